/* test/fuzz/fuzz_gen.h — what the seed-corpus writers share (fuzz_gen_corpus2
 * and its fuzz_gen_corpus2_*.c parts): a growable byte buffer that writes one
 * corpus file under the output folder. */
#ifndef GWTF_TEST_FUZZ_GEN_H
#define GWTF_TEST_FUZZ_GEN_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gen_buf {
  uint8_t *p;
  size_t n, cap;
} gen_buf;

/* Where gen_write and gen_flush put files: OUT/<sub>/<hash>. */
void gen_set_out(const char *out_root);
unsigned gen_written(void); /* files written so far */

void gen_write(const char *sub, const uint8_t *bytes, size_t len);
void gen_put(gen_buf *b, const void *src, size_t n); /* exits on out of memory */
void gen_put8(gen_buf *b, uint8_t v);
void gen_put16(gen_buf *b, uint16_t v); /* little endian */
void gen_put32(gen_buf *b, uint32_t v); /* little endian */
void gen_put_msg(gen_buf *b, const ProtobufCMessage *m); /* packed protobuf */
/* Writes b as one file of `sub` and empties it. */
void gen_flush(const char *sub, gen_buf *b);

/* The corpus parts kept in files of their own. */
void gen_train_corpus(void); /* train_msg: fuzz_gen_corpus2_train.c */

#endif
