/* train/peer_move.c — refilling an empty stage from an over-provisioned one
 * (issue 18, item 2).
 *
 * The leader notices a stage that trained and has no live member
 * (peer_join.c: stage.empty). A relay that joins is placed there first; if
 * none is waiting and the stage stays empty for MOVE_AFTER_MS, the leader
 * moves one: from the stage with the most live members (at least two, so
 * the donor keeps one; ties: the larger capacity, then the lower stage) it
 * takes the member with the highest node ID (never the donor's aggregator,
 * the lowest) and sends it TRAIN_MOVE. That relay finishes the round it is
 * in, leaves its stage (its microbatches and its aggregation state go, as
 * in a crash seen from its neighbours), and is then assigned the empty
 * stage exactly as a placed joiner: it restores the newest replica
 * (peer_replica.c) or reports the stage lost. Only a relay whose driver can
 * switch its compute to another stage takes a move (cfg.movable). */
#include "train/peer_join.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_agg.h"
#include "train/peer_trust.h"
#include "util/err.h"

/* An empty stage waits this long for a joiner before a member is moved:
 * a relay that is joining right now costs no other stage a member. */
#define MOVE_AFTER_MS 3000

/* ---- the leader ---- */

typedef struct donor {
  int stage;
  uint32_t live, capacity;
  const gw_id *pick; /* its live member with the highest ID */
} donor;

static donor donor_of(train_peer *p, int s) {
  donor d = {.stage = s};
  peer_stage_view *v = &p->members[s];
  for (size_t i = 0; i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (v->v[i].heard || gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id) || trust_banned(p, id)) continue;
    d.live++;
    d.capacity += v->v[i].capacity;
    if (!d.pick || gw_id_cmp(id, d.pick) > 0) d.pick = id;
  }
  return d;
}

/* The most over-provisioned stage other than `empty`: the most live
 * members, at least two. NULL pick when none has two. */
static donor pick_donor(train_peer *p, int empty) {
  donor best = {0};
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    if (s == empty) continue;
    donor d = donor_of(p, s);
    if (d.live < 2) continue;
    if (!best.pick || d.live > best.live || (d.live == best.live && d.capacity > best.capacity)) best = d;
  }
  return best;
}

static void leader_moves(train_peer *p) {
  if (!p->was_leader || p->iteration == 0 || p->n_candidates > 0) return; /* a joiner waiting goes there first */
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    uint64_t since = p->rep.empty_since[s];
    if (!since || p->now - since < MOVE_AFTER_MS) continue;
    donor d = pick_donor(p, s);
    if (!d.pick) continue; /* nobody to spare: the stage waits for a joiner */
    Gwtf__TrainAssign a = GWTF__TRAIN_ASSIGN__INIT;
    a.stage = s;
    a.iteration = p->iteration;
    peer_send(p, d.pick, GWTF__TRAIN_MSG__TRAIN_MOVE, &a.base, NULL);
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(d.pick, who);
    GW_INFO(&p->log, "stage.move", "peer=%s from_stage=%d to_stage=%d donor_members=%u iter=%llu", who, d.stage, s,
            d.live, (unsigned long long)p->iteration);
    uint32_t cap = 0;
    peer_stage_view *v = &p->members[d.stage];
    for (size_t i = 0; i < v->n; i++)
      if (gw_id_eq(&v->v[i].id, d.pick)) cap = v->v[i].capacity;
    join_note_placed(p, d.pick, s, cap); /* counts in stage s now (and may report it lost) */
    p->rep.empty_since[s] = 0;
    return; /* one move per tick: the next one sees this one placed */
  }
}

/* ---- the relay that moves ---- */

/* Leaves our stage: what we hold for it goes, as if we had crashed and come
 * back without a stage. Sized buffers (the aggregation's) are freed: the
 * new stage has another parameter count. */
static void leave_stage(train_peer *p) {
  mb_abandon_iteration(p, UINT64_MAX);
  agg_abandon_round(p);
  agg_free(p);
  memset(&p->agg, 0, sizeof(p->agg));
  join_free(p);
  memset(&p->dl, 0, sizeof(p->dl));
  memset(&p->verify, 0, sizeof(p->verify));
  memset(p->snap_queue, 0, sizeof(p->snap_queue));
  memset(p->served, 0, sizeof(p->served));
  p->n_heard = 0;
  p->trust.n_claims = 0;
  p->bwd_count = 0;
  p->missed_agg = p->resync_target = p->begin_agg_seen = 0;
  p->downstream_ready = p->pipeline_ready = p->can_take_sent = p->pipeline_sent = 0;
  p->rep.from_replica = false;
  p->rep.lost_logged = false;
}

