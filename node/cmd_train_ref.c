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
#include "train/checkpoint.h"
#include "train/agg_robust.h"
#include "train/data.h"
#include "train/grad_capture.h"
#include "train/run.h"
#include "train/subspace.h"
#include "train/wire_codec.h"
#include "util/err.h"
#include "util/file.h"

void cmd_train_ref_help(void) {
  printf("usage: gwtf train-ref --dataset PATH [--model PRESET|FILE] [--stages S] [--iterations N]\n"
         "                      [--microbatches M] [--batch B] [--seq T] [--lr X] [--grad-clip N]\n"
         "                      [--seed S]\n"
         "                      [--data-seed D] [--threads N] [--json]\n"
         "                      [--wire-dtype DTYPE[/GRAD_DTYPE]] [--subspace K[:R]]\n"
         "                      [--deterministic [--replay FILE]]\n"
         "                      [--checkpoint-dir DIR [--run NAME]]\n"
         "                      [--val-fraction F | --val-dataset PATH] [--eval-every N]\n"
         "                      [--eval-microbatches N]\n\n"
         "Trains in one process exactly what a fault-free swarm with these run settings\n"
         "trains (one data node with --data-seed D), and prints the loss of each\n"
         "iteration. Defaults match `gwtf node --create-run`.\n\n"
         "  --checkpoint-dir DIR  at the end, write every stage's checkpoint as a peer\n"
         "                        of run NAME (default \"ref\") with data dir DIR would:\n"
         "                        DIR/checkpoints/NAME.stage<s>.safetensors + .json\n"
         "                        (what gwtf export --from-checkpoints reads)\n"
         "With --val-fraction F (the last F of the dataset's tokens are held out) or\n"
         "--val-dataset PATH it also prints the validation loss on the same validation\n"
         "microbatches, at the same moments, as a swarm's data node (eval.done): before\n"
         "iterations 0, N, 2N, ... and after the last (--eval-every N, default 10), on\n"
         "--eval-microbatches validation microbatches (default: --microbatches).\n"
         "--wire-dtype passes every activation and gradient between two stages through\n"
         "that wire format (" WIRE_DTYPE_LIST "; ACT/GRAD:\n"
         "activations in ACT, their gradients in GRAD, e.g. rot4/lr8), as a swarm whose\n"
         "peers all use it does.\n"
         "--subspace K[:R] confines every activation between stages to x0(tokens) + U z\n"
         "(U: C x K from the seed; x0: the embedding's part outside U, a table every\n"
         "stage holds): every block's residual writes are projected onto U after each\n"
         "step, a link carries z (K numbers a row, in --wire-dtype) and the token ids,\n"
         "and U^T g back; the table steps every R iterations (default 10; 0: never)\n"
         "at R times the rate with the gradient outside U summed where it arrives\n"
         "(docs/TRAINING.md, \"Subspace crossings\").\n"
         "--grad-clip N clips each stage's gradient to L2 norm N before its step, as the\n"
         "run record's grad_clip makes every peer do (default 1; 0: off).\n"
         "--deterministic trains as a swarm of `gwtf node --deterministic` peers does: each\n"
         "microbatch's gradient on its own, summed per stage in microbatch-ID order and\n"
         "divided by their number (docs/TRAINING.md, \"Exactly once\"). --replay FILE then\n"
         "takes each stage's microbatches of each iteration from FILE, lines\n"
         "\"ITER STAGE ID,ID,...\" (hex microbatch IDs, iteration << 20 | index, as the\n"
         "aggregators' ledger.counted events list them; \"-\" for none: no step), so that a\n"
         "churned swarm's deferred or missing microbatches are replayed as they happened.\n"
         "The output ends with each stage's final weights hash (as aggregation.done logs it).\n");
}

typedef struct ref {
  train_run run;
  gpu_backend *be;
  stage *st[TRAIN_RUN_MAX_STAGES + 1];
  adamw_config opt;
  train_dataset ds;
  uint64_t data_seed;
  train_dataset val; /* validation tokens (n_tokens 0: none) */
  uint32_t val_n;    /* validation microbatches */
  int eval_every;
  train_dtype wire, wire_grad; /* stage boundaries go through these wire formats (F32: untouched) */
  uint8_t *wire_buf;
  bool det;             /* --deterministic */
  struct replay_line {  /* --replay: stage `stage` of iteration `it` averages ids[0..n) */
    int it, stage;
    uint64_t *ids;
    uint32_t n;
  } *replay;
  size_t n_replay;
  float *cap_save, *cap_scratch;
  int sub_k, sub_refresh; /* --subspace K[:R] (k 0: off) */
  subspace sub;
  float *zbuf; /* (B*T, k): what crosses a link under --subspace */
} ref;

