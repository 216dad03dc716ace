/* train/generate.c — incremental decoding with a KV cache, and the full
 * forward it is checked against. */
#include "train/generate.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "train/hf_export.h"
#include "util/err.h"

/* Activations for `rows` positions of one sequence, on the device. */
typedef struct gen_bufs {
  int rows;
  float *x, *n, *mean, *rstd, *qkv, *att_state, *atty, *h, *fc, *fc_act, *logits;
  int32_t *tok;
} gen_bufs;

struct gen_model {
  model_config cfg;
  gpu_backend *be;
  float *params; /* device: the whole model */
  float *rope;   /* device: (T_max, hd/2, 2) cos/sin, llama only */
  gen_bufs one;  /* one position (gen_step) */
  int max_len, pos;
  float *kcache, *vcache; /* host: (L, max_len, C) each */
  float *qkv_host, *att_host, *scores;
};

/* Pointers to one block's tensors (llama's q|k|v and gate|up are stacked,
 * see train/model.h, so qkvw and fcw cover both). */
typedef struct gen_block {
  const float *n1w, *n1b, *qkvw, *qkvb, *ow, *ob, *n2w, *n2b, *fcw, *fcb, *pw, *pb;
} gen_block;

static gen_block block_at(const gen_model *g, int layer) {
  model_tensor t[MODEL_BLOCK_TENSORS_MAX];
  model_block_tensors(&g->cfg, layer, t);
  const float *p = g->params + hf_block_offset(&g->cfg, layer);
  gen_block b = {0};
  if (g->cfg.arch == MODEL_GPT) {
    b.n1w = p + t[0].offset, b.n1b = p + t[1].offset, b.qkvw = p + t[2].offset, b.qkvb = p + t[3].offset;
    b.ow = p + t[4].offset, b.ob = p + t[5].offset, b.n2w = p + t[6].offset, b.n2b = p + t[7].offset;
    b.fcw = p + t[8].offset, b.fcb = p + t[9].offset, b.pw = p + t[10].offset, b.pb = p + t[11].offset;
  } else {
    b.n1w = p + t[0].offset, b.qkvw = p + t[1].offset, b.ow = p + t[4].offset, b.n2w = p + t[5].offset;
    b.fcw = p + t[6].offset, b.pw = p + t[8].offset;
  }
  return b;
}

/* Data-node tensors: token embedding, positions (gpt), final norm, head. */
typedef struct gen_head {
  const float *wte, *wpe, *nfw, *nfb, *lm;
} gen_head;

static gen_head head_at(const gen_model *g) {
  model_tensor t[MODEL_HEAD_TENSORS_MAX];
  model_head_tensors(&g->cfg, t);
  const float *p = g->params;
  gen_head h = {.wte = p + t[0].offset};
  if (g->cfg.arch == MODEL_GPT) {
    h.wpe = p + t[1].offset, h.nfw = p + t[2].offset, h.nfb = p + t[3].offset, h.lm = h.wte; /* tied */
  } else {
    h.nfw = p + t[1].offset, h.lm = p + t[2].offset;
  }
  return h;
}

/* ---- buffers ---------------------------------------------------------------------- */

static void bufs_free(gpu_backend *be, gen_bufs *b) {
  float *f[] = {b->x, b->n, b->mean, b->rstd, b->qkv, b->att_state, b->atty, b->h, b->fc, b->fc_act, b->logits};
  for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) gpu_free(be, f[i]);
  gpu_free(be, b->tok);
  memset(b, 0, sizeof(*b));
}

static int bufs_alloc(gpu_backend *be, const model_config *c, int rows, bool attention, gen_bufs *b) {
  memset(b, 0, sizeof(*b));
  size_t N = (size_t)rows, C = (size_t)c->d_model, F = (size_t)c->d_ff, V = (size_t)c->vocab_size;
  b->rows = rows;
  b->x = gpu_alloc(be, N * C * sizeof(float));
  b->n = gpu_alloc(be, N * C * sizeof(float));
  b->mean = gpu_alloc(be, N * sizeof(float));
  b->rstd = gpu_alloc(be, N * sizeof(float));
  b->qkv = gpu_alloc(be, 3 * N * C * sizeof(float));
  b->atty = gpu_alloc(be, N * C * sizeof(float));
  b->h = gpu_alloc(be, N * C * sizeof(float));
  b->fc = gpu_alloc(be, 2 * N * F * sizeof(float));
  b->fc_act = gpu_alloc(be, N * F * sizeof(float));
  b->logits = gpu_alloc(be, N * V * sizeof(float));
  b->tok = gpu_alloc(be, N * sizeof(int32_t));
  if (attention) b->att_state = gpu_alloc(be, gpu_attention_state_floats(be, 1, rows, c->n_heads) * sizeof(float));
  if (!b->x || !b->n || !b->mean || !b->rstd || !b->qkv || !b->atty || !b->h || !b->fc || !b->fc_act ||
      !b->logits || !b->tok || (attention && !b->att_state)) {
    bufs_free(be, b);
    return GW_ENOMEM;
  }
  return 0;
}

