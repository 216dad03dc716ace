/* `gwtf node`: run a peer. Option parsing only; node/node.c does the work. */
#include <arpa/inet.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht/stage_dir.h"
#include "node/cmd.h"
#include "node/dht_node.h"
#include "node/node.h"
#include "node/train_node.h"
#include "node/web_feed.h"
#include "node/web_http.h"
#include "p2p/frame.h"
#include "util/err.h"

void cmd_node_help(void) {
  char dir[512];
  node_default_data_dir(dir, sizeof(dir));
  printf("usage: gwtf node [options]\n\n"
         "Runs a peer: listens for encrypted sessions, keeps sessions to the bootstrap\n"
         "peers (reconnecting with backoff), pings them and logs RTT, and logs peers\n"
         "that are lost and that come back. Ctrl-C (SIGINT) or SIGTERM shuts down\n"
         "cleanly: goodbyes sent, port mappings removed, exit 0.\n\n"
         "options:\n"
         "  --listen ADDR:PORT         where to accept sessions (default 0.0.0.0:%d;\n"
         "                             port 0 picks a free one; the log says which)\n"
         "  --bootstrap [ID@]HOST:PORT a peer to connect to; repeatable. With ID (64 hex\n"
         "                             digits) the peer must prove it owns that node ID\n"
         "  --data-dir DIR             state directory (default %s)\n"
         "  --identity FILE            key file (default DIR/identity.key, created 0600)\n"
         "  --log-format text|json     (default text)\n"
         "  --log-level LEVEL          debug, info, warn, error (default info)\n"
         "  --links FILE               emulate link latency/bandwidth (docs/LINKS.md)\n"
         "  --links-bw-scale F         multiply emulated bandwidths by F, e.g. 1/32\n"
         "  --port-mapping auto|pcp|natpmp|upnp|off\n"
         "                             ask the router to forward our port (TCP and UDP):\n"
         "                             auto tries PCP, NAT-PMP, then UPnP-IGD (default auto;\n"
         "                             skipped when listening on loopback). --nat-pmp on|off\n"
         "                             is an old spelling of natpmp|off\n"
         "  --port-mapping-gateway IPV4  PCP/NAT-PMP server to ask instead of the default\n"
         "                             route's gateway (old spelling: --nat-pmp-gateway)\n"
         "  --max-frame BYTES          largest frame accepted (default 64M; K/M/G suffixes)\n"
         "  --ping-interval MS         keepalive ping period (default 5000)\n"
         "  --handshake-timeout MS     drop connections that do not authenticate in time\n"
         "                             (default 5000)\n"
         "  --announce RUN:STAGE       announce this peer in stage STAGE of run RUN in the\n"
         "                             DHT (its address is the --listen address); repeatable\n"
         "  --record-ttl SEC           lifetime of our DHT records (default 1800); they are\n"
         "                             republished every SEC/2 while the node runs\n"
         "  --dht-stats SEC            log the routing-table size and stored records every\n"
         "                             SEC seconds (default %d)\n"
         "  --relay on|off             relay circuits for peers that cannot be dialled\n"
         "                             (default on; only with a listener; docs/RELAY.md)\n"
         "  --relay-max-circuits N     circuits relayed at once (default 16)\n"
         "  --relay-max-bytes-per-s B  per circuit, both directions (default 16M; 0: no limit)\n"
         "  --relay-max-bytes B        per circuit, then it is closed (default 8G; 0: no limit)\n"
         "  --relay-circuit-lifetime-s SEC  per circuit (default 21600; 0: no limit)\n"
         "  --hole-punch on|off        try to turn relayed sessions into direct ones\n"
         "                             (default on; docs/PUNCH.md)\n"
         "  --max-handshakes-per-ip N  inbound handshakes in flight from one IP (default %d;\n"
         "                             0: no cap); --max-handshakes-per-subnet N per /24 or\n"
         "                             /64 (default %d). Over it: closed at once, limit.hit\n"
         "  --max-sessions-per-ip N    inbound connections from one IP (default %d);\n"
         "                             --max-sessions-per-subnet N (default %d)\n"
         "  --limit-loopback on|off    apply the per-IP caps to 127.0.0.0/8 and ::1 too\n"
         "                             (default off: local swarms share 127.0.0.1)\n"
         "  --max-rx-buffer BYTES      frames being received, all peers together (default\n"
         "                             1G; at least --max-frame + 1M); more waits\n"
         "  --min-rx-rate BYTES        a frame being received must gain this many bytes a\n"
         "                             second over 20 s, else the peer is cut (default 64K;\n"
         "                             0: off). docs/P2P.md, Limits\n"
         "  --http [IP:]PORT           serve a live web view of this node (its log events:\n"
         "                             stages, flows, loss, timeline) at http://IP:PORT/;\n"
         "                             IP defaults to 127.0.0.1 (docs/WEB.md)\n"
         "  --http-public              allow --http on a non-loopback address (the page\n"
         "                             has no authentication: anyone who reaches it sees\n"
         "                             the run)\n",
         NODE_DEFAULT_PORT, dir, DHT_NODE_STATS_MS / 1000, P2P_LIMIT_HANDSHAKES_PER_IP,
         P2P_LIMIT_HANDSHAKES_PER_SUBNET, P2P_LIMIT_SESSIONS_PER_IP, P2P_LIMIT_SESSIONS_PER_SUBNET);
  train_node_print_help();
}

