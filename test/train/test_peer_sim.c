/* The training protocol in one process, on the deterministic simulator:
 * fault-free training equals a direct computation; a forward crash is
 * re-routed; a backward crash is repaired without recomputing anything before
 * the gap; a leader crash hands over; a joiner is placed, downloads and
 * trains; the SWARM baseline restarts instead of repairing. */
#include "testutil.h"

#include <math.h>

#include "util/rng.h"

#include "peer_harness.h"
#include "train.pb-c.h"

#define M 4       /* microbatches per iteration */
#define ITERS 5
#define STAGES 3

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

/* ---- the direct reference: the same fake model, one process ---- */

typedef struct ref_model {
  float w[STAGES + 1][H_NP]; /* stage 0 = the data node's embedding */
} ref_model;

static void ref_iteration(ref_model *rm, uint64_t it, double *loss_out) {
  enum { A = H_B * H_T * H_C };
  float g[STAGES + 1][H_NP] = {{0}};
  double loss_sum = 0;
  for (uint32_t j = 0; j < M; j++) {
    int32_t tok[H_B * H_T], tgt[H_B * H_T];
    h_sample(NULL, it, j, tok, tgt);
    float x[STAGES + 1][A], emb_in[A], grad[A];
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        emb_in[i * H_C + c] = (float)tok[i] / 256.0f;
        x[0][i * H_C + c] = emb_in[i * H_C + c] * (1.0f + rm->w[0][0]) + rm->w[0][1] * (float)(c + 1);
      }
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < A; k++) x[s][k] = x[s - 1][k] * (1.0f + rm->w[s][0]) + rm->w[s][1];
    double l = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = x[STAGES][i * H_C + c] - (float)tgt[i] / 256.0f;
        l += (double)d * d;
        grad[i * H_C + c] = 2.0f * d / (float)A;
      }
    loss_sum += (float)(l / A);
    for (int s = STAGES; s >= 1; s--)
      for (int k = 0; k < A; k++) {
        g[s][0] += grad[k] * x[s - 1][k];
        g[s][1] += grad[k];
        grad[k] *= 1.0f + rm->w[s][0];
      }
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        g[0][0] += grad[i * H_C + c] * emb_in[i * H_C + c];
        g[0][1] += grad[i * H_C + c] * (float)(c + 1);
      }
  }
  for (int s = 0; s <= STAGES; s++)
    for (int k = 0; k < H_NP; k++) rm->w[s][k] -= H_LR * (g[s][k] / (float)M);
  *loss_out = loss_sum / M;
}

/* The validation loss of the reference's current weights: the same forward,
 * per-microbatch losses as floats, their mean in double. */
static double ref_eval(const ref_model *rm, uint32_t n) {
  enum { A = H_B * H_T * H_C };
  double sum = 0;
  for (uint32_t j = 0; j < n; j++) {
    int32_t tok[H_B * H_T], tgt[H_B * H_T];
    h_val_sample(NULL, j, tok, tgt);
    float x[A];
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++)
        x[i * H_C + c] = (float)tok[i] / 256.0f * (1.0f + rm->w[0][0]) + rm->w[0][1] * (float)(c + 1);
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < A; k++) x[k] = x[k] * (1.0f + rm->w[s][0]) + rm->w[s][1];
    double l = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = x[i * H_C + c] - (float)tgt[i] / 256.0f;
        l += (double)d * d;
      }
    sum += (float)(l / A);
  }
  return sum / n;
}

/* ---- swarms ---- */

/* One data node and two relays per stage, placed by the leader. */
static int build(h_harness *h, uint64_t seed, int relays_per_stage, uint32_t relay_cap) {
  h_init(h, STAGES, seed, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int i = 0; i < STAGES * relays_per_stage; i++) h_start(h, h_add(h, TRAIN_RELAY, -1, relay_cap, 0, false));
  return d;
}

static void assert_agree(h_harness *h, uint64_t iters) {
  char why[200] = "";
  if (!h_hashes_agree(h, iters, why, sizeof(why))) fail_msg("%s", why);
}

static const train_counters *C(h_harness *h, int i) { return train_peer_counters(h->nodes[i].tp); }

/* Every iteration's loss at data node d is the reference's, to float
 * rounding; the reference's final weights into *out when it is not NULL. */
static void assert_losses_match_reference(h_harness *h, int d, ref_model *out) {
  ref_model rm = {{{0}}};
  for (uint64_t it = 0; it < ITERS; it++) {
    double ref, got = h->nodes[d].loss_of[it];
    ref_iteration(&rm, it, &ref);
    if (fabs(got - ref) > 1e-5 * fmax(1.0, fabs(ref)))
      fail_msg("iter %llu loss %.9f, reference %.9f", (unsigned long long)it, got, ref);
  }
  if (out) *out = rm;
}

static void test_fault_free_matches_reference(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 1, 2, M);
  assert_true(h_run_until_finished(&h, 120000));
  /* the leader placed two relays in every stage */
  for (int s = 1; s <= STAGES; s++) {
    int n = 0;
    for (int i = 0; i < h.n_nodes; i++) n += h.nodes[i].stage == s;
    assert_int_equal(n, 2);
  }
  ref_model rm;
  assert_losses_match_reference(&h, d, &rm);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_int_equal(C(&h, d)->backward_recoveries, 0);
  /* final weights of every stage equal the reference's */
  for (int i = 0; i < h.n_nodes; i++)
    for (int k = 0; k < H_NP; k++) assert_float_equal(h.nodes[i].w[k], rm.w[h.nodes[i].stage][k], 1e-6);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Validation (peer_eval.c): evaluations before iterations 0, 2, 4 and after
 * the last one leave training exactly as without them (losses and final
 * weights equal the direct reference, every stage agrees), leave no compute
 * state anywhere, count as no forward or backward of the relays (their
 * aggregation weight), and their loss equals the reference's validation
 * loss at the same weights. */
#define EVAL_N 3
#define EVAL_EVERY 2
static void test_eval_leaves_training_unchanged(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 1, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  train_peer_set_validation(h.nodes[d].tp, h_val_sample, NULL, EVAL_N, EVAL_EVERY);
  h_start(&h, d);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  assert_true(h_run_until_finished(&h, 120000));
  h_node *dn = &h.nodes[d];
  ref_model rm = {{{0}}};
  int evals = 0;
  for (uint64_t it = 0; it <= ITERS; it++) {
    bool due = it % EVAL_EVERY == 0 || it == ITERS;
    assert_int_equal(dn->have_eval[it], due);
    if (due) {
      evals++;
      double want = ref_eval(&rm, EVAL_N), got = dn->eval_loss_of[it];
      assert_int_equal(dn->eval_ok_of[it], EVAL_N);
      if (fabs(got - want) > 1e-5 * fmax(1.0, fabs(want)))
        fail_msg("eval before iter %llu: val_loss %.9f, reference %.9f", (unsigned long long)it, got, want);
    }
    if (it == ITERS) break;
    double ref;
    ref_iteration(&rm, it, &ref);
    double got = dn->loss_of[it];
    if (fabs(got - ref) > 1e-5 * fmax(1.0, fabs(ref)))
      fail_msg("iter %llu loss %.9f, reference %.9f", (unsigned long long)it, got, ref);
  }
  assert_int_equal(evals, 4);
  assert_int_equal(dn->eval_states_held, 0);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  /* the relays' forwards and backwards are the training ones only */
  for (int s = 1; s <= STAGES; s++) {
    uint64_t fwd = 0, bwd = 0;
    for (int i = 0; i < h.n_nodes; i++)
      if (h.nodes[i].stage == s) fwd += C(&h, i)->forward_computed, bwd += C(&h, i)->backward_computed;
    assert_int_equal(fwd, (uint64_t)M * ITERS);
    assert_int_equal(bwd, (uint64_t)M * ITERS);
  }
  for (int i = 0; i < h.n_nodes; i++) {
    assert_int_equal(h_states_held(&h.nodes[i]), 0);
    for (int k = 0; k < H_NP; k++) assert_float_equal(h.nodes[i].w[k], rm.w[h.nodes[i].stage][k], 1e-6);
  }
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* A relay dies as its first eval forward runs: the eval microbatch is
 * re-routed like a training one, the evaluation still covers the whole
 * validation set (or says how much it covered), and training goes on. */
static bool crash_at_eval_forward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_EVAL_FORWARD || n->role != TRAIN_RELAY || n->stage != 2) return false;
  *crash = n->index;
  return true;
}

