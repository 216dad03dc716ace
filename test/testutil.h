/* test/testutil.h — small helpers shared by the C tests (cmocka). */
#ifndef GWTF_TEST_TESTUTIL_H
#define GWTF_TEST_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ftw.h>
#include <sys/stat.h>

#include <cmocka.h>

/* A fresh private directory under $TMPDIR (or /tmp); never NULL (aborts the
 * test binary instead). The caller frees the string and removes the tree with
 * testutil_rmtree. */
static inline char *testutil_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  char tmpl[512];
  snprintf(tmpl, sizeof(tmpl), "%s/gwtf-test-XXXXXX", base && *base ? base : "/tmp");
  char *dir = mkdtemp(tmpl);
  char *copy = dir ? strdup(dir) : NULL;
  if (!copy) {
    fprintf(stderr, "cannot create a temporary directory under %s\n", tmpl);
    abort();
  }
  return copy;
}

static inline int testutil_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static inline void testutil_rmtree(const char *dir) {
  if (dir) nftw(dir, testutil_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
