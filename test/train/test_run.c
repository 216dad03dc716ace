/* test/train/test_run.c — the run record (train/run.h): what a creator
 * writes is what every peer reads, grad_clip included; a record without
 * grad_clip (every run made before it existed) clips nothing; a bad one is
 * refused with a reason. The same for subspace (absent: off). */
#include "train_testutil.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "train/run.h"
#include "util/err.h"

static train_run a_run(double grad_clip) {
  train_run r;
  memset(&r, 0, sizeof(r));
  assert_int_equal(model_preset_get("tiny", &r.model), 0);
  snprintf(r.name, sizeof(r.name), "%s", "swarm");
  snprintf(r.dataset, sizeof(r.dataset), "%s", "moby");
  r.stages = 3, r.batch = 4, r.seq = 64, r.microbatches = 4, r.lr = 1e-3, r.seed = 7, r.grad_clip = grad_clip;
  memset(r.leader.b, 0xab, sizeof(r.leader.b));
  return r;
}

static int decode(const char *text, train_run *out, char *err, size_t len) {
  return train_run_decode((const uint8_t *)text, strlen(text), out, err, len);
}

static void test_round_trip(void **state) {
  (void)state;
  for (int k = 0; k < 2; k++) {
    train_run r = a_run(k ? 0.75 : 0), back;
    char *text = train_run_encode(&r), err[256] = "";
    assert_non_null(text);
    assert_true((strstr(text, "grad_clip") != NULL) == (k == 1)); /* off: not written, as before */
    assert_int_equal(decode(text, &back, err, sizeof(err)), 0);
    assert_true(back.grad_clip == r.grad_clip);
    assert_true(back.lr == r.lr && back.stages == 3 && back.seed == 7 && gw_id_eq(&back.leader, &r.leader));
    assert_string_equal(back.name, "swarm");
    free(text);
  }
}

static void test_bad_grad_clip(void **state) {
  (void)state;
  train_run r = a_run(1.0), back;
  char *text = train_run_encode(&r), err[256] = "";
  json_t *o = json_loads(text, 0, NULL);
  assert_non_null(o);
  const double bad[] = {-1.0, 1e31};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    json_object_set_new(o, "grad_clip", json_real(bad[i]));
    char *t = json_dumps(o, JSON_COMPACT);
    assert_int_equal(decode(t, &back, err, sizeof(err)), GW_EINVAL);
    assert_non_null(strstr(err, "grad_clip"));
    free(t);
  }
  json_object_set_new(o, "grad_clip", json_string("1.0")); /* not a number */
  char *t = json_dumps(o, JSON_COMPACT);
  assert_int_equal(decode(t, &back, err, sizeof(err)), GW_EINVAL);
  free(t);
  json_decref(o);
  free(text);
}

static void test_subspace(void **state) {
  (void)state;
  train_run r = a_run(1.0), back;
  char err[256] = "";
  char *text = train_run_encode(&r);
  assert_null(strstr(text, "subspace")); /* off: not written, as before it existed */
  free(text);
  r.subspace_k = 32, r.subspace_refresh = 10;
  text = train_run_encode(&r);
  assert_non_null(strstr(text, "\"subspace\":{\"k\":32,\"refresh\":10}"));
  assert_int_equal(decode(text, &back, err, sizeof(err)), 0);
  assert_int_equal(back.subspace_k, 32);
  assert_int_equal(back.subspace_refresh, 10);
  json_t *o = json_loads(text, 0, NULL);
  assert_non_null(o);
  free(text);
  /* a rank at or past d_model, a negative refresh, an unknown or missing field */
  const char *bad[] = {"{\"k\":128,\"refresh\":0}", "{\"k\":-1,\"refresh\":0}", "{\"k\":8,\"refresh\":-1}",
                       "{\"k\":8,\"refresh\":0,\"x\":1}", "{\"k\":8}", "8"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    json_object_set_new(o, "subspace", json_loads(bad[i], JSON_DECODE_ANY, NULL));
    char *t = json_dumps(o, JSON_COMPACT);
    assert_int_equal(decode(t, &back, err, sizeof(err)), GW_EINVAL);
    assert_non_null(strstr(err, "subspace"));
    free(t);
  }
  json_decref(o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_bad_grad_clip),
      cmocka_unit_test(test_subspace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
