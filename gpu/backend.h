/* gpu/backend.h — the compute backends behind one interface.
 *
 * A backend owns a device (the CPU, or one CUDA GPU) and runs the kernels a
 * transformer stage needs, as llm.c-style *_forward / *_backward pairs. The
 * stage code in train/ is written once against this header; the CPU backend
 * (gpu/cpu_*.c, OpenBLAS + OpenMP) is always built and is the reference CI
 * runs, the CUDA backend (gpu/cuda_*.cu, cuBLAS + kernels) is built when CMake
 * finds nvcc (compile definition GWTF_HAVE_CUDA), as a module opened with
 * dlopen when it is chosen at run time with `--device cuda[:N]`.
 *
 * Conventions every backend follows (the CUDA author works from this list):
 *
 *  - Pointers handed to kernels are DEVICE pointers from gpu_alloc() (plain
 *    host memory for the CPU backend). Host data moves with gpu_upload /
 *    gpu_download only.
 *  - Everything is fp32 and row-major; integer tensors (tokens, targets) are
 *    int32. Matmuls run in full fp32: TF32 tensor cores round inputs to 10
 *    mantissa bits (~1e-3 relative), which the fixtures' 1e-4 would reject;
 *    a backend may offer TF32 as an explicit opt-in, never by default. A shape comment "(B,T,C)" means a contiguous array whose last
 *    index varies fastest. N always stands for B*T (rows of activations).
 *  - Linear weights use PyTorch's layout [out, in]: y = x @ W^T + b.
 *  - Dimensions are int (like llm.c); implementations compute offsets and
 *    element counts in size_t, because B*T*V or B*NH*T*T may exceed INT_MAX.
 *  - Gradient semantics are stated per kernel and are part of the contract:
 *      PARAMETER gradients (dweight, dbias, dwte, ...) are always ACCUMULATED
 *        (+=), so several microbatches sum into one gradient buffer;
 *      INPUT gradients are OVERWRITTEN (=) unless the kernel says
 *        "accumulated": the norms accumulate into dinp because their input is
 *        the residual stream, whose gradient already holds the skip path.
 *  - Kernels return void and may run asynchronously (queued on the backend's
 *    stream). The first failure is remembered and returned by the next
 *    gpu_sync / gpu_download; after that the backend is unusable.
 *    gpu_download waits for all queued work before it copies.
 *  - Results must be deterministic: the same inputs on the same device with
 *    the same thread count give bit-identical outputs and gradients (no
 *    atomics whose order varies; reductions in a fixed order).
 *  - A backend is used by one thread at a time (the node's compute worker).
 *
 * Numerical definitions (must match PyTorch fp32 within the fixture
 * tolerance, max abs error / max abs value <= 1e-4):
 *  - layernorm: mean and biased variance over C, eps inside the sqrt:
 *      rstd = 1/sqrt(var + eps), out = (x - mean) * rstd * w + b
 *  - rmsnorm: rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * w
 *  - gelu_tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *  - silu: x * sigmoid(x)
 *  - rope (rotate-half, theta given by the caller's table): for head dims
 *    i < hd/2, with x1 = x[i], x2 = x[i + hd/2], angle = t * theta^(-2i/hd):
 *      out[i] = x1 cos - x2 sin,  out[i + hd/2] = x2 cos + x1 sin
 *  - attention: per (b, head), S = Q K^T / sqrt(hd), causal mask (key t2 > t
 *    excluded), P = softmax(S) row-wise, out = P V.
 *  - cross-entropy: loss_i = logsumexp(logits_i) - logits_i[target_i].
 *  - adamw: PyTorch's torch.optim.AdamW (decoupled weight decay applied
 *    before the moment update, bias correction on both moments).
 */
#ifndef GWTF_GPU_BACKEND_H
#define GWTF_GPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices -------------------------------------------------------------- */

typedef enum gpu_kind { GPU_CPU = 0, GPU_CUDA = 1 } gpu_kind;

typedef struct gpu_device {
  gpu_kind kind;
  int index; /* CUDA device ordinal; 0 for the CPU */
} gpu_device;

#define GPU_DEVICE_STR_MAX (16)

/* Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Returns 0 or GW_EINVAL. */
int gpu_device_parse(const char *s, gpu_device *out);
/* Writes "cpu" or "cuda:N" into out (at least GPU_DEVICE_STR_MAX bytes). */
void gpu_device_format(const gpu_device *dev, char *out, size_t len);
/* True when the CUDA backend can be loaded: this build has it (a module,
 * gwtf-cuda.so, opened at run time) and the CUDA libraries it needs are
 * present. Whether a GPU is there is gpu_backend_open's answer. */
bool gpu_have_cuda(void);

/* ---- backends --------------------------------------------------------------- */

typedef struct gpu_backend gpu_backend;

/* Which build of the CPU kernels to run (x86-64: the SSE2 baseline or the
 * x86-64-v3 = AVX2 one); AUTO picks the best the CPU has. Tests use the
 * others to cover both. */
typedef enum gpu_cpu_kernels {
  GPU_CPU_KERNELS_AUTO = 0,
  GPU_CPU_KERNELS_BASELINE = 1,
  GPU_CPU_KERNELS_V3 = 2,
} gpu_cpu_kernels;

typedef struct gpu_options {
  /* CPU: threads for every kernel, sgemm included (one OpenMP team; see
   * gpu/cpu.h). 0 = the cores this process may run on. Ignored by CUDA. */
  int threads;
  gpu_cpu_kernels cpu_kernels; /* CPU only */
} gpu_options;

/* Opens a backend on dev. On failure returns a negative code and writes a
 * sentence for the user into err (if not NULL): GW_EUNSUPPORTED when the
 * binary has no CUDA backend, GW_ENOENT when no such GPU is present (with
 * the driver's reason). */
int gpu_backend_open(const gpu_device *dev, const gpu_options *opt, gpu_backend **out, char *err,
                     size_t err_len);
/* Waits for queued work, frees everything the backend allocated internally.
 * Buffers from gpu_alloc must have been freed before. NULL is a no-op. */
void gpu_backend_close(gpu_backend *be);

/* Hyperparameters of one AdamW update (see gpu_adamw_update). */
typedef struct gpu_adamw_args {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_scale; /* the update uses grad * grad_scale (1/microbatches) */
  long long step;   /* 1 for the first update; drives bias correction */
} gpu_adamw_args;

/* What a device is, for logs and MFU. */
typedef struct gpu_device_info {
  char name[96];     /* "Intel(R) Xeon(R) ...", "NVIDIA H100 80GB HBM3" */
  double peak_flops; /* dense peak FLOP/s of the math in use (fp32); 0 = unknown */
} gpu_device_info;

/* The kernel table. Every backend fills every entry. Shapes are in the
 * comments of the gpu_* wrappers below, which is what callers use. */
typedef struct gpu_ops {
  const char *name; /* "cpu", "cuda" */
  void (*close)(gpu_backend *be);
  /* memory */
  void *(*alloc)(gpu_backend *be, size_t bytes);
  void (*free)(gpu_backend *be, void *p);
  int (*upload)(gpu_backend *be, void *dst, const void *src_host, size_t bytes);
  int (*download)(gpu_backend *be, void *dst_host, const void *src, size_t bytes);
  void (*copy)(gpu_backend *be, void *dst, const void *src, size_t bytes);
  void (*zero)(gpu_backend *be, void *p, size_t bytes);
  int (*sync)(gpu_backend *be);
  int (*mem_info)(gpu_backend *be, size_t *free_bytes, size_t *total_bytes);
  int (*device_info)(gpu_backend *be, gpu_device_info *out);
  size_t (*attention_state_floats)(gpu_backend *be, int B, int T, int NH);
  /* kernels */
  void (*matmul_forward)(gpu_backend *be, float *out, const float *inp, const float *weight,
                         const float *bias, const float *residual, int N, int IC, int OC);
  void (*matmul_backward)(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int N, int IC,
                          int OC);
  void (*layernorm_forward)(gpu_backend *be, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, float eps);
  void (*layernorm_backward)(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C);
  void (*rmsnorm_forward)(gpu_backend *be, float *out, float *rstd, const float *inp,
                          const float *weight, int N, int C, float eps);
  void (*rmsnorm_backward)(gpu_backend *be, float *dinp, float *dweight, const float *dout,
                           const float *inp, const float *weight, const float *rstd, int N, int C);
  void (*gelu_forward)(gpu_backend *be, float *out, const float *inp, size_t n);
  void (*gelu_backward)(gpu_backend *be, float *dinp, const float *inp, const float *dout, size_t n);
  void (*swiglu_forward)(gpu_backend *be, float *out, const float *inp, int N, int F);
  void (*swiglu_backward)(gpu_backend *be, float *dinp, const float *dout, const float *inp, int N,
                          int F);
  void (*rope_forward)(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C, int NH);
  void (*rope_backward)(gpu_backend *be, float *dqkv, const float *freqs, int B, int T, int C,
                        int NH);
  void (*attention_forward)(gpu_backend *be, float *out, float *state, const float *qkv, int B,
                            int T, int C, int NH);
  void (*attention_backward)(gpu_backend *be, float *dqkv, const float *dout, const float *qkv,
                             const float *state, int B, int T, int C, int NH);
  void (*encoder_forward)(gpu_backend *be, float *out, const int32_t *tokens, const float *wte,
                          const float *wpe, int B, int T, int C);
  void (*encoder_backward)(gpu_backend *be, float *dwte, float *dwpe, const float *dout,
                           const int32_t *tokens, int B, int T, int C);
  void (*crossentropy_forward)(gpu_backend *be, float *losses, float *probs, const float *logits,
                               const int32_t *targets, int N, int V);
  void (*crossentropy_backward)(gpu_backend *be, float *dlogits, const float *probs,
                                const int32_t *targets, float dloss, int N, int V);
  void (*adamw_update)(gpu_backend *be, float *param, const float *grad, float *m, float *v,
                       size_t n, const gpu_adamw_args *a);
} gpu_ops;

