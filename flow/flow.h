/* flow/flow.h — GWTF decentralized flow routing (paper §IV–V-C) as a pure
 * protocol state machine.
 *
 * One `flow` instance runs in every peer. It decides, with local knowledge
 * only, which next-stage peer carries each unit of flow (one microbatch in
 * flight) so that as many microbatches as possible are trained at the lowest
 * cost. Messages and ticks in, messages out (util/io.h): no sockets, no wall
 * clock, no globals. The training layer drives it over encrypted sessions
 * (bodies of MSG_FLOW envelopes, peers addressed by gw_id); sim/ drives the
 * very same code in `gwtf sim flow` and the tests.
 *
 * ---- Model ----
 * Stages form a ring: stage 0 holds the data nodes (each the source and the
 * sink of its own flows), stages 1..S hold relays; stage S sends back to
 * stage 0. A *segment* is one unit of flow on a link up -> down, named by a
 * random 64-bit id the upstream end drew; both ends store it. A *unit* is one
 * slot of a relay's capacity, holding at most one incoming and one outgoing
 * segment for the same target data node:
 *
 *   in + out    paired: part of a path;
 *   out only    unpaired outflow: a path from here to the sink exists and
 *               waits for an inflow (what previous-stage peers request);
 *   in only     unpaired inflow: wants a next hop.
 *
 * "Sending outflow reduces capacity by 1, even if unpaired": every unit
 * counts against the capacity. A data node has `capacity` source slots (its
 * demand) and as many sink slots; it starts with all source slots unpaired.
 * Paths are built backwards from the sink: a unit's *cost to sink* is its
 * outgoing link's cost combined (flow_cost_combine: d added under sum, d^p
 * under max) with the cost the next hop reported for that segment, in the
 * objective's units, and is pushed upstream whenever it changes,
 * with a per-sender version so that a late update never overwrites a newer
 * one. A unit that loses its next hop pushes "broken" instead: the path
 * above it is offered and used by nobody until a cost comes again.
 *
 * ---- Protocol (messages in proto/flow.proto) ----
 * Request Flow: a relay that is stable (no unpaired unit) and has spare
 * capacity, a relay with an unpaired inflow, and a data node with an
 * unpaired source slot pick the next-stage peer j with unpaired outflow for
 * the target that minimises d(i,j) (+ or max) j's cost to sink, and request
 * it; j accepts when it still has such a unit at that cost or rejects with
 * its current cost. One outstanding request per node; a request is re-sent
 * each tick for `request_retry_ticks` ticks, and (chain_requests) the next
 * one goes out as soon as a message makes one possible. Offers (count and
 * cost of unpaired outflow per target) go to previous-stage peers. With
 * `reroute` (an extension), a paired unit whose path costs more than an
 * offered one requests it and leaves its old path behind as a standby.
 *
 * Request Change / Request Redirect: every node tells its same-stage peers
 * its units and link costs. With probability `p_propose_unmet` (it has
 * nothing to request) or `p_propose_satisfied` per tick a node proposes the
 * best change — swapping next hops with a peer's unit of the same target —
 * or redirect — carrying a peer's unit prev -> peer -> next itself — it can
 * find, or a random one when none improves. The receiver decides with
 * simulated annealing: accept when the objective improves, else with
 * probability e^((cost_cur - cost_new)/T); T starts at `temp_relay` and
 * becomes `cooling`*T after each accepted change. A peer that rejects is
 * left alone for `reject_ignore_attempts` proposals. Only complete flows
 * (units a data node's probe passed recently) count fully in the objective;
 * standby paths count with weight `dangling_weight`.
 *
 * No half-connected flows: the upstream end owns a segment. Every change of
 * a segment's ends is announced to the other end (notify-switch, re-sent
 * until acknowledged); an end that cannot apply the announcement tears the
 * segment down on the new party's side (cancel/deny), unless it handed its
 * own end to a same-stage peer a moment ago (a change or redirect crossing
 * this one), in which case it forwards the announcement there. A node
 * remembers ids it was told to drop for `tombstone_ticks` so a late
 * announcement cannot revive them, and answers a repeated proposal as it
 * answered the first. Periodic audits between neighbours remove what loss
 * left behind and double as heartbeats: a neighbour silent for
 * `peer_timeout_ticks` is presumed dead and every segment through it is
 * torn down and rebuilt elsewhere. Sooner, as a rule: audits carry
 * round-trip samples, and a neighbour whose audit is overdue by more than
 * its RTO is suspected and pinged; `probe_tries` unanswered pings (waiting 1, 1, 2, 4 RTOs) and
 * it is presumed dead (flow/flow_live.c). A relay whose inflow finds no next hop
 * pushes it back with DENY after `inflow_timeout_ticks`, or
 * `pushback_timeout_ticks` when the next hop itself went away; an unpaired
 * outflow idle for `outflow_idle_ticks` is cancelled.
 *
 * ---- Use ----
 *   flow_config cfg;
 *   flow_config_default(&cfg);
 *   cfg.self = my_id; cfg.role = FLOW_RELAY; cfg.stage = 2; cfg.n_stages = 4;
 *   cfg.capacity = 3; cfg.io = io; cfg.log = &log;
 *   flow *f; flow_new(&cfg, &f);
 *   flow_add_peer(f, &peer, 3);                        // from the DHT stage directory
 *   flow_set_cost(f, &peer, FLOW_DIR_NEXT, flow_cost_eq1(...));
 *   flow_start(f, now);                                 // arms the first tick
 *   ... flow_on_message(f, &from, body, len, now); flow_on_tick(f, now); ...
 *   flow_next_hop(f, &from, seg, &next, &next_seg);     // route a microbatch
 */
