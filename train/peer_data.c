/* train/peer_data.c — the data node's side of an iteration (GWTF §IV):
 * which microbatches it starts and when (its share of the run's batch, a
 * backlog of those deferred by churn), whether every stage can take them
 * (routes, CAN_TAKE), and the end of each microbatch it owns (done,
 * deferred, lost), which closes the iteration; and what happens to its
 * microbatch on the way (its embedding sent to stage 1, its return from the
 * last stage and the loss, the trip deadline, the backward's end at stage 0).
 * The hop machinery both roles share is train/peer_mb.c, a relay's side of
 * a hop train/peer_relay.c; repairs are train/peer_repair.c. */
#include "train/peer_data.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_leader.h"
#include "train/peer_repair.h"
#include "train/peer_wire.h"
#include "util/err.h"

/* ---- data node: one iteration ---- */

static int backlog_push(train_peer *p, uint64_t iteration, uint32_t index) {
  size_t limit = (size_t)p->cfg.capacity; /* an iteration's worth: older work is dropped, not hoarded */
  if (p->n_backlog == limit) {
    memmove(p->backlog, p->backlog + 1, (p->n_backlog - 1) * sizeof(*p->backlog));
    p->n_backlog--;
    p->counters.lost_microbatches++;
  }
  if (p->n_backlog == p->cap_backlog) {
    size_t cap = p->cap_backlog ? 2 * p->cap_backlog : 16;
    void *nb = realloc(p->backlog, cap * sizeof(*p->backlog));
    if (!nb) return GW_ENOMEM;
    p->backlog = nb;
    p->cap_backlog = cap;
  }
  p->backlog[p->n_backlog].iteration = iteration;
  p->backlog[p->n_backlog].index = index;
  p->n_backlog++;
  return 0;
}

static uint32_t live_mbs(const train_peer *p) {
  uint32_t n = 0;
  for (size_t i = 0; i < p->n_mbs; i++)
    if (p->mbs[i].used && p->mbs[i].iteration == p->iteration) n++;
  return n;
}

static void data_refill(train_peer *p, uint32_t slot);

/* A repaired microbatch came home: how long its repairs took, and where:
 * find_s from the first RECOVER to the first REPAIR taken on (the walk to
 * the last live peer before the gap), rebuild_s from the last REPAIR taken
 * on to now (the re-sent segment's forward and the backward from there). */
static void log_recovered(train_peer *p, const peer_mb *mb) {
  double secs = (double)(p->now - mb->recover_started_ms) / 1000.0;
  double find = mb->first_taken_ms ? (double)(mb->first_taken_ms - mb->recover_started_ms) / 1000.0 : secs;
  double rebuild = mb->repair_taken_ms ? (double)(p->now - mb->repair_taken_ms) / 1000.0 : 0.0;
  p->counters.backward_recoveries++;
  GW_INFO(&p->log, "backward.recovered", "mb=%llx repairs=%u secs=%.3f find_s=%.3f rebuild_s=%.3f",
          (unsigned long long)mb->id, mb->repairs, secs, find, rebuild);
}

