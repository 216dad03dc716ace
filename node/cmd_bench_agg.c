/* `gwtf bench agg`: what one aggregation costs the aggregator with
 * `--aggregate mean` and with `--aggregate trimmed-mean`, on random
 * contributions of a stage's size, and what the average's signature
 * (train/avg_sig.h) costs its aggregator and each member, printed as JSON. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "node/cmd.h"
#include "train.pb-c.h"
#include "train/agg_robust.h"
#include "train/avg_sig.h"
#include "util/clock.h"
#include "util/rng.h"

#define DEFAULT_PARAMS (1u << 20)
#define DEFAULT_MEMBERS 5
#define DEFAULT_REPS 5

void cmd_bench_agg_help(void) {
  printf("usage: gwtf bench agg [--params N] [--members M] [--trim F] [--reps R]\n\n"
         "Times the aggregator's combination of M contributions of N floats (default\n"
         "%u members, %u floats: 4 MiB each), with the mean and with the coordinate-wise\n"
         "trimmed mean (trim fraction F, default 0.2), median of R runs (default %d);\n"
         "and the average's signature: the aggregator hashes the average and signs it\n"
         "(sign_us), a member verifies the signature and hashes what it received\n"
         "(verify_us); avg_sig_bytes is what the signature fields add to the average's\n"
         "first chunk. Prints one JSON object (milliseconds, microseconds, bytes).\n",
         DEFAULT_MEMBERS, DEFAULT_PARAMS, DEFAULT_REPS);
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* The average's signature over `avg` with m contributors: the
 * aggregator's work (hash + sign) and a member's (verify + hash), in
 * microseconds; returns 0, or 1 when a signature did not verify. */
static int time_signature(const float *avg, long n, long m, double *sign_us, double *verify_us) {
  uint8_t seed[32], pk[32], sk[64], sig[64], hash[32], run[32], hashes[TRAIN_AGG_MAX_INPUTS][32];
  gw_id ids[TRAIN_AGG_MAX_INPUTS];
  memset(seed, 1, sizeof(seed));
  memset(run, 2, sizeof(run));
  crypto_sign_seed_keypair(pk, sk, seed);
  for (long i = 0; i < m; i++) {
    memset(ids[i].b, (int)i, sizeof(ids[i].b));
    memset(hashes[i], (int)i + 1, 32);
  }
  avg_sig_fields f = {.run_id = run, .stage = 1, .iteration = 7, .total_count = (uint32_t)m, .n_floats = (uint64_t)n,
                      .contributors = ids, .hashes = (const uint8_t(*)[32])hashes, .n_contributors = (uint32_t)m,
                      .avg_hash = hash};
  uint64_t t0 = gw_clock_mono_ns();
  avg_sig_hash_floats(avg, (size_t)n, hash);
  avg_sig_sign(&f, sk, sig);
  uint64_t t1 = gw_clock_mono_ns();
  uint8_t got[32];
  int bad = avg_sig_verify(&f, pk, sig) != 0;
  avg_sig_hash_floats(avg, (size_t)n, got);
  bad |= memcmp(got, hash, 32) != 0;
  uint64_t t2 = gw_clock_mono_ns();
  *sign_us = (double)(t1 - t0) / 1e3;
  *verify_us = (double)(t2 - t1) / 1e3;
  return bad;
}

/* Bytes the three signature fields add to a TrainGrad. */
static size_t signature_bytes(void) {
  uint8_t key[32] = {0}, hash[32] = {0}, sig[64] = {0};
  Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
  size_t without = gwtf__train_grad__get_packed_size(&g);
  g.avg_key = (ProtobufCBinaryData){32, key};
  g.avg_hash = (ProtobufCBinaryData){32, hash};
  g.avg_sig = (ProtobufCBinaryData){64, sig};
  return gwtf__train_grad__get_packed_size(&g) - without;
}

