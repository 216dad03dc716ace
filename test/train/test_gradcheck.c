/* test/train/test_gradcheck.c — analytic gradients against central finite
 * differences, for both architectures, the blocks and the data-node part.
 *
 * Tolerance. With a scalar objective L evaluated in fp32 and summed in
 * double, the central difference (L(p+h) - L(p-h)) / 2h differs from the
 * true derivative by a rounding term ~ dL / h (dL: the fp32 error of L,
 * ~1e-7 relative per term, ~1e-6 absolute for these sizes, so ~1e-4 with
 * h = 1e-2) and a truncation term h^2 L''' / 6 (~1e-5 of the gradient
 * scale here). We allow 2e-3 of the largest gradient in the tensor plus an
 * absolute 1e-4 for the rounding term; the worst case we measured was
 * 1.6e-4 of the scale. Seeded mutations of the kernels (the GELU
 * derivative off by 5%, RoPE backward rotating the wrong way, RMSNorm's
 * dweight missing its rstd, the cross-entropy gradient 1% short) all fail
 * this test. */
#include "train_testutil.h"

#include <math.h>

#define GC_H (1e-2)
#define GC_REL_TOL (2e-3)
#define GC_COORDS (3) /* coordinates checked per tensor */
#define B (2)
#define T (5)

/* Weights of a realistic scale (N(0, 1/fan_in), norms near 1, biases
 * non-zero) so attention is not uniform and every path carries signal. */
