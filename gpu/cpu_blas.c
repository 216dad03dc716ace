/* gpu/cpu_blas.c — the CPU kernels built on cblas_sgemm: linear layers and
 * causal attention. Semantics and shapes: gpu/backend.h. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "gpu/cpu.h"
#include "util/err.h"

/* Attention works on blocks of query rows so that the causal mask skips
 * whole key ranges: block i only multiplies against keys [0, end of block i),
 * which removes almost half of the QK^T and PV work at long T. */
#define GPU_CPU_ATT_BLOCK (64)
/* Columns per task in the column sum of dbias. */
#define GPU_CPU_COL_BLOCK (128)
/* Row split granularity of a parallel sgemm (a multiple of the kernels'
 * register tile, so no thread gets a ragged edge in the middle). */
#define GPU_CPU_GEMM_ROWS (16)

/* C (M,N) = alpha op(A) op(B) + beta C, row-major, with the rows of C split
 * across the backend's OpenMP threads, each running a single-threaded
 * sgemm. One thread pool does all the work: OpenBLAS's own pthreads stay
 * idle (gpu_cpu_open sets them to 1), because two pools spin-waiting for
 * the same two cores were much slower (docs/COMPUTE.md). */
static void sgemm_rows(const gpu_backend *be, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N,
                       int K, float alpha, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc) {
  int nt = gpu_cpu_team(be, (size_t)M * N * K / 64);
  int chunks = (M + GPU_CPU_GEMM_ROWS - 1) / GPU_CPU_GEMM_ROWS;
  if (nt > chunks) nt = chunks;
  if (nt <= 1) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    int m0 = chunks * t / n * GPU_CPU_GEMM_ROWS, m1 = chunks * (t + 1) / n * GPU_CPU_GEMM_ROWS;
    if (m1 > M) m1 = M;
    /* Row m of op(A) is row m of A, or column m of A when transposed. */
    const float *a = ta == CblasNoTrans ? A + (size_t)m0 * lda : A + m0;
    if (m1 > m0)
      cblas_sgemm(CblasRowMajor, ta, tb, m1 - m0, N, K, alpha, a, lda, B, ldb, beta,
                  C + (size_t)m0 * ldc, ldc);
  }
}

/* out rows = residual rows (+ bias), so that sgemm can add with beta = 1. */
static void fill_rows(const gpu_backend *be, float *out, const float *bias, const float *residual,
                      int N, int OC) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * OC)) schedule(static)
  for (int r = 0; r < N; r++) {
    float *o = out + (size_t)r * OC;
    if (residual && bias) {
      const float *res = residual + (size_t)r * OC;
      for (int j = 0; j < OC; j++) o[j] = res[j] + bias[j];
    } else if (residual) {
      memcpy(o, residual + (size_t)r * OC, (size_t)OC * sizeof(float));
    } else {
      memcpy(o, bias, (size_t)OC * sizeof(float));
    }
  }
}

static void matmul_forward(gpu_backend *be, float *out, const float *inp, const float *weight,
                           const float *bias, const float *residual, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias || (residual && residual != out)) {
    fill_rows(be, out, bias, residual, N, OC);
    beta = 1.0f;
  } else if (residual == out && residual) {
    beta = 1.0f;
  }
  sgemm_rows(be, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

/* dbias[j] += sum over rows of dout[r, j]; each column summed in row order. */
static void colsum_accumulate(const gpu_backend *be, float *dbias, const float *dout, int N, int OC) {
  int nblocks = (OC + GPU_CPU_COL_BLOCK - 1) / GPU_CPU_COL_BLOCK;
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * OC)) schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    int j0 = blk * GPU_CPU_COL_BLOCK;
    int nj = OC - j0 < GPU_CPU_COL_BLOCK ? OC - j0 : GPU_CPU_COL_BLOCK;
    float acc[GPU_CPU_COL_BLOCK] = {0};
    for (int r = 0; r < N; r++) {
      const float *d = dout + (size_t)r * OC + j0;
      for (int j = 0; j < nj; j++) acc[j] += d[j];
    }
    for (int j = 0; j < nj; j++) dbias[j0 + j] += acc[j];
  }
}

