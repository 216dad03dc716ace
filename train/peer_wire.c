/* train/peer_wire.c — compression of activations and their gradients on
 * each link (--wire-dtype), negotiated through HELLO.
 *
 * Every peer says in its HELLO which wire dtypes it accepts and which one it
 * would like to send (its activations forward, and, where it differs, its
 * gradients backward: wire_grad_dtype). A sender uses its wish on a link only once the
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
 * step of the row's scale (int8). The rotated formats (rot4/3/2,
 * train/wire_rot.h) rely on the same argument: their error is spread over
 * the row by the rotation and is about 1-12 % of the row's energy. */
#include "train/peer_wire.h"

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

static train_dtype my_want_grad(const train_peer *p) {
  return p->cfg.wire_grad_dtype == 0 ? my_want(p)
         : wire_dtype_ok(p->cfg.wire_grad_dtype) ? p->cfg.wire_grad_dtype : TRAIN_F32;
}

static const peer_wire_link *link_find(const train_peer *p, const gw_id *id) {
  for (uint32_t i = 0; i < p->n_wire; i++)
    if (gw_id_eq(&p->wire[i].id, id)) return &p->wire[i];
  return NULL;
}

void wire_fill_hello(const train_peer *p, Gwtf__TrainHello *h) {
  h->wire_accept = my_accept(p);
  h->wire_dtype = (uint32_t)my_want(p);
  h->wire_grad_dtype = my_want_grad(p) == my_want(p) ? 0u : (uint32_t)my_want_grad(p);
}

/* A dtype from the network: one we know, else F32. */
static train_dtype known_or_f32(uint32_t d) {
  return d < 32 && wire_dtype_ok((train_dtype)d) ? (train_dtype)d : TRAIN_F32;
}

/* What goes on a link one way: the sender's wish if the receiver takes it. */
static train_dtype agree(train_dtype want, uint32_t accept) { return (accept & WIRE_BIT(want)) ? want : TRAIN_F32; }

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
    l->to = l->to_grad = l->from = l->from_grad = TRAIN_F32;
  }
  l->at_ms = p->now;
  /* A mask from the network: only the dtypes we know count. */
  l->accept = (h->wire_accept & WIRE_ACCEPT_ALL) | WIRE_BIT(TRAIN_F32);
  l->want = known_or_f32(h->wire_dtype);
  /* no gradient wish (a peer from before it, or the same): wire_dtype */
  l->want_grad = h->wire_grad_dtype == 0 ? l->want : known_or_f32(h->wire_grad_dtype);
  train_dtype to = agree(my_want(p), l->accept), to_g = agree(my_want_grad(p), l->accept);
  train_dtype fr = agree(l->want, my_accept(p)), fr_g = agree(l->want_grad, my_accept(p));
  if (to != l->to || fr != l->from || to_g != l->to_grad || fr_g != l->from_grad) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_INFO(&p->log, "wire.negotiated", "peer=%s to=%s from=%s to_grad=%s from_grad=%s wanted=%s wanted_grad=%s", who,
            wire_dtype_name(to), wire_dtype_name(fr), wire_dtype_name(to_g), wire_dtype_name(fr_g),
            wire_dtype_name(my_want(p)), wire_dtype_name(my_want_grad(p)));
  }
  l->to = to;
  l->from = fr;
  l->to_grad = to_g;
  l->from_grad = fr_g;
  return fresh && (l->want != TRAIN_F32 || l->want_grad != TRAIN_F32);
}

train_dtype train_peer_wire_to(const train_peer *p, const gw_id *peer, bool grad) {
  const peer_wire_link *l = link_find(p, peer);
  return l ? (grad ? l->to_grad : l->to) : TRAIN_F32;
}

train_dtype train_peer_wire_from(const train_peer *p, const gw_id *peer, bool grad) {
  const peer_wire_link *l = link_find(p, peer);
  return l ? (grad ? l->from_grad : l->from) : TRAIN_F32;
}

static size_t act_rows(const train_peer *p) { return (size_t)p->cfg.shape.B * (size_t)p->cfg.shape.T; }

/* ---- subspace crossings (train/subspace.h) ----
 * The run decides, not the link: every peer of a subspace run sends z
 * (k numbers a row) whatever the dtype, so a tensor's columns are k. */

bool wire_subspace(const train_peer *p) { return p->cfg.subspace_k > 0; }

