/* flow/flow.c — lifecycle, membership, the driver's message entry point and
 * the queries of flow/flow.h. The protocol's moves live in flow_rx.c (what
 * a message does), flow_tick.c (what time does) and flow_units.c (the unit
 * and segment bookkeeping both share). */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"
#include "flow/instance.h"
#include "util/err.h"

void flow_tunables_default(flow_tunables *t) {
  *t = (flow_tunables){
      .tick_ms = 2000,
      .request_retry_ticks = 5,
      .inflow_timeout_ticks = 12,
      .pushback_timeout_ticks = 2,
      .outflow_idle_ticks = 12,
      .reject_ignore_attempts = 5,
      .temp_relay = 1.7,
      .temp_data = 2.0,
      .cooling = 0.95,
      .p_propose_unmet = 0.3,
      .p_propose_satisfied = 0.1,
      .offer_period_ticks = 6,
      .state_period_ticks = 6,
      .cost_period_ticks = 12,
      .audit_period_ticks = 3,
      .peer_timeout_ticks = 10,
      .probe_tries = 4,
      .probe_timeout_min_ms = 200,
      .rto_initial_ms = 1000,
      .offer_flush_ms = 100,
      .rebuild_ticks = 5,
      .probe_period_ticks = 3,
      .live_ticks = 10,
      .tombstone_ticks = 10,
      .stable_ticks = 6,
      .dangling_weight = 0.1,
      .min_gain = 0.005,
      .chain_requests = true,
      .reroute = true,
      .objective = FLOW_OBJ_MAX,
      .max_norm = 8,
  };
}

/* The table behind flow_tunables_set/describe: one row per field. */
typedef enum tun_type { TUN_U64, TUN_INT, TUN_DOUBLE, TUN_BOOL, TUN_OBJECTIVE } tun_type;

typedef struct tun_field {
  const char *name;
  tun_type type;
  size_t offset;
} tun_field;

