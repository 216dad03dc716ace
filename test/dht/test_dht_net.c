/* Small simulated networks (seeded, virtual time): joining, lookups,
 * publication and paging, expiry, republication, withdrawal, restarts from
 * saved contacts, and the stage directory. */
#include "dht_testnet.h"


#define SEED (20240611)

static void run_until_flag(testnet *t, bool *flag, uint64_t budget_ms) {
  assert_true(sim_run_while_not(t->s, tn_flag, flag, sim_now(t->s) + budget_ms));
}

static tn_records_result fetch(testnet *t, size_t from, const gw_id *key) {
  tn_records_result r = {0};
  assert_int_equal(dht_fetch(t->nodes[from], key, tn_on_records, &r, sim_now(t->s)), 0);
  run_until_flag(t, &r.done, 20000);
  return r;
}

static void test_join_and_lookups(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 64, SEED, NULL, NULL);
  tn_join_all(&t, 20, 60000);
  for (size_t i = 0; i < t.n; i++) {
    dht_stats st;
    dht_get_stats(t.nodes[i], &st);
    assert_true(st.contacts >= 20);
  }
  gw_rng *rng = sim_rng(t.s);
  for (int q = 0; q < 40; q++) {
    gw_id target;
    gw_rng_bytes(rng, target.b, sizeof(target.b));
    size_t from = (size_t)gw_rng_below(rng, t.n);
    tn_nodes_result r = {0};
    assert_int_equal(dht_find_node(t.nodes[from], &target, tn_on_nodes, &r, sim_now(t.s)), 0);
    run_until_flag(&t, &r.done, 10000);
    assert_int_equal(r.status, 0);
    size_t truth = tn_true_closest(&t, &target);
    /* The asker itself may be the closest; it looks for others. */
    if (truth == from) continue;
    assert_true(gw_id_eq(&r.closest[0].id, &t.ids[truth]->id));
    assert_true(r.st.hops >= 1 && r.st.hops <= 4);
    assert_true(r.st.rpcs >= DHT_WIDTH && r.st.rpcs <= 20);
    assert_int_equal(r.st.timeouts, 0);
  }
  /* Every datagram fitted the limit (the sim refuses larger ones). */
  assert_int_equal(sim_get_stats(t.s)->refused_size, 0);
  tn_free(&t);
}

static void test_publish_fetch_paging(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 48, SEED + 1, NULL, NULL);
  tn_join_all(&t, 20, 60000);
  gw_id key;
  gw_id_hash_str("run/big/stage/1", &key);
  /* 40 publishers under one key: far more than one datagram holds. */
  for (size_t i = 0; i < 40; i++) {
    char v[32];
    snprintf(v, sizeof(v), "member-%zu", i);
    assert_int_equal(dht_publish(t.nodes[i], &key, (const uint8_t *)v, strlen(v), NULL, NULL, sim_now(t.s)), 0);
  }
  sim_run_until(t.s, sim_now(t.s) + 10000);
  tn_records_result r = fetch(&t, 45, &key);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.n, 40);
  for (size_t i = 0; i < 40; i++) {
    assert_true(tn_has_publisher(&r, &t.ids[i]->id));
    if (i) assert_true(gw_id_cmp(&r.publishers[i - 1], &r.publishers[i]) < 0);
  }
  /* Paging took more requests than nodes asked. */
  assert_true(r.st.rpcs > DHT_WIDTH);
  assert_int_equal(sim_get_stats(t.s)->refused_size, 0);
  /* A key nobody published: an empty answer, not an error. */
  gw_id none;
  gw_id_hash_str("run/none", &none);
  r = fetch(&t, 3, &none);
  assert_int_equal(r.status, 0);
  assert_int_equal(r.n, 0);
  tn_free(&t);
}

typedef struct pub_count {
  int rounds;
  size_t last_stored;
} pub_count;

static void on_published(void *ud, int status, size_t stored) {
  pub_count *c = ud;
  (void)status;
  c->rounds++;
  c->last_stored = stored;
}

