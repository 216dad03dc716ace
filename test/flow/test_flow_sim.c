/* Simulated runs of the flow protocol (flow/simflow.h) on whole instances:
 * invariants after every step (no half-connected flows), the optimum's
 * number of flows and a cost within a measured bound of it on Table V
 * settings 1-4, beating greedy on every setting (Fig. 7), convergence under
 * 5% loss, flows rebuilt after crashes, a joining node taking flows, DENY
 * pushing a flow back to its data node, a unique optimum found exactly, and
 * byte-for-byte replay from a seed; crash recovery within 10 rounds on
 * average with and without the transport's notice, and a slow relay that
 * is pinged but never presumed dead. */
#include "flowtest.h"

#include "flow/greedy.h"
#include "flow/mcf.h"
#include "flow/simflow.h"

/* Bounds set after measuring (scripts/flow_eval.py; docs/FLOW.md has the
 * tables): over 20 seeds the mean gap to the optimum is 2.3-4.4% per
 * setting and the worst run +10.4%; on the 5 seeds this test runs, setting
 * 4 (wide link costs) averages +5.6%. */
#define GAP_MEAN_MAX (0.07)
#define GAP_RUN_MAX (0.12)

/* Default options with the objective the optimum is compared under. */
static flow_sim_opts sum_opts(uint64_t seed) {
  flow_sim_opts o;
  flow_sim_opts_default(&o);
  o.seed = seed;
  o.tun.objective = FLOW_OBJ_SUM;
  return o;
}

typedef struct watch {
  flow_simulation *s;
  char err[256];
  uint64_t steps, quiet_checks;
  bool failed;
} watch;

/* After every delivered event: each node's own invariants; and whenever no
 * message is in flight, both ends of every segment agree. */
static bool check_step(void *ud) {
  watch *w = ud;
  w->steps++;
  if (flow_sim_check_local(w->s, w->err, sizeof(w->err)) != 0) return w->failed = true;
  if (flow_sim_in_flight(w->s) == 0) {
    w->quiet_checks++;
    if (flow_sim_check_consistent(w->s, w->err, sizeof(w->err)) != 0) return w->failed = true;
  }
  return false;
}

static void run_watched(const char *what, const flow_instance *in, const flow_sim_opts *o, int rounds,
                        flow_solution *out) {
  flow_simulation *s;
  assert_int_equal(flow_sim_new(in, o, &s), 0);
  watch w = {.s = s};
  flow_sim_set_hook(s, check_step, &w);
  for (int r = 0; r < rounds && !w.failed; r++) flow_sim_round(s);
  if (w.failed)
    fail_msg("%s: round %d, after %llu steps: %s", what, flow_sim_rounds_done(s), (unsigned long long)w.steps, w.err);
  assert_true(w.quiet_checks >= (uint64_t)rounds / 2); /* the global check really ran */
  double *reported = NULL;
  assert_int_equal(flow_sim_flows(s, out, &reported), 0);
  char err[256];
  assert_int_equal(flow_solution_check(in, out, err, sizeof(err)), 0);
  /* The cost each data node believes (objective sum) is the sum of the links. */
  if (o->tun.objective == FLOW_OBJ_SUM)
    for (int k = 0; k < out->n_flows; k++) assert_near(reported[k], out->cost[k], 1e-6 * (1 + out->cost[k]));
  /* No relay is left with an inflow it cannot pass on. */
  for (int i = 0; i < in->n_nodes; i++) {
    if (!flow_sim_alive(s, i) || in->nodes[i].stage == 0) continue;
    flow_counts c;
    flow_get_counts(flow_sim_node(s, i), &c);
    assert_int_equal(c.unpaired_in, 0);
  }
  free(reported);
  flow_sim_free(s);
}

