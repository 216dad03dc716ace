/* train/peer_leader.c — the leader (GWTF §V-B): the live data node with the
 * lowest node ID. Data nodes report ITER_DONE to it and to each other (the
 * others then wrap up); when every live data node has reported, it starts
 * the aggregation (agg_on_begin, train/peer_agg.c). */
#include "train/peer_leader.h"

#include <string.h>

#include "train/peer_agg.h"
#include "train/peer_trust.h"
#include "util/err.h"

/* ---- the leader ---- */

static void announce_leader(train_peer *p) {
  Gwtf__TrainLeader l = GWTF__TRAIN_LEADER__INIT;
  l.leader = id_bytes(&p->cfg.self);
  l.iteration = p->iteration;
  for (int s = 0; s <= p->cfg.n_stages; s++) peer_broadcast_stage(p, s, GWTF__TRAIN_MSG__TRAIN_LEADER, &l.base);
}

static void send_iter_done(train_peer *p) {
  Gwtf__TrainIterDone d = GWTF__TRAIN_ITER_DONE__INIT;
  d.iteration = p->iteration;
  d.done = p->iter_done;
  d.deferred = p->iter_deferred;
  d.loss_sum = p->iter_loss_sum;
  d.seconds = (double)(p->now - p->iter_started_ms) / 1000.0;
  peer_stage_view *v = peer_stage(p, 0);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (!gw_id_eq(id, &p->cfg.self) && !(p->have_leader && gw_id_eq(id, &p->leader)))
      peer_send(p, id, GWTF__TRAIN_MSG__TRAIN_ITER_DONE, &d.base, NULL);
  }
  if (p->have_leader && !p->was_leader) peer_send(p, &p->leader, GWTF__TRAIN_MSG__TRAIN_ITER_DONE, &d.base, NULL);
}

static void leader_maybe_begin(train_peer *p) {
  if (!p->was_leader || !p->iter_reported || p->aggregating) return;
  if (p->reports_iteration != p->iteration) return;
  peer_stage_view *v = peer_stage(p, 0);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id)) continue;
    if (!id_in(p->iter_reports, p->n_iter_reports, id)) return;
  }
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = p->iteration;
  agg_on_begin(p, &p->cfg.self, &m);
}

static void note_report(train_peer *p, const gw_id *from, uint64_t iteration) {
  if (p->reports_iteration != iteration) {
    p->reports_iteration = iteration;
    p->n_iter_reports = 0;
  }
  if (!id_in(p->iter_reports, p->n_iter_reports, from) && p->n_iter_reports < PEER_MAX_CONTRIB)
    p->iter_reports[p->n_iter_reports++] = *from;
}

void data_report_iteration(train_peer *p) {
  p->iter_reported = true;
  GW_INFO(&p->log, "iteration.microbatches_done", "iter=%llu done=%u deferred=%u", (unsigned long long)p->iteration,
          p->iter_done, p->iter_deferred);
  send_iter_done(p);
  if (p->was_leader) {
    rebalance_short_stage(p);
    rebalance_on_iteration(p); /* between rounds: a moved relay leaves after this aggregation */
    note_report(p, &p->cfg.self, p->iteration);
    leader_maybe_begin(p);
  }
}

/* Another data node is done with this iteration: we finish ours. */
static void data_wrap_up(train_peer *p, const gw_id *from) {
  char who[GW_ID_SHORT_LEN + 1];
  if (!p->iter_running || p->iter_wrap_up) return;
  p->iter_wrap_up = true;
  peer_short(from, who);
  GW_INFO(&p->log, "iteration.wrapping_up", "iter=%llu finished=%s in_flight=%u backlog=%zu",
          (unsigned long long)p->iteration, who, p->iter_sent - p->iter_done, p->n_backlog);
}

