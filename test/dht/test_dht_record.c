/* Unit tests for signed records, the record store, cookies and rate limits,
 * and the wire codec's checks. */
#include "testutil.h"

#include "dht.pb-c.h"
#include "dht/guard.h"
#include "dht/record.h"
#include "dht/store.h"
#include "dht/wire.h"
#include "util/err.h"

#define HOUR (3600u * 1000u)

static p2p_identity ident(uint8_t n) {
  uint8_t seed[32];
  memset(seed, n, sizeof(seed));
  p2p_identity id;
  p2p_identity_from_seed(seed, &id);
  return id;
}

static gw_id key_of(const char *s) {
  gw_id k;
  gw_id_hash_str(s, &k);
  return k;
}

static dht_rec *make(const p2p_identity *me, const char *key, const char *value, uint64_t seq) {
  dht_rec *r;
  gw_id k = key_of(key);
  assert_int_equal(dht_rec_make(me, &k, (const uint8_t *)value, strlen(value), seq, HOUR, 0, &r), 0);
  return r;
}

/* What a receiver does: open the record from its wire form. */
static int reopen(const dht_rec *r, uint64_t remaining, uint64_t now, dht_rec **out) {
  return dht_rec_open(r->body, r->body_len, r->sig, P2P_SIG_BYTES, remaining, 24 * HOUR, now, out);
}

static void test_record_roundtrip(void **state) {
  (void)state;
  p2p_identity a = ident(1);
  dht_rec *r = make(&a, "run/x", "hello", 7), *o;
  assert_int_equal(reopen(r, 1000, 50, &o), 0);
  assert_true(gw_id_eq(&o->publisher, &a.id));
  assert_true(gw_id_eq(&o->key, &r->key));
  assert_int_equal(o->seq, 7);
  assert_int_equal(o->value_len, 5);
  assert_memory_equal(o->value, "hello", 5);
  /* Expiry comes from the remaining time, never beyond the signed lifetime. */
  assert_int_equal(o->expires_ms, 1050);
  dht_rec_free(o);
  assert_int_equal(reopen(r, 10 * HOUR, 0, &o), 0);
  assert_int_equal(o->expires_ms, HOUR);
  /* The stored bytes are the signed bytes. */
  assert_int_equal(o->body_len, r->body_len);
  assert_memory_equal(o->body, r->body, r->body_len);
  dht_rec *copy = dht_rec_dup(o);
  assert_memory_equal(copy->value, "hello", 5);
  assert_memory_equal(copy->body, r->body, r->body_len);
  dht_rec_free(copy);
  dht_rec_free(o);
  dht_rec_free(r);
}

static void test_record_forged(void **state) {
  (void)state;
  p2p_identity a = ident(1), b = ident(2);
  dht_rec *r = make(&a, "run/x", "hello", 7), *o;
  /* Any flipped bit in the body breaks the signature. */
  for (size_t i = 0; i < r->body_len; i += 7) {
    dht_rec *t = dht_rec_dup(r);
    t->body[i] ^= 0x10;
    int rc = reopen(t, 1000, 0, &o);
    assert_true(rc == GW_EAUTH || rc == GW_EPROTO || rc == GW_ERANGE);
    dht_rec_free(t);
  }
  /* b's signature over a body naming a's key. */
  dht_rec *t = dht_rec_dup(r);
  uint8_t msg[512];
  memcpy(msg, DHT_RECORD_DOMAIN, strlen(DHT_RECORD_DOMAIN));
  memcpy(msg + strlen(DHT_RECORD_DOMAIN), t->body, t->body_len);
  p2p_sign(&b, msg, strlen(DHT_RECORD_DOMAIN) + t->body_len, t->sig);
  assert_int_equal(reopen(t, 1000, 0, &o), GW_EAUTH);
  /* Signed without the domain prefix (e.g. taken from a datagram signature). */
  p2p_sign(&a, t->body, t->body_len, t->sig);
  assert_int_equal(reopen(t, 1000, 0, &o), GW_EAUTH);
  dht_rec_free(t);
  /* Truncated signature, garbage body. */
  assert_int_equal(dht_rec_open(r->body, r->body_len, r->sig, 10, 1000, HOUR, 0, &o), GW_EPROTO);
  uint8_t junk[40];
  memset(junk, 0xff, sizeof(junk));
  assert_int_equal(dht_rec_open(junk, sizeof(junk), r->sig, P2P_SIG_BYTES, 1000, HOUR, 0, &o), GW_EPROTO);
  dht_rec_free(r);
}

