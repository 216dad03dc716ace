/* The port-mapping fuzz targets' code (see fuzz_portmap.h). */
#include "fuzz_portmap.h"

#include <miniupnpc/upnpreplyparse.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/natpmp.h"
#include "p2p/pcp.h"
#include "p2p/upnp.h"

#define UPNP_BODY_MAX (64 * 1024)

int fuzz_pcp_reply(const uint8_t *data, size_t size) {
  p2p_pcp_map_req req = {.lifetime = 3600, .protocol = P2P_PCP_PROTO_TCP, .internal_port = 7447,
                         .suggested_port = 7447};
  memset(req.nonce, 0x5a, sizeof(req.nonce)); /* the seed corpus uses this nonce */
  p2p_pcp_reply r;
  if (p2p_pcp_parse_reply(data, size, &r) != 0) return 0;
  if (!p2p_pcp_result_name(r.result)) abort();
  if (p2p_pcp_reply_matches(&r, &req) && p2p_pcp_reply_usable(&r, &req)) {
    /* what the client records */
    if (!p2p_pcp_ip_is4(r.external_ip) || r.external_port == 0 || r.lifetime == 0) abort();
  }
  (void)p2p_pcp_epoch_ok(1000, 5000, 1000 + (r.lifetime & 0xffff), r.epoch);
  return 0;
}

int fuzz_natpmp_reply(const uint8_t *data, size_t size) {
  p2p_natpmp_reply r;
  if (p2p_natpmp_parse_reply(data, size, &r) != 0) return 0;
  if (r.op < 128 || r.op > 130) abort();
  return 0;
}

int fuzz_upnp_reply(const uint8_t *data, size_t size) {
  if (size > UPNP_BODY_MAX) return 0;
  struct NameValueParserData pd;
  memset(&pd, 0, sizeof(pd));
  ParseNameValue((const char *)data, (int)size, &pd);
  const char *ext = GetValueFromNameValueList(&pd, "NewExternalIPAddress");
  const char *client = GetValueFromNameValueList(&pd, "NewInternalClient");
  const char *port = GetValueFromNameValueList(&pd, "NewInternalPort");
  const char *lease = GetValueFromNameValueList(&pd, "NewLeaseDuration");
  uint8_t ip[4];
  if (ext && p2p_upnp_parse_ipv4(ext, ip) == 0 && (ip[0] | ip[1] | ip[2] | ip[3]) == 0) abort();
  uint32_t granted;
  if (client && port && p2p_upnp_check_entry(client, port, lease, "10.77.1.2", 7447, &granted) == 0 &&
      strcmp(client, "10.77.1.2") != 0)
    abort(); /* only our own address may pass */
  ClearNameValueList(&pd);
  return 0;
}
