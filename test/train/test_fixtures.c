/* test/train/test_fixtures.c — every committed PyTorch fixture passes on
 * the CPU backend, and the checker notices a wrong value. */
#include "train_testutil.h"

#include "train/fixture.h"
#include "train/safetensors.h"
#include "util/err.h"
#include "util/file.h"

typedef struct tally {
  int n;
  int failed;
  char first_failed[96];
} tally;

static void count(void *ud, const fixture_result *r) {
  tally *t = ud;
  t->n++;
  if (!r->ok && !t->failed++) snprintf(t->first_failed, sizeof(t->first_failed), "%s", r->name);
  if (!r->ok) print_message("  %s: rel %.3g\n", r->name, r->rel);
}

static void fixture_path(const char *name, char *out, size_t len) {
  const char *src = getenv("GWTF_SOURCE_DIR");
  snprintf(out, len, "%s/test/fixtures/%s", src ? src : ".", name);
}

static tally run(gpu_backend *be, const char *path) {
  tally t = {0};
  int failed = -1;
  char err[256] = "";
  int rc = fixture_run(path, be, FIXTURE_TOLERANCE, count, &t, &failed, err, sizeof(err));
  if (rc) fail_msg("%s: %s", path, err);
  assert_int_equal(failed, t.failed);
  return t;
}

/* name, comparisons it must make (outputs + one per parameter) */
static const struct {
  const char *name;
  int n;
} fixtures[] = {
    {"gpt_blocks.safetensors", 2 + 24},       {"gpt_blocks_small.safetensors", 2 + 12},
    {"llama_blocks.safetensors", 2 + 18},     {"llama_blocks_small.safetensors", 2 + 9},
    {"gpt_head.safetensors", 3 + 4},          {"gpt_head_small.safetensors", 3 + 4},
    {"llama_head.safetensors", 3 + 3},        {"llama_head_small.safetensors", 3 + 3},
    {"adamw.safetensors", 3},
};

/* Every fixture, with both builds of the CPU kernels (the x86-64-v3 one
 * only where the CPU has it). */
static void test_all_fixtures(void **state) {
  (void)state;
  gpu_cpu_kernels variants[2] = {GPU_CPU_KERNELS_BASELINE, GPU_CPU_KERNELS_V3};
  for (int v = 0; v < 2; v++) {
    gpu_backend *be = tt_cpu_kernels(2, variants[v]);
    if (!be) {
      print_message("x86-64-v3 kernels not available here: baseline only\n");
      continue;
    }
    for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
      char path[1024];
      fixture_path(fixtures[i].name, path, sizeof(path));
      tally t = run(be, path);
      if (t.failed)
        fail_msg("%s (kernels %d): %d of %d over tolerance (first: %s)", fixtures[i].name, (int)variants[v],
                 t.failed, t.n, t.first_failed);
      assert_int_equal(t.n, fixtures[i].n);
    }
    gpu_backend_close(be);
  }
}

/* Adds delta to the first float of tensor `name` in a copy of the fixture. */
static void write_perturbed(const char *src, const char *dst, const char *name, float delta) {
  uint8_t *buf;
  size_t len;
  assert_int_equal(gw_file_read_all(src, 1 << 24, &buf, &len), 0);
  st_file f;
  char err[256];
  assert_int_equal(st_parse(buf, len, &f, err, sizeof(err)), 0);
  const st_tensor *t = st_find(&f, name);
  assert_non_null(t);
  float v;
  memcpy(&v, t->data, sizeof(v));
  v += delta;
  memcpy((uint8_t *)t->data, &v, sizeof(v));
  st_free(&f);
  assert_int_equal(gw_file_write_atomic1(dst, buf, len, 0644), 0);
  free(buf);
}

/* The checker is not vacuous: a wrong expected value, or a wrong weight,
 * shows up as a failure of exactly the affected outputs. */
static void test_checker_detects_errors(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  char *dir = testutil_tmpdir(), src[1024], dst[1024];
  snprintf(dst, sizeof(dst), "%s/bad.safetensors", dir);
  fixture_path("gpt_blocks_small.safetensors", src, sizeof(src));
  write_perturbed(src, dst, "expected.grad.blocks.0.mlp.fc.bias", 1e-2f);
  tally t = run(be, dst);
  assert_int_equal(t.failed, 1);
  assert_string_equal(t.first_failed, "grad.blocks.0.mlp.fc.bias");
  /* A changed weight moves the output and (nearly) every gradient. */
  write_perturbed(src, dst, "blocks.0.attn.qkv.weight", 0.5f);
  t = run(be, dst);
  assert_true(t.failed >= 10);
  assert_string_equal(t.first_failed, "output");
  fixture_path("adamw.safetensors", src, sizeof(src));
  write_perturbed(src, dst, "grad", 1.0f);
  t = run(be, dst);
  assert_int_equal(t.failed, 3);
  testutil_rmtree(dir);
  free(dir);
  gpu_backend_close(be);
}

static void test_malformed_fixture(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  char *dir = testutil_tmpdir(), path[1024], err[256];
  snprintf(path, sizeof(path), "%s/f.safetensors", dir);
  float x = 1.0f;
  int64_t one[1] = {1};
  st_writer w;
  st_writer_init(&w);
  st_writer_meta(&w, "kind", "blocks");
  st_writer_meta(&w, "arch", "gpt");
  st_writer_add(&w, "input", ST_F32, one, 1, &x);
  assert_int_equal(st_writer_save(&w, path), 0);
  st_writer_free(&w);
  int failed;
  assert_int_equal(fixture_run(path, be, 1e-4, NULL, NULL, &failed, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "d_model"));
  st_writer_init(&w);
  st_writer_meta(&w, "kind", "conv");
  assert_int_equal(st_writer_save(&w, path), 0);
  st_writer_free(&w);
  assert_int_equal(fixture_run(path, be, 1e-4, NULL, NULL, &failed, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "'conv'"));
  testutil_rmtree(dir);
  free(dir);
  gpu_backend_close(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_fixtures),
      cmocka_unit_test(test_checker_detects_errors),
      cmocka_unit_test(test_malformed_fixture),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
