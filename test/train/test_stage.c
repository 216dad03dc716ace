/* test/train/test_stage.c — the stage API: determinism, pipeline splits,
 * microbatch slots, crash recovery, state, checkpoints. */
#include "train_testutil.h"

#include <math.h>

#include "train/checkpoint.h"
#include "util/err.h"
#include "util/file.h"

#define B (2)
#define T (5)

typedef struct run_out {
  float *y, *dx, *grads;
} run_out;

static void run_free(run_out *r) {
  free(r->y), free(r->dx), free(r->grads);
}

/* forward + backward of one microbatch; returns y, dx and all gradients. */
static run_out run_once(stage *st, uint64_t mb, const float *x, const float *dy) {
  size_t n = (size_t)B * T * stage_get_spec(st)->model.d_model;
  run_out r = {malloc(n * sizeof(float)), malloc(n * sizeof(float)), NULL};
  assert_int_equal(stage_forward(st, mb, x, r.y), 0);
  assert_int_equal(stage_backward(st, mb, dy, r.dx), 0);
  r.grads = tt_read_all(st, STAGE_GRADS);
  return r;
}

static void check_repeat(model_arch arch) {
  gpu_backend *be = tt_cpu(2);
  stage_spec s = tt_spec(tt_model(arch, 3), 0, 3, false, B, T, 2);
  size_t n = (size_t)B * T * s.model.d_model;
  float *x = tt_randn(n, 1, 1.0f), *dy = tt_randn(n, 2, 1.0f);
  stage *a = tt_stage(&s, be, 7), *b = tt_stage(&s, be, 7);
  run_out ra = run_once(a, 1, x, dy), rb = run_once(b, 1, x, dy);
  size_t np = stage_n_params(a);
  assert_memory_equal(ra.y, rb.y, n * sizeof(float));
  assert_memory_equal(ra.dx, rb.dx, n * sizeof(float));
  assert_memory_equal(ra.grads, rb.grads, np * sizeof(float));
  /* Again in the same stage, after release and zeroing. */
  assert_int_equal(stage_release(a, 1), 0);
  assert_int_equal(stage_zero_grads(a), 0);
  run_out rc = run_once(a, 9, x, dy);
  assert_memory_equal(ra.y, rc.y, n * sizeof(float));
  assert_memory_equal(ra.dx, rc.dx, n * sizeof(float));
  assert_memory_equal(ra.grads, rc.grads, np * sizeof(float));
  /* A second microbatch accumulates: grads double (exactly, x + x). */
  assert_int_equal(stage_forward(a, 10, x, NULL), 0);
  assert_int_equal(stage_backward(a, 10, dy, NULL), 0);
  float *g2 = tt_read_all(a, STAGE_GRADS);
  for (size_t i = 0; i < np; i++) assert_true(g2[i] == 2.0f * ra.grads[i]);
  free(g2);
  run_free(&ra), run_free(&rb), run_free(&rc);
  free(x), free(dy);
  stage_destroy(a), stage_destroy(b);
  gpu_backend_close(be);
}

static void test_repeat_gpt(void **state) {
  (void)state;
  check_repeat(MODEL_GPT);
}

static void test_repeat_llama(void **state) {
  (void)state;
  check_repeat(MODEL_LLAMA);
}

/* The row reductions are fixed-chunk and sgemm never splits K, so the
 * result does not depend on the thread count either. */
