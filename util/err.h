/* util/err.h — error codes shared by every layer.
 *
 * Functions return 0 on success or one of these negative codes, in the
 * libuv style; gw_strerror() turns one into text for a log line. Layers may
 * also pass through negative libuv codes (UV_E*): gw_strerror() knows those
 * too, because they never collide with ours (ours sit below -10000). */
#ifndef GWTF_UTIL_ERR_H
#define GWTF_UTIL_ERR_H

#include <stdarg.h>
#include <stddef.h>

enum {
  GW_OK = 0,
  GW_EINVAL = -10001,    /* bad argument or malformed input */
  GW_ENOMEM = -10002,    /* allocation failed */
  GW_EPROTO = -10003,    /* peer broke the protocol */
  GW_EIO = -10004,       /* read/write failed */
  GW_ETIMEDOUT = -10005, /* no answer in time */
  GW_EPERM = -10006,     /* refused: permissions or policy */
  GW_ENOENT = -10007,    /* no such file, key or peer */
  GW_EEXIST = -10008,    /* already there */
  GW_ERANGE = -10009,    /* too large or out of range */
  GW_EAUTH = -10010,     /* signature or MAC check failed */
  GW_ECLOSED = -10011,   /* handle or session already closed */
  GW_EAGAIN = -10012,    /* try again later (rate limited, busy) */
  GW_EFULL = -10013,     /* capacity reached */
  GW_EUNSUPPORTED = -10014,
};

/* Human-readable text for a gwtf, libuv or negated errno code. Never NULL. */
const char *gw_strerror(int code);

/* Writes a printf-style sentence into err (when err and err_len are set) and
 * returns code: `return gw_fail(err, len, GW_EINVAL, "line %d: ...", n);`. */
int gw_fail(char *err, size_t err_len, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
int gw_vfail(char *err, size_t err_len, int code, const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

#endif
