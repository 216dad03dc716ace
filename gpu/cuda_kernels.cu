/* gpu/cuda_kernels.cu — the CUDA kernels that are not matrix products: norms,
 * activations, RoPE, embedding, cross-entropy, AdamW. One kernel per job;
 * row-wise work is one warp per row, element-wise work a grid-stride loop
 * with size_t indices (B*T*V passes INT_MAX). Semantics: gpu/backend.h. */
#include <math.h>

#include "gpu/cuda_common.cuh"
#include "util/err.h"

__global__ void gpu_cuda_colsum_finish_kernel(float *dst0, float *dst1, const float2 *partial,
                                              int chunks, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float2 s = partial[c];
  for (int ch = 1; ch < chunks; ch++) {
    float2 p = partial[(size_t)ch * C + c];
    s.x += p.x;
    s.y += p.y;
  }
  dst0[c] += s.x;
  if (dst1) dst1[c] += s.y;
}

/* The common guard of row kernels: N rows of C. */
static bool rows_ok(gpu_cuda *g, int N, int C, const char *what) {
  return gpu_cuda_require(g, N >= 0 && C > 0, what);
}

/* ---- layernorm ---------------------------------------------------------------------- */

/* One warp per row. inp, out (N,C); mean, rstd (N). */
__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int N, int C, float eps) {
  size_t row = gpu_cuda_warp_row();
  if (row >= (size_t)N) return;
  int lane = threadIdx.x % GPU_CUDA_WARP;
  const float *x = inp + row * C;
  float *o = out + row * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) sum += x[i];
  float m = gpu_cuda_warp_sum(sum) / (float)C;
  float var = 0.0f;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) {
    float d = x[i] - m;
    var += d * d;
  }
  float s = 1.0f / sqrtf(gpu_cuda_warp_sum(var) / (float)C + eps);
  for (int i = lane; i < C; i += GPU_CUDA_WARP) o[i] = (x[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

/* dinp (N,C) += s (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) s.
 * One warp per row; the weight and bias gradients are column sums (below). */
__global__ static void layernorm_backward_kernel(float *dinp, const float *dout, const float *inp,
                                                 const float *weight, const float *mean,
                                                 const float *rstd, int N, int C) {
  size_t row = gpu_cuda_warp_row();
  if (row >= (size_t)N) return;
  int lane = threadIdx.x % GPU_CUDA_WARP;
  const float *x = inp + row * C, *dy = dout + row * C;
  float *dx = dinp + row * C;
  float m = mean[row], s = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) {
    float g = dy[i] * weight[i], xhat = (x[i] - m) * s;
    a += g;
    b += g * xhat;
  }
  a = gpu_cuda_warp_sum(a) / (float)C;
  b = gpu_cuda_warp_sum(b) / (float)C;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) {
    float xhat = (x[i] - m) * s;
    dx[i] += (dy[i] * weight[i] - a - xhat * b) * s;
  }
}

/* (dy xhat, dy) of element (r, c): dweight and dbias of layernorm. */
struct gpu_cuda_term_layernorm {
  const float *dout, *inp, *mean, *rstd;
  int C;
  __device__ float2 operator()(int r, int c) const {
    size_t i = (size_t)r * C + c;
    return make_float2(dout[i] * (inp[i] - mean[r]) * rstd[r], dout[i]);
  }
};

void gpu_cuda_layernorm_forward(gpu_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *weight, const float *bias, int N,
                                int C, float eps) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, C, "layernorm_forward") || N == 0) return;
  layernorm_forward_kernel<<<gpu_cuda_row_grid(N), GPU_CUDA_THREADS, 0, g->stream>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
  gpu_cuda_launched(g, "layernorm_forward");
}

void gpu_cuda_layernorm_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, C, "layernorm_backward") || N == 0) return;
  layernorm_backward_kernel<<<gpu_cuda_row_grid(N), GPU_CUDA_THREADS, 0, g->stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  gpu_cuda_launched(g, "layernorm_backward");
  gpu_cuda_colsum(g, dweight, dbias, gpu_cuda_term_layernorm{dout, inp, mean, rstd, C}, N, C,
                  "layernorm_backward: dweight, dbias");
}

