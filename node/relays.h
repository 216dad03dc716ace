/* node/relays.h — which public peers a private node keeps relay
 * reservations on (issue 16; the circuits themselves are p2p/relay.h).
 *
 * Policy, run every NODE_RELAYS_TICK_MS from the node's loop:
 *   - while the reachability verdict is private, keep reservations on up
 *     to NODE_RELAYS_WANT public peers we have direct (not relayed)
 *     sessions with, lowest measured RTT first;
 *   - a relay that refuses (a gwtf.RelayStatus: relay-off, private,
 *     too-many-reservations, ...), that stays unanswered, or whose session
 *     is gone, is dropped and avoided for a while; another takes its place;
 *   - when the verdict becomes public (or unknown again) every reservation
 *     is dropped.
 * The set of granted reservations is what the node advertises (stage
 * records carry it, dht/stage_dir.h); each change is logged
 *   nat.relays relays=ID@ADDR,...   (relays=- when empty)
 * and bumps a generation counter the train component watches. */
#ifndef GWTF_NODE_RELAYS_H
#define GWTF_NODE_RELAYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "p2p/host.h"
#include "util/log.h"

#define NODE_RELAYS_WANT (2)
#define NODE_RELAYS_TICK_MS (500)
#define NODE_RELAYS_MAX (NODE_RELAYS_WANT)

typedef struct node_relays node_relays;

int node_relays_new(p2p_host *h, const gw_id *me, const gw_log *log, node_relays **out);
void node_relays_free(node_relays *r);
/* The latest reachability verdict (the host's reachability callback). */
void node_relays_set_status(node_relays *r, p2p_reach_status status, uint64_t now_ms);
void node_relays_tick(node_relays *r, uint64_t now_ms);

/* The granted reservations, in order of preference, up to max; returns
 * how many. *private_out: the verdict is private (our direct address is
 * not dialable). */
size_t node_relays_get(const node_relays *r, p2p_relay_addr *out, size_t max, bool *private_out);
/* Changes whenever node_relays_get would answer differently. */
uint64_t node_relays_generation(const node_relays *r);

#endif