static void test_eval_survives_a_relay_crash(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 3, verbose());
  h.hook = crash_at_eval_forward;
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  train_peer_set_validation(h.nodes[d].tp, h_val_sample, NULL, EVAL_N, EVAL_EVERY);
  h_start(&h, d);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  assert_true(h_run_until_finished(&h, 300000));
  assert_true(h.hook_fired);
  h_node *dn = &h.nodes[d];
  assert_true(dn->have_eval[0]);
  assert_int_equal(dn->eval_ok_of[0], EVAL_N); /* re-routed, not lost */
  uint64_t rerouted = 0;
  for (int i = 0; i < h.n_nodes; i++) rerouted += C(&h, i)->forward_rerouted;
  assert_true(rerouted >= 1);
  assert_true(dn->have_eval[ITERS]);
  assert_int_equal(dn->iterations_done, ITERS);
  assert_int_equal(dn->eval_states_held, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* The only relay of stage 2 dies in the evaluation before iteration 2:
 * its eval microbatch, and the ones after it, have nowhere to go. They are
 * not deferred to a later evaluation: eval.done comes with what came back
 * (fewer than the set), and training goes on once a new relay is placed in
 * the empty stage and restores its replica (train/peer_replica.c; without
 * one the run would stop: stage.lost). */
static bool crash_at_eval_of_2(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_EVAL_FORWARD || n->stage != 2 || train_peer_iteration(n->tp) < 2) return false;
  *crash = n->index;
  return true;
}

static void test_eval_partial_when_a_stage_is_lost(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 5, verbose());
  h.hook = crash_at_eval_of_2;
  h.replicate_every = 1;
  h.replicas = 2;
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  train_peer_set_validation(h.nodes[d].tp, h_val_sample, NULL, EVAL_N, EVAL_EVERY);
  h_start(&h, d);
  for (int i = 0; i < STAGES; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  for (int k = 0; k < 2000 && !h.hook_fired; k++) h_run_for(&h, 10);
  assert_true(h.hook_fired);
  h_node *dn = &h.nodes[d];
  for (int k = 0; k < 6000 && !dn->have_eval[2]; k++) h_run_for(&h, 10);
  assert_true(dn->have_eval[2]);
  assert_true(dn->eval_ok_of[2] < EVAL_N);
  assert_true(dn->eval_ok_of[2] == 0 ? isnan(dn->eval_loss_of[2]) : isfinite(dn->eval_loss_of[2]));
  assert_int_equal(dn->eval_states_held, 0);
  h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false)); /* the leader places it in stage 2 */
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(dn->iterations_done, ITERS);
  assert_true(dn->have_eval[ITERS]);
  assert_int_equal(dn->eval_ok_of[ITERS], EVAL_N);
  h_free(&h);
}

/* An aggregation that begins while a data node evaluates (the leader did
 * not wait for it: here a forged-early BEGIN_AGG from the other data node)
 * drops the eval microbatches with the rest of the iteration's; the
 * evaluation then reports what came back instead of waiting forever. */
typedef struct early_agg {
  int d0, d1;
  bool sent;
} early_agg;

static bool begin_agg_during_eval(h_harness *h, h_node *n, const train_job *job, int *crash) {
  early_agg *e = h->hook_ud;
  (void)crash;
  if (e->sent || n->index != e->d0 || job->kind != TRAIN_JOB_EVAL_EMBED || train_peer_iteration(n->tp) != 2)
    return false;
  Gwtf__TrainIteration it = GWTF__TRAIN_ITERATION__INIT;
  it.iteration = 2;
  uint8_t buf[32];
  size_t len = gwtf__train_iteration__pack(&it, buf);
  assert_int_equal(h_inject(h, e->d1, e->d0, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, buf, len, NULL), 0);
  e->sent = true;
  return false;
}

static void test_eval_dropped_by_a_round_reports(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 11, verbose());
  early_agg e = {0};
  h.hook = begin_agg_during_eval;
  h.hook_ud = &e;
  e.d0 = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  e.d1 = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  train_peer_set_validation(h.nodes[e.d0].tp, h_val_sample, NULL, EVAL_N, EVAL_EVERY);
  h_start(&h, e.d0);
  h_start(&h, e.d1);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  h_node *dn = &h.nodes[e.d0];
  for (int k = 0; k < 20000 && !dn->have_eval[2]; k++) h_run_for(&h, 10);
  assert_true(e.sent);
  assert_true(dn->have_eval[2]);
  assert_true(dn->eval_ok_of[2] < EVAL_N);
  h_free(&h);
}

/* Churn can tear down every flow of a data node. From iteration 2 on, its
 * router reports no route: after flow_grace_ms each iteration still trains
 * every microbatch, hop by hop on next_hop's fallback, instead of waiting for
 * routes (settle_ms) and reporting empty iterations. Only the first
 * iteration without a flow waits the grace; the ones after it, whose wait
 * would be as vain, start at once. */
static void test_no_flow_routes_by_fallback(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 5, 2, M);
  h.nodes[d].no_routes_from = 2;
  assert_true(h_run_until_finished(&h, 120000));
  if (verbose())
    for (uint64_t it = 0; it < ITERS; it++) fprintf(stderr, "iteration %llu: %.3f s\n", (unsigned long long)it, h.nodes[d].secs_of[it]);
  double grace_s = (double)h.tun.flow_grace_ms / 1000.0;
  assert_true(h.nodes[d].secs_of[2] > grace_s);
  for (uint64_t it = 3; it < ITERS; it++) assert_true(h.nodes[d].secs_of[it] < h.nodes[d].secs_of[2] - grace_s / 2);
  assert_losses_match_reference(&h, d, NULL);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* The data node starts its first iteration when every stage has a member,
 * but its directory may not say yet which stage a relay the leader just
 * placed is in: no stage-1 peer is a hop for a moment. The microbatches
 * wait for one (within a trip), rather than go to the next iteration; a CI
 * run deferred one of the first iteration's that way. */
static void test_no_hop_yet_waits(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 7, 2, M);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY) h.nodes[i].unrouted_until = UINT64_MAX;
  for (int k = 0; k < 20000 && C(&h, d)->forward_computed < M; k++) h_run_for(&h, 10);
  assert_int_equal(C(&h, d)->forward_computed, M); /* every embedding is done, none has a hop */
  h_run_for(&h, 2 * h.tun.tick_ms);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  uint64_t now = sim_now(h.s);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY) h.nodes[i].unrouted_until = now + h.tun.tick_ms;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* A relay whose next stage has live members but no hop yet (a relay placed
 * there a moment ago whose link cost it has not measured: its view lags
 * the data node's) waits for one within a hop timeout rather than DENY
 * "no_route" at once: those DENYs came back to the data node from every
 * relay of the stage within milliseconds and it deferred the whole
 * iteration (swarm_kill_fraction, once in a fresh clone). */
static void test_relay_no_hop_yet_waits(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 8, 2, M);
  while (train_peer_iteration(h.nodes[d].tp) < 2 && sim_now(h.s) < 60000) h_run_for(&h, 1);
  uint64_t until = sim_now(h.s) + h.tun.hop_timeout_ms / 2;
  int blinded = 0;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY && h.nodes[i].stage == 2) h.nodes[i].unrouted_until = until, blinded++;
  assert_int_equal(blinded, 2);
  uint64_t forwarded = 0;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 2) forwarded += C(&h, i)->forward_computed;
  assert_true(h_run_until_finished(&h, 120000));
  uint64_t after = 0;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 2) after += C(&h, i)->forward_computed;
  assert_true(after > forwarded);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_losses_match_reference(&h, d, NULL);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* With fewer flows than microbatches, a data node starts as many as its
 * share of the narrowest stage allows (spread over its flows), the rest as
 * microbatches come home. */
