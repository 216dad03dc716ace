/* train/peer_verify.c — a downloaded stage state is checked against the
 * stage's word before it is trained on (issue 17, item 4).
 *
 * The source of a download announces a hash of what it sends, which only
 * proves the bytes arrived intact: a member serving wrong weights announces
 * their hash. So once the state is restored, the joiner asks every
 * directory member of its stage (the source too) for its weights hash at
 * the download's iteration (TRAIN_HASH_REQ; members answer TRAIN_HASH with
 * the hash their last aggregation or restore logged) and:
 *   - two members announcing our hash: verified (`weights.verified`);
 *   - two members announcing another, or, once everyone asked answered or
 *     the hop timeout passed, any member announcing another while fewer
 *     than two announce ours: refuted (`weights.mismatch`); the joiner
 *     downloads again from a member it has not tried;
 *   - nobody contradicting it (the source is the only member at that
 *     iteration, or members not yet aggregated once have no hash):
 *     accepted on the source's word (`weights.unconfirmed`).
 * A member that has no weights to compare (itself still joining) answers
 * with an empty hash, and one already past the download's iteration has no
 * hash of it: both count as answered, so a joiner does not wait the hop
 * timeout for them (the stage aggregates meanwhile, and the download is
 * stale before it is used).
 * Members of another iteration are not counted: the join code fetches
 * again when the stage aggregated meanwhile. */
#include "train/peer_join.h"

#include <string.h>

#include "train/peer_trust.h"

static bool zero_hash(const uint8_t *h) {
  for (int i = 0; i < 32; i++)
    if (h[i]) return false;
  return true;
}

/* Directory members of our stage other than us: whom we ask. */
static uint32_t askable(train_peer *p, gw_id *out, uint32_t max) {
  peer_stage_view *v = peer_stage(p, p->stage);
  uint32_t n = 0;
  for (size_t i = 0; v && i < v->n && n < max; i++)
    if (!v->v[i].heard && !gw_id_eq(&v->v[i].id, &p->cfg.self) && !trust_banned(p, &v->v[i].id))
      out[n++] = v->v[i].id;
  return n;
}

static uint32_t n_asked(train_peer *p) {
  gw_id ids[PEER_MAX_CONTRIB];
  return askable(p, ids, PEER_MAX_CONTRIB);
}

bool verify_begin(train_peer *p, const gw_id *source, uint64_t iteration, const uint8_t hash[32]) {
  peer_verify *v = &p->verify;
  gw_id ids[PEER_MAX_CONTRIB];
  uint32_t n = askable(p, ids, PEER_MAX_CONTRIB);
  char src[GW_ID_SHORT_LEN + 1];
  peer_short(source, src);
  bool others = false;
  for (uint32_t i = 0; i < n; i++) others |= !gw_id_eq(&ids[i], source);
  if (!others) {
    GW_INFO(&p->log, "weights.unconfirmed", "from=%s iter=%llu reason=no_other_member", src,
            (unsigned long long)iteration);
    return false;
  }
  memset(v, 0, sizeof(*v));
  v->active = true;
  v->source = *source;
  v->iteration = iteration;
  memcpy(v->hash, hash, 32);
  v->deadline = p->now + p->cfg.tun.hop_timeout_ms;
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = iteration;
  /* A member we cannot reach (no session: under churn, most often a dead
   * one the directory still lists) abstains at once rather than at the
   * deadline: in the grid of 2026-11-26, half the rejoining relays waited
   * the whole hop timeout (2 s) for such a member before they trained. */
  for (uint32_t i = 0; i < n; i++)
    if (peer_send(p, &ids[i], GWTF__TRAIN_MSG__TRAIN_HASH_REQ, &m.base, NULL) != 0 && v->n_abstain < PEER_MAX_CONTRIB)
      v->abstain[v->n_abstain++] = ids[i];
  GW_DEBUG(&p->log, "weights.verifying", "from=%s iter=%llu asked=%u", src, (unsigned long long)iteration, n);
  return true;
}

