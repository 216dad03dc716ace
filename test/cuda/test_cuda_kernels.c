/* test/cuda/test_cuda_kernels.c — every kernel of the CUDA backend against
 * the CPU backend, through gpu/backend.h only.
 *
 * For each kernel: random inputs of awkward sizes (T and C not powers of
 * two, 3 heads, B > 1, vocabularies of 7, 256 and 50257), run once on the
 * CPU and twice on CUDA from the same initial buffers. The CUDA outputs and
 * gradients must match the CPU's within 1e-4 of the largest expected value
 * (AdamW: bit for bit), and the two CUDA runs must be bit-identical.
 * Accumulated gradients start from random values, so "+=" is checked too;
 * overwritten outputs start from random garbage.
 *
 * Without the CUDA backend in this build, or without a GPU, prints
 * "SKIPPED: <reason>" and exits 77 (SKIP_RETURN_CODE in CMakeLists.txt). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "testutil.h"
#include "util/err.h"
#include "util/rng.h"

#define SKIP_CODE (77)
#define TOL (1e-4)
#define MAX_BUFS (12)
#define CPU_THREADS (2)

typedef struct backends {
  gpu_backend *cpu, *cuda;
} backends;

/* One device buffer of a kernel case. */
typedef struct tbuf {
  const char *name;
  const void *init; /* host contents uploaded before each run */
  size_t bytes;
  bool compare;     /* an output or gradient: checked after the run */
} tbuf;

/* Runs the kernel(s) of a case on be; dev[i] is the device copy of bufs[i]. */
typedef void (*run_fn)(gpu_backend *be, void *const *dev, const void *arg);

/* ---- harness ---------------------------------------------------------------------- */

static void run_once(gpu_backend *be, const tbuf *bufs, int n, run_fn run, const void *arg,
                     float **out) {
  void *dev[MAX_BUFS] = {0};
  for (int i = 0; i < n; i++) {
    dev[i] = gpu_alloc(be, bufs[i].bytes);
    assert_non_null(dev[i]);
    assert_int_equal(gpu_upload(be, dev[i], bufs[i].init, bufs[i].bytes), 0);
  }
  run(be, dev, arg);
  assert_int_equal(gpu_sync(be), 0);
  for (int i = 0; i < n; i++) {
    out[i] = NULL;
    if (!bufs[i].compare) continue;
    out[i] = malloc(bufs[i].bytes);
    assert_non_null(out[i]);
    assert_int_equal(gpu_download(be, out[i], dev[i], bufs[i].bytes), 0);
  }
  for (int i = 0; i < n; i++) gpu_free(be, dev[i]);
}

/* max |got - want| / max |want| (absolute when want is all zeros); infinite
 * when got holds a NaN or an infinity. */
