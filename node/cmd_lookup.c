/* `gwtf lookup --bootstrap HOST:PORT run/NAME[/stage/S]`: join the DHT
 * briefly (as a client: nobody adds us to their tables), print what the
 * stage directory holds for that key, leave. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht/stage_dir.h"
#include "node/cmd.h"
#include "node/dht_runtime.h"
#include "p2p/sockaddr.h"
#include "util/err.h"
#include "util/log.h"

#define LOOKUP_MAX_BOOT (8)
#define LOOKUP_TIMEOUT_S (15)

void cmd_lookup_help(void) {
  printf("usage: gwtf lookup --bootstrap HOST:PORT [--bootstrap ...] KEY [--json] [--timeout SEC]\n"
         "                   [--log-level LEVEL] [--log-format text|json]\n\n"
         "Joins the DHT through the bootstrap peers for a moment and prints what it holds at KEY:\n"
         "  run/NAME/stage/S  the live members of stage S of run NAME, one per line:\n"
         "                    <node-id> <ip:port> capacity=C load=L ttl_ms=T\n"
         "  run/NAME          every run record published for NAME: <publisher> seq=Q ttl_ms=T <value>\n"
         "--json prints one JSON object instead. Exits 0 when something was found, 2 when\n"
         "nothing was, 1 when no bootstrap peer answered within --timeout (default %d s).\n",
         LOOKUP_TIMEOUT_S);
}

typedef struct lookup_job {
  uv_loop_t *loop;
  uv_timer_t timeout;
  dht_runtime *rt;
  const char *key_text;
  char run[STAGE_DIR_NAME_MAX + 1];
  int64_t stage;
  bool json, joined;
  int exit_code;
} lookup_job;

static void finish(lookup_job *job, int code) {
  job->exit_code = code;
  if (job->rt) dht_runtime_stop(job->rt);
  job->rt = NULL;
  uv_close((uv_handle_t *)&job->timeout, NULL);
}

static void print_json(json_t *obj) {
  char *s = json_dumps(obj, JSON_COMPACT);
  if (s) printf("%s\n", s);
  free(s);
  json_decref(obj);
}

static char *to_hex(const uint8_t *p, size_t n) {
  char *s = malloc(2 * n + 1);
  if (s) sodium_bin2hex(s, 2 * n + 1, p, n);
  return s;
}

static void on_members(void *ud, int status, const stage_member *m, size_t n) {
  lookup_job *job = ud;
  if (status != 0) return; /* closed: finish() has already run */
  json_t *arr = job->json ? json_array() : NULL;
  for (size_t i = 0; i < n; i++) {
    char id[GW_ID_HEX_LEN + 1], addr[GW_ADDR_STRLEN];
    gw_id_to_hex(&m[i].id, id);
    gw_addr_format(&m[i].addr, addr);
    if (!job->json) {
      printf("%s %s capacity=%u load=%u ttl_ms=%llu\n", id, addr, m[i].capacity, m[i].load,
             (unsigned long long)m[i].remaining_ms);
      continue;
    }
    char *extra = to_hex(m[i].extra, m[i].extra_len);
    json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:I, s:I, s:s}", "id", id, "addr", addr, "capacity",
                                         (json_int_t)m[i].capacity, "load", (json_int_t)m[i].load, "ttl_ms",
                                         (json_int_t)m[i].remaining_ms, "extra_hex", extra ? extra : ""));
    free(extra);
  }
  if (job->json) print_json(json_pack("{s:s, s:o}", "key", job->key_text, "members", arr));
  if (!job->json && n == 0) fprintf(stderr, "gwtf lookup: no live members at %s\n", job->key_text);
  finish(job, n ? 0 : 2);
}

static bool printable(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] < 0x20 || p[i] > 0x7e) return false;
  return true;
}

