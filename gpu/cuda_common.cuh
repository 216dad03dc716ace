/* gpu/cuda_common.cuh — internals of the CUDA backend, shared by gpu/cuda_*.cu
 * only (callers use gpu/backend.h).
 *
 * Execution model: one CUDA stream and one cuBLAS handle per backend; every
 * kernel, copy and GEMM is queued on that stream, so stream order alone
 * serialises the kernels that share the scratch buffer below.
 *
 * Errors: each ops entry starts with gpu_cuda_enter(), which makes the
 * backend's device current (the compute worker may not be the thread that
 * opened it) and returns NULL once a failure has been latched, turning every
 * later kernel into a no-op. The first failure is kept in `err` and returned
 * by the next sync / download, as gpu/backend.h requires.
 *
 * Determinism: no floating-point atomics anywhere. Row reductions are warp
 * shuffles in a fixed butterfly; column reductions (bias and norm weight
 * gradients) go through gpu_cuda_colsum below, whose partition depends only
 * on the shape, never on the device or on scheduling. */
#ifndef GWTF_GPU_CUDA_COMMON_CUH
#define GWTF_GPU_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/backend.h"

typedef struct gpu_cuda {
  gpu_backend base;
  cudaStream_t stream;
  cublasHandle_t blas;
  void *blas_workspace; /* given to cuBLAS explicitly: a fixed workspace is
                           part of what makes its results reproducible */
  float *scratch;       /* grows on demand; one kernel at a time uses it */
  size_t scratch_floats;
  int err;              /* first failure (GW_*), sticky */
  cudaDeviceProp prop;
} gpu_cuda;

static inline gpu_cuda *gpu_cuda_of(gpu_backend *be) { return (gpu_cuda *)be; }

/* ---- errors (gpu/cuda_backend.cu) ------------------------------------------ */

/* Latches `code` as the backend's failure unless one is already latched, and
 * prints the first one on stderr: the contract passes on only a code, and
 * "which kernel, which CUDA error" is what a user needs to report. */
void gpu_cuda_fail(gpu_cuda *g, int code, const char *what, const char *detail);
/* True when e is cudaSuccess; otherwise latches it (GW_ENOMEM for an
 * allocation failure, GW_EIO for anything else). */
bool gpu_cuda_ok(gpu_cuda *g, cudaError_t e, const char *what);
bool gpu_cuda_blas_ok(gpu_cuda *g, cublasStatus_t s, const char *what);
/* Start of every queued operation: NULL when the backend has failed (or its
 * device cannot be made current), else the backend. */
gpu_cuda *gpu_cuda_enter(gpu_backend *be);
/* After a kernel launch: latches a bad launch configuration or an earlier
 * asynchronous fault. */
static inline void gpu_cuda_launched(gpu_cuda *g, const char *what) {
  gpu_cuda_ok(g, cudaGetLastError(), what);
}
/* Latches GW_EINVAL for shapes no kernel can run (negative sizes, heads that
 * do not divide C); returns `ok`. */
bool gpu_cuda_require(gpu_cuda *g, bool ok, const char *what);

/* Device scratch of at least n floats (n > 0), or NULL with the failure
 * latched. Valid until the next call; stream order keeps earlier kernels'
 * uses of the old contents safe. */
float *gpu_cuda_scratch(gpu_cuda *g, size_t n);

/* ---- launch shapes ------------------------------------------------------------ */

#define GPU_CUDA_WARP (32)
#define GPU_CUDA_THREADS (256)                        /* threads per block */
#define GPU_CUDA_ROWS_PER_BLOCK (GPU_CUDA_THREADS / GPU_CUDA_WARP) /* warp-per-row kernels */
#define GPU_CUDA_MAX_GRID (65536u)                    /* blocks of grid-stride kernels */

/* Blocks for a grid-stride kernel over n elements (n > 0). */
static inline unsigned gpu_cuda_grid(size_t n) {
  size_t blocks = (n + GPU_CUDA_THREADS - 1) / GPU_CUDA_THREADS;
  return blocks < GPU_CUDA_MAX_GRID ? (unsigned)blocks : GPU_CUDA_MAX_GRID;
}
/* Blocks for a warp-per-row kernel over `rows` rows (rows > 0). */
static inline unsigned gpu_cuda_row_grid(size_t rows) {
  return (unsigned)((rows + GPU_CUDA_ROWS_PER_BLOCK - 1) / GPU_CUDA_ROWS_PER_BLOCK);
}

