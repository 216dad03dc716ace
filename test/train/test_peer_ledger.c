/* Exactly once (issue 20, item 4; train/peer_ledger.h), on the
 * deterministic simulator:
 *   - order: with --deterministic the weights after every iteration are the
 *     same bytes whichever members compute which microbatches, in whatever
 *     order (one relay per stage against three of capacity 1);
 *   - duplicate: a SWARM-style restart sends a microbatch a relay already
 *     computed its backward for through it again. Without --deterministic
 *     its gradient is in that relay's sum twice (it is reported:
 *     ledger.duplicate); with it the copy is kept once by ID, and the run
 *     ends with the fault-free run's weights, bit for bit;
 *   - missing: a member that accumulated microbatches dies as the round
 *     starts; the stage's aggregator finds them in the iteration's ledger
 *     (BEGIN_AGG) and in no contribution: ledger.missing. With
 *     --deterministic the member had shared each microbatch's gradient with
 *     its stage as it computed it: the aggregator counts those
 *     (ledger.recovered), nothing is missing, and the weights are the
 *     fault-free run's, bit for bit;
 *   - re-run: a member dies in the middle of the iteration after it
 *     accumulated some microbatches; with --deterministic the data node runs
 *     them again (the other stages keep theirs by ID), nothing is missing and
 *     the weights are the fault-free run's, bit for bit; without it, with
 *     --rerun-lost, the other stages drop the re-run's gradient and the
 *     weights are the fault-free run's to the order of additions. */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "peer_harness.h"

#define STAGES 2
#define M 4
#define ITERS 4

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

typedef struct run_result {
  float w[STAGES + 1][H_NP]; /* each stage's weights at the end (every member agrees) */
  uint64_t duplicates, missing, extra, exact_rounds, reruns, recovered;
  bool fired;
} run_result;

typedef struct scenario {
  bool det;
  int per_stage[STAGES + 1]; /* relays per stage */
  uint32_t capacity;
  train_recovery recovery;
  h_job_hook hook;
  uint64_t seed;
  bool rerun_lost; /* without det: re-run what a dead member held */
} scenario;

static void run(const scenario *sc, run_result *r) {
  h_harness h;
  memset(r, 0, sizeof(*r));
  h_init(&h, STAGES, sc->seed, verbose());
  h.tun.deterministic = sc->det;
  h.tun.rerun_lost = sc->rerun_lost;
  h.recovery = sc->recovery;
  h.hook = sc->hook;
  h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < sc->per_stage[s]; k++) h_add(&h, TRAIN_RELAY, s, sc->capacity, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  assert_true(h_run_until_finished(&h, 600000));
  char why[200] = "";
  if (!h_hashes_agree(&h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  for (int i = 0; i < h.n_nodes; i++) {
    const h_node *n = &h.nodes[i];
    const train_counters *c = train_peer_counters(n->tp);
    r->duplicates += c->ledger_duplicates;
    r->missing += c->ledger_missing;
    r->extra += c->ledger_extra;
    r->exact_rounds += c->ledger_exact_rounds;
    r->reruns += c->ledger_reruns;
    r->recovered += c->ledger_recovered;
    if (n->alive) memcpy(r->w[n->stage], n->w, sizeof(n->w));
  }
  r->fired = h.hook_fired;
  h_free(&h);
}

static void assert_same_weights(const run_result *a, const run_result *b) {
  for (int s = 0; s <= STAGES; s++)
    if (memcmp(a->w[s], b->w[s], sizeof(a->w[s])) != 0)
      fail_msg("stage %d: weights %.9g %.9g against %.9g %.9g", s, (double)a->w[s][0], (double)a->w[s][1],
               (double)b->w[s][0], (double)b->w[s][1]);
}

/* One relay per stage computes everything in arrival order; three per
 * stage of capacity 1 split every iteration between them, in another
 * order: --deterministic gives both the same bytes, every round exact and
 * nothing duplicated, missing or extra. */
static void test_order_independent(void **state) {
  (void)state;
  scenario one = {true, {0, 1, 1}, M, TRAIN_RECOVER_PATH, NULL, 11, false};
  scenario three = {true, {0, 3, 3}, 1, TRAIN_RECOVER_PATH, NULL, 12, false};
  run_result a, b;
  run(&one, &a);
  run(&three, &b);
  assert_same_weights(&a, &b);
  assert_int_equal(a.duplicates + a.missing + a.extra + b.duplicates + b.missing + b.extra, 0);
  /* every stage's every round, averaged exactly by microbatch */
  assert_int_equal(a.exact_rounds, (STAGES + 1) * ITERS);
  assert_int_equal(b.exact_rounds, (STAGES + 1) * ITERS);
}

/* The first stage-1 relay to start a backward in iteration 1 dies right
 * then: it has accumulated nothing of that iteration, and the data node
 * restarts its microbatches through the other one (SWARM recovery), and so
 * through stage 2's only relay a second time. */
static bool crash_first_stage1_backward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_BACKWARD || n->stage != 1 || train_peer_iteration(n->tp) != 1) return false;
  *crash = n->index;
  return true;
}

