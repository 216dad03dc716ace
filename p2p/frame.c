#include "p2p/frame.h"

#include <stdlib.h>
#include <string.h>

#include "proto/gwtf.pb-c.h"
#include "util/err.h"

/* Records at least this long are read straight into their own buffer. */
#define RX_DIRECT_MIN ((size_t)16 << 10)
/* A record buffer up to this size is kept for the next record (steady
 * streams of tensor frames then allocate once); larger ones are freed. */
#define RX_KEEP_MAX ((size_t)8 << 20)
/* The payload's plaintext starts one byte into its record (after the
 * encrypted tag), so the record starts one byte before the alignment. */
#define RX_PAYLOAD_OFF (P2P_PAYLOAD_ALIGN - 1)

#define TAG_MESSAGE (crypto_secretstream_xchacha20poly1305_TAG_MESSAGE)
#define TAG_FINAL (crypto_secretstream_xchacha20poly1305_TAG_FINAL)

/* ---- channel ---- */

void p2p_channel_init_tx(p2p_channel *ch, const uint8_t key[32], uint8_t header[P2P_STREAM_HEADER_BYTES]) {
  crypto_secretstream_xchacha20poly1305_init_push(&ch->tx, header, key);
}

void p2p_channel_init_rx(p2p_channel *ch, const uint8_t key[32], const uint8_t header[P2P_STREAM_HEADER_BYTES]) {
  /* init_pull cannot fail for a header of the right size: any 24 bytes are
   * a nonce; a wrong header shows up as the first record failing to open. */
  crypto_secretstream_xchacha20poly1305_init_pull(&ch->rx, header, key);
  ch->rx_final = false;
}

void p2p_channel_wipe(p2p_channel *ch) { sodium_memzero(ch, sizeof(*ch)); }

/* ---- tensors ---- */

size_t p2p_dtype_size(uint32_t dtype) {
  switch (dtype) {
  case GWTF__DTYPE__DTYPE_F32:
  case GWTF__DTYPE__DTYPE_I32: return 4;
  case GWTF__DTYPE__DTYPE_F16:
  case GWTF__DTYPE__DTYPE_BF16:
  case GWTF__DTYPE__DTYPE_U16: return 2;
  case GWTF__DTYPE__DTYPE_U8:
  case GWTF__DTYPE__DTYPE_Q8ROW:
  case GWTF__DTYPE__DTYPE_R4ROW:
  case GWTF__DTYPE__DTYPE_R3ROW:
  case GWTF__DTYPE__DTYPE_R2ROW:
  case GWTF__DTYPE__DTYPE_LR8:
  case GWTF__DTYPE__DTYPE_LR16:
  case GWTF__DTYPE__DTYPE_LR32:
  case GWTF__DTYPE__DTYPE_LR32R4:
  case GWTF__DTYPE__DTYPE_R5ROW:
  case GWTF__DTYPE__DTYPE_LR16R4: return 1;
  default: return 0;
  }
}

int p2p_tensor_check(const p2p_tensor *t, uint64_t nbytes) {
  if (t->ndim > P2P_TENSOR_MAX_DIMS) return GW_EINVAL;
  if (t->total != 0 && (t->offset > t->total || nbytes > t->total - t->offset)) return GW_EINVAL;
  if (t->dtype == GWTF__DTYPE__DTYPE_UNSPECIFIED) return t->ndim == 0 ? 0 : GW_EINVAL; /* raw bytes */
  size_t esize = p2p_dtype_size(t->dtype);
  if (esize == 0) return GW_EINVAL;
  uint64_t whole = t->total ? t->total : nbytes;
  if (t->ndim == 0) return whole % esize == 0 ? 0 : GW_EINVAL;
  uint64_t n = esize;
  for (uint32_t i = 0; i < t->ndim; i++) {
    if (t->shape[i] != 0 && n > UINT64_MAX / t->shape[i]) return GW_EINVAL;
    n *= t->shape[i];
  }
  return n == whole ? 0 : GW_EINVAL;
}

/* ---- sealing ---- */

