/* train/run.c — see run.h. */
#include "train/run.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

void train_run_stage_layers(const train_run *r, int s, int *first, int *n) {
  int L = r->model.n_layers, S = r->stages, base = L / S, extra = L % S;
  *first = 0;
  for (int k = 1; k < s; k++) *first += base + (k <= extra);
  *n = base + (s <= extra);
}

void train_run_stage_spec(const train_run *r, int s, int capacity, stage_spec *spec) {
  memset(spec, 0, sizeof(*spec));
  spec->model = r->model;
  spec->batch = r->batch;
  spec->seq_len = r->seq;
  spec->capacity = capacity;
  if (s == 0)
    spec->has_head = true;
  else
    train_run_stage_layers(r, s, &spec->first_layer, &spec->n_layers);
}

int train_run_validate(const train_run *r, char *err, size_t err_len) {
  if (model_config_validate(&r->model, err, err_len) != 0) return GW_EINVAL;
  if (r->stages < 1 || r->stages > TRAIN_RUN_MAX_STAGES || r->model.n_layers < r->stages) {
    snprintf(err, err_len, "%d stages need at least as many layers (the model has %d)", r->stages,
             r->model.n_layers);
    return GW_EINVAL;
  }
  if (r->batch < 1 || r->seq < 2 || r->seq > r->model.max_seq_len || r->microbatches < 1 || !(r->lr > 0)) {
    snprintf(err, err_len, "batch %d, seq %d (model max %d), microbatches %d or lr %g out of range", r->batch, r->seq,
             r->model.max_seq_len, r->microbatches, r->lr);
    return GW_EINVAL;
  }
  if (!(r->grad_clip >= 0 && r->grad_clip < 1e30)) {
    snprintf(err, err_len, "grad_clip %g out of range (>= 0; 0: off)", r->grad_clip);
    return GW_EINVAL;
  }
  if (r->subspace_k < 0 || r->subspace_k >= r->model.d_model || r->subspace_refresh < 0 ||
      r->subspace_refresh > 1000000 || (!r->subspace_k && r->subspace_refresh)) {
    snprintf(err, err_len, "subspace k %d (in [1, d_model %d); 0: off) or refresh %d out of range", r->subspace_k,
             r->model.d_model, r->subspace_refresh);
    return GW_EINVAL;
  }
  return 0;
}

char *train_run_encode(const train_run *r) {
  char *model = model_config_to_json(&r->model);
  char leader[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(&r->leader, leader);
  json_error_t jerr;
  json_t *m = model ? json_loads(model, 0, &jerr) : NULL;
  free(model);
  if (!m) return NULL;
  json_t *layers = json_array();
  for (int s = 1; s <= r->stages; s++) {
    int first, n;
    train_run_stage_layers(r, s, &first, &n);
    json_array_append_new(layers, json_pack("[ii]", first, n));
  }
  json_t *o = json_pack("{s:i,s:s,s:o,s:i,s:o,s:i,s:i,s:i,s:f,s:I,s:s,s:s}", "version", 1, "name", r->name, "model", m,
                        "stages", r->stages, "layers", layers, "batch", r->batch, "seq", r->seq, "microbatches",
                        r->microbatches, "lr", r->lr, "seed", (json_int_t)r->seed, "leader", leader, "dataset",
                        r->dataset);
  if (o) json_object_set_new(o, "access", json_string(r->private_run ? "private" : "open"));
  if (o && r->grad_clip > 0) json_object_set_new(o, "grad_clip", json_real(r->grad_clip)); /* absent: off */
  if (o && r->subspace_k > 0)
    json_object_set_new(o, "subspace", json_pack("{s:i,s:i}", "k", r->subspace_k, "refresh", r->subspace_refresh));
  if (o && r->private_run) {
    char key[65];
    for (int i = 0; i < 32; i++) snprintf(key + 2 * i, 3, "%02x", r->run_key[i]);
    json_object_set_new(o, "run_key", json_string(key));
  }
  char *text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  json_decref(o);
  return text;
}

int train_run_decode(const uint8_t *buf, size_t len, train_run *r, char *err, size_t err_len) {
  json_error_t jerr;
  json_t *o = json_loadb((const char *)buf, len, 0, &jerr);
  if (!o) {
    snprintf(err, err_len, "run record is not JSON: %s", jerr.text);
    return GW_EINVAL;
  }
  int version = 0;
  json_int_t seed = 0;
  const char *name = NULL, *leader = NULL, *dataset = "", *access = "open", *run_key = NULL;
  json_t *model = NULL, *sub = NULL;
  memset(r, 0, sizeof(*r));
  int rc = GW_EINVAL;
  if (json_unpack_ex(o, &jerr, 0, "{s:i,s:s,s:o,s:i,s:i,s:i,s:i,s:F,s:I,s:s,s?s,s?s,s?s,s?F,s?o}", "version",
                     &version, "name", &name, "model", &model, "stages", &r->stages, "batch", &r->batch, "seq",
                     &r->seq, "microbatches", &r->microbatches, "lr", &r->lr, "seed", &seed, "leader", &leader,
                     "dataset", &dataset, "access", &access, "run_key", &run_key, "grad_clip", &r->grad_clip,
                     "subspace", &sub) != 0) {
    snprintf(err, err_len, "run record: %s", jerr.text);
    goto out;
  }
  if (sub && json_unpack_ex(sub, &jerr, JSON_STRICT, "{s:i,s:i}", "k", &r->subspace_k, "refresh",
                            &r->subspace_refresh) != 0) {
    snprintf(err, err_len, "run record: subspace: %s", jerr.text);
    goto out;
  }
  if (strcmp(access, "private") == 0) {
    gw_id key;
    if (!run_key || gw_id_from_hex(run_key, &key) != 0) {
      snprintf(err, err_len, "run record: a private run without a usable run_key");
      goto out;
    }
    r->private_run = true;
    memcpy(r->run_key, key.b, 32);
  } else if (strcmp(access, "open") != 0) {
    snprintf(err, err_len, "run record: access '%.16s' is neither private nor open", access);
    goto out;
  }
  if (version != 1 || strlen(name) > TRAIN_RUN_NAME_MAX || gw_id_from_hex(leader, &r->leader) != 0) {
    snprintf(err, err_len, "run record: version %d, name or leader unusable", version);
    goto out;
  }
  char *mtext = json_dumps(model, JSON_COMPACT);
  model_preset_get("tiny", &r->model); /* every field is in the record; this only fills the struct */
  int mrc = mtext ? model_config_from_json(mtext, strlen(mtext), &r->model, err, err_len) : GW_ENOMEM;
  free(mtext);
  if (mrc != 0) goto out;
  snprintf(r->name, sizeof(r->name), "%s", name);
  snprintf(r->dataset, sizeof(r->dataset), "%s", dataset);
  r->seed = (uint64_t)seed;
  rc = train_run_validate(r, err, err_len);
out:
  json_decref(o);
  return rc;
}
