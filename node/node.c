#include "node/node.h"

#include "node/dht_node.h"
#include "node/export_swarm.h"
#include "node/relays.h"
#include "node/train_node.h"

#include <arpa/inet.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/link.h"
#include "p2p/portmap.h"
#include "p2p/sockaddr.h"
#include "util/err.h"
#include "util/file.h"

#ifndef GWTF_VERSION
#define GWTF_VERSION "0.0.0"
#endif

/* An unresolved bootstrap host name is tried again this often. */
#define RESOLVE_RETRY_MS (30000)
#define JOIN_LINES_MAX (4)

/* The upper layers, in start order (they stop in reverse). The DHT (issue 3)
 * and training (issue 6) add their entries here. */
static const node_component *const components[] = {&dht_component, &train_component, &export_component, NULL};
#define N_COMPONENTS (sizeof(components) / sizeof(components[0]) - 1)

typedef struct bootstrap {
  node *n;
  uv_getaddrinfo_t req;
  bool resolving;
  bool done;
  char host[256];
  uint16_t port;
  gw_id id;
  bool has_id;
} bootstrap;

struct node {
  node_config cfg;
  char data_dir[PATH_MAX];
  char identity_path[PATH_MAX];
  uv_loop_t loop;
  bool loop_ready;
  gw_log_sink sink;
  gw_log log;
  p2p_identity me;
  bool identity_created;
  p2p_links *links;
  p2p_host *host;
  p2p_portmap *nat;
  bool nat_join_printed;
  node_relays *relays; /* which relays a private node reserves on (node/relays.h) */
  uv_signal_t sigint, sigterm;
  uv_timer_t resolve_timer, relays_timer;
  bool handles_ready;
  bootstrap boot[NODE_MAX_BOOTSTRAP];
  void *comp_state[N_COMPONENTS + 1];
  size_t comp_started;
  bool stopping;
  int stops_pending; /* host and port mapping */
  int exit_code;
};

/* ---- small helpers ---- */

void node_default_data_dir(char *out, size_t out_len) {
  const char *home = getenv("HOME");
  if (home && *home)
    snprintf(out, out_len, "%s/.gwtf", home);
  else
    snprintf(out, out_len, "gwtf-data");
}

int node_parse_peer_spec(const char *spec, char *host, size_t host_len, uint16_t *port, gw_id *id, bool *has_id) {
  *has_id = false;
  const char *at = strchr(spec, '@');
  if (at) {
    char hex[GW_ID_HEX_LEN + 1];
    if ((size_t)(at - spec) != GW_ID_HEX_LEN) return GW_EINVAL;
    memcpy(hex, spec, GW_ID_HEX_LEN);
    hex[GW_ID_HEX_LEN] = '\0';
    if (gw_id_from_hex(hex, id) != 0) return GW_EINVAL;
    *has_id = true;
    spec = at + 1;
  }
  return gw_addr_split(spec, host, (unsigned)host_len, port);
}

int node_parse_size(const char *s, uint64_t *out) {
  char *end = NULL;
  if (!s || *s < '0' || *s > '9') return GW_EINVAL;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I') && (end[1] == 'B' || end[1] == 'b')) end += 2;
  if (*end != '\0' || v > (UINT64_MAX >> shift)) return GW_EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}

int node_parse_factor(const char *s, double *out) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s) return GW_EINVAL;
  if (*end == '/') {
    const char *den = end + 1;
    double d = strtod(den, &end);
    if (end == den || !(d > 0)) return GW_EINVAL;
    v /= d;
  }
  if (*end != '\0' || !(v > 0) || v > 1e6) return GW_EINVAL;
  *out = v;
  return 0;
}

