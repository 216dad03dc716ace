/* train/peer_relay.c — what happens to a microbatch at a relay: its hop
 * (GWTF §IV, §V-D forward part).
 *
 * A relay of stage s takes a FORWARD from stage s-1 (or the data node), runs
 * its forward, passes its output on to stage s+1 (the last stage: back to
 * the microbatch's origin), and later runs the backward on the gradient that
 * comes back and passes its own gradient upstream. It confirms each hop
 * twice, one hop late: FORWARD_DONE upstream once the next peer holds our
 * output, BACKWARD_DONE downstream once the peer before us holds our
 * gradient, so a relay that dies between computing and delivering always
 * leaves a live peer waiting on it (train/peer_mb.c says how).
 *
 * The microbatch table, re-routing, the acknowledgements and the deadlines
 * both roles keep are train/peer_mb.c; the data node's side of a
 * microbatch is train/peer_data.c; reporting a lost upstream peer is
 * train/peer_repair.c. */
#include "train/peer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_repair.h"
#include "train/peer_trust.h"
#include "train/peer_wire.h"

/* ---- forward ---- */

static bool accept_iteration(train_peer *p, const Gwtf__TrainMicrobatch *m, bool *queue, const char **why) {
  *queue = false;
  if (m->iteration < p->iteration) return (*why = "stale_iteration"), false;
  if (m->iteration > p->iteration + 1) return (*why = "future_iteration"), false;
  if (m->iteration == p->iteration && p->aggregating) return (*why = "aggregating"), false;
  /* Upstream already started the next iteration: hold it until our own
   * aggregation has updated the weights it must run on. */
  if (m->iteration == p->iteration + 1) *queue = true;
  /* A relay the leader moves once this round is done would only carry the
   * next iteration's microbatches away with it: the sender picks another. */
  if (p->rep.move_pending && m->iteration >= p->rep.move_after && !p->cfg.tun.move_drops_held)
    return (*why = "moving"), false;
  return true;
}

static bool submit_forward(train_peer *p, peer_mb *mb) {
  size_t n = peer_act_floats(p);
  mb->fwd = FWD_COMPUTE;
  return peer_submit(p, mb->eval ? TRAIN_JOB_EVAL_FORWARD : TRAIN_JOB_FORWARD, mb, mb->in, n * sizeof(float),
                     mb->out, n * sizeof(float));
}

/* Microbatches we hold at most once m is in: a repair rebuilding a gap may
 * take one of the reserve slots. A full replacement used to deny it, and
 * each "full" cost the peer re-sending a round trip to the next candidate
 * or a wait for a slot: in the grid of 2026-11-26, the 14 of 100 repairs
 * that met one took 0.24-3 s to the rebuilt forward (median 0.8 s, against
 * 0.2 s for the others), most of the slow tail; a stage is full exactly
 * when its members carry the most flows. */
static uint32_t relay_admits(const train_peer *p, const Gwtf__TrainMicrobatch *m) {
  return p->cfg.capacity + (m->repair ? p->cfg.tun.repair_reserve : 0);
}

/* ---- waiting for a slot ---- */

/* A sender that found our stage full asks us (wait_for_slot) to keep its
 * microbatch until one of our slots frees rather than DENY it: each "full"
 * cost it a round trip and a transfer, and while every peer of the stage
 * was full it went on bouncing between them, so a slot that freed was
 * taken by whichever retry came next. In a hetero-churn20 run (seed 121)
 * a data node's microbatches bounced between the two full relays of
 * stage 1 for up to 3 s. Waiting here, one starts the moment a slot frees.
 * It holds its input (one activation), not a slot's stored activations;
 * at most tun.slot_wait of them wait, oldest first. Not a repair (it has
 * the reserve) nor one that waits for our aggregation (FWD_QUEUED). */
static uint32_t slot_waiting(const train_peer *p) {
  uint32_t n = 0;
  for (size_t i = 0; i < p->n_mbs; i++) n += p->mbs[i].used && p->mbs[i].fwd == FWD_SLOT;
  return n;
}

static bool may_wait_for_slot(const train_peer *p, const Gwtf__TrainMicrobatch *m, bool queue) {
  return m->wait_for_slot && !m->repair && !queue && slot_waiting(p) < p->cfg.tun.slot_wait;
}

/* mb came while we were full: it waits, holding no slot; its sender hears
 * FORWARD_RECEIVED "queued" (its output is held here) and waits on. */
static void slot_wait_begin(train_peer *p, peer_mb *mb) {
  mb->fwd = FWD_SLOT;
  mb->slot_freed = true;
  p->held--;
  p->counters.slot_waits++;
  mb_ack(p, &mb->prev, GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED, mb, "queued");
  GW_DEBUG(&p->log, "forward.slot_wait", "mb=%llx held=%u waiting=%u", (unsigned long long)mb->id, p->held,
           slot_waiting(p));
}

