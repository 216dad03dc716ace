/* train/peer_mb.c — the microbatch core both roles share (GWTF §IV, §V-D
 * forward part): the table of microbatches a peer holds, the hop messages
 * and their acknowledgements, re-routing, DENY, and the deadlines on what a
 * peer passed on. What differs by role is called from one place each: the
 * data node's side (its microbatch's start, loss, trip deadline, deferral,
 * the backward's arrival at stage 0) is train/peer_data.c, a relay's hop is
 * train/peer_relay.c.
 *
 * Every hop is acknowledged twice: *_RECEIVED on arrival, and *_DONE once
 * the receiver's own result (its output going forward, its gradient going
 * back) has arrived at the peer after it. So a peer keeps waiting on what it
 * sent until that is safe two hops on: a peer that dies after computing but
 * before its result arrived (it sat in a send queue, or on a slow link)
 * always leaves a live peer that re-routes or re-sends.
 * A sender that hears nothing in time, gets DENY, or loses the session
 * re-routes to another peer of the same stage (FORWARD) or reports to the
 * origin (BACKWARD, see train/peer_repair.c). */
#include "train/peer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_data.h"
#include "train/peer_liveness.h"
#include "train/peer_repair.h"
#include "train/peer_wire.h"
#include "util/err.h"

/* ---- bookkeeping ---- */

/* The compute layer keeps activations under this key. The attempt is part of
 * it so that a restarted microbatch never meets its earlier attempt's state. */
uint64_t mb_key(const gw_id *origin, uint64_t id, uint32_t attempt) {
  uint64_t h = 1469598103934665603ULL;
  for (int i = 0; i < GW_ID_BYTES; i++) h = (h ^ origin->b[i]) * 1099511628211ULL;
  for (int i = 0; i < 8; i++) h = (h ^ ((id >> (8 * i)) & 0xff)) * 1099511628211ULL;
  for (int i = 0; i < 4; i++) h = (h ^ ((attempt >> (8 * i)) & 0xff)) * 1099511628211ULL;
  return h;
}

peer_mb *mb_find(train_peer *p, const gw_id *origin, uint64_t id) {
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (mb->used && mb->id == id && gw_id_eq(&mb->origin, origin)) return mb;
  }
  return NULL;
}

peer_mb *mb_new(train_peer *p, const gw_id *origin, uint64_t id) {
  peer_mb *slot = NULL;
  for (size_t i = 0; i < p->n_mbs && !slot; i++)
    if (!p->mbs[i].used) slot = &p->mbs[i];
  if (!slot) {
    /* Pending jobs point at their microbatch, so the array never moves:
     * it is sized once for everything a peer may hold. */
    if (p->n_mbs == 0) {
      size_t cap = 4 * (size_t)p->cfg.capacity + 16;
      p->mbs = calloc(cap, sizeof(*p->mbs));
      if (!p->mbs) return NULL;
      p->n_mbs = cap;
      slot = &p->mbs[0];
    } else {
      return NULL;
    }
  }
  memset(slot, 0, sizeof(*slot));
  slot->used = true;
  slot->origin = *origin;
  slot->id = id;
  slot->key = mb_key(origin, id, 0);
  slot->started_ms = p->now;
  p->held++;
  return slot;
}

/* The work spent on mb counted: on its origin, the microbatch completed; on
 * a relay, our backward of it ran (what happens after is not ours). */
static bool mb_useful(const train_peer *p, const peer_mb *mb) {
  return p->cfg.role == TRAIN_DATA ? mb->end == MB_COMPLETE : mb->bwd == BWD_DONE;
}

void mb_free(train_peer *p, peer_mb *mb) {
  if (!mb->used) return;
  if (!mb_useful(p, mb) && !mb->eval) p->counters.wasted_seconds += mb->compute_s; /* eval trains nothing by design */
  if (mb->job && !p->closing) {
    /* A job still computes on our buffers: they go with it, and the state
     * it leaves in the compute layer is released when it ends. (Closing,
     * the worker has already stopped and freed its jobs.) */
    void *bufs[] = {mb->in, mb->out, mb->grad, mb->tokens, mb->targets, mb->gpart};
    peer_job_abandon(mb->job, bufs, sizeof(bufs) / sizeof(bufs[0]));
  } else {
    if (mb->has_state) peer_release_key(p, mb->key);
    free(mb->in);
    free(mb->out);
    free(mb->grad);
    free(mb->tokens);
    free(mb->targets);
    free(mb->gpart);
  }
  mb->job = NULL;
  mb->gpart = NULL;
  mb->used = false;
  mb->in = mb->out = mb->grad = NULL;
  mb->tokens = mb->targets = NULL;
  if (!mb->slot_freed) p->held--;
}

