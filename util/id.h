/* util/id.h — 256-bit node IDs and DHT keys.
 *
 * A node ID is BLAKE2b-256 of the node's Ed25519 public key (p2p/identity.h),
 * so a peer cannot pick its position in the DHT. DHT keys are BLAKE2b-256 of
 * their string name ("run/NAME/stage/S"). */
#ifndef GWTF_UTIL_ID_H
#define GWTF_UTIL_ID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_ID_BYTES 32
#define GW_ID_HEX_LEN (2 * GW_ID_BYTES)
#define GW_ID_SHORT_LEN 8 /* hex digits in log lines */

typedef struct gw_id {
  uint8_t b[GW_ID_BYTES];
} gw_id;

bool gw_id_eq(const gw_id *a, const gw_id *b);
/* memcmp order: used for "lowest node ID" elections and sorting. */
int gw_id_cmp(const gw_id *a, const gw_id *b);
bool gw_id_is_zero(const gw_id *a);

/* Writes GW_ID_HEX_LEN hex digits and a NUL: out must hold GW_ID_HEX_LEN + 1. */
void gw_id_to_hex(const gw_id *id, char *out);
/* Writes the first GW_ID_SHORT_LEN hex digits and a NUL. */
void gw_id_to_short(const gw_id *id, char *out);
/* Parses exactly GW_ID_HEX_LEN hex digits. Returns 0 or GW_EINVAL. */
int gw_id_from_hex(const char *hex, gw_id *out);
/* BLAKE2b-256 of a byte string (DHT keys, hashes of public keys). */
void gw_id_hash(const void *data, size_t len, gw_id *out);
/* BLAKE2b-256 of a NUL-terminated string: gw_id_hash_str("run/x") is a DHT key. */
void gw_id_hash_str(const char *s, gw_id *out);

#endif