static peer_mb *oldest_waiting(train_peer *p) {
  peer_mb *best = NULL;
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (mb->used && mb->fwd == FWD_SLOT && (!best || mb->started_ms < best->started_ms)) best = mb;
  }
  return best;
}

/* A waiting microbatch we will not run after all: its sender, which holds
 * its output (FORWARD_RECEIVED said "queued"), re-routes it on the DENY. */
static void give_back(train_peer *p, peer_mb *mb, const char *reason) {
  Gwtf__TrainMicrobatch m;
  ProtobufCBinaryData path[PEER_MAX_PATH];
  mb_fill_msg(&m, path, mb);
  mb_deny(p, &mb->prev, &m, reason);
  mb_free(p, mb);
}

/* Gives what waits for a slot the ones that are free, oldest first: its
 * forward starts, and a second FORWARD_RECEIVED tells the sender so (its
 * deadline on us is a compute's again). One whose iteration closed
 * meanwhile goes back to the sender. */
void relay_take_free_slots(train_peer *p) {
  peer_mb *mb;
  while (p->held < p->cfg.capacity && (mb = oldest_waiting(p))) {
    mb->slot_freed = false;
    p->held++;
    if (mb->iteration != p->iteration || p->aggregating) {
      give_back(p, mb, mb->iteration < p->iteration ? "stale_iteration" : "aggregating");
      continue;
    }
    GW_INFO(&p->log, "forward.slot_taken", "mb=%llx waited_ms=%llu", (unsigned long long)mb->id,
            (unsigned long long)(p->now - mb->started_ms));
    mb_ack(p, &mb->prev, GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED, mb, NULL);
    if (!submit_forward(p, mb)) give_back(p, mb, "compute_unavailable");
  }
}

void relay_on_forward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t) {
  gw_id origin;
  const char *why = NULL;
  bool queue;
  if (p->state != PEER_READY) return mb_deny(p, from, m, "not_ready");
  id_from_bytes(&origin, m->origin);
  if (!accept_iteration(p, m, &queue, &why)) {
    behind_note_future(p, from, &origin, m->iteration); /* the run may have left our stage behind */
    return mb_deny(p, from, m, why);
  }
  if ((int)m->n_path != p->stage || m->n_path > PEER_MAX_PATH) return mb_deny(p, from, m, "bad_path");
  peer_mb *old = mb_find(p, &origin, m->id);
  if (old) {
    /* A repair, or a restart from the origin, may send the same microbatch
     * through us again: start over. A plain copy is a re-route duplicate. */
    bool again = m->attempt > old->attempt || m->repair;
    if (!again) return mb_deny(p, from, m, "duplicate");
    if (old->job) return mb_deny(p, from, m, "busy");
    mb_free(p, old);
  }
  bool full = p->held >= relay_admits(p, m);
  if (full && !may_wait_for_slot(p, m, queue)) return mb_deny(p, from, m, "full");
  peer_mb *mb = mb_new(p, &origin, m->id);
  if (!mb) return mb_deny(p, from, m, "full");
  if (!full) p->counters.repair_reserve_used += p->held > p->cfg.capacity;
  mb->iteration = m->iteration;
  mb->attempt = m->attempt;
  mb->rerun_stages = m->rerun_stages;
  mb->key = mb_key(&origin, m->id, m->attempt);
  mb->flow_in = m->flow_id;
  mb->prev = *from;
  mb->path_len = (uint32_t)m->n_path;
  for (size_t i = 0; i < m->n_path; i++) id_from_bytes(&mb->path[i], m->path[i]);
  mb->repair = m->repair;
  mb->repair_end_stage = m->repair_end_stage;
  if (m->repair) id_from_bytes(&mb->repair_target, m->repair_target);
  mb->eval = m->eval && !m->repair; /* forward only: nothing kept for a backward */
  if (wire_subspace(p) && !(mb->tokens = wire_tokens_take(p, m))) { /* checked at the door: out of memory */
    mb_free(p, mb);
    return mb_deny(p, from, m, "out_of_memory");
  }
  mb->in = wire_act_decode(p, t, mb->tokens);
  mb->out = malloc(peer_act_floats(p) * sizeof(float));
  if (!mb->in || !mb->out) {
    mb_free(p, mb);
    return mb_deny(p, from, m, "out_of_memory");
  }
  if (full) {
    slot_wait_begin(p, mb);
    return;
  }
  mb_ack(p, from, GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED, mb, NULL);
  if (queue) {
    mb->fwd = FWD_QUEUED;
    behind_note_next(p);
    return;
  }
  if (!submit_forward(p, mb)) {
    mb_free(p, mb);
    mb_deny(p, from, m, "compute_unavailable");
  }
}