static void test_threads_identical(void **state) {
  (void)state;
  gpu_backend *b1 = tt_cpu(1), *b3 = tt_cpu(3);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 2), 0, 2, false, B, 37, 1);
  s.model.max_seq_len = 40;
  size_t n = (size_t)B * 37 * s.model.d_model;
  float *x = tt_randn(n, 3, 1.0f), *dy = tt_randn(n, 4, 1.0f);
  stage *a = tt_stage(&s, b1, 5), *c = tt_stage(&s, b3, 5);
  float *ya = malloc(n * sizeof(float)), *yc = malloc(n * sizeof(float));
  assert_int_equal(stage_forward(a, 1, x, ya), 0);
  assert_int_equal(stage_forward(c, 1, x, yc), 0);
  assert_memory_equal(ya, yc, n * sizeof(float));
  assert_int_equal(stage_backward(a, 1, dy, ya), 0);
  assert_int_equal(stage_backward(c, 1, dy, yc), 0);
  assert_memory_equal(ya, yc, n * sizeof(float));
  float *ga = tt_read_all(a, STAGE_GRADS), *gc = tt_read_all(c, STAGE_GRADS);
  assert_memory_equal(ga, gc, stage_n_params(a) * sizeof(float));
  free(x), free(dy), free(ya), free(yc), free(ga), free(gc);
  stage_destroy(a), stage_destroy(c);
  gpu_backend_close(b1), gpu_backend_close(b3);
}

/* Blocks [0,4) in one stage equal blocks [0,2) then [2,4) in two stages:
 * same weights (init depends on names only), same activations, same
 * gradients, bit for bit. */
static void check_split(model_arch arch) {
  gpu_backend *be = tt_cpu(2);
  model_config m = tt_model(arch, 4);
  stage_spec whole = tt_spec(m, 0, 4, false, B, T, 1), lo = tt_spec(m, 0, 2, false, B, T, 1),
             hi = tt_spec(m, 2, 2, false, B, T, 1);
  stage *w = tt_stage(&whole, be, 11), *a = tt_stage(&lo, be, 11), *b = tt_stage(&hi, be, 11);
  size_t n = (size_t)B * T * m.d_model;
  float *x = tt_randn(n, 1, 1.0f), *dy = tt_randn(n, 2, 1.0f);
  float *yw = malloc(n * 4), *ya = malloc(n * 4), *yb = malloc(n * 4), *dxw = malloc(n * 4),
        *dxa = malloc(n * 4), *dxb = malloc(n * 4);
  assert_int_equal(stage_forward(w, 1, x, yw), 0);
  assert_int_equal(stage_forward(a, 1, x, ya), 0);
  assert_int_equal(stage_forward(b, 1, ya, yb), 0);
  assert_memory_equal(yw, yb, n * 4);
  assert_int_equal(stage_backward(w, 1, dy, dxw), 0);
  assert_int_equal(stage_backward(b, 1, dy, dxb), 0);
  assert_int_equal(stage_backward(a, 1, dxb, dxa), 0);
  assert_memory_equal(dxw, dxa, n * 4);
  for (int i = 0; i < stage_n_tensors(w); i++) {
    const model_tensor *tw = stage_tensor(w, i);
    stage *part = stage_find_tensor(a, tw->name) ? a : b;
    const model_tensor *tp = stage_find_tensor(part, tw->name);
    assert_non_null(tp);
    float *gw = malloc(tw->numel * 4), *gp = malloc(tw->numel * 4);
    assert_int_equal(stage_read(w, STAGE_GRADS, tw->offset, tw->numel, gw), 0);
    assert_int_equal(stage_read(part, STAGE_GRADS, tp->offset, tp->numel, gp), 0);
    assert_memory_equal(gw, gp, tw->numel * 4);
    free(gw), free(gp);
  }
  free(x), free(dy), free(yw), free(ya), free(yb), free(dxw), free(dxa), free(dxb);
  stage_destroy(w), stage_destroy(a), stage_destroy(b);
  gpu_backend_close(be);
}

static void test_split_gpt(void **state) {
  (void)state;
  check_split(MODEL_GPT);
}

static void test_split_llama(void **state) {
  (void)state;
  check_split(MODEL_LLAMA);
}

