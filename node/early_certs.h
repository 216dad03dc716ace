/* node/early_certs.h — membership certificates that arrived before the
 * training peer existed.
 *
 * A private run's members present their certificate once per session, as
 * its first message (train/peer_admit.c). A node that restarts has its
 * sessions back before it has read the run record and made its training
 * peer: those certificates used to be dropped, the members took them as
 * presented, and their next message reached a peer that did not know them
 * (`run.refused reason=no_certificate` on a member) until it asked for the
 * certificate again. The node keeps the newest one per peer here and hands
 * them to the peer once it exists, before anything else from them.
 *
 *   node_early_certs c = {0};
 *   node_early_certs_keep(&c, from, body, len);     // no peer yet
 *   node_early_certs_replay(&c, give, ud);          // the peer exists
 *   node_early_certs_free(&c);
 */
#ifndef GWTF_NODE_EARLY_CERTS_H
#define GWTF_NODE_EARLY_CERTS_H

#include <stddef.h>
#include <stdint.h>

#include "util/id.h"

#define NODE_EARLY_CERTS_MAX 64     /* peers; more are dropped (they present again when asked) */
#define NODE_EARLY_CERT_BYTES 1024  /* a certificate message is ~200 bytes; larger is not one */

typedef struct node_early_cert {
  gw_id from;
  uint8_t *body;
  size_t len;
} node_early_cert;

typedef struct node_early_certs {
  node_early_cert v[NODE_EARLY_CERTS_MAX];
  size_t n;
} node_early_certs;

/* Keeps a copy of body as from's newest certificate message. Returns 0, or
 * GW_EFULL / GW_EINVAL (too large) / GW_ENOMEM, when it keeps nothing. */
int node_early_certs_keep(node_early_certs *c, const gw_id *from, const uint8_t *body, size_t len);
/* Calls give for each kept message, oldest peer first, then forgets them. */
void node_early_certs_replay(node_early_certs *c, void (*give)(void *ud, const gw_id *from, const uint8_t *body,
                                                                size_t len),
                             void *ud);
void node_early_certs_free(node_early_certs *c);

#endif
