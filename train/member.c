/* train/member.c — see member.h. */
#include "train/member.h"

#include <ctype.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.pb-c.h"
#include "util/err.h"

#define MEMBER_VERSION 1
/* Domain tags: a signature over one kind of body never verifies as another. */
static const char TAG_INVITE[] = "gwtf-invite-v1";
static const char TAG_CERT[] = "gwtf-cert-v1";
static const char TAG_REVOKE[] = "gwtf-revoke-v1";
/* A packed invite is small; anything larger is not one of ours. */
#define INVITE_BODY_MAX 512
#define REVOKE_BODY_MAX (MEMBER_MAX_REVOKED * (GW_ID_BYTES + 2) + 128)

int member_key_generate(member_key *out) {
  if (sodium_init() < 0) return GW_EIO;
  crypto_sign_keypair(out->pk, out->sk);
  return 0;
}

void member_key_from_seed(const uint8_t seed[32], member_key *out) {
  crypto_sign_seed_keypair(out->pk, out->sk, seed);
}

/* Signs tag || body. */
static void sign(const char *tag, const uint8_t *body, size_t len, const member_key *key, uint8_t sig[64]) {
  crypto_sign_state st;
  crypto_sign_init(&st);
  crypto_sign_update(&st, (const uint8_t *)tag, strlen(tag) + 1);
  crypto_sign_update(&st, body, len);
  crypto_sign_final_create(&st, sig, NULL, key->sk);
}

static int verify(const char *tag, const uint8_t *body, size_t len, const uint8_t *sig, size_t sig_len,
                  const uint8_t pk[32]) {
  if (sig_len != MEMBER_SIG_BYTES) return GW_EINVAL;
  crypto_sign_state st;
  crypto_sign_init(&st);
  crypto_sign_update(&st, (const uint8_t *)tag, strlen(tag) + 1);
  crypto_sign_update(&st, body, len);
  return crypto_sign_final_verify(&st, sig, pk) == 0 ? 0 : GW_EAUTH;
}

static bool run_ok(const char *run) {
  size_t n = run ? strlen(run) : 0;
  return n > 0 && n <= MEMBER_RUN_MAX;
}

/* Packs body and its signature into a {bytes body = 1; bytes sig = 2;}
 * message (RunToken, MemberCert and RunRevocations share that shape). */
static int pack_signed(const ProtobufCMessage *body, const char *tag, const member_key *key, uint8_t **out,
                       size_t *len) {
  size_t blen = protobuf_c_message_get_packed_size(body);
  uint8_t *b = malloc(blen ? blen : 1);
  if (!b) return GW_ENOMEM;
  protobuf_c_message_pack(body, b);
  uint8_t sig[MEMBER_SIG_BYTES];
  sign(tag, b, blen, key, sig);
  Gwtf__MemberCert m = GWTF__MEMBER_CERT__INIT; /* same field numbers as RunToken, RunRevocations */
  m.body = (ProtobufCBinaryData){blen, b};
  m.sig = (ProtobufCBinaryData){sizeof(sig), sig};
  *len = gwtf__member_cert__get_packed_size(&m);
  *out = malloc(*len);
  if (!*out) {
    free(b);
    return GW_ENOMEM;
  }
  gwtf__member_cert__pack(&m, *out);
  free(b);
  return 0;
}

/* ---- invites ---- */

static int invite_bin(const member_invite *inv, const member_key *key, uint8_t **out, size_t *len) {
  if (!run_ok(inv->run) || strlen(inv->creator_addr) > MEMBER_ADDR_MAX ||
      memcmp(inv->run_key, key->pk, MEMBER_PK_BYTES) != 0)
    return GW_EINVAL;
  Gwtf__RunInvite m = GWTF__RUN_INVITE__INIT;
  m.version = MEMBER_VERSION;
  m.run = (char *)inv->run;
  m.run_key = (ProtobufCBinaryData){MEMBER_PK_BYTES, (uint8_t *)inv->run_key};
  m.creator = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)inv->creator.b};
  m.creator_addr = (char *)inv->creator_addr;
  m.invite_id = (ProtobufCBinaryData){MEMBER_INVITE_ID_BYTES, (uint8_t *)inv->id};
  m.expires = inv->expires;
  m.uses = inv->uses;
  return pack_signed(&m.base, TAG_INVITE, key, out, len);
}

