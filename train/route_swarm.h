/* train/route_swarm.h — SWARM's stochastic wiring, the baseline router.
 *
 * SWARM (Ryabinin et al., ICML'23, Alg. 1) sends each microbatch to the peer
 * of the next stage with the smallest total expected busy time: an
 * interleaved weighted round-robin where every choice adds the peer's
 * expected processing time — an exponentially weighted moving average of its
 * measured response times (α = 0.1, bias-corrected as in the SWARM code) —
 * to its priority. A peer that fails is banned (infinite priority) until it
 * re-announces itself in the DHT; a new or re-admitted peer enters at the
 * current minimum priority, so it is probed at once.
 *
 * It plugs into train/peer.h as a train_router; the peer keeps everything
 * else (transport, aggregation, recovery mode) the same, so that only the
 * routing differs between `--routing gwtf` and `--routing swarm`. */
#ifndef GWTF_TRAIN_ROUTE_SWARM_H
#define GWTF_TRAIN_ROUTE_SWARM_H

#include <stdbool.h>
#include <stddef.h>

#include "train/peer.h"

#define ROUTE_SWARM_ALPHA 0.1
#define ROUTE_SWARM_INITIAL_MS 100.0 /* expected time of a peer never measured */

typedef struct route_swarm route_swarm;

/* stage: the stage this peer serves (0 for a data node); n_stages: relay
 * stages; slots: microbatches a data node starts per iteration. */
route_swarm *route_swarm_new(int stage, int n_stages, unsigned slots, double alpha);
void route_swarm_free(route_swarm *r);
/* The stage may be learnt after creation (a relay placed by the leader). */
void route_swarm_set_stage(route_swarm *r, int stage);

/* Replaces the known members of the next stage; peers not seen before enter
 * at the current minimum priority. Banned peers stay banned. */
void route_swarm_set_next(route_swarm *r, const gw_id *ids, size_t n);
/* The peer re-announced itself (a newer DHT record): lift its ban. */
void route_swarm_readmit(route_swarm *r, const gw_id *peer);
bool route_swarm_banned(const route_swarm *r, const gw_id *peer);
/* The expected time (ms) of a peer, NAN when unknown. */
double route_swarm_expected_ms(const route_swarm *r, const gw_id *peer);
/* Its current priority (total expected busy time), INFINITY when banned. */
double route_swarm_priority(const route_swarm *r, const gw_id *peer);

/* The train_router view of it. */
train_router route_swarm_router(route_swarm *r);

#endif
