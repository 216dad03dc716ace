/* train/peer_avg.c — the average a member applies (GWTF §V-E): who may
 * send it (the aggregator it picked, or one that heals a split), checked
 * against its signature and our own contribution's hash, received in
 * chunks, applied, passed on to members that contributed to us; a split
 * healed by fetching the lowest aggregator's weights; a joiner's note of a
 * round that ended while it fetched. The round itself (who aggregates,
 * BEGIN_AGG, collecting, finishing) is train/peer_agg.c. */
#include "train/peer_agg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/peer_join.h"
#include "train/peer_trust.h"

/* If we sent our gradient to its aggregator, the average must list our
 * contribution with the hash of what we sent: one that lists a different
 * hash was not made from our gradient (refused, agg.forged). One that leaves us out is applied all the
 * same (logged once it is whole and checked): the aggregator may have timed
 * out on us or rejected us, and a member that refused it would split from
 * its stage. */
static bool avg_lists_us_right(train_peer *p, const gw_id *from, const peer_avg_sig *sig, const Gwtf__TrainGrad *g,
                               bool *left_out) {
  peer_agg *a = &p->agg;
  *left_out = false;
  /* not in a round yet: nothing of ours went anywhere (`contributed` is
   * the last round's until we enter one) */
  if (!p->aggregating || !a->contributed || !agg_sent_grad_to(p, from)) return true;
  for (size_t i = 0; i < g->n_contributors; i++) {
    gw_id id;
    id_from_bytes(&id, g->contributors[i]);
    if (!gw_id_eq(&id, &p->cfg.self)) continue;
    if (i < g->n_contributor_hashes && g->contributor_hashes[i].len == 32 &&
        memcmp(g->contributor_hashes[i].data, a->my_hash, 32) == 0)
      return true;
    avgsig_refuse(p, from, &sig->signer, g->iteration, "contribution_hash");
    return false;
  }
  *left_out = true; /* counted once its floats check out (commit_average) */
  return true;
}

/* Whether an average lists exactly the contributors and hashes of the one
 * we applied last (then it is the same average: the same inputs in the same
 * order give the same bits). */
static bool same_as_applied(const peer_agg *a, const Gwtf__TrainGrad *g) {
  if (g->n_contributors != a->n_last_contributors || g->n_contributor_hashes != g->n_contributors) return false;
  for (uint32_t i = 0; i < a->n_last_contributors; i++) {
    gw_id id;
    id_from_bytes(&id, g->contributors[i]);
    if (!gw_id_eq(&id, &a->last_contributors[i]) || g->contributor_hashes[i].len != 32 ||
        memcmp(g->contributor_hashes[i].data, a->last_contrib_hashes[i], 32) != 0)
      return false;
  }
  return true;
}

/* The round we finished was also averaged by a vouched member of lower ID
 * than the aggregator we followed: two views picked two aggregators and
 * the stage split. The lowest one's weights are the stage's, so we fetch
 * them from it (its own state is its average applied). */
static void on_split(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g) {
  peer_agg *a = &p->agg;
  if (g->offset != 0 || !a->have_last_avg || g->iteration != a->last_avg_iteration ||
      (p->aggregating && a->phase == AGG_APPLY) ||
      !peer_vouched(p, from) || gw_id_cmp(from, &a->applied_from) >= 0 || same_as_applied(a, g))
    return;
  /* It makes us download our state again: only for an average its
   * aggregator really made (a vouched one of lower ID than ours). */
  peer_avg_sig sig;
  if (!avgsig_check(p, from, g, &sig)) return;
  char who[GW_ID_SHORT_LEN + 1], mine[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  peer_short(&a->applied_from, mine);
  GW_WARN(&p->log, "agg.split_detected", "iter=%llu aggregator=%s followed=%s members=%zu",
          (unsigned long long)g->iteration, who, mine, g->n_contributors);
  p->counters.splits_healed++;
  a->aggregator = *from; /* RESYNC from it is now in order too */
  p->dl.prefer = *from;
  p->dl.has_prefer = true;
  join_resync(p, p->iteration, "split");
}

/* Members that contributed to us though we do not aggregate (or no longer)
 * wait for our average: they get the stage's, which leaves them out
 * (agg.left_out), and they apply it. */
static void pass_on(train_peer *p) {
  peer_agg *a = &p->agg;
  if (!a->pass_on) return;
  a->pass_on = false;
  for (uint32_t i = 0; i < a->n_pass_on; i++)
    if (peer_alive(p, &a->pass_to[i])) agg_send_last_avg(p, &a->pass_to[i]);
  a->n_pass_on = 0;
}

/* The average whose floats just checked out becomes the one we applied:
 * kept, with its list and signature, for members that ask us late (they
 * must get exactly these bits, verifiable as its aggregator's). */
static void commit_average(train_peer *p, uint64_t iteration, uint32_t total_count) {
  peer_agg *a = &p->agg;
  avgkeep_push_last(p);
  a->last_avg = total_count ? a->avg : NULL;
  if (total_count) a->avg = NULL;
  a->have_last_avg = true;
  a->last_avg_iteration = iteration;
  a->last_avg_total_count = total_count;
  a->last_sig = a->pend.sig;
  a->n_last_contributors = a->pend.n_contributors;
  memcpy(a->last_contributors, a->pend.contributors, a->pend.n_contributors * sizeof(gw_id));
  memcpy(a->last_contrib_hashes, a->pend.hashes, a->pend.n_contributors * 32);
  a->pend.sig.have = false;
  if (a->pend.left_out) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(&a->pend.from, who);
    p->counters.rounds_left_out++;
    GW_WARN(&p->log, "agg.left_out", "aggregator=%s iter=%llu", who, (unsigned long long)iteration);
  }
}

