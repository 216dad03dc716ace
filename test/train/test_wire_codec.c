/* Wire formats of activations (train/wire_codec.h): rounding to nearest
 * even against a brute-force neighbour search, error bounds per dtype, the
 * edge cases (zeros, NaN, Inf, denormals, huge values) and hostile sizes;
 * the rotated (rot4/3/2, train/wire_rot.h) and low-rank (lr8/16/32,
 * train/wire_lowrank.h) formats: their error against what the math
 * promises, and every malformed variant of their bytes refused. */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/wire_codec.h"
#include "util/err.h"
#include "util/rng.h"

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* A random float with a random exponent in [2^lo, 2^hi) and a random sign. */
static float rand_float(gw_rng *r, int lo, int hi) {
  double m = 1.0 + (double)(gw_rng_next(r) >> 11) * 0x1p-53;
  int e = lo + (int)(gw_rng_next(r) % (uint64_t)(hi - lo));
  float x = (float)ldexp(m, e);
  return (gw_rng_next(r) & 1) ? -x : x;
}

/* h is the nearest representable value to x among h-1, h, h+1 (same sign
 * half of the code space), ties to the even code. */
static void check_nearest(float x, uint16_t h, float (*dec)(uint16_t), uint16_t max_finite) {
  uint16_t mag = h & 0x7fffu;
  double d = fabs((double)x - (double)dec(h));
  if (mag > 0) {
    double dl = fabs((double)x - (double)dec((uint16_t)(h - 1)));
    if (!(d < dl || (d == dl && (h & 1u) == 0))) fail_msg("x=%a code=%04x is not nearest (below is closer)", (double)x, h);
  }
  if (mag < max_finite) {
    double du = fabs((double)x - (double)dec((uint16_t)(h + 1)));
    if (!(d < du || (d == du && (h & 1u) == 0))) fail_msg("x=%a code=%04x is not nearest (above is closer)", (double)x, h);
  }
}