/* What crossing one link in dtype d does to a (B*T, cols) tensor. */
static int wire_cross(ref *r, train_dtype d, float *x, size_t cols) {
  if (d == TRAIN_F32) return 0;
  size_t rows = (size_t)r->run.batch * r->run.seq;
  size_t n = wire_bytes(d, rows, cols);
  int rc = wire_encode(d, x, rows, cols, r->wire_buf, n);
  return rc ? rc : wire_decode(d, r->wire_buf, n, rows, cols, x);
}

/* An activation crossing a link: in full, or under --subspace as z = U^T (x
 * - x0), rebuilt by the receiver from z and the token ids. */
static int cross_act(ref *r, float *x, const int32_t *tok) {
  if (!r->sub_k) return wire_cross(r, r->wire, x, (size_t)r->run.model.d_model);
  size_t rows = (size_t)r->run.batch * r->run.seq;
  int rc = subspace_encode(&r->sub, x, tok, rows, r->run.seq, r->zbuf);
  if (rc == 0) rc = wire_cross(r, r->wire, r->zbuf, (size_t)r->sub_k);
  return rc ? rc : subspace_decode(&r->sub, r->zbuf, tok, rows, r->run.seq, x);
}

/* A gradient crossing back: under --subspace U^T g crosses, the receiver of
 * the activation keeps g's part outside U for the table. */
static int cross_grad(ref *r, float *g, const int32_t *tok) {
  if (!r->sub_k) return wire_cross(r, r->wire_grad, g, (size_t)r->run.model.d_model);
  size_t rows = (size_t)r->run.batch * r->run.seq;
  int rc = subspace_grad_split(&r->sub, g, tok, rows, r->run.seq, r->zbuf);
  if (rc == 0) rc = wire_cross(r, r->wire_grad, r->zbuf, (size_t)r->sub_k);
  if (rc == 0) subspace_grad_lift(&r->sub, r->zbuf, rows, g);
  return rc;
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
  if ((rc = stage_embed_forward(r->st[0], key, tok, x)) != 0 || (rc = cross_act(r, x, tok)) != 0) return rc;
  for (int s = 1; s <= S; s++, t = x, x = y, y = t)
    if ((rc = stage_forward(r->st[s], key, x, y)) != 0 || (rc = cross_act(r, y, tok)) != 0) return rc;
  if ((rc = stage_loss(r->st[0], x, tgt, loss, y)) != 0) return rc; /* y = d loss / d x */
  if ((rc = cross_grad(r, y, tok)) != 0) return rc;
  for (int s = S; s >= 1; s--, t = x, x = y, y = t) {
    if ((rc = stage_backward(r->st[s], key, y, x)) != 0 || (rc = cross_grad(r, x, tok)) != 0) return rc;
    stage_release(r->st[s], key);
  }
  rc = stage_embed_backward(r->st[0], key, y);
  stage_release(r->st[0], key);
  return rc;
}

/* Every stage's state and sidecar, as train_node.c writes them after an
 * aggregation: iteration = aggregations done, hash = stage_weight_hash. */
static int save_checkpoints(ref *r, const char *dir, const char *run, int iterations) {
  char path[4096], sub[4096];
  snprintf(sub, sizeof(sub), "%s/checkpoints", dir);
  int rc = gw_mkdir_p(sub, 0700);
  for (int s = 0; rc == 0 && s <= r->run.stages; s++) {
    uint8_t hash[STAGE_HASH_BYTES], *blob = NULL;
    size_t len = 0;
    rc = ckpt_run_path(path, sizeof(path), dir, run, s);
    if (rc == 0) rc = stage_weight_hash(r->st[s], hash);
    if (rc == 0) rc = stage_state_size(r->st[s], &len);
    if (rc == 0 && !(blob = malloc(len))) rc = GW_ENOMEM;
    if (rc == 0) rc = stage_state_read(r->st[s], 0, blob, len);
    if (rc == 0) rc = ckpt_save_blob(path, blob, len, run, s, iterations, hash);
    free(blob);
    if (rc == 0) fprintf(stderr, "checkpoint.saved path=%s bytes=%zu iter=%d\n", path, len, iterations);
  }
  return rc;
}