/* (T_max, hd/2, 2) cos/sin in double, then rounded: the table stage.c
 * builds, so generation rotates exactly as training did. */
static int build_rope(gen_model *g) {
  const model_config *c = &g->cfg;
  int hd = c->d_model / c->n_heads, half = hd / 2;
  size_t n = (size_t)c->max_seq_len * hd;
  float *host = malloc(n * sizeof(float));
  g->rope = gpu_alloc(g->be, n * sizeof(float));
  if (!host || !g->rope) {
    free(host);
    return GW_ENOMEM;
  }
  for (int t = 0; t < c->max_seq_len; t++) {
    for (int i = 0; i < half; i++) {
      double angle = (double)t * pow((double)c->rope_theta, -2.0 * i / hd);
      host[((size_t)t * half + i) * 2] = (float)cos(angle);
      host[((size_t)t * half + i) * 2 + 1] = (float)sin(angle);
    }
  }
  int rc = gpu_upload(g->be, g->rope, host, n * sizeof(float));
  free(host);
  return rc;
}

int gen_create(const model_config *cfg, const float *params, gpu_backend *be, int max_len, gen_model **out,
               char *err, size_t err_len) {
  *out = NULL;
  int rc = model_config_validate(cfg, err, err_len);
  if (rc) return rc;
  if (max_len < 1 || max_len > cfg->max_seq_len)
    return gw_fail(err, err_len, GW_EINVAL, "context of %d positions is outside [1, %d]", max_len, cfg->max_seq_len);
  gen_model *g = calloc(1, sizeof(*g));
  if (!g) return GW_ENOMEM;
  g->cfg = *cfg;
  g->be = be;
  g->max_len = max_len;
  size_t C = (size_t)cfg->d_model, cache = (size_t)cfg->n_layers * (size_t)max_len * C;
  size_t bytes = hf_model_numel(cfg) * sizeof(float);
  g->params = gpu_alloc(be, bytes);
  g->kcache = malloc(cache * sizeof(float));
  g->vcache = malloc(cache * sizeof(float));
  g->qkv_host = malloc(3 * C * sizeof(float));
  g->att_host = malloc(C * sizeof(float));
  g->scores = malloc((size_t)max_len * sizeof(float));
  rc = g->params && g->kcache && g->vcache && g->qkv_host && g->att_host && g->scores ? 0 : GW_ENOMEM;
  if (!rc) rc = gpu_upload(be, g->params, params, bytes);
  if (!rc && cfg->arch == MODEL_LLAMA) rc = build_rope(g);
  if (!rc) rc = bufs_alloc(be, cfg, 1, false, &g->one);
  if (!rc) rc = gpu_sync(be);
  if (rc) {
    gen_destroy(g);
    return gw_fail(err, err_len, rc, "cannot set up the model for generation: %s", gw_strerror(rc));
  }
  *out = g;
  return 0;
}

void gen_destroy(gen_model *g) {
  if (!g) return;
  bufs_free(g->be, &g->one);
  gpu_free(g->be, g->params);
  gpu_free(g->be, g->rope);
  free(g->kcache);
  free(g->vcache);
  free(g->qkv_host);
  free(g->att_host);
  free(g->scores);
  free(g);
}

int gen_position(const gen_model *g) { return g->pos; }
void gen_reset(gen_model *g) { g->pos = 0; }

/* ---- one position against the cache --------------------------------------------- */

/* q (C) of the new position against the cached keys and values 0..t of
 * layer l; out (C), heads concatenated. Scale 1/sqrt(hd), softmax with the
 * maximum subtracted, as the training kernel does. */