static uint32_t max_in_flight_with_one_route(int relays_per_stage, uint32_t relay_cap) {
  h_harness h;
  int d = build(&h, 6, relays_per_stage, relay_cap);
  h.nodes[d].routes = 1;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  uint32_t max = h.nodes[d].max_in_flight;
  h_free(&h);
  return max;
}

/* Two data nodes with one route each share one relay per stage. */
static uint32_t max_in_flight_of_two(uint32_t relay_cap) {
  h_harness h;
  h_init(&h, STAGES, 6, verbose());
  int d[2];
  for (int k = 0; k < 2; k++) {
    d[k] = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
    h.nodes[d[k]].routes = 1;
    h_start(&h, d[k]);
  }
  for (int s = 1; s <= STAGES; s++) h_start(&h, h_add(&h, TRAIN_RELAY, s, relay_cap, 0, true));
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(C(&h, d[0])->lost_microbatches + C(&h, d[1])->lost_microbatches, 0);
  assert_agree(&h, ITERS);
  uint32_t max = h.nodes[d[0]].max_in_flight > h.nodes[d[1]].max_in_flight ? h.nodes[d[0]].max_in_flight
                                                                            : h.nodes[d[1]].max_in_flight;
  h_free(&h);
  return max;
}

static void test_starts_up_to_its_share(void **state) {
  (void)state;
  assert_int_equal(max_in_flight_with_one_route(2, M), M); /* share 2M, capped at M */
  assert_int_equal(max_in_flight_with_one_route(1, 2), 2); /* share 2 */
  assert_int_equal(max_in_flight_with_one_route(1, 1), 1); /* share 1: one at a time */
  /* 3 slots over 2 data nodes: 2 each (one waits for a slot), not 1 */
  assert_int_equal(max_in_flight_of_two(3), 2);
}

/* A data node whose narrowest stage grows while an iteration runs one
 * microbatch at a time (one relay of capacity 1 per stage; a second joins
 * every stage once the first iteration is done) starts more at once as the
 * joiners get ready, not one per microbatch that comes home: the run ends
 * sooner than with the iteration's width fixed at its start, and trains
 * exactly what the reference does either way. */
static uint64_t run_with_joiners(bool widen, uint64_t *widened) {
  h_harness h;
  h_init(&h, STAGES, 12, verbose());
  h.tun.no_widen = !widen; /* before any peer starts: each takes the tunables then */
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h.nodes[d].routes = 1;
  h_start(&h, d);
  /* compute well over the network's delays, so that an iteration's width is what its time is made of */
  for (int s = 1; s <= STAGES; s++) {
    int r = h_add(&h, TRAIN_RELAY, -1, 1, 0, false);
    h.nodes[r].job_ms = 40;
    h_start(&h, r);
  }
  while (train_peer_iteration(h.nodes[d].tp) < 1 && sim_now(h.s) < 60000) h_run_for(&h, 10);
  assert_true(train_peer_iteration(h.nodes[d].tp) >= 1);
  for (int s = 1; s <= STAGES; s++) {
    int r = h_add(&h, TRAIN_RELAY, s, 1, 0, false);
    h.nodes[r].job_ms = 40;
    h_start(&h, r);
  }
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_losses_match_reference(&h, d, NULL);
  assert_agree(&h, ITERS);
  *widened = C(&h, d)->microbatches_widened;
  uint64_t end = sim_now(h.s);
  h_free(&h);
  return end;
}

static void test_widens_when_a_stage_grows(void **state) {
  (void)state;
  uint64_t widened_fixed, widened;
  uint64_t fixed = run_with_joiners(false, &widened_fixed), wide = run_with_joiners(true, &widened);
  assert_int_equal(widened_fixed, 0);
  assert_true(widened > 0);
  if (wide >= fixed) fail_msg("widening: the run ended at %llu ms, at the start's width at %llu ms",
                              (unsigned long long)wide, (unsigned long long)fixed);
}

/* A data node that starts more microbatches than the next stage has slots
 * (its router reports M routes; one relay of capacity 1 per stage) hears
 * "full" for all but one. Slots free up as microbatches finish, so the
 * others wait for one and every microbatch trains, in the reference's
 * order of results, rather than being deferred at the first "full". */
static void test_full_next_stage_waits_for_a_slot(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 7, 1, 1);
  h.nodes[d].routes = M;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(C(&h, d)->denies_received > 0); /* the next stage was full, and said so */
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches, 0);
  assert_losses_match_reference(&h, d, NULL);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Two data nodes share one relay of capacity 2 per stage; a has two routes,
 * b one, and there are three for two slots, so one is still going when the
 * other is done. The aggregation waits for the last, so it starts nothing
 * new once the other's ITER_DONE arrives: it defers the rest to its next
 * iteration, and no microbatch is lost on the way. (Without the wrap-up,
 * both train all their microbatches every iteration.) */
static void test_slow_data_node_wraps_up(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 8, verbose());
  int a = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  int b = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h.nodes[a].routes = 2;
  h.nodes[b].routes = 1;
  h_start(&h, a);
  h_start(&h, b);
  for (int i = 0; i < STAGES; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, 2, 0, false));
  assert_true(h_run_until_finished(&h, 120000));
  /* whichever is behind in an iteration (they share the relays' slots, so
   * either can be) stops there; all is trained, late, but none is lost */
  assert_true(C(&h, a)->deferred_microbatches + C(&h, b)->deferred_microbatches > 0);
  assert_true(C(&h, a)->microbatches_done > 0 && C(&h, b)->microbatches_done > 0);
  assert_int_equal(C(&h, a)->lost_microbatches + C(&h, b)->lost_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Crash a stage-2 relay the moment it starts a forward in iteration 2. */
static bool crash_on_forward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h;
  if (job->kind != TRAIN_JOB_FORWARD || n->stage != 2 || train_peer_iteration(n->tp) != 2) return false;
  *crash = n->index;
  return true;
}

static void test_forward_crash_reroutes(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 2, 2, M);
  h.hook = crash_on_forward;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  uint64_t rerouted = 0;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1 && h.nodes[i].alive) rerouted += C(&h, i)->forward_rerouted;
  assert_true(rerouted >= 1);
  /* nothing lost, nothing deferred: every iteration trained all M */
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches + C(&h, d)->lost_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Crash the stage-`stage` relay that carried a microbatch when its loss is
 * computed, i.e. after its forward and before its backward. */
static bool crash_stage_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash, int stage) {
  if (job->kind != TRAIN_JOB_LOSS || train_peer_iteration(n->tp) != 2) return false;
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *r = &h->nodes[i];
    if (!r->alive || r->stage != stage) continue;
    for (int k = 0; k < 64; k++)
      if (r->states[k].used && r->states[k].key == job->key) {
        *crash = i;
        return true;
      }
  }
  return false;
}

static bool crash_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  return crash_stage_before_backward(h, n, job, crash, 2);
}

/* How long a data node waits for a microbatch's backward after its loss. */
static uint64_t trip_deadline_ms(const h_harness *h) { return h->tun.hop_timeout_ms * (uint64_t)(h->n_stages + 2); }

static void run_backward_crash(train_recovery mode, uint64_t seed, h_harness *h, int *d) {
  h_init(h, STAGES, seed, verbose());
  h->recovery = mode;
  *d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, *d);
  for (int i = 0; i < STAGES * 2; i++) h_start(h, h_add(h, TRAIN_RELAY, -1, M, 0, false));
  h->hook = crash_before_backward;
  assert_true(h_run_until_finished(h, 120000));
  assert_true(h->hook_fired);
}

