/* train/route_flow.h — the GWTF router: microbatches follow the flows that
 * the decentralized flow protocol (flow/flow.h) builds.
 *
 * A data node sends one microbatch along each of its complete flows, and
 * any more it starts (up to its share of the narrowest stage) to the
 * fallback below; a relay sends it to the next hop of the flow segment it
 * arrived on.
 * When that hop failed, denied or is being avoided, another of the flow
 * state's units for the same data node is used; when the flow state has no
 * route at all (in the seconds after a crash, before flows are rebuilt) the
 * microbatch goes to the live next-stage peer with the least cost by Eq. 1
 * plus the wait its load implies (our bytes queued on the link to it, the
 * microbatches we have outstanding there times its compute time, and a peer
 * that just said DENY full last), and
 * the choice is logged as a fallback. A hop the load callback says is gone
 * (no session, or it left a probe unanswered) is never chosen, not even
 * when a flow names it: the flow protocol hears of it on its own. The flow protocol itself runs beside the
 * training peer, fed with membership and measured costs by the node. */
#ifndef GWTF_TRAIN_ROUTE_FLOW_H
#define GWTF_TRAIN_ROUTE_FLOW_H

#include "flow/flow.h"
#include "train/peer.h"

#define ROUTE_FLOW_MAX_NEXT 256

typedef struct route_flow {
  flow *f;            /* NULL until the stage is known */
  int stage, n_stages;
  const gw_log *log;
  /* next-stage peers with their current cost, for the fallback */
  gw_id next[ROUTE_FLOW_MAX_NEXT];
  double next_cost[ROUTE_FLOW_MAX_NEXT];
  size_t n_next;
  uint64_t fallbacks;
  /* the next hops' load (train_peer_next_load); NULL: cost alone */
  int (*load)(void *ud, const gw_id *peer, train_load *out);
  void *load_ud;
  uint64_t now_ms; /* the driver's clock, kept current (the flow needs it to tear down) */
} route_flow;

void route_flow_init(route_flow *r, int n_stages, const gw_log *log);
/* Attaches the flow instance once the stage is known. */
void route_flow_attach(route_flow *r, flow *f, int stage);
/* The next stage's live peers and their Eq. 1 cost from us (for fallbacks). */
void route_flow_set_next(route_flow *r, const gw_id *ids, const double *costs, size_t n);
/* Where the fallback learns a next hop's load, and whether it is gone. */
void route_flow_set_load(route_flow *r, int (*load)(void *ud, const gw_id *peer, train_load *out), void *ud);
/* The fallback's score of a next hop: its Eq. 1 cost (ms) plus the wait its
 * load implies; HUGE_VAL when it is gone. Exposed for tests. */
double route_flow_score(const route_flow *r, const gw_id *peer, double cost_ms, train_load *load);
train_router route_flow_router(route_flow *r);
/* A data node's flows: how many, how many a probe measured, and the sum of
 * their measured path costs (Eq. 2's objective for those flows). */
void route_flow_data_cost(route_flow *r, size_t *flows, size_t *probed, double *sum);

#endif