void data_mb_finished(train_peer *p, peer_mb *mb, mb_end how) {
  if (mb->eval) return eval_mb_finished(p, mb, how);
  mb->end = how;
  bool rerun = ledger_is_rerun(mb);
  if (rerun) {
    ledger_rerun_finished(p, mb, how == MB_COMPLETE); /* counted once already: no loss, no backlog */
  } else if (how == MB_COMPLETE) {
    p->iter_done++;
    p->iter_loss_sum += mb->loss;
    p->counters.microbatches_done++;
    /* its whole trip, for the communication time (trip minus compute) */
    GW_INFO(&p->log, "microbatch.done", "mb=%llx trip_s=%.4f iter=%llu attempt=%u", (unsigned long long)mb->id,
            (double)(p->now - mb->started_ms) / 1000.0, (unsigned long long)p->iteration, mb->attempt);
    if (mb->repairs > 0) log_recovered(p, mb);
  } else if (how == MB_DEFERRED) {
    p->iter_deferred++;
    p->counters.deferred_microbatches++;
    backlog_push(p, mb->id >> 20, (uint32_t)(mb->id & 0xfffff));
    GW_INFO(&p->log, "microbatch.deferred", "mb=%llx iter=%llu", (unsigned long long)mb->id,
            (unsigned long long)p->iteration);
  } else {
    p->counters.lost_microbatches++;
    GW_WARN(&p->log, "microbatch.lost", "mb=%llx iter=%llu", (unsigned long long)mb->id,
            (unsigned long long)p->iteration);
  }
  p->last_progress_ms = p->now;
  uint32_t slot = mb->index;
  mb_free(p, mb);
  if (how == MB_COMPLETE && !rerun) data_refill(p, slot);
  ledger_launch_reruns(p); /* a member on a completed microbatch's path died: before the iteration ends */
  if (p->iter_running && live_mbs(p) == 0) {
    p->iter_running = false;
    data_report_iteration(p);
  }
}

static int data_launch_attempt(train_peer *p, uint64_t orig_iteration, uint32_t index, uint32_t slot,
                               uint32_t attempt, uint64_t rerun_stages) {
  uint64_t id = (orig_iteration << 20) | index;
  peer_mb *mb = mb_new(p, &p->cfg.self, id);
  if (!mb) return GW_ENOMEM;
  mb->attempt = attempt;
  mb->rerun_stages = rerun_stages;
  mb->key = mb_key(&p->cfg.self, id, attempt);
  size_t bt = (size_t)p->cfg.shape.B * (size_t)p->cfg.shape.T;
  mb->iteration = p->iteration;
  mb->index = slot;
  mb->tokens = malloc(bt * sizeof(int32_t));
  mb->targets = malloc(bt * sizeof(int32_t));
  mb->out = malloc(peer_act_floats(p) * sizeof(float));
  if (!mb->tokens || !mb->targets || !mb->out ||
      p->sample(p->sample_ud, orig_iteration, index, mb->tokens, mb->targets) != 0) {
    mb_free(p, mb);
    return GW_EIO;
  }
  mb->fwd = FWD_EMBED;
  if (!peer_submit(p, TRAIN_JOB_EMBED, mb, mb->tokens, bt * sizeof(int32_t), mb->out,
                   peer_act_floats(p) * sizeof(float))) {
    mb_free(p, mb);
    return GW_EIO;
  }
  p->iter_sent++;
  return 0;
}

static int data_launch(train_peer *p, uint64_t orig_iteration, uint32_t index, uint32_t slot) {
  return data_launch_attempt(p, orig_iteration, index, slot, 0, 0);
}

int data_rerun(train_peer *p, uint64_t id, uint32_t attempt, uint64_t stages) {
  if (!p->iter_running || p->iter_wrap_up || p->aggregating) return GW_EAGAIN;
  if (mb_find(p, &p->cfg.self, id)) return GW_EEXIST; /* running again already */
  int rc = data_launch_attempt(p, id >> 20, (uint32_t)(id & 0xfffff), 0, attempt, stages);
  if (rc == 0) p->iter_sent--; /* not one of the iteration's microbatches: it takes no refill's turn */
  return rc;
}

/* The oldest microbatch waiting in the backlog, removed from it. */
static void backlog_pop(train_peer *p, uint64_t *iteration, uint32_t *index) {
  *iteration = p->backlog[0].iteration;
  *index = p->backlog[0].index;
  memmove(p->backlog, p->backlog + 1, (p->n_backlog - 1) * sizeof(*p->backlog));
  p->n_backlog--;
}

