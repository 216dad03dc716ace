/* train/subspace.h — activations between stages confined, by the model's
 * construction, to x = x0(tokens) + U z: k numbers a row cross a link
 * instead of C, with no error from the crossing itself (Pluralis' Protocol
 * Models, arXiv 2506.01260; measured in PyTorch by
 * scripts/bench_subspace.py, docs/TRAINING.md "A subspace fixed by the
 * architecture").
 *
 * The pieces:
 *  - U (C x k, orthonormal columns) is derived from the run's seed, so
 *    every peer holds the same one without sending it.
 *  - Every block's residual writes (gpt: attn.proj and mlp.proj, weight
 *    and bias; llama: attn.o and mlp.down) are projected onto U after each
 *    step (subspace_project_block): a block adds only inside U.
 *  - The embedding's part outside U, the table (tok and pos rows times
 *    (I - U U^T)), is the same at every stage; x0 of a row is its token's
 *    and its position's table rows, so a receiver rebuilds x = x0 + U z
 *    from the token ids and z.
 *  - Backward, a stage's parameters move its output only inside U, so U^T g
 *    is all that crosses back. The gradient's part outside U, which only
 *    the table can use, is summed by token and position where it is known
 *    (each receiver of a crossing, and the data node's own embedding
 *    gradient: subspace_grad_split, subspace_head_pre_step).
 *  - Every `refresh` iterations those sums are stepped into the table
 *    (AdamW at `refresh` times the run's rate, the measured `delayed10x`)
 *    and the new table is published to every stage: it changes rarely,
 *    so it can be known everywhere (subspace_table_step).
 *
 * The data node's tok_emb / pos_emb stay full C wide; after each of its
 * steps their part outside U is reset to the table (subspace_head_post_step),
 * so the embedding the data node computes is x0 + (its part in U), exactly
 * what the receiver rebuilds. Host arrays, fp32, row-major. */
#ifndef GWTF_TRAIN_SUBSPACE_H
#define GWTF_TRAIN_SUBSPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/adamw.h"
#include "train/model.h"
#include "train/stage.h"

#define SUBSPACE_REFRESH_DEFAULT (10)

typedef struct subspace {
  int C, k;          /* model width, subspace rank */
  int V, P;          /* table rows: tokens, positions (0 for llama: RoPE, no pos_emb) */
  int refresh;       /* iterations between table steps; 0: never (a fixed table) */
  float *U;          /* (C, k): column j is basis vector j */
  float *table;      /* (V + P, C): tok rows, then pos rows; every row orthogonal to U */
  float *gsum;       /* (V + P, C): this process's gradient outside U since the last table step (refresh > 0) */
  long long version; /* table steps published */
  /* the table's trainable copy and its AdamW moments (refresh > 0) */
  float *w, *m, *v;
  long long step;
  size_t max_rows;     /* activation rows one call may hand over (B*T) */
  float *scratch;      /* scratch_rows x C */
  size_t scratch_rows; /* max_rows, at least 256 (the table is projected by blocks of these) */
} subspace;

/* Parses "K" or "K:R" (R: refresh iterations, default
 * SUBSPACE_REFRESH_DEFAULT; 0: the table never steps); 0 or GW_EINVAL. */
int subspace_parse(const char *s, int *k, int *refresh);

/* U and the table from the run's seed (the table: the initial embedding's
 * part outside U, as stage_create initialises it, so a relay computes it
 * without the data node). rows: the most activation rows one call handles
 * (B*T). GW_EINVAL with a sentence when k is not in [1, C). The data
 * node's stage is then held to it by subspace_head_post_step. */
int subspace_init(subspace *s, const model_config *cfg, int k, int refresh, uint64_t seed, size_t rows, char *err,
                  size_t err_len);
void subspace_free(subspace *s);

/* The deterministic orthonormal basis alone (Gram-Schmidt in double over
 * normal draws from the seed): U (C, k). */
void subspace_basis(int C, int k, uint64_t seed, float *U);

/* Forward crossing: z (rows, k) = U^T (x - x0). tokens: rows ids; row r's
 * position is r % T. */
int subspace_encode(subspace *s, const float *x, const int32_t *tokens, size_t rows, int T, float *z);
/* The receiver: x (rows, C) = x0 + U z. */
int subspace_decode(subspace *s, const float *z, const int32_t *tokens, size_t rows, int T, float *x);
/* Backward crossing at the receiver of an activation: gz (rows, k) = U^T g
 * is what goes back; g's part outside U is added to gsum by token and
 * position. */
int subspace_grad_split(subspace *s, const float *g, const int32_t *tokens, size_t rows, int T, float *gz);
/* The sender of that activation: g (rows, C) = U gz. */
void subspace_grad_lift(const subspace *s, const float *gz, size_t rows, float *g);

/* Projects a block stage's residual writes onto U (after each step, and
 * once at creation). */
int subspace_project_block(const subspace *s, stage *st);
/* Before a block stage's step: the gradients of its residual writes
 * projected onto U too, so that AdamW's moments hold only what the step
 * keeps (the projection after it removes the rest anyway). */
int subspace_block_pre_step(const subspace *s, stage *st);
/* The data node before its step: its embedding gradient's part outside U
 * moves to gsum (the table takes it, not the stage's own step). */
int subspace_head_pre_step(subspace *s, stage *head);
/* The data node after its step (and after a table step): its embedding's
 * part outside U is the table again. */
int subspace_head_post_step(subspace *s, stage *head);
/* Around any stage's step, whatever it holds (the head, blocks, or both):
 * before it the pre-steps above, after it the projection and the head's
 * reset to the table. Every member of a stage does the same, so members
 * stay bit-identical; after stage_create too (the seeded weights). */
int subspace_before_step(subspace *s, stage *st);
int subspace_after_step(subspace *s, stage *st);
/* One AdamW step of the table with gsum (scaled by grad_scale), at lr,
 * then publishes it (table = w (I - U U^T)) and clears gsum. */
void subspace_table_step(subspace *s, const adamw_config *opt, float lr, float grad_scale);

/* True after iteration `it` (0-based) when the table steps. */
bool subspace_table_due(const subspace *s, long long it);

#endif
