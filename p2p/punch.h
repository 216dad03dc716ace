/* p2p/punch.h — hole punching: moving a relayed session to a direct one.
 *
 * Two peers joined through a relay circuit (p2p/relay.h) try to reach each
 * other directly, DCUtR-style (libp2p's "direct connection upgrade through
 * relay"), over the relayed session S1:
 *
 *   starter (the circuit's target) -> other   PUNCH_CONNECT {id, my addrs, nat}
 *   other -> starter                          PUNCH_CONNECT {id, its addrs, nat}
 *   starter: rtt = time of that exchange;     PUNCH_SYNC {id}, then waits rtt/2
 *   both, at about the same moment: dial every address of the other from our
 *   listen port (or a punch port), one socket per address, SO_REUSEPORT,
 *   again every retry_ms when an attempt fails, until timeout_ms.
 *
 * Through cone NATs (Linux MASQUERADE keeps the source port) the SYNs cross
 * and TCP opens simultaneously, or one end's SYN reaches the other's
 * listener. A punched connection starts with the 40-byte preface
 * "GWPH" | ver | 0 0 0 | id, the same bytes from both ends, then the
 * ordinary handshake with the lower node ID as initiator (TCP gave no roles).
 *
 * Migration, lossless and in order, by markers: the lower node ID (the
 * "chooser") takes the first direct session S2 that comes up, stops reading
 * it (p2p_session_hold_rx), sends PUNCH_MIGRATE {hash of S2} as its last
 * frame on S1 and from then on sends on S2. The other end, on reading that
 * marker (everything sent before it on S1 has been delivered), sends its
 * own marker as its last frame on S1, switches its sends to S2 and reads
 * S2. The chooser, on reading the other's marker, reads S2 and closes S1
 * with Goodbye(DIRECT): by then both ends have read all of S1. Upper layers
 * see no peer_down/peer_up: the host only swaps the peer's session.
 * Frames wait in the direct connection's socket (TCP flow control) while
 * the relayed tail drains, so nothing is buffered twice.
 *
 * Log lines: nat.punch_started, nat.direct (after_ms), nat.punch_failed
 * (nat=mine/theirs, reason). See docs/PUNCH.md. */
#ifndef GWTF_P2P_PUNCH_H
#define GWTF_P2P_PUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/handshake.h"
#include "p2p/identity.h"
#include "util/addr.h"
#include "util/id.h"
#include "util/log.h"

#define P2P_PUNCH_VERSION (1)
#define P2P_PUNCH_PREFACE_BYTES (40) /* == P2P_HS_MSG1_BYTES, like a relay preface */
#define P2P_PUNCH_ID_BYTES (32)
#define P2P_PUNCH_MAX_ADDRS (8)

typedef struct p2p_punch_config {
  bool enabled;         /* punch relayed sessions (and answer a peer's punch) */
  uint32_t timeout_ms;  /* from the first dial until a direct session is up */
  uint32_t retry_ms;    /* a failed dial to one address is tried again after this */
  uint32_t answer_ms;   /* how long the starter waits for the peer's CONNECT */
  uint32_t migrate_ms;  /* how long a migration may wait for the other end's marker */
  /* Test hook: advertise this address instead of ours (family 0: off). */
  gw_addr test_advertise;
} p2p_punch_config;

/* Defaults: off (the node turns it on), 5 s, 100 ms, 5 s, 30 s. */
void p2p_punch_config_defaults(p2p_punch_config *cfg);

/* The preface of a punched connection. */
void p2p_punch_preface(const uint8_t id[P2P_PUNCH_ID_BYTES], uint8_t out[P2P_PUNCH_PREFACE_BYTES]);
bool p2p_punch_is_preface(const uint8_t rec[P2P_PUNCH_PREFACE_BYTES]);
/* A TCP socket (family 4 or 6) with SO_REUSEADDR and SO_REUSEPORT, not yet
 * bound: the fd, or a negative UV error. */
int p2p_punch_socket(int family);
/* Lets punch sockets bind the port of a bound listener: SO_REUSEPORT set
 * after the listener's bind, so that bind still failed on a port another
 * process holds, and a later plain bind of this port still fails. */
int p2p_punch_share_port(uv_tcp_t *listener);

/* gwtf.PunchNat as a log token: unknown, none, cone, symmetric. */
const char *p2p_punch_nat_name(int nat);

typedef struct p2p_punch_stats {
  uint64_t started, direct, failed; /* punches begun, migrated, given up */
  uint32_t active;
} p2p_punch_stats;

/* ---- between p2p/host.c and p2p/punch.c (not for other layers) ---- */

struct p2p_host;
struct p2p_session;
struct p2p_msg;
typedef struct p2p_punch p2p_punch;

int p2p_punch_new(struct p2p_host *h, uv_loop_t *loop, const p2p_punch_config *cfg, const p2p_identity *me,
                  const gw_log *log, p2p_punch **out);
/* The host is closing: no more dials, sends or timers. */
void p2p_punch_stop(p2p_punch *p);
/* Frees (its handles close from the loop). Sessions belong to the host. */
void p2p_punch_free(p2p_punch *p);
void p2p_punch_get_stats(const p2p_punch *p, p2p_punch_stats *out);
/* A relayed session to peer became the peer's current session. */
void p2p_punch_relayed_up(p2p_punch *p, const gw_id *peer, struct p2p_session *s1);
/* A MSG_PUNCH_* message on session s from peer. */
void p2p_punch_on_message(p2p_punch *p, struct p2p_session *s, const gw_id *peer, const struct p2p_msg *msg);
/* An accepted connection began with a punch preface. */
void p2p_punch_on_preface(p2p_punch *p, struct p2p_session *s, const uint8_t *preface);
/* A punched session (dialled by p2p_host_punch_dial or accepted) is up. */
void p2p_punch_on_up(p2p_punch *p, struct p2p_session *s);
/* Any session is closing; forget it. */
void p2p_punch_on_closed(p2p_punch *p, struct p2p_session *s);
void p2p_punch_peer_down(p2p_punch *p, const gw_id *peer);

/* Provided by host.c for punch.c. */
int p2p_host_punch_dial(struct p2p_host *h, const gw_addr *local, const gw_addr *remote,
                        const uint8_t preface[P2P_PUNCH_PREFACE_BYTES], p2p_role role, const gw_id *expect,
                        struct p2p_session **out);
/* Makes s the peer's current session (sends go there from now on). */
void p2p_host_punch_switch(struct p2p_host *h, const gw_id *peer, struct p2p_session *s);
/* The peer's current session, NULL when down. */
struct p2p_session *p2p_host_punch_current(const struct p2p_host *h, const gw_id *peer);
/* Our end and how the peer sees it, for each direct session that is up
 * and was told (Hello's observed address); returns how many (<= max). */
size_t p2p_host_punch_observed(const struct p2p_host *h, gw_addr *local, gw_addr *observed, size_t max);

#endif
