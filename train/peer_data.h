/* train/peer_data.h — the data node: its side of an iteration (train/peer_data.c:
 * which microbatches it starts and when, whether every stage can take them)
 * and its validation loss (train/peer_eval.c: held-out microbatches forward
 * through the pipeline, without gradients). A data node microbatch's trip
 * is declared with the hop core, in train/peer_mb.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_DATA_H
#define GWTF_TRAIN_PEER_DATA_H

#include "train/peer_internal.h"

/* peer_data.c: the data node's iteration (its microbatches' trip: train/peer_mb.h) */
void data_tick(train_peer *p);
void data_start_iteration(train_peer *p);
/* Launches a completed microbatch of this iteration again, with `attempt`,
 * for `stages` (bit s: stage s accumulates it; train/peer_ledger.c: a
 * member on its path died with its gradient). GW_EAGAIN: the iteration is
 * over or wrapping up; GW_EEXIST: it runs. */
int data_rerun(train_peer *p, uint64_t id, uint32_t attempt, uint64_t stages);
bool data_routes_ready(train_peer *p, uint32_t want, uint32_t *slots);
uint32_t data_share(train_peer *p);

/* peer_eval.c: validation microbatches (forward only) */
#define EVAL_ID_BIT (1ULL << 63) /* an eval microbatch's id: never a training one's */
/* Data node, before an iteration starts: true while an evaluation is due or
 * running (the iteration waits for it). */
bool eval_tick(train_peer *p);
/* Data node: an eval microbatch came back; its loss job runs (no gradient). */
void eval_on_return(train_peer *p, peer_mb *mb);
/* An eval microbatch's job ended (data node or relay). */
void eval_job_done(train_peer *p, peer_mb *mb, train_job *job);
/* Data node: an eval microbatch is over (COMPLETE with its loss, or not). */
void eval_mb_finished(train_peer *p, peer_mb *mb, mb_end how);
void eval_free(train_peer *p);

#endif
