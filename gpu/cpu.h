/* gpu/cpu.h — internals of the CPU backend (OpenBLAS + OpenMP), shared by
 * gpu/cpu_*.c only.
 *
 * Threading: every OpenMP region names its thread count (num_threads) so
 * the backend never touches the process-wide OpenMP default; OpenBLAS gets
 * the same count through openblas_set_num_threads, except inside regions
 * that call sgemm from every thread (attention), which run with OpenBLAS at
 * one thread so the two pools do not oversubscribe the cores.
 *
 * Determinism: reductions over rows (dweight, dbias of the norms, ...) sum
 * fixed-size row chunks into per-chunk partials and then add the partials in
 * chunk order, so the result does not depend on the thread count at all;
 * the rest is element-wise or row-wise. */
#ifndef GWTF_GPU_CPU_H
#define GWTF_GPU_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpu/backend.h"

typedef struct gpu_cpu {
  gpu_backend base;
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

/* Kernels, one per gpu_ops entry (semantics in gpu/backend.h). */
void gpu_cpu_matmul_forward(gpu_backend *be, float *out, const float *inp, const float *weight,
                            const float *bias, const float *residual, int N, int IC, int OC);
void gpu_cpu_matmul_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int N, int IC,
                             int OC);
size_t gpu_cpu_attention_state_floats(gpu_backend *be, int B, int T, int NH);
void gpu_cpu_attention_forward(gpu_backend *be, float *out, float *state, const float *qkv, int B,
                               int T, int C, int NH);
void gpu_cpu_attention_backward(gpu_backend *be, float *dqkv, const float *dout, const float *qkv,
                                const float *state, int B, int T, int C, int NH);
void gpu_cpu_layernorm_forward(gpu_backend *be, float *out, float *mean, float *rstd,
                               const float *inp, const float *weight, const float *bias, int N,
                               int C, float eps);
void gpu_cpu_layernorm_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                                const float *dout, const float *inp, const float *weight,
                                const float *mean, const float *rstd, int N, int C);
void gpu_cpu_rmsnorm_forward(gpu_backend *be, float *out, float *rstd, const float *inp,
                             const float *weight, int N, int C, float eps);
void gpu_cpu_rmsnorm_backward(gpu_backend *be, float *dinp, float *dweight, const float *dout,
                              const float *inp, const float *weight, const float *rstd, int N,
                              int C);
void gpu_cpu_gelu_forward(gpu_backend *be, float *out, const float *inp, size_t n);
void gpu_cpu_gelu_backward(gpu_backend *be, float *dinp, const float *inp, const float *dout,
                           size_t n);
void gpu_cpu_swiglu_forward(gpu_backend *be, float *out, const float *inp, int N, int F);
void gpu_cpu_swiglu_backward(gpu_backend *be, float *dinp, const float *dout, const float *inp,
                             int N, int F);
void gpu_cpu_rope_forward(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C,
                          int NH);
void gpu_cpu_rope_backward(gpu_backend *be, float *dqkv, const float *freqs, int B, int T, int C,
                           int NH);
void gpu_cpu_encoder_forward(gpu_backend *be, float *out, const int32_t *tokens, const float *wte,
                             const float *wpe, int B, int T, int C);
void gpu_cpu_encoder_backward(gpu_backend *be, float *dwte, float *dwpe, const float *dout,
                              const int32_t *tokens, int B, int T, int C);
void gpu_cpu_crossentropy_forward(gpu_backend *be, float *losses, float *probs, const float *logits,
                                  const int32_t *targets, int N, int V);
void gpu_cpu_crossentropy_backward(gpu_backend *be, float *dlogits, const float *probs,
                                   const int32_t *targets, float dloss, int N, int V);
void gpu_cpu_adamw_update(gpu_backend *be, float *param, const float *grad, float *m, float *v,
                          size_t n, const gpu_adamw_args *a);

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
  int32_t zi;
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
  /* 2^n from the low bits of z, which hold n + 0x400000 after the trick. */
  int32_t e = (zi - 0x4B400000 + 127) << 23;
  float scale;
  memcpy(&scale, &e, sizeof(scale));
  return y * scale;
}

/* 1 / (1 + exp(-x)) */
static inline float gpu_cpu_sigmoidf(float x) { return 1.0f / (1.0f + gpu_cpu_expf(-x)); }

#endif