static double rel_err(const float *got, const float *want, size_t n) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    diff = fmax(diff, fabs((double)got[i] - (double)want[i]));
    scale = fmax(scale, fabs((double)want[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

/* CPU once, CUDA twice; CUDA within tol of the CPU (tol 0: identical bits)
 * and identical to itself. */
static void check_kernel(const backends *b, const char *kernel, const tbuf *bufs, int n, run_fn run,
                         const void *arg, double tol) {
  assert_true(n <= MAX_BUFS);
  float *ref[MAX_BUFS], *got[MAX_BUFS], *again[MAX_BUFS];
  run_once(b->cpu, bufs, n, run, arg, ref);
  run_once(b->cuda, bufs, n, run, arg, got);
  run_once(b->cuda, bufs, n, run, arg, again);
  for (int i = 0; i < n; i++) {
    if (!bufs[i].compare) continue;
    size_t floats = bufs[i].bytes / sizeof(float);
    double e = rel_err(got[i], ref[i], floats);
    bool same = memcmp(got[i], again[i], bufs[i].bytes) == 0;
    printf("  %-34s %-8s rel err %.2e%s\n", kernel, bufs[i].name, e,
           same ? "" : "  NOT bit-identical across runs");
    if (tol == 0.0)
      assert_memory_equal(got[i], ref[i], bufs[i].bytes);
    else
      assert_true(e <= tol);
    assert_true(same);
  }
  for (int i = 0; i < n; i++) {
    free(ref[i]);
    free(got[i]);
    free(again[i]);
  }
}

static float *rand_floats(gw_rng *r, size_t n, float lo, float hi) {
  float *x = malloc(n * sizeof(float));
  assert_non_null(x);
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)gw_rng_uniform(r);
  return x;
}

static float *randu(gw_rng *r, size_t n) { return rand_floats(r, n, -1.0f, 1.0f); }

static int32_t *rand_tokens(gw_rng *r, size_t n, int V) {
  int32_t *t = malloc(n * sizeof(int32_t));
  assert_non_null(t);
  for (size_t i = 0; i < n; i++) t[i] = (int32_t)gw_rng_below(r, (uint64_t)V);
  return t;
}

static void free_all(void **p, int n) {
  for (int i = 0; i < n; i++) free(p[i]);
}

#define FB(n) ((size_t)(n) * sizeof(float))
#define IB(n) ((size_t)(n) * sizeof(int32_t))
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ---- matmul ---------------------------------------------------------------------- */

typedef enum { RES_NONE, RES_SEPARATE, RES_IN_PLACE } res_mode;

typedef struct mm_arg {
  int N, IC, OC;
  bool bias;
  res_mode res;
  bool dinp, dbias; /* backward: compute these (else NULL) */
} mm_arg;

enum { MM_INP, MM_W, MM_B, MM_RES, MM_OUT, MM_DOUT, MM_DINP, MM_DW, MM_DB, MM_NBUF };

static void run_matmul(gpu_backend *be, void *const *d, const void *arg) {
  const mm_arg *a = arg;
  float *out = d[MM_OUT];
  const float *res = a->res == RES_NONE ? NULL : a->res == RES_IN_PLACE ? out : d[MM_RES];
  gpu_matmul_forward(be, out, d[MM_INP], d[MM_W], a->bias ? d[MM_B] : NULL, res, a->N, a->IC,
                     a->OC);
  gpu_matmul_backward(be, a->dinp ? d[MM_DINP] : NULL, d[MM_DW], a->dbias ? d[MM_DB] : NULL,
                      d[MM_DOUT], d[MM_INP], d[MM_W], a->N, a->IC, a->OC);
}

static void check_matmul(const backends *b, gw_rng *r, const mm_arg *a) {
  size_t nin = (size_t)a->N * a->IC, nw = (size_t)a->OC * a->IC, nout = (size_t)a->N * a->OC;
  void *h[MM_NBUF] = {randu(r, nin),  randu(r, nw),   randu(r, a->OC), randu(r, nout), randu(r, nout),
                      randu(r, nout), randu(r, nin), randu(r, nw),    randu(r, a->OC)};
  tbuf bufs[MM_NBUF] = {
      {"inp", h[MM_INP], FB(nin), false},     {"weight", h[MM_W], FB(nw), false},
      {"bias", h[MM_B], FB(a->OC), false},    {"resid", h[MM_RES], FB(nout), false},
      {"out", h[MM_OUT], FB(nout), true},     {"dout", h[MM_DOUT], FB(nout), false},
      {"dinp", h[MM_DINP], FB(nin), a->dinp}, {"dweight", h[MM_DW], FB(nw), true},
      {"dbias", h[MM_DB], FB(a->OC), a->dbias},
  };
  char name[96];
  snprintf(name, sizeof(name), "matmul N%d IC%d OC%d b%d r%d", a->N, a->IC, a->OC, a->bias,
           (int)a->res);
  check_kernel(b, name, bufs, MM_NBUF, run_matmul, a, TOL);
  free_all(h, MM_NBUF);
}

static void test_matmul(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 1);
  const mm_arg cases[] = {
      {74, 54, 163, true, RES_SEPARATE, true, true},  /* gpt proj: bias + skip */
      {74, 54, 163, true, RES_NONE, true, true},      /* fc: bias only */
      {74, 54, 163, false, RES_IN_PLACE, false, false}, /* llama o-proj, first layer's dinp skipped */
      {74, 54, 163, false, RES_NONE, true, false},    /* llama qkv */
      {74, 54, 163, true, RES_IN_PLACE, true, true},
      {1, 7, 3, true, RES_SEPARATE, true, true},      /* one row */
      {37, 64, 50257, false, RES_NONE, true, false},  /* LM head over a GPT-2 vocabulary */
      {300, 130, 45, true, RES_NONE, true, true},     /* several column-sum chunks for dbias */
  };
  for (size_t i = 0; i < COUNT(cases); i++) check_matmul(b, &r, &cases[i]);
}

/* ---- norms ----------------------------------------------------------------------- */

typedef struct norm_arg {
  int N, C;
} norm_arg;

enum { LN_INP, LN_W, LN_B, LN_OUT, LN_MEAN, LN_RSTD, LN_DOUT, LN_DINP, LN_DW, LN_DB, LN_NBUF };

static void run_layernorm(gpu_backend *be, void *const *d, const void *arg) {
  const norm_arg *a = arg;
  gpu_layernorm_forward(be, d[LN_OUT], d[LN_MEAN], d[LN_RSTD], d[LN_INP], d[LN_W], d[LN_B], a->N,
                        a->C, 1e-5f);
  gpu_layernorm_backward(be, d[LN_DINP], d[LN_DW], d[LN_DB], d[LN_DOUT], d[LN_INP], d[LN_W],
                         d[LN_MEAN], d[LN_RSTD], a->N, a->C);
}

static void test_layernorm(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 2);
  const norm_arg cases[] = {{74, 54}, {300, 1000}, {1, 3}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const norm_arg *a = &cases[k];
    size_t nx = (size_t)a->N * a->C;
    /* an offset on the input, so mean subtraction matters */
    void *h[LN_NBUF] = {rand_floats(&r, nx, 2.0f, 5.0f), randu(&r, a->C), randu(&r, a->C),
                        randu(&r, nx), randu(&r, a->N), randu(&r, a->N), randu(&r, nx),
                        randu(&r, nx), randu(&r, a->C), randu(&r, a->C)};
    tbuf bufs[LN_NBUF] = {
        {"inp", h[0], FB(nx), false},   {"weight", h[1], FB(a->C), false},
        {"bias", h[2], FB(a->C), false}, {"out", h[3], FB(nx), true},
        {"mean", h[4], FB(a->N), true},  {"rstd", h[5], FB(a->N), true},
        {"dout", h[6], FB(nx), false},   {"dinp", h[7], FB(nx), true},
        {"dweight", h[8], FB(a->C), true}, {"dbias", h[9], FB(a->C), true},
    };
    char name[64];
    snprintf(name, sizeof(name), "layernorm N%d C%d", a->N, a->C);
    check_kernel(b, name, bufs, LN_NBUF, run_layernorm, a, TOL);
    free_all(h, LN_NBUF);
  }
}

