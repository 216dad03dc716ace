/* util/file.h — files the user owns are never left half-written.
 *
 * gw_file_write_atomic writes to a temporary file in the same directory,
 * fsyncs it, renames it over the target and fsyncs the directory, so a crash
 * leaves either the old file or the new one. */
#ifndef GWTF_UTIL_FILE_H
#define GWTF_UTIL_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Writes the concatenation of n_parts buffers atomically with the given mode.
 * Returns 0 or a negative code (errno-based, see gw_strerror). */
int gw_file_write_atomic(const char *path, const void *const *parts, const size_t *lens, size_t n_parts,
                         mode_t mode);
/* Convenience for one buffer. */
int gw_file_write_atomic1(const char *path, const void *data, size_t len, mode_t mode);
/* Reads a whole file of at most max_len bytes into a malloc'd buffer (NUL
 * appended, not counted). GW_ERANGE when the file is larger than max_len. */
int gw_file_read_all(const char *path, size_t max_len, uint8_t **out, size_t *out_len);
/* mkdir -p with the given mode for created directories. */
int gw_mkdir_p(const char *path, mode_t mode);

#endif