/* A microbatch came home, so its route is free again: the next one of this
 * iteration goes down it. A flow is a pipeline slot, not one microbatch per
 * iteration, so an iteration with fewer flows than microbatches trains them
 * all, in turns (the paper defers the rest to later iterations; its capacity
 * is memory, which a finished microbatch gives back) — until another data
 * node is done: then the rest wait for the next iteration (peer_agg.c). */
static void data_refill(train_peer *p, uint32_t slot) {
  if (!p->iter_running || p->iter_wrap_up || p->iter_sent >= p->cfg.capacity || p->n_backlog == 0) return;
  uint64_t it;
  uint32_t index;
  backlog_pop(p, &it, &index);
  if (data_launch(p, it, index, slot) == 0) {
    p->iter_deferred = (uint32_t)p->n_backlog;
    GW_DEBUG(&p->log, "microbatch.refill", "slot=%u iter=%llu", slot, (unsigned long long)p->iteration);
  } else {
    backlog_push(p, it, index);
  }
}

static bool every_stage_served(train_peer *p) {
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    bool any = false;
    for (size_t i = 0; i < p->members[s].n && !any; i++) any = peer_alive(p, &p->members[s].v[i].id);
    if (!any) return false;
  }
  return true;
}

/* This data node's share of the pipeline: the narrowest stage's capacity
 * (its live members' announced microbatch slots) over the live data nodes,
 * rounded up. Rounding down left a slot of an odd-sized narrowest stage idle
 * every iteration (3 slots, 2 data nodes: 1 microbatch each, one after
 * another); rounded up, the one microbatch too many waits for a slot
 * (FWD_WAIT) and takes it the moment it frees. */
uint32_t data_share(train_peer *p) {
  uint64_t narrowest = UINT64_MAX;
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    uint64_t cap = 0;
    for (size_t i = 0; i < p->members[s].n; i++)
      if (peer_alive(p, &p->members[s].v[i].id)) cap += p->members[s].v[i].capacity;
    if (cap < narrowest) narrowest = cap;
  }
  uint64_t data = 1; /* ourselves, whether or not the directory lists us yet */
  for (size_t i = 0; i < p->members[0].n; i++)
    if (!gw_id_eq(&p->members[0].v[i].id, &p->cfg.self) && peer_alive(p, &p->members[0].v[i].id)) data++;
  uint64_t share = narrowest == UINT64_MAX ? 0 : (narrowest + data - 1) / data;
  return share > UINT32_MAX ? UINT32_MAX : (uint32_t)share;
}

/* How long an iteration waits for a flow of ours before it starts on the
 * fallback (the cheapest live next-stage peer after load; a full peer
 * DENYs). The first iteration waits up to settle_ms (at start an empty
 * flow state looks settled too: no peer known, nothing asked). Later ones
 * wait flow_grace_ms, for flows that churn tore down and the flow protocol
 * is rebuilding; but not again right after an iteration that waited in
 * vain (`flowless`): in the grid of 2026-11-26, 12 of the 15 such waits of
 * hetero-churn10 ended without a flow, and in two of the three fault-free
 * hetero runs one data node had no flow all run and waited 1 s every
 * iteration. */
static uint64_t no_flow_grace(const train_peer *p) {
  if (p->iteration == 0) return p->cfg.tun.settle_ms;
  return p->flowless ? 0 : p->cfg.tun.flow_grace_ms;
}

/* How many microbatches the iteration can start with, once the routes allow
 * it; false: wait (data_tick asks again next tick). */
