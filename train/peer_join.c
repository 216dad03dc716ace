/* train/peer_join.c — joining a run (GWTF §V-B) and fetching a stage's state.
 *
 * A relay without a stage sends JOIN (its capacity) to the leader, which
 * places it (train/peer_place.c). The placed peer downloads its stage's
 * weights, optimizer state and step from a stage member in chunks, checks
 * them against the hash that member announced, restores them, and starts
 * taking microbatches. A member that is aggregating serves the request once
 * its weights are final for the iteration. */
#include "train/peer_join.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_admit.h"
#include "train/peer_agg.h"
#include "train/peer_leader.h"
#include "train/peer_replica.h"
#include "train/peer_trust.h"
#include "util/err.h"

#define JOIN_RETRY_MS 2000
#define MAX_STATE_BYTES (((uint64_t)1) << 36) /* 64 GiB: refuse anything larger */
#define JOIN_SOURCE_WAIT_MS 20000 /* how long a new member waits for a reachable stage peer */
/* A snapshot costs a serialization of the stage's whole state: one
 * requester gets at most one per this interval (one in flight at a time by
 * the queue), so anyone's WEIGHTS_REQ cannot keep the worker busy. */
#define WEIGHTS_REQ_MIN_INTERVAL_MS 1000
/* A stage that had trained, which the leader saw empty: this long for the
 * DHT to name a replica holder before the stage's state is declared lost. */
#define REPLICA_WAIT_MS 20000
/* after a request that could not be sent, the next source or holder is
 * asked this much later (a session may be coming up meanwhile) */
#define JOIN_UNSENT_RETRY_MS 500

static void fetch_or_init(train_peer *p);
static void no_source_left(train_peer *p);
static void catch_up_next(train_peer *p);
static void restored_from_replica(train_peer *p, train_job *job);

void join_free(train_peer *p) {
  free(p->dl.buf);
  p->dl.buf = NULL;
}

void join_become_ready(train_peer *p) {
  p->state = PEER_READY;
  p->dl.holds = 0;
  p->last_update_ms = p->now;
  GW_INFO(&p->log, "peer.ready", "iter=%llu step=%llu", (unsigned long long)p->iteration,
          (unsigned long long)p->step);
  peer_emit(p, TRAIN_EV_READY);
  if (p->cfg.role == TRAIN_DATA) leader_check(p);
  join_serve_pending(p);
  agg_try_can_take(p);
  /* Tell the stage where we are: a member that is ahead answers, and we
   * catch up if the stage aggregated while we were getting ready. */
  p->last_hello_ms = p->now;
  peer_send_hellos(p);
  peer_hello_owed(p);
}

/* We are behind our stage (we missed an aggregation): drop what we hold and
 * fetch the stage's state again. */
void join_resync(train_peer *p, uint64_t target, const char *why) {
  GW_WARN(&p->log, "train.resync", "iter=%llu target=%llu reason=%s",
          (unsigned long long)p->iteration, (unsigned long long)target, why);
  if (target > p->resync_target) p->resync_target = target;
  p->counters.resyncs++;
  /* What we hold and have not passed on goes back to the peers before us,
   * which re-route it at once: dropped silently, each waited at its sender
   * for the hop's cap (a joiner that resynced as it took a data node's
   * microbatch for the next round cost that iteration 1.5 s in
   * test_resync_hands_back_what_it_holds). */
  if (p->cfg.role == TRAIN_RELAY && p->state == PEER_READY) relay_hand_back(p, "not_ready");
  mb_abandon_iteration(p, UINT64_MAX);
  agg_abandon_round(p);
  p->iter_running = false;
  p->iter_reported = false;
  p->dl.n_tried = 0;
  p->dl.waiting_since = 0;
  p->dl.assigned_members = 1; /* we were in a stage with members: wait for one */
  if (p->state == PEER_READY) p->dl.holds = p->iteration + 1; /* ours stay in place until a download lands */
  p->state = PEER_DOWNLOADING;
  fetch_or_init(p);
}

/* ---- the candidate ---- */

/* A download of our stage's state from `from` starts: a member's weights
 * or a holder's replica, the same chunks either way. */
static void download_begin(train_peer *p, const gw_id *from) {
  free(p->dl.buf);
  p->dl.buf = NULL;
  p->dl.active = true;
  p->dl.from = *from;
  p->dl.total = p->dl.received = 0;
  p->dl.started_ms = p->now;
  p->dl.deadline = p->now + p->cfg.tun.agg_timeout_ms;
  if (p->dl.n_tried < PEER_MAX_AVOID) p->dl.tried[p->dl.n_tried++] = *from;
  p->state = PEER_DOWNLOADING;
  p->missed_agg = 0;
  p->dl.catch_up = false;
  p->dl.avg_of = p->dl.wait_round_until = 0;
}

