/* train/peer_repair.c — repairing a backward pass broken by a crash (GWTF §V-D).
 *
 * A peer whose gradient was not confirmed (no BACKWARD_DONE from the peer
 * before it on the path) reports RECOVER to the microbatch's origin. The
 * origin walks the stored path towards itself to find the last live peer L
 * before the gap, asking each member in turn (REPAIR) to re-send its stored
 * output to replacements of the lost stage(s); a member answers whether it
 * took the repair on (PROBE_REPLY), and one that cannot passes the walk on
 * to the member before it. The last replacement
 * tells the peer after the gap (REPAIR_READY), which re-sends its stored
 * gradient, and the backward pass resumes. Only the lost stages compute
 * again; nothing before the gap is recomputed.
 *
 * With TRAIN_RECOVER_RESTART (the SWARM baseline) there is no RECOVER: the
 * GWTF paper's SWARM "restarts pipelines after backward pass timeouts", so a
 * relay that lost its upstream peer only drops its state, and the origin
 * sends the microbatch through the whole pipeline again when its trip
 * deadline passes with no gradient back (or at once, when it was the origin's
 * own backward hop that failed: that it sees for itself). */
#include "train/peer_repair.h"

#include <stdlib.h>
#include <string.h>

static void short_of(const gw_id *id, char *out) { peer_short(id, out); }

/* RECOVER to mb's origin: `suspect`, at stage `stage` of its path, is gone;
 * we hold what comes after it (or, `forward`, we passed mb on to it). */
static void send_recover_of(train_peer *p, const peer_mb *mb, const gw_id *suspect, int stage, bool forward) {
  Gwtf__TrainRecover r = GWTF__TRAIN_RECOVER__INIT;
  r.id = mb->id;
  r.origin = id_bytes(&mb->origin);
  r.iteration = mb->iteration;
  r.suspect = id_bytes(suspect);
  r.suspect_stage = stage;
  r.reporter = id_bytes(&p->cfg.self);
  r.forward = forward;
  peer_send(p, &mb->origin, GWTF__TRAIN_MSG__TRAIN_RECOVER, &r.base, NULL);
}

static void send_recover(train_peer *p, const peer_mb *mb, int up) {
  send_recover_of(p, mb, &mb->path[up], up, false);
}

void repair_report_forward(train_peer *p, peer_mb *mb) {
  /* (a replacement inside a gap: the one after it holds the rebuilt output
   * and reports for itself, repair_on_recover's reach) */
  bool inside_gap = mb->repair && p->stage != mb->repair_end_stage;
  if (p->cfg.role != TRAIN_RELAY || p->cfg.recovery != TRAIN_RECOVER_PATH || mb->eval || inside_gap ||
      mb->fwd != FWD_DONE || mb->bwd != BWD_NONE || p->stage < 1 || p->stage >= p->cfg.n_stages)
    return;
  char who[GW_ID_SHORT_LEN + 1];
  send_recover_of(p, mb, &mb->next, p->stage + 1, true);
  short_of(&mb->next, who);
  p->counters.forwards_at_risk++;
  GW_INFO(&p->log, "forward.at_risk", "mb=%llx suspect=%s suspect_stage=%d", (unsigned long long)mb->id, who,
          p->stage + 1);
}

/* On the origin: the last relay did not confirm our loss gradient. */
static void report_origin(train_peer *p, peer_mb *mb, int up) {
  if (p->cfg.recovery == TRAIN_RECOVER_RESTART && peer_alive(p, &mb->path[up])) {
    /* SWARM has no chain of confirmations to read a silence from: while
     * the last relay is there, only the trip deadline (data_mb_tick) decides. */
    mb->bwd_deadline = UINT64_MAX;
    return;
  }
  repair_begin(p, mb, up, &p->cfg.self);
}

