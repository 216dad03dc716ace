/* train/run_memory.c — see run_memory.h. */
#include "train/run_memory.h"

#include <string.h>

#include "util/err.h"

int train_run_stage_memory(const train_run *r, int s, int capacity, gpu_backend *be, train_stage_memory *out) {
  if (s < 0 || s > r->stages || capacity < 1) return GW_EINVAL;
  stage_spec spec;
  train_run_stage_spec(r, s, capacity, &spec);
  stage_memory m;
  int rc = stage_memory_estimate(&spec, be, &m);
  if (rc != 0) return rc;
  memset(out, 0, sizeof(*out));
  out->first_layer = spec.first_layer;
  out->n_layers = spec.n_layers;
  out->params = (size_t)spec.n_layers * model_block_numel(&r->model) + (spec.has_head ? model_head_numel(&r->model) : 0);
  out->weights_bytes = out->params * sizeof(float);
  out->optimizer_bytes = m.state_bytes - out->weights_bytes;
  out->workspace_bytes = m.workspace_bytes;
  out->per_mb_bytes = m.per_mb_bytes;
  out->capacity = capacity;
  out->total_bytes = m.state_bytes + m.workspace_bytes + (size_t)capacity * m.per_mb_bytes;
  return 0;
}

/* The largest relay stage of r: with the even split, stage 1 (it takes the
 * extra layer when the count does not divide). */
static int largest_relay_fits(train_run *r, size_t budget, int capacity, gpu_backend *be, bool *fits) {
  train_stage_memory m;
  int rc = train_run_stage_memory(r, 1, capacity, be, &m);
  if (rc == 0) *fits = m.total_bytes <= budget;
  return rc;
}

int train_run_stages_for_memory(train_run *r, size_t budget, int capacity, gpu_backend *be) {
  int max = r->model.n_layers < TRAIN_RUN_MAX_STAGES ? r->model.n_layers : TRAIN_RUN_MAX_STAGES;
  if (max < 1) return GW_EINVAL;
  for (int s = 1; s <= max; s++) {
    r->stages = s;
    bool fits = false;
    int rc = largest_relay_fits(r, budget, capacity, be, &fits);
    if (rc != 0) return rc;
    if (fits) return 0;
  }
  r->stages = max;
  return GW_ERANGE;
}
