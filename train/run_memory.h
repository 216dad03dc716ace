/* train/run_memory.h — how much memory each stage of a run needs, and the
 * stage count chosen from a per-node memory budget (issue 20).
 *
 * A stage needs its state (weights, gradients, AdamW m and v: 16 bytes a
 * parameter), a shared workspace, and per microbatch in flight what its
 * backward keeps (stage_memory_estimate). Stage 0 is the data node's
 * embedding and head: with a large vocabulary it is often the biggest, and it
 * cannot shed layers (it holds none), so a budget can only be checked
 * against it. Relay stages hold identical blocks, so for a given count of
 * stages the even split (train_run_stage_layers) already makes the largest
 * stage as small as it can be: choosing the split by memory is choosing the
 * fewest stages whose even split fits. */
#ifndef GWTF_TRAIN_RUN_MEMORY_H
#define GWTF_TRAIN_RUN_MEMORY_H

#include <stddef.h>

#include "gpu/backend.h"
#include "train/run.h"
#include "train/stage.h"

typedef struct train_stage_memory {
  int first_layer, n_layers; /* 0, 0 for stage 0 */
  size_t params;
  size_t weights_bytes;   /* the parameters alone */
  size_t optimizer_bytes; /* gradients + AdamW m and v */
  size_t workspace_bytes;
  size_t per_mb_bytes; /* activations one microbatch in flight keeps */
  int capacity;        /* microbatches in flight counted in total_bytes */
  size_t total_bytes;  /* state + workspace + capacity * per_mb */
} train_stage_memory;

/* Memory of stage s (0..stages) of r holding capacity microbatches in flight
 * on be (whose attention decides what is saved). Returns 0 or GW_EINVAL. */
int train_run_stage_memory(const train_run *r, int s, int capacity, gpu_backend *be, train_stage_memory *out);

/* The fewest relay stages (1..min(n_layers, TRAIN_RUN_MAX_STAGES)) whose
 * even split fits every relay stage, at capacity microbatches, in
 * budget_bytes; written to r->stages. Returns 0, or GW_ERANGE when not even
 * one block per stage fits (r->stages then holds n_layers' count anyway, for
 * the caller's message), GW_EINVAL for a bad run. */
int train_run_stages_for_memory(train_run *r, size_t budget_bytes, int capacity, gpu_backend *be);

#endif
