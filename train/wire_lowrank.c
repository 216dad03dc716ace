/* train/wire_lowrank.c — low-rank tensors on the wire (see train/wire_lowrank.h). */
#include "train/wire_lowrank.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* ---- bf16 (nearest even; the payload is bf16 so its 8 bits set the error) ---- */

static inline uint16_t f_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  x += 0x7fffu + ((x >> 16) & 1u);
  uint16_t h = (uint16_t)(x >> 16);
  /* a finite float must stay finite: FLT_MAX would round up to Inf */
  if ((h & 0x7f80u) == 0x7f80u) h = (uint16_t)((h & 0x8000u) | 0x7f7fu);
  return h;
}

static inline float bf16_to_f(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

static inline void put16(uint8_t *p, uint16_t h) { memcpy(p, &h, sizeof(h)); }
static inline uint16_t get16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, sizeof(h));
  return h;
}

/* ---- sizes ---- */

/* A factor row: its scale (bf16, the row's largest magnitude), then rank
 * int8 values q = round(x * 127 / scale). */
static size_t frow_bytes(size_t rank) { return 2 + rank; }

size_t wire_lr_bytes(size_t rank, size_t rows, size_t cols) {
  if (rank == 0 || rank > WIRE_LR_MAX_RANK) return 0;
  if (rows > SIZE_MAX / 4 - cols) return 0;
  size_t rc = rows + cols; /* U has rows factor rows, V cols */
  if (rc > (SIZE_MAX / 4 - cols) / frow_bytes(rank)) return 0;
  return 2 * cols + rc * frow_bytes(rank);
}

size_t wire_lr_scratch(size_t rank, size_t rows, size_t cols) {
  /* Xc (rows x cols), G (cols x cols), Q and Z (cols x rank) */
  if (rows && cols > SIZE_MAX / sizeof(float) / 4 / rows) return 0;
  if (cols && cols > SIZE_MAX / sizeof(float) / 4 / cols) return 0;
  return (rows * cols + cols * cols + 2 * cols * rank) * sizeof(float);
}

/* ---- int8 factor rows ---- */

/* Quantizes x (rank floats) into one factor row; x becomes what the
 * receiver will see (so that U can be fitted to the V it will use). */
static void frow_put(float *x, size_t rank, uint8_t *out) {
  float m = 0;
  for (size_t k = 0; k < rank; k++) m = fmaxf(m, fabsf(x[k]));
  uint16_t h = f_to_bf16(m);
  float mq = bf16_to_f(h);
  if (mq < m) { /* rounded below the largest value: one bf16 step up, so that |q| <= 127 */
    h = (uint16_t)(h + 1u);
    if ((h & 0x7f80u) == 0x7f80u) h = 0x7f7fu;
    mq = bf16_to_f(h);
  }
  put16(out, h);
  int8_t *q = (int8_t *)(out + 2);
  double inv = mq > 0 ? 127.0 / (double)mq : 0.0, step = (double)mq / 127.0;
  for (size_t k = 0; k < rank; k++) {
    double v = nearbyint((double)x[k] * inv);
    if (v > 127) v = 127;
    if (v < -127) v = -127;
    q[k] = (int8_t)v;
    x[k] = (float)(v * step);
  }
}

static bool frow_ok(const uint8_t *in) {
  uint16_t h = get16(in);
  return !(h & 0x8000u) && (h & 0x7f80u) != 0x7f80u; /* a finite, non-negative scale */
}

static void frow_get(const uint8_t *in, size_t rank, float *x) {
  double step = (double)bf16_to_f(get16(in)) / 127.0;
  const int8_t *q = (const int8_t *)(in + 2);
  for (size_t k = 0; k < rank; k++) x[k] = (float)((double)q[k] * step);
}

/* ---- the subspace ---- */

/* G = Xc^T Xc (cols x cols, symmetric; both halves filled). */
static void gram(const float *xc, size_t rows, size_t cols, float *g) {
  memset(g, 0, cols * cols * sizeof(float));
  for (size_t i = 0; i < rows; i++) {
    const float *x = xc + i * cols;
    for (size_t a = 0; a < cols; a++) {
      float xa = x[a];
      float *ga = g + a * cols;
      for (size_t b = a; b < cols; b++) ga[b] += xa * x[b];
    }
  }
  for (size_t a = 0; a < cols; a++)
    for (size_t b = 0; b < a; b++) g[a * cols + b] = g[b * cols + a];
}

