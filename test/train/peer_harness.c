/* test/train/peer_harness.c — see peer_harness.h. */
#include "peer_harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "train.pb-c.h"
#include "train/replica_store.h"
#include "util/err.h"

#define ACT_FLOATS (H_B * H_T * H_C)

static h_node *node_by_id(h_harness *h, const gw_id *id) {
  for (int i = 0; i < h->n_nodes; i++)
    if (gw_id_eq(&h->nodes[i].peer.id, id)) return &h->nodes[i];
  return NULL;
}

/* ---- membership: what the DHT stage directory would say ---- */

/* What the DHT's replica keys would say: every live holder's newest
 * replica of each stage, told to every peer. */
static void set_holders(h_harness *h) {
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *me = &h->nodes[i];
    if (!me->alive || !me->tp) continue;
    int s = train_peer_stage(me->tp); /* a relay's stage, or stage 0 for a data node */
    if (s < 0) continue;
    train_replica_holder list[16];
    size_t k = 0;
    for (int j = 0; j < h->n_nodes && k < 16; j++) {
      h_node *n = &h->nodes[j];
      const replica_entry *e = (n->alive || h->holders_outlive) && n->tp ? train_peer_replica(n->tp, s) : NULL;
      if (!e) continue;
      list[k] = (train_replica_holder){.id = n->peer.id, .iteration = e->iteration, .step = e->step};
      memcpy(list[k].weights_hash, e->weights_hash, 32);
      k++;
    }
    train_peer_set_replica_holders(me->tp, list, k, sim_now(h->s));
  }
}

static void refresh_members(h_harness *h) {
  set_holders(h);
  train_member list[H_MAX_NODES];
  const gw_id *leader = NULL;
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *n = &h->nodes[i];
    if (n->alive && n->role == TRAIN_DATA && n->ready && (!leader || gw_id_cmp(&n->peer.id, leader) < 0))
      leader = &n->peer.id;
  }
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *me = &h->nodes[i];
    if (!me->alive || !me->tp) continue;
    for (int s = 0; s <= h->n_stages; s++) {
      size_t k = 0;
      for (int j = 0; j < h->n_nodes; j++) {
        h_node *n = &h->nodes[j];
        if (n->alive && (n->ready || (n->listed_early && n->stage >= 0)) && n->stage == s && !n->hidden_from[i] &&
            !(me->dir_blind && s == me->stage && j != i))
          list[k++] = (train_member){.id = n->peer.id, .capacity = n->capacity, .load = n->dir_load};
      }
      train_peer_set_members(me->tp, s, list, k, sim_now(h->s));
    }
    if (leader && me->role == TRAIN_RELAY) train_peer_set_leader(me->tp, leader, sim_now(h->s));
  }
}

void h_refresh(h_harness *h) { refresh_members(h); }

/* ---- router: a fixed spread over live next-stage peers ---- */

static int route(void *ctx, const gw_id *origin, const gw_id *from, uint32_t slot, uint64_t in_flow,
                 const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow) {
  (void)in_flow;
  *out_flow = 0;
  h_node *me = ctx;
  h_harness *h = me->h;
  int next = (train_peer_stage(me->tp) + 1) % (h->n_stages + 1);
  h_node *cand[H_MAX_NODES];
  int n = 0;
  for (int j = 0; j < h->n_nodes; j++) {
    h_node *c = &h->nodes[j];
    bool avoided = false;
    for (size_t a = 0; a < n_avoid; a++) avoided |= gw_id_eq(&avoid[a], &c->peer.id);
    bool unrouted = (c->unrouted && train_peer_iteration(me->tp) >= c->unrouted_from) || sim_now(h->s) < c->unrouted_until;
    if (c->alive && c->ready && c->stage == next && !avoided && !unrouted) cand[n++] = c;
  }
  if (n == 0) return GW_ENOENT;
  unsigned pick = slot + origin->b[0] + (from ? from->b[1] : 0u);
  *out = cand[pick % (unsigned)n]->peer.id;
  return 0;
}

