/* NAT-PMP (RFC 6886): the strict reply check (natpmp.h) and the client
 * behind the port-mapping interface (p2p_pm_natpmp, portmap.h). */
#include "p2p/natpmp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <natpmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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

typedef enum phase { PH_IDLE, PH_MAP, PH_STOP } phase;

#define MAX_OPS (3)

typedef struct np_client {
  uv_loop_t *loop;
  p2p_portmap_config cfg;
  p2p_pm_done_fn done;
  void *ud;
  natpmp_t np;
  bool np_open;
  const char *setup_error;
  uv_poll_t poll;
  bool poll_ready;
  uv_timer_t retry;    /* libnatpmp's own resend schedule */
  uv_timer_t deadline; /* give up / stop timeout; 0 ms to report a failure from the loop */
  int open_handles;
  phase ph;
  op ops[MAX_OPS];
  int n_ops, cur;
  uint8_t public_ip[4];
  bool tcp_mapped, udp_mapped;
  bool heard; /* the gateway answered something well-formed */
  p2p_pm_result res;
  const char *fail_why;
  bool fail_absent;
  p2p_pm_closed_fn closed;
  void *closed_ud;
} np_client;

static void run_op(np_client *c);

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

/* ---- teardown ---- */

static void on_closed(uv_handle_t *h) {
  np_client *c = h->data;
  if (--c->open_handles > 0) return;
  if (c->np_open) closenatpmp(&c->np);
  p2p_pm_closed_fn closed = c->closed;
  void *ud = c->closed_ud;
  bool all = !c->tcp_mapped && !c->udp_mapped;
  free(c);
  if (closed) closed(ud, all);
}

static void quiesce(np_client *c) {
  if (c->poll_ready) uv_poll_stop(&c->poll);
  uv_timer_stop(&c->retry);
  uv_timer_stop(&c->deadline);
}

static void finish_close(np_client *c) {
  quiesce(c);
  c->ph = PH_IDLE;
  /* The poll handle goes before libnatpmp closes its socket (on_closed). */
  if (c->poll_ready) uv_close((uv_handle_t *)&c->poll, on_closed);
  uv_close((uv_handle_t *)&c->retry, on_closed);
  uv_close((uv_handle_t *)&c->deadline, on_closed);
}

/* A run of requests failed with reason (why). */
static void failed(np_client *c, const char *why, bool absent) {
  phase ph = c->ph;
  quiesce(c);
  if (ph == PH_STOP) {
    finish_close(c);
    return;
  }
  c->ph = PH_IDLE;
  if (ph != PH_MAP || !c->done) return;
  c->res.rc = absent ? GW_ENOENT : GW_EPROTO;
  c->res.why = why;
  c->res.absent = absent;
  c->done(c->ud, &c->res);
}

static void on_deferred_fail(uv_timer_t *t) {
  np_client *c = t->data;
  failed(c, c->fail_why, c->fail_absent);
}

static void fail_later(np_client *c, const char *why, bool absent) {
  quiesce(c);
  c->fail_why = why;
  c->fail_absent = absent;
  uv_timer_start(&c->deadline, on_deferred_fail, 0, 0);
}

static void next_op(np_client *c) {
  if (++c->cur < c->n_ops) {
    run_op(c);
    return;
  }
  quiesce(c);
  if (c->ph == PH_STOP) {
    finish_close(c);
    return;
  }
  c->ph = PH_IDLE;
  c->res.rc = 0;
  c->res.why = NULL;
  c->done(c->ud, &c->res);
}

/* ---- one request ---- */

static bool response_matches(const np_client *c, const natpmpresp_t *r) {
  switch (c->ops[c->cur]) {
  case OP_PUBADDR: return r->type == NATPMP_RESPTYPE_PUBLICADDRESS;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    return r->type == NATPMP_RESPTYPE_TCPPORTMAPPING && r->pnu.newportmapping.privateport == c->cfg.tcp_port;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    return r->type == NATPMP_RESPTYPE_UDPPORTMAPPING && r->pnu.newportmapping.privateport == c->cfg.udp_port;
  default: return false;
  }
}

