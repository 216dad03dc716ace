/* `gwtf experiment`: one cell of the paper's Table II, measured.
 *
 *   gwtf experiment --scenario FILE --routing gwtf|swarm --repeats N --json
 *
 * A scenario (the JSON files in data/scenarios, format in docs/EVALUATION.md) describes a swarm:
 * data nodes, stages, relays with their capacities and compute slowdowns,
 * churn, the model and microbatch shape, and the geo links. Each repeat runs
 * that swarm on this machine with `gwtf swarm` (seed + repeat), peers spread
 * over the 8 cities of the links table by a seeded shuffle, and reads its
 * summary. Reported per repeat and as mean and standard deviation, with the
 * paper's definitions (§VI):
 *   time_per_microbatch_s   max iteration time over data nodes / microbatches
 *                           processed, over the iterations after the first
 *   throughput              microbatches processed per iteration
 *   communication_s         per microbatch, its round trip at its data node
 *                           minus the compute spent on it along its path
 *   wasted_compute_s        compute on microbatches that were excluded from
 *                           aggregation or not part of the final path
 *   wasted_compute_on_crashed_s  the part of it done by peers that then died
 *                           (forwards whose backward they did not live to
 *                           carry); the rest is the routing's (a bypassed
 *                           peer's forward, a deferred microbatch)
 * and, apart, unaggregated_compute_s: compute whose gradient never reached an
 * aggregation (work lost with a crashed relay's accumulated gradient counts
 * here, though its microbatch was on its final path).
 * Only the routing (and with it the recovery) differs between --routing gwtf
 * and --routing swarm: transport, DHT, compute, aggregation and links are the
 * same. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "node/cmd.h"
#include "util/err.h"
#include "util/file.h"
#include "util/rng.h"

extern char **environ;

#define EXP_MAX_REPEATS 100
#define EXP_ARGS_MAX 96

typedef struct scenario {
  char name[64];
  char dir[PATH_MAX]; /* relative paths in the file are from here */
  int data_nodes, stages, relays, iterations, microbatches, batch, seq;
  char capacities[256], slowdowns[256];
  double churn, lr, links_bw_scale;
  char model[PATH_MAX], links[PATH_MAX], dataset[PATH_MAX];
  uint64_t seed;
  int flow_tick_ms, hop_timeout_ms;
  double val_fraction; /* held-out fraction for the validation loss (0: none) */
  int eval_every;      /* iterations between evaluations (-1: the swarm's default) */
  int rebalance_after; /* the swarm's --rebalance-after (0: off, the swarm's default) */
  int move_to_short;   /* the swarm's --move-to-short (default 0) */
} scenario;

typedef struct run_metrics {
  double time_per_mb_s, throughput, communication_s, wasted_s, unaggregated_s;
  double wasted_crashed_s; /* the part of wasted_s done by peers that died */
  int crashes, reroutes, recoveries, lost, iterations;
  bool agree, ok;
  double flows_sum, optimal_sum;
  int flows, optimal_flows;
  json_t *validation; /* the swarm summary's validation curve (NULL: none) */
} run_metrics;

void cmd_experiment_help(void) {
  printf("usage: gwtf experiment --scenario FILE --routing gwtf|swarm [--repeats N] [--json]\n"
         "                       [--base-port P] [--workdir DIR]\n"
         "                       [--val-fraction F] [--eval-every N] [--churn P]\n\n"
         "Runs a scenario (data/scenarios/*.json; format in docs/EVALUATION.md) N times\n"
         "(seeds seed..seed+N-1) as a local swarm and reports, per the GWTF paper's\n"
         "Table II: time per microbatch, throughput (microbatches per iteration),\n"
         "communication time and wasted compute, per repeat and as mean and std.\n"
         "Fault-free runs also report our flows' cost next to the exact optimum\n"
         "(`gwtf sim flow --algo optimal`) for the same peers and measured links.\n"
         "--val-fraction / --eval-every (or the scenario's val_fraction, eval_every)\n"
         "add the validation loss curve (gwtf swarm's) to every repeat and its mean.\n"
         "--churn P replaces the scenario's churn (0 <= P < 1): --churn 0 on a churn\n"
         "scenario runs the same peers, cities and seeds fault-free, the reference\n"
         "for what churn costs (scripts/churn_cost.py --clean).\n");
}

