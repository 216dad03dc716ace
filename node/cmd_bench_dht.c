/* `gwtf bench dht`: N real DHT nodes, each with its own UDP socket on
 * 127.0.0.1, in one process and on one libuv loop.
 *
 * Phases: start and join (each node through node 0 and one random earlier
 * node), settle until no node has work left, publish L records, warm up
 * (every node runs two unmeasured lookups, so that its round-trip estimate
 * reflects the idle network rather than the CPU-bound join phase, as routine
 * traffic would in a live swarm), kill a fraction of the nodes at once
 * (their sockets close; nobody repairs anything), then L lookups of random
 * keys and L fetches of the records. A
 * lookup succeeds when the closest node it returns is the closest live node
 * to the key (other than the asker); a fetch when it returns the record. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dht/routing.h"
#include "node/cmd.h"
#include "node/dht_runtime.h"
#include "util/err.h"
#include "util/rng.h"

#define BENCH_CONCURRENCY (16)      /* lookups (or fetches) in flight at once */
#define BENCH_JOIN_BATCH (25)       /* nodes started together */
#define BENCH_JOIN_WAIT_MS (10000)  /* longest wait for a batch to join before the next */
#define BENCH_CHECK_MS (50)
#define BENCH_VALUE_BYTES (48)      /* about the size of a stage record */
#define BENCH_PHASE_TIMEOUT_MS (300 * 1000)
#define BENCH_WARM_ROUNDS (2)        /* unmeasured lookups per node before the kill */

void cmd_bench_dht_help(void) {
  printf("usage: gwtf bench dht [--nodes N] [--lookups L] [--kill FRACTION] [--seed S] [--json]\n"
         "                      [--settle SEC] [--concurrency C]\n\n"
         "Runs N DHT nodes (default 1000), each with its own UDP socket on 127.0.0.1, in one\n"
         "process. After they join and settle, it publishes L records (default 1000), kills\n"
         "FRACTION of the nodes at once (default 0) with no repair, then runs L lookups of\n"
         "random keys and L fetches of the records, C at a time (default %d). Prints the\n"
         "success rates, hops, RPCs, bytes and latency per lookup (median, p95/p99), the\n"
         "largest datagram and the memory per node; --json prints one JSON object.\n",
         BENCH_CONCURRENCY);
}

typedef struct bench bench;

typedef struct bnode {
  p2p_identity me;
  dht_runtime *rt;
  bool alive, joined;
  bench *b;
} bnode;

typedef struct series {
  double *v;
  size_t n;
} series;

struct bench {
  uv_loop_t loop;
  size_t n_nodes, n_lookups, concurrency;
  double kill;
  uint64_t seed;
  unsigned settle_s;
  bnode *nodes;
  size_t started, joined;
  gw_rng rng;
  /* records published before the kill */
  gw_id *keys;
  size_t *owner;
  uint8_t (*values)[BENCH_VALUE_BYTES];
  size_t pub_next, pub_done, pub_acked;
  /* the phase running: jobs to start, started, in flight, done */
  size_t jobs, next, inflight, done, ok;
  series hops, rpcs, bytes, ms;
  size_t rec_ok;
  uint64_t max_dgram, timeouts;
  double setup_s, rss_per_node;
};

/* ---- loop helpers ---- */

static void on_wake(uv_timer_t *t) { (void)t; }

/* Runs the loop until pred holds or timeout_ms passes; returns pred. pred
 * is checked every BENCH_CHECK_MS at most (some predicates scan every node). */
static bool run_until(bench *b, bool (*pred)(bench *), uint64_t timeout_ms) {
  uv_timer_t t;
  uv_timer_init(&b->loop, &t);
  uv_timer_start(&t, on_wake, BENCH_CHECK_MS, BENCH_CHECK_MS); /* so pred is rechecked when idle */
  uint64_t end = uv_now(&b->loop) + timeout_ms, checked = 0;
  bool ok = pred(b);
  while (!ok && uv_now(&b->loop) < end) {
    uv_run(&b->loop, UV_RUN_ONCE);
    if (uv_now(&b->loop) - checked >= BENCH_CHECK_MS) {
      checked = uv_now(&b->loop);
      ok = pred(b);
    }
  }
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(&b->loop, UV_RUN_NOWAIT);
  return ok || pred(b);
}

