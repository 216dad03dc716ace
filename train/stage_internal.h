/* train/stage_internal.h — the stage struct, shared by train/stage.c and
 * train/stage_state.c only. */
#ifndef GWTF_TRAIN_STAGE_INTERNAL_H
#define GWTF_TRAIN_STAGE_INTERNAL_H

#include "train/stage.h"

/* Which parts of a stage have run forward for a microbatch. */
typedef enum stage_part { STAGE_PART_EMBED = 1, STAGE_PART_BLOCKS = 2 } stage_part;

/* One microbatch in flight. Device memory is allocated on first use and
 * kept across releases, so steady state allocates nothing. */
typedef struct stage_slot {
  bool used;
  uint64_t id;
  unsigned parts;   /* stage_part bits */
  float *acts;      /* blocks: residual stream (L+1 tensors) + saved activations */
  int32_t *tokens;  /* embed: (B, T) tokens for the embedding backward */
} stage_slot;

struct stage {
  stage_spec spec;
  gpu_backend *be;
  model_tensor *tensors; /* head tensors, then each block's */
  int n_tensors;
  size_t n_params, head_numel, block_numel;
  float *params, *grads, *m, *v; /* device, n_params each */
  long long step;
  float *ws;          /* shared workspace (see workspace_layout) */
  int32_t *targets;   /* device copy of the loss targets */
  float *rope;        /* llama: (T_max, hd/2, 2) cos/sin */
  size_t att_floats;  /* attention state per layer and microbatch */
  stage_slot *slots;  /* capacity entries */
  /* Cached safetensors header of the serialised state, for step state_step. */
  uint8_t *state_header;
  size_t state_header_len;
  long long state_header_step;
};

void stage_set_err(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
float *stage_buf_ptr(stage *st, stage_buf which);

#endif
