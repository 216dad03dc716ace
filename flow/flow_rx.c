/* flow/flow_rx.c — what each FlowMessage does.
 *
 * Ownership rule behind every handler: the upstream end owns a segment. A
 * node that learns of a segment it cannot keep tells the party that would
 * otherwise believe in it (cancel downstream, deny upstream), and remembers
 * ids it could not match (tombstones) so that a late notify-switch cannot
 * bring them back. Every message is validated before it touches state. */
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"

static void bad_message(flow *f, int p, const char *reason) {
  char who[GW_ID_SHORT_LEN + 1];
  GW_WARN(f->cfg.log, "flow.bad_message", "peer=%s reason=%s", flow_short(&f->peers[p].id, who), reason);
}

/* A peer id from the wire, resolved to a known peer (or -1). */
static int peer_of(const flow *f, const ProtobufCBinaryData *b) {
  gw_id id;
  if (!flow_id_from_bytes(b, &id)) return -1;
  return flow_peer_find(f, &id);
}

/* ---- offers ---- */

static void on_offer(flow *f, int p, const Gwtf__FlowOffer *o) {
  if (!flow_peer_is_next(f, p)) return;
  if (o->n_entries > FLOW_MAX_OFFER_ENTRIES) {
    bad_message(f, p, "offer_too_long");
    return;
  }
  foffer *entries = calloc(o->n_entries + 1, sizeof(*entries));
  if (!entries) return;
  int n = 0;
  for (size_t i = 0; i < o->n_entries; i++) {
    const Gwtf__FlowOfferEntry *e = o->entries[i];
    if (!flow_id_from_bytes(&e->target, &entries[n].target) || !flow_cost_ok(e->cost)) {
      free(entries);
      bad_message(f, p, "offer_entry");
      return;
    }
    if (e->count == 0) continue;
    entries[n].count = e->count;
    entries[n].cost = e->cost;
    n++;
  }
  fpeer *pe = &f->peers[p];
  free(pe->offers);
  pe->offers = entries;
  pe->n_offers = n;
  pe->spare = o->spare;
  if (o->spare > 0) pe->denied = false;
}

/* The reply to a request is also the freshest offer for its target. */
static void update_offer(flow *f, int p, const gw_id *target, uint32_t count, double cost, uint32_t spare) {
  fpeer *pe = &f->peers[p];
  pe->spare = spare;
  if (spare > 0) pe->denied = false;
  for (int i = 0; i < pe->n_offers; i++) {
    if (!gw_id_eq(&pe->offers[i].target, target)) continue;
    if (count == 0) {
      pe->offers[i] = pe->offers[--pe->n_offers];
    } else {
      pe->offers[i].count = count;
      pe->offers[i].cost = cost;
    }
    return;
  }
  if (count == 0) return;
  foffer *grown = realloc(pe->offers, ((size_t)pe->n_offers + 1) * sizeof(*grown));
  if (!grown) return;
  pe->offers = grown;
  pe->offers[pe->n_offers++] = (foffer){*target, count, cost};
}

/* ---- Request Flow ---- */

static int best_dangling(const flow *f, const gw_id *target) {
  int best = -1;
  double best_cost = INFINITY;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || un->kind != UNIT_RELAY || !un->has_out || un->has_in || un->locked_txn) continue;
    if (!gw_id_eq(&un->target, target) || !f->peers[un->out_peer].alive) continue;
    double c = flow_unit_cost(f, un);
    if (c < best_cost) best_cost = c, best = u;
  }
  return best;
}

static int free_sink(const flow *f) {
  for (int u = 0; u < f->n_units; u++)
    if (f->units[u].kind == UNIT_SINK && !f->units[u].used) return u;
  return -1;
}

static void on_request(flow *f, int p, const Gwtf__FlowRequest *r) {
  gw_id target;
  if (!flow_id_from_bytes(&r->target, &target) || !flow_cost_ok(r->cost) || r->seg == 0) {
    bad_message(f, p, "request");
    return;
  }
  int u = flow_find_in(f, p, r->seg);
  if (u >= 0) { /* a resent request we already granted */
    flow_send_reply(f, p, r->seg, &target, true, flow_unit_cost(f, &f->units[u]));
    return;
  }
  if (!flow_peer_usable_prev(f, p) || flow_tomb_has(f, r->seg, p)) {
    flow_send_reply(f, p, r->seg, &target, false, 0);
    return;
  }
  if (f->cfg.role == FLOW_DATA) {
    u = gw_id_eq(&target, &f->cfg.self) ? free_sink(f) : -1;
    if (u >= 0) f->units[u].target = target;
  } else {
    u = best_dangling(f, &target);
    /* "If it does have unpaired outflow to that data node at that cost, it
     * approves it"; a cheaper one is approved too. */
    if (u >= 0 && flow_unit_cost(f, &f->units[u]) > r->cost + FLOW_COST_EPS * (1 + r->cost)) u = -1;
  }
  if (u < 0) {
    flow_send_reply(f, p, r->seg, &target, false, 0);
    return;
  }
  flow_bind_in(f, u, p, r->seg);
  double c = flow_unit_cost(f, &f->units[u]);
  f->units[u].sent_cost = c;
  flow_send_reply(f, p, r->seg, &target, true, c);
}

