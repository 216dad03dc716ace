/* train/peer.h — the training peer: microbatches along flows, crash repair,
 * within-stage aggregation, joins and leader failover (GWTF §IV, §V-B, §V-D,
 * §V-E), as a state machine.
 *
 * Like dht/ and flow/, the peer never touches a socket, a thread or the wall
 * clock. Its driver (node/train_runtime.c for real; test/train for in-process
 * simulations) hands it messages, ticks and finished compute jobs, and it acts
 * through a train_io: sends (body + optional tensor), compute jobs that run on
 * a worker thread, and events the driver turns into DHT announcements.
 *
 * Messages between two peers must arrive in the order they were sent (they
 * travel on one encrypted TCP session); across peers there is no order.
 *
 * Two policies are pluggable:
 *   - the router picks next hops: GWTF flows (train/route_flow.c) or SWARM's
 *     stochastic wiring (train/route_swarm.c);
 *   - the recovery mode: GWTF repairs a broken backward along the stored path
 *     (only the lost stage recomputes); SWARM restarts the microbatch from its
 *     data node.
 *
 * The journey of one microbatch (origin D, path D → R1 → R2 → R3 → D):
 *   FORWARD(act)   D→R1, R1→R2, R2→R3, R3→D; each receiver answers its sender
 *                  with FORWARD_RECEIVED on arrival and FORWARD_DONE once its
 *                  own output is held by the next peer (no answer in time,
 *                  DENY or a lost session: the sender re-routes to another
 *                  peer of that stage).
 *   loss           D computes the loss and the gradient of R3's output.
 *   BACKWARD(grad) D→R3, R3→R2, R2→R1, R1→D; each receiver answers with
 *                  BACKWARD_RECEIVED on arrival and BACKWARD_DONE once its
 *                  own gradient is held by the peer before it. Until then the
 *                  sender keeps the gradient it sent, and every peer keeps the
 *                  output it produced, so a gap can be rebuilt even when a
 *                  peer dies with its result still in its send queue.
 *   repair         a sender without BACKWARD_DONE reports RECOVER to D; D
 *                  probes the path, finds the last live peer L before the gap
 *                  and the first live peer F after it, and asks L (REPAIR) to
 *                  re-send its stored output to replacements of the lost
 *                  stage(s); the last replacement tells F (REPAIR_READY), and F
 *                  re-sends its stored gradient. Nothing before the gap is
 *                  recomputed.
 * Aggregation: when every data node reported ITER_DONE, the leader floods
 * BEGIN_AGG front to back; each stage's members send their gradient sums to
 * the stage's lowest live vouched node ID (directory, ASSIGN, or a directory
 * member's BEGIN_AGG list: never a peer that only said HELLO), which averages them weighted by
 * microbatches (in node-ID order, so the result is bit-identical everywhere)
 * and sends the average back; every member steps its optimizer and logs its
 * weight hash, and tells the stage before it CAN_TAKE; the next iteration
 * starts once stage 1 has stepped (a later stage still stepping holds its
 * microbatches until it has).
 */
#ifndef GWTF_TRAIN_PEER_H
#define GWTF_TRAIN_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/model.h"
#include "util/addr.h"
#include "util/log.h"

typedef struct train_peer train_peer;

typedef enum train_role { TRAIN_DATA = 1, TRAIN_RELAY = 2 } train_role;

typedef enum train_recovery {
  TRAIN_RECOVER_PATH = 0,    /* GWTF §V-D: rebuild the gap, resume from the stored gradient */
  TRAIN_RECOVER_RESTART = 1, /* SWARM: restart the microbatch from its data node */
} train_recovery;

/* ---- tensors on the wire ---- */

/* Values are gwtf.DType's. F16, BF16, Q8ROW, R*ROW and LR* carry compressed
 * activations and activation gradients between stages (train/wire_codec.h);
 * weights and aggregation always travel as F32. */
typedef enum train_dtype {
  TRAIN_F32 = 1,
  TRAIN_F16 = 2,
  TRAIN_BF16 = 3,
  TRAIN_I32 = 4,
  TRAIN_U8 = 6,
  TRAIN_Q8ROW = 7, /* int8 with one float scale per row: shape [.., cols + 4] bytes */
  TRAIN_R4ROW = 8,  /* rotated 4-bit rows (train/wire_rot.h): shape [.., 2 + cols/2] bytes */
  TRAIN_R3ROW = 9,  /* rotated 3-bit rows: [.., 2 + ceil(3 cols / 8)] bytes */
  TRAIN_R2ROW = 10, /* rotated 2-bit rows: [.., 2 + ceil(cols / 4)] bytes */
  TRAIN_LR8 = 11,   /* column mean + rank-8 int8 factors (train/wire_lowrank.h): shape [bytes] */
  TRAIN_LR16 = 12,  /* the same, rank 16 */
  TRAIN_LR32 = 13,  /* the same, rank 32 */
  TRAIN_LR32R4 = 14, /* rank 32 with rotated 4-bit factor rows */
  TRAIN_R5ROW = 15,  /* rotated 5-bit rows: [.., 2 + ceil(5 cols / 8)] bytes */
  TRAIN_LR16R4 = 16, /* rank 16 with rotated 4-bit factor rows */
} train_dtype;

