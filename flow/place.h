/* flow/place.h — node placement (GWTF §V-B) as a protocol state machine.
 *
 * Joining nodes (candidates) are put where they widen the bottleneck. The
 * leader — the live data node with the lowest node ID — periodically floods
 * a utilization query stage by stage: it sends the query to the stage-1
 * peers it knows; a relay collects the copies arriving from the previous
 * stage during one tick, adds its own record (capacity and flows through
 * it) and forwards the merged set to the next-stage peers it knows; stage S
 * sends it back to the leader. The leader ranks stages by utilization,
 * (flows through the stage) / (stage capacity), and assigns the waiting
 * candidates highest capacity first: the largest candidate to the most
 * utilized stage, the second to the second, and so on (wrapping around when
 * there are more candidates than stages).
 *
 * Same driver contract as flow/flow.h (util/io.h); messages are the
 * Place* members of gwtf.FlowMessage (proto/flow.proto), so the training
 * layer feeds every MSG_FLOW body to both the flow and the place instance —
 * each ignores the other's messages.
 *
 * Roles: a data node (stage 0) leads when its ID is the lowest among the
 * data nodes it knows (the others stay quiet); a relay relays queries, and
 * at stage S sends them to the leader named in the query; a candidate
 * (stage -1) asks the leader for a stage until it gets one. */
#ifndef GWTF_FLOW_PLACE_H
#define GWTF_FLOW_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/addr.h"
#include "util/id.h"
#include "util/io.h"
#include "util/log.h"

typedef struct place place;

typedef struct place_tunables {
  uint64_t tick_ms;       /* 2000, as the flow protocol */
  int query_period_ticks; /* 16: the leader floods this often ("periodically"; at least every
                             n_stages + 3 ticks, the time a flood takes to come back) */
  int join_retry_ticks;   /* 6: a candidate without an answer asks again */
  int max_candidates;     /* 1024 waiting candidates at most */
  int max_records;        /* 4096 records per query at most */
} place_tunables;

void place_tunables_default(place_tunables *t);

/* A relay's own figures for the query: its capacity and the flows through it. */
typedef void (*place_stats_fn)(void *ud, uint32_t *capacity, uint32_t *flows);
/* A candidate learnt its stage. */
typedef void (*place_assigned_fn)(void *ud, int stage);

#define PLACE_CANDIDATE (-1)

typedef struct place_config {
  gw_id self;
  int stage; /* 0: data node; 1..n_stages: relay; PLACE_CANDIDATE */
  int n_stages;
  uint32_t capacity; /* a candidate's capacity (what the leader ranks by) */
  place_tunables tun;
  gw_io io;
  const gw_log *log;
  place_stats_fn stats;
  void *stats_ud;
  place_assigned_fn on_assigned;
  void *assigned_ud;
} place_config;

int place_new(const place_config *cfg, place **out);
void place_free(place *p);
int place_start(place *p, uint64_t now_ms);
/* Ignores flow routing messages with 0; GW_EPROTO on malformed input. */
int place_on_message(place *p, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms);
void place_on_tick(place *p, uint64_t now_ms);

/* Membership: data nodes (stage 0: leader election, and where stage S
 * sends the query back) and next-stage peers (where queries go). */
int place_add_peer(place *p, const gw_id *id, int stage);
int place_remove_peer(place *p, const gw_id *id);

bool place_is_leader(const place *p);
/* The leader this node believes in (itself included); NULL when it knows no
 * data node at all. */
const gw_id *place_leader(const place *p);
/* A candidate's assigned stage, or PLACE_CANDIDATE while it has none. */
int place_assigned_stage(const place *p);

/* Utilization the leader computed from its last complete query. */
typedef struct place_stage_util {
  uint64_t flows, capacity;
  int nodes;
  double utilization; /* flows / capacity; +inf for a stage without capacity */
} place_stage_util;

/* Fills util[1..n_stages] (util[0] unused); false before the first query
 * completed. */
bool place_utilization(const place *p, place_stage_util *util);

/* The leader's rule on its own, for the evaluation and tests: candidates by
 * capacity (highest first, ties by index) go to stages by utilization
 * (highest first, ties by lower capacity, then lower stage), the k-th
 * candidate to the (k mod S)-th stage. util has n_stages + 1 entries
 * (index 0 unused); stage_out gets a stage 1..S per candidate. */
void place_rank(const place_stage_util *util, int n_stages, const uint32_t *cand_capacity, int n_cand, int *stage_out);

#endif
