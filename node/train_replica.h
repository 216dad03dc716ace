/* node/train_replica.h — the node's side of stage replicas
 * (train/peer_replica.c): when to push, what a holder writes to its data
 * dir and announces in the DHT, and the holders a restorer looks up.
 *
 * A holder announces run/<name>/replica/<s> (dht/stage_dir.h) with its
 * address and, in the record's extra bytes, the newest replica it holds of
 * stage s: iteration (8 bytes, big-endian), step (8) and the weights hash
 * the stage logged (32). */
#ifndef GWTF_NODE_TRAIN_REPLICA_H
#define GWTF_NODE_TRAIN_REPLICA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/stage_dir.h"
#include "train/peer.h"
#include "util/log.h"

#define TRAIN_REPLICA_EXTRA_BYTES (48)

void train_replica_extra_encode(uint8_t out[TRAIN_REPLICA_EXTRA_BYTES], uint64_t iteration, uint64_t step,
                                const uint8_t hash[32]);
/* A holder record's extra into h (id from the record); GW_EPROTO when it
 * is not one. */
int train_replica_extra_decode(const stage_member *m, train_replica_holder *h);

/* Whether the aggregation that made `iteration` is one whose state we push
 * (every `every`, 0: never) and we are the stage's pusher. */
bool train_replica_due(const train_peer *p, int every, uint64_t iteration);

/* A replica of `stage` was stored (TRAIN_EV_REPLICA_STORED): written to
 * data_dir atomically and announced under the replica key with `me`'s
 * address. Logs failures; returns 0 or the first error. */
int train_replica_keep(dht *d, const char *run, const char *data_dir, const train_peer *p, int stage,
                       const stage_member *me, const gw_log *log, uint64_t now_ms);
/* One was dropped (TRAIN_EV_REPLICA_DROPPED): its files removed; the
 * announcement names the stage's next newest we hold, or is withdrawn. */
void train_replica_drop(dht *d, const char *run, const char *data_dir, const train_peer *p, int stage,
                        uint64_t iteration, const stage_member *me, const gw_log *log, uint64_t now_ms);

#endif