static void on_runs(void *ud, int status, const stage_run *r, size_t n) {
  lookup_job *job = ud;
  if (status != 0) return;
  json_t *arr = job->json ? json_array() : NULL;
  for (size_t i = 0; i < n; i++) {
    char id[GW_ID_HEX_LEN + 1];
    gw_id_to_hex(&r[i].publisher, id);
    char *hex = to_hex(r[i].value, r[i].len);
    bool text = printable(r[i].value, r[i].len);
    if (!job->json && text) {
      printf("%s seq=%llu ttl_ms=%llu %.*s\n", id, (unsigned long long)r[i].seq,
             (unsigned long long)r[i].remaining_ms, (int)r[i].len, (const char *)r[i].value);
    } else if (!job->json) {
      printf("%s seq=%llu ttl_ms=%llu hex:%s\n", id, (unsigned long long)r[i].seq,
             (unsigned long long)r[i].remaining_ms, hex ? hex : "");
    } else {
      json_t *o = json_pack("{s:s, s:I, s:I, s:s}", "publisher", id, "seq", (json_int_t)r[i].seq, "ttl_ms",
                            (json_int_t)r[i].remaining_ms, "value_hex", hex ? hex : "");
      if (text) json_object_set_new(o, "value", json_stringn((const char *)r[i].value, r[i].len));
      json_array_append_new(arr, o);
    }
    free(hex);
  }
  if (job->json) print_json(json_pack("{s:s, s:o}", "key", job->key_text, "records", arr));
  if (!job->json && n == 0) fprintf(stderr, "gwtf lookup: no run record at %s\n", job->key_text);
  finish(job, n ? 0 : 2);
}

static void on_joined(void *ud) {
  lookup_job *job = ud;
  dht *d = dht_runtime_dht(job->rt);
  uint64_t now = dht_runtime_now(job->rt);
  job->joined = true;
  int rc = job->stage < 0 ? stage_dir_find_run(d, job->run, on_runs, job, now)
                          : stage_dir_discover(d, job->run, (uint32_t)job->stage, on_members, job, now);
  if (rc != 0) {
    fprintf(stderr, "gwtf lookup: %s\n", gw_strerror(rc));
    finish(job, 1);
  }
}

static void on_timeout(uv_timer_t *t) {
  lookup_job *job = t->data;
  if (job->joined)
    fprintf(stderr, "gwtf lookup: the lookup did not finish in time\n");
  else
    fprintf(stderr, "gwtf lookup: no bootstrap peer answered\n");
  finish(job, 1);
}

/* Resolves HOST:PORT (names too: this runs before the loop does anything). */
static int resolve(uv_loop_t *loop, const char *spec, gw_peer *out) {
  char host[256], port_s[8];
  uint16_t port;
  memset(out, 0, sizeof(*out));
  if (gw_addr_parse(spec, &out->addr) == 0) return 0;
  if (gw_addr_split(spec, host, sizeof(host), &port) != 0) return GW_EINVAL;
  snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
  uv_getaddrinfo_t req;
  struct addrinfo hints = {.ai_socktype = SOCK_DGRAM};
  int rc = uv_getaddrinfo(loop, &req, NULL, host, port_s, &hints);
  if (rc != 0) return rc;
  rc = req.addrinfo ? p2p_addr_from_sockaddr(req.addrinfo->ai_addr, &out->addr) : GW_ENOENT;
  uv_freeaddrinfo(req.addrinfo);
  return rc;
}