static uint32_t slots(void *ctx) {
  h_node *me = ctx;
  if (me->no_routes_from && train_peer_iteration(me->tp) >= me->no_routes_from) return 0;
  return me->routes ? me->routes : me->capacity;
}

/* ---- io ---- */

static void arm(h_node *n) {
  uint64_t at = n->peer_tick_at;
  for (int i = 0; i < n->n_jobs; i++)
    if (n->jobs[i].done_at < at) at = n->jobs[i].done_at;
  gw_io io = sim_io(n->h->s, n->index);
  io.want_tick(io.ud, at);
}

/* Wire format inside the simulator: type, body, then an optional tensor. */
static int raw_send(h_node *n, const gw_id *to, uint32_t type, const uint8_t *body, size_t len,
                    const train_tensor *t) {
  h_node *dst = node_by_id(n->h, to);
  if (!dst) return GW_ENOENT;
  size_t tn = t ? t->nbytes : 0;
  size_t total = 4 + 4 + len + 1 + (t ? 1 + 1 + 32 + 8 : 0) + tn;
  uint8_t *buf = malloc(total), *q = buf;
  if (!buf) return GW_ENOMEM;
  uint32_t l32 = (uint32_t)len;
  memcpy(q, &type, 4), q += 4;
  memcpy(q, &l32, 4), q += 4;
  memcpy(q, body, len), q += len;
  *q++ = t ? 1 : 0;
  if (t) {
    *q++ = (uint8_t)t->dtype;
    *q++ = (uint8_t)t->ndim;
    memcpy(q, t->shape, 32), q += 32;
    uint64_t nb = t->nbytes;
    memcpy(q, &nb, 8), q += 8;
    memcpy(q, t->data, tn), q += tn;
  }
  gw_io io = sim_io(n->h->s, n->index);
  n->h->sending = type;
  int rc = io.send(io.ud, &dst->peer, buf, total);
  free(buf);
  return rc;
}

static int io_send(void *ud, const gw_id *to, uint32_t type, const uint8_t *body, size_t len,
                   const train_tensor *t) {
  h_node *n = ud;
  h_node *dst = node_by_id(n->h, to);
  if (dst && sim_now(n->h->s) < n->sessions_until[dst - n->h->nodes]) return GW_ECLOSED;
  if (dst && n->h->send_hook)
    n->h->send_hook(n->h, (int)(n - n->h->nodes), (int)(dst - n->h->nodes), type, body, len, t);
  return raw_send(n, to, type, body, len, t);
}

/* The node's identity key signs: its ID is BLAKE2b-256 of the public half. */
static void io_sign(void *ud, const uint8_t *msg, size_t len, uint8_t sig[64]) {
  h_node *n = ud;
  crypto_sign_detached(sig, NULL, msg, len, n->sk);
}

static void io_want_tick(void *ud, uint64_t at) {
  h_node *n = ud;
  n->peer_tick_at = at;
  arm(n);
}

static void io_random(void *ud, void *buf, size_t len) {
  h_node *n = ud;
  gw_io io = sim_io(n->h->s, n->index);
  io.random(io.ud, buf, len);
}

/* Harness pings (not train messages): a PING is answered with a PONG by
 * the receiver's harness, as a session's keepalive is by its p2p layer. */
#define H_PING 0xfffe0001u
#define H_PONG 0xfffe0002u
#define H_RTT_ALPHA 0.125
#define H_RTT_BETA 0.25

static void h_ping(h_node *n, h_node *dst) {
  uint8_t buf[9] = {0};
  uint32_t type = H_PING;
  memcpy(buf, &type, 4);
  n->ping_at[dst - n->h->nodes] = sim_now(n->h->s);
  gw_io io = sim_io(n->h->s, n->index);
  n->h->sending = type;
  io.send(io.ud, &dst->peer, buf, sizeof(buf));
}