/* The peers that knew us in our old stage: its members (who would wait for
 * our gradient) and its neighbours (whose flows send us microbatches). */
static size_t old_area(train_peer *p, gw_id *out, size_t max) {
  int S = p->cfg.n_stages, st = p->stage;
  int area[3] = {st, (st + S) % (S + 1), (st + 1) % (S + 1)};
  size_t n = 0;
  for (int k = 0; k < 3; k++) {
    peer_stage_view *v = peer_stage(p, area[k]);
    for (size_t i = 0; v && i < v->n && n < max; i++)
      if (!gw_id_eq(&v->v[i].id, &p->cfg.self)) out[n++] = v->v[i].id;
  }
  return n;
}

/* We carry nothing: no microbatch of ours is live here. */
static bool relay_idle(const train_peer *p) {
  for (size_t i = 0; i < p->n_mbs; i++)
    if (p->mbs[i].used) return false;
  return true;
}

static void try_move(train_peer *p) {
  peer_replicas *r = &p->rep;
  if (!r->move_pending || p->state != PEER_READY || p->aggregating || p->snapshot_running) return;
  /* A rebalancing move waits for our aggregation of the round it was
   * decided in, unless we carry nothing of it: our share of the round is
   * empty, and our stage-mates forget us as our HELLO from the new stage
   * comes. A relay the flows left idle waited for the round's end, up to an
   * iteration (homo-churn20 seed 123: 4 s of a move's 6). */
  if (p->iteration < r->move_after && !relay_idle(p)) return;
  r->move_pending = false;
  if (r->move_stage == p->stage) return;
  GW_INFO(&p->log, "stage.moving", "from_stage=%d to_stage=%d iter=%llu", p->stage, r->move_stage,
          (unsigned long long)p->iteration);
  uint64_t iteration = r->move_iteration > p->iteration ? r->move_iteration : p->iteration;
  gw_id told[3 * PEER_MAX_CONTRIB];
  size_t n_told = old_area(p, told, sizeof(told) / sizeof(told[0]));
  relay_hand_back(p, "moving");
  leave_stage(p);
  p->state = PEER_UNASSIGNED;
  Gwtf__TrainAssign a = GWTF__TRAIN_ASSIGN__INIT;
  a.stage = r->move_stage;
  a.iteration = iteration;
  a.step = r->move_step;
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB];
  for (uint32_t i = 0; i < r->n_move_peers; i++) ids[i] = id_bytes(&r->move_peers[i]);
  a.n_stage_peers = r->n_move_peers;
  a.stage_peers = ids;
  join_on_assign(p, &p->leader, &a); /* as a placed joiner: the newest replica, or stage.lost */
  /* Our HELLO from the new stage tells them we left (forget_moved in
   * peer.c): before, the old stage's aggregator waited out its timeout for
   * our gradient, and upstream flows kept sending to us, when the new stage
   * was no neighbour of the old one. */
  for (size_t i = 0; i < n_told; i++) peer_hello_to(p, &told[i]);
}

void move_on_move(train_peer *p, const gw_id *from, const Gwtf__TrainAssign *a) {
  (void)from; /* the leader (the dispatcher's row) */
  if (a->stage < 1 || a->stage > p->cfg.n_stages || a->stage == p->stage) return;
  if (p->cfg.role != TRAIN_RELAY || !p->cfg.movable) {
    GW_WARN(&p->log, "stage.move_refused", "to_stage=%d reason=not_movable", a->stage);
    return;
  }
  p->rep.move_pending = true;
  p->rep.move_stage = a->stage;
  p->rep.move_iteration = a->iteration;
  p->rep.move_step = a->step;
  p->rep.move_after = a->after_round ? a->iteration + 1 : 0;
  p->rep.n_move_peers = 0;
  for (size_t i = 0; i < a->n_stage_peers && p->rep.n_move_peers < PEER_MAX_CONTRIB; i++)
    if (a->stage_peers[i].len == GW_ID_BYTES)
      id_from_bytes(&p->rep.move_peers[p->rep.n_move_peers++], a->stage_peers[i]);
  try_move(p);
}

void move_after_round(train_peer *p) { try_move(p); }

void move_tick(train_peer *p) {
  leader_moves(p);
  try_move(p);
}