/* ---- the scenario file ---- */

static void list_to_string(json_t *v, char *out, size_t len) {
  size_t off = 0, i;
  json_t *x;
  out[0] = '\0';
  if (json_is_number(v)) {
    snprintf(out, len, "%g", json_number_value(v));
    return;
  }
  json_array_foreach(v, i, x) {
    if (off + 16 >= len) break;
    off += (size_t)snprintf(out + off, len - off, "%s%g", i ? "," : "", json_number_value(x));
  }
}

/* dir/name into out; GW_EINVAL when it does not fit. */
static int path_join(char *out, size_t len, const char *dir, const char *name) {
  int n = snprintf(out, len, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= len ? GW_EINVAL : 0;
}

static void resolve(const scenario *sc, const char *path, char *out, size_t len) {
  if (!path || !*path) {
    out[0] = '\0';
  } else if (path[0] == '/') {
    snprintf(out, len, "%s", path);
  } else {
    char tmp[PATH_MAX];
    /* a preset name ("tiny") resolves to no file and stays as it is */
    if (path_join(tmp, sizeof(tmp), sc->dir, path) != 0 || !realpath(tmp, out)) snprintf(out, len, "%s", path);
  }
}

static int load_scenario(const char *path, scenario *sc, char *err, size_t err_len) {
  json_error_t jerr;
  json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!o) {
    snprintf(err, err_len, "%s:%d: %s", path, jerr.line, jerr.text);
    return GW_EINVAL;
  }
  memset(sc, 0, sizeof(*sc));
  char copy[PATH_MAX];
  snprintf(copy, sizeof(copy), "%s", path);
  snprintf(sc->dir, sizeof(sc->dir), "%s", dirname(copy));
  const char *name = NULL, *model = "tiny", *links = NULL, *dataset = NULL;
  json_t *caps = NULL, *slows = NULL;
  json_int_t seed = 1;
  sc->data_nodes = 1, sc->stages = 3, sc->relays = 6, sc->iterations = 20, sc->microbatches = 4, sc->batch = 4;
  sc->seq = 64, sc->lr = 1e-3, sc->links_bw_scale = 1, sc->flow_tick_ms = 100, sc->hop_timeout_ms = 2000;
  sc->eval_every = -1;
  const char *about = NULL; /* free text for people reading the file */
  int rc = json_unpack_ex(o, &jerr, JSON_STRICT,
                          "{s:s,s?s,s?i,s?i,s?i,s?o,s?o,s?F,s?i,s?s,s?i,s?i,s?i,s?F,s?s,s?F,s?s,s?I,s?i,s?i,s?F,s?i,s?i,s?b}", "name",
                          &name, "about", &about, "data_nodes", &sc->data_nodes, "stages", &sc->stages, "relays",
                          &sc->relays, "capacities", &caps, "slowdowns", &slows, "churn", &sc->churn, "iterations",
                          &sc->iterations, "model", &model, "microbatches", &sc->microbatches, "batch", &sc->batch,
                          "seq", &sc->seq, "lr", &sc->lr, "links", &links, "links_bw_scale", &sc->links_bw_scale,
                          "dataset", &dataset, "seed", &seed, "flow_tick_ms", &sc->flow_tick_ms, "hop_timeout_ms",
                          &sc->hop_timeout_ms, "val_fraction", &sc->val_fraction, "eval_every", &sc->eval_every,
                          "rebalance_after", &sc->rebalance_after, "move_to_short", &sc->move_to_short);
  if (rc != 0) {
    snprintf(err, err_len, "%s: %s", path, jerr.text);
    json_decref(o);
    return GW_EINVAL;
  }
  snprintf(sc->name, sizeof(sc->name), "%s", name);
  if (caps) list_to_string(caps, sc->capacities, sizeof(sc->capacities));
  if (slows) list_to_string(slows, sc->slowdowns, sizeof(sc->slowdowns));
  resolve(sc, model, sc->model, sizeof(sc->model));
  if (access(sc->model, R_OK) != 0) snprintf(sc->model, sizeof(sc->model), "%s", model);
  resolve(sc, links, sc->links, sizeof(sc->links));
  resolve(sc, dataset, sc->dataset, sizeof(sc->dataset));
  sc->seed = (uint64_t)seed;
  json_decref(o);
  if (sc->churn < 0 || sc->churn >= 1 || sc->relays < sc->stages || sc->iterations < 2 || sc->links_bw_scale <= 0) {
    snprintf(err, err_len, "%s: churn in [0,1), relays >= stages, iterations >= 2, links_bw_scale > 0", path);
    return GW_EINVAL;
  }
  /* Said once here rather than by every repeat's swarm: the bundled
   * scenarios train on a text fetched by a script, not kept in git. */
  if (sc->dataset[0] && access(sc->dataset, R_OK) != 0) {
    snprintf(err, err_len, "%s: dataset %s: %s (the bundled text comes from ./scripts/fetch_data.sh)", path,
             sc->dataset, strerror(errno));
    return GW_EINVAL;
  }
  return 0;
}

