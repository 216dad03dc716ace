/* Unit tests for p2p/handshake and p2p/frame: the key exchange, sealed
 * frames, and the stream reassembler, all without sockets. */
#include "testutil.h"

#include "p2p/frame.h"
#include "p2p/handshake.h"
#include "proto/gwtf.pb-c.h"
#include "util/err.h"

#define MAX_FRAME ((size_t)1 << 20)

typedef struct pair {
  p2p_identity a, b; /* a dials b */
  p2p_handshake ha, hb;
  p2p_channel ca, cb; /* a's and b's channels */
} pair;

static int setup(void **state) {
  (void)state;
  return p2p_crypto_init();
}

/* Runs the three messages between a and b; returns the first failure. */
static int run_handshake(pair *p, const gw_id *expect) {
  uint8_t m1[P2P_HS_MSG1_BYTES], m2[P2P_HS_MAX_MSG_BYTES], m3[P2P_HS_MAX_MSG_BYTES], none[P2P_HS_MAX_MSG_BYTES];
  size_t n2 = 0, n3 = 0, n0 = 0;
  p2p_hs_init(&p->ha, P2P_INITIATOR, &p->a, expect);
  p2p_hs_init(&p->hb, P2P_RESPONDER, &p->b, NULL);
  p2p_hs_start(&p->ha, m1);
  assert_int_equal(p2p_hs_want(&p->hb), P2P_HS_MSG1_BYTES);
  int rc = p2p_hs_read(&p->hb, m1, m2, &n2);
  if (rc) return rc;
  assert_int_equal(n2, P2P_HS_MSG2_BYTES);
  assert_int_equal(p2p_hs_want(&p->ha), P2P_HS_MSG2_BYTES);
  if ((rc = p2p_hs_read(&p->ha, m2, m3, &n3)) != 0) return rc;
  assert_int_equal(n3, P2P_HS_MSG3_BYTES);
  return p2p_hs_read(&p->hb, m3, none, &n0);
}

/* Handshake, then each side starts its stream and opens the other's. */
static void connect_pair(pair *p) {
  p2p_identity_generate(&p->a);
  p2p_identity_generate(&p->b);
  assert_int_equal(run_handshake(p, &p->b.id), 0);
  uint8_t hdr_a[P2P_STREAM_HEADER_BYTES], hdr_b[P2P_STREAM_HEADER_BYTES];
  p2p_channel_init_tx(&p->ca, p->ha.tx_key, hdr_a);
  p2p_channel_init_tx(&p->cb, p->hb.tx_key, hdr_b);
  p2p_channel_init_rx(&p->ca, p->ha.rx_key, hdr_b);
  p2p_channel_init_rx(&p->cb, p->hb.rx_key, hdr_a);
}

static void test_handshake_agrees(void **state) {
  (void)state;
  pair p;
  connect_pair(&p);
  assert_true(p2p_hs_done(&p.ha) && p2p_hs_done(&p.hb));
  assert_true(gw_id_eq(&p.ha.peer_id, &p.b.id));
  assert_true(gw_id_eq(&p.hb.peer_id, &p.a.id));
  assert_memory_equal(p.ha.tx_key, p.hb.rx_key, P2P_SESSION_KEY_BYTES);
  assert_memory_equal(p.ha.rx_key, p.hb.tx_key, P2P_SESSION_KEY_BYTES);
  assert_memory_not_equal(p.ha.tx_key, p.ha.rx_key, P2P_SESSION_KEY_BYTES);
  assert_memory_equal(p.ha.session_hash, p.hb.session_hash, 32);
  /* Fresh ephemeral keys: a second handshake between the same two gets new keys. */
  pair q = p;
  assert_int_equal(run_handshake(&q, &q.b.id), 0);
  assert_memory_not_equal(q.ha.tx_key, p.ha.tx_key, P2P_SESSION_KEY_BYTES);
}

static void test_handshake_wrong_expected_id(void **state) {
  (void)state;
  pair p;
  p2p_identity other;
  p2p_identity_generate(&p.a);
  p2p_identity_generate(&p.b);
  p2p_identity_generate(&other);
  assert_int_equal(run_handshake(&p, &other.id), GW_EPERM);
  assert_string_equal(p.ha.why, "unexpected-id");
  assert_false(p2p_hs_done(&p.ha));
}

static void test_handshake_rejects_self(void **state) {
  (void)state;
  pair p;
  p2p_identity_generate(&p.a);
  p.b = p.a;
  assert_int_equal(run_handshake(&p, NULL), GW_EPERM);
  assert_string_equal(p.ha.why, "self");
}

