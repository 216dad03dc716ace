#include "flow/mcf.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* Edges live in pairs: e and e ^ 1 are an edge and its residual reverse. */
typedef struct mcf_edge {
  int to, next; /* next: the following edge out of the same vertex, -1 ends */
  int cap;      /* residual capacity */
  double cost;
} mcf_edge;

struct mcf_graph {
  int n;
  int *head; /* first edge out of each vertex */
  mcf_edge *e;
  int n_edges, cap_edges;
  int *orig_cap; /* capacity as added, per forward edge pair */
};

mcf_graph *mcf_new(int n_vertices) {
  if (n_vertices < 1) return NULL;
  mcf_graph *g = calloc(1, sizeof(*g));
  if (!g) return NULL;
  g->n = n_vertices;
  g->head = malloc((size_t)n_vertices * sizeof(int));
  if (!g->head) {
    free(g);
    return NULL;
  }
  for (int i = 0; i < n_vertices; i++) g->head[i] = -1;
  return g;
}

void mcf_free(mcf_graph *g) {
  if (!g) return;
  free(g->head);
  free(g->e);
  free(g->orig_cap);
  free(g);
}

int mcf_add_edge(mcf_graph *g, int u, int v, int cap, double cost) {
  if (u < 0 || v < 0 || u >= g->n || v >= g->n || cap < 0 || !(cost >= 0) || !isfinite(cost)) return GW_EINVAL;
  if (g->n_edges + 2 > g->cap_edges) {
    int cap_e = g->cap_edges ? 2 * g->cap_edges : 64;
    mcf_edge *e = realloc(g->e, (size_t)cap_e * sizeof(*e));
    if (!e) return GW_ENOMEM;
    g->e = e;
    int *oc = realloc(g->orig_cap, (size_t)(cap_e / 2) * sizeof(int));
    if (!oc) return GW_ENOMEM;
    g->orig_cap = oc;
    g->cap_edges = cap_e;
  }
  int k = g->n_edges;
  g->e[k] = (mcf_edge){v, g->head[u], cap, cost};
  g->head[u] = k;
  g->e[k + 1] = (mcf_edge){u, g->head[v], 0, -cost};
  g->head[v] = k + 1;
  g->orig_cap[k / 2] = cap;
  g->n_edges += 2;
  return k;
}

int mcf_edge_flow(const mcf_graph *g, int e) { return g->orig_cap[e / 2] - g->e[e].cap; }

/* ---- Dijkstra on reduced costs ---- */

typedef struct heap_item {
  double d;
  int v;
} heap_item;

typedef struct dijkstra {
  double *dist, *pot;
  int *prev_edge;
  heap_item *heap;
  int n_heap, cap_heap;
} dijkstra;

static int heap_push(dijkstra *w, double d, int v) {
  if (w->n_heap == w->cap_heap) {
    int cap = w->cap_heap ? 2 * w->cap_heap : 256;
    heap_item *h = realloc(w->heap, (size_t)cap * sizeof(*h));
    if (!h) return GW_ENOMEM;
    w->heap = h;
    w->cap_heap = cap;
  }
  int i = w->n_heap++;
  /* Ties by vertex number keep the chosen paths independent of push order. */
  while (i > 0) {
    int p = (i - 1) / 2;
    if (w->heap[p].d < d || (w->heap[p].d == d && w->heap[p].v <= v)) break;
    w->heap[i] = w->heap[p];
    i = p;
  }
  w->heap[i] = (heap_item){d, v};
  return 0;
}

static heap_item heap_pop(dijkstra *w) {
  heap_item top = w->heap[0], last = w->heap[--w->n_heap];
  int i = 0, n = w->n_heap;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    heap_item best = last;
    if (l < n && (w->heap[l].d < best.d || (w->heap[l].d == best.d && w->heap[l].v < best.v))) m = l, best = w->heap[l];
    if (r < n && (w->heap[r].d < best.d || (w->heap[r].d == best.d && w->heap[r].v < best.v))) m = r;
    if (m == i) break;
    w->heap[i] = w->heap[m];
    i = m;
  }
  if (n > 0) w->heap[i] = last;
  return top;
}

