/* p2p/udp.h — the authenticated UDP endpoint the DHT speaks over.
 *
 * One datagram on the wire, never more than P2P_UDP_MAX_DGRAM bytes:
 *
 *   0      1           2                 34            len-64      len
 *   | 'g'  | ver|flags | sender pk (32)  |  payload ... | sig (64)  |
 *
 *   sig = Ed25519(sender, "gwtf-udp-v1" || bytes [0, 34) || recipient || payload)
 *
 * where `recipient` is the recipient's 32-byte node ID when the sender knew it
 * (flag P2P_UDP_FLAG_BOUND) and 32 zero bytes when it knew only an address (a
 * bootstrap peer). The recipient ID is signed but not sent: the receiver puts
 * its own ID there, so a datagram meant for one node does not verify at
 * another. The sender's node ID is BLAKE2b-256 of the pk, so a verified
 * datagram proves the sender owns the ID it claims.
 *
 * Why signatures and not crypto_box: a box is keyed by the recipient's key,
 * which a node does not have when it first writes to a bootstrap peer known
 * only by HOST:PORT; and a signature verifies with nothing but the datagram,
 * so the receiver keeps no per-sender state (no cached shared keys) for
 * senders it has not verified — the DHT's "no state for unverified senders"
 * rule. Payloads are not secret (DHT contents are public), so nothing is lost
 * by not encrypting. The source address is not authenticated (a NATed sender
 * does not know it); the DHT's cookies (dht/guard.h) prove it instead.
 *
 * Bad datagrams — too short, too long, wrong magic or version, bad signature —
 * are dropped and counted before anything is allocated for them. */
#ifndef GWTF_P2P_UDP_H
#define GWTF_P2P_UDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/identity.h"
#include "util/addr.h"

#define P2P_UDP_MAX_DGRAM (1200)   /* IPv6-safe: fits the 1280-byte minimum MTU */
#define P2P_UDP_MAGIC (0x67)       /* 'g' */
#define P2P_UDP_VERSION (1)
#define P2P_UDP_FLAG_BOUND (0x01)  /* the signature covers the recipient's node ID */
#define P2P_UDP_HEADER_BYTES (2 + P2P_PK_BYTES)
#define P2P_UDP_OVERHEAD (P2P_UDP_HEADER_BYTES + P2P_SIG_BYTES) /* 98 */
#define P2P_UDP_MAX_PAYLOAD (P2P_UDP_MAX_DGRAM - P2P_UDP_OVERHEAD) /* 1102 */

typedef struct p2p_udp p2p_udp;

typedef struct p2p_udp_stats {
  uint64_t dgrams_in, bytes_in;   /* accepted (verified) datagrams, wire bytes */
  uint64_t dgrams_out, bytes_out; /* sent datagrams, wire bytes */
  uint64_t rejected_malformed;    /* too short, wrong magic, version or flags */
  uint64_t rejected_oversize;     /* longer than P2P_UDP_MAX_DGRAM */
  uint64_t rejected_auth;         /* signature does not verify (forged or misaddressed) */
  uint64_t send_errors;
  size_t max_dgram_in, max_dgram_out; /* largest wire size seen each way (accepted / sent) */
} p2p_udp_stats;

/* A verified datagram: from->id is the sender's proven node ID, from->addr the
 * address it came from. payload is valid only during the call. */
typedef void (*p2p_udp_recv_cb)(void *ud, const gw_peer *from, const uint8_t *payload, size_t len,
                                size_t wire_len);
/* A datagram was dropped: reason is GW_ERANGE (oversize), GW_EPROTO
 * (malformed) or GW_EAUTH (bad signature). from may be NULL. */
typedef void (*p2p_udp_reject_cb)(void *ud, const gw_addr *from, int reason, size_t wire_len);

typedef struct p2p_udp_config {
  gw_addr bind;             /* IPv4 or IPv6 address and port; port 0 picks one */
  const p2p_identity *me;   /* signs every datagram; must outlive the endpoint */
  p2p_udp_recv_cb on_recv;
  p2p_udp_reject_cb on_reject; /* may be NULL */
  void *ud;
} p2p_udp_config;

/* Binds a socket on loop and starts receiving. Returns 0 or a negative code
 * (a UV_E* code when the bind fails). */
int p2p_udp_open(uv_loop_t *loop, const p2p_udp_config *cfg, p2p_udp **out);
/* Stops receiving and frees the endpoint once libuv has closed the handle
 * (the loop must run again). Sends still queued are dropped. */
void p2p_udp_close(p2p_udp *u);

/* Signs and sends one payload of at most P2P_UDP_MAX_PAYLOAD bytes to
 * to->addr, bound to to->id unless it is zero. Returns 0 or a negative code;
 * GW_ERANGE when the payload is too large. Never blocks. */
int p2p_udp_send(p2p_udp *u, const gw_peer *to, const uint8_t *payload, size_t len);

/* The address the socket is bound to (with the port the kernel picked). */
int p2p_udp_local_addr(const p2p_udp *u, gw_addr *out);
const p2p_udp_stats *p2p_udp_get_stats(const p2p_udp *u);
const gw_id *p2p_udp_id(const p2p_udp *u);

/* ---- the codec, without sockets (tests and fuzzers call these) ---- */

/* Builds a datagram into out[cap] (cap >= len + P2P_UDP_OVERHEAD).
 * to may be NULL or zero for an unbound datagram. Returns 0, GW_ERANGE. */
int p2p_udp_seal(const p2p_identity *me, const gw_id *to, const uint8_t *payload, size_t len,
                 uint8_t *out, size_t cap, size_t *out_len);

/* Checks framing only (size, magic, version, flags); no signature check, no
 * allocation. On success *payload points into dgram. Returns 0, GW_ERANGE
 * (oversize) or GW_EPROTO (malformed). */
int p2p_udp_parse(const uint8_t *dgram, size_t len, const uint8_t **pk, const uint8_t **payload,
                  size_t *payload_len);

/* p2p_udp_parse, then verifies the signature against recipient `me` and
 * derives the sender's node ID. Returns 0, GW_ERANGE, GW_EPROTO or GW_EAUTH. */
int p2p_udp_unseal(const uint8_t *dgram, size_t len, const gw_id *me, gw_id *sender,
                   const uint8_t **payload, size_t *payload_len);

#endif
