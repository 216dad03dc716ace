/* train/peer_agg.c — the end of an iteration (GWTF §V-E); the leader that starts it is train/peer_leader.c.
 *
 * Data nodes report ITER_DONE to the leader (the live data node with the
 * lowest node ID) and tell the other data nodes, which then finish what they
 * have in flight but start nothing new: the aggregation waits for the last
 * data node, so a microbatch one starts after another finished would hold
 * every stage up for a whole trip. When every live data node has reported,
 * the leader floods BEGIN_AGG front to back. Each stage's members send their gradient sums to
 * the stage's aggregator — its lowest live node ID among the members the
 * directory, the leader or a directory member's BEGIN_AGG vouches for —
 * which averages them weighted by microbatch counts (or takes their trimmed
 * mean), summing in node-ID order so that every member receives the same
 * bits, and sends the average back with the list of what it averaged. Where
 * views differ, the lowest vouched aggregator's average wins: a higher one
 * defers and passes it on, a member split off resyncs from it. Every member
 * steps its optimizer with it and logs the hash of its weights, and sends
 * CAN_TAKE to the stage before it; data nodes start the next iteration when
 * a stage-1 peer has stepped, and a stage further on that has not yet holds
 * the new iteration's microbatches until it has.
 *
 * Members that crash are dropped from the round when their session goes; an
 * aggregator that crashes is replaced by the next-lowest ID, and a member that
 * already applied an average answers late contributors with it, so every live
 * member ends the round with the same weights. Who aggregates, and whose
 * average a member takes, is train/peer_agg_who.c. */
#include "train/peer_agg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/agg_robust.h"
#include "train/peer_join.h"
#include "train/peer_trust.h"
#include "util/err.h"

static size_t chunk_floats(const train_peer *p) {
  size_t n = p->cfg.tun.chunk_bytes / sizeof(float);
  return n ? n : 1;
}

static void hash_hex(const uint8_t hash[32], char out[17]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++) {
    out[2 * i] = hex[hash[i] >> 4];
    out[2 * i + 1] = hex[hash[i] & 15];
  }
  out[16] = '\0';
}

/* Our exported gradient is dropped. An export still writing it keeps it
 * until it ends, and its result is ignored (agg_job_done). Closing, the
 * worker has already stopped and freed its jobs. */
static void drop_mine(train_peer *p) {
  peer_agg *a = &p->agg;
  if (a->export_job && !p->closing) peer_job_abandon(a->export_job, (void *[]){a->mine}, 1);
  else free(a->mine);
  a->export_job = NULL;
  a->mine = NULL;
}

void agg_free(train_peer *p) {
  peer_agg *a = &p->agg;
  for (uint32_t i = 0; i < a->n_contrib; i++) free(a->contrib[i].buf);
  a->n_contrib = 0;
  drop_mine(p);
  free(a->avg);
  free(a->last_avg);
  a->avg = a->last_avg = NULL;
  avgkeep_free(p);
  agg_early_free(p);
}

static void reset_round(peer_agg *a) {
  for (uint32_t i = 0; i < a->n_contrib; i++) free(a->contrib[i].buf);
  a->n_contrib = 0;
  a->n_failed = 0;
  a->avg_received = 0;
  a->avg_total_count = 0;
  a->picked = a->asked_applied = a->contributed = a->pass_on = false;
  a->n_pass_on = 0;
  a->n_sent_to = 0;
  a->pend.sig.have = false;
}

/* ---- beginning a round ---- */

/* The members a BEGIN_AGG to our stage names: us, and those our directory
 * lists or a directory member vouched for. A member that only heard one of
 * them by HELLO may then pick it to aggregate, so views that differ by a
 * joiner still agree (peer_vouch, agg_repick). */
static size_t fill_members(train_peer *p, ProtobufCBinaryData ids[PEER_MAX_CONTRIB]) {
  size_t n = 0;
  ids[n++] = id_bytes(&p->cfg.self);
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n && n < PEER_MAX_CONTRIB; i++)
    if ((!v->v[i].heard || v->v[i].vouched) && !gw_id_eq(&v->v[i].id, &p->cfg.self)) ids[n++] = id_bytes(&v->v[i].id);
  return n;
}

void agg_flood_begin(train_peer *p, uint64_t iteration) {
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB];
  m.iteration = iteration;
  ledger_fill_begin(p, &m, iteration); /* the iteration's ledger travels with it (peer_ledger.h) */
  if (p->stage < p->cfg.n_stages)
    peer_broadcast_stage(p, p->stage + 1, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, &m.base);
  m.n_members = fill_members(p, ids);
  m.members = ids;
  peer_broadcast_stage(p, p->stage, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, &m.base);
}

/* Our member list again, to our stage only and without the ledger (both
 * went with the first): after we gave up aggregating for a lower ID, the
 * members that sent us their gradient learn of it from us. */
static void relist_members(train_peer *p, uint64_t iteration) {
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB];
  m.iteration = iteration;
  m.n_members = fill_members(p, ids);
  m.members = ids;
  peer_broadcast_stage(p, p->stage, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, &m.base);
}

