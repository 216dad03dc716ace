/* train/fixture.c — runs PyTorch reference fixtures (see the header). */
#include "train/fixture.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/model.h"
#include "train/safetensors.h"
#include "train/stage.h"
#include "util/err.h"

/* Fixtures are small; anything bigger is not one of ours. */
#define FIXTURE_MAX_BYTES ((size_t)256 << 20)

typedef struct fixture_ctx {
  st_file f;
  gpu_backend *be;
  double tol;
  fixture_report_fn report;
  void *ud;
  int n_failed;
  char *err;
  size_t err_len;
} fixture_ctx;

static int fail(fixture_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(fixture_ctx *x, const char *fmt, ...) {
  if (x->err && x->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, x->err_len, fmt, ap);
    va_end(ap);
  }
  return GW_EINVAL;
}

static int meta_int(fixture_ctx *x, const char *key, int *out) {
  const char *s = st_meta(&x->f, key);
  char *end = NULL;
  errno = 0;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || errno || *end || v < 0 || v > (1L << 30))
    return fail(x, "fixture metadata '%s' is missing or not an integer", key);
  *out = (int)v;
  return 0;
}

static int meta_float(fixture_ctx *x, const char *key, float *out) {
  const char *s = st_meta(&x->f, key);
  char *end = NULL;
  errno = 0;
  float v = s ? strtof(s, &end) : 0.0f;
  if (!s || errno || *end || !isfinite(v))
    return fail(x, "fixture metadata '%s' is missing or not a number", key);
  *out = v;
  return 0;
}

/* A fresh host copy of an F32 tensor of the given shape. */
static int load_f32(fixture_ctx *x, const char *name, const int64_t *shape, int ndim, float **out) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  *out = malloc((n ? n : 1) * sizeof(float));
  if (!*out) return GW_ENOMEM;
  int rc = st_copy(&x->f, name, ST_F32, shape, ndim, *out, x->err, x->err_len);
  if (rc) {
    free(*out);
    *out = NULL;
  }
  return rc;
}

/* Compares n floats of ours against the expected tensor `name`. */
static int compare(fixture_ctx *x, const char *label, const char *name, const int64_t *shape,
                   int ndim, const float *ours) {
  float *want;
  int rc = load_f32(x, name, shape, ndim, &want);
  if (rc) return rc;
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  fixture_result r = {0};
  snprintf(r.name, sizeof(r.name), "%s", label);
  bool finite = true;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)ours[i] - (double)want[i]);
    finite = finite && isfinite(ours[i]);
    r.max_abs_err = d > r.max_abs_err ? d : r.max_abs_err;
    r.max_abs_ref = fabs(want[i]) > r.max_abs_ref ? fabs(want[i]) : r.max_abs_ref;
  }
  free(want);
  r.rel = r.max_abs_ref > 0.0 ? r.max_abs_err / r.max_abs_ref : r.max_abs_err;
  r.ok = finite && r.rel <= x->tol;
  if (!r.ok) x->n_failed++;
  if (x->report) x->report(x->ud, &r);
  return 0;
}

/* Model config, batch and sequence length from the metadata. */
static int read_spec(fixture_ctx *x, stage_spec *s) {
  memset(s, 0, sizeof(*s));
  model_config *c = &s->model;
  const char *arch = st_meta(&x->f, "arch");
  if (model_arch_parse(arch, &c->arch))
    return fail(x, "fixture arch '%s' is not gpt or llama", arch ? arch : "");
  int rc = meta_int(x, "d_model", &c->d_model);
  if (!rc) rc = meta_int(x, "n_heads", &c->n_heads);
  if (!rc) rc = meta_int(x, "n_layers", &c->n_layers);
  if (!rc) rc = meta_int(x, "d_ff", &c->d_ff);
  if (!rc) rc = meta_int(x, "vocab_size", &c->vocab_size);
  if (!rc) rc = meta_int(x, "max_seq_len", &c->max_seq_len);
  if (!rc) rc = meta_float(x, "eps", &c->eps);
  if (!rc) rc = meta_float(x, "rope_theta", &c->rope_theta);
  if (!rc) rc = meta_int(x, "batch", &s->batch);
  if (!rc) rc = meta_int(x, "seq_len", &s->seq_len);
  s->capacity = 1;
  return rc;
}

