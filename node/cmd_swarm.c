/* `gwtf swarm`: a whole training swarm on this machine, one process per peer.
 *
 * It starts the data nodes (the first creates the run) and the relays as
 * separate `gwtf node` processes on loopback, merges their log streams on
 * screen (each line prefixed with the peer's name, coloured on a TTY), and
 * with --churn P kills each relay with probability P per iteration — SIGKILL
 * at a random moment of the iteration, so crashes land in forward, backward
 * and aggregation — restarting it a little later with a fresh identity.
 *
 * The children log JSON; this process reads their events to follow the run:
 * iteration.done from the data nodes (loss, microbatches, time), the weight
 * hash every peer logs after each aggregation (every stage must agree,
 * except for the last hash of a peer that was killed before using it:
 * node/swarm_hashes.h),
 * forward re-routes, backward recoveries, lost microbatches and the compute
 * spent on work that never reached an aggregation (node/swarm_events.c
 * counts them). At the end it prints a summary and writes it as JSON
 * (--summary-json: node/swarm_summary.c). This file keeps the processes,
 * their output and the stopping; node/swarm_internal.h is the state the
 * three share.
 *
 * Exit status: 0 when every iteration completed, the stages' weights agree
 * and no peer other than the ones it killed exited abnormally; 1 otherwise. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "node/cmd.h"
#include "node/swarm_args.h"
#include "node/swarm_internal.h"
#include "train/peer.h"
#include "train/data.h"
#include "train/wire_codec.h"
#include "util/err.h"
#include "util/file.h"
#include "util/rng.h"

#define STOP_GRACE_MS 5000

static const char *const colours[] = {"\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[91m"};

/* ---- output ---- */

void swarm_say(swarm *sw, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%sswarm%s | ", sw->tty ? "\033[1m" : "", sw->tty ? "\033[0m" : "");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
}

/* Renders one JSON log line of a child as text: "name | time LEVEL node stage event k=v ...". */
static void render(swarm *sw, peer_proc *p, json_t *ev) {
  if (sw->o.quiet) return;
  const char *level = json_string_value(json_object_get(ev, "level"));
  const char *event = json_string_value(json_object_get(ev, "event"));
  const char *node = json_string_value(json_object_get(ev, "node"));
  const char *ts = json_string_value(json_object_get(ev, "ts"));
  json_t *stage = json_object_get(ev, "stage");
  char line[LINE_MAX_BYTES], st[16];
  size_t off = 0;
  if (json_is_integer(stage))
    snprintf(st, sizeof(st), "s%lld", (long long)json_integer_value(stage));
  else
    snprintf(st, sizeof(st), "-");
  const char *col = sw->tty ? colours[p->index % 6] : "", *rst = sw->tty ? "\033[0m" : "";
  off += (size_t)snprintf(line + off, sizeof(line) - off, "%s%-4s%s | %s %-5s %s %s %s%s%s", col, p->name, rst,
                          ts ? ts + 11 : "", level ? level : "", node ? node : "-", st,
                          sw->tty ? "\033[1m" : "", event ? event : "?", rst);
  const char *key;
  json_t *val;
  json_object_foreach(ev, key, val) {
    if (!strcmp(key, "ts") || !strcmp(key, "level") || !strcmp(key, "node") || !strcmp(key, "stage") ||
        !strcmp(key, "event"))
      continue;
    if (off + 64 >= sizeof(line)) break;
    if (json_is_string(val))
      off += (size_t)snprintf(line + off, sizeof(line) - off, " %s=%s", key, json_string_value(val));
    else if (json_is_integer(val))
      off += (size_t)snprintf(line + off, sizeof(line) - off, " %s=%lld", key, (long long)json_integer_value(val));
    else if (json_is_real(val))
      off += (size_t)snprintf(line + off, sizeof(line) - off, " %s=%g", key, json_real_value(val));
    else if (json_is_boolean(val))
      off += (size_t)snprintf(line + off, sizeof(line) - off, " %s=%s", key, json_is_true(val) ? "true" : "false");
  }
  puts(line);
}

static void on_line(swarm *sw, peer_proc *p, char *line) {
  json_error_t jerr;
  json_t *ev = line[0] == '{' ? json_loads(line, 0, &jerr) : NULL;
  if (!ev) {
    if (!sw->o.quiet) printf("%-4s | %s\n", p->name, line); /* not a log line: show it as it is */
    return;
  }
  render(sw, p, ev);
  swarm_web_line(sw->web, p->name, json_string_value(json_object_get(ev, "node")),
                 json_string_value(json_object_get(ev, "event")), line);
  swarm_on_event(sw, p, ev);
  json_decref(ev);
}

/* ---- children ---- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  peer_stream *st = h->data;
  (void)suggested;
  buf->base = st->buf + st->len;
  buf->len = sizeof(st->buf) - st->len;
}

static void stream_closed(uv_handle_t *h);

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  peer_stream *st = s->data;
  (void)buf;
  if (n < 0) { /* EOF: the child is gone and everything it wrote was read */
    uv_read_stop(s);
    if (!uv_is_closing((uv_handle_t *)s)) uv_close((uv_handle_t *)s, stream_closed);
    return;
  }
  st->len += (size_t)n;
  size_t start = 0;
  for (size_t i = 0; i < st->len; i++) {
    if (st->buf[i] != '\n') continue;
    st->buf[i] = '\0';
    on_line(st->p->sw, st->p, st->buf + start);
    start = i + 1;
  }
  memmove(st->buf, st->buf + start, st->len - start);
  st->len -= start;
  if (st->len == sizeof(st->buf)) st->len = 0; /* an absurdly long line: drop it */
}

