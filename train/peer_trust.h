/* train/peer_trust.h — who may say what, and what a peer's word is worth
 * (train/peer_trust.c: the dispatcher's table, bans, a stage-mate's claim
 * to be ahead); and a stage whose members all fell behind the run
 * (train/peer_behind.c: the upstream's refused offers as evidence). Their
 * state (peer_trust, peer_behind) is in train/peer_internal.h. Internal
 * to train/. */
#ifndef GWTF_TRAIN_PEER_TRUST_H
#define GWTF_TRAIN_PEER_TRUST_H

#include "train/peer_internal.h"

/* peer_trust.c: who may say what (the dispatcher's table), bans, evidence */
bool trust_admit(train_peer *p, const gw_id *from, uint32_t type);
void trust_refuse(train_peer *p, const gw_id *from, uint32_t type, const char *reason);
bool trust_banned(train_peer *p, const gw_id *id);
/* TRAIN_BANNED: a peer says it banned us (logged as run.banned_by). */
void trust_on_banned(train_peer *p, const gw_id *from, const Gwtf__TrainBanned *m);
/* A contribution failed validation: logged, counted toward a ban. */
void trust_reject(train_peer *p, const gw_id *from, uint64_t iteration, const char *reason);
/* The aggregator checks the round's complete contributions (shape was
 * checked per chunk): finite, count, norm; marks the failures rejected. */
void trust_validate_round(train_peer *p);
/* A peer of our stage says it is in `iteration`, later than ours (HELLO,
 * BEGIN_AGG): resync once the evidence suffices (see peer_trust.c). */
void trust_claim_ahead(train_peer *p, const gw_id *from, uint64_t iteration, const char *why);
/* The lowest iteration a live directory member of our stage lately said it
 * is in past ours (one claim is enough: the caller has other evidence). */
bool trust_stage_ahead(train_peer *p, uint64_t *iteration);
/* Member `id` lately said it is in `iteration` or later. */
bool trust_claims_reach(train_peer *p, const gw_id *id, uint64_t iteration);

/* peer_behind.c: upstream offers microbatches of an iteration past our next
 * one, or a catch-up's average never comes; a stage whose members all fell
 * behind moves on (behind_tick). */
void behind_note_future(train_peer *p, const gw_id *from, const gw_id *origin, uint64_t iteration);
void behind_note_next(train_peer *p); /* a microbatch of our next iteration was queued */
void behind_tick(train_peer *p);

#endif
