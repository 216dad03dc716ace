/* test/node/test_swarm_waste.c — the paper's wasted compute (node/swarm_waste.c):
 * only compute on a completed microbatch's final path is useful. */
#include "testutil.h"

#include <stdbool.h>

#include "node/swarm_waste.h"

#define EPS 1e-9

/* One attempt through data node D and relays r1..r3: embed, forwards, loss,
 * backwards, embed backward; each step costs 1 s. */
static void trip(swarm_waste *w, const char *mb, unsigned attempt, const char *const relays[3], bool embed) {
  if (embed) swarm_waste_compute(w, "D", "D", mb, attempt, "embed", 1);
  for (int i = 0; i < 3; i++) swarm_waste_compute(w, relays[i], "D", mb, attempt, "forward", 1);
  swarm_waste_compute(w, "D", "D", mb, attempt, "loss", 1);
  for (int i = 2; i >= 0; i--) swarm_waste_compute(w, relays[i], "D", mb, attempt, "backward", 1);
  swarm_waste_compute(w, "D", "D", mb, attempt, "embed_backward", 1);
}

static const char *const PATH_A[3] = {"r1", "r2", "r3"};

/* Attempt 0 of mb along PATH_A up to its loss, embedding included (5 s). */
static void to_loss(swarm_waste *w, const char *mb) {
  swarm_waste_compute(w, "D", "D", mb, 0, "embed", 1);
  for (int i = 0; i < 3; i++) swarm_waste_compute(w, PATH_A[i], "D", mb, 0, "forward", 1);
  swarm_waste_compute(w, "D", "D", mb, 0, "loss", 1);
}

static void test_fault_free_wastes_nothing(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  trip(w, "1", 0, PATH_A, true);
  trip(w, "2", 0, PATH_A, true);
  swarm_waste_done(w, "D", "1", 0);
  swarm_waste_done(w, "D", "2", 0);
  assert_float_equal(swarm_waste_total_s(w), 18, EPS);
  assert_float_equal(swarm_waste_wasted_s(w), 0, EPS);
  swarm_waste_free(w);
}

static void test_unfinished_microbatch_is_waste(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  trip(w, "1", 0, PATH_A, true);
  swarm_waste_done(w, "D", "1", 0);
  /* deferred after its forward: embed + 3 forwards + loss */
  to_loss(w, "2");
  assert_float_equal(swarm_waste_wasted_s(w), 5, EPS);
  swarm_waste_free(w);
}

/* SWARM: attempt 0 broke in its backward at r2 and was sent again. Its
 * forwards, its loss and r3's backward are thrown away; the embedding is
 * reused. */
static void test_restart_wastes_the_first_attempt(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  to_loss(w, "1");
  swarm_waste_compute(w, "r3", "D", "1", 0, "backward", 1);
  static const char *const PATH_B[3] = {"r1", "r4", "r3"}; /* r1 and r3 serve again */
  trip(w, "1", 1, PATH_B, false);
  swarm_waste_done(w, "D", "1", 1);
  assert_float_equal(swarm_waste_total_s(w), 6 + 8, EPS);
  assert_float_equal(swarm_waste_wasted_s(w), 5, EPS);
  swarm_waste_free(w);
}

/* GWTF: r2 crashed after its forward; r4 recomputed stage 2 from r1's
 * stored output and the backward resumed. Only r2's forward is lost. */
static void test_repair_wastes_only_the_lost_stage(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  to_loss(w, "1");
  swarm_waste_compute(w, "r3", "D", "1", 0, "backward", 1);
  swarm_waste_compute(w, "r4", "D", "1", 0, "recompute", 1);
  swarm_waste_compute(w, "r4", "D", "1", 0, "backward", 1);
  swarm_waste_compute(w, "r1", "D", "1", 0, "backward", 1);
  swarm_waste_compute(w, "D", "D", "1", 0, "embed_backward", 1);
  swarm_waste_done(w, "D", "1", 0);
  assert_float_equal(swarm_waste_wasted_s(w), 1, EPS);
  swarm_waste_free(w);
}

/* A relay that crashed after carrying a completed microbatch's backward was
 * on its final path: not waste by the paper's definition. */
static void test_crash_after_backward_is_not_waste(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  trip(w, "1", 0, PATH_A, true);
  swarm_waste_done(w, "D", "1", 0);
  assert_float_equal(swarm_waste_wasted_s(w), 0, EPS);
  swarm_waste_free(w);
}

/* The waste is split by who did it: r2 died after its forward (repaired
 * through r4), r5 was bypassed alive (its forward of microbatch 2 a spare
 * the re-route left behind). Only r2's second counts as a death's, also
 * once its record has left the window; marking a peer twice changes
 * nothing. */
static void test_waste_of_peers_that_died(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(64);
  to_loss(w, "1");
  swarm_waste_compute(w, "r5", "D", "2", 0, "forward", 1);
  trip(w, "2", 0, PATH_A, true);
  static const char *const PATH_R[3] = {"r1", "r4", "r3"};
  trip(w, "1", 0, PATH_R, false); /* the rebuilt path: r4 recomputes and carries the backward */
  swarm_waste_done(w, "D", "1", 0);
  swarm_waste_done(w, "D", "2", 0);
  assert_float_equal(swarm_waste_on_lost_s(w), 0, EPS); /* nobody died yet */
  swarm_waste_peer_lost(w, "r2");
  swarm_waste_peer_lost(w, "r2");
  swarm_waste_peer_lost(w, NULL); /* ignored */
  assert_float_equal(swarm_waste_wasted_s(w), 2, EPS); /* r2's forward of 1, r5's of 2 */
  assert_float_equal(swarm_waste_on_lost_s(w), 1, EPS);
  for (int i = 0; i < 80; i++) swarm_waste_compute(w, "r1", "D", "3", 0, "forward", 0); /* push them out */
  assert_float_equal(swarm_waste_on_lost_s(w), 1, EPS);
  assert_float_equal(swarm_waste_wasted_s(w), 2, EPS);
  swarm_waste_free(w);
}

/* A completion is credited once, and records that fell out of the window
 * stay in the total as waste. */
static void test_window_and_duplicates(void **state) {
  (void)state;
  swarm_waste *w = swarm_waste_new(4);
  trip(w, "1", 0, PATH_A, true); /* 5 records: the embedding's falls out */
  swarm_waste_done(w, "D", "1", 0);
  swarm_waste_done(w, "D", "1", 0);
  assert_float_equal(swarm_waste_total_s(w), 9, EPS);
  assert_float_equal(swarm_waste_wasted_s(w), 1, EPS);
  swarm_waste_compute(w, NULL, "D", "1", 0, "forward", 1); /* ignored */
  swarm_waste_compute(w, "r1", "D", "1", 0, "forward", -1);
  assert_float_equal(swarm_waste_total_s(w), 9, EPS);
  swarm_waste_free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_free_wastes_nothing),
      cmocka_unit_test(test_unfinished_microbatch_is_waste),
      cmocka_unit_test(test_restart_wastes_the_first_attempt),
      cmocka_unit_test(test_repair_wastes_only_the_lost_stage),
      cmocka_unit_test(test_crash_after_backward_is_not_waste),
      cmocka_unit_test(test_window_and_duplicates),
      cmocka_unit_test(test_waste_of_peers_that_died),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