static void test_bf16_nearest_even(void **state) {
  (void)state;
  gw_rng r;
  gw_rng_seed(&r, 1);
  for (int i = 0; i < 200000; i++) {
    float x = rand_float(&r, -126, 127);
    uint16_t h = wire_f32_to_bf16(x);
    check_nearest(x, h, wire_bf16_to_f32, 0x7f7f);
    float y = wire_bf16_to_f32(h);
    assert_true(fabs((double)y - x) <= ldexp(fabs((double)x), -8)); /* half an ulp of 8 bits: <= 2^-8 relative */
  }
  /* ties: 1 + 2^-8 sits halfway between 1 and 1 + 2^-7: goes to the even 1 */
  assert_true(wire_bf16_to_f32(wire_f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
  assert_true(wire_bf16_to_f32(wire_f32_to_bf16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  /* every bf16 value survives the round trip */
  for (uint32_t c = 0; c < 0x10000; c++) {
    float f = wire_bf16_to_f32((uint16_t)c);
    if (isnan(f)) assert_true(isnan(wire_bf16_to_f32(wire_f32_to_bf16(f))));
    else assert_int_equal(wire_f32_to_bf16(f), c);
  }
}

static void test_bf16_special(void **state) {
  (void)state;
  assert_true(isnan(wire_bf16_to_f32(wire_f32_to_bf16(NAN))));
  /* a NaN whose payload sits only in the low bits must not become Inf */
  assert_true(isnan(wire_bf16_to_f32(wire_f32_to_bf16(bits_f(0x7f800001u)))));
  assert_true(isnan(wire_bf16_to_f32(wire_f32_to_bf16(bits_f(0xffffffffu)))));
  assert_true(wire_bf16_to_f32(wire_f32_to_bf16(INFINITY)) == INFINITY);
  assert_true(wire_bf16_to_f32(wire_f32_to_bf16(-INFINITY)) == -INFINITY);
  assert_true(signbit(wire_bf16_to_f32(wire_f32_to_bf16(-0.0f))));
  /* FLT_MAX rounds up past the largest bf16: Inf, as round-to-nearest says */
  assert_true(wire_bf16_to_f32(wire_f32_to_bf16(FLT_MAX)) == INFINITY);
  /* denormals keep 2^-133 absolute precision */
  float d = bits_f(0x00012345u);
  assert_true(fabsf(wire_bf16_to_f32(wire_f32_to_bf16(d)) - d) <= 0x1p-134f);
}

static void test_f16_nearest_even(void **state) {
  (void)state;
  gw_rng r;
  gw_rng_seed(&r, 2);
  for (int i = 0; i < 200000; i++) {
    float x = rand_float(&r, -26, 16); /* subnormal halves up to 65535 */
    if (fabsf(x) >= 65520.0f) continue;
    uint16_t h = wire_f32_to_f16(x);
    check_nearest(x, h, wire_f16_to_f32, 0x7bff);
    float y = wire_f16_to_f32(h);
    if (fabsf(x) >= 0x1p-14f) assert_true(fabs((double)y - x) <= ldexp(fabs((double)x), -11));
    else assert_true(fabs((double)y - x) <= 0x1p-25);
  }
  for (uint32_t c = 0; c < 0x10000; c++) {
    float f = wire_f16_to_f32((uint16_t)c);
    if (isnan(f)) assert_true(isnan(wire_f16_to_f32(wire_f32_to_f16(f))));
    else assert_int_equal(wire_f32_to_f16(f), c);
  }
}

static void test_f16_special(void **state) {
  (void)state;
  assert_true(wire_f16_to_f32(wire_f32_to_f16(65504.0f)) == 65504.0f);
  assert_true(wire_f16_to_f32(wire_f32_to_f16(65519.0f)) == 65504.0f);
  assert_true(wire_f16_to_f32(wire_f32_to_f16(65520.0f)) == INFINITY); /* the tie goes to the even: Inf */
  assert_true(wire_f16_to_f32(wire_f32_to_f16(-1e30f)) == -INFINITY);
  assert_true(wire_f16_to_f32(wire_f32_to_f16(FLT_MAX)) == INFINITY);
  assert_true(wire_f16_to_f32(wire_f32_to_f16(INFINITY)) == INFINITY);
  assert_true(isnan(wire_f16_to_f32(wire_f32_to_f16(NAN))));
  assert_true(isnan(wire_f16_to_f32(wire_f32_to_f16(bits_f(0x7f800001u)))));
  assert_true(wire_f16_to_f32(wire_f32_to_f16(0x1p-24f)) == 0x1p-24f);  /* smallest subnormal */
  assert_true(wire_f16_to_f32(wire_f32_to_f16(0x1p-25f)) == 0.0f);      /* tie to even: 0 */
  assert_true(wire_f16_to_f32(wire_f32_to_f16(0x1.8p-25f)) == 0x1p-24f);
  assert_true(wire_f16_to_f32(wire_f32_to_f16(bits_f(0x00000001u))) == 0.0f); /* float denormal */
  assert_true(signbit(wire_f16_to_f32(wire_f32_to_f16(-0.0f))));
  assert_true(wire_f16_to_f32(wire_f32_to_f16(0x1.ffcp-15f)) == 0x1p-14f); /* rounds up into the normals */
}

/* Encodes and decodes rows x cols, checking the byte count. */
static float *round_trip(train_dtype d, const float *x, size_t rows, size_t cols) {
  size_t n = wire_bytes(d, rows, cols);
  assert_true(n > 0);
  uint8_t *buf = malloc(n);
  float *y = malloc(rows * cols * sizeof(float));
  assert_non_null(buf);
  assert_non_null(y);
  assert_int_equal(wire_encode(d, x, rows, cols, buf, n), 0);
  assert_int_equal(wire_check(d, buf, n, rows, cols), 0);
  assert_int_equal(wire_decode(d, buf, n, rows, cols, y), 0);
  free(buf);
  return y;
}

static void test_sizes(void **state) {
  (void)state;
  assert_int_equal(wire_bytes(TRAIN_F32, 256, 64), 256 * 64 * 4);
  assert_int_equal(wire_bytes(TRAIN_BF16, 256, 64), 256 * 64 * 2);
  assert_int_equal(wire_bytes(TRAIN_F16, 256, 64), 256 * 64 * 2);
  assert_int_equal(wire_bytes(TRAIN_Q8ROW, 256, 64), 256 * 68);
  assert_int_equal(wire_bytes(TRAIN_I32, 256, 64), 0);
  assert_int_equal(wire_bytes(TRAIN_F32, SIZE_MAX / 2, 4), 0); /* overflow: no size */
  assert_int_equal(wire_bytes(TRAIN_Q8ROW, 2, SIZE_MAX - 2), 0);
  /* rotated: a bf16 scale, then bits x C packed (the tiny model's 128: 7.8x, 10.2x, 15.1x) */
  assert_int_equal(wire_bytes(TRAIN_R4ROW, 256, 128), 256 * 66);
  assert_int_equal(wire_bytes(TRAIN_R3ROW, 256, 128), 256 * 50);
  assert_int_equal(wire_bytes(TRAIN_R2ROW, 256, 128), 256 * 34);
  assert_int_equal(wire_bytes(TRAIN_R3ROW, 4, 5), 4 * (2 + 2)); /* 15 bits: 2 bytes, one padding bit */
  assert_int_equal(wire_shape_last(TRAIN_R3ROW, 128), 50);
  assert_int_equal(wire_shape_last(TRAIN_Q8ROW, 128), 132);
  assert_int_equal(wire_shape_last(TRAIN_BF16, 128), 128);
  /* low rank: mean (bf16) + (rows + cols) factor rows of a bf16 scale and rank int8 */
  assert_int_equal(wire_bytes(TRAIN_LR8, 256, 128), 256 + 384 * 10);
  assert_int_equal(wire_bytes(TRAIN_LR16, 256, 128), 256 + 384 * 18);
  assert_int_equal(wire_bytes(TRAIN_LR32, 256, 128), 256 + 384 * 34);
  /* rank 32 with rotated 4-bit factor rows: a bf16 scale and 16 bytes of codes */
  assert_int_equal(wire_bytes(TRAIN_LR32R4, 256, 128), 256 + 384 * 18);
  assert_int_equal(wire_bytes(TRAIN_LR16R4, 256, 128), 256 + 384 * 10);
  /* rotated 5 bits: 80 bytes of codes for 128 (6.2x), 4 x (2 + 4) for 5 x 5 bits: 1 padding bit */
  assert_int_equal(wire_bytes(TRAIN_R5ROW, 256, 128), 256 * 82);
  assert_int_equal(wire_bytes(TRAIN_R5ROW, 4, 5), 4 * (2 + 4));
  assert_int_equal(wire_shape_last(TRAIN_LR32R4, 128), 0);
  assert_int_equal(wire_shape_last(TRAIN_LR16, 128), 0); /* not row by row */
  assert_int_equal(wire_bytes(TRAIN_LR32, SIZE_MAX / 8, 8), 0);
  assert_int_equal(wire_bytes(TRAIN_R2ROW, 2, SIZE_MAX / 2), 0);
}

/* A unit Gaussian (Box-Muller). */
static float gauss(gw_rng *r) {
  double u1 = ((double)(gw_rng_next(r) >> 11) + 1) * 0x1p-53, u2 = (double)(gw_rng_next(r) >> 11) * 0x1p-53;
  return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

static double sq_err(const float *x, const float *y, size_t n, double *energy) {
  double e = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    s += (double)x[i] * x[i];
  }
  *energy = s;
  return e;
}

/* Rows of very different scales, Gaussian or with one outlier coordinate
 * 30x the rest (the residual stream's shape): the relative squared error of
 * the whole tensor is what Lloyd-Max promises for a Gaussian (0.0025,
 * 0.0095, 0.0345, 0.1175) within a margin, thanks to the rotation, and no row is
 * ever off by more than its own norm. */
static void test_rot_bounds(void **state) {
  (void)state;
  const train_dtype ds[] = {TRAIN_R5ROW, TRAIN_R4ROW, TRAIN_R3ROW, TRAIN_R2ROW};
  const double want[] = {0.0025, 0.0095, 0.0345, 0.1175};
  const size_t shapes[][2] = {{256, 128}, {64, 96}, {32, 1024}};
  gw_rng r;
  gw_rng_seed(&r, 5);
  for (size_t sh = 0; sh < 3; sh++) {
    size_t rows = shapes[sh][0], cols = shapes[sh][1];
    float *x = malloc(rows * cols * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < rows; i++) {
      double scale = ldexp(1.0, (int)(gw_rng_next(&r) % 60) - 30);
      for (size_t j = 0; j < cols; j++) x[i * cols + j] = (float)(scale * gauss(&r));
      if (i % 2) x[i * cols + (i % cols)] *= 30.0f; /* an outlier */
    }
    for (size_t k = 0; k < 4; k++) {
      float *y = round_trip(ds[k], x, rows, cols);
      double rel_sum = 0;
      for (size_t i = 0; i < rows; i++) {
        double en, e = sq_err(x + i * cols, y + i * cols, cols, &en);
        if (e > en * 1.01) fail_msg("%s row %zu: error %g > norm %g", wire_dtype_name(ds[k]), i, e, en);
        rel_sum += e / en;
      }
      double rel = rel_sum / (double)rows;
      /* 96 = 3 x 32: blocks of 32 mix less than one block of 128 */
      double margin = cols == 96 ? 1.6 : 1.25;
      if (rel > want[k] * margin || rel < want[k] * 0.5)
        fail_msg("%s at %zux%zu: mean relative squared error %g, Gaussian %g", wire_dtype_name(ds[k]), rows, cols, rel,
                 want[k]);
      free(y);
    }
    free(x);
  }
}

/* The worst case for a rotation: a row that the rotation turns into a
 * single spike. The error stays below the row's norm (the least-squares
 * gain never does worse than sending zero). */
static void test_rot_worst_case(void **state) {
  (void)state;
  enum { C = 64 };
  float x[C], sign[C];
  /* find D: the codec's signs, by rotating unit vectors... simpler: a row
   * that is H times a spike, whatever D is, is a spike after H D only when
   * D = I; so try every +-1 pattern of the first row of H with random flips
   * and keep the bound for each. */
  gw_rng r;
  gw_rng_seed(&r, 6);
  for (int t = 0; t < 200; t++) {
    for (int j = 0; j < C; j++) sign[j] = (gw_rng_next(&r) & 1) ? -1.0f : 1.0f;
    for (int j = 0; j < C; j++) x[j] = sign[j] * (t % 2 ? 1.0f : (j == t % C ? 50.0f : 0.01f));
    for (unsigned k = 0; k < 3; k++) {
      const train_dtype d = k == 0 ? TRAIN_R4ROW : k == 1 ? TRAIN_R3ROW : TRAIN_R2ROW;
      float *y = round_trip(d, x, 1, C);
      double en, e = sq_err(x, y, C, &en);
      if (e > en * 1.01) fail_msg("%s try %d: error %g > norm %g", wire_dtype_name(d), t, e, en);
      free(y);
    }
  }
}

static void test_rot_edges(void **state) {
  (void)state;
  enum { C = 12 }; /* block of 4: three rotations per row; 12 x 3 bits = 36: 4 padding bits */
  const float sub = bits_f(0x00000005u);
  float x[5][C] = {
      {0, 0, 0, 0, 0, -0.0f, 0, 0, 0, 0, 0, 0},
      {1.0f, NAN, -2.0f, 3.0f, 0.5f, 1, 1, 1, 1, 1, 1, 1},
      {sub, -sub, 2 * sub, 0, sub, -3 * sub, sub, sub, sub, sub, sub, sub},
      {FLT_MAX, -FLT_MAX, 1e30f, 0, -1e38f, 3e38f, FLT_MAX, FLT_MAX, -FLT_MAX, 1, 2, 3},
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, INFINITY},
  };
  for (unsigned k = 0; k < 3; k++) {
    const train_dtype d = k == 0 ? TRAIN_R4ROW : k == 1 ? TRAIN_R3ROW : TRAIN_R2ROW;
    float *y = round_trip(d, &x[0][0], 5, C);
    for (int j = 0; j < C; j++) {
      assert_true(y[j] == 0.0f);                  /* zero row: zeros */
      assert_true(isnan(y[C + j]));               /* a NaN smears over its row: all NaN */
      assert_true(isfinite(y[2 * C + j]));        /* denormals stay finite (and tiny) */
      assert_true(fabsf(y[2 * C + j]) < 1e-38f);
      assert_true(isfinite(y[3 * C + j]));        /* huge rows do not overflow */
      assert_true(isnan(y[4 * C + j]));           /* Inf too */
    }
    double en, e = sq_err(x[3], y + 3 * C, C, &en);
    assert_true(e <= en * 1.01);
    free(y);
  }
}

/* mean + a rank-k tensor (k <= rank) + small noise comes back within the
 * noise and the int8 steps; of a full-rank Gaussian it keeps clearly more
 * than any fixed r-dimensional subspace would (r/C of the energy): its top
 * directions, found per tensor. */
static void test_lr_bounds(void **state) {
  (void)state;
  enum { R = 256, C = 128, K = 6 };
  gw_rng r;
  gw_rng_seed(&r, 7);
  float *x = malloc(R * C * sizeof(float)), *a = malloc(R * K * sizeof(float)), *b = malloc(C * K * sizeof(float));
  float mu[C];
  assert_non_null(x);
  for (int i = 0; i < R * K; i++) a[i] = gauss(&r) * (float)(1 + i % K);
  for (int i = 0; i < C * K; i++) b[i] = gauss(&r);
  for (int j = 0; j < C; j++) mu[j] = 3.0f * gauss(&r);
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++) {
      double v = mu[j] + 1e-3 * gauss(&r);
      for (int k = 0; k < K; k++) v += (double)a[i * K + k] * b[j * K + k];
      x[i * C + j] = (float)v;
    }
  const train_dtype ds[] = {TRAIN_LR8, TRAIN_LR16, TRAIN_LR32};
  for (int k = 0; k < 3; k++) {
    float *y = round_trip(ds[k], x, R, C);
    double en, e = sq_err(x, y, R * C, &en);
    /* int8 factors: half a step of 1/127 per factor value, relative */
    if (e > en * 2e-4) fail_msg("%s on a rank-%d tensor: relative squared error %g", wire_dtype_name(ds[k]), K, e / en);
    free(y);
  }
  /* 4-bit factor rows: about 1 % squared error in each of U and V */
  float *y4 = round_trip(TRAIN_LR32R4, x, R, C);
  double en4, e4 = sq_err(x, y4, R * C, &en4);
  if (e4 > en4 * 0.03) fail_msg("lr32r4 on a rank-%d tensor: relative squared error %g", K, e4 / en4);
  free(y4);
  y4 = round_trip(TRAIN_LR16R4, x, R, C);
  e4 = sq_err(x, y4, R * C, &en4);
  if (e4 > en4 * 0.03) fail_msg("lr16r4 on a rank-%d tensor: relative squared error %g", K, e4 / en4);
  free(y4);
  for (int i = 0; i < R * C; i++) x[i] = gauss(&r);
  const double rank[] = {8, 16, 32};
  for (int k = 0; k < 3; k++) {
    float *y = round_trip(ds[k], x, R, C);
    double en, e = sq_err(x, y, R * C, &en);
    /* a random 256 x 128 Gaussian's top-r subspace holds well above r/C
     * (its singular values spread, Marchenko-Pastur): 8: ~12 %, 32: ~50 % */
    double fixed = 1.0 - rank[k] / C;
    if (e / en > fixed - 0.5 * rank[k] / C || e / en < 0.3)
      fail_msg("%s on a Gaussian: relative squared error %g, a fixed rank-%g subspace %g", wire_dtype_name(ds[k]),
               e / en, rank[k], fixed);
    free(y);
  }
  /* lr32r4 keeps the same subspace as lr32, up to its 4-bit steps */
  float *y32 = round_trip(TRAIN_LR32, x, R, C);
  y4 = round_trip(TRAIN_LR32R4, x, R, C);
  double e32 = sq_err(x, y32, R * C, &en4);
  e4 = sq_err(x, y4, R * C, &en4);
  if (e4 > e32 + 0.03 * en4) fail_msg("lr32r4 on a Gaussian: %g, lr32 %g", e4 / en4, e32 / en4);
  free(y32);
  free(y4);
  free(x);
  free(a);
  free(b);
}

static void lr_edges(train_dtype d) {
  enum { R = 20, C = 12 };
  float x[R * C];
  /* every row the same: only the mean, exact to bf16 */
  for (int i = 0; i < R * C; i++) x[i] = (float)(i % C) - 5.25f;
  float *y = round_trip(d, x, R, C);
  for (int i = 0; i < R * C; i++) assert_true(y[i] == x[i]);
  free(y);
  /* zeros */
  memset(x, 0, sizeof(x));
  y = round_trip(d, x, R, C);
  for (int i = 0; i < R * C; i++) assert_true(y[i] == 0.0f);
  free(y);
  /* one NaN (or Inf): the whole tensor decodes to NaN */
  for (int i = 0; i < R * C; i++) x[i] = (float)i;
  x[77] = INFINITY;
  y = round_trip(d, x, R, C);
  for (int i = 0; i < R * C; i++) assert_true(isnan(y[i]));
  free(y);
  /* denormals only: no overflow in the scaling */
  for (int i = 0; i < R * C; i++) x[i] = bits_f(0x00000001u + (uint32_t)(i % 5));
  y = round_trip(d, x, R, C);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]) && fabsf(y[i]) < 1e-38f);
  free(y);
  /* +-FLT_MAX in one column: finite */
  for (int i = 0; i < R * C; i++) x[i] = (i % C == 0) ? (i % 2 ? FLT_MAX : -FLT_MAX) : 1.0f;
  y = round_trip(d, x, R, C);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]));
  free(y);
  /* huge values: finite, and close (rank 12 >= C holds the whole tensor) */
  for (int i = 0; i < R * C; i++) x[i] = (i % 2 ? -1.0f : 1.0f) * (float)(i % 7) * 4e37f;
  y = round_trip(d == TRAIN_LR8 ? TRAIN_LR32 : d, x, R, C);
  double en, e = sq_err(x, y, R * C, &en);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]));
  assert_true(e < en * 0.05);
  free(y);
}

