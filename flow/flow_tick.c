/* flow/flow_tick.c — what time does: liveness, timeouts, the periodic
 * messages, Request Flow, and the search for a Request Change / Redirect
 * worth proposing (simulated annealing). */
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"

/* ---- objective and annealing ---- */

double flow_score(const flow *f, const double *cost, const double *weight, int n) {
  (void)f;
  double sum = 0;
  for (int i = 0; i < n; i++) sum += weight[i] * cost[i];
  return sum;
}

/* A difference of scores in cost units, for the annealing draw (under max
 * scores are sums of d^p, so their p-th roots are compared). A difference
 * below min_gain of what is at stake counts as none: such a move buys
 * nothing, yet costs messages and disturbs microbatches in flight — and
 * under max most moves away from the bottleneck are like that. */
static double score_delta(const flow *f, double before, double after) {
  double level = before, delta = before - after;
  if (f->tun.objective == FLOW_OBJ_MAX) {
    double p = 1 / f->tun.max_norm;
    level = pow(before, p);
    delta = level - pow(after, p);
  }
  return fabs(delta) <= f->tun.min_gain * level ? 0 : delta;
}

double flow_change_delta(const flow *f, double link_a_b, double link_a_e, double rest_b, double link_c_e,
                         double link_c_b, double rest_e, double w_a, double w_c) {
  double w[2] = {w_a, w_c};
  double before[2] = {flow_combine(f, link_a_b, rest_b), flow_combine(f, link_c_e, rest_e)};
  double after[2] = {flow_combine(f, link_a_e, rest_e), flow_combine(f, link_c_b, rest_b)};
  return score_delta(f, flow_score(f, before, w, 2), flow_score(f, after, w, 2));
}

double flow_redirect_delta(const flow *f, double link_p_x, double link_x_n, double link_p_y, double link_y_n,
                           double rest, double w) {
  double before = flow_combine(f, link_p_x, flow_combine(f, link_x_n, rest));
  double after = flow_combine(f, link_p_y, flow_combine(f, link_y_n, rest));
  return score_delta(f, flow_score(f, &before, &w, 1), flow_score(f, &after, &w, 1));
}

/* Better: always. Equal: never — a move that gains nothing still costs
 * messages and disturbs microbatches in flight. Worse: with probability
 * e^(delta/T), delta = cost_cur - cost_new < 0. */
bool flow_anneal_accept(flow *f, double delta) {
  double eps = FLOW_COST_EPS * 1e3;
  if (delta > eps) return true;
  if (delta >= -eps) return false;
  return flow_random_uniform(f) < exp(delta / f->temperature);
}

void flow_clear_pending(flow *f) {
  if ((f->pend.kind == REQ_CHANGE || f->pend.kind == REQ_REDIRECT) && f->pend.peer >= 0) {
    f->past[f->past_next] = (past_proposal){f->peers[f->pend.peer].id, f->pend.txn, f->pend.kind};
    f->past_next = (f->past_next + 1) % FLOW_PAST_PROPOSALS;
  }
  if (f->pend.kind != REQ_NONE)
    for (int u = 0; u < f->n_units; u++)
      if (f->units[u].locked_txn == f->pend.txn) f->units[u].locked_txn = 0;
  memset(&f->pend, 0, sizeof(f->pend));
  f->pend.kind = REQ_NONE;
  f->pend.unit = f->pend.peer = f->pend.my_next = f->pend.your_next = f->pend.prev = f->pend.next = -1;
}

/* ---- Request Flow ---- */

/* The next-stage peer and offer that minimise d(self, j) (+/max) j's cost
 * for `target` (any target when NULL). */
static bool best_offer(const flow *f, const gw_id *target, int *peer, int *entry, double *via) {
  *peer = *entry = -1;
  *via = INFINITY;
  for (int p = 0; p < f->n_peers; p++) {
    const fpeer *pe = &f->peers[p];
    if (!pe->in_use || pe->denied || !flow_peer_usable_next(f, p)) continue;
    for (int i = 0; i < pe->n_offers; i++) {
      const foffer *o = &pe->offers[i];
      if (o->count == 0 || (target && !gw_id_eq(&o->target, target))) continue;
      double c = flow_combine(f, pe->cost_next, o->cost);
      if (c < *via) *via = c, *peer = p, *entry = i;
    }
  }
  return *peer >= 0;
}