/* A random sparse instance: some links missing, capacities 1..3, 2-3 data nodes. */
static void sparse_instance(uint64_t seed, flow_instance *in) {
  gw_rng r;
  gw_rng_seed(&r, seed);
  memset(in, 0, sizeof(*in));
  int sources = 1 + (int)(seed % 3), per = 4, stages = 5;
  in->stages = stages;
  in->n_nodes = sources + per * stages;
  in->nodes = calloc((size_t)in->n_nodes, sizeof(*in->nodes));
  in->links = calloc((size_t)in->n_nodes * (size_t)in->n_nodes, sizeof(*in->links));
  for (int i = 0; i < in->n_nodes; i++)
    in->nodes[i] = (flow_inst_node){i, i < sources ? 0 : 1 + (i - sources) % stages,
                                    i < sources ? 6 : (int)gw_rng_range(&r, 1, 3), 0};
  for (int a = 0; a < in->n_nodes; a++)
    for (int b = 0; b < in->n_nodes; b++)
      if (in->nodes[b].stage == (in->nodes[a].stage + 1) % (stages + 1) && gw_rng_uniform(&r) < 0.7)
        in->links[in->n_links++] = (flow_inst_link){a, b, (double)gw_rng_range(&r, 1, 30)};
}

/* Case k of the invariant runs: Table V setting 1 or a sparse instance, each
 * objective, with and without delays that reorder messages. */
static void invariants_case(int k, uint64_t seed) {
  flow_instance in;
  if (k == 0)
    assert_int_equal(flow_instance_table5(1, 3, &in), 0);
  else
    sparse_instance(100 + (uint64_t)k, &in);
  flow_sim_opts o;
  flow_sim_opts_default(&o);
  o.seed = seed;
  o.tun.objective = k % 2 ? FLOW_OBJ_MAX : FLOW_OBJ_SUM;
  o.delay_ms = k >= 2 ? 900 : 0; /* reordering: messages overtake each other */
  flow_solution sol;
  char what[96];
  snprintf(what, sizeof(what), "case %d (%s, delay %llu ms, seed %llu)", k, k % 2 ? "max" : "sum",
           (unsigned long long)o.delay_ms, (unsigned long long)seed);
  run_watched(what, &in, &o, 100, &sol);
  assert_true(sol.n_flows > 0);
  flow_solution_free(&sol);
  flow_instance_free(&in);
}

static void test_invariants_every_step(void **state) {
  (void)state;
  for (int k = 0; k < 4; k++) invariants_case(k, 7 + (uint64_t)k);
}

/* Seeds whose runs cross two moves on one segment: a change handing over
 * its upstream end while a redirect moves its downstream end, an end handed
 * back and forth, a notify-switch reaching a peer before the accept that
 * gives it the segment. Each left a half-connected segment for a round or
 * two, until audits cleared it (1 in 15 seeds of 400 did). */
static void test_crossing_moves_stay_connected(void **state) {
  (void)state;
  static const struct {
    int k;
    uint64_t seed;
  } cases[] = {{1, 21}, {1, 11}, {0, 14}, {2, 19}, {0, 116}, {1, 172}, {1, 190}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) invariants_case(cases[i].k, cases[i].seed);
}

static void test_table5_near_optimum(void **state) {
  (void)state;
  for (int setting = 1; setting <= 4; setting++) {
    double gap_sum = 0;
    for (uint64_t seed = 1; seed <= 5; seed++) {
      flow_instance in;
      assert_int_equal(flow_instance_table5(setting, seed, &in), 0);
      flow_solution opt;
      assert_int_equal(flow_optimal(&in, NULL, &opt), 0);
      flow_sim_opts o = sum_opts(seed);
      flow_run_result r;
      assert_int_equal(flow_sim_run(&in, &o, 120, &r), 0);
      assert_int_equal(r.sol.n_flows, opt.n_flows);
      double gap = (flow_solution_total(&r.sol) - flow_solution_total(&opt)) / flow_solution_total(&opt);
      if (gap > GAP_RUN_MAX)
        fail_msg("setting %d seed %llu: %.1f%% over the optimum", setting, (unsigned long long)seed, 100 * gap);
      assert_true(gap >= -1e-9); /* never better than the optimum */
      gap_sum += gap;
      flow_run_result_free(&r);
      flow_solution_free(&opt);
      flow_instance_free(&in);
    }
    if (gap_sum / 5 > GAP_MEAN_MAX) fail_msg("setting %d: mean %.1f%% over the optimum", setting, 100 * gap_sum / 5);
  }
}

