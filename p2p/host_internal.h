/* p2p/host_internal.h — what p2p/host.c and its companions share: the
 * host's state (peers, the addresses it keeps sessions to, one conn per
 * session) and the few helpers all three call. host_reach.c serves and asks
 * for dial-backs (p2p/reach.h); host_paths.c is the host's side of relay
 * circuits and hole punching (p2p/relay.h, p2p/punch.h); host_listen.c
 * accepts. Not an API: only these files include it. */
#ifndef GWTF_P2P_HOST_INTERNAL_H
#define GWTF_P2P_HOST_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "p2p/host.h"
#include "p2p/session.h"
#include "util/clock.h"

typedef struct peer {
  gw_id id;
  gw_addr addr;
  p2p_session *s; /* the current session; NULL while down */
  bool ever_up;
  bool switching; /* the peer dropped our session for a duplicate that is still coming up */
  uint64_t switch_deadline_ms;
  uint64_t down_since_ms;
  uint64_t up_since_ms;
  uint64_t next_ping_ms;
  uint64_t ping_nonce;
  double srtt_ms, rttvar_ms, rtt_min_ms, rtt_last_ms;
  uint64_t rtt_samples;
  struct peer *next;
} peer;

/* An address we keep a session to. */
typedef struct target {
  gw_addr addr;
  gw_id expect;  /* zero: whoever answers */
  gw_id learned; /* who answered last time */
  bool via;      /* addr is a relay: reach expect through a circuit (p2p/relay.h) */
  p2p_session *dialing;
  unsigned failures;
  uint64_t next_ms;
  struct target *next;
} target;

/* Host-side state of one session (its ud). */
typedef struct conn {
  p2p_host *h;
  p2p_session *s;
  target *t;       /* the dial this session is, until it comes up or fails */
  bool handshaking_in; /* counts against max_handshakes */
  /* A dial-back we make for a peer (p2p/reach.h): never a peer session. */
  bool probe_out;
  bool probe_reported;
  gw_id probe_for;
  uint64_t probe_nonce;
  gw_addr probe_addr;
  bool probe_in; /* a peer's dial-back to us: closed once its Hello is seen */
  bool punch;    /* a punched connection (p2p/punch.h), until it becomes the peer's session */
  bool counted;  /* inbound, counted by the limits under `from` */
  bool refused;  /* refused by the limits: closing, in no list, owns nothing */
  gw_addr from;
  struct conn *next;
} conn;

struct p2p_host {
  uv_loop_t *loop;
  p2p_host_config cfg;
  p2p_host_cbs cbs;
  p2p_session_config scfg;
  uv_tcp_t listener;
  bool listening;
  uv_timer_t tick;
  int open_handles;
  gw_addr bound;
  peer *peers;
  size_t n_peers;
  target *targets;
  conn *conns;
  size_t n_conns;
  unsigned handshakes;
  p2p_relay *relay; /* relay circuits, both roles (p2p/relay.h); NULL when out of memory */
  p2p_punch *punch; /* hole punching (p2p/punch.h); NULL when off */
  p2p_limits *limits; /* per IP / subnet caps and the reassembly budget (p2p/limits.h) */
  uint64_t fd_limit;  /* RLIMIT_NOFILE, read on every tick (it can change under us) */
  bool closing;
  p2p_reach *reach;
  bool reach_report_due; /* a verdict to hand to cbs.reachability on the next tick */
  gw_addr reach_external; /* the last mapping given to p2p_host_recheck_reachability */
  void (*done)(void *ud);
  void *done_ud;
};

/* Every session the host makes or accepts runs with these callbacks (host.c). */
extern const p2p_session_cbs host_session_cbs;

static inline uint64_t host_now_ms(void) { return gw_clock_mono_ms(); }
static inline conn *host_conn_of(const p2p_session *s) { return p2p_session_ud(s); }

/* host.c */
peer *host_find_peer(const p2p_host *h, const gw_id *id);
void host_conn_link(p2p_host *h, conn *c); /* the host owns c from here */
void host_handshake_over(p2p_host *h, conn *c);
void host_apply_links(p2p_host *h, peer *p, p2p_session *s); /* link emulation for p's session */

/* host_targets.c: targets and redials */
bool host_target_is(const target *t, const gw_id *id); /* expects or reached id */
bool host_target_satisfied(const p2p_host *h, const target *t);
void host_dial(p2p_host *h, target *t);
void host_free_target(p2p_host *h, target *t);
void host_dial_failed(p2p_host *h, target *t, int err, const char *why); /* backs off; "self" frees t */
void host_schedule_redial(p2p_host *h, const gw_id *id);               /* the peer went away */

/* host_listen.c: binds and listens on cfg.listen, accepting within the caps */
int host_start_listening(p2p_host *h);

/* host_reach.c: dial-backs (p2p/reach.h) */
int host_reach_request(void *ud, const gw_id *to, uint16_t port, uint64_t nonce);
void host_reach_decided(void *ud, const p2p_reachability *r);
void host_probe_done(p2p_host *h, conn *c, bool ok); /* our dial-back for a peer ended */
void host_serve_dial_back(p2p_host *h, p2p_session *s, const p2p_msg *msg);
void host_got_dial_back_result(p2p_host *h, const gw_id *from, const p2p_msg *msg);

/* host_paths.c: relay circuits and punched sessions */
void host_on_session_preface(p2p_session *s, const uint8_t *preface);
void host_on_session_pipe_data(p2p_session *s, uint8_t *buf, size_t len);
void host_on_session_punch(p2p_session *s, const uint8_t *preface);
int host_dial_via(p2p_host *h, target *t, conn *c);

#endif