static void test_slots(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 1), 0, 1, false, B, T, 2);
  stage *st = tt_stage(&s, be, 1);
  size_t n = (size_t)B * T * s.model.d_model;
  float *x = tt_randn(n, 1, 1.0f), *y = malloc(n * 4), *y2 = malloc(n * 4);
  assert_int_equal(stage_forward(st, 100, x, y), 0);
  assert_int_equal(stage_forward(st, 100, x, y), GW_EEXIST);
  assert_int_equal(stage_forward(st, 200, x, NULL), 0);
  assert_int_equal(stage_in_flight(st), 2);
  assert_int_equal(stage_forward(st, 300, x, NULL), GW_EFULL);
  assert_int_equal(stage_backward(st, 300, x, NULL), GW_ENOENT);
  assert_int_equal(stage_release(st, 300), GW_ENOENT);
  /* The stored output can be fetched again (re-send after a crash). */
  assert_int_equal(stage_saved_output(st, 100, y2), 0);
  assert_memory_equal(y, y2, n * 4);
  assert_int_equal(stage_release(st, 100), 0);
  assert_int_equal(stage_in_flight(st), 1);
  assert_int_equal(stage_saved_output(st, 100, y2), GW_ENOENT);
  assert_int_equal(stage_forward(st, 300, x, NULL), 0);
  /* A relay has no data-node part. */
  int32_t tok[B * T] = {0};
  float loss;
  assert_int_equal(stage_embed_forward(st, 400, tok, y), GW_EINVAL);
  assert_int_equal(stage_loss(st, x, tok, &loss, y), GW_EINVAL);
  free(x), free(y), free(y2);
  stage_destroy(st);
  gpu_backend_close(be);
}

/* A replacement peer recomputes one microbatch from the stored input and
 * gradient and gets exactly what the dead peer would have produced. */
static void test_recompute(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(2);
  stage_spec s = tt_spec(tt_model(MODEL_LLAMA, 2), 0, 2, false, B, T, 1);
  stage *dead = tt_stage(&s, be, 3), *repl = tt_stage(&s, be, 3);
  size_t n = (size_t)B * T * s.model.d_model;
  float *x = tt_randn(n, 1, 1.0f), *dy = tt_randn(n, 2, 1.0f), *dx1 = malloc(n * 4), *dx2 = malloc(n * 4);
  assert_int_equal(stage_forward(dead, 5, x, NULL), 0);
  assert_int_equal(stage_backward(dead, 5, dy, dx1), 0);
  assert_int_equal(stage_recompute(repl, 5, x, dy, dx2), 0);
  assert_memory_equal(dx1, dx2, n * 4);
  float *g1 = tt_read_all(dead, STAGE_GRADS), *g2 = tt_read_all(repl, STAGE_GRADS);
  assert_memory_equal(g1, g2, stage_n_params(dead) * 4);
  free(x), free(dy), free(dx1), free(dx2), free(g1), free(g2);
  stage_destroy(dead), stage_destroy(repl);
  gpu_backend_close(be);
}

static void test_bad_tokens(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  model_config m = tt_model(MODEL_GPT, 1);
  stage_spec s = tt_spec(m, 0, 0, true, B, T, 1);
  stage *st = tt_stage(&s, be, 1);
  size_t n = (size_t)B * T * m.d_model;
  int32_t *tok = tt_tokens(B * T, m.vocab_size, 1);
  float *x = malloc(n * 4), loss;
  tok[3] = m.vocab_size;
  assert_int_equal(stage_embed_forward(st, 1, tok, x), GW_EINVAL);
  tok[3] = -1;
  assert_int_equal(stage_loss(st, x, tok, &loss, x), GW_EINVAL);
  assert_int_equal(stage_in_flight(st), 0);
  tok[3] = 0;
  assert_int_equal(stage_embed_forward(st, 1, tok, x), 0);
  assert_int_equal(stage_forward(st, 1, x, x), GW_EINVAL); /* no blocks */
  free(tok), free(x);
  stage_destroy(st);
  gpu_backend_close(be);
}