/* Enters the round for `iteration` (weights frozen, microbatches dropped);
 * exports our gradient unless an average is already arriving. */
void agg_enter_round(train_peer *p, uint64_t iteration, bool export) {
  peer_agg *a = &p->agg;
  if (p->aggregating) return;
  p->aggregating = true;
  a->iteration = iteration;
  reset_round(a);
  agg_early_take(p);
  mb_abandon_iteration(p, iteration);
  if (p->cfg.role == TRAIN_DATA) {
    p->iter_running = false;
    a->my_count = p->iter_done;
  } else {
    a->my_count = p->bwd_count;
  }
  GW_INFO(&p->log, "aggregation.begun", "iter=%llu microbatches=%u", (unsigned long long)iteration, a->my_count);
  size_t n = p->cfg.shape.n_params;
  if (!export) {
    a->phase = AGG_COLLECT;
    return;
  }
  drop_mine(p);
  a->mine = malloc(n * sizeof(float));
  a->phase = AGG_EXPORT;
  if (a->mine) a->export_job = peer_submit(p, TRAIN_JOB_GRAD_EXPORT, NULL, NULL, 0, a->mine, n * sizeof(float));
  if (!a->export_job) {
    GW_ERROR(&p->log, "aggregation.failed", "iter=%llu reason=export", (unsigned long long)iteration);
    a->phase = AGG_COLLECT;
  }
}

void agg_begin_late(train_peer *p) {
  if (p->aggregating || p->state != PEER_READY || p->begin_agg_seen > p->iteration) return;
  GW_WARN(&p->log, "aggregation.late_begin",
          "iter=%llu msg=\"upstream moved on without a BEGIN_AGG reaching us: we begin the round\"",
          (unsigned long long)p->iteration);
  agg_begin_round(p, true);
}

void agg_begin_round(train_peer *p, bool export) {
  p->begin_agg_seen = p->iteration + 1;
  agg_flood_begin(p, p->iteration);
  agg_enter_round(p, p->iteration, export);
}

void agg_on_begin(train_peer *p, const gw_id *from, const Gwtf__TrainIteration *msg) {
  uint64_t iteration = msg->iteration;
  if (msg->n_members && p->stage >= 0 && peer_is_member(p, p->stage, from, true) && iteration >= p->iteration &&
      iteration <= p->iteration + 1) {
    bool listed = false;
    for (size_t i = 0; i < msg->n_members && i < PEER_MAX_CONTRIB; i++) {
      gw_id id;
      if (msg->members[i].len != GW_ID_BYTES) continue;
      id_from_bytes(&id, msg->members[i]);
      peer_vouch(p, &id);
      listed |= gw_id_eq(&id, &p->cfg.self);
    }
    if (!listed) {
      p->agg.unlisted.id = *from;
      p->agg.unlisted.iteration = iteration + 1;
    } else if (gw_id_eq(&p->agg.unlisted.id, from)) {
      p->agg.unlisted.iteration = 0; /* its list has us now (relist_members) */
    }
    if (iteration == p->agg.iteration) agg_repick(p);
  }
  ledger_on_begin(p, from, msg); /* every data node's flood adds its ledger */
  if (p->begin_agg_seen > iteration) return; /* already flooded */
  /* A far-future iteration is never remembered: one forged BEGIN_AGG made
   * us ignore every real one up to it. */
  if (iteration > p->iteration + TRUST_MAX_AHEAD) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, "claim_far_future");
    return;
  }
  if (p->state != PEER_READY) {
    if (p->state == PEER_DOWNLOADING || p->state == PEER_RESTORING) {
      p->begin_agg_seen = iteration + 1;
      p->missed_agg = iteration + 1;
    }
    return;
  }
  if (iteration != p->iteration) {
    /* Our stage is ahead: evidence for a resync when a directory member of
     * our stage says so (the previous stage's members flood us too, and
     * our own stage's HELLOs will tell). Catching up with the rounds we
     * missed, we enter this one once we reach it (join_round_applied). */
    if (iteration > p->iteration && p->dl.catch_up && iteration + 1 > p->missed_agg) p->missed_agg = iteration + 1;
    if (iteration > p->iteration && peer_is_member(p, p->stage, from, true))
      trust_claim_ahead(p, from, iteration, "begin_agg");
    return;
  }
  /* Catching up, this round already ended (we asked for its average): a
   * late reflood. Entered, we waited alone for stage-mates long past it, as
   * its aggregator when ours is the lowest ID (a restarted relay held a
   * homo-churn10 run 10 s so, 2026-11-28). */
  if (p->dl.catch_up && iteration < p->dl.avg_of) return;
  agg_begin_round(p, true);
}

/* ---- sending gradients and averages ---- */