/* The average names `id` among its contributors: that member sent its
 * gradient to the average's aggregator too (it switched to it,
 * agg_repick), and gets the average from it, not from us. A copy we passed
 * on reached it after the round and was refused as forged. */
static bool avg_lists(const Gwtf__TrainGrad *g, const gw_id *id) {
  for (size_t i = 0; i < g->n_contributors; i++)
    if (g->contributors[i].len == GW_ID_BYTES && memcmp(g->contributors[i].data, id->b, GW_ID_BYTES) == 0) return true;
  return false;
}

/* An average's first chunk, its signature checked: we are in the round
 * now, and this is the average we expect the rest of. */
static void begin_average(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const peer_avg_sig *sig,
                          bool left_out) {
  peer_agg *a = &p->agg;
  if (!p->aggregating) {
    /* The average overtook BEGIN_AGG: we are not in it, but we step with it. */
    agg_begin_round(p, false);
  }
  if (!gw_id_eq(from, &p->cfg.self)) {
    /* Members that sent us their gradient picked us to aggregate (their view
     * lacks the one we follow, or we did, until now). The average we apply
     * is the stage's: they get it from us once it is whole (pass_on), see
     * themselves left out and apply it, rather than give up on us and step
     * alone. */
    a->n_pass_on = 0;
    for (uint32_t i = 0; i < a->n_contrib; i++)
      if (!gw_id_eq(&a->contrib[i].id, &p->cfg.self) && !avg_lists(g, &a->contrib[i].id))
        a->pass_to[a->n_pass_on++] = a->contrib[i].id;
    a->pass_on = a->n_pass_on > 0;
    if (agg_i_aggregate(p)) {
      char who[GW_ID_SHORT_LEN + 1];
      peer_short(from, who);
      p->counters.rounds_deferred++;
      GW_WARN(&p->log, "agg.deferred", "iter=%llu to=%s contributors_waiting=%u", (unsigned long long)g->iteration,
              who, a->n_pass_on);
    }
  }
  a->aggregator = *from;
  a->picked = true;
  /* avgsig_check took only lists of at most PEER_MAX_CONTRIB well-formed entries */
  a->pend.from = *from;
  a->pend.sig = *sig;
  a->pend.left_out = left_out;
  a->pend.n_contributors = (uint32_t)g->n_contributors;
  for (uint32_t i = 0; i < a->pend.n_contributors; i++) {
    id_from_bytes(&a->pend.contributors[i], g->contributors[i]);
    memcpy(a->pend.hashes[i], g->contributor_hashes[i].data, 32);
  }
  a->avg_received = 0;
}

/* Our stage aggregated (our source sends its average to the peers it just
 * served; an aggregator whose view has us, to us) before our download was
 * checked and restored: we
 * cannot step with it yet, and would become ready a step behind a stage
 * that may have nobody else ahead to resync from. As a BEGIN_AGG seen while
 * downloading does, it makes join_accept_download fetch the newer state. */
static void missed_while_joining(train_peer *p, const gw_id *from, uint64_t iteration, const peer_avg_sig *sig) {
  if (iteration + 1 <= p->dl.avg_of) return;
  p->dl.avg_of = iteration + 1;
  p->dl.avg_from = *from;
  p->dl.avg_signer = sig->signer;
  memcpy(p->dl.avg_hash, sig->hash, 32);
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_INFO(&p->log, "agg.missed_while_joining", "iter=%llu from=%s", (unsigned long long)iteration, who);
  join_on_source_average(p);
}

/* Catching up (ready behind our stage, join_round_applied): our source
 * ended another round meanwhile, one more to step through. */
static bool catching_up_past(const train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g) {
  return p->dl.catch_up && p->state == PEER_READY && g->iteration > p->iteration && gw_id_eq(from, &p->dl.from);
}

