/* flow/flow_guard.c — see flow_guard.h. */
#include "flow/flow_guard.h"

#include <stdlib.h>
#include <string.h>

void flow_guard_init(flow_guard *g) { memset(g, 0, sizeof(*g)); }

static flow_guard_peer *peer_for(flow_guard *g, const gw_id *id, uint64_t now_ms) {
  for (size_t i = 0; i < g->n; i++)
    if (gw_id_eq(&g->peers[i].id, id)) return &g->peers[i];
  size_t k = g->n;
  if (k == FLOW_GUARD_MAX_PEERS) {
    k = 0; /* full: forget the one heard from the longest ago */
    for (size_t i = 1; i < g->n; i++)
      if (g->peers[i].last_ms < g->peers[k].last_ms) k = i;
  } else {
    g->n++;
  }
  flow_guard_peer *p = &g->peers[k];
  memset(p, 0, sizeof(*p));
  p->id = *id;
  p->tokens = FLOW_GUARD_BURST;
  p->last_ms = now_ms;
  p->stage = -1;
  return p;
}

bool flow_guard_admit(flow_guard *g, const gw_id *from, uint64_t now_ms, bool *first_drop, uint64_t *dropped) {
  flow_guard_peer *p = peer_for(g, from, now_ms);
  *first_drop = false;
  if (now_ms > p->last_ms) {
    p->tokens += (double)(now_ms - p->last_ms) * FLOW_GUARD_RATE / 1000.0;
    if (p->tokens >= FLOW_GUARD_BURST) {
      p->tokens = FLOW_GUARD_BURST;
      p->drop_logged = false; /* a quiet spell ended the flood: a new one is logged again */
    }
    p->last_ms = now_ms;
  }
  *dropped = p->dropped;
  if (p->tokens >= 1.0) {
    p->tokens -= 1.0;
    return true;
  }
  *dropped = ++p->dropped;
  if (!p->drop_logged) *first_drop = p->drop_logged = true;
  return false;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

double flow_guard_cost_claim(flow_guard *g, const gw_id *from, int stage, double claimed_s, double own_s,
                             bool *first_clamp) {
  *first_clamp = false;
  flow_guard_peer *p = peer_for(g, from, 0);
  p->stage = stage;
  p->claimed_s = claimed_s;
  double votes[FLOW_GUARD_MAX_PEERS + 1];
  size_t n = 0;
  for (size_t i = 0; i < g->n; i++)
    if (&g->peers[i] != p && g->peers[i].stage == stage && g->peers[i].claimed_s > 0)
      votes[n++] = g->peers[i].claimed_s;
  if (own_s > 0) votes[n++] = own_s;
  if (!n) return claimed_s;
  /* The lower median of what the others claim and what we measured: one
   * liar among two cannot lower it (it can lower the other's floor, not
   * raise its own), and one slow stage-mate, or our own slow spell on a
   * busy machine, cannot raise it enough to clamp an honest peer. */
  qsort(votes, n, sizeof(votes[0]), cmp_double);
  double ref = votes[(n - 1) / 2];
  double floor_s = ref / FLOW_GUARD_COST_RATIO;
  if (claimed_s >= floor_s) return claimed_s;
  if (!p->clamp_logged) *first_clamp = p->clamp_logged = true;
  return floor_s;
}
