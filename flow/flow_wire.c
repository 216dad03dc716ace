/* flow/flow_wire.c — building and sending FlowMessages (proto/flow.proto). */
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"
#include "util/err.h"

bool flow_cost_ok(double c) { return isfinite(c) && c >= 0; }

bool flow_id_from_bytes(const ProtobufCBinaryData *b, gw_id *out) {
  if (b->len != GW_ID_BYTES) return false;
  memcpy(out->b, b->data, GW_ID_BYTES);
  return true;
}

ProtobufCBinaryData flow_id_bytes(const gw_id *id) { return (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)id->b}; }

int flow_message_send(const gw_io *io, const gw_id *to, Gwtf__FlowMessage *m, size_t max_len) {
  size_t len = gwtf__flow_message__get_packed_size(m);
  if (len > max_len) return GW_ERANGE;
  uint8_t small[512];
  uint8_t *buf = len <= sizeof(small) ? small : malloc(len);
  if (!buf) return GW_ENOMEM;
  gwtf__flow_message__pack(m, buf);
  gw_peer peer;
  memset(&peer, 0, sizeof(peer));
  peer.id = *to;
  int rc = io->send(io->ud, &peer, buf, len);
  if (buf != small) free(buf);
  return rc;
}

int flow_send(flow *f, int peer, Gwtf__FlowMessage *m) {
  return flow_message_send(&f->cfg.io, &f->peers[peer].id, m, FLOW_MAX_MESSAGE);
}

int flow_send_cancel(flow *f, int peer, uint64_t seg) {
  Gwtf__FlowCancel c = GWTF__FLOW_CANCEL__INIT;
  c.seg = seg;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_CANCEL;
  m.cancel = &c;
  return flow_send(f, peer, &m);
}

int flow_send_deny(flow *f, int peer, uint64_t seg, bool full) {
  Gwtf__FlowDeny d = GWTF__FLOW_DENY__INIT;
  d.seg = seg;
  d.full = full;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_DENY;
  m.deny = &d;
  return flow_send(f, peer, &m);
}

int flow_send_cost(flow *f, int peer, uint64_t seg, double cost) {
  Gwtf__FlowCost c = GWTF__FLOW_COST__INIT;
  c.seg = seg;
  c.broken = !flow_cost_ok(cost);
  c.cost = c.broken ? 0 : cost;
  c.version = ++f->cost_clock;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_COST;
  m.cost = &c;
  return flow_send(f, peer, &m);
}

int flow_send_request(flow *f, int peer, uint64_t seg, const gw_id *target, double cost) {
  Gwtf__FlowRequest r = GWTF__FLOW_REQUEST__INIT;
  r.seg = seg;
  r.target = flow_id_bytes(target);
  r.cost = cost;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &r;
  return flow_send(f, peer, &m);
}

uint32_t flow_spare(const flow *f) {
  int free_slots = 0;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (f->cfg.role == FLOW_RELAY ? !un->used : (un->kind == UNIT_SINK && !un->used)) free_slots++;
  }
  return (uint32_t)free_slots;
}

void flow_offer_for(const flow *f, const gw_id *t, uint32_t *count, double *cost) {
  *count = 0;
  *cost = INFINITY;
  if (f->cfg.role == FLOW_DATA) {
    if (gw_id_eq(t, &f->cfg.self)) {
      *count = flow_spare(f);
      *cost = *count ? 0 : INFINITY;
    }
    return;
  }
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || !un->has_out || un->has_in || un->locked_txn || !gw_id_eq(&un->target, t)) continue;
    double c = flow_unit_cost(f, un);
    if (!f->peers[un->out_peer].alive || !flow_cost_ok(c)) continue; /* a broken path is no offer */
    (*count)++;
    if (c < *cost) *cost = c;
  }
}

int flow_send_reply(flow *f, int peer, uint64_t seg, const gw_id *target, bool accept, double cost) {
  Gwtf__FlowReply r = GWTF__FLOW_REPLY__INIT;
  uint32_t count;
  double best;
  flow_offer_for(f, target, &count, &best);
  r.seg = seg;
  r.target = flow_id_bytes(target);
  r.accept = accept;
  /* +inf does not travel (costs on the wire are finite): a reject with no
   * unit for the target says count = 0, and the cost is then ignored. */
  r.cost = accept ? cost : (flow_cost_ok(best) ? best : 0);
  r.count = count;
  r.spare = flow_spare(f);
  r.version = ++f->cost_clock;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY;
  m.reply = &r;
  return flow_send(f, peer, &m);
}

/* The target unit u offers outflow for: a data node's own (unit 0 stands
 * for all), a relay's unpaired outflow's; NULL when u offers nothing. */
const gw_id *flow_offer_target(const flow *f, int u) {
  const funit *un = &f->units[u];
  if (f->cfg.role == FLOW_DATA) return u == 0 ? &f->cfg.self : NULL;
  return un->used && un->has_out && !un->has_in ? &un->target : NULL;
}

