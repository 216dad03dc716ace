/* train/peer_trust.c — who may say what, and what a peer's word is worth.
 *
 * Every train message type has one row in `table` naming the circle that may
 * send it; train/peer.c's dispatcher asks trust_admit before any handler
 * runs, so no handler re-implements the check. A refusal is logged once per
 * (peer, type) as `train.refused` with its reason, and counted
 * (train_counters.messages_refused). The p2p session has authenticated the
 * sender's node ID, so `from` is who sent it.
 *
 * The circles, as seen by a peer of stage s (data nodes are stage 0):
 *   anyone      HELLO (what it may change is limited: see trust_claim_ahead),
 *               JOIN (the leader places it; open runs admit all),
 *               WEIGHTS_REQ (rate-limited per requester in peer_join.c);
 *   path        FORWARD, BACKWARD, their acknowledgements, DENY and the
 *               repair messages: the handlers check them against the
 *               microbatch they name (its path, the hop we sent it to);
 *   leader      ASSIGN, MOVE: the leader we follow;
 *   data        ITER_DONE: a member of stage 0;
 *   data/leader LEADER: a member of stage 0, or the leader we follow
 *               (which may name its successor);
 *   stage       GRAD, AGG_DONE: a member of s (directory or heard);
 *   stage dir   WEIGHTS_CHUNK: a member of s the directory (or the leader's
 *               ASSIGN) lists; the handler takes chunks only from the one
 *               we asked;
 *   flood       BEGIN_AGG: a member of s or of s-1 (stage 0: of 0), the way
 *               the flood travels front to back;
 *   next        CAN_TAKE: a member of s+1, the way it travels back;
 *   aggregator  AVG: the aggregator we chose for this round, or a vouched
 *               member of lower ID (its average wins: agg_is_round_aggregator);
 *               RESYNC: the aggregator of the round we last took part in.
 *   admission   CERT, REDEEM, ADMITTED, REVOKED (private runs): anyone, for
 *               they carry a signature by the run key (peer_admit.c);
 *   verify      HASH_REQ: anyone (a joiner); HASH: a member of s the
 *               directory lists (peer_verify.c).
 *   replicas    REPLICA_PUSH: anyone here, because the stage it pushes is
 *               named in its body: replica_on_push takes it only from a
 *               directory member of that stage (not ours); REPLICA_REQ:
 *               anyone (a restorer; rate-limited per requester);
 *               REPLICA_CHUNK: anyone, taken only from the holder we asked
 *               (join_on_chunk, as WEIGHTS_CHUNK) (peer_replica.c);
 *               STAGE_LOST: anyone, believed by the leader only from a
 *               peer it placed into that stage while its own view shows
 *               no other live member there (peer_leader.c).
 * A banned peer (repeated rejected contributions) is refused everything. In
 * a private run, a peer without a valid membership certificate is refused
 * everything but the admission messages, before its circle is looked at
 * (admit_check). */
#include "train/peer_trust.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/peer_admit.h"
#include "train/peer_agg.h"
#include "train/peer_join.h"
#include "train/peer_ledger.h"
#include "util/err.h"

/* A peer whose contributions were rejected this many times is banned ... */
#define TRUST_BAN_AFTER 3
/* ... for this long. */
#define TRUST_BAN_MS (10 * 60 * 1000)
/* A rejection is forgotten after this many iterations without another: a
 * member rejected now and then over a long run (an honest one in a judged
 * round, say) is not banned for rejections months apart. One that fails
 * every few rounds is (what it sends is left out every time anyway). */
#define TRUST_STRIKE_ITERS 8
/* A banned peer hears of its ban at most this often (TRAIN_BANNED). */
#define TRUST_TELL_MS (60 * 1000)
/* A round with nothing to compare a contribution with (one or two, none of
 * ours) holds it to past rounds' norms this many times looser before it
 * clips: honest per-microbatch norms rise tenfold between two iterations
 * now and then (0.45 -> 4.7 in the validation swarm; 0.51 -> 11 in
 * swarm_deterministic, where a clip at norm_k breaks the bit-for-bit
 * equality with train-ref). */