int member_token_make(const member_invite *inv, const member_key *key, char *out, size_t out_len) {
  uint8_t *bin = NULL;
  size_t len = 0;
  int rc = invite_bin(inv, key, &bin, &len);
  if (rc != 0) return rc;
  size_t pre = strlen(MEMBER_TOKEN_PREFIX);
  size_t need = pre + sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
  if (need > out_len) {
    free(bin);
    return GW_ERANGE;
  }
  memcpy(out, MEMBER_TOKEN_PREFIX, pre);
  sodium_bin2base64(out + pre, out_len - pre, bin, len, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
  free(bin);
  return 0;
}

int member_token_to_bin(const char *text, uint8_t **out, size_t *len) {
  if (!text) return GW_EINVAL;
  while (isspace((unsigned char)*text)) text++;
  size_t n = strnlen(text, MEMBER_TOKEN_TEXT_MAX + 1), pre = strlen(MEMBER_TOKEN_PREFIX);
  if (n > MEMBER_TOKEN_TEXT_MAX || n < pre || strncmp(text, MEMBER_TOKEN_PREFIX, pre) != 0) return GW_EINVAL;
  while (n > pre && isspace((unsigned char)text[n - 1])) n--;
  size_t cap = (n - pre) * 3 / 4 + 3;
  uint8_t *bin = malloc(cap);
  if (!bin) return GW_ENOMEM;
  size_t got = 0;
  const char *end = NULL;
  if (sodium_base642bin(bin, cap, text + pre, n - pre, NULL, &got, &end, sodium_base64_VARIANT_URLSAFE_NO_PADDING) !=
          0 ||
      end != text + n) {
    free(bin);
    return GW_EINVAL;
  }
  *out = bin;
  *len = got;
  return 0;
}

int member_token_parse_bin(const uint8_t *buf, size_t len, member_invite *out) {
  memset(out, 0, sizeof(*out));
  if (len > INVITE_BODY_MAX + 128) return GW_EINVAL;
  Gwtf__RunToken *t = gwtf__run_token__unpack(NULL, len, buf);
  if (!t) return GW_EINVAL;
  int rc = GW_EINVAL;
  Gwtf__RunInvite *m = NULL;
  if (t->invite.len > INVITE_BODY_MAX) goto out;
  m = gwtf__run_invite__unpack(NULL, t->invite.len, t->invite.data);
  if (!m || m->version != MEMBER_VERSION || !run_ok(m->run) || m->run_key.len != MEMBER_PK_BYTES ||
      m->creator.len != GW_ID_BYTES || strlen(m->creator_addr) > MEMBER_ADDR_MAX ||
      m->invite_id.len != MEMBER_INVITE_ID_BYTES)
    goto out;
  rc = verify(TAG_INVITE, t->invite.data, t->invite.len, t->sig.data, t->sig.len, m->run_key.data);
  if (rc != 0) goto out;
  snprintf(out->run, sizeof(out->run), "%s", m->run);
  memcpy(out->run_key, m->run_key.data, MEMBER_PK_BYTES);
  memcpy(out->creator.b, m->creator.data, GW_ID_BYTES);
  snprintf(out->creator_addr, sizeof(out->creator_addr), "%s", m->creator_addr);
  memcpy(out->id, m->invite_id.data, MEMBER_INVITE_ID_BYTES);
  out->expires = m->expires;
  out->uses = m->uses;
out:
  if (m) gwtf__run_invite__free_unpacked(m, NULL);
  gwtf__run_token__free_unpacked(t, NULL);
  if (rc != 0) memset(out, 0, sizeof(*out));
  return rc;
}

int member_token_parse(const char *text, member_invite *out) {
  uint8_t *bin = NULL;
  size_t len = 0;
  memset(out, 0, sizeof(*out));
  int rc = member_token_to_bin(text, &bin, &len);
  if (rc != 0) return rc;
  rc = member_token_parse_bin(bin, len, out);
  free(bin);
  return rc;
}

/* ---- certificates ---- */

int member_cert_make(const member_cert *c, const member_key *key, uint8_t **out, size_t *len) {
  if (!run_ok(c->run) || memcmp(c->run_key, key->pk, MEMBER_PK_BYTES) != 0) return GW_EINVAL;
  Gwtf__MemberCertBody m = GWTF__MEMBER_CERT_BODY__INIT;
  m.version = MEMBER_VERSION;
  m.run = (char *)c->run;
  m.run_key = (ProtobufCBinaryData){MEMBER_PK_BYTES, (uint8_t *)c->run_key};
  m.peer = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)c->peer.b};
  m.issued = c->issued;
  m.expires = c->expires;
  return pack_signed(&m.base, TAG_CERT, key, out, len);
}