static void test_backward_crash_repairs_along_path(void **state) {
  (void)state;
  h_harness h;
  int d;
  run_backward_crash(TRAIN_RECOVER_PATH, 3, &h, &d);
  /* every microbatch the crashed relay held was repaired, none was lost */
  uint64_t repaired = C(&h, d)->backward_recoveries;
  assert_true(repaired >= 1);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches + C(&h, d)->lost_microbatches, 0);
  /* Only the lost stage recomputed, once per repaired microbatch: no repair
   * forward anywhere else, and the data node and stage 1 computed each
   * microbatch's forward exactly once. */
  uint64_t recomputed[STAGES + 1] = {0}, forwards[STAGES + 1] = {0};
  for (int i = 0; i < h.n_nodes; i++) {
    recomputed[h.nodes[i].stage] += C(&h, i)->forward_recomputed;
    forwards[h.nodes[i].stage] += C(&h, i)->forward_computed;
  }
  assert_int_equal(recomputed[2], repaired);
  assert_int_equal(recomputed[1] + recomputed[3] + recomputed[0], 0);
  assert_int_equal(forwards[0], (uint64_t)M * ITERS);
  assert_int_equal(forwards[1], (uint64_t)M * ITERS);
  /* the relay after the gap reported it: no trip deadline was waited out */
  assert_true(h.nodes[d].secs_of[2] * 1000.0 < (double)trip_deadline_ms(&h));
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* A stage-1 relay dies before the backward of a microbatch, at a moment
 * the data node does not list its stage-mate as a hop (a relay placed there
 * a moment ago: the directory lags). The repair's gap is stage 1, so the
 * data node re-sends its own embedding into it, avoiding the dead relay:
 * nobody alive refused it, so it waits for the mate to become a hop and the
 * microbatch is repaired. Before, the avoided dead relay counted as a
 * refusal and the microbatch was deferred at once, after every stage past
 * the gap had run its backward (swarm_backward_crash in CI). */
static bool crash_stage1_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  return crash_stage_before_backward(h, n, job, crash, 1);
}

/* As the RECOVER goes to the data node, the live stage-1 relays stop being
 * hops for a hop timeout (within the data node's wait, a trip). */
static void unlist_stage1_on_recover(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                                     const train_tensor *t) {
  int *unlisted = h->hook_ud;
  (void)from, (void)to, (void)body, (void)len, (void)t;
  if (type != GWTF__TRAIN_MSG__TRAIN_RECOVER) return;
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].alive && h->nodes[i].stage == 1) {
      h->nodes[i].unrouted_until = sim_now(h->s) + h->tun.hop_timeout_ms;
      (*unlisted)++;
    }
}