/* A data node trains one step so that moments and step are non-zero. */
static stage *trained_head(gpu_backend *be, uint64_t seed) {
  model_config m = tt_model(MODEL_LLAMA, 2);
  stage_spec s = tt_spec(m, 0, 1, true, B, T, 1);
  stage *st = tt_stage(&s, be, seed);
  size_t n = (size_t)B * T * m.d_model;
  int32_t *tok = tt_tokens(B * T, m.vocab_size, 2);
  float *x = malloc(n * 4), *y = malloc(n * 4), loss;
  adamw_config cfg;
  adamw_defaults(&cfg);
  for (int step = 0; step < 2; step++) {
    assert_int_equal(stage_embed_forward(st, 1, tok, x), 0);
    assert_int_equal(stage_forward(st, 1, x, y), 0);
    assert_int_equal(stage_loss(st, y, tok, &loss, y), 0);
    assert_int_equal(stage_backward(st, 1, y, x), 0);
    assert_int_equal(stage_embed_backward(st, 1, x), 0);
    assert_int_equal(stage_release(st, 1), 0);
    assert_int_equal(stage_step(st, &cfg, 1e-2f, 1.0f), 0);
    assert_int_equal(stage_zero_grads(st), 0);
  }
  free(tok), free(x), free(y);
  return st;
}

/* Validation's loss: bit for bit stage_loss's, and nothing moves — no
 * gradient accumulates, no parameter changes, nothing is kept. */
static void test_loss_eval(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(2);
  for (int arch = 0; arch < 2; arch++) {
    model_config m = tt_model(arch ? MODEL_LLAMA : MODEL_GPT, 2);
    stage_spec s = tt_spec(m, 0, 1, true, B, T, 2);
    stage *st = tt_stage(&s, be, 5);
    size_t n = (size_t)B * T * m.d_model, np = stage_n_params(st);
    int32_t *tok = tt_tokens(B * T, m.vocab_size, 4);
    float *y = tt_randn(n, 6, 1.0f), *dy = malloc(n * 4), le = 0, lt = 0;
    float *p0 = tt_read_all(st, STAGE_PARAMS), *g0 = tt_read_all(st, STAGE_GRADS);
    uint8_t h0[STAGE_HASH_BYTES], h1[STAGE_HASH_BYTES];
    assert_int_equal(stage_weight_hash(st, h0), 0);
    assert_int_equal(stage_loss_eval(st, y, tok, &le), 0);
    float *p1 = tt_read_all(st, STAGE_PARAMS), *g1 = tt_read_all(st, STAGE_GRADS);
    assert_memory_equal(p0, p1, np * 4);
    assert_memory_equal(g0, g1, np * 4);
    assert_int_equal(stage_weight_hash(st, h1), 0);
    assert_memory_equal(h0, h1, sizeof(h0));
    assert_int_equal(stage_in_flight(st), 0);
    assert_int_equal(stage_loss(st, y, tok, &lt, dy), 0);
    assert_memory_equal(&le, &lt, sizeof(float));
    float *g2 = tt_read_all(st, STAGE_GRADS);
    assert_memory_not_equal(g0, g2, np * 4); /* the training loss does accumulate */
    tok[0] = -1;
    assert_int_equal(stage_loss_eval(st, y, tok, &le), GW_EINVAL);
    free(tok), free(y), free(dy), free(p0), free(p1), free(g0), free(g1), free(g2);
    stage_destroy(st);
  }
  gpu_backend_close(be);
}

static void assert_same_state(stage *a, stage *b) {
  for (stage_buf w = STAGE_PARAMS; w <= STAGE_ADAM_V; w++) {
    if (w == STAGE_GRADS) continue;
    float *pa = tt_read_all(a, w), *pb = tt_read_all(b, w);
    assert_memory_equal(pa, pb, stage_n_params(a) * 4);
    free(pa), free(pb);
  }
  assert_int_equal(stage_step_count(a), stage_step_count(b));
  uint8_t ha[STAGE_HASH_BYTES], hb[STAGE_HASH_BYTES];
  assert_int_equal(stage_weight_hash(a, ha), 0);
  assert_int_equal(stage_weight_hash(b, hb), 0);
  assert_memory_equal(ha, hb, sizeof(ha));
}