int member_cert_parse(const uint8_t *buf, size_t len, const char *run, const uint8_t run_key[MEMBER_PK_BYTES],
                      member_cert *out) {
  memset(out, 0, sizeof(*out));
  if (len > MEMBER_CERT_MAX) return GW_EINVAL;
  Gwtf__MemberCert *c = gwtf__member_cert__unpack(NULL, len, buf);
  if (!c) return GW_EINVAL;
  Gwtf__MemberCertBody *m = NULL;
  /* the signature first: nothing of an unsigned body is even parsed */
  int rc = verify(TAG_CERT, c->body.data, c->body.len, c->sig.data, c->sig.len, run_key);
  if (rc != 0) goto out;
  rc = GW_EINVAL;
  m = gwtf__member_cert_body__unpack(NULL, c->body.len, c->body.data);
  if (!m || m->version != MEMBER_VERSION || !run_ok(m->run) || (run && strcmp(m->run, run) != 0) ||
      m->run_key.len != MEMBER_PK_BYTES || memcmp(m->run_key.data, run_key, MEMBER_PK_BYTES) != 0 ||
      m->peer.len != GW_ID_BYTES || m->expires < m->issued)
    goto out;
  snprintf(out->run, sizeof(out->run), "%s", m->run);
  memcpy(out->run_key, run_key, MEMBER_PK_BYTES);
  memcpy(out->peer.b, m->peer.data, GW_ID_BYTES);
  out->issued = m->issued;
  out->expires = m->expires;
  rc = 0;
out:
  if (m) gwtf__member_cert_body__free_unpacked(m, NULL);
  gwtf__member_cert__free_unpacked(c, NULL);
  if (rc != 0) memset(out, 0, sizeof(*out));
  return rc;
}

bool member_cert_valid(const member_cert *c, const gw_id *peer, uint64_t now_s) {
  return gw_id_eq(&c->peer, peer) && now_s < c->expires;
}

/* ---- revocations ---- */

int member_revocations_make(const member_revocations *r, const uint8_t run_key[MEMBER_PK_BYTES],
                            const member_key *key, uint8_t **out, size_t *len) {
  if (!run_ok(r->run) || r->n > MEMBER_MAX_REVOKED || memcmp(run_key, key->pk, MEMBER_PK_BYTES) != 0)
    return GW_EINVAL;
  Gwtf__RunRevocationsBody m = GWTF__RUN_REVOCATIONS_BODY__INIT;
  ProtobufCBinaryData *ids = calloc(r->n ? r->n : 1, sizeof(*ids));
  if (!ids) return GW_ENOMEM;
  for (size_t i = 0; i < r->n; i++) ids[i] = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)r->peers[i].b};
  m.version = MEMBER_VERSION;
  m.run = (char *)r->run;
  m.seq = r->seq;
  m.n_peers = r->n;
  m.peers = ids;
  int rc = pack_signed(&m.base, TAG_REVOKE, key, out, len);
  free(ids);
  return rc;
}

int member_revocations_parse(const uint8_t *buf, size_t len, const char *run,
                             const uint8_t run_key[MEMBER_PK_BYTES], member_revocations *out) {
  memset(out, 0, sizeof(*out));
  if (len > REVOKE_BODY_MAX + 128) return GW_EINVAL;
  Gwtf__RunRevocations *c = gwtf__run_revocations__unpack(NULL, len, buf);
  if (!c) return GW_EINVAL;
  Gwtf__RunRevocationsBody *m = NULL;
  int rc = verify(TAG_REVOKE, c->body.data, c->body.len, c->sig.data, c->sig.len, run_key);
  if (rc != 0) goto out;
  rc = GW_EINVAL;
  m = gwtf__run_revocations_body__unpack(NULL, c->body.len, c->body.data);
  if (!m || m->version != MEMBER_VERSION || !run_ok(m->run) || (run && strcmp(m->run, run) != 0) ||
      m->n_peers > MEMBER_MAX_REVOKED)
    goto out;
  out->peers = calloc(m->n_peers ? m->n_peers : 1, sizeof(gw_id));
  if (!out->peers) {
    rc = GW_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < m->n_peers; i++) {
    if (m->peers[i].len != GW_ID_BYTES) goto out;
    memcpy(out->peers[out->n++].b, m->peers[i].data, GW_ID_BYTES);
  }
  snprintf(out->run, sizeof(out->run), "%s", m->run);
  out->seq = m->seq;
  rc = 0;
out:
  if (m) gwtf__run_revocations_body__free_unpacked(m, NULL);
  gwtf__run_revocations__free_unpacked(c, NULL);
  if (rc != 0) member_revocations_free(out);
  return rc;
}

bool member_revoked(const member_revocations *r, const gw_id *peer) {
  for (size_t i = 0; r && i < r->n; i++)
    if (gw_id_eq(&r->peers[i], peer)) return true;
  return false;
}

void member_revocations_free(member_revocations *r) {
  free(r->peers);
  memset(r, 0, sizeof(*r));
}

int member_parse_duration(const char *s, uint64_t *seconds) {
  char *end = NULL;
  if (!s || !isdigit((unsigned char)*s)) return GW_EINVAL;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mul = 1;
  if (*end == 'd') mul = 86400, end++;
  else if (*end == 'h') mul = 3600, end++;
  else if (*end == 'm') mul = 60, end++;
  else if (*end == 's') end++;
  if (*end || v > 100ull * 365 * 86400 / mul) return GW_EINVAL;
  *seconds = (uint64_t)v * mul;
  return 0;
}
