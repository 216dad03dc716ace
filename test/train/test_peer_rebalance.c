/* Live rebalancing (issue 18, item 3) on the deterministic simulator: the
 * leader moves a relay into the bottleneck stage (train/peer_rebalance.c).
 *   - a skewed swarm (4, 1, 1 relays of equal speed) is evened out to
 *     2, 2, 2 by exactly two moves: the first only after the same stage was
 *     the bottleneck for rebalance_after iterations, the second no sooner
 *     than rebalance_after iterations after the first landed (cooldown);
 *     then nothing moves again (no oscillation); every stage's members
 *     agree on their weights at the end, the moved relays train;
 *   - speeds count, not heads: a stage of one slow relay takes a fast one
 *     from a stage of two, which is left with one, and no move follows
 *     (the way back is never worth it);
 *   - a move that would only shift the bottleneck (2, 1 of equal speed) is
 *     never made: no stage is emptied, no last member moves;
 *   - rebalance_after 0 turns it off;
 *   - a relay's wish for a stage (JOIN's want_stage, --join-stage) is
 *     granted only by a leader told to (--grant-join-stages), and ignored
 *     otherwise: a peer must not choose the stage it attacks. */
#include "testutil.h"

#include <math.h>

#include "peer_harness.h"
#include "train.pb-c.h"

#define M 4

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

typedef struct moves {
  int n;
  int who[16], from[16], to[16];
  uint64_t at[16]; /* the leader's iteration when the harness saw the relay change stage */
} moves;

/* One data node; per[s] relays in stage s (job_ms: each relay's compute
 * time per job, 0: the harness's). Returns the data node's index. */
static int build_dropping(h_harness *h, int stages, const int *per, const uint64_t *job_ms, uint64_t iters,
                          uint32_t after, bool drops_held) {
  h_init(h, stages, 33, verbose());
  h->movable = true;
  h->tun.move_drops_held = drops_held;
  h->tun.rebalance_after = after;
  h->tun.rebalance_margin = 0.2;
  h->tun.hello_period_ms = 50; /* speeds reach the leader within the first iteration (0.1 s here) */
  int d = h_add(h, TRAIN_DATA, 0, M, iters, true);
  int k = 0;
  for (int s = 1; s <= stages; s++)
    for (int i = 0; i < per[s]; i++) {
      int r = h_add(h, TRAIN_RELAY, s, M, 0, true);
      h->nodes[r].job_ms = job_ms ? job_ms[k] : 0;
      k++;
    }
  for (int i = 0; i < h->n_nodes; i++) h_start(h, i);
  return d;
}

static int build(h_harness *h, int stages, const int *per, const uint64_t *job_ms, uint64_t iters, uint32_t after) {
  return build_dropping(h, stages, per, job_ms, iters, after, false);
}

/* Runs to the end, noting every relay's change of stage. */
static void run_noting_moves(h_harness *h, int d, uint64_t iters, moves *mv) {
  int last[H_MAX_NODES];
  for (int i = 0; i < h->n_nodes; i++) last[i] = h->nodes[i].stage;
  memset(mv, 0, sizeof(*mv));
  for (int k = 0; k < 400000 && h->nodes[d].iterations_done < iters; k++) {
    h_run_for(h, 5);
    for (int i = 0; i < h->n_nodes; i++) {
      if (h->nodes[i].stage == last[i]) continue;
      if (mv->n < 16) {
        mv->who[mv->n] = i;
        mv->from[mv->n] = last[i];
        mv->to[mv->n] = h->nodes[i].stage;
        mv->at[mv->n] = train_peer_iteration(h->nodes[d].tp);
      }
      mv->n++;
      last[i] = h->nodes[i].stage;
    }
  }
}

static int count_in(h_harness *h, int stage) {
  int n = 0;
  for (int i = 0; i < h->n_nodes; i++)
    n += h->nodes[i].alive && h->nodes[i].role == TRAIN_RELAY && h->nodes[i].stage == stage;
  return n;
}

