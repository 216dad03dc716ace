/* `gwtf sim flow|gen|join`: the flow layer on the deterministic simulator.
 *
 *   gwtf sim gen  --setting K --seed S [--out FILE]
 *   gwtf sim flow --instance FILE --algo gwtf|optimal|greedy [--objective max|sum]
 *                 [--rounds N] [--seed S] [--loss P] [--delay MS]
 *                 [--crash ROUND:NODE]... [--crash-notice] [--join ROUND:NODE]... [--trace] [--json]
 *   gwtf sim join --setting K --seed S [--json]
 *
 * The logic lives in flow/; this file parses flags and prints. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/greedy.h"
#include "flow/instance.h"
#include "flow/mcf.h"
#include "flow/placeeval.h"
#include "flow/simflow.h"
#include "node/cmd.h"
#include "util/err.h"
#include "util/file.h"
#include "util/log.h"

#define SIM_MAX_EVENTS (1024)
#define SIM_MAX_ROUNDS (1000000)

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return GW_EINVAL;
  *out = v;
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-') return GW_EINVAL;
  *out = v;
  return 0;
}

static int parse_prob(const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= 0 && v < 1)) return GW_EINVAL;
  *out = v;
  return 0;
}

/* ---- gwtf sim gen ---- */

void cmd_sim_gen_help(void) {
  printf(
      "usage: gwtf sim gen --setting K --seed S [--out FILE]\n\n"
      "Writes the flow instance of the GWTF paper's Table V setting K (1-6) as JSON,\n"
      "to FILE (written atomically) or to standard output:\n\n"
      "  K  sources relays stages capacities link costs\n"
      "  1     1      40     8     U(1,3)     U(1,20)\n"
      "  2     1      40    10     U(1,3)     U(1,20)\n"
      "  3     1      40     8     U(5,15)    U(1,20)\n"
      "  4     1      40     8     U(1,3)     U(5,100)\n"
      "  5     2      40     8     U(1,3)     U(1,20)\n"
      "  6     4      80     8     U(1,3)     U(1,20)\n\n"
      "floor(U(a,b)) is an integer drawn uniformly from [a, b-1]; relays are spread\n"
      "evenly over the stages, consecutive stages are fully linked, and each data\n"
      "node wants as many flows as the largest stage can carry.\n");
}