enum { RN_INP, RN_W, RN_OUT, RN_RSTD, RN_DOUT, RN_DINP, RN_DW, RN_NBUF };

static void run_rmsnorm(gpu_backend *be, void *const *d, const void *arg) {
  const norm_arg *a = arg;
  gpu_rmsnorm_forward(be, d[RN_OUT], d[RN_RSTD], d[RN_INP], d[RN_W], a->N, a->C, 1e-5f);
  gpu_rmsnorm_backward(be, d[RN_DINP], d[RN_DW], d[RN_DOUT], d[RN_INP], d[RN_W], d[RN_RSTD], a->N,
                       a->C);
}

static void test_rmsnorm(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 3);
  const norm_arg cases[] = {{74, 54}, {300, 1000}, {1, 3}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const norm_arg *a = &cases[k];
    size_t nx = (size_t)a->N * a->C;
    void *h[RN_NBUF] = {randu(&r, nx), randu(&r, a->C), randu(&r, nx),  randu(&r, a->N),
                        randu(&r, nx), randu(&r, nx),  randu(&r, a->C)};
    tbuf bufs[RN_NBUF] = {
        {"inp", h[0], FB(nx), false},  {"weight", h[1], FB(a->C), false}, {"out", h[2], FB(nx), true},
        {"rstd", h[3], FB(a->N), true}, {"dout", h[4], FB(nx), false},     {"dinp", h[5], FB(nx), true},
        {"dweight", h[6], FB(a->C), true},
    };
    char name[64];
    snprintf(name, sizeof(name), "rmsnorm N%d C%d", a->N, a->C);
    check_kernel(b, name, bufs, RN_NBUF, run_rmsnorm, a, TOL);
    free_all(h, RN_NBUF);
  }
}