static void attend_cached(gen_model *g, int l, int t, const float *q, float *out) {
  int C = g->cfg.d_model, NH = g->cfg.n_heads, hd = C / NH;
  const float *K = g->kcache + (size_t)l * g->max_len * C, *V = g->vcache + (size_t)l * g->max_len * C;
  float scale = 1.0f / sqrtf((float)hd), *s = g->scores;
  for (int h = 0; h < NH; h++) {
    const float *qh = q + h * hd;
    float max = -INFINITY;
    for (int j = 0; j <= t; j++) {
      const float *kj = K + (size_t)j * C + h * hd;
      float dot = 0.0f;
      for (int i = 0; i < hd; i++) dot += qh[i] * kj[i];
      s[j] = dot * scale;
      if (s[j] > max) max = s[j];
    }
    float sum = 0.0f;
    for (int j = 0; j <= t; j++) {
      s[j] = expf(s[j] - max);
      sum += s[j];
    }
    float *oh = out + h * hd;
    memset(oh, 0, (size_t)hd * sizeof(float));
    for (int j = 0; j <= t; j++) {
      const float *vj = V + (size_t)j * C + h * hd;
      float p = s[j] / sum;
      for (int i = 0; i < hd; i++) oh[i] += p * vj[i];
    }
  }
}

/* The attention of block l at position t: the new q, k, v row comes to
 * the host, k and v join the cache, the result goes back to the device. */
static int attention_step(gen_model *g, int l, int t) {
  size_t C = (size_t)g->cfg.d_model;
  int rc = gpu_download(g->be, g->qkv_host, g->one.qkv, 3 * C * sizeof(float));
  if (rc) return rc;
  memcpy(g->kcache + ((size_t)l * g->max_len + t) * C, g->qkv_host + C, C * sizeof(float));
  memcpy(g->vcache + ((size_t)l * g->max_len + t) * C, g->qkv_host + 2 * C, C * sizeof(float));
  attend_cached(g, l, t, g->qkv_host, g->att_host);
  return gpu_upload(g->be, g->one.atty, g->att_host, C * sizeof(float));
}

static int block_step(gen_model *g, int l, int t) {
  gpu_backend *be = g->be;
  const model_config *c = &g->cfg;
  gen_block p = block_at(g, l);
  gen_bufs *b = &g->one;
  int C = c->d_model, F = c->d_ff, hd = C / c->n_heads;
  if (c->arch == MODEL_GPT) {
    gpu_layernorm_forward(be, b->n, b->mean, b->rstd, b->x, p.n1w, p.n1b, 1, C, c->eps);
    gpu_matmul_forward(be, b->qkv, b->n, p.qkvw, p.qkvb, NULL, 1, C, 3 * C);
  } else {
    gpu_rmsnorm_forward(be, b->n, b->rstd, b->x, p.n1w, 1, C, c->eps);
    gpu_matmul_forward(be, b->qkv, b->n, p.qkvw, NULL, NULL, 1, C, 3 * C);
    /* the table's row t: the kernel rotates its single row as position t */
    gpu_rope_forward(be, b->qkv, g->rope + (size_t)t * hd, 1, 1, C, c->n_heads);
  }
  int rc = attention_step(g, l, t);
  if (rc) return rc;
  if (c->arch == MODEL_GPT) {
    gpu_matmul_forward(be, b->h, b->atty, p.ow, p.ob, b->x, 1, C, C);
    gpu_layernorm_forward(be, b->n, b->mean, b->rstd, b->h, p.n2w, p.n2b, 1, C, c->eps);
    gpu_matmul_forward(be, b->fc, b->n, p.fcw, p.fcb, NULL, 1, C, F);
    gpu_gelu_forward(be, b->fc_act, b->fc, (size_t)F);
    gpu_matmul_forward(be, b->x, b->fc_act, p.pw, p.pb, b->h, 1, F, C);
  } else {
    gpu_matmul_forward(be, b->h, b->atty, p.ow, NULL, b->x, 1, C, C);
    gpu_rmsnorm_forward(be, b->n, b->rstd, b->h, p.n2w, 1, C, c->eps);
    gpu_matmul_forward(be, b->fc, b->n, p.fcw, NULL, NULL, 1, C, 2 * F);
    gpu_swiglu_forward(be, b->fc_act, b->fc, 1, F);
    gpu_matmul_forward(be, b->x, b->fc_act, p.pw, NULL, b->h, 1, F, C);
  }
  return 0;
}