/* The stage of the peer we send our gradient to and wait on for
 * BACKWARD_DONE: the one before us on the path; for the data node, whose
 * gradient is the loss gradient, the last stage. */
int mb_upstream_stage(const train_peer *p) { return p->cfg.role == TRAIN_DATA ? p->cfg.n_stages : p->stage - 1; }

static bool from_upstream(const train_peer *p, const peer_mb *mb, const gw_id *from) {
  int up = mb_upstream_stage(p);
  return up >= 0 && (uint32_t)up < mb->path_len && gw_id_eq(&mb->path[up], from);
}

/* `full`: the peer only had no free slot, so it may be asked again after a
 * wait; anything else (no answer, session lost, refused) rules it out. */
static void avoid_add(peer_mb *mb, const gw_id *id, bool full) {
  for (uint32_t i = 0; i < mb->n_avoid; i++)
    if (gw_id_eq(&mb->avoid[i], id)) {
      if (!full) mb->avoid_full &= ~(1u << i);
      return;
    }
  if (mb->n_avoid == PEER_MAX_AVOID) return;
  if (full) mb->avoid_full |= 1u << mb->n_avoid;
  mb->avoid[mb->n_avoid++] = *id;
}

/* Forgets the peers that only said "full": they are asked again. */
static void avoid_forget_full(peer_mb *mb) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < mb->n_avoid; i++)
    if (!(mb->avoid_full & (1u << i))) mb->avoid[n++] = mb->avoid[i];
  mb->n_avoid = n;
  mb->avoid_full = 0;
}

/* ---- messages ---- */

void mb_ack(train_peer *p, const gw_id *to, uint32_t type, const peer_mb *mb, const char *reason) {
  Gwtf__TrainAck a = GWTF__TRAIN_ACK__INIT;
  a.id = mb->id;
  a.origin = id_bytes(&mb->origin);
  a.iteration = mb->iteration;
  a.reason = (char *)(reason ? reason : "");
  peer_send(p, to, type, &a.base, NULL);
}

void mb_deny(train_peer *p, const gw_id *to, const Gwtf__TrainMicrobatch *m, const char *reason) {
  Gwtf__TrainAck a = GWTF__TRAIN_ACK__INIT;
  char who[GW_ID_SHORT_LEN + 1];
  a.id = m->id;
  a.origin = m->origin;
  a.iteration = m->iteration;
  a.reason = (char *)reason;
  a.repair = m->repair;
  peer_send(p, to, GWTF__TRAIN_MSG__TRAIN_DENY, &a.base, NULL);
  p->counters.denies_sent++;
  p->counters.repair_denies += m->repair;
  peer_short(to, who);
  GW_INFO(&p->log, "deny.sent", "mb=%llx to=%s reason=%s%s", (unsigned long long)m->id, who, reason,
          m->repair ? " repair=1" : "");
}

void mb_fill_msg(Gwtf__TrainMicrobatch *m, ProtobufCBinaryData *path, const peer_mb *mb) {
  gwtf__train_microbatch__init(m);
  m->id = mb->id;
  m->origin = id_bytes(&mb->origin);
  m->iteration = mb->iteration;
  m->attempt = mb->attempt;
  m->rerun_stages = mb->rerun_stages;
  for (uint32_t i = 0; i < mb->path_len; i++) path[i] = id_bytes(&mb->path[i]);
  m->n_path = mb->path_len;
  m->path = path;
  m->repair = mb->repair;
  m->repair_end_stage = mb->repair_end_stage;
  if (mb->repair) m->repair_target = id_bytes(&mb->repair_target);
  m->flow_id = mb->flow_out;
  m->eval = mb->eval;
}