/* The unit a granted request is for: the one that asked, if it still needs
 * an outflow, else any unit that does, else a new one when there is room. */
static int unit_for_grant(flow *f, const pending *pd, const gw_id *target) {
  if (pd->unit >= 0 && pd->unit < f->n_units) {
    const funit *un = &f->units[pd->unit];
    if (flow_unit_needs_out(un) && !un->locked_txn && gw_id_eq(&un->target, target)) return pd->unit;
  }
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (flow_unit_needs_out(un) && !un->locked_txn && gw_id_eq(&un->target, target)) return u;
  }
  if (pd->unit >= 0) return -1; /* it asked for a unit that no longer needs it */
  int u = flow_unit_alloc(f);
  if (u >= 0) f->units[u].target = *target;
  return u;
}

/* Hands back a grant that answered our pending request but that we cannot
 * use. Its sender's offer for that target goes too, until the sender offers
 * again (at its next tick: our cancel frees its unit): the reply refreshed
 * that offer, and with chain_requests we would otherwise ask for the same
 * unit at once, get it, hand it back, and so on at network speed. */
static void hand_back(flow *f, int p, uint64_t seg, const gw_id *target) {
  flow_send_cancel(f, p, seg);
  update_offer(f, p, target, 0, 0, f->peers[p].spare);
}

/* The unit swaps its next hop for the granted one; the old next hop keeps
 * its path as standby. */
static void reroute_granted(flow *f, const pending *pd, int p, const Gwtf__FlowReply *r) {
  funit *un = pd->unit >= 0 ? &f->units[pd->unit] : NULL;
  bool ok = un && un->used && un->has_out && un->out_peer != p && flow_peer_usable_next(f, p) &&
            !flow_tomb_has(f, r->seg, p) && gw_id_eq(&un->target, &pd->target);
  if (!ok) {
    hand_back(f, p, r->seg, &pd->target);
    return;
  }
  flow_send_cancel(f, un->out_peer, un->out_seg);
  flow_bind_out(f, pd->unit, p, r->seg, r->cost, r->version);
}

static void on_reply(flow *f, int p, const Gwtf__FlowReply *r) {
  gw_id target;
  if (!flow_id_from_bytes(&r->target, &target) || !flow_cost_ok(r->cost)) {
    bad_message(f, p, "reply");
    return;
  }
  if (!flow_peer_is_next(f, p)) return;
  update_offer(f, p, &target, r->count, r->cost, r->spare);
  bool ours = f->pend.kind == REQ_FLOW && f->pend.peer == p && f->pend.txn == r->seg;
  if (!ours) {
    /* A grant we no longer wait for (timed out, or a duplicate): keep it if
     * it is already ours, otherwise hand it back. */
    if (r->accept && flow_find_out(f, p, r->seg) < 0) flow_send_cancel(f, p, r->seg);
    return;
  }
  pending pd = f->pend;
  flow_clear_pending(f);
  if (r->accept && !gw_id_eq(&target, &pd.target)) {
    /* A grant must be for the target we asked for: one for another (a data
     * node we never asked to reach) would bind an outflow nobody needs. */
    bad_message(f, p, "reply-target");
    hand_back(f, p, r->seg, &pd.target);
    return;
  }
  if (r->accept && pd.reroute) {
    reroute_granted(f, &pd, p, r);
    return;
  }
  if (r->accept) {
    /* The link first: unit_for_grant may allocate a unit, which must not
     * stay behind empty when the grant is handed back. */
    bool usable = flow_peer_usable_next(f, p) && !flow_tomb_has(f, r->seg, p);
    int u = usable ? unit_for_grant(f, &pd, &target) : -1;
    if (u >= 0)
      flow_bind_out(f, u, p, r->seg, r->cost, r->version);
    else
      hand_back(f, p, r->seg, &pd.target);
  }
}

/* ---- teardown and costs ---- */

static void on_cancel(flow *f, int p, const Gwtf__FlowCancel *c) {
  int u = flow_find_in(f, p, c->seg);
  if (u >= 0)
    flow_drop_in(f, u);
  else
    flow_tomb_add(f, c->seg, p);
}

