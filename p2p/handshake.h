/* p2p/handshake.h — the authenticated key exchange that opens every session.
 *
 * A pure state machine: bytes in, bytes out, no sockets, so tests and fuzzers
 * drive it directly. Three fixed-size messages (docs/P2P.md has the layout):
 *
 *   msg1  I -> R   magic, version, ephemeral X25519 key e_I                 (40 B)
 *   msg2  R -> I   magic, version, e_R, static Ed25519 key S_R,
 *                  sig_R = Sign(S_R, H("responder" | msg1 | msg2 before sig)) (136 B)
 *   msg3  I -> R   S_I, sig_I = Sign(S_I, H("initiator" | msg1 | msg2 | S_I))  (96 B)
 *
 * Each signature covers both ephemeral keys, so it cannot be replayed into
 * another handshake, and the signer's own static key, so a relay cannot
 * swap identities. The session keys are crypto_kx keys of the two ephemeral
 * keys (forward secrecy: the static keys only sign), then each is bound to
 * the whole transcript with a keyed BLAKE2b: a man in the middle who rewrote
 * any byte ends up with keys that open nothing. The dialler checks the node
 * ID behind S_R when it knows whom it meant to reach.
 *
 * Usage (initiator):   p2p_hs_init(.., P2P_INITIATOR, ..); p2p_hs_start(-> msg1);
 *                      p2p_hs_read(msg2 -> msg3); p2p_hs_done() is true.
 * Usage (responder):   p2p_hs_init(.., P2P_RESPONDER, ..);
 *                      p2p_hs_read(msg1 -> msg2); p2p_hs_read(msg3); done.
 * p2p_hs_want() says how many bytes the next p2p_hs_read() consumes. */
#ifndef GWTF_P2P_HANDSHAKE_H
#define GWTF_P2P_HANDSHAKE_H

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "p2p/identity.h"
#include "util/id.h"

#define P2P_HS_VERSION (1)
#define P2P_HS_PREFIX_BYTES (8) /* "GWTF", version, suite, 2 reserved bytes */
#define P2P_HS_EPH_BYTES (crypto_kx_PUBLICKEYBYTES)
#define P2P_HS_MSG1_BYTES (P2P_HS_PREFIX_BYTES + P2P_HS_EPH_BYTES)                                   /* 40 */
#define P2P_HS_MSG2_BYTES (P2P_HS_PREFIX_BYTES + P2P_HS_EPH_BYTES + P2P_PK_BYTES + P2P_SIG_BYTES)   /* 136 */
#define P2P_HS_MSG3_BYTES (P2P_PK_BYTES + P2P_SIG_BYTES)                                          /* 96 */
#define P2P_HS_MAX_MSG_BYTES (P2P_HS_MSG2_BYTES)
#define P2P_SESSION_KEY_BYTES (32)

typedef enum p2p_role { P2P_INITIATOR = 0, P2P_RESPONDER = 1 } p2p_role;

typedef struct p2p_handshake {
  p2p_role role;
  int step; /* private */
  const p2p_identity *me;
  bool has_expect;
  gw_id expect;
  uint8_t eph_pk[crypto_kx_PUBLICKEYBYTES];
  uint8_t eph_sk[crypto_kx_SECRETKEYBYTES];
  uint8_t msg1[P2P_HS_MSG1_BYTES]; /* transcript */
  uint8_t msg2[P2P_HS_MSG2_BYTES];
  /* Results, valid once p2p_hs_done(). */
  uint8_t peer_pk[P2P_PK_BYTES];
  gw_id peer_id;
  uint8_t tx_key[P2P_SESSION_KEY_BYTES];
  uint8_t rx_key[P2P_SESSION_KEY_BYTES];
  uint8_t session_hash[32]; /* BLAKE2b-256 of the transcript: same on both ends */
  /* Why the last p2p_hs_read failed: a short token for the log's reason=. */
  const char *why;
} p2p_handshake;

/* expect (may be NULL) is the node ID an initiator means to reach; a
 * responder ignores it. me must outlive the handshake. */
void p2p_hs_init(p2p_handshake *hs, p2p_role role, const p2p_identity *me, const gw_id *expect);
/* Initiator: writes msg1 (P2P_HS_MSG1_BYTES) to out. */
void p2p_hs_start(p2p_handshake *hs, uint8_t out[P2P_HS_MSG1_BYTES]);
/* Bytes the next p2p_hs_read consumes; 0 when done. */
size_t p2p_hs_want(const p2p_handshake *hs);
/* Consumes exactly p2p_hs_want() bytes from in. When this side must answer,
 * the answer is written to out (room for P2P_HS_MAX_MSG_BYTES) and its size
 * to *out_len (else 0). Returns 0, or with hs->why set:
 *   GW_EPROTO  bad magic, version or key ("bad-magic", "version", "bad-key")
 *   GW_EAUTH   a signature does not verify ("bad-signature")
 *   GW_EPERM   the responder is not the node we meant to reach
 *              ("unexpected-id"), or it is ourselves ("self"). */
int p2p_hs_read(p2p_handshake *hs, const uint8_t *in, uint8_t *out, size_t *out_len);
bool p2p_hs_done(const p2p_handshake *hs);
/* Erases every secret (ephemeral key, session keys). */
void p2p_hs_wipe(p2p_handshake *hs);

#endif