#define TRUST_HISTORY_SLACK 4
/* A claim that our stage is ahead counts this long (HELLOs repeat it). */
#define TRUST_CLAIM_MS(p) (3 * (p)->cfg.tun.hello_period_ms)

typedef enum trust_circle {
  CIRCLE_ANYONE = 0,
  CIRCLE_PATH,
  CIRCLE_LEADER,
  CIRCLE_DATA,
  CIRCLE_DATA_OR_LEADER,
  CIRCLE_STAGE,
  CIRCLE_STAGE_DIR,
  CIRCLE_FLOOD,
  CIRCLE_NEXT,
  CIRCLE_AGGREGATOR,
  CIRCLE_LAST_AGGREGATOR,
} trust_circle;

typedef struct trust_row {
  uint32_t type;
  trust_circle circle;
  const char *name;
} trust_row;

#define ROW(MSG, C) {GWTF__TRAIN_MSG__##MSG, C, #MSG}
static const trust_row table[] = {
    ROW(TRAIN_HELLO, CIRCLE_ANYONE),
    ROW(TRAIN_JOIN, CIRCLE_ANYONE),
    ROW(TRAIN_WEIGHTS_REQ, CIRCLE_ANYONE),
    ROW(TRAIN_ASSIGN, CIRCLE_LEADER),
    ROW(TRAIN_WEIGHTS_CHUNK, CIRCLE_STAGE_DIR),
    ROW(TRAIN_FORWARD, CIRCLE_PATH),
    ROW(TRAIN_FORWARD_DONE, CIRCLE_PATH),
    ROW(TRAIN_FORWARD_RECEIVED, CIRCLE_PATH),
    ROW(TRAIN_DENY, CIRCLE_PATH),
    ROW(TRAIN_BACKWARD, CIRCLE_PATH),
    ROW(TRAIN_BACKWARD_DONE, CIRCLE_PATH),
    ROW(TRAIN_BACKWARD_RECEIVED, CIRCLE_PATH),
    ROW(TRAIN_RECOVER, CIRCLE_PATH),
    ROW(TRAIN_PROBE, CIRCLE_PATH),
    ROW(TRAIN_PROBE_REPLY, CIRCLE_PATH),
    ROW(TRAIN_REPAIR, CIRCLE_PATH),
    ROW(TRAIN_REPAIR_READY, CIRCLE_PATH),
    ROW(TRAIN_ITER_DONE, CIRCLE_DATA),
    ROW(TRAIN_BEGIN_AGG, CIRCLE_FLOOD),
    ROW(TRAIN_GRAD, CIRCLE_STAGE),
    ROW(TRAIN_AVG, CIRCLE_AGGREGATOR),
    ROW(TRAIN_AGG_DONE, CIRCLE_STAGE),
    ROW(TRAIN_CAN_TAKE, CIRCLE_NEXT),
    ROW(TRAIN_LEADER, CIRCLE_DATA_OR_LEADER),
    ROW(TRAIN_RESYNC, CIRCLE_LAST_AGGREGATOR),
    /* private runs: they carry their own proof (a signature by the run key) */
    ROW(TRAIN_CERT, CIRCLE_ANYONE),
    ROW(TRAIN_REDEEM, CIRCLE_ANYONE),
    ROW(TRAIN_ADMITTED, CIRCLE_ANYONE),
    ROW(TRAIN_REVOKED, CIRCLE_ANYONE),
    /* verified downloads: a joiner asks, its stage's directory members answer */
    ROW(TRAIN_HASH_REQ, CIRCLE_ANYONE),
    ROW(TRAIN_HASH, CIRCLE_STAGE_DIR),
    /* stage replicas (peer_replica.c): the handlers check what the body names */
    ROW(TRAIN_REPLICA_PUSH, CIRCLE_ANYONE),
    ROW(TRAIN_REPLICA_REQ, CIRCLE_ANYONE),
    ROW(TRAIN_REPLICA_CHUNK, CIRCLE_ANYONE),
    /* the leader believes it only from a peer it placed into that stage, and
     * only while its own view shows the stage empty (peer_leader.c) */
    ROW(TRAIN_STAGE_LOST, CIRCLE_ANYONE),
    ROW(TRAIN_MOVE, CIRCLE_LEADER),
    /* only logged: a forged one tells a user something false, changes nothing */
    ROW(TRAIN_BANNED, CIRCLE_ANYONE),
};
#undef ROW