enum {
  OPT_LISTEN = 1000,
  OPT_BOOTSTRAP,
  OPT_DATA_DIR,
  OPT_IDENTITY,
  OPT_LOG_FORMAT,
  OPT_LOG_LEVEL,
  OPT_LINKS,
  OPT_LINKS_SCALE,
  OPT_NAT,
  OPT_PORT_MAPPING,
  OPT_NAT_GW,
  OPT_MAX_FRAME,
  OPT_PING,
  OPT_HS_TIMEOUT,
  OPT_ANNOUNCE,
  OPT_RECORD_TTL,
  OPT_DHT_STATS,
  OPT_RELAY,
  OPT_RELAY_MAX_CIRCUITS,
  OPT_RELAY_MAX_BPS,
  OPT_RELAY_MAX_BYTES,
  OPT_RELAY_LIFETIME,
  OPT_HOLE_PUNCH,
  OPT_LIM_HS_IP,
  OPT_LIM_HS_NET,
  OPT_LIM_SESS_IP,
  OPT_LIM_SESS_NET,
  OPT_LIM_LOOPBACK,
  OPT_LIM_RX_BUFFER,
  OPT_LIM_RX_RATE,
  OPT_HTTP,
  OPT_HTTP_PUBLIC,
};

static int bad(const char *opt, const char *val, const char *want) {
  fprintf(stderr, "gwtf node: %s '%s': %s\n", opt, val, want);
  return 2;
}

static int parse_ms(const char *s, uint32_t lo, uint32_t *out) {
  char *end = NULL;
  unsigned long v = strtoul(s, &end, 10);
  if (end == s || *end || v < lo || v > 3600000) return GW_EINVAL;
  *out = (uint32_t)v;
  return 0;
}

/* The --max-*-per-* and rx options (p2p/limits.h); returns 0 or an exit code. */
static int apply_limit(p2p_limits_config *l, int c, const char *arg) {
  uint64_t v;
  char *end = NULL;
  if (c == OPT_LIM_LOOPBACK) {
    if (strcmp(arg, "on") && strcmp(arg, "off")) return bad("--limit-loopback", arg, "on or off");
    l->limit_loopback = strcmp(arg, "on") == 0;
    return 0;
  }
  if (c == OPT_LIM_RX_BUFFER || c == OPT_LIM_RX_RATE) {
    if (node_parse_size(arg, &v) != 0 || v > ((uint64_t)1 << 40) || (c == OPT_LIM_RX_RATE && v > UINT32_MAX))
      return bad(c == OPT_LIM_RX_BUFFER ? "--max-rx-buffer" : "--min-rx-rate", arg, "a size (K/M/G suffixes)");
    if (c == OPT_LIM_RX_BUFFER)
      l->rx_budget = (size_t)v;
    else
      l->rx_min_Bps = (uint32_t)v;
    return 0;
  }
  v = strtoull(arg, &end, 10);
  if (end == arg || *end || v > 1000000) return bad("--max-...-per-ip/subnet", arg, "a count, 0 for no cap");
  switch (c) {
  case OPT_LIM_HS_IP: l->handshakes_per_ip = (uint32_t)v; break;
  case OPT_LIM_HS_NET: l->handshakes_per_subnet = (uint32_t)v; break;
  case OPT_LIM_SESS_IP: l->sessions_per_ip = (uint32_t)v; break;
  default: l->sessions_per_subnet = (uint32_t)v; break;
  }
  return 0;
}