/* The links table with this run's peers spread over its regions: a seeded
 * shuffle of the ports, so each repeat places peers differently but the
 * same seed replays. */
static int write_links(const scenario *sc, uint64_t seed, int base_port, int n_peers, const char *out) {
  json_error_t jerr;
  json_t *o = json_load_file(sc->links, 0, &jerr);
  if (!o) {
    fprintf(stderr, "gwtf experiment: %s:%d: %s\n", sc->links, jerr.line, jerr.text);
    return GW_EINVAL;
  }
  json_t *regions = json_object_get(o, "regions");
  size_t nr = json_array_size(regions);
  if (nr == 0) {
    json_decref(o);
    fprintf(stderr, "gwtf experiment: %s has no regions\n", sc->links);
    return GW_EINVAL;
  }
  gw_rng rng;
  gw_rng_seed(&rng, seed * 7919 + 17);
  json_t *nodes = json_array();
  for (int i = 0; i < n_peers; i++) {
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", base_port + i);
    json_t *r = json_array_get(regions, (size_t)gw_rng_below(&rng, nr));
    json_array_append_new(nodes, json_pack("{s:s,s:O}", "addr", addr, "region", r));
  }
  json_object_set_new(o, "nodes", nodes);
  json_object_set_new(o, "bandwidth_scale", json_real(sc->links_bw_scale));
  int rc = json_dump_file(o, out, JSON_INDENT(1)) == 0 ? 0 : GW_EIO;
  json_decref(o);
  return rc;
}

/* ---- running one repeat ---- */