/* Flips one byte of message `which` (1..3) at offset `at` in transit. */
static int tampered_handshake(size_t which, size_t at) {
  pair p;
  p2p_identity_generate(&p.a);
  p2p_identity_generate(&p.b);
  uint8_t m1[P2P_HS_MSG1_BYTES], m2[P2P_HS_MAX_MSG_BYTES], m3[P2P_HS_MAX_MSG_BYTES], none[P2P_HS_MAX_MSG_BYTES];
  size_t n = 0;
  p2p_hs_init(&p.ha, P2P_INITIATOR, &p.a, NULL);
  p2p_hs_init(&p.hb, P2P_RESPONDER, &p.b, NULL);
  p2p_hs_start(&p.ha, m1);
  if (which == 1) m1[at] ^= 0x01;
  int rc = p2p_hs_read(&p.hb, m1, m2, &n);
  if (rc) return rc;
  if (which == 2) m2[at] ^= 0x01;
  if ((rc = p2p_hs_read(&p.ha, m2, m3, &n)) != 0) return rc;
  if (which == 3) m3[at] ^= 0x01;
  if ((rc = p2p_hs_read(&p.hb, m3, none, &n)) != 0) return rc;
  /* Both accepted: the keys must still disagree, or the tampering was harmless. */
  return memcmp(p.ha.tx_key, p.hb.rx_key, 32) == 0 ? 0 : GW_EAUTH;
}

static void test_handshake_tampering(void **state) {
  (void)state;
  assert_int_equal(tampered_handshake(1, 0), GW_EPROTO);  /* magic */
  assert_int_equal(tampered_handshake(1, 4), GW_EPROTO);  /* version */
  assert_int_equal(tampered_handshake(2, 1), GW_EPROTO);  /* magic */
  /* Every byte of the ephemeral keys, static keys and signatures matters. */
  for (size_t at = P2P_HS_PREFIX_BYTES; at < P2P_HS_MSG1_BYTES; at += 7)
    assert_int_not_equal(tampered_handshake(1, at), 0);
  for (size_t at = P2P_HS_PREFIX_BYTES; at < P2P_HS_MSG2_BYTES; at += 5)
    assert_int_equal(tampered_handshake(2, at), GW_EAUTH);
  for (size_t at = 0; at < P2P_HS_MSG3_BYTES; at += 5) assert_int_equal(tampered_handshake(3, at), GW_EAUTH);
}

/* A relay that swaps the dialler's identity for its own, with a valid
 * signature over the transcript it saw, ends up with keys that open
 * nothing: the keys are bound to the whole transcript. */
static void test_handshake_identity_swap(void **state) {
  (void)state;
  pair p;
  p2p_identity mallory;
  p2p_identity_generate(&p.a);
  p2p_identity_generate(&p.b);
  p2p_identity_generate(&mallory);
  uint8_t m1[P2P_HS_MSG1_BYTES], m2[P2P_HS_MAX_MSG_BYTES], m3[P2P_HS_MAX_MSG_BYTES], none[P2P_HS_MAX_MSG_BYTES];
  size_t n = 0;
  p2p_hs_init(&p.ha, P2P_INITIATOR, &p.a, &p.b.id);
  p2p_hs_init(&p.hb, P2P_RESPONDER, &p.b, NULL);
  p2p_hs_start(&p.ha, m1);
  assert_int_equal(p2p_hs_read(&p.hb, m1, m2, &n), 0);
  assert_int_equal(p2p_hs_read(&p.ha, m2, m3, &n), 0);
  /* Mallory relays msg1 and msg2 untouched, then replaces A's msg3 with
   * her own key and a valid signature over the transcript she saw. */
  p2p_handshake fake;
  uint8_t scratch[P2P_HS_MSG1_BYTES], forged[P2P_HS_MAX_MSG_BYTES];
  p2p_hs_init(&fake, P2P_INITIATOR, &mallory, NULL);
  p2p_hs_start(&fake, scratch);
  memcpy(fake.msg1, m1, sizeof(m1)); /* sign over A's msg1, as a relay would */
  assert_int_equal(p2p_hs_read(&fake, m2, forged, &n), 0);
  /* B accepts the forged msg3: it believes it talks to Mallory ... */
  assert_int_equal(p2p_hs_read(&p.hb, forged, none, &n), 0);
  assert_true(gw_id_eq(&p.hb.peer_id, &mallory.id));
  /* ... but its keys are bound to a transcript A never saw, so nothing A
   * sends opens at B, and Mallory has no keys at all. */
  assert_memory_not_equal(p.hb.rx_key, p.ha.tx_key, P2P_SESSION_KEY_BYTES);
  assert_memory_not_equal(p.hb.tx_key, p.ha.rx_key, P2P_SESSION_KEY_BYTES);
  assert_memory_not_equal(p.hb.session_hash, p.ha.session_hash, 32);
}

