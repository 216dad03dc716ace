/* test/train/test_safetensors.c — the safetensors reader and writer: round
 * trips, and hostile files rejected with a clear error and no crash. */
#include "testutil.h"

#include <errno.h>

#include "train/safetensors.h"
#include "util/err.h"
#include "util/file.h"

/* A file from a literal JSON header and n_data bytes of data. */
static uint8_t *make_file(const char *json, size_t n_data, uint64_t hdr_len_override, size_t *len) {
  size_t hl = strlen(json);
  *len = 8 + hl + n_data;
  uint8_t *buf = calloc(1, *len);
  assert_non_null(buf);
  uint64_t declared = hdr_len_override ? hdr_len_override : hl;
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(declared >> (8 * i));
  memcpy(buf + 8, json, hl);
  for (size_t i = 0; i < n_data; i++) buf[8 + hl + i] = (uint8_t)i;
  return buf;
}

/* Parsing must fail with GW_EINVAL and an error that mentions `phrase`. */
static void expect_reject(const char *json, size_t n_data, uint64_t hdr_len, const char *phrase) {
  size_t len;
  uint8_t *buf = make_file(json, n_data, hdr_len, &len);
  st_file f;
  char err[ST_ERR_MAX] = "";
  int rc = st_parse(buf, len, &f, err, sizeof(err));
  if (rc != GW_EINVAL || !strstr(err, phrase))
    fail_msg("header %s: rc %d, err '%s', wanted '%s'", json, rc, err, phrase);
  free(buf);
}

static void test_round_trip(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  char path[600];
  snprintf(path, sizeof(path), "%s/t.safetensors", dir);
  float a[6] = {1, -2, 3.5f, 4, 5, 6};
  int32_t b[3] = {7, -8, 9};
  int64_t sa[2] = {2, 3}, sb[1] = {3};
  st_writer w;
  st_writer_init(&w);
  st_writer_meta(&w, "kind", "test");
  st_writer_add(&w, "a", ST_F32, sa, 2, a);
  st_writer_add(&w, "b.c", ST_I32, sb, 1, b);
  st_writer_add(&w, "scalar", ST_F32, NULL, 0, &a[2]);
  assert_int_equal(st_writer_save(&w, path), 0);
  st_writer_free(&w);

  st_file f;
  char err[ST_ERR_MAX];
  assert_int_equal(st_load(path, 1 << 20, &f, err, sizeof(err)), 0);
  assert_int_equal(f.n_tensors, 3);
  assert_string_equal(st_meta(&f, "kind"), "test");
  assert_null(st_meta(&f, "nope"));
  float a2[6];
  int32_t b2[3];
  float s;
  assert_int_equal(st_copy(&f, "a", ST_F32, sa, 2, a2, err, sizeof(err)), 0);
  assert_memory_equal(a, a2, sizeof(a));
  assert_int_equal(st_copy(&f, "b.c", ST_I32, sb, 1, b2, err, sizeof(err)), 0);
  assert_memory_equal(b, b2, sizeof(b));
  assert_int_equal(st_copy(&f, "scalar", ST_F32, NULL, 0, &s, err, sizeof(err)), 0);
  assert_true(s == 3.5f);
  /* Data starts 8-byte aligned: the header length is padded. */
  assert_int_equal((f.tensors[0].data - f.buf) % 8, 0);
  st_free(&f);

  /* The header alone: metadata and shapes, no data. */
  assert_int_equal(st_load_header(path, &f, err, sizeof(err)), 0);
  assert_string_equal(st_meta(&f, "kind"), "test");
  assert_int_equal(st_check(&f, "a", ST_F32, sa, 2, err, sizeof(err)), 0);
  assert_int_equal(st_copy(&f, "a", ST_F32, sa, 2, a2, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "only the header"));
  st_free(&f);
  /* ... which still notices a file cut short. */
  assert_int_equal(truncate(path, 8 + 16), 0);
  assert_int_equal(st_load_header(path, &f, err, sizeof(err)), GW_EINVAL);
  assert_int_equal(st_load_header("/nonexistent/x", &f, err, sizeof(err)), -ENOENT);
  testutil_rmtree(dir);
  free(dir);
}

