/* train/peer.c — the training peer's core: configuration, message dispatch,
 * membership, the periodic tick and the helpers the other peer_*.c files
 * share. The protocol itself is described in train/peer.h. */
#include "train/peer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_admit.h"
#include "train/peer_agg.h"
#include "train/peer_data.h"
#include "train/peer_join.h"
#include "train/peer_leader.h"
#include "train/peer_liveness.h"
#include "train/peer_repair.h"
#include "train/peer_replica.h"
#include "train/peer_trust.h"
#include "train/peer_wire.h"
#include "util/err.h"

void train_tunables_default(train_tunables *t) {
  t->tick_ms = 100;
  t->hop_timeout_ms = 5000;
  t->live_rto_k = 4;
  t->live_floor_ms = 500;
  t->probe_timeout_ms = 1000;
  t->agg_timeout_ms = 10000;
  t->stall_timeout_ms = 60000;
  t->hello_period_ms = 2000;
  t->settle_ms = 15000;
  t->flow_grace_ms = 1000;
  t->max_repairs = 4;
  t->max_reroutes = 4;
  t->repair_reserve = 1;
  t->slot_wait = 2;
  t->chunk_bytes = 4u << 20;
  t->norm_k = 10.0;
  t->no_validation = false;
  t->no_widen = false;
  t->aggregate = TRAIN_AGG_MEAN;
  t->trim_fraction = 0.2;
  t->byzantine = TRAIN_BYZ_NONE;
  t->byzantine_scale = 100.0;
  t->rebalance_after = 3;
  t->rebalance_margin = 0.2;
}

/* ---- small helpers ---- */

void peer_short(const gw_id *id, char out[GW_ID_SHORT_LEN + 1]) { gw_id_to_short(id, out); }

void peer_hex8(const uint8_t *b, char out[17]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  out[16] = '\0';
}

bool id_in(const gw_id *list, size_t n, const gw_id *id) {
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&list[i], id)) return true;
  return false;
}

void id_from_bytes(gw_id *out, ProtobufCBinaryData b) {
  memset(out, 0, sizeof(*out));
  if (b.len == GW_ID_BYTES) memcpy(out->b, b.data, GW_ID_BYTES);
}

ProtobufCBinaryData id_bytes(const gw_id *id) {
  ProtobufCBinaryData b = {GW_ID_BYTES, (uint8_t *)id->b};
  return b;
}

size_t peer_act_floats(const train_peer *p) {
  return (size_t)p->cfg.shape.B * (size_t)p->cfg.shape.T * (size_t)p->cfg.shape.C;
}

void peer_tensor_f32(train_tensor *t, const float *data, int B, int T, int C) {
  memset(t, 0, sizeof(*t));
  t->dtype = TRAIN_F32;
  t->ndim = 3;
  t->shape[0] = (uint64_t)B;
  t->shape[1] = (uint64_t)T;
  t->shape[2] = (uint64_t)C;
  t->data = data;
  t->nbytes = (size_t)B * (size_t)T * (size_t)C * sizeof(float);
}

bool peer_in_view(const peer_stage_view *v, const gw_id *id) {
  for (size_t i = 0; i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, id)) return true;
  return false;
}

bool peer_alive(train_peer *p, const gw_id *id) {
  if (gw_id_eq(id, &p->cfg.self)) return true;
  return p->io.connected ? p->io.connected(p->io.ud, id) : true;
}

peer_stage_view *peer_stage(train_peer *p, int stage) {
  if (stage < 0 || stage > p->cfg.n_stages) return NULL;
  return &p->members[stage];
}

int peer_send(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg,
              const train_tensor *tensor) {
  uint8_t stack[512];
  admit_before_send(p, to, type); /* a private run: our certificate goes first */
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = len <= sizeof(stack) ? stack : malloc(len);
  if (!buf) return GW_ENOMEM;
  protobuf_c_message_pack(msg, buf);
  int rc = p->io.send(p->io.ud, to, type, buf, len, tensor);
  if (buf != stack) free(buf);
  return rc;
}

void peer_broadcast_stage(train_peer *p, int stage, uint32_t type, const ProtobufCMessage *msg) {
  peer_stage_view *v = peer_stage(p, stage);
  if (!v) return;
  for (size_t i = 0; i < v->n; i++)
    if (!gw_id_eq(&v->v[i].id, &p->cfg.self)) peer_send(p, &v->v[i].id, type, msg, NULL);
}

