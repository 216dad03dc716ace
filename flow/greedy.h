/* flow/greedy.h — the SWARM-style baseline of the paper's Fig. 7.
 *
 * "Sending to the next stage closest node": a microbatch of data node d
 * leaves d for the cheapest stage-1 relay that still has spare capacity,
 * that relay sends it to the cheapest stage-2 relay with spare capacity, and
 * so on; the last stage sends it back to d. No look-ahead, no rerouting.
 *
 * Data nodes take turns, one flow each, until each has what it wants or can
 * get no further flow. At the last stage only relays with a link back to d
 * count as candidates (a relay that cannot reach d is not a next hop for d's
 * microbatch); a path that reaches a dead end is not counted and d stops.
 * Ties go to the lower node index, so the result is deterministic. */
#ifndef GWTF_FLOW_GREEDY_H
#define GWTF_FLOW_GREEDY_H

#include "flow/instance.h"
#include "flow/solution.h"

/* Returns 0 or GW_ENOMEM. exclude (may be NULL) marks nodes to leave out. */
int flow_greedy(const flow_instance *in, const unsigned char *exclude, flow_solution *out);

#endif
