/* test/fuzz/fuzz_frame_lib.c — the session layer's receive side (p2p_rx,
 * frames, the handshake) under hostile bytes; see fuzz_targets.h. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_targets.h"
#include "p2p/frame.h"
#include "p2p/handshake.h"
#include "p2p/identity.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"

#define WIRE_MAX (256u << 10) /* a sealed script never grows past this */

void fuzz_frame_key(uint8_t key[32]) { memset(key, 0x5a, 32); }

void fuzz_frame_peer(uint8_t id[32]) { memset(id, 0x42, 32); }

/* ---- the session's receive steps (p2p/session.c session_got_record and friends) ---- */

typedef enum { R_HEADER, R_HELLO, R_UP, R_DONE } rx_state;

typedef struct rx_session {
  rx_state state;
  p2p_rx rx;
  p2p_channel ch;
  gw_id peer;
  p2p_head pending;
  bool has_pending;
  unsigned delivered;
} rx_session;

static void deliver(rx_session *s, const p2p_head *h, const uint8_t *payload) {
  p2p_msg m;
  p2p_head_to_msg(h, payload ? &s->rx : NULL, payload, &m);
  /* The upper layers read body and tensor; touch every byte as they would. */
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < m.body_len; i++) sink ^= m.body[i];
  if (m.tensor && m.data_len) sink ^= m.data[0] ^ m.data[m.data_len - 1];
  (void)sink;
  /* Every other message is kept by its consumer (p2p_msg_keep), like a
   * training layer holding an activation. */
  if (m.data && (s->delivered++ & 1)) free(p2p_msg_keep(&m));
}

static void got_head(rx_session *s, uint8_t *rec, size_t len) {
  p2p_head h;
  const char *why = NULL;
  if (p2p_frame_open_head(&s->ch, rec, len, &s->peer, FUZZ_FRAME_MAX, &h, &why) != 0) {
    s->state = R_DONE;
    return;
  }
  if (s->state == R_HELLO) {
    Gwtf__Hello *hello = NULL;
    if (h.env->type != GWTF__MSG_TYPE__MSG_HELLO || h.has_tensor || h.final ||
        !(hello = gwtf__hello__unpack(NULL, h.env->body.len, h.env->body.data))) {
      s->state = R_DONE;
    } else {
      gwtf__hello__free_unpacked(hello, NULL);
      s->state = R_UP;
      p2p_rx_expect_head(&s->rx);
    }
  } else if (h.final) {
    Gwtf__Goodbye *g = gwtf__goodbye__unpack(NULL, h.env->body.len, h.env->body.data);
    if (g) gwtf__goodbye__free_unpacked(g, NULL);
    s->state = R_DONE;
  } else if (h.has_tensor) {
    s->pending = h;
    s->has_pending = true;
    if (p2p_rx_expect_payload(&s->rx, h.payload_bytes) != 0) s->state = R_DONE;
    return;
  } else {
    deliver(s, &h, NULL);
    p2p_rx_expect_head(&s->rx);
  }
  p2p_head_clear(&h);
}

static void got_payload(rx_session *s, uint8_t *rec, size_t len) {
  const char *why = NULL;
  if (p2p_frame_open_payload(&s->ch, rec, len, &why) != 0) {
    s->state = R_DONE;
    return;
  }
  deliver(s, &s->pending, rec + 1);
  p2p_head_clear(&s->pending);
  s->has_pending = false;
  p2p_rx_expect_head(&s->rx);
}

static void got_record(rx_session *s) {
  uint8_t *rec, key[32];
  size_t len;
  p2p_rx_record(&s->rx, &rec, &len);
  switch (s->state) {
  case R_HEADER:
    fuzz_frame_key(key);
    p2p_channel_init_rx(&s->ch, key, rec);
    s->state = R_HELLO;
    p2p_rx_expect_head(&s->rx);
    break;
  case R_HELLO:
  case R_UP:
    if (s->has_pending)
      got_payload(s, rec, len);
    else
      got_head(s, rec, len);
    break;
  default: break;
  }
}