void peer_tensor_1d(train_tensor *t, const float *data, size_t n) {
  memset(t, 0, sizeof(*t));
  t->dtype = TRAIN_F32;
  t->ndim = 1;
  t->shape[0] = n;
  t->data = data;
  t->nbytes = n * sizeof(float);
}

void peer_emit(train_peer *p, train_event_kind kind) {
  if (!p->io.event) return;
  train_event ev = {.kind = kind, .stage = p->stage, .iteration = p->iteration, .leader = p->leader};
  p->io.event(p->io.ud, &ev);
}

train_job *peer_submit(train_peer *p, train_job_kind kind, peer_mb *mb, const void *in, size_t in_bytes,
                       void *out, size_t out_bytes) {
  train_job *job = calloc(1, sizeof(*job));
  if (!job) return NULL;
  job->kind = kind;
  job->key = mb ? mb->key : 0;
  job->mb_id = mb ? mb->id : 0;
  job->in = in;
  job->in_bytes = in_bytes;
  job->out = out;
  job->out_bytes = out_bytes;
  job->targets = mb ? mb->targets : NULL;
  job->owner = mb;
  job->drop_grad = ledger_drops_grad(p, mb, kind);
  job->grad_part = job->drop_grad ? NULL : ledger_part_for(p, mb, kind);
  if (p->io.compute(p->io.ud, job) != 0) {
    free(job);
    return NULL;
  }
  if (mb) mb->job = job;
  return job;
}

void peer_job_keep(train_job *job, void *const *bufs, size_t n) {
  size_t k = 0;
  while (k < TRAIN_JOB_MAX_ORPHANS && job->orphans[k]) k++;
  for (size_t i = 0; i < n; i++) {
    if (!bufs[i]) continue;
    /* Sized for every buffer one owner holds, so this never drops one; if
     * it ever did, leaking beats freeing memory a worker writes. */
    if (k < TRAIN_JOB_MAX_ORPHANS) job->orphans[k++] = bufs[i];
  }
}

void peer_job_abandon(train_job *job, void *const *bufs, size_t n) {
  job->owner = NULL;
  peer_job_keep(job, bufs, n);
}

void train_job_free(train_job *job) {
  if (!job) return;
  for (size_t i = 0; i < TRAIN_JOB_MAX_ORPHANS; i++) free(job->orphans[i]);
  free(job->blob);
  free(job);
}

/* Frees the activations the compute layer keeps under key. */
void peer_release_key(train_peer *p, uint64_t key) {
  if (p->closing) return;
  train_job *job = calloc(1, sizeof(*job));
  if (!job) return;
  job->kind = TRAIN_JOB_RELEASE;
  job->key = key;
  if (p->io.compute(p->io.ud, job) != 0) free(job);
}

/* ---- lifecycle ---- */

int train_peer_new(train_peer **out, const train_peer_config *cfg, const train_io *io,
                   const train_router *router, const gw_log *log) {
  if (cfg->n_stages < 1 || cfg->n_stages > PEER_MAX_STAGES || cfg->capacity == 0) return GW_EINVAL;
  /* A peer is one of the two (the microbatch code dispatches on it, peer_mb.c). */
  if (cfg->role != TRAIN_DATA && cfg->role != TRAIN_RELAY) return GW_EINVAL;
  if (cfg->role == TRAIN_DATA && cfg->stage != 0) return GW_EINVAL;
  train_peer *p = calloc(1, sizeof(*p));
  if (!p) return GW_ENOMEM;
  p->cfg = *cfg;
  p->io = *io;
  p->router = *router;
  if (log)
    p->log = *log;
  p->stage = cfg->stage;
  p->state = PEER_UNASSIGNED;
  replica_store_init(&p->rep.store, 0, 0);
  int rc = wire_init(p);
  if (rc != 0) {
    wire_free(p);
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void train_peer_free(train_peer *p) {
  if (!p) return;
  p->closing = true;
  for (size_t i = 0; i < p->n_mbs; i++)
    if (p->mbs[i].used) mb_free(p, &p->mbs[i]);
  free(p->mbs);
  for (int s = 0; s <= PEER_MAX_STAGES; s++) free(p->members[s].v);
  free(p->backlog);
  eval_free(p);
  agg_free(p);
  ledger_free(p);
  join_free(p);
  replica_free(p);
  admit_free(p);
  wire_free(p);
  free(p);
}

void train_peer_set_sampler(train_peer *p, train_sample_fn fn, void *ud) {
  p->sample = fn;
  p->sample_ud = ud;
}

void train_peer_set_shape(train_peer *p, const train_shape *shape) { p->cfg.shape = *shape; }

void train_peer_start(train_peer *p, uint64_t now_ms) {
  p->now = now_ms;
  p->last_update_ms = now_ms;
  gw_log_set_stage(&p->log, p->stage);
  admit_tick(p); /* a private run: a holder issues its own certificate, a joiner redeems its invite now */
  if (p->stage >= 0 && p->cfg.initial_weights) {
    /* A run's first members start from the shared seeded init. */
    join_become_ready(p);
  } else if (p->stage >= 0) {
    /* A fixed stage that must fetch its weights: ask the leader for peers. */
    peer_emit(p, TRAIN_EV_STAGE_ASSIGNED);
  }
  p->io.want_tick(p->io.ud, now_ms + p->cfg.tun.tick_ms);
}

/* ---- membership ---- */

bool peer_vouched(train_peer *p, const gw_id *id) {
  if (gw_id_eq(id, &p->cfg.self)) return true;
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, id)) return !v->v[i].heard || v->v[i].vouched;
  return false;
}