static void on_deny(flow *f, int p, const Gwtf__FlowDeny *d) {
  int u = flow_find_out(f, p, d->seg);
  if (d->full) f->peers[p].denied = true;
  if (u < 0) {
    flow_tomb_add(f, d->seg, p);
    return;
  }
  if (d->full) flow_emit(f, FLOW_EV_DENY, &f->units[u], p);
  flow_drop_out(f, u);
  f->units[u].pushed_back = true;
  flow_rebuild(f); /* a flow pushed back to us is rebuilt from here */
}

static void on_cost(flow *f, int p, const Gwtf__FlowCost *c) {
  if (!flow_cost_ok(c->cost)) {
    bad_message(f, p, "cost");
    return;
  }
  double cost = c->broken ? INFINITY : c->cost;
  if (c->broken) flow_rebuild(f); /* a path through us broke below */
  int u = flow_find_out(f, p, c->seg);
  if (u < 0) {
    /* It may have overtaken the message that gives us the segment. */
    flow_early_cost_add(f, p, c->seg, cost, c->version);
    return;
  }
  flow_set_rest(f, u, cost, c->version);
}

/* ---- notify-switch ---- */

static void hold_switch(flow *f, bool up, int from, uint64_t seg, const gw_id *old_end, const gw_id *new_end,
                        double cost, uint32_t forwarded) {
  pending *pd = &f->pend;
  held_switch h = {up, f->peers[from].id, seg, *old_end, *new_end, cost, forwarded};
  for (int i = 0; i < pd->n_held; i++)
    if (pd->held[i].up == up && pd->held[i].seg == seg) { /* a re-send: the newest word counts */
      pd->held[i] = h;
      return;
    }
  if (pd->n_held < (int)(sizeof(pd->held) / sizeof(pd->held[0]))) pd->held[pd->n_held++] = h;
}

/* A notify-switch for an end we no longer hold: when we handed it to a
 * same-stage peer moments ago (a change or redirect crossed this switch),
 * pass it on; when our own pending proposal is about to give it to us,
 * leave it unacknowledged so that its sender tries again. */
static bool switch_elsewhere(flow *f, bool up, uint64_t seg, const gw_id *old_end, const gw_id *new_end, double cost,
                             uint32_t forwarded, int sender) {
  int z = flow_handover_find(f, seg, !up);
  if (z >= 0 && forwarded < FLOW_MAX_FORWARDS) {
    flow_forward_switch(f, z, up, seg, old_end, new_end, cost, forwarded + 1);
    flow_send_switch_ack(f, sender, seg);
    return true;
  }
  const pending *pd = &f->pend;
  bool ours = up ? pd->kind == REQ_REDIRECT && pd->in_seg == seg
                 : (pd->kind == REQ_REDIRECT && pd->out_seg == seg) || (pd->kind == REQ_CHANGE && pd->your_seg == seg);
  if (ours) hold_switch(f, up, sender, seg, old_end, new_end, cost, forwarded);
  return ours;
}

static void on_switch_up(flow *f, int p, const Gwtf__FlowSwitchUp *s) {
  gw_id old_id, new_id;
  if (!flow_id_from_bytes(&s->old_up, &old_id) || !flow_id_from_bytes(&s->new_up, &new_id)) {
    bad_message(f, p, "switch_up");
    return;
  }
  int old_up = flow_peer_find(f, &old_id), new_up = flow_peer_find(f, &new_id);
  if (p != old_up && p != new_up && !(s->forwarded && flow_peer_is_same(f, p))) {
    bad_message(f, p, "switch_up_sender");
    return;
  }
  if (new_up >= 0 && flow_find_in(f, new_up, s->seg) >= 0) { /* a re-send we already applied */
    flow_send_switch_ack(f, p, s->seg);
    return;
  }
  int u = old_up >= 0 ? flow_find_in(f, old_up, s->seg) : -1;
  if (u < 0 && switch_elsewhere(f, true, s->seg, &old_id, &new_id, 0, s->forwarded, p)) return;
  flow_send_switch_ack(f, p, s->seg);
  if (u >= 0 && new_up >= 0 && flow_peer_usable_prev(f, new_up) && !flow_tomb_has(f, s->seg, new_up)) {
    funit *un = &f->units[u];
    un->in_peer = new_up;
    un->in_since = f->now;
    f->state_dirty = true;
    flow_emit(f, FLOW_EV_CHANGED, un, new_up);
    flow_push_cost(f, u, true); /* the new upstream end needs our cost */
    return;
  }
  if (u >= 0) flow_drop_in(f, u);
  if (new_up >= 0) flow_send_deny(f, new_up, s->seg, false);
}