#define TUN(field, type) \
  { #field, type, offsetof(flow_tunables, field) }
static const tun_field tun_fields[] = {
    TUN(tick_ms, TUN_U64),
    TUN(request_retry_ticks, TUN_INT),
    TUN(inflow_timeout_ticks, TUN_INT),
    TUN(pushback_timeout_ticks, TUN_INT),
    TUN(outflow_idle_ticks, TUN_INT),
    TUN(reject_ignore_attempts, TUN_INT),
    TUN(temp_relay, TUN_DOUBLE),
    TUN(temp_data, TUN_DOUBLE),
    TUN(cooling, TUN_DOUBLE),
    TUN(p_propose_unmet, TUN_DOUBLE),
    TUN(p_propose_satisfied, TUN_DOUBLE),
    TUN(offer_period_ticks, TUN_INT),
    TUN(state_period_ticks, TUN_INT),
    TUN(cost_period_ticks, TUN_INT),
    TUN(audit_period_ticks, TUN_INT),
    TUN(peer_timeout_ticks, TUN_INT),
    TUN(probe_tries, TUN_INT),
    TUN(probe_timeout_min_ms, TUN_U64),
    TUN(rto_initial_ms, TUN_U64),
    TUN(offer_flush_ms, TUN_U64),
    TUN(rebuild_ticks, TUN_INT),
    TUN(probe_period_ticks, TUN_INT),
    TUN(live_ticks, TUN_INT),
    TUN(tombstone_ticks, TUN_INT),
    TUN(stable_ticks, TUN_INT),
    TUN(dangling_weight, TUN_DOUBLE),
    TUN(min_gain, TUN_DOUBLE),
    TUN(chain_requests, TUN_BOOL),
    TUN(reroute, TUN_BOOL),
    TUN(objective, TUN_OBJECTIVE),
    TUN(max_norm, TUN_DOUBLE),
};
#undef TUN

int flow_tunables_set(flow_tunables *t, const char *name, const char *value) {
  for (size_t i = 0; i < sizeof(tun_fields) / sizeof(tun_fields[0]); i++) {
    const tun_field *tf = &tun_fields[i];
    if (strcmp(tf->name, name) != 0) continue;
    void *at = (char *)t + tf->offset;
    char *end = NULL;
    errno = 0;
    switch (tf->type) {
    case TUN_U64: {
      unsigned long long v = strtoull(value, &end, 10);
      if (errno || end == value || *end || value[0] == '-') return GW_EINVAL;
      *(uint64_t *)at = v;
      return 0;
    }
    case TUN_INT: {
      long v = strtol(value, &end, 10);
      if (errno || end == value || *end || v < INT32_MIN || v > INT32_MAX) return GW_EINVAL;
      *(int *)at = (int)v;
      return 0;
    }
    case TUN_DOUBLE: {
      double v = strtod(value, &end);
      if (end == value || *end || !isfinite(v)) return GW_EINVAL;
      *(double *)at = v;
      return 0;
    }
    case TUN_BOOL:
      if (!strcmp(value, "true") || !strcmp(value, "1")) return (*(bool *)at = true), 0;
      if (!strcmp(value, "false") || !strcmp(value, "0")) return (*(bool *)at = false), 0;
      return GW_EINVAL;
    case TUN_OBJECTIVE:
      if (!strcmp(value, "max")) return (*(flow_objective *)at = FLOW_OBJ_MAX), 0;
      if (!strcmp(value, "sum")) return (*(flow_objective *)at = FLOW_OBJ_SUM), 0;
      return GW_EINVAL;
    }
  }
  return GW_ENOENT;
}

void flow_tunables_describe(const flow_tunables *t, char *buf, size_t len) {
  size_t used = 0;
  if (len) buf[0] = '\0';
  for (size_t i = 0; i < sizeof(tun_fields) / sizeof(tun_fields[0]) && used < len; i++) {
    const tun_field *tf = &tun_fields[i];
    const void *at = (const char *)t + tf->offset;
    int n = 0;
    switch (tf->type) {
    case TUN_U64:
      n = snprintf(buf + used, len - used, "%s=%llu\n", tf->name, (unsigned long long)*(const uint64_t *)at);
      break;
    case TUN_INT: n = snprintf(buf + used, len - used, "%s=%d\n", tf->name, *(const int *)at); break;
    case TUN_DOUBLE: n = snprintf(buf + used, len - used, "%s=%g\n", tf->name, *(const double *)at); break;
    case TUN_BOOL:
      n = snprintf(buf + used, len - used, "%s=%s\n", tf->name, *(const bool *)at ? "true" : "false");
      break;
    case TUN_OBJECTIVE:
      n = snprintf(buf + used, len - used, "%s=%s\n", tf->name,
                   *(const flow_objective *)at == FLOW_OBJ_SUM ? "sum" : "max");
      break;
    }
    if (n < 0) break;
    used += (size_t)n;
  }
}

void flow_config_default(flow_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->role = FLOW_RELAY;
  flow_tunables_default(&cfg->tun);
}

double flow_cost_eq1(double c_i, double c_j, double lat_ij, double lat_ji, double bw_ij, double bw_ji, double size) {
  if (c_i < 0 || c_j < 0 || lat_ij < 0 || lat_ji < 0 || bw_ij < 0 || bw_ji < 0 || size < 0) return NAN;
  double transfer = bw_ij + bw_ji > 0 ? 2.0 * size / (bw_ij + bw_ji) : (size > 0 ? INFINITY : 0);
  return (c_i + c_j) / 2 + (lat_ij + lat_ji) / 2 + transfer;
}

static bool tunables_ok(const flow_tunables *t) {
  return t->tick_ms > 0 && t->request_retry_ticks > 0 && t->inflow_timeout_ticks > 0 && t->pushback_timeout_ticks > 0 &&
         t->outflow_idle_ticks > 0 && t->reject_ignore_attempts >= 0 && t->temp_relay > 0 && t->temp_data > 0 &&
         t->cooling > 0 && t->cooling <= 1 && t->p_propose_unmet >= 0 && t->p_propose_unmet <= 1 &&
         t->p_propose_satisfied >= 0 && t->p_propose_satisfied <= 1 && t->offer_period_ticks > 0 &&
         t->state_period_ticks > 0 && t->cost_period_ticks > 0 && t->audit_period_ticks > 0 &&
         t->peer_timeout_ticks > t->audit_period_ticks && t->probe_tries >= 0 && t->probe_tries <= 16 &&
         t->probe_timeout_min_ms > 0 && t->rto_initial_ms > 0 && t->rebuild_ticks >= 0 &&
         t->probe_period_ticks > 0 && t->live_ticks > 0 &&
         t->tombstone_ticks > 0 && t->stable_ticks >= 0 && t->dangling_weight >= 0 && t->dangling_weight <= 1 &&
         t->max_norm >= 1 && t->max_norm <= 16 && t->min_gain >= 0 && t->min_gain < 1 &&
         (t->objective == FLOW_OBJ_MAX || t->objective == FLOW_OBJ_SUM);
}

int flow_new(const flow_config *cfg, flow **out) {
  *out = NULL;
  if (cfg->n_stages < 1 || cfg->capacity < 0 || cfg->capacity > FLOW_MAX_CAPACITY || !cfg->io.send ||
      !cfg->io.want_tick || !cfg->io.random || !tunables_ok(&cfg->tun))
    return GW_EINVAL;
  if (cfg->role == FLOW_DATA ? cfg->stage != 0 : (cfg->stage < 1 || cfg->stage > cfg->n_stages)) return GW_EINVAL;
  flow *f = calloc(1, sizeof(*f));
  if (!f) return GW_ENOMEM;
  f->cfg = *cfg;
  f->tun = cfg->tun;
  f->next_stage = (cfg->stage + 1) % (cfg->n_stages + 1);
  f->prev_stage = (cfg->stage + cfg->n_stages) % (cfg->n_stages + 1);
  f->temperature = cfg->role == FLOW_DATA ? f->tun.temp_data : f->tun.temp_relay;
  f->n_units = cfg->role == FLOW_DATA ? 2 * cfg->capacity : cfg->capacity;
  f->units = calloc((size_t)f->n_units + 1, sizeof(*f->units));
  if (!f->units) {
    free(f);
    return GW_ENOMEM;
  }
  flow_clear_pending(f);
  if (cfg->role == FLOW_DATA) {
    /* Source slots 0..cap-1 exist from the start, unpaired ("data nodes start
     * with unpaired flows matching their capacity"); sink slots are used as
     * stage-S peers bind to them. */
    for (int i = 0; i < cfg->capacity; i++) {
      funit *u = &f->units[i];
      u->used = true;
      u->kind = UNIT_SOURCE;
      u->target = cfg->self;
      u->sent_cost = NAN;
    }
    for (int i = cfg->capacity; i < f->n_units; i++) f->units[i].kind = UNIT_SINK;
  }
  *out = f;
  return 0;
}

void flow_peer_clear_views(fpeer *p) {
  free(p->offers);
  free(p->units);
  free(p->next_costs);
  p->offers = NULL;
  p->units = NULL;
  p->next_costs = NULL;
  p->n_offers = p->n_units = p->n_next_costs = 0;
  p->spare = 0;
}

void flow_free(flow *f) {
  if (!f) return;
  for (int i = 0; i < f->n_peers; i++) flow_peer_clear_views(&f->peers[i]);
  for (int i = 0; i < f->n_units; i++) free(f->units[i].path);
  free(f->peers);
  free(f->units);
  free(f);
}

int flow_start(flow *f, uint64_t now_ms) {
  f->now = now_ms;
  f->phase = (uint32_t)(flow_random_u64(f) % 1024);
  f->last_change = now_ms;
  f->started = true;
  f->offer_dirty = f->state_dirty = true;
  f->cfg.io.want_tick(f->cfg.io.ud, now_ms);
  return 0;
}

/* ---- small helpers ---- */

uint64_t flow_random_u64(flow *f) {
  uint64_t x = 0;
  f->cfg.io.random(f->cfg.io.ud, &x, sizeof(x));
  return x;
}

double flow_random_uniform(flow *f) { return (double)(flow_random_u64(f) >> 11) * 0x1.0p-53; }

const char *flow_short(const gw_id *id, char *buf) {
  gw_id_to_short(id, buf);
  return buf;
}

int flow_peer_find(const flow *f, const gw_id *id) {
  for (int i = 0; i < f->n_peers; i++)
    if (f->peers[i].in_use && gw_id_eq(&f->peers[i].id, id)) return i;
  return -1;
}

bool flow_peer_is_next(const flow *f, int p) { return p >= 0 && f->peers[p].stage == f->next_stage; }
bool flow_peer_is_prev(const flow *f, int p) { return p >= 0 && f->peers[p].stage == f->prev_stage; }
bool flow_peer_is_same(const flow *f, int p) { return p >= 0 && f->peers[p].stage == f->cfg.stage; }

bool flow_peer_usable_next(const flow *f, int p) {
  return flow_peer_is_next(f, p) && f->peers[p].alive && f->peers[p].cost_next >= 0;
}

bool flow_peer_usable_prev(const flow *f, int p) {
  return flow_peer_is_prev(f, p) && f->peers[p].alive && f->peers[p].cost_prev >= 0;
}

static const char *const event_names[] = {"flow.established", "flow.changed", "flow.torn_down", "flow.deny",
                                          "flow.peer_dead"};

void flow_emit(flow *f, flow_event_kind kind, const funit *u, int peer) {
  flow_event ev = {.kind = kind, .cost = NAN};
  if (u) {
    ev.in_seg = u->has_in ? u->in_seg : 0;
    ev.out_seg = u->has_out ? u->out_seg : 0;
    ev.target = u->target;
    ev.cost = u->has_out || u->kind == UNIT_SINK ? flow_unit_cost(f, u) : NAN;
  }
  if (peer >= 0) ev.peer = f->peers[peer].id;
  /* Changes to complete flows are what "stable" waits out. */
  if (kind == FLOW_EV_PEER_DEAD || (u && (flow_unit_live(f, u) || u->kind == UNIT_SOURCE))) f->last_change = f->now;
  if (f->cfg.on_event) f->cfg.on_event(f->cfg.event_ud, &ev);
  if (!f->cfg.log || !gw_log_enabled(f->cfg.log, kind == FLOW_EV_DENY ? GW_LOG_WARN : GW_LOG_INFO)) return;
  char peer_s[GW_ID_SHORT_LEN + 1], target_s[GW_ID_SHORT_LEN + 1];
  flow_short(&ev.peer, peer_s);
  flow_short(&ev.target, target_s);
  gw_log_event(f->cfg.log, kind == FLOW_EV_DENY ? GW_LOG_WARN : GW_LOG_INFO, event_names[kind],
               "in=%016llx out=%016llx peer=%s target=%s cost=%.6g", (unsigned long long)ev.in_seg,
               (unsigned long long)ev.out_seg, peer_s, target_s, ev.cost);
}

/* ---- membership ---- */

int flow_add_peer(flow *f, const gw_id *id, int stage) {
  if (gw_id_eq(id, &f->cfg.self) || gw_id_is_zero(id) || stage < 0 || stage > f->cfg.n_stages) return GW_EINVAL;
  int p = flow_peer_find(f, id);
  if (p >= 0) {
    if (f->peers[p].stage != stage) {
      /* A peer that moved stage is a new neighbour: forget what it was. */
      flow_peer_teardown(f, p);
      flow_peer_clear_views(&f->peers[p]);
      f->peers[p].stage = stage;
      f->peers[p].cost_next = f->peers[p].cost_prev = -1;
    }
    f->peers[p].alive = true;
    f->peers[p].last_heard = f->now;
    return 0;
  }
  for (p = 0; p < f->n_peers && f->peers[p].in_use; p++) {
  }
  if (p == f->n_peers) {
    if (f->n_peers >= FLOW_MAX_PEERS) return GW_EFULL;
    if (f->n_peers == f->cap_peers) {
      int cap = f->cap_peers ? 2 * f->cap_peers : 16;
      fpeer *np = realloc(f->peers, (size_t)cap * sizeof(*np));
      if (!np) return GW_ENOMEM;
      f->peers = np;
      f->cap_peers = cap;
    }
    f->n_peers++;
  }
  fpeer *pe = &f->peers[p];
  memset(pe, 0, sizeof(*pe));
  pe->in_use = true;
  pe->id = *id;
  pe->stage = stage;
  pe->alive = true;
  pe->cost_next = pe->cost_prev = -1;
  pe->last_heard = f->now;
  f->offer_dirty = f->state_dirty = true;
  return 0;
}

int flow_set_cost(flow *f, const gw_id *id, flow_dir dir, double cost) {
  int p = flow_peer_find(f, id);
  if (p < 0) return GW_ENOENT;
  if (isnan(cost) || cost > 1e300) return GW_EINVAL;
  fpeer *pe = &f->peers[p];
  if (dir == FLOW_DIR_NEXT)
    pe->cost_next = cost < 0 ? -1 : cost;
  else
    pe->cost_prev = cost < 0 ? -1 : cost;
  /* A link that disappeared takes its segments with it; a cost that changed
   * changes the cost to sink of every unit sending over it. */
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (!un->used) continue;
    if (dir == FLOW_DIR_NEXT && un->has_out && un->out_peer == p) {
      if (cost < 0) {
        flow_send_cancel(f, p, un->out_seg);
        flow_drop_out(f, u);
      } else {
        flow_push_cost(f, u, false);
      }
    } else if (dir == FLOW_DIR_PREV && cost < 0 && un->has_in && un->in_peer == p) {
      flow_send_deny(f, p, un->in_seg, false);
      flow_drop_in(f, u);
    }
  }
  f->state_dirty = true;
  return 0;
}