static void test_beats_greedy(void **state) {
  (void)state;
  for (int setting = 1; setting <= 6; setting++) {
    double gwtf_per_flow = 0, greedy_per_flow = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
      flow_instance in;
      assert_int_equal(flow_instance_table5(setting, seed, &in), 0);
      flow_solution g;
      assert_int_equal(flow_greedy(&in, NULL, &g), 0);
      flow_sim_opts o = sum_opts(seed);
      flow_run_result r;
      assert_int_equal(flow_sim_run(&in, &o, 120, &r), 0);
      assert_true(r.sol.n_flows >= g.n_flows - (setting >= 5)); /* several data nodes: may trade one flow */
      gwtf_per_flow += flow_solution_total(&r.sol) / r.sol.n_flows;
      greedy_per_flow += flow_solution_total(&g) / g.n_flows;
      flow_run_result_free(&r);
      flow_solution_free(&g);
      flow_instance_free(&in);
    }
    if (gwtf_per_flow >= greedy_per_flow)
      fail_msg("setting %d: gwtf %.2f per flow, greedy %.2f", setting, gwtf_per_flow / 4, greedy_per_flow / 4);
  }
}

static void test_converges_under_loss(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 3; seed++) {
    flow_instance in;
    assert_int_equal(flow_instance_table5(1, seed, &in), 0);
    flow_solution opt;
    assert_int_equal(flow_optimal(&in, NULL, &opt), 0);
    flow_sim_opts o;
    flow_sim_opts_default(&o);
    o.seed = seed;
    o.loss = 0.05;
    o.tun.objective = FLOW_OBJ_SUM;
    flow_run_result r;
    assert_int_equal(flow_sim_run(&in, &o, 150, &r), 0);
    /* Converged: all the flows in (nearly) every one of the last 20 rounds —
     * a lost message can break one for the round until its re-send — at a
     * cost near the optimum. */
    int full = 0;
    double worst = 0;
    for (int k = 130; k < 150; k++) {
      if (r.trace[k].num_flows != opt.n_flows) continue;
      full++;
      double gap = (r.trace[k].total_cost - flow_solution_total(&opt)) / flow_solution_total(&opt);
      worst = gap > worst ? gap : worst;
    }
    if (full < 17) fail_msg("seed %llu: all flows in only %d of the last 20 rounds", (unsigned long long)seed, full);
    if (worst > 0.15)
      fail_msg("seed %llu: %.1f%% over the optimum under 5%% loss", (unsigned long long)seed, 100 * worst);
    char err[256];
    assert_int_equal(flow_solution_check(&in, &r.sol, err, sizeof(err)), 0);
    flow_run_result_free(&r);
    flow_solution_free(&opt);
    flow_instance_free(&in);
  }
}

/* The nodes that carry the most flows. */
static int busiest(const flow_instance *in, const flow_solution *sol, int n, flow_sim_event *out, int round) {
  int *load = calloc((size_t)in->n_nodes, sizeof(int)), found = 0;
  for (int k = 0; k < sol->n_flows; k++)
    for (int i = 1; i + 1 < sol->path_len; i++) load[flow_solution_path(sol, k)[i]]++;
  for (; found < n; found++) {
    int best = -1;
    for (int i = 0; i < in->n_nodes; i++)
      if (load[i] > 0 && (best < 0 || load[i] > load[best])) best = i;
    if (best < 0) break;
    out[found] = (flow_sim_event){round, best};
    load[best] = 0;
  }
  free(load);
  return found;
}

/* Runs to round 60 and sets o up to crash the 10 % busiest relays (4 of
 * 40) there. */
static void run_to_crash(flow_instance *in, flow_sim_opts *o, flow_run_result *before, flow_sim_event crash[4]) {
  assert_int_equal(flow_sim_run(in, o, 60, before), 0);
  assert_int_equal(busiest(in, &before->sol, 4, crash, 60), 4);
  o->crashes = crash;
  o->n_crashes = 4;
}