int cmd_bench_agg(int argc, char **argv) {
  static const struct option opts[] = {{"params", required_argument, 0, 'n'}, {"members", required_argument, 0, 'm'},
                                       {"trim", required_argument, 0, 't'},   {"reps", required_argument, 0, 'r'},
                                       {"help", no_argument, 0, 'h'},         {0}};
  long n = DEFAULT_PARAMS, m = DEFAULT_MEMBERS, reps = DEFAULT_REPS;
  double trim = 0.2;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'n': n = atol(optarg); break;
    case 'm': m = atol(optarg); break;
    case 't': trim = atof(optarg); break;
    case 'r': reps = atol(optarg); break;
    case 'h': cmd_bench_agg_help(); return 0;
    default: cmd_bench_agg_help(); return 2;
    }
  }
  if (n < 1 || n > (1L << 28) || m < 1 || m > TRAIN_AGG_MAX_INPUTS || reps < 1 || reps > 1000 ||
      !(trim >= 0 && trim < 0.5)) {
    fprintf(stderr, "gwtf bench agg: --params 1..2^28, --members 1..%d, --trim [0, 0.5), --reps 1..1000\n",
            TRAIN_AGG_MAX_INPUTS);
    return 2;
  }
  float *bufs[TRAIN_AGG_MAX_INPUTS] = {0}, *out = malloc((size_t)n * sizeof(float));
  const float *sums[TRAIN_AGG_MAX_INPUTS];
  uint32_t counts[TRAIN_AGG_MAX_INPUTS];
  gw_rng rng;
  gw_rng_seed(&rng, 1);
  int rc = out ? 0 : 1;
  for (long i = 0; i < m && rc == 0; i++) {
    bufs[i] = malloc((size_t)n * sizeof(float));
    if (!bufs[i]) {
      rc = 1;
      break;
    }
    for (long k = 0; k < n; k++) bufs[i][k] = (float)((double)gw_rng_below(&rng, 2000001) / 1e6 - 1.0);
    sums[i] = bufs[i];
    counts[i] = 1 + (uint32_t)(i % 3);
  }
  double t_mean[1000], t_trim[1000], t_sign[1000], t_verify[1000];
  uint32_t total = 0;
  for (long i = 0; i < m; i++) total += counts[i];
  for (long r = 0; r < reps && rc == 0; r++) {
    uint64_t t0 = gw_clock_mono_ns();
    train_agg_mean(sums, (uint32_t)m, (size_t)n, total, out);
    uint64_t t1 = gw_clock_mono_ns();
    rc = train_agg_trimmed_mean(sums, counts, (uint32_t)m, (size_t)n, trim, out) != 0;
    uint64_t t2 = gw_clock_mono_ns();
    t_mean[r] = (double)(t1 - t0) / 1e6;
    t_trim[r] = (double)(t2 - t1) / 1e6;
    if (rc == 0) rc = time_signature(out, n, m, &t_sign[r], &t_verify[r]);
  }
  if (rc == 0) {
    qsort(t_mean, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_trim, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_sign, (size_t)reps, sizeof(double), cmp_double);
    qsort(t_verify, (size_t)reps, sizeof(double), cmp_double);
    printf("{\"params\":%ld,\"members\":%ld,\"trim\":%g,\"trimmed_each_end\":%u,\"mean_ms\":%.3f,"
           "\"trimmed_mean_ms\":%.3f,\"sign_us\":%.1f,\"verify_us\":%.1f,\"avg_sig_bytes\":%zu}\n",
           n, m, trim, train_agg_trim_count((uint32_t)m, trim), t_mean[reps / 2], t_trim[reps / 2],
           t_sign[reps / 2], t_verify[reps / 2], signature_bytes());
  } else {
    fprintf(stderr, "gwtf bench agg: out of memory, or a signature did not verify\n");
  }
  for (long i = 0; i < m; i++) free(bufs[i]);
  free(out);
  return rc;
}
