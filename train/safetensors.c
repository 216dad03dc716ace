/* train/safetensors.c — safetensors reader and writer (see the header for
 * the format and the checks). */
#include "train/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/err.h"
#include "util/file.h"

#define ST_LEN_BYTES (8)

static const struct {
  const char *name;
  size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},     [ST_I8] = {"I8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},   [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},   [ST_F64] = {"F64", 8},   [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(st_dtype d) { return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].name : "?"; }
size_t st_dtype_size(st_dtype d) { return (unsigned)d < ST_DTYPE_COUNT ? dtypes[d].size : 0; }

static void st_fail_message(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void st_fail_message(char *err, size_t len, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
}
/* Writes the reason and evaluates to GW_EINVAL, visibly to the compiler:
 * callers that read an out-parameter only on success then compile without
 * maybe-uninitialized warnings in optimised builds. */
#define st_fail(err, len, ...) (st_fail_message((err), (len), __VA_ARGS__), GW_EINVAL)

static int parse_dtype(const char *s, st_dtype *out) {
  for (int i = 0; s && i < ST_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) return (*out = (st_dtype)i), 0;
  return GW_EINVAL;
}

/* "[2,3,4]" for messages. */
static void format_shape(const int64_t *shape, int ndim, char *out, size_t len) {
  size_t used = (size_t)snprintf(out, len, "[");
  for (int i = 0; i < ndim && used < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (used < len) snprintf(out + used, len - used, "]");
}

/* Fills one st_tensor from its header entry, checking everything that can
 * be checked without the other tensors. */
static int parse_entry(const char *name, json_t *v, size_t data_len, st_tensor *t, char *err,
                       size_t len) {
  if (!*name) return st_fail(err, len, "a tensor has an empty name");
  if (!json_is_object(v)) return st_fail(err, len, "tensor '%s': entry is not an object", name);
  json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
         *off = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || parse_dtype(json_string_value(dt), &t->dtype) != 0)
    return st_fail(err, len, "tensor '%s': missing or unknown dtype", name);
  if (!json_is_array(sh) || json_array_size(sh) > ST_MAX_DIMS)
    return st_fail(err, len, "tensor '%s': shape must be an array of at most %d sizes", name,
                   ST_MAX_DIMS);
  t->name = name;
  t->ndim = (int)json_array_size(sh);
  size_t bytes = st_dtype_size(t->dtype);
  bool overflow = false;
  for (int i = 0; i < t->ndim; i++) {
    json_t *d = json_array_get(sh, (size_t)i);
    if (!json_is_integer(d) || json_integer_value(d) < 0)
      return st_fail(err, len, "tensor '%s': shape entries must be non-negative integers", name);
    t->shape[i] = json_integer_value(d);
    overflow = overflow || __builtin_mul_overflow(bytes, (size_t)t->shape[i], &bytes);
  }
  if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
      !json_is_integer(json_array_get(off, 1)))
    return st_fail(err, len, "tensor '%s': data_offsets must be [begin, end]", name);
  json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
  if (b < 0 || e < b || (uint64_t)e > data_len)
    return st_fail(err, len, "tensor '%s': data_offsets [%lld, %lld] outside the %zu data bytes", name,
                   (long long)b, (long long)e, data_len);
  if (overflow || (uint64_t)(e - b) != bytes) {
    char s[128];
    format_shape(t->shape, t->ndim, s, sizeof(s));
    if (overflow)
      return st_fail(err, len, "tensor '%s': %s %s has more bytes than a file can hold", name,
                     st_dtype_name(t->dtype), s);
    return st_fail(err, len, "tensor '%s': %s %s needs %zu bytes but data_offsets span %lld", name,
                   st_dtype_name(t->dtype), s, bytes, (long long)(e - b));
  }
  t->begin = (size_t)b;
  t->end = (size_t)e;
  return 0;
}

static int by_begin(const void *a, const void *b) {
  const st_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Sorted by offset, tensors must tile the data section exactly. */
static int check_layout(st_file *f, size_t data_len, char *err, size_t len) {
  qsort(f->tensors, f->n_tensors, sizeof(st_tensor), by_begin);
  size_t pos = 0;
  for (size_t i = 0; i < f->n_tensors; i++) {
    st_tensor *t = &f->tensors[i];
    if (t->begin < pos)
      return st_fail(err, len, "tensors '%s' and '%s' overlap", f->tensors[i - 1].name, t->name);
    if (t->begin > pos)
      return st_fail(err, len, "data bytes [%zu, %zu) before tensor '%s' belong to no tensor", pos,
                     t->begin, t->name);
    pos = t->end;
  }
  if (pos != data_len)
    return st_fail(err, len, "the last %zu data bytes belong to no tensor", data_len - pos);
  return 0;
}

static int check_metadata(json_t *meta, char *err, size_t len) {
  if (!json_is_object(meta)) return st_fail(err, len, "__metadata__ is not an object");
  const char *k;
  json_t *v;
  json_object_foreach(meta, k, v) {
    if (!json_is_string(v)) return st_fail(err, len, "__metadata__ value '%s' is not a string", k);
  }
  return 0;
}

static int parse_header(st_file *f, const uint8_t *hdr, size_t hdr_len, size_t data_len, char *err,
                        size_t len) {
  json_error_t je;
  json_t *root = json_loadb((const char *)hdr, hdr_len, JSON_REJECT_DUPLICATES, &je);
  if (!root) return st_fail(err, len, "header is not valid JSON: %s (byte %d)", je.text, je.position);
  f->header = root;
  if (!json_is_object(root)) return st_fail(err, len, "header is not a JSON object");
  size_t n = json_object_size(root);
  f->tensors = calloc(n ? n : 1, sizeof(st_tensor));
  if (!f->tensors) return GW_ENOMEM;
  const char *name;
  json_t *v;
  json_object_foreach(root, name, v) {
    int rc = strcmp(name, "__metadata__") == 0
                 ? check_metadata(v, err, len)
                 : parse_entry(name, v, data_len, &f->tensors[f->n_tensors++], err, len);
    if (rc) return rc;
  }
  return check_layout(f, data_len, err, len);
}

/* The header length from the first 8 bytes, checked against the file. */
static int header_length(const uint8_t *first8, size_t file_len, size_t *hdr_len, char *err,
                         size_t err_len) {
  if (file_len < ST_LEN_BYTES)
    return st_fail(err, err_len, "file is %zu bytes, shorter than the 8-byte header length", file_len);
  uint64_t n = 0;
  for (int i = ST_LEN_BYTES - 1; i >= 0; i--) n = n << 8 | first8[i];
  if (n > file_len - ST_LEN_BYTES)
    return st_fail(err, err_len, "header length %llu runs past the end of the %zu-byte file",
                   (unsigned long long)n, file_len);
  if (n > ST_MAX_HEADER)
    return st_fail(err, err_len, "header length %llu exceeds the %u-byte limit", (unsigned long long)n,
                   ST_MAX_HEADER);
  *hdr_len = (size_t)n;
  return 0;
}

int st_parse(const uint8_t *buf, size_t len, st_file *out, char *err, size_t err_len) {
  memset(out, 0, sizeof(*out));
  size_t hdr_len;
  int rc = header_length(buf, len, &hdr_len, err, err_len);
  if (rc) return rc;
  out->buf = buf;
  out->len = len;
  size_t data_off = ST_LEN_BYTES + hdr_len;
  rc = parse_header(out, buf + ST_LEN_BYTES, hdr_len, len - data_off, err, err_len);
  if (rc) {
    st_free(out);
    return rc;
  }
  for (size_t i = 0; i < out->n_tensors; i++) out->tensors[i].data = buf + data_off + out->tensors[i].begin;
  return 0;
}

int st_load(const char *path, size_t max_len, st_file *out, char *err, size_t err_len) {
  uint8_t *buf = NULL;
  size_t len = 0;
  memset(out, 0, sizeof(*out));
  int rc = gw_file_read_all(path, max_len, &buf, &len);
  if (rc) {
    if (err && err_len) snprintf(err, err_len, "cannot read %s: %s", path, gw_strerror(rc));
    return rc;
  }
  rc = st_parse(buf, len, out, err, err_len);
  if (rc) {
    free(buf);
    return rc;
  }
  out->owned = buf;
  return 0;
}

int st_load_header(const char *path, st_file *out, char *err, size_t err_len) {
  memset(out, 0, sizeof(*out));
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    int rc = -errno;
    if (err && err_len) snprintf(err, err_len, "cannot read %s: %s", path, gw_strerror(rc));
    return rc;
  }
  uint8_t first8[ST_LEN_BYTES] = {0};
  struct stat sb;
  size_t hdr_len = 0;
  int rc = fstat(fileno(fp), &sb) == 0 ? 0 : GW_EIO;
  size_t got = rc ? 0 : fread(first8, 1, sizeof(first8), fp);
  if (!rc) rc = header_length(first8, got < ST_LEN_BYTES ? got : (size_t)sb.st_size, &hdr_len, err, err_len);
  uint8_t *hdr = rc ? NULL : malloc(hdr_len ? hdr_len : 1);
  if (!rc && !hdr) rc = GW_ENOMEM;
  if (!rc && fread(hdr, 1, hdr_len, fp) != hdr_len) rc = st_fail(err, err_len, "%s: short read", path);
  fclose(fp);
  if (!rc) {
    out->len = (size_t)sb.st_size;
    rc = parse_header(out, hdr, hdr_len, out->len - ST_LEN_BYTES - hdr_len, err, err_len);
  }
  if (rc) {
    st_free(out);
    free(hdr);
    return rc;
  }
  out->owned = hdr; /* the JSON was parsed from it; data stays on disk */
  return 0;
}

void st_free(st_file *f) {
  if (!f) return;
  json_decref((json_t *)f->header);
  free(f->tensors);
  free(f->owned);
  memset(f, 0, sizeof(*f));
}

const st_tensor *st_find(const st_file *f, const char *name) {
  for (size_t i = 0; i < f->n_tensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
  json_t *meta = json_object_get((json_t *)f->header, "__metadata__");
  return json_string_value(json_object_get(meta, key));
}

int st_check(const st_file *f, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
             char *err, size_t err_len) {
  const st_tensor *t = st_find(f, name);
  if (!t) return st_fail(err, err_len, "tensor '%s' is missing", name);
  if (t->dtype != dtype)
    return st_fail(err, err_len, "tensor '%s': dtype %s, expected %s", name, st_dtype_name(t->dtype),
                   st_dtype_name(dtype));
  bool same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
  if (!same) {
    char got[128], want[128];
    format_shape(t->shape, t->ndim, got, sizeof(got));
    format_shape(shape, ndim, want, sizeof(want));
    return st_fail(err, err_len, "tensor '%s': shape %s, expected %s", name, got, want);
  }
  return 0;
}

int st_copy(const st_file *f, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
            void *dst, char *err, size_t err_len) {
  int rc = st_check(f, name, dtype, shape, ndim, err, err_len);
  if (rc) return rc;
  const st_tensor *t = st_find(f, name);
  if (t->end > t->begin && !t->data)
    return st_fail(err, err_len, "tensor '%s': only the header was loaded", name);
  if (t->end > t->begin) memcpy(dst, t->data, t->end - t->begin);
  return 0;
}

/* ---- writer -------------------------------------------------------------------- */

void st_writer_init(st_writer *w) {
  memset(w, 0, sizeof(*w));
  w->metadata = json_object();
  if (!w->metadata) w->err = GW_ENOMEM;
}

void st_writer_free(st_writer *w) {
  for (size_t i = 0; i < w->n; i++) free(w->tensors[i].name);
  free(w->tensors);
  json_decref((json_t *)w->metadata);
  memset(w, 0, sizeof(*w));
}

void st_writer_add(st_writer *w, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
                   const void *data) {
  if (w->err) return;
  if (ndim < 0 || ndim > ST_MAX_DIMS || (unsigned)dtype >= ST_DTYPE_COUNT) {
    w->err = GW_EINVAL;
    return;
  }
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    st_writer_tensor *t = realloc(w->tensors, cap * sizeof(*t));
    if (!t) {
      w->err = GW_ENOMEM;
      return;
    }
    w->tensors = t;
    w->cap = cap;
  }
  st_writer_tensor *t = &w->tensors[w->n];
  t->name = strdup(name);
  if (!t->name) {
    w->err = GW_ENOMEM;
    return;
  }
  t->dtype = dtype;
  t->ndim = ndim;
  t->bytes = st_dtype_size(dtype);
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    t->bytes *= (size_t)shape[i];
  }
  t->data = data;
  w->n++;
}

