/* node/run_access.c — see run_access.h. */
#include "node/run_access.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "p2p/identity.h"
#include "util/err.h"
#include "util/file.h"

#define REDEEMED_MAX_BYTES (4u << 20)

void run_access_path(const char *data_dir, const char *run, const char *file, char *out, size_t len) {
  snprintf(out, len, "%s/runs/%s%s%s", data_dir, run, file ? "/" : "", file ? file : "");
}

int run_access_load_key(const char *path, bool create, member_key *out, char *err, size_t err_len) {
  if (!create && access(path, F_OK) != 0) {
    snprintf(err, err_len, "no run key at %s", path);
    return GW_ENOENT;
  }
  p2p_identity id;
  int created = 0;
  int rc = p2p_identity_load_or_create(path, &id, &created, err, err_len);
  if (rc != 0) return rc;
  memcpy(out->pk, id.pk, MEMBER_PK_BYTES);
  memcpy(out->sk, id.sk, MEMBER_SK_BYTES);
  p2p_identity_wipe(&id);
  return 0;
}

static void hex(const uint8_t *b, size_t n, char *out) {
  for (size_t i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* The redeemed file's lines, malloc'd (NULL, 0 when there is none). */
static int read_redeemed(const char *data_dir, const char *run, char **text, size_t *len) {
  char path[4096];
  run_access_path(data_dir, run, "redeemed", path, sizeof(path));
  uint8_t *buf = NULL;
  *text = NULL;
  *len = 0;
  int rc = gw_file_read_all(path, REDEEMED_MAX_BYTES, &buf, len);
  if (rc == -ENOENT) return 0; /* nobody redeemed anything yet */
  if (rc != 0) return rc;
  *text = (char *)buf;
  return 0;
}

int run_access_redeem(const char *data_dir, const char *run, const uint8_t id[MEMBER_INVITE_ID_BYTES],
                      uint32_t uses, const gw_id *peer) {
  char *text = NULL;
  size_t len = 0;
  int rc = read_redeemed(data_dir, run, &text, &len);
  if (rc != 0) return rc;
  char line[2 * MEMBER_INVITE_ID_BYTES + 1 + GW_ID_HEX_LEN + 2];
  hex(id, MEMBER_INVITE_ID_BYTES, line);
  line[2 * MEMBER_INVITE_ID_BYTES] = ' ';
  gw_id_to_hex(peer, line + 2 * MEMBER_INVITE_ID_BYTES + 1);
  strcat(line, "\n");
  size_t line_len = strlen(line);
  uint32_t count = 0;
  for (size_t off = 0; off + line_len <= len; off += line_len) {
    if (memcmp(text + off, line, line_len) == 0) {
      free(text);
      return 0; /* this peer again: no new use */
    }
    count += memcmp(text + off, line, 2 * MEMBER_INVITE_ID_BYTES) == 0;
  }
  if (uses && count >= uses) {
    free(text);
    return GW_EFULL;
  }
  char path[4096], dir[4096];
  run_access_path(data_dir, run, NULL, dir, sizeof(dir));
  run_access_path(data_dir, run, "redeemed", path, sizeof(path));
  gw_mkdir_p(dir, 0700);
  const void *parts[2] = {text ? text : "", line};
  size_t lens[2] = {len, line_len};
  rc = gw_file_write_atomic(path, parts, lens, 2, 0600);
  free(text);
  return rc;
}

int run_access_redeemers(const char *data_dir, const char *run, gw_id *out, size_t max, size_t *n) {
  char *text = NULL;
  size_t len = 0;
  *n = 0;
  int rc = read_redeemed(data_dir, run, &text, &len);
  if (rc != 0) return rc;
  size_t line_len = 2 * MEMBER_INVITE_ID_BYTES + 1 + GW_ID_HEX_LEN + 1;
  for (size_t off = 0; off + line_len <= len && *n < max; off += line_len) {
    char idhex[GW_ID_HEX_LEN + 1];
    memcpy(idhex, text + off + 2 * MEMBER_INVITE_ID_BYTES + 1, GW_ID_HEX_LEN);
    idhex[GW_ID_HEX_LEN] = '\0';
    if (gw_id_from_hex(idhex, &out[*n]) == 0) (*n)++;
  }
  free(text);
  return 0;
}

int run_access_read_revocations(const char *data_dir, const char *run, uint8_t **buf, size_t *len) {
  char path[4096];
  run_access_path(data_dir, run, "revoked", path, sizeof(path));
  int rc = gw_file_read_all(path, (size_t)MEMBER_MAX_REVOKED * 40 + 4096, buf, len);
  return rc == -ENOENT ? GW_ENOENT : rc;
}

int run_access_revoke(const char *data_dir, const char *run, const member_key *key, const gw_id *peer,
                      uint64_t *seq, size_t *n, char *err, size_t err_len) {
  member_revocations old = {0}, now = {0};
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = run_access_read_revocations(data_dir, run, &buf, &len);
  if (rc == 0) {
    rc = member_revocations_parse(buf, len, run, key->pk, &old);
    free(buf);
    if (rc != 0) {
      snprintf(err, err_len, "the revocation list of run %s does not verify with its run key", run);
      return rc;
    }
  } else if (rc != GW_ENOENT) {
    snprintf(err, err_len, "cannot read the revocation list: %s", gw_strerror(rc));
    return rc;
  }
  if (old.n >= MEMBER_MAX_REVOKED) {
    member_revocations_free(&old);
    snprintf(err, err_len, "the revocation list is full (%d peers)", MEMBER_MAX_REVOKED);
    return GW_EFULL;
  }
  snprintf(now.run, sizeof(now.run), "%s", run);
  now.seq = old.seq + 1;
  now.peers = calloc(old.n + 1, sizeof(gw_id));
  if (!now.peers) {
    member_revocations_free(&old);
    return GW_ENOMEM;
  }
  for (size_t i = 0; i < old.n; i++) now.peers[now.n++] = old.peers[i];
  if (!member_revoked(&old, peer)) now.peers[now.n++] = *peer;
  member_revocations_free(&old);
  rc = member_revocations_make(&now, key->pk, key, &buf, &len);
  if (rc == 0) {
    char path[4096], dir[4096];
    run_access_path(data_dir, run, NULL, dir, sizeof(dir));
    run_access_path(data_dir, run, "revoked", path, sizeof(path));
    gw_mkdir_p(dir, 0700);
    rc = gw_file_write_atomic1(path, buf, len, 0600);
    free(buf);
    if (rc != 0) snprintf(err, err_len, "cannot write %s: %s", path, gw_strerror(rc));
  } else {
    snprintf(err, err_len, "cannot sign the revocation list: %s", gw_strerror(rc));
  }
  *seq = now.seq;
  *n = now.n;
  member_revocations_free(&now);
  return rc;
}

int run_access_write_addr(const char *data_dir, const char *run, const char *addr) {
  char path[4096], dir[4096];
  run_access_path(data_dir, run, NULL, dir, sizeof(dir));
  run_access_path(data_dir, run, "creator.addr", path, sizeof(path));
  gw_mkdir_p(dir, 0700);
  return gw_file_write_atomic1(path, addr, strlen(addr), 0644);
}

int run_access_read_addr(const char *data_dir, const char *run, char *out, size_t len) {
  char path[4096];
  run_access_path(data_dir, run, "creator.addr", path, sizeof(path));
  uint8_t *buf = NULL;
  size_t n = 0;
  int rc = gw_file_read_all(path, 512, &buf, &n);
  if (rc != 0) return rc;
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
  snprintf(out, len, "%.*s", (int)n, (const char *)buf);
  free(buf);
  return 0;
}