static double rss_bytes(void) {
  long pages = 0, resident = 0;
  FILE *fp = fopen("/proc/self/statm", "r");
  if (!fp) return 0;
  if (fscanf(fp, "%ld %ld", &pages, &resident) != 2) resident = 0;
  fclose(fp);
  return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static size_t pick_live(bench *b) {
  for (;;) {
    size_t i = (size_t)gw_rng_below(&b->rng, b->n_nodes);
    if (b->nodes[i].alive) return i;
  }
}

/* ---- start, join, settle ---- */

static void on_joined(void *ud) {
  bnode *n = ud;
  n->joined = true;
  n->b->joined++;
}

static int start_node(bench *b, size_t i) {
  bnode *n = &b->nodes[i];
  uint8_t seed[32];
  uint64_t mix[2] = {b->seed, i};
  crypto_generichash(seed, sizeof(seed), (const uint8_t *)mix, sizeof(mix), NULL, 0);
  p2p_identity_from_seed(seed, &n->me);
  n->b = b;
  gw_peer boot[2];
  size_t nb = 0;
  memset(boot, 0, sizeof(boot));
  if (i > 0) p2p_udp_local_addr(dht_runtime_udp(b->nodes[0].rt), &boot[nb++].addr);
  if (i > 1) p2p_udp_local_addr(dht_runtime_udp(b->nodes[1 + gw_rng_below(&b->rng, i - 1)].rt), &boot[nb++].addr);
  dht_runtime_config cfg = {.bootstrap = boot, .n_bootstrap = nb};
  gw_addr_parse("127.0.0.1:0", &cfg.bind);
  cfg.dht.allow_loopback = true;
  cfg.dht.rate_ip = UINT32_MAX; /* every node shares 127.0.0.1 */
  cfg.dht.on_joined = on_joined;
  cfg.dht.ud = n;
  int rc = dht_runtime_start(&b->loop, &n->me, &cfg, &n->rt);
  if (rc == 0) n->alive = true;
  if (i == 0 && rc == 0) on_joined(n); /* the first node has nobody to join */
  return rc;
}

static bool all_joined(bench *b) { return b->joined == b->started; }

static bool quiet(bench *b) {
  for (size_t i = 0; i < b->started; i++) {
    dht_stats st;
    if (!b->nodes[i].alive) continue;
    dht_get_stats(dht_runtime_dht(b->nodes[i].rt), &st);
    if (st.lookups_active > 0 || st.rpcs_pending > 0) return false;
  }
  return true;
}

static int start_all(bench *b) {
  for (size_t i = 0; i < b->n_nodes; i++) {
    int rc = start_node(b, i);
    if (rc != 0) {
      fprintf(stderr, "gwtf bench dht: node %zu: %s (raise the open-files limit?)\n", i, gw_strerror(rc));
      return rc;
    }
    b->started++;
    /* Pace by progress, not by the clock: a batch joins before the next one
     * starts, so a busy machine slows the setup down instead of timing it out. */
    if (b->started % BENCH_JOIN_BATCH == 0) run_until(b, all_joined, BENCH_JOIN_WAIT_MS);
  }
  return 0;
}

/* ---- records ---- */

static void publish_next(bench *b);

static void on_published(void *ud, int status, size_t stored) {
  bench *b = ud;
  (void)status;
  b->pub_done++;
  b->pub_acked += stored > 0;
  publish_next(b);
}

static void publish_next(bench *b) {
  while (b->pub_next < b->n_lookups && b->pub_next - b->pub_done < b->concurrency) {
    size_t i = b->pub_next++;
    char name[64];
    snprintf(name, sizeof(name), "bench/%llu/%zu", (unsigned long long)b->seed, i);
    gw_id_hash_str(name, &b->keys[i]);
    gw_rng_bytes(&b->rng, b->values[i], BENCH_VALUE_BYTES);
    size_t who = pick_live(b);
    b->owner[i] = who;
    dht_runtime *rt = b->nodes[who].rt;
    /* Each publisher's callback is shared: a node may publish several keys. */
    if (dht_publish(dht_runtime_dht(rt), &b->keys[i], b->values[i], BENCH_VALUE_BYTES, on_published, b,
                    dht_runtime_now(rt)) != 0)
      b->pub_done++;
  }
}

static bool all_published(bench *b) { return b->pub_done == b->n_lookups; }

/* ---- the measured phase ---- */

typedef struct job {
  bench *b;
  uint64_t t0;
  size_t asker, truth, record;
} job;

static void push(series *s, double v) { s->v[s->n++] = v; }

static void sample(bench *b, const dht_lookup_stats *st, uint64_t t0) {
  push(&b->hops, st->hops);
  push(&b->rpcs, st->rpcs);
  push(&b->bytes, (double)st->bytes);
  push(&b->ms, (double)(uv_hrtime() - t0) / 1e6);
  b->timeouts += st->timeouts;
}

static int start_lookup(bench *b, job *j);
static int start_fetch(bench *b, job *j);
typedef int (*job_start_fn)(bench *b, job *j);

/* Keeps `concurrency` jobs in flight until b->jobs have been started;
 * start() sends one and returns 0, or fails (the job then counts as done). */
static void launch(bench *b, job_start_fn start) {
  while (b->next < b->jobs && b->inflight < b->concurrency) {
    b->next++;
    job *j = calloc(1, sizeof(*j));
    if (j) {
      j->b = b;
      b->inflight++;
    }
    if (!j || start(b, j) != 0) {
      if (j) b->inflight--;
      free(j);
      b->done++;
    }
  }
}

static void job_done(job *j, job_start_fn next) {
  bench *b = j->b;
  b->done++;
  b->inflight--;
  free(j);
  launch(b, next);
}

static void on_nodes(void *ud, int status, const gw_peer *closest, size_t n, const dht_lookup_stats *st) {
  job *j = ud;
  bench *b = j->b;
  if (status != GW_ECLOSED) {
    sample(b, st, j->t0);
    if (status == 0 && n > 0 && gw_id_eq(&closest[0].id, &b->nodes[j->truth].me.id)) b->ok++;
  }
  job_done(j, start_lookup);
}

/* The closest live node to target other than `asker`: what a lookup must find. */
static size_t true_closest(bench *b, const gw_id *target, size_t asker) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < b->n_nodes; i++) {
    if (!b->nodes[i].alive || i == asker) continue;
    if (best == SIZE_MAX || dht_dist_cmp(target, &b->nodes[i].me.id, &b->nodes[best].me.id) < 0) best = i;
  }
  return best;
}

