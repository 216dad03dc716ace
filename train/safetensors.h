/* train/safetensors.h — a small reader and writer for the safetensors format
 * (module prefix st_).
 *
 * Layout: 8-byte little-endian header length n, n bytes of JSON header
 * (padded with spaces to a multiple of 8), then the raw data. The header
 * maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * with offsets relative to the data start; "__metadata__" maps strings to
 * strings. These are the files PyTorch users read with the `safetensors`
 * package (scripts/st_load.py is a dependency-free reader for checking).
 *
 * The reader treats every file as hostile: it checks the header length
 * against the file size before parsing, rejects duplicate names, unknown
 * dtypes, shapes whose byte size does not match their offsets, offsets past
 * the data, overlapping tensors and holes in the data (the rule of the
 * reference implementation), and non-string metadata. Every failure
 * returns GW_EINVAL with a sentence naming the tensor and the problem. */
#ifndef GWTF_TRAIN_SAFETENSORS_H
#define GWTF_TRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS (8)
#define ST_MAX_HEADER (100u * 1024u * 1024u) /* the reference implementation's limit */
#define ST_ERR_MAX (256)                     /* a good size for err buffers */

typedef enum st_dtype {
  ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_F64, ST_I64,
  ST_U64, ST_DTYPE_COUNT
} st_dtype;

/* "F32", "I32", ... */
const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

typedef struct st_tensor {
  const char *name; /* points into the parsed header; valid until st_free */
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  size_t begin, end;   /* byte offsets within the data section */
  const uint8_t *data; /* file bytes (NULL after st_load_header); may be unaligned: use st_copy */
} st_tensor;

typedef struct st_file {
  uint8_t *owned;      /* the file buffer when st_load read it */
  const uint8_t *buf;
  size_t len;
  void *header;        /* the parsed JSON (json_t *) */
  st_tensor *tensors;  /* sorted by begin offset */
  size_t n_tensors;
} st_file;

/* Parses buf (which must outlive the st_file). Returns 0 or GW_EINVAL. */
int st_parse(const uint8_t *buf, size_t len, st_file *out, char *err, size_t err_len);
/* Reads and parses a file of at most max_len bytes (GW_ERANGE when
 * larger; file errors as from gw_file_read_all). */
int st_load(const char *path, size_t max_len, st_file *out, char *err, size_t err_len);
/* Reads and checks only the header (the data offsets against the file's
 * size): metadata and shapes without reading the data. Tensors have
 * data == NULL and st_copy refuses them. */
int st_load_header(const char *path, st_file *out, char *err, size_t err_len);
void st_free(st_file *f);

/* The tensor called name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* The metadata value for key, or NULL. */
const char *st_meta(const st_file *f, const char *key);

/* Checks that tensor `name` exists, has dtype `dtype` and exactly the
 * given shape; each check fails with GW_EINVAL and a sentence
 * ("tensor 'x': shape [3,4], expected [4,4]"). */
int st_check(const st_file *f, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
             char *err, size_t err_len);
/* st_check, then copies the tensor's bytes into dst. */
int st_copy(const st_file *f, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
            void *dst, char *err, size_t err_len);

/* ---- writer ----------------------------------------------------------------------
 * Tensors are appended in order and laid out back to back; data is not
 * copied, so every pointer must stay valid until the file is written. */

typedef struct st_writer_tensor {
  char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  const void *data;
  size_t bytes;
} st_writer_tensor;

typedef struct st_writer {
  st_writer_tensor *tensors;
  size_t n, cap;
  void *metadata; /* json_t * */
  int err;        /* first failure of add/meta, returned by header/save */
} st_writer;

void st_writer_init(st_writer *w);
void st_writer_free(st_writer *w);
/* data may be NULL when only the header is wanted (st_writer_header). */
void st_writer_add(st_writer *w, const char *name, st_dtype dtype, const int64_t *shape, int ndim,
                   const void *data);
void st_writer_meta(st_writer *w, const char *key, const char *value);
/* The 8-byte length and the padded JSON header, malloc'd. */
int st_writer_header(st_writer *w, uint8_t **out, size_t *len);
/* Bytes of the data section (sum of all tensors). */
size_t st_writer_data_bytes(const st_writer *w);
/* Writes the file atomically (util/file.h) with mode 0644. */
int st_writer_save(st_writer *w, const char *path);

#endif
