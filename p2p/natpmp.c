/* NAT-PMP (RFC 6886): the strict reply check (natpmp.h) and the client
 * behind the port-mapping interface (p2p_pm_natpmp, portmap.h). */
#include "p2p/natpmp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <natpmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "p2p/pm_req.h"
#include "p2p/portmap.h"
#include "util/err.h"

/* ---- the reply check ---- */

#define get16 p2p_pm_get16
#define get32 p2p_pm_get32

int p2p_natpmp_parse_reply(const uint8_t *buf, size_t len, p2p_natpmp_reply *out) {
  memset(out, 0, sizeof(*out));
  if (len < 8 || len > 16 || buf[0] != 0) return GW_EPROTO;
  uint8_t op = buf[1];
  if (op != P2P_NATPMP_OP_PUBLIC && op != P2P_NATPMP_OP_UDP && op != P2P_NATPMP_OP_TCP) return GW_EPROTO;
  out->op = op;
  out->result = get16(buf + 2);
  out->epoch = get32(buf + 4);
  size_t full = op == P2P_NATPMP_OP_PUBLIC ? 12 : 16;
  if (out->result != 0) return len == 8 || len == full ? 0 : GW_EPROTO;
  if (len != full) return GW_EPROTO;
  if (op == P2P_NATPMP_OP_PUBLIC) {
    memcpy(out->public_ip, buf + 8, 4);
  } else {
    out->internal_port = get16(buf + 8);
    out->external_port = get16(buf + 10);
    out->lifetime = get32(buf + 12);
  }
  return 0;
}

/* ---- the client on the loop ---- */

/* One request to the gateway. */
typedef enum op { OP_PUBADDR, OP_MAP_TCP, OP_MAP_UDP, OP_DEL_TCP, OP_DEL_UDP } op;

#define MAX_OPS (3)

typedef struct np_client {
  p2p_pm_req req; /* first: the run of requests (pm_req.h) */
  natpmp_t np;
  bool np_open;
  uv_poll_t poll;
  bool poll_ready;
  op ops[MAX_OPS];
  uint8_t public_ip[4];
} np_client;

static const char *natpmp_reason(int r) {
  switch (r) {
  case NATPMP_ERR_NOGATEWAYSUPPORT: return "no-gateway";
  case NATPMP_ERR_CANNOTGETGATEWAY: return "no-default-gateway";
  case NATPMP_ERR_NOTAUTHORIZED: return "not-authorized";
  case NATPMP_ERR_NETWORKFAILURE: return "gateway-network-failure";
  case NATPMP_ERR_OUTOFRESOURCES: return "gateway-out-of-resources";
  case NATPMP_ERR_UNSUPPORTEDVERSION: return "unsupported-version";
  case NATPMP_ERR_UNSUPPORTEDOPCODE: return "unsupported-opcode";
  case NATPMP_ERR_WRONGPACKETSOURCE: return "wrong-source";
  case NATPMP_ERR_SOCKETERROR:
  case NATPMP_ERR_CONNECTERR:
  case NATPMP_ERR_FCNTLERROR: return "socket";
  case NATPMP_ERR_SENDERR: return "send";
  case NATPMP_ERR_RECVFROM: return "recv";
  default: return "error";
  }
}

/* ---- one request ---- */

static bool response_matches(const np_client *c, const natpmpresp_t *r) {
  switch (c->ops[c->req.cur]) {
  case OP_PUBADDR: return r->type == NATPMP_RESPTYPE_PUBLICADDRESS;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    return r->type == NATPMP_RESPTYPE_TCPPORTMAPPING && r->pnu.newportmapping.privateport == c->req.base.cfg.tcp_port;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    return r->type == NATPMP_RESPTYPE_UDPPORTMAPPING && r->pnu.newportmapping.privateport == c->req.base.cfg.udp_port;
  default: return false;
  }
}

/* A grant we can use: a port and a lease. */
static bool record_mapping(np_client *c, bool tcp, const natpmpresp_t *r) {
  uint32_t lease = r->pnu.newportmapping.lifetime;
  uint16_t port = r->pnu.newportmapping.mappedpublicport;
  if (lease == 0 || port == 0) return false;
  p2p_pm_req_granted(&c->req, tcp, c->public_ip, port, lease);
  return true;
}

static void got_response(np_client *c, const natpmpresp_t *r) {
  static const uint8_t zero[4] = {0};
  op o = c->ops[c->req.cur];
  switch (o) {
  case OP_PUBADDR:
    memcpy(c->public_ip, &r->pnu.publicaddress.addr, 4);
    if (memcmp(c->public_ip, zero, 4) == 0) {
      p2p_pm_req_failed(&c->req, "no-public-address", false);
      return;
    }
    break;
  case OP_MAP_TCP:
  case OP_MAP_UDP:
    if (!record_mapping(c, o == OP_MAP_TCP, r)) {
      p2p_pm_req_failed(&c->req, "bad-reply", false);
      return;
    }
    break;
  case OP_DEL_TCP:
  case OP_DEL_UDP: p2p_pm_req_deleted(&c->req, o == OP_DEL_TCP); break;
  default: break;
  }
  p2p_pm_req_next(&c->req);
}

static void run_op(p2p_pm_req *req);
static void on_retry(uv_timer_t *t);
static void on_poll(uv_poll_t *p, int status, int events);

static void wait_response(np_client *c) {
  struct timeval tv;
  if (getnatpmprequesttimeout(&c->np, &tv) != 0) return;
  int64_t ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
  uv_timer_start(&c->req.resend, on_retry, ms > 0 ? (uint64_t)ms : 0, 0);
  if (c->poll_ready) uv_poll_start(&c->poll, UV_READABLE, on_poll);
}