static int start_lookup(bench *b, job *j) {
  gw_id target;
  gw_rng_bytes(&b->rng, target.b, sizeof(target.b));
  j->asker = pick_live(b);
  j->truth = true_closest(b, &target, j->asker);
  j->t0 = uv_hrtime();
  dht_runtime *rt = b->nodes[j->asker].rt;
  return dht_find_node(dht_runtime_dht(rt), &target, on_nodes, j, dht_runtime_now(rt));
}

static void on_records(void *ud, int status, const dht_record *recs, size_t n, const dht_lookup_stats *st) {
  job *j = ud;
  bench *b = j->b;
  (void)st;
  for (size_t i = 0; status == 0 && i < n; i++)
    if (gw_id_eq(&recs[i].publisher, &b->nodes[b->owner[j->record]].me.id) &&
        recs[i].value_len == BENCH_VALUE_BYTES && memcmp(recs[i].value, b->values[j->record], BENCH_VALUE_BYTES) == 0) {
      b->rec_ok++;
      break;
    }
  job_done(j, start_fetch);
}

/* Warm-up: each node in turn looks up a random key; nothing is measured. */
static int start_warm(bench *b, job *j);

static void on_warm(void *ud, int status, const gw_peer *closest, size_t n, const dht_lookup_stats *st) {
  (void)status, (void)closest, (void)n, (void)st;
  job_done(ud, start_warm);
}

static int start_warm(bench *b, job *j) {
  gw_id target;
  gw_rng_bytes(&b->rng, target.b, sizeof(target.b));
  dht_runtime *rt = b->nodes[(b->next - 1) % b->n_nodes].rt;
  return dht_find_node(dht_runtime_dht(rt), &target, on_warm, j, dht_runtime_now(rt));
}

static int start_fetch(bench *b, job *j) {
  j->record = (size_t)gw_rng_below(&b->rng, b->n_lookups);
  j->asker = pick_live(b);
  dht_runtime *rt = b->nodes[j->asker].rt;
  return dht_fetch(dht_runtime_dht(rt), &b->keys[j->record], on_records, j, dht_runtime_now(rt));
}

static bool phase_done(bench *b) { return b->done == b->jobs; }