static void test_repair_into_unlisted_stage_waits(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 3, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < 2; k++) h_start(&h, h_add(&h, TRAIN_RELAY, s, M, 0, true));
  int unlisted = 0;
  h.hook = crash_stage1_before_backward;
  h.send_hook = unlist_stage1_on_recover;
  h.hook_ud = &unlisted;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  assert_true(unlisted >= 1);
  const train_counters *dc = C(&h, d);
  assert_true(dc->backward_recoveries >= 1);
  assert_int_equal(dc->deferred_microbatches + dc->lost_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_losses_match_reference(&h, d, NULL);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Messages of the repair walk, counted as they are sent. */
typedef struct walk_count {
  h_harness *h;
  uint64_t probes, repairs, replies;
} walk_count;

static uint64_t count_walk(void *ud, int from, int to, size_t len, gw_rng *rng) {
  walk_count *w = ud;
  (void)from, (void)to, (void)len;
  w->probes += w->h->sending == GWTF__TRAIN_MSG__TRAIN_PROBE;
  w->repairs += w->h->sending == GWTF__TRAIN_MSG__TRAIN_REPAIR;
  w->replies += w->h->sending == GWTF__TRAIN_MSG__TRAIN_PROBE_REPLY;
  return 1 + gw_rng_below(rng, 3);
}

/* The crash of run_backward_crash: the last live peer before each gap is
 * reached with the REPAIR itself, which it answers (PROBE_REPLY), and
 * nothing is probed first: one message to it, not three (probe, reply,
 * repair), before the re-send starts. */
static void test_repair_needs_no_probe(void **state) {
  (void)state;
  h_harness h;
  walk_count w = {&h, 0, 0, 0};
  h_init(&h, STAGES, 3, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  sim_set_delay_fn(h.s, count_walk, &w);
  h.hook = crash_before_backward;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  const train_counters *dc = C(&h, d);
  if (verbose())
    fprintf(stderr, "repairs %llu: %llu REPAIR, %llu PROBE, %llu PROBE_REPLY\n",
            (unsigned long long)dc->backward_recoveries, (unsigned long long)w.repairs, (unsigned long long)w.probes,
            (unsigned long long)w.replies);
  assert_true(dc->backward_recoveries >= 1);
  assert_int_equal(w.probes, 0);
  assert_int_equal(w.repairs, dc->repairs_started);
  assert_int_equal(w.replies, w.repairs);
  assert_int_equal(dc->lost_microbatches + dc->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Repairs into a full stage. Stage 2 has two relays of one slot each.
 * One dies before the backward of its microbatch at a moment the other,
 * the only replacement, holds a microbatch of its own. With a repair
 * reserve it takes the rebuilt microbatch at once (0.03 s of virtual time
 * to the repair's end); without one (the same run, reserve 0) it turns it
 * away ("full"), and the re-sending peer waits for the slot (0.33 s): in
 * the grid, such waits were the whole of the slow tail of repairs. */
static int states_held(const h_node *n) {
  int k = 0;
  for (int i = 0; i < 64; i++) k += n->states[i].used;
  return k;
}

static bool crash_when_mate_full(h_harness *h, h_node *n, const train_job *job, int *crash) {
  int victim;
  if (!crash_before_backward(h, n, job, &victim)) return false;
  for (int i = 0; i < h->n_nodes; i++)
    if (i != victim && h->nodes[i].alive && h->nodes[i].stage == 2 && states_held(&h->nodes[i]) >= 1) {
      *crash = victim;
      return true;
    }
  return false;
}

static void run_full_stage_repair(uint32_t reserve, uint64_t *denied, uint64_t *reserved) {
  h_harness h;
  h_init(&h, STAGES, 3, verbose());
  h.tun.repair_reserve = reserve;
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < 2; k++) {
      int r = h_add(&h, TRAIN_RELAY, s, s == 2 ? 1 : M / 2, 0, true);
      h_start(&h, r);
    }
  h.hook = crash_when_mate_full;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  *denied = *reserved = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    *denied += C(&h, i)->repair_denies;
    *reserved += C(&h, i)->repair_reserve_used;
  }
  if (verbose())
    fprintf(stderr, "reserve %u: %llu repairs denied, %llu over capacity\n", reserve, (unsigned long long)*denied,
            (unsigned long long)*reserved);
  assert_true(C(&h, d)->backward_recoveries >= 1);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->lost_microbatches + C(&h, d)->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

static void test_full_stage_takes_the_repair(void **state) {
  (void)state;
  uint64_t denied, reserved;
  run_full_stage_repair(1, &denied, &reserved);
  assert_true(reserved >= 1);
  assert_int_equal(denied, 0);
  run_full_stage_repair(0, &denied, &reserved); /* the case is real: without the reserve, "full" */
  assert_int_equal(reserved, 0);
  assert_true(denied >= 1);
}

/* The crash of run_backward_crash, with a slow rebuild: REPAIR_READY takes
 * 2.5 hop timeouts (a slow replacement, a thin link). The last relay cannot
 * confirm the data node's loss gradient until the gap upstream of it is
 * rebuilt, and it answers every probe. The data node waits on it: only
 * stage 2 is recomputed. Before, its wait for BACKWARD_DONE ended at its
 * cap (3 hop timeouts after BACKWARD_RECEIVED), it suspected the live last
 * relay, and a second repair rebuilt stages 2..3 (swarm_backward_crash
 * under load: "recomputed at stages [2, 3], the gap was stage 3"). */
static uint64_t slow_repair_ready(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  (void)from, (void)to, (void)len;
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_REPAIR_READY) return h->tun.hop_timeout_ms * 5 / 2;
  return 1 + gw_rng_below(rng, 3);
}

/* Runs the crash of stage `stage` before the backward with REPAIR_READY
 * 2.5 hop timeouts slow; every microbatch needed one repair, which rebuilt
 * that stage alone, and none was lost. */
static void run_slow_rebuild(int stage, h_job_hook hook) {
  h_harness h;
  h_init(&h, STAGES, 3, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  sim_set_delay_fn(h.s, slow_repair_ready, &h);
  h.hook = hook;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  uint64_t repaired = C(&h, d)->backward_recoveries, recomputed[STAGES + 1] = {0}, others = 0;
  for (int i = 0; i < h.n_nodes; i++) recomputed[h.nodes[i].stage] += C(&h, i)->forward_recomputed;
  for (int s = 0; s <= STAGES; s++) others += s == stage ? 0 : recomputed[s];
  assert_true(repaired >= 1);
  assert_int_equal(C(&h, d)->repairs_started, repaired);
  assert_int_equal(recomputed[stage], repaired);
  assert_int_equal(others, 0);
  assert_int_equal(C(&h, d)->lost_microbatches + C(&h, d)->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

static void test_slow_rebuild_keeps_the_last_relay(void **state) {
  (void)state;
  run_slow_rebuild(2, crash_before_backward);
}

/* The last relay dies before the backward: the gap is the last stage and
 * the data node itself is the peer after it. It waits for REPAIR_READY (a
 * trip at most) once the repair is taken on. Before, its next tick found
 * the dead last relay again and began a new repair, every tick until the
 * slow REPAIR_READY came: four ticks used up the break's repairs and the
 * microbatch was lost (grid of 2026-11-26, homo-churn20 seed 122, two
 * microbatches). */
static bool crash_last_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  return crash_stage_before_backward(h, n, job, crash, STAGES);
}

static void test_slow_rebuild_of_the_last_stage(void **state) {
  (void)state;
  run_slow_rebuild(STAGES, crash_last_before_backward);
}

/* Four stages; the stage-2 relay of a microbatch dies as its loss is
 * computed, and the stage-3 relay reports it. The last relay's confirmation
 * to the data node (BACKWARD_DONE) comes late, in the middle of the repair,
 * whose probe answers are slow too. That confirmation says nothing about the
 * gap further up: the repair goes on, and each repaired microbatch needed
 * one repair. Before, it ended the repair silently, and the stage-3 relay
 * had to time out and report again. */
typedef struct late_confirm {
  int data;
} late_confirm;

static uint64_t late_confirmation(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  const late_confirm *c = h->hook_ud;
  (void)from, (void)len, (void)rng;
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_BACKWARD_DONE && to == c->data) return 700;
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_PROBE_REPLY) return 600; /* under the probe timeout */
  return 2;
}

static void test_late_confirmation_keeps_the_repair(void **state) {
  (void)state;
  h_harness h;
  late_confirm c = {-1};
  h_init(&h, 4, 8, verbose());
  c.data = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, c.data);
  for (int s = 1; s <= 4; s++)
    for (int k = 0; k < 2; k++) h_start(&h, h_add(&h, TRAIN_RELAY, s, M, 0, true));
  sim_set_delay_fn(h.s, late_confirmation, &h);
  h.hook = crash_before_backward;
  h.hook_ud = &c;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  const train_counters *dc = C(&h, c.data);
  assert_true(dc->backward_recoveries >= 1);
  assert_int_equal(dc->repairs_started, dc->backward_recoveries);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(dc->lost_microbatches + dc->deferred_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* The live relay of `stage` holding state under `key` (-1: none). */
static int holder(h_harness *h, int stage, uint64_t key) {
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *r = &h->nodes[i];
    if (!r->alive || r->stage != stage) continue;
    for (int k = 0; k < 64; k++)
      if (r->states[k].used && r->states[k].key == key) return i;
  }
  return -1;
}

/* Iteration 2: stages 1 and 2 of a microbatch's path die as its loss is
 * computed, so its data node re-sends its own embedding into the gap; then
 * the peer after the gap (stage 3) dies as the gap is recomputed, and the
 * repaired backward never comes. */
typedef struct gap_crash {
  int phase, target; /* target: the stage-3 relay after the gap */
  uint64_t key;
} gap_crash;

static bool crash_gap_then_target(h_harness *h, h_node *n, const train_job *job, int *crash) {
  gap_crash *g = h->hook_ud;
  if (train_peer_iteration(n->tp) != 2) return false;
  if (g->phase == 0 && job->kind == TRAIN_JOB_LOSS) {
    int s1 = holder(h, 1, job->key), s2 = holder(h, 2, job->key);
    g->target = holder(h, 3, job->key);
    if (s1 < 0 || s2 < 0 || g->target < 0) return false;
    g->key = job->key;
    /* crashed here, not through *crash: the harness runs a hook until it first fires */
    h_crash(h, s1);
    h_crash(h, s2);
    g->phase = 1;
    return false;
  }
  if (g->phase == 1 && job->kind == TRAIN_JOB_FORWARD && n->stage == 2 && job->key == g->key) {
    *crash = g->target;
    g->phase = 2;
    return true;
  }
  return false;
}

/* A data node that re-sent its own output into a repair has no last relay
 * to blame while it waits: when the repaired backward is lost too, its trip
 * deadline defers the microbatch (before, it waited for the stall timeout). */
static void test_lost_self_repair_meets_trip_deadline(void **state) {
  (void)state;
  h_harness h;
  gap_crash g = {0, -1, 0};
  int d = build(&h, 4, 3, M);
  h.hook = crash_gap_then_target;
  h.hook_ud = &g;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(g.phase, 2);
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  assert_true(C(&h, d)->deferred_microbatches >= 1);
  assert_true(h.nodes[d].secs_of[2] * 1000.0 < (double)h.tun.stall_timeout_ms);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Iteration 2, four stages, one repair allowed per break: a microbatch's
 * stage-3 relay dies as its loss is computed (the first break, mended from
 * its stage-2 relay); then, as the mended backward reaches stage 2, its
 * stage-1 relay dies too (a second break, at another peer). The second
 * break gets a repair of its own and the microbatch completes. Before,
 * the budget was per microbatch, and the second break lost it (the grid's
 * one lost microbatch at 20 % churn). */
typedef struct two_breaks {
  int victim_stage, trigger_stage; /* the second death: stage victim_stage's relay, as stage trigger_stage runs the backward */
  int phase, victim;
  uint64_t key;
} two_breaks;

static bool crash_two_breaks(h_harness *h, h_node *n, const train_job *job, int *crash) {
  two_breaks *t = h->hook_ud;
  if (train_peer_iteration(n->tp) != 2) return false;
  if (t->phase == 0 && job->kind == TRAIN_JOB_LOSS) {
    int s3 = holder(h, 3, job->key);
    t->victim = holder(h, t->victim_stage, job->key);
    if (s3 < 0 || t->victim < 0) return false;
    t->key = job->key;
    h_crash(h, s3); /* here, not through *crash: the harness stops calling a hook once it fires */
    t->phase = 1;
    return false;
  }
  if (t->phase == 1 && job->kind == TRAIN_JOB_BACKWARD && n->stage == t->trigger_stage && job->key == t->key) {
    *crash = t->victim;
    t->phase = 2;
    return true;
  }
  return false;
}

/* Four stages of three relays, the two deaths of t; the data node's index. */
static int run_two_breaks(h_harness *h, uint64_t seed, uint32_t max_repairs, two_breaks *t) {
  h_init(h, 4, seed, verbose());
  if (max_repairs) h->tun.max_repairs = max_repairs;
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= 4; s++)
    for (int k = 0; k < 3; k++) h_start(h, h_add(h, TRAIN_RELAY, s, M, 0, true));
  h->hook = crash_two_breaks;
  h->hook_ud = t;
  assert_true(h_run_until_finished(h, 120000));
  assert_int_equal(t->phase, 2);
  const train_counters *dc = C(h, d);
  if (verbose())
    fprintf(stderr, "repairs %llu, recovered %llu, lost %llu, deferred %llu\n", (unsigned long long)dc->repairs_started,
            (unsigned long long)dc->backward_recoveries, (unsigned long long)dc->lost_microbatches,
            (unsigned long long)dc->deferred_microbatches);
  assert_int_equal(dc->lost_microbatches + dc->deferred_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_agree(h, ITERS);
  return d;
}

static void test_second_break_gets_its_own_repair(void **state) {
  (void)state;
  h_harness h;
  two_breaks t = {.victim_stage = 1, .trigger_stage = 2};
  int d = run_two_breaks(&h, 11, 1, &t);
  assert_true(C(&h, d)->repairs_started >= 2);
  h_free(&h);
}

/* Iteration 2: stage 3 of a microbatch's path dies as its loss is
 * computed, and a repair rebuilds it on a replacement; then stage 2 dies as
 * that replacement computes the backward. The replacement reports RECOVER,
 * though the origin's path still names the dead stage-3 peer (REPAIR_READY
 * went to stage 4): the origin takes the report and repairs the second
 * break alone, stage 2. Before, the report was dropped; stage 4 later
 * gave up on the live replacement and a repair rebuilt stages 2 and 3 (in
 * the grid, with no such fallback, the trip deadline deferred the
 * microbatch). */
static void test_recover_from_a_replacement(void **state) {
  (void)state;
  h_harness h;
  two_breaks t = {.victim_stage = 2, .trigger_stage = 3};
  int d = run_two_breaks(&h, 13, 0, &t);
  assert_int_equal(C(&h, d)->repairs_started, 2);
  uint64_t recomputed = 0; /* stage 3 by the first repair, stage 2 by the second */
  for (int i = 0; i < h.n_nodes; i++) recomputed += C(&h, i)->forward_recomputed;
  assert_int_equal(recomputed, 2);
  h_free(&h);
}

static void test_swarm_mode_restarts_from_data_node(void **state) {
  (void)state;
  h_harness h;
  int d;
  run_backward_crash(TRAIN_RECOVER_RESTART, 3, &h, &d);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  uint64_t forwards1 = 0, recomputed = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    if (h.nodes[i].stage == 1) forwards1 += C(&h, i)->forward_computed;
    recomputed += C(&h, i)->forward_recomputed;
  }
  /* every restarted microbatch went through stage 1 again */
  uint64_t restarted = C(&h, d)->backward_recoveries;
  assert_true(restarted >= 1);
  assert_int_equal(forwards1, (uint64_t)M * ITERS + restarted);
  assert_int_equal(recomputed, 0);
  /* SWARM has no failure notice: the data node restarted only when the
   * backward did not come back within its trip deadline */
  assert_true(h.nodes[d].secs_of[2] * 1000.0 >= (double)trip_deadline_ms(&h));
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Iteration 2: a stage-2 relay passes a microbatch on, but its FORWARD_DONE
 * to the stage-1 relay before it is held up, and it dies as the loss is
 * computed. The stage-1 relay, still waiting, re-routes a spare copy, which
 * meets the first copy's path (or the data node) and is refused as a
 * duplicate. By the time the repaired microbatch is home, no relay after
 * stage 2 may still hold the spare: it is dropped, not carried on and kept
 * until the aggregation. */
typedef struct spare_check {
  int phase, sender, prev; /* the stage-2 relay and the stage-1 relay before it */
  uint64_t key;
  int spares_held;
} spare_check;

static uint64_t hold_forward_done(void *ud, int from, int to, size_t len, gw_rng *rng) {
  const spare_check *c = ud;
  (void)len;
  if (c->phase >= 1 && from == c->sender && to == c->prev) return 60000; /* past the end of the run */
  return 1 + gw_rng_below(rng, 3);
}

static bool lose_hop_after_passing_on(h_harness *h, h_node *n, const train_job *job, int *crash) {
  spare_check *c = h->hook_ud;
  (void)crash; /* crashed here: the harness stops calling a hook once it fires */
  if (train_peer_iteration(n->tp) != 2) return false;
  if (c->phase == 0 && job->kind == TRAIN_JOB_FORWARD && n->stage == 2) {
    c->prev = holder(h, 1, job->key);
    if (c->prev < 0) return false;
    c->sender = n->index;
    c->key = job->key;
    c->phase = 1;
  } else if (c->phase == 1 && job->kind == TRAIN_JOB_LOSS && job->key == c->key) {
    h_crash(h, c->sender);
    c->phase = 2;
  } else if (c->phase == 2 && job->kind == TRAIN_JOB_EMBED_BACKWARD && job->key == c->key) {
    for (int s = 3; s <= STAGES; s++) c->spares_held += holder(h, s, c->key) >= 0;
    c->phase = 3;
  }
  return false;
}

static void test_spare_copy_is_dropped(void **state) {
  (void)state;
  h_harness h;
  spare_check c = {0, -1, -1, 0, 0};
  int d = build(&h, 7, 2, M);
  sim_set_delay_fn(h.s, hold_forward_done, &c);
  h.hook = lose_hop_after_passing_on;
  h.hook_ud = &c;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(c.phase, 3); /* the microbatch came home */
  assert_int_equal(c.spares_held, 0);
  assert_true(C(&h, c.prev)->forward_rerouted >= 1); /* a spare was sent */
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches + C(&h, d)->lost_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Two data nodes; the leader (lowest ID) crashes in iteration 2. */
static bool crash_leader(h_harness *h, h_node *n, const train_job *job, int *crash) {
  if (job->kind != TRAIN_JOB_EMBED || !train_peer_is_leader(n->tp) || train_peer_iteration(n->tp) != 2)
    return false;
  (void)h;
  *crash = n->index;
  return true;
}

static void test_leader_crash_hands_over(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 4, verbose());
  int a = h_add(&h, TRAIN_DATA, 0, 2, ITERS, true);
  int b = h_add(&h, TRAIN_DATA, 0, 2, ITERS, true);
  h_start(&h, a);
  h_start(&h, b);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, 4, 0, false));
  h.hook = crash_leader;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  int survivor = h.nodes[a].alive ? a : b;
  assert_true(train_peer_is_leader(h.nodes[survivor].tp));
  assert_int_equal(train_peer_iteration(h.nodes[survivor].tp), ITERS);
  assert_true(h.nodes[survivor].iterations_done >= ITERS);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* A relay joins after two iterations: it goes to the smallest stage,
 * downloads the stage's weights (same hash) and carries microbatches. */
static void test_join_mid_run(void **state) {
  (void)state;
  h_harness h;
  /* the router's fixed spread depends on node IDs: with this seed it sends
   * the joiner work (since IDs are hashes of the peers' keys, seed 5's
   * stage-1 relays both sent everything to the other stage-2 member) */
  h_init(&h, STAGES, 8, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, 6, true);
  h_start(&h, d);
  /* stage 2 gets one relay, the others two */
  int fixed[5] = {1, 1, 2, 3, 3};
  for (int i = 0; i < 5; i++) h_start(&h, h_add(&h, TRAIN_RELAY, fixed[i], M, 0, true));
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 100);
  int j = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  h_start(&h, j);
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(h.nodes[j].stage, 2);
  assert_true(h.nodes[j].ready);
  assert_true(C(&h, j)->forward_computed > 0);
  assert_agree(&h, 6);
  /* its weights equal its stage peer's */
  for (int i = 0; i < h.n_nodes; i++)
    if (i != j && h.nodes[i].stage == 2) assert_memory_equal(h.nodes[i].w, h.nodes[j].w, sizeof(h.nodes[j].w));
  h_free(&h);
}

/* A joiner whose session to the leader comes up 500 ms after it started:
 * its first JOIN found no session. It sends the JOIN as the session comes
 * up (the transport's peer_up), and is placed within a few message delays
 * of it, not at its next retry (JOIN_RETRY_MS, 2 s after the first). */
static void test_join_when_leader_session_up(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 8, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, 6, true);
  h_start(&h, d);
  for (int i = 0; i < 2 * STAGES; i++) h_start(&h, h_add(&h, TRAIN_RELAY, 1 + i % STAGES, M, 0, true));
  while (train_peer_iteration(h.nodes[d].tp) < 1) h_run_for(&h, 100);
  int j = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  uint64_t t0 = sim_now(h.s), up = t0 + 500;
  h.nodes[j].sessions_until[d] = up;
  h_start(&h, j);
  h_run_for(&h, up - sim_now(h.s));
  assert_int_equal(h.nodes[j].stage, -1); /* its JOIN had no session */
  train_peer_on_peer_up(h.nodes[j].tp, &h.nodes[d].peer.id, sim_now(h.s));
  h_run_for(&h, 200);
  assert_true(h.nodes[j].stage >= 1);
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.nodes[j].ready);
  assert_agree(&h, 6);
  h_free(&h);
}

