/* gpu/cuda_blas.cu — the CUDA kernels built on cuBLAS: linear layers and
 * causal attention. Semantics and shapes: gpu/backend.h.
 *
 * cuBLAS is column-major and our tensors are row-major. A row-major (R, K)
 * array with row stride ld is, read by cuBLAS, the column-major (K, R) matrix
 * X^T with the same ld. So every product below is written for the transposes:
 * to get row-major Y = A B we ask cuBLAS for Y^T = B^T A^T, passing B first.
 * Each call carries its row-major formula and its column-major reading. */
#include <math.h>

#include "gpu/cuda_common.cuh"
#include "util/err.h"

/* ---- linear layers -------------------------------------------------------------- */

/* out (N,OC) = (residual (N,OC) or 0) + bias (OC), before the GEMM adds
 * inp @ weight^T with beta = 1. residual may equal out (read, then written
 * by the same thread). */
__global__ static void bias_fill_kernel(float *out, const float *bias, const float *residual,
                                        size_t n, int OC) {
  for (size_t i = gpu_cuda_tid(); i < n; i += gpu_cuda_nthreads()) {
    float r = residual ? residual[i] : 0.0f;
    out[i] = r + bias[i % OC];
  }
}

void gpu_cuda_matmul_forward(gpu_backend *be, float *out, const float *inp, const float *weight,
                             const float *bias, const float *residual, int N, int IC, int OC) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !gpu_cuda_require(g, N >= 0 && IC > 0 && OC >= 0, "matmul_forward")) return;
  if (N == 0 || OC == 0) return;
  size_t n = (size_t)N * OC;
  float beta = 0.0f;
  if (bias) {
    bias_fill_kernel<<<gpu_cuda_grid(n), GPU_CUDA_THREADS, 0, g->stream>>>(out, bias, residual, n,
                                                                           OC);
    gpu_cuda_launched(g, "matmul_forward: bias");
    beta = 1.0f;
  } else if (residual) {
    if (residual != out)
      gpu_cuda_ok(g,
                  cudaMemcpyAsync(out, residual, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                  g->stream),
                  "matmul_forward: residual");
    beta = 1.0f;
  }
  /* out (N,OC) = inp @ weight^T + beta out;  column-major: out^T (OC,N) =
   * W (OC,IC) x inp^T (IC,N) + beta out^T, W read transposed from its W^T (IC,OC). */
  const float one = 1.0f;
  gpu_cuda_blas_ok(g,
                   cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, &one, weight, IC, inp,
                               IC, &beta, out, OC),
                   "matmul_forward: cublasSgemm");
}

/* dbias (OC) += sum over rows of dout (N,OC). */
struct gpu_cuda_term_rows {
  const float *x;
  int C;
  __device__ float2 operator()(int r, int c) const {
    return make_float2(x[(size_t)r * C + c], 0.0f);
  }
};

void gpu_cuda_matmul_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int N,
                              int IC, int OC) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || !gpu_cuda_require(g, N >= 0 && IC > 0 && OC > 0, "matmul_backward")) return;
  if (N == 0) return;
  const float one = 1.0f, zero = 0.0f;
  if (dinp) {
    /* dinp (N,IC) = dout @ weight;  column-major: dinp^T (IC,N) = W^T (IC,OC) x dout^T (OC,N). */
    gpu_cuda_blas_ok(g,
                     cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, &one, weight, IC,
                                 dout, OC, &zero, dinp, IC),
                     "matmul_backward: dinp cublasSgemm");
  }
  /* dweight (OC,IC) += dout^T @ inp;  column-major: dweight^T (IC,OC) +=
   * inp^T (IC,N) x dout (N,OC), dout read transposed from its dout^T (OC,N). */
  gpu_cuda_blas_ok(g,
                   cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, &one, inp, IC, dout,
                               OC, &one, dweight, IC),
                   "matmul_backward: dweight cublasSgemm");
  if (dbias)
    gpu_cuda_colsum(g, dbias, (float *)NULL, gpu_cuda_term_rows{dout, OC}, N, OC,
                    "matmul_backward: dbias");
}

/* ---- attention -------------------------------------------------------------------
 * Scores are materialised, as on the CPU: state = P (B,NH,T,T), the softmax
 * probabilities with zeros above the diagonal. Per batch row b, the heads
 * are one strided-batched GEMM: head h of q, k, v sits at column h*hd of the
 * (T,3C) slab of b, so consecutive heads are hd floats apart with row stride
 * 3C. The masked half of Q K^T is computed and then overwritten with zeros;
 * the zeros let P V and the backward products run over whole T x T blocks. */

/* C[i] = alpha op(A[i]) op(B[i]) + beta C[i], column-major, i < batch. */
static void gemm_heads(gpu_cuda *g, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                       int k, float alpha, const float *A, int lda, long long sa, const float *B,
                       int ldb, long long sb, float *C, int ldc, long long sc, int batch,
                       const char *what) {
  const float beta = 0.0f;
  gpu_cuda_blas_ok(g,
                   cublasSgemmStridedBatched(g->blas, ta, tb, m, n, k, &alpha, A, lda, sa, B, ldb,
                                             sb, &beta, C, ldc, sc, batch),
                   what);
}

/* One warp per score row; row r of (rows, T) is query t = r % T.
 * p[0..t] = softmax(p[0..t]), p[t+1..T) = 0. */
__global__ static void causal_softmax_kernel(float *P, size_t rows, int T) {
  size_t row = gpu_cuda_warp_row();
  if (row >= rows) return;
  int lane = threadIdx.x % GPU_CUDA_WARP, t = (int)(row % T);
  float *p = P + row * T;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += GPU_CUDA_WARP) mx = fmaxf(mx, p[j]);
  mx = gpu_cuda_warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += GPU_CUDA_WARP) {
    float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  float inv = 1.0f / gpu_cuda_warp_sum(sum);
  for (int j = lane; j < T; j += GPU_CUDA_WARP) p[j] = j <= t ? p[j] * inv : 0.0f;
}