/* On a relay: the peer before us did not confirm our gradient. */
static void report_relay(train_peer *p, peer_mb *mb, int up) {
  if (up == 0) {
    /* The origin itself did not confirm: if it is gone, so is the microbatch. */
    if (!peer_alive(p, &mb->origin)) mb_free(p, mb);
    else mb->bwd_deadline = p->now + p->cfg.tun.hop_timeout_ms;
    return;
  }
  if (p->cfg.recovery == TRAIN_RECOVER_RESTART) {
    /* SWARM: no failure notice; the origin's timeout restarts the microbatch. */
    GW_INFO(&p->log, "backward.dropped", "mb=%llx reason=upstream_lost", (unsigned long long)mb->id);
    mb_free(p, mb);
    return;
  }
  char who[GW_ID_SHORT_LEN + 1];
  send_recover(p, mb, up);
  short_of(&mb->path[up], who);
  GW_WARN(&p->log, "peer.presumed_dead", "peer=%s mb=%llx waited_for=backward_done", who,
          (unsigned long long)mb->id);
  /* Wait for the rebuilt segment; report again if nothing comes. */
  mb->bwd_deadline = p->now + 3 * p->cfg.tun.hop_timeout_ms;
}

/* The peer before us on mb's path is lost (its session dropped) before our
 * gradient was due: the gap is reported now, not when the backward reaches
 * us. The origin has the segment rebuilt meanwhile (REPAIR_READY names the
 * replacement), so that our gradient goes straight to it; in the grid the
 * backward reached the peer after the gap a median 0.41 s after the death
 * (90th percentile 1.15 s), and only then did the repair begin. Not in
 * SWARM mode, which learns of failures by its timeouts. */
void repair_report_early(train_peer *p, peer_mb *mb) {
  int up = mb_upstream_stage(p);
  if (p->cfg.role != TRAIN_RELAY || p->cfg.recovery != TRAIN_RECOVER_PATH || p->cfg.tun.late_gap_report ||
      mb->eval || mb->gap_reported_early ||
      mb->bwd != BWD_NONE || up < 1 || (uint32_t)up >= mb->path_len)
    return;
  char who[GW_ID_SHORT_LEN + 1];
  send_recover(p, mb, up);
  short_of(&mb->path[up], who);
  p->counters.gaps_reported_early++;
  GW_INFO(&p->log, "backward.gap_reported", "mb=%llx suspect=%s early=1", (unsigned long long)mb->id, who);
  mb->gap_reported_early = true;
}

/* A peer holding an unconfirmed gradient asks for help (or, on the origin,
 * starts the repair itself: the last relay lost our loss gradient). In
 * SWARM mode nobody asks: relays drop the microbatch, and the origin acts
 * only on what it sees itself, its own session to the last relay. */
void repair_report(train_peer *p, peer_mb *mb) {
  int up = mb_upstream_stage(p);
  if (up < 0 || (uint32_t)up >= mb->path_len) return;
  if (p->cfg.role == TRAIN_DATA) report_origin(p, mb, up);
  else report_relay(p, mb, up);
}

/* SWARM baseline: send the stored embedding through the whole pipeline again. */
static void restart(train_peer *p, peer_mb *mb, const gw_id *suspect) {
  /* Relays key the new attempt apart from the old one; our own embedding
   * state stays under our key and is reused. */
  mb->attempt++;
  mb->repair = false;
  mb->recovering = false;
  mb->bwd = BWD_NONE;
  mb->grad_acked = false;
  mb->grad_due_ms = 0;
  mb->path_len = 1;
  mb->n_avoid = 0;
  mb->avoid_full = 0;
  if (suspect && mb->n_avoid < PEER_MAX_AVOID) mb->avoid[mb->n_avoid++] = *suspect;
  p->counters.forward_rerouted++;
  GW_INFO(&p->log, "backward.restarted", "mb=%llx attempt=%u", (unsigned long long)mb->id, mb->attempt);
  mb_send_forward(p, mb);
}

void repair_restart_lost_forward(train_peer *p, peer_mb *mb) {
  GW_WARN(&p->log, "forward.lost", "mb=%llx suspect_stage=%d action=restart attempt=%u", (unsigned long long)mb->id,
          mb->at_risk_stage, mb->attempt + 1);
  p->counters.forwards_restarted++;
  mb->at_risk_stage = 0;
  mb->risk_waited = false;
  mb->n_reports = 0; /* of the lost attempt's path */
  restart(p, mb, NULL);
}

