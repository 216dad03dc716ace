/* The CPU backend's scalar exp (gpu/cpu.h): accurate over the range the
 * kernels use, clamped outside it, and defined for every input a peer can
 * send, NaN and infinities included (UBSan saw a signed-shift overflow on
 * NaN before; the sanitizer build runs this test). */
#include "testutil.h"

#include <math.h>

#include "gpu/cpu.h"

static void test_expf_matches_libm(void **state) {
  (void)state;
  for (float x = -80.0f; x <= 80.0f; x += 0.37f) {
    double want = exp((double)x), got = gpu_cpu_expf(x);
    if (fabs(got - want) > 2e-7 * want) fail_msg("expf(%g) = %.9g, libm %.9g", (double)x, got, want);
  }
}

static void test_expf_clamps(void **state) {
  (void)state;
  assert_float_equal(gpu_cpu_expf(-1e30f), gpu_cpu_expf(-80.0f), 0);
  assert_float_equal(gpu_cpu_expf(1e30f), gpu_cpu_expf(80.0f), 0);
  assert_float_equal(gpu_cpu_expf(-INFINITY), gpu_cpu_expf(-80.0f), 0);
  assert_float_equal(gpu_cpu_expf(INFINITY), gpu_cpu_expf(80.0f), 0);
}

static void test_expf_nan_in_nan_out(void **state) {
  (void)state;
  assert_true(isnan(gpu_cpu_expf(NAN)));
  assert_true(isnan(gpu_cpu_expf(-NAN)));
  assert_true(isnan(gpu_cpu_sigmoidf(NAN)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_expf_matches_libm),
      cmocka_unit_test(test_expf_clamps),
      cmocka_unit_test(test_expf_nan_in_nan_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
