/* train/member.h — run membership for private runs: the run key, invite
 * tokens, membership certificates and revocation lists (issue 17, item 1).
 *
 * A private run has an Ed25519 key pair, the run key; its creator holds the
 * secret half (a second data node may be given it, `--run-key FILE`). With
 * it a holder signs:
 *   - an invite: run name, run public key, the creator's node ID and
 *     address, an invite ID, an expiry and a use count. Pasted as text,
 *     "gwtf1:" + base64url of a RunToken (proto/train.proto);
 *   - a membership certificate: run, run key, the member's node ID, issue
 *     and expiry times. A peer presents it once per session;
 *   - a revocation list: node IDs that are no longer members, with a
 *     sequence number (a newer list replaces an older one).
 * Every object is a packed protobuf body plus a detached signature over a
 * domain tag and the body, so a signature of one kind never verifies as
 * another, and the bytes verified are the bytes parsed.
 *
 * Pure functions: no sockets, no clock (callers pass unix seconds), no
 * files. Parsers treat their input as hostile: sizes are checked, a bad
 * signature or version is GW_EAUTH / GW_EINVAL, and nothing is kept from
 * input that does not verify. */
#ifndef GWTF_TRAIN_MEMBER_H
#define GWTF_TRAIN_MEMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define MEMBER_PK_BYTES 32
#define MEMBER_SK_BYTES 64
#define MEMBER_SIG_BYTES 64
#define MEMBER_INVITE_ID_BYTES 16
#define MEMBER_RUN_MAX 64
#define MEMBER_ADDR_MAX 255
#define MEMBER_TOKEN_PREFIX "gwtf1:"
/* The longest token text we accept (a real one is ~300 characters). */
#define MEMBER_TOKEN_TEXT_MAX 1024
/* The largest packed certificate (a real one is ~180 bytes). */
#define MEMBER_CERT_MAX 512
/* Revocation lists hold at most this many peers. */
#define MEMBER_MAX_REVOKED 1024

typedef struct member_key {
  uint8_t pk[MEMBER_PK_BYTES];
  uint8_t sk[MEMBER_SK_BYTES];
} member_key;

typedef struct member_invite {
  char run[MEMBER_RUN_MAX + 1];
  uint8_t run_key[MEMBER_PK_BYTES];
  gw_id creator;
  char creator_addr[MEMBER_ADDR_MAX + 1];
  uint8_t id[MEMBER_INVITE_ID_BYTES];
  uint64_t expires; /* unix seconds; 0: never */
  uint32_t uses;    /* 0: unlimited */
} member_invite;

typedef struct member_cert {
  char run[MEMBER_RUN_MAX + 1];
  uint8_t run_key[MEMBER_PK_BYTES];
  gw_id peer;
  uint64_t issued, expires; /* unix seconds */
} member_cert;

typedef struct member_revocations {
  char run[MEMBER_RUN_MAX + 1];
  uint64_t seq;
  gw_id *peers; /* malloc'd; member_revocations_free */
  size_t n;
} member_revocations;

/* A fresh run key. Returns 0 or GW_EIO (libsodium would not start). */
int member_key_generate(member_key *out);
/* The key of a 32-byte seed (key files hold the seed). */
void member_key_from_seed(const uint8_t seed[32], member_key *out);

/* ---- invites ---- */

/* Signs inv with key (inv->run_key must be key's public half) and writes
 * the token text, NUL-terminated, to out. Returns 0, GW_EINVAL (a field out
 * of range, a key that does not match) or GW_ERANGE (out too small). */
int member_token_make(const member_invite *inv, const member_key *key, char *out, size_t out_len);
/* Parses token text (surrounding whitespace allowed) and checks its
 * signature against the run key it carries: the token is its own root of
 * trust, and the holder of the run key checks that key is its own. Expiry
 * and uses are the redeemer's to check. Returns 0, GW_EINVAL or GW_EAUTH. */
int member_token_parse(const char *text, member_invite *out);
/* The same from a packed RunToken (what TRAIN_REDEEM carries). */
int member_token_parse_bin(const uint8_t *buf, size_t len, member_invite *out);
/* The packed RunToken inside token text, malloc'd into *out. */
int member_token_to_bin(const char *text, uint8_t **out, size_t *len);

/* ---- certificates ---- */

/* Signs c (c->run_key must be key's public half); the packed MemberCert is
 * malloc'd into *out. Returns 0, GW_EINVAL or GW_ENOMEM. */
int member_cert_make(const member_cert *c, const member_key *key, uint8_t **out, size_t *len);
/* Parses a packed MemberCert and checks it was signed by run_key for run.
 * Expiry is the caller's to check (member_cert_valid). */
int member_cert_parse(const uint8_t *buf, size_t len, const char *run, const uint8_t run_key[MEMBER_PK_BYTES],
                      member_cert *out);
/* A parsed certificate for peer that has not expired at now_s. */
bool member_cert_valid(const member_cert *c, const gw_id *peer, uint64_t now_s);

/* ---- revocations ---- */

int member_revocations_make(const member_revocations *r, const uint8_t run_key[MEMBER_PK_BYTES],
                            const member_key *key, uint8_t **out, size_t *len);
int member_revocations_parse(const uint8_t *buf, size_t len, const char *run,
                             const uint8_t run_key[MEMBER_PK_BYTES], member_revocations *out);
bool member_revoked(const member_revocations *r, const gw_id *peer);
void member_revocations_free(member_revocations *r);

/* ---- text helpers for the CLI and the run record ---- */

/* "7d", "12h", "30m", "45s" or plain seconds; 0 on success. */
int member_parse_duration(const char *s, uint64_t *seconds);

#endif
