/* train/subspace.c — see subspace.h. The products with U are OpenBLAS
 * sgemms on host arrays: at k << C each costs 2 * rows * C * k flops, a few
 * percent of a block's forward. */
#include "train/subspace.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/rng.h"

/* U's draws come from their own stream of the run's seed: the weights'
 * initialisation uses the seed itself. */
#define SUBSPACE_SEED_TAG (0x5375627370616365ULL) /* "Subspace" */

int subspace_parse(const char *s, int *k, int *refresh) {
  char *end;
  long kv = strtol(s, &end, 10), rv = SUBSPACE_REFRESH_DEFAULT;
  if (end == s || kv < 1 || kv > MODEL_MAX_DIM) return GW_EINVAL;
  if (*end == ':') {
    const char *r = end + 1;
    rv = strtol(r, &end, 10);
    if (end == r || rv < 0 || rv > 1000000) return GW_EINVAL;
  }
  if (*end != '\0') return GW_EINVAL;
  *k = (int)kv;
  *refresh = (int)rv;
  return 0;
}

void subspace_basis(int C, int k, uint64_t seed, float *U) {
  gw_rng rng;
  gw_rng_seed(&rng, seed ^ SUBSPACE_SEED_TAG);
  double *q = malloc((size_t)C * k * sizeof(double)); /* column j at q[j*C ..] */
  if (!q) {
    memset(U, 0, (size_t)C * k * sizeof(float));
    return;
  }
  for (size_t i = 0; i < (size_t)C * k; i++) q[i] = gw_rng_normal(&rng);
  /* modified Gram-Schmidt, two passes: orthogonal to float precision */
  for (int j = 0; j < k; j++) {
    double *v = q + (size_t)j * C;
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < j; i++) {
        const double *u = q + (size_t)i * C;
        double d = 0;
        for (int c = 0; c < C; c++) d += u[c] * v[c];
        for (int c = 0; c < C; c++) v[c] -= d * u[c];
      }
    double n = 0;
    for (int c = 0; c < C; c++) n += v[c] * v[c];
    n = sqrt(n);
    for (int c = 0; c < C; c++) v[c] /= n;
  }
  for (int c = 0; c < C; c++)
    for (int j = 0; j < k; j++) U[(size_t)c * k + j] = (float)q[(size_t)j * C + c];
  free(q);
}

/* rows x C in place: a -= (a U) U^T, the part outside U; tmp: rows x k */
static void drop_inside(const subspace *s, float *a, size_t rows, float *tmp) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, s->k, s->C, 1.0f, a, s->C, s->U, s->k,
              0.0f, tmp, s->k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, s->C, s->k, -1.0f, tmp, s->k, s->U, s->k,
              1.0f, a, s->C);
}

/* x0 (rows x C): each row's token row of the table plus its position's */
static void gather_x0(const subspace *s, const int32_t *tokens, size_t rows, int T, float *x0) {
  size_t C = (size_t)s->C;
  for (size_t r = 0; r < rows; r++) {
    const float *t = s->table + (size_t)tokens[r] * C;
    float *o = x0 + r * C;
    if (s->P) {
      const float *p = s->table + ((size_t)s->V + r % (size_t)T) * C;
      for (size_t c = 0; c < C; c++) o[c] = t[c] + p[c];
    } else {
      memcpy(o, t, C * sizeof(float));
    }
  }
}

static int check_rows(const subspace *s, const int32_t *tokens, size_t rows, int T) {
  if (rows > s->max_rows || T < 1 || (s->P && T > s->P)) return GW_ERANGE;
  for (size_t r = 0; r < rows; r++)
    if (tokens[r] < 0 || tokens[r] >= s->V) return GW_EINVAL;
  return 0;
}

int subspace_encode(subspace *s, const float *x, const int32_t *tokens, size_t rows, int T, float *z) {
  int rc = check_rows(s, tokens, rows, T);
  if (rc != 0) return rc;
  float *d = s->scratch;
  gather_x0(s, tokens, rows, T, d);
  for (size_t i = 0; i < rows * (size_t)s->C; i++) d[i] = x[i] - d[i];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, s->k, s->C, 1.0f, d, s->C, s->U, s->k, 0.0f,
              z, s->k);
  return 0;
}

