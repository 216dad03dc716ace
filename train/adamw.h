/* train/adamw.h — AdamW hyperparameters and the learning-rate schedule.
 *
 * The update itself is a backend kernel (gpu_adamw_update, the formula of
 * torch.optim.AdamW: decoupled weight decay, bias-corrected moments);
 * stage_step (train/stage.h) applies it to every tensor of a stage, with
 * weight decay on matrices only (model_tensor.weight_decay), after clipping
 * the stage's gradient to `grad_clip` in L2 norm when that is set. The norm
 * is the stage's own: a pipeline stage sees only its gradient, and the
 * global norm of llm.c and PyTorch's clip_grad_norm_ would need every
 * stage's every step (docs/TRAINING.md, "Gradient clipping"). */
#ifndef GWTF_TRAIN_ADAMW_H
#define GWTF_TRAIN_ADAMW_H

#include <stddef.h>

typedef struct adamw_config {
  float lr;           /* peak learning rate */
  float beta1, beta2; /* moment decay */
  float eps;          /* added to sqrt(v_hat) */
  float weight_decay; /* decoupled, on matrices */
  int warmup_steps;   /* linear warm-up from lr/warmup to lr */
  int decay_steps;    /* cosine decay to min_lr_frac * lr after warm-up; 0 = constant */
  float min_lr_frac;
  float grad_clip;    /* > 0: a step's gradient is scaled down to this L2 norm when above it; 0: off */
} adamw_config;

/* GPT-2 / llm.c defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
 * decay 0.1, no warm-up, constant rate; no clipping (the run record sets
 * it). */
void adamw_defaults(adamw_config *cfg);

/* Checks ranges (lr > 0, betas in [0, 1), eps > 0, decay >= 0, ...).
 * Returns 0 or GW_EINVAL with a sentence in err. */
int adamw_validate(const adamw_config *cfg, char *err, size_t err_len);

/* Learning rate for optimizer step `step` (1 for the first update). */
float adamw_lr_at(const adamw_config *cfg, long long step);

#endif
