/* flow/flow_units.c — units, segments and costs: the bookkeeping that the
 * message handlers and the tick share. Nothing here decides anything; it
 * keeps each unit's shape and cost right and tells upstream when the cost
 * changed. */
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"

double flow_cost_combine(const flow_tunables *t, double link, double rest) {
  if (!isfinite(link) || !isfinite(rest)) return INFINITY; /* no path */
  if (t->objective == FLOW_OBJ_SUM) return link + rest;
  return pow(link, t->max_norm) + rest; /* the path's sum of d^p: additive, like sum */
}

double flow_combine(const flow *f, double link, double rest) { return flow_cost_combine(&f->tun, link, rest); }

double flow_unit_cost(const flow *f, const funit *u) {
  if (u->kind == UNIT_SINK) return 0; /* the flow has arrived */
  if (!u->has_out) return INFINITY;
  return flow_combine(f, f->peers[u->out_peer].cost_next, u->rest);
}

bool flow_unit_live(const flow *f, const funit *u) {
  if (u->kind == UNIT_SOURCE) return u->has_out;
  return u->used && u->live_until > f->now;
}

bool flow_unit_needs_out(const funit *u) {
  return u->used && !u->has_out && (u->kind == UNIT_SOURCE || (u->kind == UNIT_RELAY && u->has_in));
}

int flow_units_used(const flow *f) {
  int n = 0;
  for (int u = 0; u < f->n_units; u++) n += f->units[u].used && f->units[u].kind == UNIT_RELAY;
  return n;
}

bool flow_relay_stable(const flow *f) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->kind == UNIT_RELAY && un->has_in != un->has_out) return false;
  }
  return true;
}

int flow_unit_alloc(flow *f) {
  if (f->cfg.role != FLOW_RELAY) return -1;
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (un->used) continue;
    memset(un, 0, sizeof(*un));
    un->used = true;
    un->kind = UNIT_RELAY;
    un->sent_cost = NAN;
    un->unpaired_since = f->now;
    return u;
  }
  return -1;
}

int flow_find_in(const flow *f, int peer, uint64_t seg) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->has_in && un->in_peer == peer && un->in_seg == seg) return u;
  }
  return -1;
}

int flow_find_out(const flow *f, int peer, uint64_t seg) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->has_out && un->out_peer == peer && un->out_seg == seg) return u;
  }
  return -1;
}

int flow_find_out_seg(const flow *f, uint64_t seg) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->has_out && un->out_seg == seg) return u;
  }
  return -1;
}

static void unit_free(flow *f, int u) {
  funit *un = &f->units[u];
  free(un->path);
  un->path = NULL;
  un->path_len = 0;
  if (un->kind == UNIT_SOURCE) {
    /* Source slots never go away; they only lose their first hop. */
    un->has_out = false;
    un->unpaired_since = f->now;
    return;
  }
  unit_kind kind = un->kind;
  memset(un, 0, sizeof(*un));
  un->kind = kind;
}

void flow_bind_in(flow *f, int u, int peer, uint64_t seg) {
  funit *un = &f->units[u];
  if (un->kind == UNIT_SINK && !un->used) {
    un->used = true;
    un->sent_cost = NAN;
  }
  un->has_in = true;
  un->in_peer = peer;
  un->in_seg = seg;
  un->in_since = f->now;
  un->sent_cost = NAN; /* the new upstream end has not heard our cost */
  f->offer_dirty = f->state_dirty = true;
  if (un->has_out) flow_emit(f, FLOW_EV_ESTABLISHED, un, peer);
}

static void early_cost_take(flow *f, int u);

void flow_bind_out(flow *f, int u, int peer, uint64_t seg, double rest, uint64_t version) {
  funit *un = &f->units[u];
  bool was_out = un->has_out;
  un->has_out = true;
  un->out_peer = peer;
  un->out_seg = seg;
  un->out_since = f->now;
  un->rest = rest;
  un->rest_version = version;
  early_cost_take(f, u);
  un->pushed_back = false;
  if (!un->has_in) un->unpaired_since = f->now;
  f->offer_dirty = f->state_dirty = true;
  if (was_out)
    flow_emit(f, FLOW_EV_CHANGED, un, peer);
  else if (un->has_in || un->kind == UNIT_SOURCE)
    flow_emit(f, FLOW_EV_ESTABLISHED, un, peer);
  flow_push_cost(f, u, false);
}

void flow_drop_in(flow *f, int u) {
  funit *un = &f->units[u];
  if (!un->used || !un->has_in) return;
  if (un->has_out) flow_emit(f, FLOW_EV_TORN_DOWN, un, un->in_peer);
  un->has_in = false;
  un->live_until = 0;
  un->unpaired_since = f->now;
  f->offer_dirty = f->state_dirty = true;
  if (!un->has_out) unit_free(f, u);
}

void flow_drop_out(flow *f, int u) {
  funit *un = &f->units[u];
  if (!un->used || !un->has_out) return;
  if (un->has_in || un->kind == UNIT_SOURCE) flow_emit(f, FLOW_EV_TORN_DOWN, un, un->out_peer);
  un->has_out = false;
  un->live_until = 0;
  un->unpaired_since = f->now;
  un->pushed_back = false; /* on_deny and a dead next hop set it */
  free(un->path);
  un->path = NULL;
  un->path_len = 0;
  f->offer_dirty = f->state_dirty = true;
  if (!un->has_in && un->kind == UNIT_RELAY)
    unit_free(f, u);
  else
    flow_push_cost(f, u, false); /* the flows above us are broken until we find a next hop */
}

