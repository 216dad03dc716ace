/* dht/routing.h — the Kademlia routing table: k-buckets by shared prefix.
 *
 * Bucket i holds the contacts whose ID shares exactly i leading bits with
 * ours; the last bucket holds every contact sharing at least that many, and
 * it is the only one that splits (it is the one that covers our own ID). A
 * bucket keeps its contacts least recently seen first, plus a small
 * replacement cache of newer contacts that found it full.
 *
 * Rules this table enforces (the DHT decides when to call it):
 * - a contact enters only through dht_routing_update, which the DHT calls
 *   when the contact has answered one of our requests — never on hearsay;
 * - at most one entry per IP:port: a second ID at a known address is refused;
 * - a full bucket never drops its least recently seen contact on its own: it
 *   parks the newcomer in the replacement cache and names the contact to
 *   ping; only a failed ping (dht_routing_ping_failed) or repeated failures
 *   evict it, and the most recent replacement takes its place.
 *
 * Pure data structure: no I/O, no clock (times are passed in). */
#ifndef GWTF_DHT_ROUTING_H
#define GWTF_DHT_ROUTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/id.h"

#define DHT_ID_BITS (8 * GW_ID_BYTES)
#define DHT_COOKIE_BYTES (8)
/* Consecutive unanswered requests after which a contact counts as bad: it is
 * no longer handed out, and a waiting replacement takes its slot. */
#define DHT_MAX_FAILS (2)

typedef struct dht_contact {
  gw_peer peer;
  uint64_t last_seen_ms; /* last verified message from it at this address */
  uint8_t fails;         /* requests unanswered since its last reply */
  bool ping_pending;     /* an eviction ping is in flight */
  bool has_cookie;       /* cookie: what it gave us to prove our address to it */
  uint8_t cookie[DHT_COOKIE_BYTES];
} dht_contact;

typedef struct dht_bucket {
  dht_contact *live; /* n_live used, least recently seen first */
  size_t n_live;
  dht_contact *repl; /* replacement cache, most recent last */
  size_t n_repl;
  uint64_t refresh_at_ms; /* when a lookup in this bucket's range is due */
} dht_bucket;

typedef struct dht_routing {
  gw_id self;
  size_t k, repl_max;
  uint64_t refresh_ms; /* a bucket no lookup has covered for this long gets one */
  dht_bucket *buckets;
  size_t n_buckets;
} dht_routing;

typedef enum dht_update {
  DHT_RT_ADDED = 0,   /* new live contact */
  DHT_RT_UPDATED,     /* already live: now most recently seen */
  DHT_RT_CACHED,      /* bucket full: kept as a replacement */
  DHT_RT_REFUSED,     /* our own ID, or another ID holds that address */
} dht_update;

/* XOR-metric helpers. */
/* Shared leading bits of a and b (256 when equal). */
unsigned dht_cpl(const gw_id *a, const gw_id *b);
/* <0, 0, >0 as a is closer to, as close as, or farther from target than b. */
int dht_dist_cmp(const gw_id *target, const gw_id *a, const gw_id *b);
/* The XOR distance itself. */
void dht_distance(const gw_id *a, const gw_id *b, gw_id *out);

int dht_routing_init(dht_routing *rt, const gw_id *self, size_t k, size_t repl_max, uint64_t refresh_ms,
                     uint64_t now_ms);
void dht_routing_free(dht_routing *rt);

/* The contact answered us (or proved its address some other way): add it,
 * refresh it, or cache it. On DHT_RT_CACHED, *to_ping (may be NULL) names the
 * least recently seen contact of the full bucket when it deserves a ping
 * (not heard from within fresh_ms and not already being pinged); the caller
 * sends it and sets ping_pending. cookie (may be NULL) is stored with it. */
dht_update dht_routing_update(dht_routing *rt, const gw_peer *p, const uint8_t *cookie, uint64_t now_ms,
                              uint64_t fresh_ms, dht_contact **to_ping);

dht_contact *dht_routing_find(dht_routing *rt, const gw_id *id);
/* Whether a contact with this ID would get a live or replacement slot now
 * (so it is worth verifying an unknown sender with a ping). */
bool dht_routing_would_accept(const dht_routing *rt, const gw_id *id, const gw_addr *addr);

/* A request to this contact went unanswered. Evicts it in favour of a
 * replacement when it has failed DHT_MAX_FAILS times. Returns true when evicted. */
bool dht_routing_failed(dht_routing *rt, const gw_id *id);
/* The eviction ping to this contact went unanswered: evict it, promote the
 * most recent replacement. */
void dht_routing_ping_failed(dht_routing *rt, const gw_id *id);
/* Removes a contact (live or cached); a replacement takes a live slot. */
void dht_routing_remove(dht_routing *rt, const gw_id *id);

/* Up to max good contacts closest to target, closest first, skipping `skip`
 * (may be NULL). Returns how many were written. */
size_t dht_routing_closest(const dht_routing *rt, const gw_id *target, const gw_id *skip, gw_peer *out,
                           size_t max);
/* Up to max good contacts, most recently seen first (the contacts file). */
size_t dht_routing_recent(const dht_routing *rt, gw_peer *out, size_t max);

size_t dht_routing_size(const dht_routing *rt);      /* live contacts */
size_t dht_routing_good(const dht_routing *rt);      /* live contacts with fails < DHT_MAX_FAILS */
/* The bucket an ID falls in. */
size_t dht_routing_bucket_of(const dht_routing *rt, const gw_id *id);
/* A lookup covered target's bucket: its refresh is due refresh_ms from now. */
void dht_routing_touch_range(dht_routing *rt, const gw_id *target, uint64_t now_ms);
/* Makes every bucket due for refresh now (after joining). */
void dht_routing_refresh_all(dht_routing *rt, uint64_t now_ms);
/* A bucket whose refresh is due at now, or -1; and the earliest due time. */
int dht_routing_refresh_due(const dht_routing *rt, uint64_t now_ms);
uint64_t dht_routing_next_refresh(const dht_routing *rt);
/* A random ID in bucket i's range, from 32 caller-supplied random bytes. */
void dht_routing_random_in(const dht_routing *rt, size_t i, const uint8_t rnd[GW_ID_BYTES], gw_id *out);

#endif
