/* train/replica_store.c — see replica_store.h. */
#include "train/replica_store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "util/err.h"
#include "util/file.h"

void replica_store_init(replica_store *s, size_t max_entries, uint64_t max_bytes) {
  memset(s, 0, sizeof(*s));
  s->max_entries = max_entries ? max_entries : REPLICA_DEFAULT_MAX_ENTRIES;
  s->max_bytes = max_bytes ? max_bytes : REPLICA_DEFAULT_MAX_BYTES;
}

void replica_store_free(replica_store *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i].blob);
  free(s->v);
  memset(s, 0, sizeof(*s));
}

static size_t stage_count(const replica_store *s, int stage) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++) n += s->v[i].stage == stage;
  return n;
}

/* The entry to drop next, never the one just taken (new_*): the oldest of
 * the stage holding the most entries (ties: the oldest overall), so each
 * stage keeps its newest longest. */
static size_t victim(const replica_store *s, int new_stage, uint64_t new_iter) {
  size_t best = s->n, best_count = 0;
  for (size_t i = 0; i < s->n; i++) {
    if (s->v[i].stage == new_stage && s->v[i].iteration == new_iter) continue;
    size_t c = stage_count(s, s->v[i].stage);
    if (best == s->n || c > best_count || (c == best_count && s->v[i].iteration < s->v[best].iteration)) {
      best = i;
      best_count = c;
    }
  }
  return best;
}

static void remove_at(replica_store *s, size_t i, replica_entry *dropped, size_t max_dropped, size_t *n_dropped) {
  replica_entry e = s->v[i];
  s->bytes -= e.len;
  free(e.blob);
  e.blob = NULL;
  if (dropped && n_dropped && *n_dropped < max_dropped) dropped[(*n_dropped)++] = e;
  s->v[i] = s->v[--s->n];
}

int replica_store_put(replica_store *s, const replica_entry *e, replica_entry *dropped, size_t max_dropped,
                      size_t *n_dropped) {
  if (n_dropped) *n_dropped = 0;
  if (!e->blob || e->len == 0) return GW_EINVAL;
  if (e->len > s->max_bytes) return GW_ERANGE;
  gw_id got;
  gw_id_hash(e->blob, e->len, &got);
  if (memcmp(got.b, e->blob_hash, 32) != 0) return GW_EPROTO;
  /* the same (stage, iteration) again: a retry by its pusher replaces it;
   * another member's is refused, so a hostile member of the stage cannot
   * overwrite the replica its aggregator pushed (the first push comes
   * right after the step) */
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].stage == e->stage && s->v[i].iteration == e->iteration) {
      if (!gw_id_eq(&s->v[i].from, &e->from)) return GW_EEXIST;
      s->bytes -= s->v[i].len;
      free(s->v[i].blob);
      s->v[i] = s->v[--s->n];
      break;
    }
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 4;
    replica_entry *v = realloc(s->v, cap * sizeof(*v));
    if (!v) return GW_ENOMEM;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = *e;
  s->bytes += e->len;
  /* the new entry fits the byte bound alone and max_entries >= 1: the
   * loop ends before it would have to drop it */
  while (s->n > s->max_entries || s->bytes > s->max_bytes) {
    size_t k = victim(s, e->stage, e->iteration);
    if (k == s->n) break;
    remove_at(s, k, dropped, max_dropped, n_dropped);
  }
  return 0;
}

const replica_entry *replica_store_newest(const replica_store *s, int stage) {
  const replica_entry *best = NULL;
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].stage == stage && (!best || s->v[i].iteration > best->iteration)) best = &s->v[i];
  return best;
}

int replica_path(char *out, size_t len, const char *data_dir, const char *run, int stage, uint64_t iteration) {
  int n = snprintf(out, len, "%s/replicas/%s.stage%d.iter%" PRIu64 ".state", data_dir, run, stage, iteration);
  return n < 0 || (size_t)n >= len ? GW_ERANGE : 0;
}

int replica_save(const char *data_dir, const char *run, const replica_entry *e) {
  char path[4096], dir[4096];
  int rc = replica_path(path, sizeof(path), data_dir, run, e->stage, e->iteration);
  if (rc != 0) return rc;
  if (snprintf(dir, sizeof(dir), "%s/replicas", data_dir) >= (int)sizeof(dir)) return GW_ERANGE;
  if ((rc = gw_mkdir_p(dir, 0700)) != 0) return rc;
  return ckpt_save_blob(path, e->blob, e->len, run, e->stage, (long long)e->iteration, e->weights_hash);
}

int replica_remove(const char *data_dir, const char *run, int stage, uint64_t iteration) {
  char path[4096], side[4200];
  int rc = replica_path(path, sizeof(path), data_dir, run, stage, iteration);
  if (rc != 0) return rc;
  snprintf(side, sizeof(side), "%s%s", path, CKPT_SIDECAR_SUFFIX);
  int err = 0;
  if (unlink(side) != 0 && errno != ENOENT) err = -errno;
  if (unlink(path) != 0 && errno != ENOENT) err = -errno;
  return err;
}