/* SWARM baseline, on the origin: the backward did not come back within a
 * trip, and nobody says why. */
void repair_restart_timed_out(train_peer *p, peer_mb *mb) {
  if (++mb->repairs > p->cfg.tun.max_repairs) {
    data_mb_finished(p, mb, MB_LOST);
    return;
  }
  if (mb->repairs == 1) mb->recover_started_ms = p->now;
  GW_WARN(&p->log, "backward.failed", "mb=%llx suspect=unknown action=restart reason=timeout",
          (unsigned long long)mb->id);
  restart(p, mb, NULL);
}

static void probe_next(train_peer *p, peer_mb *mb);

/* Counts a repair of the break at `suspect`. The budget is per break: a
 * microbatch whose path breaks again at another peer once the first break
 * is mended (a second death on it, at 20 % churn) gets repairs of its own
 * for that one. Before, the budget was per microbatch: in the grid
 * (hetero-churn20 seed 121) four repairs of one break, whose only
 * replacement was full, used it up, and the death of a peer upstream then
 * lost the microbatch. Every stage's breaks together stay bounded. */
static bool repair_budget_left(train_peer *p, peer_mb *mb, const gw_id *suspect) {
  uint32_t max = p->cfg.tun.max_repairs;
  if (!gw_id_eq(suspect, &mb->break_suspect) || mb->repairs == 0) {
    mb->break_suspect = *suspect;
    mb->break_repairs = 0;
  }
  mb->repairs++;
  return ++mb->break_repairs <= max && mb->repairs <= max * (uint32_t)p->cfg.n_stages;
}

void repair_begin(train_peer *p, peer_mb *mb, int suspect_stage, const gw_id *target) {
  char who[GW_ID_SHORT_LEN + 1];
  if (mb->recovering || suspect_stage < 1 || suspect_stage > p->cfg.n_stages) return;
  const gw_id *suspect = &mb->path[suspect_stage];
  if (p->router.peer_failed) p->router.peer_failed(p->router.ctx, suspect);
  if (!repair_budget_left(p, mb, suspect)) {
    data_mb_finished(p, mb, MB_LOST);
    return;
  }
  if (mb->repairs == 1) mb->recover_started_ms = p->now;
  short_of(suspect, who);
  if (p->cfg.recovery == TRAIN_RECOVER_RESTART) {
    GW_WARN(&p->log, "backward.failed", "mb=%llx suspect=%s suspect_stage=%d action=restart", (unsigned long long)mb->id,
            who, suspect_stage);
    restart(p, mb, suspect);
    return;
  }
  p->counters.repairs_started++;
  GW_WARN(&p->log, "backward.recovery_started", "mb=%llx suspect=%s suspect_stage=%d repair=%u",
          (unsigned long long)mb->id, who, suspect_stage, mb->repairs);
  mb->recovering = true;
  mb->gap_last = suspect_stage;
  mb->gap_target = *target;
  mb->probe_stage = suspect_stage - 1;
  probe_next(p, mb);
}

/* L took the repair on (or we re-send our own embedding): the rebuilt
 * segment and the rest of the backward have as long as a trip. That holds
 * for our wait on the last relay's BACKWARD_DONE too: it cannot confirm
 * our loss gradient before the gap upstream of it is rebuilt. A death of
 * it still shows at once (its session drops, or a probe goes unanswered);
 * only the cap on a live, answering relay moves. Before, a rebuild slower
 * than that cap (3 hop timeouts) made us suspect the live last relay, and
 * a second repair rebuilt its stage as well (test_slow_rebuild_keeps_the_
 * last_relay; swarm_backward_crash under load).
 * When the gap is the last stage, we are the peer after it: the last relay
 * we wait on is the dead one, and what we wait for is REPAIR_READY (which
 * re-sends our loss gradient and sets new deadlines). Before, our next tick
 * found that dead relay again and began a new repair, every tick until a
 * slow REPAIR_READY came: four ticks used up the break's repairs and lost
 * the microbatch (test_slow_rebuild_of_the_last_stage). Should the peer
 * re-sending into the gap die before its FORWARD left, the trip deadline
 * defers the microbatch; it re-sends at once on our REPAIR, so that window
 * is short, while re-repairing on its death at any time would rebuild the
 * gap twice whenever it died after re-sending. */
