/* Stage replicas (issue 18, items 1 and 2) on the deterministic simulator:
 *   - every K aggregations each relay stage's aggregator (one member) pushes
 *     its state to R peers outside the stage; each holder stores it with the
 *     hash the stage logged for that aggregation;
 *   - a holder's bound drops the oldest;
 *   - when every peer of a stage is gone, the leader places the next joiner
 *     into that (empty) stage; it restores the newest replica, whose weights
 *     hash is the one the stage logged, and training goes on with one
 *     aggregation lost;
 *   - a holder serving other weights is refused, one that also forges the
 *     hash it announces is outvoted by the honest holders;
 *   - without a replica the joiner never trains fresh weights: it and the
 *     leader report the stage lost (the run stops);
 *   - hostile pushes, a forged STAGE_LOST and requests for nothing change
 *     nothing. */
#include "testutil.h"

#include <math.h>

#include "peer_harness.h"
#include "train.pb-c.h"
#include "train/replica_store.h"

#define M 4
#define STAGES 3

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

/* One data node and `per_stage` relays in each stage, all started. */
static int build(h_harness *h, uint64_t seed, int per_stage, uint64_t iterations, int every) {
  h_init(h, STAGES, seed, verbose());
  h->replicate_every = every;
  h->replicas = 2;
  int d = h_add(h, TRAIN_DATA, 0, M, iterations, true);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < per_stage; k++) h_add(h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h->n_nodes; i++) h_start(h, i);
  return d;
}

static void test_push_and_store(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 6;
  build(&h, 7, 2, iters, 2);
  assert_true(h_run_until_finished(&h, 120000));
  uint32_t pushed = 0;
  for (int i = 0; i < h.n_nodes; i++) pushed += h.nodes[i].replicas_pushed;
  /* aggregations 2, 4, 6 of three relay stages and stage 0 (the data
   * node's), two holders each, one pusher per stage */
  assert_int_equal(pushed, 3 * (STAGES + 1) * 2);
  for (int s = 0; s <= STAGES; s++) {
    /* the stage's logged hash after its 6th aggregation */
    const uint8_t *logged = NULL;
    for (int i = 0; i < h.n_nodes; i++)
      if (h.nodes[i].stage == s && h.nodes[i].have_hash[iters - 1]) logged = h.nodes[i].hash_of[iters - 1];
    assert_non_null(logged);
    int holders = 0;
    for (int i = 0; i < h.n_nodes; i++) {
      const replica_entry *e = train_peer_replica(h.nodes[i].tp, s);
      if (!e) continue;
      assert_int_not_equal(h.nodes[i].stage, s); /* held outside the stage */
      if (e->iteration != iters) continue;
      holders++;
      assert_memory_equal(e->weights_hash, logged, 32);
      assert_int_equal(e->step, iters);
      /* the bytes are the stage's weights: the fake snapshot is w */
      int member = -1;
      for (int k = 0; k < h.n_nodes && member < 0; k++)
        if (h.nodes[k].stage == s) member = k;
      assert_int_equal(e->len, sizeof(h.nodes[member].w));
      assert_memory_equal(e->blob, h.nodes[member].w, e->len);
    }
    assert_int_equal(holders, 2);
  }
  char why[200] = "";
  if (!h_hashes_agree(&h, iters, why, sizeof(why))) fail_msg("%s", why);
  h_free(&h);
}

static void test_holder_bound(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 11, verbose());
  h.replicate_every = 1;
  h.replicas = 2;
  h.replica_max = 2;
  int d = h_add(&h, TRAIN_DATA, 0, M, 6, true);
  for (int s = 1; s <= STAGES; s++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  assert_true(h_run_until_finished(&h, 120000));
  /* the data node is the one peer every stage knows: it holds replicas of
   * all three, six times over, and keeps two */
  assert_true(h.nodes[d].replicas_stored >= 6);
  assert_true(h.nodes[d].replicas_dropped > 0);
  uint32_t kept = 0;
  for (int s = 1; s <= STAGES; s++) kept += train_peer_replica(h.nodes[d].tp, s) != NULL;
  assert_true(kept >= 1 && kept <= 2);
  h_free(&h);
}

