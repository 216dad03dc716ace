/* node/train_known.c — peers we know: the stage directory, dialling, link costs (Eq. 1), discovery and announcing. */
#include "node/train_rt.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "flow/flow_guard.h"
#include "node/relays.h"
#include "node/run_access.h"
#include "node/train_access.h"
#include "node/train_replica.h"
#include "train/route_flow.h"
#include "train/run.h"
#include "train/route_swarm.h"
#include "train/stage.h"
#include "train/wire_codec.h"
#include "util/err.h"

/* ---- the component's state ---- */

known_peer *train_rt_known_find(train_rt *rt, const gw_id *id) {
  for (size_t i = 0; i < rt->n_known; i++)
    if (gw_id_eq(&rt->known[i].id, id)) return &rt->known[i];
  return NULL;
}

/* ---- costs (Eq. 1) ---- */

int train_rt_next_stage(const train_rt *rt) { return rt->stage == rt->run.stages ? 0 : rt->stage + 1; }

/* What one tensor in dtype d puts on the wire: its encoded size, or fp32's
 * where that is smaller (train/peer_wire.c sends fp32 then). */
static double sent_bytes(train_dtype d, size_t rows, size_t cols) {
  size_t b = wire_bytes(d, rows, cols), f = wire_bytes(TRAIN_F32, rows, cols);
  return (double)(b == 0 || b > f ? f : b);
}

double train_rt_link_cost(train_rt *rt, const gw_id *peer) {
  p2p_peer_stats st;
  if (p2p_host_peer_stats(rt->host, peer, &st) != 0 || !st.connected) return -1;
  known_peer *k = train_rt_known_find(rt, peer);
  double ci = rt->compute_s_ewma > 0 ? rt->compute_s_ewma : DEFAULT_COMPUTE_S;
  double cj = k && k->compute_s > 0 ? k->compute_s : ci;
  double lat = st.rtt_samples ? st.rtt_ms / 2000.0 : 0.0;
  double tx = st.tx_Bps > 0 ? st.tx_Bps : DEFAULT_BW_BPS, rx = st.rx_Bps > 0 ? st.rx_Bps : DEFAULT_BW_BPS;
  /* Eq. 1's size: the bytes one microbatch puts on this link each way, as
   * negotiated (train_peer_wire_to/from): our activation to a next-stage
   * peer and its gradient back, or the reverse for a previous-stage peer.
   * Compression makes a slow link cheaper, and the flows follow. */
  size_t rows = (size_t)rt->run.batch * (size_t)rt->run.seq;
  /* subspace crossings: k numbers a row (the token ids, 2 or 4 bytes a row, left out) */
  size_t cols = (size_t)(rt->run.subspace_k ? rt->run.subspace_k : rt->run.model.d_model);
  bool next = k && k->stage == train_rt_next_stage(rt); /* else previous: gradients go, activations come */
  train_dtype to = rt->peer ? train_peer_wire_to(rt->peer, peer, !next) : TRAIN_F32;
  train_dtype from = rt->peer ? train_peer_wire_from(rt->peer, peer, next) : TRAIN_F32;
  double size = 0.5 * (sent_bytes(to, rows, cols) + sent_bytes(from, rows, cols));
  /* In milliseconds: the annealing temperature (T0 = 1.7, GWTF §VI) is
   * calibrated for costs of a few units to a few tens, and link costs in
   * seconds (~0.01) would make it accept almost every worse change. */
  return 1000.0 * flow_cost_eq1(ci, cj, lat, lat, tx, rx, size);
}

int train_rt_prev_stage(const train_rt *rt) { return rt->stage == 0 ? rt->run.stages : rt->stage - 1; }

/* One line with every next-hop cost we measured: experiments rebuild the
 * swarm's flow instance from these to compare our flows with the optimum. */
static void log_costs(train_rt *rt, const gw_id *ids, const double *costs, size_t n) {
  char line[1200];
  size_t off = 0;
  for (size_t i = 0; i < n && off + 32 < sizeof(line); i++) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&ids[i], who);
    off += (size_t)snprintf(line + off, sizeof(line) - off, "%s%s:%.3f", i ? "," : "", who, costs[i]);
  }
  if (n) GW_INFO(&rt->log, "flow.link_costs", "capacity=%u to=%s", rt->capacity, line);
}

