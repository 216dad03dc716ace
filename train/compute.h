/* train/compute.h — runs the training peer's compute jobs (train/peer.h) on
 * a stage of the model (train/stage.h). Called on the compute worker thread
 * only; the stage is created lazily by the first job, so that allocating and
 * initialising a large stage never blocks the event loop. */
#ifndef GWTF_TRAIN_COMPUTE_H
#define GWTF_TRAIN_COMPUTE_H

#include <stdint.h>

#include "gpu/backend.h"
#include "train/adamw.h"
#include "train/peer.h"
#include "train/stage.h"
#include "train/subspace.h"

typedef struct train_compute {
  stage_spec spec;
  gpu_device device;
  int threads;
  uint64_t init_seed; /* the run's seed: every member of a stage starts identical */
  adamw_config opt;
  /* created by the first job */
  gpu_backend *be;
  stage *st;
  float *cap_save, *cap_scratch; /* --deterministic: grad_capture's scratch (n_params each), lazily */
  /* subspace crossings (the run record's subspace, train/subspace.h): the
   * step holds the residual writes in U and the embedding's part outside U
   * at the table; sub_k 0: off */
  int sub_k, sub_refresh;
  subspace sub;
  char err[256];
} train_compute;

/* Sets up (does not allocate the stage). */
void train_compute_init(train_compute *c, const stage_spec *spec, const gpu_device *dev, int threads,
                        uint64_t init_seed, const adamw_config *opt);
/* Subspace crossings for this run (before the first job; k 0: off). */
void train_compute_set_subspace(train_compute *c, int k, int refresh);
/* Runs one job; matches node/worker.h's run signature. */
void train_compute_run(void *ctx, train_job *job);
/* Frees the stage and the backend (worker thread stopped first). */
void train_compute_free(train_compute *c);
/* Parameters of the stage described by spec, without creating it. */
size_t train_compute_n_params(const stage_spec *spec);

#endif