static void stream_closed(uv_handle_t *h) {
  peer_stream *st = h->data;
  st->open = false;
}

static bool streams_open(const peer_proc *p) { return p->streams[0].open || p->streams[1].open; }

static void close_streams(peer_proc *p) {
  for (int i = 0; i < 2; i++) {
    peer_stream *st = &p->streams[i];
    if (!st->open || uv_is_closing((uv_handle_t *)&st->pipe)) continue;
    uv_read_stop((uv_stream_t *)&st->pipe);
    uv_close((uv_handle_t *)&st->pipe, stream_closed);
  }
}

static void proc_closed(uv_handle_t *h) {
  peer_proc *p = h->data;
  p->process_open = false;
}

static void start_peer(peer_proc *p);

static void restart_cb(uv_timer_t *t) {
  peer_proc *p = t->data;
  if (p->sw->stopping || p->running) return;
  if (streams_open(p) || p->process_open) { /* the old process is not reaped yet */
    uv_timer_start(t, restart_cb, 100, 0);
    return;
  }
  p->generation++;
  start_peer(p);
}

static void exit_cb(uv_process_t *proc, int64_t status, int term_signal) {
  peer_proc *p = proc->data;
  swarm *sw = p->sw;
  p->running = false;
  /* Abnormal: a non-zero status, or a signal we did not send. */
  bool expected = (status == 0 && term_signal == 0) ||
                  ((p->killed_by_us || p->crashed_itself) && term_signal == SIGKILL) ||
                  (sw->stopping && (term_signal == SIGTERM || term_signal == SIGKILL));
  if (p->crashed_itself && !sw->stopping) p->killed_by_us = true; /* restarted like a churned peer */
  if (p->killed_by_us && !sw->stopping) p->killed_generation = p->generation;
  char fields[128];
  snprintf(fields, sizeof(fields), "\"status\":%lld,\"signal\":%d,\"expected\":%s", (long long)status, term_signal,
           expected ? "true" : "false");
  swarm_web_note(sw->web, p->name, expected ? "info" : "error", "swarm.exit", fields);
  if (!expected) {
    sw->unexpected_exits++;
    swarm_say(sw, "%s exited unexpectedly (status %lld, signal %d)", p->name, (long long)status, term_signal);
    if (p->data && !sw->stopping) {
      /* No run without its data nodes: stop rather than wait forever. */
      swarm_say(sw, "a data node is gone: stopping the swarm");
      sw->failed = true;
      swarm_stop_all(sw);
    }
  }
  uv_close((uv_handle_t *)proc, proc_closed); /* its streams close at their EOF */
  if (p->killed_by_us && !sw->stopping && !p->data && !p->no_restart) {
    /* a data node does not come back (it would create the run), nor a
     * peer of a stage --kill-stage wiped out */
    /* Its work since its last aggregation never reaches one. */
    sw->unaggregated_s += p->unaggregated_compute_s;
    p->unaggregated_compute_s = 0;
    uint64_t delay = (uint64_t)(1000.0 * fmax(0.5, sw->last_iter_secs) * sw->o.restart_after);
    uv_timer_start(&p->restart_timer, restart_cb, delay, 0);
  }
}

