/* p2p/identity.h — a peer's long-term Ed25519 identity.
 *
 * The node ID is BLAKE2b-256 of the public key, so an ID costs a key pair
 * and cannot be picked to land next to a DHT key. The key file holds the
 * 32-byte seed as hex under a version line; it is created with mode 0600 and
 * refused when group or others can read it. */
#ifndef GWTF_P2P_IDENTITY_H
#define GWTF_P2P_IDENTITY_H

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define P2P_PK_BYTES crypto_sign_PUBLICKEYBYTES /* 32 */
#define P2P_SK_BYTES crypto_sign_SECRETKEYBYTES /* 64 */
#define P2P_SIG_BYTES crypto_sign_BYTES         /* 64 */

typedef struct p2p_identity {
  uint8_t pk[P2P_PK_BYTES];
  uint8_t sk[P2P_SK_BYTES];
  gw_id id;
} p2p_identity;

/* Call once before anything else that uses libsodium. Returns 0 or GW_EIO. */
int p2p_crypto_init(void);

/* A fresh in-memory identity (tests, benchmarks, churned swarm peers). */
void p2p_identity_generate(p2p_identity *out);
/* A deterministic identity from a 32-byte seed (seeded simulations). */
void p2p_identity_from_seed(const uint8_t seed[32], p2p_identity *out);

/* Loads the identity at path, creating it (and its directory) when missing.
 * Refuses, with GW_EPERM, a file that group or others may read; err (may be
 * NULL) then holds a message that tells the user what to run. *created is set
 * when a new key was written. */
int p2p_identity_load_or_create(const char *path, p2p_identity *out, int *created, char *err,
                                size_t err_len);
/* Writes a new identity to path (refusing to overwrite). */
int p2p_identity_create(const char *path, p2p_identity *out, char *err, size_t err_len);

/* Node ID of a public key. */
void p2p_id_from_pk(const uint8_t pk[P2P_PK_BYTES], gw_id *out);

/* Detached signatures with the identity's key. */
void p2p_sign(const p2p_identity *me, const uint8_t *msg, size_t len, uint8_t sig[P2P_SIG_BYTES]);
/* 0 when sig is a valid signature of msg by pk, else GW_EAUTH. */
int p2p_verify(const uint8_t pk[P2P_PK_BYTES], const uint8_t *msg, size_t len,
               const uint8_t sig[P2P_SIG_BYTES]);

void p2p_identity_wipe(p2p_identity *id);

#endif