/* ---- rmsnorm ------------------------------------------------------------------------ */

/* One warp per row. out = x s w, s = 1/sqrt(mean(x^2) + eps). */
__global__ static void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp,
                                              const float *weight, int N, int C, float eps) {
  size_t row = gpu_cuda_warp_row();
  if (row >= (size_t)N) return;
  int lane = threadIdx.x % GPU_CUDA_WARP;
  const float *x = inp + row * C;
  float *o = out + row * C;
  float ss = 0.0f;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) ss += x[i] * x[i];
  float s = 1.0f / sqrtf(gpu_cuda_warp_sum(ss) / (float)C + eps);
  for (int i = lane; i < C; i += GPU_CUDA_WARP) o[i] = x[i] * s * weight[i];
  if (lane == 0) rstd[row] = s;
}

/* dinp (N,C) += s (dy w - x b), b = s^2 mean(dy w x). One warp per row. */
__global__ static void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *weight, const float *rstd, int N,
                                               int C) {
  size_t row = gpu_cuda_warp_row();
  if (row >= (size_t)N) return;
  int lane = threadIdx.x % GPU_CUDA_WARP;
  const float *x = inp + row * C, *dy = dout + row * C;
  float *dx = dinp + row * C;
  float s = rstd[row];
  float b = 0.0f;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) b += dy[i] * weight[i] * x[i];
  b = gpu_cuda_warp_sum(b) * s * s / (float)C;
  for (int i = lane; i < C; i += GPU_CUDA_WARP) dx[i] += (dy[i] * weight[i] - x[i] * b) * s;
}

/* dy x s of element (r, c): dweight of rmsnorm. */
struct gpu_cuda_term_rmsnorm {
  const float *dout, *inp, *rstd;
  int C;
  __device__ float2 operator()(int r, int c) const {
    size_t i = (size_t)r * C + c;
    return make_float2(dout[i] * inp[i] * rstd[r], 0.0f);
  }
};

void gpu_cuda_rmsnorm_forward(gpu_backend *be, float *out, float *rstd, const float *inp,
                              const float *weight, int N, int C, float eps) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, C, "rmsnorm_forward") || N == 0) return;
  rmsnorm_forward_kernel<<<gpu_cuda_row_grid(N), GPU_CUDA_THREADS, 0, g->stream>>>(
      out, rstd, inp, weight, N, C, eps);
  gpu_cuda_launched(g, "rmsnorm_forward");
}

void gpu_cuda_rmsnorm_backward(gpu_backend *be, float *dinp, float *dweight, const float *dout,
                               const float *inp, const float *weight, const float *rstd, int N,
                               int C) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, C, "rmsnorm_backward") || N == 0) return;
  rmsnorm_backward_kernel<<<gpu_cuda_row_grid(N), GPU_CUDA_THREADS, 0, g->stream>>>(
      dinp, dout, inp, weight, rstd, N, C);
  gpu_cuda_launched(g, "rmsnorm_backward");
  gpu_cuda_colsum(g, dweight, (float *)NULL, gpu_cuda_term_rmsnorm{dout, inp, rstd, C}, N, C,
                  "rmsnorm_backward: dweight");
}

/* ---- activations ------------------------------------------------------------------------ */

#define GELU_K (0.7978845608028654f) /* sqrt(2/pi) */
#define GELU_A (0.044715f)

/* out (n) = 0.5 x (1 + tanh(k (x + a x^3))); out may equal inp. */
__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    float x = inp[i];
    float u = GELU_K * (x + GELU_A * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

/* dinp (n) = gelu'(inp) dout; dinp may equal dout. */
__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    float x = inp[i];
    float t = tanhf(GELU_K * (x + GELU_A * x * x * x));
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    dinp[i] = (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * dout[i];
  }
}

void gpu_cuda_gelu_forward(gpu_backend *be, float *out, const float *inp, size_t n) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || n == 0) return;
  gelu_forward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(out, inp, n);
  gpu_cuda_launched(g, "gelu_forward");
}