/* Flows were lost: they are rebuilt back from the sink, a stage per offer,
 * so for a while offers go out as they change, not at the next tick. */
void flow_rebuild(flow *f) { f->rebuild_until = f->now + (uint64_t)f->tun.rebuild_ticks * f->tun.tick_ms; }

void flow_peer_down(flow *f, int p, bool forget) {
  if (f->pend.kind != REQ_NONE &&
      (f->pend.peer == p || f->pend.my_next == p || f->pend.your_next == p || f->pend.prev == p || f->pend.next == p))
    flow_clear_pending(f);
  flow_peer_teardown(f, p);
  flow_peer_clear_views(&f->peers[p]);
  f->peers[p].alive = false;
  f->peers[p].suspect_since = 0; /* a revived peer starts with a clean slate */
  f->peers[p].probes_sent = 0;
  flow_rebuild(f);
  flow_emit(f, FLOW_EV_PEER_DEAD, NULL, p);
  if (forget) f->peers[p].in_use = false;
}

int flow_remove_peer(flow *f, const gw_id *id, uint64_t now_ms) {
  int p = flow_peer_find(f, id);
  if (p < 0) return GW_ENOENT;
  f->now = now_ms;
  flow_peer_down(f, p, true);
  return 0;
}

int flow_peer_failed(flow *f, const gw_id *id, uint64_t now_ms) {
  int p = flow_peer_find(f, id);
  if (p < 0) return GW_ENOENT;
  if (now_ms > f->now) f->now = now_ms;
  if (!f->peers[p].alive) return 0;
  flow_peer_down(f, p, false);
  /* What it held is rebuilt now: requests for the units that lost their
   * next hop, and our changed offers upstream (flushed shortly). */
  if (f->tun.chain_requests && f->started) flow_try_request(f);
  flow_arm(f);
  return 0;
}

