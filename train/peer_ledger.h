/* train/peer_ledger.h — exactly once (issue 20, item 4): which microbatches
 * a stage's gradient counts, and `--deterministic`. Internal to train/.
 *
 * - Every member lists the microbatches (origin, ID) it accumulated in the
 *   iteration; a second backward of one it already has is a duplicate
 *   (`ledger.duplicate scope=member`). A data node's list is the
 *   iteration's ledger: the microbatches that completed, with the path each
 *   came back along (which peer of each stage accumulated it).
 * - BEGIN_AGG carries the data nodes' ledgers front to back (merged: each
 *   data node's flood adds its own list and names itself a source).
 * - A member's contribution (TRAIN_GRAD, first chunk) carries its list. The
 *   stage's aggregator counts each microbatch once across contributions:
 *   one listed by two members is `ledger.duplicate scope=stage`; one in the
 *   ledger that no contribution lists is `ledger.missing` (the member that
 *   accumulated it died, or its contribution did not arrive); one listed of
 *   a ledger source's microbatches that the ledger lacks is `ledger.extra`
 *   (the data node deferred it after this stage computed its backward: it
 *   trains again in a later iteration). `ledger.counted` lists what the
 *   average covers.
 * - Without --deterministic the sums cannot be taken apart: duplicates and
 *   extras stay in the average and are only reported. With it, each member
 *   keeps each microbatch's own gradient (train/grad_capture.h) and sends
 *   them to the aggregator beside its sum (TRAIN_GRAD with mb_grad); the
 *   aggregator averages exactly the microbatches counted (each once, extras
 *   left out), summed in (ID, origin) order, divided by their number: the
 *   same bits as `gwtf train-ref --deterministic` on those microbatches. */
#ifndef GWTF_TRAIN_PEER_LEDGER_H
#define GWTF_TRAIN_PEER_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "p2p/identity.h"
#include "train/peer.h"
#include "train.pb-c.h"

/* At most this many microbatches in one list (a contribution's, a ledger):
 * a longer list from the network is ignored. */
#define LEDGER_MAX_IDS 4096
/* ledger.counted lists microbatch IDs in at most this many characters
 * (then truncated=1): a log line's fields hold 1536 (util/log.c). */
#define LEDGER_LOG_CHARS 1200
/* A re-run's attempt numbers have this bit (and the re-run count above bit
 * 8): relays then know a second backward of it is expected, not a duplicate. */
#define LEDGER_RERUN_ATTEMPT (1u << 16)
/* A microbatch is re-run at most this many times in one iteration. */
#define LEDGER_MAX_RERUNS 3

typedef struct ledger_mb {
  gw_id origin;
  uint64_t id;
  bool rerun; /* computed for a re-run (not part of its identity) */
} ledger_mb;

/* One microbatch's own gradient (--deterministic), ours or a contributor's. */
typedef struct ledger_grad {
  gw_id holder;
  ledger_mb mb;
  float *g;
  uint64_t received; /* floats, chunks in order */
  bool complete, bad;
} ledger_grad;

typedef struct ledger_list {
  gw_id member;
  ledger_mb *mbs;
  uint32_t n;
} ledger_list;

typedef struct peer_ledger {
  uint64_t iteration; /* what everything below is for (reset when ours moves on) */
  int stage;          /* ... and in which stage (a relay may be moved) */
  ledger_mb *mine;    /* accumulated by us this iteration */
  uint8_t *paths;     /* data node: per entry of mine, the path (n_stages + 1 node IDs) */
  uint8_t *reruns;    /* data node: per entry, re-runs launched; bit 7: one is wanted */
  uint32_t n_mine, cap_mine;
  ledger_grad *grads; /* --deterministic: per-microbatch gradients held */
  uint32_t n_grads, cap_grads;
  ledger_list lists[64]; /* aggregator: each contributor's list */
  uint32_t n_lists;
  ledger_mb *book;       /* the iteration's ledger, from BEGIN_AGG (and ours, data node) */
  uint32_t n_book, cap_book;
  gw_id sources[64];     /* data nodes whose ledgers `book` holds */
  uint32_t n_sources;
  /* the round being averaged: ledger_round -> ledger_average */
  const ledger_grad **chosen;
  uint32_t n_chosen;
  bool exact;
  /* scratch for lists we send (valid while the send runs) */
  uint64_t *out_ids;
  protobuf_c_boolean *out_reruns;
  ProtobufCBinaryData *out_origins, *out_sources;
  uint32_t out_cap;
} peer_ledger;