int flow_send_offer(flow *f, int peer) {
  Gwtf__FlowOfferEntry entries[FLOW_MAX_OFFER_ENTRIES];
  Gwtf__FlowOfferEntry *ptrs[FLOW_MAX_OFFER_ENTRIES];
  gw_id targets[FLOW_MAX_OFFER_ENTRIES];
  size_t n = 0;
  /* One entry per target we hold unpaired outflow for. */
  for (int u = 0; u < f->n_units && n < FLOW_MAX_OFFER_ENTRIES; u++) {
    const gw_id *t = flow_offer_target(f, u);
    if (!t) continue;
    bool seen = false;
    for (size_t k = 0; k < n && !seen; k++) seen = gw_id_eq(&targets[k], t);
    if (seen) continue;
    uint32_t count;
    double cost;
    flow_offer_for(f, t, &count, &cost);
    if (count == 0) continue;
    targets[n] = *t;
    gwtf__flow_offer_entry__init(&entries[n]);
    entries[n].target = flow_id_bytes(&targets[n]);
    entries[n].count = count;
    entries[n].cost = cost;
    ptrs[n] = &entries[n];
    n++;
  }
  Gwtf__FlowOffer o = GWTF__FLOW_OFFER__INIT;
  o.stage = f->cfg.stage;
  o.spare = flow_spare(f);
  o.n_entries = n;
  o.entries = ptrs;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &o;
  return flow_send(f, peer, &m);
}

int flow_send_state(flow *f, int peer) {
  size_t cap_u = (size_t)f->n_units + 1, cap_l = (size_t)f->n_peers + 1;
  Gwtf__FlowUnitInfo *infos = calloc(cap_u, sizeof(*infos));
  Gwtf__FlowUnitInfo **uptrs = calloc(cap_u, sizeof(*uptrs));
  Gwtf__FlowLinkCost *links = calloc(cap_l, sizeof(*links));
  Gwtf__FlowLinkCost **lptrs = calloc(cap_l, sizeof(*lptrs));
  int rc = GW_ENOMEM;
  if (!infos || !uptrs || !links || !lptrs) goto done;
  size_t nu = 0, nl = 0;
  for (int u = 0; u < f->n_units; u++) {
    const funit *un = &f->units[u];
    if (!un->used || un->kind != UNIT_RELAY) continue;
    Gwtf__FlowUnitInfo *i = &infos[nu];
    gwtf__flow_unit_info__init(i);
    i->target = flow_id_bytes(&un->target);
    i->live = flow_unit_live(f, un);
    if (un->has_in) {
      i->prev = flow_id_bytes(&f->peers[un->in_peer].id);
      i->in_seg = un->in_seg;
      i->in_link = f->peers[un->in_peer].cost_prev;
    }
    if (un->has_out && flow_cost_ok(un->rest)) { /* a broken path is nothing to trade */
      i->next = flow_id_bytes(&f->peers[un->out_peer].id);
      i->out_seg = un->out_seg;
      i->out_link = f->peers[un->out_peer].cost_next;
      i->rest = un->rest;
    }
    uptrs[nu++] = i;
  }
  for (int p = 0; p < f->n_peers; p++) {
    if (!flow_peer_usable_next(f, p)) continue;
    gwtf__flow_link_cost__init(&links[nl]);
    links[nl].peer = flow_id_bytes(&f->peers[p].id);
    links[nl].cost = f->peers[p].cost_next;
    lptrs[nl] = &links[nl];
    nl++;
  }
  Gwtf__FlowState st = GWTF__FLOW_STATE__INIT;
  st.stage = f->cfg.stage;
  st.capacity = (uint32_t)f->cfg.capacity;
  st.n_units = nu;
  st.units = uptrs;
  st.n_next_costs = nl;
  st.next_costs = lptrs;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_STATE;
  m.state = &st;
  rc = flow_send(f, peer, &m);
done:
  free(infos);
  free(uptrs);
  free(links);
  free(lptrs);
  return rc;
}

int flow_send_audit(flow *f, int peer, bool reply) {
  uint64_t *up = malloc(((size_t)f->n_units + 1) * sizeof(uint64_t));
  uint64_t *down = malloc(((size_t)f->n_units + 1) * sizeof(uint64_t));
  int rc = GW_ENOMEM;
  if (up && down) {
    size_t nu = 0, nd = 0;
    for (int u = 0; u < f->n_units; u++) {
      const funit *un = &f->units[u];
      if (!un->used) continue;
      if (un->has_out && un->out_peer == peer) up[nu++] = un->out_seg; /* we are upstream */
      if (un->has_in && un->in_peer == peer) down[nd++] = un->in_seg;  /* we are downstream */
    }
    Gwtf__FlowAudit a = GWTF__FLOW_AUDIT__INIT;
    a.n_up_segs = nu;
    a.up_segs = up;
    a.n_down_segs = nd;
    a.down_segs = down;
    a.reply = reply;
    flow_live_audit_out(f, peer, &a.ping, &a.echo, &a.echo_held_ms);
    Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
    m.msg_case = GWTF__FLOW_MESSAGE__MSG_AUDIT;
    m.audit = &a;
    rc = flow_send(f, peer, &m);
  }
  free(up);
  free(down);
  return rc;
}