/* A joiner that one member's directory does not list yet (directories lag
 * behind joins): that member learns of it from its HELLO, so every member
 * picks the same aggregator and the stage's weights stay one. Without it,
 * the joiner (lowest ID) aggregates for the others while the member that
 * does not know it waits to aggregate for itself. */
static int lowest_of_stage(const h_harness *h, int stage, int except) {
  int best = -1;
  for (int i = 0; i < h->n_nodes; i++)
    if (i != except && h->nodes[i].stage == stage &&
        (best < 0 || gw_id_cmp(&h->nodes[i].peer.id, &h->nodes[best].peer.id) < 0))
      best = i;
  return best;
}

static void test_joiner_known_by_hello(void **state) {
  (void)state;
  h_harness h;
  int d, j;
  /* The split needs the joiner to be the one its view makes aggregator:
   * the lowest ID of its stage. Seeds are tried until it is. */
  for (uint64_t seed = 9;; seed++) {
    h_init(&h, STAGES, seed, verbose());
    d = h_add(&h, TRAIN_DATA, 0, M, 6, true);
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < 2; k++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
    j = h_add(&h, TRAIN_RELAY, 2, M, 0, false);
    if (lowest_of_stage(&h, 2, -1) == j) break;
    h_free(&h);
  }
  for (int i = 0; i < j; i++) h_start(&h, i);
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 100);
  h.nodes[j].hidden_from[lowest_of_stage(&h, 2, j)] = true;
  h_start(&h, j);
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.nodes[j].ready);
  assert_true(h.nodes[j].have_hash[5]); /* it aggregated the last iteration with its stage */
  assert_agree(&h, 6);
  for (int i = 0; i < h.n_nodes; i++)
    if (i != j && h.nodes[i].stage == 2) assert_memory_equal(h.nodes[i].w, h.nodes[j].w, sizeof(h.nodes[j].w));
  h_free(&h);
}

