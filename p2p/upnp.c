/* UPnP-IGD: the answer checks (upnp.h) and the client behind the
 * port-mapping interface (p2p_pm_upnp, portmap.h). */
#include "p2p/upnp.h"

#include <miniupnpc/miniupnpc.h>
#include <miniupnpc/upnpcommands.h>
#include <miniupnpc/upnperrors.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/portmap.h"
#include "util/err.h"

/* ---- checks ---- */

int p2p_upnp_parse_uint(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
  if (!s || !*s) return GW_EINVAL;
  uint64_t v = 0;
  size_t n = 0;
  for (; s[n]; n++) {
    if (s[n] < '0' || s[n] > '9' || n >= 10) return GW_EINVAL;
    v = v * 10 + (uint64_t)(s[n] - '0');
  }
  if (v < lo || v > hi) return GW_EINVAL;
  *out = (uint32_t)v;
  return 0;
}

int p2p_upnp_parse_ipv4(const char *s, uint8_t out[4]) {
  if (!s) return GW_EINVAL;
  const char *p = s;
  for (int i = 0; i < 4; i++) {
    uint32_t v = 0;
    size_t n = 0;
    while (p[n] >= '0' && p[n] <= '9') {
      if (n == 3) return GW_EINVAL;
      v = v * 10 + (uint32_t)(p[n] - '0');
      n++;
    }
    if (n == 0 || (n > 1 && p[0] == '0') || v > 255) return GW_EINVAL;
    out[i] = (uint8_t)v;
    p += n;
    if (i < 3 && *p++ != '.') return GW_EINVAL;
  }
  if (*p != '\0') return GW_EINVAL;
  if ((out[0] | out[1] | out[2] | out[3]) == 0) return GW_EINVAL;
  return 0;
}

int p2p_upnp_check_entry(const char *int_client, const char *int_port, const char *lease, const char *want_client,
                         uint16_t want_port, uint32_t *lease_out) {
  uint8_t a[4], b[4];
  uint32_t port;
  if (p2p_upnp_parse_ipv4(int_client, a) != 0 || p2p_upnp_parse_ipv4(want_client, b) != 0 || memcmp(a, b, 4) != 0)
    return GW_EINVAL;
  if (p2p_upnp_parse_uint(int_port, 1, 65535, &port) != 0 || port != want_port) return GW_EINVAL;
  /* Some routers leave the lease empty for a permanent mapping. */
  if (!lease || !*lease) {
    *lease_out = 0;
    return 0;
  }
  return p2p_upnp_parse_uint(lease, 0, UINT32_MAX, lease_out);
}

/* ---- the client ---- */

/* UPnP error codes (upnpcommands.h). */
#define UPNP_NO_SUCH_ENTRY (714)
#define UPNP_CONFLICT (718)
#define UPNP_ONLY_PERMANENT (725)
#define SSDP_TTL (2)
#define IGD_DEVICE "urn:schemas-upnp-org:device:InternetGatewayDevice:1"

typedef enum job { JOB_MAP, JOB_DELETE } job;

typedef struct upnp_client {
  p2p_pm_client base; /* first; its mapped flags are touched by the worker thread only while busy */
  uv_work_t work;
  bool busy;
  /* Touched by the worker thread only while busy. */
  job job;
  bool have_igd;
  struct UPNPUrls urls;
  struct IGDdatas data;
  char lanaddr[64];
  p2p_pm_result res;
  int upnp_err;       /* the router's error code behind res.why, for the log line */
  const char *step;   /* which call failed */
  /* Loop side. */
  bool closing, unmap;
} upnp_client;

