/* gpu/backend.c — device names and the choice of backend at run time. */
#include "gpu/backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/backend_impl.h"
#include "util/err.h"

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

#ifdef GWTF_HAVE_CUDA
/* Opens the CUDA backend module: $GWTF_CUDA_MODULE when set; else the one
 * installed beside this gwtf (GWTF_CUDA_MODULE_REL, relative to the
 * directory of the executable); else, for programs run from the build tree,
 * the module built there. On failure writes the loader's reason into why. */
static void *cuda_module_dlopen(char *why, size_t why_len) {
  const char *path = getenv("GWTF_CUDA_MODULE");
  char installed[PATH_MAX + sizeof(GWTF_CUDA_MODULE_REL) + 1];
  if (!path || !*path) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
      snprintf(why, why_len, "cannot find this program's directory: %s", strerror(errno));
      return NULL;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(installed, sizeof(installed), "%s/%s", exe, GWTF_CUDA_MODULE_REL);
    path = installed;
    size_t build_len = strlen(GWTF_BUILD_DIR);
    if (access(installed, F_OK) != 0 && strncmp(exe, GWTF_BUILD_DIR, build_len) == 0 &&
        (exe[build_len] == '/' || exe[build_len] == '\0'))
      path = GWTF_CUDA_MODULE_BUILD_PATH;
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) snprintf(why, why_len, "%s", dlerror());
  return h;
}
#endif

/* The module stays loaded once opened: backends live in its code, and the
 * CUDA runtime does not support being unloaded. */
static int cuda_module_get(const gpu_cuda_module **out, char *err, size_t err_len) {
  *out = NULL;
#ifdef GWTF_HAVE_CUDA
  char why[512];
  void *h = cuda_module_dlopen(why, sizeof(why));
  if (!h) {
    gpu_set_err(err, err_len,
                "the CUDA backend cannot be loaded (%s); it needs the CUDA runtime and cuBLAS "
                "libraries of CUDA %d (libcudart, libcublas) and an NVIDIA driver; use --device cpu "
                "without them",
                why, GWTF_CUDA_MAJOR);
    return GW_EUNSUPPORTED;
  }
  const gpu_cuda_module *m = dlsym(h, GPU_CUDA_MODULE_SYMBOL);
  if (!m || m->abi != GPU_CUDA_MODULE_ABI || m->ops_size != sizeof(gpu_ops)) {
    dlclose(h);
    gpu_set_err(err, err_len, "the CUDA backend module found is not from this gwtf's build (%s)",
                m ? "another backend interface" : "no " GPU_CUDA_MODULE_SYMBOL " in it");
    return GW_EUNSUPPORTED;
  }
  *out = m;
  return 0;
#else
  gpu_set_err(err, err_len,
              "this gwtf was built without the CUDA backend (no nvcc at configure time, or "
              "-DGWTF_CUDA=OFF); rebuild with -DGWTF_CUDA=ON or use --device cpu");
  return GW_EUNSUPPORTED;
#endif
}

bool gpu_have_cuda(void) {
  const gpu_cuda_module *m;
  return cuda_module_get(&m, NULL, 0) == 0;
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
  const gpu_cuda_module *m;
  int rc = cuda_module_get(&m, err, err_len);
  return rc ? rc : m->open(dev->index, out, err, err_len);
}

void gpu_backend_close(gpu_backend *be) {
  if (be) be->ops->close(be);
}