static void send_vector_n(train_peer *p, const gw_id *to, uint32_t type, const float *v, size_t n, uint32_t count,
                          const gw_id *contributors, uint8_t (*hashes)[32], uint32_t n_contrib,
                          uint32_t total_count, uint64_t iteration, const peer_avg_sig *sig) {
  size_t step = chunk_floats(p);
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB], hs[PEER_MAX_CONTRIB];
  for (uint32_t i = 0; i < n_contrib; i++) {
    ids[i] = id_bytes(&contributors[i]);
    if (hashes) hs[i] = (ProtobufCBinaryData){32, hashes[i]};
  }
  bool own_sum = type == GWTF__TRAIN_MSG__TRAIN_GRAD && v; /* our contribution: with its ledger */
  if (own_sum) ledger_send_mb_grads(p, to, iteration);
  for (size_t off = 0; off < n || off == 0; off += step) {
    Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
    train_tensor t;
    size_t len = n - off < step ? n - off : step;
    g.iteration = iteration;
    g.stage = p->stage;
    g.count = count;
    g.offset = off;
    g.total = v ? n : 0;
    g.n_contributors = n_contrib;
    g.contributors = ids;
    if (hashes) {
      g.n_contributor_hashes = n_contrib;
      g.contributor_hashes = hs;
    }
    g.total_count = total_count;
    if (off == 0) avgsig_fill(sig, &g); /* an average's signature: first chunk only */
    if (off == 0 && own_sum) ledger_fill_grad(p, &g);
    if (v) peer_tensor_1d(&t, v + off, len);
    peer_send(p, to, type, &g.base, v ? &t : NULL);
    if (!v) break;
  }
}

static void send_vector(train_peer *p, const gw_id *to, uint32_t type, const float *v, uint32_t count,
                        const gw_id *contributors, uint8_t (*hashes)[32], uint32_t n_contrib, uint32_t total_count,
                        uint64_t iteration, const peer_avg_sig *sig) {
  send_vector_n(p, to, type, v, p->cfg.shape.n_params, count, contributors, hashes, n_contrib, total_count,
                iteration, sig);
}

static void send_mine(train_peer *p) {
  peer_agg *a = &p->agg;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(&a->aggregator, who);
  GW_DEBUG(&p->log, "aggregation.contribute", "iter=%llu to=%s", (unsigned long long)a->iteration, who);
  size_t n = p->cfg.shape.n_params;
  if (p->cfg.tun.byzantine != TRAIN_BYZ_NONE) n = byz_corrupt(p, a->mine, n); /* test tool */
  gw_id h;
  gw_id_hash(a->mine, n * sizeof(float), &h);
  memcpy(a->my_hash, h.b, 32);
  a->contributed = a->my_count > 0;
  if (a->n_sent_to < sizeof(a->sent_to) / sizeof(a->sent_to[0]) && !id_in(a->sent_to, a->n_sent_to, &a->aggregator))
    a->sent_to[a->n_sent_to++] = a->aggregator;
  send_vector_n(p, &a->aggregator, GWTF__TRAIN_MSG__TRAIN_GRAD, a->mine, n, a->my_count, NULL, NULL, 0, 0,
                a->iteration, NULL);
  /* Twice the aggregator's own wait: it may spend all of its agg_timeout on
   * a member that never contributes, and a member giving up on a live
   * aggregator just as it averages would split the stage. */
  a->deadline = p->now + 2 * p->cfg.tun.agg_timeout_ms;
}

/* The average we applied last, ours or another aggregator's, with its
 * aggregator's signature as it came: a copy we pass on verifies as that
 * aggregator's (peer_avgsig.c). */
void agg_send_last_avg(train_peer *p, const gw_id *to) {
  peer_agg *a = &p->agg;
  agg_send_avg(p, to, a->last_avg, a->last_avg_total_count, a->last_contributors, a->last_contrib_hashes,
               a->n_last_contributors, a->last_avg_iteration, &a->last_sig);
}

void agg_send_avg(train_peer *p, const gw_id *to, const float *avg, uint32_t total_count, const gw_id *contributors,
                  uint8_t (*hashes)[32], uint32_t n_contributors, uint64_t iteration, const peer_avg_sig *sig) {
  /* No microbatch anywhere in the stage: the "average" is a skipped step. */
  send_vector(p, to, GWTF__TRAIN_MSG__TRAIN_AVG, total_count ? avg : NULL, 0, contributors, hashes, n_contributors,
              total_count, iteration, sig);
}

/* ---- the aggregator ---- */

agg_contrib *agg_contrib_for(peer_agg *a, const gw_id *id) {
  for (uint32_t i = 0; i < a->n_contrib; i++)
    if (gw_id_eq(&a->contrib[i].id, id)) return &a->contrib[i];
  if (a->n_contrib == PEER_MAX_CONTRIB) return NULL;
  agg_contrib *c = &a->contrib[a->n_contrib++];
  memset(c, 0, sizeof(*c));
  c->id = *id;
  return c;
}

static int cmp_contrib(const void *x, const void *y) {
  return gw_id_cmp(&((const agg_contrib *)x)->id, &((const agg_contrib *)y)->id);
}