static void h_pong(h_node *n, int from) {
  h_node *src = &n->h->nodes[from];
  uint8_t buf[9] = {0};
  uint32_t type = H_PONG;
  memcpy(buf, &type, 4);
  gw_io io = sim_io(n->h->s, n->index);
  n->h->sending = type;
  io.send(io.ud, &src->peer, buf, sizeof(buf));
}

static void h_got_pong(h_node *n, int from) {
  if (!n->ping_at[from]) return;
  double rtt = (double)(sim_now(n->h->s) - n->ping_at[from]);
  n->ping_at[from] = 0;
  bool first = n->rtt_samples[from] == 0;
  n->rttvar[from] = first ? rtt / 2 : (1 - H_RTT_BETA) * n->rttvar[from] + H_RTT_BETA * fabs(n->srtt[from] - rtt);
  n->srtt[from] = first ? rtt : (1 - H_RTT_ALPHA) * n->srtt[from] + H_RTT_ALPHA * rtt;
  n->rtt_samples[from]++;
}

static bool io_link(void *ud, const gw_id *peer, train_link *out) {
  h_node *n = ud, *dst = node_by_id(n->h, peer);
  if (!dst || !dst->alive) return false;
  long j = dst - n->h->nodes;
  if (!n->rtt_samples[j] && !n->ping_at[j]) h_ping(n, dst); /* a first sample, as a session's first ping */
  out->srtt_ms = n->srtt[j];
  out->rttvar_ms = n->rttvar[j];
  out->rtt_samples = n->rtt_samples[j];
  out->heard = n->heard[j];
  out->queue_ms = 0;
  return true;
}

static void io_probe(void *ud, const gw_id *peer) {
  h_node *n = ud, *dst = node_by_id(n->h, peer);
  if (dst && dst->alive) h_ping(n, dst);
}

static bool io_connected(void *ud, const gw_id *peer) {
  h_node *me = ud, *n = node_by_id(me->h, peer);
  return n && n->alive && sim_now(me->h->s) >= me->sessions_until[n - me->h->nodes];
}

/* Virtual compute time of one of n's jobs (a slower device: job_ms). */
static uint64_t h_job_ms(const h_node *n) { return n->job_ms ? n->job_ms : H_JOB_MS; }

static int io_compute(void *ud, train_job *job) {
  h_node *n = ud;
  h_harness *h = n->h;
  if (n->n_jobs == 64) return GW_EFULL;
  if (h->hook && !h->hook_fired) {
    int crash = -1;
    if (h->hook(h, n, job, &crash)) {
      h->hook_fired = true;
      /* the job is queued anyway: if its owner crashed, it never completes */
      n->jobs[n->n_jobs++] = (h_job){job, sim_now(h->s) + h_job_ms(n)};
      if (h->hook_silences) h_silence(h, crash);
      else h_crash(h, crash);
      return 0;
    }
  }
  n->jobs[n->n_jobs++] = (h_job){job, sim_now(h->s) + h_job_ms(n)};
  arm(n);
  return 0;
}

