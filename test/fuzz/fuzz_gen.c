/* test/fuzz/fuzz_gen.c — see fuzz_gen.h. */
#include "fuzz_gen.h"

#include <stdlib.h>
#include <string.h>

#include "fuzz_targets.h"

static const char *out_root;
static unsigned n_written;

void gen_set_out(const char *root) { out_root = root; }

unsigned gen_written(void) { return n_written; }

void gen_write(const char *sub, const uint8_t *bytes, size_t len) {
  fuzz_corpus_write(out_root, sub, bytes, len);
  n_written++;
}

void gen_put(gen_buf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) exit(1);
  }
  if (n) memcpy(b->p + b->n, src, n);
  b->n += n;
}

void gen_put8(gen_buf *b, uint8_t v) { gen_put(b, &v, 1); }

void gen_put16(gen_buf *b, uint16_t v) {
  gen_put8(b, (uint8_t)v);
  gen_put8(b, (uint8_t)(v >> 8));
}

void gen_put32(gen_buf *b, uint32_t v) {
  gen_put16(b, (uint16_t)v);
  gen_put16(b, (uint16_t)(v >> 16));
}

void gen_put_msg(gen_buf *b, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *tmp = malloc(n ? n : 1);
  if (!tmp) exit(1);
  protobuf_c_message_pack(m, tmp);
  gen_put(b, tmp, n);
  free(tmp);
}

void gen_flush(const char *sub, gen_buf *b) {
  gen_write(sub, b->p, b->n);
  free(b->p);
  memset(b, 0, sizeof(*b));
}
