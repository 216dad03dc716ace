#include "dht/record.h"

#include <stdlib.h>
#include <string.h>

#include "dht.pb-c.h"
#include "util/err.h"

#define DOMAIN_LEN (sizeof(DHT_RECORD_DOMAIN) - 1)

/* One allocation: the struct, then the body, then the value. */
static dht_rec *rec_alloc(size_t body_len, size_t value_len) {
  dht_rec *r = calloc(1, sizeof(*r) + body_len + value_len + 1);
  if (!r) return NULL;
  r->body = (uint8_t *)(r + 1);
  r->body_len = body_len;
  r->value = r->body + body_len;
  r->value_len = value_len;
  return r;
}

static void signed_bytes(const uint8_t *body, size_t len, uint8_t *out) {
  memcpy(out, DHT_RECORD_DOMAIN, DOMAIN_LEN);
  memcpy(out + DOMAIN_LEN, body, len);
}

int dht_rec_make(const p2p_identity *me, const gw_id *key, const uint8_t *value, size_t len, uint64_t seq,
                 uint64_t lifetime_ms, uint64_t now_ms, dht_rec **out) {
  *out = NULL;
  if (len > DHT_MAX_VALUE_BYTES || lifetime_ms == 0) return GW_ERANGE;
  Gwtf__DhtRecordBody b = GWTF__DHT_RECORD_BODY__INIT;
  b.key = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)key->b};
  b.publisher_pk = (ProtobufCBinaryData){P2P_PK_BYTES, (uint8_t *)me->pk};
  b.seq = seq;
  b.lifetime_ms = lifetime_ms;
  b.value = (ProtobufCBinaryData){len, (uint8_t *)value};
  size_t body_len = gwtf__dht_record_body__get_packed_size(&b);
  if (body_len > DHT_MAX_BODY_BYTES) return GW_ERANGE;
  dht_rec *r = rec_alloc(body_len, len);
  if (!r) return GW_ENOMEM;
  gwtf__dht_record_body__pack(&b, r->body);
  if (len) memcpy(r->value, value, len);
  uint8_t msg[DOMAIN_LEN + DHT_MAX_BODY_BYTES];
  signed_bytes(r->body, body_len, msg);
  p2p_sign(me, msg, DOMAIN_LEN + body_len, r->sig);
  r->key = *key;
  r->publisher = me->id;
  memcpy(r->pk, me->pk, P2P_PK_BYTES);
  r->seq = seq;
  r->lifetime_ms = lifetime_ms;
  r->expires_ms = now_ms + lifetime_ms;
  *out = r;
  return 0;
}

/* Decodes the body into r's fields (sizes already bounded by the caller). */
static int decode_body(const uint8_t *body, size_t body_len, uint64_t max_lifetime_ms, dht_rec **out) {
  Gwtf__DhtRecordBody *b = gwtf__dht_record_body__unpack(NULL, body_len, body);
  if (!b) return GW_EPROTO;
  int rc = 0;
  if (b->key.len != GW_ID_BYTES || b->publisher_pk.len != P2P_PK_BYTES)
    rc = GW_EPROTO;
  else if (b->value.len > DHT_MAX_VALUE_BYTES || b->lifetime_ms == 0 || b->lifetime_ms > max_lifetime_ms)
    rc = GW_ERANGE;
  dht_rec *r = rc == 0 ? rec_alloc(body_len, b->value.len) : NULL;
  if (rc == 0 && !r) rc = GW_ENOMEM;
  if (rc == 0) {
    memcpy(r->body, body, body_len);
    if (b->value.len) memcpy(r->value, b->value.data, b->value.len);
    memcpy(r->key.b, b->key.data, GW_ID_BYTES);
    memcpy(r->pk, b->publisher_pk.data, P2P_PK_BYTES);
    p2p_id_from_pk(r->pk, &r->publisher);
    r->seq = b->seq;
    r->lifetime_ms = b->lifetime_ms;
  }
  gwtf__dht_record_body__free_unpacked(b, NULL);
  *out = r;
  return rc;
}

int dht_rec_open(const uint8_t *body, size_t body_len, const uint8_t *sig, size_t sig_len,
                 uint64_t remaining_ms, uint64_t max_lifetime_ms, uint64_t now_ms, dht_rec **out) {
  *out = NULL;
  if (!body || !sig || sig_len != P2P_SIG_BYTES) return GW_EPROTO;
  if (body_len > DHT_MAX_BODY_BYTES) return GW_ERANGE;
  if (remaining_ms == 0) return GW_ETIMEDOUT;
  dht_rec *r;
  int rc = decode_body(body, body_len, max_lifetime_ms, &r);
  if (rc != 0) return rc;
  uint8_t msg[DOMAIN_LEN + DHT_MAX_BODY_BYTES];
  signed_bytes(body, body_len, msg);
  if (p2p_verify(r->pk, msg, DOMAIN_LEN + body_len, sig) != 0) {
    dht_rec_free(r);
    return GW_EAUTH;
  }
  memcpy(r->sig, sig, P2P_SIG_BYTES);
  r->expires_ms = now_ms + (remaining_ms < r->lifetime_ms ? remaining_ms : r->lifetime_ms);
  *out = r;
  return 0;
}

dht_rec *dht_rec_dup(const dht_rec *r) {
  dht_rec *c = rec_alloc(r->body_len, r->value_len);
  if (!c) return NULL;
  uint8_t *body = c->body, *value = c->value;
  *c = *r;
  c->body = body;
  c->value = value;
  memcpy(c->body, r->body, r->body_len);
  if (r->value_len) memcpy(c->value, r->value, r->value_len);
  return c;
}

void dht_rec_free(dht_rec *r) { free(r); }

size_t dht_rec_footprint(const dht_rec *r) { return sizeof(*r) + r->body_len + r->value_len; }

uint64_t dht_rec_remaining(const dht_rec *r, uint64_t now_ms) {
  return r->expires_ms > now_ms ? r->expires_ms - now_ms : 0;
}
