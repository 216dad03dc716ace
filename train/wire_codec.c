/* train/wire_codec.c — activation wire formats (see train/wire_codec.h). */
#include "train/wire_codec.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/wire_lowrank.h"
#include "train/wire_rot.h"
#include "util/err.h"

#define Q8_SCALE_BYTES 4
#define Q8_NONFINITE (-128)

/* ---- element conversions (static inline: the loops below call no function per element) ---- */

static inline uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof(x));
  return x;
}

static inline float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof(f));
  return f;
}

static inline uint16_t to_bf16(float f) {
  uint32_t x = f32_bits(f);
  /* NaN: keep sign and the top of the payload, force the quiet bit (the
   * rounding add could carry a NaN into Inf). */
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  /* round to nearest, ties to even; a carry out of the mantissa bumps the
   * exponent, which is right, up to and including overflow to Inf */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static inline float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) /* Inf, or NaN made quiet with its top payload bits */
    return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
  if (ax < 0x38800000u) {
    /* below 2^-14: a binary16 subnormal, a multiple of 2^-24. Adding 0.5
     * puts the value where the float's ulp is 2^-24, so the FPU's own
     * round-to-nearest-even does the rounding; the mantissa bits are then
     * the half's bits (2^-14 itself comes out as the smallest normal). */
    float a = bits_f32(ax) + 0.5f;
    return (uint16_t)(sign | (uint16_t)(f32_bits(a) - 0x3f000000u));
  }
  /* normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
   * to nearest even; a mantissa carry moves into the exponent */
  ax += (uint32_t)(15 - 127) * (1u << 23) + 0xfffu + ((ax >> 13) & 1u);
  return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

static inline float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = (float)m * 5.9604644775390625e-8f; /* m x 2^-24, exact */
    return bits_f32(f32_bits(v) | sign);
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t wire_f32_to_bf16(float x) { return to_bf16(x); }
float wire_bf16_to_f32(uint16_t h) { return from_bf16(h); }
uint16_t wire_f32_to_f16(float x) { return to_f16(x); }
float wire_f16_to_f32(uint16_t h) { return from_f16(h); }

/* ---- sizes and names ---- */

bool wire_dtype_ok(train_dtype d) {
  return d == TRAIN_F32 || d == TRAIN_BF16 || d == TRAIN_F16 || d == TRAIN_Q8ROW || d == TRAIN_R4ROW ||
         d == TRAIN_R3ROW || d == TRAIN_R2ROW || d == TRAIN_LR8 || d == TRAIN_LR16 || d == TRAIN_LR32 ||
         d == TRAIN_LR32R4 || d == TRAIN_R5ROW || d == TRAIN_LR16R4;
}

/* Bits per element of a rotated format; 0 for any other dtype. */
static unsigned rot_bits(train_dtype d) {
  return d == TRAIN_R5ROW ? 5 : d == TRAIN_R4ROW ? 4 : d == TRAIN_R3ROW ? 3 : d == TRAIN_R2ROW ? 2 : 0;
}

/* Rank of a low-rank format; 0 for any other dtype. */
static size_t lr_rank(train_dtype d) {
  return d == TRAIN_LR8 ? 8 : d == TRAIN_LR16 || d == TRAIN_LR16R4 ? 16 : d == TRAIN_LR32 || d == TRAIN_LR32R4 ? 32 : 0;
}

/* Bits per factor element of a low-rank format: int8 rows, or rotated
 * 4-bit rows for LR16R4 and LR32R4. */
static unsigned lr_fbits(train_dtype d) { return d == TRAIN_LR32R4 || d == TRAIN_LR16R4 ? 4 : 8; }

size_t wire_shape_last(train_dtype d, size_t cols) {
  if (d == TRAIN_Q8ROW) return cols > SIZE_MAX - Q8_SCALE_BYTES ? 0 : cols + Q8_SCALE_BYTES;
  if (rot_bits(d)) return wire_rot_row_bytes(rot_bits(d), cols);
  return lr_rank(d) ? 0 : cols;
}

size_t wire_bytes(train_dtype d, size_t rows, size_t cols) {
  if (lr_rank(d)) return wire_lr_bytes(lr_rank(d), lr_fbits(d), rows, cols);
  size_t per_row;
  switch (d) {
  case TRAIN_R5ROW:
  case TRAIN_R4ROW:
  case TRAIN_R3ROW:
  case TRAIN_R2ROW:
    per_row = wire_rot_row_bytes(rot_bits(d), cols);
    if (per_row == 0) return 0;
    break;
  case TRAIN_F32:
    if (cols > SIZE_MAX / 4) return 0;
    per_row = cols * 4;
    break;
  case TRAIN_BF16:
  case TRAIN_F16:
    if (cols > SIZE_MAX / 2) return 0;
    per_row = cols * 2;
    break;
  case TRAIN_Q8ROW:
    if (cols > SIZE_MAX - Q8_SCALE_BYTES) return 0;
    per_row = cols + Q8_SCALE_BYTES;
    break;
  default: return 0;
  }
  if (rows && per_row > SIZE_MAX / rows) return 0;
  return rows * per_row;
}

