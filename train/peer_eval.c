/* train/peer_eval.c — validation loss: a data node runs a fixed set of
 * held-out microbatches forward through the pipeline, without gradients.
 *
 * When: before iteration i starts (after CAN_TAKE, on the weights of i
 * aggregations) for i = 0, every, 2*every, ..., and once more after the last
 * iteration, so a run's curve starts at its initial weights and ends at its
 * final ones. The iteration waits for the evaluation: it never overlaps our
 * own training microbatches, and the relays are in our iteration, not
 * aggregating, so they accept the FORWARDs.
 *
 * How: an eval microbatch is a peer_mb with `eval` set (and EVAL_ID_BIT in
 * its id), so it travels exactly like a training one: the same router, the
 * same FORWARD / FORWARD_RECEIVED / FORWARD_DONE, re-routes, DENY and
 * waiting for a full stage (peer_mb.c). What differs:
 *   - its FORWARD says eval=true; a relay runs TRAIN_JOB_EVAL_FORWARD, which
 *     keeps no activations, and frees the microbatch once FORWARD_DONE says
 *     its output is held two hops on. It never sees a backward, so it adds
 *     nothing to the relay's gradient or to its aggregation weight;
 *   - the data node's embedding and loss jobs keep nothing and accumulate no
 *     gradient (TRAIN_JOB_EVAL_EMBED, TRAIN_JOB_EVAL_LOSS);
 *   - a microbatch that cannot be placed or does not come back in time is
 *     not deferred to a later iteration: it is simply not evaluated this
 *     time. eval.done then says so (complete=0, tokens < wanted) and its
 *     val_loss is the mean over those that came back, not comparable to a
 *     complete one's.
 * The losses are summed in validation-index order (in double), so the
 * result does not depend on the order microbatches came home in. */
#include "train/peer_data.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

void train_peer_set_validation(train_peer *p, train_val_fn fn, void *ud, uint32_t n, uint64_t every) {
  eval_free(p);
  p->eval.fn = fn;
  p->eval.ud = ud;
  p->eval.n = !fn ? 0 : n > 0xfffff ? 0xfffff : n; /* the index lives in the id's low 20 bits */
  p->eval.every = every;
}

void eval_free(train_peer *p) {
  free(p->eval.loss);
  free(p->eval.got);
  p->eval.loss = NULL;
  p->eval.got = NULL;
}

static bool eval_due(const train_peer *p) {
  if (!p->eval.every || !p->eval.n || p->eval.done_for == p->iteration + 1) return false;
  bool last = p->cfg.iterations && p->iteration >= p->cfg.iterations;
  return p->iteration % p->eval.every == 0 || last;
}

static uint64_t eval_id(const train_peer *p, uint32_t index) {
  return EVAL_ID_BIT | (p->eval.iteration << 20) | (index & 0xfffff);
}

/* Whether any microbatch of the running evaluation is still out. */
static bool eval_live(const train_peer *p) {
  for (size_t i = 0; i < p->n_mbs; i++)
    if (p->mbs[i].used && p->mbs[i].eval) return true;
  return false;
}

/* Sends validation microbatch `index` down route `slot`: embedding first. */
static int eval_launch(train_peer *p, uint32_t index, uint32_t slot) {
  peer_mb *mb = mb_new(p, &p->cfg.self, eval_id(p, index));
  if (!mb) return GW_ENOMEM;
  size_t bt = (size_t)p->cfg.shape.B * (size_t)p->cfg.shape.T;
  mb->eval = true;
  mb->iteration = p->eval.iteration;
  mb->index = slot;
  mb->tokens = malloc(bt * sizeof(int32_t));
  mb->targets = malloc(bt * sizeof(int32_t));
  mb->out = malloc(peer_act_floats(p) * sizeof(float));
  if (!mb->tokens || !mb->targets || !mb->out || p->eval.fn(p->eval.ud, index, mb->tokens, mb->targets) != 0 ||
      !peer_submit(p, TRAIN_JOB_EVAL_EMBED, mb, mb->tokens, bt * sizeof(int32_t), mb->out,
                   peer_act_floats(p) * sizeof(float))) {
    mb_free(p, mb);
    return GW_EIO;
  }
  mb->fwd = FWD_EMBED;
  return 0;
}