/* Every live member we know has contributed (or the round timed out). */
static bool contributed(const peer_agg *a, const gw_id *id) {
  for (uint32_t k = 0; k < a->n_contrib; k++)
    if (gw_id_eq(&a->contrib[k].id, id) && (a->contrib[k].complete || a->contrib[k].rejected)) return true;
  return false;
}

/* A live stage-mate heard by HELLO only, in the round, that has not
 * contributed, and that would pick us to aggregate: the lowest ID it knows,
 * so one above ours (a member below us that our directory lacks aggregates
 * among its own view: test_member_blind_to_its_stage). */
static bool heard_member_pending(train_peer *p) {
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (v->v[i].heard && !v->v[i].vouched && gw_id_cmp(id, &p->cfg.self) > 0 && peer_alive(p, id) &&
        !agg_out_of_round(p, id) && !contributed(&p->agg, id))
      return true;
  }
  return false;
}

static bool round_complete(train_peer *p) {
  peer_agg *a = &p->agg;
  if (a->phase == AGG_EXPORT) return false; /* our own gradient first */
  if (p->now >= a->deadline) return true;
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    /* A peer only heard by HELLO is not waited for: anyone can say HELLO,
     * and a stranger claiming our stage held every round for its timeout.
     * Its gradient is taken if it comes in time. One that is vouched for
     * is waited for, as it may be picked (pick_aggregator). */
    if ((v->v[i].heard && !v->v[i].vouched) || gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id) ||
        agg_out_of_round(p, id))
      continue;
    if (!contributed(a, id)) return false;
  }
  /* Microbatches the data nodes' ledger lists that no contribution has may
   * be with a stage-mate we only heard by HELLO: a member that got ready a
   * moment ago, which our directory does not list yet, and that the flows
   * already gave work. Its gradient is waited for, to the deadline. Before,
   * the round averaged without it (swarm_validation_crash on a loaded
   * machine: ledger.missing for the two microbatches such a member carried,
   * and the losses left train-ref's). A stranger's HELLO cannot hold a
   * round whose microbatches are all accounted for. */
  return !(heard_member_pending(p) && ledger_uncovered(p));
}


/* --aggregate trimmed-mean: the coordinate-wise trimmed mean of the
 * non-empty contributions' per-microbatch gradients (in node-ID order; the
 * function sorts each coordinate itself), into last_avg. */
static void trimmed_mean(train_peer *p) {
  peer_agg *a = &p->agg;
  const float *sums[PEER_MAX_CONTRIB];
  uint32_t counts[PEER_MAX_CONTRIB], m = 0;
  for (uint32_t i = 0; i < a->n_contrib; i++)
    if (a->contrib[i].count > 0) {
      sums[m] = a->contrib[i].buf;
      counts[m++] = a->contrib[i].count;
    }
  int rc = train_agg_trimmed_mean(sums, counts, m, p->cfg.shape.n_params, p->cfg.tun.trim_fraction, a->last_avg);
  if (rc != 0) GW_ERROR(&p->log, "aggregation.failed", "iter=%llu reason=trimmed_mean", (unsigned long long)a->iteration);
  GW_DEBUG(&p->log, "aggregation.trimmed", "iter=%llu inputs=%u trimmed=%u", (unsigned long long)a->iteration, m,
           2 * train_agg_trim_count(m, p->cfg.tun.trim_fraction));
}

/* The aggregator's last step: average in node-ID order, send, apply. */
static void finish_round(train_peer *p) {
  peer_agg *a = &p->agg;
  size_t n = p->cfg.shape.n_params;
  uint32_t kept = 0, total = 0;
  trust_validate_round(p);
  for (uint32_t i = 0; i < a->n_contrib; i++)
    if (a->contrib[i].complete && !a->contrib[i].rejected) a->contrib[kept++] = a->contrib[i];
    else free(a->contrib[i].buf);
  a->n_contrib = kept;
  qsort(a->contrib, a->n_contrib, sizeof(a->contrib[0]), cmp_contrib);
  for (uint32_t i = 0; i < a->n_contrib; i++) total += a->contrib[i].count;
  ledger_round(p, &total); /* each microbatch once (peer_ledger.h) */
  avgkeep_push_last(p);
  if (total > 0) {
    a->last_avg = calloc(n, sizeof(float));
    if (!a->last_avg) return;
    if (p->cfg.tun.aggregate == TRAIN_AGG_TRIMMED) {
      trimmed_mean(p);
    } else if (!ledger_average(p, a->last_avg)) {
      const float *sums[PEER_MAX_CONTRIB];
      for (uint32_t i = 0; i < a->n_contrib; i++) sums[i] = a->contrib[i].buf;
      train_agg_mean(sums, a->n_contrib, n, total, a->last_avg);
    }
  }
  a->have_last_avg = true;
  a->last_avg_iteration = a->iteration;
  a->last_avg_total_count = total;
  a->n_last_contributors = a->n_contrib;
  for (uint32_t i = 0; i < a->n_contrib; i++) {
    const agg_contrib *c = &a->contrib[i];
    a->last_contributors[i] = c->id;
    gw_id h;
    if (!c->clipped) gw_id_hash(c->buf, n * sizeof(float), &h);
    memcpy(a->last_contrib_hashes[i], c->clipped ? c->hash : h.b, 32);
  }
  avgsig_sign_last(p);
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (!gw_id_eq(&v->v[i].id, &p->cfg.self) && peer_alive(p, &v->v[i].id)) agg_send_last_avg(p, &v->v[i].id);
  /* Peers that just fetched our state may not be in our view yet: without
   * this average they would start the next iteration one step behind. */
  for (size_t i = 0; i < sizeof(p->served) / sizeof(p->served[0]); i++) {
    const gw_id *id = &p->served[i].id;
    bool known = false;
    for (size_t k = 0; v && k < v->n; k++) known |= gw_id_eq(&v->v[k].id, id);
    if (p->served[i].at_ms && !known && p->now - p->served[i].at_ms < 4 * p->cfg.tun.agg_timeout_ms &&
        peer_alive(p, id))
      agg_send_last_avg(p, id);
  }
  agg_apply_average(p, a->last_avg, total);
}

