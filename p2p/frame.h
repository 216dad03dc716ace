/* p2p/frame.h — sealed frames on an encrypted session.
 *
 * After the handshake each side sends the 24-byte header of its
 * crypto_secretstream_xchacha20poly1305 stream, then frames. A frame is one
 * message: a protobuf Envelope (type, request id, sender, body, optional
 * TensorHeader) and, for tensors, the raw bytes. On the wire:
 *
 *   u32be L | head record (L bytes)  | [payload record (nbytes + 17 bytes)]
 *             = secretstream(Envelope)  = secretstream(raw tensor bytes)
 *
 * The payload is its own record so the sender seals it straight from the
 * caller's buffer (the encryption is the only copy) and the receiver, which
 * learns nbytes from the authenticated envelope, decrypts it in place in a
 * buffer it can hand to the upper layer. Every record's position in the
 * stream is authenticated by secretstream's internal counter: a replayed,
 * dropped, reordered or altered record fails to open, and the keys come from
 * this session's handshake, so a record from another session never opens.
 *
 * Limits, checked before anything is allocated: L <= P2P_HEAD_MAX + 17, and
 * head + payload <= the receiver's max_frame. A clean close is a Goodbye
 * sealed with the FINAL tag; a stream that stops without one was cut.
 *
 * Nothing here touches a socket: p2p_rx reassembles records from whatever
 * byte chunks the transport delivers, so tests and fuzzers drive it
 * directly. */
#ifndef GWTF_P2P_FRAME_H
#define GWTF_P2P_FRAME_H

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define P2P_STREAM_HEADER_BYTES (crypto_secretstream_xchacha20poly1305_HEADERBYTES) /* 24 */
#define P2P_ABYTES (crypto_secretstream_xchacha20poly1305_ABYTES)                   /* 17 */
#define P2P_LEN_BYTES (4)
/* Envelopes carry control messages; bulk bytes go in the payload. The cap
 * also bounds what protobuf-c may allocate while decoding one. */
#define P2P_HEAD_MAX ((size_t)1 << 20)
#define P2P_MAX_FRAME_DEFAULT ((size_t)64 << 20)
#define P2P_MAX_FRAME_MIN ((size_t)64 << 10)
#define P2P_TENSOR_MAX_DIMS (8)
/* Received payloads start at this alignment (ready for float or SIMD use). */
#define P2P_PAYLOAD_ALIGN (64)

/* ---- the channel: one secretstream per direction ---- */

typedef struct p2p_channel {
  crypto_secretstream_xchacha20poly1305_state tx;
  crypto_secretstream_xchacha20poly1305_state rx;
  bool rx_final; /* the peer sent FINAL: nothing may follow */
} p2p_channel;

/* Starts the sending stream; header must be sent before any frame. */
void p2p_channel_init_tx(p2p_channel *ch, const uint8_t key[32], uint8_t header[P2P_STREAM_HEADER_BYTES]);
/* Starts the receiving stream from the peer's header. */
void p2p_channel_init_rx(p2p_channel *ch, const uint8_t key[32], const uint8_t header[P2P_STREAM_HEADER_BYTES]);
void p2p_channel_wipe(p2p_channel *ch);

/* ---- messages ---- */

/* Describes payload bytes (gwtf.TensorHeader without the protobuf). */
typedef struct p2p_tensor {
  uint32_t dtype; /* a gwtf.DType value; 0 = raw bytes without a shape */
  uint32_t ndim;
  uint64_t shape[P2P_TENSOR_MAX_DIMS];
  const char *name; /* may be NULL */
  uint64_t offset;  /* chunked transfers: where these bytes sit in the whole tensor */
  uint64_t total;   /* chunked transfers: whole tensor size in bytes; 0 = not chunked */
} p2p_tensor;

/* One message. To send: fill type, request_id, body and, for a payload,
 * tensor + data/data_len (tensor may be NULL for raw bytes). Received
 * messages point into buffers the host owns for the duration of the
 * callback; p2p_msg_keep() takes the payload buffer instead. */
typedef struct p2p_msg {
  uint32_t type; /* a gwtf.MsgType value */
  uint64_t request_id;
  const uint8_t *body;
  size_t body_len;
  const p2p_tensor *tensor;
  const uint8_t *data;
  size_t data_len;
  void *own_; /* private: the received payload buffer (data points inside it) */
} p2p_msg;

/* Takes ownership of a received payload: returns a pointer to pass to
 * free() once done with msg->data (which stays valid and aligned), or NULL
 * when there is no payload. */
void *p2p_msg_keep(p2p_msg *msg);

/* Bytes per element of a gwtf.DType, 0 when unknown. */
size_t p2p_dtype_size(uint32_t dtype);
/* Checks that a tensor description agrees with nbytes of payload: known
 * dtype, ndim <= P2P_TENSOR_MAX_DIMS, shape x element size = nbytes (or
 * = total for a chunk, with offset + nbytes <= total), no overflow. */