/* Loads every parameter of the stage from the fixture, by name. */
static int load_params(fixture_ctx *x, stage *st) {
  int rc = 0;
  for (int i = 0; !rc && i < stage_n_tensors(st); i++) {
    const model_tensor *t = stage_tensor(st, i);
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    float *data;
    rc = load_f32(x, t->name, shape, t->ndim, &data);
    if (!rc) rc = stage_write(st, STAGE_PARAMS, t->offset, t->numel, data);
    free(data);
  }
  return rc;
}

/* expected.grad.<name> for every parameter. */
static int compare_grads(fixture_ctx *x, stage *st) {
  int rc = 0;
  for (int i = 0; !rc && i < stage_n_tensors(st); i++) {
    const model_tensor *t = stage_tensor(st, i);
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    float *g = malloc(t->numel * sizeof(float));
    if (!g) return GW_ENOMEM;
    char label[96], name[128];
    snprintf(label, sizeof(label), "grad.%s", t->name);
    snprintf(name, sizeof(name), "expected.grad.%s", t->name);
    rc = stage_read(st, STAGE_GRADS, t->offset, t->numel, g);
    if (!rc) rc = compare(x, label, name, shape, t->ndim, g);
    free(g);
  }
  return rc;
}

static int make_stage(fixture_ctx *x, stage_spec *s, stage **st) {
  int rc = stage_create(s, x->be, 0, st, x->err, x->err_len);
  if (!rc) rc = load_params(x, *st);
  return rc;
}

static int run_blocks(fixture_ctx *x) {
  stage_spec s;
  int rc = read_spec(x, &s);
  if (rc) return rc;
  s.first_layer = 0;
  s.n_layers = s.model.n_layers;
  stage *st = NULL;
  int64_t act[3] = {s.batch, s.seq_len, s.model.d_model};
  float *in = NULL, *dout = NULL, *y = NULL, *dx = NULL;
  size_t n = (size_t)s.batch * s.seq_len * s.model.d_model;
  rc = make_stage(x, &s, &st);
  if (!rc) rc = load_f32(x, "input", act, 3, &in);
  if (!rc) rc = load_f32(x, "grad_output", act, 3, &dout);
  if (!rc && (!(y = malloc(n * sizeof(float))) || !(dx = malloc(n * sizeof(float))))) rc = GW_ENOMEM;
  if (!rc) rc = stage_forward(st, 1, in, y);
  if (!rc) rc = stage_backward(st, 1, dout, dx);
  if (!rc) rc = compare(x, "output", "expected.output", act, 3, y);
  if (!rc) rc = compare(x, "grad_input", "expected.grad_input", act, 3, dx);
  if (!rc) rc = compare_grads(x, st);
  free(in), free(dout), free(y), free(dx);
  stage_destroy(st);
  return rc;
}

static int run_head(fixture_ctx *x) {
  stage_spec s;
  int rc = read_spec(x, &s);
  if (rc) return rc;
  s.has_head = true;
  s.n_layers = 0;
  stage *st = NULL;
  int64_t act[3] = {s.batch, s.seq_len, s.model.d_model}, bt[2] = {s.batch, s.seq_len};
  size_t N = (size_t)s.batch * s.seq_len, n = N * s.model.d_model;
  float *in = NULL, *demb = NULL, *emb = NULL, *dx = NULL, loss = 0.0f;
  int32_t *tokens = malloc(N * sizeof(int32_t)), *targets = malloc(N * sizeof(int32_t));
  rc = tokens && targets ? make_stage(x, &s, &st) : GW_ENOMEM;
  if (!rc) rc = st_copy(&x->f, "tokens", ST_I32, bt, 2, tokens, x->err, x->err_len);
  if (!rc) rc = st_copy(&x->f, "targets", ST_I32, bt, 2, targets, x->err, x->err_len);
  if (!rc) rc = load_f32(x, "input", act, 3, &in);
  if (!rc) rc = load_f32(x, "grad_embedding", act, 3, &demb);
  if (!rc && (!(emb = malloc(n * sizeof(float))) || !(dx = malloc(n * sizeof(float))))) rc = GW_ENOMEM;
  if (!rc && (rc = stage_embed_forward(st, 1, tokens, emb)) == GW_EINVAL)
    fail(x, "fixture tokens are outside the vocabulary");
  if (!rc && (rc = stage_loss(st, in, targets, &loss, dx)) == GW_EINVAL)
    fail(x, "fixture targets are outside the vocabulary");
  if (!rc) rc = stage_embed_backward(st, 1, demb);
  if (!rc) rc = compare(x, "embedding", "expected.embedding", act, 3, emb);
  if (!rc) rc = compare(x, "loss", "expected.loss", NULL, 0, &loss);
  if (!rc) rc = compare(x, "grad_input", "expected.grad_input", act, 3, dx);
  if (!rc) rc = compare_grads(x, st);
  free(in), free(demb), free(emb), free(dx), free(tokens), free(targets);
  stage_destroy(st);
  return rc;
}

