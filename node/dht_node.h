/* node/dht_node.h — the DHT in a `gwtf node`: the "dht" component.
 *
 * It runs a dht (dht/dht.h) over UDP on the node's listen port (the TCP
 * sessions and the DHT share one port number, which is what the stage
 * directory announces), joins through the bootstrap peers and the contacts
 * saved by an earlier run, announces the stages given with --announce once
 * joined (the DHT republishes them until shutdown), and logs the
 * routing-table size and stored-record count periodically. Upper components
 * reach it with node_dht(). */
#ifndef GWTF_NODE_DHT_NODE_H
#define GWTF_NODE_DHT_NODE_H

#include "node/dht_runtime.h"
#include "node/node.h"

#define DHT_NODE_STATS_MS (30000)

extern const node_component dht_component;

/* The node's DHT runtime, NULL before the component started. */
dht_runtime *node_dht(node *n);

/* Client mode on or off (dht_set_client_mode): node.c switches it on when
 * the reachability check (p2p/reach.h) says this node is private, and off
 * when it says public. No-op before the component started. */
void dht_node_set_client_mode(node *n, bool on);

/* Parses an --announce value "RUN:STAGE" into run (room for run_len bytes)
 * and stage. Returns 0 or GW_EINVAL. */
int dht_node_parse_announce(const char *spec, char *run, size_t run_len, uint32_t *stage);

#endif