void node_config_defaults(node_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  gw_addr_parse("0.0.0.0:7447", &cfg->listen);
  cfg->log_level = GW_LOG_INFO;
  cfg->log_format = GW_LOG_TEXT;
  cfg->port_mapping = P2P_PORTMAP_AUTO;
  cfg->max_frame = P2P_MAX_FRAME_DEFAULT;
  cfg->ping_interval_ms = 5000;
  cfg->handshake_timeout_ms = 5000;
  p2p_relay_config_defaults(&cfg->relay);
  cfg->hole_punch = true;
  p2p_limits_config_defaults(&cfg->limits);
}

uv_loop_t *node_loop(node *n) { return &n->loop; }
p2p_host *node_host(node *n) { return n->host; }
const p2p_identity *node_identity(const node *n) { return &n->me; }
const gw_log *node_log(const node *n) { return &n->log; }
const node_config *node_get_config(const node *n) { return &n->cfg; }
node_relays *node_get_relays(node *n) { return n->relays; }
const p2p_portmap_status *node_portmap_status(const node *n) { return n->nat ? p2p_portmap_get_status(n->nat) : NULL; }

static bool is_unspecified(const gw_addr *a) {
  static const uint8_t zero[16] = {0};
  return memcmp(a->ip, zero, a->family == 4 ? 4 : 16) == 0;
}

static bool is_loopback(const gw_addr *a) {
  static const uint8_t loop6[16] = {[15] = 1};
  return a->family == 4 ? a->ip[0] == 127 : memcmp(a->ip, loop6, 16) == 0;
}

/* ---- create ---- */

int node_create(const node_config *cfg, node **out, char *err, size_t err_len) {
  *out = NULL;
  node *n = calloc(1, sizeof(*n));
  if (!n) return GW_ENOMEM;
  n->cfg = *cfg;
  if (cfg->data_dir)
    snprintf(n->data_dir, sizeof(n->data_dir), "%s", cfg->data_dir);
  else
    node_default_data_dir(n->data_dir, sizeof(n->data_dir));
  int len = cfg->identity_path
                ? snprintf(n->identity_path, sizeof(n->identity_path), "%s", cfg->identity_path)
                : snprintf(n->identity_path, sizeof(n->identity_path), "%s/identity.key", n->data_dir);
  if (len < 0 || (size_t)len >= sizeof(n->identity_path)) {
    snprintf(err, err_len, "the identity path is too long");
    free(n);
    return GW_ERANGE;
  }
  n->cfg.data_dir = n->data_dir;
  n->cfg.identity_path = n->identity_path;

  int rc = gw_mkdir_p(n->data_dir, 0700);
  if (rc != 0) {
    snprintf(err, err_len, "cannot create the data directory %s: %s", n->data_dir, gw_strerror(rc));
    free(n);
    return rc;
  }
  int created = 0;
  if ((rc = p2p_identity_load_or_create(n->identity_path, &n->me, &created, err, err_len)) != 0) {
    free(n);
    return rc;
  }
  n->identity_created = created != 0;
  if (cfg->links_path &&
      (rc = p2p_links_load(cfg->links_path, cfg->links_bw_scale, &n->links, err, err_len)) != 0) {
    p2p_identity_wipe(&n->me);
    free(n);
    return rc;
  }
  gw_log_sink_init(&n->sink, stderr, cfg->log_level, cfg->log_format);
  if (cfg->log_feed) gw_log_sink_subscribe(&n->sink, cfg->log_feed, cfg->log_feed_ud, GW_LOG_INFO);
  gw_log_init(&n->log, &n->sink, &n->me.id);
  if ((rc = uv_loop_init(&n->loop)) != 0) {
    snprintf(err, err_len, "cannot start the event loop: %s", gw_strerror(rc));
    node_destroy(n);
    return rc;
  }
  n->loop_ready = true;
  /* A peer that resets a connection must not kill us: write errors come
   * back as EPIPE from libuv instead. */
  signal(SIGPIPE, SIG_IGN);
  *out = n;
  return 0;
}

void node_destroy(node *n) {
  if (!n) return;
  if (n->loop_ready) {
    uv_run(&n->loop, UV_RUN_DEFAULT); /* let closing handles finish */
    uv_loop_close(&n->loop);
  }
  p2p_links_free(n->links);
  node_relays_free(n->relays);
  p2p_identity_wipe(&n->me);
  free(n);
}

