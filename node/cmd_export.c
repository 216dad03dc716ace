/* node/cmd_export.c — `gwtf export`: the whole model of a run as a Hugging
 * Face–style directory (train/hf_export.h), from the per-stage checkpoints
 * peers write, or from a live swarm's members (node/export_swarm.h). */
#include <dirent.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/cmd.h"
#include "node/export_swarm.h"
#include "node/node.h"
#include "node/run_access.h"
#include "train/checkpoint.h"
#include "train/hf_export.h"
#include "util/err.h"
#include "util/file.h"
#include "util/log.h"

#define EXPORT_MAX_DIRS (64)
#define EXPORT_MAX_CANDIDATES (1024)
/* A stage state file of more than 12 GiB (4 GiB of weights and their two
 * moments) is not one gwtf wrote. */
#define EXPORT_MAX_STATE ((size_t)12 << 30)

void cmd_export_help(void) {
  printf("usage: gwtf export --run NAME --out DIR --from-checkpoints DIR [DIR...]\n"
         "       gwtf export --run NAME --out DIR --bootstrap HOST:PORT [--bootstrap ...]\n"
         "                   [--listen IP:PORT] [--verify-members N] [--timeout-ms N]\n"
         "                   [--data-dir DIR] [--run-key FILE]\n\n"
         "Assembles the whole model of run NAME and writes a Hugging Face-style\n"
         "directory: model.safetensors (GPT-2 names for gpt, LLaMA names for llama,\n"
         "fp32), config.json (GPT2Config / LlamaConfig) and tokenizer.txt (which\n"
         "tokenizer the run used). Every file is written atomically.\n\n"
         "  --run NAME              the run to export\n"
         "  --out DIR               the directory to write (created if needed)\n"
         "  --from-checkpoints DIR  peers' data directories (or their checkpoints/\n"
         "                          folders); further DIRs may follow. Each stage's\n"
         "                          file must match the weight hash in its .json\n"
         "                          sidecar; the newest iteration at which every\n"
         "                          stage has a checkpoint is exported (an older one\n"
         "                          is said so in the log)\n"
         "  --bootstrap HOST:PORT   instead: a peer of the live swarm. The run record and\n"
         "                          the stage directory are looked up in the DHT; each\n"
         "                          stage's state is downloaded from members as a\n"
         "                          joining peer gets it, checked against the hash its\n"
         "                          chunks announce; N members of each stage must hold\n"
         "                          the same weights, all stages the same iteration (a\n"
         "                          stage that moved on meanwhile is fetched again)\n"
         "  --verify-members N      members per stage whose weights must agree (default\n"
         "                          2; fewer when the stage has fewer)\n"
         "  --listen IP:PORT        this tool's session and DHT port (default\n"
         "                          0.0.0.0:0, any free port; a bootstrap peer on 127.x\n"
         "                          lets the DHT take loopback contacts: a local swarm)\n"
         "  --timeout-ms N          give up after N ms (default 120000)\n"
         "  --data-dir DIR          keep this tool's identity there (default: a fresh one\n"
         "                          in a temporary directory, removed afterwards)\n"
         "  --run-key FILE          a private run's key (on its creator's machine\n"
         "                          DATA_DIR/runs/NAME/run.key): this tool certifies\n"
         "                          itself with it, as a member would be; without it a\n"
         "                          private run's members refuse to serve, and export\n"
         "                          stops saying so\n"
         "  --log-level L           debug|info|warn|error (default info)\n\n"
         "Then: gwtf sample --model DIR --prompt TEXT.\n"
         "Exit status: 0 written, 1 failure (the log says which stage and why), 2 usage.\n");
}

typedef struct candidate {
  char path[PATH_MAX];
  ckpt_sidecar side;
} candidate;

typedef struct export_ctx {
  gw_log log;
  const char *run;
  candidate *c;
  int n;
} export_ctx;

/* "<run>.stage<N>.safetensors" -> N; -1 for any other name. */
static int stage_of(const char *run, const char *name) {
  size_t rl = strlen(run);
  if (strncmp(name, run, rl) != 0 || strncmp(name + rl, ".stage", 6) != 0) return -1;
  const char *p = name + rl + 6;
  char *end;
  long s = strtol(p, &end, 10);
  if (end == p || s < 0 || s > 1024 || strcmp(end, ".safetensors") != 0) return -1;
  return (int)s;
}