void gpu_cuda_gelu_backward(gpu_backend *be, float *dinp, const float *inp, const float *dout,
                            size_t n) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || n == 0) return;
  gelu_backward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(dinp, inp, dout, n);
  gpu_cuda_launched(g, "gelu_backward");
}

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* inp (N,2F) = gate | up, out (N,F) = silu(gate) up. Element i = (r, j). */
__global__ static void swiglu_forward_kernel(float *out, const float *inp, size_t n, int F) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    size_t r = i / F, j = i % F;
    const float *gate = inp + r * 2 * F;
    float x = gate[j];
    out[i] = x * sigmoid(x) * gate[F + j];
  }
}

/* dinp (N,2F): dgate = dy up silu'(gate), dup = dy silu(gate). */
__global__ static void swiglu_backward_kernel(float *dinp, const float *dout, const float *inp,
                                              size_t n, int F) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    size_t r = i / F, j = i % F;
    const float *gate = inp + r * 2 * F;
    float *dgate = dinp + r * 2 * F;
    float x = gate[j], up = gate[F + j], dy = dout[i];
    float s = sigmoid(x);
    dgate[j] = dy * up * s * (1.0f + x * (1.0f - s));
    dgate[F + j] = dy * x * s;
  }
}

void gpu_cuda_swiglu_forward(gpu_backend *be, float *out, const float *inp, int N, int F) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, F, "swiglu_forward") || N == 0) return;
  size_t n = (size_t)N * F;
  swiglu_forward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(out, inp, n, F);
  gpu_cuda_launched(g, "swiglu_forward");
}

void gpu_cuda_swiglu_backward(gpu_backend *be, float *dinp, const float *dout, const float *inp,
                              int N, int F) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, F, "swiglu_backward") || N == 0) return;
  size_t n = (size_t)N * F;
  swiglu_backward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(dinp, dout, inp, n,
                                                                               F);
  gpu_cuda_launched(g, "swiglu_backward");
}

/* ---- rope ---------------------------------------------------------------------------------- */

/* In place on the q and k thirds of qkv (B,T,3C). Element i = (b, t, h, j)
 * with j < hd/2 rotates the pair (j, j + hd/2) of head h in both q and k by
 * the angle of (t, j), or by minus it when dir = -1 (the transpose, for
 * backward). freqs (T, hd/2, 2) = (cos, sin). */
__global__ static void rope_kernel(float *qkv, const float *freqs, size_t n, int T, int C, int NH,
                                   float dir) {
  int hd = C / NH, half = hd / 2;
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    int j = (int)(i % half);
    int h = (int)(i / half % NH);
    size_t bt = i / half / NH;
    const float *cs = freqs + (bt % T) * hd + 2 * j;
    float c = cs[0], s = dir * cs[1];
    for (int part = 0; part < 2; part++) { /* q, then k */
      float *x = qkv + bt * 3 * C + (size_t)part * C + (size_t)h * hd;
      float x1 = x[j], x2 = x[j + half];
      x[j] = x1 * c - x2 * s;
      x[j + half] = x2 * c + x1 * s;
    }
  }
}

static void rope_apply(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C, int NH,
                       float dir, const char *what) {
  gpu_cuda *g = gpu_cuda_enter(be);
  /* Rotate-half pairs dimension j with j + hd/2, so hd must be even. */
  if (!g || !gpu_cuda_require(g,
                              B >= 0 && T >= 0 && NH > 0 && C > 0 && C % NH == 0 &&
                                  (C / NH) % 2 == 0,
                              what))
    return;
  size_t n = (size_t)B * T * NH * (C / NH / 2);
  if (n == 0) return;
  rope_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(qkv, freqs, n, T, C, NH, dir);
  gpu_cuda_launched(g, what);
}

void gpu_cuda_rope_forward(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C,
                           int NH) {
  rope_apply(be, qkv, freqs, B, T, C, NH, 1.0f, "rope_forward");
}

