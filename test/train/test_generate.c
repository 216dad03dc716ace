/* test/train/test_generate.c — train/generate (KV cache against the whole
 * forward, sampling) and train/hf_export (names, directory round trip,
 * stage states with their hashes, config refusals). The comparison with
 * PyTorch on Hugging Face names is test_export.py. */
#include "train_testutil.h"

#include <math.h>
#include <sodium.h>

#include "train/checkpoint.h"
#include "train/generate.h"
#include "train/hf_export.h"
#include "util/file.h"

/* Odd sizes, several heads, a context of 24. */
static model_config small_model(model_arch arch) {
  model_config c = {arch, 24, 3, 2, arch == MODEL_GPT ? 40 : 36, 37, 24, 1e-5f, 10000.0f};
  return c;
}

/* GPT-2 init plus noise on every tensor, so biases and norm weights are
 * not the zeros and ones a mapping bug could hide behind. */
static float *random_model(const model_config *c, uint64_t seed) {
  size_t n = hf_model_numel(c);
  float *p = malloc(n * sizeof(float));
  assert_non_null(p);
  model_tensor t[MODEL_BLOCK_TENSORS_MAX];
  int k = model_head_tensors(c, t);
  for (int i = 0; i < k; i++) model_init_tensor(&t[i], seed, p + t[i].offset);
  for (int l = 0; l < c->n_layers; l++) {
    k = model_block_tensors(c, l, t);
    for (int i = 0; i < k; i++) model_init_tensor(&t[i], seed, p + hf_block_offset(c, l) + t[i].offset);
  }
  gw_rng rng;
  gw_rng_seed(&rng, seed + 1);
  for (size_t i = 0; i < n; i++) p[i] += 0.3f * (float)gw_rng_normal(&rng);
  return p;
}

static void check_cache_matches_full(model_arch arch) {
  model_config c = small_model(arch);
  float *p = random_model(&c, 5);
  gpu_backend *be = tt_cpu(1);
  gen_model *g = NULL;
  char err[256];
  assert_int_equal(gen_create(&c, p, be, c.max_seq_len, &g, err, sizeof(err)), 0);
  int T = 20, V = c.vocab_size;
  int32_t tok[20];
  for (int i = 0; i < T; i++) tok[i] = (i * 7 + 3) % V;
  float *full = malloc((size_t)T * V * sizeof(float)), *step = malloc((size_t)T * V * sizeof(float));
  float *again = malloc((size_t)V * sizeof(float));
  assert_int_equal(gen_forward(g, tok, T, full), 0);
  double worst = 0, scale = 0;
  for (int t = 0; t < T; t++) {
    assert_int_equal(gen_position(g), t);
    assert_int_equal(gen_step(g, tok[t], step + (size_t)t * V), 0);
    for (int v = 0; v < V; v++) {
      double d = fabs(step[(size_t)t * V + v] - full[(size_t)t * V + v]);
      worst = d > worst ? d : worst;
      scale = fabs(full[(size_t)t * V + v]) > scale ? fabs(full[(size_t)t * V + v]) : scale;
    }
  }
  printf("%s: cached vs full over %d positions: max abs diff %.2e (max |logit| %.2f)\n", model_arch_name(arch), T,
         worst, scale);
  assert_true(scale > 0.5);       /* the comparison is about real numbers */
  assert_true(worst <= 1e-4 * scale);
  /* a new sequence after a reset gives the same logits bit for bit */
  gen_reset(g);
  for (int t = 0; t < 5; t++) assert_int_equal(gen_step(g, tok[t], again), 0);
  assert_memory_equal(again, step + 4 * (size_t)V, (size_t)V * sizeof(float));
  /* a prompt at once, then steps: the same logits as the whole forward */
  int P = 7;
  assert_int_equal(gen_prefill(g, tok, P, again), 0);
  assert_int_equal(gen_position(g), P);
  double wp = 0;
  for (int v = 0; v < V; v++) wp = fmax(wp, fabs(again[v] - full[(size_t)(P - 1) * V + v]));
  for (int t = P; t < T; t++) {
    assert_int_equal(gen_step(g, tok[t], again), 0);
    for (int v = 0; v < V; v++) wp = fmax(wp, fabs(again[v] - full[(size_t)t * V + v]));
  }
  printf("%s: prefill of %d then %d steps vs full: max abs diff %.2e\n", model_arch_name(arch), P, T - P, wp);
  assert_true(wp <= 1e-4 * scale);
  assert_int_equal(gen_prefill(g, tok, 1, again), 0); /* one position: no row to move */
  for (int v = 0; v < V; v++) assert_true(fabs(again[v] - full[v]) <= 1e-4 * scale);
  /* bad input: a token outside the vocabulary, a full cache */
  assert_int_equal(gen_step(g, V, again), GW_EINVAL);
  assert_int_equal(gen_step(g, -1, again), GW_EINVAL);
  gen_reset(g);
  for (int t = 0; t < c.max_seq_len; t++) assert_int_equal(gen_step(g, 1, again), 0);
  assert_int_equal(gen_step(g, 1, again), GW_ERANGE);
  assert_int_equal(gen_forward(g, tok, c.max_seq_len + 1, full), GW_ERANGE);
  assert_int_equal(gen_prefill(g, tok, 0, full), GW_ERANGE);
  free(full);
  free(step);
  free(again);
  free(p);
  gen_destroy(g);
  gpu_backend_close(be);
}