static size_t act_cols(const train_peer *p) {
  return wire_subspace(p) ? (size_t)p->cfg.subspace_k : (size_t)p->cfg.shape.C;
}

/* Bytes of one token id on the wire: 2 while the vocabulary fits. */
static size_t token_bytes(const train_peer *p) { return p->cfg.model.vocab_size <= 65536 ? 2 : 4; }

int wire_init(train_peer *p) {
  if (!wire_subspace(p)) return 0;
  char err[256];
  size_t rows = act_rows(p);
  int rc = subspace_init(&p->sub, &p->cfg.model, p->cfg.subspace_k, p->cfg.subspace_refresh, p->cfg.seed, rows, err,
                         sizeof(err));
  if (rc != 0) {
    GW_ERROR(&p->log, "subspace.failed", "reason=\"%s\"", err);
    return rc;
  }
  p->sub_z = malloc(rows * (size_t)p->cfg.subspace_k * sizeof(float));
  p->sub_tokens = malloc(rows * token_bytes(p));
  if (!p->sub_z || !p->sub_tokens) return GW_ENOMEM;
  return 0;
}

/* FORWARD: the token ids into the message (little-endian, token_bytes each). */
static void attach_tokens(train_peer *p, Gwtf__TrainMicrobatch *m, const int32_t *tokens) {
  size_t rows = act_rows(p), w = token_bytes(p);
  for (size_t r = 0; r < rows; r++)
    for (size_t b = 0; b < w; b++) p->sub_tokens[r * w + b] = (uint8_t)((uint32_t)tokens[r] >> (8 * b));
  m->tokens.data = p->sub_tokens;
  m->tokens.len = rows * w;
}

static uint32_t token_at(const train_peer *p, const Gwtf__TrainMicrobatch *m, size_t r) {
  size_t w = token_bytes(p);
  uint32_t v = 0;
  for (size_t b = 0; b < w; b++) v |= (uint32_t)m->tokens.data[r * w + b] << (8 * b);
  return v;
}

bool wire_tokens_ok(const train_peer *p, const Gwtf__TrainMicrobatch *m) {
  size_t rows = act_rows(p);
  if (!wire_subspace(p) || p->cfg.role == TRAIN_DATA) return true; /* the data node has its own */
  if (m->tokens.len != rows * token_bytes(p)) return false;
  for (size_t r = 0; r < rows; r++)
    if (token_at(p, m, r) >= (uint32_t)p->cfg.model.vocab_size) return false;
  return true;
}

int32_t *wire_tokens_take(const train_peer *p, const Gwtf__TrainMicrobatch *m) {
  size_t rows = act_rows(p);
  if (!wire_subspace(p) || !wire_tokens_ok(p, m)) return NULL;
  int32_t *t = malloc(rows * sizeof(int32_t));
  for (size_t r = 0; t && r < rows; r++) t[r] = (int32_t)token_at(p, m, r);
  return t;
}

/* What crosses instead of `data` (rows x C): z, or U^T g (its part outside
 * U into the table's sums). NULL when the ids do not fit (not ours). */
static const float *to_subspace(train_peer *p, uint32_t type, const ProtobufCMessage *msg, const float *data,
                                const int32_t *tokens) {
  size_t rows = act_rows(p);
  int T = p->cfg.shape.T;
  if (!tokens) return NULL;
  if (type == GWTF__TRAIN_MSG__TRAIN_BACKWARD)
    return subspace_grad_split(&p->sub, data, tokens, rows, T, p->sub_z) == 0 ? p->sub_z : NULL;
  if (subspace_encode(&p->sub, data, tokens, rows, T, p->sub_z) != 0) return NULL;
  if (p->cfg.role == TRAIN_RELAY && p->stage == p->cfg.n_stages) return p->sub_z; /* to the data node: it has them */
  Gwtf__TrainMicrobatch *m = (Gwtf__TrainMicrobatch *)msg;
  attach_tokens(p, m, tokens);
  p->counters.wire_bytes += m->tokens.len; /* they cross with every other activation */
  return p->sub_z;
}

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

