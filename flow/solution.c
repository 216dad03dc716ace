#include "flow/solution.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int flow_adjacency_build(const flow_instance *in, flow_adjacency *adj) {
  adj->off = calloc((size_t)in->n_nodes + 1, sizeof(int));
  adj->idx = malloc(((size_t)in->n_links + 1) * sizeof(int));
  if (!adj->off || !adj->idx) {
    flow_adjacency_free(adj);
    return GW_ENOMEM;
  }
  for (int k = 0; k < in->n_links; k++) adj->off[in->links[k].from + 1]++;
  for (int u = 0; u < in->n_nodes; u++) adj->off[u + 1] += adj->off[u];
  int *fill = malloc(((size_t)in->n_nodes + 1) * sizeof(int));
  if (!fill) {
    flow_adjacency_free(adj);
    return GW_ENOMEM;
  }
  memcpy(fill, adj->off, ((size_t)in->n_nodes + 1) * sizeof(int));
  for (int k = 0; k < in->n_links; k++) adj->idx[fill[in->links[k].from]++] = k;
  free(fill);
  return 0;
}

void flow_adjacency_free(flow_adjacency *adj) {
  free(adj->off);
  free(adj->idx);
  adj->off = adj->idx = NULL;
}

int flow_adjacency_link(const flow_instance *in, const flow_adjacency *adj, int u, int v) {
  for (int k = adj->off[u]; k < adj->off[u + 1]; k++)
    if (in->links[adj->idx[k]].to == v) return adj->idx[k];
  return -1;
}

void flow_solution_init(flow_solution *s, int stages) {
  memset(s, 0, sizeof(*s));
  s->path_len = stages + 2;
}

void flow_solution_free(flow_solution *s) {
  free(s->nodes);
  free(s->cost);
  int len = s->path_len;
  memset(s, 0, sizeof(*s));
  s->path_len = len;
}

int flow_solution_add(flow_solution *s, const int *path, double cost) {
  if (s->n_flows == s->cap) {
    int cap = s->cap ? 2 * s->cap : 16;
    int *nodes = realloc(s->nodes, (size_t)cap * (size_t)s->path_len * sizeof(int));
    if (!nodes) return GW_ENOMEM;
    s->nodes = nodes;
    double *c = realloc(s->cost, (size_t)cap * sizeof(double));
    if (!c) return GW_ENOMEM;
    s->cost = c;
    s->cap = cap;
  }
  memcpy(s->nodes + (size_t)s->n_flows * (size_t)s->path_len, path, (size_t)s->path_len * sizeof(int));
  s->cost[s->n_flows++] = cost;
  return 0;
}

const int *flow_solution_path(const flow_solution *s, int k) { return s->nodes + (size_t)k * (size_t)s->path_len; }

double flow_solution_total(const flow_solution *s) {
  double t = 0;
  for (int k = 0; k < s->n_flows; k++) t += s->cost[k];
  return t;
}

double flow_solution_max(const flow_solution *s) {
  double m = 0;
  for (int k = 0; k < s->n_flows; k++) m = s->cost[k] > m ? s->cost[k] : m;
  return m;
}

/* qsort has no context argument; path_len travels in the element itself. */
typedef struct sort_item {
  const int *path;
  int len;
  double cost;
} sort_item;

static int cmp_item(const void *a, const void *b) {
  const sort_item *x = a, *y = b;
  for (int i = 0; i < x->len; i++)
    if (x->path[i] != y->path[i]) return (x->path[i] > y->path[i]) - (x->path[i] < y->path[i]);
  return (x->cost > y->cost) - (x->cost < y->cost);
}

void flow_solution_sort(flow_solution *s) {
  if (s->n_flows < 2) return;
  size_t n = (size_t)s->n_flows, len = (size_t)s->path_len;
  sort_item *items = malloc(n * sizeof(*items));
  int *nodes = malloc(n * len * sizeof(int));
  double *cost = malloc(n * sizeof(double));
  if (items && nodes && cost) {
    for (size_t k = 0; k < n; k++) items[k] = (sort_item){s->nodes + k * len, (int)len, s->cost[k]};
    qsort(items, n, sizeof(*items), cmp_item);
    for (size_t k = 0; k < n; k++) {
      memcpy(nodes + k * len, items[k].path, len * sizeof(int));
      cost[k] = items[k].cost;
    }
    memcpy(s->nodes, nodes, n * len * sizeof(int));
    memcpy(s->cost, cost, n * sizeof(double));
  }
  /* On allocation failure the order stays as found: still a valid solution. */
  free(items);
  free(nodes);
  free(cost);
}