/* ---- activations ------------------------------------------------------------------ */

typedef struct elem_arg {
  size_t n;
  bool in_place;
} elem_arg;

enum { GE_INP, GE_OUT, GE_DOUT, GE_DINP, GE_NBUF };

static void run_gelu(gpu_backend *be, void *const *d, const void *arg) {
  const elem_arg *a = arg;
  if (a->in_place) {
    /* backward first (it needs the input), dinp over dout, then out over inp */
    gpu_gelu_backward(be, d[GE_DOUT], d[GE_INP], d[GE_DOUT], a->n);
    gpu_gelu_forward(be, d[GE_INP], d[GE_INP], a->n);
  } else {
    gpu_gelu_forward(be, d[GE_OUT], d[GE_INP], a->n);
    gpu_gelu_backward(be, d[GE_DINP], d[GE_INP], d[GE_DOUT], a->n);
  }
}

static void test_gelu(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 4);
  /* the last size needs more than one pass of the capped grid-stride loop */
  const elem_arg cases[] = {{1001, false}, {1001, true}, {((size_t)1 << 24) + 1001, true}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const elem_arg *a = &cases[k];
    size_t nsep = a->in_place ? 1 : a->n; /* out and dinp are unused in place */
    void *h[GE_NBUF] = {rand_floats(&r, a->n, -6.0f, 6.0f), randu(&r, nsep), randu(&r, a->n),
                        randu(&r, nsep)};
    tbuf bufs[GE_NBUF] = {
        {"inp", h[0], FB(a->n), a->in_place}, {"out", h[1], FB(nsep), !a->in_place},
        {"dout", h[2], FB(a->n), a->in_place}, {"dinp", h[3], FB(nsep), !a->in_place},
    };
    char name[64];
    snprintf(name, sizeof(name), "gelu n%zu%s", a->n, a->in_place ? " in place" : "");
    check_kernel(b, name, bufs, GE_NBUF, run_gelu, a, TOL);
    free_all(h, GE_NBUF);
  }
}

typedef struct swiglu_arg {
  int N, F;
} swiglu_arg;

enum { SW_INP, SW_OUT, SW_DOUT, SW_DINP, SW_NBUF };

static void run_swiglu(gpu_backend *be, void *const *d, const void *arg) {
  const swiglu_arg *a = arg;
  gpu_swiglu_forward(be, d[SW_OUT], d[SW_INP], a->N, a->F);
  gpu_swiglu_backward(be, d[SW_DINP], d[SW_DOUT], d[SW_INP], a->N, a->F);
}

static void test_swiglu(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 5);
  const swiglu_arg a = {74, 163};
  size_t n2 = (size_t)a.N * 2 * a.F, n = (size_t)a.N * a.F;
  void *h[SW_NBUF] = {rand_floats(&r, n2, -6.0f, 6.0f), randu(&r, n), randu(&r, n), randu(&r, n2)};
  tbuf bufs[SW_NBUF] = {
      {"inp", h[0], FB(n2), false}, {"out", h[1], FB(n), true},
      {"dout", h[2], FB(n), false}, {"dinp", h[3], FB(n2), true},
  };
  check_kernel(b, "swiglu N74 F163", bufs, SW_NBUF, run_swiglu, &a, TOL);
  free_all(h, SW_NBUF);
}

