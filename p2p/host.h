/* p2p/host.h — the connection manager: every encrypted session of a node.
 *
 * Upper layers (flow, training, the DHT's session traffic) address peers by
 * node ID and never see a socket. The host
 *   - listens, and dials the peers it is asked to keep (bootstrap peers, or
 *     any peer an upper layer wants), with a dial timeout and reconnects
 *     with exponential backoff and jitter while they stay wanted;
 *   - keeps one session per peer pair: when both sides dial at once, the
 *     session dialled by the lower node ID wins, on both sides, and the
 *     other is closed with a "duplicate" goodbye that does not count as the
 *     peer going away; a session from a restarted peer (new instance)
 *     replaces the stale one;
 *   - pings every peer, keeps a smoothed RTT, and tracks observed
 *     throughput per peer (the flow cost model reads both);
 *   - shapes each peer's sends with the link emulator when given a links
 *     file (p2p/link.h);
 *   - reports peer up / down (lost or left) and every message, with the
 *     verified sender ID.
 *
 * Single-threaded: call everything from the loop's thread. Callbacks run
 * from the loop, never from inside a p2p_host_* call, so callers may call
 * back into the host from them. */
#ifndef GWTF_P2P_HOST_H
#define GWTF_P2P_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/frame.h"
#include "p2p/identity.h"
#include "p2p/limits.h"
#include "p2p/link.h"
#include "p2p/punch.h"
#include "p2p/relay.h"
#include "p2p/reach.h"
#include "util/addr.h"
#include "util/log.h"

typedef struct p2p_host p2p_host;

typedef enum p2p_down_reason {
  P2P_DOWN_LOST = 0, /* the connection broke or went silent: the peer may be dead */
  P2P_DOWN_LEFT = 1, /* the peer said goodbye: it is shutting down or disconnected from us */
} p2p_down_reason;

typedef struct p2p_host_cbs {
  void *ud;
  /* A peer is connected. peer->addr is where it accepts sessions (its
   * announced listen port on the address it came from). back is true when
   * this peer had been connected before. */
  void (*peer_up)(void *ud, const gw_peer *peer, bool back);
  void (*peer_down)(void *ud, const gw_id *id, p2p_down_reason reason);
  /* A message outside the p2p range (types >= 100). from is the
   * authenticated sender. See p2p_msg for buffer lifetime. */
  void (*message)(void *ud, const gw_id *from, p2p_msg *msg);
  /* A peer's write queue drained to low_water after exceeding it: a good
   * moment to send more (backpressure). May be NULL. */
  void (*writable)(void *ud, const gw_id *id);
  /* A reachability check reached a verdict (p2p/reach.h): public or
   * private at r->addr, agreed by r->checked_by peers. Comes after every
   * check, also when the verdict did not change. May be NULL. */
  void (*reachability)(void *ud, const p2p_reachability *r);
} p2p_host_cbs;

typedef struct p2p_host_config {
  const p2p_identity *me; /* must outlive the host */
  gw_addr listen;         /* family 0: no listener (dial only); port 0: any free port */
  size_t max_frame;       /* largest frame we accept (default P2P_MAX_FRAME_DEFAULT) */
  size_t max_queue;       /* per-peer queued bytes beyond which sends fail with GW_EFULL */
  size_t low_water;       /* writable() threshold */
  uint32_t connect_timeout_ms;
  uint32_t handshake_timeout_ms;
  uint32_t goodbye_timeout_ms;
  uint32_t ping_interval_ms;
  uint32_t idle_timeout_ms; /* no bytes for this long: the peer is lost */
  uint32_t backoff_min_ms;
  uint32_t backoff_max_ms;
  uint32_t max_handshakes; /* concurrent inbound handshakes, all IPs; more are refused */
  uint32_t max_sessions;   /* open sessions, all of them; more inbound are refused */
  p2p_limits_config limits; /* per IP / subnet caps, reassembly budget, slow senders (p2p/limits.h) */
  uint32_t dial_back_timeout_ms; /* connect + handshake bound of a dial-back we make for a peer */
  bool log_rtt;             /* a peer.rtt line per pong */
  const p2p_links *links;   /* link emulation; NULL = off. Must outlive the host */
  const gw_log *log;
  const char *agent;
  p2p_relay_config relay; /* serving as a relay (with a listener only) and its limits */
  p2p_punch_config punch; /* hole punching of relayed sessions (p2p/punch.h); off by default */
} p2p_host_config;

typedef struct p2p_peer_stats {
  gw_addr addr; /* listen address, else the address it connected from */
  bool connected;
  double rtt_ms;      /* smoothed (EWMA, 1/8); 0 until the first pong */
  double rttvar_ms;   /* its mean deviation (RFC 6298's RTTVAR, 1/4) */
  double rtt_min_ms;
  double rtt_last_ms;
  uint64_t rtt_samples;
  double tx_Bps, rx_Bps; /* observed throughput over recent large frames; 0 = no sample yet */
  uint64_t bytes_tx, bytes_rx, frames_tx, frames_rx; /* current session */
  size_t queued_bytes, queued_frames;
  uint64_t connected_ms; /* how long the current session has been up */
  bool relayed;               /* the current session runs through a relay circuit */
  uint8_t session_hash[32];   /* the current session's handshake hash (the same on both ends) */
} p2p_peer_stats;

/* Defaults: 64 MiB frames, 256 MiB queue, 1 MiB low water, connect 5 s,
 * handshake 5 s, goodbye 2 s, ping 5 s, idle 20 s, backoff 250 ms..30 s,
 * 64 handshakes, 1024 sessions, RTT lines on, p2p_limits_config_defaults. */
void p2p_host_config_defaults(p2p_host_config *cfg);

