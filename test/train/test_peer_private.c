/* Private runs and verified downloads (issue 17, items 1 and 4), in process
 * on the deterministic harness:
 *   - a stranger (no certificate) is refused at every entry point: JOIN to
 *     the leader, a FORWARD straight to a relay, a GRAD to a stage's
 *     aggregator, a WEIGHTS_REQ, a HELLO; nothing it sends reaches the
 *     model (every weight hash equals the same run without it);
 *   - an invited peer redeems its token, is placed and trains; revoked, it
 *     is dropped and does no more work from the next iteration on;
 *   - an expired token and a used-up one are refused; an expired
 *     certificate is refused;
 *   - a member that serves wrong weights is found out by the stage's
 *     hashes, and the joiner downloads again from another member;
 *   - the token, certificate and revocation codecs round-trip and refuse
 *     tampering. */
#include "testutil.h"

#include <math.h>

#include "peer_harness.h"
#include "train.pb-c.h"
#include "train/member.h"
#include "util/err.h"

#define M 4
#define STAGES 2
#define PER_STAGE 2

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }
static const train_counters *C(h_harness *h, int i) { return train_peer_counters(h->nodes[i].tp); }

static member_key run_key(void) {
  uint8_t seed[32];
  memset(seed, 7, sizeof(seed));
  member_key k;
  member_key_from_seed(seed, &k);
  return k;
}

static train_membership base_membership(const member_key *k) {
  train_membership m;
  memset(&m, 0, sizeof(m));
  snprintf(m.run, sizeof(m.run), "priv");
  memcpy(m.run_key, k->pk, 32);
  m.cert_ttl_s = 3600;
  return m;
}

/* A certificate for node i, signed by the run key (what an earlier
 * redemption would have given it). */
static void give_cert(h_harness *h, int i, const member_key *k, uint64_t expires) {
  member_cert c = {0};
  snprintf(c.run, sizeof(c.run), "priv");
  memcpy(c.run_key, k->pk, 32);
  c.peer = h->nodes[i].peer.id;
  c.issued = 0;
  c.expires = expires;
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(member_cert_make(&c, k, &buf, &len), 0);
  train_membership m = base_membership(k);
  m.cert = buf;
  m.cert_len = len;
  assert_int_equal(train_peer_set_membership(h->nodes[i].tp, &m), 0);
  free(buf);
}

static void give_token(h_harness *h, int i, const member_key *k, int creator, uint64_t expires, uint32_t uses,
                       uint8_t invite_byte) {
  member_invite inv = {0};
  snprintf(inv.run, sizeof(inv.run), "priv");
  memcpy(inv.run_key, k->pk, 32);
  inv.creator = h->nodes[creator].peer.id;
  snprintf(inv.creator_addr, sizeof(inv.creator_addr), "10.0.0.1:7000");
  memset(inv.id, invite_byte, sizeof(inv.id));
  inv.expires = expires;
  inv.uses = uses;
  char text[MEMBER_TOKEN_TEXT_MAX];
  assert_int_equal(member_token_make(&inv, k, text, sizeof(text)), 0);
  uint8_t *bin = NULL;
  size_t len = 0;
  assert_int_equal(member_token_to_bin(text, &bin, &len), 0);
  train_membership m = base_membership(k);
  m.token = bin;
  m.token_len = len;
  assert_int_equal(train_peer_set_membership(h->nodes[i].tp, &m), 0);
  free(bin);
}

/* The creator (data node, holds the run key) and PER_STAGE certified
 * relays per stage, all from the seeded init. Returns the data node. */
