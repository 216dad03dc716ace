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
  free(w);
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

/* A fresh record; the oldest one goes (its compute stays in the total). */
static waste_rec *add(swarm_waste *w, const char *peer, const char *origin, const char *mb, unsigned attempt) {
  waste_rec *r = &w->recs[w->next];
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