/* The validation loss of the current weights, as a swarm's data node
 * computes it (train/peer_eval.c): each validation microbatch forward only,
 * nothing kept, no gradient; the mean of the per-microbatch losses, summed
 * in index order in double. */
static int evaluate(ref *r, float *bufs[2], int32_t *tok, int32_t *tgt, double *out) {
  const train_run *run = &r->run;
  double sum = 0;
  for (uint32_t j = 0; j < r->val_n; j++) {
    uint64_t key = (1ULL << 63) | j;
    int rc = train_dataset_val_sample(&r->val, j, run->batch, run->seq, tok, tgt);
    float *x = bufs[0], *y = bufs[1], *t, loss = 0;
    if (rc == 0) rc = stage_embed_forward(r->st[0], key, tok, x);
    if (rc == 0) rc = cross_act(r, x, tok);
    stage_release(r->st[0], key);
    for (int s = 1; rc == 0 && s <= run->stages; s++, t = x, x = y, y = t) {
      rc = stage_forward(r->st[s], key, x, y);
      if (rc == 0) rc = cross_act(r, y, tok);
      stage_release(r->st[s], key);
    }
    if (rc == 0) rc = stage_loss_eval(r->st[0], x, tgt, &loss);
    if (rc != 0) return rc;
    sum += loss;
  }
  *out = sum / r->val_n;
  return 0;
}

static bool eval_due(const ref *r, int it, int iterations) {
  return r->val_n > 0 && r->eval_every > 0 && (it % r->eval_every == 0 || it == iterations);
}

static int print_eval(ref *r, int it, float *bufs[2], int32_t *tok, int32_t *tgt, bool json, int *n_printed) {
  double v;
  int rc = evaluate(r, bufs, tok, tgt, &v);
  if (rc != 0) return rc;
  long long tokens = (long long)r->val_n * r->run.batch * r->run.seq;
  if (json)
    printf("%s{\"iteration\":%d,\"val_loss\":%.9g,\"tokens\":%lld}", (*n_printed)++ ? "," : "", it, v, tokens);
  else
    printf("eval iter %d val_loss %.6f tokens %lld\n", it, v, tokens);
  return 0;
}

/* --subspace after every stage's step: every refresh iterations the table
 * steps first (at refresh times the rate: it learns from refresh
 * iterations' gradient at once), then every stage is held to it and to U. */
static int subspace_after_steps(ref *r) {
  long long steps = stage_step_count(r->st[0]);
  if (subspace_table_due(&r->sub, steps - 1)) {
    float lr = adamw_lr_at(&r->opt, steps) * (float)r->sub.refresh;
    subspace_table_step(&r->sub, &r->opt, lr, 1.0f / (float)r->run.microbatches);
  }
  int rc = 0;
  for (int s = 0; rc == 0 && s <= r->run.stages; s++) rc = subspace_after_step(&r->sub, r->st[s]);
  return rc;
}

/* --subspace: U and the table from the seed and the data node's initial
 * embedding, every block's residual writes in U from the start. */
static int subspace_setup(ref *r, char *err, size_t err_len) {
  size_t rows = (size_t)r->run.batch * r->run.seq;
  int rc = subspace_init(&r->sub, &r->run.model, r->sub_k, r->sub_refresh, r->run.seed, rows, err, err_len);
  for (int s = 0; rc == 0 && s <= r->run.stages; s++) rc = subspace_after_step(&r->sub, r->st[s]);
  if (rc == 0 && !(r->zbuf = malloc(rows * (size_t)r->sub_k * sizeof(float)))) rc = GW_ENOMEM;
  return rc;
}

static int step_all(ref *r) {
  for (int s = 0; r->sub_k && s <= r->run.stages; s++) {
    int rc = subspace_before_step(&r->sub, r->st[s]);
    if (rc != 0) return rc;
  }
  for (int s = 0; s <= r->run.stages; s++) {
    float lr = adamw_lr_at(&r->opt, stage_step_count(r->st[s]) + 1);
    int rc = stage_step(r->st[s], &r->opt, lr, 1.0f / (float)r->run.microbatches);
    if (rc == 0) rc = stage_zero_grads(r->st[s]);
    if (rc != 0) return rc;
  }
  return r->sub_k ? subspace_after_steps(r) : 0;
}

