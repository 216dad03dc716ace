/* The training protocol in one process, on the deterministic simulator:
 * routing, widening and shares. Fault-free training equals a direct
 * computation; evaluations leave training unchanged, survive a relay's
 * crash, and report what came back when a stage is lost or a round drops
 * them; a data node without flows routes by fallback; a microbatch with no
 * hop yet waits for one (at the data node and at a relay); a data node
 * starts up to its share of the narrowest stage, widens when a stage grows,
 * waits for a slot in a full next stage and wraps up when it is behind; a
 * forward crash is re-routed; the next iteration starts once stage 1 has
 * stepped, its microbatches waiting at a stage still in its round. Crashes and repairs of the backward are in
 * test_peer_repair.c; leader failover, joins and aggregation in
 * test_peer_membership.c; the helpers all three share in peer_sim_common.c. */
#include "testutil.h"

#include <math.h>

#include "peer_harness.h"
#include "peer_sim_common.h"
#include "train.pb-c.h"

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

/* The iteration's boundary (peer_agg.c, CAN_TAKE): every link 30 ms one
 * way, and the last stage's round slow (its GRAD and AVG 150 ms). The data
 * node starts the next iteration once stage 1 has stepped; its microbatches
 * reach the last stage before that stage has stepped, wait there for its
 * step (FWD_QUEUED) and run on the stepped weights: losses and weights equal
 * the reference's, and the run ends sooner than when the data node waited
 * for every stage to step and for CAN_TAKE to come back through each
 * (can_take_waits_downstream), by more than the stage-by-stage way back. */
typedef struct boundary_watch {
  uint32_t early; /* FORWARDs sent to a relay of the last stage that had not stepped for them yet */
} boundary_watch;

static uint64_t slow_last_round(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  (void)to, (void)len, (void)rng;
  bool round = h->sending == GWTF__TRAIN_MSG__TRAIN_GRAD || h->sending == GWTF__TRAIN_MSG__TRAIN_AVG;
  return round && h->nodes[from].stage == h->n_stages ? 150 : 30;
}

static void watch_forwards(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                           const train_tensor *t) {
  boundary_watch *w = h->hook_ud;
  (void)from, (void)t;
  if (type != GWTF__TRAIN_MSG__TRAIN_FORWARD || h->nodes[to].stage != h->n_stages) return;
  Gwtf__TrainMicrobatch *m = gwtf__train_microbatch__unpack(NULL, len, body);
  if (!m) return;
  w->early += m->iteration > train_peer_iteration(h->nodes[to].tp);
  gwtf__train_microbatch__free_unpacked(m, NULL);
}

static bool relays_stepped(void *ud) {
  h_harness *h = ud;
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].role == TRAIN_RELAY && train_peer_iteration(h->nodes[i].tp) < ITERS) return false;
  return true;
}

static uint64_t run_with_slow_last_round(bool wait_downstream, uint32_t *early) {
  h_harness h;
  boundary_watch w = {0};
  h_init(&h, STAGES, 5, verbose());
  h.tun.can_take_waits_downstream = wait_downstream;
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < 2; k++) h_start(&h, h_add(&h, TRAIN_RELAY, s, M, 0, true));
  sim_set_delay_fn(h.s, slow_last_round, &h);
  h.hook_ud = &w;
  h.send_hook = watch_forwards;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches + C(&h, d)->lost_microbatches, 0);
  ref_model rm;
  assert_losses_match_reference(&h, d, &rm);
  /* The run ends when every stage's aggregator has stepped; its stage-mates
   * step as its average reaches them. */
  uint64_t end = sim_now(h.s);
  assert_true(sim_run_while_not(h.s, relays_stepped, &h, end + 10000));
  for (int i = 0; i < h.n_nodes; i++)
    for (int k = 0; k < H_NP; k++) assert_float_equal(h.nodes[i].w[k], rm.w[h.nodes[i].stage][k], 1e-6);
  assert_agree(&h, ITERS);
  *early = w.early;
  h_free(&h);
  return end;
}

static void test_next_iteration_starts_when_stage_one_stepped(void **state) {
  (void)state;
  uint32_t early_waiting, early;
  uint64_t waiting = run_with_slow_last_round(true, &early_waiting);
  uint64_t pipelined = run_with_slow_last_round(false, &early);
  assert_int_equal(early_waiting, 0); /* every stage had stepped before the iteration began */
  assert_true(early > 0);             /* the last stage's round was still on when they came */
  /* per boundary, CAN_TAKE came back through the two stages after stage 1 */
  uint64_t way_back = (uint64_t)(ITERS - 1) * 2 * 30;
  if (pipelined + way_back > waiting)
    fail_msg("the run ended at %llu ms, waiting for every stage at %llu ms", (unsigned long long)pipelined,
             (unsigned long long)waiting);
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
      cmocka_unit_test(test_starts_up_to_its_share),
      cmocka_unit_test(test_widens_when_a_stage_grows),
      cmocka_unit_test(test_full_next_stage_waits_for_a_slot),
      cmocka_unit_test(test_slow_data_node_wraps_up),
      cmocka_unit_test(test_forward_crash_reroutes),
      cmocka_unit_test(test_next_iteration_starts_when_stage_one_stepped),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
