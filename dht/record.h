/* dht/record.h — signed records: what a publisher signs and every node checks.
 *
 * A record is (key, subkey = publisher's node ID, value, sequence, lifetime).
 * The publisher signs the encoded DhtRecordBody (proto/dht.proto) prefixed
 * with DHT_RECORD_DOMAIN; nodes keep and forward those exact bytes and never
 * re-encode them, so a signature always covers what was signed (protobuf
 * encoding is not canonical). The subkey is not sent: it is BLAKE2b-256 of
 * the publisher's key inside the body, so nobody can publish under another
 * peer's ID.
 *
 * Expiry travels as the time remaining (DhtRecord.remaining_ms, unsigned),
 * capped by the signed lifetime: peers' clocks need not agree, and a relay
 * cannot make a record outlive its lifetime in one step. */
#ifndef GWTF_DHT_RECORD_H
#define GWTF_DHT_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "p2p/identity.h"
#include "util/id.h"

#define DHT_RECORD_DOMAIN "gwtf-dht-record-v1"
/* Largest value: a record must fit in one STORE datagram with room to spare. */
#define DHT_MAX_VALUE_BYTES (768)
/* Largest encoded body: the value plus key, publisher key, seq and lifetime. */
#define DHT_MAX_BODY_BYTES (DHT_MAX_VALUE_BYTES + 128)

typedef struct dht_rec {
  gw_id key;
  gw_id publisher; /* the subkey: BLAKE2b-256 of pk */
  uint8_t pk[P2P_PK_BYTES];
  uint64_t seq, lifetime_ms;
  uint64_t expires_ms; /* on the local clock */
  uint8_t sig[P2P_SIG_BYTES];
  uint8_t *body; /* the signed bytes, exactly as received (inside this allocation) */
  size_t body_len;
  uint8_t *value; /* a copy of the value (inside this allocation) */
  size_t value_len;
} dht_rec;

/* Encodes and signs a new record expiring lifetime_ms after now_ms.
 * GW_ERANGE when the value is too large. */
int dht_rec_make(const p2p_identity *me, const gw_id *key, const uint8_t *value, size_t len, uint64_t seq,
                 uint64_t lifetime_ms, uint64_t now_ms, dht_rec **out);

/* Checks a record received from the network and returns an owned copy:
 *   GW_EPROTO     the body does not decode or a field has the wrong size
 *   GW_ERANGE     value or body too large, or lifetime over max_lifetime_ms
 *   GW_ETIMEDOUT  nothing remains of its lifetime (expired)
 *   GW_EAUTH      the signature does not verify
 * expires_ms = now + min(remaining, lifetime). */
int dht_rec_open(const uint8_t *body, size_t body_len, const uint8_t *sig, size_t sig_len,
                 uint64_t remaining_ms, uint64_t max_lifetime_ms, uint64_t now_ms, dht_rec **out);

dht_rec *dht_rec_dup(const dht_rec *r);
void dht_rec_free(dht_rec *r);

/* Bytes charged against the storage cap. */
size_t dht_rec_footprint(const dht_rec *r);
/* Time to live left at now (0 once expired). */
uint64_t dht_rec_remaining(const dht_rec *r, uint64_t now_ms);
/* An empty value marks a withdrawn record. */
static inline bool dht_rec_is_tombstone(const dht_rec *r) { return r->value_len == 0; }

#endif