typedef struct train_tensor {
  train_dtype dtype;
  uint32_t ndim;
  uint64_t shape[4];
  const void *data;
  size_t nbytes;
} train_tensor;

/* ---- compute jobs (run on the driver's worker thread) ---- */

typedef enum train_job_kind {
  TRAIN_JOB_EMBED = 1,        /* data: tokens [B,T] -> out [B,T,C]                       */
  TRAIN_JOB_FORWARD,          /* relay: in [B,T,C] -> out [B,T,C], keeps state for key   */
  TRAIN_JOB_LOSS,             /* data: in [B,T,C], targets -> loss, grad_in [B,T,C];     */
                              /*       accumulates head gradients                        */
  TRAIN_JOB_BACKWARD,         /* relay: grad_out -> grad_in, accumulates, frees key      */
  TRAIN_JOB_EMBED_BACKWARD,   /* data: grad [B,T,C] -> accumulates embedding gradients   */
  TRAIN_JOB_RELEASE,          /* drop the state kept for key (no gradient)              */
  TRAIN_JOB_GRAD_EXPORT,      /* copy the accumulated gradient sum into out (n_params)   */
  TRAIN_JOB_APPLY,            /* optimizer step with gradient `in`, zero grads, hash     */
  TRAIN_JOB_SKIP_STEP,        /* no microbatches anywhere: zero grads, hash              */
  TRAIN_JOB_SNAPSHOT,         /* serialize the stage state (weights, optimizer, step)    */
  TRAIN_JOB_RESTORE,          /* load a serialized state, hash                          */
  /* validation (train/peer_eval.c): forward only, nothing kept, no gradient */
  TRAIN_JOB_EVAL_EMBED,       /* data: tokens [B,T] -> out [B,T,C]                       */
  TRAIN_JOB_EVAL_FORWARD,     /* relay: in [B,T,C] -> out [B,T,C]                        */
  TRAIN_JOB_EVAL_LOSS,        /* data: in [B,T,C], targets -> loss                       */
} train_job_kind;

#define TRAIN_JOB_MAX_ORPHANS 6

typedef struct train_job {
  train_job_kind kind;
  uint64_t key;     /* microbatch state key (origin-and-id hash) */
  uint64_t mb_id;   /* the microbatch's ID, for logs (0 when none) */
  const void *in;   /* input tensor or token ids */
  const int32_t *targets;
  void *out;        /* output buffer, owned by the peer */
  size_t in_bytes, out_bytes;
  /* results, filled by the worker */
  int rc;
  float loss;
  double seconds;   /* compute time, for cost estimates and wasted-compute accounting */
  uint8_t hash[32]; /* APPLY, SKIP_STEP, RESTORE: weights hash; SNAPSHOT: state hash */
  void *blob;       /* SNAPSHOT: malloc'd serialized state (the peer frees it) */
  size_t blob_len;
  void *owner;      /* the peer's bookkeeping; NULL once the peer abandoned the job */
  /* --deterministic, LOSS / BACKWARD / EMBED_BACKWARD: the job's own
   * gradient is added into this (n_params floats, the peer's; see
   * train/grad_capture.h); NULL: accumulate as usual. */
  float *grad_part;
  /* LOSS / BACKWARD / EMBED_BACKWARD of a ledger re-run on a stage that
   * holds its gradient already: the job's weight gradient is dropped (the
   * stage's sum is as before the job); its outputs are as usual. */
  bool drop_grad;
  /* Buffers the peer let go of while this job still reads or writes them
   * (its microbatch or round was abandoned): they live until the job ends
   * and are freed with it, by train_job_free. */
  void *orphans[TRAIN_JOB_MAX_ORPHANS];
} train_job;

/* Frees a job with its blob and its orphaned buffers. Whoever holds a job the
 * peer will never see again (a worker shutting down) frees it with this. */
void train_job_free(train_job *job);

/* ---- routing policy ---- */

