#include "flow/place.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flow/wire.h"
#include "proto/flow.pb-c.h"
#include "util/err.h"

typedef struct pl_peer {
  gw_id id;
  int stage;
} pl_peer;

typedef struct pl_record {
  gw_id node;
  int stage;
  uint32_t capacity, flows;
} pl_record;

typedef struct pl_candidate {
  gw_id id;
  uint32_t capacity;
} pl_candidate;

/* One query in progress at this node. */
typedef struct pl_query {
  uint64_t id;
  gw_id leader;
  pl_record *records;
  int n_records;
  bool active;  /* records are being collected */
  bool forward; /* forward at the next tick (relays) */
  uint64_t started;
} pl_query;

struct place {
  place_config cfg;
  uint64_t now, ticks;
  pl_peer *peers;
  int n_peers, cap_peers;
  pl_query q;
  pl_candidate *cands;
  int n_cands;
  place_stage_util *util; /* leader: last result, [0..n_stages] */
  bool have_util;
  int assigned;
  uint64_t last_join;
  uint64_t last_done; /* leader: the query whose results were last used */
};

void place_tunables_default(place_tunables *t) {
  *t = (place_tunables){
      .tick_ms = 2000, .query_period_ticks = 16, .join_retry_ticks = 6, .max_candidates = 1024, .max_records = 4096};
}

int place_new(const place_config *cfg, place **out) {
  *out = NULL;
  if (cfg->n_stages < 1 || cfg->stage < PLACE_CANDIDATE || cfg->stage > cfg->n_stages || !cfg->io.send ||
      !cfg->io.want_tick || !cfg->io.random || cfg->tun.tick_ms == 0 || cfg->tun.query_period_ticks < 1 ||
      cfg->tun.join_retry_ticks < 1 || cfg->tun.max_candidates < 1 || cfg->tun.max_records < 1)
    return GW_EINVAL;
  place *p = calloc(1, sizeof(*p));
  if (!p) return GW_ENOMEM;
  p->cfg = *cfg;
  p->assigned = PLACE_CANDIDATE;
  p->util = calloc((size_t)cfg->n_stages + 1, sizeof(*p->util));
  if (!p->util) {
    free(p);
    return GW_ENOMEM;
  }
  *out = p;
  return 0;
}

void place_free(place *p) {
  if (!p) return;
  free(p->peers);
  free(p->q.records);
  free(p->cands);
  free(p->util);
  free(p);
}

int place_start(place *p, uint64_t now_ms) {
  p->now = now_ms;
  p->cfg.io.want_tick(p->cfg.io.ud, now_ms);
  return 0;
}

/* ---- membership ---- */

static int find_peer(const place *p, const gw_id *id) {
  for (int i = 0; i < p->n_peers; i++)
    if (gw_id_eq(&p->peers[i].id, id)) return i;
  return -1;
}

int place_add_peer(place *p, const gw_id *id, int stage) {
  if (gw_id_eq(id, &p->cfg.self) || stage < 0 || stage > p->cfg.n_stages) return GW_EINVAL;
  int i = find_peer(p, id);
  if (i >= 0) {
    p->peers[i].stage = stage;
    return 0;
  }
  if (p->n_peers == p->cap_peers) {
    int cap = p->cap_peers ? 2 * p->cap_peers : 16;
    pl_peer *np = realloc(p->peers, (size_t)cap * sizeof(*np));
    if (!np) return GW_ENOMEM;
    p->peers = np;
    p->cap_peers = cap;
  }
  p->peers[p->n_peers++] = (pl_peer){*id, stage};
  return 0;
}

int place_remove_peer(place *p, const gw_id *id) {
  int i = find_peer(p, id);
  if (i < 0) return GW_ENOENT;
  p->peers[i] = p->peers[--p->n_peers];
  return 0;
}

const gw_id *place_leader(const place *p) {
  const gw_id *best = p->cfg.stage == 0 ? &p->cfg.self : NULL;
  for (int i = 0; i < p->n_peers; i++)
    if (p->peers[i].stage == 0 && (!best || gw_id_cmp(&p->peers[i].id, best) < 0)) best = &p->peers[i].id;
  return best;
}