/* A directory member of our stage listed `id` as a member in its BEGIN_AGG:
 * if we only heard `id` by HELLO, it is now vouched for (for three HELLO
 * periods, like the HELLO itself). */
static uint32_t heard_slot(train_peer *p, const gw_id *id);

void peer_vouch(train_peer *p, const gw_id *id) {
  if (gw_id_eq(id, &p->cfg.self) || trust_banned(p, id)) return;
  /* kept even before we hear the peer: its HELLO may be on a slower link
   * than the BEGIN_AGG that vouches for it */
  uint32_t k = heard_slot(p, id);
  if (p->heard[k].stage != p->stage) {
    p->heard[k].stage = p->stage;
    p->heard[k].at_ms = 0;
    p->heard[k].listed = false;
  }
  p->heard[k].vouched_ms = p->now;
  peer_vouch_view(p, p->stage, id);
}

bool peer_is_member(train_peer *p, int stage, const gw_id *id, bool dir_only) {
  peer_stage_view *v = peer_stage(p, stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, id)) return !dir_only || !v->v[i].heard;
  return false;
}

size_t peer_dir_others(train_peer *p) {
  peer_stage_view *v = peer_stage(p, p->stage);
  size_t n = 0;
  for (size_t i = 0; v && i < v->n; i++) n += !v->v[i].heard && !gw_id_eq(&v->v[i].id, &p->cfg.self);
  return n;
}

/* Appends a member to our view of a stage unless it is there. */
static void member_add(train_peer *p, int stage, const gw_id *id, uint32_t capacity, uint32_t load, bool heard) {
  peer_stage_view *v = peer_stage(p, stage);
  if (!v || peer_in_view(v, id)) return;
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 8;
    peer_member *nv = realloc(v->v, cap * sizeof(*nv));
    if (!nv) return;
    v->v = nv;
    v->cap = cap;
  }
  peer_member *m = &v->v[v->n++];
  memset(m, 0, sizeof(*m));
  m->id = *id;
  m->capacity = capacity;
  m->load = load;
  m->heard = heard;
}

/* The entry of `id` in our heard list, made (replacing the stalest when
 * full) when it is not there. */
static uint32_t heard_slot(train_peer *p, const gw_id *id) {
  uint32_t k = 0;
  while (k < p->n_heard && !gw_id_eq(&p->heard[k].id, id)) k++;
  if (k < p->n_heard) return k;
  if (p->n_heard == PEER_MAX_CONTRIB) {
    k = 0; /* full: replace the stalest */
    for (uint32_t i = 1; i < p->n_heard; i++) {
      uint64_t ti = p->heard[i].at_ms > p->heard[i].vouched_ms ? p->heard[i].at_ms : p->heard[i].vouched_ms;
      uint64_t tk = p->heard[k].at_ms > p->heard[k].vouched_ms ? p->heard[k].at_ms : p->heard[k].vouched_ms;
      if (ti < tk) k = i;
    }
  } else {
    k = p->n_heard++;
  }
  memset(&p->heard[k], 0, sizeof(p->heard[k]));
  p->heard[k].id = *id;
  p->heard[k].stage = p->stage;
  return k;
}