static int build(h_harness *h, uint64_t seed, uint64_t iters, bool private_run) {
  member_key k = run_key();
  h_init(h, STAGES, seed, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, iters, true);
  if (private_run) {
    train_membership m = base_membership(&k);
    m.have_sk = true;
    memcpy(m.sk, k.sk, 64);
    assert_int_equal(train_peer_set_membership(h->nodes[d].tp, &m), 0);
  }
  for (int s = 1; s <= STAGES; s++)
    for (int j = 0; j < PER_STAGE; j++) {
      int r = h_add(h, TRAIN_RELAY, s, M, 0, true);
      if (private_run) give_cert(h, r, &k, 1000000);
    }
  return d;
}

static void start_all(h_harness *h, int upto) {
  for (int i = 0; i < upto; i++) h_start(h, i);
}

static void assert_agree(h_harness *h, uint64_t iters) {
  char why[200] = "";
  if (!h_hashes_agree(h, iters, why, sizeof(why))) fail_msg("%s", why);
}

static void inject(h_harness *h, int from, int to, uint32_t type, const ProtobufCMessage *m, const train_tensor *t) {
  uint8_t body[256];
  size_t len = protobuf_c_message_pack(m, body);
  assert_int_equal(h_inject(h, from, to, type, body, len, t), 0);
}

/* The stranger's attempts, at one moment of the run. */
static void attack(h_harness *h, int stranger, int d, int r1, int r2) {
  Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
  j.capacity = 4;
  inject(h, stranger, d, GWTF__TRAIN_MSG__TRAIN_JOIN, &j.base, NULL);
  /* a FORWARD straight to a relay, with a plausible activation */
  Gwtf__TrainMicrobatch mb = GWTF__TRAIN_MICROBATCH__INIT;
  mb.id = 77;
  mb.origin = (ProtobufCBinaryData){GW_ID_BYTES, h->nodes[stranger].peer.id.b};
  mb.iteration = train_peer_iteration(h->nodes[r1].tp);
  ProtobufCBinaryData path[1] = {{GW_ID_BYTES, h->nodes[stranger].peer.id.b}};
  mb.n_path = 1;
  mb.path = path;
  float act[H_B * H_T * H_C];
  for (int i = 0; i < H_B * H_T * H_C; i++) act[i] = 100.0f;
  train_tensor t = {.dtype = TRAIN_F32, .ndim = 3, .shape = {H_B, H_T, H_C}, .data = act, .nbytes = sizeof(act)};
  inject(h, stranger, r1, GWTF__TRAIN_MSG__TRAIN_FORWARD, &mb.base, &t);
  /* a huge gradient to a stage-2 member (the aggregator or not: both refuse) */
  Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
  g.iteration = train_peer_iteration(h->nodes[r2].tp);
  g.stage = 2;
  g.count = 1;
  g.total = H_NP;
  float v[H_NP] = {1000.0f, 1000.0f};
  train_tensor gt = {.dtype = TRAIN_F32, .ndim = 1, .shape = {H_NP}, .data = v, .nbytes = sizeof(v)};
  inject(h, stranger, r2, GWTF__TRAIN_MSG__TRAIN_GRAD, &g.base, &gt);
  Gwtf__TrainWeightsReq w = GWTF__TRAIN_WEIGHTS_REQ__INIT;
  w.stage = 1;
  inject(h, stranger, r1, GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ, &w.base, NULL);
  Gwtf__TrainHello he = GWTF__TRAIN_HELLO__INIT;
  he.stage = 2;
  he.iteration = train_peer_iteration(h->nodes[r2].tp) + 1;
  inject(h, stranger, r2, GWTF__TRAIN_MSG__TRAIN_HELLO, &he.base, NULL);
}

/* Every message takes 2 ms: the stranger's messages (and our answers to
 * it) then change no other message's timing, so the run with it and the
 * run without it can be compared bit for bit. */
static uint64_t fixed_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)ud, (void)from, (void)to, (void)len, (void)rng;
  return 2;
}

