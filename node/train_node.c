/* node/train_node.c — the "train" component of a node (see train_node.h). */
#include "node/train_node.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "flow/flow_guard.h"
#include "gwtf.pb-c.h"
#include "node/dht_node.h"
#include "node/early_certs.h"
#include "node/relays.h"
#include "node/run_access.h"
#include "node/train_access.h"
#include "node/train_plan.h"
#include "node/worker.h"
#include "train/checkpoint.h"
#include "train/replica_store.h"
#include "node/train_replica.h"
#include "train/compute.h"
#include "train/data.h"
#include "train/model.h"
#include "train/route_flow.h"
#include "train/run.h"
#include "train/route_swarm.h"
#include "train/stage.h"
#include "train/wire_codec.h"
#include "train.pb-c.h"
#include "util/err.h"
#include "util/file.h"

#define PEER_TICK_MS 100
#define DISCOVER_MS 1000
#define SEARCH_MS 200 /* the run record's lookup, until it is found */
#define RUN_REFRESH_MS 5000
#define COST_MS 2000
#define COST_SOON_MS 300 /* a neighbour's session came up: its first RTT sample is in by then */
#define ANNOUNCE_MS 5000
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

void train_node_opts_default(train_node_opts *o) {
  memset(o, 0, sizeof(*o));
  o->device = "cpu";
  o->routing = "gwtf";
  o->model = "tiny";
  o->stages = 3;
  o->microbatches = 4;
  o->batch = 4;
  o->seq = 64;
  o->lr = 1e-3;
  o->seed = 1;
  o->threads = 0; /* all the cores this process may use: a home node uses the machine */
  o->checkpoint_every = 10;
  o->replicate_every = 5;
  o->replicas = 2;
  o->replica_max = REPLICA_DEFAULT_MAX_ENTRIES;
  o->rebalance_after = 3;
  o->rebalance_margin = 0.2;
  o->flow_tick_ms = 2000;
  o->hop_timeout_ms = 5000;
  o->live_k = 4;
  o->live_floor_ms = 500;
  o->exit_when_done = true;
  o->slowdown = 1.0;
  o->byzantine_scale = 100.0;
  o->eval_every = 10;
}

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
  uv_timer_t peer_timer, flow_timer, disco_timer, cost_timer, stop_timer;
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
  bool want_announce; /* ready: announce, and again until it succeeds */
  uint64_t relays_gen; /* node_relays_generation at the last announcement */
  /* private runs (node/train_access.h) */
  train_access acc;
  const char *data_dir;
  char creator_addr[GW_ADDR_STRLEN]; /* what we last wrote to creator.addr */
} train_rt;

static uint64_t now_ms(train_rt *rt) { return uv_now(rt->loop); }

static known_peer *known_find(train_rt *rt, const gw_id *id) {
  for (size_t i = 0; i < rt->n_known; i++)
    if (gw_id_eq(&rt->known[i].id, id)) return &rt->known[i];
  return NULL;
}

/* ---- train_io: the peer's view of the node ---- */

static int io_send(void *ud, const gw_id *to, uint32_t type, const uint8_t *body, size_t len,
                   const train_tensor *t) {
  train_rt *rt = ud;
  p2p_msg m = {.type = type, .body = body, .body_len = len};
  p2p_tensor pt;
  if (t) {
    memset(&pt, 0, sizeof(pt));
    pt.dtype = (uint32_t)t->dtype;
    pt.ndim = t->ndim;
    for (uint32_t i = 0; i < t->ndim && i < 4; i++) pt.shape[i] = t->shape[i];
    m.tensor = &pt;
    m.data = t->data;
    m.data_len = t->nbytes;
  }
  return p2p_host_send(rt->host, to, &m);
}

static void peer_tick_cb(uv_timer_t *t);

static void io_want_tick(void *ud, uint64_t at) {
  train_rt *rt = ud;
  uint64_t now = now_ms(rt);
  uv_timer_start(&rt->peer_timer, peer_tick_cb, at > now ? at - now : 0, 0);
}

static void io_random(void *ud, void *buf, size_t len) {
  (void)ud;
  randombytes_buf(buf, len);
}

/* Failure detection (train/peer_liveness.c): the session's RTT, what we
 * heard from the peer, and our queue to it in ms at its measured rate. */
static bool io_link(void *ud, const gw_id *peer, train_link *out) {
  train_rt *rt = ud;
  p2p_peer_stats st;
  if (p2p_host_peer_stats(rt->host, peer, &st) != 0 || !st.connected) return false;
  out->srtt_ms = st.rtt_ms;
  out->rttvar_ms = st.rttvar_ms;
  out->rtt_samples = st.rtt_samples;
  out->heard = st.bytes_rx;
  double bps = st.tx_Bps > 0 ? st.tx_Bps : DEFAULT_BW_BPS;
  out->queue_ms = 1000.0 * (double)st.queued_bytes / bps;
  return true;
}

/* The GWTF router's fallback weighs next hops by load (train/route_flow.h). */
static int next_load(void *ud, const gw_id *peer, train_load *out) {
  train_rt *rt = ud;
  if (!rt->peer) return p2p_host_is_connected(rt->host, peer) ? 0 : -1;
  return train_peer_next_load(rt->peer, peer, out);
}

static void io_probe(void *ud, const gw_id *peer) {
  train_rt *rt = ud;
  p2p_host_ping(rt->host, peer);
}

static bool io_connected(void *ud, const gw_id *peer) {
  train_rt *rt = ud;
  return p2p_host_is_connected(rt->host, peer);
}

static int io_compute(void *ud, train_job *job) {
  train_rt *rt = ud;
  if (rt->o->crash_job && (int)job->kind == rt->o->crash_job &&
      train_peer_iteration(rt->peer) >= rt->o->crash_iteration) {
    GW_WARN(&rt->log, "debug.crash", "job=%d mb=%llx iter=%llu msg=\"--debug-crash: SIGKILL now\"", (int)job->kind,
            (unsigned long long)job->mb_id, (unsigned long long)train_peer_iteration(rt->peer));
    raise(SIGKILL);
  }
  return node_worker_submit(rt->worker, job);
}

/* What our activations and gradients cost the links so far (--wire-dtype):
 * one line per aggregation, cumulative. */
static void log_wire(train_rt *rt, uint64_t iteration) {
  const train_counters *c = train_peer_counters(rt->peer);
  GW_INFO(&rt->log, "wire.sent", "iter=%llu tensors=%llu bytes=%llu fp32_bytes=%llu", (unsigned long long)iteration,
          (unsigned long long)c->wire_tensors, (unsigned long long)c->wire_bytes, (unsigned long long)c->wire_f32_bytes);
}

static void on_peer_event(void *ud, const train_event *ev);

static uint64_t io_unix_s(void *ud) {
  (void)ud;
  return (uint64_t)time(NULL);
}

/* A holder of the run key counts an invite's uses in the data dir, so a
 * restart does not hand them out again. */
static int io_redeem(void *ud, const uint8_t id[16], uint32_t uses, const gw_id *peer) {
  train_rt *rt = ud;
  return train_access_redeem(&rt->acc, id, uses, peer, &rt->log);
}

/* An aggregator signs its averages with the node's identity key (the
 * train peer never holds the secret half). */
static void io_sign(void *ud, const uint8_t *msg, size_t len, uint8_t sig[64]) {
  train_rt *rt = ud;
  p2p_sign(node_identity(rt->n), msg, len, sig);
}

/* ---- flow protocol io ---- */

static int flow_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  train_rt *rt = ud;
  if (rt->peer) train_peer_present(rt->peer, &to->id); /* a private run: our certificate goes first */
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_FLOW, .body = buf, .body_len = len};
  return p2p_host_send(rt->host, &to->id, &m);
}

static void flow_tick_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  if (rt->flow) flow_on_tick(rt->flow, now_ms(rt));
}

static void flow_want_tick(void *ud, uint64_t at) {
  train_rt *rt = ud;
  uint64_t now = now_ms(rt);
  uv_timer_start(&rt->flow_timer, flow_tick_cb, at > now ? at - now : 0, 0);
}

/* ---- the peer's clock ---- */

static void stop_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  node_stop(rt->n);
}

/* Stops the node from the loop, not from here: we may be inside one of the
 * peer's callbacks (an event, a job's result), and stopping frees the peer,
 * which then goes on writing to itself (seen with ASan after stage.lost). */
static void stop_soon(train_rt *rt) { uv_timer_start(&rt->stop_timer, stop_cb, 0, 0); }