int flow_peer_denied(flow *f, const gw_id *id, uint64_t now_ms) {
  int p = flow_peer_find(f, id);
  if (p < 0) return GW_ENOENT;
  f->now = now_ms;
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (un->used && un->has_out && un->out_peer == p) {
      flow_send_cancel(f, p, un->out_seg);
      flow_emit(f, FLOW_EV_DENY, un, p);
      flow_drop_out(f, u);
    }
  }
  f->peers[p].denied = true;
  return 0;
}

/* ---- driver entry point ---- */

int flow_on_message(flow *f, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms) {
  if (now_ms > f->now) f->now = now_ms;
  if (!from || len > FLOW_MAX_MESSAGE) return GW_EPROTO;
  int p = flow_peer_find(f, &from->id);
  char who[GW_ID_SHORT_LEN + 1];
  if (p < 0) {
    /* Only peers the directory told us about take part; anything else is
     * noise (or a peer we have not learnt of yet, which will retry). */
    GW_DEBUG(f->cfg.log, "flow.unknown_peer", "peer=%s", flow_short(&from->id, who));
    return GW_ENOENT;
  }
  Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, len, buf);
  if (!m) {
    GW_WARN(f->cfg.log, "flow.bad_message", "peer=%s len=%zu reason=undecodable", flow_short(&from->id, who), len);
    return GW_EPROTO;
  }
  if (!f->peers[p].alive) {
    f->peers[p].alive = true; /* heard from again: no longer presumed dead */
    f->offer_dirty = f->state_dirty = true;
  }
  f->peers[p].last_heard = f->now;
  flow_live_heard(f, p);
  flow_handle(f, p, m);
  gwtf__flow_message__free_unpacked(m, NULL);
  /* A message may have made a request possible (a standby path was taken,
   * a next hop was lost, a grant arrived): ask now rather than next tick. */
  if (f->tun.chain_requests && f->started) flow_try_request(f);
  flow_arm(f); /* a request to watch, offers to flush */
  return 0;
}

