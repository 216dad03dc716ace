/* node/swarm_hashes.c — stage weights agreement of a swarm (see swarm_hashes.h). */
#include "node/swarm_hashes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int swarm_hashes_note(swarm_hashes *hs, uint64_t iteration, int stage, const char *hash, int peer, int generation) {
  if (hs->n == hs->cap) {
    size_t cap = hs->cap ? 2 * hs->cap : 256;
    swarm_hash_rec *nr = realloc(hs->recs, cap * sizeof(*nr));
    if (!nr) return GW_ENOMEM;
    hs->recs = nr;
    hs->cap = cap;
  }
  swarm_hash_rec *h = &hs->recs[hs->n++];
  h->iteration = iteration;
  h->stage = stage;
  h->peer = peer;
  h->generation = generation;
  snprintf(h->hash, sizeof(h->hash), "%s", hash);
  return 0;
}

/* The weights a peer computed in its last aggregation before it was killed
 * died with it. Restarts follow kills, so every generation before the
 * current one was killed. */
static bool died_unused(const swarm_hashes *hs, const swarm_hash_peer *peers, const swarm_hash_rec *h) {
  const swarm_hash_peer *p = &peers[h->peer];
  if (h->generation == p->generation && p->killed_generation != h->generation) return false;
  for (size_t i = 0; i < hs->n; i++) {
    const swarm_hash_rec *o = &hs->recs[i];
    if (o->peer == h->peer && o->generation == h->generation && o->iteration > h->iteration) return false;
  }
  return true;
}

/* The first iteration after `iteration` at which every live peer of
 * `stage` logged the same weights again, or -1 if none did before the end. */
static long long healed_at(const swarm_hashes *hs, const swarm_hash_peer *peers, int stage, uint64_t iteration) {
  for (uint64_t it = iteration + 1;; it++) {
    const char *first = NULL;
    bool same = true;
    for (size_t i = 0; i < hs->n; i++) {
      const swarm_hash_rec *h = &hs->recs[i];
      if (h->stage != stage || h->iteration != it || died_unused(hs, peers, h)) continue;
      if (!first) first = h->hash;
      else same &= strcmp(first, h->hash) == 0;
    }
    if (!first) return -1;
    if (same) return (long long)it;
  }
}

/* Whether an earlier record of the same (stage, iteration) already
 * disagreed with one before it: that split is counted once. */
static bool split_counted(const swarm_hashes *hs, const swarm_hash_peer *peers, size_t upto, const swarm_hash_rec *h) {
  for (size_t i = 0; i < upto; i++) {
    const swarm_hash_rec *o = &hs->recs[i];
    if (o->stage != h->stage || o->iteration != h->iteration || died_unused(hs, peers, o)) continue;
    for (size_t j = 0; j < i; j++) {
      const swarm_hash_rec *q = &hs->recs[j];
      if (q->stage == o->stage && q->iteration == o->iteration && !died_unused(hs, peers, q) &&
          strcmp(q->hash, o->hash) != 0)
        return true;
    }
  }
  return false;
}

int swarm_hashes_check(const swarm_hashes *hs, const swarm_hash_peer *peers, int *unhealed,
                       void (*say)(void *ud, const char *line), void *ud) {
  int splits = 0;
  *unhealed = 0;
  for (size_t i = 0; i < hs->n; i++) {
    const swarm_hash_rec *h = &hs->recs[i];
    if (died_unused(hs, peers, h)) continue;
    for (size_t j = 0; j < i; j++) {
      const swarm_hash_rec *o = &hs->recs[j];
      if (o->iteration != h->iteration || o->stage != h->stage || died_unused(hs, peers, o)) continue;
      if (strcmp(o->hash, h->hash) != 0 && !split_counted(hs, peers, i, h)) {
        long long healed = healed_at(hs, peers, h->stage, h->iteration);
        splits++;
        *unhealed += healed < 0;
        char when[48] = "never healed", line[256];
        if (healed >= 0) snprintf(when, sizeof(when), "healed by iteration %lld", healed);
        snprintf(line, sizeof(line), "WEIGHTS DISAGREE: stage %d after iteration %llu: %s has %s, %s has %s (%s)",
                 h->stage, (unsigned long long)h->iteration, peers[h->peer].name, h->hash, peers[o->peer].name,
                 o->hash, when);
        if (say) say(ud, line);
      }
      break; /* the first live record of the group stands for it */
    }
  }
  return splits;
}

void swarm_hashes_free(swarm_hashes *hs) {
  free(hs->recs);
  hs->recs = NULL;
  hs->n = hs->cap = 0;
}