/* The holder of stage s's replica with the lowest node ID: the one a
 * restorer asks first among holders that agree (-1: none). */
static int lowest_holder(h_harness *h, int s) {
  int best = -1;
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].alive && train_peer_replica(h->nodes[i].tp, s) &&
        (best < 0 || gw_id_cmp(&h->nodes[i].peer.id, &h->nodes[best].peer.id) < 0))
      best = i;
  return best;
}

/* Kills every relay of stage 1 while the run is in iteration `kill_at`,
 * then starts one fresh relay for the leader to place. Returns its index. */
static int kill_stage_and_join(h_harness *h, int d, uint64_t kill_at) {
  for (int k = 0; k < 200000 && train_peer_iteration(h->nodes[d].tp) < kill_at; k++) h_run_for(h, 5);
  assert_int_equal(train_peer_iteration(h->nodes[d].tp), kill_at);
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].alive && h->nodes[i].stage == 1) h_crash(h, i);
  int j = h_add(h, TRAIN_RELAY, -1, M, 0, false);
  h_start(h, j);
  return j;
}

static void test_empty_stage_refilled_from_replica(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10, kill_at = 5;
  int d = build(&h, 21, 1, iters, 2);
  int victim = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) victim = i;
  int j = kill_stage_and_join(&h, d, kill_at);
  assert_true(h_run_until_finished(&h, 600000));
  /* the leader's refill decision: the joiner went to the empty stage */
  assert_int_equal(h.nodes[j].stage, 1);
  assert_true(h.nodes[j].ready);
  assert_false(h.nodes[j].stage_lost);
  assert_false(h.nodes[d].stage_lost);
  /* it restored the replica of aggregation 4 (the newest before the kill at
   * 5): the weights the dead stage logged then */
  assert_true(h.nodes[victim].have_hash[3]);
  /* aggregations 5..9 ran after the restore: one (the 5th) was lost */
  assert_int_equal(train_peer_step(h.nodes[j].tp), iters - 1);
  assert_int_equal(train_peer_step(h.nodes[d].tp), iters);
  /* training went on: every iteration after the restore finished with a loss */
  assert_true(h.nodes[d].iterations_done >= iters - 1);
  assert_true(isfinite(h.nodes[d].last_loss));
  h_free(&h);
}

/* Both relays of stage 1 die in iteration 5 and two fresh relays start
 * one after the other: the leader places both into the emptied stage, the
 * second told of the first (placed, not yet in the directory, which lags
 * three rounds for them). No round of theirs splits. Before, each was told
 * of nobody, restored the replica and aggregated alone until their
 * directories caught up (swarm_kill_fraction). */
/* Everything to `slow` but the leader's ASSIGN takes 1 s: its restore
 * is still on its way when the leader places the next joiner. */
typedef struct slow_to {
  h_harness *h;
  int slow;
} slow_to;

static uint64_t slow_restore(void *ud, int from, int to, size_t len, gw_rng *rng) {
  const slow_to *st = ud;
  (void)from, (void)len;
  if (to == st->h->nodes[st->slow].index && st->h->sending != GWTF__TRAIN_MSG__TRAIN_ASSIGN) return 1000;
  return 1 + gw_rng_below(rng, 3);
}

