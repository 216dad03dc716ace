#include "dht/routing.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* ---- the XOR metric ---- */

unsigned dht_cpl(const gw_id *a, const gw_id *b) {
  for (unsigned i = 0; i < GW_ID_BYTES; i++) {
    uint8_t x = a->b[i] ^ b->b[i];
    if (x) return i * 8 + (unsigned)__builtin_clz((unsigned)x) - 24;
  }
  return DHT_ID_BITS;
}

int dht_dist_cmp(const gw_id *target, const gw_id *a, const gw_id *b) {
  for (unsigned i = 0; i < GW_ID_BYTES; i++) {
    uint8_t da = a->b[i] ^ target->b[i], db = b->b[i] ^ target->b[i];
    if (da != db) return da < db ? -1 : 1;
  }
  return 0;
}

void dht_distance(const gw_id *a, const gw_id *b, gw_id *out) {
  for (unsigned i = 0; i < GW_ID_BYTES; i++) out->b[i] = a->b[i] ^ b->b[i];
}

/* ---- buckets ---- */

static int bucket_alloc(dht_routing *rt, dht_bucket *b, uint64_t now_ms) {
  memset(b, 0, sizeof(*b));
  b->live = calloc(rt->k + rt->repl_max, sizeof(dht_contact));
  if (!b->live) return GW_ENOMEM;
  b->repl = b->live + rt->k;
  b->refresh_at_ms = now_ms + rt->refresh_ms;
  return 0;
}

static void remove_at(dht_contact *arr, size_t *n, size_t i) {
  memmove(&arr[i], &arr[i + 1], (*n - i - 1) * sizeof(*arr));
  (*n)--;
}

static dht_contact *find_in(dht_contact *arr, size_t n, const gw_id *id, size_t *at) {
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&arr[i].peer.id, id)) {
      if (at) *at = i;
      return &arr[i];
    }
  return NULL;
}

/* Fills free live slots from the replacement cache, most recent first. */
static void promote(dht_routing *rt, dht_bucket *b) {
  while (b->n_live < rt->k && b->n_repl > 0) {
    b->live[b->n_live] = b->repl[--b->n_repl];
    b->live[b->n_live].fails = 0;
    b->live[b->n_live].ping_pending = false;
    b->n_live++;
  }
}

int dht_routing_init(dht_routing *rt, const gw_id *self, size_t k, size_t repl_max, uint64_t refresh_ms,
                     uint64_t now_ms) {
  memset(rt, 0, sizeof(*rt));
  if (k == 0) return GW_EINVAL;
  rt->self = *self;
  rt->k = k;
  rt->repl_max = repl_max;
  rt->refresh_ms = refresh_ms;
  rt->buckets = malloc(sizeof(dht_bucket));
  if (!rt->buckets) return GW_ENOMEM;
  int rc = bucket_alloc(rt, &rt->buckets[0], now_ms);
  if (rc != 0) {
    free(rt->buckets);
    rt->buckets = NULL;
    return rc;
  }
  rt->n_buckets = 1;
  return 0;
}

void dht_routing_free(dht_routing *rt) {
  for (size_t i = 0; i < rt->n_buckets; i++) free(rt->buckets[i].live);
  free(rt->buckets);
  memset(rt, 0, sizeof(*rt));
}

size_t dht_routing_bucket_of(const dht_routing *rt, const gw_id *id) {
  size_t cpl = dht_cpl(&rt->self, id);
  return cpl < rt->n_buckets - 1 ? cpl : rt->n_buckets - 1;
}

/* Moves the contacts of src sharing at least `depth` bits with us to dst,
 * keeping their order. */
static void move_deeper(const dht_routing *rt, size_t depth, dht_contact *src, size_t *n_src, dht_contact *dst,
                        size_t *n_dst) {
  for (size_t i = 0; i < *n_src;) {
    if (dht_cpl(&rt->self, &src[i].peer.id) >= depth) {
      dst[(*n_dst)++] = src[i];
      remove_at(src, n_src, i);
    } else {
      i++;
    }
  }
}

