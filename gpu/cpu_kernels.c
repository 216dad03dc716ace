/* gpu/cpu_kernels.c — the CPU kernels that are not matrix products: norms,
 * activations, RoPE, embedding, cross-entropy, AdamW. Plain C, OpenMP over
 * the outer loop, inner loops written so the compiler vectorises them.
 * Semantics and shapes: gpu/backend.h. */
#include <math.h>
#include <string.h>

#include "gpu/cpu.h"

/* Deterministic sum over rows of per-chunk partials: out[i] += sum_ch
 * part[ch * stride + i] for i < width, chunks added in order (see gpu/cpu.h). */
static void reduce_partials(const gpu_backend *be, float *out, const float *part, int nchunks,
                            int width, size_t stride) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)nchunks * width)) schedule(static)
  for (int i = 0; i < width; i++) {
    float s = 0.0f;
    for (int ch = 0; ch < nchunks; ch++) s += part[(size_t)ch * stride + i];
    out[i] += s;
  }
}

static int row_chunks(int N) { return (N + GPU_CPU_ROW_CHUNK - 1) / GPU_CPU_ROW_CHUNK; }

/* ---- layernorm ---------------------------------------------------------------- */

static void layernorm_forward(gpu_backend *be, float *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C, float eps) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * C)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *x = inp + (size_t)r * C;
    float *o = out + (size_t)r * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int i = 0; i < C; i++) var += (x[i] - m) * (x[i] - m);
    float s = 1.0f / sqrtf(var / (float)C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

static void layernorm_backward(gpu_backend *be, float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C) {
  int nchunks = row_chunks(N);
  float *part = gpu_cpu_scratch(gpu_cpu_of(be), (size_t)nchunks * 2 * C);
  if (!part) return;
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * C)) schedule(static)
  for (int ch = 0; ch < nchunks; ch++) {
    float *pw = part + (size_t)ch * 2 * C, *pb = pw + C;
    memset(pw, 0, (size_t)2 * C * sizeof(float));
    int r1 = (ch + 1) * GPU_CPU_ROW_CHUNK < N ? (ch + 1) * GPU_CPU_ROW_CHUNK : N;
    for (int r = ch * GPU_CPU_ROW_CHUNK; r < r1; r++) {
      const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
      float *dx = dinp + (size_t)r * C;
      float m = mean[r], s = rstd[r];
      /* dx = s * (dy*w - mean(dy*w) - xhat * mean(dy*w*xhat)) */
      float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
      for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s, g = dy[i] * weight[i];
        a += g;
        b += g * xhat;
      }
      a /= (float)C;
      b /= (float)C;
#pragma omp simd
      for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s, g = dy[i] * weight[i];
        pb[i] += dy[i];
        pw[i] += xhat * dy[i];
        dx[i] += (g - a - xhat * b) * s;
      }
    }
  }
  reduce_partials(be, dweight, part, nchunks, C, (size_t)2 * C);
  reduce_partials(be, dbias, part + C, nchunks, C, (size_t)2 * C);
}

/* ---- rmsnorm ----------------------------------------------------------------- */

static void rmsnorm_forward(gpu_backend *be, float *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * C)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *x = inp + (size_t)r * C;
    float *o = out + (size_t)r * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    float s = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = x[i] * s * weight[i];
    rstd[r] = s;
  }
}

static void rmsnorm_backward(gpu_backend *be, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C) {
  int nchunks = row_chunks(N);
  float *part = gpu_cpu_scratch(gpu_cpu_of(be), (size_t)nchunks * C);
  if (!part) return;
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * C)) schedule(static)
  for (int ch = 0; ch < nchunks; ch++) {
    float *pw = part + (size_t)ch * C;
    memset(pw, 0, (size_t)C * sizeof(float));
    int r1 = (ch + 1) * GPU_CPU_ROW_CHUNK < N ? (ch + 1) * GPU_CPU_ROW_CHUNK : N;
    for (int r = ch * GPU_CPU_ROW_CHUNK; r < r1; r++) {
      const float *x = inp + (size_t)r * C, *dy = dout + (size_t)r * C;
      float *dx = dinp + (size_t)r * C;
      float s = rstd[r];
      /* dx = s * (dy*w - xhat * mean(dy*w*xhat)), xhat = x * s */
      float b = 0.0f;
#pragma omp simd reduction(+ : b)
      for (int i = 0; i < C; i++) b += dy[i] * weight[i] * x[i];
      b = b * s * s / (float)C;
#pragma omp simd
      for (int i = 0; i < C; i++) {
        pw[i] += dy[i] * x[i] * s;
        dx[i] += (dy[i] * weight[i] - x[i] * b) * s;
      }
    }
  }
  reduce_partials(be, dweight, part, nchunks, C, (size_t)C);
}

