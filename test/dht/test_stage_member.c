/* Stage-directory member records (dht/stage_dir.h): encode/decode with the
 * relays of a private member, the size of the largest record, and hostile
 * values a publisher may put in one. */
#include "testutil.h"

#include "dht.pb-c.h"
#include "dht/record.h"
#include "dht/stage_dir.h"
#include "util/err.h"

static gw_addr addr(const char *s) {
  gw_addr a;
  assert_int_equal(gw_addr_parse(s, &a), 0);
  return a;
}

static gw_id id_of(uint8_t n) {
  gw_id id;
  memset(id.b, n, sizeof(id.b));
  return id;
}

static void test_roundtrip_relays(void **state) {
  (void)state;
  stage_member m = {.addr = addr("203.0.113.7:7447"), .capacity = 3, .load = 1, .no_direct = true};
  m.relays[0] = (stage_relay){id_of(0x11), addr("198.51.100.1:7447")};
  m.relays[1] = (stage_relay){id_of(0x22), addr("[2001:db8::5]:9000")};
  m.n_relays = 2;
  uint8_t buf[DHT_MAX_VALUE_BYTES];
  size_t len = 0;
  assert_int_equal(stage_member_encode(&m, buf, sizeof(buf), &len), 0);
  stage_member d;
  void *owned = NULL;
  assert_int_equal(stage_member_decode(buf, len, &d, &owned), 0);
  assert_true(gw_addr_eq(&d.addr, &m.addr));
  assert_true(d.no_direct);
  assert_int_equal(d.n_relays, 2);
  assert_int_equal(d.capacity, 3);
  assert_int_equal(d.load, 1);
  for (size_t i = 0; i < 2; i++) {
    assert_true(gw_id_eq(&d.relays[i].id, &m.relays[i].id));
    assert_true(gw_addr_eq(&d.relays[i].addr, &m.relays[i].addr));
  }
  stage_member_free_owned(owned);

  /* A public member: no relays, no flag (and an old reader's record decodes the same). */
  stage_member p = {.addr = addr("198.51.100.9:7447"), .capacity = 2};
  assert_int_equal(stage_member_encode(&p, buf, sizeof(buf), &len), 0);
  assert_int_equal(stage_member_decode(buf, len, &d, &owned), 0);
  assert_false(d.no_direct);
  assert_int_equal(d.n_relays, 0);
  stage_member_free_owned(owned);
}

/* The largest record we would publish (every relay, IPv6 everywhere, full
 * extra, the largest numbers) is a valid DHT value, so a STORE of it fits
 * the 1200-byte datagram. */
static void test_largest_fits(void **state) {
  (void)state;
  uint8_t extra[STAGE_DIR_EXTRA_MAX];
  memset(extra, 0xff, sizeof(extra));
  stage_member m = {.addr = addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"),
                    .capacity = UINT32_MAX, .load = UINT32_MAX, .no_direct = true,
                    .extra = extra, .extra_len = sizeof(extra)};
  for (size_t i = 0; i < STAGE_DIR_MAX_RELAYS; i++)
    m.relays[i] = (stage_relay){id_of((uint8_t)(0xf0 + i)), addr("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535")};
  m.n_relays = STAGE_DIR_MAX_RELAYS;
  uint8_t buf[DHT_MAX_VALUE_BYTES];
  size_t len = 0;
  assert_int_equal(stage_member_encode(&m, buf, sizeof(buf), &len), 0);
  assert_true(len <= DHT_MAX_VALUE_BYTES);
  print_message("largest member record: %zu bytes (limit %d)\n", len, DHT_MAX_VALUE_BYTES);
  uint8_t seed[32] = {7};
  p2p_identity me;
  p2p_identity_from_seed(seed, &me);
  gw_id key;
  gw_id_hash_str("run/x/stage/1", &key);
  dht_rec *r = NULL;
  assert_int_equal(dht_rec_make(&me, &key, buf, len, 1, 3600000, 0, &r), 0);
  dht_rec_free(r);
  /* More relays than a record carries, or a relay without an address, are refused. */
  stage_member over = m;
  over.n_relays = STAGE_DIR_MAX_RELAYS + 1;
  assert_int_equal(stage_member_encode(&over, buf, sizeof(buf), &len), GW_ERANGE);
  stage_member noaddr = m;
  noaddr.relays[1].addr = (gw_addr){0};
  assert_int_equal(stage_member_encode(&noaddr, buf, sizeof(buf), &len), GW_EINVAL);
}

