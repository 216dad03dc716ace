#include "train/data.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/rng.h"


/* Returns the offset of the first byte that breaks UTF-8, or len when valid.
 * Overlong forms and surrogates are rejected, as the standard requires. */
static size_t utf8_invalid_at(const uint8_t *s, size_t len) {
  size_t i = 0;
  while (i < len) {
    uint8_t c = s[i];
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + n > len) return i;
    for (size_t k = 1; k < n; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n;
  }
  return len;
}

static int open_tokens(train_dataset *ds, const char *path, char *err, size_t err_len) {
  const int32_t *hdr = ds->map;
  if (hdr[1] != 1)
    return gw_fail(err, err_len, GW_EINVAL,
                "%s: llm.c token file version %d is not supported (only version 1, uint16 tokens)", path,
                (int)hdr[1]);
  size_t body = ds->map_len - TRAIN_LLMC_HEADER_INTS * sizeof(int32_t);
  if (hdr[2] < 0 || (size_t)hdr[2] * sizeof(uint16_t) != body)
    return gw_fail(err, err_len, GW_EINVAL, "%s: header says %d tokens but the file holds %zu", path, (int)hdr[2],
                body / sizeof(uint16_t));
  ds->kind = TRAIN_DATA_TOKENS_U16;
  ds->toks = (const uint16_t *)(hdr + TRAIN_LLMC_HEADER_INTS);
  ds->n_tokens = (size_t)hdr[2];
  uint16_t max = 0;
  for (size_t i = 0; i < ds->n_tokens; i++)
    if (ds->toks[i] > max) max = ds->toks[i];
  ds->vocab_needed = (uint32_t)max + 1;
  return 0;
}

static int open_text(train_dataset *ds, const char *path, char *err, size_t err_len) {
  size_t bad = utf8_invalid_at(ds->map, ds->map_len);
  if (bad != ds->map_len)
    return gw_fail(err, err_len, GW_EINVAL,
                "%s: not UTF-8 text (invalid byte at offset %zu) and not an llm.c token file", path, bad);
  ds->kind = TRAIN_DATA_TEXT;
  ds->bytes = ds->map;
  ds->n_tokens = ds->map_len;
  ds->vocab_needed = 256;
  return 0;
}

int train_dataset_open(const char *path, train_dataset *ds, char *err, size_t err_len) {
  memset(ds, 0, sizeof(*ds));
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    int code = -errno;
    return gw_fail(err, err_len, code, "%s: cannot open dataset (%s)", path, strerror(-code));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 2) {
    close(fd);
    return gw_fail(err, err_len, GW_ERANGE, "%s: not a regular file with at least 2 bytes", path);
  }
  ds->map_len = (size_t)st.st_size;
  ds->map = mmap(NULL, ds->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (ds->map == MAP_FAILED) {
    ds->map = NULL;
    return gw_fail(err, err_len, GW_EIO, "%s: cannot map the file (%s)", path, strerror(errno));
  }
  const int32_t *hdr = ds->map;
  bool is_tokens = ds->map_len >= TRAIN_LLMC_HEADER_INTS * sizeof(int32_t) && hdr[0] == TRAIN_LLMC_MAGIC;
  int rc = is_tokens ? open_tokens(ds, path, err, err_len) : open_text(ds, path, err, err_len);
  if (rc != 0) train_dataset_close(ds);
  return rc;
}

void train_dataset_close(train_dataset *ds) {
  if (ds->map) munmap(ds->map, ds->map_len);
  memset(ds, 0, sizeof(*ds));
}

void train_dataset_describe(const train_dataset *ds, char *out, size_t out_len) {
  snprintf(out, out_len, "%s, %.1f MB, %zu tokens, vocab>=%u",
           ds->kind == TRAIN_DATA_TEXT ? "utf8-text" : "llmc-u16", (double)ds->map_len / 1e6, ds->n_tokens,
           ds->vocab_needed);
}

static inline int32_t token_at(const train_dataset *ds, size_t i) {
  return ds->kind == TRAIN_DATA_TEXT ? (int32_t)ds->bytes[i] : (int32_t)ds->toks[i];
}

int train_dataset_sample(const train_dataset *ds, uint64_t seed, uint64_t iteration, uint32_t index, int B,
                         int T, int32_t *inputs, int32_t *targets) {
  if (B <= 0 || T <= 0 || ds->n_tokens < (size_t)T + 1) return GW_ERANGE;
  gw_rng rng;
  /* Mix the three coordinates so that nearby (iteration, index) pairs give
   * unrelated streams. */
  gw_rng_seed(&rng, seed ^ (iteration * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)index * 0xc2b2ae3d27d4eb4fULL));
  uint64_t span = ds->n_tokens - (size_t)T; /* start positions with T+1 tokens available */
  for (int b = 0; b < B; b++) {
    size_t pos = (size_t)gw_rng_below(&rng, span);
    for (int t = 0; t < T; t++) {
      inputs[b * T + t] = token_at(ds, pos + (size_t)t);
      targets[b * T + t] = token_at(ds, pos + (size_t)t + 1);
    }
  }
  return 0;
}

