/* train/generate.h — text generation from a whole model with a KV cache
 * (module prefix gen_).
 *
 * The model is one flat fp32 array in gwtf's storage order (train/hf_export.h:
 * the data-node part, then blocks 0..L-1), uploaded once to a gpu/ backend.
 * Generation is incremental: gen_step runs ONE new position through every
 * block, with the matmuls, norms and activations of gpu/ on a (1, C) row,
 * and attends to the keys and values of all earlier positions kept in a
 * host-side cache (the new q, k, v row is the only thing downloaded per
 * layer, so the same code serves the CPU and the CUDA backend). gen_prefill
 * puts a prompt through the whole-sequence training kernels at once and
 * fills the cache from them. gen_forward runs a whole sequence at once
 * without the cache: the reference the cached path is tested against.
 *
 * Not thread-safe; one thread drives a gen_model. Errors: 0 or GW_E*. */
#ifndef GWTF_TRAIN_GENERATE_H
#define GWTF_TRAIN_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/backend.h"
#include "train/model.h"
#include "util/rng.h"

typedef struct gen_model gen_model;

/* Uploads params (hf_model_numel(cfg) floats, host) to be, which must
 * outlive the model. The cache holds max_len positions (<= max_seq_len). */
int gen_create(const model_config *cfg, const float *params, gpu_backend *be, int max_len, gen_model **out,
               char *err, size_t err_len);
void gen_destroy(gen_model *g);

/* Positions in the cache (the next gen_step's position). */
int gen_position(const gen_model *g);
/* Empties the cache (a new sequence). */
void gen_reset(gen_model *g);

/* Appends token at position gen_position() and writes the logits for the
 * next token (vocab_size floats, host). GW_ERANGE when the cache is full,
 * GW_EINVAL for a token outside the vocabulary. */
int gen_step(gen_model *g, int32_t token, float *logits);

/* The logits of every position of tokens[0..T) (T * vocab_size floats),
 * without the cache (which it leaves alone). T <= max_seq_len. */
int gen_forward(gen_model *g, const int32_t *tokens, int T, float *logits);

/* A prompt at once: empties the cache, runs tokens[0..T) through the
 * whole-sequence kernels, keeps every position's keys and values in the
 * cache, and writes the logits of the LAST position (vocab_size floats).
 * Afterwards gen_step continues at position T. GW_ERANGE when T exceeds
 * the cache. */
int gen_prefill(gen_model *g, const int32_t *tokens, int T, float *logits);

/* How the next token is drawn from the logits. */
typedef struct gen_sampling {
  float temperature; /* <= 0: greedy (argmax) */
  int top_k;         /* keep the k most likely tokens; <= 0: all */
} gen_sampling;

/* Draws a token: softmax(logits / temperature) over the top_k largest
 * logits (ties broken by the lower id), one uniform draw from rng. The same
 * logits and rng state give the same token on every machine. scratch holds
 * 2 * V ints-or-floats (gen_pick_scratch_bytes). */
size_t gen_pick_scratch_bytes(int V);
int32_t gen_pick(const float *logits, int V, const gen_sampling *s, gw_rng *rng, void *scratch);

#endif
