/* train/grad_capture.c — see grad_capture.h. */
#include "train/grad_capture.h"

int grad_capture_begin(stage *st, float *save) {
  int rc = stage_read(st, STAGE_GRADS, 0, stage_n_params(st), save);
  return rc ? rc : stage_zero_grads(st);
}

int grad_capture_end(stage *st, float *save, float *scratch, float *part) {
  size_t n = stage_n_params(st);
  int rc = stage_read(st, STAGE_GRADS, 0, n, scratch);
  if (rc) return rc;
  for (size_t k = 0; k < n; k++) {
    part[k] += scratch[k];
    save[k] += scratch[k];
  }
  return stage_write(st, STAGE_GRADS, 0, n, save);
}