static void test_checkpoint(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(2);
  char *dir = testutil_tmpdir(), path[600], bad[600];
  snprintf(path, sizeof(path), "%s/stage.safetensors", dir);
  snprintf(bad, sizeof(bad), "%s/bad.safetensors", dir);
  stage *a = trained_head(be, 1), *b = tt_stage(stage_get_spec(a), be, 99);
  assert_int_equal(ckpt_save(a, path), 0);
  char err[256] = "";
  assert_int_equal(ckpt_load(b, path, err, sizeof(err)), 0);
  assert_same_state(a, b);
  long long step = -1;
  assert_int_equal(ckpt_step(path, &step, err, sizeof(err)), 0);
  assert_int_equal(step, 2);
  /* Same outputs after load. */
  size_t n = (size_t)B * T * 12;
  float *x = tt_randn(n, 5, 1.0f), *ya = malloc(n * 4), *yb = malloc(n * 4);
  assert_int_equal(stage_forward(a, 1, x, ya), 0);
  assert_int_equal(stage_forward(b, 1, x, yb), 0);
  assert_memory_equal(ya, yb, n * 4);

  /* A checkpoint of other layers is refused and changes nothing. */
  stage_spec other = *stage_get_spec(a);
  other.first_layer = 1;
  stage *c = tt_stage(&other, be, 4);
  uint8_t before[STAGE_HASH_BYTES], after[STAGE_HASH_BYTES];
  assert_int_equal(stage_weight_hash(c, before), 0);
  assert_int_equal(ckpt_load(c, path, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "first_layer"));
  assert_int_equal(stage_weight_hash(c, after), 0);
  assert_memory_equal(before, after, sizeof(before));

  /* A truncated checkpoint is refused too. */
  uint8_t *buf;
  size_t len;
  assert_int_equal(gw_file_read_all(path, 1 << 26, &buf, &len), 0);
  assert_int_equal(gw_file_write_atomic1(bad, buf, len - 4, 0644), 0);
  assert_int_equal(ckpt_load(b, bad, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "outside"));
  assert_int_equal(ckpt_step(bad, &step, err, sizeof(err)), GW_EINVAL);
  /* One whose tensor has the wrong shape: a different model config. */
  stage_spec wide = *stage_get_spec(a);
  wide.model.d_ff = 24;
  stage *d = tt_stage(&wide, be, 4);
  assert_int_equal(ckpt_load(d, path, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "d_ff"));
  free(buf), free(x), free(ya), free(yb);
  stage_destroy(a), stage_destroy(b), stage_destroy(c), stage_destroy(d);
  testutil_rmtree(dir);
  free(dir);
  gpu_backend_close(be);
}

/* The state read in odd-sized chunks equals the state read at once and
 * loads into a fresh stage (a joining peer's download). */
static void test_state_stream(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage *a = trained_head(be, 3), *b = tt_stage(stage_get_spec(a), be, 8);
  size_t len;
  assert_int_equal(stage_state_size(a, &len), 0);
  uint8_t *whole = malloc(len), *chunks = malloc(len);
  assert_int_equal(stage_state_read(a, 0, whole, len), 0);
  for (size_t off = 0; off < len; off += 777) {
    size_t k = len - off < 777 ? len - off : 777;
    assert_int_equal(stage_state_read(a, off, chunks + off, k), 0);
  }
  assert_memory_equal(whole, chunks, len);
  assert_int_equal(stage_state_read(a, len - 1, chunks, 2), GW_ERANGE);
  char err[256];
  assert_int_equal(stage_state_load(b, chunks, len, err, sizeof(err)), 0);
  assert_same_state(a, b);
  free(whole), free(chunks);
  stage_destroy(a), stage_destroy(b);
  gpu_backend_close(be);
}