static void test_stranger_is_refused_everywhere(void **state) {
  (void)state;
  const uint64_t iters = 6;
  /* two harnesses (1 MB each) in one frame: past valgrind's 2 MB stack frame */
  static h_harness ref, h;
  int d = build(&ref, 31, iters, true);
  sim_set_delay_fn(ref.s, fixed_delay, NULL);
  start_all(&ref, ref.n_nodes);
  assert_true(h_run_until_finished(&ref, 120000));

  d = build(&h, 31, iters, true);
  sim_set_delay_fn(h.s, fixed_delay, NULL);
  int stranger = h_add(&h, TRAIN_RELAY, -1, M, 0, false); /* never started: in no view */
  start_all(&h, stranger);
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 1);
  int r1 = 1, r2 = 1 + PER_STAGE; /* a stage-1 and a stage-2 relay */
  attack(&h, stranger, d, r1, r2);
  int s2[4];
  h_by_id(&h, 2, s2, 4);
  attack(&h, stranger, d, r1, s2[0]); /* the stage-2 aggregator too */
  h_run_for(&h, 50);
  /* every entry point said no, before any handler */
  assert_true(C(&h, d)->admissions_refused >= 2);  /* JOIN x2 */
  assert_true(C(&h, r1)->admissions_refused >= 4); /* FORWARD, WEIGHTS_REQ x2 */
  assert_true(C(&h, r2)->admissions_refused >= 2); /* GRAD, HELLO */
  assert_true(C(&h, s2[0])->admissions_refused >= 2);
  assert_int_equal(train_peer_stage(h.nodes[stranger].tp), -1); /* never placed */
  /* forged certificates and tokens: one signature check, then dropped
   * unchecked for a second */
  uint64_t checked = C(&h, d)->signatures_checked;
  Gwtf__TrainCert fc = GWTF__TRAIN_CERT__INIT;
  uint8_t junk[152];
  memset(junk, 0x5a, sizeof(junk));
  fc.cert = (ProtobufCBinaryData){sizeof(junk), junk};
  Gwtf__TrainRedeem fr = GWTF__TRAIN_REDEEM__INIT;
  fr.token = (ProtobufCBinaryData){sizeof(junk), junk};
  for (int i = 0; i < 50; i++) {
    inject(&h, stranger, d, GWTF__TRAIN_MSG__TRAIN_CERT, &fc.base, NULL);
    inject(&h, stranger, d, GWTF__TRAIN_MSG__TRAIN_REDEEM, &fr.base, NULL);
  }
  h_run_for(&h, 50);
  assert_true(C(&h, d)->signatures_checked - checked <= 2);
  assert_false(train_peer_member(h.nodes[d].tp, &h.nodes[stranger].peer.id));
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), iters);
  /* nothing it sent reached the model: the same weights, iteration by iteration */
  for (int i = 0; i < ref.n_nodes; i++)
    for (uint64_t it = 0; it < iters; it++) {
      assert_true(ref.nodes[i].have_hash[it] && h.nodes[i].have_hash[it]);
      assert_memory_equal(ref.nodes[i].hash_of[it], h.nodes[i].hash_of[it], 32);
    }
  assert_int_equal(C(&h, r2)->contributions_rejected, 0); /* refused, not even validated */
  /* members never refused each other */
  for (int i = 0; i < stranger; i++) assert_true(C(&h, i)->admissions_refused <= 6);
  h_free(&ref);
  h_free(&h);
}

