/* p2p/relay.h — relay circuits: how two peers talk when one cannot be dialled.
 *
 * Any peer with a listener relays by default (libp2p circuit relay v2 is the
 * model: reservations with limits; the relay only moves bytes). A private
 * node P keeps an ordinary session with a public peer R and reserves a slot
 * on it (MSG_RELAY_RESERVE -> MSG_RELAY_RESERVED with R's limits, or a
 * refusal with a reason), renewing before it expires. A dialler D then
 *
 *   1. opens a new TCP connection to R's listen port and sends a 40-byte
 *      preface instead of handshake msg1:   "GWRC" | ver | 0 0 0 | target ID
 *   2. R checks the reservation and limits, and tells P over their session
 *      (MSG_RELAY_INCOMING{token}); P opens a new TCP connection to R:
 *                                           "GWRA" | ver | 0 0 0 | token
 *   3. R answers both connections with an 8-byte status  "GWRS" | ver | code | 0 0
 *      (code: a gwtf.RelayStatus), and from then on splices them byte for
 *      byte, with backpressure, within the limits: bytes/s, total bytes and
 *      lifetime per circuit.
 *   4. Over that pipe D runs the ordinary handshake as initiator, expecting
 *      P's node ID; P runs it as responder. The end-to-end session is the
 *      same sealed session as over a direct connection: R never holds a key,
 *      cannot read a frame, and a byte it changes fails the session's
 *      authentication.
 *
 * The preface has the size of handshake msg1, so a listener reads the same
 * 40 bytes either way and tells the two apart by the magic.
 *
 * Addresses: "RELAY_ID@RELAY_HOST:PORT/p2p-circuit/TARGET_ID" (IDs in hex)
 * names a target reachable through a relay (p2p_relay_addr_parse/format).
 *
 * Upper layers use the host: p2p_host_connect_via() (dial through a relay),
 * p2p_host_relay_reserve() (be reachable through one). This header's second
 * half is the contract between p2p/host.c and p2p/relay.c only. */
#ifndef GWTF_P2P_RELAY_H
#define GWTF_P2P_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/id.h"
#include "util/log.h"

#define P2P_RELAY_VERSION (1)
#define P2P_RELAY_PREFACE_BYTES (40) /* == P2P_HS_MSG1_BYTES */
#define P2P_RELAY_STATUS_BYTES (8)
#define P2P_RELAY_TOKEN_BYTES (32)
/* "RELAY_ID_HEX@" + host:port + "/p2p-circuit/" + TARGET_ID_HEX + NUL */
#define P2P_RELAY_ADDR_STRLEN (64 + 1 + GW_ADDR_STRLEN + 13 + 64 + 1)

typedef struct p2p_relay_config {
  bool enabled;               /* serve as a relay (only with a listener) */
  uint32_t max_reservations;  /* peers holding a slot at once */
  uint32_t max_circuits;      /* circuits open or being opened at once */
  uint64_t max_bytes_per_s;   /* per circuit, both directions; 0 = no limit */
  uint64_t max_bytes;         /* per circuit, both directions; 0 = no limit */
  uint32_t circuit_lifetime_s;/* per circuit; 0 = no limit */
  uint32_t reservation_s;     /* how long a reservation lasts without renewal */
  uint32_t connect_back_ms;   /* how long a dialler waits for the target to connect back */
  /* Test hook: flip the byte at this offset of the dialler->target stream
   * (counted from the first spliced byte, 1-based; 0 = off). Shows that a
   * relay that changes a byte breaks the session rather than forging it. */
  uint64_t test_flip_at;
} p2p_relay_config;

/* Defaults: on, 128 reservations of 1 h, 16 circuits, 16 MiB/s, 8 GiB and
 * 6 h per circuit, 5 s to connect back. Training traffic, not just a hole
 * punch: libp2p's 128 KiB / 2 min per circuit would not carry one microbatch. */
void p2p_relay_config_defaults(p2p_relay_config *cfg);

/* A gwtf.RelayStatus as a log token ("no-reservation", ...). */
const char *p2p_relay_status_name(int status);

/* A circuit address. */
typedef struct p2p_relay_addr {
  gw_id relay;
  gw_addr relay_addr;
  gw_id target;
} p2p_relay_addr;