typedef struct train_router {
  void *ctx;
  /* Next hop for a microbatch of `origin` at this peer. A data node passes
   * from = NULL and slot = the microbatch's position in the iteration; a relay
   * passes the peer it came from and the flow id it came with (in_flow, 0 if
   * none). Peers in avoid[] must not be chosen. Returns 0 with *out and
   * *out_flow (the id to send with; 0 if none) set, or GW_ENOENT. */
  int (*next_hop)(void *ctx, const gw_id *origin, const gw_id *from, uint32_t slot, uint64_t in_flow,
                  const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow);
  /* How many microbatches this data node can start now (its routes). */
  uint32_t (*slots)(void *ctx);
  /* Whether the routes have settled (may be NULL: always). A data node's
   * first iteration waits for it, up to tunables.settle_ms. */
  bool (*settled)(void *ctx, uint64_t now_ms);
  /* A peer failed to answer or its session dropped. */
  void (*peer_failed)(void *ctx, const gw_id *peer);
  /* A peer answered DENY: it cannot take more work for now (may be NULL). */
  void (*peer_denied)(void *ctx, const gw_id *peer);
  /* A peer finished a hop in ms (SWARM's response-time average). */
  void (*observe)(void *ctx, const gw_id *peer, double ms);
} train_router;

/* ---- events for the driver ---- */

typedef enum train_event_kind {
  TRAIN_EV_STAGE_ASSIGNED = 1, /* announce in the stage directory */
  TRAIN_EV_LEADER_CHANGED,     /* (data nodes) the run record names the leader: republish it */
  TRAIN_EV_READY,              /* weights in place, taking microbatches */
  TRAIN_EV_AGGREGATED,         /* weights changed: checkpoint if due */
  TRAIN_EV_ITERATION_DONE,     /* a data node finished an iteration (summary fields set) */
  TRAIN_EV_EVAL_DONE,          /* a data node evaluated the validation set: iteration (weights after
                                  that many steps), loss (mean over `done` microbatches, NaN when
                                  none), done, deferred (= not evaluated), seconds */
  TRAIN_EV_CERTIFIED,          /* private run: we got a (new) certificate: keep it (train_peer_certificate) */
  TRAIN_EV_REPLICA_STORED,     /* we hold a new replica of `stage` at `iteration` (hash: its weights hash):
                                  persist it (train_peer_replica) and announce it */
  TRAIN_EV_REPLICA_DROPPED,    /* the replica of `stage` at `iteration` was dropped (bound): remove it */
  TRAIN_EV_STAGE_LOST,         /* our stage had trained, no member is left and no replica of it exists:
                                  the run cannot go on without training on fresh weights: stop */
} train_event_kind;

typedef struct train_event {
  train_event_kind kind;
  int stage;
  uint64_t iteration;
  gw_id leader;
  uint8_t hash[32];
  /* TRAIN_EV_ITERATION_DONE */
  double loss, seconds;
  uint32_t done, deferred;
} train_event;

/* What the session to a neighbour measured (train_io.link): the train layer
 * reads no clock or socket, so failure detection gets its RTTs from here. */
typedef struct train_link {
  double srtt_ms, rttvar_ms; /* smoothed RTT and its mean deviation (RFC 6298) */
  uint64_t rtt_samples;      /* 0: no RTT measured yet */
  uint64_t heard;            /* grows whenever anything (a byte, a pong) arrives from the peer */
  double queue_ms;           /* our bytes queued to it, at its measured rate: a probe waits behind them */
} train_link;

typedef struct train_io {
  void *ud;
  int (*send)(void *ud, const gw_id *to, uint32_t type, const uint8_t *body, size_t len,
              const train_tensor *tensor);
  void (*want_tick)(void *ud, uint64_t at_ms);
  void (*random)(void *ud, void *buf, size_t len);
  /* Is there a live session to this peer right now? */
  bool (*connected)(void *ud, const gw_id *peer);
  /* Queue a job on the worker; its completion comes back through
   * train_peer_on_job_done on the driver's thread. */
  int (*compute)(void *ud, train_job *job);
  void (*event)(void *ud, const train_event *ev);
  /* What a neighbour said about itself in its HELLO: the cost model's
   * compute time of that peer (may be NULL). */
  void (*peer_info)(void *ud, const gw_id *peer, int stage, uint32_t capacity, double compute_ms);
  /* Private runs: the wall clock in unix seconds, for certificate and
   * invite expiry (may be NULL: the peer's clock / 1000, for simulations). */
  uint64_t (*unix_s)(void *ud);
  /* Private runs, on a holder of the run key: `peer` redeems invite `id`
   * that allows `uses` peers (0: unlimited). Returns 0 when it may (the
   * same peer again counts once; the driver persists the count) or
   * GW_EFULL when the invite is used up. NULL: counted in memory. */
  int (*redeem)(void *ud, const uint8_t id[16], uint32_t uses, const gw_id *peer);
  /* Signs msg with our node identity key (Ed25519, detached, 64 bytes into
   * sig): an aggregator signs its averages (train/avg_sig.h). May be NULL:
   * then our averages go unsigned, and members refuse them. */
  void (*sign)(void *ud, const uint8_t *msg, size_t len, uint8_t sig[64]);
  /* Failure detection (train/peer_liveness.c); both may be NULL, then a
   * peer is presumed dead only at the fixed hop timeouts. link: fills *out
   * for a peer with a live session (false: none). probe: a keepalive round
   * trip to the peer now (its answer shows in link's `heard`). */
  bool (*link)(void *ud, const gw_id *peer, train_link *out);
  void (*probe)(void *ud, const gw_id *peer);
} train_io;

