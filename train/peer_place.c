/* train/peer_place.c — the leader places joining relays (GWTF §V-B).
 *
 * A relay without a stage sends JOIN (its capacity) to the leader (the
 * candidate's side is train/peer_join.c). The leader batches candidates and
 * places them: stages ranked by utilization (the flows through the stage,
 * or the microbatches the data nodes start if more, over its capacity; an
 * empty stage first), candidates by capacity, highest with highest. It also
 * says when a stage that trained has no live member left: the next joiner
 * goes there and restores the stage's newest replica. */
#include "train/peer_join.h"

#include <math.h>
#include <stdlib.h>

#include "train/peer_leader.h"
#include "train/peer_trust.h"

#define PLACEMENT_PERIOD_MS 500
#define PENDING_PLACEMENT_MS 30000 /* a placed peer counts this long before it shows up in the directory */
/* The leader takes one JOIN per peer per this interval (a joiner retries
 * every JOIN_RETRY_MS): anyone connected could otherwise keep it placing. */
#define JOIN_MIN_INTERVAL_MS 1000

/* A JOIN reached a data node that is not (or no longer) the leader: the
 * joiner read a stale run record. Point it to the leader we know. */
static void redirect_joiner(train_peer *p, const gw_id *joiner) {
  if (p->cfg.role != TRAIN_DATA || !p->have_leader || gw_id_eq(&p->leader, &p->cfg.self)) return;
  Gwtf__TrainLeader l = GWTF__TRAIN_LEADER__INIT;
  l.leader = id_bytes(&p->leader);
  l.iteration = p->iteration;
  peer_send(p, joiner, GWTF__TRAIN_MSG__TRAIN_LEADER, &l.base, NULL);
}

/* One JOIN per peer per JOIN_MIN_INTERVAL_MS; false when this one is over. */
static bool join_rate_ok(train_peer *p, const gw_id *from) {
  size_t n = sizeof(p->join_seen) / sizeof(p->join_seen[0]), k = 0, oldest = 0;
  while (k < n && !(p->join_seen[k].at_ms && gw_id_eq(&p->join_seen[k].id, from))) {
    if (p->join_seen[k].at_ms < p->join_seen[oldest].at_ms) oldest = k;
    k++;
  }
  if (k < n && p->now - p->join_seen[k].at_ms < JOIN_MIN_INTERVAL_MS) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_JOIN, "rate_limited");
    return false;
  }
  if (k == n) k = oldest; /* a new peer takes the stalest slot */
  p->join_seen[k].id = *from;
  p->join_seen[k].at_ms = p->now ? p->now : 1;
  return true;
}

void join_on_join(train_peer *p, const gw_id *from, const Gwtf__TrainJoin *j) {
  if (j->capacity == 0) return;
  if (!p->was_leader) {
    redirect_joiner(p, from);
    return;
  }
  if (!join_rate_ok(p, from)) return;
  for (uint32_t i = 0; i < p->n_candidates; i++)
    if (gw_id_eq(&p->candidates[i].id, from)) return;
  if (p->n_candidates == PEER_MAX_CONTRIB) return;
  peer_candidate *c = &p->candidates[p->n_candidates++];
  c->id = *from;
  c->capacity = j->capacity;
  c->compute_ms = j->compute_ms;
  c->want_stage = p->cfg.grant_join_stage && j->want_stage >= 1 && j->want_stage <= p->cfg.n_stages ? j->want_stage : 0;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "join.candidate", "peer=%s capacity=%u", who, j->capacity);
}

typedef struct stage_rank {
  int stage;
  double utilization;
  uint32_t capacity;
} stage_rank;

static int cmp_rank(const void *x, const void *y) {
  const stage_rank *a = x, *b = y;
  if (a->utilization != b->utilization) return a->utilization > b->utilization ? -1 : 1;
  if (a->capacity != b->capacity) return a->capacity < b->capacity ? -1 : 1; /* the smaller bottleneck first */
  return a->stage - b->stage;
}

static int cmp_candidate(const void *x, const void *y) {
  const peer_candidate *a = x, *b = y;
  if (a->capacity != b->capacity) return a->capacity > b->capacity ? -1 : 1;
  return gw_id_cmp(&a->id, &b->id);
}

/* What the data nodes start in an iteration: their microbatches (a data
 * node's capacity), every one of which each stage must hold at once for the
 * iteration to run in one wave. */
