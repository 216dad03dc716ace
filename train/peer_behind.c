/* train/peer_behind.c — a stage whose members all fell behind the run.
 *
 * A relay trains iteration I and takes microbatches of I and I+1 (the next
 * one waits for our aggregation); anything later is refused as
 * `future_iteration` (peer_relay.c). Normally a member that missed an
 * aggregation hears a stage-mate ahead of it (HELLO, BEGIN_AGG) and
 * resyncs (trust_claim_ahead). But when the members that were ahead die
 * (churn took the only one that had aggregated), those left hold an older
 * iteration, nobody claims to be ahead, and every microbatch the data nodes
 * send is refused: the run stalls for good.
 *
 * So the upstream's refused offers count as evidence. When FORWARDs past
 * our next iteration keep coming for BEHIND_WAIT_MS (directory members of
 * the previous stage sending microbatches that directory data nodes
 * started) and we are not in a round:
 *   - a live stage-mate that lately said it is ahead of us: resync from it
 *     (one claim is enough here, with the upstream's word besides);
 *   - nobody ahead: the newer weights are gone. We carry on from ours in
 *     the upstream's iteration (`stage.skip_ahead`, the steps between are
 *     lost), as a download does when the whole stage was behind
 *     (`stage.stale_weights`), rather than stall the run.
 * A previous-stage member could push us forward with forged offers; it
 * could stall us just as well by not forwarding at all, and our weights
 * are untouched either way.
 *
 * A joiner that missed rounds while it fetched asks the member that served
 * it for their averages, one by one (peer_join.c, catch_up). When that
 * member dies before it answers, and the rest of the stage with it, no
 * microbatch need come to show we are behind: the data nodes wait for the
 * CAN_TAKE of a round we never enter (a homo-churn10 run stalled so, every
 * member of its stage 5 dead within one iteration while a joiner caught
 * up). So a catch-up unanswered for an aggregation timeout becomes a
 * resync when a live stage-mate says it is ahead; while its source lives we
 * wait on (an average of a large stage over a thin link takes long, and
 * the source's own claims to be ahead resync us); once the source is gone
 * it is given up: we carry on from our weights past the rounds we missed,
 * into the one that began if a BEGIN_AGG told us of it
 * (`weights.catch_up_failed`). */
#include "train/peer_trust.h"

#include "train/peer_agg.h"
#include "train/peer_join.h"

/* offers this long in a row before we act: a member that only missed the
 * round resyncs through its stage-mates well before */
#define BEHIND_WAIT_MS(p) (2 * (p)->cfg.tun.agg_timeout_ms)
/* no offer for this long ends the spell (upstream gives up on a refused
 * microbatch after its re-routes, and its origin starts it again later) */
#define BEHIND_GAP_MS(p) (4 * (p)->cfg.tun.agg_timeout_ms)
/* A catch-up whose source is gone waits this long for a session to a listed
 * stage-mate to come up (a new peer's took 1.5 s in the swarm) */
#define CATCH_UP_SESSION_WAIT_MS 3000

static void behind_reset(train_peer *p) {
  p->behind.iteration = p->behind.since_ms = p->behind.last_ms = 0;
}

void behind_note_future(train_peer *p, const gw_id *from, const gw_id *origin, uint64_t iteration) {
  peer_behind *b = &p->behind;
  if (p->state != PEER_READY || p->stage < 1 || iteration <= p->iteration + 1) return;
  if (!peer_is_member(p, p->stage - 1, from, true) || !peer_is_member(p, 0, origin, true)) return;
  if (!b->since_ms || p->now - b->last_ms > BEHIND_GAP_MS(p)) b->since_ms = p->now ? p->now : 1;
  b->iteration = iteration; /* upstream's latest word: our round may end meanwhile, it still is ahead */
  b->last_ms = p->now;
}

void behind_note_next(train_peer *p) {
  peer_behind *b = &p->behind;
  if (b->next_since_ms && b->next_of == p->iteration) return;
  b->next_since_ms = p->now ? p->now : 1;
  b->next_of = p->iteration;
}

/* Microbatches of our next iteration wait for our round, which a BEGIN_AGG
 * starts; one that reached us while we were still in an older round (or
 * getting ready) was dropped, and upstream will not send another. */
static void next_tick(train_peer *p) {
  peer_behind *b = &p->behind;
  if (!b->next_since_ms) return;
  if (b->next_of != p->iteration || p->state != PEER_READY) {
    b->next_since_ms = 0;
    return;
  }
  if (p->aggregating || p->now - b->next_since_ms < BEHIND_WAIT_MS(p)) return;
  b->next_since_ms = 0;
  agg_begin_late(p);
}

