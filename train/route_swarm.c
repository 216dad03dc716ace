/* train/route_swarm.c — see route_swarm.h. */
#include "train/route_swarm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

typedef struct sw_peer {
  gw_id id;
  double ema;       /* raw EWMA of response times (ms) */
  unsigned samples; /* for the bias correction ema / (1 - (1-α)^n) */
  double priority;  /* total expected busy time assigned so far */
  bool banned, present;
} sw_peer;

struct route_swarm {
  int stage, n_stages;
  unsigned slots;
  double alpha;
  sw_peer *peers;
  size_t n, cap;
};

route_swarm *route_swarm_new(int stage, int n_stages, unsigned slots, double alpha) {
  route_swarm *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->stage = stage;
  r->n_stages = n_stages;
  r->slots = slots;
  r->alpha = alpha > 0 && alpha <= 1 ? alpha : ROUTE_SWARM_ALPHA;
  return r;
}

void route_swarm_free(route_swarm *r) {
  if (!r) return;
  free(r->peers);
  free(r);
}

void route_swarm_set_stage(route_swarm *r, int stage) { r->stage = stage; }

static sw_peer *find(const route_swarm *r, const gw_id *id) {
  for (size_t i = 0; i < r->n; i++)
    if (gw_id_eq(&r->peers[i].id, id)) return &r->peers[i];
  return NULL;
}

static double expected(const route_swarm *r, const sw_peer *p) {
  if (p->samples == 0) return ROUTE_SWARM_INITIAL_MS;
  return p->ema / (1.0 - pow(1.0 - r->alpha, (double)p->samples));
}

/* The smallest priority among usable peers: where newcomers start. */
static double min_priority(const route_swarm *r) {
  double m = INFINITY;
  for (size_t i = 0; i < r->n; i++)
    if (r->peers[i].present && !r->peers[i].banned && r->peers[i].priority < m) m = r->peers[i].priority;
  return isfinite(m) ? m : 0.0;
}

void route_swarm_set_next(route_swarm *r, const gw_id *ids, size_t n) {
  for (size_t i = 0; i < r->n; i++) r->peers[i].present = false;
  for (size_t k = 0; k < n; k++) {
    sw_peer *p = find(r, &ids[k]);
    if (!p) {
      if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 8;
        sw_peer *np = realloc(r->peers, cap * sizeof(*np));
        if (!np) return;
        r->peers = np;
        r->cap = cap;
      }
      double start = min_priority(r);
      p = &r->peers[r->n++];
      memset(p, 0, sizeof(*p));
      p->id = ids[k];
      p->priority = start;
    }
    p->present = true;
  }
}

void route_swarm_readmit(route_swarm *r, const gw_id *peer) {
  sw_peer *p = find(r, peer);
  if (!p || !p->banned) return;
  p->priority = min_priority(r); /* among the others: it is still banned here */
  p->banned = false;
}

bool route_swarm_banned(const route_swarm *r, const gw_id *peer) {
  const sw_peer *p = find(r, peer);
  return p && p->banned;
}

double route_swarm_expected_ms(const route_swarm *r, const gw_id *peer) {
  const sw_peer *p = find(r, peer);
  return p ? expected(r, p) : NAN;
}

double route_swarm_priority(const route_swarm *r, const gw_id *peer) {
  const sw_peer *p = find(r, peer);
  return !p ? NAN : p->banned ? INFINITY : p->priority;
}

/* ---- train_router ---- */

static bool avoided(const gw_id *avoid, size_t n, const gw_id *id) {
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&avoid[i], id)) return true;
  return false;
}

/* Alg. 1 choose_server: the smallest priority wins and pays its expected
 * time. Ties go to the lower node ID, so runs replay. */
static int next_hop(void *ctx, const gw_id *origin, const gw_id *from, uint32_t slot, uint64_t in_flow,
                    const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow) {
  route_swarm *r = ctx;
  (void)origin, (void)from, (void)slot, (void)in_flow;
  sw_peer *best = NULL;
  for (size_t i = 0; i < r->n; i++) {
    sw_peer *p = &r->peers[i];
    if (!p->present || p->banned || avoided(avoid, n_avoid, &p->id)) continue;
    if (!best || p->priority < best->priority ||
        (p->priority == best->priority && gw_id_cmp(&p->id, &best->id) < 0))
      best = p;
  }
  if (!best) return GW_ENOENT;
  best->priority += expected(r, best);
  *out = best->id;
  *out_flow = 0;
  return 0;
}

static uint32_t slots(void *ctx) {
  route_swarm *r = ctx;
  for (size_t i = 0; i < r->n; i++)
    if (r->peers[i].present && !r->peers[i].banned) return r->slots;
  return 0; /* nobody to send to */
}

/* ban_server: infinite priority until the peer re-announces. */
static void peer_failed(void *ctx, const gw_id *peer) {
  sw_peer *p = find(ctx, peer);
  if (p) p->banned = true;
}

static void observe(void *ctx, const gw_id *peer, double ms) {
  route_swarm *r = ctx;
  sw_peer *p = find(r, peer);
  if (!p || !(ms >= 0)) return;
  p->ema = r->alpha * ms + (1.0 - r->alpha) * p->ema;
  p->samples++;
}

train_router route_swarm_router(route_swarm *r) {
  train_router t = {.ctx = r, .next_hop = next_hop, .slots = slots, .peer_failed = peer_failed,
                    .observe = observe};
  return t;
}