uint32_t join_pipeline_demand(train_peer *p) {
  uint32_t demand = p->cfg.role == TRAIN_DATA ? p->cfg.capacity : 0;
  peer_stage_view *v = &p->members[0];
  for (size_t i = 0; i < v->n; i++)
    if (!gw_id_eq(&v->v[i].id, &p->cfg.self) && peer_alive(p, &v->v[i].id)) demand += v->v[i].capacity;
  return demand;
}

uint32_t join_placed_slots(train_peer *p, int s) {
  uint32_t cap = 0;
  for (uint32_t k = 0; k < p->n_placed; k++)
    if (p->placed[k].stage == s && p->now - p->placed[k].at_ms <= PENDING_PLACEMENT_MS &&
        !peer_in_view(&p->members[s], &p->placed[k].id) && peer_alive(p, &p->placed[k].id))
      cap += p->placed[k].capacity;
  return cap;
}

/* §V-B: a stage's utilization is the flows through it over its capacity.
 * The flows through a relay are what its directory record announced, up to
 * a refresh old; but every complete flow of ours passes every stage, so a
 * stage carries at least those. Before, a record announced before the
 * flows formed ranked a stage of one relay below a stage of two
 * (swarm_join, about 1 run in 8: the late relay joined the two). Ranking by
 * the stages' speeds instead (the rebalancing's rates) was tried and undone:
 * on the grid's homogeneous stages the compute-time claims of a tiny model
 * on a loaded machine swing 3x, and joiners piled into one stage (6, 2
 * relays where 3, 3 were).
 *
 * The flows are not the load, though: a stage carries every microbatch the
 * data nodes start, on flows or on the fallback, and one with fewer slots
 * than that runs an iteration in waves. And a stage that loses a relay
 * loses the flows through it too, so by flows it looked less utilized just
 * when it most needed the next joiner: in homo-churn10 runs (seeds
 * 110-114) a restarted relay was placed back into the stage that had lost
 * one in 13 of 57 restarts, about chance (1 in 6), and a stage stayed
 * short until chance filled it. So the load counted is at least the
 * demand (join_pipeline_demand): a stage short of slots ranks first. */
static void rank_stages(train_peer *p, stage_rank *ranks) {
  uint32_t ours = p->router.slots ? p->router.slots(p->router.ctx) : 0; /* our complete flows */
  uint32_t demand = p->cfg.tun.place_by_flows ? 0 : join_pipeline_demand(p);
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    uint32_t cap = 0, load = 0;
    for (size_t i = 0; i < v->n; i++) {
      /* A directory record outlives its peer by up to the record TTL: only
       * members we can reach count. */
      if (!peer_alive(p, &v->v[i].id)) continue;
      cap += v->v[i].capacity;
      load += v->v[i].load;
    }
    cap += join_placed_slots(p, s); /* and those we placed that have not announced themselves yet */
    if (load < ours) load = ours;
    if (load < demand) load = demand;
    ranks[s - 1].stage = s;
    ranks[s - 1].capacity = cap;
    ranks[s - 1].utilization = cap ? (double)load / cap : INFINITY;
  }
  qsort(ranks, (size_t)p->cfg.n_stages, sizeof(*ranks), cmp_rank);
}

/* The stage's members for an ASSIGN: those the directory lists, and those
 * we placed there lately that it does not list yet. Two relays placed into
 * an emptied stage one after the other used to be told of nobody: each
 * restored the replica and aggregated alone, and the stage split for three
 * rounds (swarm_kill_fraction). Now the second knows the first (it fetches
 * the first's state once that is in place, join_on_weights_req) and
 * aggregates with it. */
static size_t assign_members(train_peer *p, int stage, const gw_id *to, ProtobufCBinaryData ids[PEER_MAX_CONTRIB]) {
  peer_stage_view *v = &p->members[stage];
  size_t n = 0;
  for (size_t i = 0; i < v->n && n < PEER_MAX_CONTRIB; i++)
    if (peer_alive(p, &v->v[i].id)) ids[n++] = id_bytes(&v->v[i].id);
  for (uint32_t k = 0; k < p->n_placed && n < PEER_MAX_CONTRIB; k++) {
    const gw_id *id = &p->placed[k].id;
    if (p->placed[k].stage == stage && p->now - p->placed[k].at_ms <= PENDING_PLACEMENT_MS &&
        !peer_in_view(v, id) && !gw_id_eq(id, to) && peer_alive(p, id))
      ids[n++] = id_bytes(id);
  }
  return n;
}