void st_writer_meta(st_writer *w, const char *key, const char *value) {
  if (!w->err && json_object_set_new((json_t *)w->metadata, key, json_string(value)) != 0)
    w->err = GW_ENOMEM;
}

size_t st_writer_data_bytes(const st_writer *w) {
  size_t total = 0;
  for (size_t i = 0; i < w->n; i++) total += w->tensors[i].bytes;
  return total;
}

static json_t *tensor_entry(const st_writer_tensor *t, size_t begin) {
  json_t *shape = json_array();
  for (int i = 0; shape && i < t->ndim; i++) json_array_append_new(shape, json_integer(t->shape[i]));
  return json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t->dtype), "shape", shape,
                   "data_offsets", (json_int_t)begin, (json_int_t)(begin + t->bytes));
}

int st_writer_header(st_writer *w, uint8_t **out, size_t *len) {
  *out = NULL;
  if (w->err) return w->err;
  json_t *root = json_object();
  int rc = root ? 0 : GW_ENOMEM;
  if (!rc && json_object_size((json_t *)w->metadata))
    rc = json_object_set((json_t *)root, "__metadata__", (json_t *)w->metadata) ? GW_ENOMEM : 0;
  size_t pos = 0;
  for (size_t i = 0; !rc && i < w->n; i++) {
    json_t *e = tensor_entry(&w->tensors[i], pos);
    if (!e || json_object_set_new(root, w->tensors[i].name, e) != 0) rc = GW_ENOMEM;
    pos += w->tensors[i].bytes;
  }
  char *js = rc ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (!js) return rc ? rc : GW_ENOMEM;
  /* Pad with spaces so the data starts 8-byte aligned, as the reference
   * writer does. */
  size_t n = strlen(js), padded = (n + 7) / 8 * 8;
  uint8_t *buf = malloc(ST_LEN_BYTES + padded);
  if (!buf) {
    free(js);
    return GW_ENOMEM;
  }
  for (int i = 0; i < ST_LEN_BYTES; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  memcpy(buf + ST_LEN_BYTES, js, n);
  memset(buf + ST_LEN_BYTES + n, ' ', padded - n);
  free(js);
  *out = buf;
  *len = ST_LEN_BYTES + padded;
  return 0;
}

int st_writer_save(st_writer *w, const char *path) {
  uint8_t *hdr = NULL;
  size_t hdr_len = 0;
  int rc = st_writer_header(w, &hdr, &hdr_len);
  if (rc) return rc;
  const void **parts = calloc(w->n + 1, sizeof(*parts));
  size_t *lens = calloc(w->n + 1, sizeof(*lens));
  if (!parts || !lens) {
    rc = GW_ENOMEM;
  } else {
    parts[0] = hdr;
    lens[0] = hdr_len;
    for (size_t i = 0; i < w->n; i++) {
      parts[i + 1] = w->tensors[i].data;
      lens[i + 1] = w->tensors[i].bytes;
    }
    rc = gw_file_write_atomic(path, (const void *const *)parts, lens, w->n + 1, 0644);
  }
  free(parts);
  free(lens);
  free(hdr);
  return rc;
}