/* ---- frames ---- */

/* Seals msg on a's channel into a fresh buffer. */
static uint8_t *seal(pair *p, const p2p_msg *m, bool final, size_t *len) {
  uint8_t *buf = NULL;
  assert_int_equal(p2p_frame_seal(&p->ca, &p->a.id, m, final, MAX_FRAME, &buf, len), 0);
  return buf;
}

typedef struct got {
  int rc;
  const char *why;
  p2p_head head;
  bool has_payload;
  uint8_t *payload;
  size_t n_frames;
} got;

/* Feeds wire bytes to b's reassembler in chunks of `chunk` bytes and opens
 * every record; stops at the first error. */
static void feed(pair *p, p2p_rx *rx, const uint8_t *wire, size_t len, size_t chunk, got *g) {
  size_t off = 0;
  while (off < len && g->rc == 0) {
    size_t n = len - off < chunk ? len - off : chunk;
    uint8_t *win;
    size_t wn;
    long used;
    if (p2p_rx_window(rx, &win, &wn)) { /* read straight into the record, as the session does */
      used = (long)(wn < n ? wn : n);
      memcpy(win, wire + off, (size_t)used);
      p2p_rx_commit(rx, (size_t)used);
    } else {
      used = p2p_rx_feed(rx, wire + off, n);
    }
    if (used < 0) {
      g->rc = (int)used;
      return;
    }
    off += (size_t)used;
    if (!rx->ready) continue;
    uint8_t *rec;
    size_t rlen;
    p2p_rx_record(rx, &rec, &rlen);
    if (rx->kind == P2P_RX_HEAD) {
      if (g->head.env) p2p_head_clear(&g->head);
      g->rc = p2p_frame_open_head(&p->cb, rec, rlen, &p->a.id, rx->max_frame, &g->head, &g->why);
      if (g->rc) return;
      if (g->head.has_tensor) {
        g->rc = p2p_rx_expect_payload(rx, g->head.payload_bytes);
      } else {
        g->n_frames++;
        p2p_rx_expect_head(rx);
      }
    } else {
      g->rc = p2p_frame_open_payload(&p->cb, rec, rlen, &g->why);
      if (g->rc) return;
      free(g->payload);
      g->payload = malloc(g->head.payload_bytes + 1);
      memcpy(g->payload, rec + 1, g->head.payload_bytes);
      assert_int_equal(((uintptr_t)(rec + 1)) % P2P_PAYLOAD_ALIGN, 0);
      g->has_payload = true;
      g->n_frames++;
      p2p_rx_expect_head(rx);
    }
  }
}

static void got_clear(got *g) {
  if (g->head.env) p2p_head_clear(&g->head);
  free(g->payload);
  memset(g, 0, sizeof(*g));
}