static void test_crash_teardown_and_rebuild(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 3; seed++) {
    flow_instance in;
    assert_int_equal(flow_instance_table5(1, seed, &in), 0);
    flow_sim_opts o = sum_opts(seed);
    flow_run_result before;
    flow_sim_event crash[4];
    run_to_crash(&in, &o, &before, crash);
    flow_run_result r;
    assert_int_equal(flow_sim_run(&in, &o, 120, &r), 0);
    assert_int_equal(r.last_crash_round, 60);
    assert_true(r.trace[60].num_flows < before.sol.n_flows); /* they were torn down ... */
    unsigned char gone[64] = {0};
    for (int k = 0; k < 4; k++) gone[crash[k].node] = 1;
    flow_solution survivors;
    assert_int_equal(flow_optimal(&in, gone, &survivors), 0);
    /* ... and rebuilt through the others, as many as the survivors allow */
    assert_int_equal(r.sol.n_flows, survivors.n_flows < before.sol.n_flows ? survivors.n_flows : before.sol.n_flows);
    assert_true(r.recovered_round > 60 && r.recovered_round <= 60 + 30);
    for (int k = 0; k < r.sol.n_flows; k++)
      for (int i = 1; i + 1 < r.sol.path_len; i++) assert_false(gone[flow_solution_path(&r.sol, k)[i]]);
    flow_solution_free(&survivors);
    flow_run_result_free(&r);
    flow_run_result_free(&before);
    flow_instance_free(&in);
  }
}

/* Issue 20: after 10% of the relays (the busiest) crash, the flows are back
 * to what the survivors allow within 10 rounds on average — whether the
 * crash is a process crash the transport reports to its session partners
 * or a silent machine loss the flow layer finds alone (RTT-based suspicion
 * and pings); every run within 30. No live peer is presumed dead. */
static void test_crash_recovered_within_ten_rounds(void **state) {
  (void)state;
  for (int notice = 0; notice <= 1; notice++) {
    int sum = 0, n = 0;
    for (uint64_t seed = 1; seed <= 5; seed++) {
      flow_instance in;
      assert_int_equal(flow_instance_table5(1, seed, &in), 0);
      flow_sim_opts o = sum_opts(seed);
      flow_run_result before;
      flow_sim_event crash[4];
      run_to_crash(&in, &o, &before, crash);
      o.crash_notice = notice;
      flow_run_result r;
      assert_int_equal(flow_sim_run(&in, &o, 100, &r), 0);
      assert_true(r.trace[60].num_flows < before.sol.n_flows);
      if (r.recovered_round < 0 || r.recovered_round > 60 + 30)
        fail_msg("seed %llu, notice %d: back in round %d (target %d flows)", (unsigned long long)seed, notice,
                 r.recovered_round, r.recovery_target);
      sum += r.recovered_round - 60;
      n++;
      assert_int_equal(r.optimum_flows, r.recovery_target);
      assert_true(r.detections >= 4);
      /* the transport's notice is one message delay */
      if (notice) assert_true(r.detect_max_ms < (uint64_t)o.tun.tick_ms);
      assert_int_equal(r.false_alarms, 0);
      flow_run_result_free(&r);
      flow_run_result_free(&before);
      flow_instance_free(&in);
    }
    if (sum > 10 * n) fail_msg("notice %d: back after %.1f rounds on average", notice, (double)sum / n);
  }
}

/* One relay's links turn slow (500 ms each way: 250 times the round trip
 * the others measured from it): its audits come late and it is suspected,
 * but it answers the pings, so nobody presumes it dead and it keeps its
 * flows. */
typedef struct slow_links {
  int node;
} slow_links;

static uint64_t slow_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)len;
  (void)rng;
  const slow_links *sl = ud;
  return from == sl->node || to == sl->node ? 500 : 1;
}

static void test_slow_peer_not_presumed_dead(void **state) {
  (void)state;
  flow_instance in;
  assert_int_equal(flow_instance_table5(1, 2, &in), 0);
  flow_sim_opts o = sum_opts(2);
  flow_simulation *s;
  assert_int_equal(flow_sim_new(&in, &o, &s), 0);
  for (int r = 0; r < 40; r++) flow_sim_round(s);
  flow_solution sol;
  assert_int_equal(flow_sim_flows(s, &sol, NULL), 0);
  flow_sim_event slow[1] = {{0}}; /* (Release gcc cannot see busiest fills it) */
  assert_int_equal(busiest(&in, &sol, 1, slow, 0), 1);
  flow_solution_free(&sol);
  flow_counts c;
  flow_get_counts(flow_sim_node(s, slow[0].node), &c);
  assert_true(c.paired > 0);
  slow_links sl = {slow[0].node};
  sim_set_delay_fn(flow_sim_engine(s), slow_delay, &sl);
  for (int r = 0; r < 40; r++) flow_sim_round(s);
  assert_int_equal(flow_sim_false_alarms(s), 0);
  flow_get_counts(flow_sim_node(s, slow[0].node), &c);
  assert_true(c.units > 0);
  flow_sim_free(s);
  flow_instance_free(&in);
}

