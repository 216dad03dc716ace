/* dht/store.h — the records this node holds for others, with hard caps.
 *
 * Records live under their key, one per subkey (publisher), ordered by
 * publisher ID so that FIND_VALUE can page through a key with many
 * publishers. Rules:
 * - a record replaces the held one from the same publisher only with a
 *   strictly higher sequence (a replay or an older copy is refused);
 * - expired records are never returned and are dropped by dht_store_expire;
 * - caps on keys, subkeys per key and total bytes refuse new records rather
 *   than evict held ones (a flood cannot push out what honest peers stored).
 * Pure data structure: times are passed in. */
#ifndef GWTF_DHT_STORE_H
#define GWTF_DHT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/record.h"

typedef struct dht_store_limits {
  size_t max_keys;
  size_t max_subkeys; /* records per key: one per publisher */
  size_t max_bytes;   /* sum of dht_rec_footprint */
} dht_store_limits;

typedef struct dht_store dht_store;

int dht_store_new(const dht_store_limits *lim, dht_store **out);
void dht_store_free(dht_store *s);

/* Takes ownership of r when it returns 0. Otherwise the caller keeps r:
 *   GW_EEXIST  the same publisher's record with seq >= r->seq is held
 *   GW_EFULL   a cap would be exceeded */
int dht_store_put(dht_store *s, dht_rec *r, uint64_t now_ms);

/* Up to max live records under key whose publisher sorts after `after`
 * (NULL: from the first), in publisher order. *more is set when live records
 * remain beyond the last one returned. Pointers stay valid until the next
 * put or expire. */
size_t dht_store_get(const dht_store *s, const gw_id *key, const gw_id *after, uint64_t now_ms,
                     const dht_rec **out, size_t max, bool *more);

/* Drops expired records. Returns the earliest expiry left (UINT64_MAX: none). */
uint64_t dht_store_expire(dht_store *s, uint64_t now_ms);
uint64_t dht_store_next_expiry(const dht_store *s);

size_t dht_store_records(const dht_store *s);
size_t dht_store_keys(const dht_store *s);
size_t dht_store_bytes(const dht_store *s);

#endif
