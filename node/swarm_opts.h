/* node/swarm_opts.h — `gwtf swarm`'s command line: the options, their
 * checks and the help text (node/cmd_swarm.c runs the swarm). */
#ifndef GWTF_NODE_SWARM_OPTS_H
#define GWTF_NODE_SWARM_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#define SWARM_MAX_PEERS 256
#define SWARM_MAX_ITERS 100000

typedef struct swarm_opts {
  int relays, stages, data_nodes, iterations;
  const char *model, *dataset, *links, *summary_json, *routing, *workdir, *log_level, *device;
  double churn;
  uint64_t seed;
  int capacity, microbatches, batch, seq, threads, base_port, restart_after, flow_tick, hop_timeout;
  double lr;
  double grad_clip; /* the run's (0: off), given to the data node that creates it */
  const char *subspace; /* the run's --subspace K:0 (NULL: off), given to the data node that creates it */
  bool quiet;
  const char *faults[16]; /* NAME:KIND:ITER */
  int n_faults;
  int late_relays, late_after;
  const char *slowdowns; /* comma list, cycled over relays; "" = all 1 */
  const char *capacities; /* comma list, cycled over relays; overrides --capacity */
  double slowdown;       /* every peer */
  const char *aggregate; /* --aggregate, passed to every peer (NULL: the node's default) */
  bool no_validation;    /* --no-validate-contributions, passed to every peer (tests) */
  bool deterministic;    /* --deterministic, passed to every peer */
  bool rerun_lost;       /* --rerun-lost, passed to every peer */
  int byzantine;         /* --byzantine N:MODE: the last N relays misbehave (tests) */
  const char *byzantine_mode;
  const char *http;      /* --http [IP:]PORT: the live web view (node/swarm_web.h) */
  bool http_public;
  double val_fraction;   /* data nodes: held-out fraction (0: none) */
  const char *val_dataset;
  int eval_every;        /* -1: the node's default */
  const char *wire_dtype, *wire_accept; /* passed to every peer (NULL: node defaults) */
  int eval_microbatches; /* 0: the node's default */
  int checkpoint_every;  /* peers' --checkpoint-every (0: none, the default) */
  int replicate_every;   /* peers' --replicate-every (-1: the node's default) */
  int replicas;          /* peers' --replicas (0: the node's default) */
  int kill_stage;        /* --kill-stage S: SIGKILL every peer of stage S at once (0: none) ... */
  int kill_at;           /* ... once the leader finished this many iterations (--at-iteration) */
  bool kill_data_node;   /* --kill-data-node: every data node at --at-iteration, a fresh one ... */
  int replace_after_ms;  /* ... --replace-after MS later (node/swarm_kill.h) */
  double kill_fraction;  /* --kill-fraction F: ceil(F x relays) relays at once at --at-iteration (0: none) */
  int rebalance_after;   /* data nodes' --rebalance-after (0, the default here: --no-rebalance) */
  bool move_to_short;    /* data nodes' --move-to-short */
  const char *join_stages; /* test tool: each relay's --join-stage, cycled (NULL: the leader places) */
} swarm_opts;

/* Parses argv into *o with the defaults `gwtf help swarm` states. Returns 0,
 * 1 after printing the help (--help), or 2 after printing why the command
 * line is wrong. */
int swarm_opts_parse(int argc, char **argv, swarm_opts *o);

#endif