void flow_push_cost(flow *f, int u, bool force) {
  funit *un = &f->units[u];
  if (!un->used || !un->has_in) return;
  double c = flow_unit_cost(f, un); /* +inf: no path behind us, sent as "broken" */
  bool same = isinf(c) ? isinf(un->sent_cost) : fabs(c - un->sent_cost) <= FLOW_COST_EPS * (1 + fabs(c));
  if (!force && !isnan(un->sent_cost) && same) return;
  un->sent_cost = c;
  flow_send_cost(f, un->in_peer, un->in_seg, c);
}

void flow_tomb_add(flow *f, uint64_t seg, int peer) {
  tombstone *t = &f->tombs[f->tomb_next];
  f->tomb_next = (f->tomb_next + 1) % FLOW_TOMBSTONES;
  t->seg = seg;
  t->peer = f->peers[peer].id;
  t->until = f->now + (uint64_t)f->tun.tombstone_ticks * f->tun.tick_ms;
}

bool flow_tomb_has(const flow *f, uint64_t seg, int peer) {
  for (int i = 0; i < FLOW_TOMBSTONES; i++) {
    const tombstone *t = &f->tombs[i];
    if (t->until > f->now && t->seg == seg && gw_id_eq(&t->peer, &f->peers[peer].id)) return true;
  }
  return false;
}

void flow_peer_teardown(flow *f, int p) {
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (!un->used) continue;
    if (un->has_in && un->in_peer == p) flow_drop_in(f, u);
    if (un->used && un->has_out && un->out_peer == p) {
      flow_drop_out(f, u);
      un->pushed_back = true;
    }
  }
}

int flow_sacrificable(const flow *f) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && un->kind == UNIT_RELAY && un->has_out && !un->has_in && !un->locked_txn && !flow_unit_live(f, un))
      return u;
  }
  return -1;
}

void flow_unit_release(flow *f, int u, bool deny_full) {
  funit *un = &f->units[u];
  if (!un->used) return;
  if (un->has_out) {
    flow_send_cancel(f, un->out_peer, un->out_seg);
    flow_drop_out(f, u);
  }
  if (un->used && un->has_in) {
    flow_send_deny(f, un->in_peer, un->in_seg, deny_full);
    if (deny_full) flow_emit(f, FLOW_EV_DENY, un, un->in_peer);
    flow_drop_in(f, u);
  }
}

void flow_unit_forget(flow *f, int u) {
  if (f->units[u].kind == UNIT_SOURCE) {
    f->units[u].has_out = false;
    f->units[u].unpaired_since = f->now;
  } else {
    unit_free(f, u);
  }
  f->offer_dirty = f->state_dirty = true;
}

void flow_set_rest(flow *f, int u, double rest, uint64_t version) {
  funit *un = &f->units[u];
  if (version <= un->rest_version) return; /* overtaken by a newer one */
  un->rest = rest;
  un->rest_version = version;
  f->state_dirty = true;
  if (!un->has_in) f->offer_dirty = true;
  flow_push_cost(f, u, false);
}

void flow_early_cost_add(flow *f, int peer, uint64_t seg, double cost, uint64_t version) {
  early_cost *e = &f->early[f->early_next];
  f->early_next = (f->early_next + 1) % FLOW_EARLY_COSTS;
  *e = (early_cost){f->peers[peer].id, seg, cost, version, f->now + (uint64_t)f->tun.tombstone_ticks * f->tun.tick_ms};
}

/* Cost updates that overtook the message binding this outflow: the newest
 * one wins over what the binding carried. */
static void early_cost_take(flow *f, int u) {
  funit *un = &f->units[u];
  for (int i = 0; i < FLOW_EARLY_COSTS; i++) {
    early_cost *e = &f->early[i];
    if (e->until <= f->now || e->seg != un->out_seg || !gw_id_eq(&e->peer, &f->peers[un->out_peer].id)) continue;
    if (e->version > un->rest_version) {
      un->rest = e->cost;
      un->rest_version = e->version;
    }
    e->until = 0;
  }
}

void flow_handover_add(flow *f, uint64_t seg, bool up_end, int to) {
  handover *h = &f->handovers[f->handover_next];
  f->handover_next = (f->handover_next + 1) % FLOW_HANDOVERS;
  *h = (handover){seg, up_end, f->peers[to].id, f->now + (uint64_t)f->tun.tombstone_ticks * f->tun.tick_ms};
}

/* Newest first: an end can go back and forth (we hand it to b, b hands it
 * back, we hand it to c), and only the last handover says who has it now. */
int flow_handover_find(const flow *f, uint64_t seg, bool up_end) {
  for (int k = 1; k <= FLOW_HANDOVERS; k++) {
    const handover *h = &f->handovers[(f->handover_next - k + FLOW_HANDOVERS) % FLOW_HANDOVERS];
    if (h->until > f->now && h->seg == seg && h->up_end == up_end) return flow_peer_find(f, &h->to);
  }
  return -1;
}