static void skip_ahead(train_peer *p, uint64_t to) {
  GW_WARN(&p->log, "stage.skip_ahead",
          "stage=%d from=%llu to=%llu lost=%llu msg=\"no member of stage %d is ahead of us and the run moved on: "
          "we carry on from our weights, the steps between are lost\"",
          p->stage, (unsigned long long)p->iteration, (unsigned long long)to,
          (unsigned long long)(to - p->iteration), p->stage);
  p->counters.iterations_skipped += to - p->iteration;
  mb_abandon_iteration(p, UINT64_MAX);
  p->iteration = to;
  p->begin_agg_seen = to; /* the next round we flood is this iteration's */
  p->iter_running = false;
  p->iter_reported = false;
  /* tell the stage where we are: a stage-mate still behind follows us */
  p->last_hello_ms = p->now;
  peer_send_hellos(p);
}

/* Past the rounds a catch-up lacked, and into the one that began since. */
/* The iteration the stage is at, by what we caught up on: the round whose
 * average we lacked ended, or a later one began. */
static uint64_t catch_up_target(const train_peer *p) {
  const peer_download *d = &p->dl;
  uint64_t to = d->avg_of > p->iteration ? d->avg_of : p->iteration + 1;
  if (p->missed_agg > to + 1) to = p->missed_agg - 1; /* a later round began: we meet the stage there */
  return to;
}

static void catch_up_give_up(train_peer *p, const gw_id *source) {
  peer_download *d = &p->dl;
  uint64_t to = catch_up_target(p);
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(source, who);
  GW_WARN(&p->log, "weights.catch_up_failed",
          "from=%s from_iter=%llu to=%llu lost=%llu msg=\"the average we asked %s for never came and nobody of our "
          "stage is ahead: we carry on from our weights, the steps between are lost\"",
          who, (unsigned long long)p->iteration, (unsigned long long)to, (unsigned long long)(to - p->iteration), who);
  p->counters.iterations_skipped += to - p->iteration;
  d->catch_up = false;
  mb_abandon_iteration(p, to - 1); /* microbatches of an iteration we skip; ours wait in the queue */
  p->iteration = to;
  relay_release_queued(p);
  if (p->missed_agg > p->iteration && !p->aggregating) agg_begin_round(p, true);
  p->last_hello_ms = p->now; /* tell the stage where we are */
  peer_send_hellos(p);
}

/* A catch-up unanswered for an aggregation timeout, or whose source's
 * session is gone (it died: its answer will not come), resyncs from a
 * stage-mate ahead of us or, with none, gives the rounds up. Waiting out
 * the timeout for a source already gone held a restarted relay 20 s in a
 * homo-churn10 run (seed 113, 2026-11-28), and the data nodes' microbatches
 * with it. */
static void catch_up_tick(train_peer *p) {
  peer_download *d = &p->dl;
  if (!d->catch_up || p->state != PEER_READY || p->aggregating) return;
  const gw_id *source = p->iteration + 1 == d->avg_of ? &d->avg_from : &d->from;
  bool gone = !peer_alive(p, source);
  if (p->now < d->catch_up_until && !gone) return;
  uint64_t ahead;
  if (trust_stage_ahead(p, &ahead)) {
    d->catch_up = false;
    join_resync(p, ahead, "catch_up");
    return;
  }
  if (!gone) return;
  /* A live stage-mate may hold the rounds we lack though it has not said
   * so to us yet: we got ready a moment ago. Its state, not a skip: in a
   * homo-churn20 run (2026-12-07) a joiner whose source died while it
   * checked its download skipped a round its mate had stepped, and the
   * stage split until a hash mismatch healed it. */
  if (join_live_source(p, source)) {
    d->catch_up = false;
    join_resync(p, catch_up_target(p), "catch_up_source_gone");
    return;
  }
  /* A listed stage-mate whose session is still coming up may hold them
   * too: waited for a little. In a hetero-churn10 run (seed 170,
   * 2026-12-07) the only other member had restarted with a fresh identity
   * on its old port; our dial there still expected its old one, the
   * joiner gave the round up 0.5 s before the session to the new identity
   * came up, and the stage split. A record that outlives its peer costs
   * the wait and no more. */
  if (!d->source_gone_ms) d->source_gone_ms = p->now;
  if (join_listed_source(p, source) && p->now - d->source_gone_ms < CATCH_UP_SESSION_WAIT_MS) return;
  catch_up_give_up(p, source);
}

void behind_tick(train_peer *p) {
  peer_behind *b = &p->behind;
  catch_up_tick(p);
  next_tick(p);
  if (!b->since_ms) return;
  if (p->state != PEER_READY || b->iteration <= p->iteration + 1 || p->now - b->last_ms > BEHIND_GAP_MS(p)) {
    behind_reset(p);
    return;
  }
  if (p->aggregating || p->now - b->since_ms < BEHIND_WAIT_MS(p)) return;
  uint64_t to = b->iteration, ahead;
  behind_reset(p);
  if (trust_stage_ahead(p, &ahead)) {
    join_resync(p, ahead, "upstream_ahead");
    return;
  }
  skip_ahead(p, to);
}
