#include "p2p/natpmp.h"

#include <arpa/inet.h>
#include <natpmp.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define LIFETIME_DEFAULT_S (3600)
#define GIVE_UP_DEFAULT_MS (10000)
#define STOP_TIMEOUT_DEFAULT_MS (1500)
#define RETRY_DEFAULT_MS (60000)
/* Never renew more often than this, whatever lease a gateway grants. */
#define RENEW_MIN_MS (1000)

/* One request to the gateway. */
typedef enum op { OP_NONE, OP_PUBADDR, OP_MAP_TCP, OP_MAP_UDP, OP_DEL_TCP, OP_DEL_UDP } op;

/* What a run of requests is for. */
typedef enum phase { PH_START, PH_RENEW, PH_STOP, PH_IDLE } phase;

#define MAX_OPS (3)

struct p2p_natpmp {
  uv_loop_t *loop;
  p2p_natpmp_config cfg;
  p2p_natpmp_cb cb;
  void *ud;
  natpmp_t np;
  bool np_open;
  uv_poll_t poll;
  bool poll_ready;
  uv_timer_t retry;   /* libnatpmp's own resend schedule */
  uv_timer_t deadline; /* give up / stop timeout */
  uv_timer_t renew;
  int open_handles;
  phase ph;
  op ops[MAX_OPS];
  int n_ops, cur;
  uint8_t public_ip[4];
  bool tcp_mapped, udp_mapped;
  p2p_natpmp_status st;
  void (*done)(void *ud);
  void *done_ud;
};

static void run_op(p2p_natpmp *n);

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
  p2p_natpmp *n = h->data;
  if (--n->open_handles > 0) return;
  if (n->np_open) closenatpmp(&n->np);
  void (*done)(void *) = n->done;
  void *ud = n->done_ud;
  free(n);
  if (done) done(ud);
}

static void close_all(p2p_natpmp *n) {
  n->ph = PH_IDLE;
  /* The poll handle goes before libnatpmp closes its socket (on_closed). */
  if (n->poll_ready) uv_close((uv_handle_t *)&n->poll, on_closed);
  uv_close((uv_handle_t *)&n->retry, on_closed);
  uv_close((uv_handle_t *)&n->deadline, on_closed);
  uv_close((uv_handle_t *)&n->renew, on_closed);
}

static void quiesce(p2p_natpmp *n) {
  if (n->poll_ready) uv_poll_stop(&n->poll);
  uv_timer_stop(&n->retry);
  uv_timer_stop(&n->deadline);
}

static void set_state(p2p_natpmp *n, p2p_natpmp_state s, const char *why) {
  n->st.state = s;
  n->st.why = why;
  if (n->cb && n->ph != PH_STOP) n->cb(n->ud, &n->st);
}

/* ---- phases ---- */

static void begin(p2p_natpmp *n, phase ph, const op *ops, int n_ops, uint32_t deadline_ms);
static void on_deadline(uv_timer_t *t);

static void on_renew(uv_timer_t *t) {
  p2p_natpmp *n = t->data;
  op ops[MAX_OPS];
  int k = 0;
  if (n->cfg.tcp_port) ops[k++] = OP_MAP_TCP;
  if (n->cfg.udp_port) ops[k++] = OP_MAP_UDP;
  begin(n, PH_RENEW, ops, k, n->cfg.give_up_ms);
}

static void mapped(p2p_natpmp *n) {
  char ext[GW_ADDR_STRLEN], ext_udp[GW_ADDR_STRLEN];
  quiesce(n);
  bool renewal = n->ph == PH_RENEW;
  n->ph = PH_IDLE;
  gw_addr_format(&n->st.external_tcp, ext);
  gw_addr_format(&n->st.external_udp, ext_udp);
  if (renewal && n->st.state == P2P_NATPMP_MAPPED) {
    n->st.renewals++;
    GW_INFO(n->cfg.log, "nat.renewed", "tcp=%s udp=%s lease_s=%u renewals=%u", ext, ext_udp, n->st.lease_s,
             n->st.renewals);
  } else {
    GW_INFO(n->cfg.log, "nat.mapped", "tcp=%s udp=%s lease_s=%u", ext, ext_udp, n->st.lease_s);
  }
  /* Renew at half the lease the gateway granted (RFC 6886 §3.3). */
  uint64_t ms = (uint64_t)n->st.lease_s * 500;
  uv_timer_start(&n->renew, on_renew, ms < RENEW_MIN_MS ? RENEW_MIN_MS : ms, 0);
  set_state(n, P2P_NATPMP_MAPPED, NULL);
}