int cmd_sim_gen(int argc, char **argv) {
  long setting = 0;
  uint64_t seed = 1;
  const char *out = NULL;
  static const struct option opts[] = {{"setting", required_argument, 0, 'k'},
                                       {"seed", required_argument, 0, 's'},
                                       {"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
  int c;
  while ((c = getopt_long(argc, argv, "k:s:o:h", opts, NULL)) != -1) {
    switch (c) {
    case 'k':
      if (parse_int(optarg, 1, 6, &setting) != 0) {
        fprintf(stderr, "gwtf sim gen: --setting must be 1..6\n");
        return 2;
      }
      break;
    case 's':
      if (parse_u64(optarg, &seed) != 0) {
        fprintf(stderr, "gwtf sim gen: --seed must be a non-negative integer\n");
        return 2;
      }
      break;
    case 'o': out = optarg; break;
    case 'h': cmd_sim_gen_help(); return 0;
    default: cmd_sim_gen_help(); return 2;
    }
  }
  if (setting == 0 || optind < argc) {
    cmd_sim_gen_help();
    return 2;
  }
  flow_instance in;
  if (flow_instance_table5((int)setting, seed, &in) != 0) {
    fprintf(stderr, "gwtf sim gen: out of memory\n");
    return 1;
  }
  char *json = flow_instance_to_json(&in);
  flow_instance_free(&in);
  if (!json) {
    fprintf(stderr, "gwtf sim gen: out of memory\n");
    return 1;
  }
  int rc = 0;
  if (out) {
    const void *parts[2] = {json, "\n"};
    size_t lens[2] = {strlen(json), 1};
    rc = gw_file_write_atomic(out, parts, lens, 2, 0644);
    if (rc != 0) fprintf(stderr, "gwtf sim gen: cannot write %s: %s\n", out, gw_strerror(rc));
  } else {
    printf("%s\n", json);
  }
  free(json);
  return rc == 0 ? 0 : 1;
}

/* ---- gwtf sim flow ---- */

void cmd_sim_flow_help(void) {
  printf(
      "usage: gwtf sim flow --instance FILE --algo gwtf|optimal|greedy [options]\n\n"
      "Routes the instance's flows and prints them. gwtf runs the decentralized\n"
      "protocol (flow/flow.h) on the deterministic simulator, one tick per node per\n"
      "round; optimal is the exact min-cost max-flow (one data node only); greedy\n"
      "is the SWARM-style baseline (cheapest next node with spare capacity).\n\n"
      "options:\n"
      "  --objective max|sum   the protocol's objective (default max; the paper\n"
      "                        compares with the optimum under sum). The output's\n"
      "                        objective is what the algorithm minimises: sum for\n"
      "                        optimal, none for greedy\n"
      "  --rounds N            rounds to run (default 120)\n"
      "  --seed S              seed for the protocol's and the network's randomness\n"
      "  --loss P              message loss probability in [0, 1)\n"
      "  --delay MS            extra per-message delay, uniform in [0, MS)\n"
      "  --crash ROUND:NODE    node NODE (instance id) stops at the start of ROUND\n"
      "  --crash-notice        a crash is a process crash: nodes with a session to it\n"
      "                        learn of it one message delay later (TCP RST/EOF) and\n"
      "                        call flow_peer_failed; without it a crash is silent\n"
      "                        (a machine lost) and the flow layer detects it alone\n"
      "  --join ROUND:NODE     node NODE takes part only from ROUND on\n"
      "  --trace               add per-round figures, convergence and recovery\n"
      "  --log LEVEL           protocol events on stderr (debug|info|warn|error)\n"
      "  --set NAME=VALUE      change a protocol tunable (list below)\n"
      "  --json                one JSON object: algo, objective, rounds, messages,\n"
      "                        num_flows, total_cost, max_flow_cost, flows\n\n"
      "tunables and their defaults (flow/flow.h says where each comes from):\n");
  flow_tunables t;
  char buf[2048];
  flow_tunables_default(&t);
  flow_tunables_describe(&t, buf, sizeof(buf));
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) printf("  %s\n", line);
}

typedef struct flow_args {
  const char *instance, *algo;
  flow_objective objective;
  long rounds;
  uint64_t seed;
  double loss;
  uint64_t delay;
  flow_sim_event crashes[SIM_MAX_EVENTS], joins[SIM_MAX_EVENTS];
  int n_crashes, n_joins;
  bool trace, json, crash_notice;
  gw_log_level log_level;
  bool log;
  flow_tunables tun;
} flow_args;

static int parse_event(const char *s, flow_sim_event *ev) {
  const char *colon = strchr(s, ':');
  char round[32];
  long r, node;
  if (!colon || (size_t)(colon - s) >= sizeof(round)) return GW_EINVAL;
  memcpy(round, s, (size_t)(colon - s));
  round[colon - s] = '\0';
  if (parse_int(round, 0, SIM_MAX_ROUNDS, &r) != 0 || parse_int(colon + 1, 0, INT32_MAX, &node) != 0) return GW_EINVAL;
  ev->round = (int)r;
  ev->node = (int)node; /* an instance id until resolved */
  return 0;
}

static int parse_flow_args(int argc, char **argv, flow_args *a) {
  memset(a, 0, sizeof(*a));
  a->rounds = 120;
  a->seed = 1;
  a->objective = FLOW_OBJ_MAX;
  flow_tunables_default(&a->tun);
  bool objective_given = false;
  static const struct option opts[] = {{"instance", required_argument, 0, 'i'},
                                       {"algo", required_argument, 0, 'a'},
                                       {"objective", required_argument, 0, 'O'},
                                       {"rounds", required_argument, 0, 'r'},
                                       {"seed", required_argument, 0, 's'},
                                       {"loss", required_argument, 0, 'l'},
                                       {"delay", required_argument, 0, 'd'},
                                       {"crash", required_argument, 0, 'c'},
                                       {"crash-notice", no_argument, 0, 'N'},
                                       {"join", required_argument, 0, 'J'},
                                       {"trace", no_argument, 0, 't'},
                                       {"log", required_argument, 0, 'L'},
                                       {"json", no_argument, 0, 'j'},
                                       {"set", required_argument, 0, 'S'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
  int c;
  while ((c = getopt_long(argc, argv, "i:a:O:r:s:l:d:c:NJ:tL:jS:h", opts, NULL)) != -1) {
    const char *bad = NULL;
    switch (c) {
    case 'i': a->instance = optarg; break;
    case 'a': a->algo = optarg; break;
    case 'O':
      if (strcmp(optarg, "max") == 0)
        a->objective = FLOW_OBJ_MAX;
      else if (strcmp(optarg, "sum") == 0)
        a->objective = FLOW_OBJ_SUM;
      else
        bad = "--objective must be max or sum";
      objective_given = true;
      break;
    case 'S': {
      char name[64];
      const char *eq = strchr(optarg, '=');
      if (!eq || (size_t)(eq - optarg) >= sizeof(name)) {
        bad = "--set takes NAME=VALUE";
        break;
      }
      memcpy(name, optarg, (size_t)(eq - optarg));
      name[eq - optarg] = '\0';
      int rc = flow_tunables_set(&a->tun, name, eq + 1);
      if (rc == GW_ENOENT)
        bad = "--set: no such tunable (see gwtf help sim flow)";
      else if (rc != 0)
        bad = "--set: bad value";
      break;
    }
    case 'r':
      if (parse_int(optarg, 1, SIM_MAX_ROUNDS, &a->rounds) != 0) bad = "--rounds must be 1..1000000";
      break;
    case 's':
      if (parse_u64(optarg, &a->seed) != 0) bad = "--seed must be a non-negative integer";
      break;
    case 'l':
      if (parse_prob(optarg, &a->loss) != 0) bad = "--loss must be a probability in [0, 1)";
      break;
    case 'd':
      if (parse_u64(optarg, &a->delay) != 0) bad = "--delay must be milliseconds";
      break;
    case 'c':
    case 'J': {
      flow_sim_event *list = c == 'c' ? a->crashes : a->joins;
      int *n = c == 'c' ? &a->n_crashes : &a->n_joins;
      if (*n >= SIM_MAX_EVENTS || parse_event(optarg, &list[*n]) != 0)
        bad = c == 'c' ? "--crash takes ROUND:NODE" : "--join takes ROUND:NODE";
      else
        (*n)++;
      break;
    }
    case 't': a->trace = true; break;
    case 'N': a->crash_notice = true; break;
    case 'L':
      if (gw_log_level_parse(optarg, &a->log_level) != 0) bad = "--log must be debug|info|warn|error|off";
      a->log = true;
      break;
    case 'j': a->json = true; break;
    case 'h': cmd_sim_flow_help(); return 1;
    default: cmd_sim_flow_help(); return 2;
    }
    if (bad) {
      fprintf(stderr, "gwtf sim flow: %s\n", bad);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gwtf sim flow: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (objective_given) a->tun.objective = a->objective;
  a->objective = a->tun.objective;
  if (!a->instance || !a->algo) {
    fprintf(stderr, "gwtf sim flow: --instance and --algo are required\n");
    return 2;
  }
  if (strcmp(a->algo, "gwtf") && strcmp(a->algo, "optimal") && strcmp(a->algo, "greedy")) {
    fprintf(stderr, "gwtf sim flow: --algo must be gwtf, optimal or greedy\n");
    return 2;
  }
  return 0;
}

/* --crash/--join name instance ids; the simulator wants node indices. */
static int resolve_events(const flow_instance *in, flow_sim_event *ev, int n, const char *what) {
  for (int k = 0; k < n; k++) {
    int idx = flow_instance_find(in, ev[k].node);
    if (idx < 0) {
      fprintf(stderr, "gwtf sim flow: --%s names node %d, which is not in the instance\n", what, ev[k].node);
      return GW_EINVAL;
    }
    ev[k].node = idx;
  }
  return 0;
}

static json_t *trace_json(const flow_run_result *r) {
  json_t *arr = json_array();
  for (int k = 0; arr && k < r->rounds; k++)
    json_array_append_new(arr, json_pack("{s:i,s:i,s:f,s:f,s:I}", "round", k + 1, "num_flows", r->trace[k].num_flows,
                                         "total_cost", r->trace[k].total_cost, "max_flow_cost", r->trace[k].max_cost,
                                         "messages", (json_int_t)r->trace[k].messages));
  return arr;
}

/* What the algorithm minimises: the exact solver Eq. 2's sum, greedy nothing. */
static const char *objective_name(const flow_args *a) {
  if (strcmp(a->algo, "optimal") == 0) return "sum";
  if (strcmp(a->algo, "greedy") == 0) return "none";
  return a->objective == FLOW_OBJ_SUM ? "sum" : "max";
}

static void print_text(const flow_args *a, const flow_solution *sol, int rounds, uint64_t messages) {
  printf("algo %s, objective %s: %d flows, total cost %.6g, max flow cost %.6g", a->algo, objective_name(a),
         sol->n_flows, flow_solution_total(sol), flow_solution_max(sol));
  if (rounds) printf(", %d rounds, %llu messages", rounds, (unsigned long long)messages);
  printf("\n");
}

static int run_algo(const flow_args *a, const flow_instance *in, flow_run_result *r) {
  if (strcmp(a->algo, "optimal") == 0) return flow_optimal(in, NULL, &r->sol);
  if (strcmp(a->algo, "greedy") == 0) return flow_greedy(in, NULL, &r->sol);
  flow_sim_opts o;
  flow_sim_opts_default(&o);
  o.tun = a->tun;
  o.seed = a->seed;
  o.loss = a->loss;
  o.delay_ms = a->delay;
  o.crashes = a->crashes;
  o.n_crashes = a->n_crashes;
  o.crash_notice = a->crash_notice;
  o.joins = a->joins;
  o.n_joins = a->n_joins;
  static gw_log_sink sink;
  if (a->log) {
    gw_log_sink_init(&sink, stderr, a->log_level, GW_LOG_TEXT);
    o.log = &sink;
  }
  if (o.delay_ms >= o.tun.tick_ms) {
    fprintf(stderr, "gwtf sim flow: --delay must be below the tick (%llu ms)\n", (unsigned long long)o.tun.tick_ms);
    return GW_EINVAL;
  }
  return flow_sim_run(in, &o, (int)a->rounds, r);
}

int cmd_sim_flow(int argc, char **argv) {
  flow_args a;
  int rc = parse_flow_args(argc, argv, &a);
  if (rc != 0) return rc == 1 ? 0 : rc;
  flow_instance in;
  char err[FLOW_ERR_LEN];
  if (flow_instance_load(a.instance, &in, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf sim flow: %s\n", err);
    return 1;
  }
  if (resolve_events(&in, a.crashes, a.n_crashes, "crash") || resolve_events(&in, a.joins, a.n_joins, "join")) {
    flow_instance_free(&in);
    return 2;
  }
  bool gwtf = strcmp(a.algo, "gwtf") == 0;
  flow_run_result r;
  memset(&r, 0, sizeof(r));
  rc = run_algo(&a, &in, &r);
  if (rc == GW_EUNSUPPORTED) {
    fprintf(stderr,
            "gwtf sim flow: --algo optimal solves instances with one data node; this one has %d "
            "(flows must return to their own data node, a multi-commodity problem)\n",
            flow_instance_sources(&in));
  } else if (rc != 0) {
    fprintf(stderr, "gwtf sim flow: %s\n", gw_strerror(rc));
  } else if (!a.json) {
    print_text(&a, &r.sol, gwtf ? r.rounds : 0, r.messages);
    if (gwtf && a.trace)
      printf("settled after round %d (%llu messages); last change in round %d (%llu messages)\n", r.settled_round,
             (unsigned long long)r.messages_to_settle, r.converged_round, (unsigned long long)r.messages_to_converge);
  } else {
    json_t *o = json_object();
    json_object_set_new(o, "algo", json_string(a.algo));
    json_object_set_new(o, "objective", json_string(objective_name(&a)));
    json_object_set_new(o, "rounds", json_integer(gwtf ? r.rounds : 0));
    json_object_set_new(o, "messages", json_integer(gwtf ? (json_int_t)r.messages : 0));
    json_t *sol = flow_solution_json(&in, &r.sol);
    json_object_update(o, sol);
    json_decref(sol);
    if (gwtf && a.trace) {
      json_object_set_new(o, "converged_round", json_integer(r.converged_round));
      json_object_set_new(o, "messages_to_converge", json_integer((json_int_t)r.messages_to_converge));
      json_object_set_new(o, "settled_round", json_integer(r.settled_round));
      json_object_set_new(o, "messages_to_settle", json_integer((json_int_t)r.messages_to_settle));
      if (r.last_crash_round >= 0) {
        json_object_set_new(o, "last_crash_round", json_integer(r.last_crash_round));
        json_object_set_new(o, "recovery_target", json_integer(r.recovery_target));
        json_object_set_new(o, "recovered_round",
                            r.recovered_round >= 0 ? json_integer(r.recovered_round) : json_null());
        json_object_set_new(o, "optimum_flows", r.optimum_flows >= 0 ? json_integer(r.optimum_flows) : json_null());
        json_object_set_new(o, "optimum_cost", isnan(r.optimum_cost) ? json_null() : json_real(r.optimum_cost));
        json_object_set_new(o, "recovered_optimal_round", r.recovered_optimal_round >= 0
                                                              ? json_integer(r.recovered_optimal_round)
                                                              : json_null());
      }
      if (r.last_crash_round >= 0 || r.false_alarms) {
        json_object_set_new(o, "detections", json_integer(r.detections));
        json_object_set_new(o, "undetected", json_integer(r.undetected));
        json_object_set_new(o, "detect_mean_ms", json_real(r.detect_mean_ms));
        json_object_set_new(o, "detect_max_ms", json_integer((json_int_t)r.detect_max_ms));
        json_object_set_new(o, "false_alarms", json_integer(r.false_alarms));
      }
      json_object_set_new(o, "trace", trace_json(&r));
    }
    char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(12));
    if (text) printf("%s\n", text);
    free(text);
    json_decref(o);
  }
  flow_run_result_free(&r);
  flow_instance_free(&in);
  if (rc == GW_EUNSUPPORTED) return 2;
  return rc == 0 ? 0 : 1;
}

/* ---- gwtf sim join ---- */

void cmd_sim_join_help(void) {
  printf(
      "usage: gwtf sim join --setting K --seed S [--candidates N] [--batch B] [--no-optimal] [--json]\n\n"
      "The node-addition experiment of the GWTF paper (Table IV top, Fig. 5): a data\n"
      "node and 96 relays of Table IV setting K (1-5) receive N joining nodes\n"
      "(default 20) in batches of B (default 2). Each method places them on its own\n"
      "copy of the system; the improvement is (cost_before - cost_after) / cost_before,\n"
      "with cost = the min-cost max-flow's mean flow cost / number of flows (the time\n"
      "to train a fixed number of microbatches).\n\n"
      "  gwtf            the placement protocol (flow/place.h) on the simulator\n"
      "  capacity_first  highest capacity first, to the stage with the fewest nodes\n"
      "  random          a uniformly random stage each\n"
      "  optimal         all S^B placements of each batch, the best kept\n");
}

int cmd_sim_join(int argc, char **argv) {
  place_eval_opts o;
  place_eval_opts_default(&o);
  bool json = false;
  long v;
  static const struct option opts[] = {{"setting", required_argument, 0, 'k'},
                                       {"seed", required_argument, 0, 's'},
                                       {"candidates", required_argument, 0, 'n'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"no-optimal", no_argument, 0, 'x'},
                                       {"json", no_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
  int c;
  bool have_setting = false;
  while ((c = getopt_long(argc, argv, "k:s:n:b:xjh", opts, NULL)) != -1) {
    const char *bad = NULL;
    switch (c) {
    case 'k':
      if (parse_int(optarg, 1, 5, &v) != 0) {
        bad = "--setting must be 1..5";
      } else {
        o.setting = (int)v;
        have_setting = true;
      }
      break;
    case 's':
      if (parse_u64(optarg, &o.seed) != 0) bad = "--seed must be a non-negative integer";
      break;
    case 'n':
      if (parse_int(optarg, 1, 1000, &v) != 0) bad = "--candidates must be 1..1000";
      else o.candidates = (int)v;
      break;
    case 'b':
      if (parse_int(optarg, 1, 8, &v) != 0) bad = "--batch must be 1..8";
      else o.batch = (int)v;
      break;
    case 'x': o.optimal = false; break;
    case 'j': json = true; break;
    case 'h': cmd_sim_join_help(); return 0;
    default: cmd_sim_join_help(); return 2;
    }
    if (bad) {
      fprintf(stderr, "gwtf sim join: %s\n", bad);
      return 2;
    }
  }
  if (!have_setting || optind < argc) {
    cmd_sim_join_help();
    return 2;
  }
  place_eval_result r;
  int rc = place_eval_run(&o, &r);
  if (rc != 0) {
    fprintf(stderr, "gwtf sim join: %s\n", gw_strerror(rc));
    return 1;
  }
  if (!json) {
    printf("setting %d, seed %llu: %d stages, %d relays, %d candidates in batches of %d\n", o.setting,
           (unsigned long long)o.seed, r.stages, r.relays, o.candidates, o.batch);
    for (int m = 0; m < PLACE_M_COUNT; m++) {
      if (m == PLACE_M_OPTIMAL && !o.optimal) continue;
      printf("  %-15s improvement %6.2f%%  flows %d -> %d  cost %.4g -> %.4g\n", place_method_name(m),
             100 * r.m[m].improvement, r.m[m].flows_before, r.m[m].flows_after, r.m[m].cost_before, r.m[m].cost_after);
    }
    return 0;
  }
  json_t *root = json_pack("{s:i,s:I,s:i,s:i,s:i,s:i}", "setting", o.setting, "seed", (json_int_t)o.seed, "stages",
                           r.stages, "relays", r.relays, "candidates", o.candidates, "batch", o.batch);
  json_t *methods = json_array();
  for (int m = 0; m < PLACE_M_COUNT; m++) {
    if (m == PLACE_M_OPTIMAL && !o.optimal) continue;
    json_t *per = json_array();
    for (int s = 1; s <= r.stages; s++) json_array_append_new(per, json_integer(r.m[m].per_stage[s]));
    json_array_append_new(
        methods, json_pack("{s:s,s:f,s:f,s:f,s:i,s:i,s:o}", "method", place_method_name(m), "improvement",
                           r.m[m].improvement, "cost_before", r.m[m].cost_before, "cost_after", r.m[m].cost_after,
                           "flows_before", r.m[m].flows_before, "flows_after", r.m[m].flows_after, "per_stage", per));
  }
  json_object_set_new(root, "methods", methods);
  json_object_set_new(root, "gwtf_messages", json_integer((json_int_t)r.gwtf_messages));
  char *text = json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(12));
  if (text) printf("%s\n", text);
  free(text);
  json_decref(root);
  return 0;
}