static void on_switch_down(flow *f, int p, const Gwtf__FlowSwitchDown *s) {
  gw_id old_id, new_id;
  if (!flow_id_from_bytes(&s->old_down, &old_id) || !flow_id_from_bytes(&s->new_down, &new_id) ||
      !flow_cost_ok(s->cost)) {
    bad_message(f, p, "switch_down");
    return;
  }
  int old_down = flow_peer_find(f, &old_id), new_down = flow_peer_find(f, &new_id);
  if (p != old_down && !(s->forwarded && flow_peer_is_same(f, p))) {
    bad_message(f, p, "switch_down_sender");
    return;
  }
  if (new_down >= 0 && flow_find_out(f, new_down, s->seg) >= 0) { /* already applied */
    flow_send_switch_ack(f, p, s->seg);
    return;
  }
  int u = old_down >= 0 ? flow_find_out(f, old_down, s->seg) : -1;
  if (u < 0 && switch_elsewhere(f, false, s->seg, &old_id, &new_id, s->cost, s->forwarded, p)) return;
  flow_send_switch_ack(f, p, s->seg);
  if (u >= 0 && new_down >= 0 && flow_peer_usable_next(f, new_down) && !flow_tomb_has(f, s->seg, new_down)) {
    flow_bind_out(f, u, new_down, s->seg, s->cost, 0); /* x's estimate; y's own cost follows */
    return;
  }
  if (u >= 0) flow_drop_out(f, u);
  if (new_down >= 0) flow_send_cancel(f, new_down, s->seg);
}

/* Replays the notify-switches held while our proposal was pending, now that
 * its accept has given us their segments (see pending.held). */
static void apply_held(flow *f, const held_switch *held, int n) {
  for (int i = 0; i < n; i++) {
    const held_switch *h = &held[i];
    int from = flow_peer_find(f, &h->from);
    if (from < 0) continue; /* gone: nothing to apply or acknowledge */
    if (h->up) {
      Gwtf__FlowSwitchUp m = GWTF__FLOW_SWITCH_UP__INIT;
      m.seg = h->seg;
      m.old_up = flow_id_bytes(&h->old_end);
      m.new_up = flow_id_bytes(&h->new_end);
      m.forwarded = h->forwarded;
      on_switch_up(f, from, &m);
    } else {
      Gwtf__FlowSwitchDown m = GWTF__FLOW_SWITCH_DOWN__INIT;
      m.seg = h->seg;
      m.old_down = flow_id_bytes(&h->old_end);
      m.new_down = flow_id_bytes(&h->new_end);
      m.cost = h->cost;
      m.forwarded = h->forwarded;
      on_switch_down(f, from, &m);
    }
  }
}

/* ---- same-stage state ---- */

static bool parse_unit(const Gwtf__FlowUnitInfo *i, punit *out) {
  memset(out, 0, sizeof(*out));
  if (!flow_id_from_bytes(&i->target, &out->target)) return false;
  out->has_in = i->prev.len > 0;
  out->has_out = i->next.len > 0;
  out->live = i->live;
  if (out->has_in && (!flow_id_from_bytes(&i->prev, &out->prev) || !flow_cost_ok(i->in_link))) return false;
  if (out->has_out &&
      (!flow_id_from_bytes(&i->next, &out->next) || !flow_cost_ok(i->out_link) || !flow_cost_ok(i->rest)))
    return false;
  out->in_seg = i->in_seg;
  out->out_seg = i->out_seg;
  out->in_link = i->in_link;
  out->out_link = i->out_link;
  out->rest = i->rest;
  return true;
}

static void on_state(flow *f, int p, const Gwtf__FlowState *st) {
  if (!flow_peer_is_same(f, p)) return;
  if (st->n_units > FLOW_MAX_STATE_UNITS || st->n_next_costs > FLOW_MAX_STATE_LINKS) {
    bad_message(f, p, "state_too_long");
    return;
  }
  punit *units = calloc(st->n_units + 1, sizeof(*units));
  plink *links = calloc(st->n_next_costs + 1, sizeof(*links));
  bool ok = units && links;
  for (size_t i = 0; ok && i < st->n_units; i++) ok = parse_unit(st->units[i], &units[i]);
  for (size_t i = 0; ok && i < st->n_next_costs; i++) {
    links[i].cost = st->next_costs[i]->cost;
    ok = flow_id_from_bytes(&st->next_costs[i]->peer, &links[i].peer) && flow_cost_ok(links[i].cost);
  }
  if (!ok) {
    free(units);
    free(links);
    if (units && links) bad_message(f, p, "state");
    return;
  }
  fpeer *pe = &f->peers[p];
  free(pe->units);
  free(pe->next_costs);
  pe->units = units;
  pe->n_units = (int)st->n_units;
  pe->next_costs = links;
  pe->n_next_costs = (int)st->n_next_costs;
}

/* ---- answers to proposals ---- */

/* A proposal we answered already (its sender re-sends until it hears back):
 * the same answer again, without deciding twice. */