static void stopped(p2p_natpmp *n) {
  quiesce(n);
  if (n->tcp_mapped || n->udp_mapped)
    GW_WARN(n->cfg.log, "nat.unmap_incomplete", "tcp=%s udp=%s msg=\"the gateway did not confirm; the lease lapses\"",
            n->tcp_mapped ? "mapped" : "-", n->udp_mapped ? "mapped" : "-");
  else if (n->st.state == P2P_NATPMP_MAPPED)
    GW_INFO(n->cfg.log, "nat.unmapped", "tcp=%u udp=%u", n->cfg.tcp_port, n->cfg.udp_port);
  n->st.state = P2P_NATPMP_STOPPED;
  close_all(n);
}

/* A run of requests failed with reason (why). */
static void failed(p2p_natpmp *n, const char *why, bool no_gateway) {
  phase ph = n->ph;
  quiesce(n);
  n->ph = PH_IDLE;
  if (ph == PH_STOP) {
    stopped(n);
  } else if (ph == PH_RENEW) {
    GW_WARN(n->cfg.log, "nat.renew_failed", "reason=%s retry_ms=%u", why, n->cfg.retry_ms);
    n->tcp_mapped = n->udp_mapped = false;
    uv_timer_start(&n->renew, on_renew, n->cfg.retry_ms, 0);
    set_state(n, P2P_NATPMP_FAILED, why);
  } else if (no_gateway) {
    GW_INFO(n->cfg.log, "nat.unavailable", "reason=%s msg=\"no NAT-PMP gateway; carrying on unmapped\"", why);
    set_state(n, P2P_NATPMP_UNAVAILABLE, why);
  } else {
    GW_WARN(n->cfg.log, "nat.failed", "reason=%s msg=\"the gateway refused the mapping; carrying on unmapped\"",
            why);
    set_state(n, P2P_NATPMP_FAILED, why);
  }
}

static void next_op(p2p_natpmp *n) {
  if (++n->cur < n->n_ops) {
    run_op(n);
    return;
  }
  if (n->ph == PH_STOP)
    stopped(n);
  else
    mapped(n);
}

/* ---- one request ---- */

static bool response_matches(const p2p_natpmp *n, const natpmpresp_t *r) {
  switch (n->ops[n->cur]) {
  case OP_PUBADDR: return r->type == NATPMP_RESPTYPE_PUBLICADDRESS;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    return r->type == NATPMP_RESPTYPE_TCPPORTMAPPING && r->pnu.newportmapping.privateport == n->cfg.tcp_port;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    return r->type == NATPMP_RESPTYPE_UDPPORTMAPPING && r->pnu.newportmapping.privateport == n->cfg.udp_port;
  default: return false;
  }
}

static void record_mapping(p2p_natpmp *n, gw_addr *ext, const natpmpresp_t *r) {
  memset(ext, 0, sizeof(*ext));
  ext->family = 4;
  memcpy(ext->ip, n->public_ip, 4);
  ext->port = r->pnu.newportmapping.mappedpublicport;
  uint32_t lease = r->pnu.newportmapping.lifetime;
  if (n->st.lease_s == 0 || lease < n->st.lease_s) n->st.lease_s = lease;
}

static void got_response(p2p_natpmp *n, const natpmpresp_t *r) {
  switch (n->ops[n->cur]) {
  case OP_PUBADDR: memcpy(n->public_ip, &r->pnu.publicaddress.addr, 4); break;
  case OP_MAP_TCP:
    record_mapping(n, &n->st.external_tcp, r);
    n->tcp_mapped = true;
    break;
  case OP_MAP_UDP:
    record_mapping(n, &n->st.external_udp, r);
    n->udp_mapped = true;
    break;
  case OP_DEL_TCP: n->tcp_mapped = false; break;
  case OP_DEL_UDP: n->udp_mapped = false; break;
  default: break;
  }
  next_op(n);
}

static void on_retry(uv_timer_t *t);
static void on_poll(uv_poll_t *p, int status, int events);

static void wait_response(p2p_natpmp *n) {
  struct timeval tv;
  if (getnatpmprequesttimeout(&n->np, &tv) != 0) return;
  int64_t ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
  uv_timer_start(&n->retry, on_retry, ms > 0 ? (uint64_t)ms : 0, 0);
  if (n->poll_ready) uv_poll_start(&n->poll, UV_READABLE, on_poll);
}

/* Reads what the gateway said, or lets libnatpmp resend when it is time. */
static void service(p2p_natpmp *n) {
  if (n->ph == PH_IDLE) return;
  natpmpresp_t r;
  int rc = readnatpmpresponseorretry(&n->np, &r);
  if (rc == NATPMP_TRYAGAIN)
    wait_response(n);
  else if (rc < 0)
    failed(n, natpmp_reason(rc), rc == NATPMP_ERR_NOGATEWAYSUPPORT);
  else if (response_matches(n, &r))
    got_response(n, &r);
  else
    run_op(n); /* a late answer to an earlier request, taken for the pending one: ask again */
}

static void on_retry(uv_timer_t *t) { service(t->data); }

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status, (void)events; /* errors (ICMP unreachable) surface in the read */
  service(p->data);
}

