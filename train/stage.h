/* train/stage.h — one pipeline stage of a model on one backend: forward,
 * backward, the optimizer step and the stage's state.
 *
 * A stage holds blocks [first_layer, first_layer + n_layers) and, on a data
 * node, the data-node part ("head": token (+ position) embedding, final
 * norm, LM head and loss). Either part may be absent, not both. It knows
 * nothing about the network: tensors come in and go out as host arrays of
 * fp32 (B, T, C) activations, and microbatches are named by the caller's
 * 64-bit IDs.
 *
 * Microbatch lifecycle (several in flight, up to `capacity`):
 *
 *   stage_forward(mb, x, y)          stores what backward needs under mb
 *   stage_backward(mb, dy, dx)       accumulates parameter gradients
 *   stage_release(mb)                frees mb's slot (on COMPLETE)
 *
 * and on a data node, around its blocks (if any):
 *
 *   stage_embed_forward(mb, tokens, x)   keeps the tokens under mb
 *   stage_loss(y, targets, &loss, dy)    loss forward + backward at once
 *   stage_embed_backward(mb, dx)         embedding gradients
 *
 * Crash recovery: a replacement peer that receives a stored input
 * activation and a stored gradient runs stage_recompute (forward, then
 * backward, for that microbatch only).
 *
 * Parameters, gradients and AdamW moments live in four flat arrays of
 * stage_n_params() floats in device memory, tensor after tensor in the
 * order of train/model.h (head first, then the blocks in order); the
 * tensor table maps names to offsets. stage_read / stage_write move ranges
 * of them to and from the host (within-stage averaging, weight transfer).
 *
 * State (checkpoints, a joining peer's download) is serialised as a
 * safetensors file: every parameter under its model name, the moments as
 * "adam.m.<name>" / "adam.v.<name>", and the step and the stage layout in
 * __metadata__. The data section is params, then m, then v, back to back,
 * so it can be streamed in chunks without building the whole file.
 *
 * Not thread-safe: one thread (the node's compute worker) drives a stage.
 * Errors: 0 or a negative GW_E* code; calls that take err/err_len explain
 * bad input in a sentence. */
#ifndef GWTF_TRAIN_STAGE_H
#define GWTF_TRAIN_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/backend.h"
#include "train/adamw.h"
#include "train/model.h"

#define STAGE_MAX_BATCH (4096)
#define STAGE_MAX_CAPACITY (4096)
#define STAGE_HASH_BYTES (32)

typedef struct stage_spec {
  model_config model;
  int first_layer; /* first block held */
  int n_layers;    /* blocks held (0 for a data node without blocks) */
  bool has_head;   /* the data-node part */
  int batch;       /* B: sequences per microbatch */
  int seq_len;     /* T: tokens per sequence, <= model.max_seq_len */
  int capacity;    /* microbatches in flight at most */
} stage_spec;

typedef struct stage stage;

/* Checks the spec against its model. Returns 0 or GW_EINVAL + sentence. */
int stage_spec_validate(const stage_spec *spec, char *err, size_t err_len);

/* Creates a stage on be (which must outlive it) with GPT-2 style weights
 * from seed (model_init_tensor), zero gradients and moments, step 0. */
int stage_create(const stage_spec *spec, gpu_backend *be, uint64_t seed, stage **out, char *err,
                 size_t err_len);
void stage_destroy(stage *st);

const stage_spec *stage_get_spec(const stage *st);
gpu_backend *stage_get_backend(const stage *st);

/* ---- memory and capacity ------------------------------------------------------ */

typedef struct stage_memory {
  size_t state_bytes;     /* parameters, gradients, AdamW m and v */
  size_t workspace_bytes; /* shared scratch for backward and the loss */
  size_t per_mb_bytes;    /* what one microbatch in flight keeps */
} stage_memory;

/* Device memory the stage would use (be: the backend it will run on; its
 * attention may save more or less than the CPU's). */
int stage_memory_estimate(const stage_spec *spec, gpu_backend *be, stage_memory *out);
/* Microbatches that fit in avail_bytes next to the fixed part; 0 when not
 * even the fixed part fits. */
int stage_capacity_for(const stage_spec *spec, gpu_backend *be, size_t avail_bytes);