int subspace_decode(subspace *s, const float *z, const int32_t *tokens, size_t rows, int T, float *x) {
  int rc = check_rows(s, tokens, rows, T);
  if (rc != 0) return rc;
  gather_x0(s, tokens, rows, T, x);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, s->C, s->k, 1.0f, z, s->k, s->U, s->k, 1.0f, x,
              s->C);
  return 0;
}

int subspace_grad_split(subspace *s, const float *g, const int32_t *tokens, size_t rows, int T, float *gz) {
  int rc = check_rows(s, tokens, rows, T);
  if (rc != 0) return rc;
  size_t C = (size_t)s->C;
  float *out = s->scratch;
  memcpy(out, g, rows * C * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, s->k, s->C, 1.0f, g, s->C, s->U, s->k, 0.0f,
              gz, s->k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, s->C, s->k, -1.0f, gz, s->k, s->U, s->k, 1.0f,
              out, s->C);
  for (size_t r = 0; s->refresh && r < rows; r++) { /* a fixed table needs no sums */
    float *t = s->gsum + (size_t)tokens[r] * C;
    float *p = s->P ? s->gsum + ((size_t)s->V + r % (size_t)T) * C : NULL;
    for (size_t c = 0; c < C; c++) {
      t[c] += out[r * C + c];
      if (p) p[c] += out[r * C + c];
    }
  }
  return 0;
}

void subspace_grad_lift(const subspace *s, const float *gz, size_t rows, float *g) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, s->C, s->k, 1.0f, gz, s->k, s->U, s->k, 0.0f, g,
              s->C);
}

/* The tensors through which a block writes into the residual stream. */
static bool writes_residual(const char *name) {
  static const char *const suffixes[] = {".attn.proj.weight", ".attn.proj.bias", ".mlp.proj.weight",
                                         ".mlp.proj.bias",    ".attn.o.weight",  ".mlp.down.weight"};
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
    size_t m = strlen(suffixes[i]);
    if (n >= m && strcmp(name + n - m, suffixes[i]) == 0) return true;
  }
  return false;
}

/* W (C x cols, [out, in]) = U (U^T W) */
static int project_rows(const subspace *s, stage *st, const model_tensor *t, stage_buf which) {
  size_t cols = t->ndim == 2 ? (size_t)t->shape[1] : 1, n = (size_t)s->C * cols;
  float *w = malloc(n * sizeof(float)), *tmp = malloc((size_t)s->k * cols * sizeof(float));
  int rc = w && tmp ? stage_read(st, which, t->offset, n, w) : GW_ENOMEM;
  if (rc == 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, s->k, (int)cols, s->C, 1.0f, s->U, s->k, w, (int)cols,
                0.0f, tmp, (int)cols);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->C, (int)cols, s->k, 1.0f, s->U, s->k, tmp,
                (int)cols, 0.0f, w, (int)cols);
    rc = stage_write(st, which, t->offset, n, w);
  }
  free(w);
  free(tmp);
  return rc;
}

static int project_block_buf(const subspace *s, stage *st, stage_buf which) {
  for (int i = 0; i < stage_n_tensors(st); i++) {
    const model_tensor *t = stage_tensor(st, i);
    if (!writes_residual(t->name)) continue;
    if (t->shape[0] != s->C) return GW_EINVAL;
    int rc = project_rows(s, st, t, which);
    if (rc != 0) return rc;
  }
  return 0;
}

int subspace_project_block(const subspace *s, stage *st) { return project_block_buf(s, st, STAGE_PARAMS); }

int subspace_block_pre_step(const subspace *s, stage *st) { return project_block_buf(s, st, STAGE_GRADS); }