static void fill_envelope(Gwtf__Envelope *env, Gwtf__TensorHeader *th, const gw_id *sender, const p2p_msg *msg,
                          bool has_payload) {
  env->type = msg->type;
  env->request_id = msg->request_id;
  env->sender.data = (uint8_t *)sender->b;
  env->sender.len = GW_ID_BYTES;
  env->body.data = (uint8_t *)msg->body;
  env->body.len = msg->body ? msg->body_len : 0;
  if (!has_payload) return;
  const p2p_tensor *t = msg->tensor;
  if (t) {
    th->dtype = (Gwtf__DType)t->dtype;
    th->n_shape = t->ndim;
    th->shape = (uint64_t *)t->shape;
    th->name = (char *)(t->name ? t->name : "");
    th->offset = t->offset;
    th->total = t->total;
  }
  th->nbytes = msg->data_len;
  env->tensor = th;
}

int p2p_frame_seal(p2p_channel *ch, const gw_id *sender, const p2p_msg *msg, bool final, size_t max_frame,
                   uint8_t **out, size_t *out_len) {
  Gwtf__Envelope env = GWTF__ENVELOPE__INIT;
  Gwtf__TensorHeader th = GWTF__TENSOR_HEADER__INIT;
  bool has_payload = msg->tensor != NULL || msg->data_len > 0;
  if (msg->tensor && msg->tensor->ndim > P2P_TENSOR_MAX_DIMS) return GW_EINVAL;
  if (has_payload && msg->tensor && p2p_tensor_check(msg->tensor, msg->data_len) != 0) return GW_EINVAL;
  if (has_payload && final) return GW_EINVAL;
  fill_envelope(&env, &th, sender, msg, has_payload);
  size_t head = gwtf__envelope__get_packed_size(&env);
  if (head > P2P_HEAD_MAX || head > max_frame || msg->data_len > max_frame - head) return GW_ERANGE;
  size_t head_rec = head + P2P_ABYTES;
  size_t total = P2P_LEN_BYTES + head_rec + (has_payload ? msg->data_len + P2P_ABYTES : 0);
  uint8_t *buf = malloc(total);
  if (!buf) return GW_ENOMEM;
  buf[0] = (uint8_t)(head_rec >> 24);
  buf[1] = (uint8_t)(head_rec >> 16);
  buf[2] = (uint8_t)(head_rec >> 8);
  buf[3] = (uint8_t)head_rec;
  /* The envelope is packed where its ciphertext goes (after the one-byte
   * encrypted tag) and sealed in place: secretstream encrypts by XOR into
   * the same position, so no second buffer is needed. */
  uint8_t *rec = buf + P2P_LEN_BYTES;
  gwtf__envelope__pack(&env, rec + 1);
  crypto_secretstream_xchacha20poly1305_push(&ch->tx, rec, NULL, rec + 1, head, NULL, 0,
                                             final ? TAG_FINAL : TAG_MESSAGE);
  if (has_payload)
    crypto_secretstream_xchacha20poly1305_push(&ch->tx, rec + head_rec, NULL, msg->data, msg->data_len, NULL, 0,
                                               TAG_MESSAGE);
  *out = buf;
  *out_len = total;
  return 0;
}

/* ---- opening ---- */

static int reject(const char **why, const char *reason, int rc) {
  if (why) *why = reason;
  return rc;
}

/* Decrypts rec in place; the plaintext is rec[1 .. len - 16). */
static int open_record(p2p_channel *ch, uint8_t *rec, size_t len, unsigned char *tag) {
  if (len < P2P_ABYTES) return GW_EPROTO;
  unsigned long long mlen = 0;
  if (crypto_secretstream_xchacha20poly1305_pull(&ch->rx, rec + 1, &mlen, tag, rec, len, NULL, 0) != 0)
    return GW_EAUTH;
  return 0;
}

static int head_tensor(const Gwtf__TensorHeader *th, size_t head_len, size_t max_frame, p2p_head *out,
                       const char **why) {
  if (th->n_shape > P2P_TENSOR_MAX_DIMS) return reject(why, "tensor", GW_EPROTO);
  if (th->nbytes > max_frame - head_len) return reject(why, "oversize", GW_ERANGE);
  p2p_tensor *t = &out->tensor;
  t->dtype = (uint32_t)th->dtype;
  t->ndim = (uint32_t)th->n_shape;
  for (size_t i = 0; i < th->n_shape; i++) t->shape[i] = th->shape[i];
  t->name = th->name;
  t->offset = th->offset;
  t->total = th->total;
  if (p2p_tensor_check(t, th->nbytes) != 0) return reject(why, "tensor", GW_EPROTO);
  out->has_tensor = true;
  out->payload_bytes = th->nbytes;
  return 0;
}