_Static_assert(PEER_MAX_STAGES <= 64, "peer_mb.rebuilt has a bit per stage");

/* peer_mb.rebuilt's bit for stage s (1..PEER_MAX_STAGES). */
static uint64_t stage_bit(int s) { return 1ull << (s - 1); }

static void repair_taken(train_peer *p, peer_mb *mb) {
  mb->recovering = false;
  for (int s = mb->probe_stage + 1; s <= mb->gap_last; s++) mb->rebuilt |= stage_bit(s);
  mb->trip_deadline = p->now + data_trip_ms(p);
  if (mb->bwd_cap < mb->trip_deadline) mb->bwd_cap = mb->trip_deadline;
  if (gw_id_eq(&mb->gap_target, &p->cfg.self)) mb->bwd_deadline = mb->trip_deadline;
  if (!mb->repair_taken_ms) mb->first_taken_ms = p->now;
  mb->repair_taken_ms = p->now;
}

/* Asks L to re-send its output into the gap [first, mb->gap_last]. The
 * REPAIR is also the walk's probe: L answers whether it took the repair on
 * (repair_on_probe_reply). Before, the origin probed L and sent the REPAIR
 * on its answer, one round trip to L more before anything was re-sent (on
 * the grid's geo links up to 0.4 s of a repair's median 0.24–0.49 s). */
static void send_repair(train_peer *p, peer_mb *mb, const gw_id *L, int first) {
  char who[GW_ID_SHORT_LEN + 1];
  Gwtf__TrainRepair r = GWTF__TRAIN_REPAIR__INIT;
  ProtobufCBinaryData path[PEER_MAX_PATH], avoid[PEER_MAX_PATH];
  r.id = mb->id;
  r.origin = id_bytes(&mb->origin);
  r.iteration = mb->iteration;
  r.gap_first_stage = first;
  r.gap_last_stage = mb->gap_last;
  r.target = id_bytes(&mb->gap_target);
  for (int s = 0; s < first; s++) path[s] = id_bytes(&mb->path[s]);
  r.n_path = (size_t)first;
  r.path = path;
  for (int s = first; s <= mb->gap_last; s++) avoid[s - first] = id_bytes(&mb->path[s]);
  r.n_avoid = (size_t)(mb->gap_last - first + 1);
  r.avoid = avoid;
  short_of(L, who);
  GW_INFO(&p->log, "backward.repair", "mb=%llx resend_from=%s gap=%d..%d", (unsigned long long)mb->id, who, first,
          mb->gap_last);
  if (gw_id_eq(L, &p->cfg.self)) {
    repair_taken(p, mb);
    repair_on_repair(p, &p->cfg.self, &r);
    repair_take_pending(p, mb); /* a break reported meanwhile */
  } else {
    peer_send(p, L, GWTF__TRAIN_MSG__TRAIN_REPAIR, &r.base, NULL);
    mb->probe_deadline = p->now + p->cfg.tun.probe_timeout_ms;
  }
}

static void probe_next(train_peer *p, peer_mb *mb) {
  while (mb->probe_stage >= 1) {
    const gw_id *peer = &mb->path[mb->probe_stage];
    if (peer_alive(p, peer)) {
      send_repair(p, mb, peer, mb->probe_stage + 1);
      return;
    }
    mb->probe_stage--;
  }
  /* Every relay before the gap is gone too: we re-send our own embedding. */
  send_repair(p, mb, &p->cfg.self, 1);
}

