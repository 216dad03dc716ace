/* Unit tests of the reference solvers and the instance format: the exact
 * min-cost max-flow against brute force on tiny graphs, the greedy baseline
 * on a case with a known answer, Table V generation, JSON parsing with
 * named errors, and the solution checker. */
#include "flowtest.h"

#include "flow/greedy.h"
#include "flow/instance.h"
#include "flow/mcf.h"
#include "flow/solution.h"

static void test_mcf_graph(void **state) {
  (void)state;
  /* s=0 -> {1, 2} -> t=3; the cheap route is narrow. */
  mcf_graph *g = mcf_new(4);
  assert_non_null(g);
  int e01 = mcf_add_edge(g, 0, 1, 1, 1);
  int e02 = mcf_add_edge(g, 0, 2, 5, 4);
  int e13 = mcf_add_edge(g, 1, 3, 5, 1);
  int e23 = mcf_add_edge(g, 2, 3, 5, 4);
  mcf_add_edge(g, 1, 2, 5, 0);
  assert_true(e01 >= 0 && e02 >= 0 && e13 >= 0 && e23 >= 0);
  assert_int_equal(mcf_add_edge(g, 0, 9, 1, 1), GW_EINVAL);
  assert_int_equal(mcf_add_edge(g, 0, 1, 1, -1), GW_EINVAL);
  int flow;
  double cost;
  assert_int_equal(mcf_solve(g, 0, 3, 3, &flow, &cost), 0);
  assert_int_equal(flow, 3);
  assert_near(cost, 2 + 8 + 8, 1e-12);
  assert_int_equal(mcf_edge_flow(g, e01), 1);
  assert_int_equal(mcf_edge_flow(g, e02), 2);
  mcf_free(g);
}

/* ---- brute force on tiny instances ---- */

typedef struct brute {
  const flow_instance *in;
  const flow_adjacency *adj;
  int (*paths)[8];
  double *cost;
  int n_paths;
  int *left; /* capacity left per node */
  int best_n;
  double best_cost;
} brute;

static void enum_paths(brute *b, int *path, int hop) {
  const flow_instance *in = b->in;
  int len = in->stages + 2;
  if (hop == len) {
    memcpy(b->paths[b->n_paths], path, (size_t)len * sizeof(int));
    b->cost[b->n_paths++] = flow_path_cost(in, b->adj, path);
    return;
  }
  for (int v = 0; v < in->n_nodes; v++) {
    if (hop == len - 1 ? v != path[0] : in->nodes[v].stage != hop) continue;
    if (flow_adjacency_link(in, b->adj, path[hop - 1], v) < 0) continue;
    path[hop] = v;
    enum_paths(b, path, hop + 1);
  }
}

/* Every multiset of paths that fits the capacities: most flows, then least cost. */
static void search(brute *b, int k, int n, double cost) {
  if (n > b->best_n || (n == b->best_n && cost < b->best_cost - 1e-9)) {
    b->best_n = n;
    b->best_cost = cost;
  }
  if (k == b->n_paths) return;
  search(b, k + 1, n, cost); /* path k no more */
  const int *p = b->paths[k];
  int len = b->in->stages + 2, taken = 0;
  for (;;) {
    bool fits = true;
    for (int i = 0; i + 1 < len; i++) fits = fits && b->left[p[i]] > 0;
    if (!fits) break;
    for (int i = 0; i + 1 < len; i++) b->left[p[i]]--;
    taken++;
    search(b, k + 1, n + taken, cost + taken * b->cost[k]);
  }
  for (int i = 0; i + 1 < len; i++) b->left[p[i]] += taken;
}

/* A random tiny instance: one data node, `per` relays per stage, some links missing. */
static void tiny_instance(gw_rng *r, int stages, int per, flow_instance *in) {
  memset(in, 0, sizeof(*in));
  in->stages = stages;
  in->n_nodes = 1 + stages * per;
  in->nodes = calloc((size_t)in->n_nodes, sizeof(*in->nodes));
  in->links = calloc((size_t)in->n_nodes * (size_t)in->n_nodes, sizeof(*in->links));
  in->nodes[0] = (flow_inst_node){0, 0, (int)gw_rng_range(r, 1, 4), 0};
  for (int i = 1; i < in->n_nodes; i++)
    in->nodes[i] = (flow_inst_node){i, 1 + (i - 1) / per, (int)gw_rng_range(r, 1, 2), (double)gw_rng_range(r, 0, 2)};
  for (int a = 0; a < in->n_nodes; a++)
    for (int b = 0; b < in->n_nodes; b++)
      if (in->nodes[b].stage == (in->nodes[a].stage + 1) % (stages + 1) && gw_rng_uniform(r) < 0.8)
        in->links[in->n_links++] = (flow_inst_link){a, b, (double)gw_rng_range(r, 1, 9)};
}