static int run_lookup(lookup_job *job, const gw_peer *boot, size_t n_boot, const gw_log *lg, unsigned timeout_s) {
  p2p_identity me;
  p2p_identity_generate(&me); /* a visitor: a throwaway identity */
  bool local = true;
  for (size_t i = 0; i < n_boot; i++) local = local && boot[i].addr.family == 4 && boot[i].addr.ip[0] == 127;
  dht_runtime_config cfg = {.bootstrap = boot, .n_bootstrap = n_boot};
  gw_addr_parse(boot[0].addr.family == 6 ? "[::]:0" : "0.0.0.0:0", &cfg.bind);
  cfg.dht.log = lg;
  cfg.dht.client_only = true;
  cfg.dht.allow_loopback = local;
  cfg.dht.on_joined = on_joined;
  cfg.dht.ud = job;
  uv_timer_init(job->loop, &job->timeout);
  job->timeout.data = job;
  int rc = dht_runtime_start(job->loop, &me, &cfg, &job->rt);
  if (rc != 0) {
    fprintf(stderr, "gwtf lookup: cannot start the DHT: %s\n", gw_strerror(rc));
    job->rt = NULL;
    finish(job, 1);
  } else {
    uv_timer_start(&job->timeout, on_timeout, (uint64_t)timeout_s * 1000, 0);
  }
  uv_run(job->loop, UV_RUN_DEFAULT);
  p2p_identity_wipe(&me);
  return job->exit_code;
}

int cmd_lookup(int argc, char **argv) {
  static const struct option opts[] = {{"bootstrap", required_argument, 0, 'b'}, {"json", no_argument, 0, 'j'},
                                       {"timeout", required_argument, 0, 't'},   {"log-level", required_argument, 0, 'l'},
                                       {"log-format", required_argument, 0, 'f'}, {"help", no_argument, 0, 'h'},
                                       {0}};
  const char *boot_specs[LOOKUP_MAX_BOOT];
  size_t n_boot = 0;
  lookup_job job = {.exit_code = 1};
  gw_log_level level = GW_LOG_WARN;
  gw_log_format format = GW_LOG_TEXT;
  unsigned timeout_s = LOOKUP_TIMEOUT_S;
  int c;
  while ((c = getopt_long(argc, argv, "b:jt:l:f:h", opts, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (n_boot == LOOKUP_MAX_BOOT) {
        fprintf(stderr, "gwtf lookup: at most %d --bootstrap peers\n", LOOKUP_MAX_BOOT);
        return 2;
      }
      boot_specs[n_boot++] = optarg;
      break;
    case 'j': job.json = true; break;
    case 't': timeout_s = (unsigned)strtoul(optarg, NULL, 10); break;
    case 'l':
      if (gw_log_level_parse(optarg, &level) != 0) return fprintf(stderr, "gwtf lookup: bad --log-level\n"), 2;
      break;
    case 'f':
      if (gw_log_format_parse(optarg, &format) != 0) return fprintf(stderr, "gwtf lookup: bad --log-format\n"), 2;
      break;
    case 'h': cmd_lookup_help(); return 0;
    default: cmd_lookup_help(); return 2;
    }
  }
  if (optind != argc - 1 || n_boot == 0 || timeout_s == 0) {
    cmd_lookup_help();
    return 2;
  }
  job.key_text = argv[optind];
  if (stage_dir_parse(job.key_text, job.run, sizeof(job.run), &job.stage) != 0) {
    fprintf(stderr, "gwtf lookup: '%s' is not run/NAME or run/NAME/stage/S\n", job.key_text);
    return 2;
  }
  uv_loop_t loop;
  uv_loop_init(&loop);
  job.loop = &loop;
  gw_peer boot[LOOKUP_MAX_BOOT];
  for (size_t i = 0; i < n_boot; i++) {
    int rc = resolve(&loop, boot_specs[i], &boot[i]);
    if (rc != 0) {
      fprintf(stderr, "gwtf lookup: cannot resolve '%s': %s\n", boot_specs[i], gw_strerror(rc));
      uv_loop_close(&loop);
      return 2;
    }
  }
  gw_log_sink sink;
  gw_log lg;
  gw_log_sink_init(&sink, stderr, level, format);
  gw_log_init(&lg, &sink, NULL);
  int code = run_lookup(&job, boot, n_boot, &lg, timeout_s);
  uv_loop_close(&loop);
  return code;
}
