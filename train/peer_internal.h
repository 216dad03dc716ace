/* train/peer_internal.h — state shared by the train/peer*.c files. Not a
 * public interface: everything outside train/ goes through train/peer.h. */
#ifndef GWTF_TRAIN_PEER_INTERNAL_H
#define GWTF_TRAIN_PEER_INTERNAL_H

#include "train/member.h"
#include "train/replica_store.h"
#include "train/peer.h"
#include "train/peer_ledger.h"
#include "train/peer_mb.h"
#include "train.pb-c.h"

#define PEER_MAX_CONTRIB 64

/* ---- membership ---- */

typedef struct peer_member {
  gw_id id;
  uint32_t capacity, load;
  double compute_ms;
  bool heard; /* only heard by HELLO: not (yet) in the stage directory */
  bool vouched; /* heard, and listed by a directory member's BEGIN_AGG */
} peer_member;

typedef struct peer_stage_view {
  peer_member *v;
  size_t n, cap;
} peer_stage_view;

/* ---- aggregation of one iteration ---- */

typedef struct agg_contrib {
  gw_id id;
  float *buf;
  uint32_t count;
  uint64_t received; /* floats */
  bool complete;
  bool rejected; /* failed validation: not waited for, not averaged */
  uint8_t hash[32]; /* of the floats, listed in the average */
} agg_contrib;

typedef enum agg_phase {
  AGG_IDLE = 0,
  AGG_EXPORT,    /* GRAD_EXPORT job running */
  AGG_COLLECT,   /* member: gradient sent, waiting for AVG; aggregator: collecting */
  AGG_APPLY,     /* APPLY / SKIP_STEP job running */
} agg_phase;

/* The aggregator's signature over an average (train/avg_sig.h), kept with
 * the average so every copy we send carries it unchanged. */
typedef struct peer_avg_sig {
  bool have;
  gw_id signer; /* BLAKE2b-256 of key */
  uint8_t key[32], hash[32], sig[64];
} peer_avg_sig;

/* An average whose first chunk passed its signature check, until its floats
 * are whole (and match the signed hash): its list becomes last_* then. */
typedef struct peer_avg_pending {
  gw_id from;
  peer_avg_sig sig;
  gw_id contributors[PEER_MAX_CONTRIB];
  uint8_t hashes[PEER_MAX_CONTRIB][32];
  uint32_t n_contributors;
  bool left_out; /* we contributed and it does not list us (agg.left_out once applied) */
} peer_avg_pending;

/* An average we applied, with its list and signature as it came, kept for
 * a peer we just served our state: it steps through the rounds its
 * download took (peer_avg_keep.c). */
#define PEER_KEEP_AVGS 8
typedef struct peer_avg_kept {
  uint64_t iteration;
  float *avg; /* NULL: an empty round (a skipped step) */
  uint32_t total_count;
  peer_avg_sig sig;
  gw_id contributors[PEER_MAX_CONTRIB];
  uint8_t hashes[PEER_MAX_CONTRIB][32];
  uint32_t n_contributors;
} peer_avg_kept;

typedef struct peer_agg {
  agg_phase phase;
  uint64_t iteration;
  gw_id aggregator;
  bool picked;        /* `aggregator` is this round's (else it is the last round's) */
  bool asked_applied; /* we took the round over and asked members for an average they applied */
  bool contributed;   /* our gradient went to `aggregator`, with hash my_hash */
  uint8_t my_hash[32];
  gw_id failed[PEER_MAX_CONTRIB]; /* aggregators that did not answer */
  uint32_t n_failed;
  float *mine;
  train_job *export_job; /* GRAD_EXPORT writing `mine`, until it ends */
  uint32_t my_count;
  agg_contrib contrib[PEER_MAX_CONTRIB];
  uint32_t n_contrib;
  float *avg;
  uint64_t avg_received;
  uint32_t avg_total_count;
  bool avg_has_tensor;
  uint64_t deadline;
  /* the last average we applied, to answer members that ask late */
  float *last_avg;
  uint64_t last_avg_iteration;
  uint32_t last_avg_total_count;
  bool have_last_avg;
  gw_id last_contributors[PEER_MAX_CONTRIB];
  uint8_t last_contrib_hashes[PEER_MAX_CONTRIB][32];
  uint32_t n_last_contributors;
  peer_avg_sig last_sig; /* the signature of last_avg, sent with every copy of it */
  peer_avg_kept kept[PEER_KEEP_AVGS]; /* the ones before it, oldest first (peer_avg_keep.c) */
  uint32_t n_kept;
  peer_avg_pending pend;  /* the average arriving now */
  /* agg.forged logged once per (peer, reason) */
  struct { gw_id id; const char *reason; } forged_logged[32];
  uint32_t n_forged_logged;
  gw_id applied_from; /* whose average we applied last (ourselves when we aggregated) */
  uint8_t last_hash[32]; /* our weights hash after the last round */
  /* we were collecting as aggregator and deferred to a lower one's
   * average: pass it on to those that contributed to us */
  bool pass_on;
  gw_id pass_to[PEER_MAX_CONTRIB];
  uint32_t n_pass_on;
  /* aggregator: the median norm per microbatch of recent rounds we averaged
   * (a reference for the norm check when a round has few contributions) */
  double norm_hist[8];
  uint32_t n_norm_hist, norm_hist_pos;
  /* stage-mates whose HELLO said they are fetching their state (joining) */
  struct { gw_id id; uint64_t at_ms; } joining[8];
  /* a directory member of our stage whose BEGIN_AGG for `iteration` did not
   * list us (its view lacks us; iteration + 1, 0: none) */
  struct { gw_id id; uint64_t iteration; } unlisted;
} peer_agg;

