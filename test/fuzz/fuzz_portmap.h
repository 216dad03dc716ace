/* test/fuzz/fuzz_portmap.h — what the port-mapping fuzz targets feed.
 *
 * A router on the LAN (or anyone who can spoof it) chooses every byte of
 * the replies a node's port-mapping client reads; each target takes one
 * reply and runs it through what the client does with it:
 *
 *   fuzz_pcp_reply:    a PCP datagram: p2p_pcp_parse_reply, then the
 *                      match / usable / epoch checks against a fixed request
 *   fuzz_natpmp_reply: a NAT-PMP datagram: p2p_natpmp_parse_reply (the gate
 *                      in front of libnatpmp)
 *   fuzz_upnp_reply:   a SOAP response body: miniupnpc's ParseNameValue
 *                      (what UPNP_GetExternalIPAddress and
 *                      UPNP_GetSpecificPortMappingEntry use), then our
 *                      checks on the strings it yields (p2p/upnp.h) */
#ifndef GWTF_TEST_FUZZ_PORTMAP_H
#define GWTF_TEST_FUZZ_PORTMAP_H

#include <stddef.h>
#include <stdint.h>

int fuzz_pcp_reply(const uint8_t *data, size_t size);
int fuzz_natpmp_reply(const uint8_t *data, size_t size);
int fuzz_upnp_reply(const uint8_t *data, size_t size);

#endif
