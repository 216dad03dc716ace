/* p2p/portmap.h — asking the home router to forward our port: PCP, NAT-PMP
 * and UPnP-IGD behind one small interface.
 *
 * A node behind a home router can dial out but cannot be dialled. If the
 * router speaks a port-mapping protocol we ask it to forward our TCP port
 * (sessions) and our UDP port (DHT) — the same number — and learn the
 * external address peers can reach us at.
 *
 *   auto:   PCP (RFC 6887), then NAT-PMP (RFC 6886), then UPnP-IGD, the
 *           first that maps both ports wins
 *   pcp | natpmp | upnp: that protocol only
 *
 *   mapped:   log nat.mapped proto=P external=IP:PORT lifetime=S, then renew
 *             at half the lease the router granted (nat.renewed); a renewal
 *             that fails is retried retry_ms later (nat.renew_failed)
 *   none:     log nat.no_mapping tried=pcp,natpmp,upnp; the node carries on
 *             unmapped (other ways to be reached are not this module's job)
 *   stop:     the mappings are deleted (nat.unmapped), bounded by a timeout
 *
 * Each protocol is one file (pcp.c, natpmp.c, upnp.c) exporting one
 * p2p_pm_proto; --port-mapping auto is a loop over the table in portmap.c,
 * and a new protocol is a new file plus one table entry. Everything runs on
 * the caller's libuv loop; UPnP's blocking calls run on libuv's thread pool.
 * Status callbacks always come from the loop, never from inside a call. */
#ifndef GWTF_P2P_PORTMAP_H
#define GWTF_P2P_PORTMAP_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "util/addr.h"
#include "util/log.h"

typedef enum p2p_portmap_mode {
  P2P_PORTMAP_AUTO = 0,
  P2P_PORTMAP_PCP = 1,
  P2P_PORTMAP_NATPMP = 2,
  P2P_PORTMAP_UPNP = 3,
  P2P_PORTMAP_OFF = 4,
} p2p_portmap_mode;

/* "auto", "pcp", "natpmp" (or "nat-pmp"), "upnp", "off".
 * Returns 0 or GW_EINVAL. */
int p2p_portmap_mode_parse(const char *s, p2p_portmap_mode *out);
const char *p2p_portmap_mode_name(p2p_portmap_mode m);

typedef enum p2p_portmap_state {
  P2P_PORTMAP_WORKING = 0, /* asking the router(s) */
  P2P_PORTMAP_MAPPED = 1,  /* both ports forwarded; renewing */
  P2P_PORTMAP_NONE = 2,    /* no protocol gave us a mapping: carry on unmapped */
  P2P_PORTMAP_LAPSED = 3,  /* a renewal failed; retrying every retry_ms */
  P2P_PORTMAP_STOPPED = 4,
} p2p_portmap_state;

typedef struct p2p_portmap_config {
  p2p_portmap_mode mode;
  uint16_t tcp_port;          /* private ports to map; 0 skips one */
  uint16_t udp_port;
  uint32_t lifetime_s;        /* requested lease (default 3600) */
  uint32_t give_up_ms;        /* per protocol (default 10000; UPnP: discovery + calls) */
  uint32_t stop_timeout_ms;   /* deleting on exit may take this long (default 1500) */
  uint32_t retry_ms;          /* after a failed renewal (default 60000) */
  uint32_t upnp_discover_ms;  /* how long UPnP listens for SSDP answers (default 2000) */
  const char *gateway;        /* dotted IPv4 PCP/NAT-PMP server instead of the default route's gateway */
  const gw_log *log;
} p2p_portmap_config;

typedef struct p2p_portmap_status {
  p2p_portmap_state state;
  const char *proto;    /* "pcp", "natpmp" or "upnp" while mapped (or lapsed); NULL otherwise */
  gw_addr external_tcp; /* public IP + forwarded port, family 0 until mapped */
  gw_addr external_udp;
  uint32_t lease_s;     /* shortest lease the router granted; 0 = no expiry (UPnP permanent) */
  unsigned renewals;
  const char *why;      /* NONE / LAPSED: the last protocol's short reason */
  char tried[32];       /* protocols tried so far, "pcp,natpmp,upnp" */
} p2p_portmap_status;

typedef struct p2p_portmap p2p_portmap;

/* Called whenever the state changes or a renewal succeeds. */
typedef void (*p2p_portmap_cb)(void *ud, const p2p_portmap_status *st);

/* Starts mapping (mode must not be OFF). Always returns an object (unless
 * out of memory or the mode is OFF), even when no router answers: its
 * state then becomes NONE. */
