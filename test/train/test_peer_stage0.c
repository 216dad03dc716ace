/* Stage 0 outlives its data nodes (issue 18, item 4) on the deterministic
 * simulator:
 *   - the data node's state is replicated to relays like a relay stage's;
 *   - the run's only data node dies; a fresh data node (no weights, a new
 *     identity) restores stage 0 from the newest replica (its weights hash
 *     is the one stage 0 logged then), resumes in the relays' iteration
 *     (they take its microbatches) and the run finishes, one aggregation of
 *     stage 0 lost;
 *   - without a replica the fresh data node never trains: it reports stage 0
 *     lost (the node stops);
 *   - a run that never trained still starts a data node from the seeded
 *     init (nothing to restore). */
#include "testutil.h"

#include <math.h>

#include "peer_harness.h"
#include "train/replica_store.h"

#define M 4
#define STAGES 3

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

static int build(h_harness *h, uint64_t seed, uint64_t iterations, int every) {
  h_init(h, STAGES, seed, verbose());
  h->replicate_every = every;
  h->replicas = 2;
  int d = h_add(h, TRAIN_DATA, 0, M, iterations, true);
  for (int s = 1; s <= STAGES; s++) h_add(h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h->n_nodes; i++) h_start(h, i);
  return d;
}

/* The weights a node restored (the fake model's weights hash is BLAKE2b
 * of w). */
static uint8_t restored_hash[32];
static bool restored_seen;
static int watch_index = -1;
static bool watch_restore(h_harness *h, h_node *n, const train_job *job, int *crash) {
  (void)h, (void)crash;
  if (n->index == watch_index && job->kind == TRAIN_JOB_RESTORE && job->in_bytes == sizeof(n->w)) {
    gw_id hh;
    gw_id_hash(job->in, job->in_bytes, &hh);
    memcpy(restored_hash, hh.b, 32);
    restored_seen = true;
  }
  return false;
}

/* Runs until the data node is in iteration kill_at, kills it, and starts a
 * fresh data node (not from the seeded init). Returns its index. */
static int kill_data_and_replace(h_harness *h, int d, uint64_t kill_at, uint64_t iterations) {
  for (int k = 0; k < 200000 && train_peer_iteration(h->nodes[d].tp) < kill_at; k++) h_run_for(h, 5);
  assert_int_equal(train_peer_iteration(h->nodes[d].tp), kill_at);
  h_crash(h, d);
  h_run_for(h, 500); /* the relays notice, and pause */
  int n = h_add(h, TRAIN_DATA, 0, M, iterations, false);
  h_start(h, n);
  return n;
}

static void test_stage0_replicated_to_relays(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 41, 4, 2);
  assert_true(h_run_until_finished(&h, 120000));
  int holders = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    const replica_entry *e = train_peer_replica(h.nodes[i].tp, 0);
    if (!e) continue;
    assert_int_equal(h.nodes[i].role, TRAIN_RELAY); /* held outside stage 0 */
    assert_int_equal(e->iteration, 4);
    assert_memory_equal(e->weights_hash, h.nodes[d].hash_of[3], 32);
    assert_memory_equal(e->blob, h.nodes[d].w, sizeof(h.nodes[d].w));
    holders++;
  }
  assert_int_equal(holders, 2);
  h_free(&h);
}

static void test_data_node_restored_from_replica(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10, kill_at = 5;
  int d = build(&h, 43, iters, 2);
  watch_index = h.n_nodes; /* the replacement */
  restored_seen = false;
  h.hook = watch_restore;
  int n = kill_data_and_replace(&h, d, kill_at, iters);
  assert_int_equal(n, watch_index);
  assert_true(h_run_until_finished(&h, 600000));
  assert_true(h.nodes[n].ready);
  assert_false(h.nodes[n].stage_lost);
  /* what it restored is what stage 0 logged after aggregation 4, the newest
   * replica before the kill in iteration 5 */
  assert_true(restored_seen);
  assert_true(h.nodes[d].have_hash[3]);
  assert_memory_equal(restored_hash, h.nodes[d].hash_of[3], 32);
  /* it resumed in the relays' iteration: iterations 5..9 ran, each with a
   * loss, and stage 0 lost one step (the 5th) */
  assert_int_equal(h.nodes[n].iterations_done, iters - kill_at);
  for (uint64_t it = kill_at; it < iters; it++) assert_true(isfinite(h.nodes[n].loss_of[it]));
  assert_int_equal(train_peer_step(h.nodes[n].tp), iters - 1);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY) assert_int_equal(train_peer_step(h.nodes[i].tp), iters);
  /* no microbatch was refused as from a past or future iteration */
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY) assert_int_equal(train_peer_counters(h.nodes[i].tp)->messages_refused, 0);
  assert_true(h.nodes[n].last_done > 0);
  /* the relays and the new data node agree stage by stage */
  char why[200] = "";
  if (!h_hashes_agree(&h, iters, why, sizeof(why))) fail_msg("%s", why);
  h.hook = NULL;
  h_free(&h);
}

static void test_no_replica_stops_the_data_node(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10;
  int d = build(&h, 47, iters, 0); /* replication off */
  int n = kill_data_and_replace(&h, d, 5, iters);
  for (int k = 0; k < 20000 && !h.nodes[n].stage_lost; k++) h_run_for(&h, 5);
  assert_true(h.nodes[n].stage_lost);
  assert_false(h.nodes[n].ready); /* never trained stage 0 from fresh weights */
  assert_int_equal(h.nodes[n].iterations_done, 0);
  h_free(&h);
}

/* A data node that joins a run which never trained (no relay past
 * iteration 0, no replica) is not refused: nothing is lost. Here it joins
 * next to the creator and downloads stage 0 from it, as before. */
static void test_second_data_node_joins_a_live_run(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 6;
  int d = build(&h, 53, iters, 2);
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 3; k++) h_run_for(&h, 5);
  int n = h_add(&h, TRAIN_DATA, 0, M, iters, false);
  h_start(&h, n);
  assert_true(h_run_until_finished(&h, 600000));
  assert_true(h.nodes[n].ready);
  assert_false(h.nodes[n].stage_lost);
  /* from the live member, not a replica: its step is the creator's */
  assert_int_equal(train_peer_step(h.nodes[n].tp), train_peer_step(h.nodes[d].tp));
  char why[200] = "";
  if (!h_hashes_agree(&h, iters, why, sizeof(why))) fail_msg("%s", why);
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage0_replicated_to_relays),
      cmocka_unit_test(test_data_node_restored_from_replica),
      cmocka_unit_test(test_no_replica_stops_the_data_node),
      cmocka_unit_test(test_second_data_node_joins_a_live_run),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
