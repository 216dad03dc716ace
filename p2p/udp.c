#include "p2p/udp.h"

#include <stdlib.h>
#include <string.h>

#include "p2p/sockaddr.h"
#include "util/err.h"

#define UDP_DOMAIN "gwtf-udp-v1"
#define UDP_DOMAIN_LEN (sizeof(UDP_DOMAIN) - 1)
/* Receive buffer: larger than any valid datagram, so an oversize one is seen
 * whole (and counted) rather than silently truncated to a valid length. */
#define UDP_RX_BUF (2048)
/* The signed message: domain, header, recipient ID, payload. */
#define UDP_SIGNED_MAX (UDP_DOMAIN_LEN + P2P_UDP_HEADER_BYTES + GW_ID_BYTES + P2P_UDP_MAX_PAYLOAD)

struct p2p_udp {
  uv_udp_t handle;
  p2p_udp_config cfg;
  gw_addr local;
  p2p_udp_stats stats;
  uint8_t rx[UDP_RX_BUF];
  bool rx_busy; /* the buffer is lent to libuv between alloc_cb and recv_cb */
};

/* A send that could not go out at once (socket buffer full): owns a copy. */
typedef struct udp_send_req {
  uv_udp_send_t req;
  size_t len;
  uint8_t buf[];
} udp_send_req;

/* ---- addresses ---- */

/* A dual-stack [::] endpoint reaches IPv4 peers through v4-mapped
 * addresses (p2p/sockaddr.c reports those peers as plain IPv4). */
static int dest_sockaddr(const p2p_udp *u, const gw_addr *to, struct sockaddr_storage *ss) {
  if (u->local.family == 6 && to->family == 4) {
    gw_addr mapped = {.family = 6, .port = to->port};
    mapped.ip[10] = mapped.ip[11] = 0xff;
    memcpy(mapped.ip + 12, to->ip, 4);
    return p2p_addr_to_sockaddr(&mapped, ss);
  }
  if (to->family != u->local.family) return GW_EINVAL;
  return p2p_addr_to_sockaddr(to, ss);
}

/* ---- codec ---- */

/* Lays out the signed message for a datagram whose header is hdr. */
static size_t signed_message(uint8_t *msg, const uint8_t *hdr, const gw_id *recipient,
                             const uint8_t *payload, size_t len) {
  size_t n = 0;
  memcpy(msg + n, UDP_DOMAIN, UDP_DOMAIN_LEN);
  n += UDP_DOMAIN_LEN;
  memcpy(msg + n, hdr, P2P_UDP_HEADER_BYTES);
  n += P2P_UDP_HEADER_BYTES;
  if (recipient)
    memcpy(msg + n, recipient->b, GW_ID_BYTES);
  else
    memset(msg + n, 0, GW_ID_BYTES);
  n += GW_ID_BYTES;
  memcpy(msg + n, payload, len);
  return n + len;
}

int p2p_udp_seal(const p2p_identity *me, const gw_id *to, const uint8_t *payload, size_t len,
                 uint8_t *out, size_t cap, size_t *out_len) {
  uint8_t msg[UDP_SIGNED_MAX];
  if (len > P2P_UDP_MAX_PAYLOAD || cap < len + P2P_UDP_OVERHEAD) return GW_ERANGE;
  bool bound = to && !gw_id_is_zero(to);
  out[0] = P2P_UDP_MAGIC;
  out[1] = (uint8_t)((P2P_UDP_VERSION << 4) | (bound ? P2P_UDP_FLAG_BOUND : 0));
  memcpy(out + 2, me->pk, P2P_PK_BYTES);
  memcpy(out + P2P_UDP_HEADER_BYTES, payload, len);
  size_t mlen = signed_message(msg, out, bound ? to : NULL, payload, len);
  p2p_sign(me, msg, mlen, out + P2P_UDP_HEADER_BYTES + len);
  *out_len = len + P2P_UDP_OVERHEAD;
  return 0;
}

int p2p_udp_parse(const uint8_t *dgram, size_t len, const uint8_t **pk, const uint8_t **payload,
                  size_t *payload_len) {
  if (len > P2P_UDP_MAX_DGRAM) return GW_ERANGE;
  if (len < P2P_UDP_OVERHEAD || dgram[0] != P2P_UDP_MAGIC) return GW_EPROTO;
  if ((dgram[1] >> 4) != P2P_UDP_VERSION || (dgram[1] & 0x0f & ~P2P_UDP_FLAG_BOUND) != 0)
    return GW_EPROTO;
  *pk = dgram + 2;
  *payload = dgram + P2P_UDP_HEADER_BYTES;
  *payload_len = len - P2P_UDP_OVERHEAD;
  return 0;
}

int p2p_udp_unseal(const uint8_t *dgram, size_t len, const gw_id *me, gw_id *sender,
                   const uint8_t **payload, size_t *payload_len) {
  uint8_t msg[UDP_SIGNED_MAX];
  const uint8_t *pk;
  int rc = p2p_udp_parse(dgram, len, &pk, payload, payload_len);
  if (rc != 0) return rc;
  bool bound = (dgram[1] & P2P_UDP_FLAG_BOUND) != 0;
  size_t mlen = signed_message(msg, dgram, bound ? me : NULL, *payload, *payload_len);
  if (p2p_verify(pk, msg, mlen, *payload + *payload_len) != 0) return GW_EAUTH;
  p2p_id_from_pk(pk, sender);
  return 0;
}

