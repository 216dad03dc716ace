/* SWARM's stochastic wiring: priorities follow measured speed, failures ban
 * a peer until it re-announces, newcomers start at the minimum priority. */
#include "testutil.h"

#include <math.h>

#include "train/route_swarm.h"
#include "util/err.h"

static gw_id ids[4];

static int setup(void **state) {
  (void)state;
  for (int i = 0; i < 4; i++) {
    char name[16];
    snprintf(name, sizeof(name), "p%d", i);
    gw_id_hash_str(name, &ids[i]);
  }
  return 0;
}

static gw_id pick(train_router *t, const gw_id *avoid, size_t n_avoid) {
  gw_id out, origin = ids[3];
  uint64_t flow;
  assert_int_equal(t->next_hop(t->ctx, &origin, NULL, 0, 0, avoid, n_avoid, &out, &flow), 0);
  assert_int_equal(flow, 0);
  return out;
}

static void test_faster_peer_gets_more(void **state) {
  (void)state;
  route_swarm *r = route_swarm_new(1, 3, 4, 0.1);
  train_router t = route_swarm_router(r);
  route_swarm_set_next(r, ids, 2);
  /* p0 answers in 10 ms, p1 in 30 ms: after warm-up p0 gets ~3x the work */
  for (int k = 0; k < 50; k++) {
    t.observe(t.ctx, &ids[0], 10.0);
    t.observe(t.ctx, &ids[1], 30.0);
  }
  assert_float_equal(route_swarm_expected_ms(r, &ids[0]), 10.0, 1e-6); /* bias-corrected */
  int count[2] = {0};
  for (int k = 0; k < 400; k++) {
    gw_id p = pick(&t, NULL, 0);
    count[gw_id_eq(&p, &ids[1])]++;
  }
  assert_true(count[0] > 2.7 * count[1] && count[0] < 3.3 * count[1]);
  route_swarm_free(r);
}

static void test_bias_correction_early(void **state) {
  (void)state;
  route_swarm *r = route_swarm_new(1, 3, 4, 0.1);
  train_router t = route_swarm_router(r);
  route_swarm_set_next(r, ids, 1);
  assert_float_equal(route_swarm_expected_ms(r, &ids[0]), ROUTE_SWARM_INITIAL_MS, 1e-9);
  t.observe(t.ctx, &ids[0], 40.0); /* one sample: the corrected average is the sample itself */
  assert_float_equal(route_swarm_expected_ms(r, &ids[0]), 40.0, 1e-9);
  route_swarm_free(r);
}

static void test_ban_until_readmitted(void **state) {
  (void)state;
  route_swarm *r = route_swarm_new(1, 3, 4, 0.1);
  train_router t = route_swarm_router(r);
  route_swarm_set_next(r, ids, 2);
  t.peer_failed(t.ctx, &ids[0]);
  assert_true(route_swarm_banned(r, &ids[0]));
  assert_true(isinf(route_swarm_priority(r, &ids[0])));
  for (int k = 0; k < 10; k++) {
    gw_id p = pick(&t, NULL, 0);
    assert_true(gw_id_eq(&p, &ids[1]));
  }
  /* still banned after the directory lists it again: only a re-announce lifts it */
  route_swarm_set_next(r, ids, 2);
  assert_true(route_swarm_banned(r, &ids[0]));
  route_swarm_readmit(r, &ids[0]);
  assert_false(route_swarm_banned(r, &ids[0]));
  /* it comes back at the current minimum, so it is chosen next */
  assert_float_equal(route_swarm_priority(r, &ids[0]), route_swarm_priority(r, &ids[1]), 1e-9);
  t.peer_failed(t.ctx, &ids[1]);
  gw_id p = pick(&t, NULL, 0);
  assert_true(gw_id_eq(&p, &ids[0]));
  route_swarm_free(r);
}

static void test_all_banned_or_avoided(void **state) {
  (void)state;
  route_swarm *r = route_swarm_new(0, 3, 4, 0.1);
  train_router t = route_swarm_router(r);
  assert_int_equal(t.slots(t.ctx), 0); /* nobody known yet */
  route_swarm_set_next(r, ids, 2);
  assert_int_equal(t.slots(t.ctx), 4);
  gw_id out, origin = ids[3];
  uint64_t flow;
  assert_int_equal(t.next_hop(t.ctx, &origin, NULL, 0, 0, ids, 2, &out, &flow), GW_ENOENT);
  gw_id p = pick(&t, ids, 1); /* avoid p0 */
  assert_true(gw_id_eq(&p, &ids[1]));
  t.peer_failed(t.ctx, &ids[0]);
  t.peer_failed(t.ctx, &ids[1]);
  assert_int_equal(t.next_hop(t.ctx, &origin, NULL, 0, 0, NULL, 0, &out, &flow), GW_ENOENT);
  assert_int_equal(t.slots(t.ctx), 0);
  route_swarm_free(r);
}

static void test_newcomer_starts_at_minimum(void **state) {
  (void)state;
  route_swarm *r = route_swarm_new(1, 3, 4, 0.1);
  train_router t = route_swarm_router(r);
  route_swarm_set_next(r, ids, 2);
  for (int k = 0; k < 20; k++) pick(&t, NULL, 0);
  double lo = fmin(route_swarm_priority(r, &ids[0]), route_swarm_priority(r, &ids[1]));
  route_swarm_set_next(r, ids, 3);
  assert_float_equal(route_swarm_priority(r, &ids[2]), lo, 1e-9);
  route_swarm_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_faster_peer_gets_more),    cmocka_unit_test(test_bias_correction_early),
      cmocka_unit_test(test_ban_until_readmitted),     cmocka_unit_test(test_all_banned_or_avoided),
      cmocka_unit_test(test_newcomer_starts_at_minimum),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