/* The next validation microbatch down `slot`; one that cannot even start
 * counts as not evaluated. */
static void eval_refill(train_peer *p, uint32_t slot) {
  while (p->eval.next < p->eval.n) {
    uint32_t index = p->eval.next++;
    if (eval_launch(p, index, slot) == 0) return;
    p->eval.finished++;
  }
}

static void eval_report(train_peer *p) {
  double sum = 0;
  for (uint32_t i = 0; i < p->eval.n; i++)
    if (p->eval.got[i]) sum += p->eval.loss[i];
  uint64_t bt = (uint64_t)p->cfg.shape.B * (uint64_t)p->cfg.shape.T;
  double secs = (double)(p->now - p->eval.started_ms) / 1000.0;
  double loss = p->eval.ok ? sum / p->eval.ok : NAN;
  unsigned long long it = (unsigned long long)p->eval.iteration;
  if (p->eval.ok == 0)
    GW_WARN(&p->log, "eval.done", "iter=%llu tokens=0 wanted=%llu microbatches=0/%u complete=0 secs=%.3f "
            "msg=\"no validation microbatch came back\"",
            it, (unsigned long long)(bt * p->eval.n), p->eval.n, secs);
  else
    GW_INFO(&p->log, "eval.done",
            "iter=%llu val_loss=%.9g tokens=%llu wanted=%llu microbatches=%u/%u complete=%d secs=%.3f", it, loss,
            (unsigned long long)(bt * p->eval.ok), (unsigned long long)(bt * p->eval.n), p->eval.ok, p->eval.n,
            p->eval.ok == p->eval.n, secs);
  if (p->io.event) {
    train_event ev = {.kind = TRAIN_EV_EVAL_DONE, .stage = p->stage, .iteration = p->eval.iteration,
                      .leader = p->leader, .loss = loss, .seconds = secs, .done = p->eval.ok,
                      .deferred = p->eval.n - p->eval.ok};
    p->io.event(p->io.ud, &ev);
  }
  p->eval.running = false;
  p->eval.done_for = p->eval.iteration + 1;
  /* The next iteration's time (iteration.done secs, the swarm's time per
   * microbatch) runs from the last aggregation: the evaluation is not part
   * of it. */
  p->last_update_ms += p->now - p->eval.started_ms;
}

static void eval_start(train_peer *p, uint32_t slots) {
  eval_free(p);
  p->eval.loss = calloc(p->eval.n, sizeof(float));
  p->eval.got = calloc(p->eval.n, sizeof(bool));
  p->eval.running = true;
  p->eval.iteration = p->iteration;
  p->eval.next = p->eval.finished = p->eval.ok = 0;
  p->eval.started_ms = p->now;
  if (!p->eval.loss || !p->eval.got) {
    p->eval.finished = p->eval.next = p->eval.n; /* reported as nothing evaluated */
  } else {
    /* As many at once as an iteration would start: one per route, up to
     * our share of the narrowest stage. */
    uint32_t share = data_share(p);
    uint32_t n = slots == 0 ? 0 : slots > share ? slots : share;
    if (n > p->eval.n) n = p->eval.n;
    GW_INFO(&p->log, "eval.started", "iter=%llu microbatches=%u routes=%u", (unsigned long long)p->iteration,
            p->eval.n, slots);
    if (n == 0) p->eval.finished = p->eval.next = p->eval.n;
    for (uint32_t slot = 0; slot < n; slot++) eval_refill(p, slot);
  }
  if (p->eval.finished == p->eval.n) eval_report(p);
}

