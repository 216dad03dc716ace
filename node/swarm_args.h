/* node/swarm_args.h — the command line of one `gwtf swarm` child: a data
 * node (the first creates the run) or a relay, in its current generation
 * (a relay restarted under churn comes back with a fresh identity), with
 * what the swarm's options give each (capacity, slowdown, faults, a stage
 * to ask for, hostile modes). */
#ifndef GWTF_NODE_SWARM_ARGS_H
#define GWTF_NODE_SWARM_ARGS_H

#include <limits.h>
#include <stdbool.h>

#include "node/swarm_opts.h"

/* One child as its command line sees it. */
typedef struct swarm_child {
  int index; /* data nodes first (0: the run's creator), then relays */
  const char *name;
  bool data;
  bool late;        /* started once the leader finished --late-after iterations */
  bool replacement; /* a fresh data node in place of one --kill-data-node killed: it joins */
  int generation;
  int port;
  int bootstrap_port; /* a live peer's, to join through */
} swarm_child;

/* Where the swarm runs: the gwtf executable, its work directory (a child's
 * data dir is WORKDIR/NAME.GENERATION) and the data nodes' dataset. */
typedef struct swarm_paths {
  const char *exe, *workdir, *dataset;
} swarm_paths;

/* argv for child c (NULL-terminated, at most max - 1 arguments, each in a
 * row of store); returns how many. */
int swarm_child_args(const swarm_opts *o, const swarm_paths *paths, const swarm_child *c, char **argv,
                     char store[][PATH_MAX], int max);
/* Whether c is one of --byzantine's hostile relays: the last N relays of
 * those started at once. */
bool swarm_child_byzantine(const swarm_opts *o, const swarm_child *c);
/* Writes c's identity key so that its node ID starts with 0xff (see the .c). */
int swarm_byzantine_identity(const char *workdir, const swarm_child *c);

#endif