/* Every backend starts with these fields; implementations embed it first. */
struct gpu_backend {
  const gpu_ops *ops;
  gpu_device dev;
  int threads; /* CPU: threads in use; CUDA: 0 */
};

/* ---- memory --------------------------------------------------------------- */

/* Device memory, not initialised, aligned to at least 64 bytes. NULL when
 * out of memory (bytes == 0 returns a valid pointer to free). */
static inline void *gpu_alloc(gpu_backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }
static inline void gpu_free(gpu_backend *be, void *p) {
  if (p) be->ops->free(be, p);
}
/* Host -> device. Synchronous with respect to the host buffer: it may be
 * reused when the call returns. Returns 0 or a negative code. */
static inline int gpu_upload(gpu_backend *be, void *dst, const void *src_host, size_t bytes) {
  return be->ops->upload(be, dst, src_host, bytes);
}
/* Device -> host, after all queued work. Returns 0 or the first error of any
 * kernel queued since the last check. */
static inline int gpu_download(gpu_backend *be, void *dst_host, const void *src, size_t bytes) {
  return be->ops->download(be, dst_host, src, bytes);
}
/* Device -> device, queued. Regions must not overlap. */
static inline void gpu_copy(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  be->ops->copy(be, dst, src, bytes);
}
/* Sets bytes to zero, queued. */
static inline void gpu_zero(gpu_backend *be, void *p, size_t bytes) { be->ops->zero(be, p, bytes); }
/* Waits for all queued work; returns 0 or the first kernel error. */
static inline int gpu_sync(gpu_backend *be) { return be->ops->sync(be); }
/* Free and total device memory in bytes (CPU: MemAvailable / MemTotal). */
static inline int gpu_mem_info(gpu_backend *be, size_t *free_bytes, size_t *total_bytes) {
  return be->ops->mem_info(be, free_bytes, total_bytes);
}

/* Device name and peak throughput (the CUDA backend knows the peak of the
 * GPUs it has a table entry for; the CPU reports 0 = unknown). */
static inline int gpu_device_info_get(gpu_backend *be, gpu_device_info *out) {
  return be->ops->device_info(be, out);
}

/* ---- kernels ------------------------------------------------------------------ */

/* out (N,OC) = residual (N,OC) + inp (N,IC) @ weight^T + bias
 *   weight (OC,IC), bias (OC) or NULL, residual (N,OC) or NULL (= zeros).
 *   residual may equal out (accumulate in place); otherwise no aliasing.
 * The residual operand lets a block add its skip connection inside the
 * matmul (beta = 1) instead of in a separate pass. */
static inline void gpu_matmul_forward(gpu_backend *be, float *out, const float *inp,
                                      const float *weight, const float *bias, const float *residual,
                                      int N, int IC, int OC) {
  be->ops->matmul_forward(be, out, inp, weight, bias, residual, N, IC, OC);
}