#ifndef GWTF_FLOW_FLOW_H
#define GWTF_FLOW_FLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/id.h"
#include "util/io.h"
#include "util/log.h"

typedef struct flow flow;

typedef enum flow_role { FLOW_DATA = 0, FLOW_RELAY = 1 } flow_role;

/* sum: Eq. 2, the sum of link costs over all flows (used for comparison
 * with the exact optimum); a path's cost to sink is the sum of its links.
 *
 * max (the default): the paper's local objective, min max f(i,j)·d(i,j),
 * in the smooth form Σ f(i,j)·d(i,j)^p with p = max_norm (8), whose p-th
 * root tends to the largest link in use as p grows: a path's cost to sink
 * is the sum of d^p over its links. Taken literally (the largest link on a
 * path) every path through the same bottleneck ties, local moves cannot
 * tell a detour from a shortcut, and — not being additive — moves that
 * improve locally can cycle; the p-th powers add up along a path, so every
 * local move's gain is its exact global gain, as under sum. */
typedef enum flow_objective { FLOW_OBJ_MAX = 0, FLOW_OBJ_SUM = 1 } flow_objective;

typedef enum flow_dir { FLOW_DIR_NEXT = 0, FLOW_DIR_PREV = 1 } flow_dir;

/* Every constant of the protocol. Defaults (flow_tunables_default) are the
 * paper's or the prototype's (DecCom-Python flowprotocol.py) values; where
 * neither gives one, the comment says how it was chosen. */
