/* Replica storage (train/replica_store.h): the bound (entries and bytes,
 * oldest of the fullest stage dropped, each stage's newest kept), the hash
 * check before anything is taken, and the atomic write beside its sidecar. */
#include "testutil.h"

#include <dirent.h>

#include "train/checkpoint.h"
#include "train/replica_store.h"
#include "util/err.h"
#include "util/file.h"

/* An entry of `len` bytes derived from (stage, iteration), hashed right. */
static replica_entry make(int stage, uint64_t iteration, size_t len) {
  replica_entry e = {.stage = stage, .iteration = iteration, .step = iteration, .len = len};
  e.blob = malloc(len);
  assert_non_null(e.blob);
  for (size_t i = 0; i < len; i++) e.blob[i] = (uint8_t)(i * 7 + (size_t)stage * 13 + iteration);
  gw_id h;
  gw_id_hash(e.blob, len, &h);
  memcpy(e.blob_hash, h.b, 32);
  memset(e.weights_hash, (int)(0x10 * stage + iteration), 32);
  return e;
}

static bool holds(const replica_store *s, int stage, uint64_t iteration) {
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].stage == stage && s->v[i].iteration == iteration) return true;
  return false;
}

static void test_bound_drops_oldest_of_fullest_stage(void **state) {
  (void)state;
  replica_store s;
  replica_store_init(&s, 3, 0);
  replica_entry dropped[8];
  size_t nd = 99;
  replica_entry e = make(1, 2, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  assert_int_equal(nd, 0);
  e = make(2, 2, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  e = make(1, 4, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.bytes, 300);
  /* a fourth: stage 1 holds the most, its oldest (iter 2) goes; stage 2's
   * only replica, older still, stays */
  e = make(1, 6, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  assert_int_equal(nd, 1);
  assert_int_equal(dropped[0].stage, 1);
  assert_int_equal(dropped[0].iteration, 2);
  assert_null(dropped[0].blob);
  assert_int_equal(s.n, 3);
  assert_true(holds(&s, 2, 2) && holds(&s, 1, 4) && holds(&s, 1, 6));
  assert_int_equal(replica_store_newest(&s, 1)->iteration, 6);
  assert_int_equal(replica_store_newest(&s, 2)->iteration, 2);
  assert_null(replica_store_newest(&s, 3));
  /* the same (stage, iteration) again from its pusher replaces, never duplicates */
  e = make(1, 6, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  assert_int_equal(nd, 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.bytes, 300);
  /* ... from another member of the stage it is refused (the caller keeps its blob) */
  uint8_t first = replica_store_newest(&s, 1)->blob[0];
  e = make(1, 6, 100);
  e.from.b[0] = 1;
  e.blob[0] ^= 1;
  gw_id h2;
  gw_id_hash(e.blob, e.len, &h2);
  memcpy(e.blob_hash, h2.b, 32);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), GW_EEXIST);
  free(e.blob);
  assert_int_equal(s.n, 3);
  assert_int_equal(replica_store_newest(&s, 1)->blob[0], first); /* the first pusher's entry kept */
  replica_store_free(&s);
}

static void test_byte_bound(void **state) {
  (void)state;
  replica_store s;
  replica_store_init(&s, 100, 250);
  replica_entry dropped[8];
  size_t nd = 0;
  replica_entry e = make(1, 1, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  e = make(1, 2, 100);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  e = make(1, 3, 100); /* 300 > 250: the oldest goes */
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), 0);
  assert_int_equal(nd, 1);
  assert_int_equal(dropped[0].iteration, 1);
  assert_true(s.bytes <= 250);
  /* larger than the whole bound: refused, the caller keeps its blob */
  e = make(2, 1, 251);
  assert_int_equal(replica_store_put(&s, &e, dropped, 8, &nd), GW_ERANGE);
  free(e.blob);
  assert_int_equal(s.n, 2);
  replica_store_free(&s);
}

static void test_hash_checked(void **state) {
  (void)state;
  replica_store s;
  replica_store_init(&s, 4, 0);
  replica_entry e = make(1, 1, 64);
  e.blob[10] ^= 1; /* one bit flipped in transit */
  size_t nd = 0;
  assert_int_equal(replica_store_put(&s, &e, NULL, 0, &nd), GW_EPROTO);
  assert_int_equal(s.n, 0);
  e.blob[10] ^= 1;
  assert_int_equal(replica_store_put(&s, &e, NULL, 0, &nd), 0);
  assert_int_equal(s.n, 1);
  replica_store_free(&s);
}

static size_t count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static void test_atomic_write_and_remove(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  replica_entry e = make(3, 12, 4096);
  assert_int_equal(replica_save(dir, "demo", &e), 0);
  char path[4096], sub[4096];
  assert_int_equal(replica_path(path, sizeof(path), dir, "demo", 3, 12), 0);
  assert_non_null(strstr(path, "/replicas/demo.stage3.iter12.state"));
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(gw_file_read_all(path, 1 << 20, &buf, &len), 0);
  assert_int_equal(len, e.len);
  assert_memory_equal(buf, e.blob, len);
  free(buf);
  ckpt_sidecar sc;
  char err[256];
  assert_int_equal(ckpt_read_sidecar(path, &sc, err, sizeof(err)), 0);
  assert_string_equal(sc.run, "demo");
  assert_int_equal(sc.stage, 3);
  assert_int_equal(sc.iteration, 12);
  assert_true(sc.have_hash);
  assert_memory_equal(sc.weight_hash, e.weights_hash, 32);
  /* written through a temporary file renamed over the target: only the
   * file and its sidecar are left, no temporary */
  snprintf(sub, sizeof(sub), "%s/replicas", dir);
  assert_int_equal(count_entries(sub), 2);
  /* written again (a newer push of the same state): still two files, new bytes */
  e.blob[0] ^= 0xff;
  assert_int_equal(replica_save(dir, "demo", &e), 0);
  assert_int_equal(count_entries(sub), 2);
  assert_int_equal(gw_file_read_all(path, 1 << 20, &buf, &len), 0);
  assert_int_equal(buf[0], e.blob[0]);
  free(buf);
  assert_int_equal(replica_remove(dir, "demo", 3, 12), 0);
  assert_int_equal(count_entries(sub), 0);
  assert_int_equal(replica_remove(dir, "demo", 3, 12), 0); /* gone already: no error */
  free(e.blob);
  testutil_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bound_drops_oldest_of_fullest_stage),
      cmocka_unit_test(test_byte_bound),
      cmocka_unit_test(test_hash_checked),
      cmocka_unit_test(test_atomic_write_and_remove),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