static void test_expiry_republish_withdraw(void **state) {
  (void)state;
  dht_config cfg = {.record_ttl_ms = 20000};
  testnet t;
  tn_init(&t, 40, SEED + 2, NULL, &cfg);
  tn_join_all(&t, 20, 60000);
  gw_id key;
  gw_id_hash_str("run/ttl/stage/0", &key);
  size_t a = 5, b = 6, c = 7;
  pub_count pa = {0};
  uint64_t now = sim_now(t.s);
  assert_int_equal(dht_publish(t.nodes[a], &key, (const uint8_t *)"a", 1, on_published, &pa, now), 0);
  assert_int_equal(dht_publish(t.nodes[b], &key, (const uint8_t *)"b", 1, NULL, NULL, now), 0);
  assert_int_equal(dht_publish(t.nodes[c], &key, (const uint8_t *)"c", 1, NULL, NULL, now), 0);
  sim_run_until(t.s, now + 3000);
  assert_int_equal(pa.rounds, 1);
  assert_true(pa.last_stored >= DHT_K - 1); /* the k closest (one may be a itself) */
  tn_records_result r = fetch(&t, 30, &key);
  assert_int_equal(r.n, 3);
  /* b dies; c withdraws: c disappears at once, b only when its record expires. */
  tn_crash(&t, b);
  assert_int_equal(dht_unpublish(t.nodes[c], &key, sim_now(t.s)), 0);
  assert_int_equal(dht_unpublish(t.nodes[c], &key, sim_now(t.s)), GW_ENOENT);
  sim_run_until(t.s, sim_now(t.s) + 3000);
  r = fetch(&t, 31, &key);
  assert_int_equal(r.n, 2);
  assert_true(tn_has_publisher(&r, &t.ids[a]->id));
  assert_true(tn_has_publisher(&r, &t.ids[b]->id));
  /* Past the TTL: a republished (with a higher sequence), b's record expired. */
  uint64_t seq_before = 0;
  for (size_t i = 0; i < r.n; i++)
    if (gw_id_eq(&r.publishers[i], &t.ids[a]->id)) seq_before = r.seqs[i];
  sim_run_until(t.s, now + 25000);
  r = fetch(&t, 32, &key);
  assert_int_equal(r.n, 1);
  assert_true(gw_id_eq(&r.publishers[0], &t.ids[a]->id));
  assert_true(r.seqs[0] > seq_before);
  assert_true(pa.rounds >= 2);
  /* Nobody keeps expired records around. */
  sim_run_until(t.s, now + 60000);
  size_t holders = 0;
  for (size_t i = 0; i < t.n; i++) {
    if (!sim_alive(t.s, (int)i)) continue;
    dht_stats st;
    dht_get_stats(t.nodes[i], &st);
    holders += st.records;
  }
  assert_true(holders >= DHT_K - 1 && holders <= DHT_K + 1); /* a's record only (c's tombstone expired) */
  tn_free(&t);
}

static void test_restart_from_saved_contacts(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 30, SEED + 3, NULL, NULL);
  tn_join_all(&t, 20, 60000);
  /* Node 12 saves its contacts, then the bootstrap node and node 12 die. */
  gw_peer saved[16];
  size_t n = dht_contacts(t.nodes[12], saved, 16);
  assert_int_equal(n, 16);
  for (size_t i = 1; i < n; i++) assert_false(gw_id_is_zero(&saved[i].id));
  tn_crash(&t, 0);
  tn_crash(&t, 12);
  /* Its successor (a fresh node) starts from the saved contacts alone. A
   * saved entry whose ID no longer answers there is simply not accepted. */
  size_t fresh = tn_add(&t, SEED + 99);
  saved[0].id.b[0] ^= 1;
  assert_int_equal(dht_bootstrap(t.nodes[fresh], saved, n, sim_now(t.s)), 0);
  tn_all all = {&t, fresh, fresh + 1};
  assert_true(sim_run_while_not(t.s, tn_all_joined, &all, sim_now(t.s) + 20000));
  dht_stats st;
  dht_get_stats(t.nodes[fresh], &st);
  assert_true(st.contacts >= 20);
  gw_peer now_known[64];
  size_t k = dht_contacts(t.nodes[fresh], now_known, 64);
  for (size_t i = 0; i < k; i++) assert_false(gw_id_eq(&now_known[i].id, &saved[0].id));
  tn_free(&t);
}