/* ---- rope ----------------------------------------------------------------------------- */

typedef struct attn_arg {
  int B, T, C, NH;
} attn_arg;

enum { RO_QKV, RO_FREQS, RO_DQKV, RO_NBUF };

static void run_rope(gpu_backend *be, void *const *d, const void *arg) {
  const attn_arg *a = arg;
  gpu_rope_forward(be, d[RO_QKV], d[RO_FREQS], a->B, a->T, a->C, a->NH);
  gpu_rope_backward(be, d[RO_DQKV], d[RO_FREQS], a->B, a->T, a->C, a->NH);
}

/* (T_max, hd/2, 2) table of (cos, sin) of t * theta^(-2i/hd), in double as
 * the stage code computes it. */
static float *rope_table(int T_max, int hd, double theta) {
  int half = hd / 2;
  float *f = malloc(FB((size_t)T_max * hd));
  assert_non_null(f);
  for (int t = 0; t < T_max; t++)
    for (int i = 0; i < half; i++) {
      double angle = t * pow(theta, -2.0 * i / hd);
      f[((size_t)t * half + i) * 2] = (float)cos(angle);
      f[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
    }
  return f;
}

static void test_rope(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 6);
  const attn_arg cases[] = {{2, 37, 54, 3}, {3, 130, 48, 4}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const attn_arg *a = &cases[k];
    size_t n = (size_t)a->B * a->T * 3 * a->C;
    int hd = a->C / a->NH, T_max = a->T + 5;
    void *h[RO_NBUF] = {randu(&r, n), rope_table(T_max, hd, 10000.0), randu(&r, n)};
    tbuf bufs[RO_NBUF] = {
        {"qkv", h[0], FB(n), true},
        {"freqs", h[1], FB((size_t)T_max * hd), false},
        {"dqkv", h[2], FB(n), true},
    };
    char name[64];
    snprintf(name, sizeof(name), "rope B%d T%d C%d NH%d", a->B, a->T, a->C, a->NH);
    check_kernel(b, name, bufs, RO_NBUF, run_rope, a, TOL);
    free_all(h, RO_NBUF);
  }
}

/* ---- attention ---------------------------------------------------------------------------- */

enum { AT_QKV, AT_DOUT, AT_OUT, AT_DQKV, AT_NBUF };

static void run_attention(gpu_backend *be, void *const *d, const void *arg) {
  const attn_arg *a = arg;
  /* the saved state is private to each backend, and so is its size */
  size_t floats = gpu_attention_state_floats(be, a->B, a->T, a->NH);
  float *st = gpu_alloc(be, FB(floats));
  assert_non_null(st);
  gpu_attention_forward(be, d[AT_OUT], st, d[AT_QKV], a->B, a->T, a->C, a->NH);
  gpu_attention_backward(be, d[AT_DQKV], d[AT_DOUT], d[AT_QKV], st, a->B, a->T, a->C, a->NH);
  assert_int_equal(gpu_sync(be), 0);
  gpu_free(be, st);
}

static void test_attention(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 7);
  /* odd head dim (15), queries beyond 4 warps of keys (130), one token, ... */
  const attn_arg cases[] = {{2, 37, 54, 3}, {3, 130, 45, 3}, {1, 1, 6, 2}, {2, 64, 64, 4}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const attn_arg *a = &cases[k];
    size_t n3 = (size_t)a->B * a->T * 3 * a->C, n = (size_t)a->B * a->T * a->C;
    /* spread-out scores so that the softmax is far from uniform */
    void *h[AT_NBUF] = {rand_floats(&r, n3, -2.0f, 2.0f), randu(&r, n), randu(&r, n),
                        randu(&r, n3)};
    tbuf bufs[AT_NBUF] = {
        {"qkv", h[0], FB(n3), false}, {"dout", h[1], FB(n), false},
        {"out", h[2], FB(n), true},   {"dqkv", h[3], FB(n3), true},
    };
    char name[64];
    snprintf(name, sizeof(name), "attention B%d T%d C%d NH%d", a->B, a->T, a->C, a->NH);
    check_kernel(b, name, bufs, AT_NBUF, run_attention, a, TOL);
    free_all(h, AT_NBUF);
  }
}

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct enc_arg {
  int B, T, C, V;
  bool wpe;
} enc_arg;