/* A grant we can use: a port and a lease. */
static bool record_mapping(np_client *c, gw_addr *ext, const natpmpresp_t *r) {
  uint32_t lease = r->pnu.newportmapping.lifetime;
  uint16_t port = r->pnu.newportmapping.mappedpublicport;
  if (lease == 0 || port == 0) return false;
  memset(ext, 0, sizeof(*ext));
  ext->family = 4;
  memcpy(ext->ip, c->public_ip, 4);
  ext->port = port;
  if (c->res.lease_s == 0 || lease < c->res.lease_s) c->res.lease_s = lease;
  return true;
}

static void got_response(np_client *c, const natpmpresp_t *r) {
  static const uint8_t zero[4] = {0};
  switch (c->ops[c->cur]) {
  case OP_PUBADDR:
    memcpy(c->public_ip, &r->pnu.publicaddress.addr, 4);
    if (memcmp(c->public_ip, zero, 4) == 0) {
      failed(c, "no-public-address", false);
      return;
    }
    break;
  case OP_MAP_TCP:
    if (!record_mapping(c, &c->res.external_tcp, r)) {
      failed(c, "bad-reply", false);
      return;
    }
    c->tcp_mapped = true;
    break;
  case OP_MAP_UDP:
    if (!record_mapping(c, &c->res.external_udp, r)) {
      failed(c, "bad-reply", false);
      return;
    }
    c->udp_mapped = true;
    break;
  case OP_DEL_TCP: c->tcp_mapped = false; break;
  case OP_DEL_UDP: c->udp_mapped = false; break;
  default: break;
  }
  next_op(c);
}

static void on_retry(uv_timer_t *t);
static void on_poll(uv_poll_t *p, int status, int events);

static void wait_response(np_client *c) {
  struct timeval tv;
  if (getnatpmprequesttimeout(&c->np, &tv) != 0) return;
  int64_t ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
  uv_timer_start(&c->retry, on_retry, ms > 0 ? (uint64_t)ms : 0, 0);
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
      failed(c, "no-gateway", !c->heard);
      return false;
    }
    return true;
  }
  p2p_natpmp_reply rep;
  if ((size_t)n <= sizeof(buf) && p2p_natpmp_parse_reply(buf, (size_t)n, &rep) == 0) {
    c->heard = true;
    return true;
  }
  (void)!recv(c->np.s, buf, sizeof(buf), MSG_DONTWAIT); /* drop it */
  GW_WARN(c->cfg.log, "nat.bad_reply", "proto=natpmp reason=malformed bytes=%zd", n);
  wait_response(c);
  return false;
}

/* Reads what the gateway said, or lets libnatpmp resend when it is time. */
static void service(np_client *c) {
  if (c->ph == PH_IDLE) return;
  if (!gate(c)) return;
  natpmpresp_t r;
  int rc = readnatpmpresponseorretry(&c->np, &r);
  if (rc == NATPMP_TRYAGAIN)
    wait_response(c);
  else if (rc < 0)
    failed(c, natpmp_reason(rc), rc == NATPMP_ERR_NOGATEWAYSUPPORT && !c->heard);
  else if (response_matches(c, &r))
    got_response(c, &r);
  else
    run_op(c); /* a late answer to an earlier request, taken for the pending one: ask again */
}

static void on_retry(uv_timer_t *t) { service(t->data); }

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status, (void)events; /* errors (ICMP unreachable) surface in the read */
  service(p->data);
}

