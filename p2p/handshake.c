#include "p2p/handshake.h"

#include <string.h>

#include "util/err.h"

/* Suite 1: X25519 (crypto_kx) + Ed25519 + BLAKE2b + XChaCha20-Poly1305
 * secretstream. A new suite gets a new number, never a silent change. */
#define HS_SUITE (1)
#define HS_MSG2_SIGNED_BYTES (P2P_HS_MSG2_BYTES - P2P_SIG_BYTES)

enum { HS_INIT, HS_WANT_MSG1, HS_WANT_MSG2, HS_WANT_MSG3, HS_DONE, HS_FAILED };

/* Domain-separation labels: a signature made for one purpose never
 * verifies for another. */
static const char label_responder[] = "gwtf-p2p-v1/responder";
static const char label_initiator[] = "gwtf-p2p-v1/initiator";
static const char label_session[] = "gwtf-p2p-v1/session";

void p2p_hs_init(p2p_handshake *hs, p2p_role role, const p2p_identity *me, const gw_id *expect) {
  memset(hs, 0, sizeof(*hs));
  hs->role = role;
  hs->me = me;
  hs->step = role == P2P_INITIATOR ? HS_INIT : HS_WANT_MSG1;
  if (expect && role == P2P_INITIATOR && !gw_id_is_zero(expect)) {
    hs->has_expect = true;
    hs->expect = *expect;
  }
  crypto_kx_keypair(hs->eph_pk, hs->eph_sk);
}

bool p2p_hs_done(const p2p_handshake *hs) { return hs->step == HS_DONE; }

size_t p2p_hs_want(const p2p_handshake *hs) {
  switch (hs->step) {
  case HS_WANT_MSG1: return P2P_HS_MSG1_BYTES;
  case HS_WANT_MSG2: return P2P_HS_MSG2_BYTES;
  case HS_WANT_MSG3: return P2P_HS_MSG3_BYTES;
  default: return 0;
  }
}

void p2p_hs_wipe(p2p_handshake *hs) { sodium_memzero(hs, sizeof(*hs)); }

static void write_prefix(uint8_t *p) {
  memcpy(p, "GWTF", 4);
  p[4] = P2P_HS_VERSION;
  p[5] = HS_SUITE;
  p[6] = p[7] = 0; /* reserved; ignored on receipt so they can carry flags later */
}

static int fail(p2p_handshake *hs, int rc, const char *why) {
  hs->step = HS_FAILED;
  hs->why = why;
  sodium_memzero(hs->eph_sk, sizeof(hs->eph_sk));
  return rc;
}

static int check_prefix(p2p_handshake *hs, const uint8_t *p) {
  if (memcmp(p, "GWTF", 4) != 0) return fail(hs, GW_EPROTO, "bad-magic");
  if (p[4] != P2P_HS_VERSION || p[5] != HS_SUITE) return fail(hs, GW_EPROTO, "version");
  return 0;
}

/* BLAKE2b-256(label | parts...) over up to four byte strings. */
static void transcript_hash(uint8_t out[32], const char *label, const uint8_t *a, size_t alen,
                            const uint8_t *b, size_t blen, const uint8_t *c, size_t clen) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, 32);
  crypto_generichash_update(&st, (const uint8_t *)label, strlen(label));
  crypto_generichash_update(&st, a, alen);
  if (b) crypto_generichash_update(&st, b, blen);
  if (c) crypto_generichash_update(&st, c, clen);
  crypto_generichash_final(&st, out, 32);
}

/* kx_tx/kx_rx from crypto_kx, bound to the whole transcript:
 *   key = BLAKE2b-256(key = kx key, msg = direction | session_hash). */
static void bind_key(uint8_t out[P2P_SESSION_KEY_BYTES], const uint8_t kx_key[crypto_kx_SESSIONKEYBYTES],
                     const char *direction, const uint8_t session_hash[32]) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, kx_key, crypto_kx_SESSIONKEYBYTES, P2P_SESSION_KEY_BYTES);
  crypto_generichash_update(&st, (const uint8_t *)direction, strlen(direction));
  crypto_generichash_update(&st, session_hash, 32);
  crypto_generichash_final(&st, out, P2P_SESSION_KEY_BYTES);
}

/* Both sides end here with msg1, msg2 and msg3 known. */
static int derive_keys(p2p_handshake *hs, const uint8_t msg3[P2P_HS_MSG3_BYTES]) {
  uint8_t kx_rx[crypto_kx_SESSIONKEYBYTES], kx_tx[crypto_kx_SESSIONKEYBYTES];
  const uint8_t *peer_eph = hs->role == P2P_INITIATOR ? hs->msg2 + P2P_HS_PREFIX_BYTES
                                                      : hs->msg1 + P2P_HS_PREFIX_BYTES;
  int rc = hs->role == P2P_INITIATOR
               ? crypto_kx_client_session_keys(kx_rx, kx_tx, hs->eph_pk, hs->eph_sk, peer_eph)
               : crypto_kx_server_session_keys(kx_rx, kx_tx, hs->eph_pk, hs->eph_sk, peer_eph);
  sodium_memzero(hs->eph_sk, sizeof(hs->eph_sk));
  if (rc != 0) return fail(hs, GW_EPROTO, "bad-key"); /* low-order point */
  transcript_hash(hs->session_hash, label_session, hs->msg1, sizeof(hs->msg1), hs->msg2, sizeof(hs->msg2),
                  msg3, P2P_HS_MSG3_BYTES);
  /* crypto_kx gives the client's tx key = the server's rx key, so naming the
   * keys by direction makes both ends agree. */
  bind_key(hs->tx_key, kx_tx, hs->role == P2P_INITIATOR ? "i2r" : "r2i", hs->session_hash);
  bind_key(hs->rx_key, kx_rx, hs->role == P2P_INITIATOR ? "r2i" : "i2r", hs->session_hash);
  sodium_memzero(kx_rx, sizeof(kx_rx));
  sodium_memzero(kx_tx, sizeof(kx_tx));
  hs->step = HS_DONE;
  return 0;
}