/* ---- joins and weight transfer ---- */

typedef struct peer_download {
  bool active;
  gw_id from;
  uint8_t *buf;
  uint64_t total, received;
  uint8_t hash[32];
  uint64_t step, iteration;
  uint64_t deadline, started_ms;
  gw_id tried[PEER_MAX_AVOID];
  uint32_t n_tried;
  uint64_t waiting_since;     /* no reachable source yet: waiting since */
  uint32_t assigned_members;  /* members the leader said the stage had */
  uint64_t done_ms;           /* the last download finished (from `from`, for `iteration`) */
  gw_id prefer;               /* resync after a split: the winning aggregator first */
  bool has_prefer;
  /* The stage ended one round while we fetched (`avg_from` sent us its
   * average of round avg_of - 1): once ready we ask it for it and step
   * with it (agg_ask_missed_average), rather than fetch again. A round
   * that only began (BEGIN_AGG) is waited for until wait_round_until. */
  bool catch_up;
  uint64_t catch_up_until; /* a stage-mate one round ahead is expected until then */
  uint64_t avg_of, wait_round_until;
  gw_id avg_from; /* who sent that average: our source, or its maker (a directory member) */
  gw_id avg_signer; /* who signed it, and the hash of its floats: the catch-up */
  uint8_t avg_hash[32]; /* must bring exactly that average */
} peer_download;

typedef struct peer_candidate {
  gw_id id;
  uint32_t capacity;
  double compute_ms;
  int want_stage; /* asked for in JOIN (--join-stage, a test tool; 0: none) */
} peer_candidate;

typedef struct peer_pending_snapshot {
  gw_id to;
  int stage; /* the stage it asked for */
  bool used;
  uint64_t not_before; /* rate limit: served no earlier (WEIGHTS_REQ_MIN_INTERVAL_MS) */
} peer_pending_snapshot;

/* ---- trust (peer_trust.c) ---- */

#define TRUST_MAX_OFFENDERS 64
/* A stage is never believed to be more than this many iterations ahead of
 * us: a far-future claim is a forgery or a peer gone wrong. */
#define TRUST_MAX_AHEAD 8
#define TRUST_MAX_LOGGED 128

typedef struct trust_offender {
  gw_id id;
  uint32_t rejections;   /* contributions rejected since its last ban */
  uint64_t banned_until; /* 0: not banned */
} trust_offender;

typedef struct trust_claim {
  gw_id id;
  uint64_t iteration, at_ms; /* a directory member of our stage said it is in `iteration` */
} trust_claim;

typedef struct peer_trust {
  trust_offender offenders[TRUST_MAX_OFFENDERS];
  uint32_t n_offenders;
  struct { gw_id id; uint32_t type; } logged[TRUST_MAX_LOGGED]; /* refusals logged once per (peer, type) */
  uint32_t n_logged;
  trust_claim claims[PEER_MAX_CONTRIB];
  uint32_t n_claims;
} peer_trust;

/* ---- a stage left behind (peer_behind.c) ---- */

typedef struct peer_behind {
  uint64_t iteration; /* the iteration of the latest offer past our next one this spell (0: none) */
  uint64_t since_ms, last_ms; /* the spell's first and latest such offer */
  /* the first microbatch of our next iteration we queued while in `next_of` (0: none) */
  uint64_t next_since_ms, next_of;
} peer_behind;

/* ---- private runs (peer_admit.c) ---- */

#define ADMIT_MAX_MEMBERS 512
#define ADMIT_MAX_PENDING 128
#define ADMIT_MAX_LOGGED 128
#define ADMIT_MAX_REDEEMED 256

typedef struct admit_member {
  gw_id id;
  uint64_t expires; /* unix seconds */
} admit_member;