/* ---- queries ---- */

int flow_next_hop(const flow *f, const gw_id *from, uint64_t in_seg, gw_id *next, uint64_t *out_seg) {
  int p = flow_peer_find(f, from);
  int u = p < 0 ? -1 : flow_find_in(f, p, in_seg);
  if (u < 0) return GW_ENOENT;
  if (!f->units[u].has_out) return GW_EAGAIN;
  *next = f->peers[f->units[u].out_peer].id;
  *out_seg = f->units[u].out_seg;
  return 0;
}

int flow_route(flow *f, const gw_id *target, const gw_id *from, gw_id *next, uint64_t *out_seg) {
  int p = flow_peer_find(f, from);
  if (p < 0) return GW_ENOENT;
  for (int k = 0; k < f->n_units; k++) {
    int u = (f->rr_route + 1 + k) % (f->n_units ? f->n_units : 1);
    const funit *un = &f->units[u];
    if (un->used && un->has_in && un->has_out && un->in_peer == p && gw_id_eq(&un->target, target)) {
      f->rr_route = u;
      *next = f->peers[un->out_peer].id;
      *out_seg = un->out_seg;
      return 0;
    }
  }
  return GW_EAGAIN;
}

size_t flow_data_flows(const flow *f, flow_path_info *out, size_t max) {
  size_t n = 0;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || un->kind != UNIT_SOURCE || !un->has_out) continue;
    if (n < max) {
      flow_path_info *pi = &out[n];
      memset(pi, 0, sizeof(*pi));
      pi->seg = un->out_seg;
      pi->first_hop = f->peers[un->out_peer].id;
      pi->cost = flow_unit_cost(f, un);
      pi->path_len = un->path_len;
      for (int i = 0; i < un->path_len; i++) pi->path[i] = un->path[i];
      pi->probed_cost = un->probed_cost;
    }
    n++;
  }
  return n;
}