/* Moves the contacts of the last bucket that share more bits with us into a
 * new last bucket. Only the bucket covering our own ID ever splits, so the
 * table stays small far from us and detailed near us. */
static int split_last(dht_routing *rt, uint64_t now_ms) {
  if (rt->n_buckets >= DHT_ID_BITS) return GW_EFULL;
  dht_bucket *nb = realloc(rt->buckets, (rt->n_buckets + 1) * sizeof(*nb));
  if (!nb) return GW_ENOMEM;
  rt->buckets = nb;
  dht_bucket *fresh = &rt->buckets[rt->n_buckets];
  int rc = bucket_alloc(rt, fresh, now_ms);
  if (rc != 0) return rc;
  dht_bucket *old = &rt->buckets[rt->n_buckets - 1];
  size_t depth = rt->n_buckets; /* the new bucket's index */
  move_deeper(rt, depth, old->live, &old->n_live, fresh->live, &fresh->n_live);
  move_deeper(rt, depth, old->repl, &old->n_repl, fresh->repl, &fresh->n_repl);
  rt->n_buckets++;
  promote(rt, old);
  promote(rt, fresh);
  return 0;
}

/* Whether some other ID already occupies this IP:port (live or cached). */
static bool addr_taken(const dht_routing *rt, const gw_peer *p) {
  for (size_t i = 0; i < rt->n_buckets; i++) {
    const dht_bucket *b = &rt->buckets[i];
    for (size_t j = 0; j < b->n_live; j++)
      if (gw_addr_eq(&b->live[j].peer.addr, &p->addr) && !gw_id_eq(&b->live[j].peer.id, &p->id))
        return true;
    for (size_t j = 0; j < b->n_repl; j++)
      if (gw_addr_eq(&b->repl[j].peer.addr, &p->addr) && !gw_id_eq(&b->repl[j].peer.id, &p->id))
        return true;
  }
  return false;
}

static void fill_contact(dht_contact *c, const gw_peer *p, const uint8_t *cookie, uint64_t now_ms) {
  bool keep_cookie = c->has_cookie && gw_id_eq(&c->peer.id, &p->id) && gw_addr_eq(&c->peer.addr, &p->addr);
  uint8_t old[DHT_COOKIE_BYTES];
  memcpy(old, c->cookie, sizeof(old));
  memset(c, 0, sizeof(*c));
  c->peer = *p;
  c->last_seen_ms = now_ms;
  if (cookie) {
    memcpy(c->cookie, cookie, DHT_COOKIE_BYTES);
    c->has_cookie = true;
  } else if (keep_cookie) {
    memcpy(c->cookie, old, DHT_COOKIE_BYTES);
    c->has_cookie = true;
  }
}

static int bad_index(const dht_bucket *b) {
  for (size_t i = 0; i < b->n_live; i++)
    if (b->live[i].fails >= DHT_MAX_FAILS) return (int)i;
  return -1;
}