bool place_is_leader(const place *p) { return p->cfg.stage == 0 && place_leader(p) == &p->cfg.self; }
int place_assigned_stage(const place *p) { return p->assigned; }

bool place_utilization(const place *p, place_stage_util *util) {
  if (!p->have_util) return false;
  memcpy(util, p->util, ((size_t)p->cfg.n_stages + 1) * sizeof(*util));
  return true;
}

/* ---- ranking ---- */

typedef struct rank_item {
  int index;
  double key;
  uint64_t key2;
} rank_item;

static int cmp_rank(const void *a, const void *b) {
  const rank_item *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;     /* descending */
  if (x->key2 != y->key2) return x->key2 < y->key2 ? -1 : 1; /* ascending */
  return x->index - y->index;
}

void place_rank(const place_stage_util *util, int n_stages, const uint32_t *cand_capacity, int n_cand, int *stage_out) {
  rank_item *stages = malloc((size_t)n_stages * sizeof(*stages));
  rank_item *cands = malloc(((size_t)n_cand + 1) * sizeof(*cands));
  if (!stages || !cands) {
    /* No memory to rank: spread them over the stages in order. */
    for (int k = 0; k < n_cand; k++) stage_out[k] = 1 + k % n_stages;
  } else {
    for (int s = 0; s < n_stages; s++) stages[s] = (rank_item){s + 1, util[s + 1].utilization, util[s + 1].capacity};
    for (int k = 0; k < n_cand; k++) cands[k] = (rank_item){k, (double)cand_capacity[k], 0};
    qsort(stages, (size_t)n_stages, sizeof(*stages), cmp_rank);
    qsort(cands, (size_t)n_cand, sizeof(*cands), cmp_rank);
    for (int k = 0; k < n_cand; k++) stage_out[cands[k].index] = stages[k % n_stages].index;
  }
  free(stages);
  free(cands);
}

/* ---- wire ---- */

/* Placement messages are small; anything near this is not one. */
#define PLACE_MAX_MESSAGE ((size_t)1 << 20)

static int send_msg(place *p, const gw_id *to, Gwtf__FlowMessage *m) {
  return flow_message_send(&p->cfg.io, to, m, PLACE_MAX_MESSAGE);
}

static int send_query(place *p, const gw_id *to) {
  int n = p->q.n_records;
  Gwtf__PlaceRecord *recs = calloc((size_t)n + 1, sizeof(*recs));
  Gwtf__PlaceRecord **ptrs = calloc((size_t)n + 1, sizeof(*ptrs));
  int rc = GW_ENOMEM;
  if (recs && ptrs) {
    for (int i = 0; i < n; i++) {
      gwtf__place_record__init(&recs[i]);
      recs[i].node = flow_id_bytes(&p->q.records[i].node);
      recs[i].stage = p->q.records[i].stage;
      recs[i].capacity = p->q.records[i].capacity;
      recs[i].flows = p->q.records[i].flows;
      ptrs[i] = &recs[i];
    }
    Gwtf__PlaceQuery q = GWTF__PLACE_QUERY__INIT;
    q.query = p->q.id;
    q.leader = flow_id_bytes(&p->q.leader);
    q.n_records = (size_t)n;
    q.records = ptrs;
    Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
    m.msg_case = GWTF__FLOW_MESSAGE__MSG_PLACE_QUERY;
    m.place_query = &q;
    rc = send_msg(p, to, &m);
  }
  free(recs);
  free(ptrs);
  return rc;
}

static void send_join(place *p, const gw_id *leader) {
  Gwtf__PlaceJoin j = GWTF__PLACE_JOIN__INIT;
  j.capacity = p->cfg.capacity;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PLACE_JOIN;
  m.place_join = &j;
  send_msg(p, leader, &m);
}

static void send_assign(place *p, const gw_id *to, int stage) {
  Gwtf__PlaceAssign a = GWTF__PLACE_ASSIGN__INIT;
  a.query = p->q.id;
  a.stage = stage;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PLACE_ASSIGN;
  m.place_assign = &a;
  send_msg(p, to, &m);
}

/* ---- queries ---- */

