/* node/early_certs.c — see early_certs.h. */
#include "node/early_certs.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

int node_early_certs_keep(node_early_certs *c, const gw_id *from, const uint8_t *body, size_t len) {
  if (len == 0 || len > NODE_EARLY_CERT_BYTES) return GW_EINVAL;
  size_t k = 0;
  while (k < c->n && !gw_id_eq(&c->v[k].from, from)) k++;
  if (k == NODE_EARLY_CERTS_MAX) return GW_EFULL;
  uint8_t *copy = malloc(len);
  if (!copy) return GW_ENOMEM;
  memcpy(copy, body, len);
  if (k == c->n) {
    c->v[k].from = *from;
    c->n++;
  } else {
    free(c->v[k].body); /* a newer one from the same peer: it replaces the first */
  }
  c->v[k].body = copy;
  c->v[k].len = len;
  return 0;
}

void node_early_certs_replay(node_early_certs *c, void (*give)(void *ud, const gw_id *from, const uint8_t *body,
                                                                size_t len),
                             void *ud) {
  for (size_t k = 0; k < c->n; k++) give(ud, &c->v[k].from, c->v[k].body, c->v[k].len);
  node_early_certs_free(c);
}

void node_early_certs_free(node_early_certs *c) {
  for (size_t k = 0; k < c->n; k++) free(c->v[k].body);
  c->n = 0;
}
