/* node/train_access.h — the driver's side of private runs (issue 17, item
 * 1), for node/train_node.c: what a `gwtf node` keeps in and reads from its
 * data dir (node/run_access.h) on behalf of its training peer
 * (train/peer_admit.c): the run key, the member's own certificate, invite
 * redemptions and the revocation list. Nothing here talks to the network. */
#ifndef GWTF_NODE_TRAIN_ACCESS_H
#define GWTF_NODE_TRAIN_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "train/member.h"
#include "train/peer.h"
#include "util/log.h"

typedef struct train_access {
  const char *data_dir;
  const char *run;               /* set once the run is known */
  bool have_key;                 /* we hold the run key (creator, --run-key) */
  member_key key;
  struct timespec revoked_mtime; /* of DIR/runs/RUN/revoked when we last read or wrote it */
  uint64_t revoked_seq;          /* the sequence number of the list in that file */
} train_access;

/* Makes the peer's run private: run_key, ours to sign with when we hold
 * it, the invite (token may be NULL) and the certificate this node kept,
 * if it verifies. Returns 0 or the peer's error (logged). */
int train_access_setup(train_access *a, train_peer *p, const uint8_t run_key[MEMBER_PK_BYTES],
                       const uint8_t *token, size_t token_len, const gw_log *log);
/* TRAIN_EV_CERTIFIED: keeps our certificate in DIR/runs/RUN/member.cert. */
void train_access_save_cert(const train_access *a, train_peer *p, const gw_log *log);
/* Whether this node kept a certificate for run: a restart needs no invite. */
bool train_access_has_cert(const char *data_dir, const char *run);
/* Holders of the run key, every discovery round: the list `gwtf revoke`
 * wrote goes to the peer (which floods it), and a newer one the peer heard
 * from another holder goes to the file, so `gwtf revoke` here adds to it. */
void train_access_sync_revocations(train_access *a, train_peer *p, uint64_t now_ms, const gw_log *log);
/* train_io.redeem: counts an invite's uses in the data dir. */
int train_access_redeem(const train_access *a, const uint8_t id[MEMBER_INVITE_ID_BYTES], uint32_t uses,
                        const gw_id *peer, const gw_log *log);
void train_access_wipe(train_access *a);

#endif
