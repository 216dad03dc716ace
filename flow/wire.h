/* flow/wire.h — the few helpers every sender of gwtf.FlowMessage shares
 * (the flow protocol and placement). */
#ifndef GWTF_FLOW_WIRE_H
#define GWTF_FLOW_WIRE_H

#include <stdbool.h>

#include "proto/flow.pb-c.h"
#include "util/id.h"
#include "util/io.h"

/* A node id as a bytes field (no copy: valid while *id is). */
ProtobufCBinaryData flow_id_bytes(const gw_id *id);
/* A bytes field as a node id; false unless it is exactly 32 bytes. */
bool flow_id_from_bytes(const ProtobufCBinaryData *b, gw_id *out);
/* Packs m and sends it to `to` through io. GW_ERANGE when the packed
 * message is larger than max_len, else what io->send returns. */
int flow_message_send(const gw_io *io, const gw_id *to, Gwtf__FlowMessage *m, size_t max_len);

#endif