static void test_frame_round_trip(void **state) {
  (void)state;
  pair p;
  connect_pair(&p);
  size_t n = 200000; /* 800 kB: under MAX_FRAME */
  float *act = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) act[i] = (float)i * 0.5f;
  p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 3, .shape = {4, 250, 200}, .name = "act"};
  const uint8_t body[] = "microbatch 17";
  p2p_msg m = {.type = 300, .request_id = 0xfeedbeefULL, .body = body, .body_len = sizeof(body), .tensor = &t,
               .data = (const uint8_t *)act, .data_len = n * sizeof(float)};
  size_t len;
  uint8_t *wire = seal(&p, &m, false, &len);
  /* Chunk sizes from 1 byte to more than the frame: boundaries anywhere. */
  static const size_t chunks[] = {1, 3, 4, 17, 1000, 65536, 1 << 22};
  for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
    pair q;
    connect_pair(&q);
    free(wire);
    wire = NULL;
    assert_int_equal(p2p_frame_seal(&q.ca, &q.a.id, &m, false, MAX_FRAME, &wire, &len), 0);
    p2p_rx rx;
    p2p_rx_init(&rx, MAX_FRAME);
    p2p_rx_expect_head(&rx);
    got g = {0};
    feed(&q, &rx, wire, len, chunks[c], &g);
    assert_int_equal(g.rc, 0);
    assert_int_equal(g.n_frames, 1);
    p2p_msg out;
    p2p_head_to_msg(&g.head, NULL, g.payload, &out);
    assert_int_equal(out.type, 300);
    assert_true(out.request_id == 0xfeedbeefULL);
    assert_int_equal(out.body_len, sizeof(body));
    assert_memory_equal(out.body, body, sizeof(body));
    assert_non_null(out.tensor);
    assert_int_equal(out.tensor->dtype, GWTF__DTYPE__DTYPE_F32);
    assert_int_equal(out.tensor->ndim, 3);
    assert_int_equal(out.tensor->shape[2], 200);
    assert_string_equal(out.tensor->name, "act");
    assert_int_equal(out.data_len, n * sizeof(float));
    assert_memory_equal(out.data, act, n * sizeof(float));
    assert_false(p2p_rx_partial(&rx));
    got_clear(&g);
    p2p_rx_free(&rx);
  }
  free(wire);
  free(act);
}

/* A control message, a tensor and a raw payload back to back in one buffer. */
static void test_frame_sequence(void **state) {
  (void)state;
  pair p;
  connect_pair(&p);
  uint8_t raw[5000];
  for (size_t i = 0; i < sizeof(raw); i++) raw[i] = (uint8_t)i;
  p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_U16, .ndim = 1, .shape = {2500}};
  p2p_msg m1 = {.type = 200, .body = (const uint8_t *)"flow", .body_len = 4};
  p2p_msg m2 = {.type = 301, .tensor = &t, .data = raw, .data_len = sizeof(raw)};
  p2p_msg m3 = {.type = 302, .data = raw, .data_len = 10}; /* raw bytes, no description */
  size_t l1, l2, l3;
  uint8_t *w1 = seal(&p, &m1, false, &l1), *w2 = seal(&p, &m2, false, &l2), *w3 = seal(&p, &m3, false, &l3);
  uint8_t *all = malloc(l1 + l2 + l3);
  memcpy(all, w1, l1);
  memcpy(all + l1, w2, l2);
  memcpy(all + l1 + l2, w3, l3);
  p2p_rx rx;
  p2p_rx_init(&rx, MAX_FRAME);
  p2p_rx_expect_head(&rx);
  got g = {0};
  feed(&p, &rx, all, l1 + l2 + l3, 777, &g);
  assert_int_equal(g.rc, 0);
  assert_int_equal(g.n_frames, 3);
  assert_int_equal(g.head.env->type, 302);
  assert_int_equal(g.head.payload_bytes, 10);
  assert_memory_equal(g.payload, raw, 10);
  got_clear(&g);
  p2p_rx_free(&rx);
  free(w1), free(w2), free(w3), free(all);
}

static void test_frame_replay_reorder_tamper(void **state) {
  (void)state;
  p2p_msg m1 = {.type = 200, .body = (const uint8_t *)"one", .body_len = 3};
  p2p_msg m2 = {.type = 200, .body = (const uint8_t *)"two", .body_len = 3};
  for (int mode = 0; mode < 5; mode++) {
    pair p;
    connect_pair(&p);
    size_t l1, l2;
    uint8_t *w1 = seal(&p, &m1, false, &l1), *w2 = seal(&p, &m2, false, &l2);
    uint8_t *stream = malloc(l1 + l2);
    size_t len = 0;
    switch (mode) {
    case 0: /* replay: the first frame twice */
      memcpy(stream, w1, l1), memcpy(stream + l1, w1, l1), len = 2 * l1;
      break;
    case 1: /* reorder */
      memcpy(stream, w2, l2), memcpy(stream + l2, w1, l1), len = l1 + l2;
      break;
    case 2: /* drop the first */
      memcpy(stream, w2, l2), len = l2;
      break;
    case 3: /* flip a ciphertext bit */
      memcpy(stream, w1, l1), len = l1, stream[l1 - 3] ^= 0x40;
      break;
    case 4: /* flip the encrypted tag byte */
      memcpy(stream, w1, l1), len = l1, stream[P2P_LEN_BYTES] ^= 0x01;
      break;
    }
    p2p_rx rx;
    p2p_rx_init(&rx, MAX_FRAME);
    p2p_rx_expect_head(&rx);
    got g = {0};
    feed(&p, &rx, stream, len, 64, &g);
    assert_int_equal(g.rc, GW_EAUTH);
    assert_string_equal(g.why, "auth");
    got_clear(&g);
    p2p_rx_free(&rx);
    free(w1), free(w2), free(stream);
  }
}