static void test_step_and_hash(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 1), 0, 1, false, B, T, 1);
  stage *st = tt_stage(&s, be, 1);
  size_t n = (size_t)B * T * s.model.d_model, np = stage_n_params(st);
  float *x = tt_randn(n, 1, 1.0f);
  uint8_t h0[STAGE_HASH_BYTES], h1[STAGE_HASH_BYTES];
  assert_int_equal(stage_weight_hash(st, h0), 0);
  assert_int_equal(stage_forward(st, 1, x, NULL), 0);
  assert_int_equal(stage_backward(st, 1, x, NULL), 0);
  adamw_config cfg;
  adamw_defaults(&cfg);
  assert_int_equal(stage_step(st, &cfg, 1e-3f, 0.5f), 0);
  assert_int_equal(stage_step_count(st), 1);
  assert_int_equal(stage_weight_hash(st, h1), 0);
  assert_memory_not_equal(h0, h1, sizeof(h0));
  assert_int_equal(stage_zero_grads(st), 0);
  float *g = tt_read_all(st, STAGE_GRADS);
  for (size_t i = 0; i < np; i++) assert_true(g[i] == 0.0f);
  /* Range checks of the flat accessors. */
  assert_int_equal(stage_read(st, STAGE_PARAMS, np, 1, g), GW_ERANGE);
  assert_int_equal(stage_write(st, STAGE_ADAM_M, np - 1, 2, g), GW_ERANGE);
  assert_int_equal(stage_read(st, STAGE_PARAMS, np - 1, 1, g), 0);
  free(g), free(x);
  stage_destroy(st);
  gpu_backend_close(be);
}

/* One step of a fresh stage (seed 1) with gradient g written in, scale
 * `scale` and grad_clip `clip`; returns its parameters. */
static float *step_with(gpu_backend *be, const stage_spec *s, const float *g, float scale, float clip) {
  stage *st = tt_stage(s, be, 1);
  size_t np = stage_n_params(st);
  assert_int_equal(stage_write(st, STAGE_GRADS, 0, np, g), 0);
  adamw_config cfg;
  adamw_defaults(&cfg);
  cfg.grad_clip = clip;
  assert_int_equal(stage_step(st, &cfg, 1e-2f, scale), 0);
  float *p = tt_read_all(st, STAGE_PARAMS);
  stage_destroy(st);
  return p;
}

/* grad_clip: a gradient whose norm (times the step's scale) is above the
 * bound steps as that gradient scaled down to the bound; one below it
 * steps exactly as without clipping. */
static void test_grad_clip(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 1), 0, 1, false, B, T, 1);
  stage *probe = tt_stage(&s, be, 1);
  size_t np = stage_n_params(probe);
  stage_destroy(probe);
  float *g = tt_randn(np, 9, 1.0f), *scaled = malloc(np * sizeof(float));
  double ss = 0;
  for (size_t i = 0; i < np; i++) ss += (double)g[i] * g[i];
  double norm = sqrt(ss) * 0.5; /* the step's scale is 0.5 */
  float clip = (float)(norm / 4);
  for (size_t i = 0; i < np; i++) scaled[i] = (float)(g[i] * 0.5 * clip / norm);
  float *a = step_with(be, &s, g, 0.5f, clip), *b = step_with(be, &s, scaled, 1.0f, 0), *c = step_with(be, &s, g, 0.5f, 0);
  size_t moved = 0;
  for (size_t i = 0; i < np; i++) {
    assert_true(fabsf(a[i] - b[i]) <= 1e-6f * fmaxf(1.0f, fabsf(b[i])));
    moved += a[i] != c[i];
  }
  assert_true(moved > np / 2); /* clipping changed the step */
  float *d = step_with(be, &s, g, 0.5f, (float)(norm * 2)); /* a bound above the norm: no change */
  assert_memory_equal(d, c, np * sizeof(float));
  adamw_config bad;
  adamw_defaults(&bad);
  bad.grad_clip = -1;
  assert_int_equal(adamw_validate(&bad, NULL, 0), GW_EINVAL);
  free(g), free(scaled), free(a), free(b), free(c), free(d);
  gpu_backend_close(be);
}

