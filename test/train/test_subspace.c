/* Subspace crossings (train/subspace.h): the basis is orthonormal and the
 * same from the same seed; a block stage whose residual writes were
 * projected adds only inside U, so z = U^T (x - x0) and the token ids
 * rebuild its output exactly; its backward from U U^T g gives the same
 * U^T dx and the same parameter gradients (up to what the projection after
 * the step removes) as from g, and its pre-step projection leaves the
 * residual writes' gradients in U and every other one as it was; the gradient's part outside U lands in the
 * table's sum by token and position; the data node's embedding keeps the
 * table as its part outside U through its steps; the table's step is
 * torch's AdamW (the backend's kernel). Both architectures. */
#include "train_testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/subspace.h"

enum { B = 2, T = 5, K = 4 };

static float max_abs(const float *a, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) m = fabsf(a[i]) > m ? fabsf(a[i]) : m;
  return m;
}

static float max_diff(const float *a, const float *b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) m = fabsf(a[i] - b[i]) > m ? fabsf(a[i] - b[i]) : m;
  return m;
}

/* rows x C: a U (rows x K) */
static float *times_u(const subspace *s, const float *a, size_t rows) {
  float *o = calloc(rows * K, sizeof(float));
  assert_non_null(o);
  for (size_t r = 0; r < rows; r++)
    for (int j = 0; j < K; j++)
      for (int c = 0; c < s->C; c++) o[r * K + j] += a[r * s->C + c] * s->U[(size_t)c * K + j];
  return o;
}