static void assign(train_peer *p, const peer_candidate *c, int stage, double utilization) {
  Gwtf__TrainAssign a = GWTF__TRAIN_ASSIGN__INIT;
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB];
  size_t n = assign_members(p, stage, &c->id, ids);
  a.stage = stage;
  a.iteration = p->iteration;
  a.step = p->step;
  a.n_stage_peers = n;
  a.stage_peers = ids;
  peer_send(p, &c->id, GWTF__TRAIN_MSG__TRAIN_ASSIGN, &a.base, NULL);
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(&c->id, who);
  GW_INFO(&p->log, "join.placed", "peer=%s to_stage=%d capacity=%u utilization=%.3f", who, stage, c->capacity,
          utilization);
  /* Count it in now: the directory shows it only once it has announced. */
  join_note_placed(p, &c->id, stage, c->capacity);
}

void join_note_placed(train_peer *p, const gw_id *id, int stage, uint32_t capacity) {
  uint32_t slot = p->n_placed < PEER_MAX_CONTRIB ? p->n_placed++ : 0;
  for (uint32_t k = 0; k < p->n_placed; k++)
    if (p->now - p->placed[k].at_ms > PENDING_PLACEMENT_MS) slot = k; /* reuse a stale entry */
  p->placed[slot].id = *id;
  p->placed[slot].stage = stage;
  p->placed[slot].capacity = capacity;
  p->placed[slot].at_ms = p->now;
}

/* §V-B: the highest-capacity candidate goes to the most utilized stage, the
 * second to the second, and so on; a new round re-ranks the stages. */
static void place_candidates(train_peer *p) {
  if (!p->was_leader || p->n_candidates == 0 || p->now - p->last_join_ms < PLACEMENT_PERIOD_MS) return;
  p->last_join_ms = p->now;
  /* A candidate that asks for a stage (test tools: --join-stage, and
   * --grant-join-stages on the leader, to start a swarm skewed) gets it;
   * the others are ranked. */
  uint32_t kept = 0;
  for (uint32_t i = 0; i < p->n_candidates; i++) {
    peer_candidate *c = &p->candidates[i];
    if (c->want_stage && peer_alive(p, &c->id))
      assign(p, c, c->want_stage, NAN);
    else if (!c->want_stage)
      p->candidates[kept++] = *c;
  }
  p->n_candidates = kept;
  qsort(p->candidates, p->n_candidates, sizeof(p->candidates[0]), cmp_candidate);
  stage_rank ranks[PEER_MAX_STAGES];
  uint32_t next = 0;
  while (next < p->n_candidates) {
    rank_stages(p, ranks);
    for (int r = 0; r < p->cfg.n_stages && next < p->n_candidates; r++, next++) {
      if (peer_alive(p, &p->candidates[next].id))
        assign(p, &p->candidates[next], ranks[r].stage, ranks[r].utilization);
    }
  }
  p->n_candidates = 0;
}

/* Leader: a stage that trained and has no live member (placed ones
 * included) is said once: the next joiner is placed there (rank_stages puts
 * an empty stage first) and restores its newest replica (peer_replica.c);
 * until one joins, the run waits. A stage a live relay said it serves in a
 * HELLO of the last two periods is not empty, whatever the directory lists:
 * in the grid of 2026-11-26 (hetero-churn20, SWARM routing) the leader's
 * DHT had no good contact left, its directory views emptied, and a relay
 * moved into a live stage restored an old replica there and split it. */
static void note_empty_stages(train_peer *p) {
  if (!p->was_leader || p->iteration == 0) return;
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    bool live = false;
    for (size_t i = 0; i < v->n && !live; i++) live = !v->v[i].heard && peer_alive(p, &v->v[i].id);
    for (uint32_t k = 0; k < p->n_placed && !live; k++)
      live = p->placed[k].stage == s && p->now - p->placed[k].at_ms <= PENDING_PLACEMENT_MS &&
             peer_alive(p, &p->placed[k].id);
    if (!live) live = rebalance_heard_in_stage(p, s, 2 * p->cfg.tun.hello_period_ms);
    if (live) {
      p->rep.empty_logged[s] = false;
      p->rep.empty_since[s] = 0;
    } else if (!p->rep.empty_since[s]) {
      p->rep.empty_since[s] = p->now ? p->now : 1;
    }
    if (!live && !p->rep.empty_logged[s]) {
      p->rep.empty_logged[s] = true;
      GW_WARN(&p->log, "stage.empty",
              "stage=%d iter=%llu msg=\"no live peer serves stage %d: the next relay that joins is placed there "
              "(or one is moved from the stage with the most members) and restores the stage's newest replica\"",
              s, (unsigned long long)p->iteration, s);
    }
  }
}

void place_tick(train_peer *p) {
  note_empty_stages(p);
  place_candidates(p);
}