/* ---- --deterministic ---- */

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* Stage s's microbatches in iteration it: the replay's, or all M. *ids is
 * malloc'd, sorted ascending. */
static int stage_ids(ref *r, int it, int s, uint64_t **ids, uint32_t *n) {
  *ids = NULL;
  *n = 0;
  if (!r->replay) {
    *ids = malloc((size_t)r->run.microbatches * sizeof(uint64_t));
    if (!*ids) return GW_ENOMEM;
    for (int j = 0; j < r->run.microbatches; j++) (*ids)[j] = (uint64_t)it << 20 | (uint64_t)j;
    *n = (uint32_t)r->run.microbatches;
    return 0;
  }
  for (size_t i = 0; i < r->n_replay; i++) {
    if (r->replay[i].it != it || r->replay[i].stage != s) continue;
    if (!r->replay[i].n) return 0;
    *ids = malloc(r->replay[i].n * sizeof(uint64_t));
    if (!*ids) return GW_ENOMEM;
    memcpy(*ids, r->replay[i].ids, r->replay[i].n * sizeof(uint64_t));
    *n = r->replay[i].n;
    qsort(*ids, *n, sizeof(uint64_t), cmp_u64);
    return 0;
  }
  return 0;
}

static bool has_id(const uint64_t *ids, uint32_t n, uint64_t id) {
  /* a stage that averaged nothing in a replayed iteration has no ids (NULL):
   * bsearch must not see it (UBSan, swarm_deterministic_churn) */
  return n > 0 && bsearch(&id, ids, n, sizeof(id), cmp_u64) != NULL;
}

/* Runs `op` on stage st with its gradient captured into part (grad_capture.h). */
#define CAPTURED(st, part, op)                                                                                    \
  ((rc = grad_capture_begin((st), r->cap_save)) != 0 ? rc                                                          \
   : (rc = (op)) != 0                                 ? rc                                                          \
                      : grad_capture_end((st), r->cap_save, r->cap_scratch, (part)))

/* One microbatch (its ID: iteration << 20 | index) forward and backward,
 * each stage's own gradient into part[s] (zeroed here). */
static int det_microbatch(ref *r, uint64_t id, float *bufs[2], int32_t *tok, int32_t *tgt, float *part[],
                          float *loss) {
  const train_run *run = &r->run;
  int S = run->stages, rc;
  for (int s = 0; s <= S; s++) memset(part[s], 0, stage_n_params(r->st[s]) * sizeof(float));
  if ((rc = train_dataset_sample(&r->ds, r->data_seed, id >> 20, (uint32_t)(id & 0xfffff), run->batch, run->seq,
                                 tok, tgt)) != 0)
    return rc;
  float *x = bufs[0], *y = bufs[1], *t;
  if ((rc = stage_embed_forward(r->st[0], id, tok, x)) != 0 || (rc = cross_act(r, x, tok)) != 0) return rc;
  for (int s = 1; s <= S; s++, t = x, x = y, y = t)
    if ((rc = stage_forward(r->st[s], id, x, y)) != 0 || (rc = cross_act(r, y, tok)) != 0) return rc;
  if ((rc = CAPTURED(r->st[0], part[0], stage_loss(r->st[0], x, tgt, loss, y))) != 0) return rc;
  if ((rc = cross_grad(r, y, tok)) != 0) return rc;
  for (int s = S; s >= 1; s--, t = x, x = y, y = t) {
    if ((rc = CAPTURED(r->st[s], part[s], stage_backward(r->st[s], id, y, x))) != 0 ||
        (rc = cross_grad(r, x, tok)) != 0)
      return rc;
    stage_release(r->st[s], id);
  }
  rc = CAPTURED(r->st[0], part[0], stage_embed_backward(r->st[0], id, y));
  stage_release(r->st[0], id);
  return rc;
}

/* As the swarm's aggregator and APPLY job: the mean of the stage's
 * per-microbatch gradients in ID order, written as the gradient, one step
 * with scale 1; none: no step (SKIP_STEP). */