enum { EN_TOK, EN_WTE, EN_WPE, EN_OUT, EN_DOUT, EN_DWTE, EN_DWPE, EN_NBUF };

static void run_encoder(gpu_backend *be, void *const *d, const void *arg) {
  const enc_arg *a = arg;
  gpu_encoder_forward(be, d[EN_OUT], d[EN_TOK], d[EN_WTE], a->wpe ? d[EN_WPE] : NULL, a->B, a->T,
                      a->C);
  gpu_encoder_backward(be, d[EN_DWTE], a->wpe ? d[EN_DWPE] : NULL, d[EN_DOUT], d[EN_TOK], a->B,
                       a->T, a->C);
}

static void test_encoder(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 8);
  /* V = 7: every token repeats across the 256-position tiles of the
   * scatter-add; V = 50257: mostly distinct tokens, no positions. */
  const enc_arg cases[] = {{3, 130, 300, 7, true}, {2, 37, 54, 50257, false}, {1, 1, 5, 3, true}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const enc_arg *a = &cases[k];
    size_t BT = (size_t)a->B * a->T, nx = BT * a->C, nwte = (size_t)a->V * a->C;
    int T_max = a->T + 5;
    size_t nwpe = (size_t)T_max * a->C;
    int32_t *tok = rand_tokens(&r, BT, a->V);
    /* the last token value first appears past the first tile of 256 */
    if (BT > 300) {
      for (size_t i = 0; i < 300; i++) tok[i] = (int32_t)gw_rng_below(&r, (uint64_t)a->V - 1);
      tok[BT - 1] = a->V - 1;
    }
    void *h[EN_NBUF] = {tok,          randu(&r, nwte), randu(&r, nwpe), randu(&r, nx),
                        randu(&r, nx), randu(&r, nwte), randu(&r, nwpe)};
    tbuf bufs[EN_NBUF] = {
        {"tokens", h[0], IB(BT), false},    {"wte", h[1], FB(nwte), false},
        {"wpe", h[2], FB(nwpe), false},     {"out", h[3], FB(nx), true},
        {"dout", h[4], FB(nx), false},      {"dwte", h[5], FB(nwte), true},
        {"dwpe", h[6], FB(nwpe), a->wpe},
    };
    char name[64];
    snprintf(name, sizeof(name), "encoder B%d T%d C%d V%d%s", a->B, a->T, a->C, a->V,
             a->wpe ? " wpe" : "");
    check_kernel(b, name, bufs, EN_NBUF, run_encoder, a, TOL);
    free_all(h, EN_NBUF);
  }
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

typedef struct ce_arg {
  int N, V;
  bool in_place; /* probs and dlogits over logits, as the head does it */
} ce_arg;

enum { CE_LOGITS, CE_TARGETS, CE_PROBS, CE_LOSSES, CE_DLOGITS, CE_NBUF };

static void run_crossentropy(gpu_backend *be, void *const *d, const void *arg) {
  const ce_arg *a = arg;
  float *probs = a->in_place ? d[CE_LOGITS] : d[CE_PROBS];
  float *dlogits = a->in_place ? d[CE_LOGITS] : d[CE_DLOGITS];
  gpu_crossentropy_forward(be, d[CE_LOSSES], probs, d[CE_LOGITS], d[CE_TARGETS], a->N, a->V);
  gpu_crossentropy_backward(be, dlogits, probs, d[CE_TARGETS], 1.0f / (float)a->N, a->N, a->V);
}

