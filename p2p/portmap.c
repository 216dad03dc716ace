#include "p2p/portmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* Never renew more often than this, whatever lease a router grants. */
#define RENEW_MIN_MS (1000)
#define MAX_PROTOS (3)

/* The order of --port-mapping auto: PCP is NAT-PMP's successor on the same
 * port (a PCP router answers both), so it goes first; UPnP last because its
 * discovery waits for SSDP answers (seconds) where the others fail fast. */
static const p2p_pm_proto *const auto_order[MAX_PROTOS] = {&p2p_pm_pcp, &p2p_pm_natpmp, &p2p_pm_upnp};

struct p2p_portmap {
  uv_loop_t *loop;
  p2p_portmap_config cfg;
  p2p_portmap_cb cb;
  void *ud;
  const p2p_pm_proto *protos[MAX_PROTOS];
  int n_protos, cur;
  void *client;  /* the protocol being tried, or the one that mapped */
  bool closing;  /* a client is being closed before the next is tried */
  bool stopping;
  uv_timer_t renew;
  p2p_portmap_status st;
  void (*done)(void *ud);
  void *done_ud;
};

static const char *const mode_names[] = {"auto", "pcp", "natpmp", "upnp", "off"};

int p2p_portmap_mode_parse(const char *s, p2p_portmap_mode *out) {
  for (int i = 0; i <= P2P_PORTMAP_OFF; i++)
    if (strcmp(s, mode_names[i]) == 0) {
      *out = (p2p_portmap_mode)i;
      return 0;
    }
  if (strcmp(s, "nat-pmp") == 0) {
    *out = P2P_PORTMAP_NATPMP;
    return 0;
  }
  return GW_EINVAL;
}

const char *p2p_portmap_mode_name(p2p_portmap_mode m) {
  return (unsigned)m <= P2P_PORTMAP_OFF ? mode_names[m] : "?";
}

void p2p_pm_config_defaults(p2p_portmap_config *cfg) {
  if (!cfg->lifetime_s) cfg->lifetime_s = P2P_PM_LIFETIME_DEFAULT_S;
  if (!cfg->give_up_ms) cfg->give_up_ms = P2P_PM_GIVE_UP_DEFAULT_MS;
  if (!cfg->stop_timeout_ms) cfg->stop_timeout_ms = P2P_PM_STOP_TIMEOUT_DEFAULT_MS;
  if (!cfg->retry_ms) cfg->retry_ms = P2P_PM_RETRY_DEFAULT_MS;
  if (!cfg->upnp_discover_ms) cfg->upnp_discover_ms = P2P_PM_UPNP_DISCOVER_DEFAULT_MS;
}

void p2p_pm_client_init(p2p_pm_client *b, uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done,
                        void *ud) {
  b->loop = loop;
  b->cfg = *cfg;
  p2p_pm_config_defaults(&b->cfg);
  b->done = done;
  b->ud = ud;
}

void p2p_pm_client_closing(p2p_pm_client *b, p2p_pm_closed_fn closed, void *ud) {
  b->closed = closed;
  b->closed_ud = ud;
  b->done = NULL;
}

void p2p_pm_client_free(p2p_pm_client *b) {
  p2p_pm_closed_fn closed = b->closed;
  void *ud = b->closed_ud;
  bool all = !b->tcp_mapped && !b->udp_mapped;
  free(b);
  if (closed) closed(ud, all);
}

int p2p_pm_default_gateway(uint32_t *gw_be) {
  FILE *f = fopen("/proc/net/route", "r");
  if (!f) return GW_ENOENT;
  char line[256];
  int rc = GW_ENOENT;
  /* Iface Destination Gateway Flags ...: hex of the address as the kernel
   * holds it (network order), so the parsed value is already big-endian in
   * memory. The first default route with a gateway (RTF_GATEWAY) wins. */
  while (fgets(line, sizeof(line), f)) {
    char iface[64];
    unsigned long dest, gw, flags;
    if (sscanf(line, "%63s %lx %lx %lx", iface, &dest, &gw, &flags) != 4) continue;
    if (dest == 0 && (flags & 0x2) && gw != 0) {
      *gw_be = (uint32_t)gw;
      rc = 0;
      break;
    }
  }
  fclose(f);
  return rc;
}

/* ---- state ---- */