static void peer_tick_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  uint64_t now = now_ms(rt);
  rt->rf.now_ms = now;
  train_peer_on_tick(rt->peer, now);
  if (!rt->finished && train_peer_finished(rt->peer) && rt->o->exit_when_done) {
    rt->finished = true;
    GW_INFO(&rt->log, "node.done", "msg=\"ran its iterations; stopping\"");
    uv_timer_start(&rt->stop_timer, stop_cb, STOP_AFTER_DONE_MS, 0);
  }
}

/* ---- compute ---- */

/* On the worker thread. --slowdown stretches every job to F times its
 * duration, as a device F times slower would (the paper's heterogeneous
 * peers); the job's measured time then includes it, so Eq. 1 sees it too.
 * With one compute thread the stretch is F - 1 times the job's CPU time,
 * not its wall time: on a machine whose cores the swarm's peers share, a
 * job that waited for a core would otherwise wait F times as long, and
 * the emulated device's speed would follow the host's load. */
static void run_job(void *ctx, train_job *job) {
  train_rt *rt = ctx;
  if (job->owner == &rt->switch_marker) {
    /* a move to another stage (train/peer_move.c): every job of the old
     * stage was queued before this one and has run */
    train_compute_free(&rt->compute);
    train_compute_init(&rt->compute, &rt->switch_spec, &rt->switch_dev, rt->o->threads, rt->run.seed,
                       &rt->switch_opt);
    return;
  }
  uint64_t t0 = uv_hrtime();
  struct timespec c0, c1;
  bool cpu = rt->o->threads == 1 && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0) == 0;
  train_compute_run(&rt->compute, job);
  double ran_ns = (double)(uv_hrtime() - t0);
  if (cpu && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1) == 0)
    ran_ns = fmin(ran_ns, (double)(c1.tv_sec - c0.tv_sec) * 1e9 + (double)(c1.tv_nsec - c0.tv_nsec));
  double extra_ns = ran_ns * (rt->o->slowdown - 1.0);
  if (extra_ns > 0) uv_sleep((unsigned)(extra_ns / 1e6));
}

/* ---- compute results ---- */

/* The snapshot job carries the iteration (in key) and the weight hash the
 * aggregation announced, taken when it was queued: the worker runs jobs in
 * order, so the snapshot holds exactly those weights. */
static void write_checkpoint(train_rt *rt, train_job *job) {
  if (job->rc != 0 || !job->blob) return;
  int rc = ckpt_save_blob(rt->ckpt_path, job->blob, job->blob_len, rt->run.name, rt->stage, (long long)job->key,
                          job->hash);
  if (rc == 0)
    GW_INFO(&rt->log, "checkpoint.saved", "path=%s bytes=%zu iter=%llu", rt->ckpt_path, job->blob_len,
            (unsigned long long)job->key);
  else
    GW_ERROR(&rt->log, "checkpoint.failed", "path=%s err=\"%s\"", rt->ckpt_path, gw_strerror(rc));
}

/* Our stage's state, snapshot right after the aggregation that made
 * iteration job->key (whose logged hash is job->hash), goes to the holders
 * closest to the stage's replica key (train/peer_replica.c). */
static void push_replica(train_rt *rt, train_job *job) {
  if (job->rc != 0 || !job->blob || rt->stage < 0) return;
  gw_id key;
  if (stage_dir_replica_key(rt->run.name, (uint32_t)rt->stage, &key) != 0) return;
  train_peer_push_replica(rt->peer, &key, (uint32_t)rt->o->replicas, job->blob, job->blob_len, job->key,
                          train_peer_step(rt->peer), job->hash);
}

static void on_job_done(void *ud, train_job *job) {
  train_rt *rt = ud;
  if (job->owner == &rt->switch_marker) {
    rt->switching = false;
    GW_INFO(&rt->log, "stage.switched", "stage=%d", rt->stage);
    train_job_free(job);
    return;
  }
  if (job->owner == &rt->ckpt_marker || job->owner == &rt->replica_marker) {
    /* a snapshot of the stage we served before a move is not this stage's */
    if (job->mb_id == rt->stage_gen) {
      if (job->owner == &rt->ckpt_marker) write_checkpoint(rt, job);
      else push_replica(rt, job);
    }
    train_job_free(job);
    return;
  }
  if (job->rc == 0 && (job->kind == TRAIN_JOB_FORWARD || job->kind == TRAIN_JOB_BACKWARD)) {
    /* Eq. 1's c_i: forward + backward per microbatch, smoothed */
    double s = job->seconds * 2.0;
    rt->compute_s_ewma = rt->compute_s_ewma > 0 ? 0.8 * rt->compute_s_ewma + 0.2 * s : s;
  }
  rt->rf.now_ms = now_ms(rt);
  train_peer_on_job_done(rt->peer, job, now_ms(rt));
}

/* ---- costs (Eq. 1) ---- */

static int next_stage(const train_rt *rt) { return rt->stage == rt->run.stages ? 0 : rt->stage + 1; }

/* What one tensor in dtype d puts on the wire: its encoded size, or fp32's
 * where that is smaller (train/peer_wire.c sends fp32 then). */
static double sent_bytes(train_dtype d, size_t rows, size_t cols) {
  size_t b = wire_bytes(d, rows, cols), f = wire_bytes(TRAIN_F32, rows, cols);
  return (double)(b == 0 || b > f ? f : b);
}

static double link_cost(train_rt *rt, const gw_id *peer) {
  p2p_peer_stats st;
  if (p2p_host_peer_stats(rt->host, peer, &st) != 0 || !st.connected) return -1;
  known_peer *k = known_find(rt, peer);
  double ci = rt->compute_s_ewma > 0 ? rt->compute_s_ewma : DEFAULT_COMPUTE_S;
  double cj = k && k->compute_s > 0 ? k->compute_s : ci;
  double lat = st.rtt_samples ? st.rtt_ms / 2000.0 : 0.0;
  double tx = st.tx_Bps > 0 ? st.tx_Bps : DEFAULT_BW_BPS, rx = st.rx_Bps > 0 ? st.rx_Bps : DEFAULT_BW_BPS;
  /* Eq. 1's size: the bytes one microbatch puts on this link each way, as
   * negotiated (train_peer_wire_to/from): our activation to a next-stage
   * peer and its gradient back, or the reverse for a previous-stage peer.
   * Compression makes a slow link cheaper, and the flows follow. */
  size_t rows = (size_t)rt->run.batch * (size_t)rt->run.seq, cols = (size_t)rt->run.model.d_model;
  bool next = k && k->stage == next_stage(rt); /* else previous: gradients go, activations come */
  train_dtype to = rt->peer ? train_peer_wire_to(rt->peer, peer, !next) : TRAIN_F32;
  train_dtype from = rt->peer ? train_peer_wire_from(rt->peer, peer, next) : TRAIN_F32;
  double size = 0.5 * (sent_bytes(to, rows, cols) + sent_bytes(from, rows, cols));
  /* In milliseconds: the annealing temperature (T0 = 1.7, GWTF §VI) is
   * calibrated for costs of a few units to a few tens, and link costs in
   * seconds (~0.01) would make it accept almost every worse change. */
  return 1000.0 * flow_cost_eq1(ci, cj, lat, lat, tx, rx, size);
}

static int prev_stage(const train_rt *rt) { return rt->stage == 0 ? rt->run.stages : rt->stage - 1; }

/* One line with every next-hop cost we measured: experiments rebuild the
 * swarm's flow instance from these to compare our flows with the optimum. */
static void log_costs(train_rt *rt, const gw_id *ids, const double *costs, size_t n) {
  char line[1200];
  size_t off = 0;
  for (size_t i = 0; i < n && off + 32 < sizeof(line); i++) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&ids[i], who);
    off += (size_t)snprintf(line + off, sizeof(line) - off, "%s%s:%.3f", i ? "," : "", who, costs[i]);
  }
  if (n) GW_INFO(&rt->log, "flow.link_costs", "capacity=%u to=%s", rt->capacity, line);
}

static void update_costs(train_rt *rt) {
  if (rt->stage < 0) return;
  gw_id ids[ROUTE_FLOW_MAX_NEXT] = {{{0}}};
  double costs[ROUTE_FLOW_MAX_NEXT] = {0};
  size_t n = 0;
  int nx = next_stage(rt), pv = prev_stage(rt);
  for (size_t i = 0; i < rt->n_known; i++) {
    known_peer *k = &rt->known[i];
    if (k->stage != nx && k->stage != pv) continue;
    /* a private run: a directory member without a certificate gets no
     * flow and no microbatch (its flow messages are refused too) */
    if (!train_peer_member(rt->peer, &k->id)) continue;
    double c = link_cost(rt, &k->id);
    if (rt->flow) {
      if (k->stage == nx) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
      if (k->stage == pv) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
    }
    if (k->stage == nx && c >= 0 && n < ROUTE_FLOW_MAX_NEXT) {
      ids[n] = k->id;
      costs[n++] = c;
    }
  }
  route_flow_set_next(&rt->rf, ids, costs, n);
  log_costs(rt, ids, costs, n);
}