static void matmul_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight, int N, int IC,
                            int OC) {
  if (dinp)
    sgemm_rows(be, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  sgemm_rows(be, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
  if (dbias) colsum_accumulate(be, dbias, dout, N, OC);
}

static size_t attention_state_floats(gpu_backend *be, int B, int T, int NH) {
  (void)be;
  return (size_t)B * NH * T * T;
}

/* Row t of a causal score block: p[0..t] = softmax(p[0..t]),
 * p[t+1..keys) = 0 so that P @ V and P^T @ dO may run over whole blocks. */
static void causal_softmax_row(float *p, int t, int keys) {
  float mx = p[0];
  for (int j = 1; j <= t; j++) mx = p[j] > mx ? p[j] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j <= t; j++) {
    float e = gpu_cpu_expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j <= t; j++) p[j] *= inv;
  for (int j = t + 1; j < keys; j++) p[j] = 0.0f;
}

/* One (batch, head): P = softmax(causal(Q K^T * scale)), O = P V. */
static void attention_head_forward(float *o, float *P, const float *q, const float *k,
                                   const float *v, int T, int C, int hd, float scale) {
  int C3 = 3 * C;
  for (int r0 = 0; r0 < T; r0 += GPU_CPU_ATT_BLOCK) {
    int rows = T - r0 < GPU_CPU_ATT_BLOCK ? T - r0 : GPU_CPU_ATT_BLOCK;
    int keys = r0 + rows;
    float *Pb = P + (size_t)r0 * T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, scale, q + (size_t)r0 * C3,
                C3, k, C3, 0.0f, Pb, T);
    for (int i = 0; i < rows; i++) causal_softmax_row(Pb + (size_t)i * T, r0 + i, keys);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, Pb, T, v, C3, 0.0f,
                o + (size_t)r0 * C, C);
  }
}

static void attention_forward(gpu_backend *be, float *out, float *state, const float *qkv, int B,
                              int T, int C, int NH) {
  int hd = C / NH;
  float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)B * T * T * C / 64)) schedule(static)
  for (int bh = 0; bh < B * NH; bh++) {
    int b = bh / NH, h = bh % NH;
    const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hd;
    attention_head_forward(out + (size_t)b * T * C + (size_t)h * hd, state + (size_t)bh * T * T, q,
                           q + C, q + 2 * C, T, C, hd, scale);
  }
}

/* dS = P * (dP - rowsum(P * dP)) * scale for row t of a block, in place on
 * dP (the softmax Jacobian-vector product); masked entries become 0. */
static void causal_softmax_backward_row(float *dp, const float *p, int t, int keys, float scale) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j <= t; j++) dot += p[j] * dp[j];
#pragma omp simd
  for (int j = 0; j <= t; j++) dp[j] = p[j] * (dp[j] - dot) * scale;
  for (int j = t + 1; j < keys; j++) dp[j] = 0.0f;
}

/* One (batch, head). dP is scratch of GPU_CPU_ATT_BLOCK x T floats. */
static void attention_head_backward(float *dq, float *dk, float *dv, float *dP, const float *dout,
                                    const float *q, const float *k, const float *v, const float *P,
                                    int T, int C, int hd, float scale) {
  int C3 = 3 * C;
  for (int t = 0; t < T; t++) {
    memset(dk + (size_t)t * C3, 0, (size_t)hd * sizeof(float));
    memset(dv + (size_t)t * C3, 0, (size_t)hd * sizeof(float));
  }
  for (int r0 = 0; r0 < T; r0 += GPU_CPU_ATT_BLOCK) {
    int rows = T - r0 < GPU_CPU_ATT_BLOCK ? T - r0 : GPU_CPU_ATT_BLOCK;
    int keys = r0 + rows;
    const float *Pb = P + (size_t)r0 * T;
    const float *dob = dout + (size_t)r0 * C;
    /* dP = dO V^T;  dV += P^T dO */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, 1.0f, dob, C, v, C3, 0.0f,
                dP, T);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hd, rows, 1.0f, Pb, T, dob, C, 1.0f,
                dv, C3);
    for (int i = 0; i < rows; i++)
      causal_softmax_backward_row(dP + (size_t)i * T, Pb + (size_t)i * T, r0 + i, keys, scale);
    /* dQ = dS K;  dK += dS^T Q */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, dP, T, k, C3, 0.0f,
                dq + (size_t)r0 * C3, C3);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hd, rows, 1.0f, dP, T,
                q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
  }
}

static void attention_backward(gpu_backend *be, float *dqkv, const float *dout, const float *qkv,
                               const float *state, int B, int T, int C, int NH) {
  gpu_cpu *c = gpu_cpu_of(be);
  int nt = gpu_cpu_team(be, (size_t)B * T * T * C / 64), hd = C / NH;
  float scale = 1.0f / sqrtf((float)hd);
  size_t per_thread = (size_t)GPU_CPU_ATT_BLOCK * T;
  float *scratch = gpu_cpu_scratch(c, per_thread * (size_t)nt);
  if (!scratch) return;
#pragma omp parallel num_threads(nt)
  {
    float *dP = scratch + per_thread * (size_t)omp_get_thread_num();
#pragma omp for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
      int b = bh / NH, h = bh % NH;
      size_t off = (size_t)b * T * 3 * C + (size_t)h * hd;
      attention_head_backward(dqkv + off, dqkv + off + C, dqkv + off + 2 * C, dP,
                              dout + (size_t)b * T * C + (size_t)h * hd, qkv + off, qkv + off + C,
                              qkv + off + 2 * C, state + (size_t)bh * T * T, T, C, hd, scale);
    }
  }
}

void GPU_CPU_FN(fill_blas)(gpu_ops *ops) {
  ops->matmul_forward = matmul_forward;
  ops->matmul_backward = matmul_backward;
  ops->attention_state_floats = attention_state_floats;
  ops->attention_forward = attention_forward;
  ops->attention_backward = attention_backward;
}
