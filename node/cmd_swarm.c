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
 * spent on work that never reached an aggregation. At the end it prints a
 * summary and writes it as JSON (--summary-json).
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
#include "node/swarm_hashes.h"
#include "node/swarm_kill.h"
#include "node/swarm_opts.h"
#include "node/swarm_val.h"
#include "node/swarm_waste.h"
#include "node/swarm_web.h"
#include "train/peer.h"
#include "train/data.h"
#include "train/wire_codec.h"
#include "util/err.h"
#include "util/file.h"
#include "util/rng.h"

#define LINE_MAX_BYTES 8192
#define STOP_GRACE_MS 5000


typedef struct swarm swarm;

typedef struct peer_proc peer_proc;

/* One of a child's output streams: stderr carries its JSON log, stdout the
 * odd line for people ("to join this node: ..."). */
typedef struct peer_stream {
  uv_pipe_t pipe;
  peer_proc *p;
  bool open;
  char buf[LINE_MAX_BYTES];
  size_t len;
} peer_stream;

struct peer_proc {
  swarm *sw;
  int index;
  char name[16];
  bool data;
  int generation; /* restarts with a fresh identity bump this */
  int port;
  uv_process_t proc;
  peer_stream streams[2]; /* stdout, stderr */
  bool running, killed_by_us, process_open;
  double unaggregated_compute_s; /* compute since its last aggregation: wasted if killed */
  uv_timer_t kill_timer, restart_timer;
  bool kill_pending;
  int stage;  /* from its log lines; -1 until placed */
  bool ready; /* it logged peer.ready: it holds its stage's weights */
  bool late;  /* starts only once the leader finished late_after iterations */
  bool crashed_itself; /* logged debug.crash: its SIGKILL is the test's */
  int killed_generation; /* the latest generation that was killed (-1: none) */
  bool no_restart;       /* killed by --kill-stage: that identity never comes back */
  bool replacement;      /* a fresh data node in place of one --kill-data-node killed: it joins the run */
};

typedef struct iter_rec {
  bool seen;
  double loss_sum, secs_max;
  int done, deferred, reports;
  double comm_sum; /* over microbatches: trip time minus compute along the path */
  int comm_n;
} iter_rec;

/* Compute seconds spent on one microbatch so far, all peers together. */
typedef struct mb_cost {
  char origin[12];
  char mb[24];
  double secs;
} mb_cost;
#define MB_COSTS_MAX 4096

/* What a peer last said about its next-hop link costs (flow.link_costs):
 * the swarm's flow instance, to compare our flows with the exact optimum. */
#define LINK_NODES_MAX 512
#define LINKS_PER_NODE 64
typedef struct link_node {
  char id[12];
  int stage;
  int capacity;
  int n;
  char to[LINKS_PER_NODE][12];
  double cost[LINKS_PER_NODE];
} link_node;

struct swarm {
  swarm_opts o;
  uv_loop_t *loop;
  gw_rng rng;
  peer_proc peers[SWARM_MAX_PEERS];
  int n_peers;
  char exe[PATH_MAX], workdir[PATH_MAX], dataset[PATH_MAX];
  bool tty, stopping, failed;
  int finished_data_nodes;
  uint64_t leader_iterations;
  double last_iter_secs;
  iter_rec *iters;
  swarm_hashes hashes; /* the weights every peer logged after each aggregation */
  bool hashes_agree;
  int splits, splits_unhealed; /* (stage, iteration)s whose peers disagreed; of them, never agreeing again */
  mb_cost *costs; /* ring of the latest microbatches' compute */
  link_node *links;
  size_t n_links;
  double flows_sum;
  int flows_n, flows_probed;
  size_t n_costs, next_cost;
  int crashes, unexpected_exits;
  long long reroutes, recoveries, lost;
  /* exactly once (train/peer_ledger.h): the aggregators' ledger events */
  struct { long long rounds, counted, duplicates, missing, extra, inexact, reruns, unchecked, recovered; } ledger;
  double unaggregated_s; /* compute whose gradient never reached an aggregation */
  swarm_waste *waste;    /* the paper's wasted compute */
  swarm_val *val;        /* the validation curve (eval.done) */
  uint64_t start_ms, end_ms;
  swarm_kill kill;      /* --kill-stage, --kill-data-node, --kill-fraction (node/swarm_kill.h) */
  int stage_lost;       /* the stage a peer or the leader declared lost (0: none) */
  uv_timer_t stop_timer;
  uv_signal_t sigint;
  swarm_web *web; /* NULL without --http */
};