/* ---- activations --------------------------------------------------------------
 * gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = k (x + 0.044715 x^3):
 * the sigmoid form needs one exp and no tanh. */

#define GELU_K (0.7978845608028654f) /* sqrt(2/pi) */
#define GELU_A (0.044715f)

/* Flat element loops run in blocks: one OpenMP task each, an inner loop
 * the compiler vectorises. */
#define GPU_CPU_ELEM_BLOCK ((size_t)4096)

static long elem_blocks(size_t n) { return (long)((n + GPU_CPU_ELEM_BLOCK - 1) / GPU_CPU_ELEM_BLOCK); }
static size_t elem_end(long blk, size_t n) {
  size_t end = (size_t)(blk + 1) * GPU_CPU_ELEM_BLOCK;
  return end < n ? end : n;
}

/* 2u, the argument of the sigmoid. */
static inline float gelu_2u(float x) { return 2.0f * GELU_K * (x + GELU_A * x * x * x); }

static void gelu_forward(gpu_backend *be, float *out, const float *inp, size_t n) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, n)) schedule(static)
  for (long blk = 0; blk < elem_blocks(n); blk++) {
    size_t end = elem_end(blk, n);
#pragma omp simd
    for (size_t i = (size_t)blk * GPU_CPU_ELEM_BLOCK; i < end; i++) {
      out[i] = inp[i] * gpu_cpu_sigmoidf(gelu_2u(inp[i]));
    }
  }
}

static void gelu_backward(gpu_backend *be, float *dinp, const float *inp, const float *dout,
                          size_t n) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, n)) schedule(static)
  for (long blk = 0; blk < elem_blocks(n); blk++) {
    size_t end = elem_end(blk, n);
#pragma omp simd
    for (size_t i = (size_t)blk * GPU_CPU_ELEM_BLOCK; i < end; i++) {
      float x = inp[i], s = gpu_cpu_sigmoidf(gelu_2u(x));
      float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
      /* d/dx [x s(2u)] = s + x s (1 - s) 2 u' */
      dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
  }
}

static void swiglu_forward(gpu_backend *be, float *out, const float *inp, int N, int F) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * F)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *g = inp + (size_t)r * 2 * F, *u = g + F;
    float *o = out + (size_t)r * F;
#pragma omp simd
    for (int j = 0; j < F; j++) o[j] = g[j] * gpu_cpu_sigmoidf(g[j]) * u[j];
  }
}

static void swiglu_backward(gpu_backend *be, float *dinp, const float *dout, const float *inp,
                            int N, int F) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * F)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *g = inp + (size_t)r * 2 * F, *u = g + F, *dy = dout + (size_t)r * F;
    float *dg = dinp + (size_t)r * 2 * F, *du = dg + F;
#pragma omp simd
    for (int j = 0; j < F; j++) {
      float s = gpu_cpu_sigmoidf(g[j]);
      float silu = g[j] * s;
      dg[j] = dy[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      du[j] = dy[j] * silu;
    }
  }
}

/* ---- rope ---------------------------------------------------------------------- */

/* Rotates the q and k heads of one row (t) of qkv by +angle (dir = 1) or by
 * -angle (dir = -1, the transpose used in backward). */
static void rope_row(float *row, const float *cs, int C, int NH, float dir) {
  int hd = C / NH, half = hd / 2;
  for (int part = 0; part < 2; part++) {
    for (int h = 0; h < NH; h++) {
      float *x = row + (size_t)part * C + (size_t)h * hd;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = dir * cs[2 * i + 1];
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

static void rope_apply(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C, int NH,
                       float dir) {
  int hd = C / NH;
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)B * T * C)) schedule(static)
  for (int bt = 0; bt < B * T; bt++)
    rope_row(qkv + (size_t)bt * 3 * C, freqs + (size_t)(bt % T) * hd, C, NH, dir);
}

static void rope_forward(gpu_backend *be, float *qkv, const float *freqs, int B, int T, int C,
                         int NH) {
  rope_apply(be, qkv, freqs, B, T, C, NH, 1.0f);
}

static void rope_backward(gpu_backend *be, float *dqkv, const float *freqs, int B, int T, int C,
                          int NH) {
  rope_apply(be, dqkv, freqs, B, T, C, NH, -1.0f);
}

/* ---- embedding ------------------------------------------------------------------ */

static void encoder_forward(gpu_backend *be, float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)B * T * C)) schedule(static)
  for (int bt = 0; bt < B * T; bt++) {
    float *o = out + (size_t)bt * C;
    const float *e = wte + (size_t)tokens[bt] * C;
    if (wpe) {
      const float *p = wpe + (size_t)(bt % T) * C;
#pragma omp simd
      for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
    } else {
      memcpy(o, e, (size_t)C * sizeof(float));
    }
  }
}

