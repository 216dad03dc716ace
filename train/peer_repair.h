/* train/peer_repair.h — repairing a backward pass broken by a crash (GWTF
 * §V-D; train/peer_repair.c): RECOVER to the origin, which walks the
 * stored path to re-send around the gap; or, with TRAIN_RECOVER_RESTART
 * (SWARM), the microbatch restarted. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_REPAIR_H
#define GWTF_TRAIN_PEER_REPAIR_H

#include "train/peer_internal.h"

/* peer_repair.c */
void repair_on_recover(train_peer *p, const gw_id *from, const Gwtf__TrainRecover *r);
void repair_begin(train_peer *p, peer_mb *mb, int suspect_stage, const gw_id *target);
void repair_on_probe(train_peer *p, const gw_id *from, const Gwtf__TrainAck *a);
void repair_on_probe_reply(train_peer *p, const gw_id *from, const Gwtf__TrainProbeReply *r);
void repair_on_repair(train_peer *p, const gw_id *from, const Gwtf__TrainRepair *r);
void repair_on_ready(train_peer *p, const gw_id *from, const Gwtf__TrainMicrobatch *m);
void repair_tick(train_peer *p);
/* Data node: `peer` is gone; a walk waiting on its answer steps past it. */
void repair_peer_down(train_peer *p, const gw_id *peer);
void repair_report(train_peer *p, peer_mb *mb);
/* Relay: the peer before us on mb's path is gone before our gradient was
 * due: report the gap now (once). */
void repair_report_early(train_peer *p, peer_mb *mb);
/* Data node: a RECOVER held back (the microbatch was still out, or another
 * break's walk was on) is acted on, if it still fits the path; called once
 * the loss gradient is out and once a repair is taken on. */
void repair_take_pending(train_peer *p, peer_mb *mb);
void repair_restart_timed_out(train_peer *p, peer_mb *mb);
/* Relay: mb's next hop, which we had passed it on to, is gone before any
 * backward came. The peer that hop passed it to may be gone too (churn
 * takes several peers at once): then nobody holds the forward and only the
 * origin's trip deadline, a hop timeout per stage, would notice. We tell
 * the origin (RECOVER, forward), which waits only as long as a forward
 * takes (data_forward_at_risk). The last replacement of a repaired gap
 * reports the same way when the peer after the gap (the repair's target,
 * which was to re-send us its gradient) is gone before that gradient came:
 * the origin repairs past it (repair_on_recover). */
void repair_report_forward(train_peer *p, peer_mb *mb);
/* Data node: an at-risk forward did not come back in time: sent again, as a
 * new attempt, from our embedding. */
void repair_restart_lost_forward(train_peer *p, peer_mb *mb);

#endif