/* "RELAYHEX@HOST:PORT/p2p-circuit/TARGETHEX" (HOST: an IP literal, IPv6 in
 * brackets). GW_EINVAL on anything else. */
int p2p_relay_addr_parse(const char *s, p2p_relay_addr *out);
/* out has room for P2P_RELAY_ADDR_STRLEN. */
void p2p_relay_addr_format(const p2p_relay_addr *a, char *out);

/* Wire records (plaintext, before the end-to-end handshake). */
void p2p_relay_preface_connect(const gw_id *target, uint8_t out[P2P_RELAY_PREFACE_BYTES]);
void p2p_relay_preface_accept(const uint8_t token[P2P_RELAY_TOKEN_BYTES], uint8_t out[P2P_RELAY_PREFACE_BYTES]);
/* True when a 40-byte record is a relay preface rather than handshake msg1. */
bool p2p_relay_is_preface(const uint8_t rec[P2P_RELAY_PREFACE_BYTES]);
void p2p_relay_status_record(int status, uint8_t out[P2P_RELAY_STATUS_BYTES]);
/* The status in a status record, or -1 when it is not one. */
int p2p_relay_status_parse(const uint8_t rec[P2P_RELAY_STATUS_BYTES]);

/* Counters, for tests and the bench. */
typedef struct p2p_relay_stats {
  uint32_t reservations, circuits; /* current */
  uint64_t circuits_opened, circuits_refused, reservations_refused;
  uint64_t bytes_relayed; /* both directions, all circuits so far */
  /* Client side: relays that granted us a reservation and still hold it. */
  uint32_t reserved_on;
} p2p_relay_stats;

/* Client side: one relay we keep (or try to keep) a reservation on. */
typedef struct p2p_relay_resv {
  gw_id relay;
  gw_addr addr;
  bool reserved; /* granted and not lost */
  bool asked;    /* a request is waiting for its answer */
  int refused;   /* the relay's last refusal (a gwtf.RelayStatus; p2p_relay_status_name), 0 if none */
} p2p_relay_resv;

/* ---- between p2p/host.c and p2p/relay.c (not for other layers) ---- */

struct p2p_host;
struct p2p_session;
struct p2p_msg;
typedef struct p2p_relay p2p_relay;

int p2p_relay_new(struct p2p_host *h, const p2p_relay_config *cfg, bool can_serve, const gw_log *log,
                  p2p_relay **out);
void p2p_relay_free(p2p_relay *r);
void p2p_relay_get_stats(const p2p_relay *r, p2p_relay_stats *out);
/* Client: keep a reservation on this relay (the host keeps the session). */
int p2p_relay_want(p2p_relay *r, const gw_id *relay, const gw_addr *relay_addr);
/* Client: stop keeping it (the relay's slot lapses with the session or its expiry). */
void p2p_relay_unwant(p2p_relay *r, const gw_id *relay);
/* Client: the relays we want, up to max into out; returns how many there are. */
size_t p2p_relay_list(const p2p_relay *r, p2p_relay_resv *out, size_t max);
/* A MSG_RELAY_* message from an authenticated peer. */
void p2p_relay_on_message(p2p_relay *r, const gw_id *from, const struct p2p_msg *msg);
/* An accepted connection began with a relay preface; s is in pipe mode now. */
void p2p_relay_on_preface(p2p_relay *r, struct p2p_session *s, const uint8_t *preface);
void p2p_relay_on_pipe_data(p2p_relay *r, struct p2p_session *s, uint8_t *buf, size_t len);
void p2p_relay_on_pipe_drained(p2p_relay *r, struct p2p_session *s);
/* The pipe session is closing; do not touch s after this returns. */
void p2p_relay_on_pipe_closed(p2p_relay *r, struct p2p_session *s, const char *why);
void p2p_relay_on_peer_down(p2p_relay *r, const gw_id *id);
void p2p_relay_tick(p2p_relay *r, uint64_t now_ms);

/* Provided by host.c for relay.c. */
int p2p_host_relay_send(struct p2p_host *h, const gw_id *to, const struct p2p_msg *msg);
/* Opens P's leg: dial addr, send the preface, then act as responder. */
int p2p_host_relay_dial_back(struct p2p_host *h, const gw_addr *addr, const uint8_t preface[P2P_RELAY_PREFACE_BYTES]);
bool p2p_host_relay_peer_up(const struct p2p_host *h, const gw_id *id);

#endif