static const struct {
  const char *name;
  train_dtype d;
} names[] = {{"fp32", TRAIN_F32}, {"bf16", TRAIN_BF16}, {"fp16", TRAIN_F16}, {"int8", TRAIN_Q8ROW},
               {"rot5", TRAIN_R5ROW}, {"rot4", TRAIN_R4ROW}, {"rot3", TRAIN_R3ROW}, {"rot2", TRAIN_R2ROW},
               {"lr8", TRAIN_LR8},    {"lr16", TRAIN_LR16},  {"lr32", TRAIN_LR32},
               {"lr16r4", TRAIN_LR16R4}, {"lr32r4", TRAIN_LR32R4}};

int wire_dtype_parse(const char *s, train_dtype *out) {
  for (size_t i = 0; s && i < sizeof(names) / sizeof(names[0]); i++)
    if (strcmp(s, names[i].name) == 0) {
      *out = names[i].d;
      return 0;
    }
  return GW_EINVAL;
}

int wire_pair_parse(const char *s, train_dtype *act, train_dtype *grad) {
  if (!s) return GW_EINVAL;
  const char *slash = strchr(s, '/');
  if (!slash) {
    if (wire_dtype_parse(s, act) != 0) return GW_EINVAL;
    *grad = *act;
    return 0;
  }
  char word[8];
  size_t n = (size_t)(slash - s);
  if (n == 0 || n >= sizeof(word)) return GW_EINVAL;
  memcpy(word, s, n);
  word[n] = 0;
  train_dtype a, g;
  if (wire_dtype_parse(word, &a) != 0 || wire_dtype_parse(slash + 1, &g) != 0) return GW_EINVAL;
  *act = a;
  *grad = g;
  return 0;
}

const char *wire_dtype_name(train_dtype d) {
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (names[i].d == d) return names[i].name;
  return "?";
}

int wire_mask_parse(const char *s, uint32_t *out) {
  uint32_t m = WIRE_BIT(TRAIN_F32);
  if (!s || !*s) return GW_EINVAL;
  while (*s) {
    const char *comma = strchr(s, ',');
    size_t n = comma ? (size_t)(comma - s) : strlen(s);
    char word[8];
    if (n == 0 || n >= sizeof(word)) return GW_EINVAL;
    memcpy(word, s, n);
    word[n] = 0;
    train_dtype d;
    if (wire_dtype_parse(word, &d) != 0) return GW_EINVAL;
    m |= WIRE_BIT(d);
    s += n + (comma ? 1 : 0);
    if (comma && !*s) return GW_EINVAL; /* trailing comma */
  }
  *out = m;
  return 0;
}

/* ---- int8 with a scale per row ---- */

static void q8_encode_row(const float *x, size_t cols, uint8_t *out) {
  float m = 0.0f;
  for (size_t j = 0; j < cols; j++) {
    float a = fabsf(x[j]);
    if (a <= FLT_MAX && a > m) m = a; /* NaN and Inf do not set the scale */
  }
  memcpy(out, &m, sizeof(m));
  int8_t *q = (int8_t *)(out + Q8_SCALE_BYTES);
  /* In double: 127/m stays finite even for a subnormal m, and the sum with
   * 1.5 x 2^52 rounds v to an integer, to nearest even, in the FPU. */
  double inv = m > 0.0f ? 127.0 / (double)m : 0.0;
  const double magic = 6755399441055744.0;
  for (size_t j = 0; j < cols; j++) {
    float a = fabsf(x[j]);
    double v = (double)x[j] * inv;
    v = (v + magic) - magic;
    if (v > 127.0) v = 127.0; /* |x| <= m: only a last-bit excess could land here */
    if (v < -127.0) v = -127.0;
    q[j] = a <= FLT_MAX ? (int8_t)v : (int8_t)Q8_NONFINITE;
  }
}

static int q8_decode_row(const uint8_t *in, size_t cols, float *x) {
  float m;
  memcpy(&m, in, sizeof(m));
  if (!(m >= 0.0f && m <= FLT_MAX)) return GW_EPROTO; /* NaN, Inf or negative scale: not ours */
  const int8_t *q = (const int8_t *)(in + Q8_SCALE_BYTES);
  double step = (double)m / 127.0;
  for (size_t j = 0; j < cols; j++) x[j] = q[j] == Q8_NONFINITE ? NAN : (float)((double)q[j] * step);
  return 0;
}

/* ---- whole tensors ---- */

