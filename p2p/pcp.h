/* p2p/pcp.h — PCP (RFC 6887) MAP requests and replies as plain bytes.
 *
 * The wire part of the PCP port-mapping client: encode a MAP request, parse
 * and check a reply, judge the server's epoch. No sockets, no clock, no
 * allocation, so unit tests and the fuzzer (test/fuzz/fuzz_pcp_reply.c)
 * call it directly. The client that drives it on the libuv loop is
 * p2p_pm_pcp (p2p/portmap.h), in pcp.c.
 *
 *   request  (60 B)  ver=2 | R=0,op=MAP | 0 0 | lifetime | client IP (16)
 *                    | nonce (12) | proto | 0 0 0 | internal port | suggested port | suggested IP (16)
 *   response (>=60 B) ver=2 | R=1,op=MAP | 0 | result | lifetime | epoch | 0 (12)
 *                    | nonce (12) | proto | 0 0 0 | internal port | assigned port | assigned IP (16)
 *                    | options (4-byte headers, data padded to 4 bytes)
 *
 * IPv4 addresses travel IPv4-mapped (::ffff:a.b.c.d). A reply is accepted
 * only if it is a response (R bit), version 2, at most 1100 bytes, a
 * multiple of 4, with well-formed options that end exactly at its end. A
 * version-0 reply is a NAT-PMP server saying it does not speak PCP. */
#ifndef GWTF_P2P_PCP_H
#define GWTF_P2P_PCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define P2P_PCP_PORT (5351)
#define P2P_PCP_VERSION (2)
#define P2P_PCP_OP_ANNOUNCE (0)
#define P2P_PCP_OP_MAP (1)
#define P2P_PCP_HEADER_LEN (24)
#define P2P_PCP_MAP_LEN (P2P_PCP_HEADER_LEN + 36)
#define P2P_PCP_MAX_LEN (1100)
#define P2P_PCP_NONCE_LEN (12)
#define P2P_PCP_PROTO_TCP (6)
#define P2P_PCP_PROTO_UDP (17)

/* Result codes (RFC 6887 §7.4). */
enum {
  P2P_PCP_SUCCESS = 0,
  P2P_PCP_UNSUPP_VERSION = 1,
  P2P_PCP_NOT_AUTHORIZED = 2,
  P2P_PCP_MALFORMED_REQUEST = 3,
  P2P_PCP_UNSUPP_OPCODE = 4,
  P2P_PCP_UNSUPP_OPTION = 5,
  P2P_PCP_MALFORMED_OPTION = 6,
  P2P_PCP_NETWORK_FAILURE = 7,
  P2P_PCP_NO_RESOURCES = 8,
  P2P_PCP_UNSUPP_PROTOCOL = 9,
  P2P_PCP_USER_EX_QUOTA = 10,
  P2P_PCP_CANNOT_PROVIDE_EXTERNAL = 11,
  P2P_PCP_ADDRESS_MISMATCH = 12,
  P2P_PCP_EXCESSIVE_REMOTE_PEERS = 13,
};

typedef struct p2p_pcp_map_req {
  uint32_t lifetime;      /* seconds; 0 deletes the mapping */
  uint8_t client_ip[16];  /* our address as the server sees it (IPv4-mapped) */
  uint8_t nonce[P2P_PCP_NONCE_LEN];
  uint8_t protocol;       /* P2P_PCP_PROTO_TCP / _UDP */
  uint16_t internal_port;
  uint16_t suggested_port; /* 0: any */
  uint8_t suggested_ip[16]; /* ::ffff:0.0.0.0: any IPv4 */
} p2p_pcp_map_req;

typedef struct p2p_pcp_reply {
  uint8_t opcode;     /* P2P_PCP_OP_MAP or _ANNOUNCE (others are parsed but not used) */
  uint8_t result;
  uint32_t lifetime;  /* granted lease (or, on error, how long the error holds) */
  uint32_t epoch;     /* the server's seconds since it lost its state */
  bool has_map;       /* the MAP fields below are present */
  uint8_t nonce[P2P_PCP_NONCE_LEN];
  uint8_t protocol;
  uint16_t internal_port;
  uint16_t external_port;
  uint8_t external_ip[16];
  unsigned n_options;
} p2p_pcp_reply;

/* Writes the 60-byte request into out; returns P2P_PCP_MAP_LEN. */
size_t p2p_pcp_encode_map(const p2p_pcp_map_req *req, uint8_t out[P2P_PCP_MAP_LEN]);
/* 0: a well-formed PCP response in *out. GW_EUNSUPPORTED: a NAT-PMP server
 * (version 0) or a PCP server of another version refused our version.
 * GW_EPROTO: anything else (truncated, oversize, a request, bad options). */
int p2p_pcp_parse_reply(const uint8_t *buf, size_t len, p2p_pcp_reply *out);
/* The reply answers req: a MAP response with its nonce, protocol and
 * internal port. */
bool p2p_pcp_reply_matches(const p2p_pcp_reply *r, const p2p_pcp_map_req *req);
/* A successful MAP reply that grants something usable for an IPv4 mapping
 * (lifetime > 0, a port, an IPv4-mapped address that is not 0.0.0.0); for a
 * deletion (req lifetime 0) only lifetime 0 is checked. */
bool p2p_pcp_reply_usable(const p2p_pcp_reply *r, const p2p_pcp_map_req *req);
/* "not-authorized", "no-resources", ...; "result-N" for unknown codes. */
const char *p2p_pcp_result_name(uint8_t code);
/* RFC 6887 §8.5: false when the epoch says the server lost its state
 * between two replies (client times in seconds of our own clock). */
bool p2p_pcp_epoch_ok(uint64_t prev_client_s, uint32_t prev_epoch, uint64_t now_client_s, uint32_t now_epoch);
/* IPv4 (4 bytes, network order) <-> IPv4-mapped IPv6. */
void p2p_pcp_ip_map4(const uint8_t ip4[4], uint8_t out[16]);
bool p2p_pcp_ip_is4(const uint8_t ip[16]);

#endif