/* ---- configuration ---- */

/* How the aggregator of a stage combines its round's contributions. Both
 * are computed once, at the aggregator, and sent as one vector, so every
 * member applies the same bits. */
typedef enum train_aggregate {
  TRAIN_AGG_MEAN = 0,    /* sum of gradient sums / microbatches (bit-identical to train-ref) */
  TRAIN_AGG_TRIMMED = 1, /* coordinate-wise trimmed mean of per-microbatch gradients */
} train_aggregate;

/* A test tool (`gwtf node --byzantine MODE`): a relay that corrupts what it
 * sends as its aggregation contribution, or lies about its costs, so that
 * tests can show what the defences (validation, trimmed mean, cost clamps)
 * save. Never set in a real run. */
typedef enum train_byzantine {
  TRAIN_BYZ_NONE = 0,
  TRAIN_BYZ_NAN,         /* every value NaN */
  TRAIN_BYZ_SCALE,       /* multiplied by byzantine_scale */
  TRAIN_BYZ_RANDOM,      /* uniform noise in [-1, 1] per coordinate */
  TRAIN_BYZ_WRONG_SHAPE, /* half the vector, announced as that length */
  TRAIN_BYZ_LYING_COSTS, /* HELLO claims a near-zero compute time and the largest capacity */
} train_byzantine;

/* Parses "nan", "scale=K", "random", "wrong-shape", "lying-costs" (0, or
 * GW_EINVAL); *scale is set for scale=K. */
int train_byzantine_parse(const char *s, train_byzantine *mode, double *scale);
const char *train_byzantine_name(train_byzantine mode);

/* Every timing constant is a tunable; the defaults suit a local swarm of small
 * models (set them from measured costs for real runs). */
typedef struct train_tunables {
  uint64_t tick_ms;              /* housekeeping period (default 100) */
  uint64_t hop_timeout_ms;       /* no FORWARD_DONE/BACKWARD_DONE by then: peer presumed dead (5000);
                                    with measured RTTs, the cap of the deadlines below */
  double live_rto_k;             /* a hop's deadline: k x (srtt + 4 rttvar) + the hop's compute (4;
                                    0: fixed hop timeouts only) */
  uint64_t live_floor_ms;        /* ... and never under this, nor a probe's (500): a session stalls that
                                    long under load (a pong waits behind what the peer sent first) */
  uint64_t probe_timeout_ms;     /* repair probes (1000) */
  uint64_t agg_timeout_ms;       /* waiting for a stage member's gradient or the average (10000) */
  uint64_t stall_timeout_ms;     /* an iteration with no progress defers what is left (60000) */
  uint64_t hello_period_ms;      /* HELLO to neighbours (2000) */
  uint64_t settle_ms;            /* the first iteration waits this long at most for flows (15000) */
  uint64_t flow_grace_ms;        /* later, a data node with no flow waits this long, then routes by fallback (1000) */
  uint32_t max_repairs;          /* per break of a microbatch's path before it is declared lost (4) */
  uint32_t max_reroutes;         /* per hop before DENY goes upstream (4) */
  uint32_t repair_reserve;       /* relays: microbatches admitted over capacity when they rebuild a
                                    repair's gap (1): a repair denied "full" re-routes, a round trip
                                    each, and was most of the grid's slowest repairs */
  uint32_t slot_wait;            /* relays: microbatches kept waiting for our next free slot when their
                                    sender found our stage full (2; 0: DENY full at once, as before
                                    2026-12-07; train/peer_relay.c) */
  size_t chunk_bytes;            /* gradient / weight transfer chunk (4 MiB) */
  double norm_k;                 /* a contribution's norm per microbatch may be at most norm_k x the
                                    round's median (10) */
  bool no_validation;            /* tests only: take contributions unchecked, to show what the checks save */
  bool no_widen;                 /* tests only: an iteration keeps the width it started with (peer_data.c) */
  bool late_gap_report;          /* tests only: a relay reports a lost upstream peer only once its gradient
                                    is due, as before 2026-11-27 (train/peer_repair.c) */
  bool place_by_flows;           /* tests only: the leader ranks stages by the flows through them alone, as
                                    before 2026-11-28, not by the data nodes' demand (train/peer_place.c) */
  bool can_take_waits_downstream; /* tests only: a relay says CAN_TAKE only once every stage after it has
                                    stepped, as before 2026-11-28 (train/peer_agg.c) */
  bool move_to_short;            /* the leader moves a relay into a stage that has fewer slots than the data
                                    nodes' microbatches from one with slots to spare (train/peer_rebalance.c) */
  bool move_drops_held;          /* tests only: a moved relay leaves with what it holds, as before
                                    2026-11-28 (an older peer; train/peer_move.c, peer_relay.c) */
  train_aggregate aggregate;     /* how the aggregator combines the round's contributions (mean) */
  double trim_fraction;          /* trimmed mean: drop floor(f x m) of the m contributions at each end,
                                    per coordinate (0.2) */
  train_byzantine byzantine;     /* tests only: misbehave this way (none) */
  double byzantine_scale;        /* TRAIN_BYZ_SCALE: multiply our contribution by this (100) */
  bool deterministic;            /* --deterministic: per-microbatch gradients summed in microbatch-ID
                                    order (train/peer_ledger.h), bit for bit train-ref's (false) */
  bool rerun_lost;               /* --rerun-lost: a data node re-runs a completed microbatch whose
                                    gradient died with a member (false; implied by deterministic) */
  /* Live rebalancing (the leader, train/peer_rebalance.c): a relay is moved
   * into the bottleneck stage once the same move would have raised the
   * bottleneck's rate by more than rebalance_margin for rebalance_after
   * iterations in a row (3; 0: never), and no other move follows for
   * rebalance_after iterations after it landed. */
  uint32_t rebalance_after;
  double rebalance_margin;       /* 0.2 */
} train_tunables;