int wire_encode(train_dtype d, const float *src, size_t rows, size_t cols, void *dst, size_t dst_len) {
  size_t need = wire_bytes(d, rows, cols);
  if ((need == 0 && rows && cols) || dst_len != need || !wire_dtype_ok(d)) return GW_EINVAL;
  size_t n = rows * cols;
  switch (d) {
  case TRAIN_F32: memcpy(dst, src, n * sizeof(float)); break;
  case TRAIN_BF16: {
    uint16_t *o = dst;
    for (size_t i = 0; i < n; i++) o[i] = to_bf16(src[i]);
    break;
  }
  case TRAIN_F16: {
    uint16_t *o = dst;
    for (size_t i = 0; i < n; i++) o[i] = to_f16(src[i]);
    break;
  }
  case TRAIN_Q8ROW: {
    uint8_t *o = dst;
    for (size_t r = 0; r < rows; r++) q8_encode_row(src + r * cols, cols, o + r * (cols + Q8_SCALE_BYTES));
    break;
  }
  case TRAIN_R5ROW:
  case TRAIN_R4ROW:
  case TRAIN_R3ROW:
  case TRAIN_R2ROW: {
    unsigned b = rot_bits(d);
    size_t rb = wire_rot_row_bytes(b, cols);
    float *work = malloc((cols ? cols : 1) * sizeof(float));
    if (!work) return GW_ENOMEM;
    uint8_t *o = dst;
    for (size_t r = 0; r < rows; r++) wire_rot_encode_row(b, src + r * cols, cols, o + r * rb, work);
    free(work);
    break;
  }
  case TRAIN_LR8:
  case TRAIN_LR16:
  case TRAIN_LR32:
  case TRAIN_LR16R4:
  case TRAIN_LR32R4: {
    size_t sb = wire_lr_scratch(lr_rank(d), rows, cols);
    float *work = sb ? malloc(sb) : NULL;
    if (!work) return GW_ENOMEM;
    int rc = wire_lr_encode(lr_rank(d), lr_fbits(d), src, rows, cols, dst, work);
    free(work);
    return rc;
  }
  default: return GW_EINVAL;
  }
  return 0;
}

int wire_check(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols) {
  if (!wire_dtype_ok(d)) return GW_EINVAL;
  size_t need = wire_bytes(d, rows, cols);
  if ((need == 0 && rows && cols) || src_len != need) return GW_EPROTO;
  if (lr_rank(d)) return wire_lr_check(lr_rank(d), lr_fbits(d), src, src_len, rows, cols);
  if (rot_bits(d)) {
    size_t rb = wire_rot_row_bytes(rot_bits(d), cols);
    for (size_t r = 0; r < rows; r++)
      if (wire_rot_check_row(rot_bits(d), (const uint8_t *)src + r * rb, cols) != 0) return GW_EPROTO;
    return 0;
  }
  if (d != TRAIN_Q8ROW) return 0;
  const uint8_t *s = src;
  for (size_t r = 0; r < rows; r++) {
    float m;
    memcpy(&m, s + r * (cols + Q8_SCALE_BYTES), sizeof(m));
    if (!(m >= 0.0f && m <= FLT_MAX)) return GW_EPROTO;
  }
  return 0;
}

int wire_decode(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols, float *dst) {
  if (!wire_dtype_ok(d)) return GW_EINVAL;
  size_t need = wire_bytes(d, rows, cols);
  if ((need == 0 && rows && cols) || src_len != need) return GW_EPROTO;
  size_t n = rows * cols;
  switch (d) {
  case TRAIN_F32: memcpy(dst, src, n * sizeof(float)); break;
  case TRAIN_BF16: {
    /* memcpy per element: the payload follows a protobuf header in the
     * frame and need not be 2-byte aligned */
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      dst[i] = from_bf16(h);
    }
    break;
  }
  case TRAIN_F16: {
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, s + 2 * i, 2);
      dst[i] = from_f16(h);
    }
    break;
  }
  case TRAIN_Q8ROW: {
    const uint8_t *s = src;
    for (size_t r = 0; r < rows; r++)
      if (q8_decode_row(s + r * (cols + Q8_SCALE_BYTES), cols, dst + r * cols) != 0) return GW_EPROTO;
    break;
  }
  case TRAIN_R5ROW:
  case TRAIN_R4ROW:
  case TRAIN_R3ROW:
  case TRAIN_R2ROW: {
    const uint8_t *s = src;
    size_t rb = wire_rot_row_bytes(rot_bits(d), cols);
    for (size_t r = 0; r < rows; r++)
      if (wire_rot_decode_row(rot_bits(d), s + r * rb, cols, dst + r * cols) != 0) return GW_EPROTO;
    break;
  }
  case TRAIN_LR8:
  case TRAIN_LR16:
  case TRAIN_LR32:
  case TRAIN_LR16R4:
  case TRAIN_LR32R4: return wire_lr_decode(lr_rank(d), lr_fbits(d), src, src_len, rows, cols, dst);
  default: return GW_EINVAL;
  }
  return 0;
}