bool data_routes_ready(train_peer *p, uint32_t want, uint32_t *slots) {
  if (!p->waiting_flows_since) p->waiting_flows_since = p->now;
  uint64_t waited = p->now - p->waiting_flows_since;
  /* GWTF §V-C: training proceeds once the flows reached a steady state.
   * The first iteration waits for it (bounded); later ones use what is
   * there, since churn keeps flows changing. */
  if (p->iteration == 0 && p->router.settled && !p->router.settled(p->router.ctx, p->now) &&
      waited < p->cfg.tun.settle_ms)
    return false;
  /* No pipeline without a peer in every stage; no microbatch without a route. */
  bool served = every_stage_served(p);
  *slots = !served ? 0 : p->router.slots ? p->router.slots(p->router.ctx) : want;
  if (*slots > 0) p->flowless = false;
  if (*slots == 0 && served && waited >= no_flow_grace(p)) {
    GW_INFO(&p->log, "flows.none", "iter=%llu waited_ms=%llu routing=fallback", (unsigned long long)p->iteration,
            (unsigned long long)waited);
    p->flowless = p->iteration > 0;
    *slots = want;
  }
  if (*slots == 0 && waited < p->cfg.tun.settle_ms) {
    if (waited % 5000 < p->cfg.tun.tick_ms)
      GW_INFO(&p->log, "flows.waiting", "iter=%llu waited_s=%llu every_stage_served=%d",
              (unsigned long long)p->iteration, (unsigned long long)(waited / 1000), served);
    return false;
  }
  /* Still no route: report an empty iteration rather than hold up the other
   * data nodes, whose aggregation waits for every report. */
  if (*slots == 0)
    GW_WARN(&p->log, "iteration.no_route", "iter=%llu waited_s=%llu", (unsigned long long)p->iteration,
            (unsigned long long)(waited / 1000));
  return true;
}

void data_start_iteration(train_peer *p) {
  uint32_t want = p->cfg.capacity, slots;
  if (!data_routes_ready(p, want, &slots)) return;
  p->waiting_flows_since = 0;
  /* One microbatch per flow, and more, on the router's fallback, up to our
   * share of the narrowest stage: flows come and go as the protocol
   * re-optimizes them (Request Change tears one down before its replacement
   * is up), and a relay that is full answers DENY anyway. The rest follow
   * as microbatches come home. 0 after a fruitless wait: an empty iteration. */
  uint32_t share = data_share(p);
  uint32_t n = slots == 0 ? 0 : slots > share ? slots : share;
  if (n > want) n = want;
  if (p->iteration == 0) p->last_update_ms = p->now; /* the first iteration's clock starts now */
  p->iter_running = true;
  p->iter_reported = false;
  p->iter_wrap_up = false;
  p->iter_started_ms = p->now;
  p->last_progress_ms = p->now;
  p->iter_sent = p->iter_done = p->iter_deferred = 0;
  p->iter_loss_sum = 0;
  /* An iteration trains up to `want` microbatches: the ones carried over
   * from earlier iterations first, then new ones. */
  for (uint32_t k = 0; p->n_backlog < want; k++) backlog_push(p, p->iteration, k);
  uint32_t slot = 0;
  while (slot < n && p->n_backlog > 0) {
    uint64_t it;
    uint32_t index;
    backlog_pop(p, &it, &index);
    if (data_launch(p, it, index, slot) == 0) slot++;
  }
  p->iter_deferred = (uint32_t)p->n_backlog; /* carried to the next iteration */
  GW_INFO(&p->log, "iteration.started", "iter=%llu microbatches=%u routes=%u backlog=%zu",
          (unsigned long long)p->iteration, slot, slots, p->n_backlog);
  if (slot == 0) {
    p->iter_running = false;
    data_report_iteration(p);
  }
}

/* A slot index no microbatch of ours is using (its flow, in route_flow's
 * data_hop), the lowest. */
static uint32_t free_slot(const train_peer *p) {
  for (uint32_t slot = 0;; slot++) {
    bool used = false;
    for (size_t i = 0; i < p->n_mbs && !used; i++)
      used = p->mbs[i].used && !p->mbs[i].eval && p->mbs[i].index == slot && gw_id_eq(&p->mbs[i].origin, &p->cfg.self);
    if (!used) return slot;
  }
}

