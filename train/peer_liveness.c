/* train/peer_liveness.c — failure detection from measured RTTs, and what a
 * next hop's load looks like from here.
 *
 * A hop's wait (FORWARD_DONE, BACKWARD_DONE and their *_RECEIVED) used to be
 * a fixed hop timeout: seconds, whatever the link. Now each wait gets a
 * deadline from the session's measured RTT (the driver's train_io.link):
 *
 *   rto      = max(floor, k x (srtt + 4 rttvar))        (RFC 6298's RTO, times k)
 *   deadline = now + rto + the hop's compute (its HELLO) + our queue to it
 *
 * capped by the fixed hop timeout. A peer that misses its deadline is not
 * presumed dead but *suspected*: we probe it (a keepalive round trip, the
 * driver's train_io.probe) and it is declared failed only when nothing comes
 * back from it — not the pong, not a byte, not a train message — within the
 * probe's own deadline (its rto plus our queue to it, which the ping waits
 * behind). A peer that answers is only slow: the wait goes on (with a new
 * deadline) up to the cap, and the flows through it stay. Without RTTs (the
 * driver gives none, or none measured yet) the cap is the deadline, as before.
 *
 * Every step is one log line: peer.suspected, peer.probe_answered,
 * peer.probe_unanswered. */
#include "train/peer_liveness.h"

#include <math.h>
#include <string.h>

static live_peer *live_find(train_peer *p, const gw_id *id) {
  for (uint32_t i = 0; i < LIVE_MAX_PEERS; i++)
    if (p->live.v[i].used && gw_id_eq(&p->live.v[i].id, id)) return &p->live.v[i];
  return NULL;
}

/* The entry of `id`, made (replacing the least recently used, never one
 * being probed if another will do) when it is not there. */
static live_peer *live_get(train_peer *p, const gw_id *id) {
  live_peer *e = live_find(p, id);
  if (e) return e;
  live_peer *victim = NULL;
  for (uint32_t i = 0; i < LIVE_MAX_PEERS; i++) {
    live_peer *c = &p->live.v[i];
    if (!c->used) {
      victim = c;
      break;
    }
    if (!victim || (victim->probing && !c->probing) ||
        (victim->probing == c->probing && c->touched_ms < victim->touched_ms))
      victim = c;
  }
  memset(victim, 0, sizeof(*victim));
  victim->used = true;
  victim->id = *id;
  return victim;
}

static double rto_ms(const train_peer *p, const train_link *l) {
  double rto = p->cfg.tun.live_rto_k * (l->srtt_ms + 4.0 * l->rttvar_ms);
  double floor_ms = (double)p->cfg.tun.live_floor_ms;
  return isfinite(rto) && rto > floor_ms ? rto : floor_ms;
}

static uint64_t ms_ceil(double ms) { return ms > 0 && isfinite(ms) ? (uint64_t)ceil(ms) : 0; }

/* What the driver measured for `peer`; false: no session, or no RTT yet. */
static bool live_link(train_peer *p, const gw_id *peer, train_link *l) {
  memset(l, 0, sizeof(*l));
  return p->cfg.tun.live_rto_k > 0 && p->io.link && p->io.probe && p->io.link(p->io.ud, peer, l) &&
         l->rtt_samples > 0;
}

double live_compute_ms(train_peer *p, const gw_id *peer) {
  live_peer *e = live_find(p, peer);
  return e && isfinite(e->compute_ms) && e->compute_ms > 0 ? e->compute_ms : 0;
}

uint64_t live_deadline(train_peer *p, const gw_id *peer, double work_ms, uint64_t cap) {
  train_link l;
  if (!live_link(p, peer, &l)) return cap;
  uint64_t at = p->now + ms_ceil(rto_ms(p, &l) + work_ms + l.queue_ms);
  return at < cap ? at : cap;
}

/* `e` left a probe unanswered and nothing was heard from it since (l:
 * its link now, or NULL without one); a peer heard from again is cleared. */
