#include "p2p/identity.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"

#define KEYFILE_MAGIC "gwtf-ed25519-seed-v1"
#define SEED_BYTES crypto_sign_SEEDBYTES

int p2p_crypto_init(void) { return sodium_init() < 0 ? GW_EIO : 0; }

void p2p_id_from_pk(const uint8_t pk[P2P_PK_BYTES], gw_id *out) { gw_id_hash(pk, P2P_PK_BYTES, out); }

void p2p_identity_from_seed(const uint8_t seed[32], p2p_identity *out) {
  crypto_sign_seed_keypair(out->pk, out->sk, seed);
  p2p_id_from_pk(out->pk, &out->id);
}

void p2p_identity_generate(p2p_identity *out) {
  uint8_t seed[SEED_BYTES];
  randombytes_buf(seed, sizeof(seed));
  p2p_identity_from_seed(seed, out);
  sodium_memzero(seed, sizeof(seed));
}

void p2p_identity_wipe(p2p_identity *id) { sodium_memzero(id, sizeof(*id)); }

void p2p_sign(const p2p_identity *me, const uint8_t *msg, size_t len, uint8_t sig[P2P_SIG_BYTES]) {
  crypto_sign_detached(sig, NULL, msg, len, me->sk);
}

int p2p_verify(const uint8_t pk[P2P_PK_BYTES], const uint8_t *msg, size_t len,
               const uint8_t sig[P2P_SIG_BYTES]) {
  return crypto_sign_verify_detached(sig, msg, len, pk) == 0 ? 0 : GW_EAUTH;
}

static void set_err(char *err, size_t err_len, const char *fmt, const char *path, const char *detail) {
  if (err && err_len) snprintf(err, err_len, fmt, path, detail);
}

static int make_parent_dir(const char *path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = '\0';
  return gw_mkdir_p(dir, 0700);
}

int p2p_identity_create(const char *path, p2p_identity *out, char *err, size_t err_len) {
  uint8_t seed[SEED_BYTES];
  char text[sizeof(KEYFILE_MAGIC) + 2 * SEED_BYTES + 4];
  struct stat st;
  if (stat(path, &st) == 0) {
    set_err(err, err_len, "identity file %s already exists%s", path, "");
    return GW_EEXIST;
  }
  int rc = make_parent_dir(path);
  if (rc != 0) {
    set_err(err, err_len, "cannot create the directory for %s: %s", path, gw_strerror(rc));
    return rc;
  }
  randombytes_buf(seed, sizeof(seed));
  int n = snprintf(text, sizeof(text), "%s\n", KEYFILE_MAGIC);
  sodium_bin2hex(text + n, sizeof(text) - (size_t)n, seed, SEED_BYTES);
  n += 2 * SEED_BYTES;
  text[n++] = '\n';
  rc = gw_file_write_atomic1(path, text, (size_t)n, 0600);
  if (rc == 0) p2p_identity_from_seed(seed, out);
  sodium_memzero(seed, sizeof(seed));
  sodium_memzero(text, sizeof(text));
  if (rc != 0) set_err(err, err_len, "cannot write identity file %s: %s", path, gw_strerror(rc));
  return rc;
}

static int parse_keyfile(const char *text, size_t len, uint8_t seed[SEED_BYTES]) {
  size_t magic_len = strlen(KEYFILE_MAGIC);
  size_t bin_len = 0;
  if (len < magic_len + 1 + 2 * SEED_BYTES || memcmp(text, KEYFILE_MAGIC, magic_len) != 0 ||
      text[magic_len] != '\n')
    return GW_EINVAL;
  const char *hex = text + magic_len + 1;
  if (sodium_hex2bin(seed, SEED_BYTES, hex, 2 * SEED_BYTES, NULL, &bin_len, NULL) != 0 ||
      bin_len != SEED_BYTES)
    return GW_EINVAL;
  return 0;
}

int p2p_identity_load_or_create(const char *path, p2p_identity *out, int *created, char *err,
                                size_t err_len) {
  struct stat st;
  if (created) *created = 0;
  if (stat(path, &st) != 0) {
    if (errno != ENOENT) {
      set_err(err, err_len, "cannot read identity file %s: %s", path, strerror(errno));
      return -errno;
    }
    int rc = p2p_identity_create(path, out, err, err_len);
    if (rc == 0 && created) *created = 1;
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    set_err(err, err_len, "identity file %s is not a regular file%s", path, "");
    return GW_EINVAL;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char detail[96];
    snprintf(detail, sizeof(detail), "%04o); fix it with: chmod 600 ", (unsigned)(st.st_mode & 07777));
    if (err && err_len)
      snprintf(err, err_len,
               "refusing to use identity file %s: other users can access it (mode %s%s", path,
               detail, path);
    return GW_EPERM;
  }
  uint8_t *text = NULL;
  size_t len = 0;
  int rc = gw_file_read_all(path, 4096, &text, &len);
  if (rc != 0) {
    set_err(err, err_len, "cannot read identity file %s: %s", path, gw_strerror(rc));
    return rc;
  }
  uint8_t seed[SEED_BYTES];
  rc = parse_keyfile((const char *)text, len, seed);
  sodium_memzero(text, len);
  free(text);
  if (rc != 0) {
    set_err(err, err_len, "identity file %s is not a gwtf key file (expected '%s' then 64 hex digits)",
            path, KEYFILE_MAGIC);
    return rc;
  }
  p2p_identity_from_seed(seed, out);
  sodium_memzero(seed, sizeof(seed));
  return 0;
}
