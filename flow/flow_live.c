/* flow/flow_live.c — is a neighbour still there? Failure detection from
 * measured round trips, and the wakes between ticks that it (and the early
 * offer flush) needs.
 *
 * A neighbour we share segments with audits us every audit_period_ticks.
 * When its audit is overdue by more than its RTO, it is *suspected* and
 * pinged (FlowPing); the
 * pings wait 1, 1, 2, 4, ... RTOs, and after probe_tries
 * unanswered pings it is presumed dead. Any message from it ends the
 * suspicion, so a slow neighbour is at worst pinged, never declared dead by
 * a timeout it could not meet: what it is allowed is measured from its own
 * round trips (RFC 6298's srtt + 4 rttvar, with a floor). The old rule — a
 * neighbour silent for peer_timeout_ticks is dead — stays as the backstop
 * and is the only rule with probe_tries = 0.
 *
 * Round-trip samples cost no message: every audit carries a ping nonce, and
 * the other end's next audit echoes it with how long it was held (so the
 * sample is the time on the wire, not the audit period); ping answers are
 * samples too. */
#include <stdlib.h>
#include <string.h>

#include "flow/flow_internal.h"

/* Nonces only have to differ from each other (the answer comes over an
 * authenticated session): a counter, so that liveness draws nothing from
 * the generator the protocol's choices come from. */
static uint64_t next_nonce(flow *f) { return ++f->nonce_clock; }

uint64_t flow_live_rto(const flow *f, int p) {
  const fpeer *pe = &f->peers[p];
  double rto = !pe->has_rtt ? (double)f->tun.rto_initial_ms : pe->srtt + 4 * pe->rttvar;
  uint64_t ms = (uint64_t)(rto + 0.999);
  return ms < f->tun.probe_timeout_min_ms ? f->tun.probe_timeout_min_ms : ms;
}

void flow_live_sample(flow *f, int p, double r) {
  fpeer *pe = &f->peers[p];
  if (!(r >= 0) || r > 3600e3) return;
  if (!pe->has_rtt) {
    pe->has_rtt = true;
    pe->srtt = r;
    pe->rttvar = r / 2;
  } else {
    pe->rttvar = 0.75 * pe->rttvar + 0.25 * fabs(pe->srtt - r);
    pe->srtt = 0.875 * pe->srtt + 0.125 * r;
  }
}

void flow_live_heard(flow *f, int p) {
  fpeer *pe = &f->peers[p];
  if (!pe->suspect_since) return;
  char who[GW_ID_SHORT_LEN + 1];
  GW_DEBUG(f->cfg.log, "flow.peer_answered", "peer=%s after_ms=%llu pings=%d", flow_short(&pe->id, who),
           (unsigned long long)(f->now - pe->suspect_since), pe->probes_sent);
  pe->suspect_since = 0;
  pe->probes_sent = 0;
  pe->last_audit = f->now; /* it answered: the next audit is expected a period from now */
}

void flow_live_audit_out(flow *f, int p, uint64_t *ping, uint64_t *echo, uint32_t *held_ms) {
  fpeer *pe = &f->peers[p];
  /* Two peers that audit on the same tick cross their audits: each echo
   * answers the ping before the newest, so that one is kept too. */
  pe->ping_nonce[1] = pe->ping_nonce[0];
  pe->ping_at[1] = pe->ping_at[0];
  pe->ping_nonce[0] = next_nonce(f);
  pe->ping_at[0] = f->now;
  *ping = pe->ping_nonce[0];
  *echo = pe->echo_nonce;
  uint64_t held = pe->echo_nonce ? f->now - pe->echo_at : 0;
  *held_ms = held > UINT32_MAX ? UINT32_MAX : (uint32_t)held;
  pe->echo_nonce = 0;
}

void flow_live_audit_in(flow *f, int p, uint64_t ping, uint64_t echo, uint32_t held_ms) {
  fpeer *pe = &f->peers[p];
  pe->last_audit = f->now;
  for (int i = 0; i < 2 && echo; i++) {
    if (echo != pe->ping_nonce[i] || f->now - pe->ping_at[i] < held_ms) continue;
    flow_live_sample(f, p, (double)(f->now - pe->ping_at[i] - held_ms));
    pe->ping_nonce[i] = 0;
  }
  if (ping) {
    pe->echo_nonce = ping;
    pe->echo_at = f->now;
  }
}

