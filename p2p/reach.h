/* p2p/reach.h — is this node reachable? Measured by dial-back, never assumed.
 *
 * Requester side. Once the node has sessions with two or more peers, it
 * asks them to dial it back (MSG_DIAL_BACK: a port and a nonce). A prober
 * dials the IP it sees the requester's session come from, at that port,
 * with a fresh connection whose handshake must show the requester's node
 * ID, puts the nonce in that connection's Hello, and reports over the
 * session the request came on (MSG_DIAL_BACK_RESULT: the nonce, ok /
 * failed / refused, and the address it dialled). A prober's "ok" counts
 * only when the dial-back connection really arrived here with our nonce
 * from that prober; a "failed" only when none did. The verdict needs two
 * peers that agree on the same address:
 *   public   two "ok" for one address;
 *   private  two "failed" for one address and no "ok" for it.
 * Until then the status stays what it was (UNKNOWN at start). Refusals and
 * timeouts are no verdict; another peer is asked (at most
 * P2P_REACH_MAX_ASK per round). A node that does not listen is private
 * without asking anyone.
 *
 * Observed addresses: each peer says in its Hello which address it sees us
 * at. One peer's word changes nothing; an IP reported by two peers is the
 * agreed observed IP, and when it moves away from the address of the last
 * verdict, the check runs again. It also runs again on
 * p2p_reach_recheck (the port mapping changed) and every refresh_ms.
 *
 * Prober side: p2p_reach_admit rate-limits dial-backs per requester node
 * ID and per requester IP (token buckets) and bounds those in flight. The
 * request has no address field at all, so it cannot make a prober dial a
 * third party; the host (p2p/host.c) dials only the IP of the session the
 * request came on.
 *
 * A pure state machine: no sockets, no clock, no globals. The host feeds it
 * events with now_ms and it acts through p2p_reach_io; tests drive it
 * directly. Log lines: nat.reachability (the verdict), nat.advice (what the
 * user can do, when private), nat.observed (the agreed observed IP moved). */
#ifndef GWTF_P2P_REACH_H
#define GWTF_P2P_REACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/id.h"
#include "util/log.h"

#define P2P_REACH_AGREE (2)        /* agreeing verdicts (and observed-address reports) needed */
#define P2P_REACH_MAX_ASK (6)      /* peers asked in one round */
#define P2P_REACH_PEERS_MAX (64)   /* connected peers whose observed address we keep */
#define P2P_REACH_SERVE_KEYS (256) /* rate-limit buckets kept (node IDs and IPs) */
/* A prober's dial-back: connect and handshake, each bounded by this. */
#define P2P_REACH_DIAL_TIMEOUT_MS (5000)
/* Defaults of p2p_reach_config (0 picks them). */
#define P2P_REACH_RESULT_TIMEOUT_MS (2 * P2P_REACH_DIAL_TIMEOUT_MS + 3000)
#define P2P_REACH_REFRESH_MS (30 * 60 * 1000)
#define P2P_REACH_RETRY_MS (60 * 1000) /* an undecided round tries again, doubling up to refresh_ms */
#define P2P_REACH_SERVE_BURST (3)      /* dial-backs per requester node ID, at once ... */
#define P2P_REACH_SERVE_REFILL_MS (200 * 1000) /* ... and one more per this long */
#define P2P_REACH_SERVE_IP_BURST (8)   /* per requester IP (several nodes behind one NAT) */
#define P2P_REACH_SERVE_INFLIGHT (8)   /* dial-backs in flight at once */

typedef enum p2p_reach_status {
  P2P_REACH_UNKNOWN = 0,
  P2P_REACH_PUBLIC = 1,  /* peers reached us at addr */
  P2P_REACH_PRIVATE = 2, /* peers could not reach us at addr (or we do not listen) */
} p2p_reach_status;

