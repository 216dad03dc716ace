/* node/train_node.h — training in a `gwtf node`: the "train" component.
 *
 * It is the driver of the training peer (train/peer.h) and of the flow
 * protocol (flow/flow.h) on the node's loop:
 *   - finds the run record in the DHT (or, with --create-run, publishes it),
 *     and keeps the stage directory in view: the members of its own and the
 *     neighbouring stages (all stages for the leader) are dialled, fed to the
 *     flow protocol and to the peer, and it announces itself in its stage;
 *   - carries flow messages (MSG_FLOW) and training messages (300..399) over
 *     the node's encrypted sessions, tensors as raw payloads;
 *   - measures what Eq. 1 needs — its compute time per microbatch, each
 *     neighbour's (from HELLO), RTT and throughput from the p2p host — and
 *     sets every link's cost in the flow protocol;
 *   - runs the stage on one compute worker thread (node/worker.h), writes
 *     stage checkpoints every N iterations and can resume from one.
 *
 * The run record is JSON (docs/TRAINING.md): model config, stage count and
 * layer split, microbatch shape, optimizer, seed, dataset description and
 * the leader. */
#ifndef GWTF_NODE_TRAIN_NODE_H
#define GWTF_NODE_TRAIN_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include <getopt.h>

#include "node/node.h"
#include "train/member.h"
#include "train/peer.h"


typedef struct train_node_opts {
  const char *create_run; /* creates the run and becomes its first data node */
  const char *run;        /* joins this run */
  bool data;              /* --role data (else relay) */
  const char *model;      /* preset name or JSON file (create only) */
  const char *dataset;    /* data nodes */
  const char *device;     /* "cpu", "cuda", "cuda:N" */
  const char *routing;    /* "gwtf" or "swarm" */
  int stages;             /* create only */
  bool stages_given;      /* --stages was on the command line */
  int stage_memory_mb;    /* create only: per-node budget that picks the stage count (0: none) */
  int microbatches;       /* per data node per iteration (create only) */
  int batch, seq;         /* create only */
  double lr;              /* create only */
  double grad_clip;       /* create only: 0 off */
  int subspace_k;         /* create only: subspace crossings of rank k (0 off), --subspace K:0 */
  int subspace_refresh;   /* create only: the table's refresh (the swarm keeps it fixed: 0) */
  uint64_t seed;          /* create only: weight init and the run's randomness */
  uint64_t data_seed;     /* data nodes: microbatch sampling (0: derived from the node ID) */
  uint64_t iterations;    /* data nodes: stop after this many (0: forever) */
  double val_fraction;    /* data nodes: hold out the last fraction of the dataset (0: none) */
  const char *val_dataset; /* data nodes: validation tokens from this file instead */
  uint64_t eval_every;    /* data nodes: validation loss every N iterations (0: never) */
  int eval_microbatches;  /* data nodes: validation microbatches (0: the run's microbatches) */
  int capacity;           /* relays: microbatches in flight (0: from free memory) */
  int threads;            /* compute threads (0: all cores) */
  int checkpoint_every;   /* iterations between stage checkpoints (0: never) */
  bool resume;            /* start from a checkpoint in the data dir when recent enough */
  int replicate_every;    /* relays: push the stage's state to holders outside it every N aggregations
                             (0: never; default 5; train/peer_replica.c) */
  int replicas;           /* holders each push goes to (default 2) */
  int replica_max;        /* replicas of other stages this peer holds at most (default 4) */
  int rebalance_after;    /* the leader: live rebalancing after M iterations (default 3; 0: never) */
  bool move_to_short;     /* the leader: move a relay into a stage short of slots (default: no) */
  double rebalance_margin; /* ... when a move beats the bottleneck by this fraction (default 0.2) */
  int join_stage;         /* relays, test tool: the stage asked for in JOIN (0: the leader's choice) */
  bool grant_join_stages; /* data nodes, test tool: as the leader, grant those wishes */
  uint64_t flow_tick_ms;  /* flow protocol tick (default 2000, the prototype's) */
  uint64_t hop_timeout_ms;
  int live_k;             /* failure detection: deadline = k x (srtt + 4 rttvar) + compute (default 4; 0: off) */
  uint64_t live_floor_ms; /* ... and never under this (default 500) */
  bool exit_when_done;    /* a data node exits once it ran its iterations (default true) */
  /* Fault injection for tests (--debug-crash KIND:ITER): the node kills
   * itself with SIGKILL as it queues its first job of that kind in that
   * iteration or a later one. KIND: embed, forward, loss, backward, aggregate,
   * eval (a relay's validation forward). */
  double slowdown;        /* >= 1: every compute job takes this many times as long
                             (emulates a slower device; issue 7's heterogeneity) */
  train_dtype wire_dtype; /* --wire-dtype: activations and their gradients on the wire (0 = fp32) */
  train_dtype wire_grad_dtype; /* --wire-dtype ACT/GRAD: the gradients' (0 = wire_dtype) */
  uint32_t wire_accept;   /* --wire-accept: WIRE_BIT mask (0 = every dtype this build decodes) */
  int crash_job;          /* a train_job_kind; 0 = none */
  uint64_t crash_iteration;
  /* private runs (docs/TRAINING.md, "Private runs") */
  bool open_run;          /* --open: --create-run makes a public run */
  const char *run_key;    /* --run-key FILE: hold the run key (the creator's, or a second data node's) */
  const char *join;       /* --join TOKEN: the invite's text */
  member_invite invite;   /* parsed from --join */
  uint8_t *join_token;    /* its packed RunToken (malloc'd, lives with the process) */
  size_t join_token_len;
  char join_bootstrap[GW_ID_HEX_LEN + 2 + MEMBER_ADDR_MAX + 1]; /* "ID@ADDR" of the invite's creator */
  train_aggregate aggregate;   /* --aggregate mean|trimmed-mean */
  bool no_validation;          /* --no-validate-contributions (tests only) */
  bool deterministic;          /* --deterministic: exactly train-ref's sums (train/peer_ledger.h) */
  bool rerun_lost;             /* --rerun-lost: re-run microbatches whose gradient died with a member */
  train_byzantine byzantine;   /* --byzantine MODE (test tool) */
  double byzantine_scale;
} train_node_opts;

void train_node_opts_default(train_node_opts *o);

/* Command-line options of `gwtf node` for training; getopt codes start at
 * TRAIN_NODE_OPT_BASE. train_node_parse_opt applies one (returns 0, or 2
 * after printing what is wrong), train_node_check checks the combination. */
#define TRAIN_NODE_OPT_BASE 2000
/* The training options `gwtf node` takes, ended by a zeroed entry; at most
 * TRAIN_NODE_MAX_OPTIONS of them (a compile-time check in train_opts.c keeps
 * cmd_node's merged table from dropping any). */
#define TRAIN_NODE_MAX_OPTIONS 64
extern const struct option train_node_options[];
int train_node_parse_opt(train_node_opts *o, int code, const char *arg);
int train_node_check(const train_node_opts *o, bool *training);
void train_node_print_help(void);

/* The component; node.c lists it after the DHT. Inactive (starts and stops
 * at once) when the node's config carries no training options. */
extern const node_component train_component;

#endif