typedef struct flow_tunables {
  uint64_t tick_ms;           /* 2000: the prototype's periodic() */
  int request_retry_ticks;    /* 5: a request is re-sent this many ticks, then dropped */
  int inflow_timeout_ticks;   /* 12: an unpaired inflow is pushed back (DENY) after this */
  int pushback_timeout_ticks; /* 2: ... or after this, when it lost its next hop (pushed back to us,
                                   or the next hop died). The prototype's push-back variant waited 5;
                                   with offers flushed while flows rebuild, an offer that has not come
                                   in 2 ticks is not coming, and waiting longer only delays the data
                                   node's new path (measured: crash recovery up to 2 rounds sooner,
                                   the no-crash figures unchanged) */
  int outflow_idle_ticks;     /* 12: an unpaired outflow nobody takes is cancelled after this */
  int reject_ignore_attempts; /* 5: a same-stage peer that rejected is skipped this many proposals */
  double temp_relay;          /* 1.7: initial annealing temperature of a relay */
  double temp_data;           /* 2.0: of a data node (kept for parity; data nodes accept no changes) */
  double cooling;             /* 0.95: T <- cooling * T after each accepted change */
  double p_propose_unmet;     /* 0.3: proposal chance per tick with nothing to request */
  double p_propose_satisfied; /* 0.1: proposal chance per tick when satisfied */
  int offer_period_ticks;     /* 6: offers re-sent at least this often (prototype CHANGE broadcast) */
  int state_period_ticks;     /* 6: state to same-stage peers at least this often (QUERY_FLOWS) */
  int cost_period_ticks;      /* 12: costs re-sent upstream at least this often (NOTIFY_CHANGE_IN_COST) */
  int audit_period_ticks;     /* 3: segment audit and heartbeat per neighbour (the prototype's CHECK_FLOW
                                 ran twice per 12 ticks and its transport reported dead peers) */
  int peer_timeout_ticks;     /* 10: silence after which a neighbour is presumed dead whatever the
                                 probes say: three audits lost in a row, plus one tick (the only
                                 rule when probe_tries is 0) */
  int probe_tries;            /* 4: pings sent to a suspect before it is presumed dead, waiting 1, 1,
                                 2, 4 RTOs (0: no probing; the silence rule alone). A neighbour we
                                 share segments with is suspected when its audit is overdue by more
                                 than its RTO. 4 (8 RTOs in all, 1.6 s
                                 at the floor): at 5% loss a live peer fails four round trips once
                                 in ~10^4 suspicions (3: measured 11 false alarms in 60 runs) */
  uint64_t probe_timeout_min_ms; /* 200: floor of the RTO (srtt + 4 rttvar, RFC 6298), the margin of
                                    a suspicion and the first ping's wait (Linux's minimum RTO) */
  uint64_t rto_initial_ms;    /* 1000: the RTO before a round trip was measured (RFC 6298 2.1) */
  uint64_t offer_flush_ms;    /* 100: after a neighbour was lost, a changed offer goes upstream this long
                                 after the change rather than at the next tick (0: ticks only), so the
                                 paths it carried are rebuilt back from the sink in one tick, not one
                                 tick per stage */
  int rebuild_ticks;          /* 5: ... for this long after the loss (always on measured 0.3 to 1.3
                                 points worse per flow against greedy on settings 5-6, 4 seeds) */
  int probe_period_ticks;     /* 3: data nodes probe their flows (EVAL) */
  int live_ticks;             /* 10: a unit counts as part of a complete flow this long after a probe
                                   (three probes in a row must be lost to forget it) */
  int tombstone_ticks;        /* 10: how long dropped segment ids are remembered */
  int stable_ticks;           /* 6: ticks without a change to a complete flow before flow_is_stable */
  double dangling_weight;     /* 0.1: weight of standby (incomplete) paths in the objective */
  double min_gain;            /* 0.005: a change or redirect that moves the objective by less than this
                                   share of what is at stake is no change (neither taken nor annealed) */
  bool chain_requests;        /* true: a request goes out as soon as one is possible, not only on ticks */
  bool reroute;               /* true: a paired unit requests a strictly cheaper offered path and
                                   leaves its old one as standby (extension; see docs/FLOW.md) */
  flow_objective objective;   /* FLOW_OBJ_MAX */
  double max_norm;            /* 8: p in Σ f·d^p, the smooth max (1..16; 1 is sum) */
} flow_tunables;

void flow_tunables_default(flow_tunables *t);
/* A path's cost to sink from one link and the cost behind it, under the
 * tunables' objective (what every node computes and pushes upstream). */
double flow_cost_combine(const flow_tunables *t, double link, double rest);
/* Sets one tunable by its field name ("temp_relay", "objective" takes
 * max|sum, booleans take true|false|1|0). GW_ENOENT for an unknown name,
 * GW_EINVAL for a bad value. */
