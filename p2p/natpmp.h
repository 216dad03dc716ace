/* p2p/natpmp.h — NAT-PMP port mapping (RFC 6886) on the libuv loop.
 *
 * Asks the home router to forward our TCP port (sessions) and UDP port (DHT)
 * so that peers outside can dial us. libnatpmp (Debian's 20150609 release)
 * builds and parses the packets; we drive its non-blocking socket with a
 * uv_poll_t and its retry schedule with a uv_timer_t, so the loop never
 * blocks. One request is in flight at a time (libnatpmp keeps one).
 *
 *   start:  public address -> map TCP -> map UDP -> MAPPED
 *   renew:  at half the lease the gateway granted: map TCP -> map UDP
 *   stop:   delete both mappings (lifetime 0), bounded by a timeout
 *
 * Without a gateway (no default route, ICMP "port unreachable", or no
 * answer within give_up_ms, ~10 s by default rather than libnatpmp's own
 * two minutes of retries) the state becomes UNAVAILABLE and the node
 * carries on unmapped. A refused mapping is FAILED. A renewal that fails
 * is retried a minute later. */
#ifndef GWTF_P2P_NATPMP_H
#define GWTF_P2P_NATPMP_H

#include <stdint.h>
#include <uv.h>

#include "util/addr.h"
#include "util/log.h"

typedef enum p2p_natpmp_state {
  P2P_NATPMP_WORKING = 0,     /* asking the gateway */
  P2P_NATPMP_MAPPED = 1,      /* both ports forwarded; renewing */
  P2P_NATPMP_UNAVAILABLE = 2, /* no NAT-PMP gateway: carry on unmapped */
  P2P_NATPMP_FAILED = 3,      /* the gateway refused (or the mapping lapsed) */
  P2P_NATPMP_STOPPED = 4,
} p2p_natpmp_state;

typedef struct p2p_natpmp_config {
  uint16_t tcp_port;     /* private ports to map; 0 skips one */
  uint16_t udp_port;
  uint32_t lifetime_s;   /* requested lease (default 3600) */
  uint32_t give_up_ms;   /* default 10000 */
  uint32_t stop_timeout_ms; /* deleting on exit may take this long (default 1500) */
  uint32_t retry_ms;     /* after a failed renewal (default 60000) */
  const char *gateway;   /* dotted IPv4 to use instead of the default route's gateway (tests) */
  const gw_log *log;
} p2p_natpmp_config;

typedef struct p2p_natpmp_status {
  p2p_natpmp_state state;
  gw_addr external_tcp; /* public IP + forwarded port, family 0 until mapped */
  gw_addr external_udp;
  uint32_t lease_s;     /* shortest lease the gateway granted */
  unsigned renewals;
  const char *why;      /* UNAVAILABLE / FAILED: a short reason */
} p2p_natpmp_status;

typedef struct p2p_natpmp p2p_natpmp;

/* Called whenever the state changes or a renewal succeeds. */
typedef void (*p2p_natpmp_cb)(void *ud, const p2p_natpmp_status *st);

/* Starts mapping. Always returns an object (unless out of memory) even
 * when no gateway can be found: its state then says UNAVAILABLE. */
int p2p_natpmp_start(uv_loop_t *loop, const p2p_natpmp_config *cfg, p2p_natpmp_cb cb, void *ud, p2p_natpmp **out);
const p2p_natpmp_status *p2p_natpmp_get_status(const p2p_natpmp *n);
/* Deletes the mappings (when there are any), closes everything, frees n,
 * then calls done (may be NULL). No status callbacks after this call. */
void p2p_natpmp_stop(p2p_natpmp *n, void (*done)(void *ud), void *ud);

#endif