static void test_parse(void **state) {
  (void)state;
  int k = 0, r = 0;
  assert_int_equal(subspace_parse("32", &k, &r), 0);
  assert_int_equal(k, 32);
  assert_int_equal(r, SUBSPACE_REFRESH_DEFAULT);
  assert_int_equal(subspace_parse("16:5", &k, &r), 0);
  assert_int_equal(k, 16);
  assert_int_equal(r, 5);
  assert_int_equal(subspace_parse("8:0", &k, &r), 0);
  assert_int_equal(r, 0);
  static const char *const bad[] = {"", "0", "-3", "x", "32:", "32:-1", "32x", "32:5:1", ":5"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(subspace_parse(bad[i], &k, &r), GW_EINVAL);
}

static void test_basis(void **state) {
  (void)state;
  enum { C = 48, k = 16 };
  float *a = malloc(C * k * sizeof(float)), *b = malloc(C * k * sizeof(float));
  assert_non_null(a);
  assert_non_null(b);
  subspace_basis(C, k, 7, a);
  subspace_basis(C, k, 7, b);
  assert_memory_equal(a, b, C * k * sizeof(float));
  for (int i = 0; i < k; i++)
    for (int j = 0; j < k; j++) {
      double d = 0;
      for (int c = 0; c < C; c++) d += (double)a[c * k + i] * a[c * k + j];
      assert_true(fabs(d - (i == j)) < 1e-6);
    }
  subspace_basis(C, k, 8, b);
  assert_true(max_diff(a, b, C * k) > 0.1f);
  free(a);
  free(b);
}

/* A data-node stage (the table's source), a block stage of 2 layers, and
 * the subspace of the run. */
typedef struct fixture fixture;
static float head_off_table(fixture *f);

struct fixture {
  gpu_backend *be;
  stage *head, *blocks;
  subspace sub;
  int32_t *tok;
  size_t n; /* B*T*C */
};

static void setup(fixture *f, model_arch arch, bool project) {
  f->be = tt_cpu(1);
  model_config m = tt_model(arch, 2);
  stage_spec hs = tt_spec(m, 0, 0, true, B, T, 2), bs = tt_spec(m, 0, 2, false, B, T, 2);
  f->head = tt_stage(&hs, f->be, 3);
  f->blocks = tt_stage(&bs, f->be, 3);
  char err[256];
  assert_int_equal(subspace_init(&f->sub, &m, K, 3, 3, B * T, err, sizeof(err)), 0);
  /* the table every peer computes from the seed is the data node's initial embedding outside U */
  assert_true(head_off_table(f) < 1e-6f);
  assert_int_equal(subspace_head_post_step(&f->sub, f->head), 0);
  if (project) assert_int_equal(subspace_project_block(&f->sub, f->blocks), 0);
  f->tok = tt_tokens(B * T, m.vocab_size, 5);
  f->n = (size_t)B * T * m.d_model;
}

static void teardown(fixture *f) {
  subspace_free(&f->sub);
  stage_destroy(f->head);
  stage_destroy(f->blocks);
  gpu_backend_close(f->be);
  free(f->tok);
}

/* x = x0(tokens) + U z for a random z: an activation as the link delivers it. */
static float *arriving(fixture *f, uint64_t seed) {
  float *z = tt_randn((size_t)B * T * K, seed, 1.0f), *x = malloc(f->n * sizeof(float));
  assert_non_null(x);
  assert_int_equal(subspace_decode(&f->sub, z, f->tok, B * T, T, x), 0);
  free(z);
  return x;
}

/* The block stage's output, sent as z and rebuilt: exact when its writes are
 * in U, far off when they are not (the test can tell). */
static void check_rebuild(model_arch arch) {
  for (int project = 1; project >= 0; project--) {
    fixture f;
    setup(&f, arch, project);
    float *x = arriving(&f, 21), *y = malloc(f.n * sizeof(float)), *y2 = malloc(f.n * sizeof(float));
    float *z = malloc((size_t)B * T * K * sizeof(float));
    assert_non_null(y);
    assert_non_null(y2);
    assert_non_null(z);
    assert_int_equal(stage_forward(f.blocks, 1, x, y), 0);
    assert_int_equal(subspace_encode(&f.sub, y, f.tok, B * T, T, z), 0);
    assert_int_equal(subspace_decode(&f.sub, z, f.tok, B * T, T, y2), 0);
    float err = max_diff(y, y2, f.n) / max_abs(y, f.n);
    if (project) assert_true(err < 1e-5f);
    else assert_true(err > 1e-3f);
    free(x), free(y), free(y2), free(z);
    teardown(&f);
  }
}

static void test_rebuild_gpt(void **state) {
  (void)state;
  check_rebuild(MODEL_GPT);
}

static void test_rebuild_llama(void **state) {
  (void)state;
  check_rebuild(MODEL_LLAMA);
}

static bool writes_residual(const char *name) {
  return strstr(name, "attn.proj") || strstr(name, "mlp.proj") || strstr(name, "attn.o.") || strstr(name, "mlp.down");
}

/* Backward from U U^T dy (what the link carries) against from dy. */
static void check_backward(model_arch arch) {
  fixture f, g;
  setup(&f, arch, true);
  setup(&g, arch, true);
  float *x = arriving(&f, 21), *dy = tt_randn(f.n, 22, 1.0f), *dyp = malloc(f.n * sizeof(float));
  float *dxa = malloc(f.n * sizeof(float)), *dxb = malloc(f.n * sizeof(float));
  assert_non_null(dyp), assert_non_null(dxa), assert_non_null(dxb);
  float *gz = times_u(&f.sub, dy, B * T);
  subspace_grad_lift(&f.sub, gz, B * T, dyp);
  assert_int_equal(stage_forward(f.blocks, 1, x, NULL), 0);
  assert_int_equal(stage_backward(f.blocks, 1, dy, dxa), 0);
  assert_int_equal(stage_forward(g.blocks, 1, x, NULL), 0);
  assert_int_equal(stage_backward(g.blocks, 1, dyp, dxb), 0);
  float *ua = times_u(&f.sub, dxa, B * T), *ub = times_u(&f.sub, dxb, B * T);
  assert_true(max_diff(ua, ub, B * T * K) <= 1e-4f * max_abs(ua, B * T * K));
  float *ga = tt_read_all(f.blocks, STAGE_GRADS), *gb = tt_read_all(g.blocks, STAGE_GRADS);
  for (int i = 0; i < stage_n_tensors(f.blocks); i++) {
    const model_tensor *t = stage_tensor(f.blocks, i);
    float *a = ga + t->offset, *b = gb + t->offset;
    if (writes_residual(t->name)) {
      /* rows are output dims: compare U U^T of each column */
      size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
      for (size_t c = 0; c < cols; c++) {
        float pa[64], pb[64];
        int C = f.sub.C;
        for (int r = 0; r < C; r++) pa[r] = a[r * cols + c], pb[r] = b[r * cols + c];
        float *qa = times_u(&f.sub, pa, 1), *qb = times_u(&f.sub, pb, 1);
        assert_true(max_diff(qa, qb, K) <= 1e-4f * (max_abs(qa, K) + 1e-6f));
        free(qa), free(qb);
      }
    } else {
      assert_true(max_diff(a, b, t->numel) <= 1e-4f * (max_abs(a, t->numel) + 1e-6f));
    }
  }
  /* before the step: the residual writes' gradients into U, the rest untouched */
  assert_int_equal(subspace_block_pre_step(&f.sub, f.blocks), 0);
  float *gp = tt_read_all(f.blocks, STAGE_GRADS);
  for (int i = 0; i < stage_n_tensors(f.blocks); i++) {
    const model_tensor *t = stage_tensor(f.blocks, i);
    if (!writes_residual(t->name)) {
      assert_memory_equal(gp + t->offset, ga + t->offset, t->numel * sizeof(float));
      continue;
    }
    size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1;
    int C = f.sub.C;
    for (size_t c = 0; c < cols; c++) {
      float col[64], back[64];
      for (int r = 0; r < C; r++) col[r] = gp[t->offset + r * cols + c];
      float *q = times_u(&f.sub, col, 1);
      subspace_grad_lift(&f.sub, q, 1, back);
      assert_true(max_diff(col, back, (size_t)C) <= 1e-5f * (max_abs(col, (size_t)C) + 1e-6f));
      free(q);
    }
    assert_true(max_diff(gp + t->offset, ga + t->offset, t->numel) > 0.0f); /* it did move something */
  }
  free(gp);
  free(x), free(dy), free(dyp), free(dxa), free(dxb), free(gz), free(ua), free(ub), free(ga), free(gb);
  teardown(&f);
  teardown(&g);
}

static void test_backward_gpt(void **state) {
  (void)state;
  check_backward(MODEL_GPT);
}

static void test_backward_llama(void **state) {
  (void)state;
  check_backward(MODEL_LLAMA);
}

/* What crosses back is U^T g; g - U U^T g goes to the sum, by token and
 * position, and nothing is lost. */
static void test_grad_split(void **state) {
  (void)state;
  fixture f;
  setup(&f, MODEL_GPT, true);
  int C = f.sub.C, V = f.sub.V;
  float *g = tt_randn(f.n, 31, 1.0f), *gz = malloc((size_t)B * T * K * sizeof(float));
  float *back = malloc(f.n * sizeof(float));
  assert_non_null(gz), assert_non_null(back);
  assert_int_equal(subspace_grad_split(&f.sub, g, f.tok, B * T, T, gz), 0);
  float *want_z = times_u(&f.sub, g, B * T);
  assert_true(max_diff(gz, want_z, B * T * K) < 1e-5f);
  subspace_grad_lift(&f.sub, gz, B * T, back);
  size_t tn = ((size_t)V + f.sub.P) * C;
  float *want = calloc(tn, sizeof(float));
  assert_non_null(want);
  for (int r = 0; r < B * T; r++)
    for (int c = 0; c < C; c++) {
      float out = g[r * C + c] - back[r * C + c];
      want[(size_t)f.tok[r] * C + c] += out;
      want[((size_t)V + r % T) * C + c] += out;
    }
  assert_true(max_diff(f.sub.gsum, want, tn) < 1e-5f);
  /* the sum is orthogonal to U */
  float *su = times_u(&f.sub, f.sub.gsum, (size_t)V + f.sub.P);
  assert_true(max_abs(su, ((size_t)V + f.sub.P) * K) < 1e-5f);
  /* a token id out of range is refused, nothing added */
  f.tok[3] = V;
  assert_int_equal(subspace_grad_split(&f.sub, g, f.tok, B * T, T, gz), GW_EINVAL);
  assert_true(max_diff(f.sub.gsum, want, tn) < 1e-5f);
  free(g), free(gz), free(back), free(want_z), free(want), free(su);
  teardown(&f);
}

/* The part of tok_emb (and pos_emb) outside U, minus the table: 0 when the
 * data node's embedding agrees with what every receiver rebuilds. */
static float head_off_table(fixture *f) {
  float *w = tt_read_all(f->head, STAGE_PARAMS);
  const model_tensor *tok = stage_find_tensor(f->head, "tok_emb.weight");
  size_t rows = (size_t)f->sub.V + f->sub.P, n = rows * f->sub.C;
  float *out = malloc(n * sizeof(float));
  assert_non_null(out);
  memcpy(out, w + tok->offset, (size_t)f->sub.V * f->sub.C * sizeof(float));
  if (f->sub.P) {
    const model_tensor *pos = stage_find_tensor(f->head, "pos_emb.weight");
    memcpy(out + (size_t)f->sub.V * f->sub.C, w + pos->offset, (size_t)f->sub.P * f->sub.C * sizeof(float));
  }
  float *z = times_u(&f->sub, out, rows), *back = malloc(n * sizeof(float));
  assert_non_null(back);
  subspace_grad_lift(&f->sub, z, rows, back);
  float worst = 0;
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(out[i] - back[i] - f->sub.table[i]);
    worst = d > worst ? d : worst;
  }
  free(w), free(out), free(z), free(back);
  return worst;
}