static int run_adamw(fixture_ctx *x) {
  const st_tensor *p = st_find(&x->f, "param");
  if (!p || p->dtype != ST_F32) return fail(x, "adamw fixture has no F32 tensor 'param'");
  int64_t shape[ST_MAX_DIMS];
  memcpy(shape, p->shape, sizeof(shape));
  int ndim = p->ndim;
  size_t n = (p->end - p->begin) / sizeof(float);
  gpu_adamw_args a = {.grad_scale = 1.0f};
  int step = 0;
  int rc = meta_int(x, "step", &step);
  if (!rc) rc = meta_float(x, "lr", &a.lr);
  if (!rc) rc = meta_float(x, "beta1", &a.beta1);
  if (!rc) rc = meta_float(x, "beta2", &a.beta2);
  if (!rc) rc = meta_float(x, "adam_eps", &a.eps);
  if (!rc) rc = meta_float(x, "weight_decay", &a.weight_decay);
  if (!rc && step < 1) rc = fail(x, "adamw fixture step must be >= 1");
  if (rc) return rc;
  a.step = step;
  const char *names[4] = {"param", "grad", "m", "v"};
  float *host[4] = {0}, *dev[4] = {0};
  for (int i = 0; !rc && i < 4; i++) {
    rc = load_f32(x, names[i], shape, ndim, &host[i]);
    if (!rc && !(dev[i] = gpu_alloc(x->be, (n ? n : 1) * sizeof(float)))) rc = GW_ENOMEM;
    if (!rc) rc = gpu_upload(x->be, dev[i], host[i], n * sizeof(float));
  }
  if (!rc) {
    gpu_adamw_update(x->be, dev[0], dev[1], dev[2], dev[3], n, &a);
    for (int i = 0; !rc && i < 4; i++)
      if (i != 1) rc = gpu_download(x->be, host[i], dev[i], n * sizeof(float));
  }
  if (!rc) rc = compare(x, "param", "expected.param", shape, ndim, host[0]);
  if (!rc) rc = compare(x, "m", "expected.m", shape, ndim, host[2]);
  if (!rc) rc = compare(x, "v", "expected.v", shape, ndim, host[3]);
  for (int i = 0; i < 4; i++) {
    free(host[i]);
    gpu_free(x->be, dev[i]);
  }
  return rc;
}

int fixture_run(const char *path, gpu_backend *be, double tol, fixture_report_fn report, void *ud,
                int *n_failed, char *err, size_t err_len) {
  fixture_ctx x = {.be = be, .tol = tol, .report = report, .ud = ud, .err = err, .err_len = err_len};
  *n_failed = 0;
  int rc = st_load(path, FIXTURE_MAX_BYTES, &x.f, err, err_len);
  if (rc) return rc;
  const char *kind = st_meta(&x.f, "kind");
  if (kind && strcmp(kind, "blocks") == 0)
    rc = run_blocks(&x);
  else if (kind && strcmp(kind, "head") == 0)
    rc = run_head(&x);
  else if (kind && strcmp(kind, "adamw") == 0)
    rc = run_adamw(&x);
  else
    rc = fail(&x, "fixture kind '%s' is not blocks, head or adamw", kind ? kind : "(none)");
  st_free(&x.f);
  *n_failed = x.n_failed;
  return rc;
}