static void test_bootstrap_retries(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 2, SEED + 4, NULL, NULL);
  /* Node 0 bootstraps from node 1, which is not up yet (it crashed before
   * answering): retries back off; once node 1's successor is at that address... */
  tn_crash(&t, 1);
  tn_bootstrap(&t, 0, 1, false);
  sim_run_until(t.s, 10000);
  assert_false(dht_joined(t.nodes[0]));
  dht_stats st;
  dht_get_stats(t.nodes[0], &st);
  /* 1 s, 2 s, 4 s: four attempts in ten seconds, not a flood. */
  assert_true(st.rpcs_sent >= 3 && st.rpcs_sent <= 5);
  /* A live peer appears among the seeds: joined on the next retry. */
  size_t n2 = tn_add(&t, SEED + 5);
  tn_bootstrap(&t, n2, 0, false); /* n2 learns about 0 ... */
  tn_bootstrap(&t, 0, n2, true);  /* ... and 0 gets n2 as a second seed */
  tn_all all = {&t, 0, 1};
  assert_true(sim_run_while_not(t.s, tn_all_joined, &all, sim_now(t.s) + 30000));
  tn_free(&t);
}

/* ---- stage directory ---- */

typedef struct runs_result {
  bool done;
  size_t n;
  gw_id publisher;
  char value[64];
} runs_result;

static void on_runs(void *ud, int status, const stage_run *runs, size_t n) {
  runs_result *r = ud;
  (void)status;
  r->done = true;
  r->n = n;
  if (n) {
    r->publisher = runs[0].publisher;
    snprintf(r->value, sizeof(r->value), "%.*s", (int)runs[0].len, (const char *)runs[0].value);
  }
}

