#include "p2p/sockaddr.h"

#include <netinet/in.h>
#include <string.h>

#include "util/err.h"

int p2p_addr_to_sockaddr(const gw_addr *a, struct sockaddr_storage *out) {
  memset(out, 0, sizeof(*out));
  if (a->family == 4) {
    struct sockaddr_in *in = (struct sockaddr_in *)out;
    in->sin_family = AF_INET;
    in->sin_port = htons(a->port);
    memcpy(&in->sin_addr, a->ip, 4);
    return 0;
  }
  if (a->family == 6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(a->port);
    memcpy(&in6->sin6_addr, a->ip, 16);
    return 0;
  }
  return GW_EINVAL;
}

int p2p_addr_from_sockaddr(const struct sockaddr *sa, gw_addr *out) {
  static const uint8_t v4mapped[12] = {[10] = 0xff, [11] = 0xff};
  memset(out, 0, sizeof(*out));
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    out->family = 4;
    out->port = ntohs(in->sin_port);
    memcpy(out->ip, &in->sin_addr, 4);
    return 0;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    out->port = ntohs(in6->sin6_port);
    if (memcmp(in6->sin6_addr.s6_addr, v4mapped, 12) == 0) {
      out->family = 4;
      memcpy(out->ip, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      out->family = 6;
      memcpy(out->ip, in6->sin6_addr.s6_addr, 16);
    }
    return 0;
  }
  return GW_EINVAL;
}