static const trust_row *row_for(uint32_t type) {
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    if (table[i].type == type) return &table[i];
  return NULL;
}

static trust_offender *offender(train_peer *p, const gw_id *id, bool create) {
  peer_trust *t = &p->trust;
  for (uint32_t i = 0; i < t->n_offenders; i++)
    if (gw_id_eq(&t->offenders[i].id, id)) return &t->offenders[i];
  if (!create) return NULL;
  uint32_t k = t->n_offenders;
  if (k == TRUST_MAX_OFFENDERS) {
    /* full: forget the one with the fewest rejections that is not banned */
    k = 0;
    for (uint32_t i = 1; i < t->n_offenders; i++)
      if (!t->offenders[i].banned_until && t->offenders[i].rejections < t->offenders[k].rejections) k = i;
    if (t->offenders[k].banned_until) return NULL;
  } else {
    t->n_offenders++;
  }
  memset(&t->offenders[k], 0, sizeof(t->offenders[k]));
  t->offenders[k].id = *id;
  return &t->offenders[k];
}

bool trust_banned(train_peer *p, const gw_id *id) {
  trust_offender *o = offender(p, id, false);
  if (!o || !o->banned_until) return false;
  if (p->now < o->banned_until) return true;
  o->banned_until = 0; /* served its time; rejections start again from zero */
  o->rejections = 0;
  return false;
}

void trust_refuse(train_peer *p, const gw_id *from, uint32_t type, const char *reason) {
  peer_trust *t = &p->trust;
  p->counters.messages_refused++;
  for (uint32_t i = 0; i < t->n_logged; i++)
    if (t->logged[i].type == type && gw_id_eq(&t->logged[i].id, from)) return;
  uint32_t k = t->n_logged < TRUST_MAX_LOGGED ? t->n_logged++ : (uint32_t)(p->counters.messages_refused % TRUST_MAX_LOGGED);
  t->logged[k].id = *from;
  t->logged[k].type = type;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  const trust_row *r = row_for(type);
  GW_WARN(&p->log, "train.refused", "peer=%s type=%s reason=%s iter=%llu", who, r ? r->name : "unknown", reason,
          (unsigned long long)p->iteration);
}

static bool in_circle(train_peer *p, const gw_id *from, trust_circle c, const char **why) {
  int s = p->stage;
  switch (c) {
  case CIRCLE_ANYONE:
  case CIRCLE_PATH: return true;
  case CIRCLE_LEADER:
    *why = "not_leader";
    return p->have_leader && gw_id_eq(from, &p->leader);
  case CIRCLE_DATA:
    *why = "not_data_node";
    return peer_is_member(p, 0, from, true);
  case CIRCLE_DATA_OR_LEADER:
    *why = "not_data_node";
    return peer_is_member(p, 0, from, true) || (p->have_leader && gw_id_eq(from, &p->leader));
  case CIRCLE_STAGE:
    *why = "not_stage_member";
    return s >= 0 && peer_is_member(p, s, from, false);
  case CIRCLE_STAGE_DIR:
    *why = "not_in_directory";
    return s >= 0 && peer_is_member(p, s, from, true);
  case CIRCLE_FLOOD:
    *why = "not_stage_or_previous";
    return s >= 0 && (peer_is_member(p, s, from, false) || (s > 0 && peer_is_member(p, s - 1, from, true)));
  case CIRCLE_NEXT:
    *why = "not_next_stage";
    return s >= 0 && s < p->cfg.n_stages && peer_is_member(p, s + 1, from, true);
  case CIRCLE_AGGREGATOR:
    *why = "not_aggregator";
    return s >= 0 && agg_is_round_aggregator(p, from);
  case CIRCLE_LAST_AGGREGATOR:
    *why = "not_aggregator";
    return gw_id_eq(from, &p->agg.aggregator);
  }
  return false;
}

