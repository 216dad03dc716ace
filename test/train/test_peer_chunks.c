/* A vector (a gradient or an average) arrives in chunks, in order, on one
 * session. Chunks that leave a gap or overlap must never complete it: they
 * would hand uninitialised floats to the optimizer. Here the stage's own
 * aggregator sends a member two copies of the average's second half and
 * never its first: the member must not step. */
#include "testutil.h"

#include "peer_harness.h"
#include "train.pb-c.h"

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

static void send_second_half(h_harness *h, int from, int to) {
  Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
  g.iteration = 0;
  g.stage = 1;
  g.count = 1;
  g.total_count = 1;
  g.total = H_NP;
  g.offset = H_NP - 1;
  uint8_t body[64];
  size_t len = gwtf__train_grad__pack(&g, body);
  float half = 1.0f;
  train_tensor t = {.dtype = TRAIN_F32, .ndim = 1, .shape = {1}, .data = &half, .nbytes = sizeof(half)};
  assert_int_equal(h_inject(h, from, to, GWTF__TRAIN_MSG__TRAIN_AVG, body, len, &t), 0);
}

static void test_overlapping_chunks_never_complete(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, 2, 3, verbose());
  h_add(&h, TRAIN_DATA, 0, 4, 2, true);
  int a = h_add(&h, TRAIN_RELAY, 1, 4, 0, true), b = h_add(&h, TRAIN_RELAY, 1, 4, 0, true);
  h_add(&h, TRAIN_RELAY, 2, 4, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  /* the stage's aggregator is its lowest ID; the other is the member */
  int agg = gw_id_cmp(&h.nodes[a].peer.id, &h.nodes[b].peer.id) < 0 ? a : b, member = agg == a ? b : a;
  h_run_for(&h, 1);
  float w[H_NP];
  memcpy(w, h.nodes[member].w, sizeof(w));
  send_second_half(&h, agg, member);
  send_second_half(&h, agg, member);
  h_run_for(&h, 4 * H_JOB_MS); /* both arrive (1-3 ms each) and an APPLY job would have run */
  assert_int_equal(train_peer_iteration(h.nodes[member].tp), 0);
  assert_memory_equal(h.nodes[member].w, w, sizeof(w));
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_overlapping_chunks_never_complete),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