/* A frame sealed in one session never opens in another, even between the
 * same two nodes. */
static void test_frame_cross_session(void **state) {
  (void)state;
  pair p, q;
  connect_pair(&p);
  q = p;
  assert_int_equal(run_handshake(&q, &q.b.id), 0);
  uint8_t ha[P2P_STREAM_HEADER_BYTES], hb[P2P_STREAM_HEADER_BYTES];
  p2p_channel_init_tx(&q.ca, q.ha.tx_key, ha);
  p2p_channel_init_tx(&q.cb, q.hb.tx_key, hb);
  p2p_channel_init_rx(&q.cb, q.hb.rx_key, ha);
  p2p_msg m = {.type = 200, .body = (const uint8_t *)"x", .body_len = 1};
  size_t l;
  uint8_t *w = seal(&p, &m, false, &l); /* from session p ... */
  p2p_rx rx;
  p2p_rx_init(&rx, MAX_FRAME);
  p2p_rx_expect_head(&rx);
  got g = {0};
  feed(&q, &rx, w, l, l, &g); /* ... into session q */
  assert_int_equal(g.rc, GW_EAUTH);
  got_clear(&g);
  p2p_rx_free(&rx);
  free(w);
}

static void test_frame_truncated(void **state) {
  (void)state;
  pair p;
  connect_pair(&p);
  uint8_t raw[100000] = {1};
  p2p_msg m = {.type = 300, .data = raw, .data_len = sizeof(raw)};
  size_t l;
  uint8_t *w = seal(&p, &m, false, &l);
  size_t cuts[] = {2, P2P_LEN_BYTES + 5, l - 1000, l - 1};
  for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
    pair q = p;
    p2p_rx rx;
    p2p_rx_init(&rx, MAX_FRAME);
    p2p_rx_expect_head(&rx);
    got g = {0};
    feed(&q, &rx, w, cuts[i], 4096, &g);
    assert_int_equal(g.rc, 0);
    assert_int_equal(g.n_frames, 0);
    assert_true(p2p_rx_partial(&rx)); /* the session reports this as "truncated" at EOF */
    got_clear(&g);
    p2p_rx_free(&rx);
  }
  free(w);
}

/* Length prefixes past the limit are refused before any allocation: the
 * reassembler's high-water mark stays at zero for a 4 GiB prefix. */
static void test_frame_oversize_no_alloc(void **state) {
  (void)state;
  static const uint8_t prefixes[][4] = {{0xff, 0xff, 0xff, 0xff}, {0x00, 0x10, 0x00, 0x12}, {0x80, 0, 0, 0}};
  for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
    p2p_rx rx;
    p2p_rx_init(&rx, MAX_FRAME);
    p2p_rx_expect_head(&rx);
    assert_int_equal(p2p_rx_feed(&rx, prefixes[i], 4), GW_ERANGE);
    assert_int_equal(rx.hwm, 0);
    assert_null(rx.big);
    p2p_rx_free(&rx);
  }
  /* Too short to hold a tag. */
  p2p_rx rx;
  p2p_rx_init(&rx, MAX_FRAME);
  p2p_rx_expect_head(&rx);
  static const uint8_t tiny[4] = {0, 0, 0, 3};
  assert_int_equal(p2p_rx_feed(&rx, tiny, 4), GW_EPROTO);
  p2p_rx_free(&rx);

  /* An authenticated envelope announcing a payload over the receiver's
   * limit is refused when the head opens, before the payload buffer. */
  pair p;
  connect_pair(&p);
  uint8_t *big = calloc(1, 300000);
  p2p_msg m = {.type = 300, .data = big, .data_len = 300000};
  uint8_t *w = NULL;
  size_t l;
  assert_int_equal(p2p_frame_seal(&p.ca, &p.a.id, &m, false, 1 << 20, &w, &l), 0);
  p2p_rx_init(&rx, 100000); /* the receiver accepts 100 kB */
  p2p_rx_expect_head(&rx);
  got g = {0};
  feed(&p, &rx, w, l, l, &g);
  assert_int_equal(g.rc, GW_ERANGE);
  assert_string_equal(g.why, "oversize");
  assert_true(rx.hwm < 4096);
  got_clear(&g);
  p2p_rx_free(&rx);
  /* The sender refuses frames over its limit too. */
  free(w);
  assert_int_equal(p2p_frame_seal(&p.ca, &p.a.id, &m, false, 100000, &w, &l), GW_ERANGE);
  free(big);
}