/* Every live member of every stage ends on the same weights after the same
 * aggregation, and trained (ready). */
static void assert_stages_agree(h_harness *h, int stages) {
  for (int s = 1; s <= stages; s++) {
    int first = -1;
    for (int i = 0; i < h->n_nodes; i++) {
      h_node *n = &h->nodes[i];
      if (!n->alive || n->role != TRAIN_RELAY || n->stage != s) continue;
      assert_true(n->ready);
      if (first < 0) {
        first = i;
        continue;
      }
      assert_int_equal(n->hash_iteration, h->nodes[first].hash_iteration);
      assert_memory_equal(n->last_hash, h->nodes[first].last_hash, 32);
    }
    assert_true(first >= 0);
  }
}

static void test_skewed_swarm_evened_out(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 24;
  const uint32_t after = 3;
  int per[4] = {0, 4, 1, 1};
  int d = build(&h, 3, per, NULL, iters, after);
  int ones[4];
  assert_int_equal(h_by_id(&h, 1, ones, 4), 4);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 2);
  /* 4,1,1: stage 2 (the lower of the two bottlenecks) gets one of stage 1's;
   * 3,2,1: then stage 3 does */
  assert_int_equal(mv.from[0], 1);
  assert_int_equal(mv.to[0], 2);
  assert_int_equal(mv.from[1], 1);
  assert_int_equal(mv.to[1], 3);
  /* hysteresis: rates are known after the first iteration; the same
   * bottleneck `after` iterations in a row */
  assert_true(mv.at[0] >= after);
  /* cooldown: `after` iterations after the first move landed */
  assert_true(mv.at[1] >= mv.at[0] + after);
  for (int s = 1; s <= 3; s++) assert_int_equal(count_in(&h, s), 2);
  /* never stage 1's aggregator (its lowest ID) */
  for (int k = 0; k < 2; k++) assert_int_not_equal(mv.who[k], ones[0]);
  assert_stages_agree(&h, 3);
  h_free(&h);
}

static void test_speed_counts_not_heads(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 20;
  int per[3] = {0, 2, 1};
  uint64_t job_ms[3] = {5, 5, 20}; /* stage 2's only relay is four times slower */
  int d = build(&h, 2, per, job_ms, iters, 2);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 1); /* and none back: (1 fast) vs (1 slow + 1 fast) is the best split */
  assert_int_equal(mv.from[0], 1);
  assert_int_equal(mv.to[0], 2);
  assert_int_equal(count_in(&h, 1), 1);
  assert_int_equal(count_in(&h, 2), 2);
  assert_stages_agree(&h, 2);
  h_free(&h);
}

static void test_no_move_that_only_shifts_the_bottleneck(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 12;
  int per[3] = {0, 2, 1}; /* equal speeds: 2,1 -> 1,2 would be no better */
  int d = build(&h, 2, per, NULL, iters, 1);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 0);
  assert_int_equal(count_in(&h, 1), 2);
  assert_int_equal(count_in(&h, 2), 1);
  h_free(&h);
}

static void test_off(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10;
  int per[4] = {0, 4, 1, 1};
  int d = build(&h, 3, per, NULL, iters, 0);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 0);
  assert_int_equal(count_in(&h, 1), 4);
  h_free(&h);
}

/* A relay that joins a running swarm (2, 2, 1 relays) goes to the stage of
 * one, the most utilized: every flow of the data node passes through it,
 * whatever its directory record says (it announces no flow here, as a
 * record from before the flows formed), while stage 1's records announce
 * 3 of its 4 slots each, a peak. The leader ranked by the records alone,
 * and swarm_join placed its late relay beside two, about 1 run in 8. */