static void test_lr_edges(void **state) {
  (void)state;
  lr_edges(TRAIN_LR8);
  lr_edges(TRAIN_LR32R4);
}

/* Every way a rotated or low-rank tensor can be malformed is refused by
 * wire_check and wire_decode alike, and a valid but foreign one decodes to
 * finite values. */
static void test_hostile_compressed(void **state) {
  (void)state;
  enum { R = 3, C = 12 };
  float x[R * C], y[R * C];
  for (int i = 0; i < R * C; i++) x[i] = (float)i - 7.0f;
  uint8_t buf[1024], b2[1024];
  /* rotated, 3 bits: rows of 2 + 5 bytes (36 bits: 4 padding bits) */
  size_t n = wire_bytes(TRAIN_R3ROW, R, C), rb = n / R;
  assert_int_equal(rb, 2 + 5);
  assert_int_equal(wire_encode(TRAIN_R3ROW, x, R, C, buf, n), 0);
  assert_int_equal(wire_decode(TRAIN_R3ROW, buf, n - 1, R, C, y), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_R3ROW, buf, n + 1, R, C, y), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_R4ROW, buf, n, R, C, y), GW_EPROTO); /* another format's size */
  const uint16_t bad_scale[] = {0xbf80u /* -1 */, 0x7f80u /* Inf */, 0x7fc1u /* a NaN, not the marker */, 0xffc0u,
                                0x8001u};
  for (size_t k = 0; k < sizeof(bad_scale) / sizeof(bad_scale[0]); k++) {
    memcpy(b2, buf, n);
    memcpy(b2 + rb, &bad_scale[k], 2); /* the second row's scale */
    assert_int_equal(wire_check(TRAIN_R3ROW, b2, n, R, C), GW_EPROTO);
    assert_int_equal(wire_decode(TRAIN_R3ROW, b2, n, R, C, y), GW_EPROTO);
  }
  memcpy(b2, buf, n);
  b2[2 * rb - 1] |= 0x80; /* a padding bit of the second row */
  assert_int_equal(wire_check(TRAIN_R3ROW, b2, n, R, C), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_R3ROW, b2, n, R, C, y), GW_EPROTO);
  memcpy(b2, buf, n);
  uint16_t marker = 0x7fc0u;
  memcpy(b2, &marker, 2); /* "not finite" with codes that are not zero */
  assert_int_equal(wire_check(TRAIN_R3ROW, b2, n, R, C), GW_EPROTO);
  memset(b2 + 2, 0, rb - 2); /* a real marker row: NaN */
  assert_int_equal(wire_decode(TRAIN_R3ROW, b2, n, R, C, y), 0);
  assert_true(isnan(y[0]) && isfinite(y[C]));
  memcpy(b2, buf, n);
  uint16_t huge = 0x7f7fu; /* the largest finite scale, every code the largest level */
  for (int i = 0; i < R; i++) {
    memcpy(b2 + i * rb, &huge, 2);
    memset(b2 + i * rb + 2, 0xff, rb - 2);
    b2[i * rb + rb - 1] = 0x0f; /* padding stays zero */
  }
  assert_int_equal(wire_decode(TRAIN_R3ROW, b2, n, R, C, y), 0);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]));

  /* low rank 8 at 3 x 12: mean (24 bytes), then 12 + 3 factor rows of 10 */
  n = wire_bytes(TRAIN_LR8, R, C);
  assert_int_equal(n, 24 + 15 * 10);
  assert_int_equal(wire_encode(TRAIN_LR8, x, R, C, buf, n), 0);
  assert_int_equal(wire_check(TRAIN_LR8, buf, n, R, C), 0);
  assert_int_equal(wire_decode(TRAIN_LR8, buf, n - 1, R, C, y), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_LR16, buf, n, R, C, y), GW_EPROTO); /* rank 16 needs more */
  const size_t at[] = {2 * 3 /* a mean */, 24 + 4 * 10 /* a V row's scale */, 24 + 13 * 10 /* a U row's scale */};
  const uint16_t bad[] = {0x7f80u, 0xff80u, 0x7fc0u, 0x7fa0u};
  for (size_t p = 0; p < 3; p++)
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
      memcpy(b2, buf, n);
      memcpy(b2 + at[p], &bad[k], 2);
      assert_int_equal(wire_check(TRAIN_LR8, b2, n, R, C), GW_EPROTO);
      assert_int_equal(wire_decode(TRAIN_LR8, b2, n, R, C, y), GW_EPROTO);
    }
  memcpy(b2, buf, n);
  uint16_t neg = 0xbf80u; /* a negative factor scale */
  memcpy(b2 + 24 + 2 * 10, &neg, 2);
  assert_int_equal(wire_check(TRAIN_LR8, b2, n, R, C), GW_EPROTO);
  /* a marker in every mean, but a factor that is not zero */
  memset(b2, 0, n);
  for (int j = 0; j < C; j++) memcpy(b2 + 2 * j, &marker, 2);
  assert_int_equal(wire_decode(TRAIN_LR8, b2, n, R, C, y), 0);
  assert_true(isnan(y[0]) && isnan(y[R * C - 1]));
  b2[n - 1] = 1;
  assert_int_equal(wire_check(TRAIN_LR8, b2, n, R, C), GW_EPROTO);
  /* a marker in only some means */
  memcpy(b2, buf, n);
  memcpy(b2, &marker, 2);
  assert_int_equal(wire_check(TRAIN_LR8, b2, n, R, C), GW_EPROTO);
  /* the largest finite everything: clamped, finite */
  for (size_t i = 0; i < n; i += 2) memcpy(b2 + i, &huge, 2);
  for (size_t f = 0; f < 15; f++) memset(b2 + 24 + f * 10 + 2, 0x7f, 8);
  assert_int_equal(wire_decode(TRAIN_LR8, b2, n, R, C, y), 0);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]));

  /* rank 32 with rotated 4-bit factor rows: mean, then 15 rows of 2 + 16 */
  n = wire_bytes(TRAIN_LR32R4, R, C);
  assert_int_equal(n, 24 + 15 * 18);
  assert_int_equal(wire_encode(TRAIN_LR32R4, x, R, C, buf, n), 0);
  assert_int_equal(wire_check(TRAIN_LR32R4, buf, n, R, C), 0);
  assert_int_equal(wire_decode(TRAIN_LR32, buf, n, R, C, y), GW_EPROTO); /* int8 rows are longer */
  const uint16_t bad4[] = {0xbf80u /* -1 */, 0x7f80u, 0x7fc1u};
  for (size_t p = 0; p < 2; p++)
    for (size_t k = 0; k < sizeof(bad4) / sizeof(bad4[0]); k++) {
      memcpy(b2, buf, n);
      memcpy(b2 + 24 + (p ? 13 : 4) * 18, &bad4[k], 2); /* a V row's, a U row's scale */
      assert_int_equal(wire_check(TRAIN_LR32R4, b2, n, R, C), GW_EPROTO);
      assert_int_equal(wire_decode(TRAIN_LR32R4, b2, n, R, C, y), GW_EPROTO);
    }
  memset(b2, 0, n); /* the marker, with one factor code that is not zero */
  for (int j = 0; j < C; j++) memcpy(b2 + 2 * j, &marker, 2);
  assert_int_equal(wire_decode(TRAIN_LR32R4, b2, n, R, C, y), 0);
  assert_true(isnan(y[0]) && isnan(y[R * C - 1]));
  b2[n - 1] = 0x10;
  assert_int_equal(wire_check(TRAIN_LR32R4, b2, n, R, C), GW_EPROTO);
  /* the largest scales and levels everywhere: clamped, finite */
  for (size_t i = 0; i < n; i += 2) memcpy(b2 + i, &huge, 2);
  for (size_t f = 0; f < 15; f++) memset(b2 + 24 + f * 18 + 2, 0xff, 16);
  assert_int_equal(wire_decode(TRAIN_LR32R4, b2, n, R, C, y), 0);
  for (int i = 0; i < R * C; i++) assert_true(isfinite(y[i]));
}

