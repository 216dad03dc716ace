/* train/stage.c — a pipeline stage: memory layout, microbatch slots,
 * forward and backward of both architectures, loss, optimizer step. The
 * serialised state lives in train/stage_state.c. */
#include "train/stage.h"

#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/stage_internal.h"
#include "util/err.h"

/* Sub-buffers start on 64-byte boundaries (16 floats) for aligned loads. */
#define STAGE_ALIGN_FLOATS (16)

static size_t align_up(size_t n) {
  return (n + STAGE_ALIGN_FLOATS - 1) / STAGE_ALIGN_FLOATS * STAGE_ALIGN_FLOATS;
}

void stage_set_err(char *err, size_t len, const char *fmt, ...) {
  if (!err || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

/* ---- layout ------------------------------------------------------------------- */

/* Offsets (in floats) of one block's saved activations within a slot; the
 * same layout serves gpt and llama (absent entries have size 0). */
typedef struct act_layout {
  size_t n1, n1_mean, n1_rstd, qkv, att, atty, h, n2, n2_mean, n2_rstd, fc, fc_act, total;
} act_layout;

/* A cursor that hands out aligned sub-buffers. */
static size_t take(size_t *pos, size_t n) {
  size_t at = *pos;
  *pos += align_up(n);
  return at;
}

static act_layout layer_layout(const stage_spec *s, size_t att_floats) {
  const model_config *c = &s->model;
  size_t N = (size_t)s->batch * s->seq_len, C = c->d_model, F = c->d_ff;
  bool gpt = c->arch == MODEL_GPT;
  act_layout l;
  size_t pos = 0;
  l.n1 = take(&pos, N * C);
  l.n1_mean = take(&pos, gpt ? N : 0);
  l.n1_rstd = take(&pos, N);
  l.qkv = take(&pos, 3 * N * C);
  l.att = take(&pos, att_floats);
  l.atty = take(&pos, N * C);
  l.h = take(&pos, N * C);
  l.n2 = take(&pos, N * C);
  l.n2_mean = take(&pos, gpt ? N : 0);
  l.n2_rstd = take(&pos, N);
  l.fc = take(&pos, (gpt ? 1 : 2) * N * F); /* gpt: fc pre-GELU; llama: gate|up */
  l.fc_act = take(&pos, N * F);             /* gpt: GELU out; llama: SwiGLU out */
  l.total = pos;
  return l;
}

/* Floats of one slot's block part: L+1 residual-stream tensors (the input,
 * each block's output) and L layers of saved activations. */
static size_t slot_block_floats(const stage_spec *s, const act_layout *l) {
  size_t NC = (size_t)s->batch * s->seq_len * s->model.d_model;
  return (size_t)(s->n_layers + 1) * align_up(NC) + (size_t)s->n_layers * l->total;
}

/* The shared workspace: backward scratch and the loss part. */
typedef struct ws_layout {
  size_t dres, dC, d3C, dF, d2F, x, nf, nf_mean, nf_rstd, logits, losses, dnf, total;
} ws_layout;

static ws_layout workspace_layout(const stage_spec *s) {
  const model_config *c = &s->model;
  size_t N = (size_t)s->batch * s->seq_len, C = c->d_model, F = c->d_ff;
  bool blocks = s->n_layers > 0, head = s->has_head, llama = c->arch == MODEL_LLAMA;
  ws_layout w;
  size_t pos = 0;
  w.dres = take(&pos, N * C);
  w.dC = take(&pos, blocks ? N * C : 0);
  w.d3C = take(&pos, blocks ? 3 * N * C : 0);
  w.dF = take(&pos, blocks ? N * F : 0);
  w.d2F = take(&pos, blocks && llama ? 2 * N * F : 0);
  w.x = take(&pos, head ? N * C : 0);
  w.nf = take(&pos, head ? N * C : 0);
  w.nf_mean = take(&pos, head ? N : 0);
  w.nf_rstd = take(&pos, head ? N : 0);
  w.logits = take(&pos, head ? N * (size_t)c->vocab_size : 0);
  w.losses = take(&pos, head ? N : 0);
  w.dnf = take(&pos, head ? N * C : 0);
  w.total = pos;
  return w;
}

int stage_spec_validate(const stage_spec *s, char *err, size_t len) {
  int rc = model_config_validate(&s->model, err, len);
  if (rc) return rc;
  const model_config *c = &s->model;
  if (s->first_layer < 0 || s->n_layers < 0 || s->first_layer > c->n_layers ||
      s->n_layers > c->n_layers - s->first_layer) {
    stage_set_err(err, len, "blocks [%d, %d) are not within the model's %d layers", s->first_layer,
                  s->first_layer + s->n_layers, c->n_layers);
    return GW_EINVAL;
  }
  if (s->n_layers == 0 && !s->has_head) {
    stage_set_err(err, len, "a stage needs blocks, the data-node part, or both");
    return GW_EINVAL;
  }
  if (s->batch < 1 || s->batch > STAGE_MAX_BATCH) {
    stage_set_err(err, len, "batch must be between 1 and %d (got %d)", STAGE_MAX_BATCH, s->batch);
    return GW_EINVAL;
  }
  if (s->seq_len < 1 || s->seq_len > c->max_seq_len) {
    stage_set_err(err, len, "seq_len must be between 1 and max_seq_len %d (got %d)", c->max_seq_len,
                  s->seq_len);
    return GW_EINVAL;
  }
  if (s->capacity < 1 || s->capacity > STAGE_MAX_CAPACITY) {
    stage_set_err(err, len, "capacity must be between 1 and %d (got %d)", STAGE_MAX_CAPACITY,
                  s->capacity);
    return GW_EINVAL;
  }
  return 0;
}

int stage_memory_estimate(const stage_spec *s, gpu_backend *be, stage_memory *out) {
  if (stage_spec_validate(s, NULL, 0)) return GW_EINVAL;
  size_t params = (size_t)s->n_layers * model_block_numel(&s->model) +
                  (s->has_head ? model_head_numel(&s->model) : 0);
  size_t att = gpu_attention_state_floats(be, s->batch, s->seq_len, s->model.n_heads);
  act_layout l = layer_layout(s, att);
  ws_layout w = workspace_layout(s);
  size_t hd = (size_t)(s->model.d_model / s->model.n_heads);
  size_t rope = s->model.arch == MODEL_LLAMA ? (size_t)s->model.max_seq_len * hd : 0;
  size_t tokens_bytes = s->has_head ? (size_t)s->batch * s->seq_len * sizeof(int32_t) : 0;
  out->state_bytes = 4 * params * sizeof(float);
  out->workspace_bytes = (w.total + rope) * sizeof(float) + tokens_bytes; /* + targets */
  out->per_mb_bytes = (s->n_layers ? slot_block_floats(s, &l) * sizeof(float) : 0) + tokens_bytes;
  return 0;
}

int stage_capacity_for(const stage_spec *s, gpu_backend *be, size_t avail) {
  stage_memory m;
  if (stage_memory_estimate(s, be, &m)) return 0;
  size_t fixed = m.state_bytes + m.workspace_bytes;
  if (avail <= fixed || m.per_mb_bytes == 0) return avail > fixed ? STAGE_MAX_CAPACITY : 0;
  size_t n = (avail - fixed) / m.per_mb_bytes;
  return n > STAGE_MAX_CAPACITY ? STAGE_MAX_CAPACITY : (int)n;
}

/* ---- creation ------------------------------------------------------------------- */

/* The tensor table: head first, then the blocks, offsets made global. */
static int build_tensors(stage *st) {
  const stage_spec *s = &st->spec;
  int max = MODEL_HEAD_TENSORS_MAX + s->n_layers * MODEL_BLOCK_TENSORS_MAX;
  st->tensors = calloc((size_t)max, sizeof(model_tensor));
  if (!st->tensors) return GW_ENOMEM;
  size_t base = 0;
  if (s->has_head) {
    int n = model_head_tensors(&s->model, st->tensors);
    st->head_numel = model_head_numel(&s->model);
    st->n_tensors = n;
    base = st->head_numel;
  }
  st->block_numel = model_block_numel(&s->model);
  for (int l = 0; l < s->n_layers; l++) {
    model_tensor *t = st->tensors + st->n_tensors;
    int n = model_block_tensors(&s->model, s->first_layer + l, t);
    for (int i = 0; i < n; i++) t[i].offset += base;
    st->n_tensors += n;
    base += st->block_numel;
  }
  st->n_params = base;
  return 0;
}

/* (T_max, hd/2, 2) cos/sin table in double precision, then rounded. */
static int build_rope(stage *st) {
  const model_config *c = &st->spec.model;
  int hd = c->d_model / c->n_heads, half = hd / 2;
  size_t n = (size_t)c->max_seq_len * hd;
  float *host = malloc(n * sizeof(float));
  st->rope = gpu_alloc(st->be, n * sizeof(float));
  if (!host || !st->rope) {
    free(host);
    return GW_ENOMEM;
  }
  for (int t = 0; t < c->max_seq_len; t++) {
    for (int i = 0; i < half; i++) {
      double inv_freq = pow((double)c->rope_theta, -2.0 * i / hd);
      double angle = (double)t * inv_freq;
      host[((size_t)t * half + i) * 2] = (float)cos(angle);
      host[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
    }
  }
  int rc = gpu_upload(st->be, st->rope, host, n * sizeof(float));
  free(host);
  return rc;
}

static int init_params(stage *st, uint64_t seed) {
  float *host = malloc(st->n_params * sizeof(float));
  if (!host) return GW_ENOMEM;
  for (int i = 0; i < st->n_tensors; i++)
    model_init_tensor(&st->tensors[i], seed, host + st->tensors[i].offset);
  int rc = gpu_upload(st->be, st->params, host, st->n_params * sizeof(float));
  free(host);
  return rc;
}

static int alloc_state(stage *st) {
  size_t bytes = st->n_params * sizeof(float);
  float **bufs[4] = {&st->params, &st->grads, &st->m, &st->v};
  for (int i = 0; i < 4; i++) {
    *bufs[i] = gpu_alloc(st->be, bytes);
    if (!*bufs[i]) return GW_ENOMEM;
    if (i) gpu_zero(st->be, *bufs[i], bytes);
  }
  ws_layout w = workspace_layout(&st->spec);
  st->ws = gpu_alloc(st->be, w.total * sizeof(float));
  size_t N = (size_t)st->spec.batch * st->spec.seq_len;
  st->targets = st->spec.has_head ? gpu_alloc(st->be, N * sizeof(int32_t)) : NULL;
  st->slots = calloc((size_t)st->spec.capacity, sizeof(stage_slot));
  if (!st->ws || (st->spec.has_head && !st->targets) || !st->slots) return GW_ENOMEM;
  return 0;
}

int stage_create(const stage_spec *spec, gpu_backend *be, uint64_t seed, stage **out, char *err,
                 size_t err_len) {
  *out = NULL;
  int rc = stage_spec_validate(spec, err, err_len);
  if (rc) return rc;
  stage *st = calloc(1, sizeof(*st));
  if (!st) return GW_ENOMEM;
  st->spec = *spec;
  st->be = be;
  st->att_floats = gpu_attention_state_floats(be, spec->batch, spec->seq_len, spec->model.n_heads);
  rc = build_tensors(st);
  if (!rc) rc = alloc_state(st);
  if (!rc && spec->model.arch == MODEL_LLAMA && spec->n_layers) rc = build_rope(st);
  if (!rc) rc = init_params(st, seed);
  if (!rc) rc = gpu_sync(be);
  if (rc) {
    stage_set_err(err, err_len, "cannot create the stage: %s", gw_strerror(rc));
    stage_destroy(st);
    return rc;
  }
  *out = st;
  return 0;
}

void stage_destroy(stage *st) {
  if (!st) return;
  for (int i = 0; st->slots && i < st->spec.capacity; i++) {
    gpu_free(st->be, st->slots[i].acts);
    gpu_free(st->be, st->slots[i].tokens);
  }
  free(st->slots);
  gpu_free(st->be, st->params);
  gpu_free(st->be, st->grads);
  gpu_free(st->be, st->m);
  gpu_free(st->be, st->v);
  gpu_free(st->be, st->ws);
  gpu_free(st->be, st->targets);
  gpu_free(st->be, st->rope);
  free(st->tensors);
  free(st->state_header);
  free(st);
}

const stage_spec *stage_get_spec(const stage *st) { return &st->spec; }
gpu_backend *stage_get_backend(const stage *st) { return st->be; }

/* ---- slots ---------------------------------------------------------------------- */

static stage_slot *slot_find(stage *st, uint64_t mb) {
  for (int i = 0; i < st->spec.capacity; i++)
    if (st->slots[i].used && st->slots[i].id == mb) return &st->slots[i];
  return NULL;
}

/* The slot of mb for `part` (creating it if needed), with that part's
 * memory allocated; GW_EEXIST when that part already ran for mb. */
static int slot_acquire(stage *st, uint64_t mb, stage_part part, stage_slot **out) {
  stage_slot *sl = slot_find(st, mb);
  if (sl && (sl->parts & part)) return GW_EEXIST;
  for (int i = 0; !sl && i < st->spec.capacity; i++)
    if (!st->slots[i].used) sl = &st->slots[i];
  if (!sl) return GW_EFULL;
  size_t N = (size_t)st->spec.batch * st->spec.seq_len;
  /* Memory stays with the slot after release: the next microbatch reuses
   * it without allocating (or faulting in) fresh pages. */
  if (part == STAGE_PART_BLOCKS && !sl->acts) {
    act_layout l = layer_layout(&st->spec, st->att_floats);
    sl->acts = gpu_alloc(st->be, slot_block_floats(&st->spec, &l) * sizeof(float));
    if (!sl->acts) return GW_ENOMEM;
  }
  if (part == STAGE_PART_EMBED && !sl->tokens) {
    sl->tokens = gpu_alloc(st->be, N * sizeof(int32_t));
    if (!sl->tokens) return GW_ENOMEM;
  }
  if (!sl->used) {
    sl->used = true;
    sl->id = mb;
    sl->parts = 0;
  }
  *out = sl;
  return 0;
}

int stage_release(stage *st, uint64_t mb) {
  stage_slot *sl = slot_find(st, mb);
  if (!sl) return GW_ENOENT;
  sl->used = false;
  sl->parts = 0;
  return 0;
}

int stage_in_flight(const stage *st) {
  int n = 0;
  for (int i = 0; i < st->spec.capacity; i++) n += st->slots[i].used;
  return n;
}

/* ---- block kernels ----------------------------------------------------------------- */

/* Pointers to one block's tensors within a flat array (params or grads);
 * names follow gpt, llama maps onto them (see model_block_tensors). */
typedef struct block_ptrs {
  float *n1w, *n1b, *qkvw, *qkvb, *ow, *ob, *n2w, *n2b, *fcw, *fcb, *pw, *pb;
} block_ptrs;

static block_ptrs block_at(const stage *st, float *base, int l) {
  const model_config *c = &st->spec.model;
  size_t C = c->d_model, F = c->d_ff;
  float *p = base + st->head_numel + (size_t)l * st->block_numel;
  block_ptrs b = {0};
  if (c->arch == MODEL_GPT) {
    b.n1w = p, p += C;
    b.n1b = p, p += C;
    b.qkvw = p, p += 3 * C * C;
    b.qkvb = p, p += 3 * C;
    b.ow = p, p += C * C;
    b.ob = p, p += C;
    b.n2w = p, p += C;
    b.n2b = p, p += C;
    b.fcw = p, p += F * C;
    b.fcb = p, p += F;
    b.pw = p, p += C * F;
    b.pb = p;
  } else {
    b.n1w = p, p += C;
    b.qkvw = p, p += 3 * C * C; /* q, k, v stacked */
    b.ow = p, p += C * C;
    b.n2w = p, p += C;
    b.fcw = p, p += 2 * F * C; /* gate, up stacked */
    b.pw = p;
  }
  return b;
}

typedef struct layer_acts {
  float *x, *y, *n1, *n1_mean, *n1_rstd, *qkv, *att, *atty, *h, *n2, *n2_mean, *n2_rstd, *fc, *fc_act;
} layer_acts;

static layer_acts acts_at(const stage *st, const stage_slot *sl, int l) {
  size_t NC = (size_t)st->spec.batch * st->spec.seq_len * st->spec.model.d_model;
  act_layout lay = layer_layout(&st->spec, st->att_floats);
  float *res = sl->acts;
  float *base = sl->acts + (size_t)(st->spec.n_layers + 1) * align_up(NC) + (size_t)l * lay.total;
  layer_acts a = {
      .x = res + (size_t)l * align_up(NC),
      .y = res + (size_t)(l + 1) * align_up(NC),
      .n1 = base + lay.n1,
      .n1_mean = base + lay.n1_mean,
      .n1_rstd = base + lay.n1_rstd,
      .qkv = base + lay.qkv,
      .att = base + lay.att,
      .atty = base + lay.atty,
      .h = base + lay.h,
      .n2 = base + lay.n2,
      .n2_mean = base + lay.n2_mean,
      .n2_rstd = base + lay.n2_rstd,
      .fc = base + lay.fc,
      .fc_act = base + lay.fc_act,
  };
  return a;
}

static void gpt_block_forward(stage *st, const block_ptrs *p, const layer_acts *a) {
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int B = st->spec.batch, T = st->spec.seq_len, N = B * T, C = c->d_model, F = c->d_ff;
  gpu_layernorm_forward(be, a->n1, a->n1_mean, a->n1_rstd, a->x, p->n1w, p->n1b, N, C, c->eps);
  gpu_matmul_forward(be, a->qkv, a->n1, p->qkvw, p->qkvb, NULL, N, C, 3 * C);
  gpu_attention_forward(be, a->atty, a->att, a->qkv, B, T, C, c->n_heads);
  gpu_matmul_forward(be, a->h, a->atty, p->ow, p->ob, a->x, N, C, C);
  gpu_layernorm_forward(be, a->n2, a->n2_mean, a->n2_rstd, a->h, p->n2w, p->n2b, N, C, c->eps);
  gpu_matmul_forward(be, a->fc, a->n2, p->fcw, p->fcb, NULL, N, C, F);
  gpu_gelu_forward(be, a->fc_act, a->fc, (size_t)N * F);
  gpu_matmul_forward(be, a->y, a->fc_act, p->pw, p->pb, a->h, N, F, C);
}

static void llama_block_forward(stage *st, const block_ptrs *p, const layer_acts *a) {
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int B = st->spec.batch, T = st->spec.seq_len, N = B * T, C = c->d_model, F = c->d_ff;
  gpu_rmsnorm_forward(be, a->n1, a->n1_rstd, a->x, p->n1w, N, C, c->eps);
  gpu_matmul_forward(be, a->qkv, a->n1, p->qkvw, NULL, NULL, N, C, 3 * C);
  gpu_rope_forward(be, a->qkv, st->rope, B, T, C, c->n_heads);
  gpu_attention_forward(be, a->atty, a->att, a->qkv, B, T, C, c->n_heads);
  gpu_matmul_forward(be, a->h, a->atty, p->ow, NULL, a->x, N, C, C);
  gpu_rmsnorm_forward(be, a->n2, a->n2_rstd, a->h, p->n2w, N, C, c->eps);
  gpu_matmul_forward(be, a->fc, a->n2, p->fcw, NULL, NULL, N, C, 2 * F);
  gpu_swiglu_forward(be, a->fc_act, a->fc, N, F);
  gpu_matmul_forward(be, a->y, a->fc_act, p->pw, NULL, a->h, N, F, C);
}

/* Backward of one block, in place on the residual-stream gradient dres:
 * it holds dy on entry and dx on return (the skip connections pass it
 * through; the norms' backward adds their branch into it). */
static void gpt_block_backward(stage *st, const block_ptrs *p, const block_ptrs *g,
                               const layer_acts *a, float *dres) {
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int B = st->spec.batch, T = st->spec.seq_len, N = B * T, C = c->d_model, F = c->d_ff;
  ws_layout w = workspace_layout(&st->spec);
  float *dC = st->ws + w.dC, *d3C = st->ws + w.d3C, *dF = st->ws + w.dF;
  gpu_matmul_backward(be, dF, g->pw, g->pb, dres, a->fc_act, p->pw, N, F, C);
  gpu_gelu_backward(be, dF, a->fc, dF, (size_t)N * F);
  gpu_matmul_backward(be, dC, g->fcw, g->fcb, dF, a->n2, p->fcw, N, C, F);
  gpu_layernorm_backward(be, dres, g->n2w, g->n2b, dC, a->h, p->n2w, a->n2_mean, a->n2_rstd, N, C);
  gpu_matmul_backward(be, dC, g->ow, g->ob, dres, a->atty, p->ow, N, C, C);
  gpu_attention_backward(be, d3C, dC, a->qkv, a->att, B, T, C, c->n_heads);
  gpu_matmul_backward(be, dC, g->qkvw, g->qkvb, d3C, a->n1, p->qkvw, N, C, 3 * C);
  gpu_layernorm_backward(be, dres, g->n1w, g->n1b, dC, a->x, p->n1w, a->n1_mean, a->n1_rstd, N, C);
}

static void llama_block_backward(stage *st, const block_ptrs *p, const block_ptrs *g,
                                 const layer_acts *a, float *dres) {
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int B = st->spec.batch, T = st->spec.seq_len, N = B * T, C = c->d_model, F = c->d_ff;
  ws_layout w = workspace_layout(&st->spec);
  float *dC = st->ws + w.dC, *d3C = st->ws + w.d3C, *dF = st->ws + w.dF, *d2F = st->ws + w.d2F;
  gpu_matmul_backward(be, dF, g->pw, NULL, dres, a->fc_act, p->pw, N, F, C);
  gpu_swiglu_backward(be, d2F, dF, a->fc, N, F);
  gpu_matmul_backward(be, dC, g->fcw, NULL, d2F, a->n2, p->fcw, N, C, 2 * F);
  gpu_rmsnorm_backward(be, dres, g->n2w, dC, a->h, p->n2w, a->n2_rstd, N, C);
  gpu_matmul_backward(be, dC, g->ow, NULL, dres, a->atty, p->ow, N, C, C);
  gpu_attention_backward(be, d3C, dC, a->qkv, a->att, B, T, C, c->n_heads);
  gpu_rope_backward(be, d3C, st->rope, B, T, C, c->n_heads);
  gpu_matmul_backward(be, dC, g->qkvw, NULL, d3C, a->n1, p->qkvw, N, C, 3 * C);
  gpu_rmsnorm_backward(be, dres, g->n1w, dC, a->x, p->n1w, a->n1_rstd, N, C);
}

/* ---- microbatch API ----------------------------------------------------------------- */

static size_t act_bytes(const stage *st) {
  return (size_t)st->spec.batch * st->spec.seq_len * st->spec.model.d_model * sizeof(float);
}

int stage_forward(stage *st, uint64_t mb, const float *x, float *y) {
  if (st->spec.n_layers == 0) return GW_EINVAL;
  stage_slot *sl;
  int rc = slot_acquire(st, mb, STAGE_PART_BLOCKS, &sl);
  if (rc) return rc;
  layer_acts a0 = acts_at(st, sl, 0);
  rc = gpu_upload(st->be, a0.x, x, act_bytes(st));
  for (int l = 0; !rc && l < st->spec.n_layers; l++) {
    block_ptrs p = block_at(st, st->params, l);
    layer_acts a = acts_at(st, sl, l);
    if (st->spec.model.arch == MODEL_GPT)
      gpt_block_forward(st, &p, &a);
    else
      llama_block_forward(st, &p, &a);
  }
  if (!rc) {
    layer_acts last = acts_at(st, sl, st->spec.n_layers - 1);
    rc = y ? gpu_download(st->be, y, last.y, act_bytes(st)) : gpu_sync(st->be);
  }
  if (rc) {
    /* A failed forward leaves nothing behind for this microbatch. */
    if (!sl->parts) sl->used = false;
    return rc;
  }
  sl->parts |= STAGE_PART_BLOCKS;
  return 0;
}

int stage_backward(stage *st, uint64_t mb, const float *dy, float *dx) {
  stage_slot *sl = slot_find(st, mb);
  if (!sl || !(sl->parts & STAGE_PART_BLOCKS)) return GW_ENOENT;
  ws_layout w = workspace_layout(&st->spec);
  float *dres = st->ws + w.dres;
  int rc = gpu_upload(st->be, dres, dy, act_bytes(st));
  for (int l = st->spec.n_layers - 1; !rc && l >= 0; l--) {
    block_ptrs p = block_at(st, st->params, l), g = block_at(st, st->grads, l);
    layer_acts a = acts_at(st, sl, l);
    if (st->spec.model.arch == MODEL_GPT)
      gpt_block_backward(st, &p, &g, &a, dres);
    else
      llama_block_backward(st, &p, &g, &a, dres);
  }
  if (rc) return rc;
  return dx ? gpu_download(st->be, dx, dres, act_bytes(st)) : gpu_sync(st->be);
}

int stage_recompute(stage *st, uint64_t mb, const float *x, const float *dy, float *dx) {
  int rc = stage_forward(st, mb, x, NULL);
  return rc ? rc : stage_backward(st, mb, dy, dx);
}

int stage_saved_output(stage *st, uint64_t mb, float *y) {
  stage_slot *sl = slot_find(st, mb);
  if (!sl || !(sl->parts & STAGE_PART_BLOCKS)) return GW_ENOENT;
  layer_acts last = acts_at(st, sl, st->spec.n_layers - 1);
  return gpu_download(st->be, y, last.y, act_bytes(st));
}

/* Tokens and targets come from files and peers: check before any kernel
 * indexes a table with them. */
static int check_tokens(const stage *st, const int32_t *tok) {
  size_t n = (size_t)st->spec.batch * st->spec.seq_len;
  for (size_t i = 0; i < n; i++)
    if (tok[i] < 0 || tok[i] >= st->spec.model.vocab_size) return GW_EINVAL;
  return 0;
}

/* Pointers to the data-node tensors (params or grads). */
typedef struct head_ptrs {
  float *wte, *wpe, *nfw, *nfb, *lm;
} head_ptrs;

static head_ptrs head_at(const stage *st, float *base) {
  const model_config *c = &st->spec.model;
  size_t C = c->d_model, V = c->vocab_size;
  head_ptrs h = {.wte = base};
  if (c->arch == MODEL_GPT) {
    h.wpe = base + V * C;
    h.nfw = h.wpe + (size_t)c->max_seq_len * C;
    h.nfb = h.nfw + C;
    h.lm = h.wte; /* tied */
  } else {
    h.nfw = base + V * C;
    h.lm = h.nfw + C;
  }
  return h;
}

int stage_embed_forward(stage *st, uint64_t mb, const int32_t *tokens, float *x) {
  if (!st->spec.has_head) return GW_EINVAL;
  if (check_tokens(st, tokens)) return GW_EINVAL;
  stage_slot *sl;
  int rc = slot_acquire(st, mb, STAGE_PART_EMBED, &sl);
  if (rc) return rc;
  size_t N = (size_t)st->spec.batch * st->spec.seq_len;
  ws_layout w = workspace_layout(&st->spec);
  head_ptrs p = head_at(st, st->params);
  rc = gpu_upload(st->be, sl->tokens, tokens, N * sizeof(int32_t));
  if (!rc) {
    gpu_encoder_forward(st->be, st->ws + w.x, sl->tokens, p.wte, p.wpe, st->spec.batch,
                        st->spec.seq_len, st->spec.model.d_model);
    rc = gpu_download(st->be, x, st->ws + w.x, act_bytes(st));
  }
  if (rc) {
    if (!sl->parts) sl->used = false;
    return rc;
  }
  sl->parts |= STAGE_PART_EMBED;
  return 0;
}

int stage_embed_backward(stage *st, uint64_t mb, const float *dx) {
  stage_slot *sl = slot_find(st, mb);
  if (!sl || !(sl->parts & STAGE_PART_EMBED)) return GW_ENOENT;
  ws_layout w = workspace_layout(&st->spec);
  head_ptrs g = head_at(st, st->grads);
  int rc = gpu_upload(st->be, st->ws + w.dres, dx, act_bytes(st));
  if (rc) return rc;
  gpu_encoder_backward(st->be, g.wte, g.wpe, st->ws + w.dres, sl->tokens, st->spec.batch,
                       st->spec.seq_len, st->spec.model.d_model);
  return gpu_sync(st->be);
}

/* The head's forward for both losses: final norm, logits and the
 * per-position losses of y (B,T,C) against targets (B,T), on the device. */
static int head_forward(stage *st, const float *y, const int32_t *targets) {
  if (!st->spec.has_head) return GW_EINVAL;
  if (check_tokens(st, targets)) return GW_EINVAL;
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int N = st->spec.batch * st->spec.seq_len, C = c->d_model, V = c->vocab_size;
  ws_layout w = workspace_layout(&st->spec);
  float *x = st->ws + w.x, *nf = st->ws + w.nf, *logits = st->ws + w.logits;
  head_ptrs p = head_at(st, st->params);
  int rc = gpu_upload(be, x, y, act_bytes(st));
  if (!rc) rc = gpu_upload(be, st->targets, targets, (size_t)N * sizeof(int32_t));
  if (rc) return rc;
  if (c->arch == MODEL_GPT)
    gpu_layernorm_forward(be, nf, st->ws + w.nf_mean, st->ws + w.nf_rstd, x, p.nfw, p.nfb, N, C, c->eps);
  else
    gpu_rmsnorm_forward(be, nf, st->ws + w.nf_rstd, x, p.nfw, N, C, c->eps);
  gpu_matmul_forward(be, logits, nf, p.lm, NULL, NULL, N, C, V);
  gpu_crossentropy_forward(be, st->ws + w.losses, logits, logits, st->targets, N, V);
  return 0;
}

/* The mean of the N per-position losses, downloaded into host (N floats) and
 * summed in double in position order: both losses give the same bits. */
static int mean_loss(stage *st, float *host, float *loss) {
  int N = st->spec.batch * st->spec.seq_len;
  int rc = gpu_download(st->be, host, st->ws + workspace_layout(&st->spec).losses, (size_t)N * sizeof(float));
  if (rc) return rc;
  double sum = 0.0;
  for (int i = 0; i < N; i++) sum += host[i];
  *loss = (float)(sum / N);
  return 0;
}

int stage_loss(stage *st, const float *y, const int32_t *targets, float *loss, float *dy) {
  int rc = head_forward(st, y, targets);
  if (rc) return rc;
  gpu_backend *be = st->be;
  const model_config *c = &st->spec.model;
  int N = st->spec.batch * st->spec.seq_len, C = c->d_model, V = c->vocab_size;
  ws_layout w = workspace_layout(&st->spec);
  float *x = st->ws + w.x, *nf = st->ws + w.nf, *logits = st->ws + w.logits;
  float *dnf = st->ws + w.dnf, *dx = st->ws + w.dres;
  head_ptrs p = head_at(st, st->params), g = head_at(st, st->grads);
  gpu_crossentropy_backward(be, logits, logits, st->targets, 1.0f / (float)N, N, V);
  gpu_matmul_backward(be, dnf, g.lm, NULL, logits, nf, p.lm, N, C, V);
  gpu_zero(be, dx, act_bytes(st));
  if (c->arch == MODEL_GPT)
    gpu_layernorm_backward(be, dx, g.nfw, g.nfb, dnf, x, p.nfw, st->ws + w.nf_mean, st->ws + w.nf_rstd, N, C);
  else
    gpu_rmsnorm_backward(be, dx, g.nfw, dnf, x, p.nfw, st->ws + w.nf_rstd, N, C);
  /* The per-position losses reuse the host dy buffer (N <= N*C floats): no
   * allocation for the mean. */
  rc = mean_loss(st, dy, loss);
  if (rc) return rc;
  return gpu_download(be, dy, dx, act_bytes(st));
}

int stage_loss_eval(stage *st, const float *y, const int32_t *targets, float *loss) {
  int rc = head_forward(st, y, targets);
  if (rc) return rc;
  float *host = malloc((size_t)st->spec.batch * st->spec.seq_len * sizeof(float));
  if (!host) return GW_ENOMEM;
  rc = mean_loss(st, host, loss);
  free(host);
  return rc;
}

/* ---- parameters and optimizer ----------------------------------------------------- */

size_t stage_n_params(const stage *st) { return st->n_params; }
int stage_n_tensors(const stage *st) { return st->n_tensors; }

const model_tensor *stage_tensor(const stage *st, int i) {
  return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const model_tensor *stage_find_tensor(const stage *st, const char *name) {
  for (int i = 0; i < st->n_tensors; i++)
    if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
  return NULL;
}

float *stage_buf_ptr(stage *st, stage_buf which) {
  switch (which) {
    case STAGE_PARAMS: return st->params;
    case STAGE_GRADS: return st->grads;
    case STAGE_ADAM_M: return st->m;
    case STAGE_ADAM_V: return st->v;
  }
  return NULL;
}

static int check_range(const stage *st, size_t offset, size_t n) {
  return offset <= st->n_params && n <= st->n_params - offset ? 0 : GW_ERANGE;
}

int stage_read(stage *st, stage_buf which, size_t offset, size_t n, float *dst) {
  float *buf = stage_buf_ptr(st, which);
  if (!buf || check_range(st, offset, n)) return buf ? GW_ERANGE : GW_EINVAL;
  return gpu_download(st->be, dst, buf + offset, n * sizeof(float));
}

int stage_write(stage *st, stage_buf which, size_t offset, size_t n, const float *src) {
  float *buf = stage_buf_ptr(st, which);
  if (!buf || check_range(st, offset, n)) return buf ? GW_ERANGE : GW_EINVAL;
  return gpu_upload(st->be, buf + offset, src, n * sizeof(float));
}

int stage_zero_grads(stage *st) {
  gpu_zero(st->be, st->grads, st->n_params * sizeof(float));
  return gpu_sync(st->be);
}

/* The L2 norm of the stage's gradient, summed in double on the host, a
 * chunk at a time (the same order on every backend and every peer, so
 * peers holding the same gradient clip it alike). */
static int grad_norm(stage *st, double *norm);

int stage_step(stage *st, const adamw_config *cfg, float lr, float grad_scale) {
  if (cfg->grad_clip > 0) {
    double norm;
    int rc = grad_norm(st, &norm);
    if (rc != 0) return rc;
    norm *= fabs((double)grad_scale);
    if (norm > cfg->grad_clip) grad_scale = (float)((double)grad_scale * cfg->grad_clip / norm);
  }
  st->step++;
  for (int i = 0; i < st->n_tensors; i++) {
    const model_tensor *t = &st->tensors[i];
    gpu_adamw_args a = {
        .lr = lr,
        .beta1 = cfg->beta1,
        .beta2 = cfg->beta2,
        .eps = cfg->eps,
        .weight_decay = t->weight_decay ? cfg->weight_decay : 0.0f,
        .grad_scale = grad_scale,
        .step = st->step,
    };
    gpu_adamw_update(st->be, st->params + t->offset, st->grads + t->offset, st->m + t->offset,
                     st->v + t->offset, t->numel, &a);
  }
  return gpu_sync(st->be);
}

long long stage_step_count(const stage *st) { return st->step; }
void stage_set_step_count(stage *st, long long step) { st->step = step; }

/* Chunks for walking device memory from the host. */
#define STAGE_HOST_CHUNK ((size_t)1 << 20)

static int grad_norm(stage *st, double *norm) {
  float *chunk = malloc(STAGE_HOST_CHUNK * sizeof(float));
  if (!chunk) return GW_ENOMEM;
  double ss = 0;
  int rc = 0;
  for (size_t off = 0; !rc && off < st->n_params; off += STAGE_HOST_CHUNK) {
    size_t n = st->n_params - off < STAGE_HOST_CHUNK ? st->n_params - off : STAGE_HOST_CHUNK;
    rc = gpu_download(st->be, chunk, st->grads + off, n * sizeof(float));
    for (size_t i = 0; !rc && i < n; i++) ss += (double)chunk[i] * chunk[i];
  }
  free(chunk);
  *norm = sqrt(ss);
  return rc;
}

int stage_weight_hash(stage *st, uint8_t out[STAGE_HASH_BYTES]) {
  crypto_generichash_state h;
  crypto_generichash_init(&h, NULL, 0, STAGE_HASH_BYTES);
  float *chunk = malloc(STAGE_HOST_CHUNK * sizeof(float));
  if (!chunk) return GW_ENOMEM;
  int rc = 0;
  for (size_t off = 0; !rc && off < st->n_params; off += STAGE_HOST_CHUNK) {
    size_t n = st->n_params - off < STAGE_HOST_CHUNK ? st->n_params - off : STAGE_HOST_CHUNK;
    rc = gpu_download(st->be, chunk, st->params + off, n * sizeof(float));
    if (!rc) crypto_generichash_update(&h, (const unsigned char *)chunk, n * sizeof(float));
  }
  free(chunk);
  if (!rc) crypto_generichash_final(&h, out, STAGE_HASH_BYTES);
  return rc;
}