static void cost_cb(uv_timer_t *t) { update_costs(t->data); }

/* The costs again in COST_SOON_MS, unless due sooner. A neighbour whose
 * session just came up (a relay restarted under churn, as a new peer) had
 * no cost for the flows and was no fallback hop until the next COST_MS
 * round, a second on average: its first RTT sample is in by then. */
static void costs_soon(train_rt *rt) {
  if (uv_timer_get_due_in(&rt->cost_timer) > COST_SOON_MS)
    uv_timer_start(&rt->cost_timer, cost_cb, COST_SOON_MS, COST_MS);
}

static void known_set_stage(train_rt *rt, known_peer *k, int stage);

static void peer_info(void *ud, const gw_id *peer, int stage, uint32_t capacity, double compute_ms) {
  train_rt *rt = ud;
  (void)capacity;
  known_peer *k = known_find(rt, peer);
  if (k) {
    if (stage >= 0) known_set_stage(rt, k, stage);
    if (compute_ms > 0) {
      bool first;
      k->compute_s = flow_guard_cost_claim(&rt->guard, peer, stage, compute_ms / 1000.0,
                                           stage == rt->stage ? train_peer_compute_ms(rt->peer) / 1000.0 : 0,
                                           &first);
      if (first) {
        char who[GW_ID_SHORT_LEN + 1];
        gw_id_to_short(peer, who);
        GW_WARN(&rt->log, "flow.cost_claim_clamped", "peer=%s claimed_ms=%.4f used_ms=%.4f ratio=%g", who,
                compute_ms, 1000.0 * k->compute_s, FLOW_GUARD_COST_RATIO);
      }
    }
  }
}

/* ---- membership ---- */

static bool wanted_stage(const train_rt *rt, int s) {
  /* Everyone follows the data nodes; data nodes follow every stage (one
   * may become the leader, and each checks that every stage is served). */
  if (s == 0 || rt->stage == 0 || train_peer_is_leader(rt->peer)) return true;
  if (rt->stage < 0) return false;
  return s == rt->stage || s == next_stage(rt) || s == prev_stage(rt);
}

/* Stops dialling k the way we do now (directly, or through relays[via]). */
static void known_undial(train_rt *rt, known_peer *k) {
  if (k->via < 0)
    p2p_host_forget(rt->host, &k->addr);
  else
    p2p_host_forget_via(rt->host, &k->relays[k->via].addr, &k->id);
}

/* Dials k directly or through relays[via]; kept (and redialled) until it
 * leaves the directory or its record names other relays. */
static void known_dial(train_rt *rt, known_peer *k) {
  char who[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&k->id, who);
  k->via_since_ms = now_ms(rt);
  if (k->via < 0) {
    p2p_host_connect(rt->host, &k->addr, &k->id);
    return;
  }
  p2p_relay_addr ca = {.relay = k->relays[k->via].id, .relay_addr = k->relays[k->via].addr, .target = k->id};
  char cs[P2P_RELAY_ADDR_STRLEN];
  p2p_relay_addr_format(&ca, cs);
  int rc = p2p_host_connect_via(rt->host, &ca.relay, &ca.relay_addr, &k->id);
  GW_INFO(&rt->log, "train.dial_via", "peer=%s circuit=%s relay=%d/%zu rc=%d", who, cs, k->via + 1, k->n_relays, rc);
}

static bool same_relays(const known_peer *k, const stage_member *m) {
  if (k->n_relays != m->n_relays) return false;
  for (size_t i = 0; i < m->n_relays; i++)
    if (!gw_id_eq(&k->relays[i].id, &m->relays[i].id) || !gw_addr_eq(&k->relays[i].addr, &m->relays[i].addr))
      return false;
  return true;
}

/* How to reach a member, from its record: a private one (no_direct) that
 * names relays through the first of them, falling back to the next when a
 * relay does not get us a session (follow_relays); anyone else directly.
 * When the peer also dials us directly, the host keeps the direct session
 * (p2p/host.c: a direct session beats a relayed one). */
static void known_route(train_rt *rt, known_peer *k, const stage_member *m, bool fresh) {
  bool relayed = m->no_direct && m->n_relays > 0;
  if (!fresh && relayed == (k->via >= 0) && same_relays(k, m) && (relayed || gw_addr_eq(&k->addr, &m->addr))) return;
  if (!fresh) known_undial(rt, k);
  k->addr = m->addr;
  k->n_relays = m->n_relays;
  memcpy(k->relays, m->relays, sizeof(m->relays[0]) * m->n_relays);
  k->via = relayed ? 0 : -1;
  known_dial(rt, k);
}

/* A relayed member we are not connected to: try its next relay after a while. */
static void follow_relays(train_rt *rt, known_peer *k) {
  if (k->via < 0) return;
  uint64_t now = now_ms(rt);
  if (p2p_host_is_connected(rt->host, &k->id)) {
    k->via_since_ms = now;
    return;
  }
  if (k->n_relays < 2 || now - k->via_since_ms < VIA_FALLBACK_MS) return;
  known_undial(rt, k);
  k->via = (k->via + 1) % (int)k->n_relays;
  known_dial(rt, k);
}

/* A known peer serves `stage` (its directory record, its HELLO). When that
 * is another stage than we knew, the leader moved it (train/peer_move.c):
 * our flow state must see it there, or no flow ever goes through it. */
static void known_set_stage(train_rt *rt, known_peer *k, int stage) {
  if (k->stage != stage && rt->flow) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&k->id, who);
    GW_INFO(&rt->log, "train.peer_moved", "peer=%s from_stage=%d to_stage=%d", who, k->stage, stage);
    flow_remove_peer(rt->flow, &k->id, now_ms(rt));
    flow_add_peer(rt->flow, &k->id, stage);
    double c = link_cost(rt, &k->id);
    if (stage == next_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
    if (stage == prev_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
  }
  if (k->stage != stage && (stage == next_stage(rt) || stage == prev_stage(rt))) costs_soon(rt);
  k->stage = stage;
}

static known_peer *known_add(train_rt *rt, const stage_member *m, int stage) {
  const gw_id *id = &m->id;
  known_peer *k = known_find(rt, id);
  if (!k) {
    if (rt->n_known == MAX_KNOWN) return NULL;
    k = &rt->known[rt->n_known++];
    memset(k, 0, sizeof(*k));
    k->id = *id;
    k->stage = stage;
    known_route(rt, k, m, true);
    if (rt->flow) {
      flow_add_peer(rt->flow, id, stage);
      /* its link cost at once, not at the next cost tick: a newcomer
       * should take flows within ticks of being seen */
      double c = link_cost(rt, id);
      if (stage == next_stage(rt)) flow_set_cost(rt->flow, id, FLOW_DIR_NEXT, c);
      if (stage == prev_stage(rt)) flow_set_cost(rt->flow, id, FLOW_DIR_PREV, c);
    }
  } else {
    known_route(rt, k, m, false);
    follow_relays(rt, k);
  }
  known_set_stage(rt, k, stage);
  return k;
}

/* Peers that left every stage directory we watch are forgotten. */
static void known_sweep(train_rt *rt) {
  for (size_t i = 0; i < rt->n_known;) {
    known_peer *k = &rt->known[i];
    if (rt->discover_round - k->seen_round < 5 || !wanted_stage(rt, k->stage)) {
      i++;
      continue;
    }
    known_undial(rt, k);
    if (rt->flow) flow_remove_peer(rt->flow, &k->id, now_ms(rt));
    rt->known[i] = rt->known[--rt->n_known];
  }
}

static dir_query *query_new(train_rt *rt, int stage) {
  for (size_t i = 0; i < MAX_QUERIES; i++) {
    if (rt->queries[i]) continue;
    dir_query *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->rt = rt;
    q->stage = stage;
    rt->queries[i] = q;
    return q;
  }
  return NULL;
}

/* The lookup answered: forget it; NULL when we stopped meanwhile. */
static train_rt *query_done(dir_query *q) {
  train_rt *rt = q->rt;
  if (rt)
    for (size_t i = 0; i < MAX_QUERIES; i++)
      if (rt->queries[i] == q) rt->queries[i] = NULL;
  free(q);
  return rt;
}