/* A hostile publisher: too many relays, bad ID or IP lengths, port 0 or
 * beyond 65535, a zero ID. Bad entries are skipped, the count is capped,
 * the rest of the record still reads. */
static void test_hostile(void **state) {
  (void)state;
  uint8_t ip4[4] = {198, 51, 100, 1}, ip5[5] = {1, 2, 3, 4, 5}, idb[32], id31[31], zero[32] = {0};
  memset(idb, 0x33, sizeof(idb));
  memset(id31, 0x44, sizeof(id31));
  Gwtf__DhtRelay r[12], *rp[12];
  for (size_t i = 0; i < 12; i++) {
    gwtf__dht_relay__init(&r[i]);
    r[i].id = (ProtobufCBinaryData){32, idb};
    r[i].ip = (ProtobufCBinaryData){4, ip4};
    r[i].port = 7000 + (uint32_t)i;
    rp[i] = &r[i];
  }
  r[0].id = (ProtobufCBinaryData){31, id31};  /* short ID */
  r[1].ip = (ProtobufCBinaryData){5, ip5};    /* odd IP length */
  r[2].port = 0;
  r[3].port = 70000;
  r[4].id = (ProtobufCBinaryData){32, zero};  /* nobody */
  r[5].ip = (ProtobufCBinaryData){0, NULL};
  Gwtf__DhtStageMember w = GWTF__DHT_STAGE_MEMBER__INIT;
  w.ip = (ProtobufCBinaryData){4, ip4};
  w.port = 7447;
  w.capacity = 2;
  w.no_direct = true;
  w.n_relays = 12;
  w.relays = rp;
  uint8_t buf[2048];
  size_t len = gwtf__dht_stage_member__pack(&w, buf);
  stage_member d;
  void *owned = NULL;
  assert_int_equal(stage_member_decode(buf, len, &d, &owned), 0);
  assert_int_equal(d.n_relays, STAGE_DIR_MAX_RELAYS);
  for (size_t i = 0; i < d.n_relays; i++) {
    assert_int_equal(d.relays[i].addr.port, 7006 + i); /* entries 0..5 skipped */
    assert_int_equal(d.relays[i].addr.family, 4);
  }
  stage_member_free_owned(owned);

  /* Not a record at all, a record without a usable address, an oversize extra. */
  uint8_t junk[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f};
  assert_int_equal(stage_member_decode(junk, sizeof(junk), &d, &owned), GW_EPROTO);
  assert_null(owned);
  w.port = 0;
  len = gwtf__dht_stage_member__pack(&w, buf);
  assert_int_equal(stage_member_decode(buf, len, &d, &owned), GW_EPROTO);
  w.port = 7447;
  uint8_t big[STAGE_DIR_EXTRA_MAX + 1] = {0};
  w.extra = (ProtobufCBinaryData){sizeof(big), big};
  len = gwtf__dht_stage_member__pack(&w, buf);
  assert_int_equal(stage_member_decode(buf, len, &d, &owned), GW_EPROTO);
  /* Every truncation of a good record either fails or decodes within bounds. */
  w.extra = (ProtobufCBinaryData){0, NULL};
  len = gwtf__dht_stage_member__pack(&w, buf);
  for (size_t cut = 0; cut < len; cut++) {
    if (stage_member_decode(buf, cut, &d, &owned) == 0) {
      assert_true(d.n_relays <= STAGE_DIR_MAX_RELAYS);
      stage_member_free_owned(owned);
    }
  }
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_relays),
      cmocka_unit_test(test_largest_fits),
      cmocka_unit_test(test_hostile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
