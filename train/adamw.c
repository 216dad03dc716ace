/* train/adamw.c — AdamW hyperparameters and the learning-rate schedule. */
#include "train/adamw.h"

#include <math.h>
#include <stdio.h>

#include "util/err.h"

void adamw_defaults(adamw_config *c) {
  *c = (adamw_config){
      .lr = 6e-4f,
      .beta1 = 0.9f,
      .beta2 = 0.95f,
      .eps = 1e-8f,
      .weight_decay = 0.1f,
      .warmup_steps = 0,
      .decay_steps = 0,
      .min_lr_frac = 0.1f,
  };
}

int adamw_validate(const adamw_config *c, char *err, size_t err_len) {
  const char *bad = NULL;
  if (!(c->lr > 0.0f && isfinite(c->lr))) bad = "lr must be a positive number";
  else if (!(c->beta1 >= 0.0f && c->beta1 < 1.0f)) bad = "beta1 must be in [0, 1)";
  else if (!(c->beta2 >= 0.0f && c->beta2 < 1.0f)) bad = "beta2 must be in [0, 1)";
  else if (!(c->eps > 0.0f && isfinite(c->eps))) bad = "eps must be a positive number";
  else if (!(c->weight_decay >= 0.0f && c->weight_decay * c->lr < 1.0f))
    bad = "weight_decay must be >= 0 and lr * weight_decay < 1";
  else if (c->warmup_steps < 0 || c->decay_steps < 0) bad = "warm-up and decay steps must be >= 0";
  else if (!(c->min_lr_frac >= 0.0f && c->min_lr_frac <= 1.0f)) bad = "min_lr_frac must be in [0, 1]";
  else if (!(c->grad_clip >= 0.0f && isfinite(c->grad_clip))) bad = "grad_clip must be >= 0 (0: off)";
  if (!bad) return 0;
  if (err && err_len) snprintf(err, err_len, "%s", bad);
  return GW_EINVAL;
}

float adamw_lr_at(const adamw_config *c, long long step) {
  if (step < 1) step = 1;
  if (c->warmup_steps > 0 && step <= c->warmup_steps)
    return c->lr * (float)step / (float)c->warmup_steps;
  if (c->decay_steps <= 0) return c->lr;
  long long t = step - c->warmup_steps;
  if (t >= c->decay_steps) return c->lr * c->min_lr_frac;
  double frac = (double)t / (double)c->decay_steps;
  double coeff = 0.5 * (1.0 + cos(M_PI * frac)); /* 1 -> 0 */
  return (float)(c->lr * (c->min_lr_frac + (1.0 - c->min_lr_frac) * coeff));
}