static void test_cache_gpt(void **s) {
  (void)s;
  check_cache_matches_full(MODEL_GPT);
}
static void test_cache_llama(void **s) {
  (void)s;
  check_cache_matches_full(MODEL_LLAMA);
}

static void test_pick(void **s) {
  (void)s;
  float logits[6] = {0.1f, 2.0f, 1.9f, -3.0f, 2.0f, 0.5f};
  uint8_t scratch[6 * 16];
  assert_true(gen_pick_scratch_bytes(6) <= sizeof(scratch));
  gw_rng a, b;
  gw_rng_seed(&a, 1);
  gen_sampling greedy = {0.0f, 0}, k1 = {1.0f, 1}, k2 = {1.0f, 2}, all = {1.0f, 0};
  assert_int_equal(gen_pick(logits, 6, &greedy, &a, scratch), 1); /* the lower id of a tie */
  assert_int_equal(gen_pick(logits, 6, &k1, &a, scratch), 1);
  int seen[6] = {0};
  for (int i = 0; i < 2000; i++) seen[gen_pick(logits, 6, &k2, &a, scratch)]++;
  assert_true(seen[1] > 0 && seen[4] > 0); /* the two best, both drawn */
  assert_int_equal(seen[0] + seen[2] + seen[3] + seen[5], 0);
  gw_rng_seed(&a, 9);
  gw_rng_seed(&b, 9);
  int diff = 0;
  for (int i = 0; i < 200; i++) {
    int x = gen_pick(logits, 6, &all, &a, scratch), y = gen_pick(logits, 6, &all, &b, scratch);
    assert_int_equal(x, y);
    diff |= x != 1;
  }
  assert_true(diff); /* temperature 1 over all six does draw others */
}

/* Writes and reads back a directory: same config, same bits. */
static void check_dir_round_trip(model_arch arch) {
  model_config c = small_model(arch);
  float *p = random_model(&c, 11), *q = NULL;
  char *dir = testutil_tmpdir(), err[256];
  char out[600];
  snprintf(out, sizeof(out), "%s/export", dir);
  hf_export_info info = {.run = "t", .iteration = 4, .source = "test"};
  assert_int_equal(hf_write_dir(out, &c, p, &info, err, sizeof(err)), 0);
  model_config back;
  assert_int_equal(hf_read_dir(out, &back, &q, err, sizeof(err)), 0);
  assert_memory_equal(&back, &c, sizeof(c));
  assert_memory_equal(q, p, hf_model_numel(&c) * sizeof(float));
  free(q);
  free(p);
  testutil_rmtree(dir);
  free(dir);
}