static void test_crossentropy(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 9);
  const ce_arg cases[] = {{74, 256, false}, {5, 50257, true}, {3, 50257, false}};
  for (size_t k = 0; k < COUNT(cases); k++) {
    const ce_arg *a = &cases[k];
    size_t n = (size_t)a->N * a->V;
    void *h[CE_NBUF] = {rand_floats(&r, n, -8.0f, 8.0f), rand_tokens(&r, a->N, a->V),
                        randu(&r, n), randu(&r, a->N), randu(&r, n)};
    tbuf bufs[CE_NBUF] = {
        {"logits", h[0], FB(n), a->in_place}, {"targets", h[1], IB(a->N), false},
        {"probs", h[2], FB(n), !a->in_place}, {"losses", h[3], FB(a->N), true},
        {"dlogits", h[4], FB(n), !a->in_place},
    };
    char name[64];
    snprintf(name, sizeof(name), "crossentropy N%d V%d%s", a->N, a->V,
             a->in_place ? " in place" : "");
    check_kernel(b, name, bufs, CE_NBUF, run_crossentropy, a, TOL);
    free_all(h, CE_NBUF);
  }
}

/* ---- adamw ---------------------------------------------------------------------------- */

enum { AD_PARAM, AD_GRAD, AD_M, AD_V, AD_NBUF };

typedef struct adamw_arg {
  size_t n;
  gpu_adamw_args args;
} adamw_arg;

static void run_adamw(gpu_backend *be, void *const *d, const void *arg) {
  const adamw_arg *a = arg;
  gpu_adamw_update(be, d[AD_PARAM], d[AD_GRAD], d[AD_M], d[AD_V], a->n, &a->args);
}

/* Bit for bit: peers of one stage on different devices step the same
 * averaged gradient and must end with the same weights. */
static void test_adamw(void **state) {
  const backends *b = *state;
  gw_rng r;
  gw_rng_seed(&r, 10);
  const long long steps[] = {1, 7};
  for (size_t k = 0; k < COUNT(steps); k++) {
    adamw_arg a = {10007, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.25f, steps[k]}};
    void *h[AD_NBUF] = {randu(&r, a.n), randu(&r, a.n), rand_floats(&r, a.n, -0.1f, 0.1f),
                        rand_floats(&r, a.n, 0.0f, 0.01f)};
    tbuf bufs[AD_NBUF] = {
        {"param", h[0], FB(a.n), true}, {"grad", h[1], FB(a.n), false},
        {"m", h[2], FB(a.n), true},     {"v", h[3], FB(a.n), true},
    };
    char name[64];
    snprintf(name, sizeof(name), "adamw n%zu step %lld", a.n, steps[k]);
    check_kernel(b, name, bufs, AD_NBUF, run_adamw, &a, 0.0);
    free_all(h, AD_NBUF);
  }
}

/* ---- memory, device --------------------------------------------------------------------- */

static void test_memory(void **state) {
  const backends *b = *state;
  gpu_backend *be = b->cuda;
  void *empty = gpu_alloc(be, 0);
  assert_non_null(empty);
  gpu_free(be, empty);

  const char msg[13] = "odd 13 bytes";
  char back[13];
  void *x = gpu_alloc(be, sizeof(msg)), *y = gpu_alloc(be, sizeof(msg));
  assert_non_null(x);
  assert_non_null(y);
  assert_int_equal(gpu_upload(be, x, msg, sizeof(msg)), 0);
  gpu_copy(be, y, x, sizeof(msg));
  assert_int_equal(gpu_download(be, back, y, sizeof(back)), 0);
  assert_memory_equal(back, msg, sizeof(msg));
  gpu_zero(be, y, sizeof(msg));
  assert_int_equal(gpu_download(be, back, y, sizeof(back)), 0);
  for (size_t i = 0; i < sizeof(back); i++) assert_int_equal(back[i], 0);
  gpu_free(be, x);
  gpu_free(be, y);

  /* Out of memory is the caller's NULL, not a failure of the backend. */
  assert_null(gpu_alloc(be, (size_t)1 << 52));
  assert_int_equal(gpu_sync(be), 0);

  size_t free_b = 0, total_b = 0;
  assert_int_equal(gpu_mem_info(be, &free_b, &total_b), 0);
  assert_true(total_b > 0 && free_b <= total_b);
  gpu_device_info info;
  assert_int_equal(gpu_device_info_get(be, &info), 0);
  assert_true(strlen(info.name) > 0);
  assert_true(info.peak_flops >= 0.0);
  printf("  device %s, peak %.1f TFLOP/s fp32, memory %.1f / %.1f GiB free\n", info.name,
         info.peak_flops / 1e12, (double)free_b / (1u << 30), (double)total_b / (1u << 30));
}

