/* train/wire_lowrank.h — a tensor sent as its column mean plus a rank-r
 * factorisation (--wire-dtype ACT/lr32r4, ACT/lr32 and lr8, lr16; the codec
 * behind TRAIN_LR8, TRAIN_LR16, TRAIN_LR32 and TRAIN_LR32R4 in
 * train/wire_codec.h).
 *
 * An activation gradient (or an activation) X of rows x cols (B*T tokens x
 * C) is sent as (host order, like every other wire format here):
 *   mu  cols bf16             the column mean
 *   V   cols factor rows      an orthonormal basis of the top-rank subspace
 *                             of the centred rows (X - 1 mu^T)
 *   U   rows factor rows      the centred rows' least-squares coordinates
 *                             in V' = V as sent: (X - 1 mu^T) V' M^-1,
 *                             M = V'^T V'
 * where a factor row (fbits) is either
 *   8: a bf16 scale m (its largest magnitude, rounded up) then rank int8
 *      values round(x 127 / m): 2 + rank bytes;
 *   4: one rotated 4-bit row of rank elements (train/wire_rot.h): 2 +
 *      rank / 2 bytes, about 1 % squared error per row.
 * The receiver rebuilds X' = 1 mu^T + U V'^T: the best rank-r fit to the
 * centred tensor up to the subspace's convergence and the factors' steps.
 * 2 cols + (rows + cols)(rank + 2) bytes with int8 rows: 32x / 18.3x /
 * 9.85x fewer than fp32 for rank 8 / 16 / 32 at rows 256, cols 128; at rows
 * 4096, cols 2048 512x / 292x / 157x. Rank 32 with 4-bit rows (lr32r4):
 * 18.3x at 256 x 128, 293x at 4096 x 2048.
 *
 * Why gradients: the gradient of the loss w.r.t. the last hidden state is
 * (softmax - onehot) W_head through the final norm, so a microbatch's rows
 * lie in at most vocab directions, and the stages' backward keeps them
 * there; in the tiny model rank 32 holds >= 99.8 % of every gradient's
 * energy (docs/TRAINING.md). Activations look low rank by energy too (rank
 * 8 holds 99.3 % after every stage), but training on truncated activations
 * fails: the small directions are what tells the tokens apart. Protocol
 * Models (arXiv 2506.01260) make the subspace a property of the
 * architecture; here it is found per microbatch and the model is unchanged.
 *
 * The subspace: G = Xc^T Xc (cols x cols), then WIRE_LR_ITERS steps of
 * orthogonal iteration from a fixed pseudo-random start (deterministic: the
 * same tensor always encodes to the same bytes). Cost per tensor about
 * rows cols^2 / 2 + ITERS cols^2 rank + 2 rows cols rank multiply-adds.
 *
 * A tensor with a NaN or Inf anywhere is sent as the marker: every mu is
 * WIRE_LR_NONFINITE, U and V are zero; it decodes to all NaN (the loss and
 * the contribution checks must see it; a factorisation cannot say where).
 *
 * Decoding is hostile-input safe: the length must be exactly
 * wire_lr_bytes(rank, fbits, rows, cols) (rank and fbits come from the dtype, the
 * shape from our own run), a mean that is Inf or NaN (except a complete
 * marker) or a factor scale that is negative, Inf or NaN is refused, a
 * marker tensor's factors must be zero, and the sums are taken in double
 * and clamped to +-FLT_MAX, so no accepted input decodes to Inf or NaN. */
#ifndef GWTF_TRAIN_WIRE_LOWRANK_H
#define GWTF_TRAIN_WIRE_LOWRANK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_LR_MAX_RANK 64
#define WIRE_LR_ITERS 6
#define WIRE_LR_NONFINITE 0x7fc0u /* bf16 quiet NaN in every mu: "this tensor was not finite" */

/* Bytes of one encoded tensor with factor rows of fbits (8 or 4); 0 for a
 * rank outside 1..WIRE_LR_MAX_RANK, another fbits, or on overflow. */
size_t wire_lr_bytes(size_t rank, unsigned fbits, size_t rows, size_t cols);
/* Bytes of scratch wire_lr_encode needs; 0 on overflow. */
size_t wire_lr_scratch(size_t rank, size_t rows, size_t cols);

/* Encodes x (rows x cols) into out (wire_lr_bytes bytes) using work
 * (wire_lr_scratch bytes). GW_EINVAL for a bad rank or size. */
int wire_lr_encode(size_t rank, unsigned fbits, const float *x, size_t rows, size_t cols, uint8_t *out, float *work);
/* 0 when `in` would decode; GW_EPROTO otherwise. */
int wire_lr_check(size_t rank, unsigned fbits, const uint8_t *in, size_t len, size_t rows, size_t cols);
/* Decodes into x (rows x cols). GW_EPROTO when the check fails. */
int wire_lr_decode(size_t rank, unsigned fbits, const uint8_t *in, size_t len, size_t rows, size_t cols, float *x);

#endif