double flow_path_cost(const flow_instance *in, const flow_adjacency *adj, const int *path) {
  int len = in->stages + 2;
  double c = in->nodes[path[0]].cost;
  for (int i = 0; i + 1 < len; i++) {
    int k = flow_adjacency_link(in, adj, path[i], path[i + 1]);
    if (k < 0) return -1;
    c += in->links[k].cost;
    if (i + 1 < len - 1) c += in->nodes[path[i + 1]].cost;
  }
  return c;
}


static int check_path(const flow_instance *in, const flow_adjacency *adj, const flow_solution *s, int k, int *load,
                      char *err, size_t err_len) {
  const int *p = flow_solution_path(s, k);
  int len = s->path_len;
  if (p[0] < 0 || p[0] >= in->n_nodes || in->nodes[p[0]].stage != 0 || p[len - 1] != p[0])
    return flow_error(err, err_len, GW_EINVAL, "flow %d does not start and end at the same data node", k);
  for (int i = 1; i + 1 < len; i++) {
    if (p[i] < 0 || p[i] >= in->n_nodes || in->nodes[p[i]].stage != i)
      return flow_error(err, err_len, GW_EINVAL, "flow %d: hop %d is not a stage-%d relay", k, i, i);
    load[p[i]]++;
  }
  load[p[0]]++;
  double c = flow_path_cost(in, adj, p);
  if (c < 0) return flow_error(err, err_len, GW_EINVAL, "flow %d uses a link that does not exist", k);
  if (fabs(c - s->cost[k]) > 1e-6 * (1 + fabs(c)))
    return flow_error(err, err_len, GW_EINVAL, "flow %d: reported cost %.6g but its links sum to %.6g", k, s->cost[k], c);
  return 0;
}

int flow_solution_check(const flow_instance *in, const flow_solution *s, char *err, size_t err_len) {
  if (s->path_len != in->stages + 2) return flow_error(err, err_len, GW_EINVAL, "paths have the wrong length");
  flow_adjacency adj;
  int *load = calloc((size_t)in->n_nodes, sizeof(int));
  if (!load || flow_adjacency_build(in, &adj) != 0) {
    free(load);
    return GW_ENOMEM;
  }
  int rc = 0;
  for (int k = 0; k < s->n_flows && rc == 0; k++) rc = check_path(in, &adj, s, k, load, err, err_len);
  for (int i = 0; i < in->n_nodes && rc == 0; i++)
    if (load[i] > in->nodes[i].capacity)
      rc = flow_error(err, err_len, GW_EINVAL, "node %d carries %d flows but its capacity is %d", in->nodes[i].id, load[i],
                in->nodes[i].capacity);
  flow_adjacency_free(&adj);
  free(load);
  return rc;
}

json_t *flow_solution_json(const flow_instance *in, const flow_solution *s) {
  json_t *o = json_object(), *flows = json_array();
  if (!o || !flows) {
    json_decref(o);
    json_decref(flows);
    return NULL;
  }
  json_object_set_new(o, "num_flows", json_integer(s->n_flows));
  json_object_set_new(o, "total_cost", json_real(flow_solution_total(s)));
  json_object_set_new(o, "max_flow_cost", json_real(flow_solution_max(s)));
  for (int k = 0; k < s->n_flows; k++) {
    const int *p = flow_solution_path(s, k);
    json_t *path = json_array();
    for (int i = 0; i < s->path_len; i++) json_array_append_new(path, json_integer(in->nodes[p[i]].id));
    json_array_append_new(flows,
                          json_pack("{s:i,s:o,s:f}", "source", in->nodes[p[0]].id, "path", path, "cost", s->cost[k]));
  }
  json_object_set_new(o, "flows", flows);
  return o;
}
