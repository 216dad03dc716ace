/* train/grad_capture.h — one microbatch's own gradient, for `--deterministic`
 * (docs/TRAINING.md, "Exactly once and --deterministic").
 *
 * A stage accumulates every backward into one gradient buffer G, so the sum
 * depends on the order microbatches arrive in: float addition does not
 * associate. In deterministic mode each gradient-producing job runs with G
 * zeroed, and what it leaves there (the job's own gradient g) is added to
 * the microbatch's `part` buffer; G is then restored as saved + g, so the
 * stage's running sum is still there for the ordinary contribution. A
 * microbatch's gradient is then the same bits whoever computes it, and the
 * aggregator sums them in microbatch-ID order (train_agg_mean over the
 * vectors sorted by ID). `gwtf train-ref --deterministic` uses these very
 * functions, so both do the same floating-point operations.
 *
 * Memory: two scratch vectors of n_params floats per stage (save, scratch),
 * plus the part buffers their caller owns. */
#ifndef GWTF_TRAIN_GRAD_CAPTURE_H
#define GWTF_TRAIN_GRAD_CAPTURE_H

#include "train/stage.h"

/* save = G; G = 0. save holds stage_n_params(st) floats. */
int grad_capture_begin(stage *st, float *save);
/* scratch = G (the job's own gradient); part += scratch; G = save + scratch.
 * All three hold stage_n_params(st) floats; save is overwritten. */
int grad_capture_end(stage *st, float *save, float *scratch, float *part);

#endif
