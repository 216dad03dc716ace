/* Unit tests for the routing table: the XOR metric, bucket splits, eviction
 * only after a failed ping, the replacement cache, one entry per address. */
#include "testutil.h"

#include "dht/routing.h"
#include "util/err.h"

static gw_id id_with(uint8_t first, uint8_t last) {
  gw_id id;
  memset(&id, 0, sizeof(id));
  id.b[0] = first;
  id.b[31] = last;
  return id;
}

static gw_peer peer_at(gw_id id, int n) {
  gw_peer p;
  memset(&p, 0, sizeof(p));
  p.id = id;
  p.addr.family = 4;
  p.addr.ip[0] = 10;
  p.addr.ip[2] = (uint8_t)(n >> 8);
  p.addr.ip[3] = (uint8_t)n;
  p.addr.port = 4000;
  return p;
}

static void test_distance(void **state) {
  (void)state;
  gw_id a = id_with(0x80, 0), b = id_with(0x00, 0), c = id_with(0xc0, 0), t = id_with(0x81, 0);
  assert_int_equal(dht_cpl(&a, &a), 256);
  assert_int_equal(dht_cpl(&a, &b), 0);
  assert_int_equal(dht_cpl(&a, &c), 1);
  gw_id x = id_with(0, 0x01), y = id_with(0, 0x00);
  assert_int_equal(dht_cpl(&x, &y), 255);
  /* t = 1000 0001: a = 1000 0000 is at distance 1, c = 1100 0000 at 0x41, b at 0x81. */
  assert_true(dht_dist_cmp(&t, &a, &c) < 0);
  assert_true(dht_dist_cmp(&t, &c, &b) < 0);
  assert_true(dht_dist_cmp(&t, &b, &a) > 0);
  assert_int_equal(dht_dist_cmp(&t, &a, &a), 0);
  gw_id d;
  dht_distance(&t, &c, &d);
  assert_int_equal(d.b[0], 0x41);
  /* Symmetry and identity of the metric. */
  dht_distance(&c, &t, &d);
  assert_int_equal(d.b[0], 0x41);
  dht_distance(&t, &t, &d);
  assert_true(gw_id_is_zero(&d));
}