static int det_step(ref *r, int s, const float *const *vecs, uint32_t m, float *avg) {
  stage *st = r->st[s];
  size_t n = stage_n_params(st);
  int rc = 0;
  if (m > 0) {
    train_agg_mean(vecs, m, n, m, avg);
    rc = stage_write(st, STAGE_GRADS, 0, n, avg);
    /* --subspace K:0, as a swarm's APPLY job does it (train/compute.c) */
    if (rc == 0 && r->sub_k) rc = subspace_before_step(&r->sub, st);
    if (rc == 0) rc = stage_step(st, &r->opt, adamw_lr_at(&r->opt, stage_step_count(st) + 1), 1.0f);
    if (rc == 0 && r->sub_k) rc = subspace_after_step(&r->sub, st);
  }
  return rc ? rc : stage_zero_grads(st);
}

/* One --deterministic iteration; the loss is the mean over stage 0's microbatches. */
static int det_iteration(ref *r, int it, float *bufs[2], int32_t *tok, int32_t *tgt, double *loss_out) {
  int S = r->run.stages, rc = 0;
  uint64_t *ids[TRAIN_RUN_MAX_STAGES + 1] = {0}, *all = NULL;
  uint32_t n[TRAIN_RUN_MAX_STAGES + 1] = {0}, n_all = 0, max_n = 0;
  for (int s = 0; rc == 0 && s <= S; s++) {
    rc = stage_ids(r, it, s, &ids[s], &n[s]);
    n_all += n[s];
    if (n[s] > max_n) max_n = n[s];
  }
  /* every microbatch some stage counts runs the whole pipeline, ascending */
  if (rc == 0 && n_all && !(all = malloc(n_all * sizeof(uint64_t)))) rc = GW_ENOMEM;
  uint32_t u = 0;
  for (int s = 0; rc == 0 && s <= S; s++)
    for (uint32_t i = 0; i < n[s]; i++) all[u++] = ids[s][i];
  if (u) qsort(all, u, sizeof(uint64_t), cmp_u64);
  uint32_t k = 0;
  for (uint32_t i = 0; i < u; i++)
    if (i == 0 || all[i] != all[k - 1]) all[k++] = all[i];
  u = k;
  /* per stage, its counted microbatches' gradients, in ID order */
  float **vec = calloc((size_t)(S + 1) * (max_n ? max_n : 1), sizeof(float *));
  uint32_t got[TRAIN_RUN_MAX_STAGES + 1] = {0};
  float *part[TRAIN_RUN_MAX_STAGES + 1] = {0};
  if (rc == 0 && !vec) rc = GW_ENOMEM;
  double sum = 0;
  for (uint32_t i = 0; rc == 0 && i < u; i++) {
    for (int s = 0; rc == 0 && s <= S; s++) {
      part[s] = malloc(stage_n_params(r->st[s]) * sizeof(float));
      if (!part[s]) rc = GW_ENOMEM;
    }
    float l = 0;
    if (rc == 0) rc = det_microbatch(r, all[i], bufs, tok, tgt, part, &l);
    for (int s = 0; s <= S; s++) {
      if (rc == 0 && has_id(ids[s], n[s], all[i])) {
        vec[(size_t)s * max_n + got[s]++] = part[s];
        if (s == 0) sum += l;
      } else {
        free(part[s]);
      }
      part[s] = NULL;
    }
  }
  size_t big = 0;
  for (int s = 0; s <= S; s++) big = stage_n_params(r->st[s]) > big ? stage_n_params(r->st[s]) : big;
  float *avg = rc == 0 ? malloc(big * sizeof(float)) : NULL;
  if (rc == 0 && !avg) rc = GW_ENOMEM;
  for (int s = 0; rc == 0 && s <= S; s++)
    rc = det_step(r, s, (const float *const *)&vec[(size_t)s * max_n], got[s], avg);
  *loss_out = n[0] ? sum / n[0] : NAN;
  for (int s = 0; vec && s <= S; s++)
    for (uint32_t i = 0; i < got[s]; i++) free(vec[(size_t)s * max_n + i]);
  for (int s = 0; s <= S; s++) free(ids[s]);
  free(vec);
  free(all);
  free(avg);
  return rc;
}