/* A fixed pseudo-random start (the encoder's own choice; the receiver
 * never needs it): splitmix64 of the index, mapped to [-1, 1). */
static float start_value(size_t i) {
  uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)((double)(z >> 11) * 0x1p-52 - 1.0);
}

/* Gram-Schmidt on the columns of q (cols x rank, row-major), each column
 * projected out twice ("twice is enough": one pass in float leaves what
 * cancelled badly, and a residual column must be orthogonal for U V^T to
 * be a projection). A column that is (numerically) in the span of the
 * earlier ones is zeroed: the tensor has a lower rank than we send, and a
 * zero column costs nothing but its bytes. */
static void orthonormalise(float *q, size_t cols, size_t rank) {
  for (size_t k = 0; k < rank; k++) {
    double n0 = 0;
    for (size_t a = 0; a < cols; a++) n0 += (double)q[a * rank + k] * q[a * rank + k];
    for (int pass = 0; pass < 2; pass++)
      for (size_t l = 0; l < k; l++) {
        double d = 0;
        for (size_t a = 0; a < cols; a++) d += (double)q[a * rank + k] * q[a * rank + l];
        for (size_t a = 0; a < cols; a++) q[a * rank + k] -= (float)d * q[a * rank + l];
      }
    double n = 0;
    for (size_t a = 0; a < cols; a++) n += (double)q[a * rank + k] * q[a * rank + k];
    /* what is left after the projections: below 1e-4 of the column
     * (squared: 1e-8) is float round-off, not a direction */
    float inv = n > 1e-8 * n0 && n > 1e-30 ? (float)(1.0 / sqrt(n)) : 0.0f;
    for (size_t a = 0; a < cols; a++) q[a * rank + k] *= inv;
  }
}

/* Orthogonal iteration: q <- orth(G q), WIRE_LR_ITERS times. G's scale is
 * divided out first so that its powers stay in float range. */
static void top_subspace(float *g, size_t cols, size_t rank, float *q, float *z) {
  double tr = 0;
  for (size_t a = 0; a < cols; a++) tr += g[a * cols + a];
  if (tr > 0) {
    float inv = (float)(1.0 / tr);
    for (size_t i = 0; i < cols * cols; i++) g[i] *= inv;
  }
  for (size_t i = 0; i < cols * rank; i++) q[i] = start_value(i);
  orthonormalise(q, cols, rank);
  for (int it = 0; it < WIRE_LR_ITERS; it++) {
    memset(z, 0, cols * rank * sizeof(float));
    for (size_t a = 0; a < cols; a++) {
      const float *ga = g + a * cols;
      float *za = z + a * rank;
      for (size_t b = 0; b < cols; b++) {
        float w = ga[b];
        const float *qb = q + b * rank;
        for (size_t k = 0; k < rank; k++) za[k] += w * qb[k];
      }
    }
    orthonormalise(z, cols, rank);
    memcpy(q, z, cols * rank * sizeof(float));
  }
}

/* ---- encode / check / decode ---- */