void gpu_cuda_rope_backward(gpu_backend *be, float *dqkv, const float *freqs, int B, int T, int C,
                            int NH) {
  rope_apply(be, dqkv, freqs, B, T, C, NH, -1.0f, "rope_backward");
}

/* ---- embedding ------------------------------------------------------------------------------ */

/* out (B,T,C) = wte[tokens[b,t]] + wpe[t] (wpe may be NULL). */
__global__ static void encoder_forward_kernel(float *out, const int32_t *tokens, const float *wte,
                                              const float *wpe, size_t n, int T, int C) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    size_t bt = i / C, c = i % C;
    float e = wte[(size_t)tokens[bt] * C + c];
    out[i] = wpe ? e + wpe[(bt % T) * C + c] : e;
  }
}

/* dwte (V,C) += rows of dout (BT,C) scattered by token, deterministically:
 * block `pos` owns row tokens[pos] when pos is that token's first position,
 * and then adds the dout rows of all its positions in increasing order, one
 * block tile (256 positions) at a time. Exactly one block writes each row,
 * so there are no atomics and the order of additions never changes. Cost:
 * O(BT^2 / 256) token comparisons, cheap next to the row traffic. */
__global__ static void encoder_backward_wte_kernel(float *dwte, const float *dout,
                                                   const int32_t *tokens, int BT, int C) {
  __shared__ int positions[GPU_CUDA_THREADS];
  __shared__ int warp_hits[GPU_CUDA_ROWS_PER_BLOCK];
  int pos = blockIdx.x, tok = tokens[pos];
  int lane = threadIdx.x % GPU_CUDA_WARP, warp = threadIdx.x / GPU_CUDA_WARP;
  /* Not the first position of tok: the owner handles this one. */
  for (int s = 0; s < pos; s += GPU_CUDA_THREADS) {
    int j = s + threadIdx.x;
    if (__syncthreads_or(j < pos && tokens[j] == tok)) return;
  }
  float *row = dwte + (size_t)tok * C;
  for (int s = pos; s < BT; s += GPU_CUDA_THREADS) {
    /* Compact this tile's positions of tok, in increasing order. */
    int j = s + threadIdx.x;
    bool hit = j < BT && tokens[j] == tok;
    unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < GPU_CUDA_ROWS_PER_BLOCK; w++) {
      before += w < warp ? warp_hits[w] : 0;
      total += warp_hits[w];
    }
    if (hit) positions[before + __popc(mask & ((1u << lane) - 1u))] = j;
    __syncthreads();
    if (total > 0) {
      for (int c = threadIdx.x; c < C; c += GPU_CUDA_THREADS) {
        float acc = 0.0f;
        for (int k = 0; k < total; k++) acc += dout[(size_t)positions[k] * C + c];
        row[c] += acc;
      }
    }
    __syncthreads(); /* positions and warp_hits are rewritten by the next tile */
  }
}

/* dwpe (T,C) += sum over b of dout[b,t], b in order. Element i = (t, c). */
__global__ static void encoder_backward_wpe_kernel(float *dwpe, const float *dout, size_t n, int B,
                                                   int T, int C) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += dout[(size_t)b * T * C + i];
    dwpe[i] += s;
  }
}

void gpu_cuda_encoder_forward(gpu_backend *be, float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !gpu_cuda_require(g, B >= 0 && T >= 0 && C > 0, "encoder_forward")) return;
  size_t n = (size_t)B * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(out, tokens, wte,
                                                                               wpe, n, T, C);
  gpu_cuda_launched(g, "encoder_forward");
}

void gpu_cuda_encoder_backward(gpu_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !gpu_cuda_require(g, B >= 0 && T >= 0 && C > 0, "encoder_backward")) return;
  int BT = B * T;
  if (BT == 0) return;
  encoder_backward_wte_kernel<<<BT, GPU_CUDA_THREADS, 0, g->stream>>>(dwte, dout, tokens, BT, C);
  gpu_cuda_launched(g, "encoder_backward: dwte");
  if (dwpe) {
    size_t n = (size_t)T * C;
    encoder_backward_wpe_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(dwpe, dout, n,
                                                                                    B, T, C);
    gpu_cuda_launched(g, "encoder_backward: dwpe");
  }
}