int wire_send_act(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg, const float *data,
                  const int32_t *tokens) {
  if (wire_subspace(p) && !(data = to_subspace(p, type, msg, data, tokens))) return GW_EINVAL;
  size_t cols = act_cols(p);
  train_tensor t;
  peer_tensor_f32(&t, data, p->cfg.shape.B, p->cfg.shape.T, (int)cols);
  bool grad = type == GWTF__TRAIN_MSG__TRAIN_BACKWARD;
  train_dtype d = train_peer_wire_to(p, to, grad);
  if (d == TRAIN_F32) {
    /* A session that came up a moment ago: the peer's HELLO, which says
     * what it decodes, is still on its way, and fp32 is what every peer
     * takes. Counted apart, so that the bytes add up. */
    bool early = !link_find(p, to) && (grad ? my_want_grad(p) : my_want(p)) != TRAIN_F32;
    int rc = send_counted(p, to, type, msg, &t);
    if (rc == 0 && early) {
      p->counters.wire_early_tensors++;
      p->counters.wire_early_bytes += t.nbytes;
    }
    return rc;
  }
  size_t rows = act_rows(p), need = wire_bytes(d, rows, cols);
  /* a format bigger than fp32 (a high rank on a tiny shape) saves nothing */
  if (need == 0 || need >= t.nbytes) return send_counted(p, to, type, msg, &t);
  if (need > p->wire_buf_len) {
    uint8_t *b = realloc(p->wire_buf, need);
    if (!b) return send_counted(p, to, type, msg, &t); /* F32 is always accepted */
    p->wire_buf = b;
    p->wire_buf_len = need;
  }
  if (wire_encode(d, data, rows, cols, p->wire_buf, need) != 0) return send_counted(p, to, type, msg, &t);
  t.dtype = d;
  if (wire_shape_last(d, cols)) {
    t.shape[2] = wire_shape_last(d, cols); /* the byte formats: one row's bytes */
  } else { /* a format that is not row by row (LR*): just its bytes */
    t.ndim = 1;
    t.shape[0] = need;
  }
  t.data = p->wire_buf;
  t.nbytes = need;
  return send_counted(p, to, type, msg, &t);
}

const char *wire_act_refusal(const train_peer *p, const train_tensor *t) {
  if (!t) return "missing";
  if (t->dtype >= 32 || !wire_dtype_ok(t->dtype) || !(my_accept(p) & WIRE_BIT(t->dtype))) return "dtype";
  size_t rows = act_rows(p), cols = act_cols(p);
  uint64_t last = wire_shape_last(t->dtype, cols);
  size_t need = wire_bytes(t->dtype, rows, cols);
  /* A header without a shape (raw bytes) is fine as long as the size is. */
  if (last && t->ndim == 3 &&
      (t->shape[0] != (uint64_t)p->cfg.shape.B || t->shape[1] != (uint64_t)p->cfg.shape.T || t->shape[2] != last))
    return "shape";
  if (!last && t->ndim == 1 && t->shape[0] != (uint64_t)need) return "shape";
  if (t->ndim != (last ? 3u : 1u) && t->ndim != 0) return "shape";
  if (need == 0 || t->nbytes != need) return "size";
  /* row scales (Q8ROW, R*ROW), padding bits and marker rows (R*ROW) */
  return wire_check(t->dtype, t->data, t->nbytes, rows, cols) == 0 ? NULL : "rows";
}

float *wire_act_decode(train_peer *p, const train_tensor *t, const int32_t *tokens) {
  size_t rows = act_rows(p), cols = act_cols(p), C = (size_t)p->cfg.shape.C;
  float *f = malloc(rows * C * sizeof(float));
  /* under subspace crossings z lands in p->sub_z, then is rebuilt or lifted into f */
  float *dst = wire_subspace(p) ? p->sub_z : f;
  int rc = f ? wire_decode(t->dtype, t->data, t->nbytes, rows, cols, dst) : GW_ENOMEM;
  if (rc == 0 && wire_subspace(p)) {
    if (tokens) rc = subspace_decode(&p->sub, p->sub_z, tokens, rows, p->cfg.shape.T, f);
    else subspace_grad_lift(&p->sub, p->sub_z, rows, f);
  }
  if (rc != 0) {
    free(f);
    return NULL;
  }
  return f;
}

void wire_free(train_peer *p) {
  free(p->wire_buf);
  p->wire_buf = NULL;
  p->wire_buf_len = 0;
  subspace_free(&p->sub);
  free(p->sub_z);
  free(p->sub_tokens);
  p->sub_z = NULL;
  p->sub_tokens = NULL;
}