static void test_wrong_dtype_and_shape(void **state) {
  (void)state;
  size_t len;
  uint8_t *buf =
      make_file("{\"x\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 16, 0, &len);
  st_file f;
  char err[ST_ERR_MAX];
  assert_int_equal(st_parse(buf, len, &f, err, sizeof(err)), 0);
  float out[4];
  int64_t want[2] = {2, 2}, other[2] = {4, 1};
  assert_int_equal(st_copy(&f, "x", ST_F32, want, 2, out, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "dtype I32, expected F32"));
  assert_int_equal(st_copy(&f, "x", ST_I32, other, 2, out, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "shape [2,2], expected [4,1]"));
  assert_int_equal(st_copy(&f, "y", ST_I32, want, 2, out, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "'y' is missing"));
  st_free(&f);
  free(buf);
}

static void test_truncated(void **state) {
  (void)state;
  st_file f;
  char err[ST_ERR_MAX];
  uint8_t tiny[5] = {1, 0, 0, 0, 0};
  assert_int_equal(st_parse(tiny, sizeof(tiny), &f, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "shorter than"));
  /* Header claims more bytes than the file has. */
  expect_reject("{}", 0, 1000, "runs past the end");
  expect_reject("{}", 0, (uint64_t)1 << 62, "runs past the end");
  /* The data is cut short: the tensor's offsets leave the file. */
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, 0,
                "outside the 12 data bytes");
}

static void test_lying_header(void **state) {
  (void)state;
  /* A length that cuts the JSON in the middle. */
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 20, "not valid JSON");
  expect_reject("[1,2,3]", 0, 0, "not a JSON object");
  expect_reject("{\"x\":3}", 0, 0, "entry is not an object");
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0, "not valid JSON");
  expect_reject("{\"__metadata__\":{\"a\":1}}", 0, 0, "is not a string");
  expect_reject("{\"__metadata__\":[]}", 0, 0, "__metadata__ is not an object");
}

static void test_bad_entries(void **state) {
  (void)state;
  expect_reject("{\"x\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, "unknown dtype");
  expect_reject("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, "unknown dtype");
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, "non-negative");
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, 0,
                "at most 8");
  /* Shape and offsets disagree. */
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, "needs 12 bytes");
  /* A shape whose byte count overflows size_t. */
  expect_reject("{\"x\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}", 8, 0,
                "more bytes than a file can hold");
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, 0, "outside");
  expect_reject("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, 0, "[begin, end]");
  expect_reject("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, "empty name");
}

static void test_layout(void **state) {
  (void)state;
  expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0, "overlap");
  expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, 0,
                "belong to no tensor");
  expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12, 0,
                "last 8 data bytes belong to no tensor");
}

/* Every truncation of a valid file is rejected (never read out of bounds:
 * the sanitizer and valgrind runs watch this). */
static void test_every_truncation(void **state) {
  (void)state;
  float a[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  st_writer w;
  st_writer_init(&w);
  st_writer_meta(&w, "k", "v");
  st_writer_add(&w, "a", ST_F32, shape, 1, a);
  uint8_t *hdr;
  size_t hdr_len;
  assert_int_equal(st_writer_header(&w, &hdr, &hdr_len), 0);
  size_t len = hdr_len + sizeof(a);
  uint8_t *full = malloc(len);
  memcpy(full, hdr, hdr_len);
  memcpy(full + hdr_len, a, sizeof(a));
  st_file f;
  char err[ST_ERR_MAX];
  assert_int_equal(st_parse(full, len, &f, err, sizeof(err)), 0);
  st_free(&f);
  for (size_t cut = 0; cut < len; cut++) {
    uint8_t *part = malloc(cut ? cut : 1);
    memcpy(part, full, cut);
    assert_int_equal(st_parse(part, cut, &f, err, sizeof(err)), GW_EINVAL);
    free(part);
  }
  free(full);
  free(hdr);
  st_writer_free(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_wrong_dtype_and_shape),
      cmocka_unit_test(test_truncated),        cmocka_unit_test(test_lying_header),
      cmocka_unit_test(test_bad_entries),      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_every_truncation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