static void test_joiner_goes_to_the_busiest_stage(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10;
  int per[4] = {0, 2, 2, 1};
  int d = build(&h, 3, per, NULL, iters, 0);
  for (int k = 0; k < 100000 && h.nodes[d].iterations_done < 3; k++) h_run_for(&h, 5);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY && h.nodes[i].stage == 1) h.nodes[i].dir_load = 3;
  int late = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  h_start(&h, late);
  for (int k = 0; k < 100000 && h.nodes[late].stage < 0; k++) h_run_for(&h, 5);
  assert_int_equal(h.nodes[late].stage, 3);
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_stages_agree(&h, 3);
  h_free(&h);
}

/* The leader's directory stops listing a middle stage's relays (its DHT
 * lost its contacts under churn) while they train on and send it their
 * HELLOs: the stage is not empty, and nobody is moved into it. Before, the
 * leader moved a relay there after MOVE_AFTER_MS; it restored an old
 * replica beside the live members and the stage split. */
static void test_stage_heard_is_not_empty(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 80;
  int per[4] = {0, 2, 2, 2};
  int d = build(&h, 3, per, NULL, iters, 0);
  for (int k = 0; k < 100000 && h.nodes[d].iterations_done < 2; k++) h_run_for(&h, 5);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY && h.nodes[i].stage == 2) h.nodes[i].hidden_from[d] = true;
  h_refresh(&h);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 0);
  assert_int_equal(count_in(&h, 2), 2);
  assert_stages_agree(&h, 3);
  h_free(&h);
}

/* Four relays that each ask for stage 1 as they join (placed by the
 * leader: stage -1), beside a first member in each stage; per[s]: the
 * relays that trained in stage s at the end. */
static void place_wishing_for_1(bool grant, int per[4]) {
  h_harness h;
  h_init(&h, 3, 35, verbose());
  h.tun.rebalance_after = 0;
  h.grant_join_stage = grant;
  int d = h_add(&h, TRAIN_DATA, 0, M, 20, true);
  for (int s = 1; s <= 3; s++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  h.join_stage = 1;
  for (int k = 0; k < 4; k++) h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(h.nodes[d].iterations_done, 20);
  memset(per, 0, 4 * sizeof(int));
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY && h.nodes[i].ready) per[h.nodes[i].stage]++;
  h_free(&h);
}

static void test_join_stage_granted_only_when_told(void **state) {
  (void)state;
  int per[4];
  place_wishing_for_1(true, per);
  assert_int_equal(per[1], 1 + 4);
  assert_int_equal(per[2], 1);
  assert_int_equal(per[3], 1);
  /* ignored: the leader spreads them over the stages as it ranks them */
  place_wishing_for_1(false, per);
  assert_true(per[1] < 1 + 4 && per[2] >= 2 && per[3] >= 2);
  assert_int_equal(per[1] + per[2] + per[3], 3 + 4);
}

/* A relay moved after its round and the next iteration's microbatches:
 * stage 2's round runs over 150 ms links (the rest 30 ms), so stage 1 steps
 * first and sends them on to stage 2 (the router sends stage 2's traffic to
 * the relay the leader moves, alone, until then), where they would wait for
 * its step. Dropped as it left, they waited at stage 1 for the hop's
 * deadline and then for pings the mover answered: the iteration took
 * 1.96 s against 0.59 s settled. Now
 *   - a relay whose move is decided refuses them (DENY "moving");
 *   - one that took them before its TRAIN_MOVE came (`move_late`: the move
 *     takes 300 ms to arrive) hands them back as it leaves;
 *   - and where it leaves with them all the same (`drops_held`: an older
 *     peer, tun.move_drops_held), its HELLO from the new stage tells
 *     stage 1 it left. */
typedef struct move_watch {
  int mover;
  bool move_late;
  uint32_t denies;        /* DENYs the mover sent */
  bool moved;              /* the leader sent its TRAIN_MOVE */
  uint64_t move_iteration; /* the round it names */
  uint32_t took_next;      /* FORWARD_RECEIVEDs it sent from stage 2 for a later iteration */
} move_watch;