static void test_q8_bound(void **state) {
  (void)state;
  gw_rng r;
  gw_rng_seed(&r, 3);
  size_t rows = 64, cols = 96;
  float *x = malloc(rows * cols * sizeof(float));
  assert_non_null(x);
  for (size_t i = 0; i < rows; i++) {
    int e = (int)(gw_rng_next(&r) % 80) - 40; /* rows of very different scales */
    for (size_t j = 0; j < cols; j++) x[i * cols + j] = rand_float(&r, e - 6, e + 1);
  }
  float *y = round_trip(TRAIN_Q8ROW, x, rows, cols);
  for (size_t i = 0; i < rows; i++) {
    double m = 0;
    for (size_t j = 0; j < cols; j++) m = fmax(m, fabs((double)x[i * cols + j]));
    double half_step = m / 254.0;
    for (size_t j = 0; j < cols; j++) {
      double err = fabs((double)y[i * cols + j] - x[i * cols + j]);
      /* half a step, plus the float rounding of the decoded value */
      if (err > half_step * (1 + 1e-9) + ldexp(fabs((double)y[i * cols + j]), -24))
        fail_msg("row %zu col %zu: x=%g y=%g err=%g > %g", i, j, (double)x[i * cols + j], (double)y[i * cols + j], err,
                 half_step);
    }
  }
  /* the row maximum itself comes back exactly (q = +-127) */
  free(y);
  free(x);
}

