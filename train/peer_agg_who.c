/* train/peer_agg_who.c — who aggregates a round, and whose average a member
 * takes (GWTF §V-E; the round itself is train/peer_agg.c, applying an
 * average train/peer_avg.c).
 *
 * A stage's aggregator is its lowest live node ID among the members the
 * directory, the leader or a directory member's BEGIN_AGG vouches for,
 * leaving out members that gave up on the round, wait for our state, or say
 * they are joining; a lower one vouched for mid-round is switched to
 * (agg_repick, peer_agg.c). Views can differ for a moment; the rules here settle
 * which average a member applies: its chosen aggregator's, a vouched lower
 * ID's (a split healed), its source's while it joins, and a joiner's
 * stage-mate whose view does not have it yet. */
#include "train/peer_agg.h"

#include "train/peer_join.h"
#include "util/err.h"

bool agg_is_failed(const peer_agg *a, const gw_id *id) { return id_in(a->failed, a->n_failed, id); }

/* A joining mark lasts while its HELLOs (one per gradient it cannot take)
 * keep saying so, and at most this long after the last. */
#define JOINING_MS(p) (2 * (p)->cfg.tun.agg_timeout_ms)

static int joining_slot(const train_peer *p, const gw_id *id) {
  for (size_t i = 0; i < sizeof(p->agg.joining) / sizeof(p->agg.joining[0]); i++)
    if (p->agg.joining[i].at_ms && gw_id_eq(&p->agg.joining[i].id, id)) return (int)i;
  return -1;
}

static bool member_joining(const train_peer *p, const gw_id *id) {
  int k = joining_slot(p, id);
  return k >= 0 && p->now - p->agg.joining[k].at_ms < JOINING_MS(p);
}

/* Not waited for, not picked: it gave up on the round (failed), or it
 * waits for our state, which we serve only once the round is over (a
 * request that came between two rounds held the next for its timeout). */
bool agg_out_of_round(const train_peer *p, const gw_id *id) {
  return agg_is_failed(&p->agg, id) || join_awaits_our_state(p, id) || member_joining(p, id);
}

/* The lowest live node ID among us and the members of our stage that the
 * directory (or the leader's ASSIGN) vouches for. A peer only heard by
 * HELLO is never picked: anyone can say HELLO, and a stranger with a
 * ground-down low ID became its stage's aggregator that way. Views that
 * still differ are healed by the rule that the lowest vouched aggregator's
 * average wins (agg_on_avg, split_detected). */
gw_id agg_pick_aggregator(train_peer *p) {
  gw_id best = p->cfg.self;
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if ((!v->v[i].heard || v->v[i].vouched) && gw_id_cmp(id, &best) < 0 && peer_alive(p, id) &&
        !agg_out_of_round(p, id))
      best = *id;
  }
  return best;
}

bool agg_i_aggregate(train_peer *p) { return gw_id_eq(&p->agg.aggregator, &p->cfg.self); }

/* We are fetching (or checking) our stage's state; `from` is a directory
 * member of it (our source, or the aggregator whose view has us). */
bool agg_joining_from(train_peer *p, const gw_id *from) {
  return (p->state == PEER_DOWNLOADING || p->state == PEER_RESTORING) && peer_is_member(p, p->stage, from, true);
}

/* A directory member of our stage whose BEGIN_AGG for this round did not
 * list us, while we aggregate it (we picked ourselves, or would): its view
 * lacks us, so it aggregates without us and its gradient never comes. With
 * no third member to vouch for us to it, one of the two averages must give
 * way, or the stage splits; agg_drop_unlisted_average says which. */
static bool left_us_out(train_peer *p, const gw_id *from) {
  const peer_agg *a = &p->agg;
  if (!p->aggregating || a->unlisted.iteration != a->iteration + 1 || !gw_id_eq(from, &a->unlisted.id) ||
      !peer_is_member(p, p->stage, from, true))
    return false;
  if (a->picked) return agg_i_aggregate(p);
  gw_id pick = agg_pick_aggregator(p);
  return gw_id_eq(&pick, &p->cfg.self);
}

/* We fetched our stage's state lately: a member whose directory lacks us
 * is most likely one whose record of us is still on its way, and its
 * weights are those we fetched and stepped with since. */
static bool joined_lately(const train_peer *p) {
  return p->dl.done_ms && p->now - p->dl.done_ms < 4 * p->cfg.tun.agg_timeout_ms;
}

/* We joined lately and would aggregate this round ourselves (the lowest
 * ID our directory lists), but nobody's gradient came to us: the members
 * whose directories lack us yet (our record is on its way) picked another
 * of them and aggregated among themselves. That aggregator's average is the
 * stage's round: we follow it (agg.deferred), leaving our own gradient
 * out, as for a member that left us out (left_us_out). Before, with no
 * BEGIN_AGG of theirs to say so (theirs go to their directory's members),
 * we refused it, waited out the round, stepped with our gradient alone,
 * and the members, seeing a lower ID's average, fetched our weights: the
 * stage split and healed without their round's step (homo-churn20 seed
 * 170: stage 3 lost iteration 7's step and stalled 10 s). */