/* An invited relay joins and trains; revoked, it is dropped. */
static void test_invited_joins_then_revoked(void **state) {
  (void)state;
  const uint64_t iters = 16;
  member_key k = run_key();
  h_harness h;
  int d = build(&h, 32, iters, true);
  int joiner = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  give_token(&h, joiner, &k, d, 0, 1, 0x11);
  start_all(&h, joiner);
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 1);
  assert_false(train_peer_certified(h.nodes[joiner].tp));
  h_start(&h, joiner);
  while (train_peer_iteration(h.nodes[d].tp) < 7) h_run_for(&h, 1);
  assert_true(train_peer_certified(h.nodes[joiner].tp));
  assert_true(train_peer_stage(h.nodes[joiner].tp) >= 1);
  assert_true(h.nodes[joiner].ready);
  assert_int_equal(C(&h, d)->certs_issued, 1);
  uint64_t bwd = C(&h, joiner)->backward_computed;
  assert_true(bwd > 0); /* it trains */

  /* the creator revokes it: signed list, set on the creator, flooded */
  member_revocations r = {0};
  snprintf(r.run, sizeof(r.run), "priv");
  r.seq = 1;
  r.peers = &h.nodes[joiner].peer.id;
  r.n = 1;
  uint8_t *list = NULL;
  size_t len = 0;
  assert_int_equal(member_revocations_make(&r, k.pk, &k, &list, &len), 0);
  h.nodes[joiner].unrouted = true; /* the driver's flows leave it out as its view does */
  assert_int_equal(train_peer_set_revocations(h.nodes[d].tp, list, len, sim_now(h.s)), 0);
  free(list);
  uint64_t at = train_peer_iteration(h.nodes[d].tp);
  while (train_peer_iteration(h.nodes[d].tp) < at + 2) h_run_for(&h, 1);
  uint64_t bwd_after = C(&h, joiner)->backward_computed;
  assert_true(h_run_until_finished(&h, 240000));
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), iters);
  /* no work for it from the next iteration on */
  assert_int_equal(C(&h, joiner)->backward_computed, bwd_after);
  /* its stage-mates refuse it now: its HELLOs (and anything else) */
  int st = train_peer_stage(h.nodes[joiner].tp);
  uint64_t refused = 0;
  for (int i = 0; i < joiner; i++)
    if (h.nodes[i].stage == st) refused += C(&h, i)->admissions_refused;
  assert_true(refused > 0);
  /* the others agree among themselves to the end */
  h.nodes[joiner].stage = -1; /* its hashes stop: leave it out of the check */
  assert_agree(&h, iters);
  h_free(&h);
}

static void test_expired_and_used_up_tokens_are_refused(void **state) {
  (void)state;
  member_key k = run_key();
  h_harness h;
  int d = build(&h, 33, 0, true);
  int late = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  give_token(&h, late, &k, d, 1 /* unix second 1: long past at 2 s */, 0, 0x22);
  int first = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  give_token(&h, first, &k, d, 0, 1, 0x33);
  int second = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  give_token(&h, second, &k, d, 0, 1, 0x33); /* the same one-use invite */
  start_all(&h, late);
  h_run_for(&h, 2000);
  h_start(&h, late);
  h_start(&h, first);
  h_run_for(&h, 3000);
  h_start(&h, second);
  h_run_for(&h, 8000);
  assert_false(train_peer_certified(h.nodes[late].tp));
  assert_int_equal(train_peer_stage(h.nodes[late].tp), -1);
  assert_true(train_peer_certified(h.nodes[first].tp));
  assert_false(train_peer_certified(h.nodes[second].tp));
  assert_int_equal(train_peer_stage(h.nodes[second].tp), -1);
  assert_int_equal(C(&h, d)->certs_issued, 1);
  h_free(&h);
}

/* A member renews its certificate past half its lifetime; one whose
 * certificate expired is refused (and cannot renew it). */
static void test_certificates_renew_and_expire(void **state) {
  (void)state;
  member_key k = run_key();
  h_harness h;
  int d = build(&h, 34, 0, true);
  int renew = h_add(&h, TRAIN_RELAY, 1, M, 0, true);
  give_cert(&h, renew, &k, 6); /* unix second 6: renewed from second 3 on */
  int old = h_add(&h, TRAIN_RELAY, 1, M, 0, true);
  give_cert(&h, old, &k, 1); /* expired before it starts */
  start_all(&h, old);
  h_run_for(&h, 2000);
  h_start(&h, old);
  h_run_for(&h, 8000);
  assert_true(train_peer_certified(h.nodes[renew].tp)); /* at 10 s, with a renewed certificate */
  assert_int_equal(C(&h, d)->certs_issued, 1);
  assert_false(train_peer_certified(h.nodes[old].tp));
  uint64_t refused = 0;
  for (int i = 0; i < old; i++) refused += C(&h, i)->admissions_refused;
  assert_true(refused > 0); /* only `old`: members never refuse each other */
  assert_true(C(&h, old)->backward_computed == 0);
  h_free(&h);
}