int p2p_host_new(uv_loop_t *loop, const p2p_host_config *cfg, const p2p_host_cbs *cbs, p2p_host **out);
/* Where the listener is bound (port resolved), family 0 when not listening. */
gw_addr p2p_host_listen_addr(const p2p_host *h);

/* Keeps a session to addr: dials now and redials with backoff whenever it
 * is down, until p2p_host_disconnect/forget. expect (may be NULL) is the
 * node ID we mean to reach; anyone else answering is rejected. Each
 * expected ID at an address is dialled on its own: an old identity's
 * failures do not stop the dials of the one there now. */
int p2p_host_connect(p2p_host *h, const gw_addr *addr, const gw_id *expect);
/* Stops redialling addr for expect (NULL: for anyone); an open session stays. */
void p2p_host_forget(p2p_host *h, const gw_addr *addr, const gw_id *expect);
/* Says goodbye to a peer and stops redialling it. GW_ENOENT when not connected. */
int p2p_host_disconnect(p2p_host *h, const gw_id *id);

/* Seals and queues one message (see p2p_msg). The tensor bytes are
 * encrypted straight from msg->data; the caller may reuse them on return.
 * GW_ENOENT: no session; GW_EFULL: the peer's queue is over max_queue;
 * GW_ERANGE: over the peer's frame limit; GW_EINVAL: bad tensor or type in
 * the p2p range. */
int p2p_host_send(p2p_host *h, const gw_id *to, const p2p_msg *msg);
/* Bytes sealed and waiting for the peer's socket (0 when not connected). */
size_t p2p_host_queued(const p2p_host *h, const gw_id *to);
bool p2p_host_is_connected(const p2p_host *h, const gw_id *id);
/* Pings the peer now (the next keepalive ping moves a period on): its pong
 * is an RTT sample, and any byte it sends shows in bytes_rx. GW_ENOENT
 * when no session is up. */
int p2p_host_ping(p2p_host *h, const gw_id *id);
int p2p_host_peer_stats(const p2p_host *h, const gw_id *id, p2p_peer_stats *out);
/* Open sessions, including those still in their handshake (diagnostics). */
size_t p2p_host_session_count(const p2p_host *h);
/* What the limits count (for addr's IP and subnet when addr is not NULL). */
void p2p_host_limit_counts(const p2p_host *h, const gw_addr *addr, p2p_limit_counts *out);
/* Connected peers, up to max; returns how many are connected. */
size_t p2p_host_peers(const p2p_host *h, gw_peer *out, size_t max);

/* Reachability, measured by dial-back (p2p/reach.h). Once two or more
 * peers are connected the host asks them to dial it back at its listen
 * port (or the port given to p2p_host_recheck_reachability), and checks
 * again when the agreed observed address moves, and every 30 minutes.
 * The host also serves its peers' dial-back requests (rate-limited; it
 * dials only the IP their session comes from, and a dial-back connection
 * never becomes a peer session). */
void p2p_host_reachability(const p2p_host *h, p2p_reachability *out);
/* The port mapping changed: external is the mapped address (its port is
 * where peers should reach us from now on), NULL when the mapping went away
 * (back to the listen port). Checks again now; the callback reports the
 * verdict. */
void p2p_host_recheck_reachability(p2p_host *h, const gw_addr *external);
/* The IP two or more connected peers agree they see us at (port 0).
 * GW_ENOENT when they do not agree (yet). */
int p2p_host_observed_addr(const p2p_host *h, gw_addr *out);

/* ---- relay circuits (p2p/relay.h, docs/RELAY.md) ----
 * Keeps a session to target_id through the relay at relay_addr, like
 * p2p_host_connect (redials with backoff until disconnect). The session is
 * end-to-end: the handshake expects target_id, the relay only moves sealed
 * bytes. A refusal (no reservation, limits) is a failed dial whose reason
 * is the relay's. relay_id is for the caller's bookkeeping (the circuit
 * address); the relay's identity does not matter to the session. */
int p2p_host_connect_via(p2p_host *h, const gw_id *relay_id, const gw_addr *relay_addr, const gw_id *target_id);
/* Keeps a session to the relay and a reservation on it (renewed halfway
 * to expiry, asked again when the session comes back), so that peers can
 * reach us at relay_id@relay_addr/p2p-circuit/our-id. */
int p2p_host_relay_reserve(p2p_host *h, const gw_id *relay_id, const gw_addr *relay_addr);
void p2p_host_relay_stats(const p2p_host *h, p2p_relay_stats *out);

/* ---- hole punching (p2p/punch.h, docs/PUNCH.md) ----
 * With cfg.punch.enabled, a relayed session is upgraded to a direct one
 * when the two ends can punch through their NATs; the peer's session is
 * swapped without peer_down/peer_up and without losing or reordering a
 * frame (p2p_peer_stats.relayed turns false). */
void p2p_host_punch_stats(const p2p_host *h, p2p_punch_stats *out);
/* Stops keeping a reservation on relay_id (the session to it stays). */
void p2p_host_relay_unreserve(p2p_host *h, const gw_id *relay_id);
/* The relays we keep reservations on and where each stands, up to max;
 * returns how many there are. */
size_t p2p_host_relay_list(const p2p_host *h, p2p_relay_resv *out, size_t max);
/* Stops redialling target_id through relay_addr (an open session stays). */
void p2p_host_forget_via(p2p_host *h, const gw_addr *relay_addr, const gw_id *target_id);

/* Says goodbye on every session, waits for them to flush (bounded by the
 * goodbye timeout), closes everything and frees the host, then calls done.
 * No peer callbacks run after this call. */
void p2p_host_close(p2p_host *h, void (*done)(void *ud), void *ud);

#endif