/* Final norm and LM head on `rows` rows of b->x into b->logits. */
static void head_forward(gen_model *g, gen_bufs *b, int rows) {
  const model_config *c = &g->cfg;
  gen_head h = head_at(g);
  if (c->arch == MODEL_GPT)
    gpu_layernorm_forward(g->be, b->n, b->mean, b->rstd, b->x, h.nfw, h.nfb, rows, c->d_model, c->eps);
  else
    gpu_rmsnorm_forward(g->be, b->n, b->rstd, b->x, h.nfw, rows, c->d_model, c->eps);
  gpu_matmul_forward(g->be, b->logits, b->n, h.lm, NULL, NULL, rows, c->d_model, c->vocab_size);
}

int gen_step(gen_model *g, int32_t token, float *logits) {
  const model_config *c = &g->cfg;
  if (token < 0 || token >= c->vocab_size) return GW_EINVAL;
  if (g->pos >= g->max_len) return GW_ERANGE;
  int t = g->pos;
  gen_head h = head_at(g);
  int rc = gpu_upload(g->be, g->one.tok, &token, sizeof(token));
  if (rc) return rc;
  /* one row of the position table: the kernel adds row 0 of what it gets */
  gpu_encoder_forward(g->be, g->one.x, g->one.tok, h.wte, h.wpe ? h.wpe + (size_t)t * c->d_model : NULL, 1, 1,
                      c->d_model);
  for (int l = 0; !rc && l < c->n_layers; l++) rc = block_step(g, l, t);
  if (rc) return rc;
  head_forward(g, &g->one, 1);
  rc = gpu_download(g->be, logits, g->one.logits, (size_t)c->vocab_size * sizeof(float));
  if (!rc) g->pos++;
  return rc;
}

/* ---- the whole sequence at once ----------------------------------------------------- */

/* k and v of positions 0..T-1 of layer l, from the (T, 3C) qkv rows
 * after RoPE, into the cache. */
static int cache_from_qkv(gen_model *g, int l, const float *qkv, int T, float *host) {
  size_t C = (size_t)g->cfg.d_model;
  int rc = gpu_download(g->be, host, qkv, (size_t)T * 3 * C * sizeof(float));
  for (int t = 0; !rc && t < T; t++) {
    memcpy(g->kcache + ((size_t)l * g->max_len + t) * C, host + (size_t)t * 3 * C + C, C * sizeof(float));
    memcpy(g->vcache + ((size_t)l * g->max_len + t) * C, host + (size_t)t * 3 * C + 2 * C, C * sizeof(float));
  }
  return rc;
}

/* The whole-sequence forward; with fill, the cache takes every layer's k
 * and v and only the last position's logits are computed. */