/* ---- shutdown ---- */

static void on_handle_closed(uv_handle_t *h) { (void)h; }

static void close_own_handles(node *n) {
  if (!n->handles_ready) return;
  n->handles_ready = false;
  uv_close((uv_handle_t *)&n->sigint, on_handle_closed);
  uv_close((uv_handle_t *)&n->sigterm, on_handle_closed);
  uv_close((uv_handle_t *)&n->resolve_timer, on_handle_closed);
  uv_close((uv_handle_t *)&n->relays_timer, on_handle_closed);
}

static void transport_stopped(void *ud) {
  node *n = ud;
  if (--n->stops_pending > 0) return;
  n->host = NULL;
  n->nat = NULL;
  GW_INFO(&n->log, "node.stopped", "exit=%d", n->exit_code);
  close_own_handles(n);
}

static void stop_transport(node *n) {
  for (size_t i = 0; i < n->cfg.n_bootstrap; i++)
    if (n->boot[i].resolving) uv_cancel((uv_req_t *)&n->boot[i].req);
  n->stops_pending = 1 + (n->host ? 1 : 0) + (n->nat ? 1 : 0);
  if (n->host) p2p_host_close(n->host, transport_stopped, n);
  if (n->nat) {
    p2p_portmap *pm = n->nat;
    n->nat = NULL; /* node_portmap_status() must not see it while it goes */
    p2p_portmap_stop(pm, transport_stopped, n);
  }
  transport_stopped(n); /* the extra count keeps this from finishing inside the calls above */
}

void *node_component_state(node *n, const char *name) {
  for (size_t i = 0; i < n->comp_started; i++)
    if (strcmp(components[i]->name, name) == 0) return n->comp_state[i];
  return NULL;
}

void node_component_stopped(node *n) {
  while (n->comp_started > 0) {
    const node_component *c = components[--n->comp_started];
    if (c->stop) {
      c->stop(n, n->comp_state[n->comp_started]);
      return; /* it calls back here when done */
    }
  }
  stop_transport(n);
}

void node_stop(node *n) {
  if (n->stopping) return;
  n->stopping = true;
  GW_INFO(&n->log, "node.stopping", "peers=%zu", n->host ? p2p_host_peers(n->host, NULL, 0) : (size_t)0);
  node_component_stopped(n);
}

static void on_signal(uv_signal_t *s, int signum) {
  node *n = s->data;
  if (n->stopping) {
    GW_WARN(&n->log, "node.killed", "signal=%d msg=\"second signal: exiting without a clean shutdown\"", signum);
    exit(128 + signum);
  }
  GW_INFO(&n->log, "node.signal", "signal=%s", signum == SIGINT ? "SIGINT" : "SIGTERM");
  node_stop(n);
}

/* ---- peers and messages: fan out to the components ---- */

static void on_peer_up(void *ud, const gw_peer *peer, bool back) {
  node *n = ud;
  for (size_t i = 0; i < n->comp_started; i++)
    if (components[i]->peer_up) components[i]->peer_up(n->comp_state[i], peer, back);
}

static void on_peer_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  node *n = ud;
  for (size_t i = 0; i < n->comp_started; i++)
    if (components[i]->peer_down) components[i]->peer_down(n->comp_state[i], id, reason);
}

