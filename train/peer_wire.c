/* train/peer_wire.c — compression of activations and their gradients on
 * each link (--wire-dtype), negotiated through HELLO.
 *
 * Every peer says in its HELLO which wire dtypes it accepts and which one it
 * would like to send. A sender uses its wish on a link only once the
 * receiver's HELLO accepted it; until then, and towards a peer that does not
 * accept it (or predates compression: its HELLO has no mask), it sends F32.
 * A receiver takes any dtype it accepts, so a change on one side needs no
 * handshake. Weights and aggregation traffic never go through here.
 *
 * No error feedback for the gradients: the residual of one microbatch's
 * quantized gradient cannot correct another's. The gradient w.r.t. an
 * activation is per sample; the sender's parameter gradient is J_i^T g_i
 * with J_i different for each microbatch i, so adding microbatch i's
 * residual to microbatch j's gradient injects J_j^T e_i, noise, not a
 * correction (error feedback telescopes only for a quantity that is summed
 * as is, like a parameter gradient). Per (microbatch, hop) there is nothing
 * to carry it into either: each gradient crosses each hop once. Round to
 * nearest keeps the error small instead: <= 2^-8 relative (bf16) or half a
 * step of the row's scale (int8). */
#include "train/peer_internal.h"

#include <stdlib.h>
#include <string.h>

#include "train/wire_codec.h"
#include "util/err.h"

static uint32_t my_accept(const train_peer *p) {
  return (p->cfg.wire_accept ? p->cfg.wire_accept : WIRE_ACCEPT_ALL) | WIRE_BIT(TRAIN_F32);
}

static train_dtype my_want(const train_peer *p) {
  return wire_dtype_ok(p->cfg.wire_dtype) ? p->cfg.wire_dtype : TRAIN_F32;
}

static const peer_wire_link *link_find(const train_peer *p, const gw_id *id) {
  for (uint32_t i = 0; i < p->n_wire; i++)
    if (gw_id_eq(&p->wire[i].id, id)) return &p->wire[i];
  return NULL;
}

void wire_fill_hello(const train_peer *p, Gwtf__TrainHello *h) {
  h->wire_accept = my_accept(p);
  h->wire_dtype = (uint32_t)my_want(p);
}

bool wire_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h) {
  peer_wire_link *l = (peer_wire_link *)link_find(p, from);
  bool fresh = !l;
  if (!l) {
    if (p->n_wire < PEER_WIRE_MAX) {
      l = &p->wire[p->n_wire++];
    } else { /* forget the neighbour heard from least recently */
      l = &p->wire[0];
      for (uint32_t i = 1; i < p->n_wire; i++)
        if (p->wire[i].at_ms < l->at_ms) l = &p->wire[i];
    }
    memset(l, 0, sizeof(*l));
    l->id = *from;
    l->to = l->from = TRAIN_F32;
  }
  l->at_ms = p->now;
  /* A mask from the network: only the dtypes we know count. */
  l->accept = (h->wire_accept & WIRE_ACCEPT_ALL) | WIRE_BIT(TRAIN_F32);
  l->want = h->wire_dtype < 32 && wire_dtype_ok((train_dtype)h->wire_dtype) ? (train_dtype)h->wire_dtype : TRAIN_F32;
  train_dtype to = (l->accept & WIRE_BIT(my_want(p))) ? my_want(p) : TRAIN_F32;
  train_dtype fr = (my_accept(p) & WIRE_BIT(l->want)) ? l->want : TRAIN_F32;
  if (to != l->to || fr != l->from) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_INFO(&p->log, "wire.negotiated", "peer=%s to=%s from=%s wanted=%s", who, wire_dtype_name(to),
            wire_dtype_name(fr), wire_dtype_name(my_want(p)));
  }
  l->to = to;
  l->from = fr;
  return fresh && l->want != TRAIN_F32;
}

train_dtype train_peer_wire_to(const train_peer *p, const gw_id *peer) {
  const peer_wire_link *l = link_find(p, peer);
  return l ? l->to : TRAIN_F32;
}

train_dtype train_peer_wire_from(const train_peer *p, const gw_id *peer) {
  const peer_wire_link *l = link_find(p, peer);
  return l ? l->from : TRAIN_F32;
}

static size_t act_rows(const train_peer *p) { return (size_t)p->cfg.shape.B * (size_t)p->cfg.shape.T; }

static int send_counted(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg,
                        const train_tensor *t) {
  int rc = peer_send(p, to, type, msg, t);
  if (rc == 0) {
    p->counters.wire_tensors++;
    p->counters.wire_bytes += t->nbytes;
    p->counters.wire_f32_bytes += peer_act_floats(p) * sizeof(float);
  }
  return rc;
}

int wire_send_act(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg, const float *data) {
  train_tensor t;
  peer_tensor_f32(&t, data, p->cfg.shape.B, p->cfg.shape.T, p->cfg.shape.C);
  train_dtype d = train_peer_wire_to(p, to);
  if (d == TRAIN_F32) return send_counted(p, to, type, msg, &t);
  size_t rows = act_rows(p), cols = (size_t)p->cfg.shape.C, need = wire_bytes(d, rows, cols);
  if (need > p->wire_buf_len) {
    uint8_t *b = realloc(p->wire_buf, need);
    if (!b) return send_counted(p, to, type, msg, &t); /* F32 is always accepted */
    p->wire_buf = b;
    p->wire_buf_len = need;
  }
  if (wire_encode(d, data, rows, cols, p->wire_buf, need) != 0) return send_counted(p, to, type, msg, &t);
  t.dtype = d;
  if (d == TRAIN_Q8ROW) t.shape[2] += 4; /* each row: its 4-byte scale, then C bytes */
  t.data = p->wire_buf;
  t.nbytes = need;
  return send_counted(p, to, type, msg, &t);
}

bool wire_act_ok(const train_peer *p, const train_tensor *t) {
  if (!t || t->dtype >= 32 || !wire_dtype_ok(t->dtype) || !(my_accept(p) & WIRE_BIT(t->dtype))) return false;
  size_t rows = act_rows(p), cols = (size_t)p->cfg.shape.C;
  uint64_t last = (uint64_t)cols + (t->dtype == TRAIN_Q8ROW ? 4 : 0);
  /* A header without a shape (raw bytes) is fine as long as the size is. */
  if (t->ndim == 3 && (t->shape[0] != (uint64_t)p->cfg.shape.B || t->shape[1] != (uint64_t)p->cfg.shape.T ||
                       t->shape[2] != last))
    return false;
  if (t->ndim != 3 && t->ndim != 0) return false;
  size_t need = wire_bytes(t->dtype, rows, cols);
  if (need == 0 || t->nbytes != need) return false;
  return wire_check(t->dtype, t->data, t->nbytes, rows, cols) == 0;
}

float *wire_act_decode(const train_peer *p, const train_tensor *t) {
  size_t rows = act_rows(p), cols = (size_t)p->cfg.shape.C;
  float *f = malloc(rows * cols * sizeof(float));
  if (f && wire_decode(t->dtype, t->data, t->nbytes, rows, cols, f) != 0) {
    free(f);
    return NULL;
  }
  return f;
}

void wire_free(train_peer *p) {
  free(p->wire_buf);
  p->wire_buf = NULL;
  p->wire_buf_len = 0;
}