static void test_two_joiners_refill_one_stage(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10, kill_at = 5;
  int d = build(&h, 23, 2, iters, 2);
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < kill_at; k++) h_run_for(&h, 5);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].alive && h.nodes[i].stage == 1) h_crash(&h, i);
  int j1 = h_add(&h, TRAIN_RELAY, -1, M, 0, false), j2 = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  slow_to st = {&h, j1};
  sim_set_delay_fn(h.s, slow_restore, &st);
  h_start(&h, j1);
  /* the second asks once the first is placed (together, the leader spreads
   * one batch of joiners over the stages) and before it is ready */
  for (int k = 0; k < 20000 && h.nodes[j1].stage < 0; k++) h_run_for(&h, 1);
  assert_false(h.nodes[j1].ready);
  /* neither's directory record reaches the other for three rounds (in a
   * swarm the DHT lags the leader's placements) */
  h.nodes[j1].hidden_from[j2] = h.nodes[j2].hidden_from[j1] = true;
  h_start(&h, j2);
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < kill_at + 3; k++) h_run_for(&h, 5);
  h.nodes[j1].hidden_from[j2] = h.nodes[j2].hidden_from[j1] = false;
  h_refresh(&h);
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(h.nodes[j1].stage, 1);
  assert_int_equal(h.nodes[j2].stage, 1);
  assert_true(h.nodes[j1].ready && h.nodes[j2].ready);
  char why[200] = "";
  if (!h_hashes_agree(&h, iters, why, sizeof(why))) fail_msg("%s", why);
  assert_memory_equal(h.nodes[j1].w, h.nodes[j2].w, sizeof(h.nodes[j1].w));
  h_free(&h);
}

/* The restored state equals the replica bit for bit: the joiner's weights
 * hash right after the restore is the one stage 1 logged at aggregation 4. */
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

static void test_restored_weights_are_the_replica(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 21, 1, 8, 2);
  int victim = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) victim = i;
  watch_index = h.n_nodes; /* the joiner kill_stage_and_join adds */
  restored_seen = false;
  h.hook = watch_restore;
  int j = kill_stage_and_join(&h, d, 5);
  assert_int_equal(j, watch_index);
  for (int k = 0; k < 100000 && !h.nodes[j].ready; k++) h_run_for(&h, 5);
  assert_true(h.nodes[j].ready);
  assert_true(restored_seen);
  /* the fake model's weights hash is BLAKE2b of w: what was restored is
   * what stage 1 logged after aggregation 4 */
  assert_memory_equal(restored_hash, h.nodes[victim].hash_of[3], 32);
  h_free(&h);
}

/* A holder that serves a replica whose bytes are intact (its own hash
 * matches) but whose weights are not the ones the stage logged: the
 * restorer refuses it and takes another holder's. */
static void test_mismatch_falls_back_to_another_holder(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 21, 1, 8, 2);
  int victim = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) victim = i;
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 5; k++) h_run_for(&h, 5);
  /* the holder asked first (the lowest ID of those announcing the same
   * hash) serves forged weights under an intact transfer hash */
  int liar = lowest_holder(&h, 1);
  assert_true(liar >= 0);
  replica_entry *e = (replica_entry *)train_peer_replica(h.nodes[liar].tp, 1);
  assert_non_null(e);
  ((float *)e->blob)[0] += 1.0f;
  gw_id bh;
  gw_id_hash(e->blob, e->len, &bh);
  memcpy(e->blob_hash, bh.b, 32);
  watch_index = h.n_nodes;
  restored_seen = false;
  h.hook = watch_restore;
  int j = kill_stage_and_join(&h, d, 5);
  for (int k = 0; k < 100000 && !h.nodes[j].ready; k++) h_run_for(&h, 5);
  assert_true(h.nodes[j].ready);
  assert_int_equal(train_peer_counters(h.nodes[j].tp)->downloads_refuted, 1);
  /* the last restore is the honest holder's: stage 1's logged weights */
  assert_memory_equal(restored_hash, h.nodes[victim].hash_of[3], 32);
  h_free(&h);
}

/* A holder that forges a state *and* the weights hash it announces (its
 * own word, in its push and its DHT record) is outvoted by the two honest
 * holders of the same replica: the restorer never asks it. */