static const cached_reply *cached(const flow *f, int p, uint64_t txn) {
  for (int i = 0; i < FLOW_REPLY_CACHE; i++) {
    const cached_reply *c = &f->replies[i];
    if (c->txn == txn && txn != 0 && gw_id_eq(&c->peer, &f->peers[p].id)) return c;
  }
  return NULL;
}

static void remember(flow *f, int p, uint64_t txn, bool accept, double rest) {
  f->replies[f->reply_next] = (cached_reply){f->peers[p].id, txn, accept, rest};
  f->reply_next = (f->reply_next + 1) % FLOW_REPLY_CACHE;
}

/* ---- Request Change ---- */

static void reply_change(flow *f, int p, const Gwtf__FlowProposeChange *pc, bool accept, double rest) {
  Gwtf__FlowChangeReply r = GWTF__FLOW_CHANGE_REPLY__INIT;
  r.txn = pc->txn;
  r.accept = accept;
  r.my_seg = pc->my_seg;
  r.my_next = pc->my_next;
  r.your_seg = pc->your_seg;
  r.your_next = pc->your_next;
  r.target = pc->target;
  r.rest = rest;
  if (!cached(f, p, pc->txn)) remember(f, p, pc->txn, accept, rest);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY;
  m.change_reply = &r;
  flow_send(f, p, &m);
}

/* We are c: the proposer a sends my_seg to b; our unit sends your_seg to e.
 * After the swap a sends to e and we send to b. */
static void on_propose_change(flow *f, int a, const Gwtf__FlowProposeChange *pc) {
  gw_id target;
  if (!flow_id_from_bytes(&pc->target, &target) || !flow_cost_ok(pc->my_link) || !flow_cost_ok(pc->my_new_link) ||
      !flow_cost_ok(pc->my_rest)) {
    bad_message(f, a, "propose_change");
    return;
  }
  const cached_reply *again = cached(f, a, pc->txn);
  if (again) {
    reply_change(f, a, pc, again->accept, again->rest);
    return;
  }
  int b = peer_of(f, &pc->my_next), e = peer_of(f, &pc->your_next);
  int u = e >= 0 ? flow_find_out(f, e, pc->your_seg) : -1;
  bool busy = f->pend.kind == REQ_CHANGE || f->pend.kind == REQ_REDIRECT;
  if (busy || !flow_peer_is_same(f, a) || u < 0 || b == e || !flow_peer_usable_next(f, b) ||
      f->units[u].kind != UNIT_RELAY || f->units[u].locked_txn || !gw_id_eq(&f->units[u].target, &target) ||
      !flow_cost_ok(f->units[u].rest)) {
    reply_change(f, a, pc, false, 0);
    return;
  }
  funit *un = &f->units[u];
  double w_a = pc->my_live ? 1 : f->tun.dangling_weight;
  double w_c = flow_unit_live(f, un) ? 1 : f->tun.dangling_weight;
  double delta = flow_change_delta(f, pc->my_link, pc->my_new_link, pc->my_rest, f->peers[e].cost_next,
                                   f->peers[b].cost_next, un->rest, w_a, w_c);
  if (!flow_anneal_accept(f, delta)) {
    reply_change(f, a, pc, false, 0);
    return;
  }
  f->temperature *= f->tun.cooling;
  double rest_e = un->rest;
  reply_change(f, a, pc, true, rest_e);
  flow_handover_add(f, pc->your_seg, true, a);
  flow_send_switch_up(f, b, pc->my_seg, a, -1);
  flow_send_switch_up(f, e, pc->your_seg, -1, a);
  flow_bind_out(f, u, b, pc->my_seg, pc->my_rest, 0);
}

/* Takes over segment seg -> e that a peer handed to us, on unit u if given,
 * else on any unit that needs an outflow for target, else a new one. Hands
 * it back (cancel) when we cannot. */
static void adopt_out(flow *f, int u, int e, uint64_t seg, const gw_id *target, double rest) {
  if (e < 0 || flow_find_out(f, e, seg) >= 0) return; /* ours already: a segment has one sender */
  if (!flow_peer_usable_next(f, e) || flow_tomb_has(f, seg, e)) {
    flow_send_cancel(f, e, seg);
    return;
  }
  if (u < 0) {
    pending none = {.kind = REQ_NONE, .unit = -1};
    u = unit_for_grant(f, &none, target);
  }
  if (u < 0) {
    flow_send_cancel(f, e, seg);
    return;
  }
  flow_bind_out(f, u, e, seg, rest, 0);
}

/* Whether a reply of `kind` from p answers a proposal we made to p, pending
 * or given up on, and not answered yet. Each proposal is acted on once: a
 * second copy of a reply (p answers every re-send of a proposal from its
 * cache) or a reply to something we never proposed would bind a segment a
 * second time. */
