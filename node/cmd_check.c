/* node/cmd_check.c — `gwtf check stage FIXTURE...`: run PyTorch reference
 * fixtures on a backend and report the error of every output and gradient. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "node/cmd.h"
#include "train/fixture.h"
#include "util/err.h"

/* Exit code when the requested device cannot be opened (no CUDA in this
 * build, no GPU): test scripts turn it into a skip. */
#define CHECK_EXIT_NO_DEVICE (3)

void cmd_check_stage_help(void) {
  printf("usage: gwtf check stage FIXTURE.safetensors... [--device cpu|cuda[:N]] [--threads N]\n"
         "                        [--quiet]\n\n"
         "Runs PyTorch reference fixtures (scripts/gen_fixtures.py; committed under\n"
         "test/fixtures/) and prints, for each output and gradient, the max abs error\n"
         "relative to the max abs expected value.\n\n"
         "  --device D   cpu (default), cuda or cuda:N\n"
         "  --threads N  CPU threads (default: all cores this process may use)\n"
         "  --quiet      print only failures and the summary line\n\n"
         "Exit status: 0 when every value is within %.0e (fp32), 1 otherwise or on a\n"
         "malformed fixture, 2 on usage errors, %d when the device is not available.\n",
         FIXTURE_TOLERANCE, CHECK_EXIT_NO_DEVICE);
}

typedef struct check_out {
  bool quiet;
  int n;
} check_out;

static void print_result(void *ud, const fixture_result *r) {
  check_out *o = ud;
  o->n++;
  if (o->quiet && r->ok) return;
  printf("  %-36s rel %.2e  (max err %.2e / max %.3g)  %s\n", r->name, r->rel, r->max_abs_err,
         r->max_abs_ref, r->ok ? "ok" : "FAIL");
}

int cmd_check_stage(int argc, char **argv) {
  static const struct option opts[] = {
      {"device", required_argument, NULL, 'd'},
      {"threads", required_argument, NULL, 't'},
      {"quiet", no_argument, NULL, 'q'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  gpu_device dev = {GPU_CPU, 0};
  gpu_options gopt = {0};
  check_out out = {0};
  int c;
  while ((c = getopt_long(argc, argv, "d:t:qh", opts, NULL)) != -1) {
    switch (c) {
      case 'd':
        if (gpu_device_parse(optarg, &dev) != 0) {
          fprintf(stderr, "gwtf check stage: bad --device '%s' (cpu, cuda or cuda:N)\n", optarg);
          return 2;
        }
        break;
      case 't':
        gopt.threads = atoi(optarg);
        if (gopt.threads < 1 || gopt.threads > 1024) {
          fprintf(stderr, "gwtf check stage: --threads must be between 1 and 1024\n");
          return 2;
        }
        break;
      case 'q': out.quiet = true; break;
      case 'h': cmd_check_stage_help(); return 0;
      default: return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "gwtf check stage: no fixture given (see gwtf help check stage)\n");
    return 2;
  }
  char err[512] = "";
  gpu_backend *be = NULL;
  if (gpu_backend_open(&dev, &gopt, &be, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf check stage: %s\n", err);
    return CHECK_EXIT_NO_DEVICE;
  }
  char devname[GPU_DEVICE_STR_MAX];
  gpu_device_format(&dev, devname, sizeof(devname));
  int bad_files = 0, total_failed = 0, total = 0;
  for (int i = optind; i < argc; i++) {
    int failed = 0;
    out.n = 0;
    printf("%s on %s\n", argv[i], devname);
    int rc = fixture_run(argv[i], be, FIXTURE_TOLERANCE, print_result, &out, &failed, err, sizeof(err));
    if (rc) {
      printf("  error: %s\n", err[0] ? err : gw_strerror(rc));
      bad_files++;
      continue;
    }
    printf("  %d of %d within %.0e\n", out.n - failed, out.n, FIXTURE_TOLERANCE);
    total_failed += failed;
    total += out.n;
  }
  gpu_backend_close(be);
  if (argc - optind > 1)
    printf("all: %d of %d within %.0e, %d fixture(s) unreadable\n", total - total_failed, total,
           FIXTURE_TOLERANCE, bad_files);
  return bad_files || total_failed ? 1 : 0;
}
