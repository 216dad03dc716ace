/* A stage that joiners refill while its only member aggregates, on the
 * deterministic simulator (the stall the evaluation grid found at 20 %
 * churn, docs/TRAINING.md):
 *   - a relay joins stage 2, whose only member S serves it its state and
 *     aggregates while it comes (slowly): S's averages reach the joiner
 *     before it is ready. With rounds missed it steps with their averages,
 *     asked of S one by one (weights.catch_up: S keeps them for the peers
 *     it served), and fetches nothing again, even when every download is
 *     that slow; with more rounds missed than S keeps, it fetches S's newer
 *     state (weights.stale). Either way it trains on in step with S, never
 *     behind; before, it dropped the averages and became ready behind,
 *     with nobody but S to resync from;
 *   - the same with S's average (and everything else S sends them) lost,
 *     and S crashing once they are ready: the stage's newest weights died
 *     with S, the two joiners hold an older iteration than the data node's
 *     and nobody is ahead of them. They move on to the data node's
 *     iteration (stage.skip_ahead) and the run finishes, the two in step;
 *     before, they refused every microbatch as future_iteration and the
 *     run stalled for good;
 *   - a joiner asking S for its state between two of S's rounds is not
 *     waited for in the next (S cannot serve it until the round is over):
 *     before, that round waited its whole timeout (seen in
 *     test_node_private as a 10 s pause of the whole run);
 *   - members that pick a joiner (the lowest ID, listed while it still
 *     fetches its state) to aggregate send their gradients to another
 *     member once it says it is joining (issue 18, item 6). */
#include "testutil.h"

#include <string.h>

#include "peer_harness.h"
#include "train.pb-c.h"

#define M 4
#define ITERS 20
#define STAGES 2
#define SLOW_ONE_ROUND_MS 100 /* S's state this late: S ends one round meanwhile */
#define SLOW_PAST_KEEPING_MS 1500 /* ... more rounds than S keeps averages of (PEER_KEEP_AVGS) */
#define AGG_TIMEOUT_MS 2000       /* the harness's tunable */

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

typedef struct scene {
  h_harness h;
  int d, s, j1, j2; /* j2 < 0: one joiner */
  bool lose_s_to_joiners; /* S's averages, BEGIN_AGG and HELLO never reach the joiners */
  uint64_t slow_chunks_ms; /* S's state reaches a joiner this late, its first download */
  bool slow_link; /* ... and every later one too: the joiner's link is slower than S's rounds */
  bool in_view; /* directories list the joiners from the start, as a restarted member's record (else S's lags) */
  bool lose_catch_up_answers; /* S's averages never reach a joiner once it asked for a missed one */
  int b;                 /* the catch-up scene's other member (scene_build_catch_up) */
  bool mute_b_to_joiner; /* B's HELLOs and BEGIN_AGGs never reach the joiner: it never hears B is ahead */
} scene;

static int node_at(const scene *sc, int idx) {
  for (int i = 0; i < sc->h.n_nodes; i++)
    if (sc->h.nodes[i].index == idx) return i;
  return -1;
}

static bool is_joiner(const scene *sc, int i) { return i >= 0 && (i == sc->j1 || i == sc->j2); }

static uint64_t scene_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)len;
  const scene *sc = ud;
  int f = node_at(sc, from), t = node_at(sc, to);
  uint32_t type = sc->h.sending;
  if (sc->mute_b_to_joiner && f == sc->b && is_joiner(sc, t) &&
      (type == GWTF__TRAIN_MSG__TRAIN_HELLO || type == GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG))
    return UINT64_C(1) << 40;
  if (f == sc->s && is_joiner(sc, t)) {
    if (sc->lose_catch_up_answers && type == GWTF__TRAIN_MSG__TRAIN_AVG &&
        train_peer_counters(sc->h.nodes[t].tp)->downloads_caught_up > 0)
      return UINT64_C(1) << 40;
    if (sc->lose_s_to_joiners && (type == GWTF__TRAIN_MSG__TRAIN_AVG || type == GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG ||
                                  type == GWTF__TRAIN_MSG__TRAIN_HELLO))
      return UINT64_C(1) << 40; /* its state still comes */
    /* (the link is in order: what S sends next arrives right after) */
    if (type == GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK &&
        (sc->slow_link || train_peer_counters(sc->h.nodes[t].tp)->downloads_stale == 0))
      return sc->slow_chunks_ms;
  }
  return 1 + gw_rng_below(rng, 3);
}

