/* test/train/peer_harness.h — many training peers in one process on the
 * deterministic sim/ engine, with a tiny exact "model" instead of a
 * transformer, so that the protocol (forward, backward, repairs, aggregation,
 * joins, leader failover) can be tested at precise crash moments and its
 * arithmetic checked against a direct computation.
 *
 * The fake model: activations are (B,T,C) floats.
 *   data node  embed:  out[b,t,c] = tok[b,t]/256 * (1 + e0) + e1 * (c + 1)
 *              loss:   mean over all elements of (in - tgt[b,t]/256)^2
 *   relay      block:  out = in * (1 + w0) + w1
 * Every stage has two parameters; AdamW is replaced by w -= LR * avg_grad. */
#ifndef GWTF_TEST_PEER_HARNESS_H
#define GWTF_TEST_PEER_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "sim/sim.h"
#include "train/peer.h"

#define H_MAX_NODES 96
#define H_B 2
#define H_T 4
#define H_C 3
#define H_NP 2 /* parameters per stage */
#define H_LR 0.1f
#define H_JOB_MS 5 /* virtual compute time per job */

typedef struct h_state {
  uint64_t key;
  float *in;      /* relay: input kept for backward; data: tokens as floats */
  bool used;
} h_state;

typedef struct h_job {
  train_job *job;
  uint64_t done_at;
} h_job;

typedef struct h_harness h_harness;

typedef struct h_node {
  h_harness *h;
  int index;
  bool alive;
  gw_peer peer;
  train_peer *tp;
  train_role role;
  int stage;          /* as known to the harness (after STAGE_ASSIGNED) */
  uint32_t capacity;
  uint64_t job_ms;    /* virtual compute time of each of its jobs (0: H_JOB_MS): a slower device */
  uint64_t no_routes_from; /* data node: from this iteration on (if > 0) the router reports no route */
  uint32_t routes;         /* data node: routes the router reports (0: its capacity) */
  bool hidden_from[H_MAX_NODES]; /* node k's directory does not list it (while set) */
  /* its session to node k is not up before virtual ms sessions_until[k]
   * (0: always up): sends to k fail, k is not connected (a restarted peer's
   * sessions come up one by one) */
  uint64_t sessions_until[H_MAX_NODES];
  bool dir_blind;          /* its directory lists no other member of its own stage (the leader's ASSIGN does) */
  bool listed_early;       /* directories list it before it is ready (a restarted member's record outlives it) */
  float grad_scale;        /* hostile: exports its gradient times this (0: 1) */
  uint64_t grad_scale_from; /* grad_scale from this iteration on (0: from the start) */
  bool grad_nan;           /* hostile: exports NaN gradients */
  uint64_t hostile_every;  /* grad_scale / grad_nan only every this many iterations from
                              grad_scale_from on (0: every iteration) */
  bool bad_snapshot;       /* hostile: serves its weights + 1 to joiners (its own stay right) */
  bool unrouted;           /* the router never picks it (a driver's flows leave out revoked peers) */
  uint64_t unrouted_from;  /* unrouted from this iteration on (0: from the start) */
  uint64_t unrouted_until; /* no hop before this virtual ms (the sender's directory does not list its stage yet) */
  uint32_t dir_load;       /* the load its directory record announces (a snapshot: may be stale) */
  uint32_t in_flight, max_in_flight; /* data node: microbatches between embed and embed backward */
  bool ready;
  /* fake model */
  float w[H_NP], g[H_NP];
  h_state states[64];
  /* compute queue */
  h_job jobs[64];
  int n_jobs;
  uint64_t peer_tick_at;
  uint64_t jobs_done;
  uint64_t grads_in; /* TRAIN_GRAD messages delivered to it (it was picked to aggregate) */
  /* observations */
  uint8_t last_hash[32];
  uint64_t hash_iteration; /* iteration+1 of last_hash */
  double last_loss;
  uint64_t iterations_done;
  uint32_t last_done, last_deferred;
  /* per-iteration hashes, for the agreement check: hash_of[iter] */
  uint8_t hash_of[64][32];
  bool have_hash[64];
  double loss_of[64];
  double secs_of[64]; /* data node: each iteration's wall time (virtual s) */
  /* data node: validation before iteration i (TRAIN_EV_EVAL_DONE) */
  bool have_eval[65];
  double eval_loss_of[65];
  uint32_t eval_ok_of[65];
  int eval_states_held; /* compute states held by every node when an evaluation ended (max) */
  /* stage replicas (train/peer_replica.c) */
  uint32_t replicas_stored, replicas_dropped, replicas_pushed;
  bool stage_lost; /* TRAIN_EV_STAGE_LOST: as the restorer, or as the leader */
  /* FORWARD/BACKWARD tensors this node received, by dtype (index & 31), and their bytes */
  uint64_t act_recv[32], bwd_recv[32], act_recv_bytes; /* by dtype: FORWARD + BACKWARD, BACKWARD */
  /* its identity: peer.id is BLAKE2b-256 of pk; it signs its averages with sk */
  uint8_t pk[32], sk[64];
  /* failure detection (train_io.link/probe): a silent node is hung, not
   * crashed (its sessions stay up, nothing comes back) */
  bool silent;
  /* per peer (node index): anything heard from it, our RTT to it measured
   * by harness pings (RFC 6298 smoothing), a ping out since */
  uint64_t heard[H_MAX_NODES];
  double srtt[H_MAX_NODES], rttvar[H_MAX_NODES];
  uint64_t rtt_samples[H_MAX_NODES], ping_at[H_MAX_NODES];
} h_node;