static void test_record_expired_and_oversize(void **state) {
  (void)state;
  p2p_identity a = ident(1);
  dht_rec *r = make(&a, "run/x", "hello", 7), *o;
  assert_int_equal(reopen(r, 0, 0, &o), GW_ETIMEDOUT);
  /* A lifetime above what this node stores for others. */
  assert_int_equal(dht_rec_open(r->body, r->body_len, r->sig, P2P_SIG_BYTES, 10, HOUR - 1, 0, &o), GW_ERANGE);
  dht_rec_free(r);
  uint8_t big[DHT_MAX_VALUE_BYTES + 1];
  memset(big, 'v', sizeof(big));
  gw_id k = key_of("k");
  assert_int_equal(dht_rec_make(&a, &k, big, sizeof(big), 1, HOUR, 0, &r), GW_ERANGE);
  assert_int_equal(dht_rec_make(&a, &k, big, DHT_MAX_VALUE_BYTES, 1, HOUR, 0, &r), 0);
  dht_rec_free(r);
  /* An oversize value signed by a peer that ignores the cap is refused on receipt. */
  Gwtf__DhtRecordBody b = GWTF__DHT_RECORD_BODY__INIT;
  b.key = (ProtobufCBinaryData){32, k.b};
  b.publisher_pk = (ProtobufCBinaryData){32, a.pk};
  b.seq = 1;
  b.lifetime_ms = HOUR;
  b.value = (ProtobufCBinaryData){DHT_MAX_VALUE_BYTES + 1, big};
  uint8_t body[2048], msg[2100], sig[P2P_SIG_BYTES];
  size_t n = gwtf__dht_record_body__pack(&b, body);
  memcpy(msg, DHT_RECORD_DOMAIN, strlen(DHT_RECORD_DOMAIN));
  memcpy(msg + strlen(DHT_RECORD_DOMAIN), body, n);
  p2p_sign(&a, msg, strlen(DHT_RECORD_DOMAIN) + n, sig);
  assert_int_equal(dht_rec_open(body, n, sig, P2P_SIG_BYTES, 10, HOUR, 0, &o), GW_ERANGE);
}

static void test_store_replacement(void **state) {
  (void)state;
  p2p_identity a = ident(1), b = ident(2);
  dht_store_limits lim = {16, 16, 1 << 20};
  dht_store *s;
  assert_int_equal(dht_store_new(&lim, &s), 0);
  dht_rec *a5 = make(&a, "k", "a5", 5), *a4 = make(&a, "k", "a4", 4), *a6 = make(&a, "k", "a6", 6);
  dht_rec *a5again = make(&a, "k", "a5", 5), *b1 = make(&b, "k", "b1", 1);
  assert_int_equal(dht_store_put(s, a5, 0), 0);
  /* Lower or equal sequence from the same publisher: refused (old copy, replay). */
  assert_int_equal(dht_store_put(s, a4, 0), GW_EEXIST);
  assert_int_equal(dht_store_put(s, a5again, 0), GW_EEXIST);
  dht_rec_free(a4);
  dht_rec_free(a5again);
  /* Another publisher under the same key: a second subkey. */
  assert_int_equal(dht_store_put(s, b1, 0), 0);
  assert_int_equal(dht_store_records(s), 2);
  /* Higher sequence: replaces. */
  assert_int_equal(dht_store_put(s, a6, 0), 0);
  assert_int_equal(dht_store_records(s), 2);
  const dht_rec *out[4];
  bool more;
  gw_id k = key_of("k");
  size_t n = dht_store_get(s, &k, NULL, 0, out, 4, &more);
  assert_int_equal(n, 2);
  assert_false(more);
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&out[i]->publisher, &a.id)) assert_memory_equal(out[i]->value, "a6", 2);
  assert_true(gw_id_cmp(&out[0]->publisher, &out[1]->publisher) < 0);
  /* Paging: one at a time, the cursor is the last publisher returned. */
  assert_int_equal(dht_store_get(s, &k, NULL, 0, out, 1, &more), 1);
  assert_true(more);
  gw_id cursor = out[0]->publisher;
  assert_int_equal(dht_store_get(s, &k, &cursor, 0, out, 1, &more), 1);
  assert_false(more);
  assert_false(gw_id_eq(&out[0]->publisher, &cursor));
  dht_store_free(s);
}