/* Activations and gradients may arrive compressed (train/peer_wire.c). */
static bool valid_act(const train_peer *p, const train_tensor *t) { return wire_act_refusal(p, t) == NULL; }

/* One line per refused activation or gradient: who sent it, which way, in
 * what dtype and why (train/peer_wire.c says what it checks). */
static void log_malformed(const train_peer *p, const gw_id *from, const char *what, const train_tensor *t) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  const char *why = wire_act_refusal(p, t);
  GW_WARN(&p->log, "train.malformed", "peer=%s what=%s dtype=%u why=%s", who, what, t ? (unsigned)t->dtype : 0u,
          why ? why : "header");
}

static peer_mb *mb_from_ack(train_peer *p, const Gwtf__TrainAck *a) {
  gw_id origin;
  if (a->origin.len != GW_ID_BYTES) return NULL;
  id_from_bytes(&origin, a->origin);
  return mb_find(p, &origin, a->id);
}

void mb_log_compute(train_peer *p, const peer_mb *mb, const char *kind, double s) {
  char origin[GW_ID_SHORT_LEN + 1];
  peer_short(&mb->origin, origin);
  GW_INFO(&p->log, "compute.done", "mb=%llx origin=%s kind=%s secs=%.4f iter=%llu attempt=%u",
          (unsigned long long)mb->id, origin, kind, s, (unsigned long long)mb->iteration, mb->attempt);
}

/* ---- forward ---- */

/* Waits for the next stage to offer a hop, within budget_ms since the wait
 * began; the peers that only said "full" are asked again. True: waiting. */
static bool wait_for_hop(train_peer *p, peer_mb *mb, uint64_t budget_ms) {
  if (!mb->wait_since) mb->wait_since = p->now;
  if (p->now - mb->wait_since >= budget_ms) return false;
  const char *why = mb->avoid_full ? "next_stage_full" : "no_hop_known";
  avoid_forget_full(mb);
  mb->reroutes = 0; /* the wait budget bounds it now */
  mb->fwd = FWD_WAIT;
  /* Each try re-sends the activations, so the tries thin out as the wait
   * grows (two ticks, then half the time waited so far). */
  uint64_t waited = p->now - mb->wait_since, step = 2 * p->cfg.tun.tick_ms;
  mb->wait_until = p->now + (waited / 2 > step ? waited / 2 : step);
  GW_DEBUG(&p->log, "forward.waiting", "mb=%llx reason=%s waited_ms=%llu", (unsigned long long)mb->id,
           why, (unsigned long long)waited);
  return true;
}

/* Whether a live peer of the next stage turned mb away. One we avoid
 * because it died (a lost hop, a repair's gap) did not: its stage-mates may
 * not be hops yet. Before, any avoided peer counted: a data node re-sending
 * its embedding into a repair's gap (avoiding the dead relay) whose
 * directory did not list the stage's other member yet deferred the
 * microbatch at once, though its backward had run through every stage
 * after the gap (swarm_backward_crash in CI: ledger "extra 2"). */
static bool live_refusal(train_peer *p, const peer_mb *mb) {
  for (uint32_t i = 0; i < mb->n_avoid; i++)
    if (peer_alive(p, &mb->avoid[i])) return true;
  return false;
}

/* Some peers of the next stage are out only for want of a free slot:
 * slots free up as microbatches finish their backward (every microbatch in
 * the pipeline does within a round trip), so we wait a little and ask them
 * again rather than give the microbatch up. No live peer refused: we wait
 * for one to become a hop. Live peers that refused for other reasons: no
 * wait helps. */
bool mb_wait_for_route(train_peer *p, peer_mb *mb, uint64_t budget_ms) {
  if (live_refusal(p, mb) && !mb->avoid_full) return false;
  return wait_for_hop(p, mb, budget_ms);
}

/* Whether we ask `next` to keep mb until it has a free slot rather than
 * DENY it full (train/peer_relay.c, "waiting for a slot"): this hop met a
 * full peer already, or `next` is full lately. Not a repair (it may take a
 * relay's reserve), nor a data node's microbatch as its iteration closes:
 * one still outside the pipeline then is deferred (data_mb_tick). */