typedef struct peer_admit {
  bool private_run;
  char run[MEMBER_RUN_MAX + 1];
  uint8_t run_key[MEMBER_PK_BYTES];
  bool have_sk;
  member_key key;
  uint64_t cert_ttl_s;
  uint8_t *my_cert; /* packed MemberCert for us; NULL until admitted */
  size_t my_cert_len;
  uint64_t my_issued, my_expires;
  uint8_t *token; /* a joiner's packed RunToken */
  size_t token_len;
  gw_id token_creator;
  uint64_t last_redeem_ms;
  bool token_refused; /* a holder refused the token for good: stop asking */
  admit_member members[ADMIT_MAX_MEMBERS]; /* certificates verified */
  uint32_t n_members;
  member_revocations revoked;
  uint8_t *revoked_bin;
  size_t revoked_len;
  /* directory members that have not presented a certificate yet: kept out
   * of the views, let in as soon as one verifies */
  struct { gw_id id; int stage; uint32_t capacity, load; uint64_t asked_ms; } pending[ADMIT_MAX_PENDING];
  uint32_t n_pending;
  /* peers we presented our certificate to in this session */
  gw_id presented[ADMIT_MAX_MEMBERS];
  uint32_t n_presented, presented_pos;
  /* refusals logged once per (peer, reason); certificate requests rate-limited */
  struct { gw_id id; const char *reason; uint64_t asked_ms, at_ms; } logged[ADMIT_MAX_LOGGED];
  uint32_t n_logged;
  /* redemptions counted in memory when the driver does not count them */
  struct { uint8_t invite[MEMBER_INVITE_ID_BYTES]; gw_id peer; } redeemed[ADMIT_MAX_REDEEMED];
  uint32_t n_redeemed;
} peer_admit;

/* ---- verified downloads (peer_verify.c) ---- */

typedef struct peer_verify {
  bool active;
  gw_id source;
  uint64_t iteration;
  uint8_t hash[32]; /* our weights after the restore */
  uint64_t deadline;
  gw_id agree[PEER_MAX_CONTRIB], disagree[PEER_MAX_CONTRIB];
  uint32_t n_agree, n_disagree;
  gw_id abstain[PEER_MAX_CONTRIB]; /* answered that they have no weights to compare yet */
  uint32_t n_abstain;
} peer_verify;

/* ---- wire compression (peer_wire.c) ---- */

#define PEER_WIRE_MAX 128 /* neighbours remembered; the least recently heard is forgotten */
#define PEER_HELLO_OWED_MAX 64 /* peers our HELLO goes to as we get ready (more wait for the periodic one) */

typedef struct peer_wire_link {
  gw_id id;
  uint32_t accept;  /* WIRE_BIT mask its HELLO said it accepts (always F32) */
  train_dtype want, want_grad; /* what it would like to send us: activations, gradients */
  /* negotiated: what we send it, what it sends us (activations, gradients) */
  train_dtype to, to_grad, from, from_grad;
  uint64_t at_ms;
} peer_wire_link;

/* ---- stage replicas (peer_replica.c) ---- */

#define REPLICA_MAX_INBOUND 4  /* pushes assembled at once; a fifth replaces the stalest */
#define REPLICA_MAX_HOLDERS 16 /* holders of our stage's replicas a restorer knows of */

typedef struct replica_inbound {
  bool used;
  gw_id from;
  int stage;
  uint64_t iteration, step, total, received, last_ms;
  uint8_t hash[32], weights_hash[32];
  uint8_t *buf;
} replica_inbound;

typedef struct peer_replicas {
  replica_store store;
  replica_inbound in[REPLICA_MAX_INBOUND];
  struct { gw_id id; uint64_t at_ms; } served[8]; /* REPLICA_REQ answered lately, one per requester per second */
  /* restorer: holders of our stage's replicas (the DHT's replica key) */
  train_replica_holder holders[REPLICA_MAX_HOLDERS];
  uint32_t n_holders;
  bool from_replica;          /* the download in progress comes from a holder, not a member */
  uint8_t want_hash[32];      /* the weights hash the stage logged for it (the holders' majority) */
  uint32_t want_votes;        /* holders announcing it in the DHT (0: the holder's chunk says it) */
  uint64_t want_iteration;    /* the run's iteration when we were placed */
  bool lost_logged;
  /* stage 0 outliving its data nodes (peer_stage0.c) */
  uint64_t run_iter_seen;     /* data node getting ready: the newest iteration relays of the run said they are in */
  bool s0_restored;           /* data node: stage 0 came from a replica, no iteration started since */
  bool s0_waiting_logged;
  bool data_seen, paused;     /* relay: a live data node was seen; none is live now (run.paused) */
  uint64_t paused_since;
  uint64_t no_data_since;     /* relay: no live data node in our view since (0: one is) */
  /* leader: stages seen without a live member (stage.empty logged once) */
  bool empty_logged[PEER_MAX_STAGES + 1];
  uint64_t empty_since[PEER_MAX_STAGES + 1]; /* 0: not empty */
  /* a relay the leader moves (peer_move.c): the move waits for the round to end */
  bool move_pending;
  int move_stage;
  uint64_t move_iteration, move_step;
  uint64_t move_after; /* a rebalancing move waits until our iteration reaches this (0: none) */
  gw_id move_peers[PEER_MAX_CONTRIB]; /* the new stage's members the leader named (download sources) */
  uint32_t n_move_peers;
} peer_replicas;

/* ---- live rebalancing (the leader, peer_rebalance.c) ---- */

#define REBALANCE_MAX_RATES 256

typedef struct peer_rate {
  gw_id id;
  int stage;         /* the stage its last HELLO named */
  double compute_ms; /* its forward+backward time per microbatch (0: not measured yet) */
  uint64_t at_ms;
} peer_rate;

