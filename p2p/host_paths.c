/* p2p/host_paths.c — the host's side of the other ways to a peer: relay
 * circuits (p2p/relay.h: a preface turns a session into a relay leg or a
 * circuit's end) and hole punching (p2p/punch.h: a punched connection
 * becomes the peer's session once it wins). */
#include <stdlib.h>
#include <string.h>

#include "p2p/host_internal.h"
#include "util/err.h"

/* ---- relay circuits (p2p/relay.h) ---- */

void host_on_session_preface(p2p_session *s, const uint8_t *preface) {
  conn *c = host_conn_of(s);
  p2p_host *h = c->h;
  host_handshake_over(h, c); /* a relay leg is no handshake */
  if (h->closing || !h->relay) {
    p2p_session_close(s, P2P_END_CLOSED, 0, "shutdown");
    return;
  }
  p2p_relay_on_preface(h->relay, s, preface);
}

void host_on_session_pipe_data(p2p_session *s, uint8_t *buf, size_t len) {
  p2p_host *h = host_conn_of(s)->h;
  if (h->closing || !h->relay) {
    free(buf);
    return;
  }
  p2p_relay_on_pipe_data(h->relay, s, buf, len);
}

int host_dial_via(p2p_host *h, target *t, conn *c) {
  uint8_t preface[P2P_RELAY_PREFACE_BYTES];
  p2p_relay_preface_connect(&t->expect, preface);
  return p2p_session_dial_via(h->loop, &t->addr, preface, P2P_INITIATOR, &t->expect, &h->scfg, &host_session_cbs, c,
                              &c->s);
}

int p2p_host_relay_dial_back(p2p_host *h, const gw_addr *addr, const uint8_t preface[P2P_RELAY_PREFACE_BYTES]) {
  if (h->closing) return GW_ECLOSED;
  /* A circuit is a new inbound session from someone we do not know yet:
   * it counts against the global handshake and session caps (the relay's
   * own limits bound how many one relay brings). */
  if (h->handshakes >= h->cfg.max_handshakes || h->n_conns >= h->cfg.max_sessions) {
    bool hs = h->handshakes >= h->cfg.max_handshakes;
    p2p_limits_hit(h->limits, hs ? "handshakes-total" : "sessions-total", addr, hs ? h->handshakes : h->n_conns,
                   host_now_ms());
    return GW_EFULL;
  }
  conn *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  c->h = h;
  c->handshaking_in = true;
  int rc = p2p_session_dial_via(h->loop, addr, preface, P2P_RESPONDER, NULL, &h->scfg, &host_session_cbs, c, &c->s);
  if (rc != 0) {
    free(c);
    return rc;
  }
  host_conn_link(h, c);
  h->handshakes++;
  return 0;
}

int p2p_host_relay_send(p2p_host *h, const gw_id *to, const p2p_msg *msg) {
  peer *p = host_find_peer(h, to);
  if (!p || !p->s || h->closing) return GW_ENOENT;
  return p2p_session_send(p->s, msg);
}

bool p2p_host_relay_peer_up(const p2p_host *h, const gw_id *id) { return p2p_host_is_connected(h, id); }

/* ---- hole punching (p2p/punch.h) ---- */

void host_on_session_punch(p2p_session *s, const uint8_t *preface) {
  conn *c = host_conn_of(s);
  p2p_host *h = c->h;
  if (h->closing || !h->punch) {
    p2p_session_close(s, P2P_END_CLOSED, 0, "shutdown");
    return;
  }
  c->punch = true;
  p2p_punch_on_preface(h->punch, s, preface);
}

int p2p_host_punch_dial(p2p_host *h, const gw_addr *local, const gw_addr *remote,
                        const uint8_t preface[P2P_PUNCH_PREFACE_BYTES], p2p_role role, const gw_id *expect,
                        p2p_session **out) {
  if (h->closing) return GW_ECLOSED;
  if (h->n_conns >= h->cfg.max_sessions) return GW_EFULL;
  conn *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  c->h = h;
  c->punch = true;
  int rc = p2p_session_dial_punch(h->loop, local, remote, preface, role, expect, &h->scfg, &host_session_cbs, c, &c->s);
  if (rc != 0) {
    free(c);
    return rc;
  }
  host_conn_link(h, c);
  *out = c->s;
  return 0;
}