static bool ask_to_wait(train_peer *p, const peer_mb *mb, const gw_id *next) {
  if (mb->repair || (p->cfg.role == TRAIN_DATA && p->iter_wrap_up)) return false;
  if (mb->avoid_full) return true;
  train_load l;
  return train_peer_next_load(p, next, &l) == 0 && (l.full || (l.capacity && l.outstanding >= l.capacity));
}

/* Chooses the next hop for mb and sends it our output. When no peer of the
 * next stage will do, the role decides how long to wait for a slot and what
 * then: the data node defers the microbatch (data_no_route), a relay DENYs
 * it upstream (relay_no_route). */
void mb_send_forward(train_peer *p, peer_mb *mb) {
  char who[GW_ID_SHORT_LEN + 1];
  gw_id next;
  int rc;
  int next_stage = p->stage == p->cfg.n_stages ? 0 : p->stage + 1;
  if (next_stage == 0) {
    next = mb->origin;
    rc = id_in(mb->avoid, mb->n_avoid, &next) ? GW_ENOENT : 0;
  } else {
    const gw_id *from = p->cfg.role == TRAIN_DATA ? NULL : &mb->prev; /* the data node starts the path */
    rc = p->router.next_hop(p->router.ctx, &mb->origin, from, mb->index, mb->flow_in, mb->avoid, mb->n_avoid,
                            &next, &mb->flow_out);
  }
  if (rc != 0 || mb->reroutes > p->cfg.tun.max_reroutes) {
    if (p->cfg.role == TRAIN_DATA) data_no_route(p, mb);
    else relay_no_route(p, mb);
    return;
  }
  mb->next = next;
  Gwtf__TrainMicrobatch m;
  ProtobufCBinaryData path[PEER_MAX_PATH];
  mb_fill_msg(&m, path, mb);
  m.wait_for_slot = ask_to_wait(p, mb, &next);
  mb->fwd = FWD_SENT;
  mb->sent_ms = p->now;
  mb->fwd_cap = p->now + p->cfg.tun.hop_timeout_ms;
  if (wire_send_act(p, &next, GWTF__TRAIN_MSG__TRAIN_FORWARD, &m.base, mb->out, mb->tokens) != 0) {
    /* The session is gone: the tick re-routes at once. */
    mb->fwd_deadline = mb->fwd_cap = p->now;
  } else {
    /* FORWARD_RECEIVED: the activation crosses our queue and the link */
    mb->fwd_deadline = live_deadline(p, &next, 0, mb->fwd_cap);
  }
  peer_short(&next, who);
  GW_DEBUG(&p->log, "forward.sent", "mb=%llx to=%s", (unsigned long long)mb->id, who);
}

static void reroute(train_peer *p, peer_mb *mb, const char *why, bool full) {
  char was[GW_ID_SHORT_LEN + 1];
  peer_short(&mb->next, was);
  avoid_add(mb, &mb->next, full);
  mb->reroutes++;
  p->counters.forward_rerouted++;
  GW_INFO(&p->log, "forward.rerouted", "mb=%llx from_peer=%s reason=%s attempt=%u", (unsigned long long)mb->id,
          was, why, mb->reroutes);
  mb_send_forward(p, mb);
}

/* The next hop died or went silent: it may have passed the microbatch on
 * before it did, so a later "duplicate" means ours went through. */
static void reroute_from_lost(train_peer *p, peer_mb *mb, const char *why) {
  mb->maybe_through = true;
  reroute(p, mb, why, false);
}

/* A FORWARD: on the data node, one of its own microbatches coming back from
 * the last stage; on a relay, a microbatch for its stage. */
void mb_on_forward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t) {
  if (m->origin.len != GW_ID_BYTES || m->n_path == 0 || m->n_path > PEER_MAX_PATH || !valid_act(p, t)) {
    log_malformed(p, from, "forward", t);
    return;
  }
  if (!wire_tokens_ok(p, m)) { /* a subspace run's activation cannot be rebuilt without them */
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_WARN(&p->log, "train.malformed", "peer=%s what=forward dtype=%u why=tokens", who, (unsigned)t->dtype);
    return;
  }
  if (p->cfg.role == TRAIN_DATA) data_on_return(p, from, m, t);
  else relay_on_forward(p, from, m, t);
}

