/* train/checkpoint.c — a stage's state saved to and loaded from a checkpoint
 * file (the file helpers that need no stage: checkpoint_file.c). */
#include "train/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>

#include "util/err.h"
#include "util/file.h"

/* Slack over the expected size when reading, so that a file with a longer
 * header still reaches the parser (which then says what is wrong). */
#define CKPT_HEADER_SLACK ((size_t)1 << 20)

int ckpt_save(stage *st, const char *path) {
  size_t len;
  int rc = stage_state_size(st, &len);
  if (rc) return rc;
  uint8_t *buf = malloc(len);
  if (!buf) return GW_ENOMEM;
  rc = stage_state_read(st, 0, buf, len);
  if (!rc) rc = gw_file_write_atomic1(path, buf, len, 0644);
  free(buf);
  return rc;
}

int ckpt_load(stage *st, const char *path, char *err, size_t err_len) {
  size_t expect;
  int rc = stage_state_size(st, &expect);
  if (rc) return rc;
  uint8_t *buf = NULL;
  size_t len = 0;
  rc = gw_file_read_all(path, expect + CKPT_HEADER_SLACK, &buf, &len);
  if (rc) {
    if (err && err_len)
      snprintf(err, err_len, "cannot read checkpoint %s: %s", path,
               rc == GW_ERANGE ? "larger than this stage's state" : gw_strerror(rc));
    return rc;
  }
  rc = stage_state_load(st, buf, len, err, err_len);
  free(buf);
  return rc;
}