/* A request that never left (no session to `from` is up yet: a restarted
 * peer's sessions come up one by one) is not waited for: waiting out the
 * download timeout for it spent a correlated outage's whole replica wait
 * (REPLICA_WAIT_MS) on two holders, one of them alive, and lost the stage.
 * We move on shortly (join_tick), and holders are tried again once each
 * was tried (fetch_or_init). */
static void download_sent(train_peer *p, const gw_id *from, int rc) {
  if (rc == 0) return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "weights.unsent", "from=%s err=\"%s\"", who, gw_strerror(rc));
  p->dl.active = false;
  p->dl.deadline = p->now + JOIN_UNSENT_RETRY_MS;
}

static void request_weights(train_peer *p, const gw_id *from) {
  Gwtf__TrainWeightsReq r = GWTF__TRAIN_WEIGHTS_REQ__INIT;
  r.stage = p->stage;
  r.holds = p->dl.holds;
  download_begin(p, from);
  p->dl.waiting_since = 0;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "weights.requested", "from=%s", who);
  download_sent(p, from, peer_send(p, from, GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ, &r.base, NULL));
  /* The directory still lists us (we restarted, or resync): our
   * stage-mates, the source too (it serves us, then restoring we still
   * cannot contribute), are told not to wait for us or pick us until we
   * are ready.
   * A newcomer's HELLO would only make them flood it BEGIN_AGG as it
   * downloads, and fetch again a state it could have stepped with. */
  if (!peer_is_member(p, p->stage, &p->cfg.self, true)) return;
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (!gw_id_eq(&v->v[i].id, &p->cfg.self)) peer_hello_to(p, &v->v[i].id);
}

/* A member we may fetch from and have not asked yet: only members the
 * directory (or the leader's ASSIGN) lists (a peer that only said HELLO
 * served us its own forged weights). */
static bool untried_source(train_peer *p, const peer_member *m) {
  return !m->heard && !gw_id_eq(&m->id, &p->cfg.self) && peer_alive(p, &m->id) &&
         !id_in(p->dl.tried, p->dl.n_tried, &m->id) && !trust_banned(p, &m->id);
}

/* A stage member we have not asked yet; false when there is none. A
 * resync asks first the members that said they reached the iteration we
 * resync to: the first member listed may be as far behind as we are (two
 * joiners that got ready on an old state asked each other, and one went
 * on with it, swarm_rebalance_skewed on a loaded machine, 2026-12-07). */
static bool next_source(train_peer *p, gw_id *out) {
  peer_stage_view *v = peer_stage(p, p->stage);
  if (p->dl.has_prefer) { /* after a split: the aggregator whose average won */
    p->dl.has_prefer = false;
    if (peer_is_member(p, p->stage, &p->dl.prefer, true) && peer_alive(p, &p->dl.prefer) &&
        !trust_banned(p, &p->dl.prefer)) {
      *out = p->dl.prefer;
      return true;
    }
  }
  bool resyncing = p->resync_target > p->iteration;
  for (int ahead_only = resyncing; ahead_only >= 0; ahead_only--)
    for (size_t i = 0; v && i < v->n; i++) {
      if (!untried_source(p, &v->v[i]) || (ahead_only && !trust_claims_reach(p, &v->v[i].id, p->resync_target)))
        continue;
      *out = v->v[i].id;
      return true;
    }
  return false;
}

void join_request_replica(train_peer *p, const gw_id *holder) {
  Gwtf__TrainReplicaReq r = GWTF__TRAIN_REPLICA_REQ__INIT;
  r.stage = p->stage;
  download_begin(p, holder);
  p->rep.from_replica = true;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(holder, who);
  GW_INFO(&p->log, "replica.requested", "stage=%d from=%s", p->stage, who);
  download_sent(p, holder, peer_send(p, holder, GWTF__TRAIN_MSG__TRAIN_REPLICA_REQ, &r.base, NULL));
}

/* Every peer of our stage is gone, it had trained and no holder of a
 * replica answered: its state is lost. Say which, tell the leader (which
 * stops the run, peer_leader.c) and never train on fresh weights. */
void join_stage_lost(train_peer *p) {
  if (!p->rep.lost_logged) {
    p->rep.lost_logged = true;
    GW_ERROR(&p->log, "stage.lost",
             "stage=%d iter=%llu waited_ms=%llu msg=\"every peer of stage %d is gone and no replica of its state "
             "was found: the run stops rather than train stage %d from freshly initialised weights\"",
             p->stage, (unsigned long long)p->iteration, (unsigned long long)(p->now - p->dl.waiting_since), p->stage,
             p->stage);
    if (p->have_leader) {
      Gwtf__TrainStageLost m = GWTF__TRAIN_STAGE_LOST__INIT;
      m.stage = p->stage;
      m.iteration = p->iteration;
      peer_send(p, &p->leader, GWTF__TRAIN_MSG__TRAIN_STAGE_LOST, &m.base, NULL);
    }
    peer_emit(p, TRAIN_EV_STAGE_LOST);
  }
  p->state = PEER_DOWNLOADING;
  p->dl.active = false;
  p->dl.deadline = p->now + 10 * p->cfg.tun.tick_ms; /* a replica may still show up: keep looking */
}