/* Another data node's ITER_DONE: on the leader it counts towards BEGIN_AGG. */
void data_on_iter_done(train_peer *p, const gw_id *from, const Gwtf__TrainIterDone *d) {
  if (p->cfg.role != TRAIN_DATA || d->iteration != p->iteration) return;
  data_wrap_up(p, from);
  if (!p->was_leader) return;
  note_report(p, from, d->iteration);
  leader_maybe_begin(p);
}

/* Leader = the live data node with the lowest node ID (§V-B). */
void leader_check(train_peer *p) {
  if (p->cfg.role != TRAIN_DATA || p->state != PEER_READY) return;
  gw_id best = p->cfg.self;
  peer_stage_view *v = peer_stage(p, 0);
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_cmp(&v->v[i].id, &best) < 0 && peer_alive(p, &v->v[i].id)) best = v->v[i].id;
  bool me = gw_id_eq(&best, &p->cfg.self);
  bool changed = !p->have_leader || !gw_id_eq(&p->leader, &best);
  if (!changed && me == p->was_leader) {
    /* A data node that died (or left) no longer holds the round up. */
    if (me) leader_maybe_begin(p);
    return;
  }
  char who[GW_ID_SHORT_LEN + 1];
  p->leader = best;
  p->have_leader = true;
  p->was_leader = me;
  peer_short(&best, who);
  if (me) {
    GW_INFO(&p->log, "leader.elected", "leader=%s iter=%llu", who, (unsigned long long)p->iteration);
    announce_leader(p);
    peer_emit(p, TRAIN_EV_LEADER_CHANGED);
    if (p->iter_reported) note_report(p, &p->cfg.self, p->iteration);
    leader_maybe_begin(p);
  } else {
    GW_INFO(&p->log, "leader.changed", "leader=%s", who);
    peer_emit(p, TRAIN_EV_LEADER_CHANGED);
    if (p->iter_reported && !p->aggregating) send_iter_done(p);
  }
}

void leader_on_leader(train_peer *p, const gw_id *from, const Gwtf__TrainLeader *l) {
  gw_id leader;
  if (l->leader.len != GW_ID_BYTES) return;
  id_from_bytes(&leader, l->leader);
  /* A leader speaks for itself, or the peer we took for the leader names
   * its successor (a JOIN sent to a former leader, see join_on_join). */
  bool vouched = p->have_leader && gw_id_eq(from, &p->leader);
  if (!gw_id_eq(&leader, from) && !vouched) return;
  if (p->cfg.role == TRAIN_DATA) {
    leader_check(p);
    return;
  }
  train_peer_set_leader(p, &leader, p->now);
}

/* A peer we placed into stage S (an empty one: placement ranks those first)
 * found neither a live member nor a replica of S (peer_join.c). Believed
 * only from a peer we placed there, and only while our own view agrees that
 * nobody else serves S: a stranger's word must not stop a run. */
void leader_on_stage_lost(train_peer *p, const gw_id *from, const Gwtf__TrainStageLost *m) {
  if (!p->was_leader || m->stage < 1 || m->stage > p->cfg.n_stages) return;
  bool placed = false;
  for (uint32_t k = 0; k < p->n_placed && !placed; k++)
    placed = p->placed[k].stage == m->stage && gw_id_eq(&p->placed[k].id, from);
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  if (!placed) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_STAGE_LOST, "not_placed_there");
    return;
  }
  peer_stage_view *v = peer_stage(p, m->stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (!gw_id_eq(&v->v[i].id, from) && peer_alive(p, &v->v[i].id)) return; /* someone still serves it */
  GW_ERROR(&p->log, "run.stage_lost",
           "stage=%d iter=%llu reporter=%s msg=\"stage %d's state is lost: every peer of it is gone and no replica "
           "of it exists (replication off, or every holder gone); stopping the run\"",
           m->stage, (unsigned long long)p->iteration, who, m->stage);
  p->finished = true;
  if (p->io.event) {
    train_event ev = {.kind = TRAIN_EV_STAGE_LOST, .stage = m->stage, .iteration = p->iteration, .leader = p->leader};
    p->io.event(p->io.ud, &ev);
  }
}
