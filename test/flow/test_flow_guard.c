/* flow/flow_guard.c: a flood of flow messages is cut to the rate (and the
 * first drop flagged once), an honest rate is never cut, and a claimed
 * compute time far below ours is raised. */
#include "testutil.h"

#include "flow/flow_guard.h"

static gw_id id_of(uint8_t b) {
  gw_id id;
  memset(&id, b, sizeof(id));
  return id;
}

static void test_flood_is_cut(void **state) {
  (void)state;
  flow_guard g;
  flow_guard_init(&g);
  gw_id bad = id_of(1), good = id_of(2);
  bool first;
  uint64_t dropped, taken = 0, flagged = 0;
  /* 10 s of 10 000 messages per second from one peer */
  for (uint64_t ms = 0; ms < 10000; ms++)
    for (int k = 0; k < 10; k++) {
      taken += flow_guard_admit(&g, &bad, ms, &first, &dropped);
      flagged += first;
    }
  assert_true(taken <= FLOW_GUARD_BURST + 10 * FLOW_GUARD_RATE + 1);
  assert_true(taken >= 10 * FLOW_GUARD_RATE);
  assert_int_equal(flagged, 1); /* one log line for one flood */
  assert_int_equal(dropped, 100000 - taken);
  /* another peer at an honest 50 per second meanwhile is never cut */
  for (uint64_t ms = 0; ms < 10000; ms += 20) assert_true(flow_guard_admit(&g, &good, ms, &first, &dropped));
}

static void test_cost_claim_floor(void **state) {
  (void)state;
  flow_guard g;
  flow_guard_init(&g);
  gw_id liar = id_of(3), a = id_of(4), b = id_of(5), data = id_of(6);
  bool first;
  /* alone in its stage, and not ours: nothing to hold it to */
  assert_true(flow_guard_cost_claim(&g, &liar, 2, 1e-6, 0, &first) == 1e-6);
  assert_false(first);
  assert_true(flow_guard_cost_claim(&g, &a, 2, 0.02, 0, &first) == 0.02);
  assert_true(flow_guard_cost_claim(&g, &b, 2, 0.03, 0, &first) == 0.03);
  assert_false(first);
  /* honest stage-2 peers claim 20-30 ms: the liar's 1 us counts as 20/8 ms */
  assert_true(flow_guard_cost_claim(&g, &liar, 2, 1e-6, 0, &first) == 0.02 / FLOW_GUARD_COST_RATIO);
  assert_true(first);
  flow_guard_cost_claim(&g, &liar, 2, 1e-6, 0, &first);
  assert_false(first); /* logged once */
  /* another stage is not compared: a data node's head may cost 20x a block */
  assert_true(flow_guard_cost_claim(&g, &data, 0, 0.5, 0, &first) == 0.5);
  /* our own time counts for our stage */
  assert_true(flow_guard_cost_claim(&g, &data, 0, 0.001, 0.5, &first) == 0.5 / FLOW_GUARD_COST_RATIO);
}

/* Our own slow spell (a busy machine, a cold first job) is one vote, not
 * the floor: an honest stage-mate's claim stands while the others agree
 * with it, and a liar is still held to the others. */
static void test_own_spike_clamps_no_honest_peer(void **state) {
  (void)state;
  flow_guard g;
  flow_guard_init(&g);
  gw_id a = id_of(7), b = id_of(8), c = id_of(9), liar = id_of(10);
  bool first;
  /* our own mean is 400x theirs (a slow spell): as the floor it would clamp them */
  double own = 0.025 * 4 * FLOW_GUARD_COST_RATIO;
  flow_guard_cost_claim(&g, &a, 1, 0.020, own, &first);
  flow_guard_cost_claim(&g, &b, 1, 0.030, own, &first);
  assert_true(flow_guard_cost_claim(&g, &c, 1, 0.025, own, &first) == 0.025); /* votes 0.02 0.03 own */
  assert_false(first);
  assert_true(flow_guard_cost_claim(&g, &liar, 1, 1e-6, own, &first) == 0.025 / FLOW_GUARD_COST_RATIO);
  assert_true(first);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flood_is_cut),
      cmocka_unit_test(test_cost_claim_floor),
      cmocka_unit_test(test_own_spike_clamps_no_honest_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