static void test_stage_keys(void **state) {
  (void)state;
  char run[STAGE_DIR_NAME_MAX + 1];
  int64_t stage;
  assert_int_equal(stage_dir_parse("run/demo/stage/3", run, sizeof(run), &stage), 0);
  assert_string_equal(run, "demo");
  assert_int_equal(stage, 3);
  assert_int_equal(stage_dir_parse("run/demo", run, sizeof(run), &stage), 0);
  assert_int_equal(stage, -1);
  const char *bad[] = {"run/", "demo", "run/a b", "run/x/stage/", "run/x/stage/-1", "run/x/stage/1x",
                       "run/x/stages/1", "run/x/stage/99999999999", "run/x/y"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(stage_dir_parse(bad[i], run, sizeof(run), &stage), GW_EINVAL);
  /* Keys are BLAKE2b-256 of the name. */
  gw_id k, want;
  assert_int_equal(stage_dir_stage_key("demo", 3, &k), 0);
  gw_id_hash_str("run/demo/stage/3", &want);
  assert_true(gw_id_eq(&k, &want));
  assert_int_equal(stage_dir_run_key("demo", &k), 0);
  gw_id_hash_str("run/demo", &want);
  assert_true(gw_id_eq(&k, &want));
  assert_int_equal(stage_dir_run_key("no/slash", &k), GW_EINVAL);
}

static void test_stage_directory(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 48, SEED + 6, NULL, NULL);
  tn_join_all(&t, 20, 60000);
  uint64_t now = sim_now(t.s);
  /* 4 stages, 5 members each (nodes 10..29). */
  for (uint32_t i = 0; i < 20; i++) {
    stage_member me = {.capacity = 4 + i, .load = i % 3};
    me.addr = tn_addr(10 + i);
    me.addr.port = (uint16_t)(7000 + i);
    uint8_t extra[4] = {1, 2, 3, (uint8_t)i};
    me.extra = extra;
    me.extra_len = sizeof(extra);
    assert_int_equal(stage_dir_announce(t.nodes[10 + i], "demo", i % 4, &me, now), 0);
  }
  const char *cfg = "{\"model\":\"tiny\",\"stages\":4}";
  assert_int_equal(stage_dir_publish_run(t.nodes[10], "demo", (const uint8_t *)cfg, strlen(cfg), now), 0);
  sim_run_until(t.s, now + 5000);
  for (uint32_t s = 0; s < 4; s++) {
    tn_members_result r = {0};
    assert_int_equal(stage_dir_discover(t.nodes[40], "demo", s, tn_on_members, &r, sim_now(t.s)), 0);
    run_until_flag(&t, &r.done, 20000);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.n, 5);
    for (size_t j = 0; j < r.n; j++) {
      size_t who = SIZE_MAX;
      for (size_t i = 10; i < 30; i++)
        if (gw_id_eq(&t.ids[i]->id, &r.m[j].id)) who = i;
      assert_true(who != SIZE_MAX);
      uint32_t i = (uint32_t)(who - 10);
      assert_int_equal(i % 4, s);
      assert_int_equal(r.m[j].addr.port, 7000 + i);
      assert_int_equal(r.m[j].addr.ip[3], (uint8_t)(10 + i));
      assert_int_equal(r.m[j].capacity, 4 + i);
      assert_int_equal(r.m[j].load, i % 3);
      assert_int_equal(r.m[j].extra_len, 4);
      assert_int_equal(r.m[j].extra[3], (uint8_t)i);
      assert_true(r.m[j].remaining_ms > 0);
    }
  }
  runs_result rr = {0};
  assert_int_equal(stage_dir_find_run(t.nodes[41], "demo", on_runs, &rr, sim_now(t.s)), 0);
  run_until_flag(&t, &rr.done, 20000);
  assert_int_equal(rr.n, 1);
  assert_true(gw_id_eq(&rr.publisher, &t.ids[10]->id));
  assert_string_equal(rr.value, cfg);
  /* Withdraw one member: gone from the next discovery. */
  assert_int_equal(stage_dir_withdraw(t.nodes[10], "demo", 0, sim_now(t.s)), 0);
  sim_run_until(t.s, sim_now(t.s) + 3000);
  tn_members_result r = {0};
  assert_int_equal(stage_dir_discover(t.nodes[42], "demo", 0, tn_on_members, &r, sim_now(t.s)), 0);
  run_until_flag(&t, &r.done, 20000);
  assert_int_equal(r.n, 4);
  for (size_t j = 0; j < r.n; j++) assert_false(gw_id_eq(&r.m[j].id, &t.ids[10]->id));
  /* Announcing with an unspecified IP uses the address others see. */
  stage_member anyaddr = {.capacity = 1};
  anyaddr.addr.family = 4;
  anyaddr.addr.port = 9999;
  assert_int_equal(stage_dir_announce(t.nodes[44], "demo", 2, &anyaddr, sim_now(t.s)), 0);
  sim_run_until(t.s, sim_now(t.s) + 3000);
  r = (tn_members_result){0};
  assert_int_equal(stage_dir_discover(t.nodes[43], "demo", 2, tn_on_members, &r, sim_now(t.s)), 0);
  run_until_flag(&t, &r.done, 20000);
  assert_int_equal(r.n, 6);
  bool seen = false;
  for (size_t j = 0; j < r.n; j++)
    if (gw_id_eq(&r.m[j].id, &t.ids[44]->id)) {
      gw_addr want = tn_addr(44);
      want.port = 9999;
      assert_true(gw_addr_eq(&r.m[j].addr, &want));
      seen = true;
    }
  assert_true(seen);
  tn_free(&t);
}

/* Freeing a dht mid-lookup hands the callback GW_ECLOSED (no leaks). */
static void test_free_cancels(void **state) {
  (void)state;
  testnet t;
  tn_init(&t, 12, SEED + 7, NULL, NULL);
  tn_join_all(&t, 20, 30000);
  tn_members_result r = {0};
  assert_int_equal(stage_dir_discover(t.nodes[3], "demo", 0, tn_on_members, &r, sim_now(t.s)), 0);
  dht_free(t.nodes[3]);
  t.nodes[3] = NULL;
  sim_set_node(t.s, 3, NULL);
  assert_true(r.done);
  assert_int_equal(r.status, GW_ECLOSED);
  tn_crash(&t, 3);
  tn_free(&t);
}

/* Whether node i's routing table lists `who`. */
static bool holds(testnet *t, size_t i, const gw_id *who) {
  gw_peer got[256];
  size_t n = dht_contacts(t->nodes[i], got, 256);
  for (size_t j = 0; j < n && j < 256; j++)
    if (gw_id_eq(&got[j].id, who)) return true;
  return false;
}

/* DHT client mode (private nodes, p2p/reach.h): 30 public nodes and 6
 * clients that join, look up, publish and fetch, yet are in nobody's table
 * and never a lookup's answer. Then a public node turns client and every
 * node that had it drops it. */
