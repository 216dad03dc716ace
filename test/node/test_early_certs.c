/* test/node/test_early_certs.c — certificates kept for a training peer that
 * does not exist yet (node/early_certs.c): the newest per peer, bounded,
 * handed over once and then forgotten. */
#include "testutil.h"

#include <string.h>

#include "node/early_certs.h"
#include "util/err.h"

typedef struct seen {
  gw_id from[NODE_EARLY_CERTS_MAX];
  uint8_t first[NODE_EARLY_CERTS_MAX];
  size_t len[NODE_EARLY_CERTS_MAX];
  size_t n;
} seen;

static void give(void *ud, const gw_id *from, const uint8_t *body, size_t len) {
  seen *s = ud;
  s->from[s->n] = *from;
  s->first[s->n] = body[0];
  s->len[s->n++] = len;
}

static gw_id id_of(uint8_t k) {
  gw_id id;
  memset(&id, 0, sizeof(id));
  id.b[0] = k;
  return id;
}

static void test_newest_per_peer_in_arrival_order(void **state) {
  (void)state;
  node_early_certs c = {0};
  gw_id a = id_of(1), b = id_of(2);
  uint8_t one[3] = {1, 1, 1}, two[5] = {2, 2, 2, 2, 2}, three[2] = {3, 3};
  assert_int_equal(node_early_certs_keep(&c, &a, one, sizeof(one)), 0);
  assert_int_equal(node_early_certs_keep(&c, &b, two, sizeof(two)), 0);
  assert_int_equal(node_early_certs_keep(&c, &a, three, sizeof(three)), 0); /* a's newer one */
  seen s = {0};
  node_early_certs_replay(&c, give, &s);
  assert_int_equal(s.n, 2);
  assert_true(gw_id_eq(&s.from[0], &a));
  assert_int_equal(s.first[0], 3);
  assert_int_equal(s.len[0], sizeof(three));
  assert_true(gw_id_eq(&s.from[1], &b));
  assert_int_equal(s.len[1], sizeof(two));
  /* handed over once */
  seen again = {0};
  node_early_certs_replay(&c, give, &again);
  assert_int_equal(again.n, 0);
}

static void test_bounded(void **state) {
  (void)state;
  node_early_certs c = {0};
  uint8_t body[8] = {7};
  for (int k = 0; k < NODE_EARLY_CERTS_MAX; k++) {
    gw_id id = id_of((uint8_t)k);
    id.b[1] = 1;
    assert_int_equal(node_early_certs_keep(&c, &id, body, sizeof(body)), 0);
  }
  gw_id extra = id_of(200);
  assert_int_equal(node_early_certs_keep(&c, &extra, body, sizeof(body)), GW_EFULL);
  static uint8_t big[NODE_EARLY_CERT_BYTES + 1];
  gw_id first = id_of(0);
  first.b[1] = 1;
  assert_int_equal(node_early_certs_keep(&c, &first, big, sizeof(big)), GW_EINVAL); /* not a certificate */
  assert_int_equal(node_early_certs_keep(&c, &first, body, 0), GW_EINVAL);
  seen s = {0};
  node_early_certs_replay(&c, give, &s);
  assert_int_equal(s.n, NODE_EARLY_CERTS_MAX);
  assert_int_equal(s.len[0], sizeof(body)); /* the refused ones replaced nothing */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_newest_per_peer_in_arrival_order),
      cmocka_unit_test(test_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
