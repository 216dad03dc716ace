/* train/checkpoint.h — stage checkpoints on disk (module prefix ckpt_).
 *
 * A checkpoint is the stage's serialised state (train/stage.h): a
 * safetensors file with every parameter under its model name, the AdamW
 * moments as adam.m.<name> / adam.v.<name>, and the step and layout in
 * __metadata__. It is written atomically (a crash leaves the old file or
 * the new one) and loads in PyTorch with the safetensors package. */
#ifndef GWTF_TRAIN_CHECKPOINT_H
#define GWTF_TRAIN_CHECKPOINT_H

#include <stddef.h>

#include "train/stage.h"

/* Writes st's state to path atomically (mode 0644). */
int ckpt_save(stage *st, const char *path);
/* Replaces st's parameters, moments and step with those in path after
 * checking that the file was written for the same model and layers; on
 * error st is unchanged and err says why. */
int ckpt_load(stage *st, const char *path, char *err, size_t err_len);
/* The optimizer step a checkpoint was taken at (to decide whether it is
 * recent enough to resume from). */
int ckpt_step(const char *path, long long *step, char *err, size_t err_len);

#endif