static int forward_seq(gen_model *g, const int32_t *tokens, int T, float *logits, bool fill) {
  const model_config *c = &g->cfg;
  if (T < 1 || T > c->max_seq_len || (fill && T > g->max_len)) return GW_ERANGE;
  for (int i = 0; i < T; i++)
    if (tokens[i] < 0 || tokens[i] >= c->vocab_size) return GW_EINVAL;
  gen_bufs b;
  int rc = bufs_alloc(g->be, c, T, true, &b);
  if (rc) return rc;
  float *host = fill ? malloc((size_t)T * 3 * c->d_model * sizeof(float)) : NULL;
  if (fill && !host) rc = GW_ENOMEM;
  gpu_backend *be = g->be;
  int C = c->d_model, F = c->d_ff, NH = c->n_heads;
  gen_head hp = head_at(g);
  rc = gpu_upload(be, b.tok, tokens, (size_t)T * sizeof(int32_t));
  if (!rc) gpu_encoder_forward(be, b.x, b.tok, hp.wte, hp.wpe, 1, T, C);
  for (int l = 0; !rc && l < c->n_layers; l++) {
    gen_block p = block_at(g, l);
    if (c->arch == MODEL_GPT) {
      gpu_layernorm_forward(be, b.n, b.mean, b.rstd, b.x, p.n1w, p.n1b, T, C, c->eps);
      gpu_matmul_forward(be, b.qkv, b.n, p.qkvw, p.qkvb, NULL, T, C, 3 * C);
      gpu_attention_forward(be, b.atty, b.att_state, b.qkv, 1, T, C, NH);
      if (fill) rc = cache_from_qkv(g, l, b.qkv, T, host);
      gpu_matmul_forward(be, b.h, b.atty, p.ow, p.ob, b.x, T, C, C);
      gpu_layernorm_forward(be, b.n, b.mean, b.rstd, b.h, p.n2w, p.n2b, T, C, c->eps);
      gpu_matmul_forward(be, b.fc, b.n, p.fcw, p.fcb, NULL, T, C, F);
      gpu_gelu_forward(be, b.fc_act, b.fc, (size_t)T * F);
      gpu_matmul_forward(be, b.x, b.fc_act, p.pw, p.pb, b.h, T, F, C);
    } else {
      gpu_rmsnorm_forward(be, b.n, b.rstd, b.x, p.n1w, T, C, c->eps);
      gpu_matmul_forward(be, b.qkv, b.n, p.qkvw, NULL, NULL, T, C, 3 * C);
      gpu_rope_forward(be, b.qkv, g->rope, 1, T, C, NH);
      gpu_attention_forward(be, b.atty, b.att_state, b.qkv, 1, T, C, NH);
      if (fill) rc = cache_from_qkv(g, l, b.qkv, T, host);
      gpu_matmul_forward(be, b.h, b.atty, p.ow, NULL, b.x, T, C, C);
      gpu_rmsnorm_forward(be, b.n, b.rstd, b.h, p.n2w, T, C, c->eps);
      gpu_matmul_forward(be, b.fc, b.n, p.fcw, NULL, NULL, T, C, 2 * F);
      gpu_swiglu_forward(be, b.fc_act, b.fc, T, F);
      gpu_matmul_forward(be, b.x, b.fc_act, p.pw, NULL, b.h, T, F, C);
    }
  }
  if (!rc && fill) {
    /* only the last row: the next token's logits */
    if (T > 1) gpu_copy(be, b.x, b.x + (size_t)(T - 1) * C, (size_t)C * sizeof(float));
    head_forward(g, &b, 1);
    rc = gpu_download(be, logits, b.logits, (size_t)c->vocab_size * sizeof(float));
    if (!rc) g->pos = T;
  } else if (!rc) {
    head_forward(g, &b, T);
    rc = gpu_download(be, logits, b.logits, (size_t)T * c->vocab_size * sizeof(float));
  }
  free(host);
  bufs_free(be, &b);
  return rc;
}

int gen_forward(gen_model *g, const int32_t *tokens, int T, float *logits) {
  return forward_seq(g, tokens, T, logits, false);
}

int gen_prefill(gen_model *g, const int32_t *tokens, int T, float *logits) {
  g->pos = 0;
  return forward_seq(g, tokens, T, logits, true);
}

/* ---- sampling ------------------------------------------------------------------------ */

size_t gen_pick_scratch_bytes(int V) { return (size_t)(V > 0 ? V : 1) * (sizeof(int32_t) + sizeof(double)); }

/* Does token i rank before token j: larger logit, equal logits by the lower
 * id, so the order is total and the pick the same everywhere. */
static bool ranks_before(const float *logits, int32_t i, int32_t j) {
  return logits[i] > logits[j] || (logits[i] == logits[j] && i < j);
}

/* The k best tokens in rank order, by insertion: O(V k) at worst, about
 * O(V) in practice since most tokens lose to the current k-th. */
static void top_k(const float *logits, int V, int k, int32_t *idx) {
  int n = 0;
  for (int32_t i = 0; i < V; i++) {
    if (n == k && !ranks_before(logits, i, idx[k - 1])) continue;
    int at = n < k ? n++ : k - 1;
    while (at > 0 && ranks_before(logits, i, idx[at - 1])) {
      idx[at] = idx[at - 1];
      at--;
    }
    idx[at] = i;
  }
}

int32_t gen_pick(const float *logits, int V, const gen_sampling *s, gw_rng *rng, void *scratch) {
  if (s->temperature <= 0.0f) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  int32_t *idx = scratch;
  double *p = (double *)(idx + V);
  int k = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  if (k < V) {
    top_k(logits, V, k, idx);
  } else {
    for (int i = 0; i < V; i++) idx[i] = i;
  }
  double max = -INFINITY, sum = 0.0;
  for (int i = 0; i < k; i++)
    if (logits[idx[i]] > max) max = logits[idx[i]];
  for (int i = 0; i < k; i++) sum += p[i] = exp(((double)logits[idx[i]] - max) / s->temperature);
  double u = gw_rng_uniform(rng) * sum, acc = 0.0;
  for (int i = 0; i < k; i++) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[k - 1];
}
