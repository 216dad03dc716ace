/* train/peer_mb.h — a microbatch as one peer sees it, and the three files
 * that move it. Internal to train/ (through train/peer_internal.h).
 *
 * train/peer_mb.c is the core both roles share: the table of microbatches
 * (mb_find, mb_new, mb_free), the hop messages and their acknowledgements,
 * re-routing and DENY, and the hop deadlines. Each message handler, job
 * result and tick checks what both roles check, then calls the role's side
 * from one place: relay_* (train/peer_relay.c) on a relay, data_*
 * (train/peer_data.c) on the data node, the microbatch's origin. */
#ifndef GWTF_TRAIN_PEER_MB_H
#define GWTF_TRAIN_PEER_MB_H

#include "train/peer.h"
#include "train.pb-c.h"

#define PEER_MAX_STAGES 64
#define PEER_MAX_PATH (PEER_MAX_STAGES + 2) /* the origin, each stage, the origin again */
#define PEER_MAX_AVOID 16

/* ---- a microbatch as one peer sees it ---- */

typedef enum mb_fwd {
  FWD_NONE = 0,
  FWD_EMBED,     /* data: embedding job running */
  FWD_COMPUTE,   /* relay: forward job running (or queued until aggregation ends) */
  FWD_QUEUED,    /* relay: arrived for the next iteration while we aggregate */
  FWD_SLOT,      /* relay: arrived while we were full, waits for our next free slot (holds none) */
  FWD_SENT,      /* waiting for FORWARD_DONE from `next` */
  FWD_WAIT,      /* every next-stage peer said "full": retry at wait_until */
  FWD_FLIGHT,    /* data: first hop confirmed, waiting for the microbatch to come back */
  FWD_LOSS,      /* data: loss job running */
  FWD_DONE,      /* our forward part is finished */
} mb_fwd;

typedef enum mb_bwd {
  BWD_NONE = 0,  /* waiting for BACKWARD */
  BWD_COMPUTE,   /* backward (or embedding backward) job running */
  BWD_DONE,      /* our backward part is finished, our gradient is counted */
} mb_bwd;

typedef enum mb_end { MB_LIVE = 0, MB_COMPLETE, MB_DEFERRED, MB_LOST } mb_end;

/* A RECOVER the origin holds back (peer_mb.reports): the suspect at
 * `stage` of the path, and the peer after it that reported it. */
typedef struct mb_report {
  int stage;
  gw_id suspect, reporter;
} mb_report;
#define PEER_MB_REPORTS 4 /* breaks of one microbatch held at once; the oldest goes (its reporter asks again) */