/* The embedding tensors of the head and their first row in the table. */
static int head_embeddings(const subspace *s, stage *head, const model_tensor *t[2], size_t row0[2]) {
  t[0] = stage_find_tensor(head, "tok_emb.weight");
  t[1] = s->P ? stage_find_tensor(head, "pos_emb.weight") : NULL;
  row0[0] = 0;
  row0[1] = (size_t)s->V;
  if (!t[0] || (s->P && !t[1])) return GW_EINVAL;
  return 0;
}

int subspace_head_pre_step(subspace *s, stage *head) {
  const model_tensor *t[2];
  size_t row0[2];
  int rc = head_embeddings(s, head, t, row0);
  for (int e = 0; rc == 0 && e < 2 && t[e]; e++) {
    size_t rows = (size_t)t[e]->shape[0], n = rows * (size_t)s->C;
    float *g = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    float *tmp = malloc(rows * (size_t)s->k * sizeof(float));
    rc = g && out && tmp ? stage_read(head, STAGE_GRADS, t[e]->offset, n, g) : GW_ENOMEM;
    if (rc == 0) {
      memcpy(out, g, n * sizeof(float));
      drop_inside(s, out, rows, tmp);
      float *sum = s->refresh ? s->gsum + row0[e] * (size_t)s->C : NULL;
      for (size_t i = 0; i < n; i++) {
        if (sum) sum[i] += out[i];
        g[i] -= out[i];
      }
      rc = stage_write(head, STAGE_GRADS, t[e]->offset, n, g);
    }
    free(g);
    free(out);
    free(tmp);
  }
  return rc;
}

int subspace_head_post_step(subspace *s, stage *head) {
  const model_tensor *t[2];
  size_t row0[2];
  int rc = head_embeddings(s, head, t, row0);
  for (int e = 0; rc == 0 && e < 2 && t[e]; e++) {
    size_t rows = (size_t)t[e]->shape[0], n = rows * (size_t)s->C;
    float *w = malloc(n * sizeof(float)), *tmp = malloc(rows * (size_t)s->k * sizeof(float));
    rc = w && tmp ? stage_read(head, STAGE_PARAMS, t[e]->offset, n, w) : GW_ENOMEM;
    if (rc == 0) {
      /* w = (w U) U^T + table */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, s->k, s->C, 1.0f, w, s->C, s->U, s->k,
                  0.0f, tmp, s->k);
      memcpy(w, s->table + row0[e] * (size_t)s->C, n * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, s->C, s->k, 1.0f, tmp, s->k, s->U, s->k,
                  1.0f, w, s->C);
      rc = stage_write(head, STAGE_PARAMS, t[e]->offset, n, w);
    }
    free(w);
    free(tmp);
  }
  return rc;
}

int subspace_before_step(subspace *s, stage *st) {
  const stage_spec *spec = stage_get_spec(st);
  int rc = spec->has_head ? subspace_head_pre_step(s, st) : 0;
  return rc == 0 && spec->n_layers > 0 ? subspace_block_pre_step(s, st) : rc;
}

int subspace_after_step(subspace *s, stage *st) {
  const stage_spec *spec = stage_get_spec(st);
  int rc = spec->has_head ? subspace_head_post_step(s, st) : 0;
  return rc == 0 && spec->n_layers > 0 ? subspace_project_block(s, st) : rc;
}

/* table = w (I - U U^T) */
static void publish(subspace *s) {
  size_t rows = (size_t)s->V + (size_t)s->P;
  memcpy(s->table, s->w, rows * (size_t)s->C * sizeof(float));
  for (size_t r0 = 0; r0 < rows; r0 += s->scratch_rows) {
    size_t n = rows - r0 < s->scratch_rows ? rows - r0 : s->scratch_rows;
    drop_inside(s, s->table + r0 * (size_t)s->C, n, s->scratch);
  }
}

