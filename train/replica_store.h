/* train/replica_store.h — replicas of stage states held for other stages
 * (module prefix replica_).
 *
 * Every K aggregations one member of each relay stage pushes the stage's
 * serialised state (train/stage.h: weights, AdamW moments, step) to R peers
 * outside the stage (train/peer_replica.c), so that the state outlives the
 * stage's peers. A holder keeps what it received here:
 *
 *   - in memory, bounded by a number of entries and by bytes; over either
 *     bound, the oldest replica of the stage holding the most entries goes
 *     first (so a holder of several stages keeps each stage's newest as long
 *     as it can); a (stage, iteration) received again from its pusher
 *     replaces the entry, from anyone else it is refused (GW_EEXIST);
 *   - every entry's bytes are checked against the BLAKE2b-256 the pusher
 *     announced before it is taken (replica_store_put);
 *   - on disk (the node's data dir), written atomically beside a checkpoint
 *     sidecar (train/checkpoint.h: run, stage, iteration, weight_hash), so a
 *     crash leaves either no file or a whole one.
 *
 * Pure data structure plus path helpers: no sockets, threads or clock. */
#ifndef GWTF_TRAIN_REPLICA_STORE_H
#define GWTF_TRAIN_REPLICA_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define REPLICA_DEFAULT_MAX_ENTRIES (4)
#define REPLICA_DEFAULT_MAX_BYTES (((uint64_t)1) << 30) /* 1 GiB */

typedef struct replica_entry {
  int stage;
  uint64_t iteration;       /* aggregations the stage had done (its weights are for this iteration) */
  uint64_t step;            /* optimizer steps */
  uint8_t blob_hash[32];    /* BLAKE2b-256 of blob: the transfer arrived intact */
  uint8_t weights_hash[32]; /* the hash the stage logged after that aggregation */
  gw_id from;               /* the member that pushed it */
  uint8_t *blob;
  size_t len;
} replica_entry;

typedef struct replica_store {
  replica_entry *v;
  size_t n, cap;
  size_t max_entries;
  uint64_t max_bytes, bytes;
} replica_store;

/* max_entries 0: REPLICA_DEFAULT_MAX_ENTRIES; max_bytes 0: REPLICA_DEFAULT_MAX_BYTES. */
void replica_store_init(replica_store *s, size_t max_entries, uint64_t max_bytes);
void replica_store_free(replica_store *s);

/* Takes e (and e->blob, malloc'd, on success) after checking that blob
 * hashes to e->blob_hash (GW_EPROTO otherwise; the caller keeps the blob)
 * and that it fits the byte bound at all (GW_ERANGE). Entries dropped to
 * stay within the bounds are moved to dropped[0..*n_dropped) (their blobs
 * freed, blob = NULL) when there is room there, so the caller can remove
 * their files and log them. */
int replica_store_put(replica_store *s, const replica_entry *e, replica_entry *dropped, size_t max_dropped,
                      size_t *n_dropped);
/* The newest replica of a stage we hold; NULL when none. */
const replica_entry *replica_store_newest(const replica_store *s, int stage);

/* ---- on disk ---- */

/* <data_dir>/replicas/<run>.stage<s>.iter<i>.state; GW_ERANGE when it does
 * not fit in len. */
int replica_path(char *out, size_t len, const char *data_dir, const char *run, int stage, uint64_t iteration);
/* Writes e's blob to replica_path (creating the folder) and its sidecar
 * (path + ".json", train/checkpoint.h), each atomically. */
int replica_save(const char *data_dir, const char *run, const replica_entry *e);
/* Removes a replica's file and sidecar (a missing file is no error). */
int replica_remove(const char *data_dir, const char *run, int stage, uint64_t iteration);

#endif