/* In place on dP (rows, T): dS = P * (dP - sum_j P dP) * scale on the causal
 * part, 0 above it (the softmax Jacobian-vector product). */
__global__ static void causal_softmax_backward_kernel(float *dP, const float *P, size_t rows, int T,
                                                      float scale) {
  size_t row = gpu_cuda_warp_row();
  if (row >= rows) return;
  int lane = threadIdx.x % GPU_CUDA_WARP, t = (int)(row % T);
  float *dp = dP + row * T;
  const float *p = P + row * T;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += GPU_CUDA_WARP) dot += p[j] * dp[j];
  dot = gpu_cuda_warp_sum(dot);
  for (int j = lane; j < T; j += GPU_CUDA_WARP) dp[j] = j <= t ? p[j] * (dp[j] - dot) * scale : 0.0f;
}

size_t gpu_cuda_attention_state_floats(gpu_backend *be, int B, int T, int NH) {
  (void)be;
  return (size_t)B * NH * T * T;
}

/* What both directions derive from (B, T, C, NH). */
typedef struct attn_dims {
  int hd, C3;     /* head dim; row stride of qkv */
  long long TT;   /* floats of one head's score matrix */
  size_t rows;    /* score rows of one batch row: NH*T */
  float scale;    /* 1/sqrt(hd) */
} attn_dims;

/* False when there is nothing to do or the shape is impossible (latched). */
static bool attention_dims(gpu_cuda *g, int B, int T, int C, int NH, const char *what,
                           attn_dims *d) {
  if (!gpu_cuda_require(g, B >= 0 && T >= 0 && NH > 0 && C > 0 && C % NH == 0, what)) return false;
  d->hd = C / NH;
  d->C3 = 3 * C;
  d->TT = (long long)T * T;
  d->rows = (size_t)NH * T;
  d->scale = 1.0f / sqrtf((float)d->hd);
  return B > 0 && T > 0;
}

void gpu_cuda_attention_forward(gpu_backend *be, float *out, float *state, const float *qkv, int B,
                                int T, int C, int NH) {
  gpu_cuda *g = gpu_cuda_enter(be);
  attn_dims d;
  if (!g || !attention_dims(g, B, T, C, NH, "attention_forward", &d)) return;
  int hd = d.hd, C3 = d.C3;
  long long TT = d.TT;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
    float *P = state + (size_t)b * NH * TT;
    /* S (T,T) = scale Q K^T per head;  column-major: S^T = K (T,hd) x Q^T (hd,T),
     * K read transposed from its K^T (hd,T). */
    gemm_heads(g, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, d.scale, k, C3, hd, q, C3, hd, P, T, TT, NH,
               "attention_forward: QK^T");
    causal_softmax_kernel<<<gpu_cuda_row_grid(d.rows), GPU_CUDA_THREADS, 0, g->stream>>>(P, d.rows,
                                                                                         T);
    gpu_cuda_launched(g, "attention_forward: softmax");
    /* out (T,hd) = P V per head, written into head h's columns of out (T,C);
     * column-major: out^T (hd,T) = V^T (hd,T) x P^T (T,T). */
    gemm_heads(g, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, v, C3, hd, P, T, TT,
               out + (size_t)b * T * C, C, hd, NH, "attention_forward: PV");
  }
}

void gpu_cuda_attention_backward(gpu_backend *be, float *dqkv, const float *dout, const float *qkv,
                                 const float *state, int B, int T, int C, int NH) {
  gpu_cuda *g = gpu_cuda_enter(be);
  attn_dims d;
  if (!g || !attention_dims(g, B, T, C, NH, "attention_backward", &d)) return;
  int hd = d.hd, C3 = d.C3;
  long long TT = d.TT;
  /* dP for one batch row at a time: NH*T*T floats instead of B times that. */
  float *dP = gpu_cuda_scratch(g, d.rows * T);
  if (!dP) return;
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * C3, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + (size_t)b * T * C3, *dk = dq + C, *dv = dq + 2 * C;
    const float *dO = dout + (size_t)b * T * C;
    const float *P = state + (size_t)b * NH * TT;
    /* dP (T,T) = dO V^T;  column-major: dP^T = V (T,hd) x dO^T (hd,T). */
    gemm_heads(g, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, v, C3, hd, dO, C, hd, dP, T, TT, NH,
               "attention_backward: dO V^T");
    /* dV (T,hd) = P^T dO (overwrites);  column-major: dV^T (hd,T) = dO^T (hd,T) x P (T,T),
     * P read transposed from its P^T. */
    gemm_heads(g, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dO, C, hd, P, T, TT, dv, C3, hd, NH,
               "attention_backward: P^T dO");
    causal_softmax_backward_kernel<<<gpu_cuda_row_grid(d.rows), GPU_CUDA_THREADS, 0, g->stream>>>(
        dP, P, d.rows, T, d.scale);
    gpu_cuda_launched(g, "attention_backward: softmax");
    /* dQ (T,hd) = dS K;  column-major: dQ^T (hd,T) = K^T (hd,T) x dS^T (T,T). */
    gemm_heads(g, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, k, C3, hd, dP, T, TT, dq, C3, hd, NH,
               "attention_backward: dS K");
    /* dK (T,hd) = dS^T Q;  column-major: dK^T (hd,T) = Q^T (hd,T) x dS (T,T). */
    gemm_heads(g, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, q, C3, hd, dP, T, TT, dk, C3, hd, NH,
               "attention_backward: dS^T Q");
  }
}