/* Members of our stage we know of, connected or not (a new member may not
 * have a session to them yet). */
static size_t known_sources(train_peer *p) {
  peer_stage_view *v = peer_stage(p, p->stage);
  size_t n = 0;
  for (size_t i = 0; v && i < v->n; i++) n += !gw_id_eq(&v->v[i].id, &p->cfg.self);
  return n;
}

/* ... and those of them we are connected to. */
static size_t known_sources_alive(train_peer *p) {
  peer_stage_view *v = peer_stage(p, p->stage);
  size_t n = 0;
  for (size_t i = 0; v && i < v->n; i++) n += !gw_id_eq(&v->v[i].id, &p->cfg.self) && peer_alive(p, &v->v[i].id);
  return n;
}

static void fetch_or_init(train_peer *p) {
  gw_id src;
  p->rep.from_replica = false;
  if (next_source(p, &src)) {
    request_weights(p, &src);
    return;
  }
  /* A data node with no live stage-0 member in a run that trained: stage
   * 0's newest replica, or the run stops (peer_stage0.c). */
  if (stage0_fetch(p)) return;
  /* A stage that trained and has no reachable member: its newest replica
   * (peer_replica.c), at once when the leader told us the stage was empty,
   * else once no member showed up for JOIN_SOURCE_WAIT_MS (a live member
   * whose session is still being set up has newer weights than any
   * replica). Holders tried are in dl.tried, so a mismatch moves on to the
   * next. */
  bool trained = p->iteration > 0 || p->step > 0;
  if (!p->dl.waiting_since) p->dl.waiting_since = p->now;
  uint64_t waited = p->now - p->dl.waiting_since;
  if (trained && p->cfg.role == TRAIN_RELAY && (p->dl.assigned_members == 0 || waited >= JOIN_SOURCE_WAIT_MS) &&
      replica_next_holder(p, &src)) {
    join_request_replica(p, &src);
    return;
  }
  p->dl.n_tried = 0;
  if (next_source(p, &src)) {
    request_weights(p, &src); /* everyone failed once: try them again */
    return;
  }
  if (trained && p->cfg.role == TRAIN_RELAY && p->dl.assigned_members == 0 && known_sources_alive(p) == 0) {
    if (waited < REPLICA_WAIT_MS) {
      p->state = PEER_DOWNLOADING;
      p->dl.active = false;
      p->dl.deadline = p->now + 2 * p->cfg.tun.tick_ms; /* the driver looks the holders up meanwhile */
      return;
    }
    no_source_left(p);
    return;
  }
  /* The stage has members but we cannot reach one yet (sessions are being
   * set up, or the directory has not shown them to us): wait, bounded. */
  bool expect_members = known_sources(p) > 0 || p->dl.assigned_members > 0;
  if (expect_members && p->now - p->dl.waiting_since < JOIN_SOURCE_WAIT_MS) {
    p->state = PEER_DOWNLOADING;
    p->dl.active = false;
    p->dl.deadline = p->now + 2 * p->cfg.tun.tick_ms; /* look again soon (join_tick) */
    return;
  }
  if (trained && p->cfg.role == TRAIN_RELAY) {
    /* members were listed but none could be reached for JOIN_SOURCE_WAIT_MS,
     * and no replica holder is known */
    no_source_left(p);
    return;
  }
  /* Nobody serves this stage and it never trained (the run's first
   * iteration): start from the seeded init and say so. */
  GW_WARN(&p->log, "stage.reinitialized", "reason=no_live_member waited_ms=%llu",
          (unsigned long long)(p->now - p->dl.waiting_since));
  p->dl.waiting_since = 0;
  join_become_ready(p);
}