typedef struct peer_rebalance {
  peer_rate rates[REBALANCE_MAX_RATES]; /* data nodes: relays' HELLO claims */
  uint32_t n_rates;
  int streak_stage;     /* the bottleneck of the last iterations ... */
  uint32_t streak;      /* ... for this many in a row, each with a move worth making */
  bool pending;         /* a move in flight: until `moving` says hello from `to` */
  gw_id moving;
  int from, to;
  uint64_t sent_ms;
  uint64_t cool_until;  /* no decision before this iteration */
  const char *waiting;  /* the reason last logged at info level (stage.rebalance_wait) */
} peer_rebalance;

/* ---- failure detection (peer_liveness.c) ---- */

#define LIVE_MAX_PEERS 64

typedef struct live_peer {
  bool used;
  gw_id id;
  double compute_ms;       /* its HELLO: forward + backward per microbatch */
  uint64_t full_ms;        /* it last said DENY full (0: never) */
  double hold_ms;          /* EWMA: how long one of our microbatches held a slot there (our FORWARD to
                              its gradient back; 0: none yet) */
  bool probing;
  uint64_t probe_sent_ms, probe_deadline, probe_heard; /* probe_heard: train_link.heard then */
  uint64_t answered_ms;    /* it last answered a probe */
  uint64_t failed_ms;      /* it left a probe unanswered (0: no, or heard from since) */
  uint64_t msg_ms;         /* a train message from it last arrived */
  uint64_t touched_ms;
} live_peer;

typedef struct peer_liveness {
  live_peer v[LIVE_MAX_PEERS];
} peer_liveness;

typedef enum live_verdict {
  LIVE_WAIT = 0, /* *deadline moved: a probe is out, or the peer answered one */
  LIVE_DEAD,     /* its session is gone, or it left a probe unanswered */
  LIVE_CAP,      /* the fixed hop timeout passed */
} live_verdict;

/* ---- the peer ---- */

typedef enum peer_state {
  PEER_UNASSIGNED = 0, /* waiting for the leader to place us */
  PEER_DOWNLOADING,    /* fetching the stage's weights */
  PEER_RESTORING,      /* RESTORE job running, then its hash checked with the stage (peer_verify.c) */
  PEER_READY,          /* training */
} peer_state;

struct train_peer {
  train_peer_config cfg;
  train_io io;
  train_router router;
  gw_log log;
  train_sample_fn sample;
  void *sample_ud;
  uint64_t now;

  peer_state state;
  int stage;
  uint64_t iteration;      /* the iteration we train (weights = after iteration-1 aggregations) */
  uint64_t step;           /* optimizer steps applied */
  bool aggregating;
  uint64_t missed_agg;     /* a BEGIN_AGG seen while downloading (+1; 0 = none) */
  uint64_t resync_target;  /* the iteration the rest of the run is in, when we were behind */
  uint64_t begin_agg_seen; /* highest BEGIN_AGG iteration flooded (+1) */
  uint64_t downstream_ready; /* highest CAN_TAKE iteration heard from downstream */
  uint64_t can_take_sent;    /* highest CAN_TAKE iteration sent upstream (+1) */
  uint64_t last_reflood_ms;

  peer_mb *mbs;
  size_t n_mbs;
  uint32_t held;            /* live microbatches here: never more than cfg.capacity (relays) */
  uint32_t bwd_count;       /* relays: backward passes done in `iteration` (aggregation weight) */

  peer_stage_view members[PEER_MAX_STAGES + 1];
  /* peers of our stage heard from by HELLO lately: members, though the
   * directory may not list them yet (a view without them would pick
   * another aggregator and split the stage's aggregation) */
  /* listed: the directory listed it at the refresh before (a member kept
   * across a refresh that drops it while its HELLOs come: peer.c) */
  struct { gw_id id; int stage; uint32_t capacity; uint64_t at_ms, vouched_ms; bool listed; } heard[PEER_MAX_CONTRIB];
  uint32_t n_heard;
  gw_id leader;
  bool have_leader;
  bool was_leader;

  /* data node: the iteration in progress */
  bool iter_running, iter_reported;
  bool iter_wrap_up; /* another data node finished this iteration: start nothing new */
  uint64_t iter_started_ms, last_progress_ms, last_update_ms;
  uint32_t iter_sent, iter_done, iter_deferred;
  double iter_loss_sum;
  uint64_t waiting_flows_since;
  bool flowless; /* data: the last iteration started on the fallback, no flow of ours having come */
  struct { uint64_t iteration; uint32_t index; } *backlog; /* deferred microbatches, oldest first */
  size_t n_backlog, cap_backlog;
  bool finished;

  /* data node: validation (peer_eval.c) */
  struct {
    train_val_fn fn;
    void *ud;
    uint32_t n;              /* validation microbatches */
    uint64_t every;          /* iterations between evaluations (0: never) */
    bool running;
    uint64_t iteration;      /* the evaluation running is the one before this iteration */
    uint64_t done_for;       /* iteration + 1 of the last evaluation (0: none yet) */
    uint32_t next, finished, ok; /* launched, ended, came back with a loss */
    float *loss;             /* per validation microbatch, summed in index order */
    bool *got;
    uint64_t started_ms;
  } eval;