static void test_q8_edges(void **state) {
  (void)state;
  enum { C = 6 };
  const float sub = bits_f(0x00000005u);
  float x[5][C] = {
      {0, 0, 0, 0, 0, -0.0f},                             /* zeros */
      {1.0f, NAN, -2.0f, INFINITY, 0.5f, -INFINITY},      /* non-finite among finite */
      {sub, -sub, 2 * sub, 0, sub, -3 * sub},             /* float denormals */
      {FLT_MAX, -FLT_MAX, 1e30f, 0, -1e38f, 3e38f},       /* huge */
      {NAN, NAN, INFINITY, -INFINITY, NAN, NAN},          /* nothing finite */
  };
  float *y = round_trip(TRAIN_Q8ROW, &x[0][0], 5, C);
  for (int j = 0; j < C; j++) assert_true(y[j] == 0.0f);
  assert_true(fabsf(y[C + 0] - 1.0f) <= 2.0f / 254);
  assert_true(isnan(y[C + 1]) && isnan(y[C + 3]) && isnan(y[C + 5])); /* non-finite stays non-finite */
  assert_true(y[C + 2] == -2.0f);
  for (int j = 0; j < C; j++) {
    assert_true(isfinite(y[2 * C + j]));
    assert_true(fabs((double)y[2 * C + j] - x[2][j]) <= 3.0 * 0x1p-149 / 254 * 1.0001 + 0x1p-149);
    assert_true(isfinite(y[3 * C + j]));
    assert_true(fabs((double)y[3 * C + j] - x[3][j]) <= (double)FLT_MAX / 254 * 1.0001);
    assert_true(isnan(y[4 * C + j]));
  }
  assert_true(y[3 * C + 0] == FLT_MAX && y[3 * C + 1] == -FLT_MAX);
  free(y);
  /* bf16 and f16 keep NaN and Inf through whole tensors too */
  float z[4] = {NAN, INFINITY, -INFINITY, 1.5f};
  for (int k = 0; k < 2; k++) {
    float *w = round_trip(k ? TRAIN_F16 : TRAIN_BF16, z, 1, 4);
    assert_true(isnan(w[0]) && w[1] == INFINITY && w[2] == -INFINITY && w[3] == 1.5f);
    free(w);
  }
  float *w = round_trip(TRAIN_F32, z, 2, 2);
  assert_memory_equal(w, z, sizeof(z));
  free(w);
}

