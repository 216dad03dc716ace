/* node/swarm_internal.h — the state `gwtf swarm`'s own files share
 * (node/cmd_swarm.c, swarm_events.c, swarm_summary.c). Internal to node/:
 * the command's interface is node/cmd.h; the parts that need none of this
 * state have their own headers (swarm_kill.h, swarm_hashes.h, swarm_waste.h,
 * swarm_val.h, swarm_args.h, swarm_web.h). */
#ifndef GWTF_NODE_SWARM_INTERNAL_H
#define GWTF_NODE_SWARM_INTERNAL_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "node/swarm_hashes.h"
#include "node/swarm_kill.h"
#include "node/swarm_opts.h"
#include "node/swarm_val.h"
#include "node/swarm_waste.h"
#include "node/swarm_web.h"
#include "util/rng.h"

#define LINE_MAX_BYTES 8192

typedef struct swarm swarm;

typedef struct peer_proc peer_proc;

/* One of a child's output streams: stderr carries its JSON log, stdout the
 * odd line for people ("to join this node: ..."). */
typedef struct peer_stream {
  uv_pipe_t pipe;
  peer_proc *p;
  bool open;
  char buf[LINE_MAX_BYTES];
  size_t len;
} peer_stream;

struct peer_proc {
  swarm *sw;
  int index;
  char name[16];
  bool data;
  int generation; /* restarts with a fresh identity bump this */
  char node[16];  /* its node ID as its log lines name it (this generation's) */
  int port;
  uv_process_t proc;
  peer_stream streams[2]; /* stdout, stderr */
  bool running, killed_by_us, process_open;
  double unaggregated_compute_s; /* compute since its last aggregation: wasted if killed */
  uv_timer_t kill_timer, restart_timer;
  bool kill_pending;
  int stage;  /* from its log lines; -1 until placed */
  bool ready; /* it logged peer.ready: it holds its stage's weights */
  bool late;  /* starts only once the leader finished late_after iterations */
  bool crashed_itself; /* logged debug.crash: its SIGKILL is the test's */
  int killed_generation; /* the latest generation that was killed (-1: none) */
  bool no_restart;       /* killed by --kill-stage: that identity never comes back */
  bool replacement;      /* a fresh data node in place of one --kill-data-node killed: it joins the run */
};

typedef struct iter_rec {
  bool seen;
  double loss_sum, secs_max;
  int done, deferred, reports;
  double comm_sum; /* over microbatches: trip time minus compute along the path */
  int comm_n;
} iter_rec;

/* Compute seconds spent on one microbatch so far, all peers together. */
typedef struct mb_cost {
  char origin[12];
  char mb[24];
  double secs;
} mb_cost;
#define MB_COSTS_MAX 4096

/* What a peer last said about its next-hop link costs (flow.link_costs):
 * the swarm's flow instance, to compare our flows with the exact optimum. */
#define LINK_NODES_MAX 512
#define LINKS_PER_NODE 64
typedef struct link_node {
  char id[12];
  int stage;
  int capacity;
  int n;
  char to[LINKS_PER_NODE][12];
  double cost[LINKS_PER_NODE];
} link_node;

struct swarm {
  swarm_opts o;
  uv_loop_t *loop;
  gw_rng rng;
  peer_proc peers[SWARM_MAX_PEERS];
  int n_peers;
  char exe[PATH_MAX], workdir[PATH_MAX], dataset[PATH_MAX];
  bool tty, stopping, failed;
  int finished_data_nodes;
  uint64_t leader_iterations;
  double last_iter_secs;
  iter_rec *iters;
  swarm_hashes hashes; /* the weights every peer logged after each aggregation */
  bool hashes_agree;
  int splits, splits_unhealed; /* (stage, iteration)s whose peers disagreed; of them, never agreeing again */
  mb_cost *costs; /* ring of the latest microbatches' compute */
  link_node *links;
  size_t n_links;
  double flows_sum;
  int flows_n, flows_probed;
  size_t n_costs, next_cost;
  int crashes, unexpected_exits;
  long long reroutes, recoveries, lost;
  /* exactly once (train/peer_ledger.h): the aggregators' ledger events */
  struct { long long rounds, counted, duplicates, missing, extra, inexact, reruns, unchecked, recovered; } ledger;
  double unaggregated_s; /* compute whose gradient never reached an aggregation */
  swarm_waste *waste;    /* the paper's wasted compute */
  swarm_val *val;        /* the validation curve (eval.done) */
  uint64_t start_ms, end_ms;
  swarm_kill kill;      /* --kill-stage, --kill-data-node, --kill-fraction (node/swarm_kill.h) */
  int stage_lost;       /* the stage a peer or the leader declared lost (0: none) */
  uv_timer_t stop_timer;
  uv_signal_t sigint;
  swarm_web *web; /* NULL without --http */
};

/* node/cmd_swarm.c: the processes and the screen. The event accounting
 * calls back into these: a new iteration may churn relays or start the late
 * ones, and some events end the run. */
void swarm_say(swarm *sw, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void swarm_schedule_churn(swarm *sw);
void swarm_start_late(swarm *sw);
void swarm_stop_all(swarm *sw);
void swarm_finish_or_wait(swarm *sw, peer_proc *p);

/* node/swarm_events.c: one JSON log line of peer p, parsed, accounted. */
void swarm_on_event(swarm *sw, peer_proc *p, json_t *ev);

/* node/swarm_summary.c, once every child has stopped: whether every stage's
 * peers held the same weights after every iteration (it also sets
 * sw->splits and sw->splits_unhealed); then the summary, printed and written
 * to --summary-json (-1: not written). */
bool swarm_check_hashes(swarm *sw);
int swarm_write_summary(swarm *sw);

#endif
