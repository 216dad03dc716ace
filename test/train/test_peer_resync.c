/* When a stage member fetches its stage's state again, on the deterministic
 * simulator (test_node_private's restarted relay, on a loaded ASan run):
 *   - a member still in a round when its stage-mate begins the next one
 *     (its average is on the way) applies that average: no refetch. Before,
 *     one claim of the next iteration by the only other member made it
 *     resync;
 *   - a member that resynced from the only other member, which then died
 *     and came back without its state, serves that newcomer its own state
 *     (the stage's freshest) instead of each waiting on the other. Before,
 *     both waited out the download timeout again and again until the
 *     resyncing member gave the stage up as lost (or a replica, older than
 *     its own state, was found). The request it had sent the newcomer
 *     meanwhile is not served back to it;
 *   - two joiners that got ready behind their stage fetch from the members
 *     ahead of them (not from each other), and a catching-up joiner that
 *     its stage-mates picked to aggregate keeps their gradients for the
 *     round it has not reached yet;
 *   - a member told to resync by its aggregator fetches from it. */
#include "testutil.h"

#include "peer_harness.h"
#include "train.pb-c.h"

#define M 2
#define ITERS 8
#define AVG_LATE_MS 400 /* well within the aggregation timeout (2 s) */

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

/* One data node and two relays in the single stage; returns the data node,
 * the aggregator (the lower ID) in *a and the other member in *m. */
static int build(h_harness *h, int *a, int *m) {
  h_init(h, 1, 7, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_add(h, TRAIN_RELAY, 1, M, 0, true);
  h_add(h, TRAIN_RELAY, 1, M, 0, true);
  int s1[2];
  assert_int_equal(h_by_id(h, 1, s1, 2), 2);
  *a = s1[0];
  *m = s1[1];
  return d;
}

static void assert_agree(h_harness *h, uint64_t iters) {
  char why[200] = "";
  if (!h_hashes_agree(h, iters, why, sizeof(why))) fail_msg("%s", why);
}

/* ---- the average on its way ---- */

typedef struct late_avg {
  h_harness *h;
  int a, m;
  uint64_t iteration; /* the round whose average from a reaches m late */
} late_avg;

static uint64_t late_avg_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)len;
  const late_avg *l = ud;
  h_harness *h = l->h;
  if (from == h->nodes[l->a].index && to == h->nodes[l->m].index && h->sending == GWTF__TRAIN_MSG__TRAIN_AVG &&
      train_peer_iteration(h->nodes[l->m].tp) == l->iteration)
    return AVG_LATE_MS;
  return 1 + gw_rng_below(rng, 3);
}

/* m carries no microbatch (the data node's flows leave it out, as
 * test_node_private's did under load), so the next iteration needs
 * nothing from it: a begins that round, and says so to m, while a's
 * average of the last one is still on its way to m. */
