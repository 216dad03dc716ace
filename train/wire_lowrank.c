/* train/wire_lowrank.c — low-rank tensors on the wire (see train/wire_lowrank.h). */
#include "train/wire_lowrank.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/wire_rot.h"
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

/* A factor row. fbits 8: its scale (bf16, the row's largest magnitude),
 * then rank int8 values q = round(x * 127 / scale). fbits 4: one rotated
 * 4-bit row of rank elements (train/wire_rot.h), whose Gaussian-optimal
 * levels fit a factor row as well as an activation row: about 1 % squared
 * error, at half the bytes. */
static size_t frow_bytes(size_t rank, unsigned fbits) { return fbits == 4 ? wire_rot_row_bytes(4, rank) : 2 + rank; }

static bool fbits_ok(unsigned fbits) { return fbits == 8 || fbits == 4; }

size_t wire_lr_bytes(size_t rank, unsigned fbits, size_t rows, size_t cols) {
  if (rank == 0 || rank > WIRE_LR_MAX_RANK || !fbits_ok(fbits)) return 0;
  if (rows > SIZE_MAX / 4 - cols) return 0;
  size_t rc = rows + cols; /* U has rows factor rows, V cols */
  if (rc > (SIZE_MAX / 4 - cols) / frow_bytes(rank, fbits)) return 0;
  return 2 * cols + rc * frow_bytes(rank, fbits);
}

size_t wire_lr_scratch(size_t rank, size_t rows, size_t cols) {
  /* Xc (rows x cols), G (cols x cols), Q and Z (cols x rank), the rank x
   * rank normal matrix of the basis as sent and its Cholesky factor */
  if (rank == 0 || rank > WIRE_LR_MAX_RANK) return 0;
  if (rows && cols > SIZE_MAX / sizeof(float) / 4 / rows) return 0;
  if (cols && cols > SIZE_MAX / sizeof(float) / 4 / cols) return 0;
  return (rows * cols + cols * cols + 2 * cols * rank + 2 * rank * rank) * sizeof(float);
}

/* ---- factor rows ---- */

/* Quantizes x (rank floats) into one int8 factor row; x becomes what the
 * receiver will see (so that U can be fitted to the V it will use). */
static void frow8_put(float *x, size_t rank, uint8_t *out) {
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

static bool frow8_ok(const uint8_t *in) {
  uint16_t h = get16(in);
  return !(h & 0x8000u) && (h & 0x7f80u) != 0x7f80u; /* a finite, non-negative scale */
}

static void frow8_get(const uint8_t *in, size_t rank, float *x) {
  double step = (double)bf16_to_f(get16(in)) / 127.0;
  const int8_t *q = (const int8_t *)(in + 2);
  for (size_t k = 0; k < rank; k++) x[k] = (float)((double)q[k] * step);
}

/* One factor row of either kind; x becomes what the receiver will see.
 * work: rank floats (the rotation's scratch). */
static void frow_put(float *x, size_t rank, unsigned fbits, uint8_t *out, float *work) {
  if (fbits == 8) {
    frow8_put(x, rank, out);
    return;
  }
  wire_rot_encode_row(4, x, rank, out, work);
  (void)wire_rot_decode_row(4, out, rank, x); /* our own row: always decodes */
}

static bool frow_ok(const uint8_t *in, size_t rank, unsigned fbits) {
  return fbits == 8 ? frow8_ok(in) : wire_rot_check_row(4, in, rank) == 0;
}

/* A checked row into x (rank floats). */
static void frow_get(const uint8_t *in, size_t rank, unsigned fbits, float *x) {
  if (fbits == 8)
    frow8_get(in, rank, x);
  else
    (void)wire_rot_decode_row(4, in, rank, x);
}

/* ---- the subspace ---- */

/* G = Xc^T Xc (cols x cols, symmetric; both halves filled). BLAS: at a
 * real model's width (4096 x 768) the plain loop took over a second, the
 * transfer it saves a few tens of ms (docs/TRAINING.md). */
static void gram(const float *xc, size_t rows, size_t cols, float *g) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)cols, (int)rows, 1.0f, xc, (int)cols, 0.0f, g, (int)cols);
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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)cols, (int)rank, (int)cols, 1.0f, g, (int)cols, q,
                (int)rank, 0.0f, z, (int)rank);
    orthonormalise(z, cols, rank);
    memcpy(q, z, cols * rank * sizeof(float));
  }
}

/* ---- coordinates for the basis as sent ---- */

/* The Cholesky factor (lower, row-major, in l) of M = V'^T V' for the basis
 * V' (cols x rank) the receiver will use. V' is orthonormal only up to its
 * quantization (and has zero columns where the tensor's rank is lower), so
 * the best coordinates are the least-squares ones, u = M^-1 V'^T x, not
 * V'^T x. A pivot below 1e-6 (a zero or dependent column) marks that
 * coordinate unused: its row and column of l are zero and it solves to 0. */