/* Microbatches of the next iteration that waited for our aggregation. */
void relay_release_queued(train_peer *p) {
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used || mb->fwd != FWD_QUEUED || mb->iteration != p->iteration) continue;
    if (!submit_forward(p, mb)) mb_free(p, mb);
  }
}

/* We leave our stage (a move, peer_move.c): every microbatch we hold and
 * have not passed on goes back to the peer before us, which re-routes it at
 * once (a DENY after FORWARD_RECEIVED counts while it holds its output).
 * Dropped silently, each waited at its sender for the hop's deadline and
 * then for pings we answered: in a homo-churn10 run two of a data node's
 * microbatches stalled an iteration for 16 s. One we passed on is the next
 * peer's now; its gradient finds us gone and the gap is repaired. */
void relay_hand_back(train_peer *p, const char *reason) {
  if (p->cfg.tun.move_drops_held) return;
  for (size_t i = 0; i < p->n_mbs; i++) {
    peer_mb *mb = &p->mbs[i];
    if (!mb->used || !(mb->fwd == FWD_QUEUED || mb->fwd == FWD_SLOT || mb->fwd == FWD_COMPUTE || mb->fwd == FWD_WAIT))
      continue;
    Gwtf__TrainMicrobatch m;
    ProtobufCBinaryData path[PEER_MAX_PATH];
    mb_fill_msg(&m, path, mb);
    mb_deny(p, &mb->prev, &m, reason);
  }
}

/* Tells the peer before us that the microbatch is past us, i.e. our output
 * is held by the next peer (or a repair's gap is rebuilt): FORWARD_DONE. */
void relay_confirm_upstream(train_peer *p, peer_mb *mb) {
  if (mb->fwd_done_sent) return;
  mb->fwd_done_sent = true;
  mb_ack(p, &mb->prev, GWTF__TRAIN_MSG__TRAIN_FORWARD_DONE, mb, NULL);
}

/* A relay that cannot carry a repair on keeps its stored output: the peer
 * after the gap reports again, and the origin's next repair starts here,
 * not further back. */
static void repair_undeliverable(train_peer *p, peer_mb *mb) {
  GW_WARN(&p->log, "backward.repair_stuck", "mb=%llx at_stage=%d", (unsigned long long)mb->id, p->stage);
  mb->repair = false;
  mb->fwd = FWD_DONE;
  mb->n_avoid = 0;
  mb->avoid_full = 0;
  mb->wait_since = 0;
}

/* No peer of the next stage takes our output. We answer for it upstream:
 * our FORWARD_DONE must reach the peer before us within its wait (3 hop
 * timeouts from our FORWARD_RECEIVED), so a full stage gets one hop timeout;
 * then the peer before us hears DENY and re-routes around us. So does a
 * stage none of whose peers refused but none of which is a hop yet (a
 * relay placed there a moment ago, whose link cost we have not measured:
 * our view lags the data node's, which started the microbatch): at once,
 * every relay of our stage DENYd the data node, which deferred the whole
 * iteration (swarm_kill_fraction; test_relay_no_hop_yet_waits). */
void relay_no_route(train_peer *p, peer_mb *mb) {
  if (mb_wait_for_route(p, mb, p->cfg.tun.hop_timeout_ms)) return;
  mb->wait_since = 0;
  if (mb->repair) {
    repair_undeliverable(p, mb);
    return;
  }
  Gwtf__TrainMicrobatch m;
  ProtobufCBinaryData path[PEER_MAX_PATH];
  mb_fill_msg(&m, path, mb);
  /* With the peer before us gone, nobody would re-route it: its data node
   * hears it is dropped (data_dropped_past_risk), not its trip deadline. */
  mb_deny(p, peer_alive(p, &mb->prev) ? &mb->prev : &mb->origin, &m, "no_route");
  mb_free(p, mb);
}

/* Our forward part is over: the next peer holds our output, and the
 * microbatch went on past it. */
void relay_forward_through(train_peer *p, peer_mb *mb) {
  mb->fwd = FWD_DONE;
  relay_confirm_upstream(p, mb);
  /* No backward comes for an eval microbatch: its output is safe two hops
   * on, so the relay keeps nothing of it. */
  if (mb->eval) mb_free(p, mb);
}

/* The next peer already holds this microbatch and our copy is a spare that
 * a re-route upstream of us made (train/peer_mb.c, forward_duplicate):
 * nothing will come back through it, so we drop it and tell the peer before
 * us to do the same. */
void relay_drop_spare(train_peer *p, peer_mb *mb) {
  Gwtf__TrainMicrobatch m;
  ProtobufCBinaryData path[PEER_MAX_PATH];
  mb_fill_msg(&m, path, mb);
  mb_deny(p, &mb->prev, &m, "duplicate");
  GW_INFO(&p->log, "forward.spare_dropped", "mb=%llx", (unsigned long long)mb->id);
  mb_free(p, mb);
}

