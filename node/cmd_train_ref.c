/* `gwtf train-ref`: the run a swarm trains, trained in one process.
 *
 * Same model, same stage split, same initial weights (seeded per tensor),
 * same microbatches (sampled from (data seed, iteration, index)), same
 * optimizer: each iteration runs M microbatches through every stage and
 * steps with their mean gradient. A fault-free swarm's per-iteration loss
 * equals this one's up to the order of floating-point sums — the check that
 * the distributed machinery trains the model it claims to. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "node/cmd.h"
#include "train/data.h"
#include "train/run.h"
#include "train/wire_codec.h"
#include "util/err.h"

void cmd_train_ref_help(void) {
  printf("usage: gwtf train-ref --dataset PATH [--model PRESET|FILE] [--stages S] [--iterations N]\n"
         "                      [--microbatches M] [--batch B] [--seq T] [--lr X] [--seed S]\n"
         "                      [--data-seed D] [--threads N] [--wire-dtype fp32|bf16|fp16|int8] [--json]\n\n"
         "Trains in one process exactly what a fault-free swarm with these run settings\n"
         "trains (one data node with --data-seed D), and prints the loss of each\n"
         "iteration. Defaults match `gwtf node --create-run`. --wire-dtype passes every\n"
         "activation and gradient between two stages through that wire format, as a\n"
         "swarm whose peers all use it does.\n");
}

typedef struct ref {
  train_run run;
  gpu_backend *be;
  stage *st[TRAIN_RUN_MAX_STAGES + 1];
  adamw_config opt;
  train_dataset ds;
  uint64_t data_seed;
  train_dtype wire;  /* stage boundaries go through this wire format (F32: untouched) */
  uint8_t *wire_buf;
} ref;

/* What crossing one link does to an activation or gradient. */
static int wire_cross(ref *r, float *x) {
  if (r->wire == TRAIN_F32) return 0;
  size_t rows = (size_t)r->run.batch * r->run.seq, cols = (size_t)r->run.model.d_model;
  size_t n = wire_bytes(r->wire, rows, cols);
  int rc = wire_encode(r->wire, x, rows, cols, r->wire_buf, n);
  return rc ? rc : wire_decode(r->wire, r->wire_buf, n, rows, cols, x);
}

static int build(ref *r, char *err, size_t err_len) {
  for (int s = 0; s <= r->run.stages; s++) {
    stage_spec spec;
    train_run_stage_spec(&r->run, s, 2, &spec);
    int rc = stage_create(&spec, r->be, r->run.seed, &r->st[s], err, err_len);
    if (rc != 0) return rc;
  }
  return 0;
}

/* One microbatch through the whole model; returns its loss in *loss. */
static int one_microbatch(ref *r, uint64_t it, uint32_t j, float *bufs[2], int32_t *tok, int32_t *tgt, float *loss) {
  const train_run *run = &r->run;
  int S = run->stages, rc;
  uint64_t key = it << 20 | j;
  if ((rc = train_dataset_sample(&r->ds, r->data_seed, it, j, run->batch, run->seq, tok, tgt)) != 0) return rc;
  float *x = bufs[0], *y = bufs[1], *t;
  if ((rc = stage_embed_forward(r->st[0], key, tok, x)) != 0 || (rc = wire_cross(r, x)) != 0) return rc;
  for (int s = 1; s <= S; s++, t = x, x = y, y = t)
    if ((rc = stage_forward(r->st[s], key, x, y)) != 0 || (rc = wire_cross(r, y)) != 0) return rc;
  if ((rc = stage_loss(r->st[0], x, tgt, loss, y)) != 0) return rc; /* y = d loss / d x */
  if ((rc = wire_cross(r, y)) != 0) return rc;
  for (int s = S; s >= 1; s--, t = x, x = y, y = t) {
    if ((rc = stage_backward(r->st[s], key, y, x)) != 0 || (rc = wire_cross(r, x)) != 0) return rc;
    stage_release(r->st[s], key);
  }
  rc = stage_embed_backward(r->st[0], key, y);
  stage_release(r->st[0], key);
  return rc;
}

static int step_all(ref *r) {
  for (int s = 0; s <= r->run.stages; s++) {
    float lr = adamw_lr_at(&r->opt, stage_step_count(r->st[s]) + 1);
    int rc = stage_step(r->st[s], &r->opt, lr, 1.0f / (float)r->run.microbatches);
    if (rc == 0) rc = stage_zero_grads(r->st[s]);
    if (rc != 0) return rc;
  }
  return 0;
}

