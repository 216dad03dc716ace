/* gpu/cpu.h — internals of the CPU backend (OpenBLAS + OpenMP), shared by
 * gpu/cpu_*.c only.
 *
 * Threading: one OpenMP team of be->threads threads does all the work.
 * Every region names its thread count (num_threads), so the backend never
 * touches the process-wide OpenMP default. OpenBLAS is set to one thread
 * (gpu_cpu_open): large products are split by rows across the team, each
 * thread calling a single-threaded sgemm, and attention calls sgemm from
 * every thread, one head each. Two pools (OpenBLAS's pthreads and OpenMP's)
 * would spin-wait against each other for the same cores.
 *
 * Determinism: reductions over rows (dweight, dbias of the norms, ...) sum
 * fixed-size row chunks into per-chunk partials and then add the partials in
 * chunk order, and sgemm never splits its inner dimension, so the result
 * does not depend on the thread count at all; the rest is element-wise or
 * row-wise. */
#ifndef GWTF_GPU_CPU_H
#define GWTF_GPU_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpu/backend.h"

typedef struct gpu_cpu {
  gpu_backend base;
  gpu_ops ops;     /* this instance's table: kernels in the variant for this CPU */
  const char *isa; /* "x86-64-v3" or "baseline" */
  int err;         /* first kernel failure (GW_ENOMEM from scratch), sticky */
  float *scratch;  /* grows on demand; one kernel at a time uses it */
  size_t scratch_floats;
} gpu_cpu;

static inline gpu_cpu *gpu_cpu_of(gpu_backend *be) { return (gpu_cpu *)be; }

/* Scratch space of at least n floats, or NULL (and the sticky error set).
 * Valid until the next call; kernels take it once at the start. */
float *gpu_cpu_scratch(gpu_cpu *c, size_t n);

/* Rows per chunk in deterministic row reductions (see above). */
#define GPU_CPU_ROW_CHUNK (32)

/* Below this much work (in floats touched, or multiply-adds / 64 for
 * matrix products) a kernel runs on one thread: waking a team costs a few
 * microseconds when the cores are idle and far more when another process
 * holds one of them, which small models (tiny: 16K-float activations)
 * would pay on every kernel. */
#define GPU_CPU_PARALLEL_MIN ((size_t)1 << 15)

/* Threads for a kernel that touches `work` floats. */
static inline int gpu_cpu_team(const gpu_backend *be, size_t work) {
  return work < GPU_CPU_PARALLEL_MIN ? 1 : be->threads;
}

/* The kernels fill their gpu_ops entries (semantics in gpu/backend.h).
 * gpu/cpu_blas.c and gpu/cpu_kernels.c are compiled twice: as is, and as
 * gpu/cpu_*_v3.c with -march=x86-64-v3 (AVX2) and GPU_CPU_V3 defined,
 * which renames these two functions; gpu_cpu_open picks the v3 set when
 * the CPU has it. Both sets compute element-wise results bit for bit alike
 * (ISO C mode: no FMA contraction), so the optimizer step is the same on
 * every machine; row sums may round differently between the two. */
#ifdef GPU_CPU_V3
#define GPU_CPU_FN(name) gpu_cpu_v3_##name
#else
#define GPU_CPU_FN(name) gpu_cpu_##name
#endif
void gpu_cpu_fill_blas(gpu_ops *ops);
void gpu_cpu_fill_kernels(gpu_ops *ops);
void gpu_cpu_v3_fill_blas(gpu_ops *ops);
void gpu_cpu_v3_fill_kernels(gpu_ops *ops);

/* ---- vectorisable math ----------------------------------------------------
 * libm's expf is a function call the compiler cannot vectorise; these are
 * branch-free so loops over them become SIMD. exp: Cody-Waite range
 * reduction and a degree-6 polynomial (Cephes), relative error ~2e-7 over
 * the clamped range, far inside the 1e-4 we check against PyTorch.
 *
 * The clamp to [-80, 80] keeps every intermediate and the result normal:
 * near the float limit (-87) the result is subnormal, and subnormal
 * arithmetic costs ~100 cycles per operation on x86 (we measured the
 * vectorised GELU 8x slower with a -87 clamp). e^-80 = 1.8e-35 is zero for
 * every use here (softmax, sigmoid). */

static inline float gpu_cpu_expf(float x) {
  x = x < -80.0f ? -80.0f : x;
  x = x > 80.0f ? 80.0f : x;
  /* n = round(x / ln2), by the 1.5 * 2^23 trick (exact for |n| < 2^22). */
  float z = x * 1.44269504088896341f + 12582912.0f;
  uint32_t zi; /* unsigned: a NaN's bits would overflow a signed shift (UB) */
  memcpy(&zi, &z, sizeof(zi));
  float n = z - 12582912.0f;
  float f = x - n * 0.693359375f; /* ln2 split in two for an exact product */
  f = f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  float y = p * f * f + f + 1.0f;
  /* 2^n from the low bits of z, which hold n + 0x400000 after the trick.
   * A NaN x gives some scale, and y is NaN: NaN in, NaN out. */
  uint32_t e = (zi - 0x4B400000u + 127u) << 23;
  float scale;
  memcpy(&scale, &e, sizeof(scale));
  return y * scale;
}

/* 1 / (1 + exp(-x)) */
static inline float gpu_cpu_sigmoidf(float x) { return 1.0f / (1.0f + gpu_cpu_expf(-x)); }

#endif
