/* train/wire_codec.h — how activations and activation gradients are packed
 * for the wire between pipeline stages (--wire-dtype).
 *
 * A tensor of `rows` x `cols` floats (an activation [B,T,C] is B*T rows of C)
 * becomes one of:
 *   TRAIN_F32    4 bytes per element, unchanged (the default, bit-exact);
 *   TRAIN_BF16   2 bytes: the top half of the float, rounded to nearest even
 *                (relative error <= 2^-8 for normal values);
 *   TRAIN_F16    2 bytes: IEEE binary16, rounded to nearest even (relative
 *                error <= 2^-11 from 2^-14 to 65504); magnitudes
 *                from 65520 up become +-Inf, below 2^-24 become (signed) zero;
 *   TRAIN_Q8ROW  per row: the row's largest magnitude m as a 4-byte float,
 *                then `cols` signed bytes q = round_even(x * 127 / m), so
 *                x' = q * m / 127 is within m/254 (half a step) of x. The
 *                byte -128 is never a value: it marks a non-finite element,
 *                which decodes to NaN (a NaN or Inf activation must stay
 *                non-finite so that the loss and the contribution checks see
 *                it; int8 cannot say which one it was). On the wire its shape
 *                is [.., cols + 4] bytes, so the frame's generic size check
 *                (shape x element size == payload) holds.
 * NaN stays NaN in every format (bf16/f16 keep its sign, quiet); +-Inf stays
 * +-Inf in bf16/f16.
 *
 * Decoding treats the bytes as hostile: the payload length must equal
 * exactly what rows x cols needs in that dtype (no read beyond it), sizes
 * are computed without overflow, and a Q8ROW row whose scale is negative,
 * NaN or infinite is refused. Nothing is allocated here: the caller sizes
 * the output from its own expected shape, never from the header.
 *
 * The loops are plain C over the whole buffer (inlined conversions, no call
 * per element) so the compiler can vectorise them. */
#ifndef GWTF_TRAIN_WIRE_CODEC_H
#define GWTF_TRAIN_WIRE_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/peer.h"

/* A set of wire dtypes: bit (1u << dtype). */
#define WIRE_BIT(d) (1u << (unsigned)(d))
/* Everything this build decodes. */
#define WIRE_ACCEPT_ALL (WIRE_BIT(TRAIN_F32) | WIRE_BIT(TRAIN_BF16) | WIRE_BIT(TRAIN_F16) | WIRE_BIT(TRAIN_Q8ROW))

/* Whether d is a wire dtype for activations (f32, bf16, f16, q8row). */
bool wire_dtype_ok(train_dtype d);
/* Bytes the encoded tensor takes; 0 for an unknown dtype or on overflow. */
size_t wire_bytes(train_dtype d, size_t rows, size_t cols);
/* "fp32" | "bf16" | "fp16" | "int8" (the CLI names). */
int wire_dtype_parse(const char *s, train_dtype *out);
const char *wire_dtype_name(train_dtype d);
/* A comma list of CLI names ("fp32,bf16"); fp32 is always included. */
int wire_mask_parse(const char *s, uint32_t *out);

/* Encodes rows x cols floats into dst (dst_len must be wire_bytes(...)).
 * GW_EINVAL for an unknown dtype or a wrong dst_len. */
int wire_encode(train_dtype d, const float *src, size_t rows, size_t cols, void *dst, size_t dst_len);
/* Decodes into dst (rows x cols floats). GW_EPROTO when src_len is not
 * exactly wire_bytes(d, rows, cols) or a row scale is invalid; GW_EINVAL for
 * an unknown dtype. dst is unspecified after a failure. */
int wire_decode(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols, float *dst);

/* What wire_decode would refuse, without decoding: the length, and for
 * Q8ROW every row's scale. 0 when the bytes decode. */
int wire_check(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols);

/* Single-element conversions (the encoders' kernels, exposed for tests). */
uint16_t wire_f32_to_bf16(float x);
float wire_bf16_to_f32(uint16_t h);
uint16_t wire_f32_to_f16(float x);
float wire_f16_to_f32(uint16_t h);

#endif
