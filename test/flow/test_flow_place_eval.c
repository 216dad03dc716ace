/* The Fig. 5 node-addition experiment (flow/placeeval.h) on a small case:
 * the placement protocol beats both baselines and stays near the optimal
 * placement. Min-cost flows on ~100 nodes: a sim test, not a valgrind one. */
#include "flowtest.h"

#include "flow/placeeval.h"

static void test_eval_small(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 2; seed++) {
    place_eval_opts o;
    place_eval_opts_default(&o);
    o.setting = 1;
    o.seed = seed;
    o.candidates = 6;
    place_eval_result r;
    assert_int_equal(place_eval_run(&o, &r), 0);
    assert_int_equal(r.stages, 8);
    double g = r.m[PLACE_M_GWTF].improvement, opt = r.m[PLACE_M_OPTIMAL].improvement;
    assert_true(g > 0);
    assert_true(g >= r.m[PLACE_M_CAPACITY_FIRST].improvement);
    assert_true(g >= r.m[PLACE_M_RANDOM].improvement);
    assert_true(g >= 0.9 * opt);
    assert_true(r.gwtf_messages > 0);
    int placed = 0;
    for (int s = 1; s <= 8; s++) placed += r.m[PLACE_M_GWTF].per_stage[s];
    assert_int_equal(placed, 6);
  }
  place_eval_opts bad;
  place_eval_opts_default(&bad);
  bad.setting = 6;
  place_eval_result r;
  assert_int_equal(place_eval_run(&bad, &r), GW_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_eval_small),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
