/* flow/flow_guard.h — what a neighbour may push at us through the flow
 * protocol and the cost model: a rate limit on its flow messages, and a
 * floor under the compute time it claims for itself.
 *
 * A peer that floods flow requests (offers, grants, probes: each one makes
 * the state machine work and may send replies) is cut to a token bucket per
 * peer; a peer that claims a near-zero compute time in its HELLO would look
 * like the cheapest link in Eq. 1 and pull every flow through itself. Pure
 * state and arithmetic: the caller passes the time and logs (the first drop
 * of a peer and the first clamp of a peer are flagged for one log line). */
#ifndef GWTF_FLOW_GUARD_H
#define GWTF_FLOW_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

/* Flow messages per second one peer may send us, sustained. The protocol's
 * own traffic is a few tens per second per neighbour at --flow-tick 100
 * (the swarms'), a few per second at the default 2000. */
#define FLOW_GUARD_RATE 200
/* ... and at once, after a quiet spell (a tick that answers many units). */
#define FLOW_GUARD_BURST 1000
/* A neighbour's claimed compute time counts for at least the lower median
 * of what the other peers of its stage claim (and our own mean time, if it
 * is of our stage) divided by this. Peers of one stage run the same layers,
 * but honest ones still differ a lot: a GPU next to a CPU (an H100 runs a
 * GPT-2-small stage ~100x faster than two CPU cores, docs/CUDA.md), a peer
 * starved by its machine's other work (8x and more between two relays of
 * one stage on a busy 2-core CI machine), a newcomer whose mean still holds
 * its slow first job. So the bound only catches claims off by orders of
 * magnitude (lying-costs claims 0.001 ms against ~10 ms); a subtler liar
 * wins at most this factor. Stages are not compared with each other (a
 * data node's loss head may cost more than a relay's blocks). */
#define FLOW_GUARD_COST_RATIO 100.0
/* Peers tracked; past it the one quiet the longest is forgotten. */
#define FLOW_GUARD_MAX_PEERS 256

typedef struct flow_guard_peer {
  gw_id id;
  double tokens;
  uint64_t last_ms;
  uint64_t dropped;
  bool drop_logged, clamp_logged;
  int stage;       /* of its last cost claim (-1: none) */
  double claimed_s; /* its last claim */
} flow_guard_peer;

typedef struct flow_guard {
  flow_guard_peer peers[FLOW_GUARD_MAX_PEERS];
  size_t n;
} flow_guard;

void flow_guard_init(flow_guard *g);
/* Whether a flow message from `from` at now_ms is taken. false: drop it;
 * *first_drop is set on the first drop of a flood (a flood ends when the
 * peer's bucket has refilled to FLOW_GUARD_BURST): log then. *dropped holds
 * its drops so far. */
bool flow_guard_admit(flow_guard *g, const gw_id *from, uint64_t now_ms, bool *first_drop, uint64_t *dropped);
/* The compute time (seconds) to use for a neighbour of `stage` that claims
 * claimed_s; own_s: our measured time if we serve the same stage, else 0.
 * The floor is the lower median of the stage's other claims and own_s,
 * divided by FLOW_GUARD_COST_RATIO (liars that are half the votes or more
 * defeat it). With no reference (no other claim of that stage, own_s 0)
 * the claim stands. *first_clamp is set the first time this peer's claim is raised. */
double flow_guard_cost_claim(flow_guard *g, const gw_id *from, int stage, double claimed_s, double own_s,
                             bool *first_clamp);

#endif