int flow_tunables_set(flow_tunables *t, const char *name, const char *value);
/* Writes "name=value" lines for every tunable into buf (for --help and logs). */
void flow_tunables_describe(const flow_tunables *t, char *buf, size_t len);

/* Events, also logged as one line each (flow.established, flow.changed,
 * flow.torn_down, flow.deny, flow.peer_dead). */
typedef enum flow_event_kind {
  FLOW_EV_ESTABLISHED = 0, /* a unit became paired (data node: a source slot got a first hop) */
  FLOW_EV_CHANGED = 1,     /* a change or redirect moved a unit's next hop or took/gave a unit */
  FLOW_EV_TORN_DOWN = 2,   /* a paired unit lost its inflow or outflow */
  FLOW_EV_DENY = 3,        /* DENY sent (we cannot place a flow) or received */
  FLOW_EV_PEER_DEAD = 4,   /* a neighbour was presumed dead or reported failed */
} flow_event_kind;

typedef struct flow_event {
  flow_event_kind kind;
  uint64_t in_seg, out_seg; /* 0 when absent */
  gw_id peer;               /* the other node concerned (zero when none) */
  gw_id target;             /* the data node of the flow (zero for PEER_DEAD) */
  double cost;              /* cost to sink after the event (NAN when unknown) */
} flow_event;

typedef void (*flow_event_fn)(void *ud, const flow_event *ev);

typedef struct flow_config {
  gw_id self;
  flow_role role;
  int stage;    /* data nodes: 0; relays: 1..n_stages */
  int n_stages; /* S, the number of relay stages */
  int capacity; /* relay: flows it can carry; data node: flows it wants (its demand) */
  flow_tunables tun;
  gw_io io;
  const gw_log *log;      /* may be NULL: silent */
  flow_event_fn on_event; /* may be NULL */
  void *event_ud;
} flow_config;

/* Defaults: relay, tunables at their defaults, everything else zero. */
void flow_config_default(flow_config *cfg);

/* Limits that keep one node's state and messages bounded. */
#define FLOW_MAX_CAPACITY (4096)
#define FLOW_MAX_PEERS (4096)
#define FLOW_MAX_MESSAGE ((size_t)256 << 10) /* larger bodies are refused unread */
#define FLOW_PATH_MAX (66)                   /* d, up to 64 relays, d: the longest path a probe keeps */

int flow_new(const flow_config *cfg, flow **out);
void flow_free(flow *f);
/* Arms the first tick (at now_ms). */
int flow_start(flow *f, uint64_t now_ms);

/* ---- driver contract (util/io.h) ---- */
/* One whole MSG_FLOW body from an authenticated peer. Undecodable input
 * returns GW_EPROTO and a peer the directory never named GW_ENOENT; a
 * decodable message with invalid content is dropped with a flow.bad_message
 * log line (0). Placement messages (flow/place.h) are ignored here. */
int flow_on_message(flow *f, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms);
void flow_on_tick(flow *f, uint64_t now_ms);

/* ---- membership and costs (from the DHT stage directory and measurements) ---- */
/* Learns a peer serving `stage` (0: a data node). Only the previous, the
 * same and the next stage matter; others are accepted and ignored. A known
 * peer that was presumed dead is revived. GW_EFULL past FLOW_MAX_PEERS. */
int flow_add_peer(flow *f, const gw_id *peer, int stage);
/* The peer left cleanly (or the directory dropped it): its segments are torn
 * down without waiting for timeouts, and it is forgotten. */
int flow_remove_peer(flow *f, const gw_id *peer, uint64_t now_ms);
/* The training layer saw the peer fail (lost session, COMPLETE timeout):
 * tear down its segments now and avoid it until it is heard from again. */
int flow_peer_failed(flow *f, const gw_id *peer, uint64_t now_ms);
/* The peer sent a training-level DENY (it cannot take more work): drop our
 * segments to it and send it nothing new until it offers spare capacity. */
