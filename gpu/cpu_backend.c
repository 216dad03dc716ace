/* gpu/cpu_backend.c — the CPU backend: host memory, the kernel table. */
#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend_impl.h"
#include "gpu/cpu.h"
#include "util/err.h"

#define GPU_CPU_ALIGN (64)

float *gpu_cpu_scratch(gpu_cpu *c, size_t n) {
  if (c->err) return NULL;
  if (n <= c->scratch_floats) return c->scratch;
  free(c->scratch);
  c->scratch = NULL;
  c->scratch_floats = 0;
  void *p = NULL;
  if (n > SIZE_MAX / sizeof(float) || posix_memalign(&p, GPU_CPU_ALIGN, n * sizeof(float)) != 0) {
    c->err = GW_ENOMEM;
    return NULL;
  }
  c->scratch = p;
  c->scratch_floats = n;
  return c->scratch;
}

static void *cpu_alloc(gpu_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  /* Rounded up so vector loops may read a whole cache line at the end. */
  size_t rounded = (bytes + GPU_CPU_ALIGN - 1) / GPU_CPU_ALIGN * GPU_CPU_ALIGN;
  if (rounded < bytes || posix_memalign(&p, GPU_CPU_ALIGN, rounded ? rounded : GPU_CPU_ALIGN) != 0)
    return NULL;
  return p;
}

static void cpu_free(gpu_backend *be, void *p) {
  (void)be;
  free(p);
}

static int cpu_upload(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memcpy(dst, src, bytes);
  return gpu_cpu_of(be)->err;
}

static int cpu_download(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  if (dst != src && bytes) memcpy(dst, src, bytes);
  return gpu_cpu_of(be)->err;
}

static void cpu_copy(gpu_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) memcpy(dst, src, bytes);
}

static void cpu_zero(gpu_backend *be, void *p, size_t bytes) {
  (void)be;
  if (bytes) memset(p, 0, bytes);
}

static int cpu_sync(gpu_backend *be) { return gpu_cpu_of(be)->err; }

/* MemAvailable (what the kernel could hand out without swapping) and
 * MemTotal from /proc/meminfo. */
static int cpu_mem_info(gpu_backend *be, size_t *free_bytes, size_t *total_bytes) {
  (void)be;
  FILE *fp = fopen("/proc/meminfo", "r");
  if (!fp) return GW_EIO;
  char line[256];
  unsigned long long avail = 0, total = 0, kb;
  while (fgets(line, sizeof(line), fp)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb;
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = kb;
  }
  fclose(fp);
  if (!total) return GW_EIO;
  if (free_bytes) *free_bytes = (size_t)avail * 1024;
  if (total_bytes) *total_bytes = (size_t)total * 1024;
  return 0;
}

/* The model name from /proc/cpuinfo; no peak figure (it depends on clocks
 * and vector units we do not probe). */
static int cpu_device_info(gpu_backend *be, gpu_device_info *out) {
  const char *isa = gpu_cpu_of(be)->isa;
  snprintf(out->name, sizeof(out->name), "cpu (%s kernels, %d threads)", isa, be->threads);
  out->peak_flops = 0.0;
  FILE *fp = fopen("/proc/cpuinfo", "r");
  if (!fp) return 0;
  char line[256];
  while (fgets(line, sizeof(line), fp)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    line[strcspn(line, "\n")] = '\0';
    const char *name = colon + 1;
    while (*name == ' ' || *name == '\t') name++;
    snprintf(out->name, sizeof(out->name), "%.60s (%s kernels, %d threads)", name, isa, be->threads);
    break;
  }
  fclose(fp);
  return 0;
}

static void cpu_close(gpu_backend *be) {
  gpu_cpu *c = gpu_cpu_of(be);
  free(c->scratch);
  free(c);
}

static bool have_v3(void) {
#if defined(GWTF_CPU_V3) && defined(__clang__)
  /* clang 14 names neither the "x86-64-v3" level nor f16c, movbe and
   * lzcnt; every CPU with these five has those three too. */
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
#elif defined(GWTF_CPU_V3)
  return __builtin_cpu_supports("x86-64-v3");
#else
  return false;
#endif
}

/* Memory and bookkeeping entries; the kernels come from gpu/cpu_blas.c and
 * gpu/cpu_kernels.c in the variant asked for. */
static void fill_ops(gpu_ops *ops, bool v3) {
  *ops = (gpu_ops){
      .name = "cpu",
      .close = cpu_close,
      .alloc = cpu_alloc,
      .free = cpu_free,
      .upload = cpu_upload,
      .download = cpu_download,
      .copy = cpu_copy,
      .zero = cpu_zero,
      .sync = cpu_sync,
      .mem_info = cpu_mem_info,
      .device_info = cpu_device_info,
  };
#if defined(GWTF_CPU_V3)
  if (v3) {
    gpu_cpu_v3_fill_blas(ops);
    gpu_cpu_v3_fill_kernels(ops);
    return;
  }
#endif
  (void)v3;
  gpu_cpu_fill_blas(ops);
  gpu_cpu_fill_kernels(ops);
}

int gpu_cpu_open(int threads, gpu_cpu_kernels kernels, gpu_backend **out, char *err, size_t err_len) {
  bool v3 = kernels == GPU_CPU_KERNELS_V3 || (kernels == GPU_CPU_KERNELS_AUTO && have_v3());
  if (v3 && !have_v3()) {
    gpu_set_err(err, err_len, "this CPU (or build) cannot run the x86-64-v3 kernels");
    return GW_EUNSUPPORTED;
  }
  gpu_cpu *c = calloc(1, sizeof(*c));
  if (!c) {
    gpu_set_err(err, err_len, "out of memory opening the CPU backend");
    return GW_ENOMEM;
  }
  fill_ops(&c->ops, v3);
  c->isa = v3 ? "x86-64-v3" : "baseline";
  c->base.ops = &c->ops;
  c->base.dev = (gpu_device){GPU_CPU, 0};
  c->base.threads = threads;
  /* OpenBLAS runs single-threaded inside our OpenMP threads (gpu/cpu.h).
   * Process-wide: OpenBLAS has no per-handle setting. */
  openblas_set_num_threads(1);
  *out = &c->base;
  return 0;
}
