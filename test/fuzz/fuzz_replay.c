/* Replays the committed fuzz corpora through the fuzz targets' code, in
 * every build (so ASan/UBSan and valgrind see every input too):
 *
 *   fuzz_replay CORPUS_DIR
 *
 * runs every file in CORPUS_DIR/dht_payload through fuzz_dht_payload,
 * every file in CORPUS_DIR/datagram through fuzz_datagram, and the
 * port-mapping replies in CORPUS_DIR/{pcp,natpmp,upnp}_reply through their
 * targets (fuzz_portmap.h), and CORPUS_DIR/{frame,train_msg,flow_msg,
 * safetensors,run_record,member_token,member_cert} through theirs (fuzz_targets.h). Files named
 * crash-* are reproducers of open findings, kept aside: skipped. A crash or sanitizer report fails the test; so
 * does an empty corpus (a wrong path must not pass). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_harness.h"
#include "fuzz_portmap.h"
#include "fuzz_targets.h"
#include "util/file.h"

#define REPLAY_MAX_INPUT (64 * 1024)

static long replay_dir(const char *root, const char *sub, int (*target)(const uint8_t *, size_t)) {
  char dir[4096];
  snprintf(dir, sizeof(dir), "%s/%s", root, sub);
  DIR *dp = opendir(dir);
  if (!dp) {
    fprintf(stderr, "fuzz_replay: cannot open %s\n", dir);
    return -1;
  }
  long n = 0;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    if (e->d_name[0] == '.' || strncmp(e->d_name, "crash-", 6) == 0) continue;
    char path[8192];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    uint8_t *buf;
    size_t len;
    if (gw_file_read_all(path, REPLAY_MAX_INPUT, &buf, &len) != 0) {
      fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
      closedir(dp);
      return -1;
    }
    target(buf, len);
    free(buf);
    n++;
  }
  closedir(dp);
  return n;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_replay CORPUS_DIR\n");
    return 2;
  }
  long a = replay_dir(argv[1], "dht_payload", fuzz_dht_payload);
  long b = replay_dir(argv[1], "datagram", fuzz_datagram);
  long c = replay_dir(argv[1], "pcp_reply", fuzz_pcp_reply);
  long d = replay_dir(argv[1], "natpmp_reply", fuzz_natpmp_reply);
  long e = replay_dir(argv[1], "upnp_reply", fuzz_upnp_reply);
  long f = replay_dir(argv[1], "frame", fuzz_frame);
  long g = replay_dir(argv[1], "train_msg", fuzz_train_msg);
  long h = replay_dir(argv[1], "flow_msg", fuzz_flow_msg);
  long i = replay_dir(argv[1], "safetensors", fuzz_safetensors);
  long j = replay_dir(argv[1], "run_record", fuzz_run_record);
  long k = replay_dir(argv[1], "member_token", fuzz_member_token);
  long l = replay_dir(argv[1], "member_cert", fuzz_member_cert);
  if (a <= 0 || b <= 0 || c <= 0 || d <= 0 || e <= 0 || f <= 0 || g <= 0 || h <= 0 || i <= 0 || j <= 0 || k <= 0 ||
      l <= 0) {
    fprintf(stderr, "fuzz_replay: missing or empty corpus under %s\n", argv[1]);
    return 1;
  }
  printf("fuzz_replay: %ld payloads, %ld datagrams, %ld PCP, %ld NAT-PMP, %ld UPnP replies, %ld frame scripts, "
         "%ld train, %ld flow scripts, %ld safetensors files, %ld run records, %ld tokens, %ld certificates and "
         "revocation lists replayed\n",
         a, b, c, d, e, f, g, h, i, j, k, l);
  return 0;
}