/* The --relay* options (p2p/relay.h); returns 0 or an exit code. */
static int apply_relay(p2p_relay_config *r, int c, const char *arg) {
  uint64_t v;
  char *end = NULL;
  switch (c) {
  case OPT_RELAY:
    if (strcmp(arg, "on") && strcmp(arg, "off")) return bad("--relay", arg, "on or off");
    r->enabled = strcmp(arg, "on") == 0;
    return 0;
  case OPT_RELAY_MAX_CIRCUITS:
    v = strtoull(arg, &end, 10);
    if (end == arg || *end || v > 65535) return bad("--relay-max-circuits", arg, "a count from 0 to 65535");
    r->max_circuits = (uint32_t)v;
    return 0;
  case OPT_RELAY_MAX_BPS:
  case OPT_RELAY_MAX_BYTES:
    if (node_parse_size(arg, &v) != 0)
      return bad(c == OPT_RELAY_MAX_BPS ? "--relay-max-bytes-per-s" : "--relay-max-bytes", arg,
                 "bytes, K/M/G suffixes, 0 for no limit");
    *(c == OPT_RELAY_MAX_BPS ? &r->max_bytes_per_s : &r->max_bytes) = v;
    return 0;
  case OPT_RELAY_LIFETIME:
    v = strtoull(arg, &end, 10);
    if (end == arg || *end || v > 30 * 86400) return bad("--relay-circuit-lifetime-s", arg, "seconds, 0 to 2592000");
    r->circuit_lifetime_s = (uint32_t)v;
    return 0;
  default: return 2;
  }
}

/* One option into cfg; returns 0 or an exit code. */
static int apply(node_config *cfg, int c, const char *arg) {
  uint64_t size;
  char host[256];
  uint16_t port;
  gw_id id;
  bool has_id;
  switch (c) {
  case OPT_LISTEN:
    if (gw_addr_parse(arg, &cfg->listen) != 0) return bad("--listen", arg, "expected IP:PORT, e.g. 0.0.0.0:7447");
    return 0;
  case OPT_BOOTSTRAP:
    if (node_parse_peer_spec(arg, host, sizeof(host), &port, &id, &has_id) != 0 || port == 0)
      return bad("--bootstrap", arg, "expected [NODEID@]HOST:PORT");
    if (cfg->n_bootstrap == NODE_MAX_BOOTSTRAP) return bad("--bootstrap", arg, "too many bootstrap peers");
    cfg->bootstrap[cfg->n_bootstrap++] = arg;
    return 0;
  case OPT_DATA_DIR: cfg->data_dir = arg; return 0;
  case OPT_IDENTITY: cfg->identity_path = arg; return 0;
  case OPT_LOG_FORMAT:
    return gw_log_format_parse(arg, &cfg->log_format) == 0 ? 0 : bad("--log-format", arg, "text or json");
  case OPT_LOG_LEVEL:
    return gw_log_level_parse(arg, &cfg->log_level) == 0 ? 0 : bad("--log-level", arg, "debug, info, warn, error or off");
  case OPT_LINKS: cfg->links_path = arg; return 0;
  case OPT_LINKS_SCALE:
    return node_parse_factor(arg, &cfg->links_bw_scale) == 0 ? 0 : bad("--links-bw-scale", arg, "a factor > 0, e.g. 1/32");
  case OPT_NAT:
    if (strcmp(arg, "on") && strcmp(arg, "off")) return bad("--nat-pmp", arg, "on or off");
    cfg->port_mapping = strcmp(arg, "on") == 0 ? P2P_PORTMAP_NATPMP : P2P_PORTMAP_OFF;
    return 0;
  case OPT_PORT_MAPPING:
    return p2p_portmap_mode_parse(arg, &cfg->port_mapping) == 0 ? 0
                                                                 : bad("--port-mapping", arg, "auto, pcp, natpmp, upnp or off");
  case OPT_NAT_GW: {
    struct in_addr a;
    if (inet_pton(AF_INET, arg, &a) != 1) return bad("--port-mapping-gateway", arg, "an IPv4 address");
    cfg->nat_gateway = arg;
    return 0;
  }
  case OPT_MAX_FRAME:
    if (node_parse_size(arg, &size) != 0 || size < P2P_MAX_FRAME_MIN || size > ((uint64_t)1 << 32))
      return bad("--max-frame", arg, "a size between 64K and 4G");
    cfg->max_frame = (size_t)size;
    return 0;
  case OPT_PING:
    return parse_ms(arg, 100, &cfg->ping_interval_ms) == 0 ? 0 : bad("--ping-interval", arg, "milliseconds >= 100");
  case OPT_HS_TIMEOUT:
    return parse_ms(arg, 100, &cfg->handshake_timeout_ms) == 0 ? 0
                                                               : bad("--handshake-timeout", arg, "milliseconds >= 100");
  case OPT_ANNOUNCE: {
    char run[STAGE_DIR_NAME_MAX + 1];
    uint32_t stage;
    if (dht_node_parse_announce(arg, run, sizeof(run), &stage) != 0)
      return bad("--announce", arg, "expected RUN:STAGE, e.g. demo:0 (RUN of [A-Za-z0-9._-])");
    if (cfg->n_announce == NODE_MAX_ANNOUNCE) return bad("--announce", arg, "too many announcements");
    cfg->announce[cfg->n_announce++] = arg;
    return 0;
  }
  case OPT_RECORD_TTL: {
    uint32_t s;
    if (parse_ms(arg, 2, &s) != 0 || s > 86400) return bad("--record-ttl", arg, "seconds between 2 and 86400");
    cfg->record_ttl_ms = (uint64_t)s * 1000;
    return 0;
  }
  case OPT_DHT_STATS: {
    uint32_t s;
    if (parse_ms(arg, 1, &s) != 0 || s > 86400) return bad("--dht-stats", arg, "seconds between 1 and 86400");
    cfg->dht_stats_ms = s * 1000;
    return 0;
  }
  case OPT_RELAY:
  case OPT_RELAY_MAX_CIRCUITS:
  case OPT_RELAY_MAX_BPS:
  case OPT_RELAY_MAX_BYTES:
  case OPT_RELAY_LIFETIME: return apply_relay(&cfg->relay, c, arg);
  case OPT_LIM_HS_IP:
  case OPT_LIM_HS_NET:
  case OPT_LIM_SESS_IP:
  case OPT_LIM_SESS_NET:
  case OPT_LIM_LOOPBACK:
  case OPT_LIM_RX_BUFFER:
  case OPT_LIM_RX_RATE: return apply_limit(&cfg->limits, c, arg);
  case OPT_HOLE_PUNCH:
    if (strcmp(arg, "on") && strcmp(arg, "off")) return bad("--hole-punch", arg, "on or off");
    cfg->hole_punch = strcmp(arg, "on") == 0;
    return 0;
  default: return 2;
  }
}