static void test_duplicate_backward_counted_once(void **state) {
  (void)state;
  scenario clean = {true, {0, 2, 1}, M, TRAIN_RECOVER_RESTART, NULL, 21, false};
  scenario churned = clean;
  churned.hook = crash_first_stage1_backward;
  run_result a, b;
  run(&clean, &a);
  run(&churned, &b);
  assert_true(b.fired);
  assert_true(b.duplicates >= 1);                 /* stage 2's relay saw a microbatch twice */
  assert_int_equal(a.duplicates + b.missing, 0); /* and nothing of the iteration was lost */
  assert_same_weights(&a, &b);                    /* each microbatch counted once, by ID */
  /* without --deterministic the restart is reported just the same */
  scenario plain = churned;
  plain.det = false;
  run_result c;
  run(&plain, &c);
  assert_true(c.fired);
  assert_true(c.duplicates >= 1);
}

/* A stage-2 member that accumulated some microbatches dies as it starts
 * its round (its gradient export): its contribution never comes. */
static bool crash_stage2_export(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_GRAD_EXPORT || n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  if (n->g[0] == 0.0f && n->g[1] == 0.0f) return false; /* it computed nothing */
  *crash = n->index;
  return true;
}

static void test_missing_contribution_reported(void **state) {
  (void)state;
  scenario sc = {false, {0, 1, 2}, 2, TRAIN_RECOVER_PATH, crash_stage2_export, 31, false};
  run_result r;
  run(&sc, &r);
  assert_true(r.fired);
  assert_true(r.missing >= 1);
  assert_int_equal(r.duplicates + r.extra + r.recovered, 0);
}

static void test_missing_contribution_recovered(void **state) {
  (void)state;
  scenario clean = {true, {0, 1, 2}, 2, TRAIN_RECOVER_PATH, NULL, 31, false};
  scenario churned = clean;
  churned.hook = crash_stage2_export;
  run_result a, b;
  run(&clean, &a);
  run(&churned, &b);
  assert_true(b.fired);
  assert_true(b.recovered >= 1);
  assert_int_equal(b.missing + b.duplicates + b.extra, 0);
  assert_same_weights(&a, &b);
}

/* A stage-2 member that computed a backward in iteration 1 dies as it
 * starts its next one, while the iteration runs. */
static bool crash_stage2_mid_iteration(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_BACKWARD || n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  if (n->g[0] == 0.0f && n->g[1] == 0.0f) return false; /* nothing of the iteration accumulated yet */
  *crash = n->index;
  return true;
}

static void test_rerun_restores_exactly_once(void **state) {
  (void)state;
  scenario clean = {true, {0, 1, 2}, 2, TRAIN_RECOVER_PATH, NULL, 41, false};
  scenario churned = clean;
  churned.hook = crash_stage2_mid_iteration;
  run_result a, b;
  run(&clean, &a);
  run(&churned, &b);
  assert_true(b.fired);
  assert_true(b.reruns >= 1);
  assert_int_equal(b.missing + b.duplicates + b.extra, 0);
  assert_same_weights(&a, &b);
}

/* Largest difference between two runs' weights, relative to the weight. */
static double max_rel_diff(const run_result *a, const run_result *b) {
  double worst = 0;
  for (int s = 0; s <= STAGES; s++)
    for (int k = 0; k < H_NP; k++) {
      double x = a->w[s][k], y = b->w[s][k], d = fabs(x - y) / (fabs(x) > 1e-3 ? fabs(x) : 1e-3);
      if (d > worst) worst = d;
    }
  return worst;
}

/* The same death without --deterministic, with --rerun-lost: the sums
 * cannot be taken apart, so the re-run tells each stage whether it is for
 * it (rerun_stages): the dead member's stage accumulates it on its other
 * member, every other stage (and the data node) computes its backward and
 * drops the weight gradient. Nothing missing, nothing twice: the weights
 * are the fault-free run's up to the order of float additions (1e-6 here;
 * a gradient lost or counted twice moves them by 1e-3 or more). Without
 * --rerun-lost the same death leaves its microbatches missing. */
static void test_rerun_without_deterministic(void **state) {
  (void)state;
  scenario clean = {false, {0, 1, 2}, 2, TRAIN_RECOVER_PATH, NULL, 41, true};
  scenario churned = clean, off;
  churned.hook = crash_stage2_mid_iteration;
  off = churned;
  off.rerun_lost = false;
  run_result a, b, c;
  run(&clean, &a);
  run(&churned, &b);
  run(&off, &c);
  assert_true(c.fired);
  assert_int_equal(c.reruns, 0);
  assert_true(c.missing >= 1);
  assert_true(b.fired);
  assert_true(b.reruns >= 1);
  assert_int_equal(b.missing + b.duplicates + b.extra, 0);
  double d = max_rel_diff(&a, &b), lost = max_rel_diff(&a, &c);
  if (verbose())
    printf("re-run without --deterministic: %llu re-runs, weights within %.3g of fault-free; without "
           "--rerun-lost %llu missing, %.3g\n", (unsigned long long)b.reruns, d, (unsigned long long)c.missing, lost);
  assert_true(d < 1e-5);
  assert_true(lost > 1e-3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_independent),
      cmocka_unit_test(test_duplicate_backward_counted_once),
      cmocka_unit_test(test_missing_contribution_reported),
      cmocka_unit_test(test_missing_contribution_recovered),
      cmocka_unit_test(test_rerun_restores_exactly_once),
      cmocka_unit_test(test_rerun_without_deterministic),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