int flow_pick_first_hop(flow *f, gw_id *next, uint64_t *seg) {
  for (int k = 0; k < f->n_units; k++) {
    int u = (f->rr_first + 1 + k) % (f->n_units ? f->n_units : 1);
    const funit *un = &f->units[u];
    if (un->used && un->kind == UNIT_SOURCE && un->has_out && flow_cost_ok(flow_unit_cost(f, un))) {
      f->rr_first = u;
      *next = f->peers[un->out_peer].id;
      *seg = un->out_seg;
      return 0;
    }
  }
  return GW_EAGAIN;
}

void flow_get_counts(const flow *f, flow_counts *c) {
  memset(c, 0, sizeof(*c));
  c->capacity = f->cfg.capacity;
  c->temperature = f->temperature;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used) continue;
    c->inflow += un->has_in;
    c->outflow += un->has_out;
    c->live += flow_unit_live(f, un);
    switch (un->kind) {
    case UNIT_RELAY:
      c->units++;
      c->paired += un->has_in && un->has_out;
      c->unpaired_in += un->has_in && !un->has_out;
      c->unpaired_out += un->has_out && !un->has_in;
      break;
    case UNIT_SOURCE:
      c->units += un->has_out;
      c->unpaired_in += !un->has_out;
      break;
    case UNIT_SINK: c->unpaired_out++; break;
    }
  }
  for (int p = 0; p < f->n_peers; p++) c->peers_alive += f->peers[p].in_use && f->peers[p].alive;
}

bool flow_is_stable(const flow *f, uint64_t now_ms) {
  if (f->pend.kind == REQ_FLOW) return false;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->kind == UNIT_RELAY && un->has_in && !un->has_out) return false;
  }
  return now_ms >= f->last_change + (uint64_t)f->tun.stable_ticks * f->tun.tick_ms;
}

size_t flow_units(const flow *f, flow_unit_view *out, size_t max) {
  size_t n = 0;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || (un->kind == UNIT_SINK && !un->has_in)) continue;
    if (n < max) {
      flow_unit_view *v = &out[n];
      memset(v, 0, sizeof(*v));
      v->target = un->target;
      v->has_in = un->has_in;
      v->has_out = un->has_out;
      v->live = flow_unit_live(f, un);
      if (un->has_in) v->prev = f->peers[un->in_peer].id, v->in_seg = un->in_seg;
      if (un->has_out) v->next = f->peers[un->out_peer].id, v->out_seg = un->out_seg;
      v->cost = un->has_out || un->kind == UNIT_SINK ? flow_unit_cost(f, un) : INFINITY;
      v->is_source = un->kind == UNIT_SOURCE;
      v->is_sink = un->kind == UNIT_SINK;
    }
    n++;
  }
  return n;
}