static void test_store_expiry_and_caps(void **state) {
  (void)state;
  p2p_identity ids[4];
  for (int i = 0; i < 4; i++) ids[i] = ident((uint8_t)(10 + i));
  dht_store_limits lim = {2, 2, 1 << 20};
  dht_store *s;
  assert_int_equal(dht_store_new(&lim, &s), 0);
  dht_rec *r0 = make(&ids[0], "k1", "v", 1), *r1 = make(&ids[1], "k1", "v", 1);
  dht_rec *r2 = make(&ids[2], "k1", "v", 1), *r3 = make(&ids[0], "k2", "v", 1);
  dht_rec *r4 = make(&ids[0], "k3", "v", 1);
  r1->expires_ms = 500;
  assert_int_equal(dht_store_put(s, r0, 0), 0);
  assert_int_equal(dht_store_put(s, r1, 0), 0);
  assert_int_equal(dht_store_next_expiry(s), 500);
  /* Subkeys per key. */
  assert_int_equal(dht_store_put(s, r2, 0), GW_EFULL);
  /* Keys. */
  assert_int_equal(dht_store_put(s, r3, 0), 0);
  assert_int_equal(dht_store_put(s, r4, 0), GW_EFULL);
  /* Expired records are not handed out, then dropped, freeing a subkey slot. */
  const dht_rec *out[4];
  gw_id k1 = key_of("k1");
  assert_int_equal(dht_store_get(s, &k1, NULL, 500, out, 4, NULL), 1);
  assert_int_equal(dht_store_expire(s, 500), HOUR);
  assert_int_equal(dht_store_records(s), 2);
  assert_int_equal(dht_store_put(s, r2, 600), 0);
  dht_rec_free(r4);
  dht_store_free(s);
  /* Total bytes. */
  lim = (dht_store_limits){16, 16, 600};
  assert_int_equal(dht_store_new(&lim, &s), 0);
  dht_rec *x = make(&ids[0], "a", "0123456789", 1), *y = make(&ids[1], "a", "0123456789", 1);
  assert_true(dht_rec_footprint(x) < 600 && 2 * dht_rec_footprint(x) > 600);
  assert_int_equal(dht_store_put(s, x, 0), 0);
  assert_int_equal(dht_store_put(s, y, 0), GW_EFULL);
  assert_true(dht_store_bytes(s) <= 600);
  dht_rec_free(y);
  dht_store_free(s);
}

static gw_peer peer_n(int n) {
  gw_peer p;
  memset(&p, 0, sizeof(p));
  gw_id_hash(&n, sizeof(n), &p.id);
  p.addr.family = 4;
  p.addr.ip[0] = 192;
  p.addr.ip[3] = (uint8_t)n;
  p.addr.port = 9000;
  return p;
}