/* A RECOVER comes from the peer after the suspect on the microbatch's path.
 * The path we hold names the peers our forward went through; a stage a
 * repair re-sent into has a replacement we never heard of (REPAIR_READY
 * goes to the peer after the gap). Its RECOVER counts when the reporter's
 * stage is one of those: the path takes the reporter, and the suspect it
 * names when the suspect's stage was rebuilt too. Before, it was dropped,
 * the reporter asked again every three hop timeouts, and the trip deadline
 * deferred the microbatch 16 s on (grid of 2026-11-26, homo-churn20: 3
 * microbatches). */
static bool recover_on_path(peer_mb *mb, int suspect_stage, const gw_id *from, ProtobufCBinaryData suspect_bytes) {
  int at = suspect_stage + 1;
  gw_id suspect;
  id_from_bytes(&suspect, suspect_bytes);
  if (!gw_id_eq(&mb->path[at], from) && !(mb->rebuilt & stage_bit(at))) return false;
  mb->path[at] = *from;
  if (mb->rebuilt & stage_bit(suspect_stage)) mb->path[suspect_stage] = suspect;
  return true;
}

/* A report for a stage already held replaces it; with no room, the oldest
 * goes (its reporter asks again after three hop timeouts). */
static void hold_report(peer_mb *mb, int stage, const gw_id *suspect, const gw_id *reporter) {
  uint32_t i = 0;
  while (i < mb->n_reports && mb->reports[i].stage != stage) i++;
  if (i == PEER_MB_REPORTS) {
    memmove(&mb->reports[0], &mb->reports[1], (PEER_MB_REPORTS - 1) * sizeof(mb->reports[0]));
    i = PEER_MB_REPORTS - 1;
  } else if (i == mb->n_reports) {
    mb->n_reports++;
  }
  mb->reports[i] = (mb_report){.stage = stage, .suspect = *suspect, .reporter = *reporter};
}

/* The last replacement of the gap we had rebuilt reports the repair's
 * target, the peer after the gap, gone before the gradient it was to
 * re-send reached the replacement: that gradient died with it. The peer
 * after the target, had it kept its own (it does until the target's
 * upstream confirms), reports the target itself; when every peer after the
 * target is gone too, nobody holds the backward but us, with our loss
 * gradient. We have the stages from the target to the last rebuilt from
 * the replacement's output and re-send our loss gradient on REPAIR_READY,
 * as for a gap in the last stage. Before, nobody reported it and the trip
 * deadline deferred the microbatch 16 s on (homo-churn10 seed 170: a
 * repair's target died 0.12 s after re-sending, the last stage's peer just
 * before). Only the repair we know of: the target it named, a path after
 * it that no repair rebuilt (we would not know who holds what there). */
static void target_lost(train_peer *p, peer_mb *mb, int stage, const gw_id *from, ProtobufCBinaryData suspect_bytes) {
  int S = p->cfg.n_stages;
  gw_id suspect;
  id_from_bytes(&suspect, suspect_bytes);
  if (mb->recovering || !mb->grad || stage != mb->gap_last + 1 || !gw_id_eq(&suspect, &mb->gap_target) ||
      (uint32_t)S + 1 != mb->path_len)
    return;
  /* the gap's last replacement: a repair past the target starts from its
   * output, whoever asks for it (the peer after the target, or us) */
  mb->path[stage - 1] = *from;
  for (int s = stage + 1; s <= S; s++)
    if ((mb->rebuilt & stage_bit(s)) || peer_alive(p, &mb->path[s])) return;
  char who[GW_ID_SHORT_LEN + 1];
  short_of(&suspect, who);
  GW_INFO(&p->log, "backward.target_lost", "mb=%llx target=%s target_stage=%d", (unsigned long long)mb->id, who, stage);
  p->counters.repair_targets_lost++;
  mb->grad_acked = false; /* our loss gradient goes out again, on REPAIR_READY */
  repair_begin(p, mb, S, &p->cfg.self);
}

