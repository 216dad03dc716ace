/* test/train/train_testutil.h — helpers shared by the compute tests. */
#ifndef GWTF_TEST_TRAIN_TESTUTIL_H
#define GWTF_TEST_TRAIN_TESTUTIL_H

#include "testutil.h"

#include "gpu/backend.h"
#include "train/stage.h"
#include "util/err.h"
#include "util/rng.h"

/* A CPU backend with the given kernels; NULL when this CPU lacks them. */
static inline gpu_backend *tt_cpu_kernels(int threads, gpu_cpu_kernels kernels) {
  gpu_device dev = {GPU_CPU, 0};
  gpu_options opt = {threads, kernels};
  gpu_backend *be = NULL;
  char err[256];
  int rc = gpu_backend_open(&dev, &opt, &be, err, sizeof(err));
  if (rc != 0 && !(rc == GW_EUNSUPPORTED && kernels != GPU_CPU_KERNELS_AUTO))
    fail_msg("cpu backend: %s", err);
  return be;
}

static inline gpu_backend *tt_cpu(int threads) { return tt_cpu_kernels(threads, GPU_CPU_KERNELS_AUTO); }

/* A small model with odd sizes: C = 12, 3 heads, T = 5. */
static inline model_config tt_model(model_arch arch, int n_layers) {
  model_config c = {arch, 12, 3, n_layers, arch == MODEL_GPT ? 20 : 16, 11, 8, 1e-5f, 10000.0f};
  return c;
}

static inline stage_spec tt_spec(model_config c, int first, int n, bool head, int B, int T, int cap) {
  stage_spec s = {c, first, n, head, B, T, cap};
  return s;
}

static inline stage *tt_stage(const stage_spec *s, gpu_backend *be, uint64_t seed) {
  stage *st = NULL;
  char err[256];
  if (stage_create(s, be, seed, &st, err, sizeof(err)) != 0) fail_msg("stage_create: %s", err);
  return st;
}

static inline float *tt_randn(size_t n, uint64_t seed, float scale) {
  float *x = malloc(n * sizeof(float));
  assert_non_null(x);
  gw_rng r;
  gw_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) x[i] = (float)gw_rng_normal(&r) * scale;
  return x;
}

static inline int32_t *tt_tokens(size_t n, int vocab, uint64_t seed) {
  int32_t *t = malloc(n * sizeof(int32_t));
  assert_non_null(t);
  gw_rng r;
  gw_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) t[i] = (int32_t)gw_rng_below(&r, (uint64_t)vocab);
  return t;
}

static inline float *tt_read_all(stage *st, stage_buf which) {
  size_t n = stage_n_params(st);
  float *x = malloc(n * sizeof(float));
  assert_non_null(x);
  assert_int_equal(stage_read(st, which, 0, n, x), 0);
  return x;
}

#endif
