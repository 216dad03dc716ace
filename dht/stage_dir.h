/* dht/stage_dir.h — the stage directory: who serves which stage of which run.
 *
 * Two kinds of DHT keys, each BLAKE2b-256 of its name (gw_id_hash_str):
 *
 *   run/<name>            the run record: opaque bytes (model config, stage
 *                         layout, leader) signed by whoever published them.
 *                         A lookup returns every publisher's record; the
 *                         caller decides whom to trust (the run's creator).
 *   run/<name>/stage/<s>  one record per peer serving stage s: its address
 *                         (the TCP session port and the DHT's UDP port are
 *                         one number), capacity and load, plus opaque extra
 *                         bytes. The member's node ID is the record's
 *                         publisher, so nobody can announce someone else.
 *   run/<name>/replica/<s> one record per peer holding a replica of stage
 *                         s's state (train/peer_replica.c): the same
 *                         member record, its extra bytes saying which
 *                         (train_node.c: iteration, step, weights hash).
 *
 * Announcements are republished by the DHT before they expire until
 * withdrawn; a withdrawal overwrites the record with a tombstone so readers
 * stop seeing it at once. A peer that dies simply stops republishing and its
 * record expires after the record TTL (dht_config.record_ttl_ms).
 *
 * Results come through callbacks run by the DHT's on_message / on_tick, i.e.
 * on the node's loop. Names are 1..STAGE_DIR_NAME_MAX characters of
 * [A-Za-z0-9._-]. */
#ifndef GWTF_DHT_STAGE_DIR_H
#define GWTF_DHT_STAGE_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/dht.h"

#define STAGE_DIR_NAME_MAX (64)
#define STAGE_DIR_KEY_MAX (STAGE_DIR_NAME_MAX + 32) /* "run/<name>/stage/<s>" and its NUL */
#define STAGE_DIR_EXTRA_MAX (256)
/* Relays a record names (a private node advertises one or two). A record
 * with the most relays, IPv6 addresses and the largest extra stays under
 * DHT_MAX_VALUE_BYTES, so a STORE fits the 1200-byte datagram. */
#define STAGE_DIR_MAX_RELAYS (4)

/* A relay a private member holds a reservation on: it is reached at the
 * circuit address id@addr/p2p-circuit/member (p2p/relay.h). */
typedef struct stage_relay {
  gw_id id;
  gw_addr addr;
} stage_relay;

typedef struct stage_member {
  gw_id id;      /* the peer's node ID (the publisher of the record) */
  gw_addr addr;  /* where its sessions and its DHT endpoint listen */
  bool no_direct; /* addr is not dialable (reachability verdict private): use relays */
  stage_relay relays[STAGE_DIR_MAX_RELAYS]; /* in the member's order of preference */
  size_t n_relays;
  uint32_t capacity, load;
  uint64_t remaining_ms; /* until the announcement lapses unless renewed */
  const uint8_t *extra;  /* opaque to the directory; valid during the callback (NULL when empty) */
  size_t extra_len;
} stage_member;

typedef struct stage_run {
  gw_id publisher;
  uint64_t seq, remaining_ms;
  const uint8_t *value; /* valid during the callback */
  size_t len;
} stage_run;

/* status 0 (n may be 0), GW_ECLOSED when the DHT was freed first. */
typedef void (*stage_members_cb)(void *ud, int status, const stage_member *members, size_t n);
typedef void (*stage_runs_cb)(void *ud, int status, const stage_run *runs, size_t n);

/* Keys. GW_EINVAL for a bad name. */
int stage_dir_run_key(const char *run, gw_id *out);
int stage_dir_stage_key(const char *run, uint32_t stage, gw_id *out);
int stage_dir_replica_key(const char *run, uint32_t stage, gw_id *out);
/* Parses "run/NAME" (*stage = -1) or "run/NAME/stage/S". run holds run_len bytes. */
int stage_dir_parse(const char *s, char *run, size_t run_len, int64_t *stage);

/* Announces us in a stage (again: updates capacity, load or extra). me->id
 * is ignored (records carry our own ID); an unspecified IP in me->addr
 * (0.0.0.0 or ::) is replaced by the address other nodes see us at, or
 * GW_EAGAIN when none told us yet (announce again after joining). */
int stage_dir_announce(dht *d, const char *run, uint32_t stage, const stage_member *me, uint64_t now_ms);
int stage_dir_withdraw(dht *d, const char *run, uint32_t stage, uint64_t now_ms);
/* The live members of a stage, ordered by node ID. Undecodable records are skipped. */
int stage_dir_discover(dht *d, const char *run, uint32_t stage, stage_members_cb cb, void *ud,
                       uint64_t now_ms);

/* The replica key's counterparts of announce / withdraw / discover: a holder
 * of a replica of `stage` announces itself there, a restorer looks it up. */
int stage_dir_announce_replica(dht *d, const char *run, uint32_t stage, const stage_member *me, uint64_t now_ms);
int stage_dir_withdraw_replica(dht *d, const char *run, uint32_t stage, uint64_t now_ms);
int stage_dir_discover_replicas(dht *d, const char *run, uint32_t stage, stage_members_cb cb, void *ud,
                                uint64_t now_ms);

int stage_dir_publish_run(dht *d, const char *run, const uint8_t *value, size_t len, uint64_t now_ms);
int stage_dir_find_run(dht *d, const char *run, stage_runs_cb cb, void *ud, uint64_t now_ms);

/* The value encoding of a member record (proto DhtStageMember). Encoding
 * refuses more than STAGE_DIR_MAX_RELAYS relays or a relay without an IP
 * and port (GW_EINVAL / GW_ERANGE). */
int stage_member_encode(const stage_member *m, uint8_t *out, size_t cap, size_t *len);
/* Decodes a record's value; id and remaining_ms are left zero. Relays past
 * STAGE_DIR_MAX_RELAYS and malformed relay entries (bad ID length, IP
 * length, port 0 or > 65535) are skipped. out->extra points into *owned,
 * which the caller frees with stage_member_free_owned (after using extra).
 * GW_EPROTO on an undecodable or invalid record. */
int stage_member_decode(const uint8_t *value, size_t len, stage_member *out, void **owned);
void stage_member_free_owned(void *owned);

#endif