static void test_dir_gpt(void **s) {
  (void)s;
  check_dir_round_trip(MODEL_GPT);
}
static void test_dir_llama(void **s) {
  (void)s;
  check_dir_round_trip(MODEL_LLAMA);
}

static void test_names(void **s) {
  (void)s;
  model_config g = small_model(MODEL_GPT), l = small_model(MODEL_LLAMA);
  char hf[HF_NAME_MAX];
  bool tr;
  assert_int_equal(hf_tensor_name(&g, "blocks.1.attn.qkv.weight", hf, sizeof(hf), &tr), 0);
  assert_string_equal(hf, "h.1.attn.c_attn.weight");
  assert_true(tr);
  assert_int_equal(hf_tensor_name(&g, "tok_emb.weight", hf, sizeof(hf), &tr), 0);
  assert_string_equal(hf, "wte.weight");
  assert_false(tr);
  assert_int_equal(hf_tensor_name(&l, "blocks.0.mlp.down.weight", hf, sizeof(hf), &tr), 0);
  assert_string_equal(hf, "model.layers.0.mlp.down_proj.weight");
  assert_false(tr);
  assert_int_equal(hf_tensor_name(&l, "lm_head.weight", hf, sizeof(hf), &tr), 0);
  assert_string_equal(hf, "lm_head.weight");
  assert_int_equal(hf_tensor_name(&l, "blocks.0.ln1.weight", hf, sizeof(hf), &tr), GW_ENOENT);
}

static void test_config_refusals(void **s) {
  (void)s;
  model_config c;
  char err[256];
  const char *bert = "{\"model_type\":\"bert\"}";
  assert_int_equal(hf_config_parse(bert, strlen(bert), &c, err, sizeof(err)), GW_EUNSUPPORTED);
  const char *gqa = "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":8,\"intermediate_size\":8,"
                    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                    "\"max_position_embeddings\":8}";
  assert_int_equal(hf_config_parse(gqa, strlen(gqa), &c, err, sizeof(err)), GW_EUNSUPPORTED);
  assert_non_null(strstr(err, "grouped"));
  const char *relu = "{\"model_type\":\"gpt2\",\"vocab_size\":10,\"n_positions\":8,\"n_embd\":8,\"n_layer\":1,"
                     "\"n_head\":2,\"activation_function\":\"relu\"}";
  assert_int_equal(hf_config_parse(relu, strlen(relu), &c, err, sizeof(err)), GW_EUNSUPPORTED);
  /* GPT-2's own config: n_inner null means 4 * n_embd */
  const char *gpt2 = "{\"model_type\":\"gpt2\",\"vocab_size\":50257,\"n_positions\":1024,\"n_embd\":768,"
                     "\"n_layer\":12,\"n_head\":12,\"n_inner\":null,\"activation_function\":\"gelu_new\","
                     "\"layer_norm_epsilon\":1e-05}";
  assert_int_equal(hf_config_parse(gpt2, strlen(gpt2), &c, err, sizeof(err)), 0);
  assert_int_equal(c.d_ff, 3072);
  assert_true(c.eps == 1e-5f);
}

