/* p2p/host_reach.c — the host's side of dial-backs (p2p/reach.h): asking a
 * peer to dial us back, serving a peer's request by dialling the IP its
 * session comes from, and handing the results to the reach state. */
#include <stdlib.h>
#include <string.h>

#include "p2p/host_internal.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/err.h"

int host_reach_request(void *ud, const gw_id *to, uint16_t port, uint64_t nonce) {
  p2p_host *h = ud;
  peer *p = host_find_peer(h, to);
  if (!p || !p->s || h->closing) return GW_ENOENT;
  Gwtf__DialBackRequest rq = GWTF__DIAL_BACK_REQUEST__INIT;
  rq.port = port;
  rq.nonce = nonce;
  uint8_t body[32];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_DIAL_BACK, .body = body, .body_len = gwtf__dial_back_request__pack(&rq, body)};
  char id[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(to, id);
  GW_DEBUG(h->cfg.log, "nat.dial_back_asked", "peer=\"%s\" port=%u", id, (unsigned)port);
  return p2p_session_send(p->s, &m);
}

void host_reach_decided(void *ud, const p2p_reachability *r) {
  p2p_host *h = ud;
  (void)r;
  h->reach_report_due = true; /* callbacks come from the loop, never from inside a p2p_host_* call */
}

static void send_dial_back_result(p2p_session *s, uint64_t nonce, int status, const gw_addr *dialled) {
  Gwtf__DialBackResult res = GWTF__DIAL_BACK_RESULT__INIT;
  res.nonce = nonce;
  res.status = (Gwtf__DialBackStatus)status;
  if (dialled && (dialled->family == 4 || dialled->family == 6)) {
    res.dialled_ip = (ProtobufCBinaryData){dialled->family == 4 ? 4 : 16, (uint8_t *)dialled->ip};
    res.dialled_port = dialled->port;
  }
  uint8_t body[64];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_DIAL_BACK_RESULT, .body = body,
               .body_len = gwtf__dial_back_result__pack(&res, body)};
  p2p_session_send(s, &m);
}

/* Our dial-back for a peer ended: report over its session (if still there). */
void host_probe_done(p2p_host *h, conn *c, bool ok) {
  c->probe_reported = true;
  p2p_reach_serve_done(h->reach);
  char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
  gw_id_to_short(&c->probe_for, id);
  gw_addr_format(&c->probe_addr, addr);
  GW_DEBUG(h->cfg.log, "nat.dial_back", "peer=\"%s\" addr=%s result=%s", id, addr, ok ? "ok" : "failed");
  if (h->closing) return;
  peer *p = host_find_peer(h, &c->probe_for);
  if (p && p->s && p2p_session_is_up(p->s))
    send_dial_back_result(p->s, c->probe_nonce,
                          ok ? GWTF__DIAL_BACK_STATUS__DIAL_BACK_OK : GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED,
                          &c->probe_addr);
}

/* A peer asks us to dial it back. We dial only the IP its session comes
 * from (the request has no address to give), expecting its node ID. */
void host_serve_dial_back(p2p_host *h, p2p_session *s, const p2p_msg *msg) {
  const p2p_session_info *info = p2p_session_get_info(s);
  Gwtf__DialBackRequest *rq = gwtf__dial_back_request__unpack(NULL, msg->body_len, msg->body);
  if (!rq) return; /* malformed: not answered */
  uint32_t port = rq->port;
  uint64_t nonce = rq->nonce;
  gwtf__dial_back_request__free_unpacked(rq, NULL);
  char id[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&info->peer_id, id);
  const char *why = "relayed";
  /* Over a relay, remote is the relay's address: never dial that. */
  int rc = info->relayed ? GW_EPERM : p2p_reach_admit(h->reach, &info->peer_id, &info->remote, port, host_now_ms(), &why);
  if (rc != 0) {
    GW_DEBUG(h->cfg.log, "nat.dial_back_refused", "peer=\"%s\" port=%u reason=%s", id, (unsigned)port, why);
    send_dial_back_result(s, nonce, GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED, NULL);
    return;
  }
  gw_addr target = info->remote;
  target.port = (uint16_t)port;
  conn *c = calloc(1, sizeof(*c));
  if (!c) {
    p2p_reach_serve_done(h->reach);
    send_dial_back_result(s, nonce, GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED, NULL);
    return;
  }
  c->h = h;
  c->probe_out = true;
  c->probe_for = info->peer_id;
  c->probe_nonce = nonce;
  c->probe_addr = target;
  p2p_session_config scfg = h->scfg;
  scfg.dial_back_nonce = nonce;
  scfg.connect_timeout_ms = h->cfg.dial_back_timeout_ms;
  scfg.handshake_timeout_ms = h->cfg.dial_back_timeout_ms;
  rc = p2p_session_dial(h->loop, &target, &info->peer_id, &scfg, &host_session_cbs, c, &c->s);
  if (rc != 0) {
    host_probe_done(h, c, false);
    free(c);
    return;
  }
  host_conn_link(h, c);
}

void host_got_dial_back_result(p2p_host *h, const gw_id *from, const p2p_msg *msg) {
  Gwtf__DialBackResult *res = gwtf__dial_back_result__unpack(NULL, msg->body_len, msg->body);
  if (!res) return;
  gw_addr dialled = {0};
  size_t l = res->dialled_ip.len;
  if ((l == 4 || l == 16) && res->dialled_port > 0 && res->dialled_port <= 65535) {
    dialled.family = l == 4 ? 4 : 6;
    memcpy(dialled.ip, res->dialled_ip.data, l);
    dialled.port = (uint16_t)res->dialled_port;
  }
  p2p_reach_on_result(h->reach, from, res->nonce, (int)res->status, &dialled, host_now_ms());
  gwtf__dial_back_result__free_unpacked(res, NULL);
}
