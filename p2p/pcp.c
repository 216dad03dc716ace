/* PCP MAP (RFC 6887): the wire codec (pcp.h) and the client behind the
 * port-mapping interface (p2p_pm_pcp, portmap.h).
 *
 * The client is a run of requests (pm_req.h, shared with natpmp.c): one
 * request in flight, resent on a timer, a deadline for the whole run.
 *
 *   map:   MAP TCP -> MAP UDP   (same nonce every time, so a renewal
 *                                refreshes the mapping instead of adding one)
 *   close: MAP TCP, MAP UDP with lifetime 0, bounded by stop_timeout_ms
 *
 * A connected UDP socket to SERVER:5351 sees only the server's datagrams
 * and gets ICMP "port unreachable" as ECONNREFUSED: then no PCP server is
 * there (absent) and auto moves on at once. */
#include "p2p/pcp.h"

#include <arpa/inet.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/pm_req.h"
#include "p2p/portmap.h"
#include "util/err.h"

/* ---- codec ---- */

#define put16 p2p_pm_put16
#define put32 p2p_pm_put32
#define get16 p2p_pm_get16
#define get32 p2p_pm_get32

void p2p_pcp_ip_map4(const uint8_t ip4[4], uint8_t out[16]) {
  memset(out, 0, 10);
  out[10] = out[11] = 0xff;
  memcpy(out + 12, ip4, 4);
}

bool p2p_pcp_ip_is4(const uint8_t ip[16]) {
  static const uint8_t prefix[12] = {[10] = 0xff, [11] = 0xff};
  return memcmp(ip, prefix, 12) == 0;
}

size_t p2p_pcp_encode_map(const p2p_pcp_map_req *req, uint8_t out[P2P_PCP_MAP_LEN]) {
  memset(out, 0, P2P_PCP_MAP_LEN);
  out[0] = P2P_PCP_VERSION;
  out[1] = P2P_PCP_OP_MAP; /* R bit clear: a request */
  put32(out + 4, req->lifetime);
  memcpy(out + 8, req->client_ip, 16);
  uint8_t *m = out + P2P_PCP_HEADER_LEN;
  memcpy(m, req->nonce, P2P_PCP_NONCE_LEN);
  m[12] = req->protocol;
  put16(m + 16, req->internal_port);
  put16(m + 18, req->suggested_port);
  memcpy(m + 20, req->suggested_ip, 16);
  return P2P_PCP_MAP_LEN;
}

/* Options from off to len: each a 4-byte header (code, reserved, length)
 * and its data padded to 4 bytes; they must end exactly at len. */
static int walk_options(const uint8_t *buf, size_t off, size_t len, unsigned *n) {
  *n = 0;
  while (off < len) {
    if (len - off < 4) return GW_EPROTO;
    size_t olen = get16(buf + off + 2);
    size_t padded = (olen + 3) & ~(size_t)3;
    off += 4;
    if (padded > len - off) return GW_EPROTO;
    off += padded;
    (*n)++;
  }
  return 0;
}

int p2p_pcp_parse_reply(const uint8_t *buf, size_t len, p2p_pcp_reply *out) {
  memset(out, 0, sizeof(*out));
  if (len >= 2 && buf[0] == 0 && buf[1] >= 128) return GW_EUNSUPPORTED; /* NAT-PMP's answer */
  if (len < P2P_PCP_HEADER_LEN || len > P2P_PCP_MAX_LEN || (len % 4) != 0) return GW_EPROTO;
  if (!(buf[1] & 0x80)) return GW_EPROTO; /* a request, not a response */
  if (buf[0] != P2P_PCP_VERSION) return buf[3] == P2P_PCP_UNSUPP_VERSION ? GW_EUNSUPPORTED : GW_EPROTO;
  out->opcode = buf[1] & 0x7f;
  out->result = buf[3];
  out->lifetime = get32(buf + 4);
  out->epoch = get32(buf + 8);
  size_t off = P2P_PCP_HEADER_LEN;
  if (out->opcode == P2P_PCP_OP_MAP) {
    if (len < P2P_PCP_MAP_LEN) {
      /* Only an error may come without the opcode data (a server that
       * could not parse our request has nothing to copy back). */
      if (out->result == P2P_PCP_SUCCESS || len != P2P_PCP_HEADER_LEN) return GW_EPROTO;
      return 0;
    }
    const uint8_t *m = buf + P2P_PCP_HEADER_LEN;
    out->has_map = true;
    memcpy(out->nonce, m, P2P_PCP_NONCE_LEN);
    out->protocol = m[12];
    out->internal_port = get16(m + 16);
    out->external_port = get16(m + 18);
    memcpy(out->external_ip, m + 20, 16);
    off = P2P_PCP_MAP_LEN;
  }
  return walk_options(buf, off, len, &out->n_options);
}

