/* train/peer_admit.h — who is a member of a private run (issue 17, item 1;
 * train/peer_admit.c): certificates presented and verified, invite tokens
 * redeemed, revocations. trust_admit asks admit_check first. Its state
 * (peer_admit) is in train/peer_internal.h; the cryptography is
 * train/member.h. Internal to train/. */
#ifndef GWTF_TRAIN_PEER_ADMIT_H
#define GWTF_TRAIN_PEER_ADMIT_H

#include "train/peer_internal.h"

/* peer_admit.c: membership of private runs */
/* Whether a message of `type` from `from` passes admission; logs and
 * counts a refusal. Called by trust_admit before the circle check. */
bool admit_check(train_peer *p, const gw_id *from, uint32_t type);
/* Before a message goes to `to`: our certificate first, once per session. */
void admit_before_send(train_peer *p, const gw_id *to, uint32_t type);
/* Whether `id` may be in our views (an open run: everyone). Directory
 * members that may not are remembered as pending. */
bool admit_view_filter(train_peer *p, int stage, const gw_id *id, uint32_t capacity, uint32_t load);
bool admit_is_member(train_peer *p, const gw_id *id);
void admit_on_cert(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c);
void admit_on_redeem(train_peer *p, const gw_id *from, const Gwtf__TrainRedeem *r);
void admit_on_admitted(train_peer *p, const gw_id *from, const Gwtf__TrainCert *c);
void admit_on_revoked(train_peer *p, const gw_id *from, const Gwtf__TrainRevoked *r);
/* Joiners without a certificate redeem their token; holders renew theirs. */
void admit_tick(train_peer *p);
void admit_peer_up(train_peer *p, const gw_id *peer); /* a session came up: our certificate first */
void admit_peer_down(train_peer *p, const gw_id *peer);
void admit_free(train_peer *p);
/* Whether we may take part (open run, or we hold a valid certificate). */
bool admit_ready(train_peer *p);

#endif