/* --replay FILE: "ITER STAGE ID,ID,..." lines (hex IDs, "-" for none). */
static int load_replay(ref *r, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return GW_EIO;
  char line[65536];
  int rc = 0;
  while (rc == 0 && fgets(line, sizeof(line), f)) {
    int it, s, off = 0;
    if (line[0] == '#' || line[0] == '\n') continue;
    if (sscanf(line, "%d %d %n", &it, &s, &off) != 2 || it < 0 || s < 0 || s > r->run.stages) {
      rc = GW_EINVAL;
      break;
    }
    struct replay_line *nl = realloc(r->replay, (r->n_replay + 1) * sizeof(*nl));
    if (!nl) {
      rc = GW_ENOMEM;
      break;
    }
    r->replay = nl;
    struct replay_line *L = &r->replay[r->n_replay++];
    memset(L, 0, sizeof(*L));
    L->it = it;
    L->stage = s;
    for (char *p = line + off; rc == 0 && *p && *p != '\n' && *p != '-';) {
      char *end;
      unsigned long long v = strtoull(p, &end, 16);
      if (end == p) {
        rc = GW_EINVAL;
        break;
      }
      uint64_t *ni = realloc(L->ids, (L->n + 1) * sizeof(uint64_t));
      if (!ni) {
        rc = GW_ENOMEM;
        break;
      }
      L->ids = ni;
      L->ids[L->n++] = v;
      p = *end == ',' ? end + 1 : end;
    }
  }
  fclose(f);
  return rc;
}

/* Bytes one microbatch puts on the links between stages (S + 1 of them,
 * an activation out and a gradient back on each), against fp32; under
 * --subspace the token ids travel with each activation to a relay (2 bytes
 * an id when the vocabulary fits), and the table's refresh is counted
 * apart: every R iterations each relay sends its sum and receives the
 * table, in bf16. */
static void print_wire(const ref *r, bool json) {
  const train_run *run = &r->run;
  size_t rows = (size_t)run->batch * run->seq, C = (size_t)run->model.d_model, links = (size_t)run->stages + 1;
  size_t cols = r->sub_k ? (size_t)r->sub_k : C;
  /* the ids go to every relay (S links), not back to the data node */
  size_t ids = r->sub_k ? rows * (run->model.vocab_size <= 65536 ? 2 : 4) : 0;
  double per = (double)links * (double)(wire_bytes(r->wire, rows, cols) + wire_bytes(r->wire_grad, rows, cols)) +
               (double)run->stages * (double)ids;
  double fp32 = (double)links * 2.0 * (double)(rows * C * 4), table = 0;
  if (r->sub_k && r->sub.refresh > 0) /* a fixed table (K:0) never travels */
    table = 2.0 * run->stages * (double)((size_t)r->sub.V + (size_t)r->sub.P) * (double)C * 2.0 /
            ((double)r->sub.refresh * run->microbatches);
  if (json) {
    printf(",\"wire\":{\"bytes_per_microbatch\":%.0f,\"fp32_bytes_per_microbatch\":%.0f,"
           "\"table_bytes_per_microbatch\":%.0f}",
           per, fp32, table);
  } else {
    printf("wire bytes/microbatch %.0f (fp32 %.0f: %.2fx fewer)", per, fp32, fp32 / per);
    if (table > 0) printf(", with the table's refresh %.0f (%.2fx fewer)", per + table, fp32 / (per + table));
    printf("\n");
  }
}