static int train(ref *r, int iterations, bool json) {
  const train_run *run = &r->run;
  size_t act = (size_t)run->batch * run->seq * run->model.d_model, bt = (size_t)run->batch * run->seq;
  float *bufs[2] = {malloc(act * sizeof(float)), malloc(act * sizeof(float))};
  int32_t *tok = malloc(bt * sizeof(int32_t)), *tgt = malloc(bt * sizeof(int32_t));
  int rc = bufs[0] && bufs[1] && tok && tgt ? 0 : GW_ENOMEM;
  if (json) printf("{\"iterations\":[");
  for (int it = 0; rc == 0 && it < iterations; it++) {
    double sum = 0;
    for (int j = 0; rc == 0 && j < run->microbatches; j++) {
      float l = 0;
      rc = one_microbatch(r, (uint64_t)it, (uint32_t)j, bufs, tok, tgt, &l);
      sum += l;
    }
    if (rc == 0) rc = step_all(r);
    double loss = sum / run->microbatches;
    if (json)
      printf("%s{\"iteration\":%d,\"loss\":%.9g}", it ? "," : "", it, loss);
    else
      printf("iter %d loss %.6f\n", it, loss);
  }
  if (json) printf("]}\n");
  free(bufs[0]);
  free(bufs[1]);
  free(tok);
  free(tgt);
  return rc;
}

int cmd_train_ref(int argc, char **argv) {
  static const struct option opts[] = {
      {"dataset", required_argument, 0, 'D'}, {"model", required_argument, 0, 'm'},
      {"stages", required_argument, 0, 's'},  {"iterations", required_argument, 0, 'i'},
      {"microbatches", required_argument, 0, 'M'}, {"batch", required_argument, 0, 'B'},
      {"seq", required_argument, 0, 'T'},     {"lr", required_argument, 0, 'L'},
      {"seed", required_argument, 0, 'S'},    {"data-seed", required_argument, 0, 'd'},
      {"threads", required_argument, 0, 't'}, {"json", no_argument, 0, 'j'},
      {"wire-dtype", required_argument, 0, 'w'}, {"help", no_argument, 0, 'h'}, {0}};
  static ref r;
  memset(&r, 0, sizeof(r));
  const char *dataset = NULL, *model = "tiny";
  int iterations = 10, threads = 1;
  bool json = false;
  r.run.stages = 3;
  r.run.microbatches = 4;
  r.run.batch = 4;
  r.run.seq = 64;
  r.run.lr = 1e-3;
  r.run.seed = 1;
  r.wire = TRAIN_F32;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'D': dataset = optarg; break;
    case 'm': model = optarg; break;
    case 's': r.run.stages = atoi(optarg); break;
    case 'i': iterations = atoi(optarg); break;
    case 'M': r.run.microbatches = atoi(optarg); break;
    case 'B': r.run.batch = atoi(optarg); break;
    case 'T': r.run.seq = atoi(optarg); break;
    case 'L': r.run.lr = atof(optarg); break;
    case 'S': r.run.seed = strtoull(optarg, NULL, 10); break;
    case 'd': r.data_seed = strtoull(optarg, NULL, 10); break;
    case 't': threads = atoi(optarg); break;
    case 'j': json = true; break;
    case 'w':
      if (wire_dtype_parse(optarg, &r.wire) != 0) {
        fprintf(stderr, "gwtf train-ref: --wire-dtype is fp32, bf16, fp16 or int8\n");
        return 2;
      }
      break;
    case 'h': cmd_train_ref_help(); return 0;
    default: cmd_train_ref_help(); return 2;
    }
  }
  char err[512];
  if (!dataset || iterations < 1 || model_preset_get(model, &r.run.model) != 0) {
    fprintf(stderr, "gwtf train-ref: --dataset is required, --iterations >= 1, --model a preset\n");
    return 2;
  }
  if (train_run_validate(&r.run, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf train-ref: %s\n", err);
    return 2;
  }
  if (train_dataset_open(dataset, &r.ds, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf train-ref: %s\n", err);
    return 1;
  }
  adamw_defaults(&r.opt);
  r.opt.lr = (float)r.run.lr;
  gpu_device dev = {GPU_CPU, 0};
  gpu_options gopt = {.threads = threads};
  int rc = gpu_backend_open(&dev, &gopt, &r.be, err, sizeof(err));
  if (rc == 0) rc = build(&r, err, sizeof(err));
  if (rc == 0) {
    r.wire_buf = malloc(wire_bytes(TRAIN_F32, (size_t)r.run.batch * r.run.seq, (size_t)r.run.model.d_model));
    if (!r.wire_buf) rc = GW_ENOMEM;
  }
  if (rc == 0) rc = train(&r, iterations, json);
  if (rc != 0) fprintf(stderr, "gwtf train-ref: %s\n", *err ? err : gw_strerror(rc));
  for (int s = 0; s <= r.run.stages; s++) stage_destroy(r.st[s]);
  free(r.wire_buf);
  gpu_backend_close(r.be);
  train_dataset_close(&r.ds);
  return rc == 0 ? 0 : 1;
}