/* Shortest residual path from s by reduced cost; false when t is unreachable. */
static int shortest_path(const mcf_graph *g, dijkstra *w, int s, int t, bool *reached) {
  for (int i = 0; i < g->n; i++) {
    w->dist[i] = DBL_MAX;
    w->prev_edge[i] = -1;
  }
  w->dist[s] = 0;
  w->n_heap = 0;
  if (heap_push(w, 0, s) != 0) return GW_ENOMEM;
  while (w->n_heap > 0) {
    heap_item it = heap_pop(w);
    if (it.d > w->dist[it.v]) continue;
    for (int k = g->head[it.v]; k >= 0; k = g->e[k].next) {
      const mcf_edge *e = &g->e[k];
      if (e->cap <= 0) continue;
      /* Reduced costs are >= 0 up to rounding; clamp so Dijkstra stays sound. */
      double rc = e->cost + w->pot[it.v] - w->pot[e->to];
      if (rc < 0) rc = 0;
      double nd = it.d + rc;
      if (nd < w->dist[e->to] - 1e-12) {
        w->dist[e->to] = nd;
        w->prev_edge[e->to] = k;
        if (heap_push(w, nd, e->to) != 0) return GW_ENOMEM;
      }
    }
  }
  *reached = w->dist[t] < DBL_MAX;
  return 0;
}

int mcf_solve(mcf_graph *g, int s, int t, int max_flow, int *flow_out, double *cost_out) {
  if (s < 0 || t < 0 || s >= g->n || t >= g->n || s == t || max_flow < 0) return GW_EINVAL;
  dijkstra w = {0};
  w.dist = malloc((size_t)g->n * sizeof(double));
  w.pot = calloc((size_t)g->n, sizeof(double));
  w.prev_edge = malloc((size_t)g->n * sizeof(int));
  int rc = (w.dist && w.pot && w.prev_edge) ? 0 : GW_ENOMEM;
  int flow = 0;
  double cost = 0;
  while (rc == 0 && flow < max_flow) {
    bool reached = false;
    rc = shortest_path(g, &w, s, t, &reached);
    if (rc != 0 || !reached) break;
    for (int v = 0; v < g->n; v++)
      if (w.dist[v] < DBL_MAX) w.pot[v] += w.dist[v];
    int push = max_flow - flow;
    for (int v = t; v != s; v = g->e[w.prev_edge[v] ^ 1].to)
      if (g->e[w.prev_edge[v]].cap < push) push = g->e[w.prev_edge[v]].cap;
    for (int v = t; v != s; v = g->e[w.prev_edge[v] ^ 1].to) {
      int k = w.prev_edge[v];
      g->e[k].cap -= push;
      g->e[k ^ 1].cap += push;
      cost += (double)push * g->e[k].cost;
    }
    flow += push;
  }
  free(w.dist);
  free(w.pot);
  free(w.prev_edge);
  free(w.heap);
  if (flow_out) *flow_out = flow;
  if (cost_out) *cost_out = cost;
  return rc;
}

/* ---- instances ---- */

/* Vertex numbering: node i has in = 2i and out = 2i + 1; then source, sink. */
#define V_IN(i) (2 * (i))
#define V_OUT(i) (2 * (i) + 1)

/* Walks one unit of flow from the data node back to it, consuming it. */
static int take_path(mcf_graph *g, const flow_instance *in, int d, int *used, int *path) {
  int v = V_OUT(d), len = in->stages + 2;
  path[0] = d;
  for (int hop = 1; hop < len; hop++) {
    int found = -1;
    for (int k = g->head[v]; k >= 0 && found < 0; k = g->e[k].next)
      if (!(k & 1) && g->e[k].to < 2 * in->n_nodes && mcf_edge_flow(g, k) - used[k / 2] > 0) found = k;
    if (found < 0) return GW_EINVAL; /* cannot happen for a valid decomposition */
    used[found / 2]++;
    int node = g->e[found].to / 2;
    path[hop] = node;
    if (hop < len - 1) {
      /* through the node's split edge: in -> out */
      int split = -1;
      for (int k = g->head[V_IN(node)]; k >= 0 && split < 0; k = g->e[k].next)
        if (!(k & 1) && g->e[k].to == V_OUT(node)) split = k;
      if (split < 0) return GW_EINVAL;
      used[split / 2]++;
      v = V_OUT(node);
    }
  }
  return path[len - 1] == d ? 0 : GW_EINVAL;
}