static void send_request(flow *f, int unit, int peer, int entry, bool reroute) {
  foffer *o = &f->peers[peer].offers[entry];
  uint64_t seg;
  do seg = flow_random_u64(f);
  while (seg == 0 || flow_find_out_seg(f, seg) >= 0);
  flow_clear_pending(f);
  f->pend.kind = REQ_FLOW;
  f->pend.peer = peer;
  f->pend.ticks_left = f->tun.request_retry_ticks;
  f->pend.txn = seg;
  f->pend.target = o->target;
  f->pend.unit = unit;
  f->pend.cost = o->cost;
  f->pend.reroute = reroute;
  if (reroute) f->units[unit].locked_txn = seg;
  /* Assume the unit is ours until the reply says otherwise, so a chain of
   * requests does not all go to the same last unit. */
  o->count--;
  flow_send_request(f, peer, seg, &f->pend.target, f->pend.cost);
}

/* A paired unit (or a data node's first hop) whose path to the sink costs
 * more than an offered one: request the offer; on grant the old path is
 * cancelled and stays behind as a standby path. Strict improvements only,
 * so reroutes cannot cycle. */
static bool try_reroute(flow *f) {
  int best_u = -1, best_p = -1, best_e = -1;
  double best_gain = FLOW_COST_EPS * 1e3;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || !un->has_out || un->locked_txn || (un->kind == UNIT_RELAY && !un->has_in)) continue;
    int peer, entry;
    double via;
    if (!best_offer(f, &un->target, &peer, &entry, &via) || peer == un->out_peer) continue;
    double gain = flow_unit_cost(f, un) - via;
    if (gain > best_gain) best_gain = gain, best_u = u, best_p = peer, best_e = entry;
  }
  if (best_u < 0) return false;
  send_request(f, best_u, best_p, best_e, true);
  return true;
}

bool flow_try_request(flow *f) {
  if (f->pend.kind != REQ_NONE) return false;
  int peer, entry;
  double via;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    /* A source slot without a first hop, or an inflow without a next hop. */
    if (flow_unit_needs_out(un) && !un->locked_txn && best_offer(f, &un->target, &peer, &entry, &via)) {
      send_request(f, u, peer, entry, false);
      return true;
    }
  }
  /* "Nodes that have available capacity and are in a stable state look for
   * a node in a subsequent stage with an unpaired outflow." */
  if (f->cfg.role == FLOW_RELAY && flow_relay_stable(f) && flow_units_used(f) < f->cfg.capacity &&
      best_offer(f, NULL, &peer, &entry, &via)) {
    send_request(f, -1, peer, entry, false);
    return true;
  }
  return f->tun.reroute && try_reroute(f);
}

/* ---- Request Change / Redirect ---- */

typedef struct move {
  bool redirect;
  int peer;   /* the same-stage peer we propose to */
  int mine;   /* change: our unit */
  int theirs; /* index into the peer's units */
  int other;  /* change: our id of their next hop (e); redirect: prev */
  int next;   /* redirect: next */
  double delta;
  /* change: d(a,e); redirect: d(p,y), d(y,n) */
  double link1, link2;
} move;

static double peer_next_cost(const fpeer *pe, const gw_id *id) {
  for (int i = 0; i < pe->n_next_costs; i++)
    if (gw_id_eq(&pe->next_costs[i].peer, id)) return pe->next_costs[i].cost;
  return -1;
}

typedef struct search {
  move best, pick;
  int n_candidates;
} search;

static void consider(flow *f, search *s, const move *m) {
  if (s->n_candidates == 0 || m->delta > s->best.delta) s->best = *m;
  /* Reservoir sampling: a uniform pick among all candidates in one pass. */
  s->n_candidates++;
  if (flow_random_u64(f) % (uint64_t)s->n_candidates == 0) s->pick = *m;
}