static void set_state(p2p_portmap *pm, p2p_portmap_state s, const char *why) {
  pm->st.state = s;
  pm->st.why = why;
  if (s != P2P_PORTMAP_MAPPED && s != P2P_PORTMAP_LAPSED) pm->st.proto = NULL;
  if (pm->cb && !pm->stopping) pm->cb(pm->ud, &pm->st);
}

static void try_proto(p2p_portmap *pm);

static void on_renew(uv_timer_t *t) {
  p2p_portmap *pm = t->data;
  if (pm->client && !pm->stopping) pm->protos[pm->cur]->map(pm->client);
}

static void mapped(p2p_portmap *pm, const p2p_pm_result *r) {
  char tcp[GW_ADDR_STRLEN], udp[GW_ADDR_STRLEN];
  const char *name = pm->protos[pm->cur]->name;
  bool renewal = pm->st.state == P2P_PORTMAP_MAPPED;
  pm->st.external_tcp = r->external_tcp;
  pm->st.external_udp = r->external_udp;
  pm->st.lease_s = r->lease_s;
  pm->st.proto = name;
  gw_addr_format(&r->external_tcp, tcp);
  gw_addr_format(&r->external_udp, udp);
  if (!r->external_tcp.family) snprintf(tcp, sizeof(tcp), "-");
  if (!r->external_udp.family) snprintf(udp, sizeof(udp), "-");
  if (renewal) {
    pm->st.renewals++;
    GW_INFO(pm->cfg.log, "nat.renewed", "proto=%s external=%s udp=%s lifetime=%u renewals=%u", name, tcp, udp,
            r->lease_s, pm->st.renewals);
  } else {
    GW_INFO(pm->cfg.log, "nat.mapped", "proto=%s external=%s udp=%s lifetime=%u", name, tcp, udp, r->lease_s);
  }
  /* Renew at half the lease granted (RFC 6886 §3.3, RFC 6887 §11.2.1); a
   * lease without expiry (UPnP's 0) needs no renewal. */
  if (r->lease_s > 0) {
    uint64_t ms = (uint64_t)r->lease_s * 500;
    uv_update_time(pm->loop); /* the loop's cached clock may lag; the lease runs from now */
    uv_timer_start(&pm->renew, on_renew, ms < RENEW_MIN_MS ? RENEW_MIN_MS : ms, 0);
  }
  set_state(pm, P2P_PORTMAP_MAPPED, NULL);
}

static void on_renew_closed(uv_handle_t *h);

static void on_closed_next(void *ud, bool all_deleted) {
  p2p_portmap *pm = ud;
  (void)all_deleted;
  pm->closing = false;
  if (pm->stopping) {
    pm->st.state = P2P_PORTMAP_STOPPED;
    uv_close((uv_handle_t *)&pm->renew, on_renew_closed);
    return;
  }
  pm->cur++;
  try_proto(pm);
}

static void on_done(void *ud, const p2p_pm_result *r) {
  p2p_portmap *pm = ud;
  if (pm->stopping) return;
  const char *name = pm->protos[pm->cur]->name;
  if (pm->st.state == P2P_PORTMAP_WORKING) {
    if (r->rc == 0) {
      mapped(pm, r);
      return;
    }
    GW_INFO(pm->cfg.log, "nat.proto_failed", "proto=%s reason=%s absent=%s", name, r->why ? r->why : "error",
            r->absent ? "true" : "false");
    pm->st.why = r->why;
    void *c = pm->client;
    pm->client = NULL;
    pm->closing = true;
    pm->protos[pm->cur]->close(c, true, on_closed_next, pm); /* a half-made mapping goes too */
    return;
  }
  /* a renewal */
  if (r->rc == 0) {
    pm->st.state = P2P_PORTMAP_MAPPED; /* a lapsed mapping that came back is logged as renewed */
    mapped(pm, r);
    return;
  }
  GW_WARN(pm->cfg.log, "nat.renew_failed", "proto=%s reason=%s retry_ms=%u", name, r->why ? r->why : "error",
          pm->cfg.retry_ms);
  uv_timer_start(&pm->renew, on_renew, pm->cfg.retry_ms, 0);
  set_state(pm, P2P_PORTMAP_LAPSED, r->why);
}

