/* train/peer_leader.h — the leader (GWTF §V-B), the live data node with the
 * lowest node ID: data nodes report ITER_DONE to it and it starts the
 * aggregation (train/peer_leader.c); and live rebalancing between stages
 * (train/peer_rebalance.c: relays' compute times in HELLO, the leader
 * moving a relay into the bottleneck stage). Placing joiners and refilling
 * empty stages are train/peer_join.h's. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_LEADER_H
#define GWTF_TRAIN_PEER_LEADER_H

#include "train/peer_internal.h"

/* peer_leader.c */
void data_on_iter_done(train_peer *p, const gw_id *from, const Gwtf__TrainIterDone *d);
void leader_on_leader(train_peer *p, const gw_id *from, const Gwtf__TrainLeader *l);
void leader_check(train_peer *p);
/* A peer we placed into an empty stage found no replica of it: if our view
 * agrees the stage is empty, the run stops (stage.lost). */
void leader_on_stage_lost(train_peer *p, const gw_id *from, const Gwtf__TrainStageLost *m);
void data_report_iteration(train_peer *p);

/* peer_rebalance.c: the leader moves a relay into the bottleneck stage */
void rebalance_on_hello(train_peer *p, const gw_id *from, int stage, double compute_ms, bool joining);
void rebalance_hello_leader(train_peer *p, const Gwtf__TrainHello *h);
void rebalance_on_iteration(train_peer *p);
/* ... and a relay into a stage that lost slots under churn (tun.move_to_short) */
void rebalance_short_stage(train_peer *p);
/* A live relay said within_ms ago, in its HELLO, that it serves `stage`
 * (data nodes keep every relay's latest claim). */
bool rebalance_heard_in_stage(train_peer *p, int stage, uint64_t within_ms);

#endif