/* Through a step of the data node with a full gradient and a table step, its
 * embedding stays table + (its part in U); the table's step is the backend's
 * AdamW on the summed gradient. */
static void check_head(model_arch arch) {
  fixture f;
  setup(&f, arch, true);
  assert_true(head_off_table(&f) < 1e-6f);
  size_t np = stage_n_params(f.head), tn = ((size_t)f.sub.V + f.sub.P) * f.sub.C;
  float *g = tt_randn(np, 41, 0.1f);
  assert_int_equal(stage_write(f.head, STAGE_GRADS, 0, np, g), 0);
  assert_int_equal(subspace_head_pre_step(&f.sub, f.head), 0);
  /* the embedding's gradient is now in U; what left it is in the sum */
  float *g2 = tt_read_all(f.head, STAGE_GRADS);
  const model_tensor *tok = stage_find_tensor(f.head, "tok_emb.weight");
  float *left = times_u(&f.sub, f.sub.gsum, (size_t)f.sub.V);
  assert_true(max_abs(left, (size_t)f.sub.V * K) < 1e-5f);
  for (size_t i = 0; i < (size_t)f.sub.V * f.sub.C; i++)
    assert_true(fabsf(g2[tok->offset + i] + f.sub.gsum[i] - g[tok->offset + i]) < 1e-5f);
  adamw_config opt;
  adamw_defaults(&opt);
  opt.weight_decay = 0.1f;
  assert_int_equal(stage_step(f.head, &opt, 1e-2f, 1.0f), 0);
  assert_int_equal(subspace_head_post_step(&f.sub, f.head), 0);
  assert_true(head_off_table(&f) < 1e-6f);

  /* the table's step against the backend's AdamW kernel */
  float *w = malloc(tn * sizeof(float)), *sum = malloc(tn * sizeof(float));
  float *m = calloc(tn, sizeof(float)), *v = calloc(tn, sizeof(float));
  assert_non_null(w), assert_non_null(sum), assert_non_null(m), assert_non_null(v);
  memcpy(w, f.sub.w, tn * sizeof(float));
  memcpy(sum, f.sub.gsum, tn * sizeof(float));
  gpu_adamw_args a = {0.03f, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, 0.25f, 1};
  gpu_adamw_update(f.be, w, sum, m, v, tn, &a);
  long long version = f.sub.version;
  subspace_table_step(&f.sub, &opt, 0.03f, 0.25f);
  assert_int_equal(f.sub.version, version + 1);
  assert_true(max_diff(w, f.sub.w, tn) < 1e-6f);
  assert_true(max_abs(f.sub.gsum, tn) == 0.0f);
  float *tu = times_u(&f.sub, f.sub.table, (size_t)f.sub.V + f.sub.P);
  assert_true(max_abs(tu, ((size_t)f.sub.V + f.sub.P) * K) < 1e-5f);
  assert_true(head_off_table(&f) > 1e-4f); /* the table moved; the head follows at its post-step */
  assert_int_equal(subspace_head_post_step(&f.sub, f.head), 0);
  assert_true(head_off_table(&f) < 1e-6f);
  free(g), free(g2), free(left), free(w), free(sum), free(m), free(v), free(tu);
  teardown(&f);
}