/* An average the dispatcher refused. Outside a round, from a member of our
 * stage, it is a late copy of a round already over (a member answering a
 * takeover's question with the average we made, a copy passed on after we
 * applied it): nothing could apply it, and the grid's honest runs logged
 * 11 such copies in 36 runs as forgeries. Anything else is an error every
 * time (once per (peer, type) through trust_refuse's table would hide a
 * second forger's first try). */
static void refused_average(train_peer *p, const gw_id *from, const char *why) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  if (!p->aggregating && p->stage >= 0 && peer_is_member(p, p->stage, from, false)) {
    p->counters.averages_late++;
    GW_INFO(&p->log, "agg.late_copy", "peer=%s iter=%llu reason=%s", who, (unsigned long long)p->iteration, why);
    return;
  }
  p->counters.averages_forged++; /* as peer_avgsig.c counts its refusals */
  GW_ERROR(&p->log, "agg.forged", "peer=%s iter=%llu reason=%s", who, (unsigned long long)p->iteration, why);
}

/* A banned peer is told, at its ban and again at most once a minute while
 * we refuse it: refused in silence, a restarted honest relay asked its only
 * stage-mate for weights for 80 s with no word of why (issue 20's CI run). */
static void tell_banned(train_peer *p, trust_offender *o) {
  if (!o || !o->banned_until || p->now >= o->banned_until) return;
  if (o->told_ms && p->now - o->told_ms < TRUST_TELL_MS) return;
  o->told_ms = p->now;
  Gwtf__TrainBanned m = GWTF__TRAIN_BANNED__INIT;
  m.secs_left = (uint32_t)((o->banned_until - p->now + 999) / 1000);
  m.rejections = o->rejections;
  peer_send(p, &o->id, GWTF__TRAIN_MSG__TRAIN_BANNED, &m.base, NULL);
}

void trust_on_banned(train_peer *p, const gw_id *from, const Gwtf__TrainBanned *m) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  p->counters.banned_by++;
  GW_ERROR(&p->log, "run.banned_by", "peer=%s secs=%u rejections=%u msg=\"this peer refuses everything we send "
           "for %u s: it rejected %u of our gradient contributions (agg.rejected in its log)\"", who, m->secs_left,
           m->rejections, m->secs_left, m->rejections);
}

bool trust_admit(train_peer *p, const gw_id *from, uint32_t type) {
  const trust_row *r = row_for(type);
  if (!r) return true; /* the dispatcher logs unknown types */
  if (trust_banned(p, from)) {
    trust_refuse(p, from, type, "banned");
    tell_banned(p, offender(p, from, false));
    return false;
  }
  /* A private run: every circle is inside the run's members (peer_admit.c). */
  if (!admit_check(p, from, type)) return false;
  const char *why = "refused";
  if (in_circle(p, from, r->circle, &why)) return true;
  trust_refuse(p, from, type, why);
  if (type == GWTF__TRAIN_MSG__TRAIN_AVG) refused_average(p, from, why);
  return false;
}

void trust_reject(train_peer *p, const gw_id *from, uint64_t iteration, const char *reason) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  p->counters.contributions_rejected++;
  GW_WARN(&p->log, "agg.rejected", "peer=%s reason=%s iter=%llu", who, reason, (unsigned long long)iteration);
  if (gw_id_eq(from, &p->cfg.self)) return; /* our own: nobody to ban */
  trust_offender *o = offender(p, from, true);
  if (!o || o->banned_until) return;
  if (o->rejections && iteration > o->rejected_iteration + TRUST_STRIKE_ITERS) o->rejections = 0;
  o->rejected_iteration = iteration;
  if (++o->rejections < TRUST_BAN_AFTER) return;
  o->banned_until = p->now + TRUST_BAN_MS;
  o->told_ms = 0;
  p->counters.peers_banned++;
  GW_WARN(&p->log, "run.banned", "peer=%s rejections=%u secs=%d", who, o->rejections, TRUST_BAN_MS / 1000);
  tell_banned(p, o);
  /* out of every view at once: not waited for, not picked, not asked */
  for (int s = 0; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    for (size_t i = 0; i < v->n; i++)
      if (gw_id_eq(&v->v[i].id, from)) {
        v->v[i] = v->v[--v->n];
        break;
      }
  }
}

