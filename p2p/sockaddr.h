/* p2p/sockaddr.h — gw_addr <-> struct sockaddr at the socket edge.
 *
 * Protocols and the simulator work with plain gw_addr values; only the code
 * that opens sockets (sessions, the host's listener, the UDP endpoint)
 * converts. IPv4-mapped IPv6 peers (::ffff:a.b.c.d, as a dual-stack
 * listener reports them) come back as plain IPv4 so that one peer has one
 * address. */
#ifndef GWTF_P2P_SOCKADDR_H
#define GWTF_P2P_SOCKADDR_H

#include <sys/socket.h>

#include "util/addr.h"

/* Returns 0 or GW_EINVAL (family unset). */
int p2p_addr_to_sockaddr(const gw_addr *a, struct sockaddr_storage *out);
/* Returns 0 or GW_EINVAL (not AF_INET or AF_INET6). */
int p2p_addr_from_sockaddr(const struct sockaddr *sa, gw_addr *out);

#endif