static void test_hostile(void **state) {
  (void)state;
  enum { R = 3, C = 5 };
  float x[R * C], y[R * C + 8];
  for (int i = 0; i < R * C; i++) x[i] = (float)i - 7.0f;
  uint8_t buf[R * (C + 4) + 16];
  size_t n = wire_bytes(TRAIN_Q8ROW, R, C);
  assert_int_equal(wire_encode(TRAIN_Q8ROW, x, R, C, buf, n), 0);
  /* lengths other than exactly what the shape needs */
  assert_int_equal(wire_decode(TRAIN_Q8ROW, buf, n - 1, R, C, y), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_Q8ROW, buf, n + 1, R, C, y), GW_EPROTO);
  assert_int_equal(wire_decode(TRAIN_BF16, buf, n, R, C, y), GW_EPROTO);
  assert_int_equal(wire_check(TRAIN_Q8ROW, buf, n - 4, R, C), GW_EPROTO);
  /* a shape whose size overflows is refused before anything is read */
  assert_int_equal(wire_decode(TRAIN_F32, buf, 16, SIZE_MAX / 2, 8, y), GW_EPROTO);
  assert_int_equal(wire_check(TRAIN_Q8ROW, buf, 16, SIZE_MAX / 4, SIZE_MAX / 4), GW_EPROTO);
  /* unknown dtypes */
  assert_int_equal(wire_decode(TRAIN_I32, buf, n, R, C, y), GW_EINVAL);
  assert_int_equal(wire_decode((train_dtype)99, buf, n, R, C, y), GW_EINVAL);
  assert_int_equal(wire_encode(TRAIN_U8, x, R, C, buf, n), GW_EINVAL);
  assert_int_equal(wire_encode(TRAIN_Q8ROW, x, R, C, buf, n - 1), GW_EINVAL);
  /* a row scale that is NaN, Inf or negative */
  const uint32_t bad[] = {0x7fc00000u, 0x7f800000u, 0xbf800000u, 0x80000001u};
  for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
    uint8_t b2[sizeof(buf)];
    memcpy(b2, buf, n);
    memcpy(b2 + 2 * (C + 4), &bad[k], 4); /* the third row's scale */
    assert_int_equal(wire_check(TRAIN_Q8ROW, b2, n, R, C), GW_EPROTO);
    assert_int_equal(wire_decode(TRAIN_Q8ROW, b2, n, R, C, y), GW_EPROTO);
  }
  /* a valid but foreign scale decodes to bounded values: |q| <= 128 steps */
  uint8_t b3[sizeof(buf)];
  memcpy(b3, buf, n);
  float big = 1e30f;
  memcpy(b3, &big, 4);
  assert_int_equal(wire_decode(TRAIN_Q8ROW, b3, n, R, C, y), 0);
  for (int j = 0; j < C; j++) assert_true(isnan(y[j]) || fabsf(y[j]) <= big * 128 / 127);
}

