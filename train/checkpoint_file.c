/* train/checkpoint_file.c — checkpoint files without a stage: the step a
 * checkpoint holds, where a run's checkpoint lives, a serialized state (a
 * replica's) written with its sidecar, and the sidecar read back. Kept
 * apart from checkpoint.c so that code which never computes (the replica
 * store, the fuzz targets) links without the compute stage. */
#include "train/checkpoint.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/safetensors.h"
#include "util/err.h"
#include "util/file.h"

int ckpt_step(const char *path, long long *step, char *err, size_t err_len) {
  st_file f;
  int rc = st_load_header(path, &f, err, err_len);
  if (rc) return rc;
  const char *s = st_meta(&f, "step");
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : -1;
  if (!s || errno || *end || v < 0) {
    if (err && err_len) snprintf(err, err_len, "%s has no valid step in its metadata", path);
    rc = GW_EINVAL;
  } else {
    *step = v;
  }
  st_free(&f);
  return rc;
}

/* ---- a run's checkpoints -------------------------------------------------------- */

#define CKPT_SIDECAR_MAX ((size_t)4096)

int ckpt_run_path(char *out, size_t len, const char *data_dir, const char *run, int stage) {
  int n = snprintf(out, len, "%s/checkpoints/%s.stage%d.safetensors", data_dir ? data_dir : ".", run, stage);
  return n > 0 && (size_t)n < len ? 0 : GW_ERANGE;
}

int ckpt_save_blob(const char *path, const void *blob, size_t len, const char *run, int stage,
                   long long iteration, const uint8_t *hash) {
  char side[4096];
  if (snprintf(side, sizeof(side), "%s%s", path, CKPT_SIDECAR_SUFFIX) >= (int)sizeof(side)) return GW_ERANGE;
  json_t *o = json_pack("{s:s, s:i, s:I}", "run", run, "stage", stage, "iteration", (json_int_t)iteration);
  if (!o) return GW_ENOMEM;
  if (hash) {
    char hex[2 * STAGE_HASH_BYTES + 1];
    sodium_bin2hex(hex, sizeof(hex), hash, STAGE_HASH_BYTES);
    json_object_set_new(o, "weight_hash", json_string(hex));
  }
  char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  if (!text) return GW_ENOMEM;
  /* The weights first: a crash between the two leaves a sidecar that does
   * not match them, which a reader rejects, never a silent mismatch. */
  int rc = gw_file_write_atomic1(path, blob, len, 0644);
  if (!rc) {
    size_t n = strlen(text);
    text[n] = '\n'; /* replaces the NUL: written with its length */
    rc = gw_file_write_atomic1(side, text, n + 1, 0644);
  }
  free(text);
  return rc;
}

int ckpt_read_sidecar(const char *path, ckpt_sidecar *out, char *err, size_t err_len) {
  char side[4096];
  if (snprintf(side, sizeof(side), "%s%s", path, CKPT_SIDECAR_SUFFIX) >= (int)sizeof(side)) return GW_ERANGE;
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = gw_file_read_all(side, CKPT_SIDECAR_MAX, &buf, &len);
  if (rc) return gw_fail(err, err_len, rc, "cannot read %s: %s", side, gw_strerror(rc));
  json_t *o = json_loadb((const char *)buf, len, 0, NULL);
  free(buf);
  memset(out, 0, sizeof(*out));
  json_t *run = json_object_get(o, "run"), *stage = json_object_get(o, "stage"), *it = json_object_get(o, "iteration");
  json_t *hash = json_object_get(o, "weight_hash");
  rc = GW_EINVAL;
  if (!json_is_string(run) || !json_is_integer(stage) || !json_is_integer(it) || json_integer_value(stage) < 0 ||
      json_integer_value(stage) > 1024 || json_integer_value(it) < 0 ||
      strlen(json_string_value(run)) >= sizeof(out->run)) {
    gw_fail(err, err_len, rc, "%s is not a checkpoint sidecar (run, stage, iteration)", side);
  } else if (hash && (!json_is_string(hash) || strlen(json_string_value(hash)) != 2 * STAGE_HASH_BYTES ||
                      sodium_hex2bin(out->weight_hash, STAGE_HASH_BYTES, json_string_value(hash),
                                     2 * STAGE_HASH_BYTES, NULL, NULL, NULL) != 0)) {
    gw_fail(err, err_len, rc, "%s: weight_hash is not 64 hex digits", side);
  } else {
    snprintf(out->run, sizeof(out->run), "%s", json_string_value(run));
    out->stage = (int)json_integer_value(stage);
    out->iteration = json_integer_value(it);
    out->have_hash = hash != NULL;
    rc = 0;
  }
  json_decref(o);
  return rc;
}