int wire_lr_encode(size_t rank, const float *x, size_t rows, size_t cols, uint8_t *out, float *work) {
  size_t nb = wire_lr_bytes(rank, rows, cols);
  if (nb == 0) return GW_EINVAL;
  memset(out, 0, nb);
  uint8_t *mu = out, *v = out + 2 * cols, *u = v + cols * frow_bytes(rank);
  float *xc = work, *g = xc + rows * cols, *q = g + cols * cols, *z = q + cols * rank;
  bool finite = true;
  for (size_t i = 0; i < rows * cols && finite; i++) finite = isfinite(x[i]);
  if (!finite) {
    for (size_t j = 0; j < cols; j++) put16(mu + 2 * j, WIRE_LR_NONFINITE);
    return 0;
  }
  /* the column mean, as the receiver will see it (bf16), then centre on it */
  for (size_t j = 0; j < cols; j++) {
    double s = 0;
    for (size_t i = 0; i < rows; i++) s += x[i * cols + j];
    uint16_t h = f_to_bf16(rows ? (float)(s / (double)rows) : 0.0f);
    put16(mu + 2 * j, h);
    double m = bf16_to_f(h);
    for (size_t i = 0; i < rows; i++) { /* +-FLT_MAX about the mean must not become Inf */
      double d = (double)x[i * cols + j] - m;
      xc[i * cols + j] = (float)(d > FLT_MAX ? FLT_MAX : d < -FLT_MAX ? -FLT_MAX : d);
    }
  }
  /* Rows of huge values would overflow G: scale into range, undo in U. */
  float mx = 0;
  for (size_t i = 0; i < rows * cols; i++) mx = fmaxf(mx, fabsf(xc[i]));
  if (mx == 0) return 0; /* every row equals the mean: U = V = 0, residual 0 */
  for (size_t i = 0; i < rows * cols; i++) xc[i] = (float)((double)xc[i] / mx); /* 1/mx overflows for a denormal mx */
  gram(xc, rows, cols, g);
  top_subspace(g, cols, rank, q, z);
  /* V as sent (int8 rows); U = Xc V with that V, so U carries the magnitudes */
  uint8_t *vrow = v;
  for (size_t a = 0; a < cols; a++, vrow += frow_bytes(rank)) frow_put(q + a * rank, rank, vrow);
  float ui[WIRE_LR_MAX_RANK];
  for (size_t i = 0; i < rows; i++) {
    const float *xi = xc + i * cols;
    for (size_t k = 0; k < rank; k++) {
      double s = 0;
      for (size_t a = 0; a < cols; a++) s += (double)xi[a] * q[a * rank + k];
      ui[k] = (float)(s * (double)mx);
    }
    frow_put(ui, rank, u + i * frow_bytes(rank));
  }
  return 0;
}

int wire_lr_check(size_t rank, const uint8_t *in, size_t len, size_t rows, size_t cols) {
  size_t nb = wire_lr_bytes(rank, rows, cols);
  if (nb == 0 || len != nb) return GW_EPROTO;
  bool marker = cols > 0 && get16(in) == WIRE_LR_NONFINITE;
  for (size_t j = 0; j < cols; j++) {
    uint16_t h = get16(in + 2 * j);
    if (marker ? h != WIRE_LR_NONFINITE : (h & 0x7f80u) == 0x7f80u) return GW_EPROTO;
  }
  const uint8_t *f = in + 2 * cols;
  for (size_t r = 0; r < rows + cols; r++, f += frow_bytes(rank)) {
    if (marker) { /* a marker tensor's factors are all zero */
      for (size_t b = 0; b < frow_bytes(rank); b++)
        if (f[b]) return GW_EPROTO;
    } else if (!frow_ok(f)) {
      return GW_EPROTO;
    }
  }
  return 0;
}

int wire_lr_decode(size_t rank, const uint8_t *in, size_t len, size_t rows, size_t cols, float *x) {
  if (wire_lr_check(rank, in, len, rows, cols) != 0) return GW_EPROTO;
  if (cols > 0 && get16(in) == WIRE_LR_NONFINITE) {
    for (size_t i = 0; i < rows * cols; i++) x[i] = NAN;
    return 0;
  }
  const uint8_t *mu = in, *v = in + 2 * cols, *u = v + cols * frow_bytes(rank);
  float ui[WIRE_LR_MAX_RANK], vj[WIRE_LR_MAX_RANK];
  for (size_t i = 0; i < rows; i++) {
    frow_get(u + i * frow_bytes(rank), rank, ui);
    for (size_t j = 0; j < cols; j++) {
      frow_get(v + j * frow_bytes(rank), rank, vj);
      /* double, clamped: hostile factors must not make Inf or NaN */
      double s = bf16_to_f(get16(mu + 2 * j));
      for (size_t k = 0; k < rank; k++) s += (double)ui[k] * vj[k];
      x[i * cols + j] = (float)(s > FLT_MAX ? FLT_MAX : s < -FLT_MAX ? -FLT_MAX : s);
    }
  }
  return 0;
}