static void test_frame_final_and_sender(void **state) {
  (void)state;
  pair p;
  connect_pair(&p);
  p2p_msg bye = {.type = GWTF__MSG_TYPE__MSG_GOODBYE};
  p2p_msg m = {.type = 200, .body = (const uint8_t *)"late", .body_len = 4};
  size_t l1, l2;
  uint8_t *w1 = seal(&p, &bye, true, &l1), *w2 = seal(&p, &m, false, &l2);
  p2p_rx rx;
  p2p_rx_init(&rx, MAX_FRAME);
  p2p_rx_expect_head(&rx);
  got g = {0};
  feed(&p, &rx, w1, l1, l1, &g);
  assert_int_equal(g.rc, 0);
  assert_true(g.head.final);
  feed(&p, &rx, w2, l2, l2, &g);
  assert_int_equal(g.rc, GW_EPROTO);
  assert_string_equal(g.why, "after-final");
  got_clear(&g);
  p2p_rx_free(&rx);
  free(w1), free(w2);

  /* An envelope naming someone else as its sender is refused. */
  pair q;
  connect_pair(&q);
  uint8_t *w = NULL;
  size_t l;
  assert_int_equal(p2p_frame_seal(&q.ca, &q.b.id, &m, false, MAX_FRAME, &w, &l), 0);
  p2p_rx_init(&rx, MAX_FRAME);
  p2p_rx_expect_head(&rx);
  feed(&q, &rx, w, l, l, &g);
  assert_int_equal(g.rc, GW_EPROTO);
  assert_string_equal(g.why, "sender");
  got_clear(&g);
  p2p_rx_free(&rx);
  free(w);
}

static void test_tensor_check(void **state) {
  (void)state;
  p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 2, .shape = {3, 5}};
  assert_int_equal(p2p_tensor_check(&t, 60), 0);
  assert_int_equal(p2p_tensor_check(&t, 59), GW_EINVAL);
  t.dtype = 99;
  assert_int_equal(p2p_tensor_check(&t, 60), GW_EINVAL);
  t.dtype = GWTF__DTYPE__DTYPE_BF16;
  t.shape[0] = UINT64_MAX / 2;
  assert_int_equal(p2p_tensor_check(&t, 60), GW_EINVAL); /* overflow */
  /* A chunk of a weight transfer: 40 of 120 bytes at offset 80. */
  p2p_tensor c = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 2, .shape = {3, 10}, .offset = 80, .total = 120};
  assert_int_equal(p2p_tensor_check(&c, 40), 0);
  assert_int_equal(p2p_tensor_check(&c, 41), GW_EINVAL);
  c.offset = 200;
  assert_int_equal(p2p_tensor_check(&c, 0), GW_EINVAL);
  p2p_tensor raw = {0};
  assert_int_equal(p2p_tensor_check(&raw, 12345), 0);
  raw.ndim = 1;
  assert_int_equal(p2p_tensor_check(&raw, 12345), GW_EINVAL);
  assert_int_equal(p2p_dtype_size(GWTF__DTYPE__DTYPE_U8), 1);
  assert_int_equal(p2p_dtype_size(GWTF__DTYPE__DTYPE_R3ROW), 1); /* compressed rows: byte elements */
  assert_int_equal(p2p_dtype_size(GWTF__DTYPE__DTYPE_LR32), 1);
  assert_int_equal(p2p_dtype_size(GWTF__DTYPE__DTYPE_LR32R4), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handshake_agrees),
      cmocka_unit_test(test_handshake_wrong_expected_id),
      cmocka_unit_test(test_handshake_rejects_self),
      cmocka_unit_test(test_handshake_tampering),
      cmocka_unit_test(test_handshake_identity_swap),
      cmocka_unit_test(test_frame_round_trip),
      cmocka_unit_test(test_frame_sequence),
      cmocka_unit_test(test_frame_replay_reorder_tamper),
      cmocka_unit_test(test_frame_cross_session),
      cmocka_unit_test(test_frame_truncated),
      cmocka_unit_test(test_frame_oversize_no_alloc),
      cmocka_unit_test(test_frame_final_and_sender),
      cmocka_unit_test(test_tensor_check),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
