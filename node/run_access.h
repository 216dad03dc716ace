/* node/run_access.h — a private run's files in the data dir (issue 17,
 * item 1), shared by `gwtf node`, `gwtf invite` and `gwtf revoke`:
 *
 *   DIR/runs/NAME/run.key        the run key (an Ed25519 seed, the identity
 *                                key file format, mode 0600); created by
 *                                --create-run, never leaves the machine
 *                                (copy it yourself for --run-key FILE)
 *   DIR/runs/NAME/redeemed       one line per redemption, "INVITE PEER" in
 *                                hex: the leader counts an invite's uses
 *   DIR/runs/NAME/revoked        the signed revocation list (packed
 *                                RunRevocations), replaced by `gwtf revoke`;
 *                                a running holder of the key picks it up
 *   DIR/runs/NAME/creator.addr   where the creator listens (HOST:PORT), for
 *                                the invites `gwtf invite` prints
 *   DIR/runs/NAME/member.cert    a member's own certificate (node/train_node.c):
 *                                a restart presents it, no invite needed
 * Every file is written atomically (util/file.h). */
#ifndef GWTF_NODE_RUN_ACCESS_H
#define GWTF_NODE_RUN_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/member.h"

/* DIR/runs/NAME/FILE into out (FILE may be NULL: the directory). */
void run_access_path(const char *data_dir, const char *run, const char *file, char *out, size_t len);
/* Loads the run key at path; creates it (and its directory) when create is
 * set and it is missing. Returns 0 or an error with a sentence in err. */
int run_access_load_key(const char *path, bool create, member_key *out, char *err, size_t err_len);
/* `peer` redeems invite `id` (uses 0: unlimited). 0 when it may (a peer
 * that redeemed it before counts once), GW_EFULL when used up. */
int run_access_redeem(const char *data_dir, const char *run, const uint8_t id[MEMBER_INVITE_ID_BYTES],
                      uint32_t uses, const gw_id *peer);
/* The peers that redeemed invites (for `gwtf revoke` by ID prefix). */
int run_access_redeemers(const char *data_dir, const char *run, gw_id *out, size_t max, size_t *n);
/* The revocation list file, malloc'd; GW_ENOENT when there is none. */
int run_access_read_revocations(const char *data_dir, const char *run, uint8_t **buf, size_t *len);
/* Adds peer to the signed list (seq + 1) and writes it. *seq, *n: the new
 * list's sequence number and size. */
int run_access_revoke(const char *data_dir, const char *run, const member_key *key, const gw_id *peer,
                      uint64_t *seq, size_t *n, char *err, size_t err_len);
int run_access_write_addr(const char *data_dir, const char *run, const char *addr);
int run_access_read_addr(const char *data_dir, const char *run, char *out, size_t len);

#endif