/* Adds the checkpoints of the run found directly in dir. */
static void scan_dir(export_ctx *x, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) && x->n < EXPORT_MAX_CANDIDATES) {
    if (stage_of(x->run, e->d_name) < 0) continue;
    candidate *c = &x->c[x->n];
    if (snprintf(c->path, sizeof(c->path), "%s/%s", dir, e->d_name) >= (int)sizeof(c->path)) continue;
    char err[512];
    if (ckpt_read_sidecar(c->path, &c->side, err, sizeof(err)) != 0) {
      GW_WARN(&x->log, "export.skip", "path=%s reason=\"%s\"", c->path, err);
      continue;
    }
    if (strcmp(c->side.run, x->run) != 0 || c->side.stage != stage_of(x->run, e->d_name)) {
      GW_WARN(&x->log, "export.skip", "path=%s reason=\"its sidecar names run %s stage %d\"", c->path, c->side.run,
              c->side.stage);
      continue;
    }
    if (!c->side.have_hash) {
      GW_WARN(&x->log, "export.skip", "path=%s reason=\"no weight_hash in its sidecar: cannot verify it\"", c->path);
      continue;
    }
    GW_DEBUG(&x->log, "export.found", "path=%s stage=%d iter=%lld", c->path, c->side.stage, c->side.iteration);
    x->n++;
  }
  closedir(d);
}

static int max_stage(const export_ctx *x) {
  int m = -1;
  for (int i = 0; i < x->n; i++)
    if (x->c[i].side.stage > m) m = x->c[i].side.stage;
  return m;
}

/* Adds one checkpoint file to m after checking its hash. */
static int add_file(export_ctx *x, hf_model *m, const candidate *c) {
  uint8_t *buf = NULL;
  size_t len = 0;
  char err[512] = "";
  int rc = gw_file_read_all(c->path, EXPORT_MAX_STATE, &buf, &len);
  if (rc) snprintf(err, sizeof(err), "%s", gw_strerror(rc));
  int first = 0, nl = 0;
  bool head = false;
  if (!rc) rc = hf_model_add_stage(m, buf, len, c->side.weight_hash, &first, &nl, &head, err, sizeof(err));
  free(buf);
  char hex[2 * HF_HASH_BYTES + 1];
  sodium_bin2hex(hex, sizeof(hex), c->side.weight_hash, HF_HASH_BYTES);
  if (rc)
    GW_WARN(&x->log, "export.stage_rejected", "stage=%d iter=%lld path=%s err=\"%s\"", c->side.stage,
            c->side.iteration, c->path, err);
  else
    GW_INFO(&x->log, "export.stage", "stage=%d iter=%lld first_block=%d blocks=%d head=%d hash=%.16s path=%s",
            c->side.stage, c->side.iteration, first, nl, head, hex, c->path);
  return rc;
}

/* Every stage 0..S at iteration it, each from the first of its files that
 * verifies. 0 when the model is complete. */
static int try_iteration(export_ctx *x, long long it, int S, hf_model *m, char *why, size_t why_len) {
  hf_model_init(m);
  for (int s = 0; s <= S; s++) {
    bool got = false, seen = false;
    for (int i = 0; !got && i < x->n; i++) {
      if (x->c[i].side.stage != s || x->c[i].side.iteration != it) continue;
      seen = true;
      got = add_file(x, m, &x->c[i]) == 0;
    }
    if (!got) {
      snprintf(why, why_len, seen ? "no checkpoint of stage %d at iteration %lld verifies"
                                  : "stage %d has no checkpoint at iteration %lld", s, it);
      hf_model_free(m);
      return GW_ENOENT;
    }
  }
  int rc = hf_model_complete(m, why, why_len);
  if (rc) hf_model_free(m);
  return rc;
}