static void update_costs(train_rt *rt) {
  if (rt->stage < 0) return;
  gw_id ids[ROUTE_FLOW_MAX_NEXT] = {{{0}}};
  double costs[ROUTE_FLOW_MAX_NEXT] = {0};
  size_t n = 0;
  int nx = train_rt_next_stage(rt), pv = train_rt_prev_stage(rt);
  for (size_t i = 0; i < rt->n_known; i++) {
    known_peer *k = &rt->known[i];
    if (k->stage != nx && k->stage != pv) continue;
    /* a private run: a directory member without a certificate gets no
     * flow and no microbatch (its flow messages are refused too) */
    if (!train_peer_member(rt->peer, &k->id)) continue;
    double c = train_rt_link_cost(rt, &k->id);
    if (rt->flow) {
      if (k->stage == nx) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
      if (k->stage == pv) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
    }
    if (k->stage == nx && c >= 0 && n < ROUTE_FLOW_MAX_NEXT) {
      ids[n] = k->id;
      costs[n++] = c;
    }
  }
  route_flow_set_next(&rt->rf, ids, costs, n);
  log_costs(rt, ids, costs, n);
}

void train_rt_cost_cb(uv_timer_t *t) { update_costs(t->data); }

/* The costs again in COST_SOON_MS, unless due sooner. A neighbour whose
 * session just came up (a relay restarted under churn, as a new peer) had
 * no cost for the flows and was no fallback hop until the next COST_MS
 * round, a second on average: its first RTT train_rt_sample is in by then. */
void train_rt_costs_soon(train_rt *rt) {
  if (uv_timer_get_due_in(&rt->cost_timer) > COST_SOON_MS)
    uv_timer_start(&rt->cost_timer, train_rt_cost_cb, COST_SOON_MS, COST_MS);
}

static void known_set_stage(train_rt *rt, known_peer *k, int stage);

void train_rt_peer_info(void *ud, const gw_id *peer, int stage, uint32_t capacity, double compute_ms) {
  train_rt *rt = ud;
  (void)capacity;
  known_peer *k = train_rt_known_find(rt, peer);
  if (k) {
    if (stage >= 0) known_set_stage(rt, k, stage);
    if (compute_ms > 0) {
      bool first;
      k->compute_s = flow_guard_cost_claim(&rt->guard, peer, stage, compute_ms / 1000.0,
                                           stage == rt->stage ? train_peer_compute_ms(rt->peer) / 1000.0 : 0,
                                           &first);
      if (first) {
        char who[GW_ID_SHORT_LEN + 1];
        gw_id_to_short(peer, who);
        GW_WARN(&rt->log, "flow.cost_claim_clamped", "peer=%s claimed_ms=%.4f used_ms=%.4f ratio=%g", who,
                compute_ms, 1000.0 * k->compute_s, FLOW_GUARD_COST_RATIO);
      }
    }
  }
}

/* ---- membership ---- */

static bool wanted_stage(const train_rt *rt, int s) {
  /* Everyone follows the data nodes; data nodes follow every stage (one
   * may become the leader, and each checks that every stage is served). */
  if (s == 0 || rt->stage == 0 || train_peer_is_leader(rt->peer)) return true;
  if (rt->stage < 0) return false;
  return s == rt->stage || s == train_rt_next_stage(rt) || s == train_rt_prev_stage(rt);
}

/* Stops dialling k the way we do now (directly, or through relays[via]). */
static void known_undial(train_rt *rt, known_peer *k) {
  if (k->via < 0)
    p2p_host_forget(rt->host, &k->addr, &k->id);
  else
    p2p_host_forget_via(rt->host, &k->relays[k->via].addr, &k->id);
}

/* Dials k directly or through relays[via]; kept (and redialled) until it
 * leaves the directory or its record names other relays. */