void join_on_assign(train_peer *p, const gw_id *from, const Gwtf__TrainAssign *a) {
  if (p->state != PEER_UNASSIGNED || (p->have_leader && !gw_id_eq(from, &p->leader))) return;
  if (a->stage < 1 || a->stage > p->cfg.n_stages) return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  p->stage = a->stage;
  p->iteration = a->iteration;
  p->step = a->step;
  p->dl.holds = 0;
  gw_log_set_stage(&p->log, p->stage);
  GW_INFO(&p->log, "stage.assigned", "by=%s iter=%llu members=%zu", who,
          (unsigned long long)a->iteration, a->n_stage_peers);
  peer_emit(p, TRAIN_EV_STAGE_ASSIGNED); /* the driver sets our shape and announces us */
  /* The leader's list is the freshest: start with it. */
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; i < a->n_stage_peers && v; i++) {
    gw_id id;
    id_from_bytes(&id, a->stage_peers[i]);
    bool known = false;
    for (size_t k = 0; k < v->n; k++) known |= gw_id_eq(&v->v[k].id, &id);
    if (!known && !gw_id_eq(&id, &p->cfg.self)) {
      train_member m = {.id = id};
      train_member *all = malloc((v->n + 1) * sizeof(*all));
      if (!all) break;
      for (size_t k = 0; k < v->n; k++) all[k] = (train_member){v->v[k].id, v->v[k].capacity, v->v[k].load};
      all[v->n] = m;
      train_peer_set_members(p, p->stage, all, v->n + 1, p->now);
      free(all);
    }
    /* The leader vouches for them: a directory refresh that has not caught
     * up yet must not demote them to strangers heard by HELLO, or we would
     * aggregate our first round without them (a newcomer with the lowest
     * ID averaged nothing, and its empty average won over the stage's). */
    peer_vouch(p, &id);
  }
  if (a->n_stage_peers == 0 && a->iteration == 0 && a->step == 0) {
    join_become_ready(p); /* a first member: the seeded init is the stage's state */
    return;
  }
  p->dl.assigned_members = (uint32_t)a->n_stage_peers;
  p->dl.waiting_since = 0;
  p->rep.want_iteration = a->iteration;
  fetch_or_init(p);
}

/* ---- two members fetching from each other ---- */

/* Ready with the state we hold, in the run's iteration: when every member
 * of our stage was behind the run (the stage's newest weights died with
 * the peers that had them), we carry on from the newest we have rather than
 * stall the run, and say so. `slack`: rounds a catch-up will still step. */
static void ready_in_run(train_peer *p, uint64_t slack) {
  if (p->resync_target > p->iteration + slack) {
    GW_WARN(&p->log, "stage.stale_weights", "have=%llu run=%llu", (unsigned long long)p->iteration,
            (unsigned long long)p->resync_target);
    p->iteration = p->resync_target;
  }
  p->resync_target = 0;
  p->begin_agg_seen = p->iteration; /* the next round we flood is this iteration's */
  join_become_ready(p);
}

/* The state a resync kept (still in place: p->iteration and p->step are
 * its) is the newest our stage has left: we carry on from it. */
static void keep_own_state(train_peer *p, const char *why, const gw_id *asker) {
  peer_download *d = &p->dl;
  char who[GW_ID_SHORT_LEN + 1] = "none";
  if (asker) peer_short(asker, who);
  GW_WARN(&p->log, "weights.kept_own", "iter=%llu step=%llu reason=%s asker=%s", (unsigned long long)p->iteration,
          (unsigned long long)p->step, why, who);
  p->counters.states_kept++;
  free(d->buf);
  d->buf = NULL;
  d->active = false;
  d->n_tried = 0;
  d->catch_up = false;
  d->wait_round_until = 0;
  ready_in_run(p, 0);
}

static bool listed_source(train_peer *p, const gw_id *except, bool alive) {
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (!v->v[i].heard && !gw_id_eq(id, &p->cfg.self) && !gw_id_eq(id, except) && (!alive || peer_alive(p, id)) &&
        !trust_banned(p, id))
      return true;
  }
  return false;
}

bool join_live_source(train_peer *p, const gw_id *except) { return listed_source(p, except, true); }

bool join_listed_source(train_peer *p, const gw_id *except) { return listed_source(p, except, false); }

/* A member that asks for our state fetches its own (a ready one does not
 * ask). If we fetch too, holding the state a resync kept, and the asker is
 * the member we asked or our only live source besides, each waits on the
 * other: test_node_private's two relays, one resyncing as the other
 * restarted, did for 40 s, until one took an older replica (with none, the
 * stage was given up as lost). The newer state wins, the lower ID on a tie:
 * we keep ours and serve it, or ask again so that the asker, holding the
 * newer, sees our request now and does. */
static void settle_mutual_wait(train_peer *p, const gw_id *asker, uint64_t asker_holds) {
  peer_download *d = &p->dl;
  if (p->state != PEER_DOWNLOADING || !d->holds || !peer_is_member(p, p->stage, asker, false)) return;
  bool asked_it = d->active && gw_id_eq(&d->from, asker);
  if (!asked_it && join_live_source(p, asker)) return;
  if (d->holds > asker_holds || (d->holds == asker_holds && gw_id_cmp(&p->cfg.self, asker) < 0)) {
    keep_own_state(p, "mutual_wait", asker);
    return;
  }
  if (peer_is_member(p, p->stage, asker, true)) request_weights(p, asker);
}

