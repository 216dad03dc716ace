/* gpu/cuda_backend.cu — the CUDA backend: device, stream, cuBLAS handle,
 * memory, error latching, the kernel table. Kernels: gpu/cuda_blas.cu and
 * gpu/cuda_kernels.cu; internals: gpu/cuda_common.cuh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend_impl.h"
#include "gpu/cuda_common.cuh"
#include "util/err.h"

/* cuBLAS workspace: NVIDIA recommends 32 MiB on Hopper and at least 4 MiB
 * elsewhere; one size for all keeps the GEMM choice a function of the shape. */
#define GPU_CUDA_BLAS_WORKSPACE ((size_t)32 << 20)
/* The oldest GPUs this build has code for (CMAKE_CUDA_ARCHITECTURES 75;86;89;90,
 * each with PTX, so newer GPUs JIT-compile from the sm_90 PTX). */
#define GPU_CUDA_MIN_CC (75)

/* ---- errors --------------------------------------------------------------------- */

void gpu_cuda_fail(gpu_cuda *g, int code, const char *what, const char *detail) {
  if (g->err) return;
  g->err = code;
  fprintf(stderr, "gwtf: cuda:%d: %s failed: %s; the CUDA backend is unusable from here on\n",
          g->base.dev.index, what, detail);
}

bool gpu_cuda_ok(gpu_cuda *g, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  gpu_cuda_fail(g, e == cudaErrorMemoryAllocation ? GW_ENOMEM : GW_EIO, what, cudaGetErrorString(e));
  return false;
}

bool gpu_cuda_blas_ok(gpu_cuda *g, cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  gpu_cuda_fail(g, s == CUBLAS_STATUS_ALLOC_FAILED ? GW_ENOMEM : GW_EIO, what,
                cublasGetStatusString(s));
  return false;
}

bool gpu_cuda_require(gpu_cuda *g, bool ok, const char *what) {
  if (!ok) gpu_cuda_fail(g, GW_EINVAL, what, "invalid shape");
  return ok;
}

gpu_cuda *gpu_cuda_enter(gpu_backend *be) {
  gpu_cuda *g = gpu_cuda_of(be);
  if (g->err) return NULL;
  /* The current device is per host thread; cheap when it is already ours. */
  if (!gpu_cuda_ok(g, cudaSetDevice(be->dev.index), "cudaSetDevice")) return NULL;
  return g;
}

float *gpu_cuda_scratch(gpu_cuda *g, size_t n) {
  if (g->err) return NULL;
  if (n <= g->scratch_floats) return g->scratch;
  /* Queued kernels may still read the old buffer; cudaFree would wait for the
   * device anyway, this makes the wait explicit and its error ours. */
  if (!gpu_cuda_ok(g, cudaStreamSynchronize(g->stream), "scratch: cudaStreamSynchronize"))
    return NULL;
  cudaFree(g->scratch);
  g->scratch = NULL;
  g->scratch_floats = 0;
  if (n > SIZE_MAX / sizeof(float)) {
    gpu_cuda_fail(g, GW_ENOMEM, "scratch", "size overflow");
    return NULL;
  }
  void *p = NULL;
  if (!gpu_cuda_ok(g, cudaMalloc(&p, n * sizeof(float)), "scratch: cudaMalloc")) return NULL;
  g->scratch = (float *)p;
  g->scratch_floats = n;
  return g->scratch;
}

/* ---- memory --------------------------------------------------------------------- */

static void *cuda_alloc(gpu_backend *be, size_t bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g) return NULL;
  void *p = NULL;
  /* cudaMalloc(0) may hand back NULL, which callers would read as "out of
   * memory"; one byte gets a real (256-byte aligned) allocation. */
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e == cudaErrorMemoryAllocation) {
    /* Out of memory is the caller's to handle (NULL), not a backend failure;
     * clear it so the next launch check does not pick it up. */
    (void)cudaGetLastError();
    return NULL;
  }
  return gpu_cuda_ok(g, e, "cudaMalloc") ? p : NULL;
}