static void members_cb(void *ud, int status, const stage_member *members, size_t n) {
  dir_query *q = ud;
  int stage = q->stage;
  train_rt *rt = query_done(q);
  if (!rt) return;
  rt->stage_busy[stage] = false;
  if (status != 0 || rt->stopping || !rt->peer) return;
  train_member list[MAX_KNOWN];
  gw_id ids[MAX_KNOWN];
  size_t k = 0;
  const gw_id *me = &node_identity(rt->n)->id;
  for (size_t i = 0; i < n && k < MAX_KNOWN; i++) {
    const stage_member *m = &members[i];
    list[k] = (train_member){.id = m->id, .capacity = m->capacity, .load = m->load};
    ids[k++] = m->id;
    if (gw_id_eq(&m->id, me)) continue;
    known_peer *kp = known_add(rt, m, stage);
    if (!kp) continue;
    /* SWARM lifts a ban when the peer announces itself again */
    if (rt->rs && m->remaining_ms > kp->remaining_ms + 1000) route_swarm_readmit(rt->rs, &m->id);
    kp->remaining_ms = m->remaining_ms;
    kp->seen_round = rt->discover_round;
  }
  train_peer_set_members(rt->peer, stage, list, k, now_ms(rt));
  if (rt->rs && rt->stage >= 0 && stage == next_stage(rt)) route_swarm_set_next(rt->rs, ids, k);
}

/* Where others reach us, as our directory records say it. */
static void my_record(train_rt *rt, stage_member *me) {
  memset(me, 0, sizeof(*me));
  me->addr = p2p_host_listen_addr(rt->host);
  me->capacity = rt->capacity;
  /* A private node names the relays it holds reservations on: others reach
   * it through them (node/relays.h). */
  node_relays *nr = node_get_relays(rt->n);
  if (nr) {
    p2p_relay_addr ra[STAGE_DIR_MAX_RELAYS];
    size_t n = node_relays_get(nr, ra, STAGE_DIR_MAX_RELAYS, &me->no_direct);
    for (size_t i = 0; i < n; i++) me->relays[i] = (stage_relay){ra[i].relay, ra[i].relay_addr};
    me->n_relays = n;
  }
}

static void announce(train_rt *rt) {
  if (rt->stage < 0 || !rt->started) return;
  rt->want_announce = true;
  stage_member me;
  my_record(rt, &me);
  node_relays *nr = node_get_relays(rt->n);
  if (nr) rt->relays_gen = node_relays_generation(nr);
  if (rt->flow) {
    flow_counts c;
    flow_get_counts(rt->flow, &c);
    me.load = (uint32_t)(c.units > 0 ? c.units : 0);
  }
  int rc = stage_dir_announce(rt->d, rt->run.name, (uint32_t)rt->stage, &me, now_ms(rt));
  if (rc == 0 && rt->acc.have_key && rt->run.private_run) {
    /* where `gwtf invite` tells friends to dial: what we announced (a
     * wildcard listen address is the one our peers see, as in the record) */
    char addr[GW_ADDR_STRLEN];
    static const uint8_t zero[16];
    gw_addr a = me.addr, seen;
    if (memcmp(a.ip, zero, a.family == 4 ? 4 : 16) == 0 && dht_observed_addr(rt->d, &seen) == 0) {
      seen.port = a.port;
      a = seen;
    }
    gw_addr_format(&a, addr);
    if (strcmp(addr, rt->creator_addr) != 0 && run_access_write_addr(rt->data_dir, rt->run.name, addr) == 0)
      snprintf(rt->creator_addr, sizeof(rt->creator_addr), "%s", addr);
  }
  if (rc == 0 && !rt->announced) {
    rt->announced = true;
    GW_INFO(&rt->log, "stage.announced", "run=%s capacity=%u relays=%zu private=%d", rt->run.name, rt->capacity,
            me.n_relays, (int)me.no_direct);
  } else if (rc == 0 && nr && me.n_relays + me.no_direct > 0) {
    GW_DEBUG(&rt->log, "stage.reannounced", "relays=%zu private=%d", me.n_relays, (int)me.no_direct);
  }
  rt->last_announce = now_ms(rt);
}

/* ---- setting up once the run is known ---- */

static void run_cb(void *ud, int status, const stage_run *runs, size_t n);

static void refresh_run(train_rt *rt) {
  if (rt->run_query_busy) return;
  const char *name = rt->o->run ? rt->o->run : rt->o->create_run;
  dir_query *q = query_new(rt, -1);
  if (!q) return;
  if (stage_dir_find_run(rt->d, name, run_cb, q, now_ms(rt)) == 0)
    rt->run_query_busy = true;
  else
    query_done(q);
}

static void publish_run(train_rt *rt) {
  char *text = train_run_encode(&rt->run);
  if (!text) return;
  stage_dir_publish_run(rt->d, rt->run.name, (const uint8_t *)text, strlen(text), now_ms(rt));
  free(text);
}

/* The holders of our stage's replicas, for a peer that finds no live
 * member to download from (train/peer_replica.c). */
static void replicas_cb(void *ud, int status, const stage_member *members, size_t n) {
  train_rt *rt = query_done(ud);
  if (!rt) return;
  rt->replica_query_busy = false;
  if (status != 0 || rt->stopping || !rt->peer) return;
  train_replica_holder h[16];
  size_t k = 0;
  for (size_t i = 0; i < n && k < sizeof(h) / sizeof(h[0]); i++) {
    if (train_replica_extra_decode(&members[i], &h[k]) != 0) continue;
    /* a holder need not be in a stage we follow: dial it */
    if (!p2p_host_is_connected(rt->host, &members[i].id) && !known_find(rt, &members[i].id) &&
        !members[i].no_direct)
      p2p_host_connect(rt->host, &members[i].addr, &members[i].id);
    k++;
  }
  if (k > 0) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&h[0].id, who);
    GW_DEBUG(&rt->log, "replica.holders", "stage=%d holders=%zu first=%s iter=%llu", rt->stage, k, who,
             (unsigned long long)h[0].iteration);
  }
  train_peer_set_replica_holders(rt->peer, h, k, now_ms(rt));
}

static void find_replica_holders(train_rt *rt) {
  dir_query *q = query_new(rt, rt->stage);
  if (!q) return;
  if (stage_dir_discover_replicas(rt->d, rt->run.name, (uint32_t)rt->stage, replicas_cb, q, now_ms(rt)) == 0)
    rt->replica_query_busy = true;
  else
    query_done(q);
}

static void disco_cb(uv_timer_t *t) {
  train_rt *rt = t->data;
  uint64_t now = now_ms(rt);
  if (rt->stopping) return;
  if (!rt->have_run || now - rt->last_run_refresh >= RUN_REFRESH_MS) {
    rt->last_run_refresh = now;
    refresh_run(rt);
  }
  /* A node that starts asks for the run record again after SEARCH_MS,
   * doubling up to DISCOVER_MS: its first lookup, at once, finds no
   * contact yet. At DISCOVER_MS from the start, a relay restarted under
   * churn searched a whole second. */
  if (!rt->have_run) {
    rt->search_ms = rt->search_ms ? rt->search_ms * 2 : SEARCH_MS;
    if (rt->search_ms > DISCOVER_MS) rt->search_ms = DISCOVER_MS;
    uv_timer_start(t, disco_cb, rt->search_ms, DISCOVER_MS);
  }
  if (!rt->peer) return;
  rt->discover_round++;
  for (int s = 0; s <= rt->run.stages; s++) {
    if (rt->stage_busy[s] || !wanted_stage(rt, s)) continue;
    dir_query *q = query_new(rt, s);
    if (!q) break;
    if (stage_dir_discover(rt->d, rt->run.name, (uint32_t)s, members_cb, q, now) == 0)
      rt->stage_busy[s] = true;
    else
      query_done(q);
  }
  if (train_peer_wants_replicas(rt->peer) && !rt->replica_query_busy) find_replica_holders(rt);
  known_sweep(rt);
  if (rt->acc.have_key && rt->run.private_run) train_access_sync_revocations(&rt->acc, rt->peer, now, &rt->log);
  if (train_peer_is_leader(rt->peer) && rt->run.stages > 0) publish_run(rt);
  node_relays *nr = node_get_relays(rt->n);
  bool relays_moved = nr && node_relays_generation(nr) != rt->relays_gen; /* our circuit addresses changed */
  /* A node listening on 0.0.0.0 learns the address it announces from its
   * peers (stage_dir_announce: GW_EAGAIN until then): a first node asks
   * again every round until it is announced. */
  if (rt->want_announce && (!rt->announced || relays_moved || now - rt->last_announce >= ANNOUNCE_MS)) announce(rt);
}

