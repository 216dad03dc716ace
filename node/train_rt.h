/* node/train_rt.h — the state the "train" component's files share (node/train_node.c,
 * train_io.c, train_known.c, train_stage.c). Internal to node/: the component's
 * interface is node/train_node.h. */
#ifndef GWTF_NODE_TRAIN_RT_H
#define GWTF_NODE_TRAIN_RT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "flow/flow_guard.h"
#include "node/early_certs.h"
#include "node/train_access.h"
#include "node/train_node.h"
#include "node/worker.h"
#include "train/compute.h"
#include "train/data.h"
#include "train/route_flow.h"
#include "train/route_swarm.h"
#include "train/run.h"

#define PEER_TICK_MS 100
#define DISCOVER_MS 1000
#define SEARCH_MS 200 /* the run record's lookup, until it is found */
#define RUN_REFRESH_MS 5000
#define COST_MS 2000
#define COST_SOON_MS 300 /* a neighbour's session came up: its first RTT sample is in by then */
#define ANNOUNCE_MS 5000
#define PLACED_JITTER_MS 200 /* the lookup after placement, at a random delay up to this */
#define MAX_STAGES 64
#define MAX_KNOWN 512
#define DEFAULT_BW_BPS 125e6  /* 1 Gb/s until a throughput sample exists */
#define DEFAULT_COMPUTE_S 0.01 /* a peer that has not measured itself yet */
#define STOP_AFTER_DONE_MS 1000
#define REPAIR_RESERVE 1      /* train_tunables.repair_reserve */
#define REPAIR_RESERVE_MIN 8  /* memory-derived capacity: slots before one is kept for repairs */
/* A private member not reached through its current relay within this long
 * is tried through its next one. */
#define VIA_FALLBACK_MS 6000

/* ---- the component's state ---- */

typedef struct known_peer {
  gw_id id;
  gw_addr addr;
  int stage;
  uint64_t remaining_ms; /* of its record at the last look: a rise means it re-announced */
  double compute_s;      /* from its HELLO; 0 = unknown */
  uint64_t seen_round;
  /* A private member (its record says no_direct) is reached through one of
   * its relays, the one at via (-1: directly at addr). */
  stage_relay relays[STAGE_DIR_MAX_RELAYS];
  size_t n_relays;
  int via;
  uint64_t via_since_ms; /* trying relays[via] since, or last connected */
} known_peer;

/* One DHT lookup in flight. Its callback may come after we stopped (the DHT
 * stops after us and ends pending lookups with GW_ECLOSED), so it holds no
 * pointer we free: at stop, rt is set to NULL and the callback frees it. */
typedef struct dir_query {
  struct train_rt *rt;
  int stage; /* -1: the run record */
} dir_query;

#define MAX_QUERIES (MAX_STAGES + 3) /* every stage, the run record, our stage's replica holders */

typedef struct train_rt {
  node *n;
  uv_loop_t *loop;
  const train_node_opts *o;
  gw_log log;
  size_t budget_bytes; /* compute.ready's budget_mb: what this node's stage may use */
  dht *d;
  p2p_host *host;
  bool have_run, started, stopping, finished;
  uint64_t search_ms; /* the run record's next lookup, until it is found */
  train_run run;
  int stage;
  uint32_t capacity;
  uint32_t repair_reserve; /* slots over capacity for repairs (train_tunables.repair_reserve) */
  train_dataset ds;
  bool ds_open;
  train_dataset val; /* validation tokens (n_tokens 0: none) */
  uint32_t val_n;    /* validation microbatches */
  uint64_t data_seed;
  train_peer *peer;
  node_early_certs early_certs; /* members' certificates from before peer existed */
  train_compute compute;
  bool compute_ready;
  node_worker *worker;
  route_flow rf;
  route_swarm *rs;
  flow *flow;
  bool swarm_routing;
  uv_timer_t peer_timer, flow_timer, disco_timer, cost_timer, stop_timer, placed_timer;
  int open_timers;
  dir_query *queries[MAX_QUERIES]; /* in flight; NULL slots are free */
  bool stage_busy[MAX_STAGES + 1];
  bool run_query_busy;
  uint64_t last_run_refresh, last_announce, discover_round;
  known_peer known[MAX_KNOWN];
  size_t n_known;
  double compute_s_ewma; /* our forward+backward per microbatch */
  flow_guard guard;      /* flow floods and cost lies of neighbours (flow/flow_guard.h) */
  int ckpt_marker;       /* address marks the runtime's own snapshot jobs */
  int replica_marker;    /* ... and the ones whose state goes to replica holders */
  int switch_marker;     /* ... and the one that swaps the compute to another stage (a move) */
  uint64_t stage_gen;    /* bumped by each stage switch: snapshots of the stage before are dropped */
  bool switching;        /* a switch job is queued */
  stage_spec switch_spec; /* what it builds (written before it is queued, read by the worker) */
  gpu_device switch_dev;
  adamw_config switch_opt;
  bool replica_query_busy;
  char ckpt_path[PATH_MAX];
  bool announced;
  bool want_announce; /* ready: train_rt_announce, and again until it succeeds */
  uint64_t relays_gen; /* node_relays_generation at the last announcement */
  /* private runs (node/train_access.h) */
  train_access acc;
  const char *data_dir;
  char creator_addr[GW_ADDR_STRLEN]; /* what we last wrote to creator.addr */
} train_rt;

static inline uint64_t now_ms(train_rt *rt) { return uv_now(rt->loop); }

/* train_known.c */
known_peer *train_rt_known_find(train_rt *rt, const gw_id *id);

/* the train peer's and the flow protocol's io, the peer's clock and the compute worker */
gw_io train_rt_flow_io(train_rt *rt);
void train_rt_log_wire(train_rt *rt, uint64_t iteration);
int train_rt_next_load(void *ud, const gw_id *peer, train_load *out);
void train_rt_on_job_done(void *ud, train_job *job);
train_io train_rt_peer_io(train_rt *rt);
void train_rt_run_job(void *ctx, train_job *job);
void train_rt_stop_soon(train_rt *rt);

/* peers we know: the stage directory, dialling, link costs */
void train_rt_announce(train_rt *rt);
void train_rt_cost_cb(uv_timer_t *t);
void train_rt_costs_soon(train_rt *rt);
void train_rt_disco_cb(uv_timer_t *t);
void train_rt_discover_now(train_rt *rt);
double train_rt_link_cost(train_rt *rt, const gw_id *peer);
void train_rt_my_record(train_rt *rt, stage_member *me);
int train_rt_next_stage(const train_rt *rt);
void train_rt_peer_info(void *ud, const gw_id *peer, int stage, uint32_t capacity, double compute_ms);
int train_rt_prev_stage(const train_rt *rt);
void train_rt_publish_run(train_rt *rt);
train_rt *train_rt_query_done(dir_query *q);

/* our stage: the dataset, the device and capacity, entering and switching stages, routing */
void train_rt_enter_stage(train_rt *rt, int s);
int train_rt_open_validation(train_rt *rt);
int train_rt_probe_compute(train_rt *rt, bool data);
int train_rt_sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets);
void train_rt_switch_stage(train_rt *rt, int s);
int train_rt_val_sample(void *ud, uint32_t index, int32_t *inputs, int32_t *targets);

/* the component: peer events, starting the peer, the run record, create */
int train_rt_create_run(train_rt *rt);
void train_rt_on_peer_event(void *ud, const train_event *ev);
void train_rt_run_cb(void *ud, int status, const stage_run *runs, size_t n);

#endif
