/* dht/wire.h — DhtMessage (proto/dht.proto) in and out.
 *
 * Decoding treats the payload as hostile: it must unpack, have a known kind,
 * and every field must have its exact size (IDs 32 bytes, cookies 8) and stay
 * under the count caps before any handler sees it. Contacts inside are
 * checked one by one when used (dht_wire_peer).
 *
 * Encoding fits a byte budget: replies drop their farthest contacts, then
 * their last records, until the message fits the datagram (or, toward an
 * address that has not proved it receives, the size of the request). */
#ifndef GWTF_DHT_WIRE_H
#define GWTF_DHT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht.pb-c.h"
#include "util/addr.h"

#define DHT_WIRE_MAX_NODES (32)
#define DHT_WIRE_MAX_RECORDS (16)
/* Encoded size of one IPv4 contact inside a message (the most common kind),
 * and of a reply's fixed fields: what a requester pads for. */
#define DHT_WIRE_CONTACT_V4 (46)
#define DHT_WIRE_REPLY_BASE (24)
#define DHT_WIRE_MAX_PADDING (1200)

typedef Gwtf__DhtMessage dht_msg;

/* 0 or GW_EPROTO. Free *out with dht_wire_free. */
int dht_wire_decode(const uint8_t *buf, size_t len, dht_msg **out);
void dht_wire_free(dht_msg *m);

static inline bool dht_wire_is_request(int kind) {
  return kind == GWTF__DHT_KIND__DHT_PING || kind == GWTF__DHT_KIND__DHT_FIND_NODE ||
         kind == GWTF__DHT_KIND__DHT_FIND_VALUE || kind == GWTF__DHT_KIND__DHT_STORE;
}
/* Requests and replies are numbered in pairs. */
static inline int dht_wire_reply_kind(int request_kind) { return request_kind + 1; }

/* A contact from the wire as a peer: id 32 bytes (when need_id), IPv4 or
 * IPv6, non-zero port. 0 or GW_EPROTO. */
int dht_wire_peer(const Gwtf__DhtContact *c, bool need_id, gw_peer *out);
/* Points c at p's bytes (p must outlive the encoding). */
void dht_wire_contact(Gwtf__DhtContact *c, const gw_peer *p, bool with_id);

/* Packs m into out (at most max bytes), trimming nodes, then records (and
 * setting `more`), then `observed`, then `your_cookie`, until it fits. m is modified. Returns the
 * packed length, or 0 when even the bare message does not fit. */
size_t dht_wire_pack_fit(dht_msg *m, uint8_t *out, size_t max);
/* Adds padding so that m packs to at least target bytes (capped at
 * DHT_WIRE_MAX_PADDING bytes of padding). */
void dht_wire_pad(dht_msg *m, size_t target);

#endif