/* What peer p's command line depends on besides the options
 * (node/swarm_args.h). */
static swarm_child child_of(const swarm *sw, const peer_proc *p) {
  /* a fresh data node must not bootstrap from the dead: the first live
   * peer's port (the run's creator's while it runs) */
  int boot = sw->peers[0].port;
  for (int i = 0; i < sw->n_peers; i++)
    if (&sw->peers[i] != p && sw->peers[i].running) {
      boot = sw->peers[i].port;
      break;
    }
  return (swarm_child){.index = p->index, .name = p->name, .data = p->data, .late = p->late,
                       .replacement = p->replacement, .generation = p->generation, .port = p->port,
                       .bootstrap_port = boot};
}

static void start_peer(peer_proc *p) {
  swarm *sw = p->sw;
  static char store[80][PATH_MAX];
  char *argv[80];
  swarm_child c = child_of(sw, p);
  if (swarm_child_byzantine(&sw->o, &c) && swarm_byzantine_identity(sw->workdir, &c) != 0)
    swarm_say(sw, "%s: no hostile identity made", p->name);
  swarm_child_args(&sw->o, &(swarm_paths){sw->exe, sw->workdir, sw->dataset}, &c, argv, store, 80);
  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  for (int i = 0; i < 2; i++) {
    peer_stream *st = &p->streams[i];
    uv_pipe_init(sw->loop, &st->pipe, 0);
    st->pipe.data = st;
    st->p = p;
    st->len = 0;
    st->open = true;
    stdio[1 + i].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1 + i].data.stream = (uv_stream_t *)&st->pipe;
  }
  uv_process_options_t opt = {0};
  opt.file = sw->exe;
  opt.args = argv;
  opt.exit_cb = exit_cb;
  opt.stdio_count = 3;
  opt.stdio = stdio;
  p->proc.data = p;
  p->killed_by_us = false;
  p->stage = p->data ? 0 : -1; /* a fresh identity is placed anew */
  p->ready = false;
  p->crashed_itself = false;
  p->kill_pending = false;
  p->unaggregated_compute_s = 0;
  int rc = uv_spawn(sw->loop, &p->proc, &opt);
  if (rc != 0) {
    swarm_say(sw, "cannot start %s: %s", p->name, uv_strerror(rc));
    close_streams(p);
    sw->failed = true;
    return;
  }
  p->running = true;
  p->process_open = true;
  for (int i = 0; i < 2; i++) uv_read_start((uv_stream_t *)&p->streams[i].pipe, alloc_cb, read_cb);
  if (p->generation > 0) swarm_say(sw, "%s restarted with a fresh identity (generation %d)", p->name, p->generation);
  char fields[64];
  snprintf(fields, sizeof(fields), "\"generation\":%d,\"late\":%s", p->generation, p->late ? "true" : "false");
  swarm_web_note(sw->web, p->name, "info", "swarm.start", fields);
}

/* ---- late joiners ---- */

void swarm_start_late(swarm *sw) {
  for (int i = 0; i < sw->n_peers; i++) {
    peer_proc *p = &sw->peers[i];
    if (!p->late || p->running) continue;
    swarm_say(sw, "%s joins the run late (after iteration %d)", p->name,
        sw->o.kill_stage > 0 ? sw->o.kill_at : sw->o.late_after);
    start_peer(p);
  }
}

/* ---- --kill-stage, --kill-data-node, --kill-fraction (node/swarm_kill.c decides) ---- */

static void kop_peer(void *ud, int i, swarm_kill_peer *out) {
  const peer_proc *p = &((swarm *)ud)->peers[i];
  *out = (swarm_kill_peer){.running = p->running, .data = p->data, .stage = p->stage};
}