static void test_optimal_matches_brute_force(void **state) {
  (void)state;
  gw_rng r;
  gw_rng_seed(&r, 2024);
  int checked = 0, nontrivial = 0;
  for (int t = 0; t < 60; t++) {
    flow_instance in;
    tiny_instance(&r, t % 2 ? 2 : 3, t % 2 ? 3 : 2, &in);
    char err[FLOW_ERR_LEN];
    assert_int_equal(flow_instance_validate(&in, err, sizeof(err)), 0);
    flow_adjacency adj;
    assert_int_equal(flow_adjacency_build(&in, &adj), 0);
    int paths[64][8];
    double cost[64];
    int left[16];
    for (int i = 0; i < in.n_nodes; i++) left[i] = in.nodes[i].capacity;
    brute b = {&in, &adj, paths, cost, 0, left, 0, 0};
    int path[8] = {0};
    enum_paths(&b, path, 1);
    search(&b, 0, 0, 0);
    flow_solution sol;
    assert_int_equal(flow_optimal(&in, NULL, &sol), 0);
    assert_int_equal(sol.n_flows, b.best_n);
    assert_near(flow_solution_total(&sol), b.best_cost, 1e-9);
    assert_int_equal(flow_solution_check(&in, &sol, err, sizeof(err)), 0);
    int most;
    assert_int_equal(flow_max_flows(&in, NULL, &most), 0);
    assert_int_equal(most, b.best_n); /* one data node: the relaxation is exact */
    checked++;
    nontrivial += b.best_n >= 2;
    flow_solution_free(&sol);
    flow_adjacency_free(&adj);
    flow_instance_free(&in);
  }
  assert_int_equal(checked, 60);
  assert_true(nontrivial >= 30); /* most random cases route several flows */
}

static void test_optimal_refuses_several_data_nodes(void **state) {
  (void)state;
  flow_instance in;
  assert_int_equal(flow_instance_table5(5, 1, &in), 0);
  flow_solution sol;
  assert_int_equal(flow_optimal(&in, NULL, &sol), GW_EUNSUPPORTED);
  flow_solution_free(&sol);
  /* ... but the relaxed count is there: the smallest stage's capacity (all
   * links complete, data nodes never the bottleneck) */
  int most, smallest = 1 << 30;
  assert_int_equal(flow_max_flows(&in, NULL, &most), 0);
  for (int s = 1; s <= in.stages; s++) {
    int c = 0;
    for (int i = 0; i < in.n_nodes; i++) c += in.nodes[i].stage == s ? in.nodes[i].capacity : 0;
    smallest = c < smallest ? c : smallest;
  }
  assert_int_equal(most, smallest);
  flow_instance_free(&in);
}

/* d -> {a:1, b:2} -> {c, e} -> d, relays of capacity 1. Greedy takes the
 * cheap first hop a, whose only onward link is expensive; the optimum
 * routes d-b-c-d and d-a-e-d. */
static const char *greedy_case =
    "{\"stages\": 2, \"nodes\": ["
    "{\"id\": 0, \"stage\": 0, \"capacity\": 2},"
    "{\"id\": 1, \"stage\": 1, \"capacity\": 1}, {\"id\": 2, \"stage\": 1, \"capacity\": 1},"
    "{\"id\": 3, \"stage\": 2, \"capacity\": 1}, {\"id\": 4, \"stage\": 2, \"capacity\": 1}],"
    "\"links\": ["
    "{\"from\": 0, \"to\": 1, \"cost\": 1}, {\"from\": 0, \"to\": 2, \"cost\": 2},"
    "{\"from\": 1, \"to\": 3, \"cost\": 1}, {\"from\": 1, \"to\": 4, \"cost\": 9},"
    "{\"from\": 2, \"to\": 3, \"cost\": 1},"
    "{\"from\": 3, \"to\": 0, \"cost\": 1}, {\"from\": 4, \"to\": 0, \"cost\": 1}]}";