static void cuda_free(gpu_backend *be, void *p) {
  /* Freed even after a failure, so that closing a failed backend leaks
   * nothing; cudaFree's own error (sticky after a fault) has no one to go to. */
  cudaSetDevice(be->dev.index);
  cudaFree(p);
}

static int cuda_upload(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g) return gpu_cuda_of(be)->err;
  if (bytes == 0) return 0;
  /* The synchronize makes the call safe for pinned host buffers too, which
   * cudaMemcpyAsync would otherwise still be reading after returning. */
  if (gpu_cuda_ok(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream), "upload"))
    gpu_cuda_ok(g, cudaStreamSynchronize(g->stream), "upload: cudaStreamSynchronize");
  return g->err;
}

static int cuda_download(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g) return gpu_cuda_of(be)->err;
  /* Queued after every kernel on the stream, so it sees their results; the
   * synchronize also surfaces their asynchronous faults. */
  if (bytes == 0 ||
      gpu_cuda_ok(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream), "download"))
    gpu_cuda_ok(g, cudaStreamSynchronize(g->stream), "download: cudaStreamSynchronize");
  return g->err;
}

static void cuda_copy(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || bytes == 0) return;
  gpu_cuda_ok(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->stream), "copy");
}

static void cuda_zero(gpu_backend *be, void *p, size_t bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g || bytes == 0) return;
  gpu_cuda_ok(g, cudaMemsetAsync(p, 0, bytes, g->stream), "zero");
}

static int cuda_sync(gpu_backend *be) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g) return gpu_cuda_of(be)->err;
  gpu_cuda_ok(g, cudaStreamSynchronize(g->stream), "sync");
  return g->err;
}

static int cuda_mem_info(gpu_backend *be, size_t *free_bytes, size_t *total_bytes) {
  gpu_cuda *g = gpu_cuda_enter(be);
  if (!g) return gpu_cuda_of(be)->err;
  size_t f = 0, t = 0;
  if (!gpu_cuda_ok(g, cudaMemGetInfo(&f, &t), "cudaMemGetInfo")) return g->err;
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return 0;
}

/* ---- device info ------------------------------------------------------------------
 * Peak dense fp32 FLOP/s without tensor cores (our GEMMs run full fp32, no
 * TF32), from the vendors' data sheets at boost clock. First match wins, so a
 * variant comes before its base name; keys match whole words of the device
 * name ("A10" does not match "A100", "H200" does not match "GH200"). */
typedef struct gpu_cuda_peak {
  const char *key;
  double tflops;
} gpu_cuda_peak;

static const gpu_cuda_peak gpu_cuda_peaks[] = {
    {"H100 PCIe", 51.2},     {"H100 NVL", 60.0},     {"H100", 66.9},       {"GH200", 66.9},
    {"H200 NVL", 60.0},      {"H200", 66.9},         {"A100", 19.5},       {"A800", 19.5},
    {"A40", 37.4},           {"A10G", 31.2},         {"A10", 31.2},        {"L40S", 91.6},
    {"L40", 90.5},           {"L4", 30.3},           {"T4", 8.1},          {"RTX 6000 Ada", 91.1},
    {"RTX A6000", 38.7},     {"RTX 5090", 104.8},    {"RTX 4090", 82.6},   {"RTX 4080 SUPER", 52.2},
    {"RTX 4080", 48.7},      {"RTX 3090 Ti", 40.0},  {"RTX 3090", 35.6},   {"RTX 3080 Ti", 34.1},
    {"RTX 3080", 29.8},      {"RTX 2080 Ti", 13.4},
};

/* key occurs in name delimited by start/space before and end/space/'-' after. */
static bool name_has_word(const char *name, const char *key) {
  size_t n = strlen(key);
  for (const char *p = strstr(name, key); p; p = strstr(p + 1, key)) {
    bool starts = p == name || p[-1] == ' ';
    bool ends = p[n] == '\0' || p[n] == ' ' || p[n] == '-';
    if (starts && ends) return true;
  }
  return false;
}