static void test_next_round_begun_while_average_on_its_way(void **state) {
  (void)state;
  h_harness h;
  int a, m, d = build(&h, &a, &m);
  h.nodes[m].unrouted = true;
  late_avg l = {&h, a, m, 3};
  sim_set_delay_fn(h.s, late_avg_delay, &l);
  for (int i = 0; i <= m; i++) h_start(&h, i);
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  const train_counters *cm = train_peer_counters(h.nodes[m].tp);
  if (verbose())
    fprintf(stderr, "m: %llu resyncs\n", (unsigned long long)cm->resyncs);
  assert_int_equal(cm->resyncs, 0);
  assert_true(h.nodes[m].have_hash[l.iteration]); /* it stepped with the round after the late one */
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* ---- two members each waiting for the other's state ---- */

/* A HELLO from `from` claiming `iteration`: what a member ahead says. */
static void hello_at(h_harness *h, int from, int to, uint64_t iteration) {
  uint8_t buf[128];
  Gwtf__TrainHello hello = GWTF__TRAIN_HELLO__INIT;
  hello.role = GWTF__TRAIN_ROLE__TRAIN_ROLE_RELAY;
  hello.stage = 1;
  hello.capacity = M;
  hello.iteration = iteration;
  size_t len = gwtf__train_hello__pack(&hello, buf);
  assert_int_equal(h_inject(h, from, to, GWTF__TRAIN_MSG__TRAIN_HELLO, buf, len, NULL), 0);
}

/* a says it is a round ahead of m (heard between rounds: m resyncs from
 * it) and dies before it serves m; it comes back at once without its state,
 * under its ID, which the directory still lists. */
typedef struct chunk_count {
  int from, to;
  uint32_t n;
} chunk_count;

static void count_chunks(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                         const train_tensor *t) {
  (void)body, (void)len, (void)t;
  chunk_count *c = h->hook_ud;
  c->n += from == c->from && to == c->to && type == GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK;
}

static void test_resyncing_member_serves_restarted_mate(void **state) {
  (void)state;
  h_harness h;
  int a, m, d = build(&h, &a, &m);
  int j = h_add(&h, TRAIN_RELAY, 1, M, 0, false); /* a, back */
  chunk_count back = {j, m, 0};
  h.hook_ud = &back;
  h.send_hook = count_chunks;
  for (int i = 0; i < j; i++) h_start(&h, i);
  while (train_peer_iteration(h.nodes[d].tp) < 3) h_run_for(&h, 10);
  uint64_t had = 0;
  while (train_peer_counters(h.nodes[m].tp)->resyncs == 0) {
    had = train_peer_step(h.nodes[m].tp);
    hello_at(&h, a, m, train_peer_iteration(h.nodes[m].tp) + 1);
    h_run_for(&h, 1);
    assert_true(train_peer_iteration(h.nodes[d].tp) < ITERS);
  }
  h_crash(&h, a);
  uint64_t back_at = sim_now(h.s), iter_then = train_peer_iteration(h.nodes[d].tp);
  h.nodes[j].listed_early = true;
  h_start(&h, j);
  while (train_peer_iteration(h.nodes[d].tp) <= iter_then + 1 && !h.nodes[m].stage_lost) {
    h_run_for(&h, 10);
    assert_true(sim_now(h.s) < back_at + 120000);
  }
  double moved_on_ms = (double)(sim_now(h.s) - back_at);
  const train_counters *cm = train_peer_counters(h.nodes[m].tp);
  if (verbose())
    fprintf(stderr, "the data node finished an iteration %.0f ms after a came back; m kept its state %llu times\n",
            moved_on_ms, (unsigned long long)cm->states_kept);
  assert_false(h.nodes[m].stage_lost);
  assert_int_equal(cm->states_kept, 1);
  assert_true(moved_on_ms < (double)h.tun.agg_timeout_ms);
  assert_true(h.nodes[j].ready);
  assert_true(train_peer_step(h.nodes[m].tp) >= had); /* its own state: no step lost */
  assert_int_equal(back.n, 0); /* m's request, queued at j while both fetched, was not served back to it */
  assert_true(h_run_until_finished(&h, sim_now(h.s) + 120000));
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  assert_true(train_peer_step(h.nodes[j].tp) == train_peer_step(h.nodes[m].tp));
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* ---- two joiners that got ready on an old state ---- */

/* swarm_rebalance_skewed on a loaded machine: two relays placed into a
 * stage fetched its state from a member for 4 s while the stage stepped,
 * and got ready behind it. Here: joiners x and y, listed first, fetch from
 * z at `chunk_ms` a chunk while z and w step. Each (seed, chunk_ms) is a
 * scene of its own, replayed exactly by the simulator. */
#define JOIN_ITERS 12
#define JOIN_JOB_MS 50
#define JOIN_SLOW_UNTIL_MS 3000

typedef struct slow_join {
  h_harness *h;
  int z;
  uint64_t chunk_ms;
} slow_join;

static uint64_t slow_join_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)len, (void)to;
  const slow_join *sj = ud;
  h_harness *h = sj->h;
  if (from == h->nodes[sj->z].index && h->sending == GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK &&
      sim_now(h->s) < JOIN_SLOW_UNTIL_MS)
    return sj->chunk_ms;
  return 1 + gw_rng_below(rng, 3);
}