static int sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets) {
  train_rt *rt = ud;
  return train_dataset_sample(&rt->ds, rt->data_seed, iteration, index, rt->run.batch, rt->run.seq, inputs, targets);
}

static int val_sample(void *ud, uint32_t index, int32_t *inputs, int32_t *targets) {
  train_rt *rt = ud;
  return train_dataset_val_sample(&rt->val, index, rt->run.batch, rt->run.seq, inputs, targets);
}

/* The validation set: --eval-microbatches, by default the run's microbatches
 * per iteration (one iteration's forward work); fewer if the held-out tokens
 * hold fewer. */
static int open_validation(train_rt *rt) {
  const train_node_opts *o = rt->o;
  char err[512];
  if (train_validation_open(&rt->ds, o->val_dataset, o->val_fraction, &rt->val, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.dataset", "err=\"%s\"", err);
    return GW_EINVAL;
  }
  if ((int)rt->val.vocab_needed > rt->run.model.vocab_size) {
    GW_ERROR(&rt->log, "train.dataset", "err=\"the validation set needs a vocabulary of %u, the model has %d\"",
             rt->val.vocab_needed, rt->run.model.vocab_size);
    return GW_EINVAL;
  }
  uint32_t avail = train_dataset_val_count(&rt->val, rt->run.batch, rt->run.seq);
  uint32_t want = (uint32_t)(o->eval_microbatches > 0 ? o->eval_microbatches : rt->run.microbatches);
  rt->val_n = avail < want ? avail : want;
  if (rt->val.n_tokens > 0)
    GW_INFO(&rt->log, "validation.opened", "tokens=%zu train_tokens=%zu microbatches=%u eval_every=%llu",
            rt->val.n_tokens, rt->ds.n_tokens, rt->val_n, (unsigned long long)o->eval_every);
  if (rt->val.n_tokens > 0 && rt->val_n == 0)
    GW_WARN(&rt->log, "validation.empty", "msg=\"the held-out tokens hold no whole microbatch\"");
  return 0;
}

/* Microbatches in flight a stage must hold: a little more than the peer
 * admits, for releases still queued on the worker. */
static void spec_for_stage(const train_rt *rt, int s, stage_spec *spec) {
  int cap = s == 0 ? 2 * rt->run.microbatches + 4 : (int)(rt->capacity + rt->repair_reserve) + 4;
  train_run_stage_spec(&rt->run, s, cap, spec);
}

/* The capacity a relay offers: what its memory budget holds of the largest
 * stage's per-microbatch needs. */
static uint32_t derive_capacity(train_rt *rt, gpu_backend *be, size_t budget) {
  int best = INT_MAX;
  for (int s = 1; s <= rt->run.stages; s++) {
    stage_spec spec;
    rt->capacity = 1;
    spec_for_stage(rt, s, &spec);
    spec.capacity = 1;
    int c = stage_capacity_for(&spec, be, budget);
    if (c < best) best = c;
  }
  int most = 64 + REPAIR_RESERVE;
  return best <= 0 ? 1 : best > most ? (uint32_t)most : (uint32_t)best;
}

/* What the memory holds, split between the flows' slots and the repair
 * reserve: a repair's rebuilt microbatch must fit in memory like any other.
 * A small memory keeps every slot for the flows (a reserve of one would
 * cost a relay of 4 slots a quarter of its throughput to speed up repairs
 * that are rare); from REPAIR_RESERVE_MIN slots on, one goes to repairs. */
static void set_capacity_from_memory(train_rt *rt, uint32_t fits) {
  rt->repair_reserve = fits >= REPAIR_RESERVE_MIN ? REPAIR_RESERVE : 0;
  rt->capacity = fits - rt->repair_reserve > 64 ? 64 : fits - rt->repair_reserve;
}

/* Opens the device once at start to say what this node computes with
 * (device, threads, memory and the budget taken from it) and to size a
 * relay's capacity (unless --capacity says). A device that cannot be opened
 * stops the node here with the backend's reason, not at the first job. */
static int probe_compute(train_rt *rt, bool data) {
  gpu_device dev;
  gpu_backend *be = NULL;
  char err[512];
  gpu_options gopt = {.threads = rt->o->threads};
  if (gpu_device_parse(rt->o->device, &dev) != 0) return GW_EINVAL;
  int rc = gpu_backend_open(&dev, &gopt, &be, err, sizeof(err));
  if (rc != 0) {
    GW_ERROR(&rt->log, "compute.unavailable", "device=%s err=\"%s\"", rt->o->device, err);
    return rc;
  }
  size_t free_b = 0, total_b = 0;
  gpu_mem_info(be, &free_b, &total_b);
  gpu_device_info info = {0};
  gpu_device_info_get(be, &info);
  size_t budget = free_b / 10 * 8; /* leave a fifth for everything else */
  rt->budget_bytes = budget;
  rt->repair_reserve = REPAIR_RESERVE;
  if (data)
    rt->capacity = (uint32_t)rt->run.microbatches;
  else if (rt->o->capacity > 0)
    rt->capacity = (uint32_t)rt->o->capacity;
  else
    set_capacity_from_memory(rt, derive_capacity(rt, be, budget));
  char devname[GPU_DEVICE_STR_MAX];
  gpu_device_format(&be->dev, devname, sizeof(devname));
  GW_INFO(&rt->log, "compute.ready",
          "device=%s name=\"%s\" threads=%d mem_total_mb=%zu mem_free_mb=%zu budget_mb=%zu capacity=%u "
          "repair_reserve=%u%s",
          devname, info.name, be->threads, total_b >> 20, free_b >> 20, budget >> 20, rt->capacity, rt->repair_reserve,
          data || rt->o->capacity > 0 ? "" : " capacity_from=memory");
  gpu_backend_close(be);
  return 0;
}

/* What stage s's compute is built from. */
static int compute_args(train_rt *rt, int s, stage_spec *spec, gpu_device *dev, adamw_config *opt) {
  spec_for_stage(rt, s, spec);
  char err[256];
  if (stage_spec_validate(spec, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.bad_stage", "for_stage=%d err=\"%s\"", s, err);
    return GW_EINVAL;
  }
  if (gpu_device_parse(rt->o->device, dev) != 0) return GW_EINVAL;
  adamw_defaults(opt);
  opt->lr = (float)rt->run.lr;
  train_plan_log_node_stage(&rt->log, rt->o, s, spec, rt->budget_bytes);
  return 0;
}

/* The peer's shape and the checkpoint path follow the stage. */
static int stage_shape(train_rt *rt, int s, const stage_spec *spec) {
  train_shape shape = {rt->run.batch, rt->run.seq, rt->run.model.d_model, train_compute_n_params(spec)};
  train_peer_set_shape(rt->peer, &shape);
  return ckpt_run_path(rt->ckpt_path, sizeof(rt->ckpt_path), node_get_config(rt->n)->data_dir, rt->run.name, s);
}

static int start_compute(train_rt *rt, int s) {
  stage_spec spec;
  gpu_device dev;
  adamw_config opt;
  if (compute_args(rt, s, &spec, &dev, &opt) != 0) return GW_EINVAL;
  train_compute_init(&rt->compute, &spec, &dev, rt->o->threads, rt->run.seed, &opt);
  rt->compute_ready = true;
  return stage_shape(rt, s, &spec);
}

static void start_routing(train_rt *rt, int s);

/* The stage is known: compute, flows and the router follow. */
static void enter_stage(train_rt *rt, int s) {
  rt->stage = s;
  gw_log_set_stage(&rt->log, s);
  if (start_compute(rt, s) != 0) {
    stop_soon(rt);
    return;
  }
  start_routing(rt, s);
}

/* The leader moved us into another stage (train/peer_move.c): we leave the
 * directory of the old one, the worker swaps the compute once every job of
 * the old stage has run (a switch job queued behind them), and new flows
 * replace the old. The peer then restores the new stage's newest replica;
 * its RESTORE job runs after the switch. */