static void randomize(stage *st, uint64_t seed) {
  gw_rng r;
  gw_rng_seed(&r, seed);
  for (int i = 0; i < stage_n_tensors(st); i++) {
    const model_tensor *t = stage_tensor(st, i);
    float *v = malloc(t->numel * sizeof(float));
    for (size_t j = 0; j < t->numel; j++) {
      double z = gw_rng_normal(&r);
      if (t->ndim == 2) v[j] = (float)(z / sqrt((double)t->shape[1]));
      else if (strstr(t->name, "bias")) v[j] = (float)(0.1 * z);
      else v[j] = (float)(1.0 + 0.1 * z);
    }
    assert_int_equal(stage_write(st, STAGE_PARAMS, t->offset, t->numel, v), 0);
    free(v);
  }
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* An objective L(params, x) and where its input lives. */
typedef struct objective {
  stage *st;
  float *x;     /* blocks: the stage input; head: the activation y */
  float *r;     /* blocks: L = <y, r>; head: L = loss + <embedding, r> */
  int32_t *tok; /* head only */
  size_t n;     /* floats in x */
  float *tmp;
  uint64_t mb;
} objective;

static double eval(objective *o) {
  const stage_spec *s = stage_get_spec(o->st);
  uint64_t mb = ++o->mb;
  double L;
  if (!s->has_head) {
    assert_int_equal(stage_forward(o->st, mb, o->x, o->tmp), 0);
    L = dot(o->tmp, o->r, o->n);
  } else {
    float loss;
    assert_int_equal(stage_embed_forward(o->st, mb, o->tok, o->tmp), 0);
    L = dot(o->tmp, o->r, o->n);
    assert_int_equal(stage_loss(o->st, o->x, o->tok, &loss, o->tmp), 0);
    L += loss;
  }
  assert_int_equal(stage_release(o->st, mb), 0);
  return L;
}

/* Analytic gradients: all parameter grads into *grads, input grad into *gx. */
static void analytic(objective *o, float **grads, float **gx) {
  const stage_spec *s = stage_get_spec(o->st);
  *gx = malloc(o->n * sizeof(float));
  assert_int_equal(stage_zero_grads(o->st), 0);
  if (!s->has_head) {
    assert_int_equal(stage_forward(o->st, 1, o->x, NULL), 0);
    assert_int_equal(stage_backward(o->st, 1, o->r, *gx), 0);
  } else {
    float loss;
    assert_int_equal(stage_embed_forward(o->st, 1, o->tok, o->tmp), 0);
    assert_int_equal(stage_loss(o->st, o->x, o->tok, &loss, *gx), 0);
    assert_int_equal(stage_embed_backward(o->st, 1, o->r), 0);
  }
  assert_int_equal(stage_release(o->st, 1), 0);
  *grads = tt_read_all(o->st, STAGE_GRADS);
}

/* Central difference of L along one float *p (a parameter copy or x[i]). */
static double numeric(objective *o, float *p, void (*sync)(objective *, void *), void *ud) {
  float keep = *p;
  *p = (float)(keep + GC_H);
  if (sync) sync(o, ud);
  double lp = eval(o);
  *p = (float)(keep - GC_H);
  if (sync) sync(o, ud);
  double lm = eval(o);
  *p = keep;
  if (sync) sync(o, ud);
  /* Divide by the step actually taken after rounding to fp32. */
  return (lp - lm) / ((double)(float)(keep + GC_H) - (double)(float)(keep - GC_H));
}

typedef struct param_ref {
  size_t offset;
  float *value;
} param_ref;

static void write_param(objective *o, void *ud) {
  param_ref *p = ud;
  assert_int_equal(stage_write(o->st, STAGE_PARAMS, p->offset, 1, p->value), 0);
}

static void check_close(const char *what, size_t idx, double fd, double an, double scale) {
  double err = fabs(fd - an), tol = GC_REL_TOL * scale + 1e-4;
  if (!(err <= tol))
    fail_msg("%s[%zu]: finite difference %.6g, analytic %.6g (tol %.3g)", what, idx, fd, an, tol);
}

static double max_abs(const float *v, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
  return m;
}

static void gradcheck(objective *o) {
  float *grads, *gx;
  analytic(o, &grads, &gx);
  gw_rng r;
  gw_rng_seed(&r, 77);
  /* Each tensor: a few random coordinates. */
  for (int i = 0; i < stage_n_tensors(o->st); i++) {
    const model_tensor *t = stage_tensor(o->st, i);
    double scale = max_abs(grads + t->offset, t->numel);
    for (int k = 0; k < GC_COORDS; k++) {
      size_t j = (size_t)gw_rng_below(&r, t->numel);
      float v;
      assert_int_equal(stage_read(o->st, STAGE_PARAMS, t->offset + j, 1, &v), 0);
      param_ref ref = {t->offset + j, &v};
      double fd = numeric(o, &v, write_param, &ref);
      check_close(t->name, j, fd, grads[t->offset + j], scale);
    }
  }
  /* The input. */
  double scale = max_abs(gx, o->n);
  for (int k = 0; k < 2 * GC_COORDS; k++) {
    size_t j = (size_t)gw_rng_below(&r, o->n);
    double fd = numeric(o, &o->x[j], NULL, NULL);
    check_close("input", j, fd, gx[j], scale);
  }
  free(grads), free(gx);
}

static void check_blocks(model_arch arch) {
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(arch, 2), 0, 2, false, B, T, 1);
  stage *st = tt_stage(&s, be, 1);
  randomize(st, 5);
  size_t n = (size_t)B * T * s.model.d_model;
  objective o = {st, tt_randn(n, 1, 1.0f), tt_randn(n, 2, 1.0f), NULL, n, malloc(n * 4), 100};
  gradcheck(&o);
  free(o.x), free(o.r), free(o.tmp);
  stage_destroy(st);
  gpu_backend_close(be);
}

static void check_head(model_arch arch) {
  gpu_backend *be = tt_cpu(1);
  model_config m = tt_model(arch, 2);
  stage_spec s = tt_spec(m, 0, 0, true, B, T, 1);
  stage *st = tt_stage(&s, be, 1);
  randomize(st, 6);
  size_t n = (size_t)B * T * m.d_model;
  objective o = {st, tt_randn(n, 3, 1.0f), tt_randn(n, 4, 0.1f), tt_tokens(B * T, m.vocab_size, 9), n,
                 malloc(n * 4), 100};
  gradcheck(&o);
  free(o.x), free(o.r), free(o.tok), free(o.tmp);
  stage_destroy(st);
  gpu_backend_close(be);
}

static void test_gpt_blocks(void **state) {
  (void)state;
  check_blocks(MODEL_GPT);
}
static void test_llama_blocks(void **state) {
  (void)state;
  check_blocks(MODEL_LLAMA);
}
static void test_gpt_head(void **state) {
  (void)state;
  check_head(MODEL_GPT);
}
static void test_llama_head(void **state) {
  (void)state;
  check_head(MODEL_LLAMA);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt_blocks), cmocka_unit_test(test_llama_blocks),
      cmocka_unit_test(test_gpt_head),   cmocka_unit_test(test_llama_head),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