typedef struct peer_mb {
  bool used;
  uint64_t key; /* hash of (origin, id): the compute state key */
  gw_id origin;
  uint64_t id, iteration;
  uint32_t index;   /* data: position in the iteration (the router slot) */
  uint32_t attempt; /* bumped by a SWARM-style restart */
  uint64_t rerun_stages; /* a ledger re-run: the stages that keep its gradient (train/peer_ledger.h) */
  bool grad_dropped;     /* a re-run's gradient jobs on us dropped theirs: we or a stage-mate hold it */
  mb_fwd fwd;
  mb_bwd bwd;
  mb_end end;
  gw_id path[PEER_MAX_PATH]; /* origin first; includes us once our forward is done */
  uint32_t path_len;
  gw_id prev, next;          /* neighbours on the path */
  uint64_t flow_in, flow_out; /* flow ids it arrived with / left with */
  float *in;                 /* relay: received activation until its forward runs */
  float *out;                /* our output (relay) / embedding (data): kept for re-sends */
  float *grad;               /* gradient we sent upstream: kept until BACKWARD_DONE */
  bool grad_received;        /* BACKWARD_RECEIVED for `grad`: upstream holds it */
  bool done_sent;            /* relay: our BACKWARD_DONE went downstream */
  bool fwd_done_sent;        /* relay: our FORWARD_DONE went upstream */
  bool maybe_through;        /* re-routed from a lost next hop, which may have passed it on */
  bool slot_freed;           /* relay: holds no capacity slot (backward done, or FWD_SLOT) */
  int32_t *tokens, *targets; /* data */
  bool grad_acked;           /* BACKWARD_DONE received for `grad`: it is safe upstream */
  bool has_state;            /* the compute layer holds activations for key */
  bool eval;                 /* validation: forward only, nothing kept for a backward (peer_eval.c) */
  train_job *job;            /* the job computing on our buffers, until it ends */
  /* a hop's wait: the deadline (RTT-based, peer_liveness.c) and its cap (the
   * fixed hop timeout); a deadline at or past its cap is final */
  uint64_t fwd_deadline, bwd_deadline;
  uint64_t fwd_cap, bwd_cap;
  uint64_t trip_deadline; /* data: the microbatch must come back (or finish backward) by then */
  gw_id avoid[PEER_MAX_AVOID];
  uint32_t n_avoid;
  uint32_t avoid_full;       /* bit i: avoid[i] only said "full", worth asking again later */
  uint64_t wait_since, wait_until; /* FWD_WAIT: since when, and the next try */
  uint32_t reroutes, repairs;
  /* data: the peer whose loss the last repair mended, and the repairs of
   * that one break so far (max_repairs is a budget per break) */
  gw_id break_suspect;
  uint32_t break_repairs;
  uint64_t rebuilt; /* data: bit s-1, a repair re-sent into stage s (path[s] may name the peer it replaced) */
  bool repair;
  int repair_end_stage;
  gw_id repair_target;
  float loss;
  double compute_s;
  uint64_t started_ms;
  uint64_t sent_ms; /* the last FORWARD we sent: SWARM times the hop from here */
  /* data node: repair in progress */
  bool recovering;
  int probe_stage;           /* stage being probed, walking towards the origin */
  uint64_t probe_deadline;
  int gap_last;              /* last stage of the gap */
  gw_id gap_target;          /* first live peer after the gap (holds the gradient) */
  uint64_t recover_started_ms;
  uint64_t first_taken_ms, repair_taken_ms; /* data: a REPAIR first and last taken on (breakdown) */
  /* relay: we reported the peer before us lost before our gradient was
   * due (repair_report_early), and no replacement has said REPAIR_READY */
  bool gap_reported_early;
  uint64_t grad_due_ms; /* when our gradient was first ready to go upstream (backward.resumed's held_s) */
  /* data: a RECOVER we could not act on when it came: the microbatch was
   * still out (its path unknown), or another break's walk was on. Acted
   * on once the loss gradient is out, or that repair is taken on. */
  mb_report reports[PEER_MB_REPORTS];
  uint32_t n_reports;
  float *gpart; /* --deterministic: this microbatch's own gradient on us (train/peer_ledger.h) */
  /* data: its forward may be lost past stage at_risk_stage (a peer there
   * died after passing it on, and nobody after it has said it holds it):
   * the trip deadline is shortened (data_forward_at_risk). 0: not at risk */
  int at_risk_stage;
  bool risk_waited; /* data: ... and at its shortened deadline, a live peer past that stage held it */
  uint64_t flight_ms; /* data: when it left stage 1 (FWD_FLIGHT) */
} peer_mb;

/* ---- peer_mb.c: the shared core ---- */
peer_mb *mb_find(train_peer *p, const gw_id *origin, uint64_t id);
peer_mb *mb_new(train_peer *p, const gw_id *origin, uint64_t id);
void mb_free(train_peer *p, peer_mb *mb);
uint64_t mb_key(const gw_id *origin, uint64_t id, uint32_t attempt);
/* The stage we send our gradient to: the one before ours on the path (the
 * data node's: the last stage). */
int mb_upstream_stage(const train_peer *p);
void mb_ack(train_peer *p, const gw_id *to, uint32_t type, const peer_mb *mb, const char *reason);
/* DENY of the microbatch in m to `to`, logged (deny.sent) and counted. */
void mb_deny(train_peer *p, const gw_id *to, const Gwtf__TrainMicrobatch *m, const char *reason);
/* m describes mb (path: PEER_MAX_PATH entries, which m points into). */
void mb_fill_msg(Gwtf__TrainMicrobatch *m, ProtobufCBinaryData *path, const peer_mb *mb);
void mb_log_compute(train_peer *p, const peer_mb *mb, const char *kind, double s);
/* No peer of the next stage takes mb: true while it waits (FWD_WAIT), within
 * budget_ms of the wait's start, for a slot (when live peers refused it,
 * some only for being full) or for a hop (when none did: no hop is known
 * yet, or the peers we avoid are dead). */