static void io_event(void *ud, const train_event *ev) {
  h_node *n = ud;
  switch (ev->kind) {
  case TRAIN_EV_STAGE_ASSIGNED: {
    n->stage = ev->stage;
    n->ready = false; /* a moved relay takes work again once its new stage's state is in place */
    train_shape shape = {H_B, H_T, H_C, H_NP};
    train_peer_set_shape(n->tp, &shape);
    set_holders(n->h); /* a driver looks its stage's replica holders up once it has one */
    break;
  }
  case TRAIN_EV_READY:
    n->ready = true;
    n->stage = ev->stage;
    refresh_members(n->h);
    break;
  case TRAIN_EV_AGGREGATED:
    if (ev->iteration >= 1 && ev->iteration <= 64) {
      memcpy(n->hash_of[ev->iteration - 1], ev->hash, 32);
      n->have_hash[ev->iteration - 1] = true;
    }
    if (n->h->replicate_every > 0 && ev->iteration % (uint64_t)n->h->replicate_every == 0 &&
        train_peer_replica_pusher(n->tp)) {
      /* the fake model's snapshot, taken right after the step */
      char name[64];
      gw_id key;
      snprintf(name, sizeof(name), "run/h/replica/%d", ev->stage);
      gw_id_hash_str(name, &key);
      n->replicas_pushed += (uint32_t)train_peer_push_replica(n->tp, &key, n->h->replicas, n->w, sizeof(n->w),
                                                              ev->iteration, train_peer_step(n->tp), ev->hash);
    }
    break;
  case TRAIN_EV_REPLICA_STORED:
    n->replicas_stored++;
    set_holders(n->h);
    break;
  case TRAIN_EV_REPLICA_DROPPED: n->replicas_dropped++; break;
  case TRAIN_EV_STAGE_LOST: n->stage_lost = true; break;
  case TRAIN_EV_ITERATION_DONE:
    n->iterations_done++;
    n->last_loss = ev->loss;
    n->last_done = ev->done;
    n->last_deferred = ev->deferred;
    if (ev->iteration < 64) n->loss_of[ev->iteration] = ev->loss;
    if (ev->iteration < 64) n->secs_of[ev->iteration] = ev->seconds;
    break;
  case TRAIN_EV_EVAL_DONE: {
    int held = 0;
    for (int i = 0; i < n->h->n_nodes; i++)
      if (n->h->nodes[i].alive) held += h_states_held(&n->h->nodes[i]);
    if (held > n->eval_states_held) n->eval_states_held = held;
    if (ev->iteration <= 64) {
      n->have_eval[ev->iteration] = true;
      n->eval_loss_of[ev->iteration] = ev->loss;
      n->eval_ok_of[ev->iteration] = ev->done;
    }
    break;
  }
  default: break;
  }
}

/* ---- the fake model ---- */

static h_state *state_get(h_node *n, uint64_t key, bool create) {
  for (int i = 0; i < 64; i++)
    if (n->states[i].used && n->states[i].key == key) return &n->states[i];
  if (!create) return NULL;
  for (int i = 0; i < 64; i++) {
    if (!n->states[i].used) {
      n->states[i].used = true;
      n->states[i].key = key;
      n->states[i].in = malloc(ACT_FLOATS * sizeof(float));
      return &n->states[i];
    }
  }
  return NULL;
}

static void state_drop(h_state *s) {
  if (!s) return;
  free(s->in);
  s->in = NULL;
  s->used = false;
}

static void weights_hash(h_node *n, uint8_t out[32]) {
  gw_id h;
  gw_id_hash(n->w, sizeof(n->w), &h);
  memcpy(out, h.b, 32);
}

static void run_job_plain(h_node *n, train_job *job);

/* Whether a hostile node misbehaves in the iteration it is in. */
static bool hostile_now(const h_node *n) {
  uint64_t it = train_peer_iteration(n->tp);
  if (it < n->grad_scale_from) return false;
  return !n->hostile_every || (it - n->grad_scale_from) % n->hostile_every == 0;
}

/* What a hostile node multiplies the gradients it sends by (1: none). */
static float grad_factor(const h_node *n) {
  return n->grad_scale != 0.0f && hostile_now(n) ? n->grad_scale : 1.0f;
}

/* --deterministic: the job's own gradient into job->grad_part, as
 * train/grad_capture.h does on a real stage (the sum is kept). A scaled
 * node scales these too: they are what a deterministic average sums. */
static void run_job(h_node *n, train_job *job) {
  if (job->drop_grad) { /* a re-run where the gradient is held: as train/compute.c */
    float save[H_NP];
    memcpy(save, n->g, sizeof(save));
    run_job_plain(n, job);
    memcpy(n->g, save, sizeof(save));
    return;
  }
  if (!job->grad_part) {
    run_job_plain(n, job);
    return;
  }
  float save[H_NP];
  memcpy(save, n->g, sizeof(save));
  memset(n->g, 0, sizeof(n->g));
  run_job_plain(n, job);
  for (int k = 0; k < H_NP; k++) {
    job->grad_part[k] += n->g[k] * grad_factor(n);
    save[k] += n->g[k];
  }
  memcpy(n->g, save, sizeof(save));
}

