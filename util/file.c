#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

static int write_all(int fd, const void *data, size_t len) {
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void fsync_parent_dir(const char *path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = '\0';
  else if (slash)
    *slash = '\0';
  else
    snprintf(dir, sizeof(dir), ".");
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

int gw_file_write_atomic(const char *path, const void *const *parts, const size_t *lens, size_t n_parts,
                         mode_t mode) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp)) return GW_ERANGE;
  int fd = mkstemp(tmp);
  if (fd < 0) return -errno;
  int rc = 0;
  if (fchmod(fd, mode) != 0) rc = -errno;
  for (size_t i = 0; rc == 0 && i < n_parts; i++) rc = write_all(fd, parts[i], lens[i]);
  if (rc == 0 && fsync(fd) != 0) rc = -errno;
  if (close(fd) != 0 && rc == 0) rc = -errno;
  if (rc == 0 && rename(tmp, path) != 0) rc = -errno;
  if (rc != 0) {
    unlink(tmp);
    return rc;
  }
  fsync_parent_dir(path);
  return 0;
}

int gw_file_write_atomic1(const char *path, const void *data, size_t len, mode_t mode) {
  const void *parts[1] = {data};
  size_t lens[1] = {len};
  return gw_file_write_atomic(path, parts, lens, 1, mode);
}

int gw_file_read_all(const char *path, size_t max_len, uint8_t **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int rc = -errno;
    close(fd);
    return rc;
  }
  if (st.st_size < 0 || (uint64_t)st.st_size > max_len) {
    close(fd);
    return GW_ERANGE;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *buf = malloc(size + 1);
  if (!buf) {
    close(fd);
    return GW_ENOMEM;
  }
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, buf + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (got != size) {
    free(buf);
    return GW_EIO;
  }
  buf[size] = '\0';
  *out = buf;
  *out_len = size;
  return 0;
}

int gw_mkdir_p(const char *path, mode_t mode) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) return GW_ERANGE;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) return -errno;
    *p = '/';
  }
  if (mkdir(buf, mode) != 0 && errno != EEXIST) return -errno;
  return 0;
}