bool p2p_pcp_reply_matches(const p2p_pcp_reply *r, const p2p_pcp_map_req *req) {
  return r->opcode == P2P_PCP_OP_MAP && r->has_map && memcmp(r->nonce, req->nonce, P2P_PCP_NONCE_LEN) == 0 &&
         r->protocol == req->protocol && r->internal_port == req->internal_port;
}

bool p2p_pcp_reply_usable(const p2p_pcp_reply *r, const p2p_pcp_map_req *req) {
  if (r->result != P2P_PCP_SUCCESS) return false;
  if (req->lifetime == 0) return r->lifetime == 0;
  static const uint8_t any4[4] = {0};
  return r->lifetime > 0 && r->external_port != 0 && p2p_pcp_ip_is4(r->external_ip) &&
         memcmp(r->external_ip + 12, any4, 4) != 0;
}

const char *p2p_pcp_result_name(uint8_t code) {
  static const char *const names[] = {
      "success",        "unsupported-version", "not-authorized",   "malformed-request", "unsupported-opcode",
      "unsupported-option", "malformed-option", "network-failure", "no-resources",     "unsupported-protocol",
      "user-quota",     "cannot-provide-external", "address-mismatch", "excessive-remote-peers",
  };
  if (code < sizeof(names) / sizeof(names[0])) return names[code];
  return "unknown-result";
}

bool p2p_pcp_epoch_ok(uint64_t prev_client_s, uint32_t prev_epoch, uint64_t now_client_s, uint32_t now_epoch) {
  if ((uint64_t)now_epoch + 1 < prev_epoch) return false; /* went back: the server restarted */
  int64_t c = (int64_t)(now_client_s - prev_client_s);
  int64_t s = (int64_t)now_epoch - (int64_t)prev_epoch;
  if (c + 2 < s - s / 16) return false;
  if (s + 2 < c - c / 16) return false;
  return true;
}

/* ---- the client on the loop ---- */

/* A gateway on the LAN answers within milliseconds; RFC 6887's first resend
 * after 3 s would leave time for two tries before give_up_ms, so resend on
 * NAT-PMP's schedule (RFC 6886: 250 ms, doubling) instead. */
#define RESEND_FIRST_MS (250)
#define RESEND_MAX_MS (4000)

typedef struct pcp_client {
  p2p_pm_req req; /* first: the run of requests (pm_req.h) */
  uv_udp_t udp;
  bool udp_ready;
  uint8_t nonce[P2P_PCP_NONCE_LEN];
  uint8_t client_ip[16];
  uint8_t server_ip[4];
  p2p_pcp_map_req reqs[2];
  uint64_t resend_ms;
  bool have_epoch;
  uint32_t prev_epoch;
  uint64_t prev_client_s;
} pcp_client;