static uint64_t slow_stage_two_round(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  move_watch *w = h->hook_ud;
  (void)to, (void)len, (void)rng;
  if (w->move_late && h->sending == GWTF__TRAIN_MSG__TRAIN_MOVE) return 300;
  bool round = h->sending == GWTF__TRAIN_MSG__TRAIN_GRAD || h->sending == GWTF__TRAIN_MSG__TRAIN_AVG;
  return round && h->nodes[from].stage == 2 ? 150 : 30;
}

static void watch_mover(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                        const train_tensor *t) {
  move_watch *w = h->hook_ud;
  (void)t;
  if (type == GWTF__TRAIN_MSG__TRAIN_MOVE && to == w->mover) {
    Gwtf__TrainAssign *a = gwtf__train_assign__unpack(NULL, len, body);
    if (a) w->move_iteration = a->iteration, w->moved = true;
    gwtf__train_assign__free_unpacked(a, NULL);
  }
  if (from != w->mover) return;
  w->denies += type == GWTF__TRAIN_MSG__TRAIN_DENY;
  if (type == GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED && w->moved && h->nodes[from].stage == 2) {
    Gwtf__TrainAck *a = gwtf__train_ack__unpack(NULL, len, body);
    if (a) w->took_next += a->iteration > w->move_iteration;
    gwtf__train_ack__free_unpacked(a, NULL);
  }
}