int flow_peer_denied(flow *f, const gw_id *peer, uint64_t now_ms);
/* d(self, peer) for a next-stage peer (FLOW_DIR_NEXT) or d(peer, self) for
 * a previous-stage peer (FLOW_DIR_PREV); cost < 0 (or never set) means there
 * is no usable link. A changed cost is propagated like any cost change. */
int flow_set_cost(flow *f, const gw_id *peer, flow_dir dir, double cost);

/* Eq. 1: d(i,j) = (c_i + c_j)/2 + (λ_ij + λ_ji)/2 + 2·size/(β_ij + β_ji).
 * Compute times and latencies in seconds, bandwidths in bytes/s, size in
 * bytes (the activation a microbatch sends). Returns +inf when both
 * bandwidths are 0 and NAN for negative inputs. */
double flow_cost_eq1(double c_i, double c_j, double lat_ij, double lat_ji, double bw_ij, double bw_ji, double size);

/* ---- queries (for the training layer and the simulator) ---- */

/* A relay routing a microbatch: the unit whose inflow is segment `in_seg`
 * from `from`; its next hop and the segment id to send with. GW_ENOENT when
 * there is no such unit, GW_EAGAIN when it has no next hop right now. */
int flow_next_hop(const flow *f, const gw_id *from, uint64_t in_seg, gw_id *next, uint64_t *out_seg);
/* A relay routing "a microbatch of data node `target` arriving from peer
 * `from`" without a segment id: picks among the matching paired units in
 * turn (so several flows from one peer share the work). */
int flow_route(flow *f, const gw_id *target, const gw_id *from, gw_id *next, uint64_t *out_seg);

/* One complete flow of a data node, as the data node knows it. */
typedef struct flow_path_info {
  uint64_t seg; /* the segment to its first hop (the flow's id at this node) */
  gw_id first_hop;
  double cost;               /* cost to sink in the objective's units (sum of d, or of d^p under max); +inf: broken */
  int path_len;              /* 0 until a probe came back; else nodes in path (d, n1..nS, d) */
  gw_id path[FLOW_PATH_MAX]; /* filled up to path_len when known */
  double probed_cost;        /* sum of link costs measured by the last probe */
} flow_path_info;

/* A data node's flows with a first hop; returns how many there are (even
 * when more than max; only max are written). */
size_t flow_data_flows(const flow *f, flow_path_info *out, size_t max);
/* A data node picking a first hop for its next microbatch: its flows in
 * turn. GW_EAGAIN when it has none. */
int flow_pick_first_hop(flow *f, gw_id *next, uint64_t *seg);

typedef struct flow_counts {
  int capacity;
  int units;           /* relay: units in use; data node: source slots with a first hop */
  int paired;          /* relay: units with inflow and outflow */
  int unpaired_in;     /* relay: inflow without next hop; data node: source slots without first hop */
  int unpaired_out;    /* relay: outflow waiting for an inflow; data node: sink slots in use */
  int inflow, outflow; /* segments in, segments out */
  int live;            /* units that a probe passed recently */
  int peers_alive;
  double temperature;
} flow_counts;

void flow_get_counts(const flow *f, flow_counts *out);
/* No flow request pending, no relay inflow without a next hop, and no
 * change to a complete flow for stable_ticks. */
bool flow_is_stable(const flow *f, uint64_t now_ms);

/* ---- introspection for the simulator and tests ---- */

typedef struct flow_unit_view {
  gw_id target;
  bool has_in, has_out, live;
  gw_id prev, next;
  uint64_t in_seg, out_seg;
  double cost;             /* cost to sink (objective), +inf when no outflow */
  bool is_source, is_sink; /* data node slots */
} flow_unit_view;

/* Writes up to max units; returns how many the node has. */
size_t flow_units(const flow *f, flow_unit_view *out, size_t max);
const gw_id *flow_self(const flow *f);
int flow_stage(const flow *f);
/* Checks the node's own invariants (capacity, unit shapes, segment ids
 * unique per link, counters consistent). 0 or GW_EINVAL with err filled. */
int flow_check_local(const flow *f, char *err, size_t err_len);

#endif