/* Called before a node's job runs; return true to crash `crash` right then
 * (before the job completes). */
typedef bool (*h_job_hook)(h_harness *h, h_node *n, const train_job *job, int *crash);
/* Called for every message a peer sends (not for h_inject's), before it
 * enters the simulator: a test may h_inject others ahead of it. from and
 * to are node indices. */
typedef void (*h_send_hook)(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                            const train_tensor *t);

struct h_harness {
  sim *s;
  int n_stages;
  h_node nodes[H_MAX_NODES];
  int n_nodes;
  uint64_t seed;
  train_recovery recovery;
  train_tunables tun;
  h_job_hook hook;
  void *hook_ud;
  h_send_hook send_hook; /* (uses hook_ud too) */
  bool hook_fired;
  uint32_t sending; /* the train message type being sent, for a delay function */
  bool no_links;    /* give the peers no train_io.link/probe: fixed hop timeouts only */
  bool hook_silences; /* the job hook's victim goes silent (h_silence) rather than crash */
  bool tcp_order;     /* a crash reaches each peer after what the dead one had sent it, as over TCP
                         (default); false: at once, ahead of messages still on their way */
  /* stage replicas: the pusher of each stage pushes every replicate_every
   * aggregations to `replicas` holders (0: off); holders are told to every
   * peer as the DHT would (their stores) */
  int replicate_every;
  uint32_t replicas;
  size_t replica_max; /* the holders' bound (0: the default) */
  bool holders_outlive; /* a crashed holder stays listed, as its DHT record outlives it */
  bool movable;       /* relays take the leader's TRAIN_MOVE (train_peer_config.movable) */
  /* wire compression for the nodes h_add creates next (train_peer_config) */
  train_dtype wire_dtype, wire_grad_dtype;
  int subspace_k; /* subspace crossings of the toy model (H_C wide, vocabulary 256); 0: off */
  uint32_t wire_accept;
  /* test tool: the stage the nodes h_add creates next ask for in JOIN, and
   * whether data nodes (as the leader) grant it (train_peer_config) */
  int join_stage;
  bool grant_join_stage;
  gw_log_sink sink;
  gw_log log;
};

void h_init(h_harness *h, int n_stages, uint64_t seed, bool verbose);
void h_free(h_harness *h);
/* Adds a peer. stage >= 0 fixes it (data nodes: 0); -1 lets the leader place
 * it. initial: starts from the seeded init. Returns the node index. */
int h_add(h_harness *h, train_role role, int stage, uint32_t capacity, uint64_t iterations, bool initial);
void h_start(h_harness *h, int index);
/* The node stops; every other peer hears of it (its session drops) once
 * what the node had sent it has arrived, or at once without tcp_order. */
void h_crash(h_harness *h, int index);
/* The node hangs: it stops running and answering, but its sessions stay up
 * (nobody hears peer_down) — a failure only a missing answer reveals. */
void h_silence(h_harness *h, int index);
/* Runs until every live data node finished `iterations` or the deadline. */
bool h_run_until_finished(h_harness *h, uint64_t deadline_ms);
void h_run_for(h_harness *h, uint64_t ms);
/* Every peer's directory is looked up again now (a periodic DHT refresh;
 * otherwise only a start, a crash or a peer getting ready refreshes). */
void h_refresh(h_harness *h);
/* Sends a train message from node `from` to node `to` through the simulator,
 * as if `from`'s peer had sent it: what a hostile member could send. */
int h_inject(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len, const train_tensor *t);
/* The run ID every harness peer signs its averages under. */
const gw_id *h_run_id(void);
/* The live nodes of `stage` in node-ID order (lowest first: the stage's
 * aggregator); returns how many, at most max. */
int h_by_id(h_harness *h, int stage, int *out, int max);
/* Compute states (activations kept for a backward) node i holds. */
int h_states_held(const h_node *n);
/* Every live peer of every stage logged the same hash after each iteration. */
bool h_hashes_agree(h_harness *h, uint64_t iterations, char *why, size_t why_len);
/* The fake sampler (shared with the direct reference). */
int h_sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets);
/* The fake validation set (train_peer_set_validation's sampler). */
int h_val_sample(void *ud, uint32_t index, int32_t *inputs, int32_t *targets);

#endif
