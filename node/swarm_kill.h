/* node/swarm_kill.h — `gwtf swarm`'s fault injection at an iteration (test
 * tools, docs/TRAINING.md "Stage replicas and refill"):
 *   --kill-stage S --at-iteration N    every peer of relay stage S at once,
 *                                      those identities never back (the
 *                                      --late-relays spares start then);
 *   --kill-data-node --at-iteration N  every data node at once; a fresh one
 *                                      (new identity, empty data dir, same
 *                                      dataset) starts --replace-after MS later;
 *   --kill-fraction F --at-iteration N ceil(F x relays) relays at once (a
 *                                      correlated outage), restarted with
 *                                      fresh identities as churn restarts.
 * All strike when the leader has completed N iterations (SIGKILL) and
 * measure the seconds from the kill to the next completed iteration and the
 * aggregations lost (the largest `lost=` of the stage.restored lines after
 * the kill). node/cmd_swarm.c owns the processes: this module decides whom
 * to kill and when, and reports; the ops do it. */
#ifndef GWTF_NODE_SWARM_KILL_H
#define GWTF_NODE_SWARM_KILL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "node/swarm_opts.h"
#include "util/rng.h"

typedef struct swarm_kill_peer {
  bool running, data;
  int stage; /* -1: not placed yet */
} swarm_kill_peer;

typedef struct swarm_kill_ops {
  void *ud;
  void (*peer)(void *ud, int i, swarm_kill_peer *out);
  /* SIGKILL peer i; restart: it comes back with a fresh identity later (as
   * churn's victims do), else that identity is gone for good */
  void (*kill)(void *ud, int i, bool restart, const char *reason);
  /* a fresh data node in data node i's place, after_ms from now */
  void (*replace)(void *ud, int i, uint64_t after_ms);
  void (*start_late)(void *ud); /* the --late-relays spares */
  void (*say)(void *ud, const char *line);
} swarm_kill_ops;

typedef struct swarm_kill {
  const swarm_opts *o;
  swarm_kill_ops ops;
  int n_peers;
  gw_rng rng;
  bool struck;
  int peers_killed;
  uint64_t kill_ms;
  double to_next_s;  /* -1 until an iteration completes after the kill */
  int restored;      /* stage.restored lines after the kill */
  int lost_max;      /* their largest lost= (aggregations lost) */
  bool stage0_lost;  /* a fresh data node found no replica of stage 0 */
} swarm_kill;

/* Whether the command line asks for one (it allows at most one). */
bool swarm_kill_wanted(const swarm_opts *o);
void swarm_kill_init(swarm_kill *k, const swarm_opts *o, const swarm_kill_ops *ops, int n_peers);
/* The leader has completed `completed` iterations (a new high) at now_ms. */
void swarm_kill_on_iteration(swarm_kill *k, uint64_t completed, uint64_t now_ms);
/* Every log line's event: stage.restored and stage.lost count. */
void swarm_kill_on_event(swarm_kill *k, const char *event, json_t *ev);
/* The summary's record (stage_kill, data_node_kill or fraction_kill) into
 * root; lost_stage: the relay stage declared lost (0: none). */
void swarm_kill_json(const swarm_kill *k, json_t *root, int lost_stage);
/* One line of the text summary (nothing when no kill struck). */
void swarm_kill_print(const swarm_kill *k, FILE *out, int lost_stage);

#endif