/* A member one iteration ahead while we are still in the round of ours:
 * it ended that round, and its average (or the aggregator's) is on its way
 * to us; applied, we are where it is. Not evidence we missed anything. A
 * relay that applied its average later than its stage-mate began the next
 * round (test_node_private's loaded ASan run) fetched the whole state
 * instead, and when that mate restarted the two waited on each other. */
static bool in_the_round_it_ended(const train_peer *p, uint64_t iteration) {
  return iteration == p->iteration + 1 && p->aggregating && p->agg.iteration == p->iteration;
}

/* Evidence that our stage is ahead of us. Only directory members of our own
 * stage count (a stranger's HELLO made us resync before, and download the
 * weights it then served); we resync once two of them say so, or the only
 * other member does, to the lowest iteration they claim. A claim more than
 * TRUST_MAX_AHEAD iterations ahead is refused: a far-future BEGIN_AGG or
 * HELLO stopped a relay for 100 s. */
void trust_claim_ahead(train_peer *p, const gw_id *from, uint64_t iteration, const char *why) {
  peer_trust *t = &p->trust;
  uint32_t type = strcmp(why, "hello") == 0 ? GWTF__TRAIN_MSG__TRAIN_HELLO : GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG;
  if (p->stage < 0 || !peer_is_member(p, p->stage, from, true)) {
    trust_refuse(p, from, type, "claim_not_in_directory");
    return;
  }
  if (iteration > p->iteration + TRUST_MAX_AHEAD) {
    trust_refuse(p, from, type, "claim_far_future");
    return;
  }
  uint32_t k = 0;
  while (k < t->n_claims && !gw_id_eq(&t->claims[k].id, from)) k++;
  if (k == t->n_claims) {
    if (t->n_claims == PEER_MAX_CONTRIB) {
      k = 0; /* full: replace the stalest */
      for (uint32_t i = 1; i < t->n_claims; i++)
        if (t->claims[i].at_ms < t->claims[k].at_ms) k = i;
    } else {
      t->n_claims++;
    }
  }
  t->claims[k] = (trust_claim){*from, iteration, p->now};
  /* ahead while we catch up with the averages of the rounds it ended (we
   * asked for them, join_round_applied): expected, not a reason to refetch */
  if (p->dl.catch_up && p->iteration == p->dl.iteration && iteration <= p->dl.avg_of &&
      p->now < p->dl.catch_up_until)
    return;
  if (in_the_round_it_ended(p, iteration)) return;
  size_t need = peer_dir_others(p) >= 2 ? 2 : 1, have = 0;
  uint64_t target = UINT64_MAX;
  for (uint32_t i = 0; i < t->n_claims; i++) {
    trust_claim *c = &t->claims[i];
    if (c->iteration <= p->iteration || p->now - c->at_ms > TRUST_CLAIM_MS(p) ||
        !peer_is_member(p, p->stage, &c->id, true))
      continue;
    have++;
    if (c->iteration < target) target = c->iteration;
  }
  if (have < need) return;
  /* The claims stay: they name the members that hold the state we now
   * fetch (trust_claims_reach). They cannot trigger again while we fetch
   * (only a ready member weighs them), and once ready, a claim up to our
   * new iteration no longer counts. */
  join_resync(p, target, why);
}

bool trust_claims_reach(train_peer *p, const gw_id *id, uint64_t iteration) {
  peer_trust *t = &p->trust;
  for (uint32_t i = 0; i < t->n_claims; i++) {
    trust_claim *c = &t->claims[i];
    if (gw_id_eq(&c->id, id) && c->iteration >= iteration && p->now - c->at_ms <= TRUST_CLAIM_MS(p)) return true;
  }
  return false;
}

bool trust_stage_ahead(train_peer *p, uint64_t *iteration) {
  peer_trust *t = &p->trust;
  bool any = false;
  for (uint32_t i = 0; i < t->n_claims; i++) {
    trust_claim *c = &t->claims[i];
    if (c->iteration <= p->iteration || p->now - c->at_ms > TRUST_CLAIM_MS(p) ||
        !peer_is_member(p, p->stage, &c->id, true) || !peer_alive(p, &c->id))
      continue;
    if (!any || c->iteration < *iteration) *iteration = c->iteration;
    any = true;
  }
  return any;
}