static void kop_kill(void *ud, int i, bool restart, const char *reason) {
  swarm *sw = ud;
  peer_proc *p = &sw->peers[i];
  if (!p->running) return;
  p->killed_by_us = true;
  p->no_restart = !restart;
  uv_timer_stop(&p->kill_timer);
  p->kill_pending = false;
  sw->crashes++;
  swarm_waste_peer_lost(sw->waste, p->node);
  swarm_say(sw, "%s: killing %s of stage %d (SIGKILL, %s)", reason, p->name, p->stage,
      restart ? "restarted later with a fresh identity" : "not restarted");
  char fields[96];
  snprintf(fields, sizeof(fields), "\"signal\":\"SIGKILL\",\"reason\":\"%s\"", reason);
  swarm_web_note(sw->web, p->name, "warn", "swarm.kill", fields);
  uv_process_kill(&p->proc, SIGKILL);
}

/* A fresh data node in p's place: a new identity and data dir (the next
 * generation), the same dataset; it joins the run rather than create it. */
static void kop_replace(void *ud, int i, uint64_t after_ms) {
  peer_proc *p = &((swarm *)ud)->peers[i];
  p->replacement = true;
  uv_timer_start(&p->restart_timer, restart_cb, after_ms, 0);
}

static void kop_start_late(void *ud) { swarm_start_late(ud); }
static void kop_say(void *ud, const char *line) { swarm_say(ud, "%s", line); }

static void kill_ops(swarm *sw, swarm_kill_ops *ops) {
  *ops = (swarm_kill_ops){.ud = sw, .peer = kop_peer, .kill = kop_kill, .replace = kop_replace,
                          .start_late = kop_start_late, .say = kop_say};
}

/* ---- churn ---- */

static void kill_cb(uv_timer_t *t) {
  peer_proc *p = t->data;
  swarm *sw = p->sw;
  p->kill_pending = false;
  if (!p->running || sw->stopping) return;
  p->killed_by_us = true;
  sw->crashes++;
  swarm_waste_peer_lost(sw->waste, p->node);
  swarm_say(sw, "churn: killing %s (SIGKILL)", p->name);
  swarm_web_note(sw->web, p->name, "warn", "swarm.kill", "\"signal\":\"SIGKILL\",\"reason\":\"churn\"");
  uv_process_kill(&p->proc, SIGKILL);
}

/* At each new iteration every live relay dies with probability P, at a
 * random moment within about one iteration's time. */
void swarm_schedule_churn(swarm *sw) {
  if (sw->o.churn <= 0 || sw->stopping) return;
  for (int i = sw->o.data_nodes; i < sw->n_peers; i++) {
    peer_proc *p = &sw->peers[i];
    if (!p->running || p->kill_pending || p->killed_by_us || gw_rng_uniform(&sw->rng) >= sw->o.churn) continue;
    /* GWTF assumes a live peer in every stage (§VII): the last one standing
     * (counting those already doomed) is spared. */
    int others = 0;
    for (int j = sw->o.data_nodes; j < sw->n_peers; j++) {
      const peer_proc *q = &sw->peers[j];
      /* (one we SIGKILLed whose exit is not reaped yet is no survivor: a
       * stage lost both its relays at once this way) */
      others += j != i && q->running && q->ready && !q->kill_pending && !q->killed_by_us && q->stage == p->stage &&
                q->stage > 0;
    }
    if (p->stage > 0 && others == 0) {
      swarm_say(sw, "churn: sparing %s, the last live relay of stage %d", p->name, p->stage);
      continue;
    }
    double window = fmax(0.2, sw->last_iter_secs);
    uint64_t at = (uint64_t)(1000.0 * window * gw_rng_uniform(&sw->rng));
    p->kill_pending = true;
    uv_timer_start(&p->kill_timer, kill_cb, at, 0);
  }
}

/* ---- stopping ---- */

static void close_timers(swarm *sw) {
  for (int i = 0; i < sw->n_peers; i++) {
    uv_close((uv_handle_t *)&sw->peers[i].kill_timer, NULL);
    uv_close((uv_handle_t *)&sw->peers[i].restart_timer, NULL);
  }
  uv_close((uv_handle_t *)&sw->stop_timer, NULL);
  uv_close((uv_handle_t *)&sw->sigint, NULL);
}

static void hard_stop_cb(uv_timer_t *t) {
  swarm *sw = t->data;
  for (int i = 0; i < sw->n_peers; i++)
    if (sw->peers[i].running) {
      swarm_say(sw, "%s did not stop in time: SIGKILL", sw->peers[i].name);
      uv_process_kill(&sw->peers[i].proc, SIGKILL);
    }
}