/* Open run: a stage-1 member serves wrong weights; the joiner finds out by
 * the stage's hashes and downloads again from another member. */
static void test_wrong_weights_are_refetched(void **state) {
  (void)state;
  const uint64_t iters = 10;
  h_harness h;
  h_init(&h, STAGES, 35, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, iters, true);
  int bad = h_add(&h, TRAIN_RELAY, 1, M, 0, true); /* the first source the joiner tries */
  for (int j = 0; j < 2; j++) h_add(&h, TRAIN_RELAY, 1, M, 0, true);
  for (int j = 0; j < PER_STAGE; j++) h_add(&h, TRAIN_RELAY, 2, M, 0, true);
  h.nodes[bad].bad_snapshot = true;
  int joiner = h_add(&h, TRAIN_RELAY, 1, M, 0, false);
  start_all(&h, joiner);
  while (train_peer_iteration(h.nodes[d].tp) < 3) h_run_for(&h, 1);
  h_start(&h, joiner);
  assert_true(h_run_until_finished(&h, 240000));
  assert_int_equal(C(&h, joiner)->downloads_refuted, 1);
  assert_true(h.nodes[joiner].ready);
  assert_true(C(&h, joiner)->backward_computed > 0);
  assert_memory_equal(h.nodes[joiner].w, h.nodes[bad + 1].w, sizeof(h.nodes[joiner].w));
  assert_agree(&h, iters);
  h_free(&h);
}

/* Open run: stage 1 has two members, and the joiner cannot reach one of
 * them (no session: under churn, a dead member its directory still
 * lists). That one abstains at once, and the joiner takes the weights on
 * the word of the other as soon as it answered. Before, it waited for the
 * unreachable one until the verification's deadline (a hop timeout). */
static void test_unreachable_member_abstains(void **state) {
  (void)state;
  const uint64_t iters = 8;
  h_harness h;
  h_init(&h, STAGES, 37, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, iters, true);
  h_add(&h, TRAIN_RELAY, 1, M, 0, true);
  int far = h_add(&h, TRAIN_RELAY, 1, M, 0, true);
  for (int j = 0; j < PER_STAGE; j++) h_add(&h, TRAIN_RELAY, 2, M, 0, true);
  int joiner = h_add(&h, TRAIN_RELAY, 1, M, 0, false);
  h.nodes[joiner].sessions_until[far] = UINT64_MAX;
  start_all(&h, joiner);
  while (train_peer_iteration(h.nodes[d].tp) < 2) h_run_for(&h, 1);
  h_start(&h, joiner);
  assert_true(h_run_until_finished(&h, 240000));
  assert_true(h.nodes[joiner].ready);
  assert_int_equal(C(&h, joiner)->verify_timeouts, 0);
  assert_int_equal(C(&h, joiner)->downloads_refuted, 0);
  assert_true(C(&h, joiner)->backward_computed > 0);
  assert_agree(&h, iters);
  h_free(&h);
}

