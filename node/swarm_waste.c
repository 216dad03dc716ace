/* node/swarm_waste.c — see swarm_waste.h. */
#include "node/swarm_waste.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMBED_ATTEMPT UINT_MAX

/* One peer's compute on one attempt of one microbatch. */
typedef struct waste_rec {
  char peer[16], origin[16], mb[24];
  unsigned attempt;
  double secs;
  bool backward;    /* the peer carried this attempt's backward */
  bool any_attempt; /* the embedding: reused by every attempt */
  bool counted;     /* already credited to a completed microbatch */
} waste_rec;

struct swarm_waste {
  waste_rec *recs;
  size_t window, n, next;
  double total, useful;
  char (*lost)[16]; /* peers that died (killed, or crashed themselves) */
  size_t n_lost, cap_lost;
  double evicted_lost; /* waste of records that left the window, on lost peers */
};

swarm_waste *swarm_waste_new(size_t window) {
  swarm_waste *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  w->window = window ? window : 1;
  w->recs = calloc(w->window, sizeof(*w->recs));
  if (!w->recs) {
    free(w);
    return NULL;
  }
  return w;
}

void swarm_waste_free(swarm_waste *w) {
  if (!w) return;
  free(w->recs);
  free(w->lost);
  free(w);
}

static bool peer_lost(const swarm_waste *w, const char *peer) {
  for (size_t i = 0; i < w->n_lost; i++)
    if (!strcmp(w->lost[i], peer)) return true;
  return false;
}

void swarm_waste_peer_lost(swarm_waste *w, const char *peer) {
  if (!w || !peer || !*peer || peer_lost(w, peer)) return;
  if (w->n_lost == w->cap_lost) {
    size_t cap = w->cap_lost ? 2 * w->cap_lost : 64;
    char(*grown)[16] = realloc(w->lost, cap * sizeof(*grown));
    if (!grown) return; /* the split is a diagnosis: without memory it undercounts */
    w->lost = grown;
    w->cap_lost = cap;
  }
  snprintf(w->lost[w->n_lost++], sizeof(w->lost[0]), "%s", peer);
}

static bool same_mb(const waste_rec *r, const char *origin, const char *mb) {
  return !strcmp(r->origin, origin) && !strcmp(r->mb, mb);
}

static waste_rec *find(swarm_waste *w, const char *peer, const char *origin, const char *mb, unsigned attempt) {
  for (size_t i = 0; i < w->n; i++) {
    waste_rec *r = &w->recs[i];
    if (r->attempt == attempt && !strcmp(r->peer, peer) && same_mb(r, origin, mb)) return r;
  }
  return NULL;
}

/* A fresh record; the oldest one goes (its compute stays in the total, and
 * in the lost peers' share when it was waste on one). */
static waste_rec *add(swarm_waste *w, const char *peer, const char *origin, const char *mb, unsigned attempt) {
  waste_rec *r = &w->recs[w->next];
  if (w->n == w->window && !r->counted && peer_lost(w, r->peer)) w->evicted_lost += r->secs;
  w->next = (w->next + 1) % w->window;
  if (w->n < w->window) w->n++;
  memset(r, 0, sizeof(*r));
  snprintf(r->peer, sizeof(r->peer), "%s", peer);
  snprintf(r->origin, sizeof(r->origin), "%s", origin);
  snprintf(r->mb, sizeof(r->mb), "%s", mb);
  r->attempt = attempt;
  return r;
}

void swarm_waste_compute(swarm_waste *w, const char *peer, const char *origin, const char *mb, unsigned attempt,
                         const char *kind, double secs) {
  if (!w || !peer || !origin || !mb || !kind || !(secs >= 0)) return;
  w->total += secs;
  bool embed = !strcmp(kind, "embed");
  if (embed) attempt = EMBED_ATTEMPT; /* its own record: the attempt's loss is not reused */
  waste_rec *r = find(w, peer, origin, mb, attempt);
  if (!r) r = add(w, peer, origin, mb, attempt);
  r->secs += secs;
  if (!strcmp(kind, "backward") || !strcmp(kind, "embed_backward")) r->backward = true;
  if (embed) r->any_attempt = true;
}

void swarm_waste_done(swarm_waste *w, const char *origin, const char *mb, unsigned attempt) {
  if (!w || !origin || !mb) return;
  for (size_t i = 0; i < w->n; i++) {
    waste_rec *r = &w->recs[i];
    if (r->counted || !same_mb(r, origin, mb)) continue;
    if (r->any_attempt || (r->attempt == attempt && r->backward)) {
      w->useful += r->secs;
      r->counted = true;
    }
  }
}

double swarm_waste_total_s(const swarm_waste *w) { return w ? w->total : 0; }

double swarm_waste_wasted_s(const swarm_waste *w) {
  if (!w) return 0;
  double d = w->total - w->useful;
  return d > 0 ? d : 0;
}

double swarm_waste_on_lost_s(const swarm_waste *w) {
  if (!w) return 0;
  double s = w->evicted_lost;
  for (size_t i = 0; i < w->n; i++)
    if (!w->recs[i].counted && peer_lost(w, w->recs[i].peer)) s += w->recs[i].secs;
  return s;
}