static bool heard_fresh(const train_peer *p, uint64_t at_ms) {
  return at_ms && p->now - at_ms <= 3 * p->cfg.tun.hello_period_ms;
}

/* A peer of our own stage said HELLO: it is ready and a member. Kept for
 * three HELLO periods, across directory refreshes that do not list it yet. */
static void heard_member(train_peer *p, const gw_id *id, uint32_t capacity) {
  uint32_t k = heard_slot(p, id);
  if (p->heard[k].stage != p->stage) { /* a vouch for another stage */
    p->heard[k].vouched_ms = 0;
    p->heard[k].listed = false;
  }
  p->heard[k].stage = p->stage;
  p->heard[k].capacity = capacity;
  p->heard[k].at_ms = p->now;
  member_add(p, p->stage, id, capacity, 0, true);
  if (heard_fresh(p, p->heard[k].vouched_ms)) {
    peer_vouch_view(p, p->stage, id);
    agg_repick(p); /* vouched before its HELLO came: it may be the round's aggregator */
  }
}

/* Marks which peers heard by HELLO the directory lists now for our stage
 * (ours included: kept across refreshes, see train_peer_set_members). */
static void mark_listed(train_peer *p, const peer_stage_view *v) {
  for (uint32_t k = 0; k < p->n_heard; k++)
    if (p->heard[k].stage == p->stage) p->heard[k].listed = false;
  for (size_t i = 0; i < v->n; i++) {
    if (v->v[i].heard) continue;
    for (uint32_t k = 0; k < p->n_heard; k++)
      if (p->heard[k].stage == p->stage && gw_id_eq(&p->heard[k].id, &v->v[i].id)) p->heard[k].listed = true;
  }
}

void train_peer_set_members(train_peer *p, int stage, const train_member *members, size_t n, uint64_t now_ms) {
  p->now = now_ms;
  peer_stage_view *v = peer_stage(p, stage);
  if (!v) return;
  if (stage == p->stage) mark_listed(p, v);
  v->n = 0;
  for (size_t i = 0; i < n; i++)
    if (!trust_banned(p, &members[i].id) &&
        admit_view_filter(p, stage, &members[i].id, members[i].capacity, members[i].load))
      member_add(p, stage, &members[i].id, members[i].capacity, members[i].load, false);
  for (uint32_t k = 0; k < p->n_heard; k++)
    /* heard by HELLO, or vouched for (by the leader's ASSIGN or a directory
     * member's BEGIN_AGG) before its HELLO reached us */
    if (p->heard[k].stage == stage && (heard_fresh(p, p->heard[k].at_ms) || heard_fresh(p, p->heard[k].vouched_ms)) &&
        !trust_banned(p, &p->heard[k].id)) {
      /* A member our directory listed stays one while its HELLOs keep
       * coming, though this refresh lost its record (a DHT lookup under
       * churn came back short): demoted to "heard", it was neither waited
       * for nor picked, and we averaged alone, a split (evaluation grid,
       * homo-churn10 SWARM seed 111). It leaves when its session does. */
      bool kept = p->heard[k].listed && heard_fresh(p, p->heard[k].at_ms);
      member_add(p, stage, &p->heard[k].id, p->heard[k].capacity, 0, !kept);
      if (heard_fresh(p, p->heard[k].vouched_ms)) peer_vouch_view(p, stage, &p->heard[k].id);
    }
  if (stage == 0 && p->cfg.role == TRAIN_DATA) leader_check(p);
}

void peer_vouch_view(train_peer *p, int stage, const gw_id *id) {
  peer_stage_view *v = peer_stage(p, stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, id)) v->v[i].vouched = true;
}

static void drop_member(train_peer *p, const gw_id *peer) {
  for (int s = 0; s <= p->cfg.n_stages; s++) {
    peer_stage_view *v = &p->members[s];
    for (size_t i = 0; i < v->n; i++) {
      if (gw_id_eq(&v->v[i].id, peer)) {
        v->v[i] = v->v[--v->n];
        break;
      }
    }
  }
}

/* ---- HELLOs owed ---- */

