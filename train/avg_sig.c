/* train/avg_sig.c — see avg_sig.h. */
#include "train/avg_sig.h"

#include <sodium.h>
#include <string.h>

#include "util/err.h"

static uint8_t *put_u32(uint8_t *q, uint32_t v) {
  for (int i = 0; i < 4; i++) *q++ = (uint8_t)(v >> (8 * i));
  return q;
}

static uint8_t *put_u64(uint8_t *q, uint64_t v) {
  for (int i = 0; i < 8; i++) *q++ = (uint8_t)(v >> (8 * i));
  return q;
}

size_t avg_sig_body(const avg_sig_fields *f, uint8_t *out, size_t cap) {
  if (f->n_contributors > AVG_SIG_MAX_CONTRIB || cap < AVG_SIG_BODY_BYTES(f->n_contributors)) return 0;
  uint8_t *q = out;
  memcpy(q, AVG_SIG_TAG, sizeof(AVG_SIG_TAG)), q += sizeof(AVG_SIG_TAG);
  memcpy(q, f->run_id, 32), q += 32;
  q = put_u32(q, (uint32_t)f->stage);
  q = put_u64(q, f->iteration);
  q = put_u32(q, f->total_count);
  q = put_u64(q, f->n_floats);
  q = put_u32(q, f->n_contributors);
  for (uint32_t i = 0; i < f->n_contributors; i++) {
    memcpy(q, f->contributors[i].b, GW_ID_BYTES), q += GW_ID_BYTES;
    if (f->hashes) memcpy(q, f->hashes[i], 32);
    else memset(q, 0, 32);
    q += 32;
  }
  memcpy(q, f->avg_hash, 32), q += 32;
  return (size_t)(q - out);
}

void avg_sig_hash_floats(const float *v, size_t n, uint8_t out[AVG_SIG_HASH_BYTES]) {
  gw_id h;
  gw_id_hash(v, v ? n * sizeof(float) : 0, &h);
  memcpy(out, h.b, AVG_SIG_HASH_BYTES);
}

int avg_sig_sign(const avg_sig_fields *f, const uint8_t sk[64], uint8_t sig[AVG_SIG_BYTES]) {
  uint8_t body[AVG_SIG_BODY_BYTES(AVG_SIG_MAX_CONTRIB)];
  size_t len = avg_sig_body(f, body, sizeof(body));
  if (!len) return GW_EINVAL;
  crypto_sign_detached(sig, NULL, body, len, sk);
  return 0;
}

int avg_sig_verify(const avg_sig_fields *f, const uint8_t pk[AVG_SIG_KEY_BYTES], const uint8_t sig[AVG_SIG_BYTES]) {
  uint8_t body[AVG_SIG_BODY_BYTES(AVG_SIG_MAX_CONTRIB)];
  size_t len = avg_sig_body(f, body, sizeof(body));
  if (!len) return GW_EINVAL;
  return crypto_sign_verify_detached(sig, body, len, pk) == 0 ? 0 : GW_EAUTH;
}

void avg_sig_signer_id(const uint8_t pk[AVG_SIG_KEY_BYTES], gw_id *out) { gw_id_hash(pk, AVG_SIG_KEY_BYTES, out); }