static void run_op(p2p_natpmp *n) {
  int rc;
  uint32_t life = n->ph == PH_STOP ? 0 : n->cfg.lifetime_s;
  switch (n->ops[n->cur]) {
  case OP_PUBADDR: rc = sendpublicaddressrequest(&n->np); break;
  case OP_MAP_TCP:
  case OP_DEL_TCP:
    rc = sendnewportmappingrequest(&n->np, NATPMP_PROTOCOL_TCP, n->cfg.tcp_port, life ? n->cfg.tcp_port : 0, life);
    break;
  case OP_MAP_UDP:
  case OP_DEL_UDP:
    rc = sendnewportmappingrequest(&n->np, NATPMP_PROTOCOL_UDP, n->cfg.udp_port, life ? n->cfg.udp_port : 0, life);
    break;
  default: rc = NATPMP_ERR_INVALIDARGS;
  }
  if (rc < 0) {
    failed(n, natpmp_reason(rc), false);
    return;
  }
  wait_response(n);
}

static void begin(p2p_natpmp *n, phase ph, const op *ops, int n_ops, uint32_t deadline_ms) {
  n->ph = ph;
  memcpy(n->ops, ops, sizeof(op) * (size_t)n_ops);
  n->n_ops = n_ops;
  n->cur = 0;
  if (ph != PH_STOP) n->st.lease_s = 0;
  uv_timer_start(&n->deadline, on_deadline, deadline_ms, 0);
  if (n_ops == 0) {
    next_op(n);
    return;
  }
  run_op(n);
}

static void on_deadline(uv_timer_t *t) {
  p2p_natpmp *n = t->data;
  if (n->ph == PH_STOP)
    stopped(n);
  else
    failed(n, "no-answer", n->ph == PH_START);
}

/* ---- API ---- */

int p2p_natpmp_start(uv_loop_t *loop, const p2p_natpmp_config *cfg, p2p_natpmp_cb cb, void *ud, p2p_natpmp **out) {
  p2p_natpmp *n = calloc(1, sizeof(*n));
  if (!n) return GW_ENOMEM;
  n->loop = loop;
  n->cfg = *cfg;
  if (!n->cfg.lifetime_s) n->cfg.lifetime_s = LIFETIME_DEFAULT_S;
  if (!n->cfg.give_up_ms) n->cfg.give_up_ms = GIVE_UP_DEFAULT_MS;
  if (!n->cfg.stop_timeout_ms) n->cfg.stop_timeout_ms = STOP_TIMEOUT_DEFAULT_MS;
  if (!n->cfg.retry_ms) n->cfg.retry_ms = RETRY_DEFAULT_MS;
  n->ud = ud;
  n->ph = PH_IDLE;
  uv_timer_init(loop, &n->retry);
  uv_timer_init(loop, &n->deadline);
  uv_timer_init(loop, &n->renew);
  n->retry.data = n->deadline.data = n->renew.data = n->poll.data = n;
  n->open_handles = 3;
  *out = n;

  in_addr_t gw = 0;
  if (cfg->gateway && inet_pton(AF_INET, cfg->gateway, &gw) != 1) {
    n->ph = PH_START;
    failed(n, "bad-gateway-address", true);
    n->cb = cb;
    return 0;
  }
  /* initnatpmp opens and connects a non-blocking UDP socket; with no
   * forced gateway it reads the default route from /proc (no I/O wait). */
  int rc = initnatpmp(&n->np, cfg->gateway != NULL, gw);
  if (rc < 0) {
    n->ph = PH_START;
    failed(n, natpmp_reason(rc), true);
    n->cb = cb;
    return 0;
  }
  n->np_open = true;
  if (uv_poll_init_socket(loop, &n->poll, n->np.s) == 0) {
    n->poll_ready = true;
    n->open_handles++;
  }
  op ops[MAX_OPS];
  int k = 0;
  ops[k++] = OP_PUBADDR;
  if (cfg->tcp_port) ops[k++] = OP_MAP_TCP;
  if (cfg->udp_port) ops[k++] = OP_MAP_UDP;
  begin(n, PH_START, ops, k, n->cfg.give_up_ms);
  n->cb = cb; /* set last: no callback runs inside this call */
  return 0;
}

const p2p_natpmp_status *p2p_natpmp_get_status(const p2p_natpmp *n) { return &n->st; }

void p2p_natpmp_stop(p2p_natpmp *n, void (*done)(void *ud), void *ud) {
  n->done = done;
  n->done_ud = ud;
  n->cb = NULL;
  quiesce(n);
  uv_timer_stop(&n->renew);
  op ops[MAX_OPS];
  int k = 0;
  if (n->tcp_mapped) ops[k++] = OP_DEL_TCP;
  if (n->udp_mapped) ops[k++] = OP_DEL_UDP;
  if (k == 0 || !n->np_open) {
    n->ph = PH_STOP;
    stopped(n);
    return;
  }
  begin(n, PH_STOP, ops, k, n->cfg.stop_timeout_ms);
}
