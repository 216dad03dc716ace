/* train/compute.c — see compute.h. */
#include "train/compute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/grad_capture.h"
#include "util/err.h"

void train_compute_init(train_compute *c, const stage_spec *spec, const gpu_device *dev, int threads,
                        uint64_t init_seed, const adamw_config *opt) {
  memset(c, 0, sizeof(*c));
  c->spec = *spec;
  c->device = *dev;
  c->threads = threads;
  c->init_seed = init_seed;
  c->opt = *opt;
}

void train_compute_set_subspace(train_compute *c, int k, int refresh) {
  c->sub_k = k;
  c->sub_refresh = refresh;
}

void train_compute_free(train_compute *c) {
  subspace_free(&c->sub);
  stage_destroy(c->st);
  gpu_backend_close(c->be);
  free(c->cap_save);
  free(c->cap_scratch);
  c->cap_save = c->cap_scratch = NULL;
  c->st = NULL;
  c->be = NULL;
}

size_t train_compute_n_params(const stage_spec *spec) {
  size_t n = (size_t)spec->n_layers * model_block_numel(&spec->model);
  if (spec->has_head) n += model_head_numel(&spec->model);
  return n;
}

static int ensure_stage(train_compute *c) {
  if (c->st) return 0;
  gpu_options opt = {.threads = c->threads};
  int rc = gpu_backend_open(&c->device, &opt, &c->be, c->err, sizeof(c->err));
  if (rc == 0) rc = stage_create(&c->spec, c->be, c->init_seed, &c->st, c->err, sizeof(c->err));
  if (rc == 0 && c->sub_k) {
    size_t rows = (size_t)c->spec.batch * (size_t)c->spec.seq_len;
    rc = subspace_init(&c->sub, &c->spec.model, c->sub_k, c->sub_refresh, c->init_seed, rows, c->err, sizeof(c->err));
    if (rc == 0) rc = subspace_after_step(&c->sub, c->st); /* the seeded weights, as after a step */
  }
  if (rc != 0) {
    fprintf(stderr, "gwtf: cannot create the stage: %s\n", c->err);
    gpu_backend_close(c->be);
    c->be = NULL;
  }
  return rc;
}

static int hash_into(train_compute *c, train_job *job) { return stage_weight_hash(c->st, job->hash); }

/* One AdamW step with the stage's averaged gradient. */
static int apply(train_compute *c, train_job *job) {
  size_t n = stage_n_params(c->st);
  if (job->in_bytes != n * sizeof(float)) return GW_EINVAL;
  int rc = stage_write(c->st, STAGE_GRADS, 0, n, job->in);
  if (rc == 0 && c->sub_k) rc = subspace_before_step(&c->sub, c->st);
  if (rc == 0) rc = stage_step(c->st, &c->opt, adamw_lr_at(&c->opt, stage_step_count(c->st) + 1), 1.0f);
  if (rc == 0 && c->sub_k) rc = subspace_after_step(&c->sub, c->st);
  if (rc == 0) rc = stage_zero_grads(c->st);
  if (rc == 0) rc = hash_into(c, job);
  return rc;
}

static int snapshot(train_compute *c, train_job *job) {
  size_t len;
  int rc = stage_state_size(c->st, &len);
  if (rc != 0) return rc;
  job->blob = malloc(len);
  if (!job->blob) return GW_ENOMEM;
  rc = stage_state_read(c->st, 0, job->blob, len);
  if (rc != 0) {
    free(job->blob);
    job->blob = NULL;
    return rc;
  }
  job->blob_len = len;
  return 0;
}

static int restore(train_compute *c, train_job *job) {
  int rc = stage_state_load(c->st, job->in, job->in_bytes, c->err, sizeof(c->err));
  if (rc != 0) {
    fprintf(stderr, "gwtf: cannot load the stage state: %s\n", c->err);
    return rc;
  }
  return hash_into(c, job);
}

/* A microbatch key may come back (a repair through a peer that once held
 * it): drop the old state and run again. */
static int forward(train_compute *c, train_job *job) {
  int rc = stage_forward(c->st, job->key, job->in, job->out);
  if (rc == GW_EEXIST) {
    stage_release(c->st, job->key);
    rc = stage_forward(c->st, job->key, job->in, job->out);
  }
  return rc;
}