/* One data node, two relays in stage 1, S alone in stage 2 with the lowest
 * ID there (seeds are tried until it is); the joiners are fixed to stage 2
 * and start after iteration 2. Unless in_view (every directory lists them
 * from the start, as a restarted member's record), S's directory lags:
 * they are not in its view, so it neither waits for them nor floods them
 * BEGIN_AGG (only the peers it just served get its average). */
static void scene_build(scene *sc, int joiners) {
  for (uint64_t seed = 11;; seed++) {
    h_init(&sc->h, STAGES, seed, verbose());
    sc->d = h_add(&sc->h, TRAIN_DATA, 0, M, ITERS, true);
    for (int k = 0; k < 2; k++) h_add(&sc->h, TRAIN_RELAY, 1, M, 0, true);
    sc->s = h_add(&sc->h, TRAIN_RELAY, 2, M, 0, true);
    sc->j1 = h_add(&sc->h, TRAIN_RELAY, 2, M, 0, false);
    sc->j2 = joiners > 1 ? h_add(&sc->h, TRAIN_RELAY, 2, M, 0, false) : -1;
    bool lowest = gw_id_cmp(&sc->h.nodes[sc->s].peer.id, &sc->h.nodes[sc->j1].peer.id) < 0 &&
                  (sc->j2 < 0 || gw_id_cmp(&sc->h.nodes[sc->s].peer.id, &sc->h.nodes[sc->j2].peer.id) < 0);
    if (lowest) break;
    h_free(&sc->h);
  }
  for (int k = 0; k < 2; k++) {
    int j = k ? sc->j2 : sc->j1;
    if (j < 0) continue;
    if (!sc->in_view) sc->h.nodes[j].hidden_from[sc->s] = true;
  }
  sim_set_delay_fn(sc->h.s, scene_delay, sc);
  for (int i = 0; i < sc->j1; i++) h_start(&sc->h, i);
  while (train_peer_iteration(sc->h.nodes[sc->d].tp) < 2) h_run_for(&sc->h, 10);
  sc->h.nodes[sc->j1].listed_early = sc->in_view;
  h_start(&sc->h, sc->j1);
  if (sc->j2 >= 0) {
    sc->h.nodes[sc->j2].listed_early = sc->in_view;
    h_start(&sc->h, sc->j2);
  }
}

static const train_counters *counters(scene *sc, int i) { return train_peer_counters(sc->h.nodes[i].tp); }

