/* train/peer_agg.h — the end of an iteration (GWTF §V-E): the round
 * (train/peer_agg.c: BEGIN_AGG, collecting, averaging, CAN_TAKE), who
 * aggregates it (train/peer_agg_who.c), the average a member applies
 * (train/peer_avg.c), gradients for a round we have not reached yet
 * (train/peer_agg_early.c), the averages kept for peers we served
 * (train/peer_avg_keep.c), the aggregator's signature on them
 * (train/peer_avgsig.c), and the byzantine test tool's corruption of a
 * contribution (train/agg_robust.c). Its state (peer_agg) is in
 * train/peer_internal.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_AGG_H
#define GWTF_TRAIN_PEER_AGG_H

#include "train/peer_internal.h"

/* peer_agg.c */
void agg_on_begin(train_peer *p, const gw_id *from, const Gwtf__TrainIteration *m);
/* A stage-mate's HELLO says whether it is fetching its state (joining):
 * a joining member is neither waited for nor picked to aggregate. */
void agg_member_joining(train_peer *p, const gw_id *peer, bool joining);
/* Shared by the round (peer_agg.c) and the member's side of it (peer_avg.c). */
bool agg_i_aggregate(train_peer *p);
bool agg_joining_from(train_peer *p, const gw_id *from);
void agg_flood_begin(train_peer *p, uint64_t iteration);
void agg_enter_round(train_peer *p, uint64_t iteration, bool export);
/* Enters the round of our iteration and floods its BEGIN_AGG, as one
 * reaching us does (export: our gradient goes to the aggregator). */
void agg_begin_round(train_peer *p, bool export);
void agg_send_last_avg(train_peer *p, const gw_id *to);
void agg_send_avg(train_peer *p, const gw_id *to, const float *avg, uint32_t total_count, const gw_id *contributors,
                  uint8_t (*hashes)[32], uint32_t n_contributors, uint64_t iteration, const peer_avg_sig *sig);
/* peer_avg_keep.c: the average we applied last is about to be replaced:
 * kept while a peer we served lately may ask for it, else freed (last_avg
 * is NULL after). */
void avgkeep_push_last(train_peer *p);
/* A peer we served asks for the average of a round before our last: sent
 * if we kept it (true). */
bool avgkeep_answer(train_peer *p, const gw_id *to, uint64_t iteration);
void avgkeep_free(train_peer *p);
/* Steps with `avg` (NULL: an empty round, the step is skipped). */
void agg_apply_average(train_peer *p, const float *avg, uint32_t total_count);
/* Begins our round as a BEGIN_AGG would (peer_behind.c: the upstream is in
 * the next iteration and its BEGIN_AGG passed us by). */
void agg_begin_late(train_peer *p);
/* Who aggregates (train/peer_agg_who.c): the lowest live vouched member
 * still in the round (us included); whether a member is out of it (gave
 * up on it, waits for our state, or is joining); whether it failed us. */
gw_id agg_pick_aggregator(train_peer *p);
/* A member of lower ID than our round's aggregator was vouched for: switch to it (peer_agg.c). */
void agg_repick(train_peer *p);
bool agg_out_of_round(const train_peer *p, const gw_id *id);
bool agg_is_failed(const peer_agg *a, const gw_id *id);
/* Finishes our round as its aggregator once every awaited member is in. */
void agg_maybe_finish(train_peer *p);
/* Whether `from` is the aggregator of our stage's current round for us. */
bool agg_sent_grad_to(const train_peer *p, const gw_id *id);
bool agg_is_round_aggregator(train_peer *p, const gw_id *from);
/* The average of a member that left us out of its round while we
 * aggregate it, unless we joined lately: dropped (true), and the member no
 * longer waited for. */
bool agg_drop_unlisted_average(train_peer *p, const gw_id *from);
void agg_on_grad(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
/* A GRAD chunk carries part of our stage's vector (its offset and length
 * fit, f32). */
bool agg_grad_shape_ok(const train_peer *p, const Gwtf__TrainGrad *g, const train_tensor *t);
/* The round's contribution from `id` (a new one if none yet; NULL: full). */
agg_contrib *agg_contrib_for(peer_agg *a, const gw_id *id);
/* Appends a chunk of n floats' vector to c (false: out of order, or no
 * memory). */
bool agg_contrib_take(agg_contrib *c, const Gwtf__TrainGrad *g, const train_tensor *t, size_t n);
/* peer_agg_early.c: a gradient for a round we have not reached yet is
 * kept (true) until we enter that round (agg_early_take). */
bool agg_early_keep(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
void agg_early_take(train_peer *p);
void agg_early_free(train_peer *p);
void agg_on_avg(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
void agg_on_done_msg(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *d);
void agg_on_can_take(train_peer *p, const gw_id *from, uint64_t iteration, bool pipeline_stepped);
void agg_on_resync(train_peer *p, const gw_id *from, uint64_t iteration);
void agg_try_can_take(train_peer *p);
void agg_job_done(train_peer *p, train_job *job);
void agg_tick(train_peer *p);
void agg_member_downloading(train_peer *p, const gw_id *peer);
void agg_abandon_round(train_peer *p);
void agg_peer_down(train_peer *p, const gw_id *peer);
void agg_free(train_peer *p);

/* Whether we may apply an average signed by `signer` that `from` delivered
 * (`from` passed the dispatcher's row: agg_is_round_aggregator). */
bool agg_accepts_signer(train_peer *p, const gw_id *from, const gw_id *signer);

/* peer_avgsig.c: averages signed by their aggregator (train/avg_sig.h) */
/* The aggregator signs the average it just made (last_avg and its list)
 * into a->last_sig; without io.sign it stays unsigned. */
void avgsig_sign_last(train_peer *p);
/* The signature fields of an average's first chunk. */
void avgsig_fill(const peer_avg_sig *s, Gwtf__TrainGrad *g);
/* An average's first chunk from `from`: its signature is present and valid
 * over its fields, and its signer is one we may follow for the round.
 * Fills *out. Logs (agg.forged) and returns false otherwise. */
bool avgsig_check(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, peer_avg_sig *out);
/* The average's floats (NULL, 0 for a skipped step) hash to what was
 * signed; logs (agg.forged reason=hash_mismatch) and returns false otherwise. */
bool avgsig_check_floats(train_peer *p, const gw_id *from, const peer_avg_sig *s, uint64_t iteration,
                         const float *v, size_t n);
/* Logs agg.forged once per (peer, reason) and counts it. */
void avgsig_refuse(train_peer *p, const gw_id *from, const gw_id *signer, uint64_t iteration, const char *reason);

/* agg_robust.c: the byzantine test tool corrupts our contribution (in
 * place) and returns the length it then claims */
size_t byz_corrupt(train_peer *p, float *v, size_t n);

/* peer_agg.c, for a joiner catching up (peer_join.c) */
/* Ready one round behind our source: asks it for that round's average. */
void agg_ask_missed_average(train_peer *p, const gw_id *from);

#endif
