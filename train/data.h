/* train/data.h — what a data node trains on.
 *
 * A dataset is either a UTF-8 text file, read as byte-level tokens (vocab
 * 256), or an llm.c token file (a 256 x int32 header with magic 20240520,
 * version 1 and the token count, then uint16 tokens). Files are memory-mapped,
 * never loaded whole, and validated on open: a bad file gets a clear error.
 *
 * Microbatches are sampled deterministically from (seed, iteration, index),
 * so a single-process reference and a swarm of peers train on exactly the same
 * tokens, and a deferred microbatch is the same one when it is retried. */
#ifndef GWTF_TRAIN_DATA_H
#define GWTF_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define TRAIN_LLMC_MAGIC 20240520
#define TRAIN_LLMC_HEADER_INTS 256

typedef enum train_dataset_kind { TRAIN_DATA_TEXT = 1, TRAIN_DATA_TOKENS_U16 = 2 } train_dataset_kind;

typedef struct train_dataset {
  train_dataset_kind kind;
  void *map;       /* the whole file, read-only */
  size_t map_len;
  const uint8_t *bytes;  /* TEXT: the tokens */
  const uint16_t *toks;  /* TOKENS_U16: the tokens (after the header) */
  size_t n_tokens;
  uint32_t vocab_needed; /* 1 + the largest token id present */
} train_dataset;

/* Opens and validates a dataset. err (may be NULL) gets a one-line reason on
 * failure. Returns 0, GW_EINVAL (not a usable dataset), GW_ERANGE (too small)
 * or a negative errno code. */
int train_dataset_open(const char *path, train_dataset *ds, char *err, size_t err_len);
void train_dataset_close(train_dataset *ds);
/* "text, 1.2 MB, 1234567 tokens" for the log. */
void train_dataset_describe(const train_dataset *ds, char *out, size_t out_len);

/* Fills inputs and targets, each [B*T] int32 (row-major B, T), with microbatch
 * `index` of `iteration`: B windows of T+1 consecutive tokens at positions
 * drawn from a generator seeded by (seed, iteration, index); targets are the
 * inputs shifted by one. Returns 0 or GW_ERANGE when the dataset has fewer
 * than T+1 tokens. */
int train_dataset_sample(const train_dataset *ds, uint64_t seed, uint64_t iteration, uint32_t index, int B,
                         int T, int32_t *inputs, int32_t *targets);

/* A data node's sampling seed when none is given: the first 8 bytes of its
 * node ID (uniformly random), so that two data nodes of a run draw
 * different microbatches. Never 0 (0 means "not given"). */
uint64_t train_dataset_seed_for(const uint8_t id[32]);

/* ---- validation (held-out) data ----
 *
 * train_dataset_hold_out cuts the last `fraction` of ds's tokens off: ds then
 * samples training microbatches from the first part only (no training window
 * reaches into the held-out tokens), and *val views the tail. val borrows
 * ds's mapping: close only ds. fraction must be in [0, 0.5]; 0 leaves ds whole
 * and val empty. GW_ERANGE when either part would have fewer than 2 tokens. */
int train_dataset_hold_out(train_dataset *ds, double fraction, train_dataset *val);

/* The fixed validation set: microbatch `index` is B consecutive,
 * non-overlapping windows of T+1 tokens from the start of val (window w =
 * index*B + b begins at token w*T), the same on every peer and in
 * `gwtf train-ref`. train_dataset_val_count says how many fit. */
/* The validation set of a data node (and of `gwtf train-ref`): the file at
 * val_path when given (ds keeps all its tokens), else the last `fraction`
 * of ds (train_dataset_hold_out), else none (val->n_tokens == 0). Close val
 * with train_dataset_close after ds's last use. */
int train_validation_open(train_dataset *ds, const char *val_path, double fraction, train_dataset *val, char *err,
                          size_t err_len);

uint32_t train_dataset_val_count(const train_dataset *val, int B, int T);
int train_dataset_val_sample(const train_dataset *val, uint32_t index, int B, int T, int32_t *inputs,
                             int32_t *targets);

/* Writes `bytes` bytes of synthetic English-like text (a small seeded grammar,
 * so there is structure to learn) to path, atomically. Used when the default
 * dataset cannot be fetched. */
int train_synth_corpus(const char *path, size_t bytes, uint64_t seed);

#endif