static void changes_with(flow *f, search *s, int c) {
  const fpeer *pe = &f->peers[c];
  for (int a_u = 0; a_u < f->n_units; a_u++) {
    const funit *ua = &f->units[a_u];
    if (!ua->used || ua->kind != UNIT_RELAY || !ua->has_out || ua->locked_txn || !flow_cost_ok(ua->rest)) continue;
    double link_c_b = peer_next_cost(pe, &f->peers[ua->out_peer].id);
    if (link_c_b < 0) continue;
    for (int k = 0; k < pe->n_units; k++) {
      const punit *uc = &pe->units[k];
      if (!uc->has_out || !gw_id_eq(&uc->target, &ua->target)) continue;
      int e = flow_peer_find(f, &uc->next);
      if (e < 0 || e == ua->out_peer || !flow_peer_usable_next(f, e)) continue;
      double w_a = flow_unit_live(f, ua) ? 1 : f->tun.dangling_weight, w_c = uc->live ? 1 : f->tun.dangling_weight;
      move m = {.peer = c, .mine = a_u, .theirs = k, .other = e, .link1 = f->peers[e].cost_next};
      m.delta = flow_change_delta(f, f->peers[ua->out_peer].cost_next, m.link1, ua->rest, uc->out_link, link_c_b,
                                  uc->rest, w_a, w_c);
      consider(f, s, &m);
    }
  }
}

static void redirects_from(flow *f, search *s, int x) {
  const fpeer *pe = &f->peers[x];
  for (int k = 0; k < pe->n_units; k++) {
    const punit *ux = &pe->units[k];
    if (!ux->has_in || !ux->has_out) continue;
    int p = flow_peer_find(f, &ux->prev), n = flow_peer_find(f, &ux->next);
    if (!flow_peer_usable_prev(f, p) || !flow_peer_usable_next(f, n)) continue;
    move m = {.redirect = true,
              .peer = x,
              .theirs = k,
              .other = p,
              .next = n,
              .link1 = f->peers[p].cost_prev,
              .link2 = f->peers[n].cost_next};
    m.delta = flow_redirect_delta(f, ux->in_link, ux->out_link, m.link1, m.link2, ux->rest,
                                  ux->live ? 1 : f->tun.dangling_weight);
    consider(f, s, &m);
  }
}

static void propose(flow *f, const move *m) {
  const punit *theirs = &f->peers[m->peer].units[m->theirs];
  uint64_t txn = flow_random_u64(f) | 1;
  flow_clear_pending(f);
  f->pend.peer = m->peer;
  f->pend.ticks_left = f->tun.request_retry_ticks;
  f->pend.txn = txn;
  f->pend.target = theirs->target;
  if (!m->redirect) {
    funit *ua = &f->units[m->mine];
    ua->locked_txn = txn;
    f->pend.kind = REQ_CHANGE;
    f->pend.unit = m->mine;
    f->pend.my_seg = ua->out_seg;
    f->pend.my_next = ua->out_peer;
    f->pend.your_seg = theirs->out_seg;
    f->pend.your_next = m->other;
  } else {
    f->pend.kind = REQ_REDIRECT;
    f->pend.in_seg = theirs->in_seg;
    f->pend.out_seg = theirs->out_seg;
    f->pend.prev = m->other;
    f->pend.next = m->next;
  }
  flow_send_proposal(f);
}

/* Built from the pending record (and our locked unit), so a re-send carries
 * the same transaction with today's costs. */