static void got_reply(pcp_client *c, const p2p_pcp_reply *r) {
  const p2p_pcp_map_req *req = &c->reqs[c->req.cur];
  const gw_log *log = c->req.base.cfg.log;
  uint64_t now_s = uv_now(c->req.base.loop) / 1000;
  if (c->have_epoch && !p2p_pcp_epoch_ok(c->prev_client_s, c->prev_epoch, now_s, r->epoch))
    GW_INFO(log, "nat.pcp_server_restarted", "epoch=%u prev_epoch=%u msg=\"the router lost its mappings\"", r->epoch,
            c->prev_epoch);
  c->have_epoch = true;
  c->prev_epoch = r->epoch;
  c->prev_client_s = now_s;
  if (r->opcode != P2P_PCP_OP_MAP) return; /* ANNOUNCE and others: nothing pending on them */
  if (!r->has_map) {
    /* An error without opcode data answers the only request in flight. */
    if (r->result != P2P_PCP_SUCCESS) p2p_pm_req_failed(&c->req, p2p_pcp_result_name(r->result), false);
    return;
  }
  if (!p2p_pcp_reply_matches(r, req)) return; /* a late answer to an earlier request */
  if (r->result != P2P_PCP_SUCCESS) {
    p2p_pm_req_failed(&c->req, p2p_pcp_result_name(r->result), false);
    return;
  }
  if (!p2p_pcp_reply_usable(r, req)) {
    GW_WARN(log, "nat.bad_reply", "proto=pcp reason=unusable-grant lifetime=%u port=%u", r->lifetime,
            r->external_port);
    p2p_pm_req_failed(&c->req, "bad-reply", false);
    return;
  }
  bool tcp = req->protocol == P2P_PCP_PROTO_TCP;
  if (req->lifetime == 0)
    p2p_pm_req_deleted(&c->req, tcp);
  else
    p2p_pm_req_granted(&c->req, tcp, r->external_ip + 12, r->external_port, r->lifetime);
  p2p_pm_req_next(&c->req);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  static uint8_t space[P2P_PCP_MAX_LEN + 4]; /* one loop thread; the datagram is parsed before the next read */
  (void)h;
  *buf = uv_buf_init((char *)space, sizeof(space));
}

static void on_recv(uv_udp_t *u, ssize_t n, const uv_buf_t *buf, const struct sockaddr *from, unsigned flags) {
  pcp_client *c = u->data;
  if (c->req.ph == P2P_PM_IDLE) return;
  if (n < 0) {
    /* ICMP port unreachable on the connected socket: nobody serves PCP */
    if (n == UV_ECONNREFUSED) p2p_pm_req_failed(&c->req, "no-gateway", !c->req.heard);
    return;
  }
  if (n == 0 || !from) return;
  if (flags & UV_UDP_PARTIAL) {
    GW_DEBUG(c->req.base.cfg.log, "nat.bad_reply", "proto=pcp reason=oversize");
    return;
  }
  p2p_pcp_reply r;
  int rc = p2p_pcp_parse_reply((const uint8_t *)buf->base, (size_t)n, &r);
  if (rc == GW_EUNSUPPORTED) {
    p2p_pm_req_failed(&c->req, "unsupported-version", true); /* a NAT-PMP-only router: auto tries NAT-PMP next */
    return;
  }
  if (rc != 0) {
    GW_WARN(c->req.base.cfg.log, "nat.bad_reply", "proto=pcp reason=malformed bytes=%zd", n);
    return; /* keep waiting: a garbled datagram must not end the attempt */
  }
  c->req.heard = true;
  got_reply(c, &r);
}

static void pcp_send(pcp_client *c);

static void on_resend(uv_timer_t *t) {
  pcp_client *c = t->data;
  c->resend_ms = c->resend_ms * 2 > RESEND_MAX_MS ? RESEND_MAX_MS : c->resend_ms * 2;
  pcp_send(c);
}

static void pcp_send(pcp_client *c) {
  uint8_t pkt[P2P_PCP_MAP_LEN];
  p2p_pcp_encode_map(&c->reqs[c->req.cur], pkt);
  uv_buf_t b = uv_buf_init((char *)pkt, sizeof(pkt));
  int rc = uv_udp_try_send(&c->udp, &b, 1, NULL);
  if (rc == UV_ECONNREFUSED) {
    p2p_pm_req_fail_later(&c->req, "no-gateway", !c->req.heard);
    return;
  }
  /* Other errors (EAGAIN, ENETUNREACH while the link comes up) are retried. */
  uv_timer_start(&c->req.resend, on_resend, c->resend_ms, 0);
}

/* ---- the hooks of the run (pm_req.h) ---- */