/* No member serves us and no replica came: a state a resync kept is the
 * stage's newest left; without one the stage is lost. */
static void no_source_left(train_peer *p) {
  if (p->dl.holds) {
    keep_own_state(p, "no_source", NULL);
    return;
  }
  join_stage_lost(p);
}

/* ---- serving a snapshot ---- */

static void start_snapshot(train_peer *p, const gw_id *to) {
  p->snapshot_running = true;
  p->snapshot_for = *to;
  if (!peer_submit(p, TRAIN_JOB_SNAPSHOT, NULL, NULL, 0, NULL, 0)) p->snapshot_running = false;
}

void join_serve_pending(train_peer *p) {
  if (p->snapshot_running || p->aggregating || p->state != PEER_READY) return;
  for (size_t i = 0; i < sizeof(p->snap_queue) / sizeof(p->snap_queue[0]); i++) {
    if (!p->snap_queue[i].used || p->snap_queue[i].not_before > p->now) continue;
    p->snap_queue[i].used = false;
    if (p->snap_queue[i].stage != p->stage) continue; /* we were placed elsewhere */
    start_snapshot(p, &p->snap_queue[i].to);
    return;
  }
}

bool join_awaits_our_state(const train_peer *p, const gw_id *id) {
  if (p->snapshot_running && gw_id_eq(&p->snapshot_for, id)) return true;
  for (size_t i = 0; i < sizeof(p->snap_queue) / sizeof(p->snap_queue[0]); i++)
    if (p->snap_queue[i].used && gw_id_eq(&p->snap_queue[i].to, id)) return true;
  return false;
}

/* Queues a request for our state (a repeat is already queued); false when
 * the queue is full. */
static bool queue_request(train_peer *p, const gw_id *from, int stage) {
  for (size_t i = 0; i < sizeof(p->snap_queue) / sizeof(p->snap_queue[0]); i++) {
    peer_pending_snapshot *q = &p->snap_queue[i];
    if (q->used && gw_id_eq(&q->to, from)) return true;
    if (q->used) continue;
    *q = (peer_pending_snapshot){.to = *from, .stage = stage, .used = true};
    for (size_t k = 0; k < sizeof(p->served) / sizeof(p->served[0]); k++)
      if (p->served[k].at_ms && gw_id_eq(&p->served[k].id, from) &&
          p->now - p->served[k].at_ms < WEIGHTS_REQ_MIN_INTERVAL_MS) {
        q->not_before = p->served[k].at_ms + WEIGHTS_REQ_MIN_INTERVAL_MS;
        char who[GW_ID_SHORT_LEN + 1];
        peer_short(from, who);
        GW_DEBUG(&p->log, "weights.req_limited", "peer=%s wait_ms=%llu", who,
                 (unsigned long long)(q->not_before - p->now));
      }
    return true;
  }
  return false;
}

void join_on_weights_req(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsReq *r) {
  /* A member that is itself still getting ready (or whose placement is
   * still on its way) queues the request and serves it once its weights are
   * in place (join_become_ready). */
  if (p->stage >= 0 && r->stage != p->stage) return;
  agg_member_downloading(p, from);
  if (!queue_request(p, from, r->stage)) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ, "queue_full");
    return;
  }
  settle_mutual_wait(p, from, r->holds);
  join_serve_pending(p);
}

int join_send_state(train_peer *p, const gw_id *to, uint32_t type, int stage, const uint8_t *blob, size_t len,
                    uint64_t iteration, uint64_t step, const uint8_t *weights_hash) {
  gw_id hash;
  gw_id_hash(blob, len, &hash);
  size_t chunk = p->cfg.tun.chunk_bytes ? p->cfg.tun.chunk_bytes : (1u << 20);
  for (size_t off = 0; off < len; off += chunk) {
    Gwtf__TrainWeightsChunk c = GWTF__TRAIN_WEIGHTS_CHUNK__INIT;
    train_tensor t = {.dtype = TRAIN_U8, .ndim = 1};
    size_t n = len - off < chunk ? len - off : chunk;
    c.stage = stage;
    c.step = step;
    c.iteration = iteration;
    c.hash.len = 32;
    c.hash.data = hash.b;
    if (weights_hash) {
      c.weights_hash.len = 32;
      c.weights_hash.data = (uint8_t *)weights_hash;
    }
    c.offset = off;
    c.total = len;
    t.shape[0] = n;
    t.data = blob + off;
    t.nbytes = n;
    int rc = peer_send(p, to, type, &c.base, &t);
    if (rc != 0) return rc;
  }
  return 0;
}

