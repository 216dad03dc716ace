/* The training protocol in one process, on the deterministic simulator:
 * membership and aggregation. A leader crash hands over; a joiner is placed,
 * downloads and trains, fills the stage short of slots after a loss, joins as soon as its session to the leader is up,
 * and is known to a member that does not list it by its HELLO; an
 * aggregator that first hears of a round from a gradient keeps it; an
 * aggregator crash, also after it sent its average to some members, leaves
 * every stage in agreement; a member that resyncs mid-round abandons the
 * round. Routing is in test_peer_sim.c, backward repairs in
 * test_peer_repair.c. */
#include "testutil.h"

#include "util/rng.h"

#include "peer_harness.h"
#include "peer_sim_common.h"
#include "train.pb-c.h"

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

/* Two data nodes (4 microbatches each, one complete flow each) and two
 * relays per stage, each announcing two flows through it. A stage-2 relay
 * dies in iteration 1, and its flows with it (its stage-mate announces one).
 * A joiner then goes to stage 2: by the flows alone stage 2 looked the
 * least used (1 flow over 4 slots, against 4 over 8), but every stage must
 * hold the 8 microbatches the data nodes start, and stage 2 has 4 slots
 * left. Placed by the flows (place_by_flows, as before) it went to stage 1. */
static int joiner_stage_after_a_loss(bool by_flows) {
  h_harness h;
  h_init(&h, STAGES, 8, verbose());
  h.tun.place_by_flows = by_flows;
  int d[2], r[2 * STAGES];
  for (int k = 0; k < 2; k++) {
    d[k] = h_add(&h, TRAIN_DATA, 0, M, 4, true);
    h.nodes[d[k]].routes = 1;
  }
  for (int i = 0; i < 2 * STAGES; i++) {
    r[i] = h_add(&h, TRAIN_RELAY, 1 + i / 2, M, 0, true);
    h.nodes[r[i]].dir_load = 2;
  }
  for (int k = 0; k < 2; k++) h_start(&h, d[k]);
  for (int i = 0; i < 2 * STAGES; i++) h_start(&h, r[i]);
  while (train_peer_iteration(h.nodes[d[0]].tp) < 1) h_run_for(&h, 10);
  h_crash(&h, r[2]);
  h.nodes[r[3]].dir_load = 1;
  h_refresh(&h);
  int j = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  h_start(&h, j);
  while (h.nodes[j].stage < 1 && sim_now(h.s) < 60000) h_run_for(&h, 10);
  int stage = h.nodes[j].stage;
  assert_true(h_run_until_finished(&h, 120000));
  assert_agree(&h, 4);
  h_free(&h);
  return stage;
}

static void test_joiner_fills_the_stage_short_of_slots(void **state) {
  (void)state;
  assert_int_equal(joiner_stage_after_a_loss(false), 2);
  assert_int_equal(joiner_stage_after_a_loss(true), 1);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_leader_crash_hands_over),
      cmocka_unit_test(test_join_mid_run),
      cmocka_unit_test(test_joiner_fills_the_stage_short_of_slots),
      cmocka_unit_test(test_join_when_leader_session_up),
      cmocka_unit_test(test_joiner_known_by_hello),
      cmocka_unit_test(test_gradient_before_begin_agg_is_kept),
      cmocka_unit_test(test_aggregator_crash),
      cmocka_unit_test(test_aggregator_crash_after_sending_average),
      cmocka_unit_test(test_resync_abandons_the_round),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
