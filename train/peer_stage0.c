/* train/peer_stage0.c — stage 0 outlives its data nodes (issue 18, item 4).
 *
 * Stage 0 (embeddings, final norm, LM head) is replicated like a relay
 * stage: the data node that aggregated the round pushes its state to R
 * relays every K aggregations (peer_replica.c). When every data node is
 * gone, the relays keep their weights and wait (`run.paused
 * reason=no_data_node`); nothing trains without stage 0.
 *
 * A data node that starts into a run with no live stage-0 member:
 *   - learns whether the run trained and in which iteration it is: relays
 *     answer the HELLO it sends them while it gets ready with theirs (only
 *     directory members of a relay stage count), stage 1's CAN_TAKE says
 *     the same, and a replica of stage 0 in the DHT means it trained;
 *   - never trained (iteration 0, no replica): the old rules (wait for a
 *     member, else the seeded init);
 *   - trained: it restores stage 0's newest replica (hash-checked, as a
 *     relay restores its stage: peer_join.c) and resumes in the relays'
 *     iteration, so that they take its microbatches. A member listed in the
 *     directory that it cannot reach gets STAGE0_SOURCE_WAIT_MS first (a
 *     live one is reached well within it; a dead one's record outlives it
 *     by up to the record TTL);
 *   - trained and no replica after STAGE0_REPLICA_WAIT_MS: `stage.lost
 *     stage=0`, and the node stops (exit 3): it never trains stage 0 from
 *     fresh weights against relays that hold trained ones. */
#include "train/peer_replica.h"

#include <string.h>

#include "train/peer_join.h"

#define STAGE0_SOURCE_WAIT_MS 3000
#define STAGE0_REPLICA_WAIT_MS 20000

static uint64_t run_iteration(const train_peer *p) {
  return p->downstream_ready > p->rep.run_iter_seen ? p->downstream_ready : p->rep.run_iter_seen;
}

/* Whether the run this data node is getting ready for has trained. */
bool stage0_trained(train_peer *p) {
  return p->cfg.role == TRAIN_DATA && p->state != PEER_READY && (run_iteration(p) > 0 || p->rep.n_holders > 0);
}

static size_t listed_others(train_peer *p) {
  peer_stage_view *v = peer_stage(p, 0);
  size_t n = 0;
  for (size_t i = 0; v && i < v->n; i++) n += !v->v[i].heard && !gw_id_eq(&v->v[i].id, &p->cfg.self);
  return n;
}

static void wait_a_tick(train_peer *p) {
  p->state = PEER_DOWNLOADING;
  p->dl.active = false;
  p->dl.deadline = p->now + 2 * p->cfg.tun.tick_ms; /* the driver looks the holders up meanwhile */
}

bool stage0_fetch(train_peer *p) {
  if (!stage0_trained(p)) return false;
  if (!p->dl.waiting_since) p->dl.waiting_since = p->now;
  uint64_t waited = p->now - p->dl.waiting_since, it = run_iteration(p);
  if (!p->rep.s0_waiting_logged) {
    p->rep.s0_waiting_logged = true;
    GW_WARN(&p->log, "stage0.orphaned",
            "run_iter=%llu holders=%u listed=%zu msg=\"no live data node serves stage 0 of a run that trained: "
            "looking for stage 0's newest replica\"",
            (unsigned long long)it, p->rep.n_holders, listed_others(p));
  }
  /* a listed member may be alive and its session still being set up; and
   * the relays' iteration is what we must resume in (bounded wait) */
  bool go = (listed_others(p) == 0 || waited >= STAGE0_SOURCE_WAIT_MS) && (it > 0 || waited >= STAGE0_REPLICA_WAIT_MS);
  gw_id src;
  if (go && replica_next_holder(p, &src)) {
    p->rep.want_iteration = it;
    join_request_replica(p, &src);
    return true;
  }
  p->dl.n_tried = 0; /* every holder failed once: they may be asked again */
  if (waited >= STAGE0_REPLICA_WAIT_MS) {
    join_stage_lost(p);
    return true;
  }
  wait_a_tick(p);
  return true;
}