static bool aggregating_alone(train_peer *p, const gw_id *from) {
  const peer_agg *a = &p->agg;
  if (!p->aggregating || a->phase != AGG_COLLECT || !joined_lately(p) || !peer_is_member(p, p->stage, from, true))
    return false;
  gw_id pick = a->picked ? a->aggregator : agg_pick_aggregator(p);
  if (!gw_id_eq(&pick, &p->cfg.self)) return false;
  for (uint32_t i = 0; i < a->n_contrib; i++)
    if (!gw_id_eq(&a->contrib[i].id, &p->cfg.self)) return false;
  return true;
}

/* The average of a member that left us out (left_us_out). We joined lately
 * (the common case: our record has not reached its directory yet): its
 * average is the stage's, we follow it (agg.deferred) and pass it on;
 * before, we refused it as not our aggregator's, waited out the round for
 * its gradient and stepped alone, a split. Otherwise its view is what is
 * wrong (a refresh missed us): its weights may already differ from ours
 * (following such a member's empty averages froze a stage), so we drop its
 * average, stop waiting for it and finish with what we have; it stays
 * split off until its view has us (docs/TRAINING.md, known limits).
 * Returns true when the average is dropped. */
bool agg_drop_unlisted_average(train_peer *p, const gw_id *from) {
  if (!left_us_out(p, from) || joined_lately(p)) return false;
  peer_agg *a = &p->agg;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  GW_WARN(&p->log, "agg.unlisted_dropped", "iter=%llu peer=%s", (unsigned long long)a->iteration, who);
  if (!agg_is_failed(a, from) && a->n_failed < PEER_MAX_CONTRIB) a->failed[a->n_failed++] = *from;
  if (a->phase == AGG_COLLECT && a->picked) agg_maybe_finish(p);
  return true;
}

/* We sent our gradient to `id` this round: it was our pick then, and a
 * lower ID vouched for since made us send it again (agg_repick). The first
 * one's average, made with our gradient, ends our round as well as the new
 * one's would: refused, we waited twice the round's timeout for a joiner
 * that had itself deferred to that average and passed nothing on to us (its
 * list named us), a 9.5 s stall in a homo-churn10 run. */
bool agg_sent_grad_to(const train_peer *p, const gw_id *id) {
  return p->aggregating && id_in(p->agg.sent_to, p->agg.n_sent_to, id);
}

/* Only the aggregator we chose for the round may send us its average: one
 * TRAIN_AVG from anyone used to rewrite a whole stage. Before we picked
 * (our export is running, or the average overtook BEGIN_AGG) the one we
 * would pick now is the one; after, the one we picked, or a newer pick (a
 * member of lower ID appeared in our view: following it heals a split).
 * When we took a round over we asked every member for an average it
 * applied, and a member of our stage may answer with it. The member that
 * just served us its state sends its round's average to us too
 * (finish_round's `served`): it already chose our weights. So may each
 * aggregator our gradient went to this round (agg_sent_grad_to). */
bool agg_is_round_aggregator(train_peer *p, const gw_id *from) {
  peer_agg *a = &p->agg;
  if (gw_id_eq(from, &p->cfg.self)) return false;
  if (p->aggregating && a->picked && gw_id_eq(from, &a->aggregator)) return true;
  if (agg_sent_grad_to(p, from)) return true;
  if (p->aggregating && a->asked_applied && peer_is_member(p, p->stage, from, false)) return true;
  if (gw_id_eq(from, &p->dl.from) &&
      (p->state != PEER_READY || (p->dl.done_ms && p->iteration == p->dl.iteration &&
                                  p->now - p->dl.done_ms < 4 * p->cfg.tun.agg_timeout_ms)))
    return true;
  /* getting ready, a directory member's average tells us the round ended
   * (missed_while_joining): nothing of it is applied now */
  if (agg_joining_from(p, from)) return true;
  if (left_us_out(p, from) || aggregating_alone(p, from)) return true;
  /* ... and the one we then asked for it (agg_ask_missed_average) */
  if (p->dl.catch_up && gw_id_eq(from, &p->dl.avg_from) && p->iteration == p->dl.iteration) return true;
  gw_id now = agg_pick_aggregator(p);
  if (gw_id_eq(from, &now)) return true;
  /* A vouched member of lower ID than the aggregator we followed: its
   * average (of our round, or of the one we just applied: a split) wins. */
  return peer_vouched(p, from) &&
         (gw_id_cmp(from, &a->aggregator) < 0 || (a->have_last_avg && gw_id_cmp(from, &a->applied_from) < 0));
}