static void test_forged_holder_outvoted(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 21, verbose());
  h.replicate_every = 2;
  h.replicas = 3; /* three holders of each replica: one forged, two honest */
  int d = h_add(&h, TRAIN_DATA, 0, M, 8, true);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < (s == 1 ? 1 : 2); k++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  int victim = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) victim = i;
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 5; k++) h_run_for(&h, 5);
  int holders = 0;
  for (int i = 0; i < h.n_nodes; i++) holders += train_peer_replica(h.nodes[i].tp, 1) != NULL;
  assert_int_equal(holders, 3);
  /* the lowest ID, which a tie would favour, forges its hash too */
  int liar = lowest_holder(&h, 1);
  assert_true(liar >= 0);
  replica_entry *e = (replica_entry *)train_peer_replica(h.nodes[liar].tp, 1);
  assert_non_null(e);
  ((float *)e->blob)[0] += 1.0f;
  gw_id fh;
  gw_id_hash(e->blob, e->len, &fh); /* the fake model's weights hash is BLAKE2b of w */
  memcpy(e->blob_hash, fh.b, 32);
  memcpy(e->weights_hash, fh.b, 32);
  watch_index = h.n_nodes;
  restored_seen = false;
  h.hook = watch_restore;
  int j = kill_stage_and_join(&h, d, 5);
  for (int k = 0; k < 100000 && !h.nodes[j].ready; k++) h_run_for(&h, 5);
  assert_true(h.nodes[j].ready);
  assert_int_equal(train_peer_counters(h.nodes[j].tp)->downloads_refuted, 0);
  assert_memory_equal(restored_hash, h.nodes[victim].hash_of[3], 32);
  h_free(&h);
}

/* A holder's DHT record outlives it: after a correlated outage the
 * restorer must not ask a dead holder first (it would wait out the whole
 * download timeout) when a live one announces the same replica. */
static int dead_holder = -1, reqs_to_dead;
static void count_reqs(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                       const train_tensor *t) {
  (void)h, (void)from, (void)body, (void)len, (void)t;
  if (type == GWTF__TRAIN_MSG__TRAIN_REPLICA_REQ && to == dead_holder) reqs_to_dead++;
}

static void test_dead_holder_not_asked_first(void **state) {
  (void)state;
  bool tried = false;
  for (uint64_t seed = 21; seed < 80 && !tried; seed++) {
    h_harness h;
    int d = build(&h, seed, 2, 8, 2); /* two per stage: a holder's death leaves its stage served */
    h.holders_outlive = true;
    for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 5; k++) h_run_for(&h, 5);
    /* the holder a restorer of stage 1 would ask first by ID: a relay here */
    int low = lowest_holder(&h, 1);
    if (low < 0 || low == d) {
      h_free(&h);
      continue;
    }
    tried = true;
    dead_holder = low;
    reqs_to_dead = 0;
    h.send_hook = count_reqs;
    h_crash(&h, low);
    int j = kill_stage_and_join(&h, d, 5);
    for (int k = 0; k < 100000 && !h.nodes[j].ready; k++) h_run_for(&h, 5);
    assert_true(h.nodes[j].ready);
    assert_int_equal(reqs_to_dead, 0);
    assert_int_equal(train_peer_step(h.nodes[j].tp), 4); /* the replica of aggregation 4, from the live holder */
    h.send_hook = NULL;
    h_free(&h);
  }
  assert_true(tried);
}

/* A fresh relay placed into the emptied stage 1 has no session up to
 * either holder of its replica yet (they come up SESSION_MS after the
 * kill): its first requests cannot be sent. It asks again shortly and
 * restores as soon as a session is up. Before, a request that could not be
 * sent was waited for as if sent (the whole download timeout per holder):
 * in a swarm's correlated outage two holders took the whole replica wait
 * and the stage was declared lost with a live holder. */
#define SESSION_MS 600
static void test_unsent_request_asks_again(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 21, 2, 8, 2);
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 5; k++) h_run_for(&h, 5);
  uint64_t killed = sim_now(h.s);
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].alive && h.nodes[i].stage == 1) h_crash(&h, i);
  int j = h_add(&h, TRAIN_RELAY, -1, M, 0, false), holders = 0;
  for (int i = 0; i < j; i++)
    if (h.nodes[i].alive && train_peer_replica(h.nodes[i].tp, 1)) {
      h.nodes[j].sessions_until[i] = killed + SESSION_MS;
      holders++;
    }
  assert_true(holders >= 1);
  h_start(&h, j);
  for (int k = 0; k < 100000 && !h.nodes[j].ready; k++) h_run_for(&h, 5);
  uint64_t ready = sim_now(h.s) - killed;
  if (verbose()) fprintf(stderr, "%d holders; the joiner was ready %llu ms after the kill\n", holders,
                         (unsigned long long)ready);
  assert_true(h.nodes[j].ready);
  assert_int_equal(h.nodes[j].stage, 1);
  assert_int_equal(train_peer_step(h.nodes[j].tp), 4); /* the replica of aggregation 4 */
  /* asked again within JOIN_UNSENT_RETRY_MS-ish of the session, not a whole download timeout later */
  assert_true(ready < SESSION_MS + h.tun.agg_timeout_ms / 2);
  h_free(&h);
}