int cmd_node(int argc, char **argv) {
  static const struct option opts[] = {
      {"listen", required_argument, 0, OPT_LISTEN},
      {"bootstrap", required_argument, 0, OPT_BOOTSTRAP},
      {"data-dir", required_argument, 0, OPT_DATA_DIR},
      {"identity", required_argument, 0, OPT_IDENTITY},
      {"log-format", required_argument, 0, OPT_LOG_FORMAT},
      {"log-level", required_argument, 0, OPT_LOG_LEVEL},
      {"links", required_argument, 0, OPT_LINKS},
      {"links-bw-scale", required_argument, 0, OPT_LINKS_SCALE},
      {"nat-pmp", required_argument, 0, OPT_NAT},
      {"nat-pmp-gateway", required_argument, 0, OPT_NAT_GW},
      {"port-mapping", required_argument, 0, OPT_PORT_MAPPING},
      {"port-mapping-gateway", required_argument, 0, OPT_NAT_GW},
      {"max-frame", required_argument, 0, OPT_MAX_FRAME},
      {"ping-interval", required_argument, 0, OPT_PING},
      {"handshake-timeout", required_argument, 0, OPT_HS_TIMEOUT},
      {"announce", required_argument, 0, OPT_ANNOUNCE},
      {"record-ttl", required_argument, 0, OPT_RECORD_TTL},
      {"dht-stats", required_argument, 0, OPT_DHT_STATS},
      {"relay", required_argument, 0, OPT_RELAY},
      {"relay-max-circuits", required_argument, 0, OPT_RELAY_MAX_CIRCUITS},
      {"relay-max-bytes-per-s", required_argument, 0, OPT_RELAY_MAX_BPS},
      {"relay-max-bytes", required_argument, 0, OPT_RELAY_MAX_BYTES},
      {"relay-circuit-lifetime-s", required_argument, 0, OPT_RELAY_LIFETIME},
      {"hole-punch", required_argument, 0, OPT_HOLE_PUNCH},
      {"max-handshakes-per-ip", required_argument, 0, OPT_LIM_HS_IP},
      {"max-handshakes-per-subnet", required_argument, 0, OPT_LIM_HS_NET},
      {"max-sessions-per-ip", required_argument, 0, OPT_LIM_SESS_IP},
      {"max-sessions-per-subnet", required_argument, 0, OPT_LIM_SESS_NET},
      {"limit-loopback", required_argument, 0, OPT_LIM_LOOPBACK},
      {"max-rx-buffer", required_argument, 0, OPT_LIM_RX_BUFFER},
      {"min-rx-rate", required_argument, 0, OPT_LIM_RX_RATE},
      {"http", required_argument, 0, OPT_HTTP},
      {"http-public", no_argument, 0, OPT_HTTP_PUBLIC},
      {"help", no_argument, 0, 'h'},
      {0},
  };
  /* the node's own options, then training's */
  enum { N_NODE_OPTS = sizeof(opts) / sizeof(opts[0]) - 1 };
  static struct option all[N_NODE_OPTS + TRAIN_NODE_MAX_OPTIONS + 1];
  size_t n_all = 0;
  for (size_t i = 0; i < N_NODE_OPTS; i++) all[n_all++] = opts[i];
  for (size_t i = 0; train_node_options[i].name; i++) all[n_all++] = train_node_options[i];
  memset(&all[n_all], 0, sizeof(all[0]));
  node_config cfg;
  node_config_defaults(&cfg);
  static train_node_opts topts;
  train_node_opts_default(&topts);
  int c;
  const char *http = NULL;
  bool http_public = false;
  while ((c = getopt_long(argc, argv, "h", all, NULL)) != -1) {
    if (c == 'h') {
      cmd_node_help();
      return 0;
    }
    if (c == OPT_HTTP || c == OPT_HTTP_PUBLIC) {
      if (c == OPT_HTTP) http = optarg;
      else http_public = true;
      continue;
    }
    if (c == '?') {
      fprintf(stderr, "(see gwtf help node)\n");
      return 2;
    }
    int rc = c >= TRAIN_NODE_OPT_BASE ? train_node_parse_opt(&topts, c, optarg) : apply(&cfg, c, optarg);
    if (rc != 0) return rc;
  }
  bool training = false;
  int trc = train_node_check(&topts, &training);
  if (trc != 0) return trc;
  if (training) cfg.train = &topts;
  if (topts.join) {
    /* the invite's creator is a bootstrap peer, its node ID checked */
    if (cfg.n_bootstrap == NODE_MAX_BOOTSTRAP) {
      fprintf(stderr, "gwtf node: too many bootstrap peers for --join's\n");
      return 2;
    }
    char host[256];
    uint16_t port;
    gw_id id;
    bool has_id;
    if (node_parse_peer_spec(topts.join_bootstrap, host, sizeof(host), &port, &id, &has_id) == 0 && port != 0)
      cfg.bootstrap[cfg.n_bootstrap++] = topts.join_bootstrap;
    else
      fprintf(stderr, "gwtf node: the invite's address '%s' is not HOST:PORT; use --bootstrap\n",
              topts.invite.creator_addr);
  }
  if (optind < argc) {
    fprintf(stderr, "gwtf node: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  char err[600];
  bool is_public = false;
  if (http && web_http_parse_bind(http, http_public, &is_public, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf node: %s\n", err);
    return 2;
  }
  web_feed *feed = http ? web_feed_new("node") : NULL;
  if (http && !feed) {
    fprintf(stderr, "gwtf node: out of memory\n");
    return 1;
  }
  cfg.log_feed = feed ? web_feed_log_cb : NULL;
  cfg.log_feed_ud = feed;
  node *n = NULL;
  if (node_create(&cfg, &n, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf node: %s\n", err);
    web_feed_free(feed);
    return 1;
  }
  web_http *server = NULL;
  if (feed) {
    if (web_http_start(feed, http, http_public, &server, err, sizeof(err)) != 0) {
      fprintf(stderr, "gwtf node: %s\n", err);
      node_destroy(n);
      web_feed_free(feed);
      return 1;
    }
    if (is_public)
      GW_WARN(node_log(n), "http.public", "url=%s msg=\"the live view has no authentication: anyone who reaches "
                                          "this address sees the run\"", web_http_url(server));
    GW_INFO(node_log(n), "http.listening", "url=%s", web_http_url(server));
  }
  int code = node_run(n);
  web_http_stop(server); /* its threads are gone before the node's log sink */
  node_destroy(n);
  web_feed_free(feed);
  return code;
}