/* ---- cross-entropy ----------------------------------------------------------------------------- */

/* One block per row of logits (N,V). probs may equal logits: the target
 * logit is read before the first barrier, and each element is then read and
 * written by the same thread. */
__global__ static void crossentropy_forward_kernel(float *losses, float *probs, const float *logits,
                                                   const int32_t *targets, int V) {
  __shared__ float shared[GPU_CUDA_WARP];
  size_t r = blockIdx.x;
  const float *x = logits + r * V;
  float *p = probs + r * V;
  float target_logit = threadIdx.x == 0 ? x[targets[r]] : 0.0f;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = gpu_cuda_block_max(mx, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float e = expf(x[j] - mx);
    p[j] = e;
    sum += e;
  }
  sum = gpu_cuda_block_sum(sum, shared);
  float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) losses[r] = mx + logf(sum) - target_logit;
}

/* dlogits (N,V) = (probs - onehot(target)) dloss; may equal probs. */
__global__ static void crossentropy_backward_kernel(float *dlogits, const float *probs,
                                                    const int32_t *targets, float dloss, size_t n,
                                                    int V) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    size_t r = i / V;
    int j = (int)(i % V);
    float d = probs[i] * dloss;
    dlogits[i] = j == targets[r] ? d - dloss : d;
  }
}

void gpu_cuda_crossentropy_forward(gpu_backend *be, float *losses, float *probs,
                                   const float *logits, const int32_t *targets, int N, int V) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, V, "crossentropy_forward") || N == 0) return;
  crossentropy_forward_kernel<<<N, GPU_CUDA_THREADS, 0, g->stream>>>(losses, probs, logits, targets,
                                                                     V);
  gpu_cuda_launched(g, "crossentropy_forward");
}

void gpu_cuda_crossentropy_backward(gpu_backend *be, float *dlogits, const float *probs,
                                    const int32_t *targets, float dloss, int N, int V) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !rows_ok(g, N, V, "crossentropy_backward") || N == 0) return;
  size_t n = (size_t)N * V;
  crossentropy_backward_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(
      dlogits, probs, targets, dloss, n, V);
  gpu_cuda_launched(g, "crossentropy_backward");
}

/* ---- adamw ------------------------------------------------------------------------------------ */

/* The update of gpu/backend.h written with explicitly rounded intrinsics:
 * nvcc would otherwise contract a * b + c into FMAs, and the result would
 * differ in the last bit from the CPU backend, which compiles the same
 * expressions without contraction. With every operation rounded separately
 * (and the scalars below computed on the host exactly as the CPU does), a
 * GPU peer and a CPU peer that step the same averaged gradients end with the
 * same weights. */
__global__ static void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                                    float scale, float decay, float b1, float one_b1, float b2,
                                    float one_b2, float step_size, float bc2_sqrt, float eps) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    float gr = __fmul_rn(grad[i], scale);
    float p = __fmul_rn(param[i], decay);
    float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(gr, one_b1));
    float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(gr, gr), one_b2));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    param[i] = __fsub_rn(p, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
    m[i] = mi;
    v[i] = vi;
  }
}

void gpu_cuda_adamw_update(gpu_backend *be, float *param, const float *grad, float *m, float *v,
                           size_t n, const gpu_adamw_args *a) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || n == 0) return;
  double bc1 = 1.0 - pow((double)a->beta1, (double)a->step);
  double bc2 = 1.0 - pow((double)a->beta2, (double)a->step);
  float step_size = (float)((double)a->lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float decay = (float)(1.0 - (double)a->lr * (double)a->weight_decay);
  adamw_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(
      param, grad, m, v, n, a->grad_scale, decay, a->beta1, 1.0f - a->beta1, a->beta2,
      1.0f - a->beta2, step_size, bc2_sqrt, a->eps);
  gpu_cuda_launched(g, "adamw_update");
}