static void switch_stage(train_rt *rt, int s) {
  int old = rt->stage;
  if (rt->switching || compute_args(rt, s, &rt->switch_spec, &rt->switch_dev, &rt->switch_opt) != 0) {
    GW_ERROR(&rt->log, "stage.switch_failed", "from_stage=%d to_stage=%d", old, s);
    stop_soon(rt);
    return;
  }
  train_job *job = calloc(1, sizeof(*job));
  if (!job) {
    stop_soon(rt);
    return;
  }
  job->kind = TRAIN_JOB_RELEASE; /* never run as one: run_job knows the marker */
  job->owner = &rt->switch_marker;
  if (node_worker_submit(rt->worker, job) != 0) {
    free(job);
    stop_soon(rt);
    return;
  }
  rt->switching = true;
  rt->stage_gen++;
  GW_INFO(&rt->log, "stage.switch", "from_stage=%d to_stage=%d", old, s);
  if (rt->announced) stage_dir_withdraw(rt->d, rt->run.name, (uint32_t)old, now_ms(rt));
  rt->announced = false;
  rt->want_announce = false;
  rt->stage = s;
  gw_log_set_stage(&rt->log, s);
  stage_shape(rt, s, &rt->switch_spec);
  if (rt->flow) {
    flow_free(rt->flow);
    rt->flow = NULL;
  }
  start_routing(rt, s);
}

static void start_routing(train_rt *rt, int s) {
  if (rt->swarm_routing) {
    route_swarm_set_stage(rt->rs, s);
  } else {
    flow_config fc;
    flow_config_default(&fc);
    fc.self = node_identity(rt->n)->id;
    fc.role = s == 0 ? FLOW_DATA : FLOW_RELAY;
    fc.stage = s;
    fc.n_stages = rt->run.stages;
    fc.capacity = s == 0 ? rt->run.microbatches : (int)rt->capacity;
    fc.tun.tick_ms = rt->o->flow_tick_ms;
    fc.io = (gw_io){.ud = rt, .send = flow_send, .want_tick = flow_want_tick, .random = io_random};
    fc.log = &rt->log;
    if (flow_new(&fc, &rt->flow) != 0) {
      GW_ERROR(&rt->log, "flow.failed", "for_stage=%d", s);
      stop_soon(rt);
      return;
    }
    for (size_t i = 0; i < rt->n_known; i++) flow_add_peer(rt->flow, &rt->known[i].id, rt->known[i].stage);
    route_flow_attach(&rt->rf, rt->flow, s);
    flow_start(rt->flow, now_ms(rt));
  }
  uv_timer_start(&rt->cost_timer, cost_cb, 0, COST_MS);
}

static void on_peer_event(void *ud, const train_event *ev) {
  train_rt *rt = ud;
  switch (ev->kind) {
  case TRAIN_EV_STAGE_ASSIGNED:
    if (rt->stage < 0)
      enter_stage(rt, ev->stage);
    else if (ev->stage != rt->stage)
      switch_stage(rt, ev->stage);
    break;
  case TRAIN_EV_READY: announce(rt); break;
  case TRAIN_EV_CERTIFIED: train_access_save_cert(&rt->acc, rt->peer, &rt->log); break;
  case TRAIN_EV_LEADER_CHANGED:
    if (train_peer_is_leader(rt->peer)) {
      rt->run.leader = node_identity(rt->n)->id;
      publish_run(rt);
    } else if (gw_id_eq(&rt->run.leader, &node_identity(rt->n)->id)) {
      /* We published the record as its leader, and the DHT keeps
       * republishing it: replace it with one naming the new leader, which
       * readers skip (they take a record only from the leader it names). */
      train_peer_leader(rt->peer, &rt->run.leader);
      publish_run(rt);
    }
    break;
  case TRAIN_EV_ITERATION_DONE:
    if (rt->flow) {
      size_t flows, probed;
      double sum;
      route_flow_data_cost(&rt->rf, &flows, &probed, &sum);
      GW_INFO(&rt->log, "flows.cost", "iter=%llu flows=%zu probed=%zu sum=%.3f", (unsigned long long)ev->iteration,
              flows, probed, sum);
    }
    break;
  case TRAIN_EV_REPLICA_STORED: {
    stage_member me;
    my_record(rt, &me);
    train_replica_keep(rt->d, rt->run.name, rt->data_dir, rt->peer, ev->stage, &me, &rt->log, now_ms(rt));
    break;
  }
  case TRAIN_EV_REPLICA_DROPPED: {
    stage_member me;
    my_record(rt, &me);
    train_replica_drop(rt->d, rt->run.name, rt->data_dir, rt->peer, ev->stage, ev->iteration, &me, &rt->log,
                       now_ms(rt));
    break;
  }
  case TRAIN_EV_STAGE_LOST:
    /* our stage trained, its peers and every replica of it are gone: the
     * peer logged which (stage.lost); training on with fresh weights would
     * silently throw the run's work away */
    if (!rt->stopping) {
      node_set_exit_code(rt->n, 3);
      stop_soon(rt);
    }
    break;
  case TRAIN_EV_AGGREGATED:
    log_wire(rt, ev->iteration);
    if (train_replica_due(rt->peer, rt->o->replicate_every, ev->iteration)) {
      train_job *job = calloc(1, sizeof(*job));
      if (job) {
        job->kind = TRAIN_JOB_SNAPSHOT;
        job->owner = &rt->replica_marker;
        job->mb_id = rt->stage_gen;
        job->key = ev->iteration;
        memcpy(job->hash, ev->hash, sizeof(job->hash));
        if (node_worker_submit(rt->worker, job) != 0) free(job);
      }
    }
    if (rt->o->checkpoint_every > 0 && ev->iteration % (uint64_t)rt->o->checkpoint_every == 0) {
      train_job *job = calloc(1, sizeof(*job));
      if (job) {
        job->kind = TRAIN_JOB_SNAPSHOT;
        job->owner = &rt->ckpt_marker;
        job->mb_id = rt->stage_gen;
        job->key = ev->iteration;
        memcpy(job->hash, ev->hash, sizeof(job->hash));
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s", rt->ckpt_path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        gw_mkdir_p(dir, 0700);
        if (node_worker_submit(rt->worker, job) != 0) free(job);
      }
    }
    break;
  default: break;
  }
}

static void give_early_cert(void *ud, const gw_id *from, const uint8_t *body, size_t len) {
  train_rt *rt = ud;
  train_peer_on_message(rt->peer, from, GWTF__TRAIN_MSG__TRAIN_CERT, body, len, NULL, now_ms(rt));
}