void flow_live_on_ping(flow *f, int p, uint64_t nonce, bool reply) {
  fpeer *pe = &f->peers[p];
  if (!reply) {
    flow_send_ping(f, p, nonce, true);
    return;
  }
  /* Only the latest ping gives a sample: an answer to an earlier one would
   * be measured from the wrong send (Karn). Any answer proves it alive,
   * which flow_live_heard has already taken. */
  if (nonce && nonce == pe->probe_nonce) {
    flow_live_sample(f, p, (double)(f->now - pe->probe_at));
    pe->probe_nonce = 0;
  }
  pe->last_audit = f->now;
}

/* When p's silence makes it a suspect (0: it is not watched). A neighbour
 * we share segments with owes us an audit every period from its last one
 * (or from the newest segment, which may be younger). A peer we share
 * nothing with is not watched: a request to it finds out by timing out.
 * (Suspecting a peer that leaves a request unanswered past its RTO was
 * tried: no gain in recovery, and every reply slower than the RTO cost a
 * ping.) */
static uint64_t suspect_at(const flow *f, int p) {
  const fpeer *pe = &f->peers[p];
  if (!pe->in_use || !pe->alive || pe->suspect_since || f->tun.probe_tries == 0) return 0;
  uint64_t since = flow_newest_segment(f, p);
  if (!since) return 0;
  uint64_t base = pe->last_audit > since - 1 ? pe->last_audit : since - 1;
  return base + (uint64_t)f->tun.audit_period_ticks * f->tun.tick_ms + flow_live_rto(f, p);
}

static void send_probe(flow *f, int p) {
  fpeer *pe = &f->peers[p];
  pe->probe_nonce = next_nonce(f);
  pe->probe_at = f->now;
  /* Waits of 1, 1, 2, 4, ... RTOs: the first two pings cover a lost
   * message quickly, the doubling then leaves room for a peer whose round
   * trip just grew. */
  pe->probe_deadline = f->now + (flow_live_rto(f, p) << (pe->probes_sent ? pe->probes_sent - 1 : 0));
  pe->probes_sent++;
  flow_send_ping(f, p, pe->probe_nonce, false);
}

static void suspect(flow *f, int p) {
  fpeer *pe = &f->peers[p];
  pe->suspect_since = f->now;
  pe->probes_sent = 0;
  char who[GW_ID_SHORT_LEN + 1];
  GW_DEBUG(f->cfg.log, "flow.peer_suspect", "peer=%s silent_ms=%llu rto_ms=%llu", flow_short(&pe->id, who),
           (unsigned long long)(f->now - pe->last_heard), (unsigned long long)flow_live_rto(f, p));
  send_probe(f, p);
}

/* The backstop: silence for peer_timeout_ticks while sharing segments. */
static bool silent_too_long(const flow *f, int p) {
  const fpeer *pe = &f->peers[p];
  uint64_t timeout = (uint64_t)f->tun.peer_timeout_ticks * f->tun.tick_ms;
  if (f->now < pe->last_heard + timeout) return false;
  uint64_t since = flow_newest_segment(f, p);
  return since != 0 && f->now >= since - 1 + timeout; /* nothing shared: requests find out by timing out */
}

static void presume_dead(flow *f, int p) {
  fpeer *pe = &f->peers[p];
  char who[GW_ID_SHORT_LEN + 1];
  GW_WARN(f->cfg.log, "flow.peer_silent", "peer=%s silent_ms=%llu pings=%d rto_ms=%llu", flow_short(&pe->id, who),
          (unsigned long long)(f->now - pe->last_heard), pe->probes_sent, (unsigned long long)flow_live_rto(f, p));
  pe->suspect_since = 0;
  pe->probes_sent = 0;
  flow_peer_down(f, p, false);
  flow_live_tell_gone(f, p);
}

/* Our other neighbours may hold its offers (and would request a dead peer,
 * then wait request_retry_ticks) or its state (and propose moves through
 * it): they are told at once, rather than each finding out alone. */
void flow_live_tell_gone(flow *f, int p) {
  for (int q = 0; q < f->n_peers; q++)
    if (q != p && f->peers[q].in_use && f->peers[q].alive) flow_send_gone(f, q, &f->peers[p].id);
}