/* Stage 1 of a setting-1 instance gets a newcomer at round 40 with cost-1
 * links everywhere and room for 3 flows: it should end up carrying some. */
static void test_join_takes_flows(void **state) {
  (void)state;
  flow_instance in;
  assert_int_equal(flow_instance_table5(1, 4, &in), 0);
  int joiner = in.n_nodes;
  flow_inst_node *nodes = realloc(in.nodes, ((size_t)in.n_nodes + 1) * sizeof(*nodes));
  flow_inst_link *links = realloc(in.links, ((size_t)in.n_links + in.n_nodes * 2) * sizeof(*links));
  assert_true(nodes && links);
  in.nodes = nodes;
  in.links = links;
  in.nodes[joiner] = (flow_inst_node){1000, 1, 3, 0};
  for (int i = 0; i < joiner; i++) {
    if (in.nodes[i].stage == 0) in.links[in.n_links++] = (flow_inst_link){i, joiner, 1};
    if (in.nodes[i].stage == 2) in.links[in.n_links++] = (flow_inst_link){joiner, i, 1};
  }
  in.n_nodes++;
  char err[FLOW_ERR_LEN];
  assert_int_equal(flow_instance_validate(&in, err, sizeof(err)), 0);
  flow_sim_opts o = sum_opts(1);
  flow_sim_event join = {40, joiner};
  o.joins = &join;
  o.n_joins = 1;
  flow_run_result r;
  assert_int_equal(flow_sim_run(&in, &o, 120, &r), 0);
  int through = 0;
  for (int k = 0; k < r.sol.n_flows; k++) through += flow_solution_path(&r.sol, k)[1] == joiner;
  assert_true(through >= 2);
  assert_true(r.trace[119].total_cost < r.trace[39].total_cost); /* it made the flows cheaper */
  flow_run_result_free(&r);
  flow_instance_free(&in);
}

/* d -> a -> b -> d with b the only stage-2 relay: when b crashes, a holds
 * an inflow it cannot place, DENYs it back, and d's flow is gone. */
typedef struct deny_count {
  int deny_at_a, dead_seen;
} deny_count;

static void count_events(void *ud, int node, const flow_event *ev) {
  deny_count *c = ud;
  if (node == 1 && ev->kind == FLOW_EV_DENY) c->deny_at_a++;
  if (ev->kind == FLOW_EV_PEER_DEAD) c->dead_seen++;
}

static void test_deny_pushes_back_to_data_node(void **state) {
  (void)state;
  const char *json =
      "{\"stages\": 2, \"nodes\": [{\"id\": 0, \"stage\": 0, \"capacity\": 1},"
      "{\"id\": 1, \"stage\": 1, \"capacity\": 1}, {\"id\": 2, \"stage\": 2, \"capacity\": 1}],"
      "\"links\": [{\"from\": 0, \"to\": 1, \"cost\": 1}, {\"from\": 1, \"to\": 2, \"cost\": 1},"
      "{\"from\": 2, \"to\": 0, \"cost\": 1}]}";
  flow_instance in;
  char err[FLOW_ERR_LEN];
  assert_int_equal(flow_instance_parse(json, strlen(json), &in, err, sizeof(err)), 0);
  deny_count c = {0, 0};
  flow_sim_opts o;
  flow_sim_opts_default(&o);
  o.on_event = count_events;
  o.event_ud = &c;
  flow_simulation *s;
  assert_int_equal(flow_sim_new(&in, &o, &s), 0);
  for (int r = 0; r < 20; r++) flow_sim_round(s);
  flow_path_info info[2];
  assert_int_equal(flow_data_flows(flow_sim_node(s, 0), info, 2), 1);
  assert_int_equal(info[0].path_len, 4); /* the probe came back: d, a, b, d */
  flow_sim_crash(s, 2);
  flow_tunables t;
  flow_tunables_default(&t);
  for (int r = 0; r < t.peer_timeout_ticks + t.pushback_timeout_ticks + 3; r++) flow_sim_round(s);
  assert_true(c.dead_seen >= 1);
  assert_int_equal(c.deny_at_a, 1);
  assert_int_equal(flow_data_flows(flow_sim_node(s, 0), info, 2), 0);
  flow_counts a;
  flow_get_counts(flow_sim_node(s, 1), &a);
  assert_int_equal(a.units, 0);
  assert_int_equal(flow_sim_check_consistent(s, err, sizeof(err)), 0);
  flow_sim_free(s);
  flow_instance_free(&in);
}

