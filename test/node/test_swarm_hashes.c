/* test/node/test_swarm_hashes.c — a swarm's verdict on its stages' weights
 * (node/swarm_hashes.c): a split is a (stage, iteration) whose live peers
 * logged different weights, counted once, with the iteration it healed
 * by; the last weights of a peer killed before it used them are no split. */
#include "testutil.h"

#include <string.h>

#include "node/swarm_hashes.h"

typedef struct said {
  int n;
  char last[256];
} said;

static void say(void *ud, const char *line) {
  said *s = ud;
  s->n++;
  snprintf(s->last, sizeof(s->last), "%s", line);
}

/* r0, r1, r2 in stage 1; r2 in generation 1 after one kill. */
static const swarm_hash_peer PEERS[] = {
    {.name = "r0", .generation = 0, .killed_generation = -1},
    {.name = "r1", .generation = 0, .killed_generation = -1},
    {.name = "r2", .generation = 1, .killed_generation = 0},
};

static void note(swarm_hashes *hs, uint64_t it, int peer, int generation, const char *hash) {
  assert_int_equal(swarm_hashes_note(hs, it, 1, hash, peer, generation), 0);
}

static void test_agreement_is_no_split(void **state) {
  (void)state;
  swarm_hashes hs = {0};
  for (uint64_t it = 0; it < 400; it++) /* past the first allocation */
    for (int p = 0; p < 2; p++) note(&hs, it, p, 0, it % 2 ? "aa" : "bb");
  said s = {0};
  int unhealed = -1;
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 0);
  assert_int_equal(unhealed, 0);
  assert_int_equal(s.n, 0);
  swarm_hashes_free(&hs);
}

static void test_split_counted_once_with_its_healing(void **state) {
  (void)state;
  swarm_hashes hs = {0};
  note(&hs, 3, 0, 0, "aa");
  note(&hs, 3, 1, 0, "bb");
  note(&hs, 3, 2, 1, "bb"); /* a third record of the same split */
  note(&hs, 4, 1, 0, "cc");
  note(&hs, 4, 0, 0, "cc");
  said s = {0};
  int unhealed = -1;
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 1);
  assert_int_equal(unhealed, 0);
  assert_int_equal(s.n, 1);
  assert_non_null(strstr(s.last, "stage 1 after iteration 3"));
  assert_non_null(strstr(s.last, "healed by iteration 4"));
  swarm_hashes_free(&hs);
}

static void test_split_never_healed(void **state) {
  (void)state;
  swarm_hashes hs = {0};
  note(&hs, 5, 0, 0, "aa");
  note(&hs, 5, 1, 0, "bb");
  note(&hs, 6, 0, 0, "cc");
  note(&hs, 6, 1, 0, "dd"); /* still apart, and the run ends */
  said s = {0};
  int unhealed = -1;
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 2);
  assert_int_equal(unhealed, 2);
  assert_non_null(strstr(s.last, "never healed"));
  swarm_hashes_free(&hs);
}

/* r2's generation 0 was killed: its weights after iteration 7, the last
 * it logged before the kill, died with it. Its weights after iteration 6
 * were used (it aggregated again after them): a disagreement there is a
 * split. */
static void test_killed_peers_last_weights(void **state) {
  (void)state;
  swarm_hashes hs = {0};
  note(&hs, 6, 0, 0, "aa");
  note(&hs, 6, 2, 0, "aa");
  note(&hs, 7, 0, 0, "bb");
  note(&hs, 7, 2, 0, "zz"); /* killed while sending its average */
  said s = {0};
  int unhealed = -1;
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 0);
  note(&hs, 6, 1, 0, "xx"); /* r1 disagrees at 6 with the two above */
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 1);
  assert_non_null(strstr(s.last, "after iteration 6"));
  swarm_hashes_free(&hs);
  /* the same last weights from a peer that was not killed are a split */
  note(&hs, 7, 0, 0, "bb");
  note(&hs, 7, 1, 0, "zz");
  assert_int_equal(swarm_hashes_check(&hs, PEERS, &unhealed, say, &s), 1);
  swarm_hashes_free(&hs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_agreement_is_no_split),
      cmocka_unit_test(test_split_counted_once_with_its_healing),
      cmocka_unit_test(test_split_never_healed),
      cmocka_unit_test(test_killed_peers_last_weights),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