static void forward_done(train_peer *p, peer_mb *mb) {
  mb->has_state = true;
  if (mb->repair) p->counters.forward_recomputed++;
  else p->counters.forward_computed++;
  free(mb->in);
  mb->in = NULL;
  if (mb->path_len < PEER_MAX_PATH) mb->path[mb->path_len++] = p->cfg.self;
  if (mb->repair && p->stage == mb->repair_end_stage) {
    /* The gap is rebuilt: the peer after it re-sends its stored gradient. */
    Gwtf__TrainMicrobatch m;
    ProtobufCBinaryData path[PEER_MAX_PATH];
    mb_fill_msg(&m, path, mb);
    peer_send(p, &mb->repair_target, GWTF__TRAIN_MSG__TRAIN_REPAIR_READY, &m.base, NULL);
    mb->next = mb->repair_target;
    mb->fwd = FWD_DONE;
    relay_confirm_upstream(p, mb);
    /* gone while we recomputed: its gradient will not come (its loss is
     * reported as it happens otherwise, mb_peer_down) */
    if (!peer_alive(p, &mb->next)) repair_report_forward(p, mb);
    return;
  }
  /* FORWARD_DONE upstream waits until the next peer holds our output. */
  mb_send_forward(p, mb);
}

/* ---- backward ---- */

/* A gradient for a microbatch whose forward we are still passing on (a
 * re-route after our next hop died, a wait for a slot): a copy of our
 * output got through, and the gradient is of those same bits. Dropped, it
 * left the peer after us waiting and the microbatch to its trip deadline. */
static bool through_by_backward(train_peer *p, const gw_id *from, peer_mb *mb) {
  int next = p->stage == p->cfg.n_stages ? 0 : p->stage + 1;
  bool from_next = next == 0 ? gw_id_eq(from, &mb->origin) : peer_is_member(p, next, from, false);
  if ((mb->fwd != FWD_SENT && mb->fwd != FWD_WAIT) || mb->bwd != BWD_NONE || !mb->out || !from_next) return false;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "forward.through_by_backward", "mb=%llx from=%s", (unsigned long long)mb->id, who);
  mb->next = *from;
  relay_forward_through(p, mb);
  return true;
}

void relay_on_backward(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t) {
  if (mb->fwd != FWD_DONE && !through_by_backward(p, from, mb)) return;
  if (!mb_take_gradient(p, from, mb, t)) return;
  size_t n = peer_act_floats(p);
  if (!mb->grad) mb->grad = malloc(n * sizeof(float));
  if (!mb->grad) return;
  /* Not queued: a re-sent gradient tries again. */
  if (!peer_submit(p, TRAIN_JOB_BACKWARD, mb, mb->in, n * sizeof(float), mb->grad, n * sizeof(float)))
    mb->bwd = BWD_NONE;
}

/* Our BACKWARD_DONE to the peer that sent us the gradient: ours is held upstream. */
void relay_confirm_downstream(train_peer *p, peer_mb *mb) {
  if (mb->done_sent) return;
  mb->done_sent = true;
  mb_ack(p, &mb->next, GWTF__TRAIN_MSG__TRAIN_BACKWARD_DONE, mb, NULL);
}

/* BACKWARD_DONE from upstream: our gradient is safe there. Once our own
 * backward is done too, nothing of the microbatch is left for us to do. */
void relay_backward_confirmed(train_peer *p, peer_mb *mb) {
  relay_confirm_downstream(p, mb);
  if (mb->bwd == BWD_DONE) mb_free(p, mb);
}

static void backward_done(train_peer *p, peer_mb *mb) {
  mb->has_state = false; /* backward frees the activations kept for it */
  mb->bwd = BWD_DONE;
  p->counters.backward_computed++;
  if (mb->iteration == p->iteration && !mb->grad_dropped) p->bwd_count++;
  ledger_on_backward(p, mb); /* exactly once: train/peer_ledger.h */
  /* Capacity is activation memory, which the backward just freed; the
   * gradient we keep for a re-send is small. */
  mb->slot_freed = true;
  p->held--;
  /* BACKWARD_DONE downstream waits until the peer before us holds ours. */
  mb_send_backward(p, mb);
  relay_take_free_slots(p);
}

/* ---- compute results ---- */

void relay_job_done(train_peer *p, peer_mb *mb, train_job *job) {
  if (job->rc != 0) {
    mb_free(p, mb);
    return;
  }
  switch (job->kind) {
  case TRAIN_JOB_FORWARD:
    mb_log_compute(p, mb, mb->repair ? "recompute" : "forward", job->seconds);
    forward_done(p, mb);
    break;
  case TRAIN_JOB_BACKWARD:
    mb_log_compute(p, mb, "backward", job->seconds);
    backward_done(p, mb);
    break;
  default: break;
  }
}