static bool still_failed(live_peer *e, const train_link *l) {
  if (!e->failed_ms) return false;
  bool heard = (l && l->heard != e->probe_heard) || (e->msg_ms && e->msg_ms >= e->failed_ms);
  if (heard) e->failed_ms = 0;
  return !heard;
}

/* Whether `e` answered since its probe went out: anything heard from it. */
static bool probe_answered(const live_peer *e, const train_link *l) {
  return l->heard != e->probe_heard || (e->msg_ms && e->msg_ms >= e->probe_sent_ms);
}

static void start_probe(train_peer *p, live_peer *e, const train_link *l, const char *what, uint64_t mb_id) {
  char who[GW_ID_SHORT_LEN + 1];
  double rto = rto_ms(p, l);
  e->probing = true;
  e->probe_sent_ms = p->now;
  e->probe_heard = l->heard;
  e->probe_deadline = p->now + ms_ceil(rto + l->queue_ms);
  p->counters.probes_sent++;
  p->io.probe(p->io.ud, &e->id);
  peer_short(&e->id, who);
  GW_INFO(&p->log, "peer.suspected", "peer=%s mb=%llx waited_for=%s srtt_ms=%.1f rttvar_ms=%.1f rto_ms=%.0f queue_ms=%.0f",
          who, (unsigned long long)mb_id, what, l->srtt_ms, l->rttvar_ms, rto, l->queue_ms);
}

live_verdict live_check(train_peer *p, const gw_id *peer, uint64_t *deadline, uint64_t cap, double work_ms,
                        const char *what, uint64_t mb_id) {
  char who[GW_ID_SHORT_LEN + 1];
  if (p->now >= cap) return LIVE_CAP;
  if (!peer_alive(p, peer)) return LIVE_DEAD; /* the session itself is gone: nothing to ask */
  train_link l;
  if (!live_link(p, peer, &l)) {
    *deadline = cap;
    return LIVE_WAIT;
  }
  live_peer *e = live_get(p, peer);
  e->touched_ms = p->now;
  peer_short(peer, who);
  if (still_failed(e, &l)) return LIVE_DEAD; /* it failed a probe for another microbatch */
  if (e->probing) {
    if (probe_answered(e, &l)) {
      e->probing = false;
      e->answered_ms = p->now;
      GW_INFO(&p->log, "peer.probe_answered", "peer=%s after_ms=%llu", who,
              (unsigned long long)(p->now - e->probe_sent_ms));
    } else if (p->now >= e->probe_deadline) {
      e->probing = false;
      e->failed_ms = p->now;
      p->counters.probes_failed++;
      GW_WARN(&p->log, "peer.probe_unanswered", "peer=%s mb=%llx waited_for=%s probe_ms=%llu", who,
              (unsigned long long)mb_id, what, (unsigned long long)(p->now - e->probe_sent_ms));
      return LIVE_DEAD;
    } else {
      *deadline = e->probe_deadline < cap ? e->probe_deadline : cap;
      return LIVE_WAIT;
    }
  }
  double rto = rto_ms(p, &l);
  if (e->answered_ms && (double)(p->now - e->answered_ms) < rto) {
    /* alive a moment ago, only slow: wait on, up to the cap */
    uint64_t at = p->now + ms_ceil(rto + work_ms + l.queue_ms);
    *deadline = at < cap ? at : cap;
    return LIVE_WAIT;
  }
  start_probe(p, e, &l, what, mb_id);
  *deadline = e->probe_deadline < cap ? e->probe_deadline : cap;
  return LIVE_WAIT;
}

bool live_answered_lately(train_peer *p, const gw_id *peer) {
  live_peer *e = live_find(p, peer);
  if (!e || !e->answered_ms || e->failed_ms) return false;
  return p->now - e->answered_ms <= p->cfg.tun.hop_timeout_ms;
}