void agg_on_avg(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t) {
  peer_agg *a = &p->agg;
  size_t n = p->cfg.shape.n_params;
  if (g->stage == p->stage && p->state == PEER_READY && g->iteration + 1 == p->iteration) {
    on_split(p, from, g);
    return;
  }
  if (g->stage == p->stage && (agg_joining_from(p, from) || catching_up_past(p, from, g))) {
    peer_avg_sig sig;
    if (g->offset == 0 && avgsig_check(p, from, g, &sig)) missed_while_joining(p, from, g->iteration, &sig);
    return;
  }
  if (g->stage != p->stage || p->state != PEER_READY || g->iteration != p->iteration) return;
  if (p->aggregating && (a->phase == AGG_APPLY)) return;
  if (g->offset == 0) {
    /* Checked before anything changes: a refused average leaves us waiting
     * for the real one, or for the deadline that moves us on. */
    peer_avg_sig sig;
    bool left_out;
    if (!avgsig_check(p, from, g, &sig) || !avg_lists_us_right(p, from, &sig, g, &left_out)) return;
    if (agg_drop_unlisted_average(p, from)) return;
    if (p->dl.catch_up && p->iteration == p->dl.iteration && p->iteration + 1 == p->dl.avg_of &&
        gw_id_eq(from, &p->dl.avg_from) && memcmp(sig.hash, p->dl.avg_hash, 32) != 0) {
      avgsig_refuse(p, from, &sig.signer, g->iteration, "hash_mismatch"); /* not the average it told us of */
      return;
    }
    begin_average(p, from, g, &sig, left_out);
    if (g->total_count == 0 || g->total == 0) {
      if (!avgsig_check_floats(p, from, &a->pend.sig, g->iteration, NULL, 0)) {
        a->pend.sig.have = false;
        return;
      }
      commit_average(p, g->iteration, 0);
      pass_on(p);
      agg_apply_average(p, NULL, 0);
      return;
    }
  } else if (!p->aggregating || !a->pend.sig.have || !gw_id_eq(from, &a->pend.from)) {
    return; /* the rest of an average we refused, or another sender's */
  }
  if (g->total != n || !t || t->dtype != TRAIN_F32) return;
  size_t len = t->nbytes / sizeof(float);
  if (g->offset > n || len > n - g->offset) return;
  if (!a->avg) a->avg = malloc(n * sizeof(float));
  if (!a->avg) return;
  /* in order, as a contribution's chunks */
  if (g->offset != a->avg_received) return;
  memcpy(a->avg + g->offset, t->data, len * sizeof(float));
  a->avg_received += len;
  if (a->avg_received != n) return;
  if (!avgsig_check_floats(p, from, &a->pend.sig, g->iteration, a->avg, n)) {
    a->pend.sig.have = false;
    a->avg_received = 0;
    return;
  }
  if (!p->cfg.tun.no_validation) {
    for (size_t k = 0; k < n; k++) {
      if (isfinite(a->avg[k])) continue;
      /* even the round's aggregator does not get to step us into NaN: we
       * wait it out, and the next aggregator (agg_tick) takes over */
      trust_reject(p, from, g->iteration, "nonfinite");
      a->pend.sig.have = false;
      a->avg_received = 0;
      return;
    }
  }
  commit_average(p, g->iteration, g->total_count);
  pass_on(p);
  agg_apply_average(p, a->last_avg, g->total_count);
}

void agg_on_done_msg(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *d) {
  char who[GW_ID_SHORT_LEN + 1], theirs[17], mine[17];
  if (d->stage != p->stage || d->hash.len != 32 || d->iteration + 1 != p->iteration) return;
  if (memcmp(d->hash.data, p->agg.last_hash, 32) == 0) return;
  peer_short(from, who);
  peer_hex8(d->hash.data, theirs);
  peer_hex8(p->agg.last_hash, mine);
  GW_ERROR(&p->log, "aggregation.hash_mismatch", "iter=%llu peer=%s theirs=%s mine=%s",
           (unsigned long long)d->iteration, who, theirs, mine);
  /* The aggregator's weights are the stage's: the member that differs
   * fetches them again rather than drift. */
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = p->iteration;
  peer_send(p, from, GWTF__TRAIN_MSG__TRAIN_RESYNC, &m.base, NULL);
}

void agg_on_resync(train_peer *p, const gw_id *from, uint64_t iteration) {
  if (p->state != PEER_READY || p->aggregating || !gw_id_eq(from, &p->agg.aggregator)) return;
  /* Its weights are the stage's (a split's resync prefers the winner the
   * same way): the first member listed may be on our side of the split. */
  p->dl.prefer = *from;
  p->dl.has_prefer = true;
  join_resync(p, iteration, "hash_mismatch");
}

