/* flow/flow_internal.h — state shared by the flow_*.c files. Not an API. */
#ifndef GWTF_FLOW_FLOW_INTERNAL_H
#define GWTF_FLOW_FLOW_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "flow/flow.h"
#include "flow/wire.h"
#include "proto/flow.pb-c.h"

/* Bounds on what one message may carry: a longer list is refused when
 * received. Senders stay within them by construction (offers are cut at
 * FLOW_MAX_OFFER_ENTRIES), and flow_send refuses anything packed larger
 * than FLOW_MAX_MESSAGE. */
#define FLOW_MAX_OFFER_ENTRIES (256)
#define FLOW_MAX_STATE_UNITS (FLOW_MAX_CAPACITY)
#define FLOW_MAX_STATE_LINKS (FLOW_MAX_PEERS)
#define FLOW_MAX_AUDIT_SEGS (2 * FLOW_MAX_CAPACITY)
#define FLOW_MAX_PATH (FLOW_PATH_MAX)
#define FLOW_TOMBSTONES (256)
#define FLOW_PENDING_SWITCHES (256) /* notify-switches awaiting their ack */
#define FLOW_REPLY_CACHE (32)       /* answers to recent proposals, for re-sent proposals */
#define FLOW_EARLY_COSTS (64)       /* cost updates that arrived before their segment */
#define FLOW_HANDOVERS (64)         /* segment ends we handed to a same-stage peer, for forwarding */
#define FLOW_MAX_FORWARDS (4)       /* a notify-switch is passed on at most this often */
#define FLOW_PAST_PROPOSALS (8)     /* proposals no longer pending whose reply may still come */

/* Costs equal within this tolerance are the same cost (they travel as
 * doubles through several additions on different nodes). */
#define FLOW_COST_EPS (1e-9)

typedef enum unit_kind { UNIT_RELAY = 0, UNIT_SOURCE = 1, UNIT_SINK = 2 } unit_kind;

typedef struct funit {
  bool used;
  unit_kind kind;
  gw_id target;
  bool has_in, has_out;
  int in_peer, out_peer; /* indices into flow.peers */
  uint64_t in_seg, out_seg;
  uint64_t in_since, out_since; /* when the segment was bound (audit grace) */
  double rest;                  /* next hop's cost to sink for out_seg */
  uint64_t rest_version;        /* the next hop's cost clock for rest (0: heard from a third node) */
  double sent_cost;             /* cost last pushed upstream; NAN: never */
  uint64_t unpaired_since;      /* when it last became unpaired */
  bool pushed_back;             /* unpaired because its next hop went (DENY, death): the short timeout */
  uint64_t live_until;          /* a probe passed; counts as a complete flow until then */
  uint64_t locked_txn;          /* nonzero: involved in our pending proposal */
  /* data node source slots: the path a probe brought back */
  gw_id *path;
  int path_len;
  double probed_cost;
} funit;

typedef struct foffer {
  gw_id target;
  uint32_t count;
  double cost;
} foffer;

/* A same-stage peer's unit as its last FlowState described it. */
typedef struct punit {
  gw_id target;
  bool has_in, has_out, live;
  gw_id prev, next;
  uint64_t in_seg, out_seg;
  double in_link, out_link, rest;
} punit;

typedef struct plink {
  gw_id peer;
  double cost;
} plink;

typedef struct fpeer {
  bool in_use;
  gw_id id;
  int stage;
  bool alive;       /* false: presumed dead or failed; skipped until heard from */
  bool denied;      /* it sent DENY full: no requests until it offers spare capacity */
  double cost_next; /* d(self, peer); < 0: no link */
  double cost_prev; /* d(peer, self); < 0: no link */
  uint64_t last_heard;
  /* as a next-stage peer */
  foffer *offers;
  int n_offers;
  uint32_t spare;
  /* as a same-stage peer */
  punit *units;
  int n_units;
  plink *next_costs;
  int n_next_costs;
  int ignore; /* proposals to skip after a rejection */
  /* liveness (flow_live.c) */
  bool has_rtt;                  /* a round trip was measured */
  double srtt, rttvar;           /* ms, RFC 6298 */
  uint64_t ping_nonce[2], ping_at[2]; /* the pings of our last two audits, awaiting their echo */
  uint64_t echo_nonce, echo_at;  /* its last audit's ping, echoed in our next audit */
  uint64_t last_audit;           /* its last audit or ping answer: a heartbeat */
  uint64_t suspect_since;        /* 0: not suspected */
  uint64_t probe_nonce, probe_at, probe_deadline;
  int probes_sent;
} fpeer;

