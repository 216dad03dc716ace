/* node/swarm_hashes.h — whether every stage's peers of a `gwtf swarm` held
 * the same weights after every aggregation, from the weight hashes their
 * aggregation.done lines carry.
 *
 * Log lines of different peers arrive in any order, so the records are
 * judged once the swarm has stopped. Two kinds of disagreement are not a
 * split: the hash of a peer's last aggregation before it was killed (an
 * aggregator killed while sending the average leaves the others to average
 * without it; only its own, never used, weights differ), and nothing else.
 * A split of a (stage, iteration) is counted once, with the first later
 * iteration at which the stage's live peers agreed again (it healed: the
 * members split off fetched the stage's weights), if any did. */
#ifndef GWTF_NODE_SWARM_HASHES_H
#define GWTF_NODE_SWARM_HASHES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One record: peer (an index into the caller's peers) and its generation
 * (restarts with a fresh identity bump it) logged `hash` after aggregating
 * `stage` at `iteration`. */
typedef struct swarm_hash_rec {
  uint64_t iteration;
  int stage;
  int peer, generation;
  char hash[20];
} swarm_hash_rec;

typedef struct swarm_hashes {
  swarm_hash_rec *recs;
  size_t n, cap;
} swarm_hashes;

/* What the judgement needs to know of a peer at the end of the run. */
typedef struct swarm_hash_peer {
  const char *name;
  int generation;        /* its current one */
  int killed_generation; /* the latest generation that was killed, -1: none */
} swarm_hash_peer;

/* GW_ENOMEM when the record cannot be kept (the run's verdict then misses it). */
int swarm_hashes_note(swarm_hashes *hs, uint64_t iteration, int stage, const char *hash, int peer, int generation);

/* The splits, each said through `say` ("WEIGHTS DISAGREE: stage S after
 * iteration I: A has H1, B has H2 (healed by iteration J | never healed)");
 * *unhealed gets how many never healed. 0: every stage agreed throughout. */
int swarm_hashes_check(const swarm_hashes *hs, const swarm_hash_peer *peers, int *unhealed,
                       void (*say)(void *ud, const char *line), void *ud);

void swarm_hashes_free(swarm_hashes *hs);

#endif