void mb_on_forward_received(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  peer_mb *mb = mb_from_ack(p, a);
  if (!mb || mb->fwd != FWD_SENT || !gw_id_eq(&mb->next, from)) return;
  mb->wait_since = 0; /* it found a slot: a later wait has its own budget */
  /* Now its forward, and the hop after it: FORWARD_DONE. Kept waiting for
   * a slot there ("queued"), it has no compute's deadline yet: a second
   * FORWARD_RECEIVED comes as its forward starts. */
  bool queued = a->reason && !strcmp(a->reason, "queued");
  mb->fwd_cap = p->now + 3 * p->cfg.tun.hop_timeout_ms;
  mb->fwd_deadline = queued ? mb->fwd_cap : live_deadline(p, from, live_compute_ms(p, from), mb->fwd_cap);
  if (p->cfg.role == TRAIN_RELAY) relay_confirm_upstream(p, mb); /* the next peer holds our output */
}

/* Our forward part is over: the microbatch went on past the next stage. */
static void forward_through(train_peer *p, peer_mb *mb) {
  if (p->cfg.role == TRAIN_DATA) data_forward_through(p, mb);
  else relay_forward_through(p, mb);
}

void mb_on_forward_done(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  peer_mb *mb = mb_from_ack(p, a);
  if (!mb || mb->fwd != FWD_SENT || !gw_id_eq(&mb->next, from)) return;
  if (p->router.observe) p->router.observe(p->router.ctx, from, (double)(p->now - mb->sent_ms));
  forward_through(p, mb);
}

/* "duplicate": the next peer already holds this microbatch, so its forward
 * went on another way. If we re-routed it away from a next hop we lost (dead,
 * or silent past its deadline), the copy we gave that one is what went on,
 * and we are on its path: we wait for the backward. So does the data node,
 * whose microbatch it is, and a relay carrying a repair.
 * Otherwise a relay's copy is a spare that a re-route upstream of it made:
 * it drops it (relay_drop_spare). Before, each spare re-routed on, ran its
 * forward on more peers and held their slots for the rest of the iteration. */
static void forward_duplicate(train_peer *p, peer_mb *mb) {
  if (p->cfg.role == TRAIN_RELAY && !mb->repair && !mb->maybe_through) {
    relay_drop_spare(p, mb);
    return;
  }
  GW_DEBUG(&p->log, "forward.through", "mb=%llx", (unsigned long long)mb->id);
  if (mb->fwd == FWD_SENT) forward_through(p, mb);
}

/* A DENY can also come after FORWARD_DONE: the next hop computed, then found
 * no route onwards. While we still hold our output and no gradient came
 * back, the microbatch is ours to re-route (else it would stall until its
 * data node's trip deadline). Passed on means, for the data node, that its
 * microbatch travels (FWD_FLIGHT); for a relay, that its forward is done and
 * the next peer is not the peer after a repair's gap (its target). */
static bool deniable(const train_peer *p, const peer_mb *mb) {
  if (mb->fwd == FWD_SENT) return true;
  bool gap_end = mb->repair && p->stage == mb->repair_end_stage;
  bool passed_on = p->cfg.role == TRAIN_DATA ? mb->fwd == FWD_FLIGHT : mb->fwd == FWD_DONE && !gap_end;
  return passed_on && mb->bwd == BWD_NONE && mb->out;
}