static bool take_proposal(flow *f, int p, uint64_t txn, req_kind kind) {
  for (int i = 0; i < FLOW_PAST_PROPOSALS; i++) {
    past_proposal *pp = &f->past[i];
    if (pp->kind == kind && pp->txn == txn && gw_id_eq(&pp->peer, &f->peers[p].id)) {
      pp->kind = REQ_NONE;
      return true;
    }
  }
  return false;
}

/* We proposed to hand my_seg's upstream end to c, and a notify-switch from
 * its downstream end b moved our end to another next hop before c's accept
 * came (b redirected its unit to a same-stage peer): the switch reached us,
 * not c, which now holds my_seg -> b. Pass it on to c, as a crossing switch
 * is passed on after a handover. Returns the unit, or -1. */
static int pass_on_moved_end(flow *f, int c, int b, uint64_t seg) {
  int u = flow_find_out_seg(f, seg);
  if (u < 0 || f->units[u].out_peer == b) return u;
  const funit *un = &f->units[u];
  flow_forward_switch(f, c, false, seg, &f->peers[b].id, &f->peers[un->out_peer].id, un->rest, 1);
  return u;
}

/* We are a: c answered our proposal (or a proposal that already timed out). */
static void on_change_reply(flow *f, int c, const Gwtf__FlowChangeReply *r) {
  gw_id target;
  if (!flow_id_from_bytes(&r->target, &target) || !flow_cost_ok(r->rest)) {
    bad_message(f, c, "change_reply");
    return;
  }
  bool ours = f->pend.kind == REQ_CHANGE && f->pend.peer == c && f->pend.txn == r->txn;
  held_switch held[2];
  int n_held = ours ? f->pend.n_held : 0;
  memcpy(held, f->pend.held, sizeof(held));
  if (ours) flow_clear_pending(f);
  if (!take_proposal(f, c, r->txn, REQ_CHANGE)) return;
  if (!r->accept) {
    if (ours) f->peers[c].ignore = f->tun.reject_ignore_attempts;
    return;
  }
  if (ours) f->temperature *= f->tun.cooling;
  int b = peer_of(f, &r->my_next), e = peer_of(f, &r->your_next);
  flow_handover_add(f, r->my_seg, true, c);
  /* c now owns my_seg -> b; whatever we still hold of it goes, silently. */
  int u = b >= 0 ? flow_find_out(f, b, r->my_seg) : -1;
  if (u < 0 && b >= 0) u = pass_on_moved_end(f, c, b, r->my_seg);
  if (u >= 0 && (!flow_peer_usable_next(f, e) || flow_tomb_has(f, r->your_seg, e))) {
    flow_drop_out(f, u); /* locally only: b's end of my_seg belongs to c now */
    u = -1;
  }
  adopt_out(f, u, e, r->your_seg, &target, r->rest);
  apply_held(f, held, n_held);
}

/* ---- Request Redirect ---- */

static void reply_redirect(flow *f, int p, const Gwtf__FlowProposeRedirect *pr, bool accept, double rest) {
  Gwtf__FlowRedirectReply r = GWTF__FLOW_REDIRECT_REPLY__INIT;
  r.txn = pr->txn;
  r.accept = accept;
  r.in_seg = pr->in_seg;
  r.prev = pr->prev;
  r.out_seg = pr->out_seg;
  r.next = pr->next;
  r.target = pr->target;
  r.rest = rest;
  if (!cached(f, p, pr->txn)) remember(f, p, pr->txn, accept, rest);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REDIRECT_REPLY;
  m.redirect_reply = &r;
  flow_send(f, p, &m);
}

/* We are x: y offers to carry our unit prev -> x -> next instead of us. */
static void on_propose_redirect(flow *f, int y, const Gwtf__FlowProposeRedirect *pr) {
  gw_id target;
  if (!flow_id_from_bytes(&pr->target, &target) || !flow_cost_ok(pr->new_in_link) || !flow_cost_ok(pr->new_out_link)) {
    bad_message(f, y, "propose_redirect");
    return;
  }
  const cached_reply *again = cached(f, y, pr->txn);
  if (again) {
    reply_redirect(f, y, pr, again->accept, again->rest);
    return;
  }
  int prev = peer_of(f, &pr->prev), next = peer_of(f, &pr->next);
  int u = prev >= 0 ? flow_find_in(f, prev, pr->in_seg) : -1;
  bool busy = f->pend.kind == REQ_CHANGE || f->pend.kind == REQ_REDIRECT;
  if (busy || !flow_peer_is_same(f, y) || u < 0 || !f->units[u].has_out || f->units[u].out_peer != next ||
      f->units[u].out_seg != pr->out_seg || f->units[u].locked_txn || !gw_id_eq(&f->units[u].target, &target) ||
      !flow_cost_ok(f->units[u].rest)) {
    reply_redirect(f, y, pr, false, 0);
    return;
  }
  funit *un = &f->units[u];
  double w = flow_unit_live(f, un) ? 1 : f->tun.dangling_weight;
  double delta = flow_redirect_delta(f, f->peers[prev].cost_prev, f->peers[next].cost_next, pr->new_in_link,
                                     pr->new_out_link, un->rest, w);
  if (!flow_anneal_accept(f, delta)) {
    reply_redirect(f, y, pr, false, 0);
    return;
  }
  f->temperature *= f->tun.cooling;
  double rest = un->rest;
  reply_redirect(f, y, pr, true, rest);
  flow_handover_add(f, pr->in_seg, false, y);
  flow_handover_add(f, pr->out_seg, true, y);
  flow_send_switch_up(f, next, pr->out_seg, -1, y);
  flow_send_switch_down(f, prev, pr->in_seg, -1, y, flow_combine(f, pr->new_out_link, rest));
  flow_emit(f, FLOW_EV_CHANGED, un, y);
  flow_unit_forget(f, u);
}