/* The iteration widens as the pipeline does: a relay that became ready in
 * the narrowest stage (a restarted peer placed there) or a flow that formed
 * after the iteration started lets the backlog go now, up to the new share,
 * rather than one microbatch per one that comes home. In the grid's churn
 * cells the iteration after a restart started at half the share (its
 * narrowest stage down to one relay) and ran its microbatches in two waves
 * while the restarted relay sat ready beside it (docs/TRAINING.md,
 * "Widening"). */
static void data_widen(train_peer *p) {
  if (p->cfg.tun.no_widen || p->iter_wrap_up || p->n_backlog == 0 || p->iter_sent >= p->cfg.capacity ||
      !every_stage_served(p))
    return;
  uint32_t slots = p->router.slots ? p->router.slots(p->router.ctx) : 0, share = data_share(p);
  uint32_t n = slots > share ? slots : share;
  if (n > p->cfg.capacity) n = p->cfg.capacity;
  uint32_t live = live_mbs(p), added = 0;
  while (live + added < n && p->n_backlog > 0 && p->iter_sent < p->cfg.capacity) {
    uint64_t it;
    uint32_t index;
    backlog_pop(p, &it, &index);
    if (data_launch(p, it, index, free_slot(p)) != 0) {
      backlog_push(p, it, index);
      break;
    }
    added++;
  }
  if (added == 0) return;
  p->iter_deferred = (uint32_t)p->n_backlog;
  p->counters.microbatches_widened += added;
  GW_INFO(&p->log, "iteration.widened", "iter=%llu added=%u in_flight=%u share=%u routes=%u backlog=%zu",
          (unsigned long long)p->iteration, added, live + added, share, slots, p->n_backlog);
}

void data_tick(train_peer *p) {
  if (p->state != PEER_READY || p->aggregating || p->finished) return;
  if (p->iter_running) {
    data_widen(p);
    if (p->now - p->last_progress_ms < p->cfg.tun.stall_timeout_ms) return;
    GW_WARN(&p->log, "iteration.stalled", "iter=%llu waited_s=%llu", (unsigned long long)p->iteration,
            (unsigned long long)(p->cfg.tun.stall_timeout_ms / 1000));
    for (size_t i = 0; i < p->n_mbs; i++)
      if (p->mbs[i].used && p->mbs[i].iteration == p->iteration && p->iter_running)
        data_mb_finished(p, &p->mbs[i], MB_DEFERRED);
    return;
  }
  if (p->iter_reported) return; /* waiting for the leader's aggregation */
  if (p->iteration > 0 && p->downstream_ready < p->iteration) return; /* no CAN_TAKE yet */
  if (eval_tick(p)) return; /* validation first, on the weights this iteration starts from */
  if (p->cfg.iterations && p->iteration >= p->cfg.iterations) {
    if (p->pipeline_ready < p->iteration) return; /* a later stage's last step is still on */
    p->finished = true;
    GW_INFO(&p->log, "run.finished", "iterations=%llu", (unsigned long long)p->iteration);
    return;
  }
  data_start_iteration(p);
}

/* ---- data node: its microbatch's trip through the pipeline ---- */

/* A data node gives a microbatch this long to travel the whole ring once
 * (forward, or backward): long enough for every hop's own timeout and
 * re-route, short enough that a path that broke without a word (a relay
 * dying after it acknowledged) does not hold the iteration until the stall
 * timeout. */
uint64_t data_trip_ms(const train_peer *p) { return p->cfg.tun.hop_timeout_ms * (uint64_t)(p->cfg.n_stages + 2); }

/* No peer of stage 1 takes our embedding. A data node answers to nobody but
 * its iteration: a full stage gets one trip to free a slot, then the
 * microbatch waits in the backlog for a later turn. So does a stage no peer
 * of which refused yet, but none is a hop yet either: at the start the
 * directory tells us the stage of a relay the leader just placed a second or
 * two later than data_share counts its slots (a CI run deferred the first
 * iteration's fourth microbatch that way). */
