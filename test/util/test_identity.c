/* Unit tests for p2p/identity: key files, permissions, signatures. */
#include "testutil.h"

#include <sys/stat.h>

#include "p2p/identity.h"
#include "util/err.h"

static int setup(void **state) {
  (void)state;
  return p2p_crypto_init();
}

static void test_create_then_load(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  char path[600], err[512];
  snprintf(path, sizeof(path), "%s/keys/node.key", dir);
  p2p_identity a, b;
  int created = 0;
  assert_int_equal(p2p_identity_load_or_create(path, &a, &created, err, sizeof(err)), 0);
  assert_int_equal(created, 1);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(p2p_identity_load_or_create(path, &b, &created, err, sizeof(err)), 0);
  assert_int_equal(created, 0);
  assert_true(gw_id_eq(&a.id, &b.id));
  assert_memory_equal(a.pk, b.pk, P2P_PK_BYTES);
  gw_id expect;
  gw_id_hash(a.pk, P2P_PK_BYTES, &expect);
  assert_true(gw_id_eq(&expect, &a.id));
  assert_int_equal(p2p_identity_create(path, &b, err, sizeof(err)), GW_EEXIST);
  testutil_rmtree(dir);
  free(dir);
}

static void test_refuses_readable_keyfile(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  char path[600], err[512];
  snprintf(path, sizeof(path), "%s/node.key", dir);
  p2p_identity a;
  assert_int_equal(p2p_identity_create(path, &a, err, sizeof(err)), 0);
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(p2p_identity_load_or_create(path, &a, NULL, err, sizeof(err)), GW_EPERM);
  assert_non_null(strstr(err, "chmod 600"));
  assert_non_null(strstr(err, "0644"));
  testutil_rmtree(dir);
  free(dir);
}

static void test_rejects_garbage_keyfile(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  char path[600], err[512];
  snprintf(path, sizeof(path), "%s/node.key", dir);
  FILE *fp = fopen(path, "w");
  fputs("not a key\n", fp);
  fclose(fp);
  chmod(path, 0600);
  p2p_identity a;
  assert_int_equal(p2p_identity_load_or_create(path, &a, NULL, err, sizeof(err)), GW_EINVAL);
  assert_non_null(strstr(err, "not a gwtf key file"));
  testutil_rmtree(dir);
  free(dir);
}

static void test_sign_verify(void **state) {
  (void)state;
  p2p_identity a, b;
  p2p_identity_generate(&a);
  p2p_identity_generate(&b);
  assert_false(gw_id_eq(&a.id, &b.id));
  uint8_t sig[P2P_SIG_BYTES];
  const uint8_t msg[] = "record bytes";
  p2p_sign(&a, msg, sizeof(msg), sig);
  assert_int_equal(p2p_verify(a.pk, msg, sizeof(msg), sig), 0);
  assert_int_equal(p2p_verify(b.pk, msg, sizeof(msg), sig), GW_EAUTH);
  sig[0] ^= 1;
  assert_int_equal(p2p_verify(a.pk, msg, sizeof(msg), sig), GW_EAUTH);
}

static void test_seeded_identity_is_stable(void **state) {
  (void)state;
  uint8_t seed[32] = {1, 2, 3};
  p2p_identity a, b;
  p2p_identity_from_seed(seed, &a);
  p2p_identity_from_seed(seed, &b);
  assert_true(gw_id_eq(&a.id, &b.id));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_then_load), cmocka_unit_test(test_refuses_readable_keyfile),
      cmocka_unit_test(test_rejects_garbage_keyfile), cmocka_unit_test(test_sign_verify),
      cmocka_unit_test(test_seeded_identity_is_stable),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