static void known_dial(train_rt *rt, known_peer *k) {
  char who[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&k->id, who);
  k->via_since_ms = now_ms(rt);
  if (k->via < 0) {
    p2p_host_connect(rt->host, &k->addr, &k->id);
    return;
  }
  p2p_relay_addr ca = {.relay = k->relays[k->via].id, .relay_addr = k->relays[k->via].addr, .target = k->id};
  char cs[P2P_RELAY_ADDR_STRLEN];
  p2p_relay_addr_format(&ca, cs);
  int rc = p2p_host_connect_via(rt->host, &ca.relay, &ca.relay_addr, &k->id);
  GW_INFO(&rt->log, "train.dial_via", "peer=%s circuit=%s relay=%d/%zu rc=%d", who, cs, k->via + 1, k->n_relays, rc);
}

static bool same_relays(const known_peer *k, const stage_member *m) {
  if (k->n_relays != m->n_relays) return false;
  for (size_t i = 0; i < m->n_relays; i++)
    if (!gw_id_eq(&k->relays[i].id, &m->relays[i].id) || !gw_addr_eq(&k->relays[i].addr, &m->relays[i].addr))
      return false;
  return true;
}

/* How to reach a member, from its record: a private one (no_direct) that
 * names relays through the first of them, falling back to the next when a
 * relay does not get us a session (follow_relays); anyone else directly.
 * When the peer also dials us directly, the host keeps the direct session
 * (p2p/host.c: a direct session beats a relayed one). */
static void known_route(train_rt *rt, known_peer *k, const stage_member *m, bool fresh) {
  bool relayed = m->no_direct && m->n_relays > 0;
  if (!fresh && relayed == (k->via >= 0) && same_relays(k, m) && (relayed || gw_addr_eq(&k->addr, &m->addr))) return;
  if (!fresh) known_undial(rt, k);
  k->addr = m->addr;
  k->n_relays = m->n_relays;
  memcpy(k->relays, m->relays, sizeof(m->relays[0]) * m->n_relays);
  k->via = relayed ? 0 : -1;
  known_dial(rt, k);
}

/* A relayed member we are not connected to: try its next relay after a while. */
static void follow_relays(train_rt *rt, known_peer *k) {
  if (k->via < 0) return;
  uint64_t now = now_ms(rt);
  if (p2p_host_is_connected(rt->host, &k->id)) {
    k->via_since_ms = now;
    return;
  }
  if (k->n_relays < 2 || now - k->via_since_ms < VIA_FALLBACK_MS) return;
  known_undial(rt, k);
  k->via = (k->via + 1) % (int)k->n_relays;
  known_dial(rt, k);
}

static bool is_neighbour(train_rt *rt, int stage) {
  return stage >= 0 && (stage == train_rt_next_stage(rt) || stage == train_rt_prev_stage(rt));
}

/* A known peer serves `stage` (its directory record, its HELLO). When that
 * is another stage than we knew, the leader moved it (train/peer_move.c):
 * our flow state must see it there, or no flow ever goes through it. */
static void known_set_stage(train_rt *rt, known_peer *k, int stage) {
  if (k->stage != stage && rt->flow) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&k->id, who);
    GW_INFO(&rt->log, "train.peer_moved", "peer=%s from_stage=%d to_stage=%d", who, k->stage, stage);
    flow_remove_peer(rt->flow, &k->id, now_ms(rt));
    flow_add_peer(rt->flow, &k->id, stage);
    double c = train_rt_link_cost(rt, &k->id);
    if (stage == train_rt_next_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
    if (stage == train_rt_prev_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
  }
  /* the costs the fallback next hop reads: a peer that came to a stage next
   * to ours, or left one (before, it stayed a fallback hop of its old stage
   * until the next refresh, up to COST_MS) */
  if (k->stage != stage && (is_neighbour(rt, stage) || is_neighbour(rt, k->stage))) train_rt_costs_soon(rt);
  k->stage = stage;
}