static void send_snapshot(train_peer *p, const gw_id *to, const uint8_t *blob, size_t len) {
  if (join_send_state(p, to, GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK, p->stage, blob, len, p->iteration, p->step,
                      NULL) != 0)
    return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(to, who);
  GW_INFO(&p->log, "weights.served", "to=%s bytes=%zu iter=%llu", who, len, (unsigned long long)p->iteration);
  size_t oldest = 0, n = sizeof(p->served) / sizeof(p->served[0]);
  for (size_t i = 1; i < n; i++)
    if (p->served[i].at_ms < p->served[oldest].at_ms) oldest = i;
  p->served[oldest].id = *to;
  p->served[oldest].at_ms = p->now;
}

/* ---- receiving it ---- */

void join_on_chunk(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const train_tensor *t) {
  peer_download *d = &p->dl;
  if (p->state != PEER_DOWNLOADING || !d->active || !gw_id_eq(from, &d->from) || !t || c->hash.len != 32) return;
  if (c->stage != p->stage || c->total == 0 || c->total > MAX_STATE_BYTES || c->offset > c->total ||
      t->nbytes > c->total - c->offset) {
    GW_WARN(&p->log, "weights.bad_chunk", "offset=%llu total=%llu", (unsigned long long)c->offset,
            (unsigned long long)c->total);
    return;
  }
  if (c->offset == 0) {
    if (p->rep.from_replica) {
      /* the hash the stage logged for these weights: the restore must give
       * it. Chosen from the holders' announcements (replica_next_holder); a
       * holder whose chunk says otherwise contradicts its own record. */
      if (c->weights_hash.len != 32) return;
      if (p->rep.want_votes == 0) memcpy(p->rep.want_hash, c->weights_hash.data, 32);
      else if (memcmp(p->rep.want_hash, c->weights_hash.data, 32) != 0) {
        GW_WARN(&p->log, "replica.mismatch", "stage=%d iter=%llu reason=chunk_hash_differs", p->stage,
                (unsigned long long)c->iteration);
        p->counters.downloads_refuted++;
        join_refetch(p);
        return;
      }
    }
    free(d->buf);
    d->buf = malloc(c->total);
    if (!d->buf) return;
    d->total = c->total;
    d->received = 0;
    memcpy(d->hash, c->hash.data, 32);
    d->step = c->step;
    d->iteration = c->iteration;
  }
  if (!d->buf || c->total != d->total || memcmp(d->hash, c->hash.data, 32) != 0) return;
  memcpy(d->buf + c->offset, t->data, t->nbytes);
  d->received += t->nbytes;
  d->deadline = p->now + p->cfg.tun.agg_timeout_ms;
  if (d->received < d->total) return;
  gw_id got;
  gw_id_hash(d->buf, d->total, &got);
  if (memcmp(got.b, d->hash, 32) != 0) {
    GW_ERROR(&p->log, "weights.hash_mismatch", "bytes=%llu", (unsigned long long)d->total);
    fetch_or_init(p);
    return;
  }
  p->state = PEER_RESTORING;
  d->holds = 0; /* the restore overwrites our own state */
  train_job *job = peer_submit(p, TRAIN_JOB_RESTORE, NULL, d->buf, d->total, NULL, 0);
  if (!job) {
    fetch_or_init(p);
    return;
  }
  /* The job owns the bytes from here: a new assignment or download that
   * arrives while it runs cannot free them under it. */
  peer_job_keep(job, (void *[]){d->buf}, 1);
  d->buf = NULL;
}

void join_job_done(train_peer *p, train_job *job) {
  if (job->kind == TRAIN_JOB_SNAPSHOT) {
    p->snapshot_running = false;
    if (job->rc == 0 && job->blob) send_snapshot(p, &p->snapshot_for, job->blob, job->blob_len);
    join_serve_pending(p);
    return;
  }
  /* TRAIN_JOB_RESTORE */
  peer_download *d = &p->dl;
  if (p->state != PEER_RESTORING) return; /* a newer download took over while it ran */
  if (job->rc != 0) {
    GW_ERROR(&p->log, "weights.restore_failed", "rc=%d", job->rc);
    fetch_or_init(p);
    return;
  }
  char who[GW_ID_SHORT_LEN + 1], hash[17];
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++) {
    hash[2 * i] = hex[job->hash[i] >> 4];
    hash[2 * i + 1] = hex[job->hash[i] & 15];
  }
  hash[16] = '\0';
  peer_short(&d->from, who);
  GW_INFO(&p->log, "weights.downloaded", "from=%s bytes=%llu secs=%.3f iter=%llu step=%llu hash=%s", who,
          (unsigned long long)d->total, (double)(p->now - d->started_ms) / 1000.0,
          (unsigned long long)d->iteration, (unsigned long long)d->step, hash);
  /* our weights now: what we answer when a later joiner asks (peer_verify.c) */
  memcpy(p->agg.last_hash, job->hash, 32);
  if (p->rep.from_replica) {
    restored_from_replica(p, job);
    return;
  }
  /* the stage's word on them first (peer_verify.c) */
  if (verify_begin(p, &d->from, d->iteration, job->hash)) return;
  join_accept_download(p);
}