void flow_send_proposal(flow *f) {
  const pending *pd = &f->pend;
  Gwtf__FlowMessage msg = GWTF__FLOW_MESSAGE__INIT;
  if (pd->kind == REQ_CHANGE) {
    const funit *ua = &f->units[pd->unit];
    Gwtf__FlowProposeChange pc = GWTF__FLOW_PROPOSE_CHANGE__INIT;
    pc.txn = pd->txn;
    pc.my_seg = pd->my_seg;
    pc.my_next = flow_id_bytes(&f->peers[pd->my_next].id);
    pc.your_seg = pd->your_seg;
    pc.your_next = flow_id_bytes(&f->peers[pd->your_next].id);
    pc.target = flow_id_bytes(&pd->target);
    pc.my_link = f->peers[pd->my_next].cost_next;
    pc.my_new_link = f->peers[pd->your_next].cost_next;
    pc.my_rest = ua->rest;
    pc.my_live = flow_unit_live(f, ua);
    msg.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_CHANGE;
    msg.propose_change = &pc;
    flow_send(f, pd->peer, &msg);
  } else if (pd->kind == REQ_REDIRECT) {
    Gwtf__FlowProposeRedirect pr = GWTF__FLOW_PROPOSE_REDIRECT__INIT;
    pr.txn = pd->txn;
    pr.in_seg = pd->in_seg;
    pr.prev = flow_id_bytes(&f->peers[pd->prev].id);
    pr.out_seg = pd->out_seg;
    pr.next = flow_id_bytes(&f->peers[pd->next].id);
    pr.target = flow_id_bytes(&pd->target);
    pr.new_in_link = f->peers[pd->prev].cost_prev;
    pr.new_out_link = f->peers[pd->next].cost_next;
    msg.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_REDIRECT;
    msg.propose_redirect = &pr;
    flow_send(f, pd->peer, &msg);
  }
}

bool flow_try_propose(flow *f) {
  if (f->cfg.role != FLOW_RELAY || f->pend.kind != REQ_NONE) return false;
  /* Redirects need room: a free unit, or a standby path we can give up. */
  bool room = flow_units_used(f) < f->cfg.capacity || flow_sacrificable(f) >= 0;
  search s;
  memset(&s, 0, sizeof(s));
  for (int c = 0; c < f->n_peers; c++) {
    fpeer *pe = &f->peers[c];
    if (!pe->in_use || !pe->alive || !flow_peer_is_same(f, c) || pe->n_units == 0) continue;
    if (pe->ignore > 0) {
      pe->ignore--;
      continue;
    }
    changes_with(f, &s, c);
    if (room) redirects_from(f, &s, c);
  }
  if (s.n_candidates == 0) return false;
  /* The best improvement when there is one; otherwise a random move that
   * passes our own annealing draw (the receiver draws again with its data,
   * as the prototype does). */
  if (s.best.delta > FLOW_COST_EPS * 1e3) {
    propose(f, &s.best);
    return true;
  }
  if (!flow_anneal_accept(f, s.pick.delta)) return false;
  propose(f, &s.pick);
  return true;
}

/* ---- tick ---- */

bool flow_shares_segments(const flow *f, int p) {
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (un->used && ((un->has_in && un->in_peer == p) || (un->has_out && un->out_peer == p))) return true;
  }
  return false;
}

/* When the newest segment with p was bound, plus one (0: none). A segment
 * handed to us by a notify-switch may tie us to a peer we have not heard
 * from in a while; its silence only counts from then. */
uint64_t flow_newest_segment(const flow *f, int p) {
  uint64_t t = 0;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used) continue;
    if (un->has_in && un->in_peer == p && un->in_since + 1 > t) t = un->in_since + 1;
    if (un->has_out && un->out_peer == p && un->out_since + 1 > t) t = un->out_since + 1;
  }
  return t;
}

static void pending_timeout(flow *f) {
  if (f->pend.kind == REQ_NONE) return;
  if (--f->pend.ticks_left > 0) {
    /* Lost on the way, or its answer was: ask again with the same id (the
     * other side answers a repeat as it answered the first). */
    if (f->pend.kind == REQ_FLOW)
      flow_send_request(f, f->pend.peer, f->pend.txn, &f->pend.target, f->pend.cost);
    else
      flow_send_proposal(f);
    return;
  }
  /* No answer: forget what that peer offered; it offers again if alive. */
  fpeer *pe = &f->peers[f->pend.peer];
  if (f->pend.kind == REQ_FLOW) {
    free(pe->offers);
    pe->offers = NULL;
    pe->n_offers = 0;
  }
  flow_clear_pending(f);
}