static void try_proto(p2p_portmap *pm) {
  if (pm->cur >= pm->n_protos) {
    GW_INFO(pm->cfg.log, "nat.no_mapping", "tried=%s reason=%s msg=\"no router mapped our port; carrying on unmapped\"",
            pm->st.tried, pm->st.why ? pm->st.why : "-");
    set_state(pm, P2P_PORTMAP_NONE, pm->st.why);
    return;
  }
  const p2p_pm_proto *p = pm->protos[pm->cur];
  size_t len = strlen(pm->st.tried);
  snprintf(pm->st.tried + len, sizeof(pm->st.tried) - len, "%s%s", len ? "," : "", p->name);
  int rc = p->open(pm->loop, &pm->cfg, on_done, pm, &pm->client);
  if (rc != 0) {
    pm->client = NULL;
    GW_WARN(pm->cfg.log, "nat.proto_failed", "proto=%s reason=open err=\"%s\"", p->name, gw_strerror(rc));
    pm->st.why = "open";
    pm->cur++;
    try_proto(pm);
    return;
  }
  p->map(pm->client);
}

/* ---- API ---- */

int p2p_portmap_start(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_portmap_cb cb, void *ud,
                      p2p_portmap **out) {
  *out = NULL;
  if (cfg->mode == P2P_PORTMAP_OFF || (unsigned)cfg->mode > P2P_PORTMAP_OFF) return GW_EINVAL;
  p2p_portmap *pm = calloc(1, sizeof(*pm));
  if (!pm) return GW_ENOMEM;
  pm->loop = loop;
  pm->cfg = *cfg;
  p2p_pm_config_defaults(&pm->cfg);
  pm->ud = ud;
  switch (cfg->mode) {
  case P2P_PORTMAP_AUTO:
    for (int i = 0; i < MAX_PROTOS; i++) pm->protos[pm->n_protos++] = auto_order[i];
    break;
  case P2P_PORTMAP_PCP: pm->protos[pm->n_protos++] = &p2p_pm_pcp; break;
  case P2P_PORTMAP_NATPMP: pm->protos[pm->n_protos++] = &p2p_pm_natpmp; break;
  default: pm->protos[pm->n_protos++] = &p2p_pm_upnp; break;
  }
  uv_timer_init(loop, &pm->renew);
  pm->renew.data = pm;
  pm->st.state = P2P_PORTMAP_WORKING;
  *out = pm;
  try_proto(pm);
  pm->cb = cb; /* set last: no callback runs inside this call */
  return 0;
}

const p2p_portmap_status *p2p_portmap_get_status(const p2p_portmap *pm) { return &pm->st; }

static void on_renew_closed(uv_handle_t *h) {
  p2p_portmap *pm = h->data;
  void (*done)(void *) = pm->done;
  void *ud = pm->done_ud;
  free(pm);
  if (done) done(ud);
}

static void on_closed_stop(void *ud, bool all_deleted) {
  p2p_portmap *pm = ud;
  const p2p_portmap_status *st = &pm->st;
  if (st->state == P2P_PORTMAP_MAPPED || st->state == P2P_PORTMAP_LAPSED) {
    if (all_deleted)
      GW_INFO(pm->cfg.log, "nat.unmapped", "proto=%s tcp=%u udp=%u", st->proto, pm->cfg.tcp_port, pm->cfg.udp_port);
    else
      GW_WARN(pm->cfg.log, "nat.unmap_incomplete", "proto=%s msg=\"the router did not confirm; the lease lapses\"",
              st->proto);
  }
  pm->st.state = P2P_PORTMAP_STOPPED;
  uv_close((uv_handle_t *)&pm->renew, on_renew_closed);
}

void p2p_portmap_stop(p2p_portmap *pm, void (*done)(void *ud), void *ud) {
  pm->done = done;
  pm->done_ud = ud;
  pm->cb = NULL;
  pm->stopping = true;
  uv_timer_stop(&pm->renew);
  if (pm->closing) {
    return; /* on_closed_next finishes */
  }
  if (pm->client) {
    void *c = pm->client;
    pm->client = NULL;
    pm->protos[pm->cur]->close(c, true, on_closed_stop, pm);
    return;
  }
  pm->st.state = P2P_PORTMAP_STOPPED;
  uv_close((uv_handle_t *)&pm->renew, on_renew_closed);
}