/* A peer whose session came up, or whose HELLO came, while we had nothing to
 * say yet (no stage, not ready): ours goes to it as we get ready. The ready
 * broadcast reaches the stages' members by our directory, which may not list
 * it yet (a data node whose record we have not fetched), and the periodic
 * HELLO comes up to a period later: meanwhile it sent us F32 (swarm_wire_bf16
 * under ASan: a relay ready at 53.9 s was heard by the data node at 56.4 s,
 * after the first iteration's activations). */
static void hello_owe(train_peer *p, const gw_id *peer) {
  for (uint32_t i = 0; i < p->n_hello_owed; i++)
    if (gw_id_eq(&p->hello_owed[i], peer)) return;
  if (p->n_hello_owed < PEER_HELLO_OWED_MAX) p->hello_owed[p->n_hello_owed++] = *peer;
}

static void hello_forgive(train_peer *p, const gw_id *peer) {
  for (uint32_t i = 0; i < p->n_hello_owed; i++)
    if (gw_id_eq(&p->hello_owed[i], peer)) {
      p->hello_owed[i] = p->hello_owed[--p->n_hello_owed];
      return;
    }
}

/* We are ready: every HELLO owed goes now. */
void peer_hello_owed(train_peer *p) {
  for (uint32_t i = 0; i < p->n_hello_owed; i++)
    if (peer_alive(p, &p->hello_owed[i])) peer_hello_to(p, &p->hello_owed[i]);
  p->n_hello_owed = 0;
}

void train_peer_on_peer_down(train_peer *p, const gw_id *peer, uint64_t now_ms) {
  p->now = now_ms;
  if (gw_id_eq(peer, &p->cfg.self)) return;
  drop_member(p, peer);
  if (p->router.peer_failed) p->router.peer_failed(p->router.ctx, peer);
  mb_peer_down(p, peer);
  repair_peer_down(p, peer);
  ledger_peer_down(p, peer);
  agg_peer_down(p, peer);
  join_peer_down(p, peer);
  admit_peer_down(p, peer);
  hello_forgive(p, peer);
  if (p->cfg.role == TRAIN_DATA) {
    leader_check(p);
    rebalance_short_stage(p); /* the relay that died may leave its stage short */
  }
}

/* A session came up. Our HELLO goes at once (after our certificate, in a
 * private run): the peer negotiates its wire dtype towards us from it
 * (peer_wire.c), and until it has, it sends us F32. Before, a relay that
 * got ready as a neighbour's session was still coming up waited for our
 * next periodic HELLO, up to a period, and its first activations to us
 * went as F32 (swarm_wire_bf16 under ASan: one tensor of 62). */
void train_peer_on_peer_up(train_peer *p, const gw_id *peer, uint64_t now_ms) {
  p->now = now_ms;
  admit_peer_up(p, peer);
  if (p->state == PEER_READY && p->stage >= 0)
    peer_hello_to(p, peer);
  else
    hello_owe(p, peer);
  join_leader_up(p, peer);
}

void train_peer_set_leader(train_peer *p, const gw_id *leader, uint64_t now_ms) {
  p->now = now_ms;
  bool changed = !p->have_leader || !gw_id_eq(&p->leader, leader);
  p->leader = *leader;
  p->have_leader = true;
  if (changed && p->cfg.role == TRAIN_RELAY && p->state == PEER_UNASSIGNED) p->last_join_ms = 0;
}

/* ---- HELLO ---- */

double train_peer_compute_ms(const train_peer *p) {
  uint64_t jobs = p->counters.forward_computed + p->counters.backward_computed;
  return jobs ? 1000.0 * p->counters.compute_seconds / (double)jobs * 2.0 : 0.0;
}

double train_peer_mb_compute_ms(const train_peer *p) {
  const train_counters *c = &p->counters;
  uint64_t jobs = c->forward_computed + c->forward_recomputed + c->backward_computed;
  return jobs ? 1000.0 * c->microbatch_seconds / (double)jobs * 2.0 : 0.0;
}

static void fill_hello(train_peer *p, Gwtf__TrainHello *h0) {
  Gwtf__TrainHello h = GWTF__TRAIN_HELLO__INIT;
  h.role = p->cfg.role == TRAIN_DATA ? GWTF__TRAIN_ROLE__TRAIN_ROLE_DATA : GWTF__TRAIN_ROLE__TRAIN_ROLE_RELAY;
  h.stage = p->stage;
  h.capacity = p->cfg.capacity;
  h.compute_ms = (float)train_peer_compute_ms(p);
  h.mb_compute_ms = (float)train_peer_mb_compute_ms(p);
  h.iteration = p->iteration;
  h.step = p->step;
  h.joining = p->stage >= 0 && p->state != PEER_READY;
  if (p->cfg.tun.byzantine == TRAIN_BYZ_LYING_COSTS) { /* test tool: attract every flow */
    h.capacity = 4096;
    h.compute_ms = 0.001f;
    h.mb_compute_ms = 0.001f;
  }
  wire_fill_hello(p, &h);
  *h0 = h;
}

