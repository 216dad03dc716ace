/* train/run.h — a training run's shared description: what the run record in
 * the DHT says (model, stages, microbatch shape, optimizer, seed, leader),
 * how the model's blocks are split over the stages, and the stage spec each
 * peer builds from it. The node and the single-process reference
 * (`gwtf train-ref`) both use this, so they train exactly the same model. */
#ifndef GWTF_TRAIN_RUN_H
#define GWTF_TRAIN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "train/model.h"
#include "train/stage.h"
#include "util/id.h"

#define TRAIN_RUN_NAME_MAX 64
#define TRAIN_RUN_MAX_STAGES 64
/* The gradient clip a new run gets unless told otherwise (--grad-clip 0:
 * off). llm.c, nanoGPT and GPT-2 clip the whole model's gradient to norm
 * 1; here each stage clips its own (docs/TRAINING.md, "Gradient clipping"),
 * which at the default lr keeps the tiny model's loss from spiking. */
#define TRAIN_RUN_GRAD_CLIP_DEFAULT 1.0

typedef struct train_run {
  char name[TRAIN_RUN_NAME_MAX + 1];
  model_config model;
  int stages, batch, seq, microbatches;
  double lr;
  double grad_clip; /* > 0: each stage's step clips its gradient to this L2 norm (adamw_config) */
  uint64_t seed; /* weight init */
  gw_id leader;
  char dataset[256];
  /* A private run (the default for --create-run): only holders of a
   * membership certificate signed by run_key take part (train/member.h).
   * The record says "access":"private" and carries the key; an open run
   * ("access":"open", or a record without the field) admits anyone. */
  bool private_run;
  uint8_t run_key[32];
  /* Subspace crossings (train/subspace.h): every activation between stages
   * crosses as subspace_k numbers a row and the token ids; 0: off. The
   * table steps every subspace_refresh iterations (0: never). The record
   * says "subspace":{"k":K,"refresh":R}, absent when off. */
  int subspace_k, subspace_refresh;
} train_run;

/* Blocks of relay stage s (1..stages): an even split, the first stages taking
 * one more when the layer count does not divide. */
void train_run_stage_layers(const train_run *r, int s, int *first, int *n);
/* The stage spec of stage s (0: the data node's embedding and head).
 * capacity: microbatches in flight it must hold. */
void train_run_stage_spec(const train_run *r, int s, int capacity, stage_spec *spec);
/* Checks sizes against the model (layers >= stages, seq <= max_seq_len...).
 * Returns 0 or GW_EINVAL with a sentence in err. */
int train_run_validate(const train_run *r, char *err, size_t err_len);

/* The run record's JSON (docs/TRAINING.md), malloc'd; NULL when out of memory. */
char *train_run_encode(const train_run *r);
/* Parses and validates a run record. Returns 0 or GW_EINVAL with err. */
int train_run_decode(const uint8_t *buf, size_t len, train_run *r, char *err, size_t err_len);

#endif