/* Threads own disjoint column ranges and walk the rows in order, so the
 * scatter-add needs no atomics and always sums in the same order. */
static void encoder_backward(gpu_backend *be, float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C) {
  enum { COLS = 64 };
  int nblocks = (C + COLS - 1) / COLS;
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)B * T * C)) schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    int c0 = blk * COLS, nc = C - c0 < COLS ? C - c0 : COLS;
    for (int bt = 0; bt < B * T; bt++) {
      const float *d = dout + (size_t)bt * C + c0;
      float *e = dwte + (size_t)tokens[bt] * C + c0;
      for (int i = 0; i < nc; i++) e[i] += d[i];
      if (dwpe) {
        float *p = dwpe + (size_t)(bt % T) * C + c0;
        for (int i = 0; i < nc; i++) p[i] += d[i];
      }
    }
  }
}

/* ---- cross-entropy ------------------------------------------------------------------ */

static void crossentropy_forward(gpu_backend *be, float *losses, float *probs, const float *logits,
                                 const int32_t *targets, int N, int V) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * V)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *x = logits + (size_t)r * V;
    float *p = probs + (size_t)r * V;
    float mx = x[0];
    for (int j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    float target_logit = x[targets[r]]; /* read before p (maybe == x) is written */
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; j++) {
      float e = gpu_cpu_expf(x[j] - mx);
      p[j] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < V; j++) p[j] *= inv;
    losses[r] = mx + logf(sum) - target_logit;
  }
}

static void crossentropy_backward(gpu_backend *be, float *dlogits, const float *probs,
                                  const int32_t *targets, float dloss, int N, int V) {
#pragma omp parallel for num_threads(gpu_cpu_team(be, (size_t)N * V)) schedule(static)
  for (int r = 0; r < N; r++) {
    const float *p = probs + (size_t)r * V;
    float *d = dlogits + (size_t)r * V;
#pragma omp simd
    for (int j = 0; j < V; j++) d[j] = p[j] * dloss;
    d[targets[r]] -= dloss;
  }
}

/* ---- adamw -------------------------------------------------------------------- */

/* Element-wise and without FMA contraction (ISO C mode), so the step is
 * bit-identical on every CPU: peers of one stage step the same averaged
 * gradients and must end with the same weights. */
static void adamw_update(gpu_backend *be, float *param, const float *grad, float *m, float *v,
                         size_t n, const gpu_adamw_args *a) {
  double bc1 = 1.0 - pow((double)a->beta1, (double)a->step);
  double bc2 = 1.0 - pow((double)a->beta2, (double)a->step);
  float step_size = (float)((double)a->lr / bc1);
  float bc2_sqrt = (float)sqrt(bc2);
  float decay = (float)(1.0 - (double)a->lr * (double)a->weight_decay);
  float b1 = a->beta1, b2 = a->beta2, one_b1 = 1.0f - a->beta1, one_b2 = 1.0f - a->beta2;
  float eps = a->eps, scale = a->grad_scale;
#pragma omp parallel for num_threads(gpu_cpu_team(be, n)) schedule(static)
  for (long blk = 0; blk < elem_blocks(n); blk++) {
    size_t end = elem_end(blk, n);
#pragma omp simd
    for (size_t i = (size_t)blk * GPU_CPU_ELEM_BLOCK; i < end; i++) {
      float g = grad[i] * scale;
      float p = param[i] * decay;
      float mi = m[i] * b1 + g * one_b1;
      float vi = v[i] * b2 + g * g * one_b2;
      float denom = sqrtf(vi) / bc2_sqrt + eps;
      param[i] = p - step_size * (mi / denom);
      m[i] = mi;
      v[i] = vi;
    }
  }
}

void GPU_CPU_FN(fill_kernels)(gpu_ops *ops) {
  ops->layernorm_forward = layernorm_forward;
  ops->layernorm_backward = layernorm_backward;
  ops->rmsnorm_forward = rmsnorm_forward;
  ops->rmsnorm_backward = rmsnorm_backward;
  ops->gelu_forward = gelu_forward;
  ops->gelu_backward = gelu_backward;
  ops->swiglu_forward = swiglu_forward;
  ops->swiglu_backward = swiglu_backward;
  ops->rope_forward = rope_forward;
  ops->rope_backward = rope_backward;
  ops->encoder_forward = encoder_forward;
  ops->encoder_backward = encoder_backward;
  ops->crossentropy_forward = crossentropy_forward;
  ops->crossentropy_backward = crossentropy_backward;
  ops->adamw_update = adamw_update;
}