void peer_send_hellos(train_peer *p) {
  if (p->stage < 0) return;
  Gwtf__TrainHello h;
  fill_hello(p, &h);
  int S = p->cfg.n_stages;
  int neighbours[3] = {p->stage, (p->stage + 1) % (S + 1), (p->stage + S) % (S + 1)};
  for (int k = 0; k < 3; k++) {
    if (k > 0 && neighbours[k] == p->stage) continue;
    peer_broadcast_stage(p, neighbours[k], GWTF__TRAIN_MSG__TRAIN_HELLO, &h.base);
  }
  rebalance_hello_leader(p, &h); /* a middle stage's speed reaches the leader too */
}

void peer_hello_to(train_peer *p, const gw_id *to) {
  Gwtf__TrainHello me = GWTF__TRAIN_HELLO__INIT;
  fill_hello(p, &me);
  peer_send(p, to, GWTF__TRAIN_MSG__TRAIN_HELLO, &me.base, NULL);
}

void peer_hello_stage(train_peer *p, int stage) {
  Gwtf__TrainHello h;
  fill_hello(p, &h);
  peer_broadcast_stage(p, stage, GWTF__TRAIN_MSG__TRAIN_HELLO, &h.base);
}

/* A member of our stage says it serves another now (the leader moved it,
 * train/peer_move.c): it is no member of ours, whatever our directory (it
 * withdrew; the refresh lags) and the heard and vouched lists say. Before,
 * members kept vouching for it in their BEGIN_AGG lists and each round's
 * aggregator waited out its timeout for its gradient. */
static void forget_moved(train_peer *p, const gw_id *id) {
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, id)) {
      v->v[i] = v->v[--v->n];
      break;
    }
  for (uint32_t k = 0; k < p->n_heard; k++)
    if (gw_id_eq(&p->heard[k].id, id)) {
      p->heard[k] = p->heard[--p->n_heard];
      break;
    }
  agg_peer_down(p, id);
}

static void on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h) {
  if (p->stage >= 0 && h->stage >= 0 && h->stage != p->stage && peer_is_member(p, p->stage, from, false))
    forget_moved(p, from);
  mb_peer_moved(p, from, h->stage);
  if (wire_on_hello(p, from, h)) {
    if (p->stage >= 0)
      peer_hello_to(p, from);
    else
      hello_owe(p, from);
  }
  if (p->io.peer_info && h->stage >= 0) p->io.peer_info(p->io.ud, from, h->stage, h->capacity, h->compute_ms);
  live_on_hello(p, from, h->mb_compute_ms > 0 ? h->mb_compute_ms : h->compute_ms);
  rebalance_on_hello(p, from, h->stage, h->mb_compute_ms > 0 ? h->mb_compute_ms : h->compute_ms, h->joining);
  if (p->stage >= 0 && h->stage == p->stage) {
    heard_member(p, from, h->capacity);
    agg_member_joining(p, from, h->joining);
  }
  stage0_on_hello(p, from, h); /* the run's iteration, for a data node restoring stage 0 */
  if (h->stage != p->stage || h->joining || p->state != PEER_READY || p->aggregating) return;
  /* Same stage, different iteration: whoever is behind missed a round (it
   * got ready while the stage aggregated) and must fetch the state again,
   * once directory members say so (trust_claim_ahead): a HELLO alone from
   * a stranger made us resync and download its forged weights. */
  if (h->iteration > p->iteration) {
    trust_claim_ahead(p, from, h->iteration, "hello");
  } else if (h->iteration < p->iteration) {
    peer_hello_to(p, from);
  }
}

/* ---- dispatch ---- */


