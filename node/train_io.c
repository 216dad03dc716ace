/* node/train_io.c — the train peer's and the flow protocol's io, the peer's clock and the compute worker. */
#include "node/train_rt.h"

#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <string.h>
#include <time.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "gwtf.pb-c.h"
#include "node/train_access.h"
#include "node/worker.h"
#include "train/checkpoint.h"
#include "train/compute.h"
#include "train/route_flow.h"
#include "train/stage.h"
#include "train/wire_codec.h"
#include "util/err.h"

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
int train_rt_next_load(void *ud, const gw_id *peer, train_load *out) {
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
void train_rt_log_wire(train_rt *rt, uint64_t iteration) {
  const train_counters *c = train_peer_counters(rt->peer);
  GW_INFO(&rt->log, "wire.sent", "iter=%llu tensors=%llu bytes=%llu fp32_bytes=%llu early=%llu early_bytes=%llu",
          (unsigned long long)iteration, (unsigned long long)c->wire_tensors, (unsigned long long)c->wire_bytes,
          (unsigned long long)c->wire_f32_bytes, (unsigned long long)c->wire_early_tensors,
          (unsigned long long)c->wire_early_bytes);
}

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
void train_rt_stop_soon(train_rt *rt) { uv_timer_start(&rt->stop_timer, stop_cb, 0, 0); }

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
void train_rt_run_job(void *ctx, train_job *job) {
  train_rt *rt = ctx;
  if (job->owner == &rt->switch_marker) {
    /* a move to another stage (train/peer_move.c): every job of the old
     * stage was queued before this one and has run */
    train_compute_free(&rt->compute);
    train_compute_init(&rt->compute, &rt->switch_spec, &rt->switch_dev, rt->o->threads, rt->run.seed,
                       &rt->switch_opt);
    train_compute_set_subspace(&rt->compute, rt->run.subspace_k, rt->run.subspace_refresh);
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

void train_rt_on_job_done(void *ud, train_job *job) {
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

/* ---- the io tables ---- */

/* The train peer's view of the node (train/peer.h). */
train_io train_rt_peer_io(train_rt *rt) {
  train_io io = {.ud = rt, .send = io_send, .want_tick = io_want_tick, .random = io_random,
                 .connected = io_connected, .compute = io_compute, .event = train_rt_on_peer_event,
                 .peer_info = train_rt_peer_info, .unix_s = io_unix_s, .redeem = io_redeem, .sign = io_sign,
                 .link = io_link, .probe = io_probe};
  return io;
}

/* The flow protocol's (flow/flow.h). */
gw_io train_rt_flow_io(train_rt *rt) {
  return (gw_io){.ud = rt, .send = flow_send, .want_tick = flow_want_tick, .random = io_random};
}