void repair_on_recover(train_peer *p, const gw_id *from, const Gwtf__TrainRecover *r) {
  gw_id origin, reporter;
  if (p->cfg.role != TRAIN_DATA || r->origin.len != GW_ID_BYTES) return;
  id_from_bytes(&origin, r->origin);
  id_from_bytes(&reporter, r->reporter);
  if (!gw_id_eq(&origin, &p->cfg.self) || !gw_id_eq(&reporter, from)) return;
  peer_mb *mb = mb_find(p, &origin, r->id);
  if (!mb || mb->bwd != BWD_NONE || mb->end != MB_LIVE) return;
  if (r->forward) {
    /* from the peer before the suspect: a directory member of that stage */
    if (r->suspect_stage < 2 || r->suspect_stage > p->cfg.n_stages || r->suspect.len != GW_ID_BYTES ||
        !peer_is_member(p, r->suspect_stage - 1, from, true))
      return;
    if (mb->fwd == FWD_DONE) target_lost(p, mb, (int)r->suspect_stage, from, r->suspect);
    else data_forward_at_risk(p, mb, r->suspect_stage);
    return;
  }
  if (r->suspect_stage < 1 || r->suspect_stage >= p->cfg.n_stages || r->suspect.len != GW_ID_BYTES) return;
  bool out = mb->fwd == FWD_SENT || mb->fwd == FWD_FLIGHT || mb->fwd == FWD_LOSS;
  gw_id suspect;
  id_from_bytes(&suspect, r->suspect);
  bool walking_it = mb->recovering && mb->gap_last >= 1 && (uint32_t)mb->gap_last < mb->path_len &&
                    gw_id_eq(&mb->path[mb->gap_last], &suspect);
  if (out || (mb->recovering && !walking_it)) {
    /* Not now. Reported early (repair_report_early), the microbatch may
     * still be out: we learn its path when it is back, and mend the gap as
     * soon as our loss gradient is out. Or our own re-send into another
     * gap is out, the path cut to us until stage 1 passes it on
     * (data_forward_through takes it then). Or another break is being
     * walked (one walk at a time): this one follows once that repair is
     * taken on. Before, such a report was dropped while a walk or our
     * re-send was on, and its reporter asked again only three hop
     * timeouts later. */
    hold_report(mb, (int)r->suspect_stage, &suspect, &reporter);
    return;
  }
  if (mb->fwd != FWD_DONE || mb->recovering || !recover_on_path(mb, r->suspect_stage, from, r->suspect)) return;
  repair_begin(p, mb, r->suspect_stage, from);
}

/* Whether a held report still fits the path the microbatch took. */
static bool report_fits(peer_mb *mb, const mb_report *r) {
  return mb->fwd == FWD_DONE && mb->bwd == BWD_NONE && mb->end == MB_LIVE && (uint32_t)r->stage + 1 < mb->path_len &&
         gw_id_eq(&mb->path[r->stage], &r->suspect) &&
         recover_on_path(mb, r->stage, &r->reporter, id_bytes(&r->suspect));
}

void repair_take_pending(train_peer *p, peer_mb *mb) {
  while (mb->n_reports && !mb->recovering && mb->end == MB_LIVE) {
    /* Our own re-send into a gap is out: the path is cut to us until stage
     * 1 passes it on, and data_forward_through takes the reports then.
     * Before, they were taken here, fitted nothing and were dropped (a
     * second break found only by suspecting the last relay, 1.6 s). */
    if (mb->fwd != FWD_DONE) return;
    mb_report r = mb->reports[0];
    memmove(&mb->reports[0], &mb->reports[1], (mb->n_reports - 1) * sizeof(mb->reports[0]));
    mb->n_reports--;
    if (report_fits(mb, &r)) repair_begin(p, mb, r.stage, &r.reporter); /* one walk; the rest follow it */
  }
}

/* We passed the microbatch on and still hold our output, its gradient not
 * yet back: we can re-send it into a gap after us. */
static bool can_resend(const peer_mb *mb) {
  bool passed_on = mb && (mb->fwd == FWD_DONE || mb->fwd == FWD_SENT || mb->fwd == FWD_WAIT);
  return passed_on && mb->out && mb->bwd == BWD_NONE;
}