static void normal_factor(const float *vq, size_t cols, size_t rank, float *m, float *l) {
  for (size_t k = 0; k < rank; k++)
    for (size_t j = 0; j <= k; j++) {
      double s = 0;
      for (size_t a = 0; a < cols; a++) s += (double)vq[a * rank + k] * vq[a * rank + j];
      m[k * rank + j] = m[j * rank + k] = (float)s;
    }
  memset(l, 0, rank * rank * sizeof(float));
  for (size_t k = 0; k < rank; k++) {
    double d = m[k * rank + k];
    for (size_t j = 0; j < k; j++) d -= (double)l[k * rank + j] * l[k * rank + j];
    if (d < 1e-6) continue; /* unused coordinate: row k of l stays zero */
    double lkk = sqrt(d);
    l[k * rank + k] = (float)lkk;
    for (size_t i = k + 1; i < rank; i++) {
      double s = m[i * rank + k];
      for (size_t j = 0; j < k; j++) s -= (double)l[i * rank + j] * l[k * rank + j];
      l[i * rank + k] = (float)(s / lkk);
    }
  }
}

/* u <- M^-1 u through the factor (forward, then back substitution; unused
 * coordinates come out 0). */
static void normal_solve(const float *l, size_t rank, float *u) {
  double y[WIRE_LR_MAX_RANK];
  for (size_t k = 0; k < rank; k++) {
    double s = u[k];
    for (size_t j = 0; j < k; j++) s -= (double)l[k * rank + j] * y[j];
    y[k] = l[k * rank + k] > 0 ? s / l[k * rank + k] : 0.0;
  }
  for (size_t k = rank; k-- > 0;) {
    double s = y[k];
    for (size_t j = k + 1; j < rank; j++) s -= (double)l[j * rank + k] * y[j];
    y[k] = l[k * rank + k] > 0 ? s / l[k * rank + k] : 0.0;
    u[k] = (float)y[k];
  }
}

/* ---- encode / check / decode ---- */

/* Columns the mean is taken over per pass, row by row (a column at a time
 * strides through the whole tensor). */
#define WIRE_LR_COL_BLOCK 64

/* The column means, as the receiver will see them (bf16, into mu), and xc
 * = x centred on them. */
static void centre(const float *x, size_t rows, size_t cols, uint8_t *mu, float *xc) {
  double sum[WIRE_LR_COL_BLOCK], mean[WIRE_LR_COL_BLOCK];
  for (size_t j0 = 0; j0 < cols; j0 += WIRE_LR_COL_BLOCK) {
    size_t nj = cols - j0 < WIRE_LR_COL_BLOCK ? cols - j0 : WIRE_LR_COL_BLOCK;
    memset(sum, 0, sizeof(sum));
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < nj; j++) sum[j] += x[i * cols + j0 + j];
    for (size_t j = 0; j < nj; j++) {
      uint16_t h = f_to_bf16(rows ? (float)(sum[j] / (double)rows) : 0.0f);
      put16(mu + 2 * (j0 + j), h);
      mean[j] = bf16_to_f(h);
    }
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < nj; j++) { /* +-FLT_MAX about the mean must not become Inf */
        double d = (double)x[i * cols + j0 + j] - mean[j];
        xc[i * cols + j0 + j] = (float)(d > FLT_MAX ? FLT_MAX : d < -FLT_MAX ? -FLT_MAX : d);
      }
  }
}

