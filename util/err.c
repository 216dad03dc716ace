#include "util/err.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

int gw_vfail(char *err, size_t err_len, int code, const char *fmt, va_list ap) {
  if (err && err_len) vsnprintf(err, err_len, fmt, ap);
  return code;
}

int gw_fail(char *err, size_t err_len, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gw_vfail(err, err_len, code, fmt, ap);
  va_end(ap);
  return code;
}

const char *gw_strerror(int code) {
  switch (code) {
  case GW_OK: return "success";
  case GW_EINVAL: return "invalid argument or malformed input";
  case GW_ENOMEM: return "out of memory";
  case GW_EPROTO: return "protocol violation";
  case GW_EIO: return "input/output error";
  case GW_ETIMEDOUT: return "timed out";
  case GW_EPERM: return "not permitted";
  case GW_ENOENT: return "not found";
  case GW_EEXIST: return "already exists";
  case GW_ERANGE: return "too large or out of range";
  case GW_EAUTH: return "authentication failed";
  case GW_ECLOSED: return "closed";
  case GW_EAGAIN: return "try again later";
  case GW_EFULL: return "capacity reached";
  case GW_EUNSUPPORTED: return "not supported";
  default: break;
  }
  if (code < 0 && code > -4096) return uv_strerror(code); /* UV_E* == -errno on Unix */
  return "unknown error";
}