static void run_move_with_queued(bool move_late, bool drops_held) {
  h_harness h;
  const uint64_t iters = 6;
  int per[4] = {0, 2, 3, 1};
  int d = build_dropping(&h, 3, per, NULL, iters, 1, drops_held);
  int two[3];
  assert_int_equal(h_by_id(&h, 2, two, 3), 3);
  move_watch w = {.mover = two[2], .move_late = move_late}; /* equal speeds: the highest ID moves */
  h.nodes[two[0]].unrouted_until = h.nodes[two[1]].unrouted_until = 600;
  h.hook_ud = &w;
  h.send_hook = watch_mover;
  sim_set_delay_fn(h.s, slow_stage_two_round, &h);
  moves mv;
  run_noting_moves(&h, d, iters, &mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  assert_int_equal(mv.n, 1);
  assert_int_equal(mv.who[0], w.mover);
  assert_int_equal(mv.to[0], 3);
  /* Told before they came, it refuses the next iteration's microbatches;
   * told after, it took them and hands them back (or, dropping them, says
   * nothing: its HELLO is all stage 1 hears). */
  assert_int_equal(w.took_next > 0, move_late);
  assert_int_equal(w.denies > 0, !drops_held);
  const train_counters *c = train_peer_counters(h.nodes[d].tp);
  assert_int_equal(c->deferred_microbatches + c->lost_microbatches, 0);
  double steady = h.nodes[d].secs_of[iters - 1], at_move = h.nodes[d].secs_of[mv.at[0]];
  if (at_move > 1.25 * steady)
    fail_msg("iteration %llu (the move) took %.3f s, a settled one %.3f s", (unsigned long long)mv.at[0], at_move,
             steady);
  assert_stages_agree(&h, 3);
  h_free(&h);
}

static void test_relay_to_move_refuses_the_next_iteration(void **state) {
  (void)state;
  run_move_with_queued(false, false);
}

static void test_moved_relay_hands_back_what_it_held(void **state) {
  (void)state;
  run_move_with_queued(true, false);
}

static void test_moved_relay_hello_frees_what_it_held(void **state) {
  (void)state;
  run_move_with_queued(true, true);
}

/* A relay of stage 3 (of 3, 2, 2 relays, 4 slots each) crashes; the data
 * node starts 8 microbatches an iteration, so stage 3 is left with half
 * the slots it needs and runs every iteration in two waves. With
 * move_to_short the leader moves a relay of stage 1 (12 slots) there at
 * once, whatever the rates say (the rate rule is off here); without it
 * stage 3 stays short (the harness restarts nobody). */
static uint64_t run_short_stage(bool on, bool idle_donors, moves *mv, uint64_t *crash_iteration) {
  h_harness h;
  const uint64_t iters = 10;
  h_init(&h, 3, 33, verbose());
  h.movable = true;
  h.tun.rebalance_after = 0;
  h.tun.move_to_short = on;
  h.tun.hello_period_ms = 50;
  int d = h_add(&h, TRAIN_DATA, 0, 2 * M, iters, true);
  int per[4] = {0, 3, 2, 2};
  for (int s = 1; s <= 3; s++)
    for (int i = 0; i < per[s]; i++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  int one[3];
  assert_int_equal(h_by_id(&h, 1, one, 3), 3);
  if (idle_donors) h.nodes[one[1]].unrouted = h.nodes[one[2]].unrouted = true; /* the flows pass them by */
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  while (h.nodes[d].iterations_done < 3) h_run_for(&h, 5);
  int three[2];
  assert_int_equal(h_by_id(&h, 3, three, 2), 2);
  *crash_iteration = train_peer_iteration(h.nodes[d].tp);
  h_crash(&h, three[1]);
  run_noting_moves(&h, d, iters, mv);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  uint64_t end = sim_now(h.s);
  assert_int_equal(count_in(&h, 1), on ? 2 : 3);
  assert_int_equal(count_in(&h, 2), 2);
  assert_int_equal(count_in(&h, 3), on ? 2 : 1);
  const train_counters *c = train_peer_counters(h.nodes[d].tp);
  assert_int_equal(c->lost_microbatches, 0);
  assert_stages_agree(&h, 3);
  h_free(&h);
  return end;
}

static void test_short_stage_gets_a_relay_at_once(void **state) {
  (void)state;
  moves on, off;
  uint64_t crashed_on, crashed_off;
  uint64_t end_on = run_short_stage(true, false, &on, &crashed_on);
  uint64_t end_off = run_short_stage(false, false, &off, &crashed_off);
  assert_int_equal(off.n, 0);
  assert_int_equal(on.n, 1);
  assert_int_equal(on.from[0], 1);
  assert_int_equal(on.to[0], 3);
  assert_true(on.at[0] <= crashed_on + 1); /* it leaves after the round it was in, at the latest */
  if (end_on >= end_off)
    fail_msg("with the move the run ended at %llu ms, short at %llu ms", (unsigned long long)end_on,
             (unsigned long long)end_off);
}

/* The same with stage 1's flows passing two of its relays by: the one
 * moved carries nothing of the round and leaves at once, in the iteration
 * of the crash, rather than after the round (an iteration later). */
static void test_idle_relay_moves_at_once(void **state) {
  (void)state;
  moves mv;
  uint64_t crashed;
  run_short_stage(true, true, &mv, &crashed);
  assert_int_equal(mv.n, 1);
  assert_int_equal(mv.to[0], 3);
  assert_int_equal(mv.at[0], crashed);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_relay_to_move_refuses_the_next_iteration),
      cmocka_unit_test(test_moved_relay_hands_back_what_it_held),
      cmocka_unit_test(test_moved_relay_hello_frees_what_it_held),
      cmocka_unit_test(test_short_stage_gets_a_relay_at_once),
      cmocka_unit_test(test_idle_relay_moves_at_once),
      cmocka_unit_test(test_skewed_swarm_evened_out),
      cmocka_unit_test(test_speed_counts_not_heads),
      cmocka_unit_test(test_no_move_that_only_shifts_the_bottleneck),
      cmocka_unit_test(test_off),
      cmocka_unit_test(test_join_stage_granted_only_when_told),
      cmocka_unit_test(test_joiner_goes_to_the_busiest_stage),
      cmocka_unit_test(test_stage_heard_is_not_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