void agg_maybe_finish(train_peer *p) {
  peer_agg *a = &p->agg;
  if (!p->aggregating || a->phase != AGG_COLLECT || !agg_i_aggregate(p)) return;
  if (round_complete(p)) finish_round(p);
}

/* Our own gradient is exported: contribute it. */
static void contribute(train_peer *p) {
  peer_agg *a = &p->agg;
  a->phase = AGG_COLLECT;
  a->aggregator = agg_pick_aggregator(p);
  a->picked = true;
  a->deadline = p->now + p->cfg.tun.agg_timeout_ms;
  if (agg_i_aggregate(p)) {
    agg_contrib *c = agg_contrib_for(a, &p->cfg.self);
    if (!c) return;
    free(c->buf);
    c->buf = a->mine;
    a->mine = NULL;
    c->count = a->my_count;
    c->received = p->cfg.shape.n_params;
    c->complete = true;
    agg_maybe_finish(p);
  } else {
    send_mine(p);
  }
}

/* We aggregated the round and give it up: our own gradient goes back to
 * being ours to send, the others' are dropped (their senders re-send them
 * to the new aggregator, agg_repick). Their senders stay listed: one that
 * does not switch (the new aggregator is not in its view) gets the new
 * one's average from us (begin_average's pass-on). */
static void step_down(train_peer *p) {
  peer_agg *a = &p->agg;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < a->n_contrib; i++) {
    agg_contrib *c = &a->contrib[i];
    bool mine = gw_id_eq(&c->id, &p->cfg.self);
    if (mine && c->complete && !a->mine) {
      a->mine = c->buf;
      c->buf = NULL;
    }
    free(c->buf);
    if (mine) continue;
    a->contrib[kept] = (agg_contrib){.id = c->id};
    kept++;
  }
  a->n_contrib = kept;
}

/* A member of lower ID than the aggregator we picked for this round was
 * vouched for while we wait (a stage-mate's BEGIN_AGG named a joiner our
 * directory does not list yet, or its HELLO came after that vouch). Every
 * member that hears of it switches to it, so the stage ends the round with
 * one aggregator; before, those that had picked already kept their pick,
 * two aggregators each waited out the round for the other's contributors
 * and the stage split (evaluation grid, hetero-churn10 seed 112). One that
 * stops aggregating lists the new one to its stage, so the members that
 * sent it their gradient switch too. */
void agg_repick(train_peer *p) {
  peer_agg *a = &p->agg;
  if (!p->aggregating || a->phase != AGG_COLLECT || !a->picked) return;
  gw_id now = agg_pick_aggregator(p);
  if (gw_id_cmp(&now, &a->aggregator) >= 0 || gw_id_eq(&now, &p->cfg.self)) return;
  char was[GW_ID_SHORT_LEN + 1], to[GW_ID_SHORT_LEN + 1];
  peer_short(&a->aggregator, was);
  peer_short(&now, to);
  GW_INFO(&p->log, "aggregation.repicked", "iter=%llu from=%s to=%s", (unsigned long long)a->iteration, was, to);
  p->counters.aggregator_repicks++;
  bool stepped_down = agg_i_aggregate(p);
  if (stepped_down) step_down(p);
  a->aggregator = now;
  if (a->mine) send_mine(p);
  if (stepped_down) relist_members(p, a->iteration);
}