static void test_joiner_fetches_again_after_too_many_missed_averages(void **state) {
  (void)state;
  scene sc = {.slow_chunks_ms = SLOW_PAST_KEEPING_MS};
  scene_build(&sc, 1);
  assert_true(h_run_until_finished(&sc.h, 300000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  const train_counters *cj = counters(&sc, sc.j1);
  if (verbose())
    fprintf(stderr, "joiner: %llu stale downloads, %llu resyncs\n", (unsigned long long)cj->downloads_stale,
            (unsigned long long)cj->resyncs);
  assert_true(sc.h.nodes[sc.j1].ready);
  assert_true(cj->downloads_stale >= 1); /* more rounds ended than S keeps: it fetched again */
  assert_int_equal(cj->resyncs, 0);       /* and was never behind its stage */
  assert_int_equal(cj->iterations_skipped, 0);
  assert_memory_equal(sc.h.nodes[sc.j1].w, sc.h.nodes[sc.s].w, sizeof(sc.h.nodes[sc.s].w));
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_free(&sc.h);
}

/* The same with S's state a little slow: S ends one round while the
 * joiner restores it. The joiner steps with that round's average, which
 * it asks S for once ready (weights.catch_up), instead of fetching the
 * whole state again. */
static void test_joiner_catches_up_with_one_missed_average(void **state) {
  (void)state;
  scene sc = {.slow_chunks_ms = SLOW_ONE_ROUND_MS};
  scene_build(&sc, 1);
  assert_true(h_run_until_finished(&sc.h, 300000));
  const train_counters *cj = counters(&sc, sc.j1);
  if (verbose())
    fprintf(stderr, "joiner: %llu caught up, %llu stale, %llu resyncs\n", (unsigned long long)cj->downloads_caught_up,
            (unsigned long long)cj->downloads_stale, (unsigned long long)cj->resyncs);
  assert_true(sc.h.nodes[sc.j1].ready);
  assert_int_equal(cj->downloads_caught_up, 1);
  assert_int_equal(cj->downloads_stale, 0);
  assert_int_equal(cj->resyncs, 0);
  assert_memory_equal(sc.h.nodes[sc.j1].w, sc.h.nodes[sc.s].w, sizeof(sc.h.nodes[sc.s].w));
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_free(&sc.h);
}

/* Every download of S's state takes three of S's rounds (a home link, a
 * stage that aggregates faster than its state crosses it): the joiner
 * steps with the averages of the rounds it missed, which S kept for it,
 * and is ready in step with S after one download, whether S's directory
 * lists it (S floods it BEGIN_AGG) or not yet. Before, each download was
 * stale by the time it arrived and the joiner fetched again for ever
 * (test_node_private's restarted relay, on a loaded CI machine). */
static void test_joiner_on_a_slow_link_catches_up(void **state) {
  (void)state;
  for (int in_view = 0; in_view < 2; in_view++) {
    scene sc = {.slow_chunks_ms = 300, .slow_link = true, .in_view = in_view};
    scene_build(&sc, 1);
    assert_true(h_run_until_finished(&sc.h, 300000));
    assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
    const train_counters *cj = counters(&sc, sc.j1);
    if (verbose())
      fprintf(stderr, "in view %d: joiner: %llu caught up, %llu stale, %llu resyncs\n", in_view,
              (unsigned long long)cj->downloads_caught_up, (unsigned long long)cj->downloads_stale,
              (unsigned long long)cj->resyncs);
    assert_true(sc.h.nodes[sc.j1].ready);
    assert_int_equal(cj->downloads_stale, 0);
    assert_int_equal(cj->resyncs, 0);
    assert_true(cj->downloads_caught_up >= 2); /* more than one round missed */
    assert_memory_equal(sc.h.nodes[sc.j1].w, sc.h.nodes[sc.s].w, sizeof(sc.h.nodes[sc.s].w));
    char why[200] = "";
    if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
    h_free(&sc.h);
  }
}

static void test_stage_left_behind_moves_on(void **state) {
  (void)state;
  scene sc = {.lose_s_to_joiners = true};
  scene_build(&sc, 2);
  /* S aggregates on; the joiners become ready at an older iteration */
  uint64_t deadline = sim_now(sc.h.s) + 60000;
  while (!(sc.h.nodes[sc.j1].ready && sc.h.nodes[sc.j2].ready) && sim_now(sc.h.s) < deadline)
    h_run_for(&sc.h, 10);
  assert_true(sc.h.nodes[sc.j1].ready && sc.h.nodes[sc.j2].ready);
  while (train_peer_iteration(sc.h.nodes[sc.s].tp) <= train_peer_iteration(sc.h.nodes[sc.j1].tp) + 3 &&
         sim_now(sc.h.s) < deadline)
    h_run_for(&sc.h, 10);
  uint64_t behind = train_peer_iteration(sc.h.nodes[sc.j1].tp);
  if (verbose())
    fprintf(stderr, "joiners ready at %llu/%llu, S at %llu, data node at %llu\n", (unsigned long long)behind,
            (unsigned long long)train_peer_iteration(sc.h.nodes[sc.j2].tp),
            (unsigned long long)train_peer_iteration(sc.h.nodes[sc.s].tp),
            (unsigned long long)train_peer_iteration(sc.h.nodes[sc.d].tp));
  assert_true(train_peer_iteration(sc.h.nodes[sc.s].tp) > behind + 3);
  h_crash(&sc.h, sc.s); /* the stage's newest weights die with it */
  assert_true(h_run_until_finished(&sc.h, 600000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  uint64_t skipped = counters(&sc, sc.j1)->iterations_skipped + counters(&sc, sc.j2)->iterations_skipped;
  if (verbose()) fprintf(stderr, "skipped %llu iterations\n", (unsigned long long)skipped);
  assert_true(skipped >= 1);
  assert_memory_equal(sc.h.nodes[sc.j1].w, sc.h.nodes[sc.j2].w, sizeof(sc.h.nodes[sc.j1].w));
  h_free(&sc.h);
}

/* Stage 2 is S (lowest ID), B and the joiner J (sc->j1), S's catch-up
 * answers to J lost; runs until J has asked S for a missed average.
 * Returns B. */
static int scene_build_catch_up(scene *sc) {
  int b = -1;
  for (uint64_t seed = 31;; seed++) {
    h_init(&sc->h, STAGES, seed, verbose());
    sc->d = h_add(&sc->h, TRAIN_DATA, 0, M, ITERS, true);
    for (int k = 0; k < 2; k++) h_add(&sc->h, TRAIN_RELAY, 1, M, 0, true);
    sc->s = h_add(&sc->h, TRAIN_RELAY, 2, M, 0, true);
    b = h_add(&sc->h, TRAIN_RELAY, 2, M, 0, true);
    sc->j1 = h_add(&sc->h, TRAIN_RELAY, 2, M, 0, false);
    sc->j2 = -1;
    const gw_id *s_id = &sc->h.nodes[sc->s].peer.id;
    if (gw_id_cmp(s_id, &sc->h.nodes[b].peer.id) < 0 && gw_id_cmp(s_id, &sc->h.nodes[sc->j1].peer.id) < 0) break;
    h_free(&sc->h);
  }
  sc->b = b;
  sc->h.nodes[sc->j1].hidden_from[sc->s] = true; /* as in scene_build: S's directory lags */
  sim_set_delay_fn(sc->h.s, scene_delay, sc);
  for (int i = 0; i < sc->j1; i++) h_start(&sc->h, i);
  while (train_peer_iteration(sc->h.nodes[sc->d].tp) < 2) h_run_for(&sc->h, 10);
  h_start(&sc->h, sc->j1);
  uint64_t deadline = sim_now(sc->h.s) + 60000;
  while (counters(sc, sc->j1)->downloads_caught_up == 0 && sim_now(sc->h.s) < deadline) h_run_for(&sc->h, 1);
  assert_int_equal(counters(sc, sc->j1)->downloads_caught_up, 1);
  return b;
}

/* Stage 2 is S (lowest ID), B and a joiner J. J's state comes slowly: S
 * ends a round meanwhile, and J, ready a round behind, asks S for that
 * round's average (weights.catch_up). S dies before the answer reaches J;
 * with `with_b`, B dies at the same moment. J's source is gone, so J acts
 * at once, not after the aggregation timeout it gave the answer: with B
 * alive (and ahead) it resyncs from B; alone, nobody is ahead of it and
 * the averages it lacks died with S, so it gives the catch-up up
 * (weights.catch_up_failed), carries on from its weights (the steps
 * between lost) and the run finishes. Before, J waited out the timeout
 * either way (a restarted relay whose source died as it asked entered, in
 * that time, a round the stage had already ended and waited there alone:
 * it held the run 20 s in a homo-churn10 run, 2026-11-28); before that,
 * alone, it waited for ever and the run stalled
 * (2026-11-27: every member of stage 5 died within one iteration while a
 * joiner caught up). */
static void run_catch_up_source_gone(bool with_b, bool mute_b, uint64_t b_session_ms, train_counters *cj_out,
                                     uint64_t *acted_ms) {
  scene sc = {.slow_chunks_ms = SLOW_ONE_ROUND_MS, .lose_catch_up_answers = true, .mute_b_to_joiner = mute_b};
  int b = scene_build_catch_up(&sc);
  uint64_t deadline = sim_now(sc.h.s) + 60000;
  uint64_t crashed = sim_now(sc.h.s);
  h_crash(&sc.h, sc.s); /* the average J asked for dies with S */
  if (with_b) h_crash(&sc.h, b);
  if (b_session_ms) { /* J's session to B comes up only now (a new identity at an old address) */
    sc.h.nodes[sc.j1].sessions_until[b] = crashed + b_session_ms;
    sc.h.nodes[b].sessions_until[sc.j1] = crashed + b_session_ms;
  }
  h_refresh(&sc.h);
  const train_counters *cj = counters(&sc, sc.j1);
  while (cj->resyncs + cj->iterations_skipped == 0 && sim_now(sc.h.s) < deadline) h_run_for(&sc.h, 1);
  *acted_ms = sim_now(sc.h.s) - crashed;
  assert_true(h_run_until_finished(&sc.h, 600000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  assert_true(sc.h.nodes[sc.j1].ready);
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  if (verbose())
    fprintf(stderr, "with B dead %d: acted %llu ms after S died; %llu skipped, %llu resyncs\n", with_b,
            (unsigned long long)*acted_ms, (unsigned long long)cj->iterations_skipped,
            (unsigned long long)cj->resyncs);
  *cj_out = *cj;
  h_free(&sc.h);
}

static void test_catch_up_source_gone_resyncs_from_a_mate(void **state) {
  (void)state;
  train_counters cj;
  uint64_t acted;
  run_catch_up_source_gone(false, false, 0, &cj, &acted);
  assert_int_equal(cj.resyncs, 1);
  assert_int_equal(cj.iterations_skipped, 0);
  assert_true(acted < AGG_TIMEOUT_MS / 4); /* not the timeout the answer was given */
}

/* As above with B alive, but nothing B says reaches J (its HELLOs and
 * BEGIN_AGGs): J has heard no stage-mate ahead, as a joiner that got ready
 * a moment ago. B may hold the round J lacks: J fetches B's state
 * (train.resync reason=catch_up_source_gone) rather than skip the round.
 * Before, it skipped, and the stage split until a hash mismatch healed it
 * (a homo-churn20 run, 2026-12-07). */
static void test_catch_up_source_gone_fetches_from_a_silent_mate(void **state) {
  (void)state;
  train_counters cj;
  uint64_t acted;
  run_catch_up_source_gone(false, true, 0, &cj, &acted);
  assert_int_equal(cj.resyncs, 1);
  assert_int_equal(cj.iterations_skipped, 0);
  assert_true(acted < AGG_TIMEOUT_MS / 4);
}

/* As above with J's session to B down when S dies: it comes up 1 s later,
 * as a restarted member's under its new identity (our dial to its old
 * address expected the old one). J waits for it and fetches B's state
 * rather than skip the round. Before, it skipped at once, and the stage
 * split (a hetero-churn10 run, seed 170, 2026-12-07). */
static void test_catch_up_source_gone_waits_for_a_mate_session(void **state) {
  (void)state;
  train_counters cj;
  uint64_t acted;
  run_catch_up_source_gone(false, false, 1000, &cj, &acted);
  assert_int_equal(cj.resyncs, 1);
  assert_int_equal(cj.iterations_skipped, 0);
  assert_true(acted >= 1000 && acted < 1000 + AGG_TIMEOUT_MS / 4); /* as soon as the session is up */
}

static void test_catch_up_left_alone_moves_on(void **state) {
  (void)state;
  train_counters cj;
  uint64_t acted;
  run_catch_up_source_gone(true, false, 0, &cj, &acted);
  assert_true(cj.iterations_skipped >= 1);
  assert_int_equal(cj.resyncs, 0); /* nobody was left to resync from */
  assert_true(acted < AGG_TIMEOUT_MS / 4);
}

/* The scene above with S alive (its answers to J's catch-up still lost): a
 * late BEGIN_AGG of the round J is catching up on, as a stage-1 peer's
 * reflood, reaches J. That round ended; J does not enter it (it would wait
 * there alone, as its aggregator, for stage-mates long past it) and, its
 * answer not coming, resyncs from S, which is ahead. */
static void test_catch_up_ignores_an_ended_round(void **state) {
  (void)state;
  scene sc = {.slow_chunks_ms = SLOW_ONE_ROUND_MS, .lose_catch_up_answers = true};
  (void)scene_build_catch_up(&sc);
  int j = sc.j1, from = -1;
  for (int i = 0; i < sc.h.n_nodes && from < 0; i++)
    if (sc.h.nodes[i].stage == 1) from = i;
  uint64_t rounds = counters(&sc, j)->aggregations;
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = train_peer_iteration(sc.h.nodes[j].tp);
  uint8_t buf[64];
  size_t len = gwtf__train_iteration__pack(&m, buf);
  assert_int_equal(h_inject(&sc.h, from, j, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, buf, len, NULL), 0);
  uint64_t deadline = sim_now(sc.h.s) + 60000;
  while (counters(&sc, j)->resyncs == 0 && sim_now(sc.h.s) < deadline) h_run_for(&sc.h, 1);
  assert_int_equal(counters(&sc, j)->resyncs, 1);
  assert_int_equal(counters(&sc, j)->aggregations, rounds); /* no round entered alone meanwhile */
  assert_true(h_run_until_finished(&sc.h, 600000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  h_free(&sc.h);
}

/* S's directory does not list the joiner J (in_view false: S's view lags),
 * yet J gets ready, hears S's rounds and gets work from stage 1, whose view
 * has it. S aggregates: it waits for J, heard only by HELLO, while the data
 * node's ledger lists microbatches no contribution has; every microbatch
 * counts once in every round. Before, S averaged as soon as its own
 * gradient was in, without the microbatches J carried (ledger.missing; the
 * losses left train-ref's in swarm_validation_crash on a loaded machine). */
static void test_round_waits_for_a_heard_member_with_work(void **state) {
  (void)state;
  scene sc = {0};
  scene_build(&sc, 1);
  assert_true(h_run_until_finished(&sc.h, 300000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  const train_counters *cs = counters(&sc, sc.s), *cj = counters(&sc, sc.j1);
  if (verbose())
    fprintf(stderr, "S: %llu backwards, %llu missing; J: %llu backwards\n",
            (unsigned long long)cs->backward_computed, (unsigned long long)cs->ledger_missing,
            (unsigned long long)cj->backward_computed);
  assert_true(cj->backward_computed > 0); /* J carried work */
  assert_int_equal(cs->ledger_missing, 0);
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_free(&sc.h);
}

static double slowest_iteration(const h_node *n) {
  double worst = 0;
  for (int i = 0; i < ITERS; i++)
    if (n->secs_of[i] > worst) worst = n->secs_of[i];
  return worst;
}

/* S knows the joiner (a member restarting: S waits for its gradient) and
 * floods it BEGIN_AGG,
 * which reaches it after its slow first download (more rounds than S
 * keeps averages of): stale, it asks again
 * within a second, and S queues the request (one snapshot per second per
 * peer). S's next round must not wait for a peer that waits for S. */
static void test_round_does_not_wait_for_a_peer_waiting_for_our_state(void **state) {
  (void)state;
  scene sc = {.slow_chunks_ms = SLOW_PAST_KEEPING_MS, .in_view = true};
  scene_build(&sc, 1);
  assert_true(h_run_until_finished(&sc.h, 300000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  const train_counters *cj = counters(&sc, sc.j1);
  double slowest = slowest_iteration(&sc.h.nodes[sc.d]);
  if (verbose())
    fprintf(stderr, "joiner: %llu stale downloads; slowest iteration %.3f s\n",
            (unsigned long long)cj->downloads_stale, slowest);
  assert_true(cj->downloads_stale >= 1);
  assert_true(slowest < sc.h.tun.agg_timeout_ms / 2000.0); /* well under one aggregation timeout */
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_free(&sc.h);
}

/* Stage 2 has S and B; a joiner with the lowest ID there is in every
 * directory from its start (a restarted member's record), and its state
 * comes slowly: S and B pick it to aggregate (the lowest vouched member),
 * send it their gradients, and it tells them it is joining (a HELLO with
 * `joining`, answering the gradient and sent as it asks for the state):
 * they go on with the next member. Before, the gradient was lost and the
 * round waited its whole timeout for the joiner. */
static void test_gradient_to_a_joining_peer_goes_elsewhere(void **state) {
  (void)state;
  scene sc = {.slow_chunks_ms = 300, .in_view = true};
  int b = -1;
  for (uint64_t seed = 21;; seed++) {
    h_init(&sc.h, STAGES, seed, verbose());
    sc.d = h_add(&sc.h, TRAIN_DATA, 0, M, ITERS, true);
    for (int k = 0; k < 2; k++) h_add(&sc.h, TRAIN_RELAY, 1, M, 0, true);
    sc.s = h_add(&sc.h, TRAIN_RELAY, 2, M, 0, true);
    b = h_add(&sc.h, TRAIN_RELAY, 2, M, 0, true);
    sc.j1 = h_add(&sc.h, TRAIN_RELAY, 2, M, 0, false);
    sc.j2 = -1;
    const gw_id *j = &sc.h.nodes[sc.j1].peer.id;
    if (gw_id_cmp(j, &sc.h.nodes[sc.s].peer.id) < 0 && gw_id_cmp(j, &sc.h.nodes[b].peer.id) < 0) break;
    h_free(&sc.h);
  }
  sim_set_delay_fn(sc.h.s, scene_delay, &sc);
  for (int i = 0; i < sc.j1; i++) h_start(&sc.h, i);
  while (train_peer_iteration(sc.h.nodes[sc.d].tp) < 2) h_run_for(&sc.h, 10);
  sc.h.nodes[sc.j1].listed_early = true;
  h_start(&sc.h, sc.j1);
  assert_true(h_run_until_finished(&sc.h, 300000));
  assert_int_equal(train_peer_iteration(sc.h.nodes[sc.d].tp), ITERS);
  double slowest = slowest_iteration(&sc.h.nodes[sc.d]);
  if (verbose()) fprintf(stderr, "slowest iteration %.3f s\n", slowest);
  assert_true(sc.h.nodes[sc.j1].ready);
  assert_true(slowest < sc.h.tun.agg_timeout_ms / 2000.0);
  char why[200] = "";
  if (!h_hashes_agree(&sc.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_free(&sc.h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_joiner_fetches_again_after_too_many_missed_averages),
      cmocka_unit_test(test_joiner_catches_up_with_one_missed_average),
      cmocka_unit_test(test_joiner_on_a_slow_link_catches_up),
      cmocka_unit_test(test_stage_left_behind_moves_on),
      cmocka_unit_test(test_catch_up_source_gone_resyncs_from_a_mate),
      cmocka_unit_test(test_catch_up_source_gone_fetches_from_a_silent_mate),
      cmocka_unit_test(test_catch_up_source_gone_waits_for_a_mate_session),
      cmocka_unit_test(test_catch_up_left_alone_moves_on),
      cmocka_unit_test(test_catch_up_ignores_an_ended_round),
      cmocka_unit_test(test_round_waits_for_a_heard_member_with_work),
      cmocka_unit_test(test_round_does_not_wait_for_a_peer_waiting_for_our_state),
      cmocka_unit_test(test_gradient_to_a_joining_peer_goes_elsewhere),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
