/* train/route_flow.c — see route_flow.h. */
#include "train/route_flow.h"

#include <math.h>
#include <string.h>

#include "util/err.h"

void route_flow_init(route_flow *r, int n_stages, const gw_log *log) {
  memset(r, 0, sizeof(*r));
  r->n_stages = n_stages;
  r->stage = -1;
  r->log = log;
}

void route_flow_attach(route_flow *r, flow *f, int stage) {
  r->f = f;
  r->stage = stage;
}

void route_flow_set_next(route_flow *r, const gw_id *ids, const double *costs, size_t n) {
  if (n > ROUTE_FLOW_MAX_NEXT) n = ROUTE_FLOW_MAX_NEXT;
  memcpy(r->next, ids, n * sizeof(*ids));
  memcpy(r->next_cost, costs, n * sizeof(*costs));
  r->n_next = n;
}

void route_flow_set_load(route_flow *r, int (*load)(void *ud, const gw_id *peer, train_load *out), void *ud) {
  r->load = load;
  r->load_ud = ud;
}

/* A full next hop DENYs what we send it: chosen only when every other one is
 * gone or avoided (its slots may have freed by the time ours arrives). */
#define ROUTE_FULL_PENALTY_MS (1e6)

double route_flow_score(const route_flow *r, const gw_id *peer, double cost_ms, train_load *load) {
  memset(load, 0, sizeof(*load));
  double c = isfinite(cost_ms) && cost_ms >= 0 ? cost_ms : 1e30;
  if (!r->load) return c;
  if (r->load(r->load_ud, peer, load) != 0) return HUGE_VAL;
  /* What is queued on the link goes first (on a slow link, one activation
   * ahead of ours is a whole transfer), and each microbatch ahead of ours
   * there costs about one of its computes (a relay computes one at a
   * time); unknown compute: a share of the link's cost, which includes it. */
  double cap = load->capacity ? (double)load->capacity : 1.0;
  double per = load->compute_ms > 0 ? load->compute_ms : c / cap;
  double queue = isfinite(load->queue_ms) && load->queue_ms > 0 ? load->queue_ms : 0;
  double score = c + queue + (double)load->outstanding * per;
  if (load->full || (load->capacity && load->outstanding >= load->capacity)) score += ROUTE_FULL_PENALTY_MS;
  return score;
}

/* A peer the load callback knows is gone (session lost, probe unanswered). */
static bool gone(const route_flow *r, const gw_id *id) {
  train_load l;
  return r->load && r->load(r->load_ud, id, &l) != 0;
}

static bool avoided(const gw_id *avoid, size_t n, const gw_id *id) {
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&avoid[i], id)) return true;
  return false;
}

/* A data node: one of its complete flows, the slot's first, else any other.
 * A slot past the flows (the data node starts more microbatches than it has
 * flows) has none: one microbatch per flow, the rest off the flows. */
static int data_hop(route_flow *r, uint32_t slot, const gw_id *avoid, size_t n_avoid, gw_id *out,
                    uint64_t *out_flow) {
  flow_path_info paths[64];
  size_t n = flow_data_flows(r->f, paths, 64);
  if (n > 64) n = 64;
  if (slot >= n) return GW_ENOENT;
  const flow_path_info *own = &paths[slot];
  if (!avoided(avoid, n_avoid, &own->first_hop) && !gone(r, &own->first_hop)) {
    *out = own->first_hop;
    *out_flow = own->seg;
    return 0;
  }
  /* Its own flow's first hop refused or is lost: the replacement is the
   * flow with the least cost to sink plus load at its first hop (in turn
   * from the slot, before: the first one not avoided, however loaded). */
  const flow_path_info *best = NULL;
  double best_score = HUGE_VAL;
  train_load l;
  for (size_t k = 1; k < n; k++) {
    const flow_path_info *p = &paths[(slot + k) % n];
    if (avoided(avoid, n_avoid, &p->first_hop)) continue;
    double score = route_flow_score(r, &p->first_hop, p->cost, &l);
    if (score == HUGE_VAL) continue;
    if (!best || score < best_score) best = p, best_score = score;
  }
  if (!best) return GW_ENOENT;
  *out = best->first_hop;
  *out_flow = best->seg;
  return 0;
}