int p2p_tensor_check(const p2p_tensor *t, uint64_t nbytes);

/* ---- sealing ---- */

/* Seals msg (sender = our node ID) as one wire frame in a new heap buffer
 * (*out, *out_len bytes; free()). final marks the last frame (Goodbye).
 * Returns 0, GW_ERANGE when the frame would exceed max_frame or the envelope
 * P2P_HEAD_MAX, GW_EINVAL for a bad tensor description, GW_ENOMEM. */
int p2p_frame_seal(p2p_channel *ch, const gw_id *sender, const p2p_msg *msg, bool final, size_t max_frame,
                   uint8_t **out, size_t *out_len);

/* ---- receiving ---- */

/* A decoded head record. */
typedef struct p2p_head {
  struct Gwtf__Envelope *env; /* free with p2p_head_clear */
  p2p_tensor tensor;
  bool has_tensor;
  uint64_t payload_bytes; /* plaintext bytes of the payload record to expect */
  bool final;
} p2p_head;

/* Opens a head record in place (rec is modified), decodes the envelope and
 * checks it against the authenticated peer and our limits. Returns 0, or
 * with *why set: GW_EAUTH ("auth": forged, replayed, reordered or from
 * another session), GW_EPROTO ("decode", "sender", "tensor", "after-final",
 * "final-with-payload"), GW_ERANGE ("oversize"). */
int p2p_frame_open_head(p2p_channel *ch, uint8_t *rec, size_t len, const gw_id *peer, size_t max_frame,
                        p2p_head *out, const char **why);
/* Opens a payload record in place: the plaintext starts at rec + 1. */
int p2p_frame_open_payload(p2p_channel *ch, uint8_t *rec, size_t len, const char **why);
void p2p_head_clear(p2p_head *h);
/* Fills msg from a head (and a payload already opened, or NULL). */
void p2p_head_to_msg(const p2p_head *h, void *payload_base, const uint8_t *payload, p2p_msg *msg);

/* ---- p2p_rx: records out of a byte stream ----
 *
 * Feed it the bytes as they arrive; it says when a whole record is there.
 * Three kinds of record: RAW (a fixed size: handshake messages, stream
 * header), HEAD (length-prefixed) and PAYLOAD (size from the head). Big
 * records are read in place: p2p_rx_window() hands out the spot in the
 * record's own buffer, so a large payload is never copied on the way in.
 * The buffer for a record is allocated only once its size passed the
 * limits, and then exactly that size. */
typedef enum p2p_rx_kind { P2P_RX_RAW = 0, P2P_RX_HEAD = 1, P2P_RX_PAYLOAD = 2 } p2p_rx_kind;

typedef struct p2p_rx {
  size_t max_frame;
  p2p_rx_kind kind;
  bool in_len; /* HEAD: still reading the 4-byte length */
  bool ready;  /* a whole record is there: p2p_rx_record() */
  uint8_t lenbuf[P2P_LEN_BYTES];
  size_t len_have;
  uint8_t small[512]; /* small records (handshake, short envelopes) live here */
  uint8_t *big;       /* larger records: aligned heap buffer */
  size_t big_cap;
  size_t big_off; /* record starts at big + big_off (payload alignment) */
  uint8_t *rec;
  size_t need, have;
  size_t hwm; /* largest record buffer ever allocated (tests prove the limits with it) */
} p2p_rx;

void p2p_rx_init(p2p_rx *rx, size_t max_frame);
void p2p_rx_free(p2p_rx *rx);
/* What the next record is. A PAYLOAD of n plaintext bytes is n + 17 bytes. */
void p2p_rx_expect_raw(p2p_rx *rx, size_t n);
void p2p_rx_expect_head(p2p_rx *rx);
int p2p_rx_expect_payload(p2p_rx *rx, uint64_t plain_bytes);
/* Copies from data until a record completes; returns bytes consumed (>= 0)
 * or GW_ERANGE ("oversize" length prefix) / GW_ENOMEM. */
long p2p_rx_feed(p2p_rx *rx, const uint8_t *data, size_t n);
/* Where the transport may write directly (the rest of a large record), or
 * false when it should read into its own buffer and p2p_rx_feed() it. */
bool p2p_rx_window(p2p_rx *rx, uint8_t **p, size_t *n);
/* n bytes were written at the window. */
void p2p_rx_commit(p2p_rx *rx, size_t n);
/* The complete record; clears ready. */
void p2p_rx_record(p2p_rx *rx, uint8_t **rec, size_t *len);
/* Takes the heap buffer holding the current record (payloads handed to the
 * upper layer); NULL when the record sits in the small buffer. */
void *p2p_rx_take(p2p_rx *rx);
/* True when the stream stopped inside a record (a truncated frame). */
bool p2p_rx_partial(const p2p_rx *rx);

#endif