  /* leader */
  gw_id iter_reports[PEER_MAX_CONTRIB];
  uint32_t n_iter_reports;
  uint64_t reports_iteration;
  peer_candidate candidates[PEER_MAX_CONTRIB];
  uint32_t n_candidates;
  /* placed but not yet announced in the directory: counted by placement
   * until they show up there (or PENDING_PLACEMENT_MS pass) */
  struct { gw_id id; int stage; uint32_t capacity; uint64_t at_ms; } placed[PEER_MAX_CONTRIB];
  uint32_t n_placed;
  uint64_t last_join_ms;

  peer_agg agg;
  peer_ledger ledger;
  peer_trust trust;
  peer_behind behind;
  peer_download dl;
  peer_admit admit;
  peer_verify verify;
  peer_replicas rep;
  peer_rebalance rebal;
  /* leader: JOINs seen lately, one per peer per JOIN_MIN_INTERVAL_MS */
  struct { gw_id id; uint64_t at_ms; } join_seen[PEER_MAX_CONTRIB];
  peer_pending_snapshot snap_queue[8];
  /* peers we recently sent our state to: they get our next average too,
   * though they are not in our view of the stage yet */
  struct { gw_id id; uint64_t at_ms; } served[8];
  bool snapshot_running;
  gw_id snapshot_for;

  uint64_t last_hello_ms;
  gw_id hello_owed[PEER_HELLO_OWED_MAX]; /* peer.c: up, or heard, before we were ready */
  uint32_t n_hello_owed;
  peer_wire_link wire[PEER_WIRE_MAX];
  uint32_t n_wire;
  uint8_t *wire_buf; /* encoded activations, reused (the driver copies what it sends) */
  size_t wire_buf_len;
  train_counters counters;
  peer_liveness live;
  bool closing; /* train_peer_free: no more jobs; the compute layer drops its own state */
  double wasted_reported; /* counters.wasted_seconds at the last aggregation.done */
};

/* peer.c */
int peer_send(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg,
              const train_tensor *tensor);
void peer_tensor_f32(train_tensor *t, const float *data, int B, int T, int C);
size_t peer_act_floats(const train_peer *p);
bool peer_alive(train_peer *p, const gw_id *id);
bool peer_in_view(const peer_stage_view *v, const gw_id *id);
peer_stage_view *peer_stage(train_peer *p, int stage);
void peer_broadcast_stage(train_peer *p, int stage, uint32_t type, const ProtobufCMessage *msg);
void peer_emit(train_peer *p, train_event_kind kind);
void peer_send_hellos(train_peer *p);
void peer_hello_to(train_peer *p, const gw_id *to);
void peer_hello_owed(train_peer *p);
/* `t` describes n floats at data as a 1-D f32 tensor (gradients, averages). */
void peer_tensor_1d(train_tensor *t, const float *data, size_t n);
void peer_short(const gw_id *id, char out[GW_ID_SHORT_LEN + 1]);
/* The first 8 bytes of a hash (an invite ID, a weights hash) in hex, for logs. */
void peer_hex8(const uint8_t *b, char out[17]);
/* Queues a job on the compute worker; for a microbatch's job, mb->job tracks
 * it until it ends. Returns the job, or NULL when it could not be queued. */
train_job *peer_submit(train_peer *p, train_job_kind kind, peer_mb *mb, const void *in, size_t in_bytes,
                       void *out, size_t out_bytes);
/* The job takes the buffers bufs[0..n) (NULLs skipped): they are freed once
 * it ends, so a job never outlives the memory it reads or writes. */
void peer_job_keep(train_job *job, void *const *bufs, size_t n);
/* The owner of a queued or running job gives up on it: its result will be
 * ignored (job->owner = NULL) and it keeps the owner's buffers bufs[0..n). */
void peer_job_abandon(train_job *job, void *const *bufs, size_t n);
void peer_release_key(train_peer *p, uint64_t key);
bool id_in(const gw_id *list, size_t n, const gw_id *id);
/* A member of `stage` in our view; dir_only: listed by the directory (or
 * the leader's ASSIGN), not only heard by HELLO. */
bool peer_is_member(train_peer *p, int stage, const gw_id *id, bool dir_only);
/* May aggregate our stage: us, a directory (or ASSIGN) member, or a peer
 * heard by HELLO that a directory member listed in its BEGIN_AGG. */
bool peer_vouched(train_peer *p, const gw_id *id);
void peer_vouch(train_peer *p, const gw_id *id);
void peer_vouch_view(train_peer *p, int stage, const gw_id *id);
/* Directory members of our stage other than us. */
size_t peer_dir_others(train_peer *p);
void id_from_bytes(gw_id *out, ProtobufCBinaryData b);
ProtobufCBinaryData id_bytes(const gw_id *id);