void data_no_route(train_peer *p, peer_mb *mb) {
  if (mb_wait_for_route(p, mb, data_trip_ms(p))) return;
  mb->wait_since = 0;
  GW_INFO(&p->log, "microbatch.no_route", "mb=%llx reroutes=%u", (unsigned long long)mb->id, mb->reroutes);
  data_mb_finished(p, mb, MB_DEFERRED);
}

/* Stage 1 holds our embedding and passed it on: the microbatch now travels
 * until it comes back; after a repair we re-sent our own embedding into, it
 * is already back and waits for its backward. */
void data_forward_through(train_peer *p, peer_mb *mb) {
  mb->fwd = !mb->repair ? FWD_FLIGHT : FWD_DONE;
  mb->trip_deadline = p->now + data_trip_ms(p);
  mb->flight_ms = p->now;
  /* Our re-send into a repair left with the path cut to us (the FORWARD
   * carries the path up to its sender); past the gap it is the one our
   * microbatch came back by, and its last relay holds our loss gradient:
   * we watch it again. Before, its death went unseen until the trip
   * deadline (hetero-churn20, a 16 s backward timeout). */
  if (!mb->repair || !mb->grad) return;
  mb->path_len = (uint32_t)p->cfg.n_stages + 1;
  if (!peer_alive(p, &mb->path[p->cfg.n_stages])) mb->bwd_deadline = p->now; /* lost meanwhile: report it now */
  repair_take_pending(p, mb); /* a break past the gap reported while our re-send was out */
}

static uint64_t longest_forward_trip(const train_peer *p) {
  uint64_t worst = 0;
  uint32_t n = p->n_fwd_trips < 8 ? p->n_fwd_trips : 8;
  for (uint32_t i = 0; i < n; i++)
    if (p->fwd_trips[i] > worst) worst = p->fwd_trips[i];
  return worst;
}

/* Churn takes several peers at once, and the two that held a microbatch
 * last (the one that passed it on, and the one it passed it to) can die
 * together: nobody holds the forward then, nobody is left to say so, and
 * the trip deadline (a hop timeout per stage, 16 s on the grid) deferred
 * it while its iteration waited; 6 of 59 churn runs of the grid did. A
 * forward that is only slow after the death has a hop timeout more than
 * the slowest of the last eight trips. */
void data_forward_at_risk(train_peer *p, peer_mb *mb, int stage) {
  if (mb->fwd != FWD_FLIGHT || mb->end != MB_LIVE || mb->eval || mb->at_risk_stage) return;
  uint64_t wait = p->cfg.tun.hop_timeout_ms + longest_forward_trip(p);
  mb->at_risk_stage = stage;
  if (p->now + wait < mb->trip_deadline) mb->trip_deadline = p->now + wait;
  p->counters.forwards_at_risk++;
  GW_INFO(&p->log, "forward.at_risk", "mb=%llx suspect_stage=%d wait_ms=%llu", (unsigned long long)mb->id, stage,
          (unsigned long long)(mb->trip_deadline - p->now));
}

void data_dropped_past_risk(train_peer *p, peer_mb *mb, const gw_id *from, const char *reason) {
  if (mb->fwd != FWD_FLIGHT || !mb->at_risk_stage || mb->end != MB_LIVE || !reason || strcmp(reason, "no_route") != 0)
    return;
  bool relay = false;
  for (int s = mb->at_risk_stage; s <= p->cfg.n_stages && !relay; s++) relay = peer_is_member(p, s, from, true);
  if (!relay) return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "forward.dropped", "mb=%llx by=%s reason=%s", (unsigned long long)mb->id, who, reason);
  if (p->iter_wrap_up) data_mb_finished(p, mb, MB_DEFERRED);
  else repair_restart_lost_forward(p, mb);
}

/* A live peer after the stage at risk reported that stage's peer lost as
 * the one before it (repair_report_early: a RECOVER we hold while mb is
 * out): it holds mb, whose forward got past. A report alone is not enough:
 * churn can take its reporter right after it (the test's double death
 * does). */