static int run_child(char *const argv[], const char *stdout_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdout_path) {
    posix_spawn_file_actions_addopen(&fa, 1, stdout_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -rc;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void add(char **argv, int *n, char store[][PATH_MAX], const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char **argv, int *n, char store[][PATH_MAX], const char *fmt, ...) {
  if (*n + 1 >= EXP_ARGS_MAX) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(store[*n], PATH_MAX, fmt, ap);
  va_end(ap);
  argv[*n] = store[*n];
  (*n)++;
}

static double mean_over(json_t *iters, const char *key, size_t skip) {
  double sum = 0;
  int n = 0;
  size_t i;
  json_t *it;
  json_array_foreach(iters, i, it) {
    json_t *v = json_object_get(it, key);
    if (i < skip || !json_is_number(v)) continue;
    sum += json_number_value(v);
    n++;
  }
  return n ? sum / n : NAN;
}

static void read_metrics(json_t *s, run_metrics *m) {
  json_t *iters = json_object_get(s, "iterations");
  double secs = 0, done = 0;
  size_t i;
  json_t *it;
  /* the first iteration waits for flows to settle: it is warm-up */
  json_array_foreach(iters, i, it) {
    if (i == 0) continue;
    secs += json_number_value(json_object_get(it, "iteration_s"));
    done += json_number_value(json_object_get(it, "microbatches_done"));
  }
  m->iterations = (int)json_array_size(iters);
  m->time_per_mb_s = done > 0 ? secs / done : NAN;
  m->throughput = mean_over(iters, "microbatches_done", 1);
  m->communication_s = mean_over(iters, "communication_s", 1);
  m->wasted_s = json_number_value(json_object_get(s, "wasted_compute_s"));
  json_t *wc = json_object_get(s, "wasted_compute_on_crashed_s");
  m->wasted_crashed_s = json_is_number(wc) ? json_number_value(wc) : NAN;
  json_t *unagg = json_object_get(s, "unaggregated_compute_s");
  m->unaggregated_s = json_is_number(unagg) ? json_number_value(unagg) : NAN;
  m->crashes = (int)json_integer_value(json_object_get(s, "crashes"));
  m->reroutes = (int)json_integer_value(json_object_get(s, "forward_reroutes"));
  m->recoveries = (int)json_integer_value(json_object_get(s, "backward_recoveries"));
  m->lost = (int)json_integer_value(json_object_get(s, "lost_microbatches"));
  m->agree = json_is_true(json_object_get(s, "stage_hashes_agree"));
  json_t *fc = json_object_get(s, "flows_cost");
  m->flows = (int)json_integer_value(json_object_get(fc, "flows"));
  /* a cost only when a probe measured every flow's path */
  bool all_probed = m->flows > 0 && json_integer_value(json_object_get(fc, "probed")) == m->flows;
  m->flows_sum = all_probed ? json_number_value(json_object_get(fc, "sum")) : NAN;
  json_t *val = json_object_get(s, "validation");
  m->validation = json_array_size(val) > 0 ? json_incref(val) : NULL;
}

/* The repeats' validation curves, averaged per evaluated iteration over the
 * repeats that have a loss there (partial evaluations included, counted in
 * "partial"). */
static json_t *mean_validation(const run_metrics *ms, int n) {
  json_t *out = json_array();
  for (json_int_t it = 0;; it++) {
    double sum = 0;
    int k = 0, partial = 0, seen = 0;
    json_int_t next = -1; /* the smallest iteration above `it` any repeat evaluated */
    for (int r = 0; r < n; r++) {
      size_t i;
      json_t *v;
      json_array_foreach(ms[r].validation, i, v) {
        json_int_t vi = json_integer_value(json_object_get(v, "iteration"));
        json_t *loss = json_object_get(v, "val_loss");
        if (vi > it && (next < 0 || vi < next)) next = vi;
        if (vi != it) continue;
        seen++;
        if (!json_is_number(loss)) continue;
        sum += json_number_value(loss);
        k++;
        partial += !json_is_true(json_object_get(v, "complete"));
      }
    }
    if (seen)
      json_array_append_new(out, json_pack("{s:I,s:o,s:i,s:i}", "iteration", it, "val_loss",
                                           k ? json_real(sum / k) : json_null(), "repeats", k, "partial", partial));
    if (next < 0) break;
    it = next - 1;
  }
  return out;
}

/* Our flows against the exact min-cost flow on the links the peers measured
 * (one data node: the exact solver's scope). */
static void optimal_for(const char *exe, json_t *summary, const char *dir, run_metrics *m) {
  char inst[PATH_MAX], out[PATH_MAX];
  m->optimal_flows = 0;
  m->optimal_sum = NAN;
  if (path_join(inst, sizeof(inst), dir, "flow-instance.json") != 0 ||
      path_join(out, sizeof(out), dir, "flow-optimal.json") != 0)
    return;
  if (json_dump_file(json_object_get(summary, "flow_instance"), inst, 0) != 0) return;
  char *argv[] = {(char *)exe, "sim", "flow", "--instance", inst, "--algo", "optimal", "--objective", "sum", "--json",
                  NULL};
  if (run_child(argv, out) != 0) return;
  json_error_t jerr;
  json_t *o = json_load_file(out, 0, &jerr);
  if (!o) return;
  m->optimal_flows = (int)json_integer_value(json_object_get(o, "num_flows"));
  m->optimal_sum = json_number_value(json_object_get(o, "total_cost"));
  json_decref(o);
}

static int run_repeat(const char *exe, const scenario *sc, const char *routing, int r, int base_port,
                      const char *workdir, run_metrics *m) {
  char dir[PATH_MAX], links[PATH_MAX], summary[PATH_MAX], log[PATH_MAX];
  static char store[EXP_ARGS_MAX][PATH_MAX];
  char *argv[EXP_ARGS_MAX];
  int n = 0;
  uint64_t seed = sc->seed + (uint64_t)r;
  char leaf[128];
  snprintf(leaf, sizeof(leaf), "%s-%s-%d", sc->name, routing, r);
  if (path_join(dir, sizeof(dir), workdir, leaf) != 0 || path_join(summary, sizeof(summary), dir, "summary.json") != 0 ||
      path_join(log, sizeof(log), dir, "swarm.log") != 0 || path_join(links, sizeof(links), dir, "links.json") != 0)
    return GW_EINVAL;
  if (gw_mkdir_p(dir, 0700) != 0) return GW_EIO;
  add(argv, &n, store, "%s", exe);
  add(argv, &n, store, "swarm");
  add(argv, &n, store, "--summary-json");
  add(argv, &n, store, "%s", summary);
  add(argv, &n, store, "--workdir");
  add(argv, &n, store, "%s/peers", dir);
  add(argv, &n, store, "--base-port");
  add(argv, &n, store, "%d", base_port);
  add(argv, &n, store, "--routing");
  add(argv, &n, store, "%s", routing);
  add(argv, &n, store, "--seed");
  add(argv, &n, store, "%llu", (unsigned long long)seed);
  add(argv, &n, store, "--data-nodes");
  add(argv, &n, store, "%d", sc->data_nodes);
  add(argv, &n, store, "--stages");
  add(argv, &n, store, "%d", sc->stages);
  add(argv, &n, store, "--relays");
  add(argv, &n, store, "%d", sc->relays);
  add(argv, &n, store, "--iterations");
  add(argv, &n, store, "%d", sc->iterations);
  add(argv, &n, store, "--churn");
  add(argv, &n, store, "%g", sc->churn);
  add(argv, &n, store, "--model");
  add(argv, &n, store, "%s", sc->model);
  add(argv, &n, store, "--microbatches");
  add(argv, &n, store, "%d", sc->microbatches);
  add(argv, &n, store, "--batch");
  add(argv, &n, store, "%d", sc->batch);
  add(argv, &n, store, "--seq");
  add(argv, &n, store, "%d", sc->seq);
  add(argv, &n, store, "--lr");
  add(argv, &n, store, "%g", sc->lr);
  add(argv, &n, store, "--flow-tick");
  add(argv, &n, store, "%d", sc->flow_tick_ms);
  add(argv, &n, store, "--hop-timeout");
  add(argv, &n, store, "%d", sc->hop_timeout_ms);
  if (sc->capacities[0]) {
    add(argv, &n, store, "--capacities");
    add(argv, &n, store, "%s", sc->capacities);
  }
  if (sc->slowdowns[0]) {
    add(argv, &n, store, "--slowdowns");
    add(argv, &n, store, "%s", sc->slowdowns);
  }
  if (sc->val_fraction > 0) {
    add(argv, &n, store, "--val-fraction");
    add(argv, &n, store, "%.17g", sc->val_fraction);
  }
  if (sc->eval_every >= 0) {
    add(argv, &n, store, "--eval-every");
    add(argv, &n, store, "%d", sc->eval_every);
  }
  if (sc->rebalance_after > 0) {
    add(argv, &n, store, "--rebalance-after");
    add(argv, &n, store, "%d", sc->rebalance_after);
  }
  if (sc->move_to_short) add(argv, &n, store, "--move-to-short");
  if (sc->dataset[0]) {
    add(argv, &n, store, "--dataset");
    add(argv, &n, store, "%s", sc->dataset);
  }
  if (sc->links[0]) {
    int rc = write_links(sc, seed, base_port, sc->data_nodes + sc->relays, links);
    if (rc != 0) return rc;
    add(argv, &n, store, "--links");
    add(argv, &n, store, "%s", links);
  }
  argv[n] = NULL;
  fprintf(stderr, "gwtf experiment: %s %s repeat %d (seed %llu)...\n", sc->name, routing, r, (unsigned long long)seed);
  int code = run_child(argv, log);
  json_error_t jerr;
  json_t *s = json_load_file(summary, 0, &jerr);
  if (!s) {
    fprintf(stderr, "gwtf experiment: the swarm wrote no summary (exit %d); its log: %s\n", code, log);
    return GW_EIO;
  }
  read_metrics(s, m);
  m->ok = code == 0;
  if (sc->churn == 0 && sc->data_nodes == 1) optimal_for(exe, s, dir, m);
  else m->optimal_sum = NAN;
  json_decref(s);
  if (code != 0) fprintf(stderr, "gwtf experiment: the swarm exited %d (log: %s)\n", code, log);
  return 0;
}

/* ---- the report ---- */

typedef double (*field_fn)(const run_metrics *m);
static double f_tpm(const run_metrics *m) { return m->time_per_mb_s; }
static double f_thr(const run_metrics *m) { return m->throughput; }
static double f_comm(const run_metrics *m) { return m->communication_s; }
static double f_waste(const run_metrics *m) { return m->wasted_s; }
static double f_unagg(const run_metrics *m) { return m->unaggregated_s; }
static double f_waste_crashed(const run_metrics *m) { return m->wasted_crashed_s; }

static void stats(const run_metrics *ms, int n, field_fn f, double *mean, double *sd) {
  double s = 0, s2 = 0;
  int k = 0;
  for (int i = 0; i < n; i++) {
    double v = f(&ms[i]);
    if (!isfinite(v)) continue;
    s += v;
    s2 += v * v;
    k++;
  }
  *mean = k ? s / k : NAN;
  *sd = k > 1 ? sqrt(fmax(0, (s2 - s * s / k) / (k - 1))) : 0;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *report(const scenario *sc, const char *routing, const run_metrics *ms, int n) {
  static const struct { const char *name; field_fn f; } fields[] = {
      {"time_per_microbatch_s", f_tpm}, {"throughput", f_thr}, {"communication_s", f_comm},
      {"wasted_compute_s", f_waste}, {"wasted_compute_on_crashed_s", f_waste_crashed},
      {"unaggregated_compute_s", f_unagg}};
  json_t *runs = json_array(), *mean = json_object(), *sd = json_object();
  for (int i = 0; i < n; i++) {
    const run_metrics *m = &ms[i];
    json_t *r = json_pack("{s:i,s:o,s:o,s:o,s:o,s:i,s:i,s:i,s:i,s:b,s:b,s:i}", "repeat", i, "time_per_microbatch_s",
                          num_or_null(m->time_per_mb_s), "throughput", num_or_null(m->throughput), "communication_s",
                          num_or_null(m->communication_s), "wasted_compute_s", num_or_null(m->wasted_s), "crashes",
                          m->crashes, "forward_reroutes", m->reroutes, "backward_recoveries", m->recoveries,
                          "lost_microbatches", m->lost, "stage_hashes_agree", m->agree, "completed", m->ok,
                          "iterations", m->iterations);
    json_object_set_new(r, "wasted_compute_on_crashed_s", num_or_null(m->wasted_crashed_s));
    json_object_set_new(r, "unaggregated_compute_s", num_or_null(m->unaggregated_s));
    json_object_set_new(r, "flows", json_integer(m->flows));
    json_object_set_new(r, "flows_cost", num_or_null(m->flows_sum));
    json_object_set_new(r, "optimal_flows", json_integer(m->optimal_flows));
    json_object_set_new(r, "optimal_cost", num_or_null(m->optimal_sum));
    if (m->validation) json_object_set(r, "validation", m->validation);
    json_array_append_new(runs, r);
  }
  for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
    double mu, s;
    stats(ms, n, fields[k].f, &mu, &s);
    json_object_set_new(mean, fields[k].name, num_or_null(mu));
    json_object_set_new(sd, fields[k].name, num_or_null(s));
  }
  json_t *rep = json_pack("{s:s,s:s,s:i,s:f,s:o,s:o,s:o}", "scenario", sc->name, "routing", routing, "repeats", n,
                          "churn", sc->churn, "runs", runs, "mean", mean, "std", sd);
  json_t *val = mean_validation(ms, n);
  if (json_array_size(val) > 0) json_object_set_new(rep, "validation", val);
  else json_decref(val);
  return rep;
}

int cmd_experiment(int argc, char **argv) {
  static const struct option opts[] = {
      {"scenario", required_argument, 0, 's'}, {"routing", required_argument, 0, 'r'},
      {"repeats", required_argument, 0, 'n'},  {"json", no_argument, 0, 'j'},
      {"base-port", required_argument, 0, 'p'}, {"workdir", required_argument, 0, 'w'},
      {"val-fraction", required_argument, 0, 'V'}, {"eval-every", required_argument, 0, 'E'},
      {"churn", required_argument, 0, 'c'},    {"help", no_argument, 0, 'h'},
      {0}};
  const char *path = NULL, *routing = "gwtf", *workdir = NULL;
  int repeats = 1, base_port = 28000, eval_every = -2; /* -2: the scenario's */
  double val_fraction = -1;                            /* -1: the scenario's */
  double churn = -1;                                   /* -1: the scenario's */
  bool json = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 's': path = optarg; break;
    case 'r': routing = optarg; break;
    case 'n': repeats = atoi(optarg); break;
    case 'j': json = true; break;
    case 'p': base_port = atoi(optarg); break;
    case 'w': workdir = optarg; break;
    case 'V': val_fraction = atof(optarg); break;
    case 'E': eval_every = atoi(optarg); break;
    case 'c': {
      char *end;
      churn = strtod(optarg, &end);
      if (end == optarg || *end) churn = NAN; /* refused below */
      break;
    }
    case 'h': cmd_experiment_help(); return 0;
    default: cmd_experiment_help(); return 2;
    }
  }
  if (!path || repeats < 1 || repeats > EXP_MAX_REPEATS || (strcmp(routing, "gwtf") && strcmp(routing, "swarm")) ||
      base_port < 1024 || base_port > 32000) {
    fprintf(stderr, "gwtf experiment: --scenario FILE, --routing gwtf|swarm, --repeats 1..%d, --base-port < 32000\n",
            EXP_MAX_REPEATS);
    return 2;
  }
  scenario sc;
  char err[600];
  if (load_scenario(path, &sc, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf experiment: %s\n", err);
    return 2;
  }
  if (churn != -1) {
    if (!(churn >= 0 && churn < 1)) {
      fprintf(stderr, "gwtf experiment: --churn is a probability per relay per iteration, in [0, 1)\n");
      return 2;
    }
    sc.churn = churn;
  }
  if (val_fraction != -1) sc.val_fraction = val_fraction;
  if (eval_every != -2) sc.eval_every = eval_every;
  if (!(sc.val_fraction >= 0 && sc.val_fraction <= 0.5) || sc.eval_every < -1) {
    fprintf(stderr, "gwtf experiment: the validation fraction is in [0, 0.5], --eval-every >= 0\n");
    return 2;
  }
  char exe[PATH_MAX], wd[PATH_MAX];
  size_t exe_len = sizeof(exe);
  if (uv_exepath(exe, &exe_len) != 0) return 1;
  if (workdir) {
    snprintf(wd, sizeof(wd), "%s", workdir);
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(wd, sizeof(wd), "%s/gwtf-experiment-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(wd)) return 1;
  }
  run_metrics *ms = calloc((size_t)repeats, sizeof(*ms));
  if (!ms) return 1;
  int failed = 0;
  for (int r = 0; r < repeats; r++)
    if (run_repeat(exe, &sc, routing, r, base_port, wd, &ms[r]) != 0 || !ms[r].ok) failed++;
  json_t *rep = report(&sc, routing, ms, repeats);
  json_object_set_new(rep, "workdir", json_string(wd));
  if (json) {
    char *text = json_dumps(rep, JSON_INDENT(2));
    if (text) puts(text);
    free(text);
  } else {
    json_t *mu = json_object_get(rep, "mean"), *sd = json_object_get(rep, "std");
    printf("%s / %s, %d repeat(s):\n", sc.name, routing, repeats);
    const char *keys[] = {"time_per_microbatch_s", "throughput", "communication_s", "wasted_compute_s",
                          "wasted_compute_on_crashed_s", "unaggregated_compute_s"};
    for (int k = 0; k < 6; k++)
      printf("  %-22s %.4f ± %.4f\n", keys[k], json_number_value(json_object_get(mu, keys[k])),
             json_number_value(json_object_get(sd, keys[k])));
  }
  json_decref(rep);
  for (int r = 0; r < repeats; r++) json_decref(ms[r].validation);
  free(ms);
  if (failed) fprintf(stderr, "gwtf experiment: %d of %d repeat(s) did not complete\n", failed, repeats);
  return failed ? 1 : 0;
}