static void test_greedy(void **state) {
  (void)state;
  flow_instance in;
  char err[FLOW_ERR_LEN];
  assert_int_equal(flow_instance_parse(greedy_case, strlen(greedy_case), &in, err, sizeof(err)), 0);
  flow_solution g, o;
  assert_int_equal(flow_greedy(&in, NULL, &g), 0);
  assert_int_equal(flow_optimal(&in, NULL, &o), 0);
  /* greedy: d-1-3-d (3), then 1 is full: d-2, 2's only link goes to 3, full: stuck */
  assert_int_equal(g.n_flows, 1);
  assert_near(flow_solution_total(&g), 3, 0);
  const int *p = flow_solution_path(&g, 0);
  assert_int_equal(in.nodes[p[1]].id, 1);
  assert_int_equal(in.nodes[p[2]].id, 3);
  assert_int_equal(o.n_flows, 2);
  assert_near(flow_solution_total(&o), (2 + 1 + 1) + (1 + 9 + 1), 0);
  assert_int_equal(flow_solution_check(&in, &g, err, sizeof(err)), 0);
  assert_int_equal(flow_solution_check(&in, &o, err, sizeof(err)), 0);
  /* Excluding node 3 (crashed) leaves d-1-4-d only. */
  unsigned char gone[5] = {0, 0, 0, 1, 0};
  flow_solution_free(&o);
  assert_int_equal(flow_optimal(&in, gone, &o), 0);
  assert_int_equal(o.n_flows, 1);
  assert_near(flow_solution_total(&o), 11, 0);
  flow_solution_free(&g);
  flow_solution_free(&o);
  flow_instance_free(&in);
}

static void test_solution_check_catches_violations(void **state) {
  (void)state;
  flow_instance in;
  char err[FLOW_ERR_LEN];
  assert_int_equal(flow_instance_parse(greedy_case, strlen(greedy_case), &in, err, sizeof(err)), 0);
  flow_solution s;
  flow_solution_init(&s, in.stages);
  int a[4] = {0, 1, 3, 0};
  assert_int_equal(flow_solution_add(&s, a, 3), 0);
  assert_int_equal(flow_solution_check(&in, &s, err, sizeof(err)), 0);
  assert_int_equal(flow_solution_add(&s, a, 3), 0); /* node 1 carries 2 > 1 */
  assert_int_equal(flow_solution_check(&in, &s, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "capacity"));
  flow_solution_free(&s);
  int wrong_cost[4] = {0, 1, 3, 0};
  assert_int_equal(flow_solution_add(&s, wrong_cost, 4), 0);
  assert_int_equal(flow_solution_check(&in, &s, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "cost"));
  flow_solution_free(&s);
  int no_link[4] = {0, 2, 4, 0}; /* 2 -> 4 does not exist */
  assert_int_equal(flow_solution_add(&s, no_link, 4), 0);
  assert_int_equal(flow_solution_check(&in, &s, err, sizeof(err)), GW_EINVAL);
  flow_solution_free(&s);
  flow_instance_free(&in);
}

