/* flow/solution.h — a set of flows on an instance, whichever algorithm found
 * it (exact optimum, greedy baseline, or the simulated protocol), with the
 * checks and the JSON output that `gwtf sim flow` prints.
 *
 * A flow is a path of node indices d, n1, ..., nS, d (length stages + 2).
 * Its cost is the sum of its link costs plus the processing cost of every
 * node on it (the instance's optional node "cost", counted once per node;
 * the data node once). */
#ifndef GWTF_FLOW_SOLUTION_H
#define GWTF_FLOW_SOLUTION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "flow/instance.h"

typedef struct flow_solution {
  int path_len; /* stages + 2 */
  int n_flows, cap;
  int *nodes;   /* n_flows * path_len node indices */
  double *cost; /* per flow */
} flow_solution;

/* Outgoing links of every node, for cost look-ups: the links leaving node u
 * are idx[off[u] .. off[u+1]). */
typedef struct flow_adjacency {
  int *off, *idx;
} flow_adjacency;

int flow_adjacency_build(const flow_instance *in, flow_adjacency *adj);
void flow_adjacency_free(flow_adjacency *adj);
/* Index of the link u -> v, or -1. */
int flow_adjacency_link(const flow_instance *in, const flow_adjacency *adj, int u, int v);

void flow_solution_init(flow_solution *s, int stages);
void flow_solution_free(flow_solution *s);
/* Appends a path (path_len node indices) with its cost. 0 or GW_ENOMEM. */
int flow_solution_add(flow_solution *s, const int *path, double cost);
const int *flow_solution_path(const flow_solution *s, int k);
double flow_solution_total(const flow_solution *s);
double flow_solution_max(const flow_solution *s);
/* Sorts flows by (source, path) so output does not depend on discovery order. */
void flow_solution_sort(flow_solution *s);

/* Cost of a path by the instance, or -1 when a hop has no link. */
double flow_path_cost(const flow_instance *in, const flow_adjacency *adj, const int *path);

/* Checks that every flow is a valid path (ring order, existing links, ends at
 * its own data node), that its stored cost is the path's cost, that no relay
 * carries more than its capacity and no data node more than it wants.
 * Returns 0 or GW_EINVAL with err naming the first violation. */
int flow_solution_check(const flow_instance *in, const flow_solution *s, char *err, size_t err_len);

/* The output object without the algorithm fields:
 * {"num_flows", "total_cost", "max_flow_cost", "flows": [{"source", "path", "cost"}]}
 * with node ids as in the instance. The caller adds algo/objective/rounds/
 * messages. NULL on allocation failure. */
json_t *flow_solution_json(const flow_instance *in, const flow_solution *s);

#endif