/* map:  MAP TCP, MAP UDP with cfg.lifetime_s;
 * stop: the same for what is held, with lifetime 0. */
static int plan(p2p_pm_req *req, p2p_pm_phase ph) {
  pcp_client *c = (pcp_client *)req;
  const p2p_pm_client *b = &req->base;
  uint32_t lifetime = ph == P2P_PM_MAP ? b->cfg.lifetime_s : 0;
  bool want_tcp = ph == P2P_PM_MAP ? b->cfg.tcp_port != 0 : b->tcp_mapped;
  bool want_udp = ph == P2P_PM_MAP ? b->cfg.udp_port != 0 : b->udp_mapped;
  int n = 0;
  for (int i = 0; i < 2; i++) {
    bool tcp = i == 0;
    if (tcp ? !want_tcp : !want_udp) continue;
    p2p_pcp_map_req *r = &c->reqs[n++];
    memset(r, 0, sizeof(*r));
    r->lifetime = lifetime;
    memcpy(r->client_ip, c->client_ip, 16);
    memcpy(r->nonce, c->nonce, P2P_PCP_NONCE_LEN);
    r->protocol = tcp ? P2P_PCP_PROTO_TCP : P2P_PCP_PROTO_UDP;
    r->internal_port = tcp ? b->cfg.tcp_port : b->cfg.udp_port;
    r->suggested_port = lifetime ? r->internal_port : 0;
    static const uint8_t any4[4] = {0};
    p2p_pcp_ip_map4(any4, r->suggested_ip);
  }
  return n;
}

static void start(p2p_pm_req *req) {
  pcp_client *c = (pcp_client *)req;
  c->resend_ms = RESEND_FIRST_MS;
  pcp_send(c);
}

static void close_io(p2p_pm_req *req, uv_close_cb cb) {
  pcp_client *c = (pcp_client *)req;
  if (c->udp_ready) uv_close((uv_handle_t *)&c->udp, cb);
}

static const p2p_pm_req_ops pcp_ops = {.plan = plan, .start = start, .close_io = close_io};

/* ---- the interface ---- */

/* Opens the socket to SERVER:5351 and learns our address on that route. */
static const char *setup_socket(pcp_client *c) {
  uint32_t gw_be;
  const char *gateway = c->req.base.cfg.gateway;
  if (gateway) {
    if (inet_pton(AF_INET, gateway, &gw_be) != 1) return "bad-gateway-address";
  } else if (p2p_pm_default_gateway(&gw_be) != 0) {
    return "no-default-gateway";
  }
  memcpy(c->server_ip, &gw_be, 4);
  if (uv_udp_init(c->req.base.loop, &c->udp) != 0) return "socket";
  c->udp.data = c;
  c->udp_ready = true;
  c->req.open_handles++;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(P2P_PCP_PORT)};
  memcpy(&sa.sin_addr, &gw_be, 4);
  if (uv_udp_connect(&c->udp, (const struct sockaddr *)&sa) != 0) return "no-route";
  struct sockaddr_storage me;
  int len = sizeof(me);
  if (uv_udp_getsockname(&c->udp, (struct sockaddr *)&me, &len) != 0 || me.ss_family != AF_INET) return "socket";
  p2p_pcp_ip_map4((const uint8_t *)&((struct sockaddr_in *)&me)->sin_addr, c->client_ip);
  if (uv_udp_recv_start(&c->udp, on_alloc, on_recv) != 0) return "socket";
  return NULL;
}

static int pcp_open(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done, void *ud, void **out) {
  pcp_client *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  p2p_pm_req_init(&c->req, &pcp_ops, loop, cfg, done, ud);
  /* One nonce for the client's life: renewals and deletions must carry the
   * nonce that created the mapping (RFC 6887 §11.1). */
  randombytes_buf(c->nonce, sizeof(c->nonce));
  c->req.setup_error = setup_socket(c);
  *out = c;
  return 0;
}

const p2p_pm_proto p2p_pm_pcp = {.name = "pcp", .open = pcp_open, .map = p2p_pm_req_map, .close = p2p_pm_req_close};