/* Runs one phase of `jobs` jobs to the end. */
static bool run_phase(bench *b, size_t jobs, job_start_fn start) {
  b->jobs = jobs;
  b->next = b->done = b->inflight = 0;
  launch(b, start);
  return run_until(b, phase_done, BENCH_PHASE_TIMEOUT_MS);
}

static void kill_fraction(bench *b) {
  size_t victims = (size_t)llround(b->kill * (double)b->n_nodes);
  size_t *order = malloc(b->n_nodes * sizeof(*order));
  if (!order) return;
  for (size_t i = 0; i < b->n_nodes; i++) order[i] = i;
  for (size_t i = b->n_nodes; i > 1; i--) {
    size_t j = (size_t)gw_rng_below(&b->rng, i);
    size_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
  for (size_t i = 0; i < victims && i + 1 < b->n_nodes; i++) {
    bnode *n = &b->nodes[order[i]];
    dht_runtime_stop(n->rt); /* the socket closes: later datagrams to it are lost */
    n->rt = NULL;
    n->alive = false;
  }
  free(order);
}

/* ---- results ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile. */
static double pct(series *s, double p) {
  if (s->n == 0) return 0;
  qsort(s->v, s->n, sizeof(double), cmp_double);
  size_t rank = (size_t)ceil(p * (double)s->n);
  return s->v[rank ? rank - 1 : 0];
}

static void collect_udp(bench *b, uint64_t *rejected, uint64_t *rate_limited) {
  for (size_t i = 0; i < b->n_nodes; i++) {
    if (!b->nodes[i].alive) continue;
    const p2p_udp_stats *u = p2p_udp_get_stats(dht_runtime_udp(b->nodes[i].rt));
    dht_stats st;
    dht_get_stats(dht_runtime_dht(b->nodes[i].rt), &st);
    if (u->max_dgram_out > b->max_dgram) b->max_dgram = u->max_dgram_out;
    if (u->max_dgram_in > b->max_dgram) b->max_dgram = u->max_dgram_in;
    *rejected += u->rejected_auth + u->rejected_malformed + u->rejected_oversize;
    *rate_limited += st.dropped_rate;
  }
}

static void report(bench *b, bool json, double lookup_success, double record_success) {
  uint64_t rejected = 0, rate_limited = 0;
  collect_udp(b, &rejected, &rate_limited);
  json_t *o = json_pack(
      "{s:I, s:I, s:f, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:f, s:I, s:I}",
      "nodes", (json_int_t)b->n_nodes, "lookups", (json_int_t)b->n_lookups, "kill", b->kill, "seed",
      (json_int_t)b->seed, "joined", (json_int_t)b->joined, "lookup_success", lookup_success, "record_success",
      record_success, "hops_median", pct(&b->hops, 0.5), "hops_p95", pct(&b->hops, 0.95), "rpcs_median",
      pct(&b->rpcs, 0.5), "rpcs_p95", pct(&b->rpcs, 0.95), "bytes_per_lookup_median", pct(&b->bytes, 0.5),
      "bytes_per_lookup_p95", pct(&b->bytes, 0.95), "latency_ms_median", pct(&b->ms, 0.5), "latency_ms_p99",
      pct(&b->ms, 0.99), "max_datagram_bytes", (json_int_t)b->max_dgram, "rss_bytes_per_node",
      (json_int_t)llround(b->rss_per_node), "setup_s", b->setup_s, "timeouts_per_lookup",
      b->n_lookups ? (double)b->timeouts / (double)b->n_lookups : 0.0, "udp_rejected", (json_int_t)rejected,
      "rate_limited", (json_int_t)rate_limited);
  if (json) {
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
    printf("%s\n", s ? s : "{}");
    free(s);
  } else {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
      if (json_is_integer(v))
        printf("%-24s %lld\n", k, (long long)json_integer_value(v));
      else
        printf("%-24s %.4g\n", k, json_real_value(v));
    }
  }
  json_decref(o);
}

/* ---- the command ---- */

