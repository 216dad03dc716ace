#include "flow/greedy.h"

#include <stdbool.h>
#include <stdlib.h>

#include "util/err.h"

/* Cheapest usable link from u to the next stage, or -1. */
static int cheapest_next(const flow_instance *in, const flow_adjacency *adj, const unsigned char *exclude,
                         const int *load, int u, int d, bool last_relay_stage) {
  int best = -1;
  for (int k = adj->off[u]; k < adj->off[u + 1]; k++) {
    const flow_inst_link *l = &in->links[adj->idx[k]];
    int v = l->to;
    if (exclude && exclude[v]) continue;
    if (in->nodes[v].stage == 0) {
      if (v != d) continue; /* a flow returns to its own data node */
    } else {
      if (load[v] >= in->nodes[v].capacity) continue;
      if (last_relay_stage && flow_adjacency_link(in, adj, v, d) < 0) continue;
    }
    if (best < 0 || l->cost < in->links[best].cost || (l->cost == in->links[best].cost && v < in->links[best].to))
      best = adj->idx[k];
  }
  return best;
}

/* Builds one path for d; false when it reaches a dead end. */
static bool greedy_path(const flow_instance *in, const flow_adjacency *adj, const unsigned char *exclude,
                        const int *load, int d, int *path) {
  path[0] = d;
  for (int hop = 1; hop <= in->stages + 1; hop++) {
    int k = cheapest_next(in, adj, exclude, load, path[hop - 1], d, hop == in->stages);
    if (k < 0) return false;
    path[hop] = in->links[k].to;
  }
  return true;
}

int flow_greedy(const flow_instance *in, const unsigned char *exclude, flow_solution *out) {
  flow_solution_init(out, in->stages);
  flow_adjacency adj;
  if (flow_adjacency_build(in, &adj) != 0) return GW_ENOMEM;
  int *load = calloc((size_t)in->n_nodes, sizeof(int));
  bool *active = calloc((size_t)in->n_nodes, sizeof(bool));
  int *path = malloc(((size_t)in->stages + 2) * sizeof(int));
  int rc = load && active && path ? 0 : GW_ENOMEM;
  int n_active = 0;
  for (int i = 0; i < in->n_nodes && rc == 0; i++)
    if (in->nodes[i].stage == 0 && !(exclude && exclude[i]) && in->nodes[i].capacity > 0) {
      active[i] = true;
      n_active++;
    }
  while (rc == 0 && n_active > 0) {
    for (int d = 0; d < in->n_nodes && rc == 0; d++) {
      if (!active[d]) continue;
      if (!greedy_path(in, &adj, exclude, load, d, path)) {
        active[d] = false;
        n_active--;
        continue;
      }
      for (int hop = 0; hop <= in->stages; hop++) load[path[hop]]++;
      rc = flow_solution_add(out, path, flow_path_cost(in, &adj, path));
      if (load[d] >= in->nodes[d].capacity) {
        active[d] = false;
        n_active--;
      }
    }
  }
  free(load);
  free(active);
  free(path);
  flow_adjacency_free(&adj);
  if (rc == 0) flow_solution_sort(out);
  return rc;
}
