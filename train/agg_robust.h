/* train/agg_robust.h — robust aggregation (coordinate-wise trimmed mean) and
 * the byzantine test tool's corruptions.
 *
 * The trimmed mean is a pure function of its inputs, in a fixed order, so
 * the aggregator that computes it sends every member the same bits (members
 * never recompute it). */
#ifndef GWTF_TRAIN_AGG_ROBUST_H
#define GWTF_TRAIN_AGG_ROBUST_H

#include <stddef.h>
#include <stdint.h>

/* The largest number of contributions train_agg_trimmed_mean takes. */
#define TRAIN_AGG_MAX_INPUTS 64

/* Coordinate-wise trimmed mean of per-microbatch gradients: for each of the
 * n coordinates, the m values sums[i][k] / counts[i] (counts[i] > 0) are
 * sorted, floor(trim x m) are dropped at each end (fewer when that would
 * leave none), and the rest averaged (summed in sorted order, in double).
 * out gets n floats. Returns 0, or GW_EINVAL (m == 0, m too large, a zero
 * count, trim outside [0, 0.5)). With m < 3 nothing is trimmed. */
int train_agg_trimmed_mean(const float *const *sums, const uint32_t *counts, uint32_t m, size_t n, double trim,
                           float *out);

/* The mean: out[k] = (sums[0][k] + ... + sums[m-1][k]) * (1 / total), the
 * floats added in the order given, from 0 (what `gwtf train-ref` does with
 * one process's gradient sum, so that a fault-free swarm matches it bit for
 * bit). total > 0. */
void train_agg_mean(const float *const *sums, uint32_t m, size_t n, uint32_t total, float *out);

/* How many values are dropped at each end for m contributions. */
uint32_t train_agg_trim_count(uint32_t m, double trim);

#endif