static void dispatch(train_peer *p, const gw_id *from, uint32_t type, const uint8_t *body, size_t len,
                     const train_tensor *t) {
  char who[GW_ID_SHORT_LEN + 1];
  /* Who may say what: the table in peer_trust.c, before any handler. */
  if (!trust_admit(p, from, type)) return;
  switch (type) {
#define CASE(MSG, Type, fn, handler)                           \
  case GWTF__TRAIN_MSG__##MSG: {                               \
    Type *m = fn##__unpack(NULL, len, body);                   \
    if (!m) goto malformed;                                    \
    handler;                                                   \
    fn##__free_unpacked(m, NULL);                              \
    return;                                                    \
  }
    CASE(TRAIN_HELLO, Gwtf__TrainHello, gwtf__train_hello, on_hello(p, from, m))
    CASE(TRAIN_JOIN, Gwtf__TrainJoin, gwtf__train_join, join_on_join(p, from, m))
    CASE(TRAIN_ASSIGN, Gwtf__TrainAssign, gwtf__train_assign, join_on_assign(p, from, m))
    CASE(TRAIN_WEIGHTS_REQ, Gwtf__TrainWeightsReq, gwtf__train_weights_req, join_on_weights_req(p, from, m))
    CASE(TRAIN_WEIGHTS_CHUNK, Gwtf__TrainWeightsChunk, gwtf__train_weights_chunk, join_on_chunk(p, from, m, t))
    CASE(TRAIN_FORWARD, Gwtf__TrainMicrobatch, gwtf__train_microbatch, mb_on_forward(p, from, m, t))
    CASE(TRAIN_FORWARD_DONE, Gwtf__TrainAck, gwtf__train_ack, mb_on_forward_done(p, from, m))
    CASE(TRAIN_FORWARD_RECEIVED, Gwtf__TrainAck, gwtf__train_ack, mb_on_forward_received(p, from, m))
    CASE(TRAIN_DENY, Gwtf__TrainAck, gwtf__train_ack, mb_on_deny(p, from, m))
    CASE(TRAIN_BACKWARD, Gwtf__TrainMicrobatch, gwtf__train_microbatch, mb_on_backward(p, from, m, t))
    CASE(TRAIN_BACKWARD_DONE, Gwtf__TrainAck, gwtf__train_ack, mb_on_backward_done(p, from, m))
    CASE(TRAIN_BACKWARD_RECEIVED, Gwtf__TrainAck, gwtf__train_ack, mb_on_backward_received(p, from, m))
    CASE(TRAIN_RECOVER, Gwtf__TrainRecover, gwtf__train_recover, repair_on_recover(p, from, m))
    CASE(TRAIN_PROBE, Gwtf__TrainAck, gwtf__train_ack, repair_on_probe(p, from, m))
    CASE(TRAIN_PROBE_REPLY, Gwtf__TrainProbeReply, gwtf__train_probe_reply, repair_on_probe_reply(p, from, m))
    CASE(TRAIN_REPAIR, Gwtf__TrainRepair, gwtf__train_repair, repair_on_repair(p, from, m))
    CASE(TRAIN_REPAIR_READY, Gwtf__TrainMicrobatch, gwtf__train_microbatch, repair_on_ready(p, from, m))
    CASE(TRAIN_ITER_DONE, Gwtf__TrainIterDone, gwtf__train_iter_done, data_on_iter_done(p, from, m))
    CASE(TRAIN_BEGIN_AGG, Gwtf__TrainIteration, gwtf__train_iteration, agg_on_begin(p, from, m))
    CASE(TRAIN_GRAD, Gwtf__TrainGrad, gwtf__train_grad, agg_on_grad(p, from, m, t))
    CASE(TRAIN_AVG, Gwtf__TrainGrad, gwtf__train_grad, agg_on_avg(p, from, m, t))
    CASE(TRAIN_AGG_DONE, Gwtf__TrainAggDone, gwtf__train_agg_done, agg_on_done_msg(p, from, m))
    CASE(TRAIN_CAN_TAKE, Gwtf__TrainIteration, gwtf__train_iteration,
         agg_on_can_take(p, from, m->iteration, m->pipeline_stepped))
    CASE(TRAIN_LEADER, Gwtf__TrainLeader, gwtf__train_leader, leader_on_leader(p, from, m))
    CASE(TRAIN_RESYNC, Gwtf__TrainIteration, gwtf__train_iteration, agg_on_resync(p, from, m->iteration))
    CASE(TRAIN_CERT, Gwtf__TrainCert, gwtf__train_cert, admit_on_cert(p, from, m))
    CASE(TRAIN_REDEEM, Gwtf__TrainRedeem, gwtf__train_redeem, admit_on_redeem(p, from, m))
    CASE(TRAIN_ADMITTED, Gwtf__TrainCert, gwtf__train_cert, admit_on_admitted(p, from, m))
    CASE(TRAIN_REVOKED, Gwtf__TrainRevoked, gwtf__train_revoked, admit_on_revoked(p, from, m))
    CASE(TRAIN_HASH_REQ, Gwtf__TrainIteration, gwtf__train_iteration, verify_on_hash_req(p, from, m->iteration))
    CASE(TRAIN_HASH, Gwtf__TrainAggDone, gwtf__train_agg_done, verify_on_hash(p, from, m))
    CASE(TRAIN_REPLICA_PUSH, Gwtf__TrainWeightsChunk, gwtf__train_weights_chunk, replica_on_push(p, from, m, t))
    CASE(TRAIN_REPLICA_REQ, Gwtf__TrainReplicaReq, gwtf__train_replica_req, replica_on_req(p, from, m))
    CASE(TRAIN_REPLICA_CHUNK, Gwtf__TrainWeightsChunk, gwtf__train_weights_chunk, join_on_chunk(p, from, m, t))
    CASE(TRAIN_STAGE_LOST, Gwtf__TrainStageLost, gwtf__train_stage_lost, leader_on_stage_lost(p, from, m))
    CASE(TRAIN_MOVE, Gwtf__TrainAssign, gwtf__train_assign, move_on_move(p, from, m))
    CASE(TRAIN_BANNED, Gwtf__TrainBanned, gwtf__train_banned, trust_on_banned(p, from, m))
#undef CASE
  default:
    peer_short(from, who);
    GW_WARN(&p->log, "train.unknown_message", "peer=%s type=%u", who, type);
    return;
  }