/* Last, because it leaves the CUDA context unusable for this process: a
 * kernel that faults must surface in the next sync and download, and keep
 * doing so. */
static void test_error_latching(void **state) {
  const backends *b = *state;
  gpu_backend *be = b->cuda;
  enum { C = 64 };
  int32_t tok[2] = {0, 1 << 30}; /* row 2^30 of a 2-row table: ~256 GiB out */
  int32_t *dtok = gpu_alloc(be, sizeof(tok));
  float *wte = gpu_alloc(be, FB(2 * C)), *out = gpu_alloc(be, FB(2 * C));
  assert_true(dtok && wte && out);
  assert_int_equal(gpu_upload(be, dtok, tok, sizeof(tok)), 0);
  gpu_encoder_forward(be, out, dtok, wte, NULL, 1, 2, C);
  int rc = gpu_sync(be);
  printf("  faulting kernel -> %s\n", gw_strerror(rc));
  assert_true(rc < 0);
  float host[2 * C];
  assert_int_equal(gpu_download(be, host, out, sizeof(host)), rc);
  gpu_zero(be, out, sizeof(host)); /* a no-op now */
  assert_int_equal(gpu_sync(be), rc);
  gpu_free(be, dtok);
  gpu_free(be, wte);
  gpu_free(be, out);
}

/* ---- main ------------------------------------------------------------------------------------- */

static int open_backends(void **state) {
  backends *b = calloc(1, sizeof(*b));
  if (!b) return -1;
  char err[256];
  gpu_options opt = {.threads = CPU_THREADS};
  gpu_device cpu = {GPU_CPU, 0}, cuda = {GPU_CUDA, 0};
  if (gpu_backend_open(&cpu, &opt, &b->cpu, err, sizeof(err)) ||
      gpu_backend_open(&cuda, &opt, &b->cuda, err, sizeof(err))) {
    fprintf(stderr, "cannot open the backends: %s\n", err);
    gpu_backend_close(b->cpu);
    free(b);
    return -1;
  }
  *state = b;
  return 0;
}

static int close_backends(void **state) {
  backends *b = *state;
  gpu_backend_close(b->cpu);
  gpu_backend_close(b->cuda);
  free(b);
  return 0;
}

int main(void) {
  if (!gpu_have_cuda()) {
    printf("SKIPPED: this build has no CUDA backend (no nvcc at configure time, or "
           "-DGWTF_CUDA=OFF)\n");
    return SKIP_CODE;
  }
  char err[256] = "";
  gpu_device dev = {GPU_CUDA, 0};
  gpu_backend *probe = NULL;
  int rc = gpu_backend_open(&dev, NULL, &probe, err, sizeof(err));
  if (rc == GW_ENOENT) {
    printf("SKIPPED: no CUDA device (%s)\n", err);
    return SKIP_CODE;
  }
  if (rc) {
    fprintf(stderr, "cannot open cuda:0: %s\n", err);
    return 1;
  }
  gpu_backend_close(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_memory),       cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_layernorm),    cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_gelu),         cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_rope),         cmocka_unit_test(test_attention),
      cmocka_unit_test(test_encoder),      cmocka_unit_test(test_crossentropy),
      cmocka_unit_test(test_adamw),        cmocka_unit_test(test_error_latching),
  };
  return cmocka_run_group_tests(tests, open_backends, close_backends);
}
