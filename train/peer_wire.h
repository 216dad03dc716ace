/* train/peer_wire.h — compression of activations and their gradients on
 * each link (--wire-dtype; train/peer_wire.c), negotiated through HELLO.
 * Its state (peer_wire_link) is in train/peer_internal.h; the formats are
 * train/wire_codec.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_WIRE_H
#define GWTF_TRAIN_PEER_WIRE_H

#include "train/peer_internal.h"

/* peer_wire.c: activation compression per link (train/wire_codec.h) */
void wire_fill_hello(const train_peer *p, Gwtf__TrainHello *h);
/* Returns true when the sender would like to compress and has not heard our
 * HELLO yet (as far as we know): answer it with ours at once, so that its
 * compression starts now rather than a HELLO period later. */
bool wire_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h);
/* Sends a FORWARD or BACKWARD with the activation (or gradient) `data`
 * (B x T x C floats) in the dtype negotiated with `to`. */
int wire_send_act(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg, const float *data);
/* An activation tensor we can take: a dtype we accept, the [B,T,C] shape
 * (Q8ROW, R*ROW: [B,T,row bytes]), exactly the bytes that needs, valid
 * row scales and padding. NULL when it is; otherwise why not, for the
 * train.malformed line ("missing", "dtype", "shape", "size", "rows"). */
const char *wire_act_refusal(const train_peer *p, const train_tensor *t);
/* Decodes a tensor that wire_act_refusal passed into new B x T x C floats (NULL:
 * out of memory). */
float *wire_act_decode(const train_peer *p, const train_tensor *t);
void wire_free(train_peer *p);

#endif
