/* node/swarm_waste.h — wasted compute, as the GWTF paper defines it (§VI).
 *
 * "Total pipeline compute time spent on microbatches that were either
 * excluded from aggregation or not part of the final path." `gwtf swarm`
 * feeds it every compute.done line of every peer and every microbatch.done
 * of the data nodes; compute on a microbatch counts as useful when the
 * microbatch completed and the peer that did it also carried its backward
 * on the attempt that completed (so it was on the final path). Everything
 * else is waste: a forward on a peer that was then bypassed or crashed, a
 * SWARM attempt thrown away by a restart, a microbatch deferred or lost.
 *
 * The embedding is the one computation a restart reuses (the data node keeps
 * it), so it is useful whichever attempt completes.
 *
 * Compute whose gradient died with a crashed relay before any aggregation is
 * not waste by this definition (the microbatch was on its final path and
 * aggregated at the other stages); `gwtf swarm` reports it apart. */
#ifndef GWTF_NODE_SWARM_WASTE_H
#define GWTF_NODE_SWARM_WASTE_H

#include <stddef.h>

typedef struct swarm_waste swarm_waste;

/* Remembers up to `window` (peer, microbatch, attempt) records: enough for
 * every microbatch in flight (older ones count as waste if never done). */
swarm_waste *swarm_waste_new(size_t window);
void swarm_waste_free(swarm_waste *w);

/* `peer` computed `kind` (embed, forward, recompute, loss, backward,
 * embed_backward) for attempt `attempt` of microbatch `mb` of data node
 * `origin`, taking `secs`. */
void swarm_waste_compute(swarm_waste *w, const char *peer, const char *origin, const char *mb, unsigned attempt,
                         const char *kind, double secs);
/* Data node `origin` completed microbatch `mb` on attempt `attempt`. */
void swarm_waste_done(swarm_waste *w, const char *origin, const char *mb, unsigned attempt);

/* `peer` died (killed, or crashed itself): the waste it did is its death's.
 * A relay's forward of a microbatch whose backward it did not live to carry
 * is lost with it, however fast the repair; waste elsewhere (a bypassed
 * peer's forward, a deferred microbatch) is the routing's. */
void swarm_waste_peer_lost(swarm_waste *w, const char *peer);

double swarm_waste_total_s(const swarm_waste *w);  /* all compute seen */
double swarm_waste_wasted_s(const swarm_waste *w); /* total minus the final paths' */
double swarm_waste_on_lost_s(const swarm_waste *w); /* the part of it done by peers that died */

#endif