/* Stage states into a whole model: hashes checked, parts counted. */
static void test_stage_states(void **s) {
  (void)s;
  model_config c = small_model(MODEL_LLAMA);
  gpu_backend *be = tt_cpu(1);
  stage_spec head = tt_spec(c, 0, 0, true, 1, 4, 1), blocks = tt_spec(c, 0, 1, false, 1, 4, 1);
  stage_spec last = tt_spec(c, 1, 1, false, 1, 4, 1);
  stage *st[3] = {tt_stage(&head, be, 3), tt_stage(&blocks, be, 3), tt_stage(&last, be, 3)};
  uint8_t *buf[3];
  size_t len[3];
  uint8_t hash[3][STAGE_HASH_BYTES];
  for (int i = 0; i < 3; i++) {
    assert_int_equal(stage_state_size(st[i], &len[i]), 0);
    buf[i] = malloc(len[i]);
    assert_int_equal(stage_state_read(st[i], 0, buf[i], len[i]), 0);
    assert_int_equal(stage_weight_hash(st[i], hash[i]), 0);
  }
  hf_model m;
  hf_model_init(&m);
  char err[256];
  assert_int_equal(hf_model_add_stage(&m, buf[0], len[0], hash[0], NULL, NULL, NULL, err, sizeof(err)), 0);
  /* the hash of another stage: refused, nothing taken */
  assert_int_equal(hf_model_add_stage(&m, buf[1], len[1], hash[2], NULL, NULL, NULL, err, sizeof(err)), GW_EAUTH);
  assert_false(m.layers[0]);
  assert_int_equal(hf_model_add_stage(&m, buf[1], len[1], hash[1], NULL, NULL, NULL, err, sizeof(err)), 0);
  assert_int_equal(hf_model_complete(&m, err, sizeof(err)), GW_ENOENT);
  assert_non_null(strstr(err, "block 1"));
  int first = -1, n = -1;
  bool has_head = true;
  assert_int_equal(hf_model_add_stage(&m, buf[2], len[2], hash[2], &first, &n, &has_head, err, sizeof(err)), 0);
  assert_int_equal(first, 1);
  assert_int_equal(n, 1);
  assert_false(has_head);
  assert_int_equal(hf_model_complete(&m, err, sizeof(err)), 0);
  /* the whole model holds each stage's weights at their offsets */
  float *w = malloc(model_block_numel(&c) * sizeof(float));
  assert_int_equal(stage_read(st[2], STAGE_PARAMS, 0, model_block_numel(&c), w), 0);
  assert_memory_equal(m.params + hf_block_offset(&c, 1), w, model_block_numel(&c) * sizeof(float));
  free(w);
  /* a truncated state is refused */
  hf_model m2;
  hf_model_init(&m2);
  assert_int_not_equal(hf_model_add_stage(&m2, buf[1], len[1] / 2, NULL, NULL, NULL, NULL, err, sizeof(err)), 0);
  hf_model_free(&m2);
  hf_model_free(&m);
  for (int i = 0; i < 3; i++) {
    free(buf[i]);
    stage_destroy(st[i]);
  }
  gpu_backend_close(be);
}

/* Bytes from a peer or a file: a stage state and a config.json with
 * random bytes changed or cut short must come back as errors (or as a
 * valid state), never as a crash or a read out of bounds (ASan build). */
static void test_hostile_inputs(void **s) {
  (void)s;
  model_config c = small_model(MODEL_GPT);
  gpu_backend *be = tt_cpu(1);
  stage_spec spec = tt_spec(c, 1, 1, true, 1, 4, 1);
  stage *st = tt_stage(&spec, be, 9);
  size_t len;
  assert_int_equal(stage_state_size(st, &len), 0);
  uint8_t *good = malloc(len), *bad = malloc(len);
  assert_int_equal(stage_state_read(st, 0, good, len), 0);
  uint64_t header;
  memcpy(&header, good, 8);
  gw_rng rng;
  gw_rng_seed(&rng, 4);
  char err[256];
  int accepted = 0;
  for (int i = 0; i < 400; i++) {
    memcpy(bad, good, len);
    size_t n = len;
    int flips = 1 + (int)gw_rng_below(&rng, 4);
    for (int k = 0; k < flips; k++) /* mostly in the header, where the structure is */
      bad[gw_rng_below(&rng, 4) ? 8 + gw_rng_below(&rng, header) : gw_rng_below(&rng, len)] ^=
          (uint8_t)(1 + gw_rng_below(&rng, 255));
    if (i % 5 == 0) n = (size_t)gw_rng_below(&rng, len);
    uint8_t h[HF_HASH_BYTES];
    hf_model m;
    hf_model_init(&m);
    int a = hf_state_weight_hash(bad, n, h, err, sizeof(err));
    int b = hf_model_add_stage(&m, bad, n, a == 0 ? h : NULL, NULL, NULL, NULL, err, sizeof(err));
    accepted += a == 0 && b == 0;
    hf_model_free(&m);
  }
  printf("hostile stage states: %d of 400 mutations still valid states\n", accepted);
  char *js = hf_config_json(&c, NULL);
  assert_non_null(js);
  size_t jl = strlen(js);
  for (int i = 0; i < 400; i++) {
    char *j = strdup(js);
    for (int k = 0; k < 3; k++) j[gw_rng_below(&rng, jl)] = (char)gw_rng_below(&rng, 128);
    model_config back;
    (void)hf_config_parse(j, (size_t)gw_rng_below(&rng, jl + 1), &back, err, sizeof(err));
    free(j);
  }
  free(js);
  free(good);
  free(bad);
  stage_destroy(st);
  gpu_backend_close(be);
}