void flow_live_on_gone(flow *f, int from, int q) {
  fpeer *pe = &f->peers[q];
  if (!pe->in_use || !pe->alive) return;
  char who[GW_ID_SHORT_LEN + 1], by[GW_ID_SHORT_LEN + 1];
  GW_DEBUG(f->cfg.log, "flow.peer_gone_heard", "peer=%s from=%s", flow_short(&pe->id, who),
           flow_short(&f->peers[from].id, by));
  /* Not a verdict of ours: what it offered and said is forgotten (it says
   * it again within a period if alive), and we look for ourselves. */
  flow_peer_clear_views(pe);
  f->state_dirty = true;
  if (f->pend.kind != REQ_NONE && (f->pend.peer == q || f->pend.my_next == q || f->pend.your_next == q ||
                                   f->pend.prev == q || f->pend.next == q))
    flow_clear_pending(f);
  if (flow_shares_segments(f, q) && !pe->suspect_since) suspect(f, q);
}

void flow_live_check(flow *f) {
  bool lost = false;
  for (int p = 0; p < f->n_peers; p++) {
    fpeer *pe = &f->peers[p];
    if (!pe->in_use || !pe->alive) continue;
    if (silent_too_long(f, p)) {
      presume_dead(f, p);
      lost = true;
    } else if (pe->suspect_since) {
      if (f->now < pe->probe_deadline) continue;
      if (pe->probes_sent < f->tun.probe_tries) {
        send_probe(f, p);
      } else {
        presume_dead(f, p);
        lost = true;
      }
    } else {
      uint64_t at = suspect_at(f, p);
      if (at && f->now >= at) suspect(f, p);
    }
  }
  /* What the dead peer held is to be rebuilt now, not at the next tick. */
  if (lost) {
    flow_flush_offers(f);
    if (f->tun.chain_requests && f->started) flow_try_request(f);
  }
  if (f->offer_flush && f->now >= f->offer_flush) flow_flush_offers(f);
}

uint64_t flow_live_next_wake(const flow *f) {
  uint64_t wake = UINT64_MAX;
  for (int p = 0; p < f->n_peers; p++) {
    const fpeer *pe = &f->peers[p];
    if (!pe->in_use || !pe->alive) continue;
    uint64_t at = pe->suspect_since ? pe->probe_deadline : suspect_at(f, p);
    if (at && at < wake) wake = at;
  }
  if (f->offer_flush && f->offer_flush < wake) wake = f->offer_flush;
  return wake;
}

void flow_arm(flow *f) {
  if (!f->started) return;
  if (f->offer_dirty && f->tun.offer_flush_ms && !f->offer_flush && f->now < f->rebuild_until)
    f->offer_flush = f->now + f->tun.offer_flush_ms;
  uint64_t at = f->next_tick, wake = flow_live_next_wake(f);
  if (wake < at) at = wake;
  if (at < f->now) at = f->now;
  f->cfg.io.want_tick(f->cfg.io.ud, at);
}

uint64_t flow_offer_hash(const flow *f) {
  uint64_t h = 1469598103934665603ULL ^ flow_spare(f);
  for (int u = 0; u < f->n_units; u++) {
    const gw_id *t = flow_offer_target(f, u);
    if (!t) continue;
    uint32_t count;
    double cost;
    flow_offer_for(f, t, &count, &cost);
    uint64_t bits;
    memcpy(&bits, &cost, sizeof(bits));
    for (size_t i = 0; i < sizeof(t->b); i++) h = (h ^ t->b[i]) * 1099511628211ULL;
    h = (h ^ count) * 1099511628211ULL;
    h = (h ^ bits) * 1099511628211ULL;
  }
  return h;
}

void flow_flush_offers(flow *f) {
  f->offer_flush = 0;
  uint64_t h = flow_offer_hash(f);
  if (h == f->offer_sent_hash) return; /* nothing new: the tick sends what is due */
  f->offer_sent_hash = h;
  for (int p = 0; p < f->n_peers; p++)
    if (f->peers[p].in_use && f->peers[p].alive && flow_peer_is_prev(f, p) && f->peers[p].cost_prev >= 0)
      flow_send_offer(f, p);
  f->offer_dirty = false;
}