void swarm_stop_all(swarm *sw) {
  if (sw->stopping) return;
  sw->stopping = true;
  sw->end_ms = uv_now(sw->loop);
  for (int i = 0; i < sw->n_peers; i++) {
    peer_proc *p = &sw->peers[i];
    uv_timer_stop(&p->kill_timer);
    uv_timer_stop(&p->restart_timer);
    if (p->running) uv_process_kill(&p->proc, SIGTERM);
  }
  uv_timer_start(&sw->stop_timer, hard_stop_cb, STOP_GRACE_MS, 0);
}

static void sigint_cb(uv_signal_t *s, int signum) {
  swarm *sw = s->data;
  (void)signum;
  swarm_say(sw, "interrupted: stopping every peer");
  sw->failed = true;
  swarm_stop_all(sw);
}

static void finish_wait_cb(uv_timer_t *t) {
  swarm *sw = t->data;
  if (sw->stopping) return;
  swarm_say(sw, "not every data node finished in time: stopping the swarm");
  swarm_stop_all(sw);
}

/* The run ends when every data node ran its iterations. The first to
 * finish does not end it: the others may still wait for their last round's
 * average (the first is then that round's aggregator; its own round can end
 * after the rest of the pipeline's, and stopping there lost the others' last
 * iteration.done), or, with the validation loss on, evaluate their final
 * weights. They get up to a trip (hop timeout x (stages + 2), a data node's
 * deadline for an eval microbatch). */
void swarm_finish_or_wait(swarm *sw, peer_proc *p) {
  if (sw->finished_data_nodes < sw->o.data_nodes) {
    if (sw->finished_data_nodes == 1) {
      swarm_say(sw, "%s finished its iterations: waiting for the other data nodes", p->name);
      uv_timer_start(&sw->stop_timer, finish_wait_cb, (uint64_t)sw->o.hop_timeout * (uint64_t)(sw->o.stages + 2), 0);
    }
    return;
  }
  swarm_say(sw, "%s finished its iterations: stopping the swarm", p->name);
  swarm_stop_all(sw);
}

/* ---- the run ---- */