/* We are y: x answered. On accept we now carry prev -> y -> next, or, when
 * we cannot, we cancel both ends that x pointed at us. */
static void on_redirect_reply(flow *f, int x, const Gwtf__FlowRedirectReply *r) {
  gw_id target;
  if (!flow_id_from_bytes(&r->target, &target) || !flow_cost_ok(r->rest)) {
    bad_message(f, x, "redirect_reply");
    return;
  }
  bool ours = f->pend.kind == REQ_REDIRECT && f->pend.peer == x && f->pend.txn == r->txn;
  held_switch held[2];
  int n_held = ours ? f->pend.n_held : 0;
  memcpy(held, f->pend.held, sizeof(held));
  if (ours) flow_clear_pending(f);
  if (!take_proposal(f, x, r->txn, REQ_REDIRECT)) return;
  if (!r->accept) {
    if (ours) f->peers[x].ignore = f->tun.reject_ignore_attempts;
    return;
  }
  if (ours) f->temperature *= f->tun.cooling;
  int prev = peer_of(f, &r->prev), next = peer_of(f, &r->next);
  bool can = flow_peer_usable_prev(f, prev) && flow_peer_usable_next(f, next) && !flow_tomb_has(f, r->in_seg, prev) &&
             !flow_tomb_has(f, r->out_seg, next) && flow_find_in(f, prev, r->in_seg) < 0;
  int u = can ? flow_unit_alloc(f) : -1;
  if (can && u < 0) {
    int s = flow_sacrificable(f);
    if (s >= 0) {
      flow_unit_release(f, s, false);
      u = flow_unit_alloc(f);
    }
  }
  if (u < 0) {
    if (next >= 0) flow_send_cancel(f, next, r->out_seg);
    if (prev >= 0) flow_send_deny(f, prev, r->in_seg, false);
    return;
  }
  f->units[u].target = target;
  flow_bind_in(f, u, prev, r->in_seg);
  flow_bind_out(f, u, next, r->out_seg, r->rest, 0); /* and tells prev our cost */
  apply_held(f, held, n_held);
}

/* ---- audit ---- */

static bool seg_in(const uint64_t *segs, size_t n, uint64_t seg) {
  for (size_t i = 0; i < n; i++)
    if (segs[i] == seg) return true;
  return false;
}

static void on_audit(flow *f, int p, const Gwtf__FlowAudit *a) {
  if (a->n_up_segs > FLOW_MAX_AUDIT_SEGS || a->n_down_segs > FLOW_MAX_AUDIT_SEGS) {
    bad_message(f, p, "audit_too_long");
    return;
  }
  flow_live_audit_in(f, p, a->ping, a->echo, a->echo_held_ms);
  /* Segments younger than a tick may still have their news in flight. */
  uint64_t grace = f->tun.tick_ms;
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (!un->used) continue;
    if (un->has_in && un->in_peer == p && un->in_since + grace <= f->now &&
        !seg_in(a->up_segs, a->n_up_segs, un->in_seg))
      flow_drop_in(f, u);
    if (un->used && un->has_out && un->out_peer == p && un->out_since + grace <= f->now &&
        !seg_in(a->down_segs, a->n_down_segs, un->out_seg))
      flow_drop_out(f, u);
  }
  if (a->reply) return;
  /* They list segments we do not have: our own list lets them drop those. */
  bool theirs_extra = false;
  for (size_t i = 0; i < a->n_up_segs && !theirs_extra; i++) theirs_extra = flow_find_in(f, p, a->up_segs[i]) < 0;
  for (size_t i = 0; i < a->n_down_segs && !theirs_extra; i++) theirs_extra = flow_find_out(f, p, a->down_segs[i]) < 0;
  if (theirs_extra) flow_send_audit(f, p, true);
}

/* ---- probes ---- */