int p2p_portmap_start(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_portmap_cb cb, void *ud,
                      p2p_portmap **out);
const p2p_portmap_status *p2p_portmap_get_status(const p2p_portmap *pm);
/* Deletes the mappings (when there are any), closes everything, frees pm,
 * then calls done (may be NULL) from the loop. No status callbacks after
 * this call. */
void p2p_portmap_stop(p2p_portmap *pm, void (*done)(void *ud), void *ud);

/* ---- what a protocol file implements ---- */

/* The outcome of one map() (both ports). */
typedef struct p2p_pm_result {
  int rc;          /* 0: both ports mapped */
  bool absent;     /* nobody speaks this protocol here (vs. a router that refused) */
  const char *why; /* short reason when rc != 0: "no-gateway", "not-authorized", ... */
  gw_addr external_tcp, external_udp;
  uint32_t lease_s; /* shortest lease granted; 0 = no expiry */
} p2p_pm_result;

typedef void (*p2p_pm_done_fn)(void *ud, const p2p_pm_result *r);
/* all_deleted: every mapping the client knew of was confirmed deleted. */
typedef void (*p2p_pm_closed_fn)(void *ud, bool all_deleted);

typedef struct p2p_pm_proto {
  const char *name;
  /* Creates a client for cfg (copied); nothing is sent yet. */
  int (*open)(uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done, void *ud, void **out);
  /* Asks for both mappings with cfg->lifetime_s, or renews them; ends with
   * exactly one done() from the loop, within about cfg->give_up_ms. Only
   * one map() at a time. */
  void (*map)(void *client);
  /* Deletes the mappings it holds when unmap is set (bounded by
   * cfg->stop_timeout_ms), frees the client, then closed() from the loop.
   * A pending map() is abandoned: no done() after this call. */
  void (*close)(void *client, bool unmap, p2p_pm_closed_fn closed, void *ud);
} p2p_pm_proto;

extern const p2p_pm_proto p2p_pm_pcp;
extern const p2p_pm_proto p2p_pm_natpmp;
extern const p2p_pm_proto p2p_pm_upnp;

/* Shared by the protocol files. */
#define P2P_PM_LIFETIME_DEFAULT_S (3600)
#define P2P_PM_GIVE_UP_DEFAULT_MS (10000)
#define P2P_PM_STOP_TIMEOUT_DEFAULT_MS (1500)
#define P2P_PM_RETRY_DEFAULT_MS (60000)
#define P2P_PM_UPNP_DISCOVER_DEFAULT_MS (2000)
/* Big-endian fields of the PCP and NAT-PMP wire formats. */
static inline uint16_t p2p_pm_get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static inline uint32_t p2p_pm_get32(const uint8_t *p) { return (uint32_t)p2p_pm_get16(p) << 16 | p2p_pm_get16(p + 2); }
static inline void p2p_pm_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static inline void p2p_pm_put32(uint8_t *p, uint32_t v) {
  p2p_pm_put16(p, (uint16_t)(v >> 16));
  p2p_pm_put16(p + 2, (uint16_t)v);
}
/* Fills the defaults into the zero fields of cfg. */
void p2p_pm_config_defaults(p2p_portmap_config *cfg);

/* What every protocol's client keeps: its configuration, whom to tell, and
 * which mappings it holds. The first member of each client struct. */
typedef struct p2p_pm_client {
  uv_loop_t *loop;
  p2p_portmap_config cfg; /* a copy, defaults filled in */
  p2p_pm_done_fn done;    /* NULL once close() was called */
  void *ud;
  bool tcp_mapped, udp_mapped;
  p2p_pm_closed_fn closed;
  void *closed_ud;
} p2p_pm_client;

/* Fills b in for open(): cfg copied with its defaults. */
void p2p_pm_client_init(p2p_pm_client *b, uv_loop_t *loop, const p2p_portmap_config *cfg, p2p_pm_done_fn done,
                        void *ud);
/* For close(): closed() is whom to tell at the end; no done() from now on. */
void p2p_pm_client_closing(p2p_pm_client *b, p2p_pm_closed_fn closed, void *ud);
/* Frees the client that b starts (one allocation), then calls closed(),
 * if any, with whether every mapping is gone. */
void p2p_pm_client_free(p2p_pm_client *b);
/* The IPv4 gateway of the default route (from /proc/net/route), network
 * byte order. Returns 0 or GW_ENOENT. */
int p2p_pm_default_gateway(uint32_t *gw_be);

#endif