int p2p_frame_open_head(p2p_channel *ch, uint8_t *rec, size_t len, const gw_id *peer, size_t max_frame,
                        p2p_head *out, const char **why) {
  memset(out, 0, sizeof(*out));
  if (ch->rx_final) return reject(why, "after-final", GW_EPROTO);
  unsigned char tag = 0;
  int rc = open_record(ch, rec, len, &tag);
  if (rc != 0) return reject(why, rc == GW_EAUTH ? "auth" : "decode", rc);
  size_t head_len = len - P2P_ABYTES;
  if (head_len > max_frame) return reject(why, "oversize", GW_ERANGE);
  Gwtf__Envelope *env = gwtf__envelope__unpack(NULL, head_len, rec + 1);
  if (!env) return reject(why, "decode", GW_EPROTO);
  out->env = env;
  if (env->sender.len != 0 &&
      (env->sender.len != GW_ID_BYTES || memcmp(env->sender.data, peer->b, GW_ID_BYTES) != 0)) {
    p2p_head_clear(out);
    return reject(why, "sender", GW_EPROTO);
  }
  if (env->tensor && (rc = head_tensor(env->tensor, head_len, max_frame, out, why)) != 0) {
    p2p_head_clear(out);
    return rc;
  }
  if (tag == TAG_FINAL) {
    ch->rx_final = true;
    out->final = true;
    if (out->has_tensor) {
      p2p_head_clear(out);
      return reject(why, "final-with-payload", GW_EPROTO);
    }
  }
  return 0;
}

int p2p_frame_open_payload(p2p_channel *ch, uint8_t *rec, size_t len, const char **why) {
  unsigned char tag = 0;
  int rc = open_record(ch, rec, len, &tag);
  if (rc != 0) return reject(why, rc == GW_EAUTH ? "auth" : "decode", rc);
  if (tag != TAG_MESSAGE) return reject(why, "payload-tag", GW_EPROTO);
  return 0;
}

void p2p_head_clear(p2p_head *h) {
  if (h->env) gwtf__envelope__free_unpacked(h->env, NULL);
  memset(h, 0, sizeof(*h));
}

void p2p_head_to_msg(const p2p_head *h, void *payload_owner, const uint8_t *payload, p2p_msg *msg) {
  memset(msg, 0, sizeof(*msg));
  msg->type = h->env->type;
  msg->request_id = h->env->request_id;
  msg->body = h->env->body.data;
  msg->body_len = h->env->body.len;
  if (h->has_tensor) {
    msg->tensor = &h->tensor;
    msg->data = payload;
    msg->data_len = (size_t)h->payload_bytes;
    msg->own_ = payload_owner;
  }
}

void *p2p_msg_keep(p2p_msg *msg) {
  p2p_rx *rx = msg->own_;
  msg->own_ = NULL;
  return rx ? p2p_rx_take(rx) : NULL;
}

/* ---- p2p_rx ---- */

void p2p_rx_init(p2p_rx *rx, size_t max_frame) {
  memset(rx, 0, sizeof(*rx));
  rx->max_frame = max_frame;
}

void p2p_rx_free(p2p_rx *rx) {
  free(rx->big);
  memset(rx, 0, sizeof(*rx));
}

/* Sets up the buffer for a record of size bytes, its first byte at
 * big + off when it must live on the heap. Called only with sizes already
 * checked against the limits. */
static int start_record(p2p_rx *rx, size_t size, size_t off, bool heap) {
  rx->need = size;
  rx->have = 0;
  rx->ready = false;
  if (!heap && size <= sizeof(rx->small)) {
    rx->rec = rx->small;
    return 0;
  }
  if (!rx->big || rx->big_cap < size + off) {
    free(rx->big);
    rx->big = NULL;
    rx->big_cap = 0;
    void *p = NULL;
    if (posix_memalign(&p, P2P_PAYLOAD_ALIGN, size + off) != 0) return GW_ENOMEM;
    rx->big = p;
    rx->big_cap = size + off;
    if (rx->big_cap > rx->hwm) rx->hwm = rx->big_cap;
  }
  rx->big_off = off;
  rx->rec = rx->big + off;
  return 0;
}