/* Backward of gpu_matmul_forward (the residual's gradient is dout itself and
 * is the caller's business):
 *   dinp (N,IC)     = dout @ weight            OVERWRITTEN; NULL to skip
 *   dweight (OC,IC) += dout^T @ inp            accumulated
 *   dbias (OC)      += sum over rows of dout   accumulated; NULL to skip
 *   dout (N,OC), inp (N,IC), weight (OC,IC). */
static inline void gpu_matmul_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                                       const float *dout, const float *inp, const float *weight,
                                       int N, int IC, int OC) {
  be->ops->matmul_backward(be, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

/* LayerNorm over the last dim. inp (N,C), weight (C), bias (C);
 * out (N,C), mean (N), rstd (N) written (mean and rstd are saved for backward). */
static inline void gpu_layernorm_forward(gpu_backend *be, float *out, float *mean, float *rstd,
                                         const float *inp, const float *weight, const float *bias,
                                         int N, int C, float eps) {
  be->ops->layernorm_forward(be, out, mean, rstd, inp, weight, bias, N, C, eps);
}

/* dinp (N,C) += d/dinp       ACCUMULATED (inp is the residual stream)
 * dweight (C), dbias (C) +=  accumulated
 *   dout (N,C), inp (N,C) and mean/rstd (N) from the forward. */
static inline void gpu_layernorm_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                                          const float *dout, const float *inp, const float *weight,
                                          const float *mean, const float *rstd, int N, int C) {
  be->ops->layernorm_backward(be, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

/* RMSNorm over the last dim. inp (N,C), weight (C); out (N,C), rstd (N). */
static inline void gpu_rmsnorm_forward(gpu_backend *be, float *out, float *rstd, const float *inp,
                                       const float *weight, int N, int C, float eps) {
  be->ops->rmsnorm_forward(be, out, rstd, inp, weight, N, C, eps);
}

/* dinp (N,C) += ...  ACCUMULATED;  dweight (C) += ...  accumulated. */
static inline void gpu_rmsnorm_backward(gpu_backend *be, float *dinp, float *dweight,
                                        const float *dout, const float *inp, const float *weight,
                                        const float *rstd, int N, int C) {
  be->ops->rmsnorm_backward(be, dinp, dweight, dout, inp, weight, rstd, N, C);
}

/* out (n) = gelu_tanh(inp (n)). out may equal inp. */
static inline void gpu_gelu_forward(gpu_backend *be, float *out, const float *inp, size_t n) {
  be->ops->gelu_forward(be, out, inp, n);
}
/* dinp (n) = gelu_tanh'(inp) * dout   OVERWRITTEN; dinp may equal dout. */
static inline void gpu_gelu_backward(gpu_backend *be, float *dinp, const float *inp,
                                     const float *dout, size_t n) {
  be->ops->gelu_backward(be, dinp, inp, dout, n);
}

/* SwiGLU on a fused gate|up activation:
 *   inp (N,2F): columns [0,F) are gate, [F,2F) are up (one matmul against
 *   the gate and up weights stacked as a (2F,C) matrix);
 *   out (N,F) = silu(gate) * up. */
static inline void gpu_swiglu_forward(gpu_backend *be, float *out, const float *inp, int N, int F) {
  be->ops->swiglu_forward(be, out, inp, N, F);
}
/* dinp (N,2F) OVERWRITTEN: dgate = dout * up * silu'(gate), dup = dout * silu(gate).
 *   dout (N,F), inp (N,2F) from the forward. */
static inline void gpu_swiglu_backward(gpu_backend *be, float *dinp, const float *dout,
                                       const float *inp, int N, int F) {
  be->ops->swiglu_backward(be, dinp, dout, inp, N, F);
}

/* RoPE in place on the q and k thirds of qkv (B,T,3C) (layout as for
 * attention below; v is untouched). Head h of q is qkv[b,t, h*hd .. h*hd+hd),
 * of k qkv[b,t, C + h*hd ..). freqs (T_max, hd/2, 2) holds (cos, sin) of
 * angle t * theta^(-2i/hd), computed by the caller on the host in double
 * precision and uploaded once; rows 0..T-1 are used (position = index t). */
static inline void gpu_rope_forward(gpu_backend *be, float *qkv, const float *freqs, int B, int T,
                                    int C, int NH) {
  be->ops->rope_forward(be, qkv, freqs, B, T, C, NH);
}
/* The transpose rotation, in place on the q and k thirds of dqkv (B,T,3C):
 *   d1 = g1 cos + g2 sin,  d2 = g2 cos - g1 sin. */
static inline void gpu_rope_backward(gpu_backend *be, float *dqkv, const float *freqs, int B, int T,
                                     int C, int NH) {
  be->ops->rope_backward(be, dqkv, freqs, B, T, C, NH);
}

/* Floats of backend-private attention state that attention_forward saves
 * for backward (CPU: the probabilities, B*NH*T*T; a flash-style backend may
 * keep only B*NH*T log-sum-exps). */
static inline size_t gpu_attention_state_floats(gpu_backend *be, int B, int T, int NH) {
  return be->ops->attention_state_floats(be, B, T, NH);
}

/* Causal multi-head self-attention.
 *   qkv (B,T,3C): q | k | v along the last dim, each (NH, hd), hd = C/NH.
 *   out (B,T,C): heads concatenated, out[b,t,h*hd + i].
 *   state: gpu_attention_state_floats(B,T,NH) floats, written.
 * scale 1/sqrt(hd); position t attends to keys 0..t. */
static inline void gpu_attention_forward(gpu_backend *be, float *out, float *state,
                                         const float *qkv, int B, int T, int C, int NH) {
  be->ops->attention_forward(be, out, state, qkv, B, T, C, NH);
}
/* dqkv (B,T,3C) OVERWRITTEN with d/dq | d/dk | d/dv.
 *   dout (B,T,C); qkv and state as saved by the forward. */
static inline void gpu_attention_backward(gpu_backend *be, float *dqkv, const float *dout,
                                          const float *qkv, const float *state, int B, int T, int C,
                                          int NH) {
  be->ops->attention_backward(be, dqkv, dout, qkv, state, B, T, C, NH);
}

/* Token (+ position) embedding.
 *   tokens (B,T) int32 in [0,V) (the caller validates them on the host);
 *   wte (V,C); wpe (T_max,C) or NULL (llama: no learned positions);
 *   out (B,T,C) = wte[tokens[b,t]] + wpe[t]. */
static inline void gpu_encoder_forward(gpu_backend *be, float *out, const int32_t *tokens,
                                       const float *wte, const float *wpe, int B, int T, int C) {
  be->ops->encoder_forward(be, out, tokens, wte, wpe, B, T, C);
}
/* dwte (V,C) += scatter of dout rows by token; dwpe (T_max,C) += sum over
 * b of dout[b,t] (NULL to skip). Both accumulated, in a deterministic order. */
static inline void gpu_encoder_backward(gpu_backend *be, float *dwte, float *dwpe,
                                        const float *dout, const int32_t *tokens, int B, int T,
                                        int C) {
  be->ops->encoder_backward(be, dwte, dwpe, dout, tokens, B, T, C);
}

/* Softmax cross-entropy, fused.
 *   logits (N,V); targets (N) int32 in [0,V);
 *   probs (N,V) = softmax(logits) (probs may equal logits: in place);
 *   losses (N) = -log softmax(logits)[target], computed from the
 *   log-sum-exp so that it stays finite for confident predictions. */
static inline void gpu_crossentropy_forward(gpu_backend *be, float *losses, float *probs,
                                            const float *logits, const int32_t *targets, int N,
                                            int V) {
  be->ops->crossentropy_forward(be, losses, probs, logits, targets, N, V);
}
/* dlogits (N,V) = (probs - onehot(target)) * dloss   OVERWRITTEN; may equal
 * probs. dloss is d(total loss)/d(loss_i), the same for every row (1/N for
 * a mean). */
static inline void gpu_crossentropy_backward(gpu_backend *be, float *dlogits, const float *probs,
                                             const int32_t *targets, float dloss, int N, int V) {
  be->ops->crossentropy_backward(be, dlogits, probs, targets, dloss, N, V);
}

/* One AdamW step over n elements, in place on param, m, v; per element:
 *   g = grad * grad_scale
 *   param -= lr * weight_decay * param
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   param -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * (torch.optim.AdamW's formula, including where eps goes). */
static inline void gpu_adamw_update(gpu_backend *be, float *param, const float *grad, float *m,
                                    float *v, size_t n, const gpu_adamw_args *a) {
  be->ops->adamw_update(be, param, grad, m, v, n, a);
}

#ifdef __cplusplus
}
#endif

#endif
