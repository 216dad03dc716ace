/* node/train_access.c — see train_access.h. */
#include "node/train_access.h"

#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "node/run_access.h"
#include "util/err.h"
#include "util/file.h"

static uint8_t *load_cert(const char *data_dir, const char *run, size_t *len) {
  char path[PATH_MAX];
  uint8_t *buf = NULL;
  run_access_path(data_dir, run, "member.cert", path, sizeof(path));
  if (gw_file_read_all(path, MEMBER_CERT_MAX, &buf, len) != 0) return NULL;
  return buf;
}

bool train_access_has_cert(const char *data_dir, const char *run) {
  size_t len = 0;
  uint8_t *buf = load_cert(data_dir, run, &len);
  free(buf);
  return buf != NULL;
}

int train_access_setup(train_access *a, train_peer *p, const uint8_t run_key[MEMBER_PK_BYTES],
                       const uint8_t *token, size_t token_len, const gw_log *log) {
  train_membership m;
  memset(&m, 0, sizeof(m));
  snprintf(m.run, sizeof(m.run), "%s", a->run);
  memcpy(m.run_key, run_key, sizeof(m.run_key));
  m.have_sk = a->have_key;
  if (a->have_key) memcpy(m.sk, a->key.sk, sizeof(m.sk));
  m.token = token;
  m.token_len = token_len;
  size_t cert_len = 0;
  uint8_t *cert = a->have_key ? NULL : load_cert(a->data_dir, a->run, &cert_len);
  m.cert = cert;
  m.cert_len = cert_len;
  int rc = train_peer_set_membership(p, &m);
  if (rc != 0 && cert) {
    /* a kept certificate of another run of that name, or not ours: without it */
    GW_WARN(log, "run.cert_unusable", "msg=\"the kept certificate does not verify; using the invite\"");
    m.cert = NULL;
    m.cert_len = 0;
    rc = train_peer_set_membership(p, &m);
  }
  free(cert);
  sodium_memzero(m.sk, sizeof(m.sk));
  if (rc != 0) GW_ERROR(log, "run.membership", "err=\"%s\"", gw_strerror(rc));
  return rc;
}

void train_access_save_cert(const train_access *a, train_peer *p, const gw_log *log) {
  const uint8_t *cert;
  size_t len;
  if (!train_peer_certificate(p, &cert, &len)) return;
  char path[PATH_MAX], dir[PATH_MAX];
  run_access_path(a->data_dir, a->run, NULL, dir, sizeof(dir));
  run_access_path(a->data_dir, a->run, "member.cert", path, sizeof(path));
  gw_mkdir_p(dir, 0700);
  int rc = gw_file_write_atomic1(path, cert, len, 0600);
  if (rc != 0) GW_WARN(log, "run.cert_not_saved", "path=%s err=\"%s\"", path, gw_strerror(rc));
}

void train_access_sync_revocations(train_access *a, train_peer *p, uint64_t now_ms, const gw_log *log) {
  char path[PATH_MAX];
  struct stat st;
  run_access_path(a->data_dir, a->run, "revoked", path, sizeof(path));
  if (stat(path, &st) == 0 &&
      (st.st_mtim.tv_sec != a->revoked_mtime.tv_sec || st.st_mtim.tv_nsec != a->revoked_mtime.tv_nsec)) {
    a->revoked_mtime = st.st_mtim;
    uint8_t *buf = NULL;
    size_t len = 0;
    member_revocations r;
    int rc = run_access_read_revocations(a->data_dir, a->run, &buf, &len);
    if (rc == 0) rc = member_revocations_parse(buf, len, a->run, a->key.pk, &r);
    if (rc == 0) {
      if (r.seq > a->revoked_seq) a->revoked_seq = r.seq;
      member_revocations_free(&r);
      rc = train_peer_set_revocations(p, buf, len, now_ms);
    }
    free(buf);
    if (rc != 0) GW_ERROR(log, "run.bad_revocations", "path=%s err=\"%s\"", path, gw_strerror(rc));
  }
  const uint8_t *list;
  size_t len;
  uint64_t seq;
  if (train_peer_revocations(p, &list, &len, &seq) && seq > a->revoked_seq) {
    char dir[PATH_MAX];
    run_access_path(a->data_dir, a->run, NULL, dir, sizeof(dir));
    gw_mkdir_p(dir, 0700);
    if (gw_file_write_atomic1(path, list, len, 0600) == 0 && stat(path, &st) == 0) {
      a->revoked_mtime = st.st_mtim;
      a->revoked_seq = seq;
    }
  }
}

int train_access_redeem(const train_access *a, const uint8_t id[MEMBER_INVITE_ID_BYTES], uint32_t uses,
                        const gw_id *peer, const gw_log *log) {
  int rc = run_access_redeem(a->data_dir, a->run, id, uses, peer);
  if (rc != 0 && rc != GW_EFULL)
    GW_ERROR(log, "run.redeem_failed", "err=\"%s\" msg=\"cannot count the invite's uses\"", gw_strerror(rc));
  return rc;
}

void train_access_wipe(train_access *a) { sodium_memzero(&a->key, sizeof(a->key)); }
