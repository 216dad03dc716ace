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

/* Held-out tokens: training windows never reach into them, the validation
 * set reads them in order, the same every time, and a token file's tail is
 * held out the same way. */
/* Two data nodes started without --data-seed draw different microbatches.
 * The seed was once id[0] << 8 | 0x5eed: the OR kept 3 bits of the byte, 8
 * seeds for all IDs, so one pair of data nodes in 8 trained on the same
 * stream. */
static void test_default_seed_differs_per_node(void **state) {
  (void)state;
  uint64_t seen[256 * 8];
  size_t n = 0;
  for (int byte = 0; byte < 8; byte++)
    for (int v = 0; v < 256; v++) {
      uint8_t id[32] = {0};
      id[byte] = (uint8_t)v;
      uint64_t s = train_dataset_seed_for(id);
      assert_true(s != 0);
      if (v == 0) continue; /* the all-zero ID, once per byte */
      for (size_t k = 0; k < n; k++) assert_true(seen[k] != s);
      seen[n++] = s;
    }
}

static void test_hold_out_and_validation_set(void **state) {
  (void)state;
  const char *p = path_in_tmp("val.txt");
  char text[1000];
  for (int i = 0; i < 1000; i++) text[i] = (char)('a' + i % 26);
  assert_int_equal(gw_file_write_atomic1(p, text, sizeof(text), 0644), 0);
  train_dataset ds, val;
  char err[256];
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), 0);
  assert_int_equal(train_dataset_hold_out(&ds, 0.6, &val), GW_EINVAL);
  assert_int_equal(train_dataset_hold_out(&ds, 0, &val), 0);
  assert_int_equal(ds.n_tokens, 1000);
  assert_int_equal(val.n_tokens, 0);
  assert_int_equal(train_dataset_val_count(&val, 2, 5), 0);
  assert_int_equal(train_dataset_hold_out(&ds, 0.1, &val), 0);
  assert_int_equal(ds.n_tokens, 900);
  assert_int_equal(val.n_tokens, 100);
  /* training: every window, targets included, lies in the first 900 (token
   * i of this file is i, so a token says where it came from) */
  const char *ip = path_in_tmp("ids.bin");
  uint16_t ids[1000];
  for (int i = 0; i < 1000; i++) ids[i] = (uint16_t)i;
  write_tokens(ip, ids, 1000, 1000, 1);
  train_dataset ids_ds, ids_val;
  assert_int_equal(train_dataset_open(ip, &ids_ds, err, sizeof(err)), 0);
  assert_int_equal(train_dataset_hold_out(&ids_ds, 0.1, &ids_val), 0);
  int32_t in[4 * 8], tg[4 * 8], top = 0;
  for (uint32_t k = 0; k < 500; k++) {
    assert_int_equal(train_dataset_sample(&ids_ds, 5, k, 0, 4, 8, in, tg), 0);
    for (int i = 0; i < 4 * 8; i++) top = tg[i] > top ? tg[i] : top;
  }
  assert_true(top <= 899);
  assert_true(top >= 880); /* and they do reach its end */
  assert_int_equal(train_dataset_val_sample(&ids_val, 0, 1, 8, in, tg), 0);
  assert_int_equal(in[0], 900);
  train_dataset_close(&ids_val);
  train_dataset_close(&ids_ds);
  /* validation: (100 - 1) / 8 = 12 windows, 3 microbatches of 4 */
  assert_int_equal(train_dataset_val_count(&val, 4, 8), 3);
  int32_t a[4 * 8], at[4 * 8];
  assert_int_equal(train_dataset_val_sample(&val, 1, 4, 8, a, at), 0);
  for (int b = 0; b < 4; b++)
    for (int t = 0; t < 8; t++) {
      size_t pos = 900 + (size_t)(1 * 4 + b) * 8 + (size_t)t;
      assert_int_equal(a[b * 8 + t], text[pos]);
      assert_int_equal(at[b * 8 + t], text[pos + 1]);
    }
  assert_int_equal(train_dataset_val_sample(&val, 1, 4, 8, in, tg), 0);
  assert_memory_equal(a, in, sizeof(a));
  assert_int_equal(train_dataset_val_sample(&val, 3, 4, 8, in, tg), GW_ERANGE);
  train_dataset_close(&val); /* a view: unmaps nothing */
  train_dataset_close(&ds);
  /* a separate validation file, and a fraction that leaves too little */
  assert_int_equal(train_dataset_open(p, &ds, err, sizeof(err)), 0);
  assert_int_equal(train_validation_open(&ds, p, 0, &val, err, sizeof(err)), 0);
  assert_int_equal(ds.n_tokens, 1000);
  assert_int_equal(val.n_tokens, 1000);
  train_dataset_close(&val);
  assert_int_equal(train_validation_open(&ds, NULL, 0.001, &val, err, sizeof(err)), GW_ERANGE);
  assert_non_null(strstr(err, "too few"));
  train_dataset_close(&ds);
  /* llm.c tokens */
  const char *tp = path_in_tmp("vt.bin");
  uint16_t toks[100];
  for (int i = 0; i < 100; i++) toks[i] = (uint16_t)(i * 3);
  write_tokens(tp, toks, 100, 100, 1);
  assert_int_equal(train_dataset_open(tp, &ds, err, sizeof(err)), 0);
  assert_int_equal(train_validation_open(&ds, NULL, 0.2, &val, err, sizeof(err)), 0);
  assert_int_equal(ds.n_tokens, 80);
  assert_int_equal(train_dataset_val_sample(&val, 0, 1, 4, in, tg), 0);
  for (int t = 0; t < 4; t++) assert_int_equal(in[t], (80 + t) * 3), assert_int_equal(tg[t], (81 + t) * 3);
  train_dataset_close(&val);
  train_dataset_close(&ds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_text_dataset),
      cmocka_unit_test(test_rejects_invalid_utf8),
      cmocka_unit_test(test_llmc_tokens),
      cmocka_unit_test(test_sampling_is_deterministic),
      cmocka_unit_test(test_default_seed_differs_per_node),
      cmocka_unit_test(test_hold_out_and_validation_set),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