/* Checks the next datagram before libnatpmp sees it. Returns true when
 * libnatpmp may read (a good reply, or nothing there); false when the
 * datagram was dropped or the run of requests ended. */
static bool gate(np_client *c) {
  uint8_t buf[64];
  ssize_t n = recv(c->np.s, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT | MSG_TRUNC);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
    /* Peeking consumed the socket error (ICMP port unreachable): report it
     * here, since libnatpmp will not see it again. */
    if (errno == ECONNREFUSED) {
      p2p_pm_req_failed(&c->req, "no-gateway", !c->req.heard);
      return false;
    }
    return true;
  }
  p2p_natpmp_reply rep;
  if ((size_t)n <= sizeof(buf) && p2p_natpmp_parse_reply(buf, (size_t)n, &rep) == 0) {
    c->req.heard = true;
    return true;
  }
  (void)!recv(c->np.s, buf, sizeof(buf), MSG_DONTWAIT); /* drop it */
  GW_WARN(c->req.base.cfg.log, "nat.bad_reply", "proto=natpmp reason=malformed bytes=%zd", n);
  wait_response(c);
  return false;
}

/* Reads what the gateway said, or lets libnatpmp resend when it is time. */
static void service(np_client *c) {
  if (c->req.ph == P2P_PM_IDLE) return;
  if (!gate(c)) return;
  natpmpresp_t r;
  int rc = readnatpmpresponseorretry(&c->np, &r);
  if (rc == NATPMP_TRYAGAIN)
    wait_response(c);
  else if (rc < 0)
    p2p_pm_req_failed(&c->req, natpmp_reason(rc), rc == NATPMP_ERR_NOGATEWAYSUPPORT && !c->req.heard);
  else if (response_matches(c, &r))
    got_response(c, &r);
  else
    run_op(&c->req); /* a late answer to an earlier request, taken for the pending one: ask again */
}

static void on_retry(uv_timer_t *t) { service(t->data); }

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status, (void)events; /* errors (ICMP unreachable) surface in the read */
  service(p->data);
}

/* ---- the hooks of the run (pm_req.h) ---- */

static void run_op(p2p_pm_req *req) {
  np_client *c = (np_client *)req;
  const p2p_portmap_config *cfg = &req->base.cfg;
  uint32_t life = req->ph == P2P_PM_STOP ? 0 : cfg->lifetime_s;
  int rc;
  switch (c->ops[req->cur]) {
  case OP_PUBADDR: rc = sendpublicaddressrequest(&c->np); break;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    rc = sendnewportmappingrequest(&c->np, NATPMP_PROTOCOL_TCP, cfg->tcp_port, life ? cfg->tcp_port : 0, life);
    break;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    rc = sendnewportmappingrequest(&c->np, NATPMP_PROTOCOL_UDP, cfg->udp_port, life ? cfg->udp_port : 0, life);
    break;
  default: rc = NATPMP_ERR_INVALIDARGS;
  }
  if (rc < 0) {
    p2p_pm_req_fail_later(req, natpmp_reason(rc), rc == NATPMP_ERR_NOGATEWAYSUPPORT);
    return;
  }
  wait_response(c);
}

/* map:  public address (every time: it may have changed), TCP, UDP;
 * stop: delete what is held. */
static int plan(p2p_pm_req *req, p2p_pm_phase ph) {
  np_client *c = (np_client *)req;
  const p2p_pm_client *b = &req->base;
  int k = 0;
  if (ph == P2P_PM_MAP) {
    c->ops[k++] = OP_PUBADDR;
    if (b->cfg.tcp_port) c->ops[k++] = OP_MAP_TCP;
    if (b->cfg.udp_port) c->ops[k++] = OP_MAP_UDP;
  } else {
    if (b->tcp_mapped) c->ops[k++] = OP_DEL_TCP;
    if (b->udp_mapped) c->ops[k++] = OP_DEL_UDP;
  }
  return k;
}

static void quiet(p2p_pm_req *req) {
  np_client *c = (np_client *)req;
  if (c->poll_ready) uv_poll_stop(&c->poll);
}

static void close_io(p2p_pm_req *req, uv_close_cb cb) {
  np_client *c = (np_client *)req;
  if (c->poll_ready) uv_close((uv_handle_t *)&c->poll, cb);
}

static void release(p2p_pm_req *req) {
  np_client *c = (np_client *)req;
  if (c->np_open) closenatpmp(&c->np);
}

static const p2p_pm_req_ops np_ops = {
    .plan = plan, .start = run_op, .quiet = quiet, .close_io = close_io, .release = release};

/* ---- the interface ---- */

static int np_open(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done, void *ud, void **out) {
  np_client *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  p2p_pm_req_init(&c->req, &np_ops, loop, cfg, done, ud);
  c->poll.data = c;
  *out = c;

  in_addr_t gw = 0;
  if (cfg->gateway && inet_pton(AF_INET, cfg->gateway, &gw) != 1) {
    c->req.setup_error = "bad-gateway-address";
    return 0;
  }
  /* initnatpmp opens and connects a non-blocking UDP socket; with no
   * forced gateway it reads the default route from /proc (no I/O wait). */
  int rc = initnatpmp(&c->np, cfg->gateway != NULL, gw);
  if (rc < 0) {
    c->req.setup_error = natpmp_reason(rc);
    return 0;
  }
  c->np_open = true;
  if (uv_poll_init_socket(loop, &c->poll, c->np.s) == 0) {
    c->poll_ready = true;
    c->req.open_handles++;
  }
  return 0;
}

const p2p_pm_proto p2p_pm_natpmp = {.name = "natpmp", .open = np_open, .map = p2p_pm_req_map, .close = p2p_pm_req_close};