malformed:
  peer_short(from, who);
  GW_WARN(&p->log, "train.malformed", "peer=%s type=%u bytes=%zu", who, type, len);
}

void train_peer_on_message(train_peer *p, const gw_id *from, uint32_t type, const uint8_t *body, size_t len,
                           const train_tensor *tensor, uint64_t now_ms) {
  p->now = now_ms;
  live_heard(p, from); /* any message answers a probe */
  dispatch(p, from, type, body, len, tensor);
}

void train_peer_on_job_done(train_peer *p, train_job *job, uint64_t now_ms) {
  p->now = now_ms;
  p->counters.compute_seconds += job->seconds;
  if (job->kind == TRAIN_JOB_FORWARD || job->kind == TRAIN_JOB_BACKWARD) p->counters.microbatch_seconds += job->seconds;
  switch (job->kind) {
  case TRAIN_JOB_GRAD_EXPORT:
  case TRAIN_JOB_APPLY:
  case TRAIN_JOB_SKIP_STEP: agg_job_done(p, job); break;
  case TRAIN_JOB_SNAPSHOT:
  case TRAIN_JOB_RESTORE: join_job_done(p, job); break;
  case TRAIN_JOB_RELEASE: break;
  default: mb_job_done(p, job); break;
  }
  train_job_free(job);
}

void train_peer_on_tick(train_peer *p, uint64_t now_ms) {
  p->now = now_ms;
  if (p->state == PEER_READY && now_ms - p->last_hello_ms >= p->cfg.tun.hello_period_ms) {
    p->last_hello_ms = now_ms;
    peer_send_hellos(p);
  }
  admit_tick(p);
  mb_tick(p);
  repair_tick(p);
  agg_tick(p);
  join_tick(p);
  verify_tick(p);
  behind_tick(p);
  replica_tick(p);
  move_tick(p);
  stage0_tick(p);
  if (p->cfg.role == TRAIN_DATA) {
    leader_check(p);
    data_tick(p);
  }
  p->io.want_tick(p->io.ud, now_ms + p->cfg.tun.tick_ms);
}

/* ---- queries ---- */

int train_peer_stage(const train_peer *p) { return p->stage; }
uint64_t train_peer_iteration(const train_peer *p) { return p->iteration; }
bool train_peer_is_leader(const train_peer *p) { return p->was_leader; }

bool train_peer_leader(const train_peer *p, gw_id *out) {
  if (p->have_leader) *out = p->leader;
  return p->have_leader;
}
bool train_peer_finished(const train_peer *p) { return p->finished; }
const train_counters *train_peer_counters(const train_peer *p) { return &p->counters; }