/* peer_data.c: the data node's iteration (its microbatches' trip: train/peer_mb.h) */
void data_tick(train_peer *p);
void data_start_iteration(train_peer *p);
/* Launches a completed microbatch of this iteration again, with `attempt`
 * (train/peer_ledger.c: a member on its path died with its gradient).
 * GW_EAGAIN: the iteration is over or wrapping up; GW_EEXIST: it runs. */
int data_rerun(train_peer *p, uint64_t id, uint32_t attempt);
bool data_routes_ready(train_peer *p, uint32_t want, uint32_t *slots);
uint32_t data_share(train_peer *p);

/* peer_liveness.c: failure detection from measured RTTs */
/* When to suspect `peer` if what we send it now is not answered: now +
 * max(floor, k x (srtt + 4 rttvar)) + work_ms (its compute first) + our
 * queue to it, at most cap; cap without an RTT. */
uint64_t live_deadline(train_peer *p, const gw_id *peer, double work_ms, uint64_t cap);
/* `peer` missed *deadline (waiting for `what` of microbatch mb_id): probes
 * it, or reads the outcome of the probe out. LIVE_WAIT moves *deadline (the
 * probe's, or a new one once it answered: slow, not dead). */
live_verdict live_check(train_peer *p, const gw_id *peer, uint64_t *deadline, uint64_t cap, double work_ms,
                        const char *what, uint64_t mb_id);
/* It answered a probe lately (and failed none since): slow, not dead. */
bool live_answered_lately(train_peer *p, const gw_id *peer);
/* The compute time its HELLO claims (0: unknown). */
double live_compute_ms(train_peer *p, const gw_id *peer);
void live_heard(train_peer *p, const gw_id *from); /* any train message from it */
void live_on_hello(train_peer *p, const gw_id *from, double compute_ms);
void live_note_full(train_peer *p, const gw_id *from); /* it said DENY full */
/* One of our microbatches held a slot at `peer` for ms (our FORWARD to its gradient back). */
void live_note_hold(train_peer *p, const gw_id *peer, double ms);
/* How long its DENY full keeps it a last resort for the fallback. */
uint64_t live_full_for_ms(const train_peer *p, const live_peer *e, uint32_t capacity);

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