static int parse_args(bench *b, bool *json, int argc, char **argv) {
  static const struct option opts[] = {
      {"nodes", required_argument, 0, 'n'},  {"lookups", required_argument, 0, 'l'},
      {"kill", required_argument, 0, 'k'},   {"seed", required_argument, 0, 's'},
      {"json", no_argument, 0, 'j'},         {"settle", required_argument, 0, 't'},
      {"concurrency", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'}, {0}};
  int c;
  while ((c = getopt_long(argc, argv, "n:l:k:s:jt:c:h", opts, NULL)) != -1) {
    switch (c) {
    case 'n': b->n_nodes = strtoul(optarg, NULL, 10); break;
    case 'l': b->n_lookups = strtoul(optarg, NULL, 10); break;
    case 'k': b->kill = strtod(optarg, NULL); break;
    case 's': b->seed = strtoull(optarg, NULL, 10); break;
    case 'j': *json = true; break;
    case 't': b->settle_s = (unsigned)strtoul(optarg, NULL, 10); break;
    case 'c': b->concurrency = strtoul(optarg, NULL, 10); break;
    case 'h': cmd_bench_dht_help(); return 1;
    default: cmd_bench_dht_help(); return 2;
    }
  }
  if (optind != argc || b->n_nodes < 2 || b->n_lookups == 0 || b->concurrency == 0 || !(b->kill >= 0) ||
      b->kill >= 1) {
    fprintf(stderr, "gwtf bench dht: need --nodes >= 2, --lookups >= 1, 0 <= --kill < 1\n");
    return 2;
  }
  return 0;
}

static bool alloc_series(bench *b) {
  series *all[] = {&b->hops, &b->rpcs, &b->bytes, &b->ms};
  for (size_t i = 0; i < 4; i++)
    if (!(all[i]->v = calloc(b->n_lookups, sizeof(double)))) return false;
  b->keys = calloc(b->n_lookups, sizeof(*b->keys));
  b->owner = calloc(b->n_lookups, sizeof(*b->owner));
  b->values = calloc(b->n_lookups, sizeof(*b->values));
  b->nodes = calloc(b->n_nodes, sizeof(*b->nodes));
  return b->keys && b->owner && b->values && b->nodes;
}

static void free_bench(bench *b) {
  for (size_t i = 0; i < b->n_nodes && b->nodes; i++)
    if (b->nodes[i].alive) dht_runtime_stop(b->nodes[i].rt);
  uv_run(&b->loop, UV_RUN_DEFAULT);
  uv_loop_close(&b->loop);
  free(b->hops.v), free(b->rpcs.v), free(b->bytes.v), free(b->ms.v);
  free(b->keys), free(b->owner), free(b->values), free(b->nodes);
}

static int run(bench *b, bool json) {
  uint64_t t0 = uv_hrtime();
  double rss0 = rss_bytes();
  if (start_all(b) != 0) return 1;
  if (!run_until(b, all_joined, BENCH_PHASE_TIMEOUT_MS))
    fprintf(stderr, "gwtf bench dht: only %zu of %zu nodes joined\n", b->joined, b->n_nodes);
  run_until(b, quiet, (uint64_t)b->settle_s * 1000);
  b->rss_per_node = (rss_bytes() - rss0) / (double)b->n_nodes;
  b->setup_s = (double)(uv_hrtime() - t0) / 1e9;
  publish_next(b);
  if (!run_until(b, all_published, BENCH_PHASE_TIMEOUT_MS))
    fprintf(stderr, "gwtf bench dht: %zu of %zu publications finished\n", b->pub_done, b->n_lookups);
  run_until(b, quiet, (uint64_t)b->settle_s * 1000);
  run_phase(b, BENCH_WARM_ROUNDS * b->n_nodes, start_warm);
  kill_fraction(b);
  run_phase(b, b->n_lookups, start_lookup);
  double lookup_success = (double)b->ok / (double)b->n_lookups;
  run_phase(b, b->n_lookups, start_fetch);
  double record_success = (double)b->rec_ok / (double)b->n_lookups;
  report(b, json, lookup_success, record_success);
  return 0;
}

int cmd_bench_dht(int argc, char **argv) {
  bench b = {.n_nodes = 1000, .n_lookups = 1000, .seed = 1, .settle_s = 60, .concurrency = BENCH_CONCURRENCY};
  bool json = false;
  int rc = parse_args(&b, &json, argc, argv);
  if (rc != 0) return rc == 1 ? 0 : rc;
  raise_nofile();
  gw_rng_seed(&b.rng, b.seed);
  if (uv_loop_init(&b.loop) != 0 || !alloc_series(&b)) {
    fprintf(stderr, "gwtf bench dht: out of memory\n");
    return 1;
  }
  rc = run(&b, json);
  free_bench(&b);
  return rc;
}
