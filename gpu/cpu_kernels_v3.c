/* gpu/cpu_kernels_v3.c — gpu/cpu_kernels.c for x86-64-v3 (AVX2), chosen at
 * run time by gpu_cpu_open (see gpu/cpu.h). */
#define GPU_CPU_V3 1
#include "gpu/cpu_kernels.c"