static void test_no_replica_stops_the_run(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 21, 1, 10, 0); /* replication off */
  int j = kill_stage_and_join(&h, d, 5);
  for (int k = 0; k < 20000 && !h.nodes[d].stage_lost; k++) h_run_for(&h, 5);
  assert_true(h.nodes[j].stage_lost);
  assert_true(h.nodes[d].stage_lost); /* the leader agreed and stops */
  assert_int_equal(h.nodes[j].stage, 1);
  assert_false(h.nodes[j].ready); /* never trained on fresh weights */
  h_free(&h);
}

/* The leader's refill decision without a joiner: stage 1's only relay dies,
 * nobody joins, and the leader moves a member of stage 2 (the stage with
 * the most members: three, against one in stage 3) into stage 1; it takes
 * the one with the highest ID, never stage 2's aggregator. It restores stage
 * 1's replica, stage 2 goes on with two members that agree, and the run
 * finishes with one aggregation of stage 1 lost. */
static void test_leader_moves_a_member_into_an_empty_stage(void **state) {
  (void)state;
  h_harness h;
  const uint64_t iters = 10;
  h_init(&h, STAGES, 21, verbose());
  h.replicate_every = 2;
  h.replicas = 2;
  h.movable = true;
  int d = h_add(&h, TRAIN_DATA, 0, M, iters, true);
  int per[STAGES + 1] = {0, 1, 3, 1};
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < per[s]; k++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  int two[3];
  assert_int_equal(h_by_id(&h, 2, two, 3), 3);
  int mover = two[2]; /* stage 2's highest ID */
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 5; k++) h_run_for(&h, 5);
  int victim = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) victim = i;
  h_crash(&h, victim);
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(h.nodes[mover].stage, 1);
  assert_true(h.nodes[mover].ready);
  assert_int_equal(h.nodes[two[0]].stage, 2);
  assert_int_equal(h.nodes[two[1]].stage, 2);
  assert_int_equal(h.n_nodes, 1 + 1 + 3 + 1); /* nobody joined */
  /* stage 1 resumed from aggregation 4: its step counts one less */
  assert_int_equal(train_peer_step(h.nodes[mover].tp), iters - 1);
  assert_int_equal(train_peer_step(h.nodes[d].tp), iters);
  /* stage 2's remaining members agree on every aggregation */
  for (uint64_t it = 0; it < iters; it++)
    assert_memory_equal(h.nodes[two[0]].hash_of[it], h.nodes[two[1]].hash_of[it], 32);
  assert_int_equal(h.nodes[d].iterations_done, iters);
  h_free(&h);
}

/* Hostile replica traffic changes nothing: a push from a peer that is not a
 * member of the stage it names (here: a stage-2 relay claiming stage 1,
 * and a stage-1 relay pushing "stage 1" to a stage-1 peer), a push whose
 * chunks skip bytes, and a STAGE_LOST to the leader from a peer it never
 * placed there: nothing is stored, nothing is dropped, the run finishes. */
static int pack_chunk(uint8_t *buf, size_t cap, int stage, uint64_t iteration, uint64_t offset, uint64_t total,
                      const uint8_t hash[32]) {
  Gwtf__TrainWeightsChunk c = GWTF__TRAIN_WEIGHTS_CHUNK__INIT;
  c.stage = stage;
  c.iteration = iteration;
  c.step = iteration;
  c.offset = offset;
  c.total = total;
  c.hash.len = 32;
  c.hash.data = (uint8_t *)hash;
  c.weights_hash.len = 32;
  c.weights_hash.data = (uint8_t *)hash;
  assert_true(gwtf__train_weights_chunk__get_packed_size(&c) <= cap);
  return (int)gwtf__train_weights_chunk__pack(&c, buf);
}