/* A replica restored: its weights must be the ones the stage logged at
 * that aggregation, else the next holder is asked. The stage resumes in the
 * run's iteration with the replica's step: the aggregations since the
 * replica are lost (at most --replicate-every of them). */
static void restored_from_replica(train_peer *p, train_job *job) {
  peer_download *d = &p->dl;
  char who[GW_ID_SHORT_LEN + 1], got[17], want[17];
  peer_short(&d->from, who);
  peer_hex8(job->hash, got);
  peer_hex8(p->rep.want_hash, want);
  if (memcmp(job->hash, p->rep.want_hash, 32) != 0) {
    GW_ERROR(&p->log, "replica.mismatch", "stage=%d from=%s iter=%llu hash=%s logged=%s", p->stage, who,
             (unsigned long long)d->iteration, got, want);
    p->counters.downloads_refuted++;
    join_refetch(p); /* the holder is in dl.tried: the next one */
    return;
  }
  uint64_t run_iter = p->rep.want_iteration > d->iteration ? p->rep.want_iteration : d->iteration;
  GW_INFO(&p->log, "stage.restored", "stage=%d from=%s iter=%llu step=%llu hash=%s run_iter=%llu lost=%llu",
          p->stage, who, (unsigned long long)d->iteration, (unsigned long long)d->step, got,
          (unsigned long long)run_iter, (unsigned long long)(run_iter - d->iteration));
  p->rep.from_replica = false;
  p->rep.lost_logged = false;
  d->iteration = run_iter;
  if (p->cfg.role == TRAIN_DATA) p->rep.s0_restored = true; /* it may still meet the relays ahead (peer_stage0.c) */
  join_accept_download(p);
}

void join_refetch(train_peer *p) {
  p->state = PEER_DOWNLOADING;
  p->dl.active = false;
  fetch_or_init(p); /* the refuted source is in dl.tried: another member first */
}

/* Whether the stage aggregated while we fetched (peer_download's avg_of:
 * rounds up to avg_of - 1 ended; missed_agg: up to missed_agg - 1 began),
 * and the download is not to be used now: we wait for the round that
 * began to end, or fetch again. Rounds that ended, none begun after them,
 * set catch_up: we use the download and step with their averages. */
static bool overtaken(train_peer *p) {
  peer_download *d = &p->dl;
  d->catch_up = false;
  uint64_t ended = d->avg_of, began = p->missed_agg;
  uint64_t missed = began > ended ? began : ended;
  if (began <= ended && ended > p->iteration && ended - p->iteration <= PEER_KEEP_AVGS) {
    /* We step with their averages, asked one by one (catch_up_next).
     * Fetching the whole state again raced every later round (one
     * snapshot per peer per second: a stage that aggregates faster than
     * that, or than its state crosses our link, left a joiner fetching
     * stale state for ever, as test_node_private's restarted relay did). */
    d->catch_up = true;
    d->wait_round_until = 0;
    return false;
  }
  /* (a BEGIN_AGG of a round our snapshot already holds is no reason to wait) */
  if (began > ended && began > p->iteration && began - p->iteration <= PEER_KEEP_AVGS &&
      (!d->wait_round_until || p->now < d->wait_round_until)) {
    /* One began (BEGIN_AGG): its end brings its average
     * (join_on_source_average), or the wait runs out (join_tick). */
    if (!d->wait_round_until) {
      d->wait_round_until = p->now + p->cfg.tun.agg_timeout_ms;
      GW_INFO(&p->log, "weights.wait_round", "iter=%llu", (unsigned long long)(began - 1));
    }
    return true;
  }
  if (missed <= p->iteration) return false;
  p->counters.downloads_stale++;
  GW_INFO(&p->log, "weights.stale", "iter=%llu stage_aggregated=%llu", (unsigned long long)p->iteration,
          (unsigned long long)(missed - 1));
  p->state = PEER_DOWNLOADING;
  fetch_or_init(p);
  return true;
}

/* Our source asked us for our state before it served us (it fetched its
 * own then: a mutual wait it settled by keeping its state): it holds what
 * we now hold, and the request would only send it back. */
static void drop_request_from(train_peer *p, const gw_id *from) {
  for (size_t i = 0; i < sizeof(p->snap_queue) / sizeof(p->snap_queue[0]); i++)
    if (p->snap_queue[i].used && gw_id_eq(&p->snap_queue[i].to, from)) p->snap_queue[i].used = false;
}

