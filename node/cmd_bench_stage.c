/* node/cmd_bench_stage.c — `gwtf bench stage`: time one relay stage's
 * forward and backward on a backend (scripts/bench_vs_torch.py runs the
 * same configuration in PyTorch). */
#include <getopt.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "node/cmd.h"
#include "train/model.h"
#include "train/stage.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/rng.h"

#define BENCH_MAX_ITERS (100000)

void cmd_bench_stage_help(void) {
  printf("usage: gwtf bench stage [--arch gpt|llama] [--d-model C] [--heads H] [--layers L]\n"
         "                        [--d-ff F] [--seq T] [--batch B] [--device cpu|cuda[:N]]\n"
         "                        [--threads N] [--iters K] [--warmup W] [--json]\n\n"
         "Times forward and backward of L transformer blocks on one microbatch (B, T)\n"
         "and prints the medians over K iterations, tokens/s (B*T over forward +\n"
         "backward), model GFLOP/s (matmuls and attention, PaLM convention: backward =\n"
         "2x forward, attention counted unmasked) and, on CUDA, MFU.\n\n"
         "Defaults: gpt, C 512, H 8, L 4, F 4C (llama: 8C/3 rounded up to 64), T 256,\n"
         "B 4, cpu, all cores, K 10, W 2.\n");
}

typedef struct bench_opts {
  model_config cfg;
  int batch, seq, iters, warmup;
  gpu_device dev;
  gpu_options gopt;
  bool json;
} bench_opts;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Process CPU time: unlike the wall clock it does not count time the
 * scheduler gave to other processes, which makes runs on a busy machine
 * comparable (with one thread; spinning threads add their own). */
static double cpu_time_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end || v < lo || v > hi) return GW_EINVAL;
  *out = (int)v;
  return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  static const struct option opts[] = {
      {"arch", required_argument, NULL, 'a'},   {"d-model", required_argument, NULL, 'C'},
      {"heads", required_argument, NULL, 'H'},  {"layers", required_argument, NULL, 'L'},
      {"d-ff", required_argument, NULL, 'F'},   {"seq", required_argument, NULL, 'T'},
      {"batch", required_argument, NULL, 'B'},  {"device", required_argument, NULL, 'd'},
      {"threads", required_argument, NULL, 't'}, {"iters", required_argument, NULL, 'k'},
      {"warmup", required_argument, NULL, 'w'}, {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
  };
  int c, rc = 0, d_ff = 0, li = 0;
  while (!rc && (c = getopt_long(argc, argv, "h", opts, &li)) != -1) {
    switch (c) {
      case 'a': rc = model_arch_parse(optarg, &o->cfg.arch); break;
      case 'C': rc = parse_int(optarg, 1, MODEL_MAX_DIM, &o->cfg.d_model); break;
      case 'H': rc = parse_int(optarg, 1, MODEL_MAX_DIM, &o->cfg.n_heads); break;
      case 'L': rc = parse_int(optarg, 1, MODEL_MAX_LAYERS, &o->cfg.n_layers); break;
      case 'F': rc = parse_int(optarg, 1, 4 * MODEL_MAX_DIM, &d_ff); break;
      case 'T': rc = parse_int(optarg, 1, MODEL_MAX_SEQ, &o->seq); break;
      case 'B': rc = parse_int(optarg, 1, STAGE_MAX_BATCH, &o->batch); break;
      case 'd': rc = gpu_device_parse(optarg, &o->dev); break;
      case 't': rc = parse_int(optarg, 1, 1024, &o->gopt.threads); break;
      case 'k': rc = parse_int(optarg, 1, BENCH_MAX_ITERS, &o->iters); break;
      case 'w': rc = parse_int(optarg, 0, BENCH_MAX_ITERS, &o->warmup); break;
      case 'j': o->json = true; break;
      case 'h': cmd_bench_stage_help(); return 1;
      default: return GW_EINVAL;
    }
    if (rc) fprintf(stderr, "gwtf bench stage: bad value '%s' for --%s\n", optarg, opts[li].name);
  }
  if (rc) return rc;
  if (optind < argc) {
    fprintf(stderr, "gwtf bench stage: unexpected argument '%s'\n", argv[optind]);
    return GW_EINVAL;
  }
  int C = o->cfg.d_model;
  o->cfg.d_ff = d_ff ? d_ff : o->cfg.arch == MODEL_GPT ? 4 * C : (8 * C / 3 + 63) / 64 * 64;
  o->cfg.max_seq_len = o->seq;
  return 0;
}

typedef struct bench_result {
  double fwd_ms, bwd_ms, tokens_per_s, gflops, mfu; /* mfu < 0: unknown */
  double cpu_ms; /* process CPU time per forward + backward (all threads) */
  stage_memory mem;
} bench_result;