/* ---- validation ---- */

int train_dataset_hold_out(train_dataset *ds, double fraction, train_dataset *val) {
  memset(val, 0, sizeof(*val));
  if (!(fraction >= 0 && fraction <= 0.5)) return GW_EINVAL;
  if (fraction == 0) return 0;
  size_t n_val = (size_t)((double)ds->n_tokens * fraction);
  if (n_val < 2 || ds->n_tokens - n_val < 2) return GW_ERANGE;
  size_t cut = ds->n_tokens - n_val;
  *val = *ds;
  val->map = NULL; /* a view: train_dataset_close(val) unmaps nothing */
  val->map_len = 0;
  val->n_tokens = n_val;
  if (ds->kind == TRAIN_DATA_TEXT) val->bytes = ds->bytes + cut;
  else val->toks = ds->toks + cut;
  ds->n_tokens = cut;
  return 0;
}

int train_validation_open(train_dataset *ds, const char *val_path, double fraction, train_dataset *val, char *err,
                          size_t err_len) {
  memset(val, 0, sizeof(*val));
  if (val_path && *val_path) return train_dataset_open(val_path, val, err, err_len);
  int rc = train_dataset_hold_out(ds, fraction, val);
  if (rc == GW_EINVAL) return gw_fail(err, err_len, rc, "validation fraction %g is not in [0, 0.5]", fraction);
  if (rc != 0)
    return gw_fail(err, err_len, rc, "holding out %g of %zu tokens leaves too few for training or validation",
                   fraction, ds->n_tokens);
  return 0;
}

uint32_t train_dataset_val_count(const train_dataset *val, int B, int T) {
  if (B <= 0 || T <= 0 || val->n_tokens < 2) return 0;
  size_t windows = (val->n_tokens - 1) / (size_t)T; /* each needs T+1 tokens from w*T */
  size_t n = windows / (size_t)B;
  return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int train_dataset_val_sample(const train_dataset *val, uint32_t index, int B, int T, int32_t *inputs,
                             int32_t *targets) {
  if (index >= train_dataset_val_count(val, B, T)) return GW_ERANGE;
  for (int b = 0; b < B; b++) {
    size_t pos = ((size_t)index * (size_t)B + (size_t)b) * (size_t)T;
    for (int t = 0; t < T; t++) {
      inputs[b * T + t] = token_at(val, pos + (size_t)t);
      targets[b * T + t] = token_at(val, pos + (size_t)t + 1);
    }
  }
  return 0;
}

/* ---- synthetic corpus ---- */

static const char *const subjects[] = {"the whale", "the captain", "the sea", "a sailor", "the ship",
                                       "the harpooneer", "the mate", "an old man", "the crew", "the wind"};
static const char *const verbs[] = {"follows", "watches", "crosses", "remembers", "fears", "sails past",
                                    "calls to", "waits for", "dreams of", "hunts"};
static const char *const objects[] = {"the white whale", "the dark water", "the long voyage", "the harbour",
                                      "a distant island", "the morning fog", "the silent deck", "the storm",
                                      "the great ocean", "the last light"};
static const char *const endings[] = {".", " at dawn.", " in silence.", " again and again.", " before night.",
                                      " without a word."};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

int train_synth_corpus(const char *path, size_t bytes, uint64_t seed) {
  char *buf = malloc(bytes + 256);
  if (!buf) return GW_ENOMEM;
  gw_rng rng;
  gw_rng_seed(&rng, seed);
  size_t len = 0;
  int sentence = 0;
  while (len < bytes) {
    const char *s = subjects[gw_rng_below(&rng, COUNT(subjects))];
    const char *v = verbs[gw_rng_below(&rng, COUNT(verbs))];
    const char *o = objects[gw_rng_below(&rng, COUNT(objects))];
    const char *e = endings[gw_rng_below(&rng, COUNT(endings))];
    char first[2] = {(char)(s[0] - 'a' + 'A'), 0};
    len += (size_t)snprintf(buf + len, bytes + 256 - len, "%s%s %s %s%s%s", first, s + 1, v, o, e,
                            (++sentence % 6) == 0 ? "\n\n" : " ");
  }
  int rc = gw_file_write_atomic1(path, buf, bytes, 0644);
  free(buf);
  return rc;
}

uint64_t train_dataset_seed_for(const uint8_t id[32]) {
  uint64_t seed = 0;
  for (int i = 0; i < 8; i++) seed = seed << 8 | id[i];
  return seed ? seed : 1;
}