static void test_split(void **state) {
  (void)state;
  dht_routing rt;
  gw_id self = id_with(0x00, 0);
  assert_int_equal(dht_routing_init(&rt, &self, 2, 2, 1000, 0), 0);
  /* Two far contacts (first bit differs) fill the only bucket. */
  gw_peer far1 = peer_at(id_with(0x80, 1), 1), far2 = peer_at(id_with(0x90, 2), 2);
  assert_int_equal(dht_routing_update(&rt, &far1, NULL, 10, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(dht_routing_update(&rt, &far2, NULL, 10, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(rt.n_buckets, 1);
  /* A close one: the bucket covering our ID splits instead of refusing it. */
  gw_peer near = peer_at(id_with(0x40, 3), 3);
  assert_int_equal(dht_routing_update(&rt, &near, NULL, 10, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(rt.n_buckets, 2);
  assert_int_equal(rt.buckets[0].n_live, 2);
  assert_int_equal(rt.buckets[1].n_live, 1);
  assert_int_equal(dht_routing_bucket_of(&rt, &far1.id), 0);
  assert_int_equal(dht_routing_bucket_of(&rt, &near.id), 1);
  /* Far buckets never split: a third far contact waits in the replacement cache. */
  gw_peer far3 = peer_at(id_with(0xa0, 4), 4);
  assert_int_equal(dht_routing_update(&rt, &far3, NULL, 10, 0, NULL), DHT_RT_CACHED);
  assert_int_equal(rt.n_buckets, 2);
  assert_int_equal(dht_routing_size(&rt), 3);
  /* Very close contacts split repeatedly, down to the bit they differ in. */
  gw_peer deep1 = peer_at(id_with(0x00, 0x02), 5), deep2 = peer_at(id_with(0x00, 0x01), 6);
  assert_int_equal(dht_routing_update(&rt, &deep1, NULL, 10, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(dht_routing_update(&rt, &deep2, NULL, 10, 0, NULL), DHT_RT_ADDED);
  gw_peer deep3 = peer_at(id_with(0x00, 0x03), 7);
  assert_int_equal(dht_routing_update(&rt, &deep3, NULL, 10, 0, NULL), DHT_RT_ADDED);
  assert_true(rt.n_buckets >= 250);
  assert_int_equal(dht_routing_size(&rt), 6);
  /* Our own ID never enters. */
  gw_peer me = peer_at(self, 9);
  assert_int_equal(dht_routing_update(&rt, &me, NULL, 10, 0, NULL), DHT_RT_REFUSED);
  dht_routing_free(&rt);
}

/* Fills a bucket of two far contacts plus one in the replacement cache. */
static void full_bucket(dht_routing *rt, gw_peer *a, gw_peer *b, gw_peer *c) {
  gw_id self = id_with(0x00, 0);
  assert_int_equal(dht_routing_init(rt, &self, 2, 2, 1000, 0), 0);
  *a = peer_at(id_with(0x80, 1), 1);
  *b = peer_at(id_with(0x90, 2), 2);
  *c = peer_at(id_with(0xa0, 3), 3);
  /* Far contacts: make the bucket unsplittable by adding a near one first. */
  gw_peer near = peer_at(id_with(0x01, 9), 9);
  assert_int_equal(dht_routing_update(rt, &near, NULL, 0, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(dht_routing_update(rt, a, NULL, 100, 0, NULL), DHT_RT_ADDED);
  assert_int_equal(dht_routing_update(rt, b, NULL, 200, 0, NULL), DHT_RT_ADDED);
}

static void test_evict_only_after_failed_ping(void **state) {
  (void)state;
  dht_routing rt;
  gw_peer a, b, c;
  full_bucket(&rt, &a, &b, &c);
  dht_contact *to_ping = NULL;
  /* The newcomer is cached; the least recently seen (a) is named for a ping
   * because it has not been heard from within fresh_ms. */
  assert_int_equal(dht_routing_update(&rt, &c, NULL, 5000, 1000, &to_ping), DHT_RT_CACHED);
  assert_non_null(to_ping);
  assert_true(gw_id_eq(&to_ping->peer.id, &a.id));
  to_ping->ping_pending = true;
  assert_non_null(dht_routing_find(&rt, &a.id));
  assert_null(dht_routing_find(&rt, &c.id));
  /* While the ping is out, no second ping is asked for. */
  gw_peer c2 = peer_at(id_with(0xb0, 4), 4);
  assert_int_equal(dht_routing_update(&rt, &c2, NULL, 5001, 1000, &to_ping), DHT_RT_CACHED);
  assert_null(to_ping);
  /* The ping fails: a goes, the most recent replacement (c2) takes its slot. */
  dht_routing_ping_failed(&rt, &a.id);
  assert_null(dht_routing_find(&rt, &a.id));
  assert_non_null(dht_routing_find(&rt, &c2.id));
  assert_non_null(dht_routing_find(&rt, &b.id));
  dht_routing_free(&rt);
}

static void test_ping_answered_keeps_old(void **state) {
  (void)state;
  dht_routing rt;
  gw_peer a, b, c;
  full_bucket(&rt, &a, &b, &c);
  dht_contact *to_ping = NULL;
  assert_int_equal(dht_routing_update(&rt, &c, NULL, 5000, 1000, &to_ping), DHT_RT_CACHED);
  assert_non_null(to_ping);
  to_ping->ping_pending = true;
  /* a answers the ping: it becomes most recently seen, c stays cached. */
  assert_int_equal(dht_routing_update(&rt, &a, NULL, 5001, 1000, NULL), DHT_RT_UPDATED);
  dht_bucket *bk = &rt.buckets[dht_routing_bucket_of(&rt, &a.id)];
  assert_true(gw_id_eq(&bk->live[bk->n_live - 1].peer.id, &a.id));
  assert_false(bk->live[bk->n_live - 1].ping_pending);
  assert_null(dht_routing_find(&rt, &c.id));
  assert_int_equal(bk->n_repl, 1);
  /* A least recently seen contact that was heard from recently is not pinged. */
  assert_int_equal(dht_routing_update(&rt, &b, NULL, 5001, 1000, NULL), DHT_RT_UPDATED);
  gw_peer c3 = peer_at(id_with(0xc0, 5), 5);
  assert_int_equal(dht_routing_update(&rt, &c3, NULL, 5002, 1000, &to_ping), DHT_RT_CACHED);
  assert_null(to_ping);
  dht_routing_free(&rt);
}

static void test_failures_and_replacement(void **state) {
  (void)state;
  dht_routing rt;
  gw_peer a, b, c;
  full_bucket(&rt, &a, &b, &c);
  /* Without a replacement waiting, a failing contact stays but is not handed out. */
  for (int i = 0; i < DHT_MAX_FAILS; i++) assert_false(dht_routing_failed(&rt, &a.id));
  gw_peer out[8];
  size_t n = dht_routing_closest(&rt, &a.id, NULL, out, 8);
  for (size_t i = 0; i < n; i++) assert_false(gw_id_eq(&out[i].id, &a.id));
  assert_int_equal(dht_routing_good(&rt), 2);
  assert_int_equal(dht_routing_size(&rt), 3);
  /* A newcomer takes a bad contact's slot at once, no ping needed. */
  assert_int_equal(dht_routing_update(&rt, &c, NULL, 300, 1000, NULL), DHT_RT_ADDED);
  assert_null(dht_routing_find(&rt, &a.id));
  assert_non_null(dht_routing_find(&rt, &c.id));
  /* With a replacement waiting, repeated failures evict. */
  gw_peer d = peer_at(id_with(0xd0, 6), 6);
  assert_int_equal(dht_routing_update(&rt, &d, NULL, 400, 100000, NULL), DHT_RT_CACHED);
  assert_false(dht_routing_failed(&rt, &b.id));
  assert_true(dht_routing_failed(&rt, &b.id));
  assert_null(dht_routing_find(&rt, &b.id));
  assert_non_null(dht_routing_find(&rt, &d.id));
  dht_routing_free(&rt);
}

static void test_one_entry_per_address(void **state) {
  (void)state;
  dht_routing rt;
  gw_id self = id_with(0x00, 0);
  assert_int_equal(dht_routing_init(&rt, &self, 4, 2, 1000, 0), 0);
  gw_peer a = peer_at(id_with(0x80, 1), 1);
  assert_int_equal(dht_routing_update(&rt, &a, NULL, 0, 0, NULL), DHT_RT_ADDED);
  /* Another ID at the same IP:port is refused (no Sybils behind one socket). */
  gw_peer sybil = peer_at(id_with(0x81, 2), 1);
  assert_int_equal(dht_routing_update(&rt, &sybil, NULL, 0, 0, NULL), DHT_RT_REFUSED);
  assert_false(dht_routing_would_accept(&rt, &sybil.id, &sybil.addr));
  /* Same IP, another port is a different entry. */
  sybil.addr.port = 4001;
  assert_int_equal(dht_routing_update(&rt, &sybil, NULL, 0, 0, NULL), DHT_RT_ADDED);
  /* The same ID at a new address (it moved, and answered there) is updated in place. */
  gw_peer moved = a;
  moved.addr.port = 5000;
  assert_int_equal(dht_routing_update(&rt, &moved, NULL, 1, 0, NULL), DHT_RT_UPDATED);
  assert_int_equal(dht_routing_find(&rt, &a.id)->peer.addr.port, 5000);
  assert_int_equal(dht_routing_size(&rt), 2);
  dht_routing_free(&rt);
}

static void test_closest_and_recent(void **state) {
  (void)state;
  dht_routing rt;
  gw_id self = id_with(0x00, 0);
  assert_int_equal(dht_routing_init(&rt, &self, 20, 4, 1000, 0), 0);
  gw_peer all[60];
  for (int i = 0; i < 60; i++) {
    char name[16];
    snprintf(name, sizeof(name), "c%d", i);
    gw_id id;
    gw_id_hash_str(name, &id);
    all[i] = peer_at(id, i + 1);
    dht_routing_update(&rt, &all[i], NULL, (uint64_t)i, 0, NULL);
  }
  gw_id target;
  gw_id_hash_str("target", &target);
  gw_peer out[10];
  size_t n = dht_routing_closest(&rt, &target, NULL, out, 10);
  assert_int_equal(n, 10);
  for (size_t i = 1; i < n; i++) assert_true(dht_dist_cmp(&target, &out[i - 1].id, &out[i].id) < 0);
  /* Nothing in the table is closer than the last one returned and left out. */
  for (size_t b = 0; b < rt.n_buckets; b++)
    for (size_t j = 0; j < rt.buckets[b].n_live; j++) {
      const gw_id *id = &rt.buckets[b].live[j].peer.id;
      bool listed = false;
      for (size_t i = 0; i < n; i++) listed |= gw_id_eq(id, &out[i].id);
      if (!listed) assert_true(dht_dist_cmp(&target, id, &out[n - 1].id) > 0);
    }
  /* skip leaves out the asker itself. */
  gw_peer out2[10];
  size_t n2 = dht_routing_closest(&rt, &target, &out[0].id, out2, 10);
  for (size_t i = 0; i < n2; i++) assert_false(gw_id_eq(&out2[i].id, &out[0].id));
  gw_peer recent[5];
  size_t r = dht_routing_recent(&rt, recent, 5);
  assert_int_equal(r, 5);
  for (size_t i = 1; i < r; i++)
    assert_true(dht_routing_find(&rt, &recent[i - 1].id)->last_seen_ms >=
                dht_routing_find(&rt, &recent[i].id)->last_seen_ms);
  dht_routing_free(&rt);
}

static void test_random_in_bucket(void **state) {
  (void)state;
  dht_routing rt;
  gw_id self;
  gw_id_hash_str("self", &self);
  assert_int_equal(dht_routing_init(&rt, &self, 1, 0, 1000, 0), 0);
  /* Grow a few buckets. */
  for (int i = 0; i < 200; i++) {
    char name[16];
    snprintf(name, sizeof(name), "n%d", i);
    gw_id id;
    gw_id_hash_str(name, &id);
    gw_peer p = peer_at(id, i + 1);
    dht_routing_update(&rt, &p, NULL, 0, 0, NULL);
  }
  assert_true(rt.n_buckets > 3);
  uint8_t rnd[GW_ID_BYTES];
  memset(rnd, 0xa5, sizeof(rnd));
  for (size_t i = 0; i < rt.n_buckets; i++) {
    gw_id t;
    dht_routing_random_in(&rt, i, rnd, &t);
    assert_int_equal(dht_routing_bucket_of(&rt, &t), i);
  }
  dht_routing_free(&rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_distance),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_evict_only_after_failed_ping),
      cmocka_unit_test(test_ping_answered_keeps_old),
      cmocka_unit_test(test_failures_and_replacement),
      cmocka_unit_test(test_one_entry_per_address),
      cmocka_unit_test(test_closest_and_recent),
      cmocka_unit_test(test_random_in_bucket),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