static void probe_reply(train_peer *p, const gw_id *to, uint64_t id, const peer_mb *mb, bool has_output) {
  Gwtf__TrainProbeReply r = GWTF__TRAIN_PROBE_REPLY__INIT;
  r.id = id;
  r.stage = p->stage;
  r.has_output = has_output;
  r.has_grad = mb && mb->bwd != BWD_NONE;
  peer_send(p, to, GWTF__TRAIN_MSG__TRAIN_PROBE_REPLY, &r.base, NULL);
}

/* A PROBE (an origin of an earlier version walks the path with it before
 * its REPAIR): whether we could re-send. */
void repair_on_probe(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a) {
  gw_id origin;
  if (a->origin.len != GW_ID_BYTES) return;
  id_from_bytes(&origin, a->origin);
  if (!gw_id_eq(&origin, from)) return; /* only the origin probes its microbatches */
  peer_mb *mb = mb_find(p, &origin, a->id);
  probe_reply(p, from, a->id, mb, can_resend(mb));
}

void repair_on_probe_reply(train_peer *p, const gw_id *from, const Gwtf__TrainProbeReply *r) {
  peer_mb *mb = mb_find(p, &p->cfg.self, r->id);
  if (!mb || !mb->recovering || mb->probe_stage < 1 || !gw_id_eq(&mb->path[mb->probe_stage], from)) return;
  if (r->has_grad && mb->probe_stage == mb->gap_last - 1) {
    /* The gradient already got past the peer we suspected: nothing is
     * broken. Release the reporter from its wait on our behalf. */
    mb->recovering = false;
    GW_INFO(&p->log, "backward.recovery_cancelled", "mb=%llx reason=already_past", (unsigned long long)mb->id);
    if (!gw_id_eq(&mb->gap_target, &p->cfg.self)) {
      mb_ack(p, &mb->gap_target, GWTF__TRAIN_MSG__TRAIN_BACKWARD_DONE, mb, NULL);
    } else if (!mb->grad_acked) {
      /* We reported ourselves: the last relay took our loss gradient,
       * passed its own on and died before its BACKWARD_DONE. Our wait is
       * over. Before, our deadline fired again at the next tick, and four
       * such repairs of one break lost the microbatch (a homo-churn10
       * run, 2026-11-28). */
      mb->grad_acked = true;
      data_backward_confirmed(p, mb);
    }
    /* A break reported while this walk was on waited behind it: its turn
     * now, not its reporter's next ask three hop timeouts later (a 6 s
     * backward stall in a homo-churn20 run). */
    repair_take_pending(p, mb);
    return;
  }
  if (r->has_output) {
    repair_taken(p, mb); /* it re-sends into the gap (send_repair) */
    repair_take_pending(p, mb); /* a break reported meanwhile */
    return;
  }
  mb->probe_stage--;
  probe_next(p, mb);
}

/* On L: re-send our stored output into the gap. */
void repair_on_repair(train_peer *p, const gw_id *from, const Gwtf__TrainRepair *r) {
  gw_id origin;
  if (r->origin.len != GW_ID_BYTES) return;
  id_from_bytes(&origin, r->origin);
  if (!gw_id_eq(&origin, from) && !gw_id_eq(&origin, &p->cfg.self)) return;
  peer_mb *mb = mb_find(p, &origin, r->id);
  bool self = gw_id_eq(from, &p->cfg.self);
  bool fits = r->gap_first_stage == p->stage + 1 && r->gap_last_stage >= r->gap_first_stage &&
              r->gap_last_stage <= p->cfg.n_stages;
  bool take = mb && mb->out && fits && (self || can_resend(mb));
  /* the origin's walk goes on from our answer (repair_on_probe_reply) */
  if (!self) probe_reply(p, from, r->id, mb, take);
  if (!take) {
    GW_WARN(&p->log, "backward.repair_refused", "mb=%llx have=%d", (unsigned long long)r->id, mb != NULL);
    return;
  }
  mb->repair = true;
  mb->repair_end_stage = r->gap_last_stage;
  id_from_bytes(&mb->repair_target, r->target);
  mb->n_avoid = 0;
  mb->avoid_full = 0;
  mb->wait_since = 0;
  for (size_t i = 0; i < r->n_avoid && mb->n_avoid < PEER_MAX_AVOID; i++)
    id_from_bytes(&mb->avoid[mb->n_avoid++], r->avoid[i]);
  mb->path_len = (uint32_t)p->stage + 1; /* the path up to us is still valid */
  mb->reroutes = 0;
  mb_send_forward(p, mb);
}