void p2p_hs_start(p2p_handshake *hs, uint8_t out[P2P_HS_MSG1_BYTES]) {
  write_prefix(hs->msg1);
  memcpy(hs->msg1 + P2P_HS_PREFIX_BYTES, hs->eph_pk, P2P_HS_EPH_BYTES);
  memcpy(out, hs->msg1, P2P_HS_MSG1_BYTES);
  hs->step = HS_WANT_MSG2;
}

/* Responder: msg1 in, msg2 out. */
static int read_msg1(p2p_handshake *hs, const uint8_t *in, uint8_t *out, size_t *out_len) {
  int rc = check_prefix(hs, in);
  if (rc != 0) return rc;
  memcpy(hs->msg1, in, P2P_HS_MSG1_BYTES);
  uint8_t *m = hs->msg2;
  write_prefix(m);
  memcpy(m + P2P_HS_PREFIX_BYTES, hs->eph_pk, P2P_HS_EPH_BYTES);
  memcpy(m + P2P_HS_PREFIX_BYTES + P2P_HS_EPH_BYTES, hs->me->pk, P2P_PK_BYTES);
  uint8_t h[32];
  transcript_hash(h, label_responder, hs->msg1, sizeof(hs->msg1), m, HS_MSG2_SIGNED_BYTES, NULL, 0);
  p2p_sign(hs->me, h, sizeof(h), m + HS_MSG2_SIGNED_BYTES);
  memcpy(out, m, P2P_HS_MSG2_BYTES);
  *out_len = P2P_HS_MSG2_BYTES;
  hs->step = HS_WANT_MSG3;
  return 0;
}

/* Initiator: msg2 in (who answered?), msg3 out, keys derived. */
static int read_msg2(p2p_handshake *hs, const uint8_t *in, uint8_t *out, size_t *out_len) {
  int rc = check_prefix(hs, in);
  if (rc != 0) return rc;
  memcpy(hs->msg2, in, P2P_HS_MSG2_BYTES);
  memcpy(hs->peer_pk, in + P2P_HS_PREFIX_BYTES + P2P_HS_EPH_BYTES, P2P_PK_BYTES);
  uint8_t h[32];
  transcript_hash(h, label_responder, hs->msg1, sizeof(hs->msg1), hs->msg2, HS_MSG2_SIGNED_BYTES, NULL, 0);
  if (p2p_verify(hs->peer_pk, h, sizeof(h), in + HS_MSG2_SIGNED_BYTES) != 0)
    return fail(hs, GW_EAUTH, "bad-signature");
  p2p_id_from_pk(hs->peer_pk, &hs->peer_id);
  /* Checked only after the signature: the peer proved it holds this key. */
  if (gw_id_eq(&hs->peer_id, &hs->me->id)) return fail(hs, GW_EPERM, "self");
  if (hs->has_expect && !gw_id_eq(&hs->peer_id, &hs->expect)) return fail(hs, GW_EPERM, "unexpected-id");
  memcpy(out, hs->me->pk, P2P_PK_BYTES);
  transcript_hash(h, label_initiator, hs->msg1, sizeof(hs->msg1), hs->msg2, sizeof(hs->msg2), hs->me->pk,
                  P2P_PK_BYTES);
  p2p_sign(hs->me, h, sizeof(h), out + P2P_PK_BYTES);
  *out_len = P2P_HS_MSG3_BYTES;
  return derive_keys(hs, out);
}

/* Responder: msg3 in (who dialled?), keys derived. */
static int read_msg3(p2p_handshake *hs, const uint8_t *in) {
  memcpy(hs->peer_pk, in, P2P_PK_BYTES);
  uint8_t h[32];
  transcript_hash(h, label_initiator, hs->msg1, sizeof(hs->msg1), hs->msg2, sizeof(hs->msg2), hs->peer_pk,
                  P2P_PK_BYTES);
  if (p2p_verify(hs->peer_pk, h, sizeof(h), in + P2P_PK_BYTES) != 0) return fail(hs, GW_EAUTH, "bad-signature");
  p2p_id_from_pk(hs->peer_pk, &hs->peer_id);
  if (gw_id_eq(&hs->peer_id, &hs->me->id)) return fail(hs, GW_EPERM, "self");
  return derive_keys(hs, in);
}

int p2p_hs_read(p2p_handshake *hs, const uint8_t *in, uint8_t *out, size_t *out_len) {
  *out_len = 0;
  switch (hs->step) {
  case HS_WANT_MSG1: return read_msg1(hs, in, out, out_len);
  case HS_WANT_MSG2: return read_msg2(hs, in, out, out_len);
  case HS_WANT_MSG3: return read_msg3(hs, in);
  default: hs->why = "state"; return GW_EINVAL;
  }
}