static int start_peer(train_rt *rt) {
  const train_node_opts *o = rt->o;
  bool data = o->create_run || o->data;
  char err[512];
  if (data) {
    if (!o->dataset) {
      GW_ERROR(&rt->log, "train.config", "msg=\"a data node needs --dataset PATH\"");
      return GW_EINVAL;
    }
    if (train_dataset_open(o->dataset, &rt->ds, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.dataset", "err=\"%s\"", err);
      return GW_EINVAL;
    }
    rt->ds_open = true;
    if ((int)rt->ds.vocab_needed > rt->run.model.vocab_size) {
      GW_ERROR(&rt->log, "train.dataset", "err=\"the dataset needs a vocabulary of %u, the model has %d\"",
               rt->ds.vocab_needed, rt->run.model.vocab_size);
      return GW_EINVAL;
    }
    char desc[256];
    train_dataset_describe(&rt->ds, desc, sizeof(desc));
    GW_INFO(&rt->log, "dataset.opened", "path=%s desc=\"%s\"", o->dataset, desc);
    rt->data_seed = o->data_seed ? o->data_seed : (uint64_t)node_identity(rt->n)->id.b[0] << 8 | 0x5eed;
    if (open_validation(rt) != 0) return GW_EINVAL;
  }
  if (probe_compute(rt, data) != 0) return GW_EINVAL;
  if (node_worker_new(rt->loop, run_job, rt, on_job_done, rt, &rt->worker) != 0) return GW_EIO;
  rt->swarm_routing = strcmp(o->routing, "swarm") == 0;
  train_router router;
  route_flow_init(&rt->rf, rt->run.stages, &rt->log);
  route_flow_set_load(&rt->rf, next_load, rt);
  if (rt->swarm_routing) {
    rt->rs = route_swarm_new(data ? 0 : -1, rt->run.stages, (unsigned)rt->run.microbatches, ROUTE_SWARM_ALPHA);
    if (!rt->rs) return GW_ENOMEM;
    router = route_swarm_router(rt->rs);
  } else {
    router = route_flow_router(&rt->rf);
  }
  train_peer_config cfg = {0};
  cfg.self = node_identity(rt->n)->id;
  cfg.role = data ? TRAIN_DATA : TRAIN_RELAY;
  cfg.n_stages = rt->run.stages;
  cfg.stage = data ? 0 : -1;
  cfg.capacity = rt->capacity;
  cfg.shape = (train_shape){rt->run.batch, rt->run.seq, rt->run.model.d_model, 0};
  cfg.data_seed = rt->data_seed;
  cfg.iterations = data ? o->iterations : 0;
  cfg.recovery = rt->swarm_routing ? TRAIN_RECOVER_RESTART : TRAIN_RECOVER_PATH;
  train_tunables_default(&cfg.tun);
  cfg.tun.tick_ms = PEER_TICK_MS;
  cfg.tun.hop_timeout_ms = o->hop_timeout_ms;
  cfg.tun.live_rto_k = o->live_k;
  cfg.tun.live_floor_ms = o->live_floor_ms;
  cfg.tun.repair_reserve = rt->repair_reserve;
  cfg.tun.aggregate = o->aggregate;
  cfg.tun.no_validation = o->no_validation;
  cfg.tun.deterministic = o->deterministic;
  cfg.tun.byzantine = o->byzantine;
  cfg.tun.byzantine_scale = o->byzantine_scale;
  if (o->byzantine != TRAIN_BYZ_NONE)
    GW_WARN(&rt->log, "debug.byzantine", "mode=%s scale=%g msg=\"test tool: this peer misbehaves on purpose\"",
            train_byzantine_name(o->byzantine), o->byzantine_scale);
  cfg.wire_dtype = o->wire_dtype;
  cfg.wire_grad_dtype = o->wire_grad_dtype;
  cfg.wire_accept = o->wire_accept;
  cfg.initial_weights = o->create_run != NULL;
  cfg.movable = !data; /* switch_stage */
  cfg.tun.rebalance_after = (uint32_t)o->rebalance_after;
  cfg.tun.rebalance_margin = o->rebalance_margin;
  cfg.join_stage = o->join_stage <= rt->run.stages ? o->join_stage : 0;
  cfg.grant_join_stage = o->grant_join_stages;
  for (int s = 1; s <= rt->run.stages && s < (int)(sizeof(cfg.stage_layers) / sizeof(cfg.stage_layers[0])); s++) {
    int first, nl;
    train_run_stage_layers(&rt->run, s, &first, &nl);
    cfg.stage_layers[s] = (uint16_t)nl;
  }
  memcpy(cfg.node_pk, node_identity(rt->n)->pk, sizeof(cfg.node_pk));
  gw_id run_id; /* the run record's DHT key: every average's signature covers it */
  if (stage_dir_run_key(rt->run.name, &run_id) != 0) return GW_EINVAL;
  memcpy(cfg.run_id, run_id.b, sizeof(cfg.run_id));
  train_io io = {.ud = rt, .send = io_send, .want_tick = io_want_tick, .random = io_random,
                 .connected = io_connected, .compute = io_compute, .event = on_peer_event,
                 .peer_info = peer_info, .unix_s = io_unix_s, .redeem = io_redeem, .sign = io_sign,
                 .link = io_link, .probe = io_probe};
  int rc = train_peer_new(&rt->peer, &cfg, &io, &router, &rt->log);
  if (rc != 0) return rc;
  if (rt->run.private_run) {
    rt->acc.run = rt->run.name;
    rc = train_access_setup(&rt->acc, rt->peer, rt->run.run_key, o->join_token, o->join_token_len, &rt->log);
    if (rc != 0) return rc;
  }
  if (data) {
    train_peer_set_sampler(rt->peer, sample, rt);
    train_peer_set_validation(rt->peer, val_sample, rt, rt->val_n, o->eval_every);
    enter_stage(rt, 0);
  }
  if (!data) {
    char leader[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&rt->run.leader, leader);
    GW_INFO(&rt->log, "run.joining", "run=%s capacity=%u leader=%s access=%s", rt->run.name, rt->capacity, leader,
            rt->run.private_run ? (rt->acc.have_key ? "run_key" : o->join ? "invite" : "certificate") : "open");
    train_peer_set_leader(rt->peer, &rt->run.leader, now_ms(rt));
  }
  rt->started = true;
  train_peer_set_replica_store(rt->peer, (size_t)o->replica_max, 0);
  train_peer_start(rt->peer, now_ms(rt));
  if (rt->run.private_run) {
    /* Sessions that came up before the peer existed: what they presented
     * was kept (node/early_certs.h); ours goes to them now, asking for
     * theirs where we have none. */
    if (rt->early_certs.n)
      GW_DEBUG(&rt->log, "run.early_certificates", "peers=%zu", rt->early_certs.n);
    node_early_certs_replay(&rt->early_certs, give_early_cert, rt);
    gw_peer up[MAX_KNOWN];
    size_t n = p2p_host_peers(rt->host, up, MAX_KNOWN);
    if (n > MAX_KNOWN) n = MAX_KNOWN; /* it counts them all, fills at most MAX_KNOWN */
    for (size_t i = 0; i < n; i++) train_peer_on_peer_up(rt->peer, &up[i].id, now_ms(rt));
  }
  return 0;
}

/* The freshest record whose publisher is the leader it names. */
static void run_cb(void *ud, int status, const stage_run *runs, size_t n) {
  train_rt *rt = query_done(ud);
  if (!rt) return;
  rt->run_query_busy = false;
  if (status != 0 || rt->stopping) return;
  const stage_run *best = NULL;
  train_run best_info, info;
  char err[256];
  for (size_t i = 0; i < n; i++) {
    if (train_run_decode(runs[i].value, runs[i].len, &info, err, sizeof(err)) != 0) {
      GW_WARN(&rt->log, "run.bad_record", "err=\"%s\"", err);
      continue;
    }
    if (!gw_id_eq(&info.leader, &runs[i].publisher)) continue;
    /* the invite (or our copy of the run key) is the root of trust: a
     * record naming another key is someone else's run of that name */
    const uint8_t *want = rt->o->join ? rt->o->invite.run_key : rt->acc.have_key ? rt->acc.key.pk : NULL;
    if (want && (!info.private_run || memcmp(info.run_key, want, 32) != 0)) {
      char who[GW_ID_SHORT_LEN + 1];
      gw_id_to_short(&runs[i].publisher, who);
      GW_WARN(&rt->log, "run.bad_record", "publisher=%s err=\"%s\"", who,
              info.private_run ? "another run key than ours" : "an open run, where our invite is for a private one");
      continue;
    }
    if (!best || runs[i].remaining_ms > best->remaining_ms) best = &runs[i], best_info = info;
  }
  if (!best) {
    if (!rt->have_run) GW_INFO(&rt->log, "run.searching", "run=%s", rt->o->run ? rt->o->run : rt->o->create_run);
    return;
  }
  if (rt->have_run) {
    /* only the leader may change */
    if (!gw_id_eq(&best_info.leader, &rt->run.leader) && rt->peer) {
      rt->run.leader = best_info.leader;
      if (!rt->o->create_run && !rt->o->data) train_peer_set_leader(rt->peer, &rt->run.leader, now_ms(rt));
    }
    return;
  }
  if (best_info.private_run && !rt->o->join && !rt->acc.have_key &&
      !train_access_has_cert(rt->data_dir, best_info.name)) {
    GW_ERROR(&rt->log, "run.private",
             "run=%s msg=\"a private run: join it with --join TOKEN (gwtf invite on its creator) or --run-key FILE\"",
             best_info.name);
    node_stop(rt->n);
    rt->stopping = true;
    return;
  }
  rt->run = best_info;
  rt->have_run = true;
  char leader[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&rt->run.leader, leader);
  GW_INFO(&rt->log, "run.found", "run=%s model=%s stages=%d layers=%d d_model=%d leader=%s access=%s", rt->run.name,
          model_arch_name(rt->run.model.arch), rt->run.stages, rt->run.model.n_layers, rt->run.model.d_model,
          leader, rt->run.private_run ? "private" : "open");
  if (start_peer(rt) != 0) {
    node_stop(rt->n);
    return;
  }
  /* the stages' members (the leader among them) now, not at the next round */
  uv_timer_start(&rt->disco_timer, disco_cb, 0, DISCOVER_MS);
}