static void test_head_gpt(void **state) {
  (void)state;
  check_head(MODEL_GPT);
}

static void test_head_llama(void **state) {
  (void)state;
  check_head(MODEL_LLAMA);
}

static void test_init_refuses(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  model_config m = tt_model(MODEL_GPT, 1);
  stage_spec hs = tt_spec(m, 0, 0, true, B, T, 1), bs = tt_spec(m, 0, 1, false, B, T, 1);
  stage *head = tt_stage(&hs, be, 3), *blocks = tt_stage(&bs, be, 3);
  subspace s;
  char err[256] = "";
  assert_int_equal(subspace_init(&s, &m, m.d_model, 10, 1, B * T, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "rank"));
  assert_int_equal(subspace_init(&s, &m, 0, 10, 1, B * T, err, sizeof(err)), GW_EINVAL);
  assert_int_equal(subspace_init(&s, &m, K, -1, 1, B * T, err, sizeof(err)), GW_EINVAL);
  /* a fixed table (refresh 0) never steps and keeps no sums */
  assert_int_equal(subspace_init(&s, &m, K, 0, 1, B * T, err, sizeof(err)), 0);
  assert_false(subspace_table_due(&s, 9));
  float *g0 = tt_randn((size_t)B * T * m.d_model, 3, 1.0f), *z0 = malloc((size_t)B * T * K * sizeof(float));
  int32_t *tok0 = tt_tokens((size_t)B * T, m.vocab_size, 4);
  assert_non_null(z0);
  assert_int_equal(subspace_grad_split(&s, g0, tok0, B * T, T, z0), 0);
  assert_null(s.gsum);
  assert_null(s.w);
  free(g0), free(z0), free(tok0);
  subspace_free(&s);
  /* more rows than it was set up for, a position past the table */
  assert_int_equal(subspace_init(&s, &m, K, 10, 1, B * T, err, sizeof(err)), 0);
  float *x = tt_randn((size_t)4 * B * T * m.d_model, 1, 1.0f), *z = malloc((size_t)4 * B * T * K * sizeof(float));
  int32_t *tok = tt_tokens((size_t)4 * B * T, m.vocab_size, 2);
  assert_non_null(z);
  assert_int_equal(subspace_encode(&s, x, tok, (size_t)4 * B * T, T, z), GW_ERANGE);
  assert_int_equal(subspace_encode(&s, x, tok, B * T, m.max_seq_len + 1, z), GW_ERANGE);
  assert_true(!subspace_table_due(&s, 8) && subspace_table_due(&s, 9) && subspace_table_due(&s, 19));
  free(x), free(z), free(tok);
  subspace_free(&s);
  stage_destroy(head);
  stage_destroy(blocks);
  gpu_backend_close(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),        cmocka_unit_test(test_basis),         cmocka_unit_test(test_rebuild_gpt),
      cmocka_unit_test(test_rebuild_llama), cmocka_unit_test(test_backward_gpt), cmocka_unit_test(test_backward_llama),
      cmocka_unit_test(test_grad_split),   cmocka_unit_test(test_head_gpt),      cmocka_unit_test(test_head_llama),
      cmocka_unit_test(test_init_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