static const char *const colours[] = {"\033[36m", "\033[33m", "\033[35m", "\033[32m", "\033[34m", "\033[91m"};

/* ---- output ---- */

static void say(swarm *sw, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(swarm *sw, const char *fmt, ...) {
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

/* ---- events ---- */

static double num(json_t *ev, const char *key) {
  json_t *v = json_object_get(ev, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static void say_line(void *ud, const char *line) { say(ud, "%s", line); }

/* Every stage's peers hold the same weights after every iteration (judged
 * once the swarm has stopped: node/swarm_hashes.h). */
static bool check_hashes(swarm *sw) {
  swarm_hash_peer peers[SWARM_MAX_PEERS];
  for (int i = 0; i < sw->n_peers; i++)
    peers[i] = (swarm_hash_peer){.name = sw->peers[i].name, .generation = sw->peers[i].generation,
                                 .killed_generation = sw->peers[i].killed_generation};
  sw->splits = swarm_hashes_check(&sw->hashes, peers, &sw->splits_unhealed, say_line, sw);
  return sw->splits == 0;
}

static void schedule_churn(swarm *sw);
static void start_late(swarm *sw);
static void kill_ops(swarm *sw, swarm_kill_ops *ops);

static mb_cost *cost_of(swarm *sw, const char *origin, const char *mb, bool create) {
  for (size_t i = 0; i < sw->n_costs; i++)
    if (!strcmp(sw->costs[i].mb, mb) && !strcmp(sw->costs[i].origin, origin)) return &sw->costs[i];
  if (!create) return NULL;
  mb_cost *c = &sw->costs[sw->next_cost];
  sw->next_cost = (sw->next_cost + 1) % MB_COSTS_MAX;
  if (sw->n_costs < MB_COSTS_MAX) sw->n_costs++;
  snprintf(c->origin, sizeof(c->origin), "%s", origin);
  snprintf(c->mb, sizeof(c->mb), "%s", mb);
  c->secs = 0;
  return c;
}

static void on_link_costs(swarm *sw, json_t *ev) {
  const char *node = json_string_value(json_object_get(ev, "node"));
  const char *to = json_string_value(json_object_get(ev, "to"));
  json_t *stage = json_object_get(ev, "stage");
  if (!node || !to || !json_is_integer(stage)) return;
  link_node *ln = NULL;
  for (size_t i = 0; i < sw->n_links && !ln; i++)
    if (!strcmp(sw->links[i].id, node)) ln = &sw->links[i];
  if (!ln && sw->n_links < LINK_NODES_MAX) ln = &sw->links[sw->n_links++];
  if (!ln) return;
  snprintf(ln->id, sizeof(ln->id), "%s", node);
  ln->stage = (int)json_integer_value(stage);
  ln->capacity = (int)num(ev, "capacity");
  ln->n = 0;
  /* "aaaa1111:12.3,bbbb2222:14.0" */
  for (const char *c = to; *c && ln->n < LINKS_PER_NODE;) {
    const char *colon = strchr(c, ':');
    if (!colon || colon - c >= 12) break;
    memcpy(ln->to[ln->n], c, (size_t)(colon - c));
    ln->to[ln->n][colon - c] = '\0';
    ln->cost[ln->n++] = atof(colon + 1);
    const char *comma = strchr(colon, ',');
    if (!comma) break;
    c = comma + 1;
  }
}

/* The last flow.link_costs of every peer as a `gwtf sim flow` instance
 * (node IDs numbered in order of appearance, data nodes first). */
static json_t *flow_instance(const swarm *sw) {
  json_t *nodes = json_array(), *links = json_array();
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < sw->n_links; i++) {
      const link_node *ln = &sw->links[i];
      if ((ln->stage == 0) != (pass == 0)) continue;
      json_array_append_new(nodes, json_pack("{s:I,s:i,s:i,s:s}", "id", (json_int_t)i, "stage", ln->stage,
                                             "capacity", ln->capacity, "name", ln->id));
    }
  for (size_t i = 0; i < sw->n_links; i++) {
    const link_node *ln = &sw->links[i];
    for (int k = 0; k < ln->n; k++)
      for (size_t j = 0; j < sw->n_links; j++)
        if (!strcmp(sw->links[j].id, ln->to[k]))
          json_array_append_new(links, json_pack("{s:I,s:I,s:f}", "from", (json_int_t)i, "to", (json_int_t)j, "cost",
                                                 ln->cost[k]));
  }
  return json_pack("{s:i,s:o,s:o}", "stages", sw->o.stages, "nodes", nodes, "links", links);
}

/* A data node finished a microbatch: what of its trip was not compute. */
/* The aggregators' ledger events (train/peer_ledger.h): counted per stage round. */
static void on_ledger(swarm *sw, const char *what, json_t *ev) {
  if (!strcmp(what, "counted")) {
    sw->ledger.rounds++;
    double n = num(ev, "microbatches");
    if (isfinite(n)) sw->ledger.counted += (long long)n;
    if (num(ev, "checked") == 0) sw->ledger.unchecked++; /* no ledger reached that aggregator */
  } else if (!strcmp(what, "duplicate")) {
    sw->ledger.duplicates++;
  } else if (!strcmp(what, "missing")) {
    sw->ledger.missing++;
  } else if (!strcmp(what, "extra")) {
    sw->ledger.extra++;
  } else if (!strcmp(what, "inexact")) {
    sw->ledger.inexact++;
  } else if (!strcmp(what, "rerun")) {
    sw->ledger.reruns++;
  } else if (!strcmp(what, "recovered")) {
    sw->ledger.recovered++;
  }
}

static void on_microbatch_done(swarm *sw, json_t *ev) {
  const char *node = json_string_value(json_object_get(ev, "node"));
  const char *mb = json_string_value(json_object_get(ev, "mb"));
  double trip = num(ev, "trip_s"), it = num(ev, "iter");
  if (!node || !mb || !isfinite(trip) || !isfinite(it) || it < 0 || it >= SWARM_MAX_ITERS) return;
  mb_cost *c = cost_of(sw, node, mb, false);
  double comm = trip - (c ? c->secs : 0);
  iter_rec *r = &sw->iters[(size_t)it];
  r->comm_sum += comm > 0 ? comm : 0;
  r->comm_n++;
}
static void stop_all(swarm *sw);

static void on_iteration_done(swarm *sw, peer_proc *p, json_t *ev) {
  double it = num(ev, "iter");
  if (!isfinite(it) || it < 0 || it >= SWARM_MAX_ITERS) return;
  iter_rec *r = &sw->iters[(size_t)it];
  double done = num(ev, "done"), deferred = num(ev, "deferred"), loss = num(ev, "loss"), secs = num(ev, "secs");
  r->seen = true;
  r->reports++;
  if (isfinite(done)) r->done += (int)done;
  if (isfinite(deferred)) r->deferred += (int)deferred;
  if (isfinite(loss) && isfinite(done)) r->loss_sum += loss * done;
  if (isfinite(secs) && secs > r->secs_max) r->secs_max = secs;
  if ((uint64_t)it + 1 > sw->leader_iterations) {
    sw->leader_iterations = (uint64_t)it + 1;
    if (isfinite(secs)) sw->last_iter_secs = secs;
    (void)p;
    schedule_churn(sw);
    if (sw->o.late_relays > 0 && sw->o.kill_stage == 0 && (int)sw->leader_iterations == sw->o.late_after)
      start_late(sw);
    swarm_kill_on_iteration(&sw->kill, sw->leader_iterations, uv_now(sw->loop));
  }
}

static void finish_wait_cb(uv_timer_t *t) {
  swarm *sw = t->data;
  if (sw->stopping) return;
  say(sw, "not every data node finished in time: stopping the swarm");
  stop_all(sw);
}

/* The first data node that ran its iterations ends the run. With the
 * validation loss on, the others still evaluate their final weights after
 * their last iteration: they get up to a trip (hop timeout x (stages + 2),
 * a data node's deadline for an eval microbatch) to report it. */
static void finish_or_wait(swarm *sw, peer_proc *p) {
  bool validating = (sw->o.val_fraction > 0 || sw->o.val_dataset) && sw->o.eval_every != 0;
  if (validating && sw->finished_data_nodes < sw->o.data_nodes) {
    if (sw->finished_data_nodes == 1) {
      say(sw, "%s finished its iterations: waiting for the other data nodes' final evaluation", p->name);
      uv_timer_start(&sw->stop_timer, finish_wait_cb, (uint64_t)sw->o.hop_timeout * (uint64_t)(sw->o.stages + 2), 0);
    }
    return;
  }
  say(sw, "%s finished its iterations: stopping the swarm", p->name);
  stop_all(sw);
}

/* A restarted microbatch's attempt (0 on lines that do not say). */
static unsigned attempt_of(json_t *ev) {
  double a = num(ev, "attempt");
  return isfinite(a) && a >= 0 && a <= UINT_MAX ? (unsigned)a : 0;
}

static void on_event(swarm *sw, peer_proc *p, json_t *ev) {
  const char *e = json_string_value(json_object_get(ev, "event"));
  if (!e) return;
  json_t *stage = json_object_get(ev, "stage");
  if (json_is_integer(stage)) p->stage = (int)json_integer_value(stage);
  if (!strcmp(e, "peer.ready")) p->ready = true;
  if (!strcmp(e, "debug.crash")) {
    p->crashed_itself = true;
    sw->crashes++;
  }
  if (!strcmp(e, "train.resync")) p->ready = false;
  if (!strcmp(e, "iteration.done")) {
    on_iteration_done(sw, p, ev);
  } else if (!strcmp(e, "eval.done")) {
    swarm_val_event(sw->val, ev);
  } else if (!strcmp(e, "aggregation.done")) {
    const char *hash = json_string_value(json_object_get(ev, "hash"));
    double it = num(ev, "iter"), st = num(ev, "stage"), wasted = num(ev, "wasted_s"); /* stage: the line's own */
    if (hash && isfinite(it) && isfinite(st) &&
        swarm_hashes_note(&sw->hashes, (uint64_t)it, (int)st, hash, p->index, p->generation) != 0)
      say(sw, "out of memory: a weight hash of %s is not kept", p->name);
    if (isfinite(wasted)) sw->unaggregated_s += wasted;
    p->unaggregated_compute_s = 0;
  } else if (!strcmp(e, "compute.done")) {
    double s = num(ev, "secs");
    const char *origin = json_string_value(json_object_get(ev, "origin"));
    const char *mb = json_string_value(json_object_get(ev, "mb"));
    if (isfinite(s)) p->unaggregated_compute_s += s;
    mb_cost *c = origin && mb && isfinite(s) ? cost_of(sw, origin, mb, true) : NULL;
    if (c) c->secs += s;
    swarm_waste_compute(sw->waste, json_string_value(json_object_get(ev, "node")), origin, mb, attempt_of(ev),
                        json_string_value(json_object_get(ev, "kind")), s);
  } else if (!strcmp(e, "microbatch.done")) {
    on_microbatch_done(sw, ev);
    swarm_waste_done(sw->waste, json_string_value(json_object_get(ev, "node")),
                     json_string_value(json_object_get(ev, "mb")), attempt_of(ev));
  } else if (!strcmp(e, "flow.link_costs")) {
    on_link_costs(sw, ev);
  } else if (!strcmp(e, "flows.cost") && p->index == 0) {
    /* The latest iteration's flows, fully probed if any were: an iteration
     * may end between a Request Change's teardown and its replacement. */
    int n = (int)num(ev, "flows"), probed = (int)num(ev, "probed");
    bool stored_whole = sw->flows_n > 0 && sw->flows_probed == sw->flows_n;
    if (n > 0 && (probed == n || !stored_whole)) {
      sw->flows_n = n;
      sw->flows_probed = probed;
      sw->flows_sum = num(ev, "sum");
    }
  } else if (!strcmp(e, "forward.rerouted")) {
    sw->reroutes++;
  } else if (!strcmp(e, "backward.recovered")) {
    sw->recoveries++;
  } else if (!strcmp(e, "microbatch.lost")) {
    sw->lost++;
  } else if (!strncmp(e, "ledger.", 7)) {
    on_ledger(sw, e + 7, ev);
  } else if (!strcmp(e, "stage.restored")) {
    swarm_kill_on_event(&sw->kill, e, ev);
  } else if (!strcmp(e, "stage.lost") || !strcmp(e, "run.stage_lost")) {
    swarm_kill_on_event(&sw->kill, e, ev);
    /* the lost stage: the line's stage= (the JSON log names it field_stage,
     * `stage` being the node's own, 0 on the leader's line) */
    double st = json_object_get(ev, "field_stage") ? num(ev, "field_stage") : num(ev, "stage");
    if (isfinite(st) && !sw->stage_lost) sw->stage_lost = (int)st;
    if (!strcmp(e, "run.stage_lost") && !sw->stopping) {
      say(sw, "stage %d's state is lost (no live peer, no replica): stopping the swarm", sw->stage_lost);
      sw->failed = true;
      stop_all(sw);
    }
  } else if (!strcmp(e, "run.finished") && p->data) {
    ++sw->finished_data_nodes;
    if (!sw->stopping) finish_or_wait(sw, p);
  }
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
  on_event(sw, p, ev);
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
    say(sw, "%s exited unexpectedly (status %lld, signal %d)", p->name, (long long)status, term_signal);
    if (p->data && !sw->stopping) {
      /* No run without its data nodes: stop rather than wait forever. */
      say(sw, "a data node is gone: stopping the swarm");
      sw->failed = true;
      stop_all(sw);
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
    say(sw, "%s: no hostile identity made", p->name);
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
    say(sw, "cannot start %s: %s", p->name, uv_strerror(rc));
    close_streams(p);
    sw->failed = true;
    return;
  }
  p->running = true;
  p->process_open = true;
  for (int i = 0; i < 2; i++) uv_read_start((uv_stream_t *)&p->streams[i].pipe, alloc_cb, read_cb);
  if (p->generation > 0) say(sw, "%s restarted with a fresh identity (generation %d)", p->name, p->generation);
  char fields[64];
  snprintf(fields, sizeof(fields), "\"generation\":%d,\"late\":%s", p->generation, p->late ? "true" : "false");
  swarm_web_note(sw->web, p->name, "info", "swarm.start", fields);
}

/* ---- late joiners ---- */

static void start_late(swarm *sw) {
  for (int i = 0; i < sw->n_peers; i++) {
    peer_proc *p = &sw->peers[i];
    if (!p->late || p->running) continue;
    say(sw, "%s joins the run late (after iteration %d)", p->name,
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
  say(sw, "%s: killing %s of stage %d (SIGKILL, %s)", reason, p->name, p->stage,
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

static void kop_start_late(void *ud) { start_late(ud); }
static void kop_say(void *ud, const char *line) { say(ud, "%s", line); }

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
  say(sw, "churn: killing %s (SIGKILL)", p->name);
  swarm_web_note(sw->web, p->name, "warn", "swarm.kill", "\"signal\":\"SIGKILL\",\"reason\":\"churn\"");
  uv_process_kill(&p->proc, SIGKILL);
}

/* At each new iteration every live relay dies with probability P, at a
 * random moment within about one iteration's time. */
static void schedule_churn(swarm *sw) {
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
      say(sw, "churn: sparing %s, the last live relay of stage %d", p->name, p->stage);
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
      say(sw, "%s did not stop in time: SIGKILL", sw->peers[i].name);
      uv_process_kill(&sw->peers[i].proc, SIGKILL);
    }
}

static void stop_all(swarm *sw) {
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
  say(sw, "interrupted: stopping every peer");
  sw->failed = true;
  stop_all(sw);
}

/* ---- summary ---- */

static json_t *summary_json(swarm *sw, double *tokens_per_s) {
  json_t *root = json_object(), *iters = json_array();
  double tokens = 0, secs = 0;
  for (uint64_t i = 0; i < sw->leader_iterations && i < SWARM_MAX_ITERS; i++) {
    iter_rec *r = &sw->iters[i];
    if (!r->seen) continue;
    json_t *it = json_object();
    json_object_set_new(it, "iteration", json_integer((json_int_t)i));
    json_object_set_new(it, "loss", r->done ? json_real(r->loss_sum / r->done) : json_null());
    json_object_set_new(it, "time_per_microbatch_s", r->done ? json_real(r->secs_max / r->done) : json_null());
    json_object_set_new(it, "microbatches_done", json_integer(r->done));
    json_object_set_new(it, "microbatches_deferred", json_integer(r->deferred));
    json_object_set_new(it, "iteration_s", json_real(r->secs_max));
    json_object_set_new(it, "communication_s", r->comm_n ? json_real(r->comm_sum / r->comm_n) : json_null());
    json_array_append_new(iters, it);
    tokens += (double)r->done * sw->o.batch * sw->o.seq;
    secs += r->secs_max;
  }
  *tokens_per_s = secs > 0 ? tokens / secs : 0;
  json_object_set_new(root, "iterations", iters);
  json_object_set_new(root, "crashes", json_integer(sw->crashes));
  json_object_set_new(root, "forward_reroutes", json_integer(sw->reroutes));
  json_object_set_new(root, "backward_recoveries", json_integer(sw->recoveries));
  json_object_set_new(root, "lost_microbatches", json_integer(sw->lost));
  json_object_set_new(root, "ledger",
                      json_pack("{sI sI sI sI sI sI sI sI sI}", "rounds", (json_int_t)sw->ledger.rounds, "counted",
                                (json_int_t)sw->ledger.counted, "duplicates", (json_int_t)sw->ledger.duplicates,
                                "missing", (json_int_t)sw->ledger.missing, "extra", (json_int_t)sw->ledger.extra,
                                "inexact", (json_int_t)sw->ledger.inexact, "reruns", (json_int_t)sw->ledger.reruns,
                                "unchecked", (json_int_t)sw->ledger.unchecked, "recovered",
                                (json_int_t)sw->ledger.recovered));
  json_object_set_new(root, "wasted_compute_s", json_real(swarm_waste_wasted_s(sw->waste)));
  json_object_set_new(root, "unaggregated_compute_s", json_real(sw->unaggregated_s));
  json_object_set_new(root, "compute_s", json_real(swarm_waste_total_s(sw->waste)));
  json_object_set_new(root, "throughput_tokens_per_s", json_real(*tokens_per_s));
  json_object_set_new(root, "stage_hashes_agree", json_boolean(sw->hashes_agree));
  json_object_set_new(root, "stage_splits", json_integer(sw->splits));
  json_object_set_new(root, "stage_splits_unhealed", json_integer(sw->splits_unhealed));
  json_object_set_new(root, "unexpected_exits", json_integer(sw->unexpected_exits));
  json_object_set_new(root, "routing", json_string(sw->o.routing));
  json_object_set_new(root, "churn", json_real(sw->o.churn));
  json_object_set_new(root, "seed", json_integer((json_int_t)sw->o.seed));
  json_object_set_new(root, "flows_cost", json_pack("{s:i,s:i,s:f}", "flows", sw->flows_n, "probed",
                                                    sw->flows_probed, "sum", isfinite(sw->flows_sum) ? sw->flows_sum : 0));
  json_object_set_new(root, "flow_instance", flow_instance(sw));
  json_object_set_new(root, "validation", swarm_val_json(sw->val));
  swarm_kill_json(&sw->kill, root, sw->stage_lost);
  return root;
}

static int write_summary(swarm *sw) {
  double tps;
  json_t *root = summary_json(sw, &tps);
  int rc = 0;
  printf("\n%sswarm summary%s\n", sw->tty ? "\033[1m" : "", sw->tty ? "\033[0m" : "");
  printf("  %-5s %-10s %-8s %-8s %s\n", "iter", "loss", "done", "deferred", "time/microbatch (s)");
  json_t *it;
  size_t i;
  json_array_foreach(json_object_get(root, "iterations"), i, it) {
    json_t *loss = json_object_get(it, "loss"), *tpm = json_object_get(it, "time_per_microbatch_s");
    printf("  %-5lld %-10.4f %-8lld %-8lld %.3f\n", (long long)json_integer_value(json_object_get(it, "iteration")),
           json_is_number(loss) ? json_number_value(loss) : NAN,
           (long long)json_integer_value(json_object_get(it, "microbatches_done")),
           (long long)json_integer_value(json_object_get(it, "microbatches_deferred")),
           json_is_number(tpm) ? json_number_value(tpm) : NAN);
  }
  printf("  crashes %d, forward re-routes %lld, backward recoveries %lld, lost microbatches %lld\n", sw->crashes,
         sw->reroutes, sw->recoveries, sw->lost);
  if (sw->ledger.rounds)
    printf("  ledger: %lld microbatches counted in %lld stage rounds; duplicates %lld, missing %lld, extra %lld, "
           "inexact %lld, re-runs %lld, recovered %lld, rounds without a ledger %lld\n",
           sw->ledger.counted, sw->ledger.rounds, sw->ledger.duplicates, sw->ledger.missing, sw->ledger.extra,
           sw->ledger.inexact, sw->ledger.reruns, sw->ledger.recovered, sw->ledger.unchecked);
  printf("  wasted compute %.2f s (off the final paths), %.2f s never aggregated; throughput %.1f tokens/s\n",
         swarm_waste_wasted_s(sw->waste), sw->unaggregated_s, tps);
  swarm_val_print(sw->val, stdout);
  swarm_kill_print(&sw->kill, stdout, sw->stage_lost);
  if (sw->hashes_agree)
    printf("  stage weights agree: yes, unexpected exits: %d\n", sw->unexpected_exits);
  else
    printf("  stage weights agree: NO (%d split%s, %d never healed), unexpected exits: %d\n", sw->splits,
           sw->splits == 1 ? "" : "s", sw->splits_unhealed, sw->unexpected_exits);
  if (sw->o.summary_json) {
    char *text = json_dumps(root, JSON_INDENT(2));
    if (!text || gw_file_write_atomic1(sw->o.summary_json, text, strlen(text), 0644) != 0) {
      fprintf(stderr, "gwtf swarm: cannot write %s\n", sw->o.summary_json);
      rc = -1;
    } else {
      printf("  summary written to %s\n", sw->o.summary_json);
    }
    free(text);
  }
  json_decref(root);
  return rc;
}

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
    say(sw, "no --dataset given: generated a synthetic corpus at %s", sw->dataset);
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
  say(&sw, "%d data node(s), %d relays, %d stages, model %s, %d iterations, churn %.2f, routing %s, logs in %s",
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
      say(&sw, "%s; the swarm runs without its live view", err); /* the run matters more than the page */
    } else {
      say(&sw, "live view: open %s", swarm_web_url(sw.web));
    }
  }
  for (int i = 0; i < sw.n_peers && !sw.failed; i++)
    if (!sw.peers[i].late) start_peer(&sw.peers[i]);
  if (sw.failed) stop_all(&sw);
  while (uv_run(sw.loop, UV_RUN_ONCE)) {
    bool any = false;
    for (int i = 0; i < sw.n_peers; i++)
      any |= sw.peers[i].running || streams_open(&sw.peers[i]) || sw.peers[i].process_open;
    if (sw.stopping && !any) break;
  }
  close_timers(&sw);
  uv_run(sw.loop, UV_RUN_DEFAULT);
  uv_loop_close(sw.loop);
  sw.hashes_agree = check_hashes(&sw);
  bool complete = sw.leader_iterations >= (uint64_t)sw.o.iterations;
  if (!complete) say(&sw, "only %llu of %d iterations completed", (unsigned long long)sw.leader_iterations, sw.o.iterations);
  int wrc = write_summary(&sw);
  swarm_web_stop(sw.web);
  free(sw.iters);
  free(sw.costs);
  free(sw.links);
  swarm_hashes_free(&sw.hashes);
  swarm_waste_free(sw.waste);
  swarm_val_free(sw.val);
  return complete && !sw.failed && sw.unexpected_exits == 0 && sw.hashes_agree && wrc == 0 ? 0 : 1;
}