static void test_cookies(void **state) {
  (void)state;
  uint8_t seed[DHT_GUARD_SEED_BYTES], fresh[DHT_GUARD_KEY_BYTES];
  memset(seed, 3, sizeof(seed));
  memset(fresh, 4, sizeof(fresh));
  dht_rate_limits lim = {0, 0, 0, 0};
  dht_guard g;
  dht_guard_init(&g, &lim, seed, 0);
  gw_peer p = peer_n(1), q = peer_n(2);
  uint8_t c[DHT_COOKIE_BYTES];
  dht_cookie_make(&g, &p, c);
  assert_true(dht_cookie_check(&g, &p, c, sizeof(c)));
  assert_false(dht_cookie_check(&g, &q, c, sizeof(c)));     /* another sender */
  gw_peer moved = p;
  moved.addr.port++;
  assert_false(dht_cookie_check(&g, &moved, c, sizeof(c))); /* another address */
  assert_false(dht_cookie_check(&g, &p, c, 4));
  assert_false(dht_cookie_check(&g, &p, NULL, 0));
  /* Still good one rotation later, gone after two. */
  dht_guard_rotate(&g, fresh, DHT_COOKIE_ROTATE_MS);
  assert_true(dht_cookie_check(&g, &p, c, sizeof(c)));
  fresh[0] = 5;
  dht_guard_rotate(&g, fresh, 2 * DHT_COOKIE_ROTATE_MS);
  assert_false(dht_cookie_check(&g, &p, c, sizeof(c)));
}

static void test_rate_limits(void **state) {
  (void)state;
  uint8_t seed[DHT_GUARD_SEED_BYTES];
  memset(seed, 3, sizeof(seed));
  dht_rate_limits lim = {.global_rate = 100, .global_burst = 30, .ip_rate = 10, .ip_burst = 5};
  dht_guard g;
  dht_guard_init(&g, &lim, seed, 0);
  gw_peer p = peer_n(1);
  int ok = 0;
  for (int i = 0; i < 20; i++) ok += dht_guard_admit(&g, &p.addr, 0);
  assert_int_equal(ok, 5); /* the per-IP burst */
  /* 10 per second refill: after 300 ms, three more. */
  ok = 0;
  for (int i = 0; i < 20; i++) ok += dht_guard_admit(&g, &p.addr, 300);
  assert_int_equal(ok, 3);
  /* Other IPs share the global bucket: 30 - 8 used = 22 left at t = 300 (+30 refilled, capped). */
  ok = 0;
  for (int n = 2; n < 40; n++) {
    gw_peer q = peer_n(n);
    ok += dht_guard_admit(&g, &q.addr, 300);
  }
  assert_true(ok <= 30 && ok >= 20);
  /* Loopback (every peer of a local swarm) skips the per-IP bucket, not
   * the global one. */
  dht_guard_init(&g, &lim, seed, 0);
  gw_addr lo4 = {.family = 4, .ip = {127, 0, 0, 1}, .port = 9000}, lo6 = {.family = 6, .ip = {[15] = 1}, .port = 9000};
  ok = 0;
  for (int i = 0; i < 40; i++) ok += dht_guard_admit(&g, i % 2 ? &lo6 : &lo4, 0);
  assert_int_equal(ok, 30); /* the global burst, not 5 per address */
  /* Rate 0: unlimited. */
  dht_rate_limits off = {0, 0, 0, 0};
  dht_guard_init(&g, &off, seed, 0);
  for (int i = 0; i < 1000; i++) assert_true(dht_guard_admit(&g, &p.addr, 0));
}

static size_t pack(dht_msg *m, uint8_t *buf) { return gwtf__dht_message__pack(m, buf); }

