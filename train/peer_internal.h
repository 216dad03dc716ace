/* train/peer_internal.h — the core the train/peer*.c files share: the
 * peer's state (struct train_peer and the types of every module's part of
 * it) and train/peer.c's helpers. Each module declares its functions in a
 * header next to its .c, which includes this one: train/peer_data.h,
 * peer_agg.h, peer_join.h, peer_leader.h, peer_trust.h, peer_admit.h,
 * peer_repair.h, peer_replica.h, peer_liveness.h, peer_wire.h (and
 * peer_mb.h, peer_ledger.h, whose types struct train_peer holds). Not a
 * public interface: everything outside train/ goes through train/peer.h. */
#ifndef GWTF_TRAIN_PEER_INTERNAL_H
#define GWTF_TRAIN_PEER_INTERNAL_H

#include "train/member.h"
#include "train/replica_store.h"
#include "train/subspace.h"
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
  bool clipped;  /* scaled down to the round's norm bound (trust_validate_round) */
  uint8_t hash[32]; /* clipped: of the floats as sent, which the average lists */
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
  /* every aggregator our gradient went to this round (a repick sends it
   * again): each one's average was made with it, and is ours to apply */
  gw_id sent_to[4];
  uint32_t n_sent_to;
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
  /* gradients for rounds we have not reached yet (peer_agg_early.c) */
  struct { agg_contrib c; uint64_t iteration; bool used; } early[8];
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
  uint64_t source_gone_ms; /* the catch-up's source was first seen gone (0: not) */
  uint64_t avg_of, wait_round_until;
  gw_id avg_from; /* who sent that average: our source, or its maker (a directory member) */
  /* a resync keeps our own state until a download replaces it: its
   * iteration + 1 (0: we hold none of this stage's, or it was replaced) */
  uint64_t holds;
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
  uint32_t rejections;   /* contributions rejected since its last ban or clean stretch */
  uint64_t rejected_iteration; /* the iteration of its last rejection */
  uint64_t banned_until; /* 0: not banned */
  uint64_t told_ms;      /* when we last sent it TRAIN_BANNED (0: not this ban) */
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
  uint64_t downstream_ready; /* highest CAN_TAKE iteration heard from downstream: the next stage stepped */
  uint64_t pipeline_ready;   /* ... whose CAN_TAKE said every stage after us stepped (pipeline_stepped) */
  uint64_t can_take_sent;    /* highest CAN_TAKE iteration sent upstream (+1) */
  uint64_t pipeline_sent;    /* highest one sent with pipeline_stepped (+1) */
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
  uint64_t fwd_trips[8]; /* the last forward trips (stage 1 to our loss), ms: how long one may take */
  uint32_t n_fwd_trips;
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
  /* --subspace: U and the table, z of what we send (rows x k), the token
   * ids of a FORWARD we send (train/peer_wire.c) */
  subspace sub;
  float *sub_z;
  uint8_t *sub_tokens;
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
void peer_hello_stage(train_peer *p, int stage);
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

#endif