/* ---- microbatches ----------------------------------------------------------------
 * All activations are host arrays (B, T, C) fp32; tokens/targets (B, T)
 * int32 in [0, vocab_size) (GW_EINVAL otherwise: they come from files and
 * peers). GW_EFULL when capacity microbatches are already in flight,
 * GW_EEXIST when mb already ran that part, GW_ENOENT for an unknown mb. */

/* y = blocks(x). y may be NULL (recompute). */
int stage_forward(stage *st, uint64_t mb, const float *x, float *y);
/* dx = d loss / dx given dy; parameter gradients accumulate. dx may be
 * NULL (the first stage has no one to send it to). */
int stage_backward(stage *st, uint64_t mb, const float *dy, float *dx);
/* forward + backward for one microbatch from a stored input and gradient. */
int stage_recompute(stage *st, uint64_t mb, const float *x, const float *dy, float *dx);
/* The output forward produced for mb (to re-send after a downstream crash). */
int stage_saved_output(stage *st, uint64_t mb, float *y);
/* Frees mb's slot. GW_ENOENT when mb is not in flight. */
int stage_release(stage *st, uint64_t mb);
/* Microbatches in flight. */
int stage_in_flight(const stage *st);

/* Data-node part. x (B,T,C) = embedding of tokens. */
int stage_embed_forward(stage *st, uint64_t mb, const int32_t *tokens, float *x);
/* Accumulates embedding gradients from dx (B,T,C) for mb's tokens. */
int stage_embed_backward(stage *st, uint64_t mb, const float *dx);
/* Final norm, LM head and mean cross-entropy over B*T positions for the
 * activation y coming back from the last block; writes the loss and
 * dy = d loss / dy, and accumulates the head's gradients. Nothing is kept. */
int stage_loss(stage *st, const float *y, const int32_t *targets, float *loss, float *dy);
/* The same loss, bit for bit, without any gradient: nothing accumulates and
 * nothing is kept (validation). */
int stage_loss_eval(stage *st, const float *y, const int32_t *targets, float *loss);

/* ---- parameters and optimizer ----------------------------------------------------- */

typedef enum stage_buf { STAGE_PARAMS = 0, STAGE_GRADS = 1, STAGE_ADAM_M = 2, STAGE_ADAM_V = 3 } stage_buf;

size_t stage_n_params(const stage *st);
int stage_n_tensors(const stage *st);
/* Tensor i (offsets into the flat arrays); NULL when out of range. */
const model_tensor *stage_tensor(const stage *st, int i);
const model_tensor *stage_find_tensor(const stage *st, const char *name);

/* n floats at offset of one flat array, to / from the host. GW_ERANGE when
 * the range is outside [0, stage_n_params()). */
int stage_read(stage *st, stage_buf which, size_t offset, size_t n, float *dst);
int stage_write(stage *st, stage_buf which, size_t offset, size_t n, const float *src);

int stage_zero_grads(stage *st);
/* One AdamW step on every tensor with gradients scaled by grad_scale (e.g.
 * 1 / microbatches summed into them), and further down to cfg->grad_clip
 * in L2 norm (the stage's whole gradient times grad_scale) when that is set
 * and exceeded; increments the step count first, so the first call uses
 * step 1. lr usually comes from adamw_lr_at. */
int stage_step(stage *st, const adamw_config *cfg, float lr, float grad_scale);
long long stage_step_count(const stage *st);
void stage_set_step_count(stage *st, long long step);

/* BLAKE2b-256 of the parameters' fp32 bytes in storage order: equal
 * hashes mean bit-identical weights. */
int stage_weight_hash(stage *st, uint8_t out[STAGE_HASH_BYTES]);

/* ---- state ---------------------------------------------------------------------- */

/* Bytes of the serialised state (header + params + m + v). */
int stage_state_size(stage *st, size_t *len);
/* Copies bytes [offset, offset + len) of the serialised state into buf;
 * chunks of one transfer must not straddle a stage_step. */
int stage_state_read(stage *st, size_t offset, void *buf, size_t len);
/* Replaces parameters, moments and step from a serialised state after
 * checking that it was made for the same model and the same layers; on any
 * error the stage is unchanged. Gradients are zeroed. */
int stage_state_load(stage *st, const uint8_t *buf, size_t len, char *err, size_t err_len);

#endif