/* ---- the endpoint ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  p2p_udp *u = h->data;
  (void)suggested;
  /* libuv hands each buffer back through on_recv before asking again; the
   * flag only guards that assumption. */
  if (u->rx_busy) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  u->rx_busy = true;
  *buf = uv_buf_init((char *)u->rx, sizeof(u->rx));
}

static void reject(p2p_udp *u, const gw_addr *from, int rc, size_t len) {
  if (rc == GW_ERANGE)
    u->stats.rejected_oversize++;
  else if (rc == GW_EAUTH)
    u->stats.rejected_auth++;
  else
    u->stats.rejected_malformed++;
  if (u->cfg.on_reject) u->cfg.on_reject(u->cfg.ud, from, rc, len);
}

static void on_recv(uv_udp_t *h, ssize_t nread, const uv_buf_t *buf, const struct sockaddr *sa,
                    unsigned flags) {
  p2p_udp *u = h->data;
  (void)buf;
  u->rx_busy = false;
  if (nread == 0 && !sa) return; /* libuv: nothing more to read */
  if (nread < 0 || !sa) {
    reject(u, NULL, GW_EPROTO, 0);
    return;
  }
  gw_peer from;
  const uint8_t *payload;
  size_t plen, len = (size_t)nread;
  bool have_addr = p2p_addr_from_sockaddr(sa, &from.addr) == 0;
  int rc = (flags & UV_UDP_PARTIAL) ? GW_ERANGE : have_addr ? 0 : GW_EPROTO;
  if (rc == 0) rc = p2p_udp_unseal(u->rx, len, &u->cfg.me->id, &from.id, &payload, &plen);
  if (rc != 0) {
    reject(u, have_addr ? &from.addr : NULL, rc, len);
    return;
  }
  u->stats.dgrams_in++;
  u->stats.bytes_in += len;
  if (len > u->stats.max_dgram_in) u->stats.max_dgram_in = len;
  if (u->cfg.on_recv) u->cfg.on_recv(u->cfg.ud, &from, payload, plen, len);
}

int p2p_udp_open(uv_loop_t *loop, const p2p_udp_config *cfg, p2p_udp **out) {
  struct sockaddr_storage ss;
  *out = NULL;
  if (!cfg->me || p2p_addr_to_sockaddr(&cfg->bind, &ss) != 0) return GW_EINVAL;
  p2p_udp *u = calloc(1, sizeof(*u));
  if (!u) return GW_ENOMEM;
  u->cfg = *cfg;
  int rc = uv_udp_init(loop, &u->handle);
  if (rc != 0) {
    free(u);
    return rc;
  }
  u->handle.data = u;
  rc = uv_udp_bind(&u->handle, (const struct sockaddr *)&ss, 0);
  if (rc == 0) {
    int sslen = sizeof(ss);
    rc = uv_udp_getsockname(&u->handle, (struct sockaddr *)&ss, &sslen);
  }
  if (rc == 0) rc = p2p_addr_from_sockaddr((const struct sockaddr *)&ss, &u->local);
  if (rc == 0) rc = uv_udp_recv_start(&u->handle, on_alloc, on_recv);
  if (rc != 0) {
    p2p_udp_close(u);
    return rc;
  }
  *out = u;
  return 0;
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void p2p_udp_close(p2p_udp *u) {
  if (!u) return;
  uv_udp_recv_stop(&u->handle);
  uv_close((uv_handle_t *)&u->handle, on_closed);
}

static void on_sent(uv_udp_send_t *req, int status) {
  udp_send_req *r = (udp_send_req *)req;
  p2p_udp *u = req->handle->data;
  if (status != 0 && status != UV_ECANCELED) u->stats.send_errors++;
  free(r);
}

/* Queues a copy when the socket would block; the common case never allocates. */
static int send_queued(p2p_udp *u, const struct sockaddr *sa, const uint8_t *dgram, size_t len) {
  udp_send_req *r = malloc(sizeof(*r) + len);
  if (!r) return GW_ENOMEM;
  memcpy(r->buf, dgram, len);
  r->len = len;
  uv_buf_t b = uv_buf_init((char *)r->buf, (unsigned)len);
  int rc = uv_udp_send(&r->req, &u->handle, &b, 1, sa, on_sent);
  if (rc != 0) free(r);
  return rc;
}

int p2p_udp_send(p2p_udp *u, const gw_peer *to, const uint8_t *payload, size_t len) {
  uint8_t dgram[P2P_UDP_MAX_DGRAM];
  struct sockaddr_storage ss;
  size_t dlen;
  if (dest_sockaddr(u, &to->addr, &ss) != 0) return GW_EINVAL;
  int rc = p2p_udp_seal(u->cfg.me, &to->id, payload, len, dgram, sizeof(dgram), &dlen);
  if (rc != 0) return rc;
  uv_buf_t b = uv_buf_init((char *)dgram, (unsigned)dlen);
  rc = uv_udp_try_send(&u->handle, &b, 1, (const struct sockaddr *)&ss);
  if (rc == UV_EAGAIN) rc = send_queued(u, (const struct sockaddr *)&ss, dgram, dlen);
  if (rc < 0) {
    u->stats.send_errors++;
    return rc;
  }
  u->stats.dgrams_out++;
  u->stats.bytes_out += dlen;
  if (dlen > u->stats.max_dgram_out) u->stats.max_dgram_out = dlen;
  return 0;
}

int p2p_udp_local_addr(const p2p_udp *u, gw_addr *out) {
  *out = u->local;
  return 0;
}

const p2p_udp_stats *p2p_udp_get_stats(const p2p_udp *u) { return &u->stats; }
const gw_id *p2p_udp_id(const p2p_udp *u) { return &u->cfg.me->id; }
