/* node/dht_node.c — see dht_node.h. */
#include "node/dht_node.h"

#include <string.h>

#include "util/clock.h"
#include "util/err.h"

static bool is_loopback(const gw_addr *a) {
  return (a->family == 4 && a->ip[0] == 127) ||
         (a->family == 6 && !memcmp(a->ip, (const uint8_t[16]){[15] = 1}, 16));
}

/* Numeric bootstrap specs become DHT seeds; a host name is left to the
 * sessions (the DHT then learns the peer from the contacts it exchanges). */
static size_t seeds_from_config(const node_config *cfg, const gw_log *log, gw_peer *out, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < cfg->n_bootstrap && n < max; i++) {
    char host[256], spec[300];
    uint16_t port;
    bool has_id;
    gw_peer p = {0};
    if (node_parse_peer_spec(cfg->bootstrap[i], host, sizeof(host), &port, &p.id, &has_id) != 0) continue;
    snprintf(spec, sizeof(spec), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, (unsigned)port);
    if (gw_addr_parse(spec, &p.addr) != 0) {
      GW_DEBUG(log, "dht.seed_skipped", "spec=%s reason=not_numeric", cfg->bootstrap[i]);
      continue;
    }
    if (!has_id) memset(&p.id, 0, sizeof(p.id));
    out[n++] = p;
  }
  return n;
}

static int comp_start(node *n, void **state) {
  const node_config *cfg = node_get_config(n);
  gw_peer seeds[NODE_MAX_BOOTSTRAP];
  dht_runtime_config rc = {0};
  rc.bind = p2p_host_listen_addr(node_host(n));
  rc.data_dir = cfg->data_dir;
  rc.n_bootstrap = seeds_from_config(cfg, node_log(n), seeds, NODE_MAX_BOOTSTRAP);
  rc.bootstrap = seeds;
  rc.dht.log = node_log(n);
  rc.dht.record_ttl_ms = cfg->record_ttl_ms;
  rc.dht.allow_loopback = is_loopback(&rc.bind) || cfg->allow_loopback_peers;
  rc.dht.seq_base = gw_clock_wall_ms();
  rc.stats_every_ms = DHT_NODE_STATS_MS;
  dht_runtime *rt = NULL;
  int err = dht_runtime_start(node_loop(n), node_identity(n), &rc, &rt);
  if (err != 0) {
    GW_ERROR(node_log(n), "dht.failed", "err=\"%s\"", gw_strerror(err));
    return err;
  }
  *state = rt;
  return 0;
}

static void comp_stop(node *n, void *state) {
  dht_runtime_stop(state);
  node_component_stopped(n);
}

const node_component dht_component = {
    .name = "dht",
    .start = comp_start,
    .stop = comp_stop,
};

dht_runtime *node_dht(node *n) { return node_component_state(n, "dht"); }
