/* node/export_swarm.h — `gwtf export --bootstrap`: the "export" component
 * fetches a live run's whole model from its members.
 *
 * It finds the run record (run/<name>, the record its leader published) and
 * the stage directory (run/<name>/stage/<s>) in the DHT, opens a session to
 * members of every stage and asks each for its state with the message a
 * joining peer sends (TRAIN_WEIGHTS_REQ; the member answers with
 * TRAIN_WEIGHTS_CHUNK messages, as to a joiner). A download is checked
 * against the hash its chunks announce; then, as every member of a stage
 * holds bit-identical weights after an aggregation, the weights of
 * `verify_members` different members of each stage (fewer when the stage
 * has fewer) must have equal weight hashes at the same iteration, and every
 * stage must be at the same iteration: a stage that is behind (it was
 * fetched before the latest aggregation) is fetched again, until the set is
 * consistent or the time is up.
 *
 * The component is active only when node_config.export_swarm is set (a
 * node runs either it or training). Results land in the options: the node
 * stops itself when it is done or gives up. */
#ifndef GWTF_NODE_EXPORT_SWARM_H
#define GWTF_NODE_EXPORT_SWARM_H

#include <stdint.h>

#include "node/node.h"
#include "train/hf_export.h"
#include "train/member.h"

typedef struct export_swarm_opts {
  const char *run;
  uint64_t timeout_ms;   /* give up after this long */
  int verify_members;    /* members per stage that must agree (>= 1) */
  /* A private run's key (its creator's, or a copy given with --run-key):
   * the tool certifies its own identity with it and presents that
   * certificate to every member before asking for weights. NULL: open
   * runs only (a private one fails with a clear error). */
  const member_key *run_key;
  /* results */
  hf_model *model;       /* filled (hf_model_init'ed by the caller) */
  long long iteration;   /* the iteration the weights are for */
  int rc;                /* 0 once model is complete */
} export_swarm_opts;

extern const node_component export_component;

#endif
