/* test/fuzz/fuzz_files_lib.c — the safetensors reader and the run record
 * parser under hostile bytes; see fuzz_targets.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_targets.h"
#include "train/run.h"
#include "train/safetensors.h"
#include "util/id.h"

#define FUZZ_ST_COPY_MAX ((size_t)1 << 20) /* larger tensors are checked, not copied */

int fuzz_safetensors(const uint8_t *data, size_t size) {
  st_file f;
  char err[ST_ERR_MAX];
  if (st_parse(data, size, &f, err, sizeof(err)) != 0) return 0;
  /* What a checkpoint or fixture loader does with a file that parsed: look
   * each tensor up by name, check it against its own description (and a
   * wrong one), copy it out. */
  for (size_t i = 0; i < f.n_tensors; i++) {
    const st_tensor *t = &f.tensors[i];
    if (st_find(&f, t->name) == NULL) abort(); /* a tensor the reader listed must be found */
    size_t bytes = t->end - t->begin;
    int64_t wrong[ST_MAX_DIMS] = {1};
    (void)st_check(&f, t->name, t->dtype == ST_F32 ? ST_I32 : ST_F32, wrong, 1, err, sizeof(err));
    if (bytes > FUZZ_ST_COPY_MAX) {
      (void)st_check(&f, t->name, t->dtype, t->shape, t->ndim, err, sizeof(err));
      continue;
    }
    void *dst = malloc(bytes ? bytes : 1);
    if (!dst) continue;
    if (st_copy(&f, t->name, t->dtype, t->shape, t->ndim, dst, err, sizeof(err)) != 0) abort();
    free(dst);
  }
  (void)st_meta(&f, "format");
  (void)st_find(&f, "");
  st_free(&f);
  return 0;
}

/* A record that decoded must encode, and decode again to the same record. */
int fuzz_run_record(const uint8_t *data, size_t size) {
  train_run r, again;
  char err[256];
  if (train_run_decode(data, size, &r, err, sizeof(err)) != 0) return 0;
  /* What a joining peer builds from it: every stage's layers and spec. */
  for (int s = 0; s <= r.stages; s++) {
    stage_spec spec;
    train_run_stage_spec(&r, s, 2, &spec);
  }
  char *text = train_run_encode(&r);
  if (!text) {
    fprintf(stderr, "fuzz_run_record: a decoded record (name '%s', dataset '%s') does not encode\n", r.name,
            r.dataset);
    abort();
  }
  if (train_run_decode((const uint8_t *)text, strlen(text), &again, err, sizeof(err)) != 0) {
    fprintf(stderr, "fuzz_run_record: re-encoded record does not decode: %s\n%s\n", err, text);
    abort();
  }
  char *text2 = train_run_encode(&again);
  if (!text2 || strcmp(text, text2) != 0) {
    fprintf(stderr, "fuzz_run_record: round trip changed the record:\n%s\n%s\n", text, text2 ? text2 : "(null)");
    abort();
  }
  free(text2);
  free(text);
  return 0;
}

void fuzz_corpus_write(const char *root, const char *sub, const uint8_t *buf, size_t len) {
  gw_id h;
  char hex[GW_ID_HEX_LEN + 1], path[4096];
  gw_id_hash(buf, len, &h);
  gw_id_to_hex(&h, hex);
  hex[16] = '\0';
  snprintf(path, sizeof(path), "%s/%s/%s", root, sub, hex);
  FILE *fp = fopen(path, "wb");
  if (!fp || fwrite(buf, 1, len, fp) != len) {
    perror(path);
    exit(1);
  }
  fclose(fp);
}
