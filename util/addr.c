#include "util/addr.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

bool gw_addr_eq(const gw_addr *a, const gw_addr *b) {
  return a->family == b->family && a->port == b->port && gw_addr_same_ip(a, b);
}

bool gw_addr_same_ip(const gw_addr *a, const gw_addr *b) {
  if (a->family != b->family) return false;
  return memcmp(a->ip, b->ip, a->family == 4 ? 4 : 16) == 0;
}

int gw_addr_split(const char *s, char *host, unsigned host_len, uint16_t *port) {
  const char *colon;
  const char *hs = s;
  size_t hl;
  if (!s || !*s) return GW_EINVAL;
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':') return GW_EINVAL;
    hs = s + 1;
    hl = (size_t)(close - hs);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon || strchr(s, ':') != colon) return GW_EINVAL;
    hl = (size_t)(colon - s);
  }
  if (hl == 0 || hl >= host_len) return GW_EINVAL;
  char *end = NULL;
  long p = strtol(colon + 1, &end, 10);
  if (end == colon + 1 || *end != '\0' || p < 0 || p > 65535) return GW_EINVAL;
  memcpy(host, hs, hl);
  host[hl] = '\0';
  *port = (uint16_t)p;
  return 0;
}

int gw_addr_parse(const char *s, gw_addr *out) {
  char host[64];
  uint16_t port;
  memset(out, 0, sizeof(*out));
  if (gw_addr_split(s, host, sizeof(host), &port) != 0) return GW_EINVAL;
  if (inet_pton(AF_INET, host, out->ip) == 1) {
    out->family = 4;
  } else if (inet_pton(AF_INET6, host, out->ip) == 1) {
    out->family = 6;
  } else {
    return GW_EINVAL;
  }
  out->port = port;
  return 0;
}

void gw_addr_format(const gw_addr *a, char *out) {
  char ip[INET6_ADDRSTRLEN];
  if (a->family == 4) {
    inet_ntop(AF_INET, a->ip, ip, sizeof(ip));
    snprintf(out, GW_ADDR_STRLEN, "%s:%u", ip, (unsigned)a->port);
  } else if (a->family == 6) {
    inet_ntop(AF_INET6, a->ip, ip, sizeof(ip));
    snprintf(out, GW_ADDR_STRLEN, "[%s]:%u", ip, (unsigned)a->port);
  } else {
    snprintf(out, GW_ADDR_STRLEN, "-");
  }
}

bool gw_addr_is_martian(const gw_addr *a, bool allow_loopback) {
  if (a->port == 0) return true;
  if (a->family == 4) {
    uint8_t b0 = a->ip[0];
    if (b0 == 127) return !allow_loopback;
    if (b0 == 0 || b0 >= 224) return true;            /* this-net, multicast, reserved */
    if (b0 == 169 && a->ip[1] == 254) return true;     /* link-local */
    return false;
  }
  if (a->family == 6) {
    static const uint8_t loop6[16] = {[15] = 1};
    static const uint8_t any6[16] = {0};
    static const uint8_t v4mapped[12] = {[10] = 0xff, [11] = 0xff};
    if (memcmp(a->ip, loop6, 16) == 0) return !allow_loopback;
    if (memcmp(a->ip, any6, 16) == 0) return true;
    if (a->ip[0] == 0xff) return true;                        /* multicast */
    if (a->ip[0] == 0xfe && (a->ip[1] & 0xc0) == 0x80) return true; /* link-local */
    if (memcmp(a->ip, v4mapped, 12) == 0) return true;        /* v4-mapped */
    return false;
  }
  return true;
}
