/* test/fuzz/fuzz_member_lib.c — the private-run parsers (train/member.h):
 * invite tokens, membership certificates and revocation lists
 * (fuzz_targets.h: fuzz_member_token, fuzz_member_cert). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_targets.h"
#include "train/member.h"

void fuzz_member_key(member_key *k) {
  uint8_t seed[32];
  memset(seed, 0x42, sizeof(seed));
  member_key_from_seed(seed, k);
}

/* Input bytes as fields, for the round trips: take n bytes (zeros past the end). */
static void take(const uint8_t **p, size_t *left, void *out, size_t n) {
  size_t k = *left < n ? *left : n;
  memset(out, 0, n);
  memcpy(out, *p, k);
  *p += k;
  *left -= k;
}

/* A printable name of 1..MEMBER_RUN_MAX characters from the input. */
static void take_name(const uint8_t **p, size_t *left, char *out, size_t cap, size_t max) {
  uint8_t n = 0;
  take(p, left, &n, 1);
  size_t len = 1 + n % max;
  if (len >= cap) len = cap - 1;
  for (size_t i = 0; i < len; i++) {
    uint8_t c = 0;
    take(p, left, &c, 1);
    out[i] = (char)(' ' + c % 95);
  }
  out[len] = '\0';
}

int fuzz_member_token(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  member_invite inv, again;
  const uint8_t *p = data + 1;
  size_t left = size - 1;
  switch (data[0] % 3) {
  case 0: { /* token text, as pasted */
    char text[MEMBER_TOKEN_TEXT_MAX + 64];
    size_t n = left < sizeof(text) - 1 ? left : sizeof(text) - 1;
    memcpy(text, p, n);
    text[n] = '\0';
    if (member_token_parse(text, &inv) == 0 && (strlen(inv.run) == 0 || strlen(inv.run) > MEMBER_RUN_MAX)) abort();
    uint8_t *bin = NULL;
    size_t len = 0;
    if (member_token_to_bin(text, &bin, &len) == 0) free(bin);
    return 0;
  }
  case 1: /* a packed RunToken, as TRAIN_REDEEM carries it */
    if (member_token_parse_bin(p, left, &inv) == 0 && (strlen(inv.run) == 0 || strlen(inv.run) > MEMBER_RUN_MAX))
      abort();
    return 0;
  default: { /* fields: made, printed, parsed back: the same invite */
    member_key k;
    fuzz_member_key(&k);
    memset(&inv, 0, sizeof(inv));
    take_name(&p, &left, inv.run, sizeof(inv.run), MEMBER_RUN_MAX);
    take_name(&p, &left, inv.creator_addr, sizeof(inv.creator_addr), 64);
    memcpy(inv.run_key, k.pk, sizeof(inv.run_key));
    take(&p, &left, inv.creator.b, sizeof(inv.creator.b));
    take(&p, &left, inv.id, sizeof(inv.id));
    take(&p, &left, &inv.expires, sizeof(inv.expires));
    take(&p, &left, &inv.uses, sizeof(inv.uses));
    char text[MEMBER_TOKEN_TEXT_MAX];
    if (member_token_make(&inv, &k, text, sizeof(text)) != 0) return 0;
    if (member_token_parse(text, &again) != 0 || memcmp(&inv, &again, sizeof(inv)) != 0) {
      fprintf(stderr, "fuzz_member_token: a token did not parse back to its invite: %s\n", text);
      abort();
    }
    return 0;
  }
  }
}

int fuzz_member_cert(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  member_key k;
  fuzz_member_key(&k);
  const uint8_t *p = data + 1;
  size_t left = size - 1;
  member_cert c, again;
  member_revocations r, r2;
  switch (data[0] % 4) {
  case 0: /* a certificate as TRAIN_CERT carries it */
    if (member_cert_parse(p, left, NULL, k.pk, &c) == 0) member_cert_valid(&c, &c.peer, 0);
    member_cert_parse(p, left, "fuzz", k.pk, &c);
    return 0;
  case 1: /* a revocation list as TRAIN_REVOKED (or the data dir) carries it */
    if (member_revocations_parse(p, left, NULL, k.pk, &r) == 0) {
      if (r.n > MEMBER_MAX_REVOKED) abort();
      for (size_t i = 0; i < r.n; i++) member_revoked(&r, &r.peers[i]);
      member_revocations_free(&r);
    }
    return 0;
  case 2: { /* fields: made, parsed back: the same certificate */
    memset(&c, 0, sizeof(c));
    take_name(&p, &left, c.run, sizeof(c.run), MEMBER_RUN_MAX);
    memcpy(c.run_key, k.pk, sizeof(c.run_key));
    take(&p, &left, c.peer.b, sizeof(c.peer.b));
    take(&p, &left, &c.issued, sizeof(c.issued));
    take(&p, &left, &c.expires, sizeof(c.expires));
    uint8_t *buf = NULL;
    size_t len = 0;
    if (member_cert_make(&c, &k, &buf, &len) != 0) return 0;
    int rc = member_cert_parse(buf, len, c.run, k.pk, &again);
    free(buf);
    /* a certificate that expires before it is issued is refused by design */
    if (c.expires >= c.issued && (rc != 0 || memcmp(&c, &again, sizeof(c)) != 0)) abort();
    if (c.expires < c.issued && rc == 0) abort();
    return 0;
  }
  default: { /* a revocation list from fields, parsed back */
    memset(&r, 0, sizeof(r));
    take_name(&p, &left, r.run, sizeof(r.run), MEMBER_RUN_MAX);
    take(&p, &left, &r.seq, sizeof(r.seq));
    gw_id ids[16];
    uint8_t n = 0;
    take(&p, &left, &n, 1);
    r.n = n % 17;
    for (size_t i = 0; i < r.n; i++) take(&p, &left, ids[i].b, sizeof(ids[i].b));
    r.peers = ids;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (member_revocations_make(&r, k.pk, &k, &buf, &len) != 0) return 0;
    int rc = member_revocations_parse(buf, len, r.run, k.pk, &r2);
    free(buf);
    if (rc != 0 || r2.n != r.n || r2.seq != r.seq || (r.n && memcmp(r2.peers, ids, r.n * sizeof(gw_id)) != 0)) abort();
    member_revocations_free(&r2);
    return 0;
  }
  }
}
