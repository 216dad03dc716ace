/* train/wire_rot.c — rotated low-bit quantization of rows (see train/wire_rot.h). */
#include "train/wire_rot.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "util/err.h"

/* Lloyd-Max levels of a unit Gaussian (Max 1960), ascending; a code is an
 * index into its row. Thresholds are the midpoints between neighbours. */
static const float levels2[4] = {-1.5104f, -0.4528f, 0.4528f, 1.5104f};
static const float levels3[8] = {-2.1520f, -1.3439f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3439f, 2.1520f};
static const float levels4[16] = {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9424f, -0.6568f, -0.3881f, -0.1284f,
                                  0.1284f,  0.3881f,  0.6568f,  0.9424f,  1.2562f,  1.6181f,  2.0690f,  2.7326f};

static const float levels5[32] = {-3.2607f, -2.6911f, -2.3177f, -2.0287f, -1.7872f, -1.5762f, -1.3863f, -1.2118f,
                                  -1.0488f, -0.8946f, -0.7471f, -0.6049f, -0.4667f, -0.3314f, -0.1981f, -0.0659f,
                                  0.0659f,  0.1981f,  0.3314f,  0.4667f,  0.6049f,  0.7471f,  0.8946f,  1.0488f,
                                  1.2118f,  1.3863f,  1.5762f,  1.7872f,  2.0287f,  2.3177f,  2.6911f,  3.2607f};

static const float *levels_of(unsigned bits) {
  return bits == 2 ? levels2 : bits == 3 ? levels3 : bits == 4 ? levels4 : bits == 5 ? levels5 : NULL;
}

size_t wire_rot_row_bytes(unsigned bits, size_t cols) {
  if (!levels_of(bits) || cols > (SIZE_MAX - 7 - 8 * WIRE_ROT_SCALE_BYTES) / bits) return 0;
  return WIRE_ROT_SCALE_BYTES + (cols * bits + 7) / 8;
}

size_t wire_rot_block(size_t cols) {
  size_t n = cols & (~cols + 1); /* the lowest set bit: the largest power of two dividing cols */
  if (n == 0) return 1;
  return n > WIRE_ROT_MAX_BLOCK ? WIRE_ROT_MAX_BLOCK : n;
}

/* D: a fixed sign per column, from a hash of its index (both ends compute
 * it; it only has to break the alignment of the row with H's rows, e.g. a
 * row's constant offset, which H alone would pile into one coordinate). */
static inline float col_sign(size_t j) {
  uint64_t h = (uint64_t)j * 0x9e3779b97f4a7c15ull;
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  return (h >> 63) ? -1.0f : 1.0f;
}

/* In place, unnormalised: x <- H x over blocks of n (a power of two). */
static void fwht(float *x, size_t cols, size_t n) {
  for (size_t b = 0; b + n <= cols; b += n) {
    float *v = x + b;
    for (size_t h = 1; h < n; h <<= 1)
      for (size_t i = 0; i < n; i += 2 * h)
        for (size_t j = i; j < i + h; j++) {
          float a = v[j], c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
  }
}

static inline uint16_t scale_bits(const uint8_t *in) {
  uint16_t h;
  memcpy(&h, in, sizeof(h));
  return h;
}

/* bf16 of a positive finite double, rounded to nearest, at most the
 * largest finite bf16 (a scale must never read as Inf). */
static uint16_t scale_to_bf16(double s) {
  float f = s < (double)FLT_MAX ? (float)s : FLT_MAX;
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  x += 0x7fffu + ((x >> 16) & 1u);
  uint16_t h = (uint16_t)(x >> 16);
  return h >= 0x7f80u ? 0x7f7fu : h;
}

static double bf16_to_double(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, sizeof(f));
  return (double)f;
}

