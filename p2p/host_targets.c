/* p2p/host_targets.c — what the host keeps dialling: one target per
 * (address, expected node ID) or per (relay, target ID), redialled with
 * backoff while it is not connected (docs/P2P.md, "Dialling"). The rest of
 * the host is p2p/host.c; shared state in p2p/host_internal.h. */
#include "p2p/host.h"
#include "p2p/host_internal.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/session.h"
#include "util/err.h"

static uint32_t backoff_ms(const p2p_host *h, unsigned failures) {
  uint64_t d = h->cfg.backoff_min_ms;
  for (unsigned i = 1; i < failures && d < h->cfg.backoff_max_ms; i++) d *= 2;
  if (d > h->cfg.backoff_max_ms) d = h->cfg.backoff_max_ms;
  /* "Equal jitter": half fixed, half random, so peers that lost the same
   * node do not all come back in the same millisecond. */
  uint32_t half = (uint32_t)(d / 2);
  return half + (half ? randombytes_uniform(half + 1) : 0);
}

bool host_target_is(const target *t, const gw_id *id) {
  return gw_id_eq(&t->expect, id) || gw_id_eq(&t->learned, id);
}

bool host_target_satisfied(const p2p_host *h, const target *t) {
  const gw_id *id = !gw_id_is_zero(&t->expect) ? &t->expect : &t->learned;
  if (gw_id_is_zero(id)) return false;
  const peer *p = host_find_peer(h, id);
  /* A relayed session does not meet a direct target: the direct session,
   * once up, replaces it (newer_wins). */
  if (p && p->s && !t->via && p2p_session_get_info(p->s)->relayed) return false;
  return p && (p->s || p->switching);
}

void host_free_target(p2p_host *h, target *t) {
  for (target **pp = &h->targets; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      break;
    }
  if (t->dialing) host_conn_of(t->dialing)->t = NULL; /* the dial goes on, unowned */
  free(t);
}

void host_dial_failed(p2p_host *h, target *t, int err, const char *why) {
  char addr[GW_ADDR_STRLEN];
  gw_addr_format(&t->addr, addr);
  if (why && strcmp(why, "self") == 0) {
    GW_WARN(h->cfg.log, "peer.self", "addr=%s msg=\"this address is this node itself; not dialling it again\"",
            addr);
    host_free_target(h, t);
    return;
  }
  t->failures++;
  /* Another node proved (by its signature) that it holds this address: the
   * one we expect is not there, most often an old identity of a node that
   * restarted on its port. Its record may still name the address, so the
   * target stays, but it retries at the slowest rate at once: every such
   * dial costs the node there a handshake. */
  bool someone_else = why && strcmp(why, "unexpected-id") == 0;
  uint32_t delay = backoff_ms(h, someone_else ? UINT32_MAX : t->failures);
  t->next_ms = host_now_ms() + delay;
  GW_INFO(h->cfg.log, "peer.dial_failed", "addr=%s attempt=%u reason=%s err=\"%s\" retry_ms=%u", addr, t->failures,
          why ? why : "-", gw_strerror(err), delay);
}


void host_dial(p2p_host *h, target *t) {
  conn *c = calloc(1, sizeof(*c));
  int rc = GW_ENOMEM;
  if (c) {
    c->h = h;
    c->t = t;
    rc = t->via ? host_dial_via(h, t, c)
                : p2p_session_dial(h->loop, &t->addr, gw_id_is_zero(&t->expect) ? NULL : &t->expect, &h->scfg,
                                   &host_session_cbs, c, &c->s);
  }
  if (rc != 0) {
    free(c);
    host_dial_failed(h, t, rc, "dial");
    return;
  }
  host_conn_link(h, c);
  t->dialing = c->s;
}

/* The peer went away: its targets redial soon (with jitter), then back off. */
void host_schedule_redial(p2p_host *h, const gw_id *id) {
  for (target *t = h->targets; t; t = t->next)
    if (!t->dialing && host_target_is(t, id)) {
      t->failures = 0;
      t->next_ms = host_now_ms() + backoff_ms(h, 1);
    }
}

/* The direct target at addr for expect (NULL: any at addr). An address
 * can be named for more than one node ID: a node that restarted with a
 * fresh identity on its old port stays in directories under the old one
 * until its record expires. One target per address, whose expectation the
 * last caller overwrote, kept dialling the dead ID and never the live one
 * (two members of a stage could not reach each other for a whole
 * aggregation round, and the stage split), so each ID gets its own. */
static target *direct_target(p2p_host *h, const gw_addr *addr, const gw_id *expect) {
  target *open = NULL; /* one that does not know whom it reaches yet */
  for (target *t = h->targets; t; t = t->next) {
    if (t->via || !gw_addr_eq(&t->addr, addr)) continue;
    if (!expect || host_target_is(t, expect)) return t;
    if (gw_id_is_zero(&t->expect) && gw_id_is_zero(&t->learned)) open = t;
  }
  return open;
}

int p2p_host_connect(p2p_host *h, const gw_addr *addr, const gw_id *expect) {
  if (h->closing) return GW_ECLOSED;
  if (!addr->family || !addr->port) return GW_EINVAL;
  target *t = direct_target(h, addr, expect);
  if (t) {
    if (expect) t->expect = *expect;
    return 0;
  }
  if (!(t = calloc(1, sizeof(*t)))) return GW_ENOMEM;
  t->addr = *addr;
  if (expect) t->expect = *expect;
  t->next = h->targets;
  h->targets = t;
  if (!host_target_satisfied(h, t)) host_dial(h, t);
  return 0;
}

void p2p_host_forget(p2p_host *h, const gw_addr *addr, const gw_id *expect) {
  for (target *t = h->targets, *next; t; t = next) {
    next = t->next;
    if (!t->via && gw_addr_eq(&t->addr, addr) && (!expect || host_target_is(t, expect))) host_free_target(h, t);
  }
}