static void unit_timeouts(flow *f) {
  if (f->cfg.role != FLOW_RELAY) return;
  uint64_t in_to = (uint64_t)f->tun.inflow_timeout_ticks * f->tun.tick_ms;
  uint64_t back_to = (uint64_t)f->tun.pushback_timeout_ticks * f->tun.tick_ms;
  uint64_t out_to = (uint64_t)f->tun.outflow_idle_ticks * f->tun.tick_ms;
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (!un->used || un->locked_txn || (f->pend.kind == REQ_FLOW && f->pend.unit == u)) continue;
    if (un->has_in && !un->has_out && f->now >= un->unpaired_since + (un->pushed_back ? back_to : in_to)) {
      /* We cannot place this flow: DENY pushes it back upstream (§V-D). */
      flow_unit_release(f, u, true);
    } else if (un->has_out && !un->has_in && f->now >= un->unpaired_since + out_to) {
      flow_unit_release(f, u, false);
    }
  }
}

static bool due(const flow *f, int period) { return (f->ticks + f->phase) % (uint64_t)period == 0; }

static void periodic_sends(flow *f) {
  bool offers = f->offer_dirty || due(f, f->tun.offer_period_ticks);
  bool states = f->cfg.role == FLOW_RELAY && (f->state_dirty || due(f, f->tun.state_period_ticks));
  bool audits = due(f, f->tun.audit_period_ticks);
  for (int p = 0; p < f->n_peers; p++) {
    if (!f->peers[p].in_use || !f->peers[p].alive) continue;
    if (offers && flow_peer_is_prev(f, p) && f->peers[p].cost_prev >= 0) flow_send_offer(f, p);
    if (states && flow_peer_is_same(f, p)) flow_send_state(f, p);
    if (audits && flow_shares_segments(f, p)) flow_send_audit(f, p, false);
  }
  if (offers) f->offer_sent_hash = flow_offer_hash(f); /* a flush repeats none of it */
  f->offer_dirty = f->state_dirty = false;
  bool costs = due(f, f->tun.cost_period_ticks);
  bool probes = f->cfg.role == FLOW_DATA && due(f, f->tun.probe_period_ticks);
  for (int u = 0; u < f->n_units; u++) {
    funit *un = &f->units[u];
    if (!un->used) continue;
    if (costs && un->has_in && un->has_out) flow_push_cost(f, u, true);
    if (probes && un->kind == UNIT_SOURCE && un->has_out)
      flow_send_probe(f, un->out_peer, un->out_seg, &f->cfg.self, un->out_seg, &f->cfg.self, 1,
                      f->peers[un->out_peer].cost_next);
  }
}

/* "unmet": it wants flow (spare capacity, an inflow without next hop, a
 * source slot without first hop) but has nobody to request it from. */
static bool unmet(const flow *f) {
  if (f->cfg.role == FLOW_RELAY && flow_units_used(f) < f->cfg.capacity) return true;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (flow_unit_needs_out(un)) return true;
  }
  return false;
}

void flow_on_tick(flow *f, uint64_t now_ms) {
  if (now_ms > f->now) f->now = now_ms;
  if (f->now < f->next_tick) {
    /* A wake between ticks: a suspect's ping is due, or an offer flush. */
    flow_live_check(f);
    flow_arm(f);
    return;
  }
  f->next_tick = f->now + f->tun.tick_ms;
  f->ticks++;
  flow_live_check(f);
  flow_resend_switches(f);
  pending_timeout(f);
  unit_timeouts(f);
  periodic_sends(f);
  if (!flow_try_request(f) && f->pend.kind == REQ_NONE) {
    double p = unmet(f) ? f->tun.p_propose_unmet : f->tun.p_propose_satisfied;
    if (flow_random_uniform(f) < p) flow_try_propose(f);
  }
  flow_arm(f);
}