static void test_hostile_replica_messages(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 31, 1, 6, 0); /* replication off: anything stored came from us */
  int r[STAGES + 1];
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].role == TRAIN_RELAY) r[h.nodes[i].stage] = i;
  for (int k = 0; k < 200000 && train_peer_iteration(h.nodes[d].tp) < 2; k++) h_run_for(&h, 5);
  float w[H_NP] = {1, 2};
  gw_id bh;
  gw_id_hash(w, sizeof(w), &bh);
  uint8_t buf[256];
  train_tensor t = {.dtype = TRAIN_U8, .ndim = 1, .shape = {sizeof(w)}, .data = w, .nbytes = sizeof(w)};
  /* a stage-2 relay pushes "stage 1" to the data node: not a member of stage 1 */
  int len = pack_chunk(buf, sizeof(buf), 1, 2, 0, sizeof(w), bh.b);
  h_inject(&h, r[2], d, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, buf, (size_t)len, &t);
  /* stage 1 pushes its own stage to ... itself as seen by a peer of stage 1: refused (own stage) */
  h_inject(&h, r[1], r[1], GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, buf, (size_t)len, &t);
  /* a real member of stage 1 whose second chunk skips 4 bytes */
  train_tensor half = t;
  half.shape[0] = half.nbytes = 4;
  len = pack_chunk(buf, sizeof(buf), 1, 2, 0, sizeof(w), bh.b);
  h_inject(&h, r[1], d, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, buf, (size_t)len, &half);
  len = pack_chunk(buf, sizeof(buf), 1, 2, 6, sizeof(w), bh.b);
  half.data = (const uint8_t *)w + 4;
  half.shape[0] = half.nbytes = 2;
  h_inject(&h, r[1], d, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, buf, (size_t)len, &half);
  /* a relay of stage 3 tells the leader stage 1 is lost */
  Gwtf__TrainStageLost lost = GWTF__TRAIN_STAGE_LOST__INIT;
  lost.stage = 1;
  lost.iteration = 2;
  len = (int)gwtf__train_stage_lost__pack(&lost, buf);
  h_inject(&h, r[3], d, GWTF__TRAIN_MSG__TRAIN_STAGE_LOST, buf, (size_t)len, NULL);
  /* a request for a replica nobody holds is answered with nothing */
  Gwtf__TrainReplicaReq req = GWTF__TRAIN_REPLICA_REQ__INIT;
  req.stage = 1;
  len = (int)gwtf__train_replica_req__pack(&req, buf);
  h_inject(&h, r[3], d, GWTF__TRAIN_MSG__TRAIN_REPLICA_REQ, buf, (size_t)len, NULL);
  assert_true(h_run_until_finished(&h, 120000));
  for (int i = 0; i < h.n_nodes; i++) {
    assert_int_equal(h.nodes[i].replicas_stored, 0);
    assert_false(h.nodes[i].stage_lost);
    for (int s = 1; s <= STAGES; s++) assert_null(train_peer_replica(h.nodes[i].tp, s));
  }
  assert_int_equal(h.nodes[d].iterations_done, 6);
  assert_true(train_peer_counters(h.nodes[d].tp)->messages_refused >= 2);
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_push_and_store),
      cmocka_unit_test(test_holder_bound),
      cmocka_unit_test(test_empty_stage_refilled_from_replica),
      cmocka_unit_test(test_two_joiners_refill_one_stage),
      cmocka_unit_test(test_restored_weights_are_the_replica),
      cmocka_unit_test(test_mismatch_falls_back_to_another_holder),
      cmocka_unit_test(test_forged_holder_outvoted),
      cmocka_unit_test(test_dead_holder_not_asked_first),
      cmocka_unit_test(test_unsent_request_asks_again),
      cmocka_unit_test(test_no_replica_stops_the_run),
      cmocka_unit_test(test_hostile_replica_messages),
      cmocka_unit_test(test_leader_moves_a_member_into_an_empty_stage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