typedef struct joiners {
  h_harness h;
  slow_join sj;
  int d, x, y, z, w;
} joiners;

/* Runs the scene to the end: every iteration done, stage 1's hashes agree,
 * and every member stepped once per iteration (none of them a round that
 * averaged nothing while its microbatches' gradients were dropped). */
static void joiners_run(joiners *j, uint64_t seed, uint64_t chunk_ms) {
  h_harness *h = &j->h;
  h_init(h, 1, seed, verbose());
  j->d = h_add(h, TRAIN_DATA, 0, M, JOIN_ITERS, true);
  j->x = h_add(h, TRAIN_RELAY, 1, M, 0, false);
  j->y = h_add(h, TRAIN_RELAY, 1, M, 0, false);
  j->z = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  j->w = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  for (int i = 0; i <= j->w; i++) h->nodes[i].job_ms = JOIN_JOB_MS;
  j->sj = (slow_join){h, j->z, chunk_ms};
  sim_set_delay_fn(h->s, slow_join_delay, &j->sj);
  h_start(h, j->d);
  h_start(h, j->z);
  h_start(h, j->w);
  h_run_for(h, JOIN_JOB_MS);
  h_start(h, j->x);
  h_start(h, j->y);
  assert_true(h_run_until_finished(h, 120000));
  if (verbose())
    fprintf(stderr, "seed %llu, chunk %llu ms: done at %.1f s; steps x %llu y %llu z %llu w %llu\n",
            (unsigned long long)seed, (unsigned long long)chunk_ms, (double)sim_now(h->s) / 1000.0,
            (unsigned long long)train_peer_step(h->nodes[j->x].tp), (unsigned long long)train_peer_step(h->nodes[j->y].tp),
            (unsigned long long)train_peer_step(h->nodes[j->z].tp), (unsigned long long)train_peer_step(h->nodes[j->w].tp));
  assert_int_equal(train_peer_iteration(h->nodes[j->d].tp), JOIN_ITERS);
  assert_agree(h, JOIN_ITERS);
  for (int i = j->x; i <= j->w; i++) assert_int_equal(train_peer_step(h->nodes[i].tp), JOIN_ITERS);
}

/* Both got ready behind the stage, and the members' BEGIN_AGG of the next
 * round made them resync at once: each asked the first member listed, the
 * other, and one went on with its old state (weights.kept_own
 * reason=mutual_wait; chunk 600 and 1000) or served it to the other (200),
 * and the stage's hashes split. A resync asks the members that said they
 * are ahead first. */
static void test_joiners_behind_fetch_from_members_ahead(void **state) {
  (void)state;
  const uint64_t chunk_ms[] = {200, 600, 1000};
  for (size_t i = 0; i < sizeof(chunk_ms) / sizeof(chunk_ms[0]); i++) {
    joiners j;
    joiners_run(&j, 4, chunk_ms[i]);
    const train_counters *cx = train_peer_counters(j.h.nodes[j.x].tp), *cy = train_peer_counters(j.h.nodes[j.y].tp);
    assert_true(cx->resyncs >= 1 && cy->resyncs >= 1); /* the scene: both resynced */
    assert_int_equal(cx->states_kept + cy->states_kept, 0); /* neither went on with its old state */
    h_free(&j.h);
  }
}

/* A joiner with the lowest ID catches up (steps through the averages it
 * missed) while listed: z and w pick it to aggregate the round the stage
 * is in and send it their gradients rounds before it gets there. It
 * dropped them, then averaged only its own (0 microbatches): the stage
 * skipped that iteration's step, and ended a step short. */
