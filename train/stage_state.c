/* train/stage_state.c — a stage's state as a safetensors file: streamed out
 * in chunks without building the file, loaded back with full validation. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/safetensors.h"
#include "train/stage_internal.h"
#include "util/err.h"

#define STAGE_STATE_FORMAT "gwtf-stage-1"

/* The three regions of the data section, in order, and their name prefixes. */
static const stage_buf state_regions[3] = {STAGE_PARAMS, STAGE_ADAM_M, STAGE_ADAM_V};
static const char *const state_prefix[3] = {"", "adam.m.", "adam.v."};

static void meta_int(st_writer *w, const char *key, long long v) {
  char s[32];
  snprintf(s, sizeof(s), "%lld", v);
  st_writer_meta(w, key, s);
}

/* The shortest decimal that reads back as the same float ("1e-05", not
 * "9.99999975e-06"), for people reading the metadata in Python. */
static void meta_float(st_writer *w, const char *key, float v) {
  char s[32];
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(s, sizeof(s), "%.*g", prec, (double)v);
    if (strtof(s, NULL) == v) break;
  }
  st_writer_meta(w, key, s);
}

/* The metadata every state carries: what it is, for which model and
 * layers, and the optimizer step. */
static void write_meta(const stage *st, st_writer *w) {
  const model_config *c = &st->spec.model;
  st_writer_meta(w, "format", STAGE_STATE_FORMAT);
  st_writer_meta(w, "arch", model_arch_name(c->arch));
  meta_int(w, "d_model", c->d_model);
  meta_int(w, "n_heads", c->n_heads);
  meta_int(w, "n_layers", c->n_layers);
  meta_int(w, "d_ff", c->d_ff);
  meta_int(w, "vocab_size", c->vocab_size);
  meta_int(w, "max_seq_len", c->max_seq_len);
  meta_float(w, "eps", c->eps);
  meta_float(w, "rope_theta", c->rope_theta);
  meta_int(w, "first_layer", st->spec.first_layer);
  meta_int(w, "stage_layers", st->spec.n_layers);
  meta_int(w, "has_head", st->spec.has_head);
  meta_int(w, "step", st->step);
}

/* Tensors in data order: parameters, then m, then v, each in storage
 * order, so the data section is exactly params || m || v. */
static void add_tensors(const stage *st, st_writer *w) {
  char name[MODEL_NAME_MAX + 8];
  for (int pass = 0; pass < 3; pass++) {
    for (int i = 0; i < st->n_tensors; i++) {
      const model_tensor *t = &st->tensors[i];
      int64_t shape[2] = {t->shape[0], t->shape[1]};
      snprintf(name, sizeof(name), "%s%s", state_prefix[pass], t->name);
      st_writer_add(w, name, ST_F32, shape, t->ndim, NULL);
    }
  }
}

static int ensure_header(stage *st) {
  if (st->state_header && st->state_header_step == st->step) return 0;
  free(st->state_header);
  st->state_header = NULL;
  st_writer w;
  st_writer_init(&w);
  write_meta(st, &w);
  add_tensors(st, &w);
  int rc = st_writer_header(&w, &st->state_header, &st->state_header_len);
  st_writer_free(&w);
  if (!rc) st->state_header_step = st->step;
  return rc;
}

int stage_state_size(stage *st, size_t *len) {
  int rc = ensure_header(st);
  if (!rc) *len = st->state_header_len + 3 * st->n_params * sizeof(float);
  return rc;
}

int stage_state_read(stage *st, size_t offset, void *buf, size_t len) {
  size_t total;
  int rc = stage_state_size(st, &total);
  if (rc) return rc;
  if (offset > total || len > total - offset) return GW_ERANGE;
  uint8_t *out = buf;
  size_t region = st->n_params * sizeof(float);
  while (len > 0) {
    size_t n;
    if (offset < st->state_header_len) {
      n = st->state_header_len - offset < len ? st->state_header_len - offset : len;
      memcpy(out, st->state_header + offset, n);
    } else {
      size_t pos = offset - st->state_header_len, r = pos / region, at = pos % region;
      const uint8_t *src = (const uint8_t *)stage_buf_ptr(st, state_regions[r]);
      n = region - at < len ? region - at : len;
      rc = gpu_download(st->be, out, src + at, n);
      if (rc) return rc;
    }
    out += n;
    offset += n;
    len -= n;
  }
  return 0;
}

/* ---- loading ------------------------------------------------------------------------ */