static void test_table5(void **state) {
  (void)state;
  static const int want[6][7] = {/* sources relays stages cap_lo cap_hi cost_lo cost_hi (inclusive) */
                                 {1, 40, 8, 1, 2, 1, 19}, {1, 40, 10, 1, 2, 1, 19}, {1, 40, 8, 5, 14, 1, 19},
                                 {1, 40, 8, 1, 2, 5, 99}, {2, 40, 8, 1, 2, 1, 19},  {4, 80, 8, 1, 2, 1, 19}};
  for (int k = 1; k <= 6; k++) {
    flow_instance in, again, other;
    assert_int_equal(flow_instance_table5(k, 11, &in), 0);
    const int *w = want[k - 1];
    char err[FLOW_ERR_LEN];
    assert_int_equal(flow_instance_validate(&in, err, sizeof(err)), 0);
    assert_int_equal(flow_instance_sources(&in), w[0]);
    assert_int_equal(in.n_nodes - w[0], w[1]);
    assert_int_equal(in.stages, w[2]);
    int per_stage[16] = {0}, stage_cap[16] = {0};
    for (int i = 0; i < in.n_nodes; i++) {
      per_stage[in.nodes[i].stage]++;
      if (in.nodes[i].stage == 0) continue;
      stage_cap[in.nodes[i].stage] += in.nodes[i].capacity;
      assert_in_range(in.nodes[i].capacity, w[3], w[4]);
    }
    int max_cap = 0;
    for (int s = 1; s <= in.stages; s++) {
      assert_int_equal(per_stage[s], w[1] / w[2]);
      max_cap = stage_cap[s] > max_cap ? stage_cap[s] : max_cap;
    }
    for (int i = 0; i < w[0]; i++) assert_int_equal(in.nodes[i].capacity, max_cap);
    /* complete between consecutive stages, in ring order */
    int expect_links = 0;
    for (int s = 0; s <= in.stages; s++) expect_links += per_stage[s] * per_stage[(s + 1) % (in.stages + 1)];
    assert_int_equal(in.n_links, expect_links);
    double lo = 1e9, hi = -1;
    for (int l = 0; l < in.n_links; l++) {
      assert_true(in.links[l].cost == floor(in.links[l].cost));
      lo = in.links[l].cost < lo ? in.links[l].cost : lo;
      hi = in.links[l].cost > hi ? in.links[l].cost : hi;
    }
    assert_true(lo >= w[5] && hi <= w[6]);
    /* the same seed gives the same instance; another seed another one */
    assert_int_equal(flow_instance_table5(k, 11, &again), 0);
    assert_int_equal(flow_instance_table5(k, 12, &other), 0);
    char *j1 = flow_instance_to_json(&in), *j2 = flow_instance_to_json(&again), *j3 = flow_instance_to_json(&other);
    assert_string_equal(j1, j2);
    assert_true(strcmp(j1, j3) != 0);
    /* and it survives a trip through JSON */
    flow_instance back;
    assert_int_equal(flow_instance_parse(j1, strlen(j1), &back, err, sizeof(err)), 0);
    char *j4 = flow_instance_to_json(&back);
    assert_string_equal(j1, j4);
    free(j1), free(j2), free(j3), free(j4);
    flow_instance_free(&in), flow_instance_free(&again), flow_instance_free(&other), flow_instance_free(&back);
  }
  flow_instance none;
  assert_int_equal(flow_instance_table5(7, 1, &none), GW_EINVAL);
}

static void test_instance_errors_are_named(void **state) {
  (void)state;
  static const struct {
    const char *json, *expect;
  } cases[] = {
      {"{", "not valid JSON"},
      {"[]", "top level"},
      {"{\"nodes\": [], \"links\": []}", "\"stages\""},
      {"{\"stages\": 0, \"nodes\": [], \"links\": []}", "stages"},
      {"{\"stages\": 1, \"nodes\": [], \"links\": []}", "nodes"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0}], \"links\": []}", "missing \"capacity\""},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1.5}], \"links\": []}", "integer"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 3, \"capacity\": 1}], \"links\": []}", "nodes[0]: stage 3"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 1, \"stage\": 1, \"capacity\": 1}], \"links\": []}", "no data node"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1}, {\"id\": 0, \"stage\": 1, "
       "\"capacity\": 1}], \"links\": []}",
       "id 0 appears more than once"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1}], \"links\": [{\"from\": 0, \"to\": 7, "
       "\"cost\": 1}]}",
       "node 7, which is not in nodes"},
      {"{\"stages\": 2, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1}, {\"id\": 2, \"stage\": 2, "
       "\"capacity\": 1}], \"links\": [{\"from\": 0, \"to\": 2, \"cost\": 1}]}",
       "links[0]: node 0 is in stage 0 but node 2 is in stage 2"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1}, {\"id\": 1, \"stage\": 1, "
       "\"capacity\": 1}], \"links\": [{\"from\": 0, \"to\": 1, \"cost\": -2}]}",
       "links[0]: cost"},
      {"{\"stages\": 1, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1}, {\"id\": 1, \"stage\": 1, "
       "\"capacity\": 1}], \"links\": [{\"from\": 0, \"to\": 1, \"cost\": 1}, {\"from\": 0, \"to\": 1, \"cost\": 2}]}",
       "more than one link"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    flow_instance in;
    char err[FLOW_ERR_LEN] = "";
    int rc = flow_instance_parse(cases[i].json, strlen(cases[i].json), &in, err, sizeof(err));
    if (rc != GW_EINVAL || !strstr(err, cases[i].expect))
      fail_msg("case %zu: rc %d, error \"%s\", expected it to mention \"%s\"", i, rc, err, cases[i].expect);
  }
  flow_instance in;
  char err[FLOW_ERR_LEN];
  assert_true(flow_instance_load("/nonexistent/instance.json", &in, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "/nonexistent/instance.json"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mcf_graph),
      cmocka_unit_test(test_optimal_matches_brute_force),
      cmocka_unit_test(test_optimal_refuses_several_data_nodes),
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_solution_check_catches_violations),
      cmocka_unit_test(test_table5),
      cmocka_unit_test(test_instance_errors_are_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