static void test_catching_up_aggregator_keeps_early_gradients(void **state) {
  (void)state;
  const uint64_t chunk_ms[] = {850, 1300};
  for (size_t i = 0; i < sizeof(chunk_ms) / sizeof(chunk_ms[0]); i++) {
    joiners j;
    joiners_run(&j, 2, chunk_ms[i]);
    int first = gw_id_cmp(&j.h.nodes[j.x].peer.id, &j.h.nodes[j.y].peer.id) < 0 ? j.x : j.y;
    int s1[4];
    assert_int_equal(h_by_id(&j.h, 1, s1, 4), 4);
    assert_int_equal(s1[0], first); /* the scene: a joiner aggregates */
    assert_true(train_peer_counters(j.h.nodes[first].tp)->downloads_caught_up >= 1); /* ... and caught up */
    h_free(&j.h);
  }
}

/* ---- told to resync by the aggregator ---- */

typedef struct first_req {
  int from, to; /* to: the first WEIGHTS_REQ's destination (-1: none yet) */
} first_req;

static void note_first_req(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                           const train_tensor *t) {
  (void)body, (void)len, (void)t;
  first_req *f = h->hook_ud;
  if (from == f->from && type == GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ && f->to < 0) f->to = to;
}

/* A member whose hash differed from its aggregator's is told to resync
 * (TRAIN_RESYNC, injected here as the aggregator would send it): it fetches
 * the aggregator's state, the stage's. Before, it asked the first member
 * its directory lists, which may be on its own side of the split. Three
 * relays; m is one whose first listed stage-mate is not the aggregator. */
static void test_resync_told_by_aggregator_fetches_from_it(void **state) {
  (void)state;
  h_harness h;
  int d, agg, m;
  for (uint64_t seed = 1;; seed++) {
    h_init(&h, 1, seed, verbose());
    d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
    for (int k = 0; k < 3; k++) h_add(&h, TRAIN_RELAY, 1, M, 0, true);
    int s1[3];
    assert_int_equal(h_by_id(&h, 1, s1, 3), 3);
    agg = s1[0];
    if (agg != d + 1) break; /* the first relay listed is not the aggregator */
    h_free(&h);
  }
  m = agg == d + 3 ? d + 2 : d + 3; /* lists d + 1 first */
  first_req f = {m, -1};
  h.hook_ud = &f;
  h.send_hook = note_first_req;
  for (int i = 0; i <= d + 3; i++) h_start(&h, i);
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 10);
  uint8_t buf[32];
  while (train_peer_counters(h.nodes[m].tp)->resyncs == 0) {
    Gwtf__TrainIteration r = GWTF__TRAIN_ITERATION__INIT;
    r.iteration = train_peer_iteration(h.nodes[m].tp);
    size_t len = gwtf__train_iteration__pack(&r, buf);
    assert_int_equal(h_inject(&h, agg, m, GWTF__TRAIN_MSG__TRAIN_RESYNC, buf, len, NULL), 0);
    h_run_for(&h, 1);
    assert_true(train_peer_iteration(h.nodes[d].tp) < ITERS);
  }
  assert_true(h_run_until_finished(&h, sim_now(h.s) + 120000));
  assert_int_equal(f.to, agg);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* ---- a lone joiner of lowest ID ---- */

/* A joiner x with the lowest ID of stage 1 gets ready while the other
 * members' directories do not list it yet (its record is on its way, for
 * hide_ms): x picks itself to aggregate, they pick one of them and send it
 * their gradients. x follows their aggregator's average (agg.deferred)
 * instead of refusing it and stepping alone. Before, in 154 of 375 such
 * scenes (seeds 1-40, 200-5000 ms, x started 100-1300 ms in), the members
 * then saw a lower ID's average, fetched x's weights and the stage split,
 * 43 of them ending a step short; the runs took 7.2 s of virtual time on
 * average against 5.1 s now. Returns whether the scene has x lowest. */