typedef enum req_kind { REQ_NONE = 0, REQ_FLOW, REQ_CHANGE, REQ_REDIRECT } req_kind;

/* A notify-switch for a segment our pending proposal will give us, come
 * before the accept (see pending.held). */
typedef struct held_switch {
  bool up;    /* FlowSwitchUp, else FlowSwitchDown */
  gw_id from; /* by id: the peer table may change before the accept comes */
  uint64_t seg;
  gw_id old_end, new_end;
  double cost;
  uint32_t forwarded;
} held_switch;

typedef struct pending {
  req_kind kind;
  int peer;
  int ticks_left;
  uint64_t txn; /* flow: the new segment id; change/redirect: transaction id */
  gw_id target;
  int unit;     /* flow: unit that needs the outflow, -1 for a new one; change: our unit */
  bool reroute; /* flow: the unit has an outflow; the grant replaces it */
  double cost;  /* flow: expected cost */
  /* change */
  uint64_t my_seg, your_seg;
  int my_next, your_next;
  /* redirect */
  uint64_t in_seg, out_seg;
  int prev, next;
  /* Notify-switches for the segments this proposal gives us that came before
   * the accept (a neighbour's change or redirect crossed ours): applied the
   * moment the accept comes. They stay unacknowledged until then, so their
   * senders re-send them if the accept never comes; a switch applied only on
   * that re-send, a tick later, left a half-connected segment in between. */
  held_switch held[2];
  int n_held;
} pending;

/* A change or redirect we proposed: its reply is acted on once, whether it
 * comes while the proposal is pending or after we gave up on it. */
typedef struct past_proposal {
  gw_id peer;
  uint64_t txn;
  req_kind kind; /* REQ_NONE: free slot, or already answered */
} past_proposal;

/* A notify-switch re-sent each tick until acknowledged. */
typedef struct pswitch {
  bool used, up; /* up: FlowSwitchUp, else FlowSwitchDown */
  gw_id to, old_end, new_end;
  uint64_t seg;
  double cost;
  uint32_t forwarded;
  int ticks_left;
} pswitch;

/* We handed one end of a segment to a same-stage peer (change, redirect).
 * A notify-switch for that end that crosses the handover is forwarded. */
typedef struct handover {
  uint64_t seg;
  bool up_end; /* we were the upstream end */
  gw_id to;
  uint64_t until;
} handover;

/* How we answered a proposal, so a re-sent proposal gets the same answer. */
typedef struct cached_reply {
  gw_id peer;
  uint64_t txn;
  bool accept;
  double rest;
} cached_reply;

/* A cost update for a segment we did not hold yet. The downstream end's own
 * word on its cost is newer than any cost a grant or switch carried. */
typedef struct early_cost {
  gw_id peer;
  uint64_t seg;
  double cost;
  uint64_t version;
  uint64_t until;
} early_cost;

typedef struct tombstone {
  uint64_t seg;
  gw_id peer;
  uint64_t until;
} tombstone;

struct flow {
  flow_config cfg;
  flow_tunables tun;
  int next_stage, prev_stage;
  double temperature;
  uint64_t now;
  uint64_t ticks;
  uint32_t phase; /* spreads periodic sends over ticks */
  bool started;

  fpeer *peers;
  int n_peers, cap_peers;

  funit *units;
  int n_units; /* relay: capacity; data node: 2 * capacity (sources, then sinks) */

  pending pend;
  past_proposal past[FLOW_PAST_PROPOSALS];
  int past_next;
  tombstone tombs[FLOW_TOMBSTONES];
  int tomb_next;
  pswitch switches[FLOW_PENDING_SWITCHES];
  cached_reply replies[FLOW_REPLY_CACHE];
  int reply_next;
  early_cost early[FLOW_EARLY_COSTS];
  int early_next;
  handover handovers[FLOW_HANDOVERS];
  int handover_next;
  uint64_t cost_clock; /* advanced with every cost we send */

  bool offer_dirty, state_dirty;
  uint64_t next_tick;    /* the next full tick; wakes before it are the liveness checks' */
  uint64_t offer_flush;  /* 0, or when changed offers go out before the next tick */
  uint64_t rebuild_until; /* a neighbour was lost: offers are flushed early until then */
  uint64_t nonce_clock;   /* ping nonces */
  uint64_t offer_sent_hash; /* what the offers sent last said (a flush repeats nothing) */
  uint64_t last_change; /* last change to a complete flow */
  int rr_route, rr_first;
};