static void hash_hex16(const uint8_t *h, char out[17]) {
  for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Each stage's weights hash, as aggregation.done logs it. */
static int print_hashes(ref *r, bool json) {
  if (json) printf(",\"hashes\":[");
  for (int s = 0; s <= r->run.stages; s++) {
    uint8_t h[STAGE_HASH_BYTES];
    char hex[17];
    int rc = stage_weight_hash(r->st[s], h);
    if (rc != 0) return rc;
    hash_hex16(h, hex);
    if (json) printf("%s\"%s\"", s ? "," : "", hex);
    else printf("hash stage %d %s\n", s, hex);
  }
  if (json) printf("]");
  return 0;
}

static int train(ref *r, int iterations, bool json) {
  const train_run *run = &r->run;
  size_t act = (size_t)run->batch * run->seq * run->model.d_model, bt = (size_t)run->batch * run->seq;
  float *bufs[2] = {malloc(act * sizeof(float)), malloc(act * sizeof(float))};
  int32_t *tok = malloc(bt * sizeof(int32_t)), *tgt = malloc(bt * sizeof(int32_t));
  int rc = bufs[0] && bufs[1] && tok && tgt ? 0 : GW_ENOMEM;
  /* JSON: the iterations, then the validation curve (printed as computed) */
  double *losses = calloc((size_t)iterations, sizeof(double));
  if (!losses) rc = GW_ENOMEM;
  int n_evals = 0;
  if (json) printf("{\"validation\":[");
  for (int it = 0; rc == 0 && it < iterations; it++) {
    if (eval_due(r, it, iterations)) rc = print_eval(r, it, bufs, tok, tgt, json, &n_evals);
    double sum = 0, loss = 0;
    if (r->det) {
      rc = det_iteration(r, it, bufs, tok, tgt, &loss);
    } else {
      for (int j = 0; rc == 0 && j < run->microbatches; j++) {
        float l = 0;
        rc = one_microbatch(r, (uint64_t)it, (uint32_t)j, bufs, tok, tgt, &l);
        sum += l;
      }
      if (rc == 0) rc = step_all(r);
      loss = sum / run->microbatches;
    }
    if (rc == 0) losses[it] = loss;
    if (!json) printf("iter %d loss %.6f\n", it, loss);
  }
  if (rc == 0 && eval_due(r, iterations, iterations)) rc = print_eval(r, iterations, bufs, tok, tgt, json, &n_evals);
  if (json) {
    printf("],\"iterations\":[");
    for (int it = 0; rc == 0 && it < iterations; it++)
      if (isfinite(losses[it])) printf("%s{\"iteration\":%d,\"loss\":%.9g}", it ? "," : "", it, losses[it]);
      else printf("%s{\"iteration\":%d,\"loss\":null}", it ? "," : "", it); /* --replay: no microbatch */
    printf("]");
    print_wire(r, true);
    if (rc == 0) rc = print_hashes(r, true);
    printf("}\n");
  } else if (rc == 0) {
    print_wire(r, false);
    rc = print_hashes(r, false);
  }
  free(losses);
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
      {"checkpoint-dir", required_argument, 0, 'C'}, {"run", required_argument, 0, 'R'},
      {"val-fraction", required_argument, 0, 'V'}, {"val-dataset", required_argument, 0, 'W'},
      {"eval-every", required_argument, 0, 'E'}, {"eval-microbatches", required_argument, 0, 'N'},
      {"wire-dtype", required_argument, 0, 'w'}, {"grad-clip", required_argument, 0, 'G'},
      {"deterministic", no_argument, 0, 'X'}, {"replay", required_argument, 0, 'P'},
      {"subspace", required_argument, 0, 'K'},
      {"help", no_argument, 0, 'h'},          {0}};
  static ref r;
  memset(&r, 0, sizeof(r));
  const char *dataset = NULL, *model = "tiny", *ckpt_dir = NULL, *run_name = "ref", *val_dataset = NULL;
  const char *replay = NULL;
  double val_fraction = 0;
  r.eval_every = 10;
  int eval_mbs = 0;
  int iterations = 10, threads = 1;
  bool json = false;
  r.run.stages = 3;
  r.run.microbatches = 4;
  r.run.batch = 4;
  r.run.seq = 64;
  r.run.lr = 1e-3;
  r.run.grad_clip = TRAIN_RUN_GRAD_CLIP_DEFAULT;
  r.run.seed = 1;
  r.wire = r.wire_grad = TRAIN_F32;
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
    case 'G': r.run.grad_clip = atof(optarg); break;
    case 'S': r.run.seed = strtoull(optarg, NULL, 10); break;
    case 'd': r.data_seed = strtoull(optarg, NULL, 10); break;
    case 't': threads = atoi(optarg); break;
    case 'j': json = true; break;
    case 'C': ckpt_dir = optarg; break;
    case 'R': run_name = optarg; break;
    case 'V': val_fraction = atof(optarg); break;
    case 'W': val_dataset = optarg; break;
    case 'E': r.eval_every = atoi(optarg); break;
    case 'w':
      if (wire_pair_parse(optarg, &r.wire, &r.wire_grad) != 0) {
        fprintf(stderr, "gwtf train-ref: --wire-dtype is DTYPE or ACT/GRAD; a DTYPE is one of " WIRE_DTYPE_LIST "\n");
        return 2;
      }
      break;
    case 'N': eval_mbs = atoi(optarg); break;
    case 'X': r.det = true; break;
    case 'P': replay = optarg; break;
    case 'K':
      if (subspace_parse(optarg, &r.sub_k, &r.sub_refresh) != 0) {
        fprintf(stderr, "gwtf train-ref: --subspace is K or K:R (rank K >= 1, the table stepped every R "
                        "iterations, 0: never)\n");
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
  if (val_fraction < 0 || val_fraction > 0.5 || r.eval_every < 0 || (val_dataset && val_fraction > 0) ||
      eval_mbs < 0 || eval_mbs > 65536) {
    fprintf(stderr, "gwtf train-ref: --val-fraction in [0, 0.5] or --val-dataset, --eval-every >= 0, "
                    "--eval-microbatches in [0, 65536]\n");
    return 2;
  }
  if (r.sub_k && r.sub_refresh && r.det) { /* the table's sums would need a fixed order too */
    fprintf(stderr, "gwtf train-ref: --deterministic takes --subspace K:0 only (a fixed table)\n");
    return 2;
  }
  if (replay && !r.det) {
    fprintf(stderr, "gwtf train-ref: --replay goes with --deterministic\n");
    return 2;
  }
  if (replay && load_replay(&r, replay) != 0) {
    fprintf(stderr, "gwtf train-ref: cannot read --replay %s (lines: ITER STAGE ID,ID,... in hex, or -)\n", replay);
    return 2;
  }
  if (train_dataset_open(dataset, &r.ds, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf train-ref: %s\n", err);
    return 1;
  }
  if (train_validation_open(&r.ds, val_dataset, val_fraction, &r.val, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf train-ref: %s\n", err);
    train_dataset_close(&r.ds);
    return 1;
  }
  /* as a data node: --eval-microbatches (default: one iteration's), fewer if they do not fit */
  uint32_t avail = train_dataset_val_count(&r.val, r.run.batch, r.run.seq);
  uint32_t want = (uint32_t)(eval_mbs > 0 ? eval_mbs : r.run.microbatches);
  r.val_n = avail < want ? avail : want;
  adamw_defaults(&r.opt);
  r.opt.lr = (float)r.run.lr;
  r.opt.grad_clip = (float)r.run.grad_clip;
  gpu_device dev = {GPU_CPU, 0};
  gpu_options gopt = {.threads = threads};
  int rc = gpu_backend_open(&dev, &gopt, &r.be, err, sizeof(err));
  if (rc == 0) rc = build(&r, err, sizeof(err));
  if (rc == 0) {
    size_t rows = (size_t)r.run.batch * r.run.seq, cols = (size_t)r.run.model.d_model, n = 0;
    const train_dtype ds[3] = {TRAIN_F32, r.wire, r.wire_grad}; /* LR* can exceed F32 on tiny shapes */
    for (int k = 0; k < 3; k++) n = wire_bytes(ds[k], rows, cols) > n ? wire_bytes(ds[k], rows, cols) : n;
    r.wire_buf = n ? malloc(n) : NULL;
    if (!r.wire_buf) rc = GW_ENOMEM;
  }
  if (rc == 0 && r.sub_k) rc = subspace_setup(&r, err, sizeof(err));
  if (rc == 0 && r.det) {
    size_t big = 0;
    for (int s = 0; s <= r.run.stages; s++) big = stage_n_params(r.st[s]) > big ? stage_n_params(r.st[s]) : big;
    r.cap_save = malloc(big * sizeof(float));
    r.cap_scratch = malloc(big * sizeof(float));
    if (!r.cap_save || !r.cap_scratch) rc = GW_ENOMEM;
  }
  if (rc == 0) rc = train(&r, iterations, json);
  if (rc == 0 && ckpt_dir) rc = save_checkpoints(&r, ckpt_dir, run_name, iterations);
  if (rc != 0) fprintf(stderr, "gwtf train-ref: %s\n", *err ? err : gw_strerror(rc));
  for (int s = 0; s <= r.run.stages; s++) stage_destroy(r.st[s]);
  free(r.wire_buf);
  free(r.zbuf);
  subspace_free(&r.sub);
  free(r.cap_save);
  free(r.cap_scratch);
  for (size_t i = 0; i < r.n_replay; i++) free(r.replay[i].ids);
  free(r.replay);
  gpu_backend_close(r.be);
  train_dataset_close(&r.val);
  train_dataset_close(&r.ds);
  return rc == 0 ? 0 : 1;
}