/* On the peer after the gap: the rebuilt segment is in place. */
void repair_on_ready(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m) {
  gw_id origin;
  char who[GW_ID_SHORT_LEN + 1];
  if (m->origin.len != GW_ID_BYTES || m->n_path == 0 || m->n_path > PEER_MAX_PATH) return;
  id_from_bytes(&origin, m->origin);
  peer_mb *mb = mb_find(p, &origin, m->id);
  /* our gradient out and unconfirmed, or (a gap reported early) not due yet */
  bool waiting = mb && mb->grad && !mb->grad_acked && (p->cfg.role == TRAIN_DATA || mb->bwd == BWD_DONE);
  bool ahead = mb && mb->gap_reported_early && mb->bwd != BWD_DONE;
  if (!waiting && !ahead) return;
  int up = mb_upstream_stage(p);
  if ((int)m->n_path != up + 1) return;
  gw_id via;
  id_from_bytes(&via, m->path[up]);
  if (!gw_id_eq(&via, from)) return;
  mb->path[up] = via;
  for (int s = 0; s < up; s++) id_from_bytes(&mb->path[s], m->path[s]);
  mb->recovering = false;
  mb->gap_reported_early = false;
  char org[GW_ID_SHORT_LEN + 1];
  short_of(from, who);
  short_of(&mb->origin, org);
  if (!waiting) {
    /* rebuilt before the gradient reached us: it goes to `from` when it does */
    p->counters.gaps_rebuilt_ahead++;
    GW_INFO(&p->log, "backward.rebuilt_ahead", "mb=%llx via=%s origin=%s", (unsigned long long)mb->id, who, org);
    return;
  }
  /* held_s: how long our gradient waited for the gap to be mended, what
   * the break cost this microbatch here */
  double held = mb->grad_due_ms ? (double)(p->now - mb->grad_due_ms) / 1000.0 : 0.0;
  GW_INFO(&p->log, "backward.resumed", "mb=%llx via=%s origin=%s held_s=%.3f", (unsigned long long)mb->id, who, org,
          held);
  mb_send_backward(p, mb);
}

void repair_tick(train_peer *p) {
  if (p->cfg.role != TRAIN_DATA) return;
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used || !mb->recovering || mb->probe_stage < 1 || p->now < mb->probe_deadline) continue;
    mb->probe_stage--; /* no answer: presumed dead, keep walking */
    probe_next(p, mb);
  }
}

/* The peer a walk asked to re-send into the gap died before answering: the
 * walk goes on to the peer before it now, not at the probe's deadline.
 * Before, it waited out the deadline (1 s) though the death was known (a
 * homo-churn10 run: a repair's re-send source died 0.2 s after the REPAIR,
 * and the walk stood still for 0.8 s more). */
void repair_peer_down(train_peer *p, const gw_id *peer) {
  if (p->cfg.role != TRAIN_DATA) return;
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used || !mb->recovering || mb->probe_stage < 1 || !gw_id_eq(&mb->path[mb->probe_stage], peer)) continue;
    char who[GW_ID_SHORT_LEN + 1];
    short_of(peer, who);
    GW_INFO(&p->log, "backward.walk_stepped", "mb=%llx dead=%s stage=%d", (unsigned long long)mb->id, who,
            mb->probe_stage);
    p->counters.walks_stepped_on_death++;
    mb->probe_stage--;
    probe_next(p, mb);
  }
}