static void add_record(place *p, const pl_record *r) {
  for (int i = 0; i < p->q.n_records; i++)
    if (gw_id_eq(&p->q.records[i].node, &r->node)) return; /* one record per node, the first seen */
  if (p->q.n_records >= p->cfg.tun.max_records) return;
  if (p->q.n_records % 64 == 0) {
    pl_record *grown = realloc(p->q.records, ((size_t)p->q.n_records + 64) * sizeof(*grown));
    if (!grown) return;
    p->q.records = grown;
  }
  p->q.records[p->q.n_records++] = *r;
}

static void start_query(place *p) {
  uint64_t id = 0;
  p->cfg.io.random(p->cfg.io.ud, &id, sizeof(id));
  p->q.id = id | 1;
  p->q.leader = p->cfg.self;
  p->q.n_records = 0;
  p->q.active = true;
  p->q.forward = false;
  p->q.started = p->now;
  for (int i = 0; i < p->n_peers; i++)
    if (p->peers[i].stage == 1) send_query(p, &p->peers[i].id);
}

/* The leader turns the records into per-stage utilization. */
static void finish_query(place *p) {
  int S = p->cfg.n_stages;
  memset(p->util, 0, ((size_t)S + 1) * sizeof(*p->util));
  for (int i = 0; i < p->q.n_records; i++) {
    const pl_record *r = &p->q.records[i];
    if (r->stage < 1 || r->stage > S) continue;
    p->util[r->stage].flows += r->flows;
    p->util[r->stage].capacity += r->capacity;
    p->util[r->stage].nodes++;
  }
  for (int s = 1; s <= S; s++)
    p->util[s].utilization = p->util[s].capacity ? (double)p->util[s].flows / (double)p->util[s].capacity : INFINITY;
  p->have_util = true;
  p->q.active = false;
  p->last_done = p->q.id;
  if (p->n_cands == 0) return;
  uint32_t *caps = malloc((size_t)p->n_cands * sizeof(uint32_t));
  int *stages = malloc((size_t)p->n_cands * sizeof(int));
  if (caps && stages) {
    for (int k = 0; k < p->n_cands; k++) caps[k] = p->cands[k].capacity;
    place_rank(p->util, S, caps, p->n_cands, stages);
    for (int k = 0; k < p->n_cands; k++) {
      char who[GW_ID_SHORT_LEN + 1];
      gw_id_to_short(&p->cands[k].id, who);
      GW_INFO(p->cfg.log, "place.assigned", "candidate=%s capacity=%u stage=%d utilization=%.3f", who,
              p->cands[k].capacity, stages[k], p->util[stages[k]].utilization);
      send_assign(p, &p->cands[k].id, stages[k]);
    }
    p->n_cands = 0;
  }
  free(caps);
  free(stages);
}

static void on_query(place *p, const gw_peer *from, const Gwtf__PlaceQuery *q) {
  gw_id leader;
  if (!flow_id_from_bytes(&q->leader, &leader) || q->n_records > (size_t)p->cfg.tun.max_records) return;
  int fp = find_peer(p, &from->id);
  int prev_stage = (p->cfg.stage + p->cfg.n_stages) % (p->cfg.n_stages + 1);
  if (p->cfg.stage == PLACE_CANDIDATE || fp < 0 || p->peers[fp].stage != prev_stage) return;
  bool mine = p->cfg.stage == 0 && gw_id_eq(&leader, &p->cfg.self);
  if (p->cfg.stage == 0 && !mine) return;                    /* not our query: another data node leads */
  if (mine && (!p->q.active || q->query != p->q.id)) return; /* a stale one */
  if (!mine && q->query != p->q.id) {
    /* A new query reaches this relay: start collecting its copies. */
    p->q.id = q->query;
    p->q.leader = leader;
    p->q.n_records = 0;
    p->q.active = true;
    p->q.forward = true;
  } else if (!mine && !p->q.active) {
    return; /* already forwarded this one */
  }
  for (size_t i = 0; i < q->n_records; i++) {
    pl_record r;
    if (!flow_id_from_bytes(&q->records[i]->node, &r.node)) return;
    r.stage = q->records[i]->stage;
    r.capacity = q->records[i]->capacity;
    r.flows = q->records[i]->flows;
    add_record(p, &r);
  }
}