void join_accept_download(train_peer *p) {
  peer_download *d = &p->dl;
  drop_request_from(p, &d->from);
  p->iteration = d->iteration;
  p->step = d->step;
  d->active = false;
  d->done_ms = p->now;
  d->n_tried = 0;
  if (overtaken(p)) return;
  ready_in_run(p, d->catch_up ? 1 : 0);
  if (d->catch_up) catch_up_next(p);
}

/* Ready behind our stage (overtaken): asks for the average of the round
 * we are at. The last round's comes from whoever sent it to us while we
 * fetched (we hold its hash); the others from our source, which keeps what
 * it applied for the peers it served (peer_avg_keep.c). dl.iteration
 * follows us: it names the round a source's or a catch-up average may be
 * for (agg_is_round_aggregator, agg_accepts_signer). */
static void catch_up_next(train_peer *p) {
  peer_download *d = &p->dl;
  d->iteration = p->iteration;
  d->catch_up_until = p->now + p->cfg.tun.agg_timeout_ms;
  d->source_gone_ms = 0;
  agg_ask_missed_average(p, p->iteration + 1 == d->avg_of ? &d->avg_from : &d->from);
}

void join_round_applied(train_peer *p) {
  peer_download *d = &p->dl;
  if (!d->catch_up || p->iteration != d->iteration + 1) return;
  if (p->iteration < d->avg_of) {
    catch_up_next(p);
    return;
  }
  d->catch_up = false; /* in step with the stage */
  /* The round we are at began while we caught up (agg_on_begin noted its
   * BEGIN_AGG): in it, as that BEGIN_AGG would have put us. Left out, we
   * waited for claims of the round after and fetched the state again. */
  if (p->missed_agg > p->iteration && !p->aggregating) agg_begin_round(p, true);
}

void join_on_source_average(train_peer *p) {
  peer_download *d = &p->dl;
  /* the round we waited for (the last one that began) ended */
  if (p->state == PEER_RESTORING && d->wait_round_until && !p->verify.active && d->avg_of >= p->missed_agg)
    join_accept_download(p);
}

/* ---- time and failures ---- */

/* An unplaced relay asks the leader for a stage, every JOIN_RETRY_MS. */
static void join_request(train_peer *p) {
  if (p->state != PEER_UNASSIGNED || p->stage >= 0 || !p->have_leader) return;
  if (p->last_join_ms != 0 && p->now - p->last_join_ms < JOIN_RETRY_MS) return;
  Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
  j.capacity = p->cfg.capacity;
  j.want_stage = p->cfg.join_stage;
  p->last_join_ms = p->now;
  peer_send(p, &p->leader, GWTF__TRAIN_MSG__TRAIN_JOIN, &j.base, NULL);
  GW_DEBUG(&p->log, "join.requested", "capacity=%u", p->cfg.capacity);
}

/* The session to the leader came up: a JOIN that found none goes now, not
 * at its next retry. A restarted relay's first JOIN usually leaves before
 * that session is up (it dials the leader once the run record names it),
 * and waited out JOIN_RETRY_MS: in the grid of 2026-11-26, 1.3 s of the
 * 8 s a rejoining relay took to carry work again. */
void join_leader_up(train_peer *p, const gw_id *peer) {
  if (!p->have_leader || !gw_id_eq(peer, &p->leader) || !admit_ready(p)) return;
  p->last_join_ms = 0;
  join_request(p);
}

void join_tick(train_peer *p) {
  if (p->state == PEER_RESTORING && p->dl.wait_round_until && p->now >= p->dl.wait_round_until)
    join_accept_download(p); /* no average came: these weights are stale, fetch again */
  place_tick(p);
  join_serve_pending(p); /* requests held back by WEIGHTS_REQ_MIN_INTERVAL_MS */
  if (!admit_ready(p)) return; /* a private run: redeem the invite first (peer_admit.c) */
  join_request(p);
  /* A fixed stage (a data node joining later) fetches from its stage. */
  if (p->state == PEER_UNASSIGNED && p->stage >= 0 && (peer_stage(p, p->stage)->n > 0 || stage0_trained(p)))
    fetch_or_init(p);
  if (p->state == PEER_DOWNLOADING && p->now >= p->dl.deadline) {
    if (p->dl.active) {
      char who[GW_ID_SHORT_LEN + 1];
      peer_short(&p->dl.from, who);
      GW_WARN(&p->log, "weights.timeout", "from=%s", who);
    }
    fetch_or_init(p);
  }
}

void join_peer_down(train_peer *p, const gw_id *peer) {
  if (p->state == PEER_DOWNLOADING && gw_id_eq(&p->dl.from, peer)) p->dl.deadline = p->now;
  for (uint32_t i = 0; i < p->n_candidates; i++) {
    if (gw_id_eq(&p->candidates[i].id, peer)) {
      p->candidates[i] = p->candidates[--p->n_candidates];
      break;
    }
  }
}