static int parse_ll(const char *s, long long *out) {
  if (!s || !*s) return GW_EINVAL;
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (errno || *end) return GW_EINVAL;
  *out = v;
  return 0;
}

/* Metadata must describe this stage's model and layers exactly. */
static int check_meta(const stage *st, const st_file *f, char *err, size_t len) {
  const model_config *c = &st->spec.model;
  const char *fmt = st_meta(f, "format"), *arch = st_meta(f, "arch");
  if (!fmt || strcmp(fmt, STAGE_STATE_FORMAT) != 0) {
    stage_set_err(err, len, "not a gwtf stage state (format '%s', expected '%s')", fmt ? fmt : "",
                  STAGE_STATE_FORMAT);
    return GW_EINVAL;
  }
  if (!arch || strcmp(arch, model_arch_name(c->arch)) != 0) {
    stage_set_err(err, len, "state is for arch '%s', this stage is %s", arch ? arch : "",
                  model_arch_name(c->arch));
    return GW_EINVAL;
  }
  const struct {
    const char *key;
    long long want;
  } ints[] = {
      {"d_model", c->d_model},         {"n_heads", c->n_heads},
      {"n_layers", c->n_layers},       {"d_ff", c->d_ff},
      {"vocab_size", c->vocab_size},   {"max_seq_len", c->max_seq_len},
      {"first_layer", st->spec.first_layer}, {"stage_layers", st->spec.n_layers},
      {"has_head", st->spec.has_head},
  };
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
    long long v;
    if (parse_ll(st_meta(f, ints[i].key), &v) || v != ints[i].want) {
      stage_set_err(err, len, "state has %s = %s, this stage has %lld", ints[i].key,
                    st_meta(f, ints[i].key) ? st_meta(f, ints[i].key) : "(none)", ints[i].want);
      return GW_EINVAL;
    }
  }
  const char *eps = st_meta(f, "eps"), *theta = st_meta(f, "rope_theta");
  if (!eps || !theta || strtof(eps, NULL) != c->eps || strtof(theta, NULL) != c->rope_theta) {
    stage_set_err(err, len, "state has eps %s / rope_theta %s, this stage has %g / %g",
                  eps ? eps : "(none)", theta ? theta : "(none)", (double)c->eps,
                  (double)c->rope_theta);
    return GW_EINVAL;
  }
  return 0;
}

/* pass 0: check every tensor; pass 1: copy (cannot fail on input). */
static int load_tensors(stage *st, const st_file *f, bool copy, char *err, size_t len) {
  char name[MODEL_NAME_MAX + 8];
  float *host = NULL;
  if (copy) {
    size_t max = 0;
    for (int i = 0; i < st->n_tensors; i++) max = st->tensors[i].numel > max ? st->tensors[i].numel : max;
    host = malloc((max ? max : 1) * sizeof(float));
    if (!host) return GW_ENOMEM;
  }
  int rc = 0;
  for (int pass = 0; !rc && pass < 3; pass++) {
    float *dev = stage_buf_ptr(st, state_regions[pass]);
    for (int i = 0; !rc && i < st->n_tensors; i++) {
      const model_tensor *t = &st->tensors[i];
      int64_t shape[2] = {t->shape[0], t->shape[1]};
      snprintf(name, sizeof(name), "%s%s", state_prefix[pass], t->name);
      if (!copy) {
        rc = st_check(f, name, ST_F32, shape, t->ndim, err, len);
      } else {
        rc = st_copy(f, name, ST_F32, shape, t->ndim, host, err, len);
        if (!rc) rc = gpu_upload(st->be, dev + t->offset, host, t->numel * sizeof(float));
      }
    }
  }
  free(host);
  return rc;
}

int stage_state_load(stage *st, const uint8_t *buf, size_t len, char *err, size_t err_len) {
  st_file f;
  int rc = st_parse(buf, len, &f, err, err_len);
  if (rc) return rc;
  long long step = 0;
  rc = check_meta(st, &f, err, err_len);
  if (!rc && (parse_ll(st_meta(&f, "step"), &step) || step < 0)) {
    stage_set_err(err, err_len, "state has no valid step");
    rc = GW_EINVAL;
  }
  if (!rc) rc = load_tensors(st, &f, false, err, err_len);
  if (!rc) rc = load_tensors(st, &f, true, err, err_len);
  st_free(&f);
  if (rc) return rc;
  st->step = step;
  return stage_zero_grads(st);
}