/* Open run: the leader takes one JOIN per peer per second. */
static void test_join_rate_limited(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 36, 0, false);
  int stranger = h_add(&h, TRAIN_RELAY, -1, M, 0, false);
  start_all(&h, stranger);
  h_run_for(&h, 500);
  uint64_t before = C(&h, d)->messages_refused;
  Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
  j.capacity = 4;
  for (int i = 0; i < 5; i++) inject(&h, stranger, d, GWTF__TRAIN_MSG__TRAIN_JOIN, &j.base, NULL);
  h_run_for(&h, 50);
  assert_int_equal(C(&h, d)->messages_refused - before, 4);
  h_run_for(&h, 1000); /* a second later, one more is taken */
  inject(&h, stranger, d, GWTF__TRAIN_MSG__TRAIN_JOIN, &j.base, NULL);
  h_run_for(&h, 50);
  assert_int_equal(C(&h, d)->messages_refused - before, 4);
  h_free(&h);
}

/* ---- the codecs ---- */

static void test_codecs(void **state) {
  (void)state;
  member_key k = run_key(), other;
  uint8_t seed[32];
  memset(seed, 9, sizeof(seed));
  member_key_from_seed(seed, &other);
  member_invite inv = {0}, got;
  snprintf(inv.run, sizeof(inv.run), "priv");
  memcpy(inv.run_key, k.pk, 32);
  snprintf(inv.creator_addr, sizeof(inv.creator_addr), "192.0.2.1:7447");
  inv.expires = 12345;
  inv.uses = 3;
  char text[MEMBER_TOKEN_TEXT_MAX];
  assert_int_equal(member_token_make(&inv, &other, text, sizeof(text)), GW_EINVAL); /* wrong key */
  assert_int_equal(member_token_make(&inv, &k, text, 10), GW_ERANGE);
  assert_int_equal(member_token_make(&inv, &k, text, sizeof(text)), 0);
  assert_int_equal(strncmp(text, "gwtf1:", 6), 0);
  assert_int_equal(member_token_parse(text, &got), 0);
  assert_string_equal(got.creator_addr, inv.creator_addr);
  assert_int_equal(got.expires, 12345);
  assert_int_equal(got.uses, 3);
  /* every single-character change is refused */
  size_t n = strlen(text);
  for (size_t i = 6; i < n; i++) {
    char t2[MEMBER_TOKEN_TEXT_MAX];
    memcpy(t2, text, n + 1);
    t2[i] = t2[i] == 'A' ? 'B' : 'A';
    assert_int_not_equal(member_token_parse(t2, &got), 0);
  }
  member_cert c = {0}, gc;
  snprintf(c.run, sizeof(c.run), "priv");
  memcpy(c.run_key, k.pk, 32);
  memset(c.peer.b, 5, 32);
  c.issued = 10;
  c.expires = 20;
  uint8_t *buf = NULL;
  size_t len = 0;
  assert_int_equal(member_cert_make(&c, &k, &buf, &len), 0);
  assert_int_equal(member_cert_parse(buf, len, "priv", k.pk, &gc), 0);
  assert_true(member_cert_valid(&gc, &c.peer, 19));
  assert_false(member_cert_valid(&gc, &c.peer, 20));
  assert_int_equal(member_cert_parse(buf, len, "other", k.pk, &gc), GW_EINVAL);
  assert_int_equal(member_cert_parse(buf, len, "priv", other.pk, &gc), GW_EAUTH);
  buf[len / 2] ^= 1;
  assert_int_not_equal(member_cert_parse(buf, len, "priv", k.pk, &gc), 0);
  free(buf);
  uint64_t secs;
  assert_int_equal(member_parse_duration("7d", &secs), 0);
  assert_int_equal(secs, 7 * 86400);
  assert_int_not_equal(member_parse_duration("7x", &secs), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codecs),
      cmocka_unit_test(test_stranger_is_refused_everywhere),
      cmocka_unit_test(test_invited_joins_then_revoked),
      cmocka_unit_test(test_expired_and_used_up_tokens_are_refused),
      cmocka_unit_test(test_certificates_renew_and_expire),
      cmocka_unit_test(test_wrong_weights_are_refetched),
      cmocka_unit_test(test_unreachable_member_abstains),
      cmocka_unit_test(test_join_rate_limited),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
