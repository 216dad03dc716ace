/* train/peer_join.h — joining a run (GWTF §V-B) and fetching a stage's
 * state: the leader placing joiners (train/peer_place.c) and refilling an
 * empty stage by moving a relay (train/peer_move.c); the candidate's side,
 * the weights download and serving snapshots (train/peer_join.c); the
 * download checked against the stage's word (train/peer_verify.c). Their
 * state (peer_download, peer_candidate, peer_verify) is in
 * train/peer_internal.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_JOIN_H
#define GWTF_TRAIN_PEER_JOIN_H

#include "train/peer_internal.h"

/* peer_join.c */
/* Sends a serialised stage state in chunks of `type` (WEIGHTS_CHUNK,
 * REPLICA_PUSH, REPLICA_CHUNK) with its BLAKE2b-256; weights_hash (may be
 * NULL) is the hash the stage logged for those weights. */
int join_send_state(train_peer *p, const gw_id *to, uint32_t type, int stage, const uint8_t *blob, size_t len,
                    uint64_t iteration, uint64_t step, const uint8_t *weights_hash);
/* train/peer_place.c: the leader's side of a JOIN, and its tick (placing
 * the candidates of the last period; stages left empty). */
void join_on_join(train_peer *p, const gw_id *from, const Gwtf__TrainJoin *j);
void place_tick(train_peer *p);
/* Leader: `id` was placed into `stage` (ASSIGN or MOVE): it counts there
 * until the directory shows it (PENDING_PLACEMENT_MS). */
void join_note_placed(train_peer *p, const gw_id *id, int stage, uint32_t capacity);
/* Leader: what the data nodes start in an iteration (their microbatches),
 * which each stage must hold at once to run it in one wave. */
uint32_t join_pipeline_demand(train_peer *p);
/* Leader: the slots of the relays placed into stage s lately that its
 * directory does not list yet. */
uint32_t join_placed_slots(train_peer *p, int s);
/* peer_join.c, the candidate: */
void join_on_assign(train_peer *p, const gw_id *from, const Gwtf__TrainAssign *a);
void join_on_weights_req(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsReq *r);
void join_on_chunk(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const train_tensor *t);
void join_job_done(train_peer *p, train_job *job);
void join_tick(train_peer *p);
void join_leader_up(train_peer *p, const gw_id *peer); /* JOIN now, if we wait to */
void join_peer_down(train_peer *p, const gw_id *peer);
void join_become_ready(train_peer *p);
void join_serve_pending(train_peer *p);
/* `id` waits for a snapshot of our state (queued or being made): it cannot
 * contribute to a round of ours, nor aggregate one, until we served it. */
bool join_awaits_our_state(const train_peer *p, const gw_id *id);
/* An average of our stage's reached us while we got ready (dl.avg_of). */
void join_on_source_average(train_peer *p);
/* A round applied: a joiner catching up asks for the next it missed. */
void join_round_applied(train_peer *p);
void join_free(train_peer *p);
void join_resync(train_peer *p, uint64_t target, const char *why);
/* A live directory member of our stage other than `except` (a download source). */
bool join_live_source(train_peer *p, const gw_id *except);
/* ... connected or not (its session may still be coming up). */
bool join_listed_source(train_peer *p, const gw_id *except);
/* A verified download (peer_verify.c): take the restored state. */
void join_accept_download(train_peer *p);
/* A refuted one: try another member. */
void join_refetch(train_peer *p);
void join_request_replica(train_peer *p, const gw_id *holder);
void join_stage_lost(train_peer *p);

/* peer_move.c: the leader moves a relay of an over-provisioned stage into an empty one */
void move_on_move(train_peer *p, const gw_id *from, const Gwtf__TrainAssign *a);
void move_tick(train_peer *p);
void move_after_round(train_peer *p); /* our aggregation is done: a waiting move goes now */

/* peer_verify.c: a download is checked against the stage's word */
/* The restore of a download from `source` for `iteration` gave weights
 * `hash`: ask the stage. Returns true when verification is under way (the
 * peer becomes ready once it passes), false when there is nobody to ask. */
bool verify_begin(train_peer *p, const gw_id *source, uint64_t iteration, const uint8_t hash[32]);
void verify_on_hash_req(train_peer *p, const gw_id *from, uint64_t iteration);
void verify_on_hash(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *h);
void verify_tick(train_peer *p);

#endif
