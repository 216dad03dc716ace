/* train/peer_avgsig.c — the stage's average carries its aggregator's
 * signature (issue 17, item 3; the signed body is train/avg_sig.h's).
 *
 * A member used to take an average only from the peer it chose to
 * aggregate, over that peer's authenticated session. Averages also travel
 * on behalf of their aggregator: an aggregator that deferred passes the
 * lower one's average on, a member answers a late member (or a takeover's
 * question) with the average it applied, and a member that just served its
 * state sends the round's average to the joiner. The relay could hand on a
 * made-up vector. Now the aggregator signs (run, stage, iteration, total
 * microbatches, vector length, the contributors and their hashes, the hash
 * of the averaged floats) with its node key, every copy carries that
 * signature unchanged, and a member applies an average only when
 *   - the signature is valid and its key is the signer's node ID (the ID
 *     is BLAKE2b-256 of the key, which the average carries);
 *   - the signer is an aggregator it may follow for the round
 *     (agg_accepts_signer: the sender itself, or one the member would
 *     follow directly, or a lower one its own aggregator passes on);
 *   - the floats, once whole, hash to the signed hash;
 *   - it lists the member's contribution with the right hash, when the
 *     member contributed (peer_agg.c's avg_lists_us_right).
 * Anything else is refused (agg.forged peer=... reason=...), and the member
 * keeps waiting for the average, or gives up on its aggregator at the
 * deadline and takes the next one, as when no average comes. */
#include "train/peer_agg.h"

#include <string.h>

#include "train/avg_sig.h"

/* The fields of the average in a->last_* (ours, as its aggregator). */
static void last_fields(train_peer *p, avg_sig_fields *f, const uint8_t *avg_hash) {
  peer_agg *a = &p->agg;
  *f = (avg_sig_fields){.run_id = p->cfg.run_id,
                        .stage = p->stage,
                        .iteration = a->last_avg_iteration,
                        .total_count = a->last_avg_total_count,
                        .n_floats = a->last_avg_total_count && a->last_avg ? p->cfg.shape.n_params : 0,
                        .contributors = a->last_contributors,
                        .hashes = (const uint8_t(*)[32])a->last_contrib_hashes,
                        .n_contributors = a->n_last_contributors,
                        .avg_hash = avg_hash};
}

void avgsig_sign_last(train_peer *p) {
  peer_agg *a = &p->agg;
  peer_avg_sig *s = &a->last_sig;
  memset(s, 0, sizeof(*s));
  if (!p->io.sign) return;
  avg_sig_fields f;
  last_fields(p, &f, s->hash);
  avg_sig_hash_floats(f.n_floats ? a->last_avg : NULL, f.n_floats, s->hash);
  uint8_t body[AVG_SIG_BODY_BYTES(AVG_SIG_MAX_CONTRIB)];
  size_t len = avg_sig_body(&f, body, sizeof(body));
  if (!len) return;
  p->io.sign(p->io.ud, body, len, s->sig);
  memcpy(s->key, p->cfg.node_pk, 32);
  s->signer = p->cfg.self;
  s->have = true;
  p->counters.averages_signed++;
}

void avgsig_fill(const peer_avg_sig *s, Gwtf__TrainGrad *g) {
  if (!s || !s->have) return;
  g->avg_key = (ProtobufCBinaryData){32, (uint8_t *)s->key};
  g->avg_hash = (ProtobufCBinaryData){32, (uint8_t *)s->hash};
  g->avg_sig = (ProtobufCBinaryData){64, (uint8_t *)s->sig};
}

void avgsig_refuse(train_peer *p, const gw_id *from, const gw_id *signer, uint64_t iteration, const char *reason) {
  peer_agg *a = &p->agg;
  p->counters.messages_refused++;
  p->counters.averages_forged++;
  for (uint32_t i = 0; i < a->n_forged_logged; i++)
    if (a->forged_logged[i].reason == reason && gw_id_eq(&a->forged_logged[i].id, from)) return;
  uint32_t cap = sizeof(a->forged_logged) / sizeof(a->forged_logged[0]);
  uint32_t k = a->n_forged_logged < cap ? a->n_forged_logged++ : (uint32_t)(p->counters.averages_forged % cap);
  a->forged_logged[k].id = *from;
  a->forged_logged[k].reason = reason;
  char who[GW_ID_SHORT_LEN + 1], by[GW_ID_SHORT_LEN + 1] = "none";
  peer_short(from, who);
  if (signer) peer_short(signer, by);
  GW_ERROR(&p->log, "agg.forged", "peer=%s signer=%s iter=%llu reason=%s", who, by, (unsigned long long)iteration,
           reason);
}

bool avgsig_check(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, peer_avg_sig *out) {
  memset(out, 0, sizeof(*out));
  if (g->avg_key.len != 32 || g->avg_hash.len != 32 || g->avg_sig.len != 64) {
    avgsig_refuse(p, from, NULL, g->iteration, g->avg_sig.len || g->avg_key.len ? "malformed" : "unsigned");
    return false;
  }
  avg_sig_signer_id(g->avg_key.data, &out->signer);
  if (!agg_accepts_signer(p, from, &out->signer)) {
    avgsig_refuse(p, from, &out->signer, g->iteration, "signer");
    return false;
  }
  /* The list as it came: a count past our limit, an ID or a hash of the
   * wrong size is not an average any aggregator of ours made. */
  if (g->n_contributors > PEER_MAX_CONTRIB || g->n_contributor_hashes != g->n_contributors) {
    avgsig_refuse(p, from, &out->signer, g->iteration, "malformed");
    return false;
  }
  gw_id ids[PEER_MAX_CONTRIB];
  uint8_t hashes[PEER_MAX_CONTRIB][32];
  for (size_t i = 0; i < g->n_contributors; i++) {
    if (g->contributors[i].len != GW_ID_BYTES || g->contributor_hashes[i].len != 32) {
      avgsig_refuse(p, from, &out->signer, g->iteration, "malformed");
      return false;
    }
    memcpy(ids[i].b, g->contributors[i].data, GW_ID_BYTES);
    memcpy(hashes[i], g->contributor_hashes[i].data, 32);
  }
  avg_sig_fields f = {.run_id = p->cfg.run_id,
                      .stage = g->stage,
                      .iteration = g->iteration,
                      .total_count = g->total_count,
                      .n_floats = g->total,
                      .contributors = ids,
                      .hashes = (const uint8_t(*)[32])hashes,
                      .n_contributors = (uint32_t)g->n_contributors,
                      .avg_hash = g->avg_hash.data};
  if (avg_sig_verify(&f, g->avg_key.data, g->avg_sig.data) != 0) {
    avgsig_refuse(p, from, &out->signer, g->iteration, "bad_signature");
    return false;
  }
  memcpy(out->key, g->avg_key.data, 32);
  memcpy(out->hash, g->avg_hash.data, 32);
  memcpy(out->sig, g->avg_sig.data, 64);
  out->have = true;
  return true;
}

bool avgsig_check_floats(train_peer *p, const gw_id *from, const peer_avg_sig *s, uint64_t iteration,
                         const float *v, size_t n) {
  uint8_t h[32];
  avg_sig_hash_floats(v, n, h);
  if (s->have && memcmp(h, s->hash, 32) == 0) return true;
  avgsig_refuse(p, from, s->have ? &s->signer : NULL, iteration, "hash_mismatch");
  return false;
}
