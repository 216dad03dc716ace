/* gpu/backend.c — device names and the choice of backend at run time. */
#include "gpu/backend.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/backend_impl.h"
#include "util/err.h"

void gpu_set_err(char *err, size_t err_len, const char *fmt, ...) {
  if (!err || err_len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

int gpu_device_parse(const char *s, gpu_device *out) {
  if (!s) return GW_EINVAL;
  if (strcmp(s, "cpu") == 0) {
    *out = (gpu_device){GPU_CPU, 0};
    return 0;
  }
  if (strcmp(s, "cuda") == 0) {
    *out = (gpu_device){GPU_CUDA, 0};
    return 0;
  }
  if (strncmp(s, "cuda:", 5) != 0 || s[5] < '0' || s[5] > '9') return GW_EINVAL;
  errno = 0;
  char *end = NULL;
  long idx = strtol(s + 5, &end, 10);
  if (errno || *end != '\0' || idx < 0 || idx > 255) return GW_EINVAL;
  *out = (gpu_device){GPU_CUDA, (int)idx};
  return 0;
}

void gpu_device_format(const gpu_device *dev, char *out, size_t len) {
  if (dev->kind == GPU_CPU)
    snprintf(out, len, "cpu");
  else
    snprintf(out, len, "cuda:%d", dev->index);
}

bool gpu_have_cuda(void) {
#ifdef GWTF_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

/* Cores this process may run on (the affinity mask, not the machine). */
static int online_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int gpu_backend_open(const gpu_device *dev, const gpu_options *opt, gpu_backend **out, char *err,
                     size_t err_len) {
  *out = NULL;
  if (dev->kind == GPU_CPU) {
    int threads = opt && opt->threads > 0 ? opt->threads : online_cores();
    return gpu_cpu_open(threads, opt ? opt->cpu_kernels : GPU_CPU_KERNELS_AUTO, out, err, err_len);
  }
#ifdef GWTF_HAVE_CUDA
  return gpu_cuda_open(dev->index, out, err, err_len);
#else
  gpu_set_err(err, err_len,
              "this gwtf was built without the CUDA backend (no nvcc at configure time, or "
              "-DGWTF_CUDA=OFF); rebuild with -DGWTF_CUDA=ON or use --device cpu");
  return GW_EUNSUPPORTED;
#endif
}

void gpu_backend_close(gpu_backend *be) {
  if (be) be->ops->close(be);
}
