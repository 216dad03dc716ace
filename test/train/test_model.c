/* test/train/test_model.c — model configs, presets, tensor layout, init,
 * the learning-rate schedule. */
#include "testutil.h"

#include <math.h>

#include "train/adamw.h"
#include "train/model.h"
#include "util/err.h"

static void test_presets(void **state) {
  (void)state;
  size_t n;
  const model_preset *p = model_presets(&n);
  assert_true(n >= 4);
  char err[256];
  for (size_t i = 0; i < n; i++) {
    if (model_config_validate(&p[i].cfg, err, sizeof(err)) != 0) fail_msg("%s: %s", p[i].name, err);
  }
  model_config c;
  assert_int_equal(model_preset_get("tiny", &c), 0);
  assert_int_equal(c.vocab_size, 256);
  assert_true(model_total_params(&c) < 2000000);
  assert_int_equal(model_preset_get("paper-llama", &c), 0);
  assert_int_equal(c.arch, MODEL_LLAMA);
  assert_int_equal(c.d_model, 1024);
  assert_int_equal(c.n_layers, 16);
  assert_int_equal(c.n_heads, 16);
  /* issue 20: GPT-2 small exactly (124,439,808 params, tied head), its old
   * name still works, and a LLaMA of the same shape near 160M. */
  assert_int_equal(model_preset_get("gpt2-small", &c), 0);
  assert_int_equal(c.arch, MODEL_GPT);
  assert_int_equal(c.d_model, 768);
  assert_int_equal(c.n_layers, 12);
  assert_int_equal(model_total_params(&c), 124439808);
  model_config old;
  assert_int_equal(model_preset_get("gpt2-124m", &old), 0);
  assert_memory_equal(&old, &c, sizeof(c));
  assert_int_equal(model_preset_get("llama-160m", &c), 0);
  assert_int_equal(c.arch, MODEL_LLAMA);
  assert_int_equal(c.d_model, 768);
  assert_int_equal(c.n_layers, 12);
  assert_true(model_total_params(&c) > 155000000 && model_total_params(&c) < 165000000);
  assert_int_equal(model_preset_get("nope", &c), GW_ENOENT);
}

static void test_validate(void **state) {
  (void)state;
  model_config c;
  char err[256];
  assert_int_equal(model_preset_get("tiny", &c), 0);
  c.n_heads = 18; /* the paper's heads with d_model 128 */
  assert_int_equal(model_config_validate(&c, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "not divisible"));
  assert_int_equal(model_preset_get("tiny-llama", &c), 0);
  c.n_heads = 64; /* head_dim 2: fine */
  assert_int_equal(model_config_validate(&c, err, sizeof(err)), 0);
  c.n_heads = 128; /* head_dim 1: odd, no RoPE pairs */
  assert_int_equal(model_config_validate(&c, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "even head_dim"));
  assert_int_equal(model_preset_get("tiny", &c), 0);
  c.d_model = 0;
  assert_int_equal(model_config_validate(&c, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "d_model"));
}

static void test_json(void **state) {
  (void)state;
  model_config c, d;
  char err[256];
  assert_int_equal(model_preset_get("tiny-llama", &c), 0);
  char *js = model_config_to_json(&c);
  assert_non_null(js);
  assert_int_equal(model_preset_get("tiny", &d), 0);
  assert_int_equal(model_config_from_json(js, strlen(js), &d, err, sizeof(err)), 0);
  assert_memory_equal(&c, &d, sizeof(c));
  free(js);
  /* A partial object overrides only its fields. */
  const char *part = "{\"n_layers\": 2, \"d_ff\": 100}";
  assert_int_equal(model_config_from_json(part, strlen(part), &d, err, sizeof(err)), 0);
  assert_int_equal(d.n_layers, 2);
  assert_int_equal(d.d_ff, 100);
  assert_int_equal(d.d_model, c.d_model);
  const char *bad[] = {"[1]", "{\"arch\": \"rnn\"}", "{\"d_model\": -4}", "{\"eps\": \"x\"}",
                       "{\"n_heads\": 5}", "{\"d_model\": 1, \"d_model\": 2}", "{"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    model_config e = c;
    assert_int_equal(model_config_from_json(bad[i], strlen(bad[i]), &e, err, sizeof(err)), GW_EINVAL);
    assert_memory_equal(&e, &c, sizeof(c)); /* unchanged on error */
  }
}