void train_tunables_default(train_tunables *t);

typedef struct train_shape {
  int B, T, C;        /* microbatch activation shape */
  size_t n_params;    /* parameters of this peer's stage part */
} train_shape;

typedef struct train_peer_config {
  gw_id self;
  train_role role;
  int n_stages;         /* relay stages 1..n_stages; data nodes are stage 0 */
  int stage;            /* relays: -1 until assigned (or a fixed stage); data nodes: 0 */
  uint32_t capacity;    /* relays: microbatches held at once; data nodes: microbatches per iteration */
  train_shape shape;    /* the driver fills n_params once the stage is known (train_peer_set_shape) */
  /* Subspace crossings (the run record's subspace, train/subspace.h):
   * subspace_k 0 is off; model and seed are the run's (U and the table). */
  int subspace_k, subspace_refresh;
  model_config model;
  uint64_t seed;
  uint64_t data_seed;   /* data nodes: sampling seed */
  uint64_t iterations;  /* data nodes: stop after this many (0 = forever) */
  train_recovery recovery;
  train_tunables tun;
  bool initial_weights; /* this peer may start from its seeded init (the run's first members) */
  bool movable;         /* the driver can switch this relay's stage at run time: the leader may move it
                           into a stage left empty (TRAIN_MOVE, train/peer_move.c) */
  int join_stage;       /* relays, test tool: ask the leader for this stage in JOIN (0: its choice) */
  bool grant_join_stage; /* data nodes, test tool: as the leader, place a joiner in the stage it asks for
                            (else the wish is ignored: a peer must not choose the stage it attacks) */
  uint16_t stage_layers[65]; /* blocks of each relay stage 1..n_stages (0: unknown, taken as equal): the
                                rebalancer scales a relay's speed by them when it moves it */
  /* Wire compression of activations and their gradients (--wire-dtype):
   * what we would like to send (0 = F32), and the set of dtypes we accept
   * (WIRE_BIT mask, train/wire_codec.h; 0 = every one this build decodes).
   * HELLO carries both; we send a neighbour wire_dtype only once it said it
   * accepts it, else F32. wire_grad_dtype: the same for the gradients we
   * send backward (0 = wire_dtype). */
  train_dtype wire_dtype;
  train_dtype wire_grad_dtype;
  uint32_t wire_accept;
  /* Averages are signed (train/avg_sig.h): our node key's public half
   * (self is BLAKE2b-256 of it; io.sign signs with its secret half) and the
   * run's ID, which every signature covers (the node uses the run record's
   * DHT key, BLAKE2b-256 of "run/NAME"). */
  uint8_t node_pk[32];
  uint8_t run_id[32];
} train_peer_config;

/* Data nodes draw their microbatches through this callback (train/data.h). */
typedef int (*train_sample_fn)(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs,
                               int32_t *targets);