static int prepare_dirs(swarm *sw) {
  if (sw->o.workdir) {
    snprintf(sw->workdir, sizeof(sw->workdir), "%s", sw->o.workdir);
    if (gw_mkdir_p(sw->workdir, 0700) != 0) return GW_EIO;
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(sw->workdir, sizeof(sw->workdir), "%s/gwtf-swarm-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(sw->workdir)) return -errno;
  }
  if (sw->o.dataset) {
    train_dataset ds;
    char err[512];
    if (train_dataset_open(sw->o.dataset, &ds, err, sizeof(err)) != 0) {
      fprintf(stderr, "gwtf swarm: %s\n", err);
      return GW_EINVAL;
    }
    train_dataset_close(&ds);
    snprintf(sw->dataset, sizeof(sw->dataset), "%s", sw->o.dataset);
  } else {
    if (snprintf(sw->dataset, sizeof(sw->dataset), "%s/synthetic.txt", sw->workdir) >= (int)sizeof(sw->dataset))
      return GW_ERANGE;
    int rc = train_synth_corpus(sw->dataset, 1000000, sw->o.seed);
    if (rc != 0) return rc;
    swarm_say(sw, "no --dataset given: generated a synthetic corpus at %s", sw->dataset);
  }
  return 0;
}

int cmd_swarm(int argc, char **argv) {
  static swarm sw; /* large; one per process */
  memset(&sw, 0, sizeof(sw));
  int prc = swarm_opts_parse(argc, argv, &sw.o);
  if (prc != 0) return prc == 1 ? 0 : prc;
  size_t exe_len = sizeof(sw.exe);
  if (uv_exepath(sw.exe, &exe_len) != 0) {
    fprintf(stderr, "gwtf swarm: cannot find my own executable\n");
    return 1;
  }
  sw.tty = isatty(STDOUT_FILENO);
  sw.hashes_agree = true;
  gw_rng_seed(&sw.rng, sw.o.seed ^ 0xc4u);
  sw.iters = calloc(SWARM_MAX_ITERS, sizeof(*sw.iters));
  sw.costs = calloc(MB_COSTS_MAX, sizeof(*sw.costs));
  sw.links = calloc(LINK_NODES_MAX, sizeof(*sw.links));
  sw.waste = swarm_waste_new(MB_COSTS_MAX);
  sw.val = swarm_val_new();
  int rc = sw.iters && sw.costs && sw.links && sw.waste && sw.val ? prepare_dirs(&sw) : GW_ENOMEM;
  if (rc != 0) {
    fprintf(stderr, "gwtf swarm: cannot prepare %s: %s\n", sw.workdir, gw_strerror(rc));
    free(sw.iters);
    free(sw.costs);
    free(sw.links);
    swarm_waste_free(sw.waste);
    swarm_val_free(sw.val);
    return 1;
  }
  /* Many peers share few cores: OpenMP threads that spin while waiting
   * steal them from each other (docs/COMPUTE.md). Children inherit this. */
  setenv("OMP_WAIT_POLICY", "passive", 0);
  sw.loop = uv_default_loop();
  swarm_say(&sw, "%d data node(s), %d relays, %d stages, model %s, %d iterations, churn %.2f, routing %s, logs in %s",
      sw.o.data_nodes, sw.o.relays, sw.o.stages, sw.o.model, sw.o.iterations, sw.o.churn, sw.o.routing,
      sw.workdir);
  sw.n_peers = sw.o.data_nodes + sw.o.relays + sw.o.late_relays;
  for (int i = 0; i < sw.n_peers; i++) {
    peer_proc *p = &sw.peers[i];
    p->sw = &sw;
    p->index = i;
    p->data = i < sw.o.data_nodes;
    p->stage = -1;
    p->killed_generation = -1;
    p->port = sw.o.base_port + i;
    p->late = i >= sw.o.data_nodes + sw.o.relays;
    snprintf(p->name, sizeof(p->name), "%s%d", p->data ? "d" : "r", p->data ? i : i - sw.o.data_nodes);
    uv_timer_init(sw.loop, &p->kill_timer);
    uv_timer_init(sw.loop, &p->restart_timer);
    p->kill_timer.data = p->restart_timer.data = p;
  }
  swarm_kill_ops kops;
  kill_ops(&sw, &kops);
  swarm_kill_init(&sw.kill, &sw.o, &kops, sw.n_peers);
  uv_timer_init(sw.loop, &sw.stop_timer);
  sw.stop_timer.data = &sw;
  uv_signal_init(sw.loop, &sw.sigint);
  sw.sigint.data = &sw;
  uv_signal_start(&sw.sigint, sigint_cb, SIGINT);
  sw.start_ms = uv_now(sw.loop);
  if (sw.o.http) {
    char err[300];
    if (swarm_web_start(sw.o.http, sw.o.http_public, &sw.web, err, sizeof(err)) != 0) {
      swarm_say(&sw, "%s; the swarm runs without its live view", err); /* the run matters more than the page */
    } else {
      swarm_say(&sw, "live view: open %s", swarm_web_url(sw.web));
    }
  }
  for (int i = 0; i < sw.n_peers && !sw.failed; i++)
    if (!sw.peers[i].late) start_peer(&sw.peers[i]);
  if (sw.failed) swarm_stop_all(&sw);
  while (uv_run(sw.loop, UV_RUN_ONCE)) {
    bool any = false;
    for (int i = 0; i < sw.n_peers; i++)
      any |= sw.peers[i].running || streams_open(&sw.peers[i]) || sw.peers[i].process_open;
    if (sw.stopping && !any) break;
  }
  close_timers(&sw);
  uv_run(sw.loop, UV_RUN_DEFAULT);
  uv_loop_close(sw.loop);
  sw.hashes_agree = swarm_check_hashes(&sw);
  bool complete = sw.leader_iterations >= (uint64_t)sw.o.iterations;
  if (!complete) swarm_say(&sw, "only %llu of %d iterations completed", (unsigned long long)sw.leader_iterations, sw.o.iterations);
  int wrc = swarm_write_summary(&sw);
  swarm_web_stop(sw.web);
  free(sw.iters);
  free(sw.costs);
  free(sw.links);
  swarm_hashes_free(&sw.hashes);
  swarm_waste_free(sw.waste);
  swarm_val_free(sw.val);
  return complete && !sw.failed && sw.unexpected_exits == 0 && sw.hashes_agree && wrc == 0 ? 0 : 1;
}