static bool forward_got_past(train_peer *p, const peer_mb *mb) {
  for (uint32_t i = 0; i < mb->n_reports; i++)
    if (mb->reports[i].stage == mb->at_risk_stage && peer_alive(p, &mb->reports[i].reporter)) return true;
  return false;
}

/* The at-risk deadline passed and mb is not back: it goes on with its
 * whole trip if it got past the lost peer (still at risk: a relay that
 * then drops it for want of a hop says so, data_dropped_past_risk), else
 * it is sent again. */
static void forward_overdue_at_risk(train_peer *p, peer_mb *mb) {
  if (forward_got_past(p, mb)) {
    mb->risk_waited = true;
    mb->trip_deadline = mb->flight_ms + data_trip_ms(p);
    return;
  }
  repair_restart_lost_forward(p, mb);
}

/* A FORWARD from the last stage: our own microbatch came back, and its loss
 * (and loss gradient) is ours to compute. */
void data_on_return(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t) {
  gw_id origin;
  id_from_bytes(&origin, m->origin);
  if (!gw_id_eq(&origin, &p->cfg.self)) return;
  peer_mb *mb = mb_find(p, &p->cfg.self, m->id);
  if (!mb || mb->attempt != m->attempt || (mb->fwd != FWD_SENT && mb->fwd != FWD_FLIGHT)) {
    /* A spare copy from a re-route, or a microbatch we gave up on: the
     * relays that carried it drop it (train/peer_relay.c, relay_drop_spare). */
    mb_deny(p, from, m, "duplicate");
    return;
  }
  if (m->n_path != (size_t)p->cfg.n_stages + 1) return;
  mb->path_len = (uint32_t)m->n_path;
  for (size_t i = 0; i < m->n_path; i++) id_from_bytes(&mb->path[i], m->path[i]);
  mb->next = *from;
  mb_ack(p, from, GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED, mb, NULL);
  if (mb->fwd == FWD_FLIGHT && mb->flight_ms && !mb->eval) p->fwd_trips[p->n_fwd_trips++ % 8] = p->now - mb->flight_ms;
  mb->at_risk_stage = 0;
  mb->risk_waited = false;
  size_t n = peer_act_floats(p);
  free(mb->in);
  mb->in = wire_act_decode(p, t, mb->tokens);
  if (mb->eval) return eval_on_return(p, mb);
  if (!mb->grad) mb->grad = malloc(n * sizeof(float)); /* reused by a restarted attempt */
  if (!mb->in || !mb->grad) return data_mb_finished(p, mb, MB_DEFERRED);
  mb->fwd = FWD_LOSS;
  if (!peer_submit(p, TRAIN_JOB_LOSS, mb, mb->in, n * sizeof(float), mb->grad, n * sizeof(float)))
    data_mb_finished(p, mb, MB_DEFERRED);
}

/* The gradient of our embedding output, from stage 1: the last backward. */
void data_on_backward(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t) {
  if (mb->fwd != FWD_DONE || mb->end != MB_LIVE) return;
  if (!mb_take_gradient(p, from, mb, t)) return;
  if (!peer_submit(p, TRAIN_JOB_EMBED_BACKWARD, mb, mb->in, peer_act_floats(p) * sizeof(float), NULL, 0))
    mb->bwd = BWD_NONE;
}

/* BACKWARD_DONE from the last relay: it holds our loss gradient. That ends
 * a repair only if that relay was the suspect. A repair of a gap further up
 * goes on: a late confirmation (it travels behind activations on a slow
 * link) used to end it silently, and the microbatch waited for its reporter
 * to time out again (3 hop timeouts) before a second repair. We keep the
 * loss gradient until the microbatch completes: we are the peer after the
 * gap if every relay of the path is lost. */
void data_backward_confirmed(train_peer *p, peer_mb *mb) {
  if (mb->recovering && mb->gap_last == p->cfg.n_stages) mb->recovering = false;
}