int flow_send_ping(flow *f, int peer, uint64_t nonce, bool reply) {
  Gwtf__FlowPing pg = GWTF__FLOW_PING__INIT;
  pg.nonce = nonce;
  pg.reply = reply;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PING;
  m.ping = &pg;
  return flow_send(f, peer, &m);
}

int flow_send_gone(flow *f, int peer, const gw_id *gone) {
  Gwtf__FlowGone g = GWTF__FLOW_GONE__INIT;
  g.peer = flow_id_bytes(gone);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_GONE;
  m.gone = &g;
  return flow_send(f, peer, &m);
}

int flow_send_probe(flow *f, int peer, uint64_t seg, const gw_id *origin, uint64_t origin_seg, const gw_id *path,
                    int path_len, double cost) {
  ProtobufCBinaryData hops[FLOW_MAX_PATH];
  if (path_len > FLOW_MAX_PATH) return GW_ERANGE;
  for (int i = 0; i < path_len; i++) hops[i] = flow_id_bytes(&path[i]);
  Gwtf__FlowProbe pr = GWTF__FLOW_PROBE__INIT;
  pr.seg = seg;
  pr.origin = flow_id_bytes(origin);
  pr.origin_seg = origin_seg;
  pr.n_path = (size_t)path_len;
  pr.path = hops;
  pr.cost = cost;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROBE;
  m.probe = &pr;
  return flow_send(f, peer, &m);
}

static int send_switch(flow *f, const pswitch *ps) {
  int to = flow_peer_find(f, &ps->to);
  if (to < 0) return GW_ENOENT;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  Gwtf__FlowSwitchUp up = GWTF__FLOW_SWITCH_UP__INIT;
  Gwtf__FlowSwitchDown down = GWTF__FLOW_SWITCH_DOWN__INIT;
  if (ps->up) {
    up.seg = ps->seg;
    up.old_up = flow_id_bytes(&ps->old_end);
    up.new_up = flow_id_bytes(&ps->new_end);
    up.forwarded = ps->forwarded;
    m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_UP;
    m.switch_up = &up;
  } else {
    down.seg = ps->seg;
    down.old_down = flow_id_bytes(&ps->old_end);
    down.new_down = flow_id_bytes(&ps->new_end);
    down.cost = ps->cost;
    down.forwarded = ps->forwarded;
    m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_DOWN;
    m.switch_down = &down;
  }
  return flow_send(f, to, &m);
}

/* Registers a notify-switch for re-sending and sends it. A full table
 * (hundreds unacked) means the peers are gone; the audit covers the rest. */
static int reliable(flow *f, pswitch ps) {
  for (int i = 0; i < FLOW_PENDING_SWITCHES; i++)
    if (!f->switches[i].used) {
      f->switches[i] = ps;
      break;
    }
  return send_switch(f, &ps);
}

static int reliable_switch(flow *f, bool up, int to, uint64_t seg, int old_end, int new_end, double cost) {
  pswitch ps = {.used = true,
                .up = up,
                .to = f->peers[to].id,
                .seg = seg,
                .cost = cost,
                .ticks_left = f->tun.request_retry_ticks};
  ps.old_end = old_end < 0 ? f->cfg.self : f->peers[old_end].id;
  ps.new_end = new_end < 0 ? f->cfg.self : f->peers[new_end].id;
  return reliable(f, ps);
}

int flow_send_switch_up(flow *f, int to, uint64_t seg, int old_up, int new_up) {
  return reliable_switch(f, true, to, seg, old_up, new_up, 0);
}

int flow_send_switch_down(flow *f, int to, uint64_t seg, int old_down, int new_down, double cost) {
  return reliable_switch(f, false, to, seg, old_down, new_down, cost);
}

int flow_forward_switch(flow *f, int to, bool up, uint64_t seg, const gw_id *old_end, const gw_id *new_end, double cost,
                        uint32_t forwarded) {
  pswitch ps = {.used = true,
                .up = up,
                .to = f->peers[to].id,
                .old_end = *old_end,
                .new_end = *new_end,
                .seg = seg,
                .cost = cost,
                .forwarded = forwarded,
                .ticks_left = f->tun.request_retry_ticks};
  return reliable(f, ps);
}

int flow_send_switch_ack(flow *f, int to, uint64_t seg) {
  Gwtf__FlowSwitchAck a = GWTF__FLOW_SWITCH_ACK__INIT;
  a.seg = seg;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_ACK;
  m.switch_ack = &a;
  return flow_send(f, to, &m);
}

void flow_switch_acked(flow *f, int from, uint64_t seg) {
  for (int i = 0; i < FLOW_PENDING_SWITCHES; i++) {
    pswitch *ps = &f->switches[i];
    if (ps->used && ps->seg == seg && gw_id_eq(&ps->to, &f->peers[from].id)) ps->used = false;
  }
}

void flow_resend_switches(flow *f) {
  for (int i = 0; i < FLOW_PENDING_SWITCHES; i++) {
    pswitch *ps = &f->switches[i];
    if (!ps->used) continue;
    if (--ps->ticks_left <= 0) {
      ps->used = false;
      continue;
    }
    send_switch(f, ps);
  }
}