/* The aggregator of stage 2 (its lowest ID) crashes as it starts exporting
 * its gradient in iteration 1: the others pick the next lowest and agree. */
static bool crash_aggregator(h_harness *h, h_node *n, const train_job *job, int *crash) {
  if (job->kind != TRAIN_JOB_GRAD_EXPORT || n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *o = &h->nodes[i];
    if (o != n && o->alive && o->stage == 2 && gw_id_cmp(&o->peer.id, &n->peer.id) < 0) return false;
  }
  *crash = n->index;
  return true;
}

static void test_aggregator_crash(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 6, 2, M);
  h.hook = crash_aggregator;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Stage 2's aggregator sends its average, then dies while the copy to the
 * member that takes its place is still on a slow link (its bytes die with
 * it, as a killed process's queued sends do): the third member applied the
 * average and left the round. The new aggregator must find that average
 * rather than step alone and split the stage. */
typedef struct slow_link {
  int from, to; /* -1: none */
  bool armed;   /* the slow message was scheduled */
  bool crashed; /* the hook crashed the aggregator */
} slow_link;

static uint64_t slow_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  const slow_link *l = ud;
  (void)len;
  if (from == l->from && to == l->to) return 60000; /* past the end of the run */
  return 1 + gw_rng_below(rng, 3);
}

/* The live stage-2 relays in node-ID order. */
static int stage2_by_id(h_harness *h, int *out, int max) { return h_by_id(h, 2, out, max); }

static bool crash_aggregator_after_sending(h_harness *h, h_node *n, const train_job *job, int *crash) {
  slow_link *l = h->hook_ud;
  if (n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  int order[8];
  if (stage2_by_id(h, order, 8) < 3 || order[0] != n->index) return false;
  if (job->kind == TRAIN_JOB_GRAD_EXPORT) {
    l->from = n->index;
    l->to = order[1]; /* the next aggregator */
    l->armed = true;
    return false;
  }
  if (job->kind != TRAIN_JOB_APPLY || l->from != n->index) return false;
  *crash = n->index;
  l->crashed = true;
  return true;
}

/* Three relays of capacity 2 per stage (the stage's microbatches are
 * spread, so a lone average differs from the stage's), one link slowed by
 * `delay` as `hook` says: the run finishes and every stage agrees. */
static void run_with_slow_link(sim_delay_fn delay, h_job_hook hook, slow_link *l) {
  h_harness h;
  int d = build(&h, 5, 3, 2);
  sim_set_delay_fn(h.s, delay, l);
  h.hook = hook;
  h.hook_ud = l;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(l->armed);
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  assert_agree(&h, ITERS);
  h_free(&h);
}

static void test_aggregator_crash_after_sending_average(void **state) {
  (void)state;
  slow_link l = {-1, -1, false, false};
  run_with_slow_link(slow_delay, crash_aggregator_after_sending, &l);
  assert_true(l.crashed);
}

/* Stage 2's average to one member is held up on a slow link (everything
 * after it queues behind it), while the next iteration's BEGIN_AGG reaches
 * that member by other peers: it resyncs in the middle of the round. The
 * round it left must not go on over the weights it downloads. */
static uint64_t late_average_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  slow_link *l = ud;
  (void)len;
  if (from == l->from && to == l->to) {
    l->from = l->to = -1; /* one message, then the link is normal again (behind it) */
    return 5000;
  }
  return 1 + gw_rng_below(rng, 3);
}

static bool slow_average_to_member(h_harness *h, h_node *n, const train_job *job, int *crash) {
  slow_link *l = h->hook_ud;
  int order[8];
  (void)crash;
  if (job->kind != TRAIN_JOB_GRAD_EXPORT || n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  if (l->armed || stage2_by_id(h, order, 8) < 3 || order[0] != n->index) return false;
  l->from = n->index; /* its next message to the member: the average */
  l->to = order[1];
  l->armed = true;
  return false; /* true would crash a node */
}

static void test_resync_abandons_the_round(void **state) {
  (void)state;
  slow_link l = {-1, -1, false, false};
  run_with_slow_link(late_average_delay, slow_average_to_member, &l);
  assert_true(l.to < 0); /* the slow message went out */
}

/* A relay that gets ready just as its stage begins a round: the members
 * flooded BEGIN_AGG before they knew it, then, as its lowest ID, pick it to
 * aggregate. Their gradients are the first it hears of the round. It must
 * keep them all (it threw the first away as it joined the round, and waited
 * the whole timeout for that member). The weights it downloads are held back
 * to arrive 1 ms before the members' export jobs began in a first run with
 * the same seed and constant link delays: after their BEGIN_AGG went out,
 * before their gradients do. */
typedef struct early_grad {
  uint64_t export_at;  /* stage 2's first GRAD_EXPORT of iteration 3 ran */
  uint64_t applied_at; /* the last stage-2 member applied the average */
  uint64_t weights_at; /* the joiner's weights arrive (0: no joiner) */
} early_grad;

static uint64_t hold_weights(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  const early_grad *e = h->hook_ud;
  (void)from, (void)to, (void)len, (void)rng;
  uint64_t now = sim_now(h->s);
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK && e->weights_at > now + 2) return e->weights_at - now;
  return 2;
}

