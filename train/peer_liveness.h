/* train/peer_liveness.h — failure detection from measured RTTs
 * (train/peer_liveness.c): a hop's wait gets a deadline from the session's
 * RTT, the hop's compute and our queue to it; a peer that misses it is
 * probed, and declared failed only when the probe goes unanswered. Its
 * state (peer_liveness) is in train/peer_internal.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_LIVENESS_H
#define GWTF_TRAIN_PEER_LIVENESS_H

#include "train/peer_internal.h"

typedef enum live_verdict {
  LIVE_WAIT = 0, /* *deadline moved: a probe is out, or the peer answered one */
  LIVE_DEAD,     /* its session is gone, or it left a probe unanswered */
  LIVE_CAP,      /* the fixed hop timeout passed */
} live_verdict;

/* peer_liveness.c: failure detection from measured RTTs */
/* When to suspect `peer` if what we send it now is not answered: now +
 * max(floor, k x (srtt + 4 rttvar)) + work_ms (its compute first) + our
 * queue to it, at most cap; cap without an RTT. */
uint64_t live_deadline(train_peer *p, const gw_id *peer, double work_ms, uint64_t cap);
/* `peer` missed *deadline (waiting for `what` of microbatch mb_id): probes
 * it, or reads the outcome of the probe out. LIVE_WAIT moves *deadline (the
 * probe's, or a new one once it answered: slow, not dead). */
live_verdict live_check(train_peer *p, const gw_id *peer, uint64_t *deadline, uint64_t cap, double work_ms,
                        const char *what, uint64_t mb_id);
/* It answered a probe lately (and failed none since): slow, not dead. */
bool live_answered_lately(train_peer *p, const gw_id *peer);
/* The compute time its HELLO claims (0: unknown). */
double live_compute_ms(train_peer *p, const gw_id *peer);
void live_heard(train_peer *p, const gw_id *from); /* any train message from it */
void live_on_hello(train_peer *p, const gw_id *from, double compute_ms);
void live_note_full(train_peer *p, const gw_id *from); /* it said DENY full */
/* One of our microbatches held a slot at `peer` for ms (our FORWARD to its gradient back). */
void live_note_hold(train_peer *p, const gw_id *peer, double ms);
/* How long its DENY full keeps it a last resort for the fallback. */
uint64_t live_full_for_ms(const train_peer *p, const live_peer *e, uint32_t capacity);

#endif