bool eval_tick(train_peer *p) {
  if (p->eval.running && !eval_live(p)) {
    /* Its microbatches went without a word (a resync or an aggregation
     * abandoned them): what never came back was not evaluated. */
    p->eval.finished = p->eval.next = p->eval.n;
    eval_report(p);
  }
  if (p->eval.running) return true;
  if (!eval_due(p)) return false;
  uint32_t slots;
  if (!data_routes_ready(p, p->cfg.capacity, &slots)) return true;
  p->waiting_flows_since = 0; /* the iteration after us waits on its own clock */
  eval_start(p, slots);
  return p->eval.running;
}

void eval_on_return(train_peer *p, peer_mb *mb) {
  size_t n = peer_act_floats(p);
  if (!mb->in) return eval_mb_finished(p, mb, MB_DEFERRED);
  mb->fwd = FWD_LOSS;
  if (!peer_submit(p, TRAIN_JOB_EVAL_LOSS, mb, mb->in, n * sizeof(float), NULL, 0))
    eval_mb_finished(p, mb, MB_DEFERRED);
}

void eval_mb_finished(train_peer *p, peer_mb *mb, mb_end how) {
  uint32_t slot = mb->index, index = (uint32_t)(mb->id & 0xfffff);
  bool ours = p->eval.running && (mb->id & ~(uint64_t)0xfffff) == (eval_id(p, 0) & ~(uint64_t)0xfffff);
  if (ours && how == MB_COMPLETE && index < p->eval.n && !p->eval.got[index]) {
    p->eval.got[index] = true;
    p->eval.loss[index] = mb->loss;
    p->eval.ok++;
  } else if (ours && how != MB_COMPLETE) {
    GW_INFO(&p->log, "eval.microbatch_lost", "mb=%llx iter=%llu", (unsigned long long)mb->id,
            (unsigned long long)mb->iteration);
  }
  mb->end = how;
  mb_free(p, mb);
  if (!ours) return;
  p->eval.finished++;
  eval_refill(p, slot);
  if (p->eval.finished >= p->eval.n) eval_report(p);
}

/* Not compute.done: the swarm counts those as training compute (useful or
 * wasted), and an evaluation is neither. */
static void log_eval_compute(train_peer *p, const peer_mb *mb, const char *kind, double s) {
  GW_DEBUG(&p->log, "eval.compute", "mb=%llx kind=%s secs=%.4f iter=%llu", (unsigned long long)mb->id, kind, s,
           (unsigned long long)mb->iteration);
}

void eval_job_done(train_peer *p, peer_mb *mb, train_job *job) {
  if (job->rc != 0) {
    GW_ERROR(&p->log, "compute.failed", "mb=%llx kind=%d rc=%d", (unsigned long long)mb->id, (int)job->kind, job->rc);
    if (p->cfg.role == TRAIN_DATA) eval_mb_finished(p, mb, MB_DEFERRED);
    else mb_free(p, mb);
    return;
  }
  switch (job->kind) {
  case TRAIN_JOB_EVAL_EMBED:
    log_eval_compute(p, mb, "embed", job->seconds);
    data_send_embedding(p, mb);
    break;
  case TRAIN_JOB_EVAL_FORWARD:
    log_eval_compute(p, mb, "forward", job->seconds);
    free(mb->in);
    mb->in = NULL;
    if (mb->path_len < PEER_MAX_PATH) mb->path[mb->path_len++] = p->cfg.self;
    /* FORWARD_DONE upstream waits until the next peer holds our output. */
    mb_send_forward(p, mb);
    break;
  case TRAIN_JOB_EVAL_LOSS:
    log_eval_compute(p, mb, "loss", job->seconds);
    mb->loss = job->loss;
    mb->fwd = FWD_DONE;
    mb_ack(p, &mb->next, GWTF__TRAIN_MSG__TRAIN_FORWARD_DONE, mb, NULL); /* the last relay may let go of it */
    eval_mb_finished(p, mb, MB_COMPLETE);
    break;
  default: break;
  }
}
