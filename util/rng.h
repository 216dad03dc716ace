/* util/rng.h — a small seeded PRNG (xoshiro256**, seeded through splitmix64).
 *
 * Everything that must replay — the simulator, seeded experiments, weight
 * init, churn schedules — draws from one of these. Never use it for secrets:
 * keys and nonces come from libsodium. */
#ifndef GWTF_UTIL_RNG_H
#define GWTF_UTIL_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct gw_rng {
  uint64_t s[4];
} gw_rng;

void gw_rng_seed(gw_rng *r, uint64_t seed);
uint64_t gw_rng_next(gw_rng *r);
/* Uniform in [0, bound) without modulo bias; bound 0 returns 0. */
uint64_t gw_rng_below(gw_rng *r, uint64_t bound);
/* Uniform double in [0, 1). */
double gw_rng_uniform(gw_rng *r);
/* Uniform integer in [lo, hi] inclusive (the paper's floor(U(lo, hi+1))). */
int64_t gw_rng_range(gw_rng *r, int64_t lo, int64_t hi);
/* Standard normal (Box–Muller), for weight init. */
double gw_rng_normal(gw_rng *r);
void gw_rng_bytes(gw_rng *r, void *buf, size_t n);
/* A child generator whose stream is independent of the parent's next draws. */
void gw_rng_fork(gw_rng *parent, gw_rng *child);

#endif