/* One mapping: add (or refresh) it, then read it back. Thread side. */
static int add_one(upnp_client *c, const char *proto, uint16_t port, gw_addr *ext, const uint8_t ip[4],
                   uint32_t *lease) {
  char sport[8], life[16];
  snprintf(sport, sizeof(sport), "%u", (unsigned)port);
  snprintf(life, sizeof(life), "%u", (unsigned)c->base.cfg.lifetime_s);
  const char *ctl = c->urls.controlURL, *st = c->data.first.servicetype;
  int r = UPNP_AddPortMapping(ctl, st, sport, sport, c->lanaddr, "gwtf", proto, NULL, life);
  if (r == UPNP_ONLY_PERMANENT) r = UPNP_AddPortMapping(ctl, st, sport, sport, c->lanaddr, "gwtf", proto, NULL, "0");
  if (r != 0) {
    c->upnp_err = r;
    c->step = "add";
    c->res.why = r == UPNP_CONFLICT ? "port-taken" : "refused";
    return GW_EPERM;
  }
  char client[40] = "", iport[8] = "", desc[80] = "", enabled[8] = "", dur[16] = "";
  r = UPNP_GetSpecificPortMappingEntry(ctl, st, sport, proto, NULL, client, iport, desc, enabled, dur);
  uint32_t granted;
  if (r != 0 || p2p_upnp_check_entry(client, iport, dur, c->lanaddr, port, &granted) != 0) {
    c->upnp_err = r;
    c->step = "read-back";
    c->res.why = "bad-reply";
    return GW_EPROTO;
  }
  memset(ext, 0, sizeof(*ext));
  ext->family = 4;
  memcpy(ext->ip, ip, 4);
  ext->port = port;
  if (*lease == UINT32_MAX || granted < *lease) *lease = granted;
  return 0;
}

static void do_map(upnp_client *c) {
  memset(&c->res, 0, sizeof(c->res));
  c->upnp_err = 0;
  c->step = NULL;
  if (!c->have_igd) {
    int err = 0;
    /* One search, for IGD:1 (an IGD:2 router answers it too): upnpDiscover
     * would search four device types one after another, each waiting the
     * full delay when nobody answers, and a node stopping meanwhile waits
     * for the thread. */
    struct UPNPDev *devs = upnpDiscoverDevice(IGD_DEVICE, (int)c->base.cfg.upnp_discover_ms, NULL, NULL,
                                              UPNP_LOCAL_PORT_ANY, 0, SSDP_TTL, &err);
    if (!devs) {
      c->res = (p2p_pm_result){.rc = GW_ENOENT, .absent = true, .why = "no-upnp-device"};
      return;
    }
    int igd = UPNP_GetValidIGD(devs, &c->urls, &c->data, c->lanaddr, sizeof(c->lanaddr));
    freeUPNPDevlist(devs);
    if (igd != 1) {
      if (igd != 0) FreeUPNPUrls(&c->urls);
      c->res = (p2p_pm_result){.rc = GW_ENOENT, .absent = true, .why = igd == 2 ? "igd-not-connected" : "no-igd"};
      return;
    }
    c->have_igd = true;
  }
  char ext[40] = "";
  uint8_t ip[4];
  int r = UPNP_GetExternalIPAddress(c->urls.controlURL, c->data.first.servicetype, ext);
  if (r != 0 || p2p_upnp_parse_ipv4(ext, ip) != 0) {
    c->upnp_err = r;
    c->step = "external-ip";
    c->res = (p2p_pm_result){.rc = GW_EPROTO, .why = r != 0 ? "no-external-address" : "bad-reply"};
    return;
  }
  uint32_t lease = UINT32_MAX;
  if (c->base.cfg.tcp_port) {
    if ((c->res.rc = add_one(c, "TCP", c->base.cfg.tcp_port, &c->res.external_tcp, ip, &lease)) != 0) return;
    c->base.tcp_mapped = true;
  }
  if (c->base.cfg.udp_port) {
    if ((c->res.rc = add_one(c, "UDP", c->base.cfg.udp_port, &c->res.external_udp, ip, &lease)) != 0) return;
    c->base.udp_mapped = true;
  }
  c->res.lease_s = lease == UINT32_MAX ? 0 : lease;
}

static void do_delete(upnp_client *c) {
  char sport[8];
  const char *ctl = c->urls.controlURL, *st = c->data.first.servicetype;
  if (c->base.tcp_mapped) {
    snprintf(sport, sizeof(sport), "%u", (unsigned)c->base.cfg.tcp_port);
    int r = UPNP_DeletePortMapping(ctl, st, sport, "TCP", NULL);
    if (r == 0 || r == UPNP_NO_SUCH_ENTRY) c->base.tcp_mapped = false;
  }
  if (c->base.udp_mapped) {
    snprintf(sport, sizeof(sport), "%u", (unsigned)c->base.cfg.udp_port);
    int r = UPNP_DeletePortMapping(ctl, st, sport, "UDP", NULL);
    if (r == 0 || r == UPNP_NO_SUCH_ENTRY) c->base.udp_mapped = false;
  }
}

