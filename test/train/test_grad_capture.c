/* --deterministic's arithmetic on a real stage (train/grad_capture.h): a
 * microbatch's own gradient is the same bits whatever ran before it on the
 * stage, so the same microbatches' gradients, backward in two orders and
 * summed in ID order, give identical bytes; accumulated as usual (into one
 * buffer, in arrival order) they do not have to. */
#include "train_testutil.h"

#include <math.h>
#include <string.h>

#include "train/agg_robust.h"
#include "train/grad_capture.h"

#define B 2
#define T 5
#define K 3 /* microbatches */

typedef struct outcome {
  float *part[K]; /* each microbatch's own gradient, by ID */
  float *sum;     /* the stage's running sum (G) after all K */
  float *mean;    /* the parts' mean in ID order */
} outcome;

/* Forward all K, then backward in `order` with every backward captured. */
static void run_order(const stage_spec *s, gpu_backend *be, const int order[K], outcome *o) {
  stage *st = tt_stage(s, be, 9);
  size_t n = stage_n_params(st), act = (size_t)B * T * s->model.d_model;
  float *save = malloc(n * 4), *scratch = malloc(n * 4), *dx = malloc(act * 4);
  for (int k = 0; k < K; k++) {
    float *x = tt_randn(act, 100 + k, 1.0f);
    assert_int_equal(stage_forward(st, (uint64_t)k, x, NULL), 0);
    free(x);
  }
  for (int i = 0; i < K; i++) {
    int k = order[i];
    float *dy = tt_randn(act, 200 + k, 1.0f);
    o->part[k] = calloc(n, 4);
    assert_int_equal(grad_capture_begin(st, save), 0);
    assert_int_equal(stage_backward(st, (uint64_t)k, dy, dx), 0);
    assert_int_equal(grad_capture_end(st, save, scratch, o->part[k]), 0);
    free(dy);
  }
  o->sum = tt_read_all(st, STAGE_GRADS);
  o->mean = malloc(n * 4);
  train_agg_mean((const float *const *)o->part, K, n, K, o->mean);
  free(save), free(scratch), free(dx);
  stage_destroy(st);
}

static void outcome_free(outcome *o) {
  for (int k = 0; k < K; k++) free(o->part[k]);
  free(o->sum), free(o->mean);
}

static void test_order_independent(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 2), 0, 2, false, B, T, K);
  const int fwd[K] = {0, 1, 2}, rev[K] = {2, 0, 1};
  outcome a, b;
  run_order(&s, be, fwd, &a);
  run_order(&s, be, rev, &b);
  stage *probe = tt_stage(&s, be, 9);
  size_t n = stage_n_params(probe);
  stage_destroy(probe);
  for (int k = 0; k < K; k++) assert_memory_equal(a.part[k], b.part[k], n * 4);
  assert_memory_equal(a.mean, b.mean, n * 4);
  /* the running sum is kept (the ordinary contribution): the parts' sum in
   * that run's order, to rounding */
  for (size_t i = 0; i < n; i++) {
    float want = a.part[0][i] + a.part[1][i] + a.part[2][i];
    assert_true(fabsf(a.sum[i] - want) <= 1e-5f * (1.0f + fabsf(want)));
  }
  /* the mean is not all zeros: the backward did produce gradients */
  size_t nz = 0;
  for (size_t i = 0; i < n; i++) nz += a.mean[i] != 0.0f;
  assert_true(nz > n / 2);
  outcome_free(&a), outcome_free(&b);
  gpu_backend_close(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_order_independent)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