static void test_client_mode(void **state) {
  (void)state;
  testnet t;
  const size_t pub = 30, clients = 6;
  tn_init(&t, pub, SEED + 7, NULL, NULL);
  tn_join_all(&t, 20, 60000);
  for (size_t i = 0; i < clients; i++) {
    size_t c = tn_add(&t, SEED + 7);
    dht_set_client_mode(t.nodes[c], true, sim_now(t.s));
    tn_bootstrap(&t, c, (size_t)gw_rng_below(sim_rng(t.s), pub), false);
  }
  tn_all all = {&t, pub, pub + clients};
  assert_true(sim_run_while_not(t.s, tn_all_joined, &all, sim_now(t.s) + 60000));
  /* Everyone publishes; the network keeps working for a while (refreshes,
   * republication). */
  gw_id key;
  gw_id_hash_str("run/private/stage/0", &key);
  for (size_t i = 0; i < t.n; i++) {
    char v[32];
    snprintf(v, sizeof(v), "node-%zu", i);
    assert_int_equal(dht_publish(t.nodes[i], &key, (const uint8_t *)v, strlen(v), NULL, NULL, sim_now(t.s)), 0);
  }
  sim_run_until(t.s, sim_now(t.s) + 11 * 60 * 1000);
  for (size_t c = pub; c < t.n; c++) {
    for (size_t i = 0; i < t.n; i++)
      if (i != c) assert_false(holds(&t, i, &t.ids[c]->id));
    /* A client still knows the network. */
    dht_stats st;
    dht_get_stats(t.nodes[c], &st);
    assert_true(st.good_contacts >= 10);
  }
  /* Lookups from public nodes and from clients find the closest public
   * node, never a client. */
  gw_rng *rng = sim_rng(t.s);
  for (int q = 0; q < 20; q++) {
    gw_id target;
    gw_rng_bytes(rng, target.b, sizeof(target.b));
    size_t from = q % 2 ? pub + (size_t)gw_rng_below(rng, clients) : (size_t)gw_rng_below(rng, pub);
    tn_nodes_result r = {0};
    assert_int_equal(dht_find_node(t.nodes[from], &target, tn_on_nodes, &r, sim_now(t.s)), 0);
    run_until_flag(&t, &r.done, 10000);
    assert_int_equal(r.status, 0);
    for (size_t k = 0; k < r.n; k++)
      for (size_t c = pub; c < t.n; c++) assert_false(gw_id_eq(&r.closest[k].id, &t.ids[c]->id));
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < pub; i++)
      if (i != from && (best == SIZE_MAX || dht_dist_cmp(&target, &t.ids[i]->id, &t.ids[best]->id) < 0)) best = i;
    assert_true(gw_id_eq(&r.closest[0].id, &t.ids[best]->id));
  }
  /* Every record is there, clients' included, fetched by a public node
   * and by a client. */
  size_t readers[2] = {3, pub + 1};
  for (size_t k = 0; k < 2; k++) {
    tn_records_result r = fetch(&t, readers[k], &key);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.n, t.n);
  }
  /* A public node goes private: the nodes that had it drop it. */
  size_t x = 5;
  size_t had = 0;
  for (size_t i = 0; i < t.n; i++) had += i != x && holds(&t, i, &t.ids[x]->id);
  assert_true(had > 0);
  dht_set_client_mode(t.nodes[x], true, sim_now(t.s));
  sim_run_until(t.s, sim_now(t.s) + 11 * 60 * 1000);
  for (size_t i = 0; i < t.n; i++)
    if (i != x) assert_false(holds(&t, i, &t.ids[x]->id));
  assert_int_equal(sim_get_stats(t.s)->refused_size, 0);
  tn_free(&t);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_join_and_lookups),
      cmocka_unit_test(test_publish_fetch_paging),
      cmocka_unit_test(test_expiry_republish_withdraw),
      cmocka_unit_test(test_restart_from_saved_contacts),
      cmocka_unit_test(test_bootstrap_retries),
      cmocka_unit_test(test_stage_keys),
      cmocka_unit_test(test_stage_directory),
      cmocka_unit_test(test_free_cancels),
      cmocka_unit_test(test_client_mode),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