static int cmp_desc(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The newest iteration every stage has a verified checkpoint of. */
static int assemble_newest(export_ctx *x, hf_model *m, long long *iteration) {
  int S = max_stage(x);
  if (S < 0) {
    GW_ERROR(&x->log, "export.failed", "run=%s reason=\"no checkpoints of this run (with a sidecar) found\"", x->run);
    return GW_ENOENT;
  }
  long long *its = malloc((size_t)x->n * sizeof(long long));
  if (!its) return GW_ENOMEM;
  int n = 0;
  for (int i = 0; i < x->n; i++) its[n++] = x->c[i].side.iteration;
  qsort(its, (size_t)n, sizeof(long long), cmp_desc);
  char why[256] = "", first_why[256] = "";
  int rc = GW_ENOENT;
  for (int i = 0; i < n && rc; i++) {
    if (i && its[i] == its[i - 1]) continue;
    rc = try_iteration(x, its[i], S, m, why, sizeof(why));
    if (rc && !*first_why) snprintf(first_why, sizeof(first_why), "%s", why);
    if (!rc) {
      *iteration = its[i];
      if (its[i] != its[0])
        GW_WARN(&x->log, "export.older", "iter=%lld newest=%lld reason=\"%s\"", its[i], its[0], first_why);
    } else {
      GW_INFO(&x->log, "export.incomplete", "iter=%lld reason=\"%s\"", its[i], why);
    }
  }
  free(its);
  if (rc)
    GW_ERROR(&x->log, "export.failed", "run=%s stages=%d reason=\"no iteration at which every stage has a verified "
             "checkpoint; newest: %s\"", x->run, S + 1, first_why);
  return rc;
}

static int from_checkpoints(export_ctx *x, char **dirs, int n_dirs, hf_model *m, long long *iteration) {
  x->c = calloc(EXPORT_MAX_CANDIDATES, sizeof(candidate));
  if (!x->c) return GW_ENOMEM;
  for (int i = 0; i < n_dirs; i++) {
    char sub[PATH_MAX];
    scan_dir(x, dirs[i]);
    if (snprintf(sub, sizeof(sub), "%s/checkpoints", dirs[i]) < (int)sizeof(sub)) scan_dir(x, sub);
  }
  int rc = assemble_newest(x, m, iteration);
  free(x->c);
  x->c = NULL;
  return rc;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* A swarm on this machine (bootstrap on loopback): its DHT contacts are
 * loopback addresses, which a node accepts only when told to. */
static bool loopback_bootstrap(const node_config *ncfg) {
  for (size_t i = 0; i < ncfg->n_bootstrap; i++) {
    char host[256];
    uint16_t port;
    gw_id id;
    bool has_id;
    if (node_parse_peer_spec(ncfg->bootstrap[i], host, sizeof(host), &port, &id, &has_id) != 0) continue;
    if (strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 || strcmp(host, "::1") == 0) return true;
  }
  return false;
}

/* A node running only the DHT and the export component, until that is done. */
static int from_swarm(node_config *ncfg, export_swarm_opts *so) {
  ncfg->allow_loopback_peers = loopback_bootstrap(ncfg);
  char tmp[] = "/tmp/gwtf-export-XXXXXX";
  bool own_dir = !ncfg->data_dir;
  if (own_dir) {
    if (!mkdtemp(tmp)) return fprintf(stderr, "gwtf export: cannot create a temporary directory\n"), GW_EIO;
    ncfg->data_dir = tmp;
  }
  ncfg->export_swarm = so;
  node *n = NULL;
  char err[512];
  int rc = node_create(ncfg, &n, err, sizeof(err));
  if (rc)
    fprintf(stderr, "gwtf export: %s\n", err);
  else if (node_run(n) != 0 && so->rc == 0)
    rc = GW_EIO;
  node_destroy(n);
  if (own_dir) nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc ? rc : so->rc;
}

int cmd_export(int argc, char **argv) {
  static const struct option opts[] = {
      {"run", required_argument, 0, 'r'},       {"out", required_argument, 0, 'o'},
      {"from-checkpoints", required_argument, 0, 'c'}, {"log-level", required_argument, 0, 'l'},
      {"bootstrap", required_argument, 0, 'b'}, {"listen", required_argument, 0, 'L'},
      {"verify-members", required_argument, 0, 'v'}, {"timeout-ms", required_argument, 0, 't'},
      {"data-dir", required_argument, 0, 'D'},  {"run-key", required_argument, 0, 'k'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  char *dirs[EXPORT_MAX_DIRS];
  int n_dirs = 0, c;
  node_config ncfg;
  node_config_defaults(&ncfg);
  ncfg.port_mapping = P2P_PORTMAP_OFF; /* a short-lived client: nobody needs to reach it */
  gw_addr_parse("0.0.0.0:0", &ncfg.listen);
  export_swarm_opts so = {.timeout_ms = 120000, .verify_members = 2};
  char *end;
  const char *out = NULL;
  export_ctx x = {0};
  gw_log_level level = GW_LOG_INFO;
  const char *key_path = NULL;
  member_key run_key;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': x.run = optarg; break;
    case 'o': out = optarg; break;
    case 'c':
      if (n_dirs < EXPORT_MAX_DIRS) dirs[n_dirs++] = optarg;
      break;
    case 'l':
      if (gw_log_level_parse(optarg, &level) != 0) return cmd_export_help(), 2;
      break;
    case 'b':
      if (ncfg.n_bootstrap < NODE_MAX_BOOTSTRAP) ncfg.bootstrap[ncfg.n_bootstrap++] = optarg;
      break;
    case 'L':
      if (gw_addr_parse(optarg, &ncfg.listen) != 0) return fprintf(stderr, "gwtf export: bad --listen\n"), 2;
      break;
    case 'v':
      so.verify_members = (int)strtol(optarg, &end, 10);
      if (*end || so.verify_members < 1 || so.verify_members > 4)
        return fprintf(stderr, "gwtf export: --verify-members must be 1..4\n"), 2;
      break;
    case 't':
      so.timeout_ms = strtoull(optarg, &end, 10);
      if (*end || so.timeout_ms == 0) return fprintf(stderr, "gwtf export: bad --timeout-ms\n"), 2;
      break;
    case 'D': ncfg.data_dir = optarg; break;
    case 'k': key_path = optarg; break;
    case 'h': cmd_export_help(); return 0;
    default: cmd_export_help(); return 2;
    }
  }
  /* DIRs after --from-checkpoints DIR: getopt moved them to the end */
  for (int i = optind; n_dirs && i < argc && n_dirs < EXPORT_MAX_DIRS; i++) dirs[n_dirs++] = argv[i];
  if (!x.run || !*x.run || strlen(x.run) >= CKPT_RUN_NAME_MAX || !out || (n_dirs > 0) == (ncfg.n_bootstrap > 0) ||
      (optind < argc && !n_dirs)) {
    fprintf(stderr, "gwtf export: needs --run NAME, --out DIR and either --from-checkpoints DIR... or "
                    "--bootstrap HOST:PORT\n");
    return 2;
  }
  gw_log_sink sink;
  gw_log_sink_init(&sink, stderr, level, GW_LOG_TEXT);
  gw_log_init(&x.log, &sink, NULL);
  hf_model m;
  hf_model_init(&m);
  long long iteration = -1;
  int rc;
  if (n_dirs) {
    rc = from_checkpoints(&x, dirs, n_dirs, &m, &iteration);
  } else {
    ncfg.log_level = level;
    if (key_path) {
      char err[512];
      if (run_access_load_key(key_path, false, &run_key, err, sizeof(err)) != 0) {
        fprintf(stderr, "gwtf export: --run-key %s: %s\n", key_path, err);
        hf_model_free(&m);
        return 2;
      }
      so.run_key = &run_key;
    }
    so.run = x.run;
    so.model = &m;
    rc = from_swarm(&ncfg, &so);
    iteration = so.iteration;
  }
  if (rc == 0) {
    char err[512];
    hf_export_info info = {.run = x.run, .iteration = iteration, .source = n_dirs ? "checkpoints" : "swarm"};
    rc = hf_write_dir(out, &m.cfg, m.params, &info, err, sizeof(err));
    if (rc)
      GW_ERROR(&x.log, "export.failed", "out=%s err=\"%s\"", out, err);
    else
      GW_INFO(&x.log, "export.written", "out=%s run=%s iter=%lld arch=%s params=%zu tokenizer=%s", out, x.run,
              iteration, model_arch_name(m.cfg.arch), hf_model_numel(&m.cfg), hf_tokenizer_for(&m.cfg));
  }
  hf_model_free(&m);
  sodium_memzero(&run_key, sizeof(run_key));
  return rc ? 1 : 0;
}