void agg_on_grad(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t) {
  peer_agg *a = &p->agg;
  size_t n = p->cfg.shape.n_params;
  if (ledger_on_grad(p, from, g, t)) return; /* a per-microbatch gradient (--deterministic) */
  if (g->stage != p->stage) return;
  if (p->state != PEER_READY) {
    /* A member picked us from a directory that lists us (we restarted, or
     * its view is ahead of our download): tell it we are joining, and it
     * sends its gradient to another member rather than wait for us. */
    if (g->offset == 0 && (p->state == PEER_DOWNLOADING || p->state == PEER_RESTORING)) peer_hello_to(p, from);
    return;
  }
  if (a->have_last_avg && g->iteration == a->last_avg_iteration && g->offset == 0) {
    agg_send_last_avg(p, from); /* a member that missed our average */
    return;
  }
  /* a peer we served, stepping through the rounds its download took */
  if (g->offset == 0 && g->iteration < p->iteration && avgkeep_answer(p, from, g->iteration)) return;
  if (agg_early_keep(p, from, g, t)) return;
  if (g->iteration != p->iteration) return;
  bool shape_ok = agg_grad_shape_ok(p, g, t);
  /* A member may be ahead of us: it picked us before its BEGIN_AGG reached
   * us, or it flooded BEGIN_AGG before it knew us (we just got ready). Join
   * the round first, since entering it clears what an earlier round left;
   * joining after storing the gradient threw it away, and we then waited
   * the whole timeout for it. */
  if (!p->aggregating) agg_begin_round(p, true);
  agg_contrib *c = agg_contrib_for(a, from);
  if (!c || c->rejected) return;
  if (!shape_ok && !p->cfg.tun.no_validation) {
    /* not our stage's vector: the whole contribution is out of this round */
    c->rejected = true;
    c->complete = false;
    trust_reject(p, from, a->iteration, "shape");
    agg_maybe_finish(p);
    return;
  }
  if (!shape_ok || !agg_contrib_take(c, g, t, n)) return;
  agg_maybe_finish(p);
}

bool agg_grad_shape_ok(const train_peer *p, const Gwtf__TrainGrad *g, const train_tensor *t) {
  size_t n = p->cfg.shape.n_params, len = t ? t->nbytes / sizeof(float) : 0;
  return g->total == n && t && t->dtype == TRAIN_F32 && t->nbytes % sizeof(float) == 0 && g->offset <= n &&
         len <= n - g->offset;
}

bool agg_contrib_take(agg_contrib *c, const Gwtf__TrainGrad *g, const train_tensor *t, size_t n) {
  if (!c->buf) c->buf = malloc(n * sizeof(float));
  if (!c->buf) return false;
  /* A session delivers a vector's chunks in order, so each one continues
   * the last; one that leaves a gap or overlaps could complete the vector
   * with floats nobody sent. Offset 0 is a re-send, which starts over. */
  if (g->offset == 0) c->received = 0;
  else if (g->offset != c->received) return false;
  size_t len = t->nbytes / sizeof(float);
  memcpy(c->buf + g->offset, t->data, len * sizeof(float));
  c->received += len;
  c->count = g->count;
  c->complete = c->received == n;
  return true;
}

/* ---- applying an average (ours as aggregator, or a member's: peer_avg.c) ---- */

void agg_apply_average(train_peer *p, const float *avg, uint32_t total_count) {
  peer_agg *a = &p->agg;
  a->phase = AGG_APPLY;
  a->applied_from = a->aggregator;
  a->avg_total_count = total_count;
  size_t n = p->cfg.shape.n_params;
  train_job *job = avg ? peer_submit(p, TRAIN_JOB_APPLY, NULL, avg, n * sizeof(float), NULL, 0)
                       : peer_submit(p, TRAIN_JOB_SKIP_STEP, NULL, NULL, 0, NULL, 0);
  if (!job) GW_ERROR(&p->log, "aggregation.failed", "iter=%llu reason=apply", (unsigned long long)a->iteration);
}

/* ---- CAN_TAKE ---- */

/* We stepped: the stage before us may send us the next iteration. We do not
 * wait for the stages after us: a microbatch of the next iteration that
 * reaches one of them before its own step waits there (FWD_QUEUED,
 * peer_relay.c) and runs on the stepped weights. Waiting for the whole
 * pipeline to step, and for CAN_TAKE to travel back to the front one hop at
 * a time, left every stage idle at each iteration's boundary: in a
 * hetero-churn10 run the data nodes started 0.9-1.0 s after stage 1 had
 * stepped (docs/TRAINING.md, "The end of an iteration"). Once every stage
 * after us has stepped too, we say so again (pipeline_stepped): a data node
 * ends its run on that, not before the last stage's last step. */
static bool pipeline_stepped(const train_peer *p, uint64_t j) {
  return p->stage == p->cfg.n_stages || p->pipeline_ready >= j;
}

static void send_can_take(train_peer *p, uint64_t j, bool pipeline) {
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = j;
  m.pipeline_stepped = pipeline;
  peer_broadcast_stage(p, p->stage - 1, GWTF__TRAIN_MSG__TRAIN_CAN_TAKE, &m.base);
  GW_DEBUG(&p->log, "can_take.sent", "iter=%llu pipeline_stepped=%d", (unsigned long long)j, pipeline);
}