const gw_id *flow_self(const flow *f) { return &f->cfg.self; }
int flow_stage(const flow *f) { return f->cfg.stage; }

/* ---- invariants ---- */


static int check_unit(const flow *f, int u, char *err, size_t err_len) {
  const funit *un = &f->units[u];
  if (un->has_in && (un->in_peer < 0 || un->in_peer >= f->n_peers || !f->peers[un->in_peer].in_use ||
                     !flow_peer_is_prev(f, un->in_peer)))
    return flow_error(err, err_len, GW_EINVAL, "unit %d: inflow from a peer that is not a previous-stage peer", u);
  if (un->has_out && (un->out_peer < 0 || un->out_peer >= f->n_peers || !f->peers[un->out_peer].in_use ||
                      !flow_peer_is_next(f, un->out_peer)))
    return flow_error(err, err_len, GW_EINVAL, "unit %d: outflow to a peer that is not a next-stage peer", u);
  if (gw_id_is_zero(&un->target)) return flow_error(err, err_len, GW_EINVAL, "unit %d: no target", u);
  switch (un->kind) {
  case UNIT_RELAY:
    if (!un->has_in && !un->has_out) return flow_error(err, err_len, GW_EINVAL, "unit %d: used but empty", u);
    break;
  case UNIT_SOURCE:
    if (un->has_in) return flow_error(err, err_len, GW_EINVAL, "source slot %d has an inflow", u);
    if (!gw_id_eq(&un->target, &f->cfg.self)) return flow_error(err, err_len, GW_EINVAL, "source slot %d targets another node", u);
    break;
  case UNIT_SINK:
    if (un->has_out || !un->has_in) return flow_error(err, err_len, GW_EINVAL, "sink slot %d is not inflow-only", u);
    if (!gw_id_eq(&un->target, &f->cfg.self)) return flow_error(err, err_len, GW_EINVAL, "sink slot %d targets another node", u);
    break;
  }
  if (un->locked_txn && (f->pend.kind == REQ_NONE || f->pend.txn != un->locked_txn))
    return flow_error(err, err_len, GW_EINVAL, "unit %d is locked by a proposal that is not pending", u);
  for (int v = u + 1; v < f->n_units; v++) {
    const funit *w = &f->units[v];
    if (!w->used) continue;
    if (un->has_in && w->has_in && un->in_peer == w->in_peer && un->in_seg == w->in_seg)
      return flow_error(err, err_len, GW_EINVAL, "units %d and %d share inflow segment %016llx", u, v, (unsigned long long)un->in_seg);
    if (un->has_out && w->has_out && un->out_seg == w->out_seg)
      return flow_error(err, err_len, GW_EINVAL, "units %d and %d share outflow segment %016llx", u, v, (unsigned long long)un->out_seg);
  }
  return 0;
}

int flow_check_local(const flow *f, char *err, size_t err_len) {
  int used = 0;
  for (int u = 0; u < f->n_units; u++) {
    if (!f->units[u].used) continue;
    used += f->units[u].kind == UNIT_RELAY;
    int rc = check_unit(f, u, err, err_len);
    if (rc != 0) return rc;
  }
  if (used > f->cfg.capacity) return flow_error(err, err_len, GW_EINVAL, "%d units in use, capacity %d", used, f->cfg.capacity);
  if (f->pend.kind == REQ_NONE)
    for (int u = 0; u < f->n_units; u++)
      if (f->units[u].locked_txn) return flow_error(err, err_len, GW_EINVAL, "unit %d locked with nothing pending", u);
  /* A sink slot takes no outflow: a request for one could only be handed
   * back, and asked for again (the Request Flow storm of flow_unit_needs_out). */
  if (f->pend.kind == REQ_FLOW && f->pend.unit >= 0 && f->pend.unit < f->n_units &&
      f->units[f->pend.unit].kind == UNIT_SINK)
    return flow_error(err, err_len, GW_EINVAL, "pending flow request for sink slot %d", f->pend.unit);
  return 0;
}