static void work_cb(uv_work_t *w) {
  upnp_client *c = w->data;
  if (c->job == JOB_MAP)
    do_map(c);
  else
    do_delete(c);
}

static void after_work(uv_work_t *w, int status);

static void queue(upnp_client *c, job j) {
  c->job = j;
  c->busy = true;
  c->work.data = c;
  int rc = uv_queue_work(c->base.loop, &c->work, work_cb, after_work);
  if (rc != 0) {
    c->busy = false;
    c->res = (p2p_pm_result){.rc = rc, .why = "thread-pool"};
  }
}

static void finish(upnp_client *c) {
  if (c->have_igd) FreeUPNPUrls(&c->urls);
  p2p_pm_client_free(&c->base);
}

static void after_work(uv_work_t *w, int status) {
  upnp_client *c = w->data;
  (void)status; /* cancelled or run, the flags say what exists */
  c->busy = false;
  if (c->closing) {
    /* Deleting is done, or a map finished after close: delete what it made. */
    if (c->job == JOB_MAP && c->unmap && c->have_igd && (c->base.tcp_mapped || c->base.udp_mapped)) {
      queue(c, JOB_DELETE);
      if (c->busy) return;
    }
    if (!c->unmap) c->base.tcp_mapped = c->base.udp_mapped = false;
    finish(c);
    return;
  }
  if (c->res.rc != 0 && c->step)
    GW_INFO(c->base.cfg.log, "nat.upnp_error", "step=%s code=%d msg=\"%s\"", c->step, c->upnp_err,
            c->upnp_err > 0 ? strupnperror(c->upnp_err) ? strupnperror(c->upnp_err) : "-" : "-");
  c->base.done(c->base.ud, &c->res);
}

static int upnp_open(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done, void *ud, void **out) {
  upnp_client *c = calloc(1, sizeof(*c));
  if (!c) return GW_ENOMEM;
  p2p_pm_client_init(&c->base, loop, cfg, done, ud);
  *out = c;
  return 0;
}

static void free_timer(uv_handle_t *h) { free(h); }

/* Runs cb(c) from the loop on a one-shot timer (cb closes it with
 * free_timer); false when out of memory. */
static bool from_loop(upnp_client *c, uv_timer_cb cb) {
  uv_timer_t *t = malloc(sizeof(*t));
  if (!t) return false;
  uv_timer_init(c->base.loop, t);
  t->data = c;
  uv_timer_start(t, cb, 0, 0);
  return true;
}

static void on_queue_failed(uv_timer_t *t);

static void upnp_map(void *client) {
  upnp_client *c = client;
  queue(c, JOB_MAP);
  /* The done() must come from the loop: hand it over on a one-shot timer. */
  if (!c->busy) (void)from_loop(c, on_queue_failed);
}

static void on_queue_failed(uv_timer_t *t) {
  upnp_client *c = t->data;
  uv_close((uv_handle_t *)t, free_timer);
  if (!c->closing) c->base.done(c->base.ud, &c->res);
}

static void on_finish_timer(uv_timer_t *t) {
  upnp_client *c = t->data;
  uv_close((uv_handle_t *)t, free_timer);
  finish(c);
}

static void upnp_close(void *client, bool unmap, p2p_pm_closed_fn closed, void *ud) {
  upnp_client *c = client;
  c->closing = true;
  c->unmap = unmap;
  p2p_pm_client_closing(&c->base, closed, ud);
  if (c->busy) {
    uv_cancel((uv_req_t *)&c->work); /* if it has not started; after_work runs either way */
    return;
  }
  if (unmap && c->have_igd && (c->base.tcp_mapped || c->base.udp_mapped)) {
    queue(c, JOB_DELETE);
    if (c->busy) return;
  }
  if (!unmap) c->base.tcp_mapped = c->base.udp_mapped = false;
  /* closed() must come from the loop, and the caller may still be inside
   * a callback of ours: finish on a one-shot timer. */
  if (!from_loop(c, on_finish_timer)) finish(c);
}

const p2p_pm_proto p2p_pm_upnp = {.name = "upnp", .open = upnp_open, .map = upnp_map, .close = upnp_close};