void agg_try_can_take(train_peer *p) {
  if (p->aggregating || p->state != PEER_READY || p->cfg.role == TRAIN_DATA) return;
  uint64_t j = p->iteration;
  bool pipeline = pipeline_stepped(p, j);
  if (p->cfg.tun.can_take_waits_downstream && !pipeline) return;
  if (p->can_take_sent > j && (p->pipeline_sent > j || !pipeline)) return;
  p->can_take_sent = j + 1;
  if (pipeline) p->pipeline_sent = j + 1;
  send_can_take(p, j, pipeline);
}

void agg_on_can_take(train_peer *p, const gw_id *from, uint64_t iteration, bool pipeline) {
  (void)from;
  if (iteration > p->downstream_ready) p->downstream_ready = iteration;
  if (pipeline && iteration > p->pipeline_ready) p->pipeline_ready = iteration;
  agg_try_can_take(p);
}

/* ---- results of our jobs ---- */

static void summary(train_peer *p) {
  char peers[128];
  size_t off = 0;
  double secs = (double)(p->now - p->last_update_ms) / 1000.0;
  for (int s = 1; s <= p->cfg.n_stages && off + 8 < sizeof(peers); s++)
    off += (size_t)snprintf(peers + off, sizeof(peers) - off, "%s%zu", s > 1 ? "," : "", p->members[s].n);
  double loss = p->iter_done ? p->iter_loss_sum / p->iter_done : NAN;
  double tokens = (double)p->iter_done * p->cfg.shape.B * p->cfg.shape.T;
  unsigned long long it = (unsigned long long)p->agg.iteration;
  if (p->iter_done == 0) {
    /* No loss to show: "loss=nan" here read like a diverged model. */
    GW_WARN(&p->log, "iteration.done",
            "iter=%llu msg=\"no microbatch finished\" reason=%s done=0 deferred=%u secs=%.3f peers=%s", it,
            p->iter_deferred ? "all_deferred" : "none_started", p->iter_deferred, secs, peers);
  } else {
    GW_INFO(&p->log, "iteration.done",
            "iter=%llu loss=%.6f done=%u deferred=%u secs=%.3f time_per_mb_s=%.4f tokens_per_s=%.1f peers=%s", it,
            loss, p->iter_done, p->iter_deferred, secs, secs / p->iter_done, secs > 0 ? tokens / secs : 0.0, peers);
    if (!isfinite(loss))
      GW_ERROR(&p->log, "loss.nonfinite", "iter=%llu loss=%f done=%u msg=\"the model diverged\"", it, loss,
               p->iter_done);
  }
  if (p->io.event) {
    train_event ev = {.kind = TRAIN_EV_ITERATION_DONE, .stage = 0, .iteration = p->agg.iteration,
                      .loss = loss, .seconds = secs, .done = p->iter_done, .deferred = p->iter_deferred};
    p->io.event(p->io.ud, &ev);
  }
  p->last_update_ms = p->now;
}

static void round_done(train_peer *p, train_job *job) {
  peer_agg *a = &p->agg;
  char hash[17];
  if (job->rc != 0) {
    GW_ERROR(&p->log, "aggregation.failed", "iter=%llu reason=step rc=%d", (unsigned long long)a->iteration, job->rc);
    return;
  }
  memcpy(a->last_hash, job->hash, 32);
  hash_hex(job->hash, hash);
  if (job->kind == TRAIN_JOB_APPLY) p->step++;
  p->counters.aggregations++;
  /* wasted_s: compute on microbatches that did not make it into this round */
  double wasted = p->counters.wasted_seconds - p->wasted_reported;
  p->wasted_reported = p->counters.wasted_seconds;
  GW_INFO(&p->log, "aggregation.done",
          "iter=%llu hash=%s step=%llu microbatches=%u total=%u members=%u wasted_s=%.4f",
          (unsigned long long)a->iteration, hash, (unsigned long long)p->step, a->my_count,
          a->avg_total_count, a->n_last_contributors, wasted);
  if (!agg_i_aggregate(p)) {
    Gwtf__TrainAggDone d = GWTF__TRAIN_AGG_DONE__INIT;
    d.iteration = a->iteration;
    d.stage = p->stage;
    d.hash.len = 32;
    d.hash.data = a->last_hash;
    peer_send(p, &a->aggregator, GWTF__TRAIN_MSG__TRAIN_AGG_DONE, &d.base, NULL);
  }
  a->phase = AGG_IDLE;
  p->aggregating = false;
  p->iteration = a->iteration + 1;
  p->bwd_count = 0;
  if (p->io.event) {
    train_event ev = {.kind = TRAIN_EV_AGGREGATED, .stage = p->stage, .iteration = p->iteration};
    memcpy(ev.hash, job->hash, 32);
    p->io.event(p->io.ud, &ev);
  }
  if (p->cfg.role == TRAIN_DATA) {
    summary(p);
    p->iter_reported = false;
  }
  relay_release_queued(p);
  agg_try_can_take(p);
  join_serve_pending(p);
  move_after_round(p); /* a rebalancing move waited for this round (peer_move.c) */
  join_round_applied(p);
}