static void run_job_plain(h_node *n, train_job *job) {
  const float *in = job->in;
  float *out = job->out;
  h_state *st;
  job->rc = 0;
  job->seconds = (double)h_job_ms(n) / 1000.0;
  switch (job->kind) {
  case TRAIN_JOB_EMBED: {
    const int32_t *tok = job->in;
    st = state_get(n, job->key, true);
    if (++n->in_flight > n->max_in_flight) n->max_in_flight = n->in_flight;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float x = (float)tok[i] / 256.0f;
        st->in[i * H_C + c] = x;
        out[i * H_C + c] = x * (1.0f + n->w[0]) + n->w[1] * (float)(c + 1);
      }
    break;
  }
  case TRAIN_JOB_FORWARD:
    st = state_get(n, job->key, true);
    memcpy(st->in, in, ACT_FLOATS * sizeof(float));
    for (int i = 0; i < ACT_FLOATS; i++) out[i] = in[i] * (1.0f + n->w[0]) + n->w[1];
    break;
  case TRAIN_JOB_LOSS: {
    double loss = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = in[i * H_C + c] - (float)job->targets[i] / 256.0f;
        loss += (double)d * d;
        out[i * H_C + c] = 2.0f * d / (float)ACT_FLOATS;
      }
    job->loss = (float)(loss / ACT_FLOATS);
    break;
  }
  case TRAIN_JOB_BACKWARD:
    st = state_get(n, job->key, false);
    if (!st) {
      job->rc = GW_ENOENT;
      break;
    }
    for (int i = 0; i < ACT_FLOATS; i++) {
      out[i] = in[i] * (1.0f + n->w[0]);
      n->g[0] += in[i] * st->in[i];
      n->g[1] += in[i];
    }
    state_drop(st);
    break;
  case TRAIN_JOB_EMBED_BACKWARD:
    n->in_flight--;
    st = state_get(n, job->key, false);
    if (!st) {
      job->rc = GW_ENOENT;
      break;
    }
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        n->g[0] += in[i * H_C + c] * st->in[i * H_C + c];
        n->g[1] += in[i * H_C + c] * (float)(c + 1);
      }
    state_drop(st);
    break;
  case TRAIN_JOB_RELEASE:
    st = state_get(n, job->key, false);
    if (st && n->role == TRAIN_DATA) n->in_flight--; /* a deferred microbatch is no longer in flight */
    state_drop(st);
    break;
  case TRAIN_JOB_GRAD_EXPORT:
    for (int k = 0; k < H_NP; k++) out[k] = n->grad_nan && hostile_now(n) ? NAN : n->g[k] * grad_factor(n);
    break;
  case TRAIN_JOB_APPLY:
    for (int k = 0; k < H_NP; k++) n->w[k] -= H_LR * in[k];
    memset(n->g, 0, sizeof(n->g));
    weights_hash(n, job->hash);
    break;
  case TRAIN_JOB_SKIP_STEP:
    memset(n->g, 0, sizeof(n->g));
    weights_hash(n, job->hash);
    break;
  case TRAIN_JOB_SNAPSHOT:
    job->blob = malloc(sizeof(n->w));
    memcpy(job->blob, n->w, sizeof(n->w));
    if (n->bad_snapshot)
      for (int k = 0; k < H_NP; k++) ((float *)job->blob)[k] += 1.0f;
    job->blob_len = sizeof(n->w);
    break;
  /* validation: the same arithmetic, nothing kept, no gradient */
  case TRAIN_JOB_EVAL_EMBED: {
    const int32_t *tok = job->in;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++)
        out[i * H_C + c] = (float)tok[i] / 256.0f * (1.0f + n->w[0]) + n->w[1] * (float)(c + 1);
    break;
  }
  case TRAIN_JOB_EVAL_FORWARD:
    for (int i = 0; i < ACT_FLOATS; i++) out[i] = in[i] * (1.0f + n->w[0]) + n->w[1];
    break;
  case TRAIN_JOB_EVAL_LOSS: {
    double loss = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = in[i * H_C + c] - (float)job->targets[i] / 256.0f;
        loss += (double)d * d;
      }
    job->loss = (float)(loss / ACT_FLOATS);
    break;
  }
  case TRAIN_JOB_RESTORE:
    if (job->in_bytes != sizeof(n->w)) {
      job->rc = GW_EINVAL;
      break;
    }
    memcpy(n->w, in, sizeof(n->w));
    memset(n->g, 0, sizeof(n->g));
    weights_hash(n, job->hash);
    break;
  }
}