void mb_on_deny(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  peer_mb *mb = mb_from_ack(p, a);
  char who[GW_ID_SHORT_LEN + 1];
  if (mb && p->cfg.role == TRAIN_DATA && !gw_id_eq(&mb->next, from)) {
    data_dropped_past_risk(p, mb, from, a->reason);
    return;
  }
  if (!mb || !deniable(p, mb) || !gw_id_eq(&mb->next, from)) return;
  if (a->repair != mb->repair) {
    /* the refusal of a FORWARD before the repair's re-send to the same
     * peer: taken as the re-send's, it re-routed the repair away from the
     * peer rebuilding the gap, and that peer's gradient then found us
     * re-routing and was dropped (a 16 s backward timeout, homo-churn20) */
    GW_DEBUG(&p->log, "deny.stale", "mb=%llx reason=%s", (unsigned long long)mb->id, a->reason);
    return;
  }
  p->counters.denies_received++;
  /* "full" only says the peer holds all it can right now: the microbatch
   * goes elsewhere and the peer's flows stay, since its slots free up as
   * microbatches finish. Any other refusal (no route onwards, not ready)
   * means its flows do not hold: the router drops them (§V-C). */
  bool full = a->reason && !strcmp(a->reason, "full");
  bool duplicate = a->reason && !strcmp(a->reason, "duplicate");
  if (full) live_note_full(p, from); /* the fallback weighs it (train_peer_next_load) */
  if (!full && !duplicate && p->router.peer_denied) p->router.peer_denied(p->router.ctx, from);
  peer_short(from, who);
  GW_INFO(&p->log, "deny.received", "mb=%llx from=%s reason=%s", (unsigned long long)mb->id, who, a->reason);
  if (duplicate) forward_duplicate(p, mb);
  else reroute(p, mb, full ? "full" : "deny", full);
}

/* ---- backward ---- */

void mb_send_backward(train_peer *p, peer_mb *mb) {
  int up = mb_upstream_stage(p);
  if (up < 0 || (uint32_t)up >= mb->path_len) return;
  Gwtf__TrainMicrobatch m;
  ProtobufCBinaryData path[PEER_MAX_PATH];
  mb_fill_msg(&m, path, mb);
  m.repair = false;
  mb->grad_acked = mb->grad_received = false;
  if (!mb->grad_due_ms) mb->grad_due_ms = p->now;
  if (mb->gap_reported_early && !peer_alive(p, &mb->path[up])) {
    /* The gap was reported early: the gradient waits for the replacement
     * (REPAIR_READY sends it), as long as it would after a report made
     * now (report_relay); then we report again. */
    mb->bwd_deadline = mb->bwd_cap = p->now + 3 * p->cfg.tun.hop_timeout_ms;
    return;
  }
  mb->bwd_cap = p->now + p->cfg.tun.hop_timeout_ms;
  if (!peer_alive(p, &mb->path[up]) ||
      wire_send_act(p, &mb->path[up], GWTF__TRAIN_MSG__TRAIN_BACKWARD, &m.base, mb->grad, mb->tokens) != 0)
    mb->bwd_deadline = mb->bwd_cap = p->now; /* session gone: report at the next tick */
  else
    mb->bwd_deadline = live_deadline(p, &mb->path[up], 0, mb->bwd_cap);
}

/* A gradient for mb from `from`: acknowledged (BACKWARD_RECEIVED) and kept
 * in mb->in. False when there is nothing to compute: a duplicate after a
 * repair (the first one wins), or no memory. Then the role's backward job. */
bool mb_take_gradient(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t) {
  mb_ack(p, from, GWTF__TRAIN_MSG__TRAIN_BACKWARD_RECEIVED, mb, NULL);
  if (mb->bwd != BWD_NONE) return false;
  free(mb->in);
  mb->in = wire_act_decode(p, t, NULL);
  if (!mb->in) return false;
  mb->next = *from; /* whoever sent the gradient gets our BACKWARD_DONE */
  mb->bwd = BWD_COMPUTE;
  return true;
}

void mb_on_backward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t) {
  gw_id origin;
  if (m->origin.len != GW_ID_BYTES || !valid_act(p, t)) {
    log_malformed(p, from, "backward", t);
    return;
  }
  id_from_bytes(&origin, m->origin);
  peer_mb *mb = mb_find(p, &origin, m->id);
  if (!mb || mb->attempt != m->attempt) return;
  /* the next hop gives its slot back as it sends us the gradient (a data
   * node's next hop is its path's first relay: mb->next became the last) */
  const gw_id *hop = p->cfg.role == TRAIN_DATA ? &mb->path[1] : &mb->next;
  if (mb->sent_ms && mb->bwd == BWD_NONE && (p->cfg.role != TRAIN_DATA || mb->path_len > 1) && gw_id_eq(from, hop))
    live_note_hold(p, from, (double)(p->now - mb->sent_ms));
  if (p->cfg.role == TRAIN_DATA) data_on_backward(p, from, mb, t);
  else relay_on_backward(p, from, mb, t);
}