void wire_rot_encode_row(unsigned bits, const float *x, size_t cols, uint8_t *out, float *work) {
  const float *lv = levels_of(bits);
  size_t nb = wire_rot_row_bytes(bits, cols);
  memset(out, 0, nb);
  uint8_t *codes = out + WIRE_ROT_SCALE_BYTES;
  double ss = 0;
  for (size_t j = 0; j < cols; j++) ss += (double)x[j] * (double)x[j];
  if (!isfinite(ss)) { /* NaN or Inf somewhere (finite floats cannot overflow a double sum) */
    uint16_t m = WIRE_ROT_NONFINITE;
    memcpy(out, &m, sizeof(m));
    return;
  }
  if (ss == 0.0 || cols == 0) return; /* scale 0: decodes to zeros */
  size_t n = wire_rot_block(cols);
  double s = sqrt(ss / (double)cols);
  double inv = 1.0 / s; /* |x_j| / s <= sqrt(cols): no overflow in float */
  for (size_t j = 0; j < cols; j++) work[j] = (float)((double)x[j] * inv) * col_sign(j);
  fwht(work, cols, n);
  float rn = (float)(1.0 / sqrt((double)n));
  unsigned nl = 1u << bits;
  float th[31];
  for (unsigned k = 0; k + 1 < nl; k++) th[k] = 0.5f * (lv[k] + lv[k + 1]);
  double num = 0, den = 0;
  uint64_t acc = 0;
  unsigned have = 0;
  for (size_t j = 0; j < cols; j++) {
    float u = work[j] * rn;
    unsigned q = 0;
    for (unsigned k = 0; k + 1 < nl; k++) q += u > th[k];
    num += (double)u * lv[q];
    den += (double)lv[q] * lv[q];
    acc |= (uint64_t)q << have;
    have += bits;
    while (have >= 8) {
      *codes++ = (uint8_t)acc;
      acc >>= 8;
      have -= 8;
    }
  }
  if (have) *codes = (uint8_t)acc;
  double g = num / den; /* den > 0: no level is zero */
  uint16_t h = g > 0 ? scale_to_bf16(s * g) : 0;
  memcpy(out, &h, sizeof(h));
}

int wire_rot_check_row(unsigned bits, const uint8_t *in, size_t cols) {
  size_t nb = wire_rot_row_bytes(bits, cols);
  if (nb == 0) return GW_EPROTO;
  uint16_t h = scale_bits(in);
  const uint8_t *codes = in + WIRE_ROT_SCALE_BYTES;
  size_t ncode = nb - WIRE_ROT_SCALE_BYTES;
  if (h == WIRE_ROT_NONFINITE) {
    for (size_t i = 0; i < ncode; i++)
      if (codes[i]) return GW_EPROTO;
    return 0;
  }
  if ((h & 0x8000u) || (h & 0x7f80u) == 0x7f80u) return GW_EPROTO; /* negative, Inf or NaN */
  unsigned used = (unsigned)((cols * bits) % 8);
  if (used && ncode && (codes[ncode - 1] >> used)) return GW_EPROTO; /* padding bits must be zero */
  return 0;
}

int wire_rot_decode_row(unsigned bits, const uint8_t *in, size_t cols, float *x) {
  if (wire_rot_check_row(bits, in, cols) != 0) return GW_EPROTO;
  uint16_t h = scale_bits(in);
  if (h == WIRE_ROT_NONFINITE) {
    for (size_t j = 0; j < cols; j++) x[j] = NAN;
    return 0;
  }
  const float *lv = levels_of(bits);
  const uint8_t *codes = in + WIRE_ROT_SCALE_BYTES;
  uint64_t acc = 0;
  unsigned have = 0, mask = (1u << bits) - 1u;
  for (size_t j = 0; j < cols; j++) {
    while (have < bits) {
      acc |= (uint64_t)(*codes++) << have;
      have += 8;
    }
    x[j] = lv[acc & mask];
    acc >>= bits;
    have -= bits;
  }
  size_t n = wire_rot_block(cols);
  fwht(x, cols, n); /* unit levels: the sums stay small, the scale comes last */
  double k = bf16_to_double(h) / sqrt((double)n);
  for (size_t j = 0; j < cols; j++) {
    double v = (double)x[j] * k;
    if (v > FLT_MAX) v = FLT_MAX; /* a finite row decodes finite */
    if (v < -FLT_MAX) v = -FLT_MAX;
    x[j] = (float)v * col_sign(j);
  }
  return 0;
}