/* The bytes arrive in reads of `chunk` bytes; a read goes straight into the
 * record when p2p_rx offers its window (session.c session_on_alloc/session_on_read). */
static void receive(const uint8_t *wire, size_t n, size_t chunk) {
  rx_session s;
  memset(&s, 0, sizeof(s));
  fuzz_frame_peer(s.peer.b);
  p2p_rx_init(&s.rx, FUZZ_FRAME_MAX);
  p2p_rx_expect_raw(&s.rx, P2P_STREAM_HEADER_BYTES);
  size_t at = 0;
  while (at < n && s.state != R_DONE) {
    size_t take = n - at < chunk ? n - at : chunk;
    uint8_t *p;
    size_t room;
    if (p2p_rx_window(&s.rx, &p, &room)) {
      if (take > room) take = room;
      memcpy(p, wire + at, take);
      p2p_rx_commit(&s.rx, take);
      at += take;
      if (s.rx.ready) got_record(&s);
      continue;
    }
    size_t off = 0;
    while (off < take && s.state != R_DONE) {
      long used = p2p_rx_feed(&s.rx, wire + at + off, take - off);
      if (used < 0) {
        s.state = R_DONE;
        break;
      }
      off += (size_t)used;
      if (s.rx.ready) got_record(&s);
    }
    at += take;
  }
  (void)p2p_rx_partial(&s.rx);
  if (s.has_pending) p2p_head_clear(&s.pending);
  p2p_rx_free(&s.rx);
  p2p_channel_wipe(&s.ch);
}

/* ---- mode 1: a script of records, sealed here ---- */

static size_t seal_script(const uint8_t *in, size_t n, uint8_t *wire) {
  uint8_t key[32];
  fuzz_frame_key(key);
  crypto_secretstream_xchacha20poly1305_state tx;
  crypto_secretstream_xchacha20poly1305_init_push(&tx, wire, key);
  size_t w = P2P_STREAM_HEADER_BYTES;
  size_t at = 0;
  while (at + 3 <= n) {
    uint8_t kind = in[at] & 3;
    size_t len = (size_t)in[at + 1] | (size_t)in[at + 2] << 8;
    at += 3;
    if (len > n - at) len = n - at;
    const uint8_t *rec = in + at;
    at += len;
    size_t out = kind == 3 ? len : len + P2P_ABYTES;
    size_t prefix = kind <= 1 ? P2P_LEN_BYTES : 0;
    if (w + prefix + out > WIRE_MAX) break;
    if (prefix) {
      uint32_t L = (uint32_t)out;
      wire[w++] = (uint8_t)(L >> 24), wire[w++] = (uint8_t)(L >> 16);
      wire[w++] = (uint8_t)(L >> 8), wire[w++] = (uint8_t)L;
    }
    if (kind == 3) {
      memcpy(wire + w, rec, len);
    } else {
      uint8_t tag = kind == 1 ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
                              : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE;
      crypto_secretstream_xchacha20poly1305_push(&tx, wire + w, NULL, rec, len, NULL, 0, tag);
    }
    w += out;
  }
  return w;
}

/* ---- mode 2: the handshake ---- */

static const p2p_identity *hs_identity(int which) {
  static p2p_identity ids[2];
  static bool ready;
  if (!ready) {
    uint8_t seed[32];
    memset(seed, 0x21, sizeof(seed));
    p2p_identity_from_seed(seed, &ids[0]);
    memset(seed, 0x22, sizeof(seed));
    p2p_identity_from_seed(seed, &ids[1]);
    ready = true;
  }
  return &ids[which];
}

/* Copies n bytes of input (zeros past its end) and advances. */
static void take(const uint8_t **in, size_t *n, uint8_t *out, size_t want) {
  size_t k = *n < want ? *n : want;
  memcpy(out, *in, k);
  memset(out + k, 0, want - k);
  *in += k, *n -= k;
}