int train_peer_new(train_peer **out, const train_peer_config *cfg, const train_io *io,
                   const train_router *router, const gw_log *log);
void train_peer_free(train_peer *p);
void train_peer_set_sampler(train_peer *p, train_sample_fn fn, void *ud);
/* Validation (data nodes; train/peer_eval.c): before iteration i starts, for
 * i = 0, every, 2*every, ... and once more after the last iteration, the
 * data node runs the n validation microbatches fn draws (the same ones each
 * time) forward through the pipeline without gradients and logs their mean
 * loss (eval.done). every = 0 or n = 0: never. */
typedef int (*train_val_fn)(void *ud, uint32_t index, int32_t *inputs, int32_t *targets);
void train_peer_set_validation(train_peer *p, train_val_fn fn, void *ud, uint32_t n, uint64_t every);
/* Called once the stage is known (n_params depends on it). */
void train_peer_set_shape(train_peer *p, const train_shape *shape);

/* ---- driver inputs ---- */

void train_peer_start(train_peer *p, uint64_t now_ms);
void train_peer_on_message(train_peer *p, const gw_id *from, uint32_t type, const uint8_t *body, size_t len,
                           const train_tensor *tensor, uint64_t now_ms);
void train_peer_on_tick(train_peer *p, uint64_t now_ms);
void train_peer_on_job_done(train_peer *p, train_job *job, uint64_t now_ms);
/* A stage member as the driver sees it: from the DHT stage directory record
 * (capacity, and load = flows it carries) and the live sessions. */
typedef struct train_member {
  gw_id id;
  uint32_t capacity, load;
} train_member;

/* Replaces the driver's view of a stage's live members. */
void train_peer_set_members(train_peer *p, int stage, const train_member *members, size_t n, uint64_t now_ms);
void train_peer_on_peer_down(train_peer *p, const gw_id *peer, uint64_t now_ms);
/* The leader named in the run record (or by a TRAIN_LEADER message). */
void train_peer_set_leader(train_peer *p, const gw_id *leader, uint64_t now_ms);

/* ---- private runs (train/peer_admit.c, train/member.h) ----
 *
 * In a private run every train message from a peer without a valid
 * membership certificate is refused (`run.refused peer=... reason=
 * no_certificate|expired|revoked`, once per peer and reason), except the
 * admission messages that carry their own proof (TRAIN_CERT, TRAIN_REDEEM,
 * TRAIN_ADMITTED, TRAIN_REVOKED). A peer presents its certificate before
 * the first message it sends to another; a joiner without one redeems its
 * invite token with a holder of the run key (the leader, the creator).
 * Directory members without a certificate stay out of every view until
 * they present one. */
typedef struct train_membership {
  char run[65];
  uint8_t run_key[32];          /* the run's public key (the run record's, the token's) */
  bool have_sk;                 /* we hold the run key: we issue certificates */
  uint8_t sk[64];
  const uint8_t *token;         /* a joiner: the packed RunToken (member_token_to_bin) */
  size_t token_len;
  const uint8_t *cert;          /* a certificate we already hold (may be NULL) */
  size_t cert_len;
  uint64_t cert_ttl_s;          /* holders: lifetime of the certificates they issue (0: 30 days) */
} train_membership;

/* Makes the run private (call before train_peer_start). Copies m. Returns 0,
 * GW_EINVAL (a certificate that is not ours) or GW_ENOMEM. */
int train_peer_set_membership(train_peer *p, const train_membership *m);
/* A signed revocation list (packed RunRevocations) from the run record or
 * the creator's data dir; a newer one replaces the list, revoked members
 * are dropped from every view at once. Returns 0 or a negative error. */
int train_peer_set_revocations(train_peer *p, const uint8_t *list, size_t len, uint64_t now_ms);
/* The newest revocation list we hold (packed RunRevocations) and its
 * sequence number; false when none. A holder of the run key keeps it in
 * its data dir, so `gwtf revoke` there builds on it. */
bool train_peer_revocations(const train_peer *p, const uint8_t **list, size_t *len, uint64_t *seq);
/* A session to `peer` came up: present our certificate. */
void train_peer_on_peer_up(train_peer *p, const gw_id *peer, uint64_t now_ms);
/* Whether messages from `peer` are taken (always in an open run). The
 * driver asks it for flow messages; a refusal is logged like the
 * dispatcher's. */
bool train_peer_admit(train_peer *p, const gw_id *peer, uint64_t now_ms);
/* Before the driver sends its own messages (flow) to peer: presents our
 * certificate first when we have not yet. */
void train_peer_present(train_peer *p, const gw_id *peer);
/* Whether `peer` presented a valid certificate (always true in an open
 * run); no logging: for the driver's choices (flows, link costs). */