/* Between records: drop a large buffer rather than pin it to an idle session. */
static void next_record(p2p_rx *rx) {
  if (rx->big && rx->big_cap > RX_KEEP_MAX) {
    free(rx->big);
    rx->big = NULL;
    rx->big_cap = 0;
  }
  rx->rec = NULL;
  rx->need = rx->have = 0;
  rx->ready = false;
  rx->in_len = false;
  rx->len_have = 0;
}

void p2p_rx_expect_raw(p2p_rx *rx, size_t n) {
  next_record(rx);
  rx->kind = P2P_RX_RAW;
  start_record(rx, n, 0, false); /* raw records are handshake-sized: never on the heap */
}

void p2p_rx_expect_head(p2p_rx *rx) {
  next_record(rx);
  rx->kind = P2P_RX_HEAD;
  rx->in_len = true;
}

int p2p_rx_expect_payload(p2p_rx *rx, uint64_t plain_bytes) {
  next_record(rx);
  rx->kind = P2P_RX_PAYLOAD;
  if (plain_bytes > rx->max_frame) return GW_ERANGE;
  return start_record(rx, (size_t)plain_bytes + P2P_ABYTES, RX_PAYLOAD_OFF, true);
}

static int read_length(p2p_rx *rx) {
  uint32_t len = (uint32_t)rx->lenbuf[0] << 24 | (uint32_t)rx->lenbuf[1] << 16 | (uint32_t)rx->lenbuf[2] << 8 |
                 rx->lenbuf[3];
  size_t head_max = rx->max_frame < P2P_HEAD_MAX ? rx->max_frame : P2P_HEAD_MAX;
  /* Both checks come before any allocation: a 4 GiB prefix costs nothing. */
  if (len > head_max + P2P_ABYTES) return GW_ERANGE;
  if (len < P2P_ABYTES) return GW_EPROTO;
  rx->in_len = false;
  return start_record(rx, len, 0, false);
}

long p2p_rx_feed(p2p_rx *rx, const uint8_t *data, size_t n) {
  size_t used = 0;
  while (used < n && !rx->ready) {
    if (rx->kind == P2P_RX_HEAD && rx->in_len) {
      size_t take = P2P_LEN_BYTES - rx->len_have;
      if (take > n - used) take = n - used;
      memcpy(rx->lenbuf + rx->len_have, data + used, take);
      rx->len_have += take;
      used += take;
      if (rx->len_have == P2P_LEN_BYTES) {
        int rc = read_length(rx);
        if (rc != 0) return rc;
      }
      continue;
    }
    if (!rx->rec) return GW_EINVAL; /* no record expected */
    size_t take = rx->need - rx->have;
    if (take > n - used) take = n - used;
    memcpy(rx->rec + rx->have, data + used, take);
    rx->have += take;
    used += take;
    if (rx->have == rx->need) rx->ready = true;
  }
  return (long)used;
}

bool p2p_rx_window(p2p_rx *rx, uint8_t **p, size_t *n) {
  if (rx->ready || rx->in_len || !rx->rec || rx->rec == rx->small) return false;
  if (rx->need - rx->have < RX_DIRECT_MIN) return false;
  *p = rx->rec + rx->have;
  *n = rx->need - rx->have;
  return true;
}

void p2p_rx_commit(p2p_rx *rx, size_t n) {
  rx->have += n;
  if (rx->have == rx->need) rx->ready = true;
}

void p2p_rx_record(p2p_rx *rx, uint8_t **rec, size_t *len) {
  *rec = rx->rec;
  *len = rx->need;
  rx->ready = false;
}

void *p2p_rx_take(p2p_rx *rx) {
  if (!rx->rec || rx->rec == rx->small) return NULL;
  void *p = rx->big;
  rx->big = NULL;
  rx->big_cap = 0;
  rx->rec = NULL;
  return p;
}

bool p2p_rx_partial(const p2p_rx *rx) {
  if (rx->kind == P2P_RX_HEAD && rx->in_len) return rx->len_have > 0;
  return rx->rec && rx->have > 0 && rx->have < rx->need;
}
