/* The training protocol in one process, on the deterministic simulator: a
 * repair whose target dies. A repair rebuilds a gap on replacements, and
 * the last one tells the peer after the gap (the repair's target), which
 * re-sends the gradient it holds. When the target dies before that
 * gradient reaches the replacement, the peer after the target reports it
 * (it keeps its own gradient until the target's upstream confirms), and
 * when that peer is gone too, the replacement does: the data node has the
 * stages from the target to the last rebuilt and re-sends its loss
 * gradient. Either way the microbatch completes in its iteration. Other
 * repairs are test_peer_repair.c. */
#include "testutil.h"

#include "peer_harness.h"
#include "peer_sim_common.h"
#include "train.pb-c.h"

/* Iteration 2, four stages of three relays: a microbatch's stage-2 relay
 * dies as its loss is computed; its stage-3 relay (the target of the
 * repair that follows) dies as the stage-2 replacement sends it
 * REPAIR_READY, and with it (`last_too`) its stage-4 relay. */
typedef struct target_death {
  bool last_too;
  uint64_t stage2_job_ms;
  int phase, target, last;
  uint64_t key;
} target_death;

static bool crash_stage2_at_loss(h_harness *h, h_node *n, const train_job *job, int *crash) {
  target_death *t = h->hook_ud;
  (void)crash; /* crashed here: the harness stops calling a hook once it fires */
  if (t->phase != 0 || job->kind != TRAIN_JOB_LOSS || train_peer_iteration(n->tp) != 2) return false;
  int s2 = holder(h, 2, job->key);
  t->target = holder(h, 3, job->key);
  t->last = holder(h, 4, job->key);
  if (s2 < 0 || t->target < 0 || t->last < 0) return false;
  t->key = job->key;
  h_crash(h, s2);
  t->phase = 1;
  return false;
}

/* The stage-2 replacement's REPAIR_READY for our microbatch leaves for the
 * target (the crash follows in the test's loop, not inside a send). */
static void note_repair_ready(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                              const train_tensor *tensor) {
  (void)body, (void)len, (void)tensor;
  target_death *t = h->hook_ud;
  /* (the replacement holds our microbatch's state: the dead relay's is gone) */
  if (t->phase == 1 && type == GWTF__TRAIN_MSG__TRAIN_REPAIR_READY && to == t->target && holder(h, 2, t->key) == from)
    t->phase = 2;
}

/* Runs the scene; the data node's index, and into *recomputed the forwards
 * all repairs recomputed. */
static int run_target_death(h_harness *h, uint64_t seed, target_death *t, uint64_t *recomputed_out) {
  h_init(h, 4, seed, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= 4; s++)
    for (int k = 0; k < 3; k++) {
      int r = h_add(h, TRAIN_RELAY, s, M, 0, true);
      /* a slow rebuild: the backward reaches the target, which takes it
       * and holds its own, before the gap is rebuilt */
      if (s == 2) h->nodes[r].job_ms = t->stage2_job_ms;
      h_start(h, r);
    }
  h->hook = crash_stage2_at_loss;
  h->hook_ud = t;
  h->send_hook = note_repair_ready;
  while (t->phase < 2) {
    h_run_for(h, 1);
    assert_true(sim_now(h->s) < 60000);
  }
  h_crash(h, t->target);
  if (t->last_too) h_crash(h, t->last);
  t->phase = 3;
  assert_true(h_run_until_finished(h, 120000));
  const train_counters *dc = C(h, d);
  uint64_t recomputed = 0;
  for (int i = 0; i < h->n_nodes; i++) recomputed += C(h, i)->forward_recomputed;
  if (verbose())
    fprintf(stderr, "repairs %llu, recovered %llu, targets lost %llu, recomputed %llu, deferred %llu; iteration 2 %.3f s\n",
            (unsigned long long)dc->repairs_started, (unsigned long long)dc->backward_recoveries,
            (unsigned long long)dc->repair_targets_lost, (unsigned long long)recomputed,
            (unsigned long long)dc->deferred_microbatches, h->nodes[d].secs_of[2]);
  /* the microbatch completed in its iteration, well before a trip deadline
   * (a hop timeout per stage and two more) */
  assert_int_equal(dc->deferred_microbatches + dc->lost_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_true(h->nodes[d].secs_of[2] * 1000.0 < (double)(h->tun.hop_timeout_ms * 6));
  assert_agree(h, ITERS);
  *recomputed_out = recomputed;
  return d;
}

/* The peer after the target lives: it reports the target. When the
 * replacement's own report came first (it tells the data node who it is),
 * the repair past the target starts from its output and rebuilds stage 3
 * alone (seed 5: 6 stages recomputed for 6 repairs, against 8 before);
 * else from stage 1's, stages 2 and 3 (seed 11). */
static void test_repair_target_dies(void **state) {
  (void)state;
  h_harness h;
  target_death t = {.last_too = false, .stage2_job_ms = 60};
  uint64_t recomputed;
  int d = run_target_death(&h, 5, &t, &recomputed);
  assert_int_equal(C(&h, d)->repair_targets_lost, 0);
  h_free(&h);
}

/* The peer after the target dies with it: nobody but the data node holds
 * the backward. The replacement reports the target (RECOVER, forward) and
 * the data node has stages 3 and 4 rebuilt from the replacement's output,
 * then re-sends its loss gradient. Before, nobody reported and the trip
 * deadline deferred the microbatch (here iteration 2 took 3.2 s of virtual
 * time instead of 0.4; homo-churn10 seed 170: 16 s). */
static void test_repair_target_dies_with_the_last_stage(void **state) {
  (void)state;
  h_harness h;
  target_death t = {.last_too = true, .stage2_job_ms = 60};
  uint64_t recomputed;
  int d = run_target_death(&h, 5, &t, &recomputed);
  const train_counters *dc = C(&h, d);
  assert_true(dc->repair_targets_lost >= 1);
  /* a repair past a lost target rebuilt its two stages, every other one */
  assert_int_equal(recomputed, dc->repairs_started + dc->repair_targets_lost);
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repair_target_dies),
      cmocka_unit_test(test_repair_target_dies_with_the_last_stage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