static int create_run(train_rt *rt) {
  const train_node_opts *o = rt->o;
  char err[512];
  train_run *r = &rt->run;
  memset(r, 0, sizeof(*r));
  if (model_preset_get(o->model, &r->model) != 0) {
    uint8_t *text = NULL;
    size_t len = 0;
    if (gw_file_read_all(o->model, 1 << 20, &text, &len) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"--model %s is neither a preset nor a readable JSON file\"", o->model);
      return GW_EINVAL;
    }
    model_preset_get("tiny", &r->model);
    int rc = model_config_from_json((const char *)text, len, &r->model, err, sizeof(err));
    free(text);
    if (rc != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"%s: %s\"", o->model, err);
      return rc;
    }
  }
  snprintf(r->name, sizeof(r->name), "%s", o->create_run);
  r->stages = o->stages;
  r->batch = o->batch;
  r->seq = o->seq;
  r->microbatches = o->microbatches;
  r->lr = o->lr;
  r->seed = o->seed;
  r->leader = node_identity(rt->n)->id;
  snprintf(r->dataset, sizeof(r->dataset), "%s", o->dataset ? o->dataset : "");
  if (!o->open_run) {
    /* private: the run key stays in our data dir (or where --run-key says) */
    char path[PATH_MAX];
    if (o->run_key)
      snprintf(path, sizeof(path), "%s", o->run_key);
    else
      run_access_path(rt->data_dir, r->name, "run.key", path, sizeof(path));
    if (run_access_load_key(path, true, &rt->acc.key, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"run key: %s\"", err);
      return GW_EINVAL;
    }
    rt->acc.have_key = true;
    r->private_run = true;
    memcpy(r->run_key, rt->acc.key.pk, sizeof(r->run_key));
  }
  if (train_run_validate(r, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.config", "err=\"%s\"", err);
    return GW_EINVAL;
  }
  int prc = train_plan_stages(&rt->log, o, r);
  if (prc != 0) return prc;
  rt->have_run = true;
  GW_INFO(&rt->log, "run.created",
          "run=%s model=%s stages=%d layers=%d d_model=%d microbatches=%d batch=%d seq=%d access=%s", r->name,
          model_arch_name(r->model.arch), r->stages, r->model.n_layers, r->model.d_model, r->microbatches, r->batch,
          r->seq, r->private_run ? "private" : "open");
  int rc = start_peer(rt);
  if (rc == 0) publish_run(rt);
  return rc;
}

/* ---- the component ---- */

static int comp_start(node *n, void **state) {
  const train_node_opts *o = node_get_config(n)->train;
  *state = NULL;
  if (!o) return 0;
  train_rt *rt = calloc(1, sizeof(*rt));
  if (!rt) return GW_ENOMEM;
  rt->n = n;
  rt->loop = node_loop(n);
  rt->o = o;
  flow_guard_init(&rt->guard);
  rt->log = *node_log(n);
  rt->host = node_host(n);
  rt->stage = -1;
  dht_runtime *drt = node_dht(n);
  if (!drt) {
    GW_ERROR(&rt->log, "train.config", "msg=\"training needs the DHT\"");
    free(rt);
    return GW_EINVAL;
  }
  rt->d = dht_runtime_dht(drt);
  rt->data_dir = node_get_config(n)->data_dir ? node_get_config(n)->data_dir : ".";
  rt->acc.data_dir = rt->data_dir;
  if (o->run_key && !o->create_run) {
    char err[512];
    if (run_access_load_key(o->run_key, false, &rt->acc.key, err, sizeof(err)) != 0) {
      GW_ERROR(&rt->log, "train.config", "err=\"--run-key: %s\"", err);
      free(rt);
      return GW_EINVAL;
    }
    rt->acc.have_key = true;
  }
  uv_timer_t *timers[] = {&rt->peer_timer, &rt->flow_timer, &rt->disco_timer, &rt->cost_timer, &rt->stop_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) {
    uv_timer_init(rt->loop, timers[i]);
    timers[i]->data = rt;
    rt->open_timers++;
  }
  *state = rt;
  int rc = o->create_run ? create_run(rt) : 0;
  if (rc != 0) return rc;
  uv_timer_start(&rt->disco_timer, disco_cb, 0, DISCOVER_MS);
  return 0;
}

static void timer_closed(uv_handle_t *h) {
  train_rt *rt = h->data;
  if (--rt->open_timers > 0) return;
  node *n = rt->n;
  free(rt);
  node_component_stopped(n);
}

static void comp_stop(node *n, void *state) {
  train_rt *rt = state;
  if (!rt) {
    node_component_stopped(n);
    return;
  }
  rt->stopping = true;
  for (size_t i = 0; i < MAX_QUERIES; i++) /* their callbacks free them */
    if (rt->queries[i]) rt->queries[i]->rt = NULL;
  if (rt->announced) stage_dir_withdraw(rt->d, rt->run.name, (uint32_t)rt->stage, now_ms(rt));
  node_worker_free(rt->worker); /* joins the compute thread before the stage goes */
  rt->worker = NULL;
  train_peer_free(rt->peer);
  node_early_certs_free(&rt->early_certs);
  rt->peer = NULL;
  train_access_wipe(&rt->acc);
  flow_free(rt->flow);
  rt->flow = NULL;
  route_swarm_free(rt->rs);
  if (rt->compute_ready) train_compute_free(&rt->compute);
  train_dataset_close(&rt->val); /* a view of ds unmaps nothing */
  if (rt->ds_open) train_dataset_close(&rt->ds);
  uv_timer_t *timers[] = {&rt->peer_timer, &rt->flow_timer, &rt->disco_timer, &rt->cost_timer, &rt->stop_timer};
  for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) uv_close((uv_handle_t *)timers[i], timer_closed);
}

/* A member whose session came back (a relay circuit replaced after its
 * relay died, a redial after a network blip) is a live neighbour for the
 * flow protocol again, with its link cost measured on the new session:
 * flows re-form through it instead of staying on the fallback route. */
static void comp_peer_up(void *state, const gw_peer *peer, bool back) {
  train_rt *rt = state;
  if (!rt || rt->stopping) return;
  /* a private run: our certificate first, on every new session */
  if (rt->peer) train_peer_on_peer_up(rt->peer, &peer->id, now_ms(rt));
  known_peer *k = rt->flow ? known_find(rt, &peer->id) : NULL;
  if (!k) return;
  if (k->stage == next_stage(rt) || k->stage == prev_stage(rt)) costs_soon(rt);
  if (!back) return;
  flow_add_peer(rt->flow, &k->id, k->stage);
  double c = link_cost(rt, &k->id);
  if (k->stage == next_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_NEXT, c);
  if (k->stage == prev_stage(rt)) flow_set_cost(rt->flow, &k->id, FLOW_DIR_PREV, c);
}

static void comp_peer_down(void *state, const gw_id *id, p2p_down_reason reason) {
  train_rt *rt = state;
  if (!rt || !rt->peer) return;
  rt->rf.now_ms = now_ms(rt);
  (void)reason;
  train_peer_on_peer_down(rt->peer, id, now_ms(rt));
}

static void comp_message(void *state, const gw_id *from, p2p_msg *msg) {
  train_rt *rt = state;
  if (!rt) return;
  if (!rt->peer) {
    if (msg->type == GWTF__TRAIN_MSG__TRAIN_CERT && !msg->data_len && !rt->stopping)
      node_early_certs_keep(&rt->early_certs, from, msg->body, msg->body_len);
    return;
  }
  uint64_t now = now_ms(rt);
  rt->rf.now_ms = now;
  if (msg->type == GWTF__MSG_TYPE__MSG_FLOW) {
    bool first;
    uint64_t dropped;
    if (!flow_guard_admit(&rt->guard, from, now, &first, &dropped)) {
      if (first) {
        char who[GW_ID_SHORT_LEN + 1];
        gw_id_to_short(from, who);
        GW_WARN(&rt->log, "flow.rate_limited", "peer=%s rate=%d burst=%d dropped=%llu", who, FLOW_GUARD_RATE,
                FLOW_GUARD_BURST, (unsigned long long)dropped);
      }
      return;
    }
    /* flows and placement are for members only (the same state as the
     * dispatcher's, train/peer_admit.c; refusals logged there) */
    if (!train_peer_admit(rt->peer, from, now)) return;
    if (rt->flow) {
      gw_peer p = {.id = *from};
      flow_on_message(rt->flow, &p, msg->body, msg->body_len, now);
    }
    return;
  }
  train_tensor t, *tp = NULL;
  if (msg->tensor || msg->data_len) {
    memset(&t, 0, sizeof(t));
    if (msg->tensor) {
      if (msg->tensor->ndim > 4) return; /* no training tensor has more dimensions */
      t.dtype = (train_dtype)msg->tensor->dtype;
      t.ndim = msg->tensor->ndim;
      for (uint32_t i = 0; i < t.ndim; i++) t.shape[i] = msg->tensor->shape[i];
    } else {
      t.dtype = TRAIN_U8;
    }
    t.data = msg->data;
    t.nbytes = msg->data_len;
    tp = &t;
  }
  train_peer_on_message(rt->peer, from, msg->type, msg->body, msg->body_len, tp, now);
}

const node_component train_component = {
    .name = "train",
    .type_lo = 200,
    .type_hi = 399,
    .start = comp_start,
    .stop = comp_stop,
    .peer_up = comp_peer_up,
    .peer_down = comp_peer_down,
    .message = comp_message,
};