/* FP32 lanes per SM by architecture; 0 when we do not know it. */
static int fp32_lanes_per_sm(int major, int minor) {
  if (major == 7 || (major == 8 && minor == 0)) return 64;
  if (major >= 8) return 128; /* 8.6, 8.7, 8.9, 9.0, 10.x, 12.x */
  return 0;
}

/* Table figure, else SMs x lanes x 2 (FMA) x peak clock, else 0 (unknown). */
static double peak_flops(const cudaDeviceProp *p, int index) {
  for (size_t i = 0; i < sizeof(gpu_cuda_peaks) / sizeof(gpu_cuda_peaks[0]); i++)
    if (name_has_word(p->name, gpu_cuda_peaks[i].key)) return gpu_cuda_peaks[i].tflops * 1e12;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0.0;
  }
  return (double)p->multiProcessorCount * fp32_lanes_per_sm(p->major, p->minor) * 2.0 * khz * 1e3;
}

static int cuda_device_info(gpu_backend *be, gpu_device_info *out) {
  gpu_cuda *g = gpu_cuda_of(be);
  snprintf(out->name, sizeof(out->name), "%.80s (sm_%d%d)", g->prop.name, g->prop.major,
           g->prop.minor);
  out->peak_flops = peak_flops(&g->prop, be->dev.index);
  return 0;
}

/* ---- open / close -------------------------------------------------------------------- */

static void cuda_release(gpu_cuda *g) {
  cudaSetDevice(g->base.dev.index);
  if (g->stream) cudaStreamSynchronize(g->stream);
  if (g->blas) cublasDestroy(g->blas);
  cudaFree(g->blas_workspace);
  cudaFree(g->scratch);
  if (g->stream) cudaStreamDestroy(g->stream);
  /* A failed call leaves its error as the thread's last error; drop it so a
   * later backend on this thread does not inherit it. */
  (void)cudaGetLastError();
  free(g);
}

static void cuda_close(gpu_backend *be) { cuda_release(gpu_cuda_of(be)); }

static const gpu_ops cuda_ops = {
    .name = "cuda",
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .sync = cuda_sync,
    .mem_info = cuda_mem_info,
    .device_info = cuda_device_info,
    .attention_state_floats = gpu_cuda_attention_state_floats,
    .matmul_forward = gpu_cuda_matmul_forward,
    .matmul_backward = gpu_cuda_matmul_backward,
    .layernorm_forward = gpu_cuda_layernorm_forward,
    .layernorm_backward = gpu_cuda_layernorm_backward,
    .rmsnorm_forward = gpu_cuda_rmsnorm_forward,
    .rmsnorm_backward = gpu_cuda_rmsnorm_backward,
    .gelu_forward = gpu_cuda_gelu_forward,
    .gelu_backward = gpu_cuda_gelu_backward,
    .swiglu_forward = gpu_cuda_swiglu_forward,
    .swiglu_backward = gpu_cuda_swiglu_backward,
    .rope_forward = gpu_cuda_rope_forward,
    .rope_backward = gpu_cuda_rope_backward,
    .attention_forward = gpu_cuda_attention_forward,
    .attention_backward = gpu_cuda_attention_backward,
    .encoder_forward = gpu_cuda_encoder_forward,
    .encoder_backward = gpu_cuda_encoder_backward,
    .crossentropy_forward = gpu_cuda_crossentropy_forward,
    .crossentropy_backward = gpu_cuda_crossentropy_backward,
    .adamw_update = gpu_cuda_adamw_update,
};

/* Stream, cuBLAS handle and its configuration. The math mode is set, not
 * assumed: CUBLAS_DEFAULT_MATH keeps sgemm in full fp32 (no TF32, no BF16x9
 * emulation — the fixtures' 1e-4 tolerance would not survive either), and
 * atomics stay disallowed so every GEMM is reproducible. */
