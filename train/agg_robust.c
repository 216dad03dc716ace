/* train/agg_robust.c — the coordinate-wise trimmed mean (train/agg_robust.h)
 * and the byzantine test tool (`--byzantine MODE`): parsing its modes and
 * corrupting a contribution the way a hostile relay would. */
#include "train/agg_robust.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/peer_agg.h"
#include "util/err.h"

uint32_t train_agg_trim_count(uint32_t m, double trim) {
  if (m < 3) return 0; /* with two, nobody can tell which one lies */
  uint32_t t = (uint32_t)floor(trim * (double)m);
  while (t > 0 && m - 2 * t < 1) t--;
  return t;
}

void train_agg_mean(const float *const *sums, uint32_t m, size_t n, uint32_t total, float *out) {
  for (size_t k = 0; k < n; k++) out[k] = 0.0f;
  for (uint32_t i = 0; i < m; i++)
    for (size_t k = 0; k < n; k++) out[k] += sums[i][k];
  float inv = 1.0f / (float)total;
  for (size_t k = 0; k < n; k++) out[k] *= inv;
}

int train_agg_trimmed_mean(const float *const *sums, const uint32_t *counts, uint32_t m, size_t n, double trim,
                           float *out) {
  if (m == 0 || m > TRAIN_AGG_MAX_INPUTS || !(trim >= 0.0 && trim < 0.5)) return GW_EINVAL;
  float inv[TRAIN_AGG_MAX_INPUTS], col[TRAIN_AGG_MAX_INPUTS];
  for (uint32_t i = 0; i < m; i++) {
    if (counts[i] == 0) return GW_EINVAL;
    inv[i] = 1.0f / (float)counts[i];
  }
  uint32_t t = train_agg_trim_count(m, trim), keep = m - 2 * t;
  for (size_t k = 0; k < n; k++) {
    /* insertion sort: m is a stage's members, a handful */
    for (uint32_t i = 0; i < m; i++) {
      float x = sums[i][k] * inv[i];
      uint32_t j = i;
      while (j > 0 && col[j - 1] > x) {
        col[j] = col[j - 1];
        j--;
      }
      col[j] = x;
    }
    double acc = 0.0;
    for (uint32_t i = t; i < t + keep; i++) acc += col[i];
    out[k] = (float)(acc / keep);
  }
  return 0;
}

/* ---- the byzantine test tool ---- */

int train_byzantine_parse(const char *s, train_byzantine *mode, double *scale) {
  static const struct { const char *name; train_byzantine mode; } modes[] = {
      {"none", TRAIN_BYZ_NONE},   {"nan", TRAIN_BYZ_NAN},
      {"random", TRAIN_BYZ_RANDOM}, {"wrong-shape", TRAIN_BYZ_WRONG_SHAPE},
      {"lying-costs", TRAIN_BYZ_LYING_COSTS}};
  for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
    if (strcmp(s, modes[i].name) == 0) {
      *mode = modes[i].mode;
      return 0;
    }
  if (strncmp(s, "scale=", 6) == 0) {
    char *end = NULL;
    double k = strtod(s + 6, &end);
    if (end == s + 6 || *end || !isfinite(k)) return GW_EINVAL;
    *mode = TRAIN_BYZ_SCALE;
    *scale = k;
    return 0;
  }
  return GW_EINVAL;
}

const char *train_byzantine_name(train_byzantine mode) {
  switch (mode) {
  case TRAIN_BYZ_NONE: return "none";
  case TRAIN_BYZ_NAN: return "nan";
  case TRAIN_BYZ_SCALE: return "scale";
  case TRAIN_BYZ_RANDOM: return "random";
  case TRAIN_BYZ_WRONG_SHAPE: return "wrong-shape";
  case TRAIN_BYZ_LYING_COSTS: return "lying-costs";
  }
  return "unknown";
}

/* What a hostile relay does to its contribution before it sends it. Returns
 * how many floats it then claims the vector has (the stage's, or half of it
 * for wrong-shape). */
size_t byz_corrupt(train_peer *p, float *v, size_t n) {
  switch (p->cfg.tun.byzantine) {
  case TRAIN_BYZ_NAN:
    for (size_t k = 0; k < n; k++) v[k] = NAN;
    return n;
  case TRAIN_BYZ_SCALE:
    for (size_t k = 0; k < n; k++) v[k] *= (float)p->cfg.tun.byzantine_scale;
    return n;
  case TRAIN_BYZ_RANDOM:
    for (size_t k = 0; k < n; k++) {
      uint32_t r;
      p->io.random(p->io.ud, &r, sizeof(r));
      v[k] = (float)((double)r / 2147483647.5 - 1.0);
    }
    return n;
  case TRAIN_BYZ_WRONG_SHAPE: return n > 1 ? n / 2 : n;
  default: return n;
  }
}