/* ---- validating contributions (issue 17, item 2) ---- */

/* How many microbatches one member may claim for an iteration: every
 * microbatch the data nodes start (their capacity is microbatches per
 * iteration), with room for SWARM restarts that count one twice. */
#define AGG_COUNT_SLACK 4

static uint64_t count_bound(train_peer *p) {
  peer_stage_view *v = peer_stage(p, 0);
  uint64_t sum = 0;
  for (size_t i = 0; v && i < v->n; i++) sum += v->v[i].capacity;
  if (p->cfg.role == TRAIN_DATA && !peer_is_member(p, 0, &p->cfg.self, false)) sum += p->cfg.capacity;
  return sum * AGG_COUNT_SLACK;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* What no honest peer sends: a value that is not finite, or more
 * microbatches than the data nodes start (or a gradient from none). Rejected
 * at once, whatever the round. Otherwise *norm is its norm per microbatch. */
static const char *screen(train_peer *p, const agg_contrib *c, uint64_t bound, double *norm) {
  double sq = 0.0;
  for (size_t k = 0; k < p->cfg.shape.n_params; k++) {
    float x = c->buf[k];
    if (!isfinite(x)) return "nonfinite";
    sq += (double)x * (double)x;
  }
  if (bound && c->count > bound) return "count";
  if (c->count == 0 && sq > 0.0) return "count";
  *norm = sqrt(sq) / (c->count ? c->count : 1);
  return NULL;
}

/* The bound a round's norms are held to. */
typedef struct norm_bound {
  double ref, limit; /* limit = norm_k x ref (x TRUST_HISTORY_SLACK with past rounds only); ref <= 0: nothing */
  bool judged;       /* a median of three or more: above the limit is a lie */
} norm_bound;

/* The median of the last 8 rounds' medians (0 before any round). */
static double history_median(const peer_agg *a) {
  if (!a->n_norm_hist) return 0.0;
  double h[8];
  memcpy(h, a->norm_hist, a->n_norm_hist * sizeof(double));
  qsort(h, a->n_norm_hist, sizeof(h[0]), cmp_double);
  return h[a->n_norm_hist / 2];
}

/* The reference: the round's lower median of three or more (a liar among
 * two cannot raise it), else our own (we trust ourselves), else past rounds
 * only. Raised to the median of recent rounds' medians, not their largest:
 * honest norms fall tenfold in the first iterations, and a bound held at
 * the first round's let a 100x scaled gradient through by the fifth. With
 * past rounds only, the last round's median if lower (norms fall fast early
 * on), and a looser limit. */
static norm_bound round_bound(const train_peer *p, double *sorted, uint32_t m, double own) {
  const peer_agg *a = &p->agg;
  norm_bound b = {.ref = -1.0, .judged = m >= 3};
  if (b.judged) {
    qsort(sorted, m, sizeof(sorted[0]), cmp_double);
    b.ref = sorted[(m - 1) / 2];
  } else if (own >= 0.0) {
    b.ref = own;
  }
  double hist = history_median(a);
  bool only_history = b.ref < 0.0;
  if (only_history && hist > 0.0) {
    double last = a->norm_hist[(a->norm_hist_pos + 7) % 8];
    if (last < hist) hist = last;
  }
  if (hist > b.ref) b.ref = hist;
  b.limit = p->cfg.tun.norm_k * b.ref * (only_history ? TRUST_HISTORY_SLACK : 1);
  return b;
}

/* Scales a contribution down to the round's reference norm: past the
 * bound, a norm tells nothing the round can vouch for, so it enters with
 * the norm an honest one has (clipped to the bound itself, a 200x one still
 * stepped 10-40x too far: the toy model of test_peer_trust diverged). The
 * average lists the hash of what its contributor sent (it checks that
 * one); --deterministic averages the microbatches' own gradients, so they
 * are scaled too. */
static void clip(train_peer *p, agg_contrib *c, double norm, const norm_bound *b) {
  size_t n = p->cfg.shape.n_params;
  float f = (float)(b->ref / norm);
  gw_id h;
  gw_id_hash(c->buf, n * sizeof(float), &h);
  memcpy(c->hash, h.b, 32);
  c->clipped = true;
  for (size_t k = 0; k < n; k++) c->buf[k] *= f;
  ledger_scale_holder(p, &c->id, f);
  p->counters.contributions_clipped++;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(&c->id, who);
  GW_INFO(&p->log, "agg.clipped", "peer=%s norm=%g limit=%g to=%g iter=%llu", who, norm, b->limit, b->ref,
          (unsigned long long)p->agg.iteration);
}

/* Before any contribution touches the sum: every value finite, a plausible
 * microbatch count, and a norm per microbatch within norm_k times the
 * round's reference (round_bound). Against a median of three or more, a
 * contribution above it is a lie: rejected, left out of the average, its
 * sender counted toward a ban; the others still get one average,
 * bit-identical. Against our own norm or past rounds', it is scaled down to
 * the reference instead (clip): one or two norms cannot tell a scaled
 * gradient from an honest spike, and honest ones rise 200x in one iteration
 * when the model's loss spikes (test_node_private in CI: 0.55 -> 110 per
 * microbatch, the loss 3.4 -> 4.9 as train-ref has it on that data). Rejected, the stage skipped its
 * step three rounds running while the data nodes' stage took theirs, and
 * the honest member was banned: refused its own stage's weights after a
 * restart. Clipped, its step counts as much as an honest one does, a scaled
 * one no more. */
void trust_validate_round(train_peer *p) {
  peer_agg *a = &p->agg;
  if (p->cfg.tun.no_validation) return;
  double norms[PEER_MAX_CONTRIB], sorted[PEER_MAX_CONTRIB], own = -1.0;
  uint32_t m = 0;
  uint64_t bound = count_bound(p);
  for (uint32_t i = 0; i < a->n_contrib; i++) {
    agg_contrib *c = &a->contrib[i];
    norms[i] = 0.0;
    if (!c->complete || c->rejected) continue;
    const char *why = screen(p, c, bound, &norms[i]);
    if (why) {
      c->rejected = true;
      trust_reject(p, &c->id, a->iteration, why);
      continue;
    }
    if (c->count == 0) continue; /* empty: nothing to compare */
    sorted[m++] = norms[i];
    if (gw_id_eq(&c->id, &p->cfg.self)) own = norms[i];
  }
  norm_bound b = round_bound(p, sorted, m, own);
  if (b.ref <= 0.0) return; /* two strangers' words and none of ours, no past round: nothing to hold them to */
  char who[GW_ID_SHORT_LEN + 1];
  double accepted[PEER_MAX_CONTRIB];
  uint32_t n_acc = 0;
  for (uint32_t i = 0; i < a->n_contrib; i++) {
    agg_contrib *c = &a->contrib[i];
    if (!c->complete || c->rejected || c->count == 0) continue;
    peer_short(&c->id, who);
    GW_DEBUG(&p->log, "agg.norm_checked", "peer=%s norm=%g limit=%g count=%u", who, norms[i], b.limit, c->count);
    if (norms[i] <= b.limit) {
      accepted[n_acc++] = norms[i];
    } else if (!b.judged) {
      clip(p, c, norms[i], &b);
      accepted[n_acc++] = b.ref;
    } else {
      c->rejected = true;
      GW_INFO(&p->log, "agg.norm", "peer=%s norm=%g limit=%g ref=%g", who, norms[i], b.limit, b.ref);
      trust_reject(p, &c->id, a->iteration, "norm");
    }
  }
  if (n_acc == 0) return;
  qsort(accepted, n_acc, sizeof(accepted[0]), cmp_double);
  a->norm_hist[a->norm_hist_pos] = accepted[(n_acc - 1) / 2];
  a->norm_hist_pos = (a->norm_hist_pos + 1) % 8;
  if (a->n_norm_hist < 8) a->n_norm_hist++;
}