void mb_on_backward_received(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  peer_mb *mb = mb_from_ack(p, a);
  if (!mb || mb->grad_received || mb->grad_acked || !from_upstream(p, mb, from)) return;
  mb->grad_received = true;
  /* Now its backward, and the hop after it: BACKWARD_DONE. */
  mb->bwd_cap = p->now + 3 * p->cfg.tun.hop_timeout_ms;
  mb->bwd_deadline = live_deadline(p, from, live_compute_ms(p, from), mb->bwd_cap);
  if (p->cfg.role == TRAIN_RELAY) relay_confirm_downstream(p, mb); /* the peer before us holds ours */
}

void mb_on_backward_done(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  peer_mb *mb = mb_from_ack(p, a);
  if (!mb || mb->grad_acked) return;
  /* From the peer upstream, or from the origin when a repair probe found the
   * backward had already moved past the peer we suspected. */
  if (!from_upstream(p, mb, from) && !gw_id_eq(&mb->origin, from)) return;
  mb->grad_acked = true;
  if (p->cfg.role == TRAIN_DATA) data_backward_confirmed(p, mb);
  else relay_backward_confirmed(p, mb);
}

/* ---- compute results ---- */

void mb_job_done(train_peer *p, train_job *job) {
  peer_mb *mb = job->owner;
  if (!mb) {
    /* Abandoned while computing (mb_free): drop the state kept under the
     * key, which a backward has already consumed itself. */
    bool eval = job->kind == TRAIN_JOB_EVAL_EMBED || job->kind == TRAIN_JOB_EVAL_FORWARD ||
                job->kind == TRAIN_JOB_EVAL_LOSS; /* they keep nothing */
    bool kept = job->kind != TRAIN_JOB_BACKWARD && job->kind != TRAIN_JOB_EMBED_BACKWARD && !eval;
    if (kept) peer_release_key(p, job->key);
    return;
  }
  mb->job = NULL;
  mb->compute_s += job->seconds;
  if (mb->eval) return eval_job_done(p, mb, job);
  if (job->rc != 0)
    GW_ERROR(&p->log, "compute.failed", "mb=%llx kind=%d rc=%d", (unsigned long long)mb->id, (int)job->kind,
             job->rc);
  if (p->cfg.role == TRAIN_DATA) data_job_done(p, mb, job);
  else relay_job_done(p, mb, job);
}

/* ---- failures ---- */

/* We sent our gradient upstream (a relay: its backward ran; the data node:
 * its loss gradient) and wait for the peer there to confirm it.
 * A data node that re-sent its own output into a repair has no last relay
 * on its path until the repaired backward arrives: it waits on its trip
 * deadline instead (reporting would find nobody to blame, and the report
 * would stand in for the deadline check at every tick). */
static bool awaits_backward_done(const train_peer *p, const peer_mb *mb) {
  int up = mb_upstream_stage(p);
  bool grad_out = p->cfg.role == TRAIN_DATA ? mb->fwd == FWD_DONE && mb->grad : mb->bwd == BWD_DONE;
  return grad_out && !mb->grad_acked && up >= 0 && (uint32_t)up < mb->path_len;
}

/* No FORWARD_RECEIVED/FORWARD_DONE by the deadline: probe the next hop
 * (peer_liveness.c). Re-routed when it leaves the probe unanswered (its
 * flows torn down), or at the cap: then a next hop that answers probes is
 * only slow, and keeps its flows. */
static void forward_overdue(train_peer *p, peer_mb *mb) {
  char who[GW_ID_SHORT_LEN + 1];
  live_verdict v = live_check(p, &mb->next, &mb->fwd_deadline, mb->fwd_cap, live_compute_ms(p, &mb->next),
                              "forward_done", mb->id);
  if (v == LIVE_WAIT) return;
  peer_short(&mb->next, who);
  if (v == LIVE_CAP && live_answered_lately(p, &mb->next)) {
    GW_WARN(&p->log, "peer.slow", "peer=%s mb=%llx waited_for=forward_done", who, (unsigned long long)mb->id);
    reroute_from_lost(p, mb, "slow");
    return;
  }
  const char *why = !peer_alive(p, &mb->next) ? "session_lost" : v == LIVE_CAP ? "timeout" : "probe";
  GW_WARN(&p->log, "peer.presumed_dead", "peer=%s mb=%llx waited_for=forward_done reason=%s", who,
          (unsigned long long)mb->id, why);
  if (p->router.peer_failed) p->router.peer_failed(p->router.ctx, &mb->next);
  reroute_from_lost(p, mb, why);
}