static bool time_round(h_harness *h, h_node *n, const train_job *job, int *crash) {
  early_grad *e = h->hook_ud;
  (void)crash;
  if (n->stage != 2 || train_peer_iteration(n->tp) != 3) return false;
  if (job->kind == TRAIN_JOB_GRAD_EXPORT && !e->export_at) e->export_at = sim_now(h->s);
  if (job->kind == TRAIN_JOB_APPLY) e->applied_at = sim_now(h->s);
  return false;
}

/* One data node, two relays per stage, and a joiner for stage 2 with the
 * stage's lowest ID (seeds are tried until it has), started in iteration 2:
 * it gets the weights of iteration 3. */
static void run_early_grad(h_harness *h, early_grad *e, int *joiner) {
  int d;
  for (uint64_t seed = 13;; seed++) {
    h_init(h, STAGES, seed, verbose());
    d = h_add(h, TRAIN_DATA, 0, M, 6, true);
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < 2; k++) h_add(h, TRAIN_RELAY, s, M, 0, true);
    *joiner = h_add(h, TRAIN_RELAY, 2, M, 0, false);
    if (lowest_of_stage(h, 2, -1) == *joiner) break;
    h_free(h);
  }
  sim_set_delay_fn(h->s, hold_weights, h);
  h->hook = time_round;
  h->hook_ud = e;
  for (int i = 0; i < *joiner; i++) h_start(h, i);
  while (train_peer_iteration(h->nodes[d].tp) < 2) h_run_for(h, 1);
  if (e->weights_at) h_start(h, *joiner);
  assert_true(h_run_until_finished(h, 120000));
}

static void test_gradient_before_begin_agg_is_kept(void **state) {
  (void)state;
  h_harness h;
  early_grad e = {0, 0, 0};
  int j;
  run_early_grad(&h, &e, &j); /* the joiner stays off: when do the members export? */
  h_free(&h);
  assert_true(e.export_at > 0);
  /* the export job runs after BEGIN_AGG went out and ends as the gradient goes */
  e.weights_at = e.export_at - 1;
  e.export_at = e.applied_at = 0;
  run_early_grad(&h, &e, &j);
  assert_true(h.nodes[j].ready);
  assert_true(e.applied_at > e.export_at);
  assert_true(e.applied_at - e.export_at < h.tun.agg_timeout_ms);
  assert_agree(&h, 6);
  h_free(&h);
}

/* Relays crash at random moments and fresh ones join, keeping at least one
 * live peer per stage (the paper's assumption): every iteration completes,
 * every stage agrees on its weights after every aggregation. */
static void churn_soak(uint64_t seed, double p_crash, bool quiet) {
  enum { SOAK_ITERS = 20 };
  h_harness h;
  h_init(&h, STAGES, seed, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, SOAK_ITERS, true);
  h_start(&h, d);
  for (int i = 0; i < STAGES * 2; i++) h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  gw_rng rng;
  gw_rng_seed(&rng, seed * 7919);
  int crashes = 0;
  while (!train_peer_finished(h.nodes[d].tp) && sim_now(h.s) < 600000) {
    h_run_for(&h, 20);
    /* once the harness has no room for more joiners, the churn stops */
    if (h.n_nodes >= H_MAX_NODES - 1 || gw_rng_uniform(&rng) > p_crash) continue;
    int victim = 1 + (int)gw_rng_below(&rng, (uint64_t)(h.n_nodes - 1));
    h_node *v = &h.nodes[victim];
    /* the paper's assumption: the stage keeps a live member whose weights
     * are as new as the victim's */
    int others = 0;
    for (int i = 0; i < h.n_nodes; i++) {
      h_node *o = &h.nodes[i];
      others += o != v && o->alive && o->ready && o->stage == v->stage &&
                train_peer_iteration(o->tp) >= train_peer_iteration(v->tp);
    }
    if (!v->alive || !v->ready || v->role != TRAIN_RELAY || others < 1) continue;
    h_crash(&h, victim);
    crashes++;
    h_start(&h, h_add(&h, TRAIN_RELAY, -1, M, 0, false));
  }
  const train_counters *c = C(&h, d);
  if (!quiet)
    print_message("churn soak (seed %llu): %d crashes, %llu done, %llu deferred, %llu lost, %llu repaired, "
                  "%.1f s virtual\n",
                  (unsigned long long)seed, crashes, (unsigned long long)c->microbatches_done,
                  (unsigned long long)c->deferred_microbatches, (unsigned long long)c->lost_microbatches,
                  (unsigned long long)c->backward_recoveries, sim_now(h.s) / 1000.0);
  if (!train_peer_finished(h.nodes[d].tp)) fail_msg("seed %llu: the run did not finish", (unsigned long long)seed);
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), SOAK_ITERS);
  assert_true(c->microbatches_done > (uint64_t)M * SOAK_ITERS / 2);
  char why[200] = "";
  if (!h_hashes_agree(&h, SOAK_ITERS, why, sizeof(why))) fail_msg("seed %llu: %s", (unsigned long long)seed, why);
  h_free(&h);
  if (crashes < 3 && !quiet) fail_msg("seed %llu: only %d crashes", (unsigned long long)seed, crashes);
}

static void test_churn_soak(void **state) {
  (void)state;
  churn_soak(7, 0.08, false);
  /* GWTF_SOAK_SEEDS=N explores N more seeds at a harsher crash rate. */
  const char *extra = getenv("GWTF_SOAK_SEEDS"), *first = getenv("GWTF_SOAK_FIRST");
  uint64_t base = first ? strtoull(first, NULL, 10) : 1000;
  for (long k = 0; extra && k < atol(extra); k++) churn_soak(base + (uint64_t)k, 0.3, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_free_matches_reference),
      cmocka_unit_test(test_eval_leaves_training_unchanged),
      cmocka_unit_test(test_eval_survives_a_relay_crash),
      cmocka_unit_test(test_eval_partial_when_a_stage_is_lost),
      cmocka_unit_test(test_eval_dropped_by_a_round_reports),
      cmocka_unit_test(test_no_flow_routes_by_fallback),
      cmocka_unit_test(test_no_hop_yet_waits),
      cmocka_unit_test(test_relay_no_hop_yet_waits),
      cmocka_unit_test(test_repair_into_unlisted_stage_waits),
      cmocka_unit_test(test_starts_up_to_its_share),
      cmocka_unit_test(test_widens_when_a_stage_grows),
      cmocka_unit_test(test_full_next_stage_waits_for_a_slot),
      cmocka_unit_test(test_slow_data_node_wraps_up),
      cmocka_unit_test(test_forward_crash_reroutes),
      cmocka_unit_test(test_backward_crash_repairs_along_path),
      cmocka_unit_test(test_late_confirmation_keeps_the_repair),
      cmocka_unit_test(test_swarm_mode_restarts_from_data_node),
      cmocka_unit_test(test_repair_needs_no_probe),
      cmocka_unit_test(test_full_stage_takes_the_repair),
      cmocka_unit_test(test_slow_rebuild_keeps_the_last_relay),
      cmocka_unit_test(test_slow_rebuild_of_the_last_stage),
      cmocka_unit_test(test_lost_self_repair_meets_trip_deadline),
      cmocka_unit_test(test_second_break_gets_its_own_repair),
      cmocka_unit_test(test_recover_from_a_replacement),
      cmocka_unit_test(test_spare_copy_is_dropped),
      cmocka_unit_test(test_leader_crash_hands_over),
      cmocka_unit_test(test_join_mid_run),
      cmocka_unit_test(test_join_when_leader_session_up),
      cmocka_unit_test(test_joiner_known_by_hello),
      cmocka_unit_test(test_gradient_before_begin_agg_is_kept),
      cmocka_unit_test(test_aggregator_crash),
      cmocka_unit_test(test_aggregator_crash_after_sending_average),
      cmocka_unit_test(test_resync_abandons_the_round),
      cmocka_unit_test(test_churn_soak),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