static void run_op(np_client *c) {
  int rc;
  uint32_t life = c->ph == PH_STOP ? 0 : c->cfg.lifetime_s;
  switch (c->ops[c->cur]) {
  case OP_PUBADDR: rc = sendpublicaddressrequest(&c->np); break;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    rc = sendnewportmappingrequest(&c->np, NATPMP_PROTOCOL_TCP, c->cfg.tcp_port, life ? c->cfg.tcp_port : 0, life);
    break;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    rc = sendnewportmappingrequest(&c->np, NATPMP_PROTOCOL_UDP, c->cfg.udp_port, life ? c->cfg.udp_port : 0, life);
    break;
  default: rc = NATPMP_ERR_INVALIDARGS;
  }
  if (rc < 0) {
    fail_later(c, natpmp_reason(rc), rc == NATPMP_ERR_NOGATEWAYSUPPORT);
    return;
  }
  wait_response(c);
}

static void on_deadline(uv_timer_t *t) {
  np_client *c = t->data;
  if (c->ph == PH_STOP)
    finish_close(c);
  else
    failed(c, "no-answer", !c->heard);
}

static void begin(np_client *c, phase ph, const op *ops, int n_ops, uint32_t deadline_ms) {
  c->ph = ph;
  memcpy(c->ops, ops, sizeof(op) * (size_t)n_ops);
  c->n_ops = n_ops;
  c->cur = 0;
  if (ph == PH_MAP) memset(&c->res, 0, sizeof(c->res));
  uv_timer_start(&c->deadline, on_deadline, deadline_ms, 0);
  if (n_ops == 0) {
    c->cur = -1;
    next_op(c);
    return;
  }
  run_op(c);
}

/* ---- the interface ---- */

static int np_open(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done, void *ud, void **out) {
  np_client *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  c->loop = loop;
  c->cfg = *cfg;
  p2p_pm_config_defaults(&c->cfg);
  c->done = done;
  c->ud = ud;
  uv_timer_init(loop, &c->retry);
  uv_timer_init(loop, &c->deadline);
  c->retry.data = c->deadline.data = c->poll.data = c;
  c->open_handles = 2;
  *out = c;

  in_addr_t gw = 0;
  if (cfg->gateway && inet_pton(AF_INET, cfg->gateway, &gw) != 1) {
    c->setup_error = "bad-gateway-address";
    return 0;
  }
  /* initnatpmp opens and connects a non-blocking UDP socket; with no
   * forced gateway it reads the default route from /proc (no I/O wait). */
  int rc = initnatpmp(&c->np, cfg->gateway != NULL, gw);
  if (rc < 0) {
    c->setup_error = natpmp_reason(rc);
    return 0;
  }
  c->np_open = true;
  if (uv_poll_init_socket(loop, &c->poll, c->np.s) == 0) {
    c->poll_ready = true;
    c->open_handles++;
  }
  return 0;
}

static void np_map(void *client) {
  np_client *c = client;
  if (c->setup_error) {
    c->ph = PH_MAP;
    fail_later(c, c->setup_error, true);
    return;
  }
  op ops[MAX_OPS];
  int k = 0;
  ops[k++] = OP_PUBADDR; /* every time: the public address may have changed */
  if (c->cfg.tcp_port) ops[k++] = OP_MAP_TCP;
  if (c->cfg.udp_port) ops[k++] = OP_MAP_UDP;
  begin(c, PH_MAP, ops, k, c->cfg.give_up_ms);
}

static void np_close(void *client, bool unmap, p2p_pm_closed_fn closed, void *ud) {
  np_client *c = client;
  c->closed = closed;
  c->closed_ud = ud;
  c->done = NULL;
  quiesce(c);
  op ops[MAX_OPS];
  int k = 0;
  if (c->tcp_mapped) ops[k++] = OP_DEL_TCP;
  if (c->udp_mapped) ops[k++] = OP_DEL_UDP;
  if (!unmap || k == 0 || !c->np_open) {
    if (!unmap) c->tcp_mapped = c->udp_mapped = false;
    finish_close(c);
    return;
  }
  begin(c, PH_STOP, ops, k, c->cfg.stop_timeout_ms);
}

const p2p_pm_proto p2p_pm_natpmp = {.name = "natpmp", .open = np_open, .map = np_map, .close = np_close};