/* The deadlines every peer keeps on a microbatch it passed on: a slot wait
 * over, the next hop's FORWARD_DONE, the upstream peer's BACKWARD_DONE.
 * True when one of them acted (or still waits on its probe). */
bool mb_tick_hops(train_peer *p, peer_mb *mb) {
  if (mb->fwd == FWD_WAIT && p->now >= mb->wait_until) {
    mb_send_forward(p, mb);
    return true;
  }
  if (mb->fwd == FWD_SENT && p->now >= mb->fwd_deadline) {
    forward_overdue(p, mb);
    return true;
  }
  if (awaits_backward_done(p, mb) && !mb->recovering && p->now >= mb->bwd_deadline) {
    int up = mb_upstream_stage(p);
    /* the peer upstream, probed first (a deadline past its cap is final) */
    if (live_check(p, &mb->path[up], &mb->bwd_deadline, mb->bwd_cap, live_compute_ms(p, &mb->path[up]),
                   "backward_done", mb->id) == LIVE_WAIT)
      return true;
    repair_report(p, mb);
    return true;
  }
  return false;
}

void mb_tick(train_peer *p) {
  /* (a slot also frees where a microbatch is dropped, not only at its backward) */
  if (p->cfg.role == TRAIN_RELAY) relay_take_free_slots(p);
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used) continue;
    if (p->cfg.role == TRAIN_DATA) data_mb_tick(p, mb); /* and the trip's deadline */
    else mb_tick_hops(p, mb);
  }
}

/* We passed mb on to a peer now gone, and no backward came yet: the peer
 * it passed mb to may be gone with it (repair_report_forward). */
static void forward_at_risk(train_peer *p, peer_mb *mb) {
  if (p->cfg.role == TRAIN_RELAY) repair_report_forward(p, mb);
  else if (mb->fwd == FWD_FLIGHT && p->cfg.recovery == TRAIN_RECOVER_PATH) data_forward_at_risk(p, mb, 1);
}

/* The peer is gone for our microbatches: for those it was to carry on
 * (lost_next) and for those whose gradient it was to take (lost_up). */
static void mb_peer_gone(train_peer *p, const gw_id *peer, bool lost_next, bool lost_up, const char *why) {
  int up = mb_upstream_stage(p);
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used) continue;
    if (lost_next && mb->fwd == FWD_SENT && gw_id_eq(&mb->next, peer)) {
      reroute_from_lost(p, mb, why);
      continue;
    }
    if (lost_next && mb->bwd == BWD_NONE && gw_id_eq(&mb->next, peer)) forward_at_risk(p, mb);
    if (!lost_up) continue;
    if (awaits_backward_done(p, mb) && gw_id_eq(&mb->path[up], peer))
      mb->bwd_deadline = p->now; /* report at the next tick */
    else if (mb->bwd == BWD_NONE && up >= 1 && (uint32_t)up < mb->path_len && gw_id_eq(&mb->path[up], peer))
      repair_report_early(p, mb); /* our gradient is not due yet: have the gap mended meanwhile */
  }
}

void mb_peer_down(train_peer *p, const gw_id *peer) { mb_peer_gone(p, peer, true, true, "peer_lost"); }

/* A relay the leader moved says HELLO from its new stage right after it
 * left (peer_move.c); its session stays up, so without this what we had
 * sent it waited for the hop's deadline and then for pings it answered. */
void mb_peer_moved(train_peer *p, const gw_id *peer, int stage) {
  int S = p->cfg.n_stages;
  int next = p->cfg.role == TRAIN_DATA ? 1 : (p->stage == S ? 0 : p->stage + 1);
  if (stage < 0 || p->stage < 0) return;
  mb_peer_gone(p, peer, stage != next, stage != mb_upstream_stage(p), "peer_moved");
}

void mb_abandon_iteration(train_peer *p, uint64_t iteration) {
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (mb->used && mb->iteration <= iteration) mb_free(p, mb);
  }
}
