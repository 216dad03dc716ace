#include "dht/store.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

typedef struct store_key {
  gw_id key;
  dht_rec **recs; /* sorted by publisher */
  size_t n, cap;
} store_key;

struct dht_store {
  dht_store_limits lim;
  store_key *keys; /* sorted by key */
  size_t n_keys, cap_keys;
  size_t n_records, bytes;
  uint64_t next_expiry;
};

int dht_store_new(const dht_store_limits *lim, dht_store **out) {
  dht_store *s = calloc(1, sizeof(*s));
  if (!s) return GW_ENOMEM;
  s->lim = *lim;
  s->next_expiry = UINT64_MAX;
  *out = s;
  return 0;
}

void dht_store_free(dht_store *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_keys; i++) {
    for (size_t j = 0; j < s->keys[i].n; j++) dht_rec_free(s->keys[i].recs[j]);
    free(s->keys[i].recs);
  }
  free(s->keys);
  free(s);
}

/* Binary search: index of key, or where it would go (*found false). */
static size_t key_pos(const dht_store *s, const gw_id *key, bool *found) {
  size_t lo = 0, hi = s->n_keys;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = gw_id_cmp(&s->keys[mid].key, key);
    if (c == 0) return (*found = true), mid;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = false;
  return lo;
}

/* First record whose publisher is >= id (or > id when strictly). */
static size_t rec_pos(const store_key *k, const gw_id *id, bool strictly) {
  size_t lo = 0, hi = k->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = gw_id_cmp(&k->recs[mid]->publisher, id);
    if (c < 0 || (strictly && c == 0))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap * 2 : 4;
  while (cap2 < need) cap2 *= 2;
  void *p = realloc(*arr, cap2 * elem);
  if (!p) return GW_ENOMEM;
  *arr = p;
  *cap = cap2;
  return 0;
}

static int insert_key(dht_store *s, size_t at, const gw_id *key) {
  if (s->n_keys >= s->lim.max_keys) return GW_EFULL;
  int rc = grow((void **)&s->keys, &s->cap_keys, s->n_keys + 1, sizeof(*s->keys));
  if (rc != 0) return rc;
  memmove(&s->keys[at + 1], &s->keys[at], (s->n_keys - at) * sizeof(*s->keys));
  memset(&s->keys[at], 0, sizeof(*s->keys));
  s->keys[at].key = *key;
  s->n_keys++;
  return 0;
}

static void remove_key(dht_store *s, size_t at) {
  free(s->keys[at].recs);
  memmove(&s->keys[at], &s->keys[at + 1], (s->n_keys - at - 1) * sizeof(*s->keys));
  s->n_keys--;
}

static void account(dht_store *s, const dht_rec *added, const dht_rec *removed) {
  if (added) {
    s->bytes += dht_rec_footprint(added);
    if (added->expires_ms < s->next_expiry) s->next_expiry = added->expires_ms;
  }
  if (removed) s->bytes -= dht_rec_footprint(removed);
}

/* Replaces the record at k->recs[at] (same publisher) when r is newer. */
static int replace(dht_store *s, store_key *k, size_t at, dht_rec *r, uint64_t now_ms) {
  dht_rec *old = k->recs[at];
  bool expired = old->expires_ms <= now_ms;
  if (!expired && r->seq <= old->seq) return GW_EEXIST;
  if (s->bytes - dht_rec_footprint(old) + dht_rec_footprint(r) > s->lim.max_bytes) return GW_EFULL;
  account(s, r, old);
  k->recs[at] = r;
  dht_rec_free(old);
  return 0;
}

int dht_store_put(dht_store *s, dht_rec *r, uint64_t now_ms) {
  bool found;
  size_t ki = key_pos(s, &r->key, &found);
  store_key *k = found ? &s->keys[ki] : NULL;
  size_t at = k ? rec_pos(k, &r->publisher, false) : 0;
  if (k && at < k->n && gw_id_eq(&k->recs[at]->publisher, &r->publisher)) return replace(s, k, at, r, now_ms);
  if (k && k->n >= s->lim.max_subkeys) return GW_EFULL;
  if (s->bytes + dht_rec_footprint(r) > s->lim.max_bytes) return GW_EFULL;
  if (!k) {
    int rc = insert_key(s, ki, &r->key);
    if (rc != 0) return rc;
    k = &s->keys[ki];
  }
  int rc = grow((void **)&k->recs, &k->cap, k->n + 1, sizeof(*k->recs));
  if (rc != 0) {
    if (k->n == 0) remove_key(s, ki);
    return rc;
  }
  memmove(&k->recs[at + 1], &k->recs[at], (k->n - at) * sizeof(*k->recs));
  k->recs[at] = r;
  k->n++;
  s->n_records++;
  account(s, r, NULL);
  return 0;
}

size_t dht_store_get(const dht_store *s, const gw_id *key, const gw_id *after, uint64_t now_ms,
                     const dht_rec **out, size_t max, bool *more) {
  bool found;
  size_t n = 0;
  if (more) *more = false;
  size_t ki = key_pos(s, key, &found);
  if (!found) return 0;
  const store_key *k = &s->keys[ki];
  for (size_t i = after ? rec_pos(k, after, true) : 0; i < k->n; i++) {
    if (k->recs[i]->expires_ms <= now_ms) continue;
    if (n == max) {
      if (more) *more = true;
      break;
    }
    out[n++] = k->recs[i];
  }
  return n;
}

uint64_t dht_store_expire(dht_store *s, uint64_t now_ms) {
  uint64_t next = UINT64_MAX;
  for (size_t i = 0; i < s->n_keys;) {
    store_key *k = &s->keys[i];
    for (size_t j = 0; j < k->n;) {
      dht_rec *r = k->recs[j];
      if (r->expires_ms <= now_ms) {
        account(s, NULL, r);
        dht_rec_free(r);
        memmove(&k->recs[j], &k->recs[j + 1], (k->n - j - 1) * sizeof(*k->recs));
        k->n--;
        s->n_records--;
      } else {
        if (r->expires_ms < next) next = r->expires_ms;
        j++;
      }
    }
    if (k->n == 0)
      remove_key(s, i);
    else
      i++;
  }
  s->next_expiry = next;
  return next;
}

uint64_t dht_store_next_expiry(const dht_store *s) { return s->next_expiry; }
size_t dht_store_records(const dht_store *s) { return s->n_records; }
size_t dht_store_keys(const dht_store *s) { return s->n_keys; }
size_t dht_store_bytes(const dht_store *s) { return s->bytes; }