struct peer_mb;

void ledger_free(struct train_peer *p);
/* Whether a gradient job of mb drops its weight gradient (sets
 * mb->grad_dropped): mb is a re-run, and our stage is not one it is for, or
 * we hold its gradient already. */
bool ledger_drops_grad(struct train_peer *p, struct peer_mb *mb, train_job_kind kind);
/* --deterministic: the buffer a gradient job of mb adds its own gradient
 * into (mb->gpart, allocated here; LOSS starts a new one, EMBED_BACKWARD
 * adds to it); NULL otherwise or when out of memory. */
float *ledger_part_for(struct train_peer *p, struct peer_mb *mb, train_job_kind kind);
/* mb's backward (a data node's embedding backward: it completed) is done
 * on us: list it, or report it as a duplicate; keep its own gradient. */
void ledger_on_backward(struct train_peer *p, struct peer_mb *mb);
/* Data node: a completed microbatch whose path holds a member that died
 * took that stage's gradient with it; while the iteration runs, it is run
 * again through the pipeline (a re-run, TrainMicrobatch.rerun_stages: the
 * dead members' stages compute it anew on another member; the stages that
 * still hold its gradient compute its backward and drop the weight
 * gradient; --rerun-lost, implied by --deterministic). ledger_peer_down marks them, ledger_launch_reruns
 * launches what is marked (data_mb_finished calls it before it decides the
 * iteration is over), ledger_rerun_finished accounts for one that ended. */
bool ledger_is_rerun(const struct peer_mb *mb);
void ledger_peer_down(struct train_peer *p, const gw_id *peer);
void ledger_launch_reruns(struct train_peer *p);
void ledger_rerun_finished(struct train_peer *p, struct peer_mb *mb, bool complete);
/* Our contribution's first chunk: our list. Before it (--deterministic),
 * our per-microbatch gradients to `to`. */
void ledger_fill_grad(struct train_peer *p, Gwtf__TrainGrad *g);
void ledger_send_mb_grads(struct train_peer *p, const gw_id *to, uint64_t iteration);
/* A TRAIN_GRAD arrived: records a contribution's list; returns true when
 * it was a per-microbatch gradient (consumed here). */
bool ledger_on_grad(struct train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
/* BEGIN_AGG for `iteration`: the ledger we know goes with it / arrives. */
void ledger_fill_begin(struct train_peer *p, Gwtf__TrainIteration *m, uint64_t iteration);
void ledger_on_begin(struct train_peer *p, const gw_id *from, const Gwtf__TrainIteration *m);
/* Whether the iteration's ledger (the data nodes', from BEGIN_AGG) lists a
 * microbatch that none of the round's complete contributions lists (one
 * from a member that predates the ledger may hold anything). */
bool ledger_uncovered(struct train_peer *p);
/* The aggregator's kept contributions, sorted by node ID: reports
 * duplicates, missing and extra microbatches and logs ledger.counted; with
 * --deterministic, sets *total to the microbatches the average covers. */
void ledger_round(struct train_peer *p, uint32_t *total);
/* --deterministic: writes the exact average of ledger_round's microbatches
 * (n_params floats) and returns true; false: average the sums as usual. */
bool ledger_average(struct train_peer *p, float *out);
/* --deterministic: scales every microbatch gradient a contributor sent (its
 * contribution was clipped to the round's norm bound). */
void ledger_scale_holder(struct train_peer *p, const gw_id *holder, float factor);

#endif
