#include "dht/wire.h"

#include <string.h>

#include "dht/routing.h"
#include "util/err.h"

/* Read-only zeros that padding points at. */
static const uint8_t zeros[DHT_WIRE_MAX_PADDING];

static bool len_ok(const ProtobufCBinaryData *b, size_t want) { return b->len == 0 || b->len == want; }

static bool valid(const dht_msg *m) {
  if (m->kind < GWTF__DHT_KIND__DHT_PING || m->kind > GWTF__DHT_KIND__DHT_STORED) return false;
  if (!len_ok(&m->cookie, DHT_COOKIE_BYTES) || !len_ok(&m->your_cookie, DHT_COOKIE_BYTES)) return false;
  if (!len_ok(&m->after, GW_ID_BYTES)) return false;
  if (m->n_nodes > DHT_WIRE_MAX_NODES || m->n_records > DHT_WIRE_MAX_RECORDS) return false;
  bool find = m->kind == GWTF__DHT_KIND__DHT_FIND_NODE || m->kind == GWTF__DHT_KIND__DHT_FIND_VALUE;
  if (find && m->target.len != GW_ID_BYTES) return false;
  if (m->kind == GWTF__DHT_KIND__DHT_STORE && !m->record) return false;
  return true;
}

int dht_wire_decode(const uint8_t *buf, size_t len, dht_msg **out) {
  *out = gwtf__dht_message__unpack(NULL, len, buf);
  if (!*out) return GW_EPROTO;
  if (!valid(*out)) {
    dht_wire_free(*out);
    *out = NULL;
    return GW_EPROTO;
  }
  return 0;
}

void dht_wire_free(dht_msg *m) {
  if (m) gwtf__dht_message__free_unpacked(m, NULL);
}

int dht_wire_peer(const Gwtf__DhtContact *c, bool need_id, gw_peer *out) {
  memset(out, 0, sizeof(*out));
  if (!c || c->port == 0 || c->port > 65535) return GW_EPROTO;
  if (need_id) {
    if (c->id.len != GW_ID_BYTES) return GW_EPROTO;
    memcpy(out->id.b, c->id.data, GW_ID_BYTES);
  }
  if (c->ip.len == 4)
    out->addr.family = 4;
  else if (c->ip.len == 16)
    out->addr.family = 6;
  else
    return GW_EPROTO;
  memcpy(out->addr.ip, c->ip.data, c->ip.len);
  out->addr.port = (uint16_t)c->port;
  return 0;
}

void dht_wire_contact(Gwtf__DhtContact *c, const gw_peer *p, bool with_id) {
  gwtf__dht_contact__init(c);
  if (with_id) c->id = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)p->id.b};
  c->ip = (ProtobufCBinaryData){p->addr.family == 4 ? 4 : 16, (uint8_t *)p->addr.ip};
  c->port = p->addr.port;
}

size_t dht_wire_pack_fit(dht_msg *m, uint8_t *out, size_t max) {
  for (;;) {
    size_t n = gwtf__dht_message__get_packed_size(m);
    if (n <= max) return gwtf__dht_message__pack(m, out);
    if (m->n_nodes > 0) {
      m->n_nodes--;
    } else if (m->n_records > 0) {
      m->n_records--;
      m->more = 1;
    } else if (m->observed) {
      m->observed = NULL;
    } else if (m->your_cookie.len) {
      m->your_cookie = (ProtobufCBinaryData){0};
    } else {
      return 0;
    }
  }
}

void dht_wire_pad(dht_msg *m, size_t target) {
  m->padding = (ProtobufCBinaryData){0, NULL};
  size_t n = gwtf__dht_message__get_packed_size(m);
  if (n >= target) return;
  /* The field costs a tag byte and a 1-byte length (2 from 128 bytes on). */
  size_t gap = target - n;
  size_t pad = gap > 2 ? gap - 2 : 1;
  if (pad >= 128) pad = gap - 3 >= 128 ? gap - 3 : 128;
  if (pad > DHT_WIRE_MAX_PADDING) pad = DHT_WIRE_MAX_PADDING;
  m->padding = (ProtobufCBinaryData){pad, (uint8_t *)zeros};
}