static void on_message(void *ud, const gw_id *from, p2p_msg *msg) {
  node *n = ud;
  for (size_t i = 0; i < n->comp_started; i++) {
    const node_component *c = components[i];
    /* A component that is not active in this node (its start left no
     * state: training in `gwtf export`) leaves its types to the next. */
    if (c->message && n->comp_state[i] && msg->type >= c->type_lo && msg->type <= c->type_hi) {
      c->message(n->comp_state[i], from, msg);
      return;
    }
  }
  char id[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(from, id);
  GW_DEBUG(&n->log, "msg.unrouted", "peer=\"%s\" type=%u bytes=%zu", id, msg->type, msg->body_len + msg->data_len);
}

/* Reachability decides the DHT's mode: a node others cannot dial stays
 * out of their routing tables (p2p/reach.h, dht_set_client_mode); and
 * whether it keeps relay reservations (node/relays.h). */
static void on_reachability(void *ud, const p2p_reachability *r) {
  node *n = ud;
  if (r->status != P2P_REACH_UNKNOWN) dht_node_set_client_mode(n, r->status == P2P_REACH_PRIVATE);
  if (n->relays && !n->stopping) node_relays_set_status(n->relays, r->status, uv_now(&n->loop));
}

static void on_relays_timer(uv_timer_t *t) {
  node *n = t->data;
  if (n->relays && n->host && !n->stopping) node_relays_tick(n->relays, uv_now(&n->loop));
}

static void on_writable(void *ud, const gw_id *id) {
  node *n = ud;
  for (size_t i = 0; i < n->comp_started; i++)
    if (components[i]->writable) components[i]->writable(n->comp_state[i], id);
}

/* ---- telling people how to join ---- */

static void print_join(node *n, const gw_addr *a, const char *where) {
  char hex[GW_ID_HEX_LEN + 1], addr[GW_ADDR_STRLEN];
  gw_id_to_hex(&n->me.id, hex);
  gw_addr_format(a, addr);
  printf("gwtf: to join this node%s: gwtf node --bootstrap %s@%s\n", where, hex, addr);
  fflush(stdout);
}

/* A node bound to 0.0.0.0 or [::] is reachable at each of its interface
 * addresses; list a few so someone on the same network can paste one. */
static void print_join_lines(node *n, const gw_addr *bound) {
  if (!is_unspecified(bound)) {
    print_join(n, bound, "");
    return;
  }
  uv_interface_address_t *ifs = NULL;
  int count = 0, shown = 0;
  if (uv_interface_addresses(&ifs, &count) == 0) {
    for (int i = 0; i < count && shown < JOIN_LINES_MAX; i++) {
      gw_addr a;
      if (ifs[i].is_internal || p2p_addr_from_sockaddr((struct sockaddr *)&ifs[i].address, &a) != 0) continue;
      if (bound->family == 4 && a.family != 4) continue;
      a.port = bound->port;
      if (gw_addr_is_martian(&a, false)) continue; /* link-local and the like */
      print_join(n, &a, " (local network)");
      shown++;
    }
    uv_free_interface_addresses(ifs, count);
  }
  if (shown == 0) {
    gw_addr lo;
    gw_addr_parse(bound->family == 4 ? "127.0.0.1:1" : "[::1]:1", &lo);
    lo.port = bound->port;
    print_join(n, &lo, " (this machine)");
  }
}

static void on_nat(void *ud, const p2p_portmap_status *st) {
  node *n = ud;
  if (st->state == P2P_PORTMAP_MAPPED && !n->nat_join_printed && st->external_tcp.family) {
    char where[64];
    n->nat_join_printed = true;
    snprintf(where, sizeof(where), " (internet, via %s)", st->proto ? st->proto : "port mapping");
    print_join(n, &st->external_tcp, where);
  }
  if (n->host && !n->stopping) /* a new or lost mapping: reachability is measured again */
    p2p_host_recheck_reachability(n->host, st->state == P2P_PORTMAP_MAPPED ? &st->external_tcp : NULL);
}

static void start_nat(node *n, const gw_addr *bound) {
  if (n->cfg.port_mapping == P2P_PORTMAP_OFF) return;
  /* Port mapping maps IPv4 ports: useful for 0.0.0.0, a LAN address, or a
   * dual-stack [::] listener; pointless on loopback or a v6-only address. */
  if (is_loopback(bound) || (bound->family == 6 && !is_unspecified(bound))) {
    GW_INFO(&n->log, "nat.skipped", "reason=%s", is_loopback(bound) ? "loopback-listen" : "ipv6-listen");
    return;
  }
  p2p_portmap_config nc = {
      .mode = n->cfg.port_mapping,
      .tcp_port = bound->port,
      .udp_port = bound->port, /* the DHT's UDP socket shares the port number */
      .gateway = n->cfg.nat_gateway,
      .log = &n->log,
  };
  if (p2p_portmap_start(&n->loop, &nc, on_nat, n, &n->nat) != 0) n->nat = NULL;
}

/* ---- bootstrap peers ---- */

static void bootstrap_connect(node *n, bootstrap *b, const gw_addr *addr) {
  char s[GW_ADDR_STRLEN];
  gw_addr_format(addr, s);
  b->done = true;
  int rc = p2p_host_connect(n->host, addr, b->has_id ? &b->id : NULL);
  if (rc != 0)
    GW_WARN(&n->log, "node.bootstrap_failed", "addr=%s err=\"%s\"", s, gw_strerror(rc));
  else
    GW_INFO(&n->log, "node.bootstrap", "addr=%s id=%s", s, b->has_id ? "checked" : "any");
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  bootstrap *b = req->data;
  node *n = b->n;
  b->resolving = false;
  if (status == UV_ECANCELED || n->stopping) {
    uv_freeaddrinfo(res);
    return;
  }
  gw_addr a;
  if (status != 0 || !res || p2p_addr_from_sockaddr(res->ai_addr, &a) != 0) {
    GW_WARN(&n->log, "node.bootstrap_unresolved", "host=%s err=\"%s\" retry_ms=%d", b->host,
            gw_strerror(status ? status : GW_EINVAL), RESOLVE_RETRY_MS);
  } else {
    a.port = b->port;
    bootstrap_connect(n, b, &a);
  }
  uv_freeaddrinfo(res);
}

static void resolve_all(node *n) {
  for (size_t i = 0; i < n->cfg.n_bootstrap; i++) {
    bootstrap *b = &n->boot[i];
    if (b->done || b->resolving) continue;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    b->req.data = b;
    b->resolving = true;
    /* Name lookups run on libuv's thread pool: the loop never waits on DNS. */
    if (uv_getaddrinfo(&n->loop, &b->req, on_resolved, b->host, NULL, &hints) != 0) b->resolving = false;
  }
}

static void on_resolve_timer(uv_timer_t *t) { resolve_all(t->data); }

static int start_bootstrap(node *n) {
  for (size_t i = 0; i < n->cfg.n_bootstrap; i++) {
    bootstrap *b = &n->boot[i];
    b->n = n;
    if (node_parse_peer_spec(n->cfg.bootstrap[i], b->host, sizeof(b->host), &b->port, &b->id, &b->has_id) != 0)
      return GW_EINVAL;
    char numeric[300];
    gw_addr a;
    snprintf(numeric, sizeof(numeric), strchr(b->host, ':') ? "[%s]:%u" : "%s:%u", b->host, (unsigned)b->port);
    if (gw_addr_parse(numeric, &a) == 0) bootstrap_connect(n, b, &a);
  }
  resolve_all(n);
  uv_timer_start(&n->resolve_timer, on_resolve_timer, RESOLVE_RETRY_MS, RESOLVE_RETRY_MS);
  return 0;
}

/* ---- run ---- */

/* Relay limits from the command line. A node without a listener cannot
 * relay (nobody could reach it), whatever --relay says; the host knows. */
static void relay_wire(const node *n, p2p_host_config *hc) {
  hc->relay = n->cfg.relay;
  if (!hc->relay.enabled || !hc->listen.family) return;
  const p2p_relay_config *r = &hc->relay;
  GW_DEBUG(&n->log, "relay.serving",
           "max_reservations=%u max_circuits=%u max_bytes_per_s=%llu max_bytes=%llu circuit_lifetime_s=%u",
           r->max_reservations, r->max_circuits, (unsigned long long)r->max_bytes_per_s, (unsigned long long)r->max_bytes,
           r->circuit_lifetime_s);
}

static int start_host(node *n, gw_addr *bound) {
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &n->me;
  hc.listen = n->cfg.listen;
  hc.max_frame = n->cfg.max_frame;
  hc.ping_interval_ms = n->cfg.ping_interval_ms;
  hc.handshake_timeout_ms = n->cfg.handshake_timeout_ms;
  if (hc.idle_timeout_ms < 4 * hc.ping_interval_ms) hc.idle_timeout_ms = 4 * hc.ping_interval_ms;
  hc.links = n->links;
  hc.log = &n->log;
  hc.agent = "gwtf/" GWTF_VERSION;
  relay_wire(n, &hc);
  hc.punch.enabled = n->cfg.hole_punch;
  hc.limits = n->cfg.limits;
  p2p_host_cbs cbs = {.ud = n, .peer_up = on_peer_up, .peer_down = on_peer_down, .message = on_message,
                      .writable = on_writable, .reachability = on_reachability};
  int rc = p2p_host_new(&n->loop, &hc, &cbs, &n->host);
  if (rc != 0) {
    char addr[GW_ADDR_STRLEN];
    gw_addr_format(&n->cfg.listen, addr);
    GW_ERROR(&n->log, "node.listen_failed", "addr=%s err=\"%s\"", addr, gw_strerror(rc));
    return rc;
  }
  *bound = p2p_host_listen_addr(n->host);
  return 0;
}

static int start_components(node *n) {
  for (size_t i = 0; components[i]; i++) {
    int rc = components[i]->start ? components[i]->start(n, &n->comp_state[i]) : 0;
    if (rc != 0) {
      GW_ERROR(&n->log, "node.component_failed", "component=%s err=\"%s\"", components[i]->name, gw_strerror(rc));
      return rc;
    }
    n->comp_started = i + 1;
  }
  return 0;
}

static void log_started(node *n, const gw_addr *bound) {
  char hex[GW_ID_HEX_LEN + 1], addr[GW_ADDR_STRLEN];
  gw_id_to_hex(&n->me.id, hex);
  gw_addr_format(bound, addr);
  if (n->identity_created) GW_INFO(&n->log, "node.identity", "created=true path=%s", n->identity_path);
  GW_INFO(&n->log, "node.listening", "addr=%s id=\"%s\" data_dir=%s max_frame=%zu links=%s", addr, hex, n->data_dir,
          n->cfg.max_frame, n->cfg.links_path ? n->cfg.links_path : "-");
}

void node_set_exit_code(node *n, int code) { n->exit_code = code; }

int node_run(node *n) {
  uv_signal_init(&n->loop, &n->sigint);
  uv_signal_init(&n->loop, &n->sigterm);
  uv_timer_init(&n->loop, &n->resolve_timer);
  uv_timer_init(&n->loop, &n->relays_timer);
  n->sigint.data = n->sigterm.data = n->resolve_timer.data = n->relays_timer.data = n;
  n->handles_ready = true;
  uv_signal_start(&n->sigint, on_signal, SIGINT);
  uv_signal_start(&n->sigterm, on_signal, SIGTERM);

  gw_addr bound;
  int rc = start_host(n, &bound);
  if (rc == 0 && node_relays_new(n->host, &n->me.id, &n->log, &n->relays) == 0)
    uv_timer_start(&n->relays_timer, on_relays_timer, NODE_RELAYS_TICK_MS, NODE_RELAYS_TICK_MS);
  if (rc == 0) {
    log_started(n, &bound);
    print_join_lines(n, &bound);
    start_nat(n, &bound);
    rc = start_components(n);
  }
  if (rc == 0) rc = start_bootstrap(n);
  if (rc != 0) {
    n->exit_code = 1;
    n->stopping = true;
    node_component_stopped(n);
  }
  uv_run(&n->loop, UV_RUN_DEFAULT);
  return n->exit_code;
}
