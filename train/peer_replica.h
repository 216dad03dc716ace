/* train/peer_replica.h — stage replicas: a stage's state outlives its peers
 * (issue 18, items 1 and 2; train/peer_replica.c: pushed to holders outside
 * the stage, restored into an empty one); and stage 0 outliving its data
 * nodes (item 4; train/peer_stage0.c). Their state (peer_replicas) is in
 * train/peer_internal.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_REPLICA_H
#define GWTF_TRAIN_PEER_REPLICA_H

#include "train/peer_internal.h"

/* peer_replica.c */
void replica_on_push(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const train_tensor *t);
void replica_on_req(train_peer *p, const gw_id *from, const Gwtf__TrainReplicaReq *r);
void replica_tick(train_peer *p);
void replica_free(train_peer *p);
/* Restorer: a holder of our stage's newest replica we have not tried; false when none. */
bool replica_next_holder(train_peer *p, gw_id *out);

/* peer_stage0.c: stage 0 outlives its data nodes. */
bool stage0_trained(train_peer *p);
bool stage0_fetch(train_peer *p);
void stage0_on_hello(train_peer *p, const gw_id *from, const Gwtf__TrainHello *h);
void stage0_tick(train_peer *p);

#endif
