/* util/addr.h — a transport address (IPv4 or IPv6 + port) as plain data.
 *
 * Plain bytes rather than struct sockaddr so that protocol state machines,
 * the simulator and the wire can compare, hash and copy addresses without a
 * socket API. p2p/ converts to and from sockaddr at the edge. */
#ifndef GWTF_UTIL_ADDR_H
#define GWTF_UTIL_ADDR_H

#include <stdbool.h>
#include <stdint.h>

#include "util/id.h"

#define GW_ADDR_STRLEN 56 /* "[ipv6]:port" plus NUL, with room to spare */

typedef struct gw_addr {
  uint8_t family; /* 4 or 6; 0 = unset */
  uint16_t port;  /* host byte order */
  uint8_t ip[16]; /* IPv4 uses the first 4 bytes */
} gw_addr;

/* A peer as the protocols see it: who (verified node ID) and where. */
typedef struct gw_peer {
  gw_id id;
  gw_addr addr;
} gw_peer;

bool gw_addr_eq(const gw_addr *a, const gw_addr *b);
/* Same IP, any port: per-IP rate limits and "one entry per IP" rules. */
bool gw_addr_same_ip(const gw_addr *a, const gw_addr *b);
/* Parses a numeric "A.B.C.D:PORT" or "[v6]:PORT". Host names are resolved by
 * the caller (node/ uses uv_getaddrinfo so the loop never blocks).
 * Returns 0 or GW_EINVAL. */
int gw_addr_parse(const char *s, gw_addr *out);
/* Splits "HOST:PORT" (HOST may be a name or "[v6]") into its parts.
 * host must hold host_len bytes. Returns 0 or GW_EINVAL. */
int gw_addr_split(const char *s, char *host, unsigned host_len, uint16_t *port);
/* Formats as "A.B.C.D:PORT" or "[v6]:PORT" into out[GW_ADDR_STRLEN]. */
void gw_addr_format(const gw_addr *a, char *out);
/* Loopback, unspecified, multicast and similar addresses that no remote peer
 * should ever claim as its own (jech/dht's "martians"). Loopback is allowed
 * when allow_loopback is true (local swarms, tests). */
bool gw_addr_is_martian(const gw_addr *a, bool allow_loopback);

#endif
