/* flow/mcf.h — exact min-cost max-flow (the paper's "optimal" reference).
 *
 * A small general solver: successive shortest paths, Dijkstra on reduced
 * costs with Johnson potentials. Edge costs must be >= 0 (every cost in an
 * instance is), so the potentials start at zero and stay valid after each
 * augmentation. Capacities are integers, so the optimum is integral and every
 * augmentation moves whole flows.
 *
 * flow_optimal() applies it to an instance with one data node: every relay v
 * is split into v_in -> v_out (capacity = its capacity, cost = its processing
 * cost), every link u -> v becomes u_out -> v_in, and the data node d is the
 * source d_out (supply = its demand) and the sink d_in. The result is
 * decomposed into unit paths d, n1, ..., nS, d.
 *
 * Instances with several data nodes are a different problem — each flow must
 * return to the data node it came from, a multi-commodity integer flow — and
 * are refused with GW_EUNSUPPORTED (the paper, too, compares settings 5 and 6
 * with the greedy baseline only). */
#ifndef GWTF_FLOW_MCF_H
#define GWTF_FLOW_MCF_H

#include "flow/instance.h"
#include "flow/solution.h"

typedef struct mcf_graph mcf_graph;

mcf_graph *mcf_new(int n_vertices);
void mcf_free(mcf_graph *g);
/* Adds u -> v with capacity cap >= 0 and cost >= 0. Returns the edge index
 * (for mcf_edge_flow) or a negative GW_E* code. */
int mcf_add_edge(mcf_graph *g, int u, int v, int cap, double cost);
/* Sends as much flow as possible, at most max_flow, from s to t at minimum
 * cost. Returns 0 or GW_ENOMEM / GW_EINVAL. */
int mcf_solve(mcf_graph *g, int s, int t, int max_flow, int *flow_out, double *cost_out);
/* Flow on edge e after mcf_solve. */
int mcf_edge_flow(const mcf_graph *g, int e);

/* Exact min-cost max-flow of a one-data-node instance, as flows. `exclude`
 * (may be NULL) marks nodes to leave out (crashed relays). Returns 0,
 * GW_EUNSUPPORTED (several data nodes) or GW_ENOMEM. */
int flow_optimal(const flow_instance *in, const unsigned char *exclude, flow_solution *out);

/* The most flows the instance can carry if any data node's flow could end at
 * any data node: all sources behind one super-source, all sinks before one
 * super-sink. With one data node it is exactly the optimum's count; with
 * several it is an upper bound (a flow must return to its own data node).
 * Returns 0 or GW_ENOMEM. */
int flow_max_flows(const flow_instance *in, const unsigned char *exclude, int *count);

#endif
