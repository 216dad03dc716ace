/* train/avg_sig.h — the aggregator's signature over a stage's average
 * (issue 17, item 3).
 *
 * An average often reaches a member through another peer: an aggregator
 * that deferred passes the lower one's average on, a member answers a late
 * member or a takeover with the average it applied, a member that served
 * its state sends the round's average to the joiner. The aggregator signs
 * the average with its node identity key (Ed25519, p2p/identity.h), and the
 * signature travels unchanged with every copy, so a member can tell the
 * average it got is the one that aggregator produced, whoever delivered it.
 *
 * The signed body (little-endian integers), in this order:
 *   "gwtf-avg-v1\0"                      domain tag: a signature of another kind never verifies as this one
 *   run_id[32]                           the run (train_peer_config.run_id)
 *   stage u32, iteration u64, total_count u32
 *   n_floats u64                         the length of the averaged vector (0: a skipped step)
 *   n u32, then n x (node ID[32], hash[32])   the contributors in the order averaged, with the
 *                                        BLAKE2b-256 of the floats each one contributed
 *   avg_hash[32]                         BLAKE2b-256 of the averaged floats (of no bytes for a skipped step)
 * The signer is named by its public key, which it carries: its node ID is
 * BLAKE2b-256 of that key, so a receiver checks the key against the ID it
 * expects, with nothing else to look up.
 *
 * Pure functions: no clock, no peer state. */
#ifndef GWTF_TRAIN_AVG_SIG_H
#define GWTF_TRAIN_AVG_SIG_H

#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define AVG_SIG_KEY_BYTES 32
#define AVG_SIG_BYTES 64
#define AVG_SIG_HASH_BYTES 32
#define AVG_SIG_TAG "gwtf-avg-v1"
/* Contributors one signed body can list (train/peer_internal.h's PEER_MAX_CONTRIB). */
#define AVG_SIG_MAX_CONTRIB 64
/* The body's size for n contributors. */
#define AVG_SIG_BODY_BYTES(n) ((sizeof(AVG_SIG_TAG)) + 32 + 4 + 8 + 4 + 8 + 4 + (size_t)(n) * 64 + 32)

/* What the aggregator signs: the average's identity, not its floats (their
 * hash stands for them). */
typedef struct avg_sig_fields {
  const uint8_t *run_id; /* 32 bytes */
  int32_t stage;
  uint64_t iteration;
  uint32_t total_count;
  uint64_t n_floats;
  const gw_id *contributors;
  const uint8_t (*hashes)[32]; /* one per contributor (NULL: all zero) */
  uint32_t n_contributors;
  const uint8_t *avg_hash; /* 32 bytes */
} avg_sig_fields;

/* Writes the signed body into out (AVG_SIG_BODY_BYTES(n) bytes at least).
 * Returns its length, or 0 when out is too small or n is over the limit. */
size_t avg_sig_body(const avg_sig_fields *f, uint8_t *out, size_t cap);

/* BLAKE2b-256 of n floats as they travel (their bytes). */
void avg_sig_hash_floats(const float *v, size_t n, uint8_t out[AVG_SIG_HASH_BYTES]);

/* Signs the body of f with a 64-byte Ed25519 secret key. Returns 0 or
 * GW_EINVAL (too many contributors). */
int avg_sig_sign(const avg_sig_fields *f, const uint8_t sk[64], uint8_t sig[AVG_SIG_BYTES]);

/* 0 when sig is pk's signature of f's body, else GW_EAUTH (GW_EINVAL: too
 * many contributors). */
int avg_sig_verify(const avg_sig_fields *f, const uint8_t pk[AVG_SIG_KEY_BYTES], const uint8_t sig[AVG_SIG_BYTES]);

/* The node ID a signer's key stands for. */
void avg_sig_signer_id(const uint8_t pk[AVG_SIG_KEY_BYTES], gw_id *out);

#endif
