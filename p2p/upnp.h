/* p2p/upnp.h — checks on what a UPnP-IGD router answers.
 *
 * The UPnP client itself is p2p_pm_upnp (p2p/portmap.h, upnp.c): Debian's
 * libminiupnpc (2.2.x) finds the router by SSDP and speaks SOAP to it.
 * Those calls block (discovery waits upnp_discover_ms for answers, each
 * SOAP call is an HTTP round trip with miniupnpc's own timeouts), so every
 * run of them is one uv_work_t on libuv's thread pool and the loop never
 * waits:
 *
 *   map:   [discover + pick a connected IGD, once] -> external IP ->
 *          AddPortMapping TCP, UDP on the listen port (lease = lifetime;
 *          a router that only takes permanent leases (725) gets lease 0,
 *          deleted on exit) -> read each entry back to learn the lease
 *   close: DeletePortMapping TCP, UDP
 *
 * miniupnpc parses the XML; whatever strings it hands back are checked
 * here, strictly, before we believe them: a router is not trusted to send
 * a well-formed address, port or lease. Pure, so tests and the fuzzer
 * (test/fuzz/fuzz_upnp_reply.c) call them directly. */
#ifndef GWTF_P2P_UPNP_H
#define GWTF_P2P_UPNP_H

#include <stdbool.h>
#include <stdint.h>

/* A dotted IPv4 address, nothing else (no spaces, no leading zeros beyond
 * "0", each part <= 255), and not 0.0.0.0. Returns 0 or GW_EINVAL. */
int p2p_upnp_parse_ipv4(const char *s, uint8_t out[4]);
/* A decimal number in [lo, hi] with at most 10 digits. */
int p2p_upnp_parse_uint(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
/* The entry the router read back is ours: internal client want_client,
 * internal port want_port, and a lease that parses (0 = permanent). */
int p2p_upnp_check_entry(const char *int_client, const char *int_port, const char *lease, const char *want_client,
                         uint16_t want_port, uint32_t *lease_out);

#endif