bool train_peer_member(train_peer *p, const gw_id *peer);
/* Our certificate (packed MemberCert); false when we hold none. */
bool train_peer_certificate(const train_peer *p, const uint8_t **cert, size_t *len);
/* Whether we hold a valid certificate (always true in an open run). */
bool train_peer_certified(const train_peer *p);

/* ---- stage replicas (train/peer_replica.c, train/replica_store.h) ----
 *
 * Every K aggregations the member of a relay stage that aggregated the
 * round pushes the stage's serialised state to R peers outside the stage,
 * the ones closest (XOR) to the stage's replica key among those it knows,
 * so a state outlives every peer of its stage. Holders keep a bounded
 * store and announce what they hold under the replica key; a peer placed
 * into a stage that has no live member fetches the newest replica from
 * them (hash-checked against the weights hash the stage logged). */
struct replica_entry;

typedef struct train_replica_holder {
  gw_id id;
  uint64_t iteration, step;  /* the newest replica of the stage it announced */
  uint8_t weights_hash[32];  /* the hash the stage logged at that aggregation */
} train_replica_holder;

/* Bounds of the replicas this peer holds for other stages (0: defaults). */
void train_peer_set_replica_store(train_peer *p, size_t max_entries, uint64_t max_bytes);
/* Whether we push our stage's replica after the round that just ended: we
 * aggregated it (one member per stage, the same one everyone agreed on). */
bool train_peer_replica_pusher(const train_peer *p);
/* Pushes a snapshot of our stage taken right after the aggregation that
 * made `iteration` (weights_hash: what that aggregation logged) to the
 * `replicas` live peers outside our stage closest to `key`. Returns how
 * many it went to. */
int train_peer_push_replica(train_peer *p, const gw_id *key, uint32_t replicas, const void *blob, size_t len,
                            uint64_t iteration, uint64_t step, const uint8_t weights_hash[32]);
/* The newest replica of `stage` we hold (NULL: none); valid until the next
 * call into the peer. */
const struct replica_entry *train_peer_replica(const train_peer *p, int stage);
/* The holders of our stage's replicas the driver found in the DHT. */
void train_peer_set_replica_holders(train_peer *p, const train_replica_holder *h, size_t n, uint64_t now_ms);
/* Whether we are looking for a source of our stage's state (the driver
 * then looks up the replica holders). */
bool train_peer_wants_replicas(const train_peer *p);

/* ---- queries ---- */

/* The dtype of the activations (grad false) or gradients (grad true) we
 * send to `peer` (F32 until its HELLO said it accepts our wire_dtype or
 * wire_grad_dtype), and of those it sends us (F32 until its HELLO said what
 * it would like to send and we accept it). The driver's link costs use
 * their sizes: towards a next-stage peer our activations go and its
 * gradients come back; towards a previous-stage peer the reverse. */
train_dtype train_peer_wire_to(const train_peer *p, const gw_id *peer, bool grad);
train_dtype train_peer_wire_from(const train_peer *p, const gw_id *peer, bool grad);

int train_peer_stage(const train_peer *p);
uint64_t train_peer_step(const train_peer *p); /* optimizer steps our weights have taken */
uint64_t train_peer_iteration(const train_peer *p);
bool train_peer_is_leader(const train_peer *p);
/* The leader we know of; false when none yet. */
bool train_peer_leader(const train_peer *p, gw_id *out);
bool train_peer_finished(const train_peer *p); /* data node: ran cfg.iterations */

