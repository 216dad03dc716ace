#include "util/rng.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void gw_rng_seed(gw_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

uint64_t gw_rng_next(gw_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint64_t gw_rng_below(gw_rng *r, uint64_t bound) {
  if (bound == 0) return 0;
  /* Lemire-style rejection: retry the few draws that would bias the result. */
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t x = gw_rng_next(r);
    if (x >= threshold) return x % bound;
  }
}

double gw_rng_uniform(gw_rng *r) { return (double)(gw_rng_next(r) >> 11) * 0x1.0p-53; }

int64_t gw_rng_range(gw_rng *r, int64_t lo, int64_t hi) {
  if (hi <= lo) return lo;
  return lo + (int64_t)gw_rng_below(r, (uint64_t)(hi - lo) + 1);
}

double gw_rng_normal(gw_rng *r) {
  double u1 = gw_rng_uniform(r), u2 = gw_rng_uniform(r);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void gw_rng_bytes(gw_rng *r, void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    uint64_t x = gw_rng_next(r);
    size_t k = n < 8 ? n : 8;
    memcpy(p, &x, k);
    p += k;
    n -= k;
  }
}

void gw_rng_fork(gw_rng *parent, gw_rng *child) { gw_rng_seed(child, gw_rng_next(parent) ^ 0x5851f42d4c957f2dULL); }