/* peer_repair.c */
void repair_on_recover(train_peer *p, const gw_id *from, const Gwtf__TrainRecover *r);
void repair_begin(train_peer *p, peer_mb *mb, int suspect_stage, const gw_id *target);
void repair_on_probe(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void repair_on_probe_reply(train_peer *p, const gw_id *from, const Gwtf__TrainProbeReply *r);
void repair_on_repair(train_peer *p, const gw_id *from, const Gwtf__TrainRepair *r);
void repair_on_ready(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m);
void repair_tick(train_peer *p);
void repair_report(train_peer *p, peer_mb *mb);
void repair_restart_timed_out(train_peer *p, peer_mb *mb);

/* peer_agg.c */
void agg_on_begin(train_peer *p, const gw_id *from, const Gwtf__TrainIteration *m);
/* A stage-mate's HELLO says whether it is fetching its state (joining):
 * a joining member is neither waited for nor picked to aggregate. */
void agg_member_joining(train_peer *p, const gw_id *peer, bool joining);
/* Shared by the round (peer_agg.c) and the member's side of it (peer_avg.c). */
bool agg_i_aggregate(train_peer *p);
bool agg_joining_from(train_peer *p, const gw_id *from);
void agg_flood_begin(train_peer *p, uint64_t iteration);
void agg_enter_round(train_peer *p, uint64_t iteration, bool export);
/* Enters the round of our iteration and floods its BEGIN_AGG, as one
 * reaching us does (export: our gradient goes to the aggregator). */
void agg_begin_round(train_peer *p, bool export);
void agg_send_last_avg(train_peer *p, const gw_id *to);
void agg_send_avg(train_peer *p, const gw_id *to, const float *avg, uint32_t total_count, const gw_id *contributors,
                  uint8_t (*hashes)[32], uint32_t n_contributors, uint64_t iteration, const peer_avg_sig *sig);
/* peer_avg_keep.c: the average we applied last is about to be replaced:
 * kept while a peer we served lately may ask for it, else freed (last_avg
 * is NULL after). */
void avgkeep_push_last(train_peer *p);
/* A peer we served asks for the average of a round before our last: sent
 * if we kept it (true). */
bool avgkeep_answer(train_peer *p, const gw_id *to, uint64_t iteration);
void avgkeep_free(train_peer *p);
/* Steps with `avg` (NULL: an empty round, the step is skipped). */
void agg_apply_average(train_peer *p, const float *avg, uint32_t total_count);
/* Begins our round as a BEGIN_AGG would (peer_behind.c: the upstream is in
 * the next iteration and its BEGIN_AGG passed us by). */
void agg_begin_late(train_peer *p);
/* Who aggregates (train/peer_agg_who.c): the lowest live vouched member
 * still in the round (us included); whether a member is out of it (gave
 * up on it, waits for our state, or is joining); whether it failed us. */
gw_id agg_pick_aggregator(train_peer *p);
/* A member of lower ID than our round's aggregator was vouched for: switch to it (peer_agg.c). */
void agg_repick(train_peer *p);
bool agg_out_of_round(const train_peer *p, const gw_id *id);
bool agg_is_failed(const peer_agg *a, const gw_id *id);
/* Finishes our round as its aggregator once every awaited member is in. */
void agg_maybe_finish(train_peer *p);
/* Whether `from` is the aggregator of our stage's current round for us. */
bool agg_is_round_aggregator(train_peer *p, const gw_id *from);
/* The average of a member that left us out of its round while we
 * aggregate it, unless we joined lately: dropped (true), and the member no
 * longer waited for. */
bool agg_drop_unlisted_average(train_peer *p, const gw_id *from);
void agg_on_grad(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
void agg_on_avg(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t);
void agg_on_done_msg(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *d);
void agg_on_can_take(train_peer *p, const gw_id *from, uint64_t iteration);
void agg_on_resync(train_peer *p, const gw_id *from, uint64_t iteration);
void agg_try_can_take(train_peer *p);
void agg_job_done(train_peer *p, train_job *job);
void agg_tick(train_peer *p);
void agg_member_downloading(train_peer *p, const gw_id *peer);
void agg_abandon_round(train_peer *p);
void agg_peer_down(train_peer *p, const gw_id *peer);
void agg_free(train_peer *p);

/* Whether we may apply an average signed by `signer` that `from` delivered
 * (`from` passed the dispatcher's row: agg_is_round_aggregator). */
bool agg_accepts_signer(train_peer *p, const gw_id *from, const gw_id *signer);

/* peer_avgsig.c: averages signed by their aggregator (train/avg_sig.h) */
/* The aggregator signs the average it just made (last_avg and its list)
 * into a->last_sig; without io.sign it stays unsigned. */
void avgsig_sign_last(train_peer *p);
/* The signature fields of an average's first chunk. */
void avgsig_fill(const peer_avg_sig *s, Gwtf__TrainGrad *g);
/* An average's first chunk from `from`: its signature is present and valid
 * over its fields, and its signer is one we may follow for the round.
 * Fills *out. Logs (agg.forged) and returns false otherwise. */
bool avgsig_check(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, peer_avg_sig *out);
/* The average's floats (NULL, 0 for a skipped step) hash to what was
 * signed; logs (agg.forged reason=hash_mismatch) and returns false otherwise. */
bool avgsig_check_floats(train_peer *p, const gw_id *from, const peer_avg_sig *s, uint64_t iteration,
                         const float *v, size_t n);
/* Logs agg.forged once per (peer, reason) and counts it. */
void avgsig_refuse(train_peer *p, const gw_id *from, const gw_id *signer, uint64_t iteration, const char *reason);

/* agg_robust.c: the byzantine test tool corrupts our contribution (in
 * place) and returns the length it then claims */
size_t byz_corrupt(train_peer *p, float *v, size_t n);

/* peer_leader.c */
void data_on_iter_done(train_peer *p, const gw_id *from, const Gwtf__TrainIterDone *d);
void leader_on_leader(train_peer *p, const gw_id *from, const Gwtf__TrainLeader *l);
void leader_check(train_peer *p);
/* A peer we placed into an empty stage found no replica of it: if our view
 * agrees the stage is empty, the run stops (stage.lost). */
void leader_on_stage_lost(train_peer *p, const gw_id *from, const Gwtf__TrainStageLost *m);
void data_report_iteration(train_peer *p);

/* peer_trust.c: who may say what (the dispatcher's table), bans, evidence */
bool trust_admit(train_peer *p, const gw_id *from, uint32_t type);
void trust_refuse(train_peer *p, const gw_id *from, uint32_t type, const char *reason);
bool trust_banned(train_peer *p, const gw_id *id);
/* A contribution failed validation: logged, counted toward a ban. */
void trust_reject(train_peer *p, const gw_id *from, uint64_t iteration, const char *reason);
/* The aggregator checks the round's complete contributions (shape was
 * checked per chunk): finite, count, norm; marks the failures rejected. */
void trust_validate_round(train_peer *p);
/* A peer of our stage says it is in `iteration`, later than ours (HELLO,
 * BEGIN_AGG): resync once the evidence suffices (see peer_trust.c). */
void trust_claim_ahead(train_peer *p, const gw_id *from, uint64_t iteration, const char *why);
/* The lowest iteration a live directory member of our stage lately said it
 * is in past ours (one claim is enough: the caller has other evidence). */
bool trust_stage_ahead(train_peer *p, uint64_t *iteration);

/* peer_behind.c: upstream offers microbatches of an iteration past our next
 * one, or a catch-up's average never comes; a stage whose members all fell
 * behind moves on (behind_tick). */
void behind_note_future(train_peer *p, const gw_id *from, const gw_id *origin, uint64_t iteration);
void behind_note_next(train_peer *p); /* a microbatch of our next iteration was queued */
void behind_tick(train_peer *p);

/* peer_admit.c: membership of private runs */
/* Whether a message of `type` from `from` passes admission; logs and
 * counts a refusal. Called by trust_admit before the circle check. */
bool admit_check(train_peer *p, const gw_id *from, uint32_t type);
/* Before a message goes to `to`: our certificate first, once per session. */
void admit_before_send(train_peer *p, const gw_id *to, uint32_t type);
/* Whether `id` may be in our views (an open run: everyone). Directory
 * members that may not are remembered as pending. */
bool admit_view_filter(train_peer *p, int stage, const gw_id *id, uint32_t capacity, uint32_t load);
bool admit_is_member(train_peer *p, const gw_id *id);
void admit_on_cert(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c);
void admit_on_redeem(train_peer *p, const gw_id *from, const Gwtf__TrainRedeem *r);
void admit_on_admitted(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c);
void admit_on_revoked(train_peer *p, const gw_id *from, const Gwtf__TrainRevoked *r);
/* Joiners without a certificate redeem their token; holders renew theirs. */
void admit_tick(train_peer *p);
void admit_peer_up(train_peer *p, const gw_id *peer); /* a session came up: our certificate first */
void admit_peer_down(train_peer *p, const gw_id *peer);
void admit_free(train_peer *p);
/* Whether we may take part (open run, or we hold a valid certificate). */
bool admit_ready(train_peer *p);

/* peer_verify.c: a download is checked against the stage's word */
/* The restore of a download from `source` for `iteration` gave weights
 * `hash`: ask the stage. Returns true when verification is under way (the
 * peer becomes ready once it passes), false when there is nobody to ask. */
bool verify_begin(train_peer *p, const gw_id *source, uint64_t iteration, const uint8_t hash[32]);
void verify_on_hash_req(train_peer *p, const gw_id *from, uint64_t iteration);
void verify_on_hash(train_peer *p, const gw_id *from, const Gwtf__TrainAggDone *h);
void verify_tick(train_peer *p);

/* peer_wire.c: activation compression per link (train/wire_codec.h) */
void wire_fill_hello(const train_peer *p, Gwtf__TrainHello *h);
/* Returns true when the sender would like to compress and has not heard our
 * HELLO yet (as far as we know): answer it with ours at once, so that its
 * compression starts now rather than a HELLO period later. */
bool wire_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h);
/* Sends a FORWARD or BACKWARD with the activation (or gradient) `data`
 * (B x T x C floats) in the dtype negotiated with `to`. */
int wire_send_act(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg, const float *data);
/* An activation tensor we can take: a dtype we accept, the [B,T,C] shape
 * (Q8ROW, R*ROW: [B,T,row bytes]), exactly the bytes that needs, valid
 * row scales and padding. NULL when it is; otherwise why not, for the
 * train.malformed line ("missing", "dtype", "shape", "size", "rows"). */
const char *wire_act_refusal(const train_peer *p, const train_tensor *t);
/* Decodes a tensor that wire_act_refusal passed into new B x T x C floats (NULL:
 * out of memory). */
float *wire_act_decode(const train_peer *p, const train_tensor *t);
void wire_free(train_peer *p);

/* peer_replica.c */
void replica_on_push(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const train_tensor *t);
void replica_on_req(train_peer *p, const gw_id *from, const Gwtf__TrainReplicaReq *r);
void replica_tick(train_peer *p);
void replica_free(train_peer *p);
/* Restorer: a holder of our stage's newest replica we have not tried; false when none. */
bool replica_next_holder(train_peer *p, gw_id *out);

/* peer_move.c: the leader moves a relay of an over-provisioned stage into an empty one */
void move_on_move(train_peer *p, const gw_id *from, const Gwtf__TrainAssign *a);
void move_tick(train_peer *p);
void move_after_round(train_peer *p); /* our aggregation is done: a waiting move goes now */
/* peer_rebalance.c: the leader moves a relay into the bottleneck stage */
void rebalance_on_hello(train_peer *p, const gw_id *from, int stage, double compute_ms, bool joining);
void rebalance_hello_leader(train_peer *p, const Gwtf__TrainHello *h);
void rebalance_on_iteration(train_peer *p);
/* A live relay said within_ms ago, in its HELLO, that it serves `stage`
 * (data nodes keep every relay's latest claim). */
bool rebalance_heard_in_stage(train_peer *p, int stage, uint64_t within_ms);

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
/* Ready one round behind our source: asks it for that round's average. */
void agg_ask_missed_average(train_peer *p, const gw_id *from);
/* An average of our stage's reached us while we got ready (dl.avg_of). */
void join_on_source_average(train_peer *p);
/* A round applied: a joiner catching up asks for the next it missed. */
void join_round_applied(train_peer *p);
void join_free(train_peer *p);
void join_resync(train_peer *p, uint64_t target, const char *why);
/* A verified download (peer_verify.c): take the restored state. */
void join_accept_download(train_peer *p);
/* A refuted one: try another member. */
void join_refetch(train_peer *p);
void join_request_replica(train_peer *p, const gw_id *holder);
void join_stage_lost(train_peer *p);

/* peer_stage0.c: stage 0 outlives its data nodes. */
bool stage0_trained(train_peer *p);
bool stage0_fetch(train_peer *p);
void stage0_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h);
void stage0_tick(train_peer *p);
void peer_hello_stage(train_peer *p, int stage);

#endif