int wire_lr_encode(size_t rank, unsigned fbits, const float *x, size_t rows, size_t cols, uint8_t *out,
                   float *work) {
  size_t nb = wire_lr_bytes(rank, fbits, rows, cols), fb = frow_bytes(rank, fbits);
  if (nb == 0) return GW_EINVAL;
  memset(out, 0, nb);
  uint8_t *mu = out, *v = out + 2 * cols, *u = v + cols * fb;
  float *xc = work, *g = xc + rows * cols, *q = g + cols * cols, *z = q + cols * rank, *m = z + cols * rank,
        *l = m + rank * rank;
  bool finite = true;
  for (size_t i = 0; i < rows * cols && finite; i++) finite = isfinite(x[i]);
  if (!finite) {
    for (size_t j = 0; j < cols; j++) put16(mu + 2 * j, WIRE_LR_NONFINITE);
    return 0;
  }
  centre(x, rows, cols, mu, xc);
  /* Rows of huge values would overflow G: scale into range, undo in U. */
  float mx = 0;
  for (size_t i = 0; i < rows * cols; i++) {
    float a = fabsf(xc[i]);
    if (a > mx) mx = a;
  }
  if (mx == 0) return 0; /* every row equals the mean: U = V = 0 (all-zero rows of either kind), residual 0 */
  for (size_t i = 0; i < rows * cols; i++) xc[i] = (float)((double)xc[i] / mx); /* 1/mx overflows for a denormal mx */
  gram(xc, rows, cols, g);
  top_subspace(g, cols, rank, q, z);
  /* V as sent; U fitted to that V, so U carries the magnitudes */
  uint8_t *vrow = v;
  for (size_t a = 0; a < cols; a++, vrow += fb) frow_put(q + a * rank, rank, fbits, vrow, z);
  normal_factor(q, cols, rank, m, l);
  /* U = Xc V' M^-1, scaled back by mx: Xc V' a block of rows at a time
   * into z (cols x rank floats: cols rows of coordinates), then each row
   * solved and quantized (m, free after the factorisation, is the
   * rotation's scratch). */
  float ui[WIRE_LR_MAX_RANK];
  size_t blk = cols;
  for (size_t i0 = 0; i0 < rows; i0 += blk) {
    size_t nr = rows - i0 < blk ? rows - i0 : blk;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nr, (int)rank, (int)cols, 1.0f, xc + i0 * cols,
                (int)cols, q, (int)rank, 0.0f, z, (int)rank);
    for (size_t i = i0; i < i0 + nr; i++) {
      memcpy(ui, z + (i - i0) * rank, rank * sizeof(float));
      normal_solve(l, rank, ui);
      for (size_t k = 0; k < rank; k++) ui[k] = (float)((double)ui[k] * mx);
      frow_put(ui, rank, fbits, u + i * fb, m);
    }
  }
  return 0;
}

int wire_lr_check(size_t rank, unsigned fbits, const uint8_t *in, size_t len, size_t rows, size_t cols) {
  size_t nb = wire_lr_bytes(rank, fbits, rows, cols), fb = frow_bytes(rank, fbits);
  if (nb == 0 || len != nb) return GW_EPROTO;
  bool marker = cols > 0 && get16(in) == WIRE_LR_NONFINITE;
  for (size_t j = 0; j < cols; j++) {
    uint16_t h = get16(in + 2 * j);
    if (marker ? h != WIRE_LR_NONFINITE : (h & 0x7f80u) == 0x7f80u) return GW_EPROTO;
  }
  const uint8_t *f = in + 2 * cols;
  for (size_t r = 0; r < rows + cols; r++, f += fb) {
    if (marker) { /* a marker tensor's factors are all zero */
      for (size_t b = 0; b < fb; b++)
        if (f[b]) return GW_EPROTO;
    } else if (!frow_ok(f, rank, fbits)) {
      return GW_EPROTO;
    }
  }
  return 0;
}

int wire_lr_decode(size_t rank, unsigned fbits, const uint8_t *in, size_t len, size_t rows, size_t cols,
                   float *x) {
  if (wire_lr_check(rank, fbits, in, len, rows, cols) != 0) return GW_EPROTO;
  if (cols > 0 && get16(in) == WIRE_LR_NONFINITE) {
    for (size_t i = 0; i < rows * cols; i++) x[i] = NAN;
    return 0;
  }
  size_t fb = frow_bytes(rank, fbits);
  const uint8_t *mu = in, *v = in + 2 * cols, *u = v + cols * fb;
  /* V's block transposed (vt[k][j]), so the sum over k runs along whole
   * rows of columns, which the compiler vectorises */
  float ui[WIRE_LR_MAX_RANK], vj[WIRE_LR_MAX_RANK], vt[WIRE_LR_MAX_RANK][WIRE_LR_COL_BLOCK], mean[WIRE_LR_COL_BLOCK];
  for (size_t j0 = 0; j0 < cols; j0 += WIRE_LR_COL_BLOCK) {
    size_t nj = cols - j0 < WIRE_LR_COL_BLOCK ? cols - j0 : WIRE_LR_COL_BLOCK;
    for (size_t j = 0; j < nj; j++) {
      frow_get(v + (j0 + j) * fb, rank, fbits, vj);
      for (size_t k = 0; k < rank; k++) vt[k][j] = vj[k];
      mean[j] = bf16_to_f(get16(mu + 2 * (j0 + j)));
    }
    for (size_t i = 0; i < rows; i++) {
      frow_get(u + i * fb, rank, fbits, ui);
      float *xi = x + i * cols + j0;
      memcpy(xi, mean, nj * sizeof(float));
      for (size_t k = 0; k < rank; k++)
        for (size_t j = 0; j < nj; j++) xi[j] += ui[k] * vt[k][j];
      for (size_t j = 0; j < nj; j++)
        if (!isfinite(xi[j])) { /* hostile factors: again in double, clamped, so no Inf or NaN comes out */
          double s = mean[j];
          for (size_t k = 0; k < rank; k++) s += (double)ui[k] * vt[k][j];
          xi[j] = (float)(s > FLT_MAX ? FLT_MAX : s < -FLT_MAX ? -FLT_MAX : s);
        }
    }
  }
  return 0;
}
