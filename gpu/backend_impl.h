/* gpu/backend_impl.h — what each backend implementation provides to the
 * dispatcher in gpu/backend.c (internal to gpu/; callers use gpu/backend.h).
 *
 * An implementation defines a struct that starts with `gpu_backend base`,
 * fills a `static const gpu_ops` table with every entry, and exposes one open
 * function below. The CUDA one lives in a module (gwtf-cuda.so) that exists
 * only in builds with GWTF_HAVE_CUDA (gpu/CMakeLists.txt builds the module
 * and sets the definition together). */
#ifndef GWTF_GPU_BACKEND_IMPL_H
#define GWTF_GPU_BACKEND_IMPL_H

#include "gpu/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes a printf-style sentence into err when err is not NULL. */
void gpu_set_err(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The CPU backend (gpu/cpu_backend.c). threads > 0. GW_EUNSUPPORTED when
 * the kernels asked for cannot run on this CPU. */
int gpu_cpu_open(int threads, gpu_cpu_kernels kernels, gpu_backend **out, char *err, size_t err_len);

/* The CUDA backend (gpu/cuda_*.cu), built as a module gwtf opens at run
 * time, so that one gwtf runs on machines with and without CUDA. Returns
 * GW_ENOENT with the driver's reason in err when there is no usable device
 * `index`. */
int gpu_cuda_open(int index, gpu_backend **out, char *err, size_t err_len);

/* The one symbol the module exports (gpu/cuda_module.c). Bump the ABI number
 * whenever gpu_backend, gpu_ops or this struct change meaning. */
#define GPU_CUDA_MODULE_ABI (1)
#define GPU_CUDA_MODULE_SYMBOL_NAME gwtf_cuda_module
#define GPU_CUDA_MODULE_SYMBOL "gwtf_cuda_module"
typedef struct gpu_cuda_module {
  int abi;         /* GPU_CUDA_MODULE_ABI of the module's build */
  size_t ops_size; /* sizeof(gpu_ops) in the module's build */
  int (*open)(int index, gpu_backend **out, char *err, size_t err_len);
} gpu_cuda_module;

#ifdef __cplusplus
}
#endif

#endif