void subspace_table_step(subspace *s, const adamw_config *opt, float lr, float grad_scale) {
  size_t n = ((size_t)s->V + (size_t)s->P) * (size_t)s->C;
  long long t = ++s->step;
  /* torch.optim.AdamW, as gpu_adamw_update: decay, moments, bias correction */
  double bc1 = 1.0 - pow(opt->beta1, (double)t), bc2 = 1.0 - pow(opt->beta2, (double)t);
  for (size_t i = 0; i < n; i++) {
    float g = s->gsum[i] * grad_scale;
    s->w[i] -= lr * opt->weight_decay * s->w[i];
    s->m[i] = opt->beta1 * s->m[i] + (1.0f - opt->beta1) * g;
    s->v[i] = opt->beta2 * s->v[i] + (1.0f - opt->beta2) * g * g;
    double mh = s->m[i] / bc1, vh = s->v[i] / bc2;
    s->w[i] -= (float)(lr * mh / (sqrt(vh) + opt->eps));
  }
  memset(s->gsum, 0, n * sizeof(float));
  publish(s);
  s->version++;
}

bool subspace_table_due(const subspace *s, long long it) { return s->refresh > 0 && (it + 1) % s->refresh == 0; }

/* The table's rows as the run starts: the initial tok_emb and pos_emb (the
 * seed's, as stage_create makes them) outside U. Every peer computes it
 * alike, the relays without the data node's stage. */
static int initial_table(subspace *s, const model_config *cfg, uint64_t seed) {
  model_tensor t[MODEL_HEAD_TENSORS_MAX];
  int n = model_head_tensors(cfg, t);
  for (int i = 0; i < n; i++) {
    size_t row0 = strcmp(t[i].name, "tok_emb.weight") == 0 ? 0 : strcmp(t[i].name, "pos_emb.weight") == 0 ? (size_t)s->V : SIZE_MAX;
    if (row0 == SIZE_MAX) continue;
    if (t[i].ndim != 2 || t[i].shape[1] != s->C) return GW_EINVAL;
    model_init_tensor(&t[i], seed, s->w + row0 * (size_t)s->C);
  }
  publish(s);
  return 0;
}

int subspace_init(subspace *s, const model_config *cfg, int k, int refresh, uint64_t seed, size_t rows, char *err,
                  size_t err_len) {
  memset(s, 0, sizeof(*s));
  if (k < 1 || k >= cfg->d_model || refresh < 0) {
    snprintf(err, err_len, "the subspace's rank k must be in [1, d_model %d), its refresh >= 0 (got %d, %d)",
             cfg->d_model, k, refresh);
    return GW_EINVAL;
  }
  s->C = cfg->d_model;
  s->k = k;
  s->V = cfg->vocab_size;
  s->P = cfg->arch == MODEL_GPT ? cfg->max_seq_len : 0;
  s->refresh = refresh;
  size_t n = ((size_t)s->V + (size_t)s->P) * (size_t)s->C;
  s->max_rows = rows;
  s->scratch_rows = rows < 256 ? 256 : rows;
  s->U = malloc((size_t)s->C * k * sizeof(float));
  s->table = malloc(n * sizeof(float));
  s->w = calloc(n, sizeof(float));
  s->scratch = malloc(s->scratch_rows * (size_t)s->C * sizeof(float));
  if (refresh) { /* a fixed table keeps neither sums nor an optimizer */
    s->gsum = calloc(n, sizeof(float));
    s->m = calloc(n, sizeof(float));
    s->v = calloc(n, sizeof(float));
  }
  if (!s->U || !s->table || !s->w || !s->scratch || (refresh && (!s->gsum || !s->m || !s->v))) {
    subspace_free(s);
    snprintf(err, err_len, "out of memory for the subspace's table (%zu floats)", n);
    return GW_ENOMEM;
  }
  subspace_basis(s->C, k, seed, s->U);
  int rc = initial_table(s, cfg, seed);
  if (rc != 0) {
    subspace_free(s);
    snprintf(err, err_len, "the model has no embedding the subspace's table can come from");
  } else if (!refresh) {
    free(s->w); /* the table's start is all a fixed table needs */
    s->w = NULL;
  }
  return rc;
}

void subspace_free(subspace *s) {
  free(s->U);
  free(s->table);
  free(s->gsum);
  free(s->w);
  free(s->m);
  free(s->v);
  free(s->scratch);
  memset(s, 0, sizeof(*s));
}