static known_peer *known_add(train_rt *rt, const stage_member *m, int stage) {
  const gw_id *id = &m->id;
  known_peer *k = train_rt_known_find(rt, id);
  if (!k) {
    if (rt->n_known == MAX_KNOWN) return NULL;
    k = &rt->known[rt->n_known++];
    memset(k, 0, sizeof(*k));
    k->id = *id;
    k->stage = stage;
    known_route(rt, k, m, true);
    if (rt->flow) {
      flow_add_peer(rt->flow, id, stage);
      /* its link cost at once, not at the next cost tick: a newcomer
       * should take flows within ticks of being seen */
      double c = train_rt_link_cost(rt, id);
      if (stage == train_rt_next_stage(rt)) flow_set_cost(rt->flow, id, FLOW_DIR_NEXT, c);
      if (stage == train_rt_prev_stage(rt)) flow_set_cost(rt->flow, id, FLOW_DIR_PREV, c);
    }
  } else {
    known_route(rt, k, m, false);
    follow_relays(rt, k);
  }
  known_set_stage(rt, k, stage);
  return k;
}

/* Peers that left every stage directory we watch are forgotten. */
static void known_sweep(train_rt *rt) {
  for (size_t i = 0; i < rt->n_known;) {
    known_peer *k = &rt->known[i];
    if (rt->discover_round - k->seen_round < 5 || !wanted_stage(rt, k->stage)) {
      i++;
      continue;
    }
    known_undial(rt, k);
    if (rt->flow) flow_remove_peer(rt->flow, &k->id, now_ms(rt));
    rt->known[i] = rt->known[--rt->n_known];
  }
}

static dir_query *query_new(train_rt *rt, int stage) {
  for (size_t i = 0; i < MAX_QUERIES; i++) {
    if (rt->queries[i]) continue;
    dir_query *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->rt = rt;
    q->stage = stage;
    rt->queries[i] = q;
    return q;
  }
  return NULL;
}

/* The lookup answered: forget it; NULL when we stopped meanwhile. */
train_rt *train_rt_query_done(dir_query *q) {
  train_rt *rt = q->rt;
  if (rt)
    for (size_t i = 0; i < MAX_QUERIES; i++)
      if (rt->queries[i] == q) rt->queries[i] = NULL;
  free(q);
  return rt;
}

static void members_cb(void *ud, int status, const stage_member *members, size_t n) {
  dir_query *q = ud;
  int stage = q->stage;
  train_rt *rt = train_rt_query_done(q);
  if (!rt) return;
  rt->stage_busy[stage] = false;
  if (status != 0 || rt->stopping || !rt->peer) return;
  train_member list[MAX_KNOWN];
  gw_id ids[MAX_KNOWN];
  size_t k = 0;
  const gw_id *me = &node_identity(rt->n)->id;
  for (size_t i = 0; i < n && k < MAX_KNOWN; i++) {
    const stage_member *m = &members[i];
    list[k] = (train_member){.id = m->id, .capacity = m->capacity, .load = m->load};
    ids[k++] = m->id;
    if (gw_id_eq(&m->id, me)) continue;
    known_peer *kp = known_add(rt, m, stage);
    if (!kp) continue;
    /* SWARM lifts a ban when the peer announces itself again */
    if (rt->rs && m->remaining_ms > kp->remaining_ms + 1000) route_swarm_readmit(rt->rs, &m->id);
    kp->remaining_ms = m->remaining_ms;
    kp->seen_round = rt->discover_round;
  }
  train_peer_set_members(rt->peer, stage, list, k, now_ms(rt));
  if (rt->rs && rt->stage >= 0 && stage == train_rt_next_stage(rt)) route_swarm_set_next(rt->rs, ids, k);
}

/* Where others reach us, as our directory records say it. */
void train_rt_my_record(train_rt *rt, stage_member *me) {
  memset(me, 0, sizeof(*me));
  me->addr = p2p_host_listen_addr(rt->host);
  me->capacity = rt->capacity;
  /* A private node names the relays it holds reservations on: others reach
   * it through them (node/relays.h). */
  node_relays *nr = node_get_relays(rt->n);
  if (nr) {
    p2p_relay_addr ra[STAGE_DIR_MAX_RELAYS];
    size_t n = node_relays_get(nr, ra, STAGE_DIR_MAX_RELAYS, &me->no_direct);
    for (size_t i = 0; i < n; i++) me->relays[i] = (stage_relay){ra[i].relay, ra[i].relay_addr};
    me->n_relays = n;
  }
}

