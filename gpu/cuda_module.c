/* gpu/cuda_module.c — what the CUDA backend module (gwtf-cuda.so) exports:
 * one table, read by gpu/backend.c after dlopen. The module is built from the
 * same tree as gwtf; the ABI number and the size of the ops table catch a
 * module left over from another build. */
#include "gpu/backend_impl.h"

__attribute__((visibility("default"))) const gpu_cuda_module GPU_CUDA_MODULE_SYMBOL_NAME = {
    .abi = GPU_CUDA_MODULE_ABI,
    .ops_size = sizeof(gpu_ops),
    .open = gpu_cuda_open,
};
