/* train/checkpoint.h — stage checkpoints on disk (module prefix ckpt_).
 *
 * A checkpoint is the stage's serialised state (train/stage.h): a
 * safetensors file with every parameter under its model name, the AdamW
 * moments as adam.m.<name> / adam.v.<name>, and the step and layout in
 * __metadata__. It is written atomically (a crash leaves the old file or
 * the new one) and loads in PyTorch with the safetensors package. */
#ifndef GWTF_TRAIN_CHECKPOINT_H
#define GWTF_TRAIN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* ---- a run's checkpoints in a data directory ------------------------------------
 * A peer of run R serving stage s keeps <data_dir>/checkpoints/R.stage<s>.safetensors
 * and beside it R.stage<s>.safetensors.json, the sidecar:
 *   {"run":"R","stage":s,"iteration":i,"weight_hash":"<64 hex>"}
 * iteration counts the aggregations done; weight_hash is the hash the stage
 * logged after that aggregation (stage_weight_hash), so a reader can tell
 * the file holds exactly those weights (`gwtf export` checks it). */

#define CKPT_SIDECAR_SUFFIX ".json"
#define CKPT_RUN_NAME_MAX (128)

typedef struct ckpt_sidecar {
  char run[CKPT_RUN_NAME_MAX];
  int stage;
  long long iteration;
  bool have_hash; /* sidecars written before the hash was recorded lack it */
  uint8_t weight_hash[STAGE_HASH_BYTES];
} ckpt_sidecar;

/* <data_dir>/checkpoints/<run>.stage<s>.safetensors; GW_ERANGE when it does
 * not fit in len. */
int ckpt_run_path(char *out, size_t len, const char *data_dir, const char *run, int stage);
/* Writes a serialised stage state to path and its sidecar to path.json,
 * each atomically (mode 0644). hash may be NULL (no weight_hash field). */
int ckpt_save_blob(const char *path, const void *blob, size_t len, const char *run, int stage,
                   long long iteration, const uint8_t *hash);
/* Reads path's sidecar (path + ".json"). GW_EINVAL + sentence when it is
 * not one. */
int ckpt_read_sidecar(const char *path, ckpt_sidecar *out, char *err, size_t err_len);

#endif