static bool lone_joiner_scene(h_harness *h, uint64_t seed, uint64_t start_ms, uint64_t hide_ms, int *d_out, int *x_out) {
  h_init(h, 1, seed, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, JOIN_ITERS, true);
  int z = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  int w = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  int x = h_add(h, TRAIN_RELAY, 1, M, 0, false);
  int s1[3];
  assert_int_equal(h_by_id(h, 1, s1, 3), 3);
  if (s1[0] != x) {
    h_free(h);
    return false;
  }
  for (int i = 0; i <= x; i++) h->nodes[i].job_ms = JOIN_JOB_MS;
  h_start(h, d);
  h_start(h, z);
  h_start(h, w);
  h_run_for(h, start_ms);
  h->nodes[x].hidden_from[z] = h->nodes[x].hidden_from[w] = true;
  h_start(h, x);
  h_run_for(h, hide_ms);
  h->nodes[x].hidden_from[z] = h->nodes[x].hidden_from[w] = false;
  h_refresh(h);
  assert_true(h_run_until_finished(h, 120000));
  if (verbose())
    fprintf(stderr, "seed %llu start %llu hide %llu: done at %.2f s, iteration 2 %.3f s, deferred rounds of x %llu\n",
            (unsigned long long)seed, (unsigned long long)start_ms, (unsigned long long)hide_ms,
            (double)sim_now(h->s) / 1000.0, h->nodes[d].secs_of[2],
            (unsigned long long)train_peer_counters(h->nodes[x].tp)->rounds_deferred);
  assert_agree(h, JOIN_ITERS);
  for (int i = z; i <= x; i++) assert_int_equal(train_peer_step(h->nodes[i].tp), JOIN_ITERS);
  *d_out = d;
  *x_out = x;
  return true;
}

static bool lone_joiner_run(uint64_t seed, uint64_t start_ms, uint64_t hide_ms) {
  h_harness h;
  int d, x;
  if (!lone_joiner_scene(&h, seed, start_ms, hide_ms, &d, &x)) return false;
  assert_true(train_peer_counters(h.nodes[x].tp)->rounds_deferred >= 1); /* the scene: x would have aggregated */
  for (int i = d + 1; i <= x; i++) assert_int_equal(train_peer_counters(h.nodes[i].tp)->splits_healed, 0);
  h_free(&h);
  return true;
}

static void test_lone_joiner_of_lowest_id_follows_the_stage(void **state) {
  (void)state;
  const uint64_t start_ms[] = {100, 400}, hide_ms[] = {1000, 3000};
  int scenes = 0;
  for (uint64_t seed = 1; seed <= 4; seed++)
    for (size_t a = 0; a < 2; a++)
      for (size_t b = 0; b < 2; b++) scenes += lone_joiner_run(seed, start_ms[a], hide_ms[b]);
  assert_true(scenes >= 4); /* seeds 1 and 4 have x lowest */
}

/* The lone joiner's scene of seed 1 (x started 600 ms in, hidden 500 ms)
 * without a deferral: x gets ready a step behind, takes the data node's
 * microbatch for iteration 2 into its queue, and resyncs (the stage is
 * ahead). It hands that microbatch back (DENY not_ready) as it resyncs, and
 * the data node re-routes it at once. Before, the resync dropped it
 * silently and the data node waited for x's hop cap (its probes answered):
 * iteration 2 took 1.95 s of virtual time, the others 0.4 s. */
static void test_resync_hands_back_what_it_holds(void **state) {
  (void)state;
  h_harness h;
  int d, x;
  assert_true(lone_joiner_scene(&h, 1, 600, 500, &d, &x));
  assert_true(train_peer_counters(h.nodes[x].tp)->resyncs >= 1);        /* the scene */
  assert_true(train_peer_counters(h.nodes[x].tp)->denies_sent >= 1);    /* handed back */
  assert_true(train_peer_counters(h.nodes[d].tp)->denies_received >= 1);
  assert_true(h.nodes[d].secs_of[2] < 1.7); /* 1.45 s; 1.95 s before */
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_next_round_begun_while_average_on_its_way),
      cmocka_unit_test(test_resyncing_member_serves_restarted_mate),
      cmocka_unit_test(test_joiners_behind_fetch_from_members_ahead),
      cmocka_unit_test(test_catching_up_aggregator_keeps_early_gradients),
      cmocka_unit_test(test_resync_told_by_aggregator_fetches_from_it),
      cmocka_unit_test(test_lone_joiner_of_lowest_id_follows_the_stage),
      cmocka_unit_test(test_resync_hands_back_what_it_holds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