void live_heard(train_peer *p, const gw_id *from) {
  live_peer *e = live_find(p, from);
  if (e) e->msg_ms = p->now;
}

void live_on_hello(train_peer *p, const gw_id *from, double compute_ms) {
  live_peer *e = live_get(p, from);
  e->touched_ms = p->now;
  if (isfinite(compute_ms) && compute_ms >= 0) e->compute_ms = compute_ms;
}

void live_note_hold(train_peer *p, const gw_id *peer, double ms) {
  if (!isfinite(ms) || ms < 0) return;
  live_peer *e = live_get(p, peer);
  e->touched_ms = p->now;
  e->hold_ms = e->hold_ms > 0 ? 0.75 * e->hold_ms + 0.25 * ms : ms;
}

void live_note_full(train_peer *p, const gw_id *from) {
  live_peer *e = live_get(p, from);
  e->touched_ms = p->now;
  e->full_ms = p->now;
}

/* ---- load of a next hop (train_peer_next_load) ---- */

/* Microbatches we handed `peer` that hold one of its slots: sent and not
 * confirmed, or passed on through it and no gradient back yet. */
static uint32_t outstanding_at(const train_peer *p, const gw_id *peer) {
  uint32_t n = 0;
  for (size_t i = 0; i < p->n_mbs; i++) {
    const peer_mb *mb = &p->mbs[i];
    if (!mb->used || mb->eval || !gw_id_eq(&mb->next, peer)) continue;
    bool at_it = mb->fwd == FWD_SENT || ((mb->fwd == FWD_DONE || mb->fwd == FWD_FLIGHT) && mb->bwd == BWD_NONE);
    n += at_it;
  }
  return n;
}

/* How long a DENY full stays news: until one of its slots is likely free.
 * Its slots free as backwards finish, one a hold time (FORWARD to gradient
 * back, as our own microbatches there took) per slot: hold / capacity
 * apart; at least a compute there, and two ticks. Before, it was a compute
 * alone (a few ms on the grid's model, so two ticks, 0.2 s), while a slot
 * was held for about a second: the next microbatch went to the same full
 * peer, and most of the hetero grid's microbatches met a DENY full, each a
 * round trip on a slow link (0.5-0.7 s more per trip). */
uint64_t live_full_for_ms(const train_peer *p, const live_peer *e, uint32_t capacity) {
  double ms = e ? e->compute_ms : 0;
  if (e && e->hold_ms > 0) {
    double turnover = e->hold_ms / (capacity ? (double)capacity : 1.0);
    if (turnover > ms) ms = turnover;
  }
  uint64_t full_for = (uint64_t)ms;
  if (full_for < 2 * p->cfg.tun.tick_ms) full_for = 2 * p->cfg.tun.tick_ms;
  return full_for;
}

int train_peer_next_load(train_peer *p, const gw_id *peer, train_load *out) {
  memset(out, 0, sizeof(*out));
  if (!peer_alive(p, peer)) return -1;
  live_peer *e = live_find(p, peer);
  train_link l;
  memset(&l, 0, sizeof(l));
  bool have = p->io.link && p->io.link(p->io.ud, peer, &l);
  if (e && still_failed(e, have ? &l : NULL)) return -1; /* failed a probe, not heard since */
  out->outstanding = outstanding_at(p, peer);
  if (have && isfinite(l.queue_ms) && l.queue_ms > 0) out->queue_ms = l.queue_ms;
  out->compute_ms = e ? e->compute_ms : 0;
  int next = p->stage < 0 ? -1 : p->stage == p->cfg.n_stages ? 0 : p->stage + 1;
  peer_stage_view *v = next >= 0 ? peer_stage(p, next) : NULL;
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, peer)) out->capacity = v->v[i].capacity;
  out->full = e && e->full_ms && p->now - e->full_ms < live_full_for_ms(p, e, out->capacity);
  return 0;
}
