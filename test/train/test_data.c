/* Unit tests for train/data: dataset validation and deterministic sampling. */
#include "testutil.h"

#include "train/data.h"
#include "util/err.h"
#include "util/file.h"

static char *tmp;

static int setup(void **state) {
  (void)state;
  tmp = testutil_tmpdir();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  testutil_rmtree(tmp);
  free(tmp);
  return 0;
}

static const char *path_in_tmp(const char *name) {
  static char path[600];
  snprintf(path, sizeof(path), "%s/%s", tmp, name);
  return path;
}

static void write_tokens(const char *path, const uint16_t *toks, int32_t n, int32_t claimed, int32_t version) {
  int32_t hdr[TRAIN_LLMC_HEADER_INTS] = {TRAIN_LLMC_MAGIC, version, claimed};
  const void *parts[2] = {hdr, toks};
  size_t lens[2] = {sizeof(hdr), (size_t)n * sizeof(uint16_t)};
  assert_int_equal(gw_file_write_atomic(path, parts, lens, 2, 0644), 0);
}

static void test_text_dataset(void **state) {
  (void)state;
  const char *p = path_in_tmp("a.txt");
  const char text[] = "Call me Ishmael. Ça va — ☃ fine.";
  assert_int_equal(gw_file_write_atomic1(p, text, sizeof(text) - 1, 0644), 0);
  train_dataset ds;
  char err[256];
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), 0);
  assert_int_equal(ds.kind, TRAIN_DATA_TEXT);
  assert_int_equal(ds.n_tokens, sizeof(text) - 1);
  assert_int_equal(ds.vocab_needed, 256);
  train_dataset_close(&ds);
}

static void test_rejects_invalid_utf8(void **state) {
  (void)state;
  const char *p = path_in_tmp("bad.txt");
  const uint8_t bytes[] = {'o', 'k', 0xc0, 0xaf, 'x'}; /* an overlong '/' */
  assert_int_equal(gw_file_write_atomic1(p, bytes, sizeof(bytes), 0644), 0);
  train_dataset ds;
  char err[256];
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "offset 2"));
  const uint8_t surrogate[] = {0xed, 0xa0, 0x80, 'a'};
  assert_int_equal(gw_file_write_atomic1(p, surrogate, sizeof(surrogate), 0644), 0);
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), GW_EINVAL);
  const uint8_t truncated[] = {'a', 0xe2, 0x98};
  assert_int_equal(gw_file_write_atomic1(p, truncated, sizeof(truncated), 0644), 0);
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), GW_EINVAL);
  assert_true(train_dataset_open(path_in_tmp("missing"), &ds, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, "cannot open"));
}

static void test_llmc_tokens(void **state) {
  (void)state;
  const char *p = path_in_tmp("t.bin");
  uint16_t toks[100];
  for (int i = 0; i < 100; i++) toks[i] = (uint16_t)(i * 7);
  write_tokens(p, toks, 100, 100, 1);
  train_dataset ds;
  char err[256];
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), 0);
  assert_int_equal(ds.kind, TRAIN_DATA_TOKENS_U16);
  assert_int_equal(ds.n_tokens, 100);
  assert_int_equal(ds.vocab_needed, 99 * 7 + 1);
  int32_t in[2 * 5], tg[2 * 5];
  assert_int_equal(train_dataset_sample(&ds, 1, 0, 0, 2, 5, in, tg), 0);
  for (int i = 0; i < 10; i++) assert_int_equal(tg[i], in[i] + 7); /* targets are the next token */
  train_dataset_close(&ds);

  write_tokens(p, toks, 100, 101, 1); /* header lies about the count */
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "101"));
  write_tokens(p, toks, 100, 100, 2); /* uint32 version: not supported */
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "version 2"));
}

static void test_sampling_is_deterministic(void **state) {
  (void)state;
  const char *p = path_in_tmp("syn.txt");
  assert_int_equal(train_synth_corpus(p, 20000, 3), 0);
  train_dataset ds;
  assert_int_equal(train_dataset_open(p, &ds, NULL, 0), 0); /* the synthetic corpus is valid UTF-8 */
  assert_int_equal(ds.n_tokens, 20000);
  int32_t a[4 * 16], at[4 * 16], b[4 * 16], bt[4 * 16];
  assert_int_equal(train_dataset_sample(&ds, 9, 3, 2, 4, 16, a, at), 0);
  assert_int_equal(train_dataset_sample(&ds, 9, 3, 2, 4, 16, b, bt), 0);
  assert_memory_equal(a, b, sizeof(a));
  assert_memory_equal(at, bt, sizeof(at));
  for (int r = 0; r < 4; r++)
    for (int t = 0; t + 1 < 16; t++) assert_int_equal(at[r * 16 + t], a[r * 16 + t + 1]);
  assert_int_equal(train_dataset_sample(&ds, 9, 3, 3, 4, 16, b, bt), 0);
  assert_memory_not_equal(a, b, sizeof(a));
  assert_int_equal(train_dataset_sample(&ds, 9, 4, 2, 4, 16, b, bt), 0);
  assert_memory_not_equal(a, b, sizeof(a));
  assert_int_equal(train_dataset_sample(&ds, 9, 0, 0, 1, 20000, b, bt), GW_ERANGE);
  train_dataset_close(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_dataset),
      cmocka_unit_test(test_rejects_invalid_utf8),
      cmocka_unit_test(test_llmc_tokens),
      cmocka_unit_test(test_sampling_is_deterministic),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
