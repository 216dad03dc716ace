/* node/swarm_kill.c — see swarm_kill.h. */
#include "node/swarm_kill.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

static void say(swarm_kill *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(swarm_kill *k, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  k->ops.say(k->ops.ud, line);
}

bool swarm_kill_wanted(const swarm_opts *o) { return o->kill_stage > 0 || o->kill_data_node || o->kill_fraction > 0; }

void swarm_kill_init(swarm_kill *k, const swarm_opts *o, const swarm_kill_ops *ops, int n_peers) {
  memset(k, 0, sizeof(*k));
  k->o = o;
  k->ops = *ops;
  k->n_peers = n_peers;
  k->to_next_s = -1;
  gw_rng_seed(&k->rng, o->seed ^ 0x6b696c6cu); /* its own stream: churn's draws stay the same */
}

/* what was killed, for the swarm's lines */
static void what(const swarm_kill *k, char *out, size_t len) {
  if (k->o->kill_stage > 0) snprintf(out, len, "stage %d", k->o->kill_stage);
  else if (k->o->kill_data_node) snprintf(out, len, "every data node");
  else snprintf(out, len, "%.0f %% of the relays", 100.0 * k->o->kill_fraction);
}

/* Every live peer of the stage at once, for good; then the spares
 * (--late-relays) start, for the leader to place into the empty stage. */
static void kill_stage(swarm_kill *k) {
  for (int i = 0; i < k->n_peers; i++) {
    swarm_kill_peer p;
    k->ops.peer(k->ops.ud, i, &p);
    if (!p.running || p.data || p.stage != k->o->kill_stage) continue;
    k->ops.kill(k->ops.ud, i, false, "kill-stage");
    k->peers_killed++;
  }
  say(k, "kill-stage: stage %d had %d live peer(s) in iteration %d", k->o->kill_stage, k->peers_killed, k->o->kill_at);
  k->ops.start_late(k->ops.ud);
}

/* Every data node; fresh ones take their places --replace-after ms later. */
static void kill_data_nodes(swarm_kill *k) {
  for (int i = 0; i < k->n_peers; i++) {
    swarm_kill_peer p;
    k->ops.peer(k->ops.ud, i, &p);
    if (!p.running || !p.data) continue;
    k->ops.kill(k->ops.ud, i, false, "kill-data-node");
    k->ops.replace(k->ops.ud, i, (uint64_t)k->o->replace_after_ms);
    k->peers_killed++;
  }
  say(k, "kill-data-node: %d data node(s) killed in iteration %d; fresh one(s) start in %d ms", k->peers_killed,
      k->o->kill_at, k->o->replace_after_ms);
}

/* ceil(F x relays) of the live relays, drawn at random, at once; they come
 * back with fresh identities as churn's victims do. No stage is spared:
 * one may lose every member (its replica refills it). */
static void kill_fraction(swarm_kill *k) {
  int live[SWARM_MAX_PEERS], n = 0;
  for (int i = 0; i < k->n_peers && n < SWARM_MAX_PEERS; i++) {
    swarm_kill_peer p;
    k->ops.peer(k->ops.ud, i, &p);
    if (p.running && !p.data) live[n++] = i;
  }
  int want = (int)ceil(k->o->kill_fraction * (double)k->o->relays - 1e-9);
  if (want > n) want = n;
  for (int j = 0; j < want; j++) { /* a partial Fisher–Yates shuffle */
    int pick = j + (int)gw_rng_below(&k->rng, (uint64_t)(n - j));
    int t = live[j];
    live[j] = live[pick];
    live[pick] = t;
    k->ops.kill(k->ops.ud, live[j], true, "kill-fraction");
    k->peers_killed++;
  }
  say(k, "kill-fraction: %d of %d live relays killed at once in iteration %d", k->peers_killed, n, k->o->kill_at);
}

void swarm_kill_on_iteration(swarm_kill *k, uint64_t completed, uint64_t now_ms) {
  if (!swarm_kill_wanted(k->o)) return;
  if (k->struck && k->to_next_s < 0) {
    char who[64];
    what(k, who, sizeof(who));
    k->to_next_s = (double)(now_ms - k->kill_ms) / 1000.0;
    say(k, "iteration %llu completed %.2f s after %s was killed", (unsigned long long)completed - 1, k->to_next_s,
        who);
  }
  if (k->struck || (int)completed != k->o->kill_at) return;
  k->struck = true;
  k->kill_ms = now_ms;
  if (k->o->kill_stage > 0) kill_stage(k);
  else if (k->o->kill_data_node) kill_data_nodes(k);
  else kill_fraction(k);
}

static double num(json_t *ev, const char *key) {
  json_t *v = json_object_get(ev, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

void swarm_kill_on_event(swarm_kill *k, const char *event, json_t *ev) {
  if (!k->struck) return;
  if (!strcmp(event, "stage.restored")) {
    k->restored++;
    double lost = num(ev, "lost");
    if (isfinite(lost) && lost > k->lost_max) k->lost_max = (int)lost;
  } else if (!strcmp(event, "stage.lost")) {
    /* the JSON log names the line's stage= field_stage (`stage` is the node's own) */
    double st = json_object_get(ev, "field_stage") ? num(ev, "field_stage") : num(ev, "stage");
    if (st == 0) k->stage0_lost = true;
  }
}

static json_t *secs_or_null(const swarm_kill *k) {
  return k->struck && k->to_next_s >= 0 ? json_real(k->to_next_s) : json_null();
}

void swarm_kill_json(const swarm_kill *k, json_t *root, int lost_stage) {
  const swarm_opts *o = k->o;
  if (o->kill_stage > 0)
    json_object_set_new(root, "stage_kill",
                        json_pack("{s:i,s:i,s:b,s:i,s:o,s:i,s:i,s:i}", "stage", o->kill_stage, "at_iteration",
                                  o->kill_at, "killed", k->struck, "peers_killed", k->peers_killed,
                                  "secs_to_next_iteration", secs_or_null(k), "restored", k->restored, "lost_stage",
                                  lost_stage, "iterations_lost", k->lost_max));
  else if (o->kill_data_node)
    json_object_set_new(root, "data_node_kill",
                        json_pack("{s:i,s:b,s:i,s:i,s:o,s:i,s:i,s:b}", "at_iteration", o->kill_at, "killed", k->struck,
                                  "peers_killed", k->peers_killed, "replace_after_ms", o->replace_after_ms,
                                  "secs_to_next_iteration", secs_or_null(k), "restored", k->restored,
                                  "iterations_lost", k->lost_max, "stage0_lost", k->stage0_lost));
  else if (o->kill_fraction > 0)
    json_object_set_new(root, "fraction_kill",
                        json_pack("{s:f,s:i,s:b,s:i,s:o,s:i,s:i,s:i}", "fraction", o->kill_fraction, "at_iteration",
                                  o->kill_at, "killed", k->struck, "peers_killed", k->peers_killed,
                                  "secs_to_next_iteration", secs_or_null(k), "restored", k->restored,
                                  "iterations_lost", k->lost_max, "lost_stage", lost_stage));
  else if (lost_stage)
    json_object_set_new(root, "stage_kill", json_pack("{s:i}", "lost_stage", lost_stage));
}

void swarm_kill_print(const swarm_kill *k, FILE *out, int lost_stage) {
  if (!k->struck) return;
  char who[64];
  what(k, who, sizeof(who));
  fprintf(out, "  %s killed in iteration %d (%d peers): next iteration completed %s%.2f s later, %d restore(s), %d "
               "aggregation(s) lost%s\n",
          who, k->o->kill_at, k->peers_killed, k->to_next_s < 0 ? "never, " : "", k->to_next_s < 0 ? 0.0 : k->to_next_s,
          k->restored, k->lost_max,
          lost_stage ? ", a stage's state LOST" : k->stage0_lost ? ", stage 0's state LOST" : "");
}