static int embed(train_compute *c, train_job *job) {
  int rc = stage_embed_forward(c->st, job->key, job->in, job->out);
  if (rc == GW_EEXIST) {
    stage_release(c->st, job->key);
    rc = stage_embed_forward(c->st, job->key, job->in, job->out);
  }
  return rc;
}

/* Validation: run the forward and let go of what it kept at once. */
static int eval_forward(train_compute *c, train_job *job, bool data_node) {
  int rc = data_node ? embed(c, job) : forward(c, job);
  stage_release(c->st, job->key);
  return rc;
}

static void run_job(train_compute *c, train_job *job);

/* --deterministic: the job runs on a zeroed gradient and adds its own into
 * job->grad_part (train/grad_capture.h). */
static void run_captured(train_compute *c, train_job *job) {
  size_t n = stage_n_params(c->st);
  if (!c->cap_save) c->cap_save = malloc(n * sizeof(float));
  if (!c->cap_scratch) c->cap_scratch = malloc(n * sizeof(float));
  if (!c->cap_save || !c->cap_scratch) {
    job->rc = GW_ENOMEM;
    return;
  }
  job->rc = grad_capture_begin(c->st, c->cap_save);
  if (job->rc != 0) return;
  run_job(c, job);
  int rc = grad_capture_end(c->st, c->cap_save, c->cap_scratch, job->grad_part);
  if (job->rc == 0) job->rc = rc;
}

/* A re-run's job on a stage that holds the microbatch's gradient already:
 * the stage's sum is put back as it was (train/peer_ledger.h). */
static void run_dropped(train_compute *c, train_job *job) {
  size_t n = stage_n_params(c->st);
  if (!c->cap_save) c->cap_save = malloc(n * sizeof(float));
  if (!c->cap_save) {
    job->rc = GW_ENOMEM;
    return;
  }
  job->rc = stage_read(c->st, STAGE_GRADS, 0, n, c->cap_save);
  if (job->rc != 0) return;
  run_job(c, job);
  int rc = stage_write(c->st, STAGE_GRADS, 0, n, c->cap_save);
  if (job->rc == 0) job->rc = rc;
}

void train_compute_run(void *ctx, train_job *job) {
  train_compute *c = ctx;
  job->rc = ensure_stage(c);
  if (job->rc != 0) return;
  bool grads = job->kind == TRAIN_JOB_LOSS || job->kind == TRAIN_JOB_BACKWARD || job->kind == TRAIN_JOB_EMBED_BACKWARD;
  if (grads && job->drop_grad) run_dropped(c, job);
  else if (grads && job->grad_part) run_captured(c, job);
  else run_job(c, job);
}

static void run_job(train_compute *c, train_job *job) {
  switch (job->kind) {
  case TRAIN_JOB_EMBED: job->rc = embed(c, job); break;
  case TRAIN_JOB_FORWARD: job->rc = forward(c, job); break;
  case TRAIN_JOB_LOSS: job->rc = stage_loss(c->st, job->in, job->targets, &job->loss, job->out); break;
  case TRAIN_JOB_BACKWARD:
    job->rc = stage_backward(c->st, job->key, job->in, job->out);
    stage_release(c->st, job->key);
    break;
  case TRAIN_JOB_EMBED_BACKWARD:
    job->rc = stage_embed_backward(c->st, job->key, job->in);
    stage_release(c->st, job->key);
    break;
  case TRAIN_JOB_RELEASE: stage_release(c->st, job->key); break; /* GW_ENOENT is fine: nothing kept */
  case TRAIN_JOB_GRAD_EXPORT:
    job->rc = stage_read(c->st, STAGE_GRADS, 0, stage_n_params(c->st), job->out);
    break;
  case TRAIN_JOB_APPLY: job->rc = apply(c, job); break;
  case TRAIN_JOB_SKIP_STEP:
    job->rc = stage_zero_grads(c->st);
    if (job->rc == 0) job->rc = hash_into(c, job);
    break;
  case TRAIN_JOB_SNAPSHOT: job->rc = snapshot(c, job); break;
  case TRAIN_JOB_RESTORE: job->rc = restore(c, job); break;
  case TRAIN_JOB_EVAL_EMBED: job->rc = eval_forward(c, job, true); break;
  case TRAIN_JOB_EVAL_FORWARD: job->rc = eval_forward(c, job, false); break;
  case TRAIN_JOB_EVAL_LOSS: job->rc = stage_loss_eval(c->st, job->in, job->targets, &job->loss); break;
  default: job->rc = GW_EINVAL; break;
  }
}