/* ---- sim callbacks ---- */

static void on_message(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  h_node *n = ud;
  uint32_t type, blen;
  if (!n->tp || len < 9) return;
  memcpy(&type, buf, 4);
  memcpy(&blen, buf + 4, 4);
  h_node *src = node_by_id(n->h, &from->id);
  int si = src ? (int)(src - n->h->nodes) : -1;
  if (src) n->heard[si]++;
  if (type == H_PING || type == H_PONG) {
    if (src && type == H_PING) h_pong(n, si);
    if (src && type == H_PONG) h_got_pong(n, si);
    return;
  }
  if (type == GWTF__TRAIN_MSG__TRAIN_GRAD) n->grads_in++;
  const uint8_t *body = buf + 8, *q = body + blen;
  train_tensor t, *tp = NULL;
  if (*q++) {
    memset(&t, 0, sizeof(t));
    t.dtype = (train_dtype)*q++;
    t.ndim = *q++;
    memcpy(t.shape, q, 32), q += 32;
    uint64_t nb;
    memcpy(&nb, q, 8), q += 8;
    t.nbytes = nb;
    t.data = q;
    tp = &t;
    if (type == GWTF__TRAIN_MSG__TRAIN_FORWARD || type == GWTF__TRAIN_MSG__TRAIN_BACKWARD) {
      n->act_recv[t.dtype & 31]++;
      if (type == GWTF__TRAIN_MSG__TRAIN_BACKWARD) n->bwd_recv[t.dtype & 31]++;
      n->act_recv_bytes += nb;
    }
  }
  train_peer_on_message(n->tp, &from->id, type, body, blen, tp, now);
}

static void on_tick(void *ud, uint64_t now) {
  h_node *n = ud;
  if (!n->alive) return;
  for (int i = 0; i < n->n_jobs;) {
    if (n->jobs[i].done_at > now) {
      i++;
      continue;
    }
    /* one worker, first in first out, as in the node */
    train_job *job = n->jobs[i].job;
    memmove(&n->jobs[i], &n->jobs[i + 1], (size_t)(n->n_jobs - i - 1) * sizeof(n->jobs[0]));
    n->n_jobs--;
    run_job(n, job);
    n->jobs_done++;
    train_peer_on_job_done(n->tp, job, now);
    if (!n->alive) return;
  }
  if (now >= n->peer_tick_at) {
    n->peer_tick_at = UINT64_MAX;
    train_peer_on_tick(n->tp, now);
  }
  arm(n);
}

static const sim_node_ops ops = {on_message, on_tick};

/* ---- harness API ---- */

int h_sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets) {
  (void)ud;
  for (int i = 0; i < H_B * H_T; i++) {
    inputs[i] = (int32_t)((iteration * 31 + index * 7 + (uint64_t)i * 3) % 256);
    targets[i] = (inputs[i] * 5 + 11) % 256;
  }
  return 0;
}

