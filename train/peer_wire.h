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
/* Sets up the run's subspace crossings (cfg.subspace_k; nothing when 0):
 * U and the table from the run's seed. */
int wire_init(train_peer *p);
/* Whether activations cross as subspace coordinates (train/subspace.h). */
bool wire_subspace(const train_peer *p);
/* Sends a FORWARD or BACKWARD with the activation (or gradient) `data`
 * (B x T x C floats) in the dtype negotiated with `to`. Under subspace
 * crossings a FORWARD carries z = U^T (x - x0) and the token ids (msg is a
 * TrainMicrobatch; tokens: its B*T ids), a BACKWARD U^T g (tokens: the ids
 * of the activation it belongs to, for the table's sums). */
int wire_send_act(train_peer *p, const gw_id *to, uint32_t type, const ProtobufCMessage *msg, const float *data,
                  const int32_t *tokens);
/* An activation tensor we can take: a dtype we accept, the [B,T,C] shape
 * ([B,T,k] under subspace crossings; Q8ROW, R*ROW: [B,T,row bytes]),
 * exactly the bytes that needs, valid row scales and padding. NULL when it
 * is; otherwise why not, for the train.malformed line ("missing", "dtype",
 * "shape", "size", "rows"). */
const char *wire_act_refusal(const train_peer *p, const train_tensor *t);
/* Decodes a tensor that wire_act_refusal passed into new B x T x C floats
 * (NULL: out of memory). Under subspace crossings an activation (tokens:
 * its ids) is rebuilt as x0 + U z, a gradient (tokens NULL) lifted as U g. */
float *wire_act_decode(train_peer *p, const train_tensor *t, const int32_t *tokens);
/* Whether a FORWARD's token ids are usable: true without subspace
 * crossings and on a data node (the last stage sends none: the data node
 * has them); else B*T ids of the run's width, all in the vocabulary.
 * A FORWARD that fails is malformed (refused before any role sees it). */
bool wire_tokens_ok(const train_peer *p, const Gwtf__TrainMicrobatch *m);
/* The token ids a FORWARD carries under subspace crossings: new B*T int32,
 * or NULL when they are missing, of the wrong length or out of the
 * vocabulary (a malformed message). */
int32_t *wire_tokens_take(const train_peer *p, const Gwtf__TrainMicrobatch *m);
void wire_free(train_peer *p);

#endif