/* ---- helpers (flow.c) ---- */
int flow_peer_find(const flow *f, const gw_id *id);
bool flow_peer_is_next(const flow *f, int p);
bool flow_peer_is_prev(const flow *f, int p);
bool flow_peer_is_same(const flow *f, int p);
/* Usable as a next hop / as an upstream end: alive, right stage, link known. */
bool flow_peer_usable_next(const flow *f, int p);
bool flow_peer_usable_prev(const flow *f, int p);
uint64_t flow_random_u64(flow *f);
double flow_random_uniform(flow *f);
void flow_emit(flow *f, flow_event_kind kind, const funit *u, int peer);
const char *flow_short(const gw_id *id, char *buf); /* buf: GW_ID_SHORT_LEN + 1 */

/* ---- units (flow_units.c) ---- */
double flow_combine(const flow *f, double link, double rest);
double flow_unit_cost(const flow *f, const funit *u);
bool flow_unit_live(const flow *f, const funit *u);
/* A unit that needs a next hop: a source slot without its first hop, or a
 * relay unit with an inflow and no outflow. Never a data node's sink slot:
 * its inflow has arrived and it takes no outflow, so a grant for it could
 * only be handed back (and asking again would ping-pong with the offer). */
bool flow_unit_needs_out(const funit *u);
int flow_unit_alloc(flow *f); /* a free relay unit, or -1 */
int flow_find_in(const flow *f, int peer, uint64_t seg);
int flow_find_out(const flow *f, int peer, uint64_t seg);
int flow_find_out_seg(const flow *f, uint64_t seg);
void flow_bind_in(flow *f, int u, int peer, uint64_t seg);
/* Binds (or re-binds) the unit's outflow; the one place an outflow is set,
 * so early costs, events and the cost push are never forgotten. */
void flow_bind_out(flow *f, int u, int peer, uint64_t seg, double rest, uint64_t version);
/* A cost from the next hop itself: applied when newer than what we have. */
void flow_set_rest(flow *f, int u, double rest, uint64_t version);
void flow_early_cost_add(flow *f, int peer, uint64_t seg, double cost, uint64_t version);
/* Remove a segment locally (the other end is told by the caller, if at all). */
void flow_drop_in(flow *f, int u);
void flow_drop_out(flow *f, int u);
/* Pushes the unit's cost upstream when it changed. */
void flow_push_cost(flow *f, int u, bool force);
void flow_tomb_add(flow *f, uint64_t seg, int peer);
bool flow_tomb_has(const flow *f, uint64_t seg, int peer);
/* Tears down every segment shared with peer p, without telling p. */
void flow_peer_teardown(flow *f, int p);
/* Units counted by the relay capacity rule, and the stability test. */
int flow_units_used(const flow *f);
bool flow_relay_stable(const flow *f);
/* A dangling unit (outflow, no inflow, not live, not locked) we may give up
 * to host a redirect; -1 when none. */
int flow_sacrificable(const flow *f);
/* Frees a unit and cancels its outflow downstream / denies its inflow. */
void flow_unit_release(flow *f, int u, bool deny_full);
/* Frees a unit without a word to anyone (its segments were handed over). */
void flow_unit_forget(flow *f, int u);
/* Presumes a peer dead (or forgets it): pending work with it is dropped and
 * its segments are torn down locally. */
void flow_peer_down(flow *f, int p, bool forget);
/* Forgets what a peer offered and said of its units. */
void flow_peer_clear_views(fpeer *p);
/* Flows were lost (a neighbour died, a flow was pushed back, a path broke
 * below): offers are flushed early for rebuild_ticks. */
void flow_rebuild(flow *f);

/* ---- wire (flow_wire.c): each returns the io's result ---- */
int flow_send(flow *f, int peer, Gwtf__FlowMessage *m);
int flow_send_cancel(flow *f, int peer, uint64_t seg);
int flow_send_deny(flow *f, int peer, uint64_t seg, bool full);
int flow_send_cost(flow *f, int peer, uint64_t seg, double cost);
int flow_send_request(flow *f, int peer, uint64_t seg, const gw_id *target, double cost);
int flow_send_reply(flow *f, int peer, uint64_t seg, const gw_id *target, bool accept, double cost);
int flow_send_offer(flow *f, int peer);
int flow_send_state(flow *f, int peer);
int flow_send_audit(flow *f, int peer, bool reply);
int flow_send_probe(flow *f, int peer, uint64_t seg, const gw_id *origin, uint64_t origin_seg, const gw_id *path,
                    int path_len, double cost);
/* Notify-switches are reliable: kept and re-sent each tick until acked.
 * Ends are peer indices, -1 for ourselves. */