/* Three relays per stage, capacity 1; links cost 1 along "rows" and 10
 * across: the optimum (three straight rows) is unique, and gwtf finds it. */
static void test_unique_optimum_found(void **state) {
  (void)state;
  flow_instance in = {.stages = 3};
  in.n_nodes = 10;
  in.nodes = calloc(10, sizeof(*in.nodes));
  in.links = calloc(100, sizeof(*in.links));
  in.nodes[0] = (flow_inst_node){0, 0, 3, 0};
  for (int i = 1; i < 10; i++) in.nodes[i] = (flow_inst_node){i, 1 + (i - 1) / 3, 1, 0};
  for (int a = 0; a < 10; a++)
    for (int b = 0; b < 10; b++) {
      if (in.nodes[b].stage != (in.nodes[a].stage + 1) % 4) continue;
      bool row = in.nodes[a].stage == 0 || in.nodes[b].stage == 0 || (a - 1) % 3 == (b - 1) % 3;
      in.links[in.n_links++] = (flow_inst_link){a, b, row ? 1 + (double)((a + b) % 3) : 10};
    }
  char err[FLOW_ERR_LEN];
  assert_int_equal(flow_instance_validate(&in, err, sizeof(err)), 0);
  flow_solution opt;
  assert_int_equal(flow_optimal(&in, NULL, &opt), 0);
  assert_int_equal(opt.n_flows, 3);
  for (uint64_t seed = 1; seed <= 3; seed++) {
    flow_sim_opts o = sum_opts(seed);
    flow_run_result r;
    assert_int_equal(flow_sim_run(&in, &o, 120, &r), 0);
    assert_int_equal(r.sol.n_flows, opt.n_flows);
    assert_memory_equal(r.sol.nodes, opt.nodes, (size_t)opt.n_flows * (size_t)opt.path_len * sizeof(int));
    flow_run_result_free(&r);
  }
  flow_solution_free(&opt);
  flow_instance_free(&in);
}

static void test_replay_is_exact(void **state) {
  (void)state;
  flow_instance in;
  assert_int_equal(flow_instance_table5(5, 9, &in), 0);
  flow_sim_event crash[1] = {{30, 7}};
  flow_sim_opts o;
  flow_sim_opts_default(&o);
  o.seed = 99;
  o.loss = 0.03;
  o.delay_ms = 300;
  o.crashes = crash;
  o.n_crashes = 1;
  flow_run_result a, b, c;
  assert_int_equal(flow_sim_run(&in, &o, 60, &a), 0);
  assert_int_equal(flow_sim_run(&in, &o, 60, &b), 0);
  assert_true(a.messages == b.messages);
  assert_memory_equal(a.trace, b.trace, 60 * sizeof(*a.trace));
  assert_int_equal(a.sol.n_flows, b.sol.n_flows);
  assert_memory_equal(a.sol.nodes, b.sol.nodes, (size_t)a.sol.n_flows * (size_t)a.sol.path_len * sizeof(int));
  o.seed = 100;
  assert_int_equal(flow_sim_run(&in, &o, 60, &c), 0);
  assert_true(a.messages != c.messages); /* the seed matters */
  flow_run_result_free(&a);
  flow_run_result_free(&b);
  flow_run_result_free(&c);
  flow_instance_free(&in);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_invariants_every_step),
      cmocka_unit_test(test_crossing_moves_stay_connected),
      cmocka_unit_test(test_table5_near_optimum),
      cmocka_unit_test(test_beats_greedy),
      cmocka_unit_test(test_converges_under_loss),
      cmocka_unit_test(test_crash_teardown_and_rebuild),
      cmocka_unit_test(test_crash_recovered_within_ten_rounds),
      cmocka_unit_test(test_slow_peer_not_presumed_dead),
      cmocka_unit_test(test_join_takes_flows),
      cmocka_unit_test(test_deny_pushes_back_to_data_node),
      cmocka_unit_test(test_unique_optimum_found),
      cmocka_unit_test(test_replay_is_exact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