/* ---- device helpers ----------------------------------------------------------- */

/* Index of this thread's first element / stride of a grid-stride loop. */
__device__ __forceinline__ size_t gpu_cuda_tid(void) {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t gpu_cuda_nthreads(void) { return (size_t)gridDim.x * blockDim.x; }
/* Row of a warp-per-row kernel. */
__device__ __forceinline__ size_t gpu_cuda_warp_row(void) {
  return (size_t)blockIdx.x * (blockDim.x / GPU_CUDA_WARP) + threadIdx.x / GPU_CUDA_WARP;
}

/* Butterfly reductions: every lane ends with the same value (each step adds
 * the same two operands on both partners), and the order never changes. */
__device__ __forceinline__ float gpu_cuda_warp_sum(float v) {
  for (int o = GPU_CUDA_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float gpu_cuda_warp_max(float v) {
  for (int o = GPU_CUDA_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Block-wide reduction for blocks of whole warps: each warp reduces, then
 * every warp reduces the per-warp results in index order, so every thread
 * gets the same value. `shared` holds 32 floats; the leading barrier lets a
 * block call these back to back with the same `shared`. */
template <float (*WarpOp)(float)>
__device__ __forceinline__ float gpu_cuda_block_reduce(float v, float *shared, float identity) {
  int lane = threadIdx.x % GPU_CUDA_WARP, warp = threadIdx.x / GPU_CUDA_WARP;
  v = WarpOp(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x / GPU_CUDA_WARP) ? shared[lane] : identity;
  return WarpOp(v);
}
__device__ __forceinline__ float gpu_cuda_block_sum(float v, float *shared) {
  return gpu_cuda_block_reduce<gpu_cuda_warp_sum>(v, shared, 0.0f);
}
__device__ __forceinline__ float gpu_cuda_block_max(float v, float *shared) {
  return gpu_cuda_block_reduce<gpu_cuda_warp_max>(v, shared, -INFINITY);
}

/* ---- deterministic column sums --------------------------------------------------
 * dst0[c] += sum_r term(r, c).x and dst1[c] += sum_r term(r, c).y (dst1 may be
 * NULL) over rows r < N, columns c < C — the shape of every bias and norm
 * weight gradient. Two passes, no atomics:
 *   1. block (x, y) sums columns [32x, 32x+32) over the y-th chunk of rows:
 *      8 threads per column take every 8th row, then thread 0 of the column
 *      adds the 8 partial sums in order; the result goes to scratch;
 *   2. one thread per column adds the chunk partials in chunk order.
 * The chunking depends on N only (not on the SM count or on scheduling), so
 * the result is bit-identical run to run. */

#define GPU_CUDA_COLSUM_COLS (32)  /* columns per block: one warp reads 128 B */
#define GPU_CUDA_COLSUM_LANES (8)  /* threads per column */
#define GPU_CUDA_COLSUM_ROWS (128) /* rows per chunk (doubled for huge N) */
#define GPU_CUDA_MAX_GRID_Y (65535)

template <class Term>
__global__ void gpu_cuda_colsum_partial_kernel(float2 *partial, Term term, int N, int C,
                                               int rows_per_chunk) {
  __shared__ float2 acc[GPU_CUDA_COLSUM_LANES][GPU_CUDA_COLSUM_COLS];
  int c = blockIdx.x * GPU_CUDA_COLSUM_COLS + threadIdx.x;
  int r0 = blockIdx.y * rows_per_chunk;
  int r1 = min(r0 + rows_per_chunk, N);
  float2 s = make_float2(0.0f, 0.0f);
  if (c < C) {
    for (int r = r0 + threadIdx.y; r < r1; r += GPU_CUDA_COLSUM_LANES) {
      float2 t = term(r, c);
      s.x += t.x;
      s.y += t.y;
    }
  }
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    for (int i = 1; i < GPU_CUDA_COLSUM_LANES; i++) {
      s.x += acc[i][threadIdx.x].x;
      s.y += acc[i][threadIdx.x].y;
    }
    partial[(size_t)blockIdx.y * C + c] = s;
  }
}

/* partial (chunks, C) -> dst0 (C) += .x, dst1 (C) += .y */
__global__ void gpu_cuda_colsum_finish_kernel(float *dst0, float *dst1, const float2 *partial,
                                              int chunks, int C);

template <class Term>
void gpu_cuda_colsum(gpu_cuda *g, float *dst0, float *dst1, Term term, int N, int C,
                     const char *what) {
  if (N <= 0 || C <= 0) return;
  int rows = GPU_CUDA_COLSUM_ROWS;
  while ((N + rows - 1) / rows > GPU_CUDA_MAX_GRID_Y) rows *= 2;
  int chunks = (N + rows - 1) / rows;
  /* float2 per (chunk, column): 2 floats each */
  float2 *partial = (float2 *)gpu_cuda_scratch(g, (size_t)chunks * C * 2);
  if (!partial) return;
  dim3 grid((C + GPU_CUDA_COLSUM_COLS - 1) / GPU_CUDA_COLSUM_COLS, chunks);
  dim3 block(GPU_CUDA_COLSUM_COLS, GPU_CUDA_COLSUM_LANES);
  gpu_cuda_colsum_partial_kernel<<<grid, block, 0, g->stream>>>(partial, term, N, C, rows);
  gpu_cuda_launched(g, what);
  gpu_cuda_colsum_finish_kernel<<<(C + GPU_CUDA_THREADS - 1) / GPU_CUDA_THREADS, GPU_CUDA_THREADS,
                                  0, g->stream>>>(dst0, dst1, partial, chunks, C);
  gpu_cuda_launched(g, what);
}

/* ---- kernels, one per gpu_ops entry (semantics in gpu/backend.h) -------------- */

/* gpu/cuda_blas.cu */
size_t gpu_cuda_attention_state_floats(gpu_backend *be, int B, int T, int NH);
void gpu_cuda_matmul_forward(gpu_backend *be, float *out, const float *inp, const float *weight,
                             const float *bias, const float *residual, int N, int IC, int OC);
void gpu_cuda_matmul_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight, int N,
                              int IC, int OC);
void gpu_cuda_attention_forward(gpu_backend *be, float *out, float *state, const float *qkv, int B,
                                int T, int C, int NH);
void gpu_cuda_attention_backward(gpu_backend *be, float *dqkv, const float *dout, const float *qkv,
                                 const float *state, int B, int T, int C, int NH);

/* gpu/cuda_kernels.cu */
void gpu_cuda_layernorm_forward(gpu_backend *be, float *out, float *mean, float *rstd,
                                const float *inp, const float *weight, const float *bias, int N,
                                int C, float eps);
void gpu_cuda_layernorm_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C);
void gpu_cuda_rmsnorm_forward(gpu_backend *be, float *out, float *rstd, const float *inp,
                              const float *weight, int N, int C, float eps);
void gpu_cuda_rmsnorm_backward(gpu_backend *be, float *dinp, float *dweight, const float *dout,
                               const float *inp, const float *weight, const float *rstd, int N,
                               int C);
void gpu_cuda_gelu_forward(gpu_backend *be, float *out, const float *inp, size_t n);
void gpu_cuda_gelu_backward(gpu_backend *be, float *dinp, const float *inp, const float *dout,
                            size_t n);
void gpu_cuda_swiglu_forward(gpu_backend *be, float *out, const float *inp, int N, int F);
void gpu_cuda_swiglu_backward(gpu_backend *be, float *dinp, const float *dout, const float *inp,
                              int N, int F);
void gpu_cuda_rope_forward(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C,
                           int NH);
void gpu_cuda_rope_backward(gpu_backend *be, float *dqkv, const float *freqs, int B, int T, int C,
                            int NH);
void gpu_cuda_encoder_forward(gpu_backend *be, float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C);
void gpu_cuda_encoder_backward(gpu_backend *be, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C);
void gpu_cuda_crossentropy_forward(gpu_backend *be, float *losses, float *probs,
                                   const float *logits, const int32_t *targets, int N, int V);
void gpu_cuda_crossentropy_backward(gpu_backend *be, float *dlogits, const float *probs,
                                    const int32_t *targets, float dloss, int N, int V);
void gpu_cuda_adamw_update(gpu_backend *be, float *param, const float *grad, float *m, float *v,
                           size_t n, const gpu_adamw_args *a);

#endif
