/* `gwtf bench wire`: what each wire format (train/wire_codec.h) costs to
 * encode and decode one activation or gradient tensor of a given shape, how
 * many bytes it takes, and how far the decoded tensor lies from the input,
 * printed as one JSON object per format. The training-level figures (loss
 * after 200 iterations, bytes per microbatch over an emulated link) are
 * scripts/bench_wire.py's; this is the codec alone, e.g. at a real model's
 * width where a format's encoder may cost more than the transfer it saves. */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/cmd.h"
#include "train/wire_codec.h"
#include "util/clock.h"
#include "util/rng.h"

#define DEFAULT_ROWS 256
#define DEFAULT_COLS 128
#define DEFAULT_RANK 24
#define DEFAULT_REPS 5
#define DEFAULT_DTYPES "fp32,bf16,int8,rot4,rot3,lr32,lr32r4"

void cmd_bench_wire_help(void) {
  printf("usage: gwtf bench wire [--rows R] [--cols C] [--rank K] [--dtypes LIST] [--reps N]\n\n"
         "Encodes and decodes one R x C tensor (default %d x %d: the tiny model's\n"
         "B*T x d_model) in each wire format of LIST (default %s),\n"
         "median of N runs (default %d). The tensor is what a gradient between stages\n"
         "looks like: a column mean, a rank-K part (default %d) with decaying\n"
         "directions, and 1 %% noise. Prints one JSON object per format: bytes, times\n"
         "fewer than fp32, encode_ms, decode_ms, and rel_sq_err (|x - x'|^2 / |x|^2).\n",
         DEFAULT_ROWS, DEFAULT_COLS, DEFAULT_DTYPES, DEFAULT_REPS, DEFAULT_RANK);
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static double gauss(gw_rng *r) {
  double u = ((double)gw_rng_below(r, 1u << 30) + 0.5) / (double)(1u << 30);
  double v = (double)gw_rng_below(r, 1u << 30) / (double)(1u << 30);
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* mean + sum_k a_k b_k^T / (1 + k) + 1 % noise, rows x cols. */
static void fill_tensor(float *x, size_t rows, size_t cols, size_t rank) {
  gw_rng r;
  gw_rng_seed(&r, 11);
  double *a = malloc(rows * rank * sizeof(double)), *b = malloc(cols * rank * sizeof(double));
  double *mu = malloc(cols * sizeof(double));
  if (!a || !b || !mu) {
    for (size_t i = 0; i < rows * cols; i++) x[i] = (float)gauss(&r);
    free(a), free(b), free(mu);
    return;
  }
  for (size_t i = 0; i < rows * rank; i++) a[i] = gauss(&r);
  for (size_t i = 0; i < cols * rank; i++) b[i] = gauss(&r) / (double)(1 + i % rank);
  for (size_t j = 0; j < cols; j++) mu[j] = 0.3 * gauss(&r);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      double v = mu[j] + 0.01 * gauss(&r);
      for (size_t k = 0; k < rank; k++) v += a[i * rank + k] * b[j * rank + k];
      x[i * cols + j] = (float)v;
    }
  free(a), free(b), free(mu);
}

/* One format: median encode and decode times over reps, and the error. */
static int bench_one(train_dtype d, const float *x, size_t rows, size_t cols, long reps) {
  size_t n = wire_bytes(d, rows, cols), f32 = wire_bytes(TRAIN_F32, rows, cols);
  uint8_t *buf = malloc(n ? n : 1);
  float *y = malloc(rows * cols * sizeof(float));
  double te[1000], td[1000];
  int rc = buf && y && n ? 0 : 1;
  for (long r = 0; r < reps && rc == 0; r++) {
    uint64_t t0 = gw_clock_mono_ns();
    rc = wire_encode(d, x, rows, cols, buf, n) != 0;
    uint64_t t1 = gw_clock_mono_ns();
    rc = rc || wire_decode(d, buf, n, rows, cols, y) != 0;
    uint64_t t2 = gw_clock_mono_ns();
    te[r] = (double)(t1 - t0) / 1e6;
    td[r] = (double)(t2 - t1) / 1e6;
  }
  if (rc == 0) {
    double e = 0, en = 0;
    for (size_t i = 0; i < rows * cols; i++) {
      double dv = (double)y[i] - x[i];
      e += dv * dv;
      en += (double)x[i] * x[i];
    }
    qsort(te, (size_t)reps, sizeof(double), cmp_double);
    qsort(td, (size_t)reps, sizeof(double), cmp_double);
    printf("{\"dtype\":\"%s\",\"rows\":%zu,\"cols\":%zu,\"bytes\":%zu,\"fewer_than_fp32\":%.2f,\"encode_ms\":%.3f,"
           "\"decode_ms\":%.3f,\"rel_sq_err\":%.3g}\n",
           wire_dtype_name(d), rows, cols, n, (double)f32 / (double)n, te[reps / 2], td[reps / 2],
           en > 0 ? e / en : 0.0);
  } else {
    fprintf(stderr, "gwtf bench wire: %s at %zu x %zu failed (size, memory or a round trip)\n", wire_dtype_name(d),
            rows, cols);
  }
  free(buf);
  free(y);
  return rc;
}

int cmd_bench_wire(int argc, char **argv) {
  static const struct option opts[] = {{"rows", required_argument, 0, 'r'}, {"cols", required_argument, 0, 'c'},
                                       {"rank", required_argument, 0, 'k'}, {"dtypes", required_argument, 0, 'd'},
                                       {"reps", required_argument, 0, 'n'}, {"help", no_argument, 0, 'h'},
                                       {0}};
  long rows = DEFAULT_ROWS, cols = DEFAULT_COLS, rank = DEFAULT_RANK, reps = DEFAULT_REPS;
  const char *list = DEFAULT_DTYPES;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': rows = atol(optarg); break;
    case 'c': cols = atol(optarg); break;
    case 'k': rank = atol(optarg); break;
    case 'd': list = optarg; break;
    case 'n': reps = atol(optarg); break;
    case 'h': cmd_bench_wire_help(); return 0;
    default: cmd_bench_wire_help(); return 2;
    }
  }
  if (rows < 1 || cols < 1 || rows > (1L << 16) || cols > (1L << 14) || rank < 0 || rank > cols || reps < 1 ||
      reps > 1000) {
    fprintf(stderr, "gwtf bench wire: --rows 1..65536, --cols 1..16384, --rank 0..cols, --reps 1..1000\n");
    return 2;
  }
  train_dtype ds[32];
  size_t nd = 0;
  char word[16];
  for (const char *s = list; *s && nd < 32;) {
    size_t n = strcspn(s, ",");
    if (n == 0 || n >= sizeof(word)) break;
    memcpy(word, s, n);
    word[n] = 0;
    if (wire_dtype_parse(word, &ds[nd]) != 0) {
      fprintf(stderr, "gwtf bench wire: unknown dtype '%s' (one of %s)\n", word, WIRE_DTYPE_LIST);
      return 2;
    }
    nd++;
    s += n + (s[n] == ',');
  }
  float *x = malloc((size_t)rows * (size_t)cols * sizeof(float));
  if (!x) {
    fprintf(stderr, "gwtf bench wire: out of memory for a %ld x %ld tensor\n", rows, cols);
    return 1;
  }
  fill_tensor(x, (size_t)rows, (size_t)cols, (size_t)rank);
  openblas_set_num_threads(1); /* as in a node (gpu/cpu_blas.c): the codec runs beside the stage's own work */
  int rc = 0;
  for (size_t i = 0; i < nd; i++) rc |= bench_one(ds[i], x, (size_t)rows, (size_t)cols, reps);
  free(x);
  return rc;
}