static void on_probe(flow *f, int p, const Gwtf__FlowProbe *pr) {
  gw_id origin, path[FLOW_MAX_PATH];
  if (pr->n_path == 0 || pr->n_path >= FLOW_MAX_PATH || !flow_id_from_bytes(&pr->origin, &origin) ||
      !flow_cost_ok(pr->cost)) {
    bad_message(f, p, "probe");
    return;
  }
  for (size_t i = 0; i < pr->n_path; i++)
    if (!flow_id_from_bytes(&pr->path[i], &path[i])) {
      bad_message(f, p, "probe_path");
      return;
    }
  int u = flow_find_in(f, p, pr->seg);
  if (u < 0) return;
  funit *un = &f->units[u];
  un->live_until = f->now + (uint64_t)f->tun.live_ticks * f->tun.tick_ms;
  int len = (int)pr->n_path;
  path[len++] = f->cfg.self;
  if (un->kind == UNIT_RELAY) {
    if (un->has_out && len < FLOW_MAX_PATH)
      flow_send_probe(f, un->out_peer, un->out_seg, &origin, pr->origin_seg, path, len,
                      pr->cost + f->peers[un->out_peer].cost_next);
    return;
  }
  if (!gw_id_eq(&origin, &f->cfg.self)) return;
  int s = flow_find_out_seg(f, pr->origin_seg);
  if (s < 0 || f->units[s].kind != UNIT_SOURCE) return;
  funit *src = &f->units[s];
  gw_id *copy = malloc((size_t)len * sizeof(gw_id));
  if (!copy) return;
  memcpy(copy, path, (size_t)len * sizeof(gw_id));
  free(src->path);
  src->path = copy;
  src->path_len = len;
  src->probed_cost = pr->cost;
}

/* ---- liveness ---- */

static void on_gone(flow *f, int p, const Gwtf__FlowGone *g) {
  gw_id id;
  if (!flow_id_from_bytes(&g->peer, &id)) {
    bad_message(f, p, "gone");
    return;
  }
  int q = flow_peer_find(f, &id); /* a peer we do not know (or ourselves): nothing to forget */
  if (q >= 0 && q != p) flow_live_on_gone(f, p, q);
}

void flow_handle(flow *f, int p, const Gwtf__FlowMessage *m) {
  switch (m->msg_case) {
  case GWTF__FLOW_MESSAGE__MSG_OFFER: on_offer(f, p, m->offer); break;
  case GWTF__FLOW_MESSAGE__MSG_REQUEST: on_request(f, p, m->request); break;
  case GWTF__FLOW_MESSAGE__MSG_REPLY: on_reply(f, p, m->reply); break;
  case GWTF__FLOW_MESSAGE__MSG_CANCEL: on_cancel(f, p, m->cancel); break;
  case GWTF__FLOW_MESSAGE__MSG_DENY: on_deny(f, p, m->deny); break;
  case GWTF__FLOW_MESSAGE__MSG_COST: on_cost(f, p, m->cost); break;
  case GWTF__FLOW_MESSAGE__MSG_SWITCH_UP: on_switch_up(f, p, m->switch_up); break;
  case GWTF__FLOW_MESSAGE__MSG_SWITCH_DOWN: on_switch_down(f, p, m->switch_down); break;
  case GWTF__FLOW_MESSAGE__MSG_STATE: on_state(f, p, m->state); break;
  case GWTF__FLOW_MESSAGE__MSG_PROPOSE_CHANGE: on_propose_change(f, p, m->propose_change); break;
  case GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY: on_change_reply(f, p, m->change_reply); break;
  case GWTF__FLOW_MESSAGE__MSG_PROPOSE_REDIRECT: on_propose_redirect(f, p, m->propose_redirect); break;
  case GWTF__FLOW_MESSAGE__MSG_REDIRECT_REPLY: on_redirect_reply(f, p, m->redirect_reply); break;
  case GWTF__FLOW_MESSAGE__MSG_AUDIT: on_audit(f, p, m->audit); break;
  case GWTF__FLOW_MESSAGE__MSG_PROBE: on_probe(f, p, m->probe); break;
  case GWTF__FLOW_MESSAGE__MSG_SWITCH_ACK: flow_switch_acked(f, p, m->switch_ack->seg); break;
  case GWTF__FLOW_MESSAGE__MSG_PING: flow_live_on_ping(f, p, m->ping->nonce, m->ping->reply); break;
  case GWTF__FLOW_MESSAGE__MSG_GONE: on_gone(f, p, m->gone); break;
  case GWTF__FLOW_MESSAGE__MSG_PLACE_QUERY:
  case GWTF__FLOW_MESSAGE__MSG_PLACE_JOIN:
  case GWTF__FLOW_MESSAGE__MSG_PLACE_ASSIGN: break; /* flow/place.h handles these */
  default: bad_message(f, p, "unknown_type"); break;
  }
}