dht_update dht_routing_update(dht_routing *rt, const gw_peer *p, const uint8_t *cookie, uint64_t now_ms,
                              uint64_t fresh_ms, dht_contact **to_ping) {
  if (to_ping) *to_ping = NULL;
  if (gw_id_eq(&p->id, &rt->self) || addr_taken(rt, p)) return DHT_RT_REFUSED;
  dht_bucket *b = &rt->buckets[dht_routing_bucket_of(rt, &p->id)];
  size_t at;
  dht_contact *c = find_in(b->live, b->n_live, &p->id, &at);
  if (c) {
    dht_contact moved = *c;
    fill_contact(&moved, p, cookie, now_ms);
    remove_at(b->live, &b->n_live, at);
    b->live[b->n_live++] = moved;
    return DHT_RT_UPDATED;
  }
  dht_contact fresh = {0};
  if (find_in(b->repl, b->n_repl, &p->id, &at)) {
    fresh = b->repl[at];
    remove_at(b->repl, &b->n_repl, at);
  }
  fill_contact(&fresh, p, cookie, now_ms);
  for (;;) {
    if (b->n_live < rt->k) {
      b->live[b->n_live++] = fresh;
      return DHT_RT_ADDED;
    }
    int bad = bad_index(b);
    if (bad >= 0) {
      remove_at(b->live, &b->n_live, (size_t)bad);
      b->live[b->n_live++] = fresh;
      return DHT_RT_ADDED;
    }
    size_t bi = (size_t)(b - rt->buckets);
    if (bi != rt->n_buckets - 1 || split_last(rt, now_ms) != 0) break;
    b = &rt->buckets[dht_routing_bucket_of(rt, &p->id)];
  }
  if (rt->repl_max == 0) return DHT_RT_REFUSED;
  if (b->n_repl == rt->repl_max) remove_at(b->repl, &b->n_repl, 0);
  b->repl[b->n_repl++] = fresh;
  dht_contact *lrs = &b->live[0];
  if (to_ping && !lrs->ping_pending && now_ms - lrs->last_seen_ms >= fresh_ms) *to_ping = lrs;
  return DHT_RT_CACHED;
}

dht_contact *dht_routing_find(dht_routing *rt, const gw_id *id) {
  dht_bucket *b = &rt->buckets[dht_routing_bucket_of(rt, id)];
  return find_in(b->live, b->n_live, id, NULL);
}

bool dht_routing_would_accept(const dht_routing *rt, const gw_id *id, const gw_addr *addr) {
  if (gw_id_eq(id, &rt->self)) return false;
  gw_peer p = {.id = *id, .addr = *addr};
  if (addr_taken(rt, &p)) return false;
  size_t bi = dht_routing_bucket_of(rt, id);
  const dht_bucket *b = &rt->buckets[bi];
  if (find_in(b->live, b->n_live, id, NULL)) return false;
  return b->n_live < rt->k || bad_index(b) >= 0 || bi == rt->n_buckets - 1 || b->n_repl < rt->repl_max;
}

static void evict(dht_routing *rt, dht_bucket *b, size_t at) {
  remove_at(b->live, &b->n_live, at);
  promote(rt, b);
}

bool dht_routing_failed(dht_routing *rt, const gw_id *id) {
  dht_bucket *b = &rt->buckets[dht_routing_bucket_of(rt, id)];
  size_t at;
  if (find_in(b->repl, b->n_repl, id, &at)) {
    remove_at(b->repl, &b->n_repl, at);
    return true;
  }
  dht_contact *c = find_in(b->live, b->n_live, id, &at);
  if (!c) return false;
  if (c->fails < UINT8_MAX) c->fails++;
  if (c->fails >= DHT_MAX_FAILS && b->n_repl > 0) {
    evict(rt, b, at);
    return true;
  }
  return false;
}

void dht_routing_ping_failed(dht_routing *rt, const gw_id *id) {
  dht_bucket *b = &rt->buckets[dht_routing_bucket_of(rt, id)];
  size_t at;
  dht_contact *c = find_in(b->live, b->n_live, id, &at);
  if (!c) return;
  c->ping_pending = false;
  if (b->n_repl > 0)
    evict(rt, b, at);
  else
    c->fails = DHT_MAX_FAILS; /* nobody waits for the slot: keep it, marked bad */
}

void dht_routing_remove(dht_routing *rt, const gw_id *id) {
  dht_bucket *b = &rt->buckets[dht_routing_bucket_of(rt, id)];
  size_t at;
  if (find_in(b->live, b->n_live, id, &at))
    evict(rt, b, at);
  else if (find_in(b->repl, b->n_repl, id, &at))
    remove_at(b->repl, &b->n_repl, at);
}