static void test_layout(void **state) {
  (void)state;
  model_config g, l;
  assert_int_equal(model_preset_get("tiny", &g), 0);
  assert_int_equal(model_preset_get("tiny-llama", &l), 0);
  size_t C = 128, Fg = g.d_ff, Fl = l.d_ff;
  assert_int_equal(model_block_numel(&g), 4 * C * C + 2 * C * Fg + 9 * C + Fg);
  assert_int_equal(model_block_numel(&l), 4 * C * C + 3 * C * Fl + 2 * C);
  model_tensor t[MODEL_BLOCK_TENSORS_MAX];
  int n = model_block_tensors(&l, 3, t);
  assert_int_equal(n, 9);
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    assert_int_equal(t[i].offset, off); /* back to back */
    assert_int_equal(strncmp(t[i].name, "blocks.3.", 9), 0);
    off += t[i].numel;
  }
  /* q, k, v form one (3C, C) matrix; gate and up one (2F, C). */
  assert_string_equal(t[1].name, "blocks.3.attn.q.weight");
  assert_int_equal(t[2].offset, t[1].offset + C * C);
  assert_int_equal(t[3].offset, t[1].offset + 2 * C * C);
  assert_string_equal(t[7].name, "blocks.3.mlp.up.weight");
  assert_int_equal(t[7].offset, t[6].offset + Fl * C);
  /* Decay on matrices only. */
  assert_false(t[0].weight_decay);
  assert_true(t[1].weight_decay);
  model_tensor h[MODEL_HEAD_TENSORS_MAX];
  assert_int_equal(model_head_tensors(&g, h), 4);
  assert_string_equal(h[1].name, "pos_emb.weight");
  assert_false(h[0].weight_decay);
  assert_int_equal(model_head_tensors(&l, h), 3);
  assert_string_equal(h[2].name, "lm_head.weight");
  assert_true(h[2].weight_decay);
}

static void test_init(void **state) {
  (void)state;
  model_config c;
  assert_int_equal(model_preset_get("tiny", &c), 0);
  model_tensor t[MODEL_BLOCK_TENSORS_MAX];
  model_block_tensors(&c, 1, t);
  const model_tensor *qkv = &t[2], *proj = &t[4], *ln = &t[0], *bias = &t[1];
  float *a = malloc(qkv->numel * 4), *b = malloc(qkv->numel * 4);
  model_init_tensor(qkv, 42, a);
  model_init_tensor(qkv, 42, b);
  assert_memory_equal(a, b, qkv->numel * 4);
  model_init_tensor(qkv, 43, b);
  assert_memory_not_equal(a, b, qkv->numel * 4);
  double ss = 0;
  for (size_t i = 0; i < qkv->numel; i++) ss += (double)a[i] * a[i];
  double std = sqrt(ss / qkv->numel);
  assert_true(fabs(std - 0.02) < 0.001);
  /* Residual projections are scaled by 1/sqrt(2L). */
  float *p = malloc(proj->numel * 4);
  model_init_tensor(proj, 42, p);
  ss = 0;
  for (size_t i = 0; i < proj->numel; i++) ss += (double)p[i] * p[i];
  assert_true(fabs(sqrt(ss / proj->numel) - 0.02 / sqrt(8.0)) < 0.0005);
  float one[128], zero[128];
  model_init_tensor(ln, 42, one);
  model_init_tensor(bias, 42, zero);
  for (int i = 0; i < 128; i++) assert_true(one[i] == 1.0f && zero[i] == 0.0f);
  free(a), free(b), free(p);
}

static void test_lr_schedule(void **state) {
  (void)state;
  adamw_config c;
  adamw_defaults(&c);
  char err[128];
  assert_int_equal(adamw_validate(&c, err, sizeof(err)), 0);
  assert_true(adamw_lr_at(&c, 1) == c.lr && adamw_lr_at(&c, 1000) == c.lr);
  c.warmup_steps = 10;
  c.decay_steps = 100;
  assert_true(fabsf(adamw_lr_at(&c, 1) - c.lr / 10) < 1e-9f);
  assert_true(adamw_lr_at(&c, 10) == c.lr);
  float mid = adamw_lr_at(&c, 60);
  assert_true(fabsf(mid - c.lr * (c.min_lr_frac + (1 - c.min_lr_frac) * 0.5f)) < 1e-8f);
  assert_true(adamw_lr_at(&c, 110) == c.lr * c.min_lr_frac);
  assert_true(adamw_lr_at(&c, 5000) == c.lr * c.min_lr_frac);
  c.beta2 = 1.0f;
  assert_int_equal(adamw_validate(&c, err, sizeof(err)), GW_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets), cmocka_unit_test(test_validate), cmocka_unit_test(test_json),
      cmocka_unit_test(test_layout),  cmocka_unit_test(test_init),     cmocka_unit_test(test_lr_schedule),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