/* Our embedding of mb is computed: its path starts with us, and it goes to
 * stage 1 (a training or an eval microbatch alike). */
void data_send_embedding(train_peer *p, peer_mb *mb) {
  mb->path[0] = p->cfg.self;
  mb->path_len = 1;
  mb_send_forward(p, mb);
}

void data_job_done(train_peer *p, peer_mb *mb, train_job *job) {
  if (job->rc != 0) {
    data_mb_finished(p, mb, MB_DEFERRED);
    return;
  }
  switch (job->kind) {
  case TRAIN_JOB_EMBED:
    mb_log_compute(p, mb, "embed", job->seconds);
    mb->has_state = true;
    p->counters.forward_computed++;
    data_send_embedding(p, mb);
    break;
  case TRAIN_JOB_LOSS:
    mb_log_compute(p, mb, "loss", job->seconds);
    mb->loss = job->loss;
    mb->fwd = FWD_DONE;
    /* A hop-timeout per hop is generous for the backward too; past it the
     * microbatch is deferred rather than holding the iteration up longer. */
    mb->trip_deadline = p->now + data_trip_ms(p);
    mb_ack(p, &mb->next, GWTF__TRAIN_MSG__TRAIN_FORWARD_DONE, mb, NULL);
    free(mb->in);
    mb->in = NULL;
    mb_send_backward(p, mb);
    repair_take_pending(p, mb); /* a gap reported while the microbatch was out */
    break;
  case TRAIN_JOB_EMBED_BACKWARD:
    mb_log_compute(p, mb, "embed_backward", job->seconds);
    mb->has_state = false;
    mb->bwd = BWD_DONE;
    p->counters.backward_computed++;
    mb_ack(p, &mb->next, GWTF__TRAIN_MSG__TRAIN_BACKWARD_DONE, mb, NULL);
    ledger_on_backward(p, mb); /* the iteration's ledger: train/peer_ledger.h */
    data_mb_finished(p, mb, MB_COMPLETE);
    break;
  default: break;
  }
}

/* One of our microbatches at a tick: the hop deadlines every peer keeps
 * (mb_tick_hops), and the whole trip's. */
void data_mb_tick(train_peer *p, peer_mb *mb) {
  if (mb->fwd == FWD_WAIT && p->iter_wrap_up && !mb->repair && !mb->eval) {
    /* still outside the pipeline, and the iteration is closing */
    data_mb_finished(p, mb, MB_DEFERRED);
    return;
  }
  if (mb_tick_hops(p, mb)) return;
  bool travelling = mb->end == MB_LIVE && mb->bwd == BWD_NONE && (mb->fwd == FWD_FLIGHT || mb->fwd == FWD_DONE) &&
                    !mb->recovering;
  if (!travelling || !mb->trip_deadline || p->now < mb->trip_deadline) return;
  if (mb->fwd == FWD_FLIGHT && mb->at_risk_stage && !mb->risk_waited) {
    if (!p->iter_wrap_up) {
      forward_overdue_at_risk(p, mb);
      return;
    }
    /* Its short at-risk deadline passed as the iteration closes: deferred,
     * not a whole trip's timeout, and counted apart from one. */
    GW_WARN(&p->log, "forward.lost", "mb=%llx suspect_stage=%d action=defer", (unsigned long long)mb->id,
            mb->at_risk_stage);
    data_mb_finished(p, mb, MB_DEFERRED);
    return;
  }
  GW_WARN(&p->log, "microbatch.timeout", "mb=%llx phase=%s", (unsigned long long)mb->id,
          mb->fwd == FWD_FLIGHT ? "forward" : "backward");
  if (mb->fwd == FWD_DONE && p->cfg.recovery == TRAIN_RECOVER_RESTART) repair_restart_timed_out(p, mb);
  else data_mb_finished(p, mb, MB_DEFERRED);
}