size_t dht_routing_closest(const dht_routing *rt, const gw_id *target, const gw_id *skip, gw_peer *out,
                           size_t max) {
  size_t n = 0;
  if (max == 0) return 0;
  for (size_t i = 0; i < rt->n_buckets; i++) {
    const dht_bucket *b = &rt->buckets[i];
    for (size_t j = 0; j < b->n_live; j++) {
      const dht_contact *c = &b->live[j];
      if (c->fails >= DHT_MAX_FAILS || (skip && gw_id_eq(&c->peer.id, skip))) continue;
      if (n == max && dht_dist_cmp(target, &c->peer.id, &out[n - 1].id) >= 0) continue;
      size_t pos = n < max ? n++ : max - 1;
      while (pos > 0 && dht_dist_cmp(target, &c->peer.id, &out[pos - 1].id) < 0) {
        out[pos] = out[pos - 1];
        pos--;
      }
      out[pos] = c->peer;
    }
  }
  return n;
}

size_t dht_routing_recent(const dht_routing *rt, gw_peer *out, size_t max) {
  uint64_t seen[256];
  size_t n = 0;
  if (max > 256) max = 256;
  if (max == 0) return 0;
  for (size_t i = 0; i < rt->n_buckets; i++) {
    const dht_bucket *b = &rt->buckets[i];
    for (size_t j = 0; j < b->n_live; j++) {
      const dht_contact *c = &b->live[j];
      if (c->fails > 0) continue;
      if (n == max && c->last_seen_ms <= seen[n - 1]) continue;
      size_t pos = n < max ? n++ : max - 1;
      while (pos > 0 && c->last_seen_ms > seen[pos - 1]) {
        out[pos] = out[pos - 1];
        seen[pos] = seen[pos - 1];
        pos--;
      }
      out[pos] = c->peer;
      seen[pos] = c->last_seen_ms;
    }
  }
  return n;
}

size_t dht_routing_size(const dht_routing *rt) {
  size_t n = 0;
  for (size_t i = 0; i < rt->n_buckets; i++) n += rt->buckets[i].n_live;
  return n;
}

size_t dht_routing_good(const dht_routing *rt) {
  size_t n = 0;
  for (size_t i = 0; i < rt->n_buckets; i++)
    for (size_t j = 0; j < rt->buckets[i].n_live; j++) n += rt->buckets[i].live[j].fails < DHT_MAX_FAILS;
  return n;
}

void dht_routing_touch_range(dht_routing *rt, const gw_id *target, uint64_t now_ms) {
  rt->buckets[dht_routing_bucket_of(rt, target)].refresh_at_ms = now_ms + rt->refresh_ms;
}

void dht_routing_refresh_all(dht_routing *rt, uint64_t now_ms) {
  for (size_t i = 0; i < rt->n_buckets; i++) rt->buckets[i].refresh_at_ms = now_ms;
}

int dht_routing_refresh_due(const dht_routing *rt, uint64_t now_ms) {
  for (size_t i = 0; i < rt->n_buckets; i++)
    if (rt->buckets[i].refresh_at_ms <= now_ms) return (int)i;
  return -1;
}

uint64_t dht_routing_next_refresh(const dht_routing *rt) {
  uint64_t next = UINT64_MAX;
  for (size_t i = 0; i < rt->n_buckets; i++)
    if (rt->buckets[i].refresh_at_ms < next) next = rt->buckets[i].refresh_at_ms;
  return next;
}

void dht_routing_random_in(const dht_routing *rt, size_t i, const uint8_t rnd[GW_ID_BYTES], gw_id *out) {
  /* Bits [0, i) are ours; bit i is flipped (except in the last bucket, which
   * also covers deeper prefixes); the rest are random. */
  memset(out, 0, sizeof(*out));
  for (size_t bit = 0; bit < DHT_ID_BITS; bit++) {
    size_t byte = bit / 8;
    uint8_t mask = (uint8_t)(0x80u >> (bit % 8));
    uint8_t v;
    if (bit < i)
      v = rt->self.b[byte] & mask;
    else if (bit == i && i < rt->n_buckets - 1)
      v = (uint8_t)(~rt->self.b[byte] & mask);
    else
      v = rnd[byte] & mask;
    out->b[byte] |= v;
  }
}
