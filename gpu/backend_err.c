/* gpu/backend_err.c — gpu_set_err, on its own because two binaries need it:
 * gwtf itself and the CUDA backend module (gwtf-cuda.so), which resolves
 * nothing from the program that opens it. */
#include <stdarg.h>
#include <stdio.h>

#include "gpu/backend_impl.h"

void gpu_set_err(char *err, size_t err_len, const char *fmt, ...) {
  if (!err || err_len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}
