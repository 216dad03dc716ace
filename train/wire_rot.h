/* train/wire_rot.h — rotated low-bit quantization of activation rows
 * (--wire-dtype rot5 | rot4 | rot3 | rot2; the codec behind TRAIN_R5ROW,
 * TRAIN_R4ROW, TRAIN_R3ROW, TRAIN_R2ROW in train/wire_codec.h).
 *
 * A row x of C floats is sent as
 *   [scale: bf16, 2 bytes][C codes of `bits` bits, packed LSB first]
 * where, with s = rms(x), D a fixed +-1 diagonal and H the Walsh-Hadamard
 * matrix of the row's block size n (the largest power of two dividing C,
 * at most WIRE_ROT_MAX_BLOCK; the row is rotated block by block):
 *   u = H D x / (s sqrt(n))        the rotated row, unit mean square
 *   q_j = the Lloyd-Max level of a unit Gaussian nearest to u_j
 *   scale = s g, g = <u, c(q)> / |c(q)|^2   (least squares gain)
 * and the receiver rebuilds x' = D H (scale c(q)) / sqrt(n).
 *
 * Why a rotation: activations have a few large coordinates per row (the
 * residual stream's outlier dimensions), which make a per-row int4/int3
 * grid coarse for everything else. After H D, every coordinate is a mix of
 * the whole block, close to Gaussian, and the Gaussian-optimal levels fit.
 * Expected relative squared error (|x - x'|^2 / |x|^2) on Gaussian rows:
 * 0.0025 (5 bits), 0.0095 (4), 0.035 (3), 0.12 (2). Hard bound for any finite row:
 * |x - x'| <= |x| (1 + 2^-8): the gain is a least-squares fit, never worse
 * than sending zero, and the bf16 scale adds its half ulp.
 *
 * A row with a NaN or Inf cannot be rotated (it would smear into every
 * element): its scale is the marker WIRE_ROT_NONFINITE and its codes zero;
 * it decodes to a row of NaN, so the loss and the contribution checks still
 * see it. A zero row has scale 0 and decodes to zeros.
 *
 * Decoding is hostile-input safe: a scale that is negative, Inf or a NaN
 * other than the marker is refused, as are padding bits that are not zero
 * (our encoder writes zeros), and a marker row whose codes are not zero.
 * Any code is a valid level, so the decoded magnitude is bounded by the
 * scale (|x'_j| <= sqrt(n) * 3.27 * scale, clamped to FLT_MAX). */
#ifndef GWTF_TRAIN_WIRE_ROT_H
#define GWTF_TRAIN_WIRE_ROT_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_ROT_SCALE_BYTES 2
#define WIRE_ROT_NONFINITE 0x7fc0u /* bf16 quiet NaN: "this row was not finite" */
#define WIRE_ROT_MAX_BLOCK 4096

/* Bytes of one encoded row (bits 2..5); 0 on overflow or bad bits. */
size_t wire_rot_row_bytes(unsigned bits, size_t cols);
/* The rotation's block size for a row of cols (a power of two, >= 1). */
size_t wire_rot_block(size_t cols);

/* Encodes one row into out (wire_rot_row_bytes bytes). work: cols floats
 * of scratch. */
void wire_rot_encode_row(unsigned bits, const float *x, size_t cols, uint8_t *out, float *work);
/* 0 when `in` (one row) would decode; GW_EPROTO otherwise. */
int wire_rot_check_row(unsigned bits, const uint8_t *in, size_t cols);
/* Decodes one checked row into x (cols floats). GW_EPROTO on a bad row. */
int wire_rot_decode_row(unsigned bits, const uint8_t *in, size_t cols, float *x);

#endif