static void test_names(void **state) {
  (void)state;
  train_dtype d;
  assert_int_equal(wire_dtype_parse("int8", &d), 0);
  assert_int_equal(d, TRAIN_Q8ROW);
  assert_string_equal(wire_dtype_name(TRAIN_BF16), "bf16");
  assert_int_equal(wire_dtype_parse("fp8", &d), GW_EINVAL);
  uint32_t m;
  assert_int_equal(wire_mask_parse("bf16", &m), 0);
  assert_int_equal(m, WIRE_BIT(TRAIN_F32) | WIRE_BIT(TRAIN_BF16)); /* fp32 is always accepted */
  assert_int_equal(wire_mask_parse("fp32,bf16,fp16,int8,rot5,rot4,rot3,rot2,lr8,lr16,lr32,lr16r4,lr32r4", &m), 0);
  assert_int_equal(m, WIRE_ACCEPT_ALL);
  assert_int_equal(wire_dtype_parse("rot3", &d), 0);
  assert_int_equal(d, TRAIN_R3ROW);
  assert_string_equal(wire_dtype_name(TRAIN_LR32), "lr32");
  train_dtype a, g;
  assert_int_equal(wire_pair_parse("rot4/lr32", &a, &g), 0);
  assert_true(a == TRAIN_R4ROW && g == TRAIN_LR32);
  assert_int_equal(wire_pair_parse("rot4/lr32r4", &a, &g), 0);
  assert_true(a == TRAIN_R4ROW && g == TRAIN_LR32R4);
  assert_int_equal(wire_pair_parse("rot5/lr16r4", &a, &g), 0);
  assert_true(a == TRAIN_R5ROW && g == TRAIN_LR16R4);
  assert_int_equal(wire_pair_parse("int8", &a, &g), 0);
  assert_true(a == TRAIN_Q8ROW && g == TRAIN_Q8ROW);
  const char *badp[] = {"", "rot4/", "/lr8", "rot4/lr8/x", "rot6/lr8", "rot4/lr9", "verylong/lr8", NULL};
  for (size_t i = 0; i < sizeof(badp) / sizeof(badp[0]); i++) assert_int_equal(wire_pair_parse(badp[i], &a, &g), GW_EINVAL);
  const char *bad[] = {"", "bf16,", ",bf16", "fp32,,bf16", "bf16x", "verylongname"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) assert_int_equal(wire_mask_parse(bad[i], &m), GW_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_nearest_even), cmocka_unit_test(test_bf16_special),
      cmocka_unit_test(test_f16_nearest_even),  cmocka_unit_test(test_f16_special),
      cmocka_unit_test(test_sizes),             cmocka_unit_test(test_q8_bound),
      cmocka_unit_test(test_q8_edges),          cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_names),             cmocka_unit_test(test_rot_bounds),
      cmocka_unit_test(test_rot_worst_case),    cmocka_unit_test(test_rot_edges),
      cmocka_unit_test(test_lr_bounds),         cmocka_unit_test(test_lr_edges),
      cmocka_unit_test(test_hostile_compressed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