void agg_job_done(train_peer *p, train_job *job) {
  peer_agg *a = &p->agg;
  if (job->kind == TRAIN_JOB_GRAD_EXPORT) {
    if (job != a->export_job) return; /* its round was abandoned */
    a->export_job = NULL;
    if (!p->aggregating || a->phase != AGG_EXPORT) return; /* the average came first */
    if (job->rc != 0) {
      GW_ERROR(&p->log, "aggregation.failed", "iter=%llu reason=export rc=%d", (unsigned long long)a->iteration,
               job->rc);
      a->phase = AGG_COLLECT;
      return;
    }
    contribute(p);
    return;
  }
  round_done(p, job);
}

/* ---- time and failures ---- */

/* Both floods are repeated while they matter, because the set of peers
 * changes under them: a peer that joined a stage just after BEGIN_AGG went
 * by never hears of the round, and the peers before it would wait for its
 * CAN_TAKE forever. Both messages are idempotent. */
static void reflood(train_peer *p) {
  if (p->state != PEER_READY || p->aggregating || p->now - p->last_reflood_ms < p->cfg.tun.hop_timeout_ms) return;
  p->last_reflood_ms = p->now;
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  if (p->iteration > 0 && p->stage < p->cfg.n_stages && p->downstream_ready < p->iteration) {
    m.iteration = p->iteration - 1;
    peer_broadcast_stage(p, p->stage + 1, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, &m.base);
  }
  if (p->cfg.role == TRAIN_RELAY && p->can_take_sent > p->iteration)
    send_can_take(p, p->iteration, p->pipeline_sent > p->iteration);
}

/* We took over a round whose aggregator died. It may have sent its average
 * to some members before it went (its bytes to us were still in flight):
 * those have applied it and left the round, and would never contribute to
 * us. An empty GRAD asks each member; one that applied an average for this
 * round answers with it (agg_on_grad), and the stage keeps one set of
 * weights instead of splitting in two. */
static void ask_for_applied_average(train_peer *p) {
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if (gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id)) continue;
    send_vector(p, id, GWTF__TRAIN_MSG__TRAIN_GRAD, NULL, 0, NULL, NULL, 0, 0, p->agg.iteration, NULL);
  }
  p->agg.asked_applied = true;
}

void agg_ask_missed_average(train_peer *p, const gw_id *from) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  p->counters.downloads_caught_up++;
  GW_INFO(&p->log, "weights.catch_up", "iter=%llu from=%s", (unsigned long long)p->iteration, who);
  /* an empty gradient for the round it averaged: it answers with the
   * average it applied (agg_on_grad), which we step with */
  send_vector(p, from, GWTF__TRAIN_MSG__TRAIN_GRAD, NULL, 0, NULL, NULL, 0, 0, p->iteration, NULL);
}

void agg_tick(train_peer *p) {
  peer_agg *a = &p->agg;
  reflood(p);
  /* A member that became ready without a round of its own (a joiner, a
   * first member of an empty stage) owes its stage's CAN_TAKE too. */
  agg_try_can_take(p);
  if (!p->aggregating || a->phase != AGG_COLLECT) return;
  if (agg_i_aggregate(p)) {
    agg_maybe_finish(p);
    return;
  }
  if (p->now < a->deadline && peer_alive(p, &a->aggregator)) return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(&a->aggregator, who);
  GW_WARN(&p->log, "aggregation.aggregator_lost", "iter=%llu aggregator=%s", (unsigned long long)a->iteration, who);
  if (a->n_failed < PEER_MAX_CONTRIB) a->failed[a->n_failed++] = a->aggregator;
  if (!a->mine) {
    /* We joined the round through an average that then stopped coming: ask
     * the next aggregator for it with an empty contribution. */
    a->mine = calloc(p->cfg.shape.n_params ? p->cfg.shape.n_params : 1, sizeof(float));
    a->my_count = 0;
    if (!a->mine) return;
  }
  contribute(p);
  if (agg_i_aggregate(p)) ask_for_applied_average(p);
}

/* We are resyncing: the round we were in (waiting for an average that did
 * not come) is over for us; the stage's state we download replaces it. An
 * apply already running finishes, and the download that follows overwrites
 * its result. */
void agg_abandon_round(train_peer *p) {
  peer_agg *a = &p->agg;
  if (!p->aggregating || a->phase == AGG_APPLY) return;
  GW_INFO(&p->log, "aggregation.abandoned", "iter=%llu", (unsigned long long)a->iteration);
  reset_round(a);
  drop_mine(p);
  a->phase = AGG_IDLE;
  p->aggregating = false;
}

void agg_peer_down(train_peer *p, const gw_id *peer) {
  peer_agg *a = &p->agg;
  if (!p->aggregating || a->phase != AGG_COLLECT) return;
  if (agg_i_aggregate(p)) agg_maybe_finish(p);
  else if (gw_id_eq(&a->aggregator, peer)) a->deadline = p->now;
}