int flow_send_switch_up(flow *f, int to, uint64_t seg, int old_up, int new_up);
int flow_send_switch_down(flow *f, int to, uint64_t seg, int old_down, int new_down, double cost);
/* Passes a notify-switch we cannot apply on to the peer we handed that end to. */
int flow_forward_switch(flow *f, int to, bool up, uint64_t seg, const gw_id *old_end, const gw_id *new_end, double cost,
                        uint32_t forwarded);
void flow_handover_add(flow *f, uint64_t seg, bool up_end, int to);
/* The peer we recently handed that end of seg to, or -1. */
int flow_handover_find(const flow *f, uint64_t seg, bool up_end);
int flow_send_switch_ack(flow *f, int to, uint64_t seg);
void flow_switch_acked(flow *f, int from, uint64_t seg);
void flow_resend_switches(flow *f);
/* Offer summary for target t: unpaired outflow count and cheapest cost. */
void flow_offer_for(const flow *f, const gw_id *t, uint32_t *count, double *cost);
uint32_t flow_spare(const flow *f);
/* The target unit u offers outflow for (flow_wire.c); NULL: none. */
const gw_id *flow_offer_target(const flow *f, int u);
bool flow_cost_ok(double c);

int flow_send_ping(flow *f, int peer, uint64_t nonce, bool reply);
int flow_send_gone(flow *f, int peer, const gw_id *gone);

/* ---- liveness (flow_live.c) ---- */
/* The peer's retransmission timeout: srtt + 4 rttvar, at least
 * probe_timeout_min_ms (rto_initial_ms before any sample). */
uint64_t flow_live_rto(const flow *f, int p);
/* A round-trip sample (ms) from an audit echo or a ping answer. */
void flow_live_sample(flow *f, int p, double rtt_ms);
/* Any message from p: it is alive, so a suspicion ends. */
void flow_live_heard(flow *f, int p);
/* The audit fields for p: a new ping, and the echo of p's last one. */
void flow_live_audit_out(flow *f, int p, uint64_t *ping, uint64_t *echo, uint32_t *held_ms);
/* An audit from p: its ping to echo, our echoed ping (a sample). */
void flow_live_audit_in(flow *f, int p, uint64_t ping, uint64_t echo, uint32_t held_ms);
void flow_live_on_ping(flow *f, int p, uint64_t nonce, bool reply);
/* Suspicions, pings and verdicts due by now (every wake). */
void flow_live_check(flow *f);
/* The earliest time flow_live_check has something to do (UINT64_MAX: none). */
uint64_t flow_live_next_wake(const flow *f);
/* Tells our other neighbours that we presumed p dead (FlowGone). */
void flow_live_tell_gone(flow *f, int p);
/* A neighbour says it presumed `gone` dead. */
void flow_live_on_gone(flow *f, int from, int gone);
/* Asks the driver for the next wake: the next tick, or sooner. */
void flow_arm(flow *f);
/* A digest of what our offers say (the same to every previous-stage peer). */
uint64_t flow_offer_hash(const flow *f);
/* Sends the offers now if they changed since last sent (a flush). */
void flow_flush_offers(flow *f);

/* ---- tick helpers shared with flow_live.c (flow_tick.c) ---- */
bool flow_shares_segments(const flow *f, int p);
uint64_t flow_newest_segment(const flow *f, int p);

/* ---- receive (flow_rx.c) ---- */
void flow_handle(flow *f, int peer, const Gwtf__FlowMessage *m);

/* ---- tick work (flow_tick.c) ---- */
/* Sends the next Request Flow if there is one to send; true when sent. */
bool flow_try_request(flow *f);
/* Considers one Request Change / Redirect; true when a proposal was sent. */
bool flow_try_propose(flow *f);
/* (Re)sends the pending change or redirect proposal. */
void flow_send_proposal(flow *f);
void flow_clear_pending(flow *f);
/* Annealing acceptance of a move with improvement delta (> 0 = better). */
bool flow_anneal_accept(flow *f, double delta);
/* The local objective of a set of affected path costs with weights: their
 * weighted sum (costs are sums of d, or of d^p under max, so this is exact). */
double flow_score(const flow *f, const double *cost, const double *weight, int n);
/* Improvement (> 0 = better) of swapping next hops: a sends to b and c to e
 * before, a to e and c to b after. rest_x: x's cost to sink. */
double flow_change_delta(const flow *f, double link_a_b, double link_a_e, double rest_b, double link_c_e,
                         double link_c_b, double rest_e, double w_a, double w_c);
/* Improvement of carrying p -> x -> n through y instead. */
double flow_redirect_delta(const flow *f, double link_p_x, double link_x_n, double link_p_y, double link_y_n,
                           double rest, double w);

#endif