void stage0_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h) {
  if (h->stage < 0 || h->stage > p->cfg.n_stages) return;
  if (p->cfg.role == TRAIN_RELAY) {
    /* a data node behind us (one getting ready says iteration 0): it needs
     * the run's iteration to resume in */
    if (h->stage == 0 && h->role == GWTF__TRAIN_ROLE__TRAIN_ROLE_DATA && p->state == PEER_READY &&
        h->iteration < p->iteration)
      peer_hello_to(p, from);
    return;
  }
  /* a data node getting ready believes only directory members of a relay stage */
  if (p->state == PEER_READY || h->stage == 0 || !peer_is_member(p, h->stage, from, true)) return;
  if (h->iteration > p->rep.run_iter_seen) p->rep.run_iter_seen = h->iteration;
}

/* A relay: say once when no data node is live (the run cannot train) and
 * when one is back. Only after one was seen: a relay that starts before its
 * session to the data node is up is not paused. */
static void relay_watch(train_peer *p) {
  if (p->cfg.role != TRAIN_RELAY || p->state != PEER_READY) return;
  peer_stage_view *v = peer_stage(p, 0);
  bool live = false;
  for (size_t i = 0; v && i < v->n && !live; i++) live = !v->v[i].heard && peer_alive(p, &v->v[i].id);
  if (live) {
    if (p->rep.paused)
      GW_INFO(&p->log, "run.resumed", "iter=%llu paused_s=%.3f", (unsigned long long)p->iteration,
              (double)(p->now - p->rep.paused_since) / 1000.0);
    p->rep.paused = false;
    p->rep.data_seen = true;
    p->rep.no_data_since = 0;
    return;
  }
  if (!p->rep.data_seen || p->rep.paused) return;
  /* a directory refresh under churn can miss the data nodes' records for a
   * moment (seen in the grid: paused for 1 s while they trained on) */
  if (!p->rep.no_data_since) p->rep.no_data_since = p->now ? p->now : 1;
  if (p->now - p->rep.no_data_since < 3 * p->cfg.tun.hello_period_ms) return;
  p->rep.paused = true;
  p->rep.paused_since = p->now;
  GW_WARN(&p->log, "run.paused",
          "reason=no_data_node iter=%llu msg=\"no live data node: this relay keeps its stage's weights and waits; a "
          "data node that starts restores stage 0 from its newest replica and the run resumes\"",
          (unsigned long long)p->iteration);
}

/* A data node getting ready: HELLO to every relay stage each HELLO period
 * (not to stage 0: its members would count us as a member), for their
 * iteration. Once stage 0 is restored: the relays may be ahead of the
 * iteration it resumed in (their answer came late): it starts theirs. */
static void data_watch(train_peer *p) {
  if (p->cfg.role != TRAIN_DATA || p->stage != 0) return;
  if ((p->state == PEER_UNASSIGNED || p->state == PEER_DOWNLOADING) &&
      p->now - p->last_hello_ms >= p->cfg.tun.hello_period_ms) {
    p->last_hello_ms = p->now;
    for (int s = 1; s <= p->cfg.n_stages; s++) peer_hello_stage(p, s);
  }
  if (p->state != PEER_READY || !p->rep.s0_restored) return;
  if (p->iter_running || p->aggregating) {
    p->rep.s0_restored = false;
    return;
  }
  if (p->downstream_ready > p->iteration) {
    GW_WARN(&p->log, "stage0.caught_up", "iter=%llu run_iter=%llu", (unsigned long long)p->iteration,
            (unsigned long long)p->downstream_ready);
    p->iteration = p->downstream_ready;
    p->begin_agg_seen = p->iteration;
  }
}

void stage0_tick(train_peer *p) {
  relay_watch(p);
  data_watch(p);
}
