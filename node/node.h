/* node/node.h — the peer process: one libuv loop and the layers on it.
 *
 * A node owns the loop, the identity, the log sink, the p2p host (sessions,
 * reconnects, pings, link emulation), port mapping, and the upper layers, which
 * plug in as components: each gets started once the host listens, sees
 * peers come and go, receives the message types of its range, and is
 * stopped (asynchronously, in reverse order) on shutdown. The DHT and the
 * training layer become entries of the component table in node.c:
 *
 *   static const node_component *const components[] = {&dht_component, &train_component, NULL};
 *
 * Shutdown (SIGINT/SIGTERM or node_stop): components stop in reverse order,
 * then the host says goodbye on every session and port mapping deletes its
 * mappings, both bounded by short timeouts; the loop then runs dry and
 * node_run returns 0. A second signal exits at once. */
#ifndef GWTF_NODE_NODE_H
#define GWTF_NODE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/host.h"
#include "p2p/identity.h"
#include "p2p/portmap.h"
#include "util/addr.h"
#include "util/log.h"

#define NODE_DEFAULT_PORT (7447)
#define NODE_MAX_BOOTSTRAP (64)
#define NODE_MAX_ANNOUNCE (8)

typedef struct node_config {
  const char *data_dir;      /* NULL: $HOME/.gwtf, or ./gwtf-data without HOME */
  const char *identity_path; /* NULL: <data_dir>/identity.key */
  gw_addr listen;            /* TCP now; the DHT's UDP socket binds the same port */
  const char *bootstrap[NODE_MAX_BOOTSTRAP]; /* "[NODEID@]HOST:PORT" */
  size_t n_bootstrap;
  gw_log_level log_level;
  gw_log_format log_format;
  const char *links_path; /* NULL: no link emulation */
  double links_bw_scale;  /* > 0 overrides the file's bandwidth_scale */
  p2p_portmap_mode port_mapping; /* --port-mapping (default auto) */
  const char *nat_gateway; /* PCP/NAT-PMP server; NULL: the default route's gateway */
  size_t max_frame;
  uint32_t ping_interval_ms;
  uint32_t handshake_timeout_ms;
  uint64_t record_ttl_ms;     /* DHT records we publish live this long (0: the DHT's default) */
  bool allow_loopback_peers;  /* the DHT accepts 127.0.0.0/8 contacts (local swarms, tests) */
  const struct train_node_opts *train; /* NULL: no training (a plain peer) */
  /* `gwtf export --bootstrap` (node/export_swarm.h): fetch a run's weights
   * instead of training; NULL otherwise. The component writes its results
   * into it. */
  struct export_swarm_opts *export_swarm;
  /* Stage-directory announcements made by the DHT component (node/dht_node.c):
   * "RUN:STAGE", kept alive (republished) until shutdown. */
  const char *announce[NODE_MAX_ANNOUNCE];
  size_t n_announce;
  uint32_t dht_stats_ms; /* period of the dht.stats log line (0: DHT_NODE_STATS_MS) */
  p2p_relay_config relay; /* --relay*: serving as a relay for private peers (p2p/relay.h) */
  bool hole_punch;        /* --hole-punch: move relayed sessions to direct ones (p2p/punch.h) */
  p2p_limits_config limits; /* --max-*-per-ip/subnet, --max-rx-buffer, --min-rx-rate (p2p/limits.h) */
  gw_log_feed log_feed;     /* NULL, or a subscriber to every INFO+ event (--http: node/web_feed.h) */
  void *log_feed_ud;
} node_config;

typedef struct node node;

/* Everything an upper layer needs to plug into the node. */
typedef struct node_component {
  const char *name;
  uint32_t type_lo, type_hi; /* gwtf.MsgType range it receives; 0, 0 for none */
  /* Called once the host listens; *state is passed to every other call. */
  int (*start)(node *n, void **state);
  /* Must end with node_component_stopped(n), now or later from the loop. */
  void (*stop)(node *n, void *state);
  void (*peer_up)(void *state, const gw_peer *peer, bool back);
  void (*peer_down)(void *state, const gw_id *id, p2p_down_reason reason);
  void (*message)(void *state, const gw_id *from, p2p_msg *msg);
  void (*writable)(void *state, const gw_id *id);
} node_component;

void node_config_defaults(node_config *cfg);
/* Loads (or creates) the identity, opens the links file and sets up the
 * loop; nothing runs until node_run. On failure err says why. */
int node_create(const node_config *cfg, node **out, char *err, size_t err_len);
/* Listens, dials the bootstrap peers and runs until shut down. Returns the
 * process exit code (0 after a clean shutdown). */
int node_run(node *n);
/* Starts a clean shutdown; safe from any callback on the loop. */
void node_stop(node *n);
/* The code node_run returns once stopped (a component that stops the node
 * for a reason the user must see, e.g. a run that cannot go on). */
void node_set_exit_code(node *n, int code);
void node_destroy(node *n);

uv_loop_t *node_loop(node *n);
p2p_host *node_host(node *n);
const p2p_identity *node_identity(const node *n);
const gw_log *node_log(const node *n);
const node_config *node_get_config(const node *n);
/* Where port mapping stands (protocol, external TCP address, lease, state);
 * NULL when it is off or skipped (loopback listen). Changes are also
 * logged as nat.* events. */
const p2p_portmap_status *node_portmap_status(const node *n);
/* The relay reservations of a private node (node/relays.h); NULL before
 * the host listens. */
struct node_relays *node_get_relays(node *n);
void node_component_stopped(node *n);
/* The state a started component keeps (what its start() returned), by name;
 * NULL when there is no such component or it has not started. */
void *node_component_state(node *n, const char *name);

/* Parses "[NODEID@]HOST:PORT": host (room for host_len bytes), port, and
 * the expected node ID when given (*has_id). Returns 0 or GW_EINVAL. */
int node_parse_peer_spec(const char *spec, char *host, size_t host_len, uint16_t *port, gw_id *id, bool *has_id);
/* Parses a byte count: "4194304", "4M", "4MiB", "64k" (binary units).
 * Returns 0 or GW_EINVAL. */
int node_parse_size(const char *s, uint64_t *out);
/* Parses a positive factor: "0.03125" or a fraction "1/32". */
int node_parse_factor(const char *s, double *out);
/* The default data directory (see node_config.data_dir) into out. */
void node_default_data_dir(char *out, size_t out_len);

#endif
