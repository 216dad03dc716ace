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
 *   TRAIN_R5ROW, TRAIN_R4ROW, TRAIN_R3ROW, TRAIN_R2ROW   per row: a bf16
 *                scale, then 5, 4, 3 or 2 bits per element: the row rotated by a randomised
 *                Walsh-Hadamard transform and quantized to a unit Gaussian's
 *                Lloyd-Max levels (train/wire_rot.h). 7.8x, 10.2x and 15.1x
 *                fewer bytes than F32 at C = 128; relative squared error
 *                about 1 %, 3.5 %, 12 %, never above 100 %. A row with a
 *                non-finite element decodes to NaN. Shape on the wire
 *                [.., wire_shape_last(d, cols)] bytes.
 *   TRAIN_LR8, TRAIN_LR16, TRAIN_LR32   the whole tensor as its column mean
 *                plus a rank-8/16/32 factorisation U V^T, int8 factor rows
 *                (train/wire_lowrank.h): 32x, 18.3x, 9.85x fewer bytes at
 *                256 x 128. Not row by row: shape on the wire [bytes]. Made
 *                for gradients (--wire-dtype rot4/lr32): a truncated
 *                activation loses what tells its tokens apart.
 *   TRAIN_LR16R4, TRAIN_LR32R4   the same at rank 16 and 32 with rotated
 *                4-bit factor rows: 32x and 18.3x fewer bytes at 256 x 128
 *                (--wire-dtype rot5/lr16r4: 10.45x for the pair).
 * NaN stays NaN in every format (bf16/f16 keep its sign, quiet); +-Inf stays
 * +-Inf in bf16/f16.
 *
 * Decoding treats the bytes as hostile: the payload length must equal
 * exactly what rows x cols needs in that dtype (no read beyond it), sizes
 * are computed without overflow, and a Q8ROW row whose scale is negative,
 * NaN or infinite is refused (R*ROW: see train/wire_rot.h). The decoder
 * allocates nothing: the caller sizes the output from its own expected
 * shape, never from the header.
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
#define WIRE_ACCEPT_ALL                                                                                        \
  (WIRE_BIT(TRAIN_F32) | WIRE_BIT(TRAIN_BF16) | WIRE_BIT(TRAIN_F16) | WIRE_BIT(TRAIN_Q8ROW) |                    \
   WIRE_BIT(TRAIN_R4ROW) | WIRE_BIT(TRAIN_R3ROW) | WIRE_BIT(TRAIN_R2ROW) | WIRE_BIT(TRAIN_LR8) |              \
   WIRE_BIT(TRAIN_LR16) | WIRE_BIT(TRAIN_LR32) | WIRE_BIT(TRAIN_LR32R4) | WIRE_BIT(TRAIN_R5ROW) |             \
   WIRE_BIT(TRAIN_LR16R4))

/* Whether d is a wire dtype for activations (f32, bf16, f16, q8row,
 * r5/r4/r3/r2row, lr8/16/32, lr16r4/lr32r4). */
bool wire_dtype_ok(train_dtype d);
/* Bytes the encoded tensor takes; 0 for an unknown dtype or on overflow. */
size_t wire_bytes(train_dtype d, size_t rows, size_t cols);
/* The last dimension of the tensor's shape on the wire: cols for the
 * float formats, the bytes of one row for the byte formats (Q8ROW,
 * R*ROW), so that shape x element size = payload. 0 on overflow, and for
 * the LR* formats, which are not row by row (their shape is [bytes]). */
size_t wire_shape_last(train_dtype d, size_t cols);
/* The CLI names, for messages. */
#define WIRE_DTYPE_LIST "fp32, bf16, fp16, int8, rot5, rot4, rot3, rot2, lr8, lr16, lr32, lr16r4, lr32r4"

/* "fp32" | "bf16" | "fp16" | "int8" | "rot5" | "rot4" | "rot3" | "rot2" |
 * "lr8" | "lr16" | "lr32" | "lr16r4" | "lr32r4" (the CLI names). */
int wire_dtype_parse(const char *s, train_dtype *out);
/* "ACT" (both ways) or "ACT/GRAD": the dtype of the activations we send
 * forward and of the gradients we send backward (e.g. "rot4/lr8"). */
int wire_pair_parse(const char *s, train_dtype *act, train_dtype *grad);
const char *wire_dtype_name(train_dtype d);
/* A comma list of CLI names ("fp32,bf16"); fp32 is always included. */
int wire_mask_parse(const char *s, uint32_t *out);

/* Encodes rows x cols floats into dst (dst_len must be wire_bytes(...)).
 * GW_EINVAL for an unknown dtype or a wrong dst_len; GW_ENOMEM when the
 * R*ROW or LR* scratch cannot be allocated. */
int wire_encode(train_dtype d, const float *src, size_t rows, size_t cols, void *dst, size_t dst_len);
/* Decodes into dst (rows x cols floats). GW_EPROTO when src_len is not
 * exactly wire_bytes(d, rows, cols) or a row scale is invalid; GW_EINVAL for
 * an unknown dtype. dst is unspecified after a failure. */
int wire_decode(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols, float *dst);

/* What wire_decode would refuse, without decoding: the length, and for
 * Q8ROW and R*ROW every row's scale (R*ROW: and padding bits), for LR*
 * that every value is finite. 0 when the bytes decode. */
int wire_check(train_dtype d, const void *src, size_t src_len, size_t rows, size_t cols);

/* Single-element conversions (the encoders' kernels, exposed for tests). */
uint16_t wire_f32_to_bf16(float x);
float wire_bf16_to_f32(uint16_t h);
uint16_t wire_f32_to_f16(float x);
float wire_f16_to_f32(uint16_t h);

#endif