typedef struct p2p_reachability {
  p2p_reach_status status;
  gw_addr addr;        /* the address peers dialled (observed IP + our port); family 0: none */
  unsigned checked_by; /* peers whose verdicts agreed (0: not listening, nobody asked) */
} p2p_reachability;

typedef struct p2p_reach_io {
  void *ud;
  /* Sends a DialBackRequest(port, nonce) to a connected peer; non-zero when
   * it could not be sent (then that peer gives no verdict this round). */
  int (*request)(void *ud, const gw_id *to, uint16_t port, uint64_t nonce);
  /* A check reached a verdict (also when it confirms the previous one). */
  void (*decided)(void *ud, const p2p_reachability *r);
  /* A fresh random nonce; NULL: libsodium. */
  uint64_t (*random64)(void *ud);
} p2p_reach_io;

typedef struct p2p_reach_config {
  uint16_t port;              /* the port we ask to be dialled at; 0: we do not listen */
  uint32_t result_timeout_ms; /* a peer that has not answered by then gives no verdict */
  uint32_t refresh_ms;        /* a verdict is checked again after this long */
  uint32_t retry_ms;          /* first retry of an undecided check */
  uint32_t serve_burst, serve_refill_ms, serve_ip_burst, serve_inflight; /* prober limits */
  const gw_log *log;          /* may be NULL */
} p2p_reach_config;

typedef struct p2p_reach p2p_reach;

int p2p_reach_new(const p2p_reach_config *cfg, const p2p_reach_io *io, p2p_reach **out);
void p2p_reach_free(p2p_reach *r);

/* ---- requester side: events in ---- */

/* A peer session is up; observed (may be NULL or family 0) is the address
 * that peer says it sees us at (its Hello). */
void p2p_reach_peer_up(p2p_reach *r, const gw_id *id, const gw_addr *observed, uint64_t now_ms);
void p2p_reach_peer_down(p2p_reach *r, const gw_id *id, uint64_t now_ms);
/* A DialBackResult from a peer (status: a gwtf.DialBackStatus value;
 * dialled may be NULL). Anything that does not answer a request of the
 * current round is ignored. */
void p2p_reach_on_result(p2p_reach *r, const gw_id *from, uint64_t nonce, int status, const gw_addr *dialled,
                         uint64_t now_ms);
/* A dial-back connection from `from` carrying `nonce` reached us. True when
 * it answers a request of the current round. */
bool p2p_reach_on_probe(p2p_reach *r, const gw_id *from, uint64_t nonce, uint64_t now_ms);
/* Check again now (the port mapping changed). port: the port to be dialled
 * at from now on (the mapped external port, or the listen port again);
 * 0 keeps the current one. The status stays until the new verdict. */
void p2p_reach_recheck(p2p_reach *r, uint16_t port, uint64_t now_ms);
void p2p_reach_tick(p2p_reach *r, uint64_t now_ms);

void p2p_reach_get(const p2p_reach *r, p2p_reachability *out);
/* The IP two or more connected peers agree they see us at (port 0).
 * GW_ENOENT when they do not agree (yet). */
int p2p_reach_observed(const p2p_reach *r, gw_addr *out);
/* The port we ask peers to dial (0: not listening). */
uint16_t p2p_reach_port(const p2p_reach *r);

/* ---- prober side ---- */

/* May we dial `from` back, whose session comes from `from_addr`, at port?
 * 0: yes (call p2p_reach_serve_done when the dial-back ends); GW_EINVAL: bad
 * port; GW_EAGAIN: this node ID or IP asked too often; GW_EBUSY: too many
 * dial-backs in flight. *why names the reason for a log line. */
int p2p_reach_admit(p2p_reach *r, const gw_id *from, const gw_addr *from_addr, uint32_t port, uint64_t now_ms,
                    const char **why);
void p2p_reach_serve_done(p2p_reach *r);

const char *p2p_reach_status_name(p2p_reach_status s);

#endif