/* The sidecar beside a checkpoint: written, read back, refused when bent. */
static void test_sidecar(void **s) {
  (void)s;
  char *dir = testutil_tmpdir(), path[600], side[700], err[256];
  assert_int_equal(ckpt_run_path(path, sizeof(path), dir, "demo", 2), 0);
  char want[600];
  snprintf(want, sizeof(want), "%s/checkpoints/demo.stage2.safetensors", dir);
  assert_string_equal(path, want);
  snprintf(path, sizeof(path), "%s/demo.stage2.safetensors", dir);
  uint8_t hash[STAGE_HASH_BYTES];
  for (int i = 0; i < STAGE_HASH_BYTES; i++) hash[i] = (uint8_t)(i * 7);
  assert_int_equal(ckpt_save_blob(path, "abc", 3, "demo", 2, 17, hash), 0);
  ckpt_sidecar sc;
  assert_int_equal(ckpt_read_sidecar(path, &sc, err, sizeof(err)), 0);
  assert_string_equal(sc.run, "demo");
  assert_int_equal(sc.stage, 2);
  assert_int_equal(sc.iteration, 17);
  assert_true(sc.have_hash);
  assert_memory_equal(sc.weight_hash, hash, sizeof(hash));
  /* an old sidecar without the hash reads, saying so */
  assert_int_equal(ckpt_save_blob(path, "abc", 3, "demo", 2, 17, NULL), 0);
  assert_int_equal(ckpt_read_sidecar(path, &sc, err, sizeof(err)), 0);
  assert_false(sc.have_hash);
  snprintf(side, sizeof(side), "%s.json", path);
  const char *bad[] = {"{\"run\":\"demo\",\"stage\":2}",
                       ("{\"run\":\"demo\",\"stage\":2,\"iteration\":1,"
                        "\"weight_hash\":\"zz\"}"),
                       "[1,2]", "not json", "{\"run\":7,\"stage\":2,\"iteration\":1}",
                       "{\"run\":\"demo\",\"stage\":-1,\"iteration\":1}"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_int_equal(gw_file_write_atomic1(side, bad[i], strlen(bad[i]), 0644), 0);
    assert_int_equal(ckpt_read_sidecar(path, &sc, err, sizeof(err)), GW_EINVAL);
  }
  testutil_rmtree(dir);
  free(dir);
}

int main(void) {
  if (sodium_init() < 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cache_gpt),     cmocka_unit_test(test_cache_llama), cmocka_unit_test(test_pick),
      cmocka_unit_test(test_dir_gpt),       cmocka_unit_test(test_dir_llama),   cmocka_unit_test(test_names),
      cmocka_unit_test(test_config_refusals), cmocka_unit_test(test_stage_states), cmocka_unit_test(test_sidecar),
      cmocka_unit_test(test_hostile_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