void train_rt_announce(train_rt *rt) {
  if (rt->stage < 0 || !rt->started) return;
  rt->want_announce = true;
  stage_member me;
  train_rt_my_record(rt, &me);
  node_relays *nr = node_get_relays(rt->n);
  if (nr) rt->relays_gen = node_relays_generation(nr);
  if (rt->flow) {
    flow_counts c;
    flow_get_counts(rt->flow, &c);
    me.load = (uint32_t)(c.units > 0 ? c.units : 0);
  }
  int rc = stage_dir_announce(rt->d, rt->run.name, (uint32_t)rt->stage, &me, now_ms(rt));
  if (rc == 0 && rt->acc.have_key && rt->run.private_run) {
    /* where `gwtf invite` tells friends to dial: what we announced (a
     * wildcard listen address is the one our peers see, as in the record) */
    char addr[GW_ADDR_STRLEN];
    static const uint8_t zero[16];
    gw_addr a = me.addr, seen;
    if (memcmp(a.ip, zero, a.family == 4 ? 4 : 16) == 0 && dht_observed_addr(rt->d, &seen) == 0) {
      seen.port = a.port;
      a = seen;
    }
    gw_addr_format(&a, addr);
    if (strcmp(addr, rt->creator_addr) != 0 && run_access_write_addr(rt->data_dir, rt->run.name, addr) == 0)
      snprintf(rt->creator_addr, sizeof(rt->creator_addr), "%s", addr);
  }
  if (rc == 0 && !rt->announced) {
    rt->announced = true;
    GW_INFO(&rt->log, "stage.announced", "run=%s capacity=%u relays=%zu private=%d", rt->run.name, rt->capacity,
            me.n_relays, (int)me.no_direct);
  } else if (rc == 0 && nr && me.n_relays + me.no_direct > 0) {
    GW_DEBUG(&rt->log, "stage.reannounced", "relays=%zu private=%d", me.n_relays, (int)me.no_direct);
  }
  rt->last_announce = now_ms(rt);
}

/* ---- setting up once the run is known ---- */

static void refresh_run(train_rt *rt) {
  if (rt->run_query_busy) return;
  const char *name = rt->o->run ? rt->o->run : rt->o->create_run;
  dir_query *q = query_new(rt, -1);
  if (!q) return;
  if (stage_dir_find_run(rt->d, name, train_rt_run_cb, q, now_ms(rt)) == 0)
    rt->run_query_busy = true;
  else
    train_rt_query_done(q);
}

void train_rt_publish_run(train_rt *rt) {
  char *text = train_run_encode(&rt->run);
  if (!text) return;
  stage_dir_publish_run(rt->d, rt->run.name, (const uint8_t *)text, strlen(text), now_ms(rt));
  free(text);
}

/* The holders of our stage's replicas, for a peer that finds no live
 * member to download from (train/peer_replica.c). */
static void replicas_cb(void *ud, int status, const stage_member *members, size_t n) {
  train_rt *rt = train_rt_query_done(ud);
  if (!rt) return;
  rt->replica_query_busy = false;
  if (status != 0 || rt->stopping || !rt->peer) return;
  train_replica_holder h[16];
  size_t k = 0;
  for (size_t i = 0; i < n && k < sizeof(h) / sizeof(h[0]); i++) {
    if (train_replica_extra_decode(&members[i], &h[k]) != 0) continue;
    /* a holder need not be in a stage we follow: dial it */
    if (!p2p_host_is_connected(rt->host, &members[i].id) && !train_rt_known_find(rt, &members[i].id) &&
        !members[i].no_direct)
      p2p_host_connect(rt->host, &members[i].addr, &members[i].id);
    k++;
  }
  if (k > 0) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&h[0].id, who);
    GW_DEBUG(&rt->log, "replica.holders", "stage=%d holders=%zu first=%s iter=%llu", rt->stage, k, who,
             (unsigned long long)h[0].iteration);
  }
  train_peer_set_replica_holders(rt->peer, h, k, now_ms(rt));
}