static void test_memory(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  stage_spec s = tt_spec(tt_model(MODEL_GPT, 4), 0, 2, false, 4, 8, 1);
  stage_memory m;
  assert_int_equal(stage_memory_estimate(&s, be, &m), 0);
  assert_int_equal(m.state_bytes, 4 * 2 * model_block_numel(&s.model) * sizeof(float));
  assert_true(m.per_mb_bytes > 0 && m.workspace_bytes > 0);
  size_t fixed = m.state_bytes + m.workspace_bytes;
  assert_int_equal(stage_capacity_for(&s, be, fixed / 2), 0);
  assert_int_equal(stage_capacity_for(&s, be, fixed + 3 * m.per_mb_bytes), 3);
  assert_int_equal(stage_capacity_for(&s, be, fixed + 3 * m.per_mb_bytes - 1), 2);
  /* Twice the batch: about twice the activations. */
  stage_spec s2 = s;
  s2.batch = 8;
  stage_memory m2;
  assert_int_equal(stage_memory_estimate(&s2, be, &m2), 0);
  assert_true(m2.per_mb_bytes > 19 * m.per_mb_bytes / 10 && m2.per_mb_bytes <= 2 * m.per_mb_bytes + 64 * 40);
  gpu_backend_close(be);
}

/* Peers of a stage step the same averaged gradients and must stay bit-
 * identical, on whatever CPU: AdamW is element-wise without FMA
 * contraction, so both kernel builds agree exactly. */
static void test_adamw_same_on_every_cpu(void **state) {
  (void)state;
  gpu_backend *base = tt_cpu_kernels(1, GPU_CPU_KERNELS_BASELINE), *v3 = tt_cpu_kernels(2, GPU_CPU_KERNELS_V3);
  if (!v3) {
    gpu_backend_close(base);
    skip();
  }
  size_t n = 10007;
  float *p[2], *m[2], *v[2], *g = tt_randn(n, 1, 1.0f);
  gpu_adamw_args a = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.25f, 7};
  for (int k = 0; k < 2; k++) {
    p[k] = tt_randn(n, 2, 1.0f), m[k] = tt_randn(n, 3, 0.1f), v[k] = tt_randn(n, 4, 0.1f);
    for (size_t i = 0; i < n; i++) v[k][i] *= v[k][i];
    gpu_adamw_update(k ? v3 : base, p[k], g, m[k], v[k], n, &a);
  }
  assert_memory_equal(p[0], p[1], n * 4);
  assert_memory_equal(m[0], m[1], n * 4);
  assert_memory_equal(v[0], v[1], n * 4);
  for (int k = 0; k < 2; k++) free(p[k]), free(m[k]), free(v[k]);
  free(g);
  gpu_backend_close(base), gpu_backend_close(v3);
}

static void test_spec_validation(void **state) {
  (void)state;
  char err[256];
  model_config m = tt_model(MODEL_GPT, 4);
  stage_spec s = tt_spec(m, 3, 2, false, B, T, 1);
  assert_int_equal(stage_spec_validate(&s, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "not within the model's 4 layers"));
  s = tt_spec(m, 0, 0, false, B, T, 1);
  assert_int_equal(stage_spec_validate(&s, err, sizeof(err)), GW_EINVAL);
  s = tt_spec(m, 0, 1, false, B, m.max_seq_len + 1, 1);
  assert_int_equal(stage_spec_validate(&s, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "seq_len"));
  s = tt_spec(m, 0, 1, false, B, T, 0);
  assert_int_equal(stage_spec_validate(&s, err, sizeof(err)), GW_EINVAL);
  s = tt_spec(m, 0, 1, true, B, T, 1);
  assert_int_equal(stage_spec_validate(&s, err, sizeof(err)), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_repeat_gpt),      cmocka_unit_test(test_repeat_llama),
      cmocka_unit_test(test_threads_identical), cmocka_unit_test(test_split_gpt),
      cmocka_unit_test(test_split_llama),     cmocka_unit_test(test_slots),
      cmocka_unit_test(test_recompute),       cmocka_unit_test(test_bad_tokens),
      cmocka_unit_test(test_loss_eval),
      cmocka_unit_test(test_checkpoint),      cmocka_unit_test(test_state_stream),
      cmocka_unit_test(test_step_and_hash),   cmocka_unit_test(test_grad_clip), cmocka_unit_test(test_memory),
      cmocka_unit_test(test_adamw_same_on_every_cpu), cmocka_unit_test(test_spec_validation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