/* A relay forwards what it collected during the last tick, plus itself. */
static void forward_query(place *p) {
  pl_record me = {.node = p->cfg.self, .stage = p->cfg.stage};
  if (p->cfg.stats) p->cfg.stats(p->cfg.stats_ud, &me.capacity, &me.flows);
  add_record(p, &me);
  p->q.active = false;
  p->q.forward = false;
  if (p->cfg.stage == p->cfg.n_stages) {
    send_query(p, &p->q.leader); /* the ring closes at the leader */
    return;
  }
  for (int i = 0; i < p->n_peers; i++)
    if (p->peers[i].stage == p->cfg.stage + 1) send_query(p, &p->peers[i].id);
}

static void on_join(place *p, const gw_peer *from, const Gwtf__PlaceJoin *j) {
  if (!place_is_leader(p)) return;
  for (int k = 0; k < p->n_cands; k++)
    if (gw_id_eq(&p->cands[k].id, &from->id)) {
      p->cands[k].capacity = j->capacity;
      return;
    }
  if (p->n_cands >= p->cfg.tun.max_candidates) return;
  pl_candidate *grown = realloc(p->cands, ((size_t)p->n_cands + 1) * sizeof(*grown));
  if (!grown) return;
  p->cands = grown;
  p->cands[p->n_cands++] = (pl_candidate){from->id, j->capacity};
}

static void on_assign(place *p, const gw_peer *from, const Gwtf__PlaceAssign *a) {
  const gw_id *leader = place_leader(p);
  if (p->cfg.stage != PLACE_CANDIDATE || p->assigned != PLACE_CANDIDATE || !leader || !gw_id_eq(leader, &from->id))
    return;
  if (a->stage < 1 || a->stage > p->cfg.n_stages) return;
  p->assigned = a->stage;
  GW_INFO(p->cfg.log, "place.stage_assigned", "stage=%d", a->stage);
  if (p->cfg.on_assigned) p->cfg.on_assigned(p->cfg.assigned_ud, a->stage);
}

int place_on_message(place *p, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms) {
  if (now_ms > p->now) p->now = now_ms;
  if (!from || len > PLACE_MAX_MESSAGE) return GW_EPROTO;
  Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, len, buf);
  if (!m) return GW_EPROTO;
  switch (m->msg_case) {
  case GWTF__FLOW_MESSAGE__MSG_PLACE_QUERY: on_query(p, from, m->place_query); break;
  case GWTF__FLOW_MESSAGE__MSG_PLACE_JOIN: on_join(p, from, m->place_join); break;
  case GWTF__FLOW_MESSAGE__MSG_PLACE_ASSIGN: on_assign(p, from, m->place_assign); break;
  default: break; /* routing messages are flow/flow.h's */
  }
  gwtf__flow_message__free_unpacked(m, NULL);
  return 0;
}

void place_on_tick(place *p, uint64_t now_ms) {
  if (now_ms > p->now) p->now = now_ms;
  p->ticks++;
  const place_tunables *t = &p->cfg.tun;
  if (p->cfg.stage == PLACE_CANDIDATE) {
    const gw_id *leader = place_leader(p);
    if (p->assigned == PLACE_CANDIDATE && leader &&
        (p->last_join == 0 || p->now >= p->last_join + (uint64_t)t->join_retry_ticks * t->tick_ms)) {
      send_join(p, leader);
      p->last_join = p->now ? p->now : 1;
    }
  } else if (p->cfg.stage > 0) {
    if (p->q.forward) forward_query(p);
  } else if (place_is_leader(p)) {
    /* The flood needs one tick per stage; give it two more before closing. */
    uint64_t window = ((uint64_t)p->cfg.n_stages + 2) * t->tick_ms;
    if (p->q.active && p->now >= p->q.started + window) finish_query(p);
    uint64_t period = (uint64_t)t->query_period_ticks;
    if (period < (uint64_t)p->cfg.n_stages + 3) period = (uint64_t)p->cfg.n_stages + 3;
    if (!p->q.active && p->ticks % period == 1) start_query(p);
  }
  p->cfg.io.want_tick(p->cfg.io.ud, p->now + t->tick_ms);
}