static void find_replica_holders(train_rt *rt) {
  dir_query *q = query_new(rt, rt->stage);
  if (!q) return;
  if (stage_dir_discover_replicas(rt->d, rt->run.name, (uint32_t)rt->stage, replicas_cb, q, now_ms(rt)) == 0)
    rt->replica_query_busy = true;
  else
    train_rt_query_done(q);
}

/* One lookup of every stage we follow and are not looking up already. */
static void lookup_stages(train_rt *rt, uint64_t now) {
  for (int s = 0; s <= rt->run.stages; s++) {
    if (rt->stage_busy[s] || !wanted_stage(rt, s)) continue;
    dir_query *q = query_new(rt, s);
    if (!q) break;
    if (stage_dir_discover(rt->d, rt->run.name, (uint32_t)s, members_cb, q, now) == 0)
      rt->stage_busy[s] = true;
    else
      train_rt_query_done(q);
  }
}

static void placed_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  if (!rt->stopping && rt->peer) lookup_stages(rt, now_ms(rt));
}

/* Looks up the stages we follow soon, not at the next round: a relay just
 * placed follows its stage and both neighbours from here on, and the
 * members it downloads from and forwards to are dialled once their
 * records are in. At the round's pace a restarted relay spent up to a
 * second, 0.9 s in a homo-churn10 run, between its ASSIGN and asking a
 * member for the weights. A lookup of its own, a random 0–200 ms after the
 * ASSIGN, and the round keeps its phase: restarting the round instead put
 * the rounds of the peers the leader placed together in step, two of them
 * found each other's relayed records in the same round and dialled each
 * other at once (crossed circuits; test_nat_train). */
void train_rt_discover_now(train_rt *rt) {
  if (!rt->stopping) uv_timer_start(&rt->placed_timer, placed_cb, randombytes_uniform(PLACED_JITTER_MS + 1), 0);
}

void train_rt_disco_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  uint64_t now = now_ms(rt);
  if (rt->stopping) return;
  if (!rt->have_run || now - rt->last_run_refresh >= RUN_REFRESH_MS) {
    rt->last_run_refresh = now;
    refresh_run(rt);
  }
  /* A node that starts asks for the run record again after SEARCH_MS,
   * doubling up to DISCOVER_MS: its first lookup, at once, finds no
   * contact yet. At DISCOVER_MS from the start, a relay restarted under
   * churn searched a whole second. */
  if (!rt->have_run) {
    rt->search_ms = rt->search_ms ? rt->search_ms * 2 : SEARCH_MS;
    if (rt->search_ms > DISCOVER_MS) rt->search_ms = DISCOVER_MS;
    uv_timer_start(t, train_rt_disco_cb, rt->search_ms, DISCOVER_MS);
  }
  if (!rt->peer) return;
  rt->discover_round++;
  lookup_stages(rt, now);
  if (train_peer_wants_replicas(rt->peer) && !rt->replica_query_busy) find_replica_holders(rt);
  known_sweep(rt);
  if (rt->acc.have_key && rt->run.private_run) train_access_sync_revocations(&rt->acc, rt->peer, now, &rt->log);
  if (train_peer_is_leader(rt->peer) && rt->run.stages > 0) train_rt_publish_run(rt);
  node_relays *nr = node_get_relays(rt->n);
  bool relays_moved = nr && node_relays_generation(nr) != rt->relays_gen; /* our circuit addresses changed */
  /* A node listening on 0.0.0.0 learns the address it announces from its
   * peers (stage_dir_announce: GW_EAGAIN until then): a first node asks
   * again every round until it is announced. */
  if (rt->want_announce && (!rt->announced || relays_moved || now - rt->last_announce >= ANNOUNCE_MS)) train_rt_announce(rt);
}