static void test_wire_checks(void **state) {
  (void)state;
  uint8_t buf[2048];
  dht_msg *out;
  gw_id t = key_of("t");
  uint8_t cookie[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = GWTF__DHT_KIND__DHT_FIND_NODE;
  m.txid = 42;
  m.target = (ProtobufCBinaryData){32, t.b};
  m.cookie = (ProtobufCBinaryData){8, cookie};
  size_t n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), 0);
  assert_int_equal(out->txid, 42);
  dht_wire_free(out);
  /* Wrong sizes and kinds are refused before any handler sees them. */
  m.target.len = 31;
  n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), GW_EPROTO);
  m.target.len = 32;
  m.cookie.len = 7;
  n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), GW_EPROTO);
  m.cookie.len = 8;
  m.kind = 99;
  n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), GW_EPROTO);
  m.kind = GWTF__DHT_KIND__DHT_STORE; /* a STORE without a record */
  n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), GW_EPROTO);
  /* Too many contacts. */
  Gwtf__DhtContact c = GWTF__DHT_CONTACT__INIT, *cs[DHT_WIRE_MAX_NODES + 1];
  for (int i = 0; i <= DHT_WIRE_MAX_NODES; i++) cs[i] = &c;
  m.kind = GWTF__DHT_KIND__DHT_NODES;
  m.n_nodes = DHT_WIRE_MAX_NODES + 1;
  m.nodes = cs;
  n = pack(&m, buf);
  assert_int_equal(dht_wire_decode(buf, n, &out), GW_EPROTO);
  /* Garbage. */
  memset(buf, 0xff, 64);
  assert_int_equal(dht_wire_decode(buf, 64, &out), GW_EPROTO);
  /* A contact is checked when used. */
  gw_peer p;
  assert_int_equal(dht_wire_peer(&c, true, &p), GW_EPROTO);
  uint8_t ip[4] = {10, 0, 0, 1};
  c.id = (ProtobufCBinaryData){32, t.b};
  c.ip = (ProtobufCBinaryData){4, ip};
  c.port = 70000;
  assert_int_equal(dht_wire_peer(&c, true, &p), GW_EPROTO);
  c.port = 7000;
  assert_int_equal(dht_wire_peer(&c, true, &p), 0);
  assert_int_equal(p.addr.port, 7000);
  c.ip.len = 5;
  assert_int_equal(dht_wire_peer(&c, true, &p), GW_EPROTO);
}

static void test_wire_fit_and_pad(void **state) {
  (void)state;
  uint8_t buf[2048];
  gw_peer peers[20];
  Gwtf__DhtContact cs[20], *ptrs[20];
  for (int i = 0; i < 20; i++) {
    peers[i] = peer_n(i + 1);
    dht_wire_contact(&cs[i], &peers[i], true);
    ptrs[i] = &cs[i];
  }
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = GWTF__DHT_KIND__DHT_NODES;
  m.txid = 1;
  m.n_nodes = 20;
  m.nodes = ptrs;
  size_t full = gwtf__dht_message__get_packed_size(&m);
  /* The estimate a requester pads for matches what an IPv4 reply costs. */
  assert_true(full <= DHT_WIRE_REPLY_BASE + 20 * DHT_WIRE_CONTACT_V4);
  size_t n = dht_wire_pack_fit(&m, buf, 300);
  assert_true(n > 0 && n <= 300);
  assert_true(m.n_nodes > 0 && m.n_nodes < 20);
  /* Padding reaches the target from below, whatever the gap. */
  for (size_t target = 20; target < 1100; target += 13) {
    dht_msg r = GWTF__DHT_MESSAGE__INIT;
    r.kind = GWTF__DHT_KIND__DHT_PING;
    r.txid = 77;
    dht_wire_pad(&r, target);
    size_t got = gwtf__dht_message__get_packed_size(&r);
    assert_true(got >= target);
    assert_true(got <= target + 3);
  }
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_record_roundtrip),
      cmocka_unit_test(test_record_forged),
      cmocka_unit_test(test_record_expired_and_oversize),
      cmocka_unit_test(test_store_replacement),
      cmocka_unit_test(test_store_expiry_and_caps),
      cmocka_unit_test(test_cookies),
      cmocka_unit_test(test_rate_limits),
      cmocka_unit_test(test_wire_checks),
      cmocka_unit_test(test_wire_fit_and_pad),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