/* An average reaches us signed by its aggregator, `signer`, and delivered
 * by `from`, which the dispatcher let send it (agg_is_round_aggregator).
 * We apply `signer`'s average when it is the sender's own; when we would follow the
 * signer ourselves (the one we would pick now, a vouched member of lower ID
 * than the one we followed, an aggregator of ours that went silent this
 * round, or the member that just served us its state); or when our chosen
 * aggregator passes on the average of a lower ID: it deferred to it (it may
 * be one our view lacks), and as our aggregator it decides our average
 * anyway. (A joiner that follows a higher ID that left it out, left_us_out,
 * passes that average on too; its contributors refuse it and, once their
 * timeout ends, take the round over. It takes a third member whose view
 * has the joiner, and that member's BEGIN_AGG vouches for the joiner to
 * the one that lacks it: there is then no left_us_out.) A member answering a takeover's question, or the member that
 * served us, cannot hand on an average of its own making as another's. */
bool agg_accepts_signer(train_peer *p, const gw_id *from, const gw_id *signer) {
  peer_agg *a = &p->agg;
  if (gw_id_eq(signer, &p->cfg.self)) return false; /* ours we applied as we made it: a copy is a replay */
  if (gw_id_eq(signer, from)) return true;
  if (p->aggregating && a->picked && gw_id_eq(from, &a->aggregator) && gw_id_cmp(signer, from) < 0) return true;
  if (p->aggregating && agg_is_failed(a, signer)) return true;
  if (gw_id_eq(signer, &p->dl.from) && p->dl.done_ms && p->iteration == p->dl.iteration &&
      p->now - p->dl.done_ms < 4 * p->cfg.tun.agg_timeout_ms)
    return true;
  /* our source passes on the average it applied after serving us (its
   * aggregator's, a directory member of our stage: the signature says who
   * made it); asked for it (agg_ask_missed_average), we step with what it stepped */
  if (p->dl.catch_up && gw_id_eq(from, &p->dl.avg_from) && p->iteration == p->dl.iteration &&
      gw_id_eq(signer, &p->dl.avg_signer))
    return true;
  /* ... and the rounds before that one, which our source applied (we took
   * its whole state already): whoever aggregated them signed them */
  if (p->dl.catch_up && gw_id_eq(from, &p->dl.from) && p->iteration == p->dl.iteration &&
      p->iteration + 1 < p->dl.avg_of)
    return true;
  /* getting ready: our source's word, or a directory member's own average */
  if (agg_joining_from(p, from) && (gw_id_eq(from, &p->dl.from) || gw_id_eq(signer, from))) return true;
  gw_id now = agg_pick_aggregator(p);
  if (gw_id_eq(signer, &now)) return true;
  return peer_vouched(p, signer) && (gw_id_cmp(signer, &a->aggregator) < 0 ||
                                     (a->have_last_avg && gw_id_cmp(signer, &a->applied_from) < 0));
}

/* A member asked us for our weights: it is (re)joining and will not take
 * part in this round. Neither wait for it nor pick it to aggregate (else the
 * round stalls a whole timeout on it while its download waits on the round). */
void agg_member_joining(train_peer *p, const gw_id *peer, bool joining) {
  peer_agg *a = &p->agg;
  int k = joining_slot(p, peer);
  if (!joining) {
    if (k >= 0) a->joining[k].at_ms = 0;
    return;
  }
  if (k < 0) {
    k = 0; /* a free slot, or the oldest mark */
    for (size_t i = 1; i < sizeof(a->joining) / sizeof(a->joining[0]); i++)
      if (a->joining[i].at_ms < a->joining[k].at_ms) k = (int)i;
    a->joining[k].id = *peer;
  }
  a->joining[k].at_ms = p->now ? p->now : 1;
  if (!p->aggregating || a->phase != AGG_COLLECT) return;
  if (agg_i_aggregate(p)) {
    agg_maybe_finish(p); /* not waited for any more */
  } else if (gw_id_eq(&a->aggregator, peer)) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(peer, who);
    GW_INFO(&p->log, "aggregation.aggregator_joining", "iter=%llu aggregator=%s", (unsigned long long)a->iteration,
            who);
    a->deadline = p->now; /* agg_tick gives up on it and contributes to the next */
  }
}

void agg_member_downloading(train_peer *p, const gw_id *peer) {
  peer_agg *a = &p->agg;
  if (!p->aggregating || agg_is_failed(a, peer)) return;
  if (a->n_failed < PEER_MAX_CONTRIB) a->failed[a->n_failed++] = *peer;
  if (a->phase != AGG_COLLECT) return;
  if (agg_i_aggregate(p)) agg_maybe_finish(p);
  else if (gw_id_eq(&a->aggregator, peer)) a->deadline = p->now;
}