/* The live next-stage peer not avoided with the least cost plus load: only
 * while flows rebuild (or for a data node's microbatches past its flows).
 * By cost alone, every microbatch of a burst went to the same cheapest
 * peer, queued there and met DENY full. */
static int fallback(route_flow *r, const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow) {
  const gw_id *best = NULL;
  double best_score = HUGE_VAL, best_cost = 0;
  train_load best_load = {0}, l;
  size_t candidates = 0;
  for (size_t i = 0; i < r->n_next; i++) {
    if (avoided(avoid, n_avoid, &r->next[i])) continue;
    double score = route_flow_score(r, &r->next[i], r->next_cost[i], &l);
    if (score == HUGE_VAL) continue; /* gone */
    candidates++;
    if (!best || score < best_score)
      best = &r->next[i], best_score = score, best_cost = r->next_cost[i], best_load = l;
  }
  if (!best) return GW_ENOENT;
  *out = *best;
  *out_flow = 0;
  r->fallbacks++;
  char who[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(best, who);
  GW_INFO(r->log, "route.fallback",
          "to=%s reason=no_flow cost_ms=%.1f queue_ms=%.0f outstanding=%u full=%d score_ms=%.1f candidates=%zu", who,
          best_cost, best_load.queue_ms, best_load.outstanding, best_load.full, best_score, candidates);
  return 0;
}

static int next_hop(void *ctx, const gw_id *origin, const gw_id *from, uint32_t slot, uint64_t in_flow,
                    const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow) {
  route_flow *r = ctx;
  if (!r->f) return GW_ENOENT;
  if (!from) {
    int rc = data_hop(r, slot, avoid, n_avoid, out, out_flow);
    return rc == 0 ? 0 : fallback(r, avoid, n_avoid, out, out_flow);
  }
  gw_id next;
  uint64_t seg;
  if (in_flow && flow_next_hop(r->f, from, in_flow, &next, &seg) == 0 && !avoided(avoid, n_avoid, &next) &&
      !gone(r, &next)) {
    *out = next;
    *out_flow = seg;
    return 0;
  }
  /* Another unit of the same data node's flows (it spreads work over them). */
  for (int k = 0; k < 4; k++) {
    if (flow_route(r->f, origin, from, &next, &seg) != 0) break;
    if (!avoided(avoid, n_avoid, &next) && !gone(r, &next)) {
      *out = next;
      *out_flow = seg;
      return 0;
    }
  }
  return fallback(r, avoid, n_avoid, out, out_flow);
}

static uint32_t slots(void *ctx) {
  route_flow *r = ctx;
  return r->f ? (uint32_t)flow_data_flows(r->f, NULL, 0) : 0;
}

static bool settled(void *ctx, uint64_t now_ms) {
  route_flow *r = ctx;
  return r->f && flow_is_stable(r->f, now_ms);
}

static void peer_failed(void *ctx, const gw_id *peer) {
  route_flow *r = ctx;
  if (r->f) flow_peer_failed(r->f, peer, r->now_ms);
}

static void peer_denied(void *ctx, const gw_id *peer) {
  route_flow *r = ctx;
  if (r->f) flow_peer_denied(r->f, peer, r->now_ms);
}

train_router route_flow_router(route_flow *r) {
  train_router t = {.ctx = r, .next_hop = next_hop, .slots = slots, .settled = settled,
                    .peer_failed = peer_failed, .peer_denied = peer_denied};
  return t;
}

void route_flow_data_cost(route_flow *r, size_t *flows, size_t *probed, double *sum) {
  flow_path_info paths[64];
  *flows = *probed = 0;
  *sum = 0;
  if (!r->f) return;
  size_t n = flow_data_flows(r->f, paths, 64);
  *flows = n;
  for (size_t i = 0; i < n && i < 64; i++) {
    if (paths[i].path_len == 0) continue;
    (*probed)++;
    *sum += paths[i].probed_cost;
  }
}
