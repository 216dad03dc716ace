/* Wire formats of activations (train/wire_codec.h): rounding to nearest
 * even against a brute-force neighbour search, error bounds per dtype, the
 * edge cases (zeros, NaN, Inf, denormals, huge values) and hostile sizes. */
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
  assert_int_equal(wire_mask_parse("fp32,bf16,fp16,int8", &m), 0);
  assert_int_equal(m, WIRE_ACCEPT_ALL);
  const char *bad[] = {"", "bf16,", ",bf16", "fp32,,bf16", "bf16x", "verylongname"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) assert_int_equal(wire_mask_parse(bad[i], &m), GW_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bf16_nearest_even), cmocka_unit_test(test_bf16_special),
      cmocka_unit_test(test_f16_nearest_even),  cmocka_unit_test(test_f16_special),
      cmocka_unit_test(test_sizes),             cmocka_unit_test(test_q8_bound),
      cmocka_unit_test(test_q8_edges),          cmocka_unit_test(test_hostile),
      cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