int h_val_sample(void *ud, uint32_t index, int32_t *inputs, int32_t *targets) {
  (void)ud;
  for (int i = 0; i < H_B * H_T; i++) {
    inputs[i] = (int32_t)((index * 53 + (uint32_t)i * 11 + 5) % 256);
    targets[i] = (inputs[i] * 5 + 11) % 256;
  }
  return 0;
}

/* A session to a crashed peer ends (sim_notice_down_after_in_flight). */
static void session_down(void *ud, void *node, const gw_peer *peer, uint64_t now_ms) {
  (void)ud;
  h_node *n = node;
  if (n->alive && n->tp) train_peer_on_peer_down(n->tp, &peer->id, now_ms);
}

void h_init(h_harness *h, int n_stages, uint64_t seed, bool verbose) {
  memset(h, 0, sizeof(*h));
  h->n_stages = n_stages;
  h->seed = seed;
  h->s = sim_new(&(sim_config){.seed = seed, .delay_min_ms = 1, .delay_max_ms = 3, .fifo = true});
  sim_set_peer_down_fn(h->s, session_down, h);
  h->tcp_order = true; /* as the transport (TCP) delivers a session's end */
  train_tunables_default(&h->tun);
  h->tun.hop_timeout_ms = 500;
  h->tun.agg_timeout_ms = 2000;
  h->tun.stall_timeout_ms = 10000;
  gw_log_sink_init(&h->sink, stderr, verbose ? GW_LOG_DEBUG : GW_LOG_OFF, GW_LOG_TEXT);
}

void h_free(h_harness *h) {
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *n = &h->nodes[i];
    for (int k = 0; k < n->n_jobs; k++) train_job_free(n->jobs[k].job);
    train_peer_free(n->tp);
    for (int k = 0; k < 64; k++) state_drop(&n->states[k]);
  }
  sim_free(h->s);
}

int h_add(h_harness *h, train_role role, int stage, uint32_t capacity, uint64_t iterations, bool initial) {
  int i = h->n_nodes++;
  h_node *n = &h->nodes[i];
  memset(n, 0, sizeof(*n));
  n->h = h;
  n->alive = true;
  n->role = role;
  n->stage = stage;
  n->capacity = capacity;
  n->peer_tick_at = UINT64_MAX;
  char name[32];
  snprintf(name, sizeof(name), "peer-%llu-%d", (unsigned long long)h->seed, i);
  gw_id seed;
  gw_id_hash_str(name, &seed); /* a key pair per name, and the ID it stands for */
  crypto_sign_seed_keypair(n->pk, n->sk, seed.b);
  gw_id_hash(n->pk, sizeof(n->pk), &n->peer.id);
  n->peer.addr.family = 4;
  n->peer.addr.ip[0] = 10;
  n->peer.addr.ip[3] = (uint8_t)(i + 1);
  n->peer.addr.port = 7000;
  n->index = sim_add_node(h->s, &n->peer, &ops, n);
  train_peer_config cfg = {.self = n->peer.id, .role = role, .n_stages = h->n_stages, .stage = stage,
                           .capacity = capacity, .shape = {H_B, H_T, H_C, H_NP}, .iterations = iterations,
                           .recovery = h->recovery, .tun = h->tun, .initial_weights = initial, .movable = h->movable,
                           .wire_dtype = h->wire_dtype, .wire_grad_dtype = h->wire_grad_dtype,
                           .wire_accept = h->wire_accept, .join_stage = h->join_stage,
                           .grant_join_stage = h->grant_join_stage, .subspace_k = h->subspace_k,
                           .model = {MODEL_GPT, H_C, 1, 2, 4, 256, H_T, 1e-5f, 10000.0f}, .seed = h->seed};
  memcpy(cfg.node_pk, n->pk, sizeof(cfg.node_pk));
  memcpy(cfg.run_id, h_run_id()->b, sizeof(cfg.run_id));
  train_io io = {.ud = n, .send = io_send, .want_tick = io_want_tick, .random = io_random,
                 .connected = io_connected, .compute = io_compute, .event = io_event, .sign = io_sign};
  if (!h->no_links) io.link = io_link, io.probe = io_probe;
  train_router router = {.ctx = n, .next_hop = route, .slots = slots};
  gw_log lg;
  gw_log_init(&lg, &h->sink, &n->peer.id);
  train_peer_new(&n->tp, &cfg, &io, &router, &lg);
  if (h->replica_max) train_peer_set_replica_store(n->tp, h->replica_max, 0);
  if (role == TRAIN_DATA) train_peer_set_sampler(n->tp, h_sample, NULL);
  return i;
}