/* d >= 0: that data node alone; d < 0: every data node (the relaxation). */
static int build_graph(const flow_instance *in, const unsigned char *exclude, int d, mcf_graph *g) {
  int src = 2 * in->n_nodes, sink = src + 1;
  for (int i = 0; i < in->n_nodes; i++) {
    if (in->nodes[i].stage == 0 || (exclude && exclude[i])) continue;
    if (mcf_add_edge(g, V_IN(i), V_OUT(i), in->nodes[i].capacity, in->nodes[i].cost) < 0) return GW_ENOMEM;
  }
  for (int k = 0; k < in->n_links; k++) {
    const flow_inst_link *l = &in->links[k];
    if (exclude && (exclude[l->from] || exclude[l->to])) continue;
    bool from_ok = in->nodes[l->from].stage != 0 || d < 0 || l->from == d;
    bool to_ok = in->nodes[l->to].stage != 0 || d < 0 || l->to == d;
    if (from_ok && to_ok && mcf_add_edge(g, V_OUT(l->from), V_IN(l->to), INT32_MAX / 4, l->cost) < 0) return GW_ENOMEM;
  }
  for (int i = 0; i < in->n_nodes; i++) {
    if (in->nodes[i].stage != 0 || (d >= 0 && i != d) || (exclude && exclude[i])) continue;
    if (mcf_add_edge(g, src, V_OUT(i), in->nodes[i].capacity, in->nodes[i].cost) < 0 ||
        mcf_add_edge(g, V_IN(i), sink, in->nodes[i].capacity, 0) < 0)
      return GW_ENOMEM;
  }
  return 0;
}

int flow_max_flows(const flow_instance *in, const unsigned char *exclude, int *count) {
  *count = 0;
  int src = 2 * in->n_nodes, sink = src + 1, demand = 0;
  for (int i = 0; i < in->n_nodes; i++)
    if (in->nodes[i].stage == 0 && !(exclude && exclude[i])) demand += in->nodes[i].capacity;
  mcf_graph *g = mcf_new(2 * in->n_nodes + 2);
  if (!g) return GW_ENOMEM;
  int rc = build_graph(in, exclude, -1, g);
  if (rc == 0) rc = mcf_solve(g, src, sink, demand, count, NULL);
  mcf_free(g);
  return rc;
}

int flow_optimal(const flow_instance *in, const unsigned char *exclude, flow_solution *out) {
  flow_solution_init(out, in->stages);
  if (flow_instance_sources(in) != 1) return GW_EUNSUPPORTED;
  int d = 0;
  while (in->nodes[d].stage != 0) d++;
  int src = 2 * in->n_nodes, sink = src + 1;
  mcf_graph *g = mcf_new(2 * in->n_nodes + 2);
  if (!g) return GW_ENOMEM;
  int rc = build_graph(in, exclude, d, g);
  int flow = 0;
  if (rc == 0) rc = mcf_solve(g, src, sink, in->nodes[d].capacity, &flow, NULL);
  int *used = rc == 0 ? calloc((size_t)g->n_edges / 2 + 1, sizeof(int)) : NULL;
  int *path = rc == 0 ? malloc(((size_t)in->stages + 2) * sizeof(int)) : NULL;
  flow_adjacency adj = {0};
  if (rc == 0 && (!used || !path || flow_adjacency_build(in, &adj) != 0)) rc = GW_ENOMEM;
  for (int f = 0; f < flow && rc == 0; f++) {
    rc = take_path(g, in, d, used, path);
    if (rc == 0) rc = flow_solution_add(out, path, flow_path_cost(in, &adj, path));
  }
  flow_adjacency_free(&adj);
  free(used);
  free(path);
  mcf_free(g);
  if (rc == 0) flow_solution_sort(out);
  return rc;
}