/* Warm-up, then K timed forward/backward pairs on random data. */
static int run_bench(stage *st, const bench_opts *o, bench_result *r) {
  size_t n = (size_t)o->batch * o->seq * o->cfg.d_model;
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
  float *dy = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float));
  double *fwd = calloc((size_t)o->iters, sizeof(double)), *bwd = calloc((size_t)o->iters, sizeof(double));
  double *cpu = calloc((size_t)o->iters, sizeof(double));
  int rc = x && y && dy && dx && fwd && bwd && cpu ? 0 : GW_ENOMEM;
  gw_rng rng;
  gw_rng_seed(&rng, 1);
  for (size_t i = 0; !rc && i < n; i++) {
    x[i] = (float)gw_rng_normal(&rng);
    dy[i] = (float)gw_rng_normal(&rng) * 1e-3f;
  }
  for (int it = 0; !rc && it < o->warmup + o->iters; it++) {
    double c0 = cpu_time_ms();
    uint64_t t0 = gw_clock_mono_ns();
    rc = stage_forward(st, (uint64_t)it, x, y);
    uint64_t t1 = gw_clock_mono_ns();
    if (!rc) rc = stage_backward(st, (uint64_t)it, dy, dx);
    uint64_t t2 = gw_clock_mono_ns();
    if (!rc) rc = stage_release(st, (uint64_t)it);
    if (!rc && it >= o->warmup) {
      fwd[it - o->warmup] = (double)(t1 - t0) / 1e6;
      bwd[it - o->warmup] = (double)(t2 - t1) / 1e6;
      cpu[it - o->warmup] = cpu_time_ms() - c0;
    }
  }
  if (!rc) {
    r->fwd_ms = median(fwd, o->iters);
    r->bwd_ms = median(bwd, o->iters);
    r->cpu_ms = median(cpu, o->iters);
    double s = (r->fwd_ms + r->bwd_ms) / 1e3;
    r->tokens_per_s = (double)o->batch * o->seq / s;
    r->gflops = 3.0 * model_block_flops(&o->cfg, o->cfg.n_layers, o->batch, o->seq) / s / 1e9;
  }
  free(x), free(y), free(dy), free(dx), free(fwd), free(bwd), free(cpu);
  return rc;
}

static void print_result(const bench_opts *o, const gpu_device_info *info, const bench_result *r) {
  char dev[GPU_DEVICE_STR_MAX];
  gpu_device_format(&o->dev, dev, sizeof(dev));
  const model_config *c = &o->cfg;
  if (o->json) {
    printf("{\"arch\":\"%s\",\"d_model\":%d,\"heads\":%d,\"layers\":%d,\"d_ff\":%d,\"seq\":%d,"
           "\"batch\":%d,\"device\":\"%s\",\"device_name\":\"%s\",\"threads\":%d,\"iters\":%d,"
           "\"fwd_ms_median\":%.3f,\"bwd_ms_median\":%.3f,\"tokens_per_s\":%.1f,\"gflops\":%.2f,"
           "\"cpu_ms_median\":%.3f,\"state_bytes\":%zu,\"per_mb_bytes\":%zu",
           model_arch_name(c->arch), c->d_model, c->n_heads, c->n_layers, c->d_ff, o->seq, o->batch,
           dev, info->name, o->gopt.threads, o->iters, r->fwd_ms, r->bwd_ms, r->tokens_per_s,
           r->gflops, r->cpu_ms, r->mem.state_bytes, r->mem.per_mb_bytes);
    if (r->mfu >= 0) printf(",\"mfu\":%.4f", r->mfu);
    printf("}\n");
    return;
  }
  printf("%s C=%d H=%d L=%d F=%d T=%d B=%d on %s (%s)\n", model_arch_name(c->arch), c->d_model,
         c->n_heads, c->n_layers, c->d_ff, o->seq, o->batch, dev, info->name);
  printf("  forward  %9.3f ms (median of %d)\n  backward %9.3f ms\n", r->fwd_ms, o->iters, r->bwd_ms);
  printf("  cpu time %9.3f ms per forward + backward, all threads\n", r->cpu_ms);
  printf("  %.1f tokens/s, %.2f GFLOP/s", r->tokens_per_s, r->gflops);
  if (r->mfu >= 0) printf(", MFU %.1f%%", 100.0 * r->mfu);
  printf("\n  memory: %.1f MB of weights, gradients and moments, %.1f MB per microbatch in flight\n",
         (double)r->mem.state_bytes / 1e6, (double)r->mem.per_mb_bytes / 1e6);
}

int cmd_bench_stage(int argc, char **argv) {
  bench_opts o = {
      .cfg = {MODEL_GPT, 512, 8, 4, 0, 256, 256, 1e-5f, 10000.0f},
      .batch = 4, .seq = 256, .iters = 10, .warmup = 2,
      .dev = {GPU_CPU, 0},
  };
  int rc = parse_args(argc, argv, &o);
  if (rc) return rc == 1 ? 0 : 2;
  char err[512] = "";
  stage_spec spec = {.model = o.cfg, .first_layer = 0, .n_layers = o.cfg.n_layers, .batch = o.batch,
                     .seq_len = o.seq, .capacity = 1};
  if (stage_spec_validate(&spec, err, sizeof(err))) {
    fprintf(stderr, "gwtf bench stage: %s\n", err);
    return 2;
  }
  gpu_backend *be = NULL;
  if (gpu_backend_open(&o.dev, &o.gopt, &be, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf bench stage: %s\n", err);
    return 1;
  }
  o.gopt.threads = be->threads;
  stage *st = NULL;
  bench_result r = {.mfu = -1.0};
  gpu_device_info info = {0};
  gpu_device_info_get(be, &info);
  rc = stage_create(&spec, be, 1, &st, err, sizeof(err));
  if (!rc) rc = stage_memory_estimate(&spec, be, &r.mem);
  if (!rc) rc = run_bench(st, &o, &r);
  if (!rc && o.dev.kind == GPU_CUDA && info.peak_flops > 0) r.mfu = r.gflops * 1e9 / info.peak_flops;
  if (!rc) print_result(&o, &info, &r);
  else fprintf(stderr, "gwtf bench stage: %s\n", err[0] ? err : gw_strerror(rc));
  stage_destroy(st);
  gpu_backend_close(be);
  return rc ? 1 : 0;
}