bool mb_wait_for_route(train_peer *p, peer_mb *mb, uint64_t budget_ms);
/* A gradient arrived for mb: BACKWARD_RECEIVED, mb->in holds it and
 * mb->bwd is BWD_COMPUTE; false when there is nothing to compute. */
bool mb_take_gradient(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t);
/* The hop deadlines both roles keep on mb; true when one acted. */
bool mb_tick_hops(train_peer *p, peer_mb *mb);
void mb_on_forward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t);
void mb_on_forward_done(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void mb_on_deny(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void mb_on_backward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t);
void mb_on_backward_done(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void mb_on_backward_received(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void mb_on_forward_received(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void mb_job_done(train_peer *p, train_job *job);
void mb_tick(train_peer *p);
void mb_peer_down(train_peer *p, const gw_id *peer);
/* peer said (HELLO) it serves `stage`: where it held one of ours for
 * another stage, it left that stage (a move) and is gone for it. */
void mb_peer_moved(train_peer *p, const gw_id *peer, int stage);
void mb_send_forward(train_peer *p, peer_mb *mb);
void mb_send_backward(train_peer *p, peer_mb *mb);
void mb_abandon_iteration(train_peer *p, uint64_t iteration);

/* ---- peer_relay.c: a microbatch's hop at a relay ---- */
void relay_on_forward(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t);
/* Microbatches of the next iteration that waited for our aggregation. */
void relay_release_queued(train_peer *p);
/* Starts what waits for a slot (FWD_SLOT) in the slots that are free. */
void relay_take_free_slots(train_peer *p);
/* Leaving our stage: what we hold and have not passed on goes back upstream. */
void relay_hand_back(train_peer *p, const char *reason);
void relay_no_route(train_peer *p, peer_mb *mb);
void relay_forward_through(train_peer *p, peer_mb *mb);
void relay_drop_spare(train_peer *p, peer_mb *mb);
void relay_confirm_upstream(train_peer *p, peer_mb *mb);   /* FORWARD_DONE, once */
void relay_confirm_downstream(train_peer *p, peer_mb *mb); /* BACKWARD_DONE, once */
void relay_on_backward(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t);
void relay_backward_confirmed(train_peer *p, peer_mb *mb);
void relay_job_done(train_peer *p, peer_mb *mb, train_job *job);

/* ---- peer_data.c: the data node's microbatch, out and back ---- */
/* It ended (done, deferred, lost): counted, freed, maybe refilled; the
 * iteration closes with its last microbatch. */
void data_mb_finished(train_peer *p, peer_mb *mb, mb_end how);
/* How long a microbatch may take to travel the ring once, either way. */
uint64_t data_trip_ms(const train_peer *p);
void data_no_route(train_peer *p, peer_mb *mb);
void data_forward_through(train_peer *p, peer_mb *mb);
/* mb's forward may be lost past stage `stage` (a RECOVER with `forward`
 * from the peer before it, or our own stage-1 hop gone): its trip deadline
 * becomes a hop timeout plus the longest recent forward trip, and at that
 * deadline it is sent again rather than deferred, unless a live peer after
 * that stage has said it holds mb. */
void data_forward_at_risk(train_peer *p, peer_mb *mb, int stage);
/* A DENY for mb from a relay past its first hop: one whose peer before it
 * is gone found no route onwards and dropped mb (relay_no_route). Taken
 * only for a microbatch at risk: it is sent again at once. */
void data_dropped_past_risk(train_peer *p, peer_mb *mb, const gw_id *from, const char *reason);
/* A FORWARD reached the data node: one of its own microbatches came back. */
void data_on_return(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m, const train_tensor *t);
void data_on_backward(train_peer *p, const gw_id *from, peer_mb *mb, const train_tensor *t);
void data_backward_confirmed(train_peer *p, peer_mb *mb);
void data_send_embedding(train_peer *p, peer_mb *mb); /* stage 0 done: to stage 1 */
void data_job_done(train_peer *p, peer_mb *mb, train_job *job);
void data_mb_tick(train_peer *p, peer_mb *mb);

#endif