static void decide(train_peer *p, bool final) {
  peer_verify *v = &p->verify;
  bool all = v->n_agree + v->n_disagree + v->n_abstain >= n_asked(p);
  char src[GW_ID_SHORT_LEN + 1], mine[17];
  peer_short(&v->source, src);
  peer_hex8(v->hash, mine);
  if (v->n_agree >= 2) {
    v->active = false;
    GW_INFO(&p->log, "weights.verified", "from=%s iter=%llu hash=%s agree=%u disagree=%u", src,
            (unsigned long long)v->iteration, mine, v->n_agree, v->n_disagree);
    join_accept_download(p);
    return;
  }
  if (v->n_disagree >= 2 || ((final || all) && v->n_disagree > 0)) {
    v->active = false;
    p->counters.downloads_refuted++;
    GW_ERROR(&p->log, "weights.mismatch", "from=%s iter=%llu hash=%s agree=%u disagree=%u", src,
             (unsigned long long)v->iteration, mine, v->n_agree, v->n_disagree);
    join_refetch(p);
    return;
  }
  if (final || all) {
    v->active = false;
    p->counters.verify_timeouts += !all;
    GW_INFO(&p->log, "weights.unconfirmed", "from=%s iter=%llu hash=%s agree=%u reason=%s", src,
            (unsigned long long)v->iteration, mine, v->n_agree, final ? "timeout" : "no_hash");
    join_accept_download(p);
  }
}

void verify_on_hash_req(train_peer *p, const gw_id *from, uint64_t iteration) {
  (void)iteration; /* we answer with where we are; the asker compares */
  if (p->stage < 0) return;
  Gwtf__TrainAggDone h = GWTF__TRAIN_AGG_DONE__INIT;
  h.iteration = p->iteration;
  h.stage = p->stage;
  if (p->state == PEER_READY && !zero_hash(p->agg.last_hash))
    h.hash = (ProtobufCBinaryData){32, p->agg.last_hash};
  /* else an empty hash: nothing to compare yet (an older asker ignores it) */
  peer_send(p, from, GWTF__TRAIN_MSG__TRAIN_HASH, &h.base, NULL);
}

void verify_on_hash(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *h) {
  peer_verify *v = &p->verify;
  if (!v->active || p->state != PEER_RESTORING || h->stage != p->stage) return;
  if (id_in(v->agree, v->n_agree, from) || id_in(v->disagree, v->n_disagree, from) ||
      id_in(v->abstain, v->n_abstain, from))
    return;
  if (h->hash.len == 0 || h->iteration > v->iteration) {
    /* nothing to compare: it has no weights yet, or its stage moved on
     * (join_accept_download then steps with the round's average or
     * fetches again); waiting the hop timeout for it only let the stage
     * move further */
    if (v->n_abstain < PEER_MAX_CONTRIB) v->abstain[v->n_abstain++] = *from;
    decide(p, false);
    return;
  }
  if (h->iteration != v->iteration || h->hash.len != 32 || zero_hash(h->hash.data)) return;
  if (memcmp(h->hash.data, v->hash, 32) == 0) {
    if (v->n_agree < PEER_MAX_CONTRIB) v->agree[v->n_agree++] = *from;
  } else {
    char who[GW_ID_SHORT_LEN + 1], theirs[17];
    peer_short(from, who);
    peer_hex8(h->hash.data, theirs);
    GW_DEBUG(&p->log, "weights.hash_differs", "peer=%s theirs=%s", who, theirs);
    if (v->n_disagree < PEER_MAX_CONTRIB) v->disagree[v->n_disagree++] = *from;
  }
  decide(p, false);
}

/* Every tick: the deadline, and the members we asked that died meanwhile
 * (they leave the view, so n_asked no longer waits for them). */
void verify_tick(train_peer *p) {
  if (p->verify.active && p->state == PEER_RESTORING) decide(p, p->now >= p->verify.deadline);
  if (p->verify.active && p->state != PEER_RESTORING) p->verify.active = false; /* a resync took over */
}