void h_start(h_harness *h, int index) {
  refresh_members(h);
  train_peer_start(h->nodes[index].tp, sim_now(h->s));
  refresh_members(h);
}

void h_crash(h_harness *h, int index) {
  h_node *n = &h->nodes[index];
  if (!n->alive) return;
  n->alive = false;
  sim_crash(h->s, n->index);
  /* Sessions to it drop: every other peer hears about it at once, or (tcp_order)
   * once what it sent that peer has arrived. */
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].alive && h->nodes[i].tp &&
        !(h->tcp_order && sim_notice_down_after_in_flight(h->s, h->nodes[i].index, n->index)))
      train_peer_on_peer_down(h->nodes[i].tp, &n->peer.id, sim_now(h->s));
  refresh_members(h);
}

void h_silence(h_harness *h, int index) {
  h_node *n = &h->nodes[index];
  if (!n->alive || n->silent) return;
  n->silent = true;
  sim_crash(h->s, n->index); /* nothing it had queued leaves; it answers nothing */
}

static bool all_finished(void *ud) {
  h_harness *h = ud;
  bool any = false;
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *n = &h->nodes[i];
    if (n->alive && n->role == TRAIN_DATA) {
      any = true;
      if (!train_peer_finished(n->tp)) return false;
    }
  }
  return any;
}

bool h_run_until_finished(h_harness *h, uint64_t deadline_ms) {
  return sim_run_while_not(h->s, all_finished, h, deadline_ms);
}

void h_run_for(h_harness *h, uint64_t ms) { sim_run_until(h->s, sim_now(h->s) + ms); }

int h_inject(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len, const train_tensor *t) {
  return raw_send(&h->nodes[from], &h->nodes[to].peer.id, type, body, len, t);
}

const gw_id *h_run_id(void) {
  static gw_id id;
  static bool ready;
  if (!ready) gw_id_hash_str("run/harness", &id);
  ready = true;
  return &id;
}

int h_by_id(h_harness *h, int stage, int *out, int max) {
  int n = 0;
  for (int i = 0; i < h->n_nodes && n < max; i++)
    if (h->nodes[i].alive && h->nodes[i].stage == stage) out[n++] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && gw_id_cmp(&h->nodes[out[j]].peer.id, &h->nodes[out[j - 1]].peer.id) < 0; j--) {
      int t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
  return n;
}

int h_states_held(const h_node *n) {
  int k = 0;
  for (int i = 0; i < 64; i++) k += n->states[i].used;
  return k;
}

bool h_hashes_agree(h_harness *h, uint64_t iterations, char *why, size_t why_len) {
  for (uint64_t it = 0; it < iterations && it < 64; it++) {
    for (int s = 0; s <= h->n_stages; s++) {
      const uint8_t *ref = NULL;
      for (int i = 0; i < h->n_nodes; i++) {
        h_node *n = &h->nodes[i];
        if (n->stage != s || !n->have_hash[it]) continue;
        if (!ref) {
          ref = n->hash_of[it];
        } else if (memcmp(ref, n->hash_of[it], 32) != 0) {
          snprintf(why, why_len, "stage %d disagrees after iteration %llu (node %d)", s,
                   (unsigned long long)it, i);
          return false;
        }
      }
    }
  }
  return true;
}