static void handshake(const uint8_t *in, size_t n) {
  if (n < 1) return;
  uint8_t sub = in[0] & 3;
  bool with_expect = in[0] & 4;
  in++, n--;
  uint8_t buf[P2P_HS_MAX_MSG_BYTES], out[P2P_HS_MAX_MSG_BYTES];
  size_t out_len;
  p2p_handshake a, b;
  if (sub == 0) { /* a responder reads what a dialler sends */
    p2p_hs_init(&b, P2P_RESPONDER, hs_identity(1), NULL);
    while (p2p_hs_want(&b) && n) {
      size_t want = p2p_hs_want(&b);
      take(&in, &n, buf, want);
      if (p2p_hs_read(&b, buf, out, &out_len) != 0) break;
    }
    p2p_hs_wipe(&b);
    return;
  }
  if (sub == 1) { /* a dialler reads what the answer says */
    gw_id expect = hs_identity(1)->id;
    p2p_hs_init(&a, P2P_INITIATOR, hs_identity(0), with_expect ? &expect : NULL);
    p2p_hs_start(&a, out);
    take(&in, &n, buf, P2P_HS_MSG2_BYTES);
    (void)p2p_hs_read(&a, buf, out, &out_len);
    p2p_hs_wipe(&a);
    return;
  }
  /* A man in the middle flips bits of an honest exchange. */
  gw_id expect = hs_identity(1)->id;
  p2p_hs_init(&a, P2P_INITIATOR, hs_identity(0), sub == 3 ? &expect : NULL);
  p2p_hs_init(&b, P2P_RESPONDER, hs_identity(1), NULL);
  uint8_t mask[P2P_HS_MAX_MSG_BYTES];
  uint8_t m1[P2P_HS_MSG1_BYTES];
  p2p_hs_start(&a, m1);
  take(&in, &n, mask, P2P_HS_MSG1_BYTES);
  for (size_t i = 0; i < P2P_HS_MSG1_BYTES; i++) m1[i] ^= mask[i];
  bool ok = p2p_hs_read(&b, m1, out, &out_len) == 0 && out_len == P2P_HS_MSG2_BYTES;
  if (ok) {
    take(&in, &n, mask, P2P_HS_MSG2_BYTES);
    for (size_t i = 0; i < P2P_HS_MSG2_BYTES; i++) out[i] ^= mask[i];
    ok = p2p_hs_read(&a, out, buf, &out_len) == 0 && out_len == P2P_HS_MSG3_BYTES;
  }
  if (ok) {
    take(&in, &n, mask, P2P_HS_MSG3_BYTES);
    for (size_t i = 0; i < P2P_HS_MSG3_BYTES; i++) buf[i] ^= mask[i];
    ok = p2p_hs_read(&b, buf, out, &out_len) == 0;
  }
  if (ok && p2p_hs_done(&a) && p2p_hs_done(&b)) {
    /* Both ends think they talk to each other: they must share the keys and
     * know each other's true IDs, whatever was flipped on the way. */
    if (memcmp(a.tx_key, b.rx_key, P2P_SESSION_KEY_BYTES) != 0 ||
        memcmp(a.rx_key, b.tx_key, P2P_SESSION_KEY_BYTES) != 0 ||
        memcmp(a.session_hash, b.session_hash, 32) != 0 || !gw_id_eq(&a.peer_id, &hs_identity(1)->id) ||
        !gw_id_eq(&b.peer_id, &hs_identity(0)->id))
      abort();
  }
  p2p_hs_wipe(&a);
  p2p_hs_wipe(&b);
}

int fuzz_frame(const uint8_t *data, size_t size) {
  static bool ready;
  if (!ready) {
    p2p_crypto_init();
    ready = true;
  }
  if (size < 2) return 0;
  uint8_t mode = data[0] % 3;
  size_t chunk = 1 + (size_t)data[1] * 37; /* 1 .. 9436 bytes per read */
  if (mode == 0) {
    receive(data + 2, size - 2, chunk);
  } else if (mode == 1) {
    uint8_t *wire = malloc(WIRE_MAX);
    if (!wire) return 0;
    size_t n = seal_script(data + 2, size - 2, wire);
    receive(wire, n, chunk);
    free(wire);
  } else {
    handshake(data + 1, size - 1);
  }
  return 0;
}