static int cuda_init_handles(gpu_cuda *g, char *err, size_t err_len) {
  const char *what = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    gpu_set_err(err, err_len, "cuda:%d: cannot create a stream: %s", g->base.dev.index,
                cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? GW_ENOMEM : GW_EIO;
  }
  e = cudaMalloc(&g->blas_workspace, GPU_CUDA_BLAS_WORKSPACE);
  if (e != cudaSuccess) {
    gpu_set_err(err, err_len, "cuda:%d: cannot allocate the cuBLAS workspace: %s",
                g->base.dev.index, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? GW_ENOMEM : GW_EIO;
  }
  cublasStatus_t s = cublasCreate(&g->blas);
  if (s != CUBLAS_STATUS_SUCCESS) {
    g->blas = NULL;
    what = "cublasCreate";
  } else if ((s = cublasSetStream(g->blas, g->stream)) != CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetStream";
  } else if ((s = cublasSetWorkspace(g->blas, g->blas_workspace, GPU_CUDA_BLAS_WORKSPACE)) !=
             CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetWorkspace";
  } else if ((s = cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetMathMode";
  } else if ((s = cublasSetAtomicsMode(g->blas, CUBLAS_ATOMICS_NOT_ALLOWED)) !=
             CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetAtomicsMode";
  } else if ((s = cublasSetPointerMode(g->blas, CUBLAS_POINTER_MODE_HOST)) !=
             CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetPointerMode";
  }
  if (what) {
    gpu_set_err(err, err_len, "cuda:%d: %s: %s", g->base.dev.index, what, cublasGetStatusString(s));
    return s == CUBLAS_STATUS_ALLOC_FAILED ? GW_ENOMEM : GW_EIO;
  }
  return 0;
}

extern "C" int gpu_cuda_open(int index, gpu_backend **out, char *err, size_t err_len) {
  *out = NULL;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    /* The runtime reports a missing driver as an "insufficient" one. */
    const char *hint = e == cudaErrorInsufficientDriver
                           ? "; no NVIDIA driver is loaded, or it is older than this CUDA runtime"
                           : "";
    gpu_set_err(err, err_len, "no usable CUDA device: %s (%s)%s", cudaGetErrorString(e),
                cudaGetErrorName(e), hint);
    return GW_ENOENT;
  }
  if (index < 0 || index >= count) {
    gpu_set_err(err, err_len, "no CUDA device cuda:%d: %d device(s) present", index, count);
    return GW_ENOENT;
  }
  gpu_cuda *g = (gpu_cuda *)calloc(1, sizeof(*g));
  if (!g) {
    gpu_set_err(err, err_len, "out of memory opening the CUDA backend");
    return GW_ENOMEM;
  }
  g->base.ops = &cuda_ops;
  g->base.dev.kind = GPU_CUDA;
  g->base.dev.index = index;
  g->base.threads = 0;
  e = cudaGetDeviceProperties(&g->prop, index);
  if (e == cudaSuccess) e = cudaSetDevice(index);
  if (e != cudaSuccess) {
    gpu_set_err(err, err_len, "cuda:%d cannot be used: %s", index, cudaGetErrorString(e));
    cuda_release(g);
    return GW_ENOENT;
  }
  if (g->prop.major * 10 + g->prop.minor < GPU_CUDA_MIN_CC) {
    gpu_set_err(err, err_len,
                "cuda:%d (%s) has compute capability %d.%d; this build needs %d.%d or newer", index,
                g->prop.name, g->prop.major, g->prop.minor, GPU_CUDA_MIN_CC / 10,
                GPU_CUDA_MIN_CC % 10);
    cuda_release(g);
    return GW_ENOENT;
  }
  int rc = cuda_init_handles(g, err, err_len);
  if (rc) {
    cuda_release(g);
    return rc;
  }
  *out = &g->base;
  return 0;
}