void p2p_host_punch_switch(p2p_host *h, const gw_id *id, p2p_session *s) {
  peer *p = host_find_peer(h, id);
  if (!p || h->closing) return;
  const p2p_session_info *info = p2p_session_get_info(s);
  host_conn_of(s)->punch = false; /* an ordinary peer session from now on */
  p->s = s;
  p->addr = info->listen.family ? info->listen : info->remote;
  p->next_ping_ms = host_now_ms();
  p->rtt_samples = 0; /* another path: its RTT starts afresh */
  host_apply_links(h, p, s);
}

p2p_session *p2p_host_punch_current(const p2p_host *h, const gw_id *id) {
  const peer *p = host_find_peer(h, id);
  return p ? p->s : NULL;
}

size_t p2p_host_punch_observed(const p2p_host *h, gw_addr *local, gw_addr *observed, size_t max) {
  size_t n = 0;
  for (const peer *p = h->peers; p && n < max; p = p->next) {
    if (!p->s || !p2p_session_is_up(p->s)) continue;
    const p2p_session_info *info = p2p_session_get_info(p->s);
    if (info->relayed || !info->observed.family || info->observed.family != info->local.family) continue;
    local[n] = info->local;
    observed[n++] = info->observed;
  }
  return n;
}

void p2p_host_punch_stats(const p2p_host *h, p2p_punch_stats *out) { p2p_punch_get_stats(h->punch, out); }

int p2p_host_connect_via(p2p_host *h, const gw_id *relay_id, const gw_addr *relay_addr, const gw_id *target_id) {
  (void)relay_id; /* the circuit's end-to-end handshake authenticates the target; the relay is just a pipe */
  if (h->closing) return GW_ECLOSED;
  if (!relay_addr->family || !relay_addr->port || !target_id || gw_id_is_zero(target_id)) return GW_EINVAL;
  if (gw_id_eq(target_id, &h->cfg.me->id)) return GW_EINVAL;
  for (target *t = h->targets; t; t = t->next)
    if (t->via && gw_addr_eq(&t->addr, relay_addr) && gw_id_eq(&t->expect, target_id)) return 0;
  target *t = calloc(1, sizeof(*t));
  if (!t) return GW_ENOMEM;
  t->addr = *relay_addr;
  t->expect = *target_id;
  t->via = true;
  t->next = h->targets;
  h->targets = t;
  if (!host_target_satisfied(h, t)) host_dial(h, t);
  return 0;
}

int p2p_host_relay_reserve(p2p_host *h, const gw_id *relay_id, const gw_addr *relay_addr) {
  if (!h->relay) return GW_ENOMEM;
  int rc = p2p_host_connect(h, relay_addr, relay_id);
  return rc == 0 ? p2p_relay_want(h->relay, relay_id, relay_addr) : rc;
}

void p2p_host_relay_stats(const p2p_host *h, p2p_relay_stats *out) {
  if (h->relay)
    p2p_relay_get_stats(h->relay, out);
  else
    memset(out, 0, sizeof(*out));
}

void p2p_host_relay_unreserve(p2p_host *h, const gw_id *relay_id) {
  if (h->relay) p2p_relay_unwant(h->relay, relay_id);
}

size_t p2p_host_relay_list(const p2p_host *h, p2p_relay_resv *out, size_t max) {
  return h->relay ? p2p_relay_list(h->relay, out, max) : 0;
}

void p2p_host_forget_via(p2p_host *h, const gw_addr *relay_addr, const gw_id *target_id) {
  for (target *t = h->targets; t; t = t->next)
    if (t->via && gw_addr_eq(&t->addr, relay_addr) && gw_id_eq(&t->expect, target_id)) {
      host_free_target(h, t);
      return;
    }
}