typedef struct train_counters {
  uint64_t forward_computed, forward_recomputed; /* recomputed: forwards done as part of a repair */
  uint64_t backward_computed;
  uint64_t forward_rerouted, denies_sent, denies_received;
  uint64_t backward_recoveries, lost_microbatches, deferred_microbatches;
  uint64_t repairs_started; /* data: repairs begun (a microbatch may need more than one) */
  uint64_t repair_denies;   /* relays: a repair's re-sent forward we turned away (any reason) */
  uint64_t repair_reserve_used; /* relays: repairs we took with every flow slot held */
  uint64_t slot_waits;          /* relays: microbatches that waited here for a free slot */
  uint64_t gaps_reported_early; /* relays: the peer before us lost before our gradient was due */
  uint64_t gaps_rebuilt_ahead;  /* relays: ... and replaced (REPAIR_READY) before it was */
  uint64_t forwards_at_risk;    /* relays: a next hop we had passed a microbatch on to lost before its backward;
                                   data: such reports taken on */
  uint64_t forwards_restarted;  /* data: at-risk microbatches that did not come back in time, sent again */
  uint64_t walks_stepped_on_death; /* data: repair walks that went past a peer that died before answering */
  uint64_t repair_targets_lost;    /* data: repairs past a repaired gap whose target died with the gradient it was to re-send */
  uint64_t microbatches_done;
  uint64_t microbatches_widened; /* data: started mid-iteration because the pipeline grew (peer_data.c) */
  double compute_seconds, wasted_seconds;
  double microbatch_seconds; /* relays: of FORWARD and BACKWARD jobs only */
  uint64_t aggregations;
  /* trust: messages refused by the dispatch table (or as evidence), contributions
   * rejected by validation, bans, resyncs started */
  uint64_t messages_refused, contributions_rejected, peers_banned, resyncs;
  uint64_t contributions_clipped; /* scaled down to a bound no median of three backed (agg.clipped) */
  uint64_t banned_by; /* TRAIN_BANNED received: a peer refuses our messages (run.banned_by) */
  /* private runs: messages refused for want of a certificate, certificates
   * issued (holders) and verified; downloads refuted by the stage's hashes */
  uint64_t admissions_refused, certs_issued, certs_verified, downloads_refuted;
  uint64_t verify_timeouts; /* downloads accepted unconfirmed because a member we asked never answered */
  uint64_t splits_healed; /* a lower vouched aggregator's average overrode the one we applied */
  uint64_t aggregator_repicks; /* a lower member was vouched for mid-round and we switched to it */
  /* activations and gradients sent (FORWARD, BACKWARD): tensors, payload
   * bytes on the wire, and what they would have taken as fp32 */
  uint64_t wire_tensors, wire_bytes, wire_f32_bytes;
  /* of those, sent as fp32 before the receiver's HELLO said what it
   * decodes (a session just up), though we want another dtype */
  uint64_t wire_early_tensors, wire_early_bytes;
  uint64_t signatures_checked; /* certificates and tokens whose signature we checked */
  uint64_t rounds_left_out; /* we contributed, and the average we applied did not list us */
  uint64_t rounds_deferred; /* we would have aggregated, and followed another member's average instead (agg.deferred) */
  /* averages: signed as aggregator; refused (agg.forged) by the dispatcher (not from
   * the round's aggregator), by the checks of peer_avgsig.c (unsigned, a bad
   * signature, a signer we do not follow, floats that do not match the signed
   * hash) or because they misstate our contribution */
  uint64_t averages_signed, averages_forged;
  uint64_t averages_late; /* a stage-mate's copy of an average after our round was over (agg.late_copy) */
  /* exactly once (train/peer_ledger.h): microbatches a member accumulated
   * twice or an aggregator found listed twice in a round (duplicates), in
   * the iteration's ledger but in no contribution (missing), listed but
   * deferred by their data node (extra); rounds averaged exactly
   * (--deterministic) */
  uint64_t ledger_duplicates, ledger_missing, ledger_extra, ledger_exact_rounds;
  uint64_t ledger_reruns; /* data, --rerun-lost or --deterministic: microbatches run again for a member that died */
  uint64_t ledger_recovered; /* aggregator, --deterministic: missing, but a dead member had shared it */
  uint64_t iterations_skipped; /* a stage left behind moved on without the steps between (peer_behind.c) */
  uint64_t downloads_stale; /* the stage aggregated while we fetched: fetched again */
  uint64_t downloads_caught_up; /* rounds it ended meanwhile whose averages we asked for and stepped with instead */
  uint64_t states_kept; /* a resync's fetch given up for the state it kept: the stage's newest left (weights.kept_own) */
  /* failure detection (train/peer_liveness.c): peers probed after missing an
   * RTT-based deadline, and probes left unanswered (the peer declared failed) */
  uint64_t probes_sent, probes_failed;
} train_counters;

const train_counters *train_peer_counters(const train_peer *p);

/* A next-stage peer's load as we see it, for a router choosing a next hop
 * by cost and load (train/route_flow.h's fallback). */
typedef struct train_load {
  uint32_t outstanding; /* our microbatches holding one of its slots (sent, or passed on and not back) */
  uint32_t capacity;    /* its announced slots (0: unknown) */
  double compute_ms;    /* its HELLO: forward + backward per microbatch (0: unknown) */
  double queue_ms;      /* our bytes queued to it, at the link's measured rate (train_io.link) */
  bool full;            /* it said DENY full lately */
} train_load;
/* Fills *out; -1 when the peer is gone (no session, or it failed a probe
 * and was not heard from since): not a next hop. */
int train_peer_next_load(train_peer *p, const gw_id *peer, train_load *out);
/* What our HELLO claims as compute time (ms per forward + backward): the
 * mean over every job so far, 0 before the first. */
double train_peer_compute_ms(const train_peer *p);
/* The same of forward and backward jobs only (0: none yet). */
double train_peer_mb_compute_ms(const train_peer *p);

#endif
