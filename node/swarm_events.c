/* node/swarm_events.c — what `gwtf swarm` learns from its children's log
 * events: each iteration's loss, microbatches and time, the compute spent on
 * each microbatch (its communication is the rest of its trip), the weight
 * hashes, re-routes, recoveries, lost microbatches, the aggregators' ledger
 * and the last link costs every peer reported. The summary
 * (node/swarm_summary.c) is made of these counts. The processes are
 * node/cmd_swarm.c's: an event that churns, starts or stops peers calls
 * back into it (node/swarm_internal.h). */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "node/swarm_internal.h"

static double num(json_t *ev, const char *key) {
  json_t *v = json_object_get(ev, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

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

/* A data node finished a microbatch: what of its trip was not compute. */
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
    swarm_schedule_churn(sw);
    if (sw->o.late_relays > 0 && sw->o.kill_stage == 0 && (int)sw->leader_iterations == sw->o.late_after)
      swarm_start_late(sw);
    swarm_kill_on_iteration(&sw->kill, sw->leader_iterations, uv_now(sw->loop));
  }
}

/* A restarted microbatch's attempt (0 on lines that do not say). */
static unsigned attempt_of(json_t *ev) {
  double a = num(ev, "attempt");
  return isfinite(a) && a >= 0 && a <= UINT_MAX ? (unsigned)a : 0;
}

void swarm_on_event(swarm *sw, peer_proc *p, json_t *ev) {
  const char *e = json_string_value(json_object_get(ev, "event"));
  if (!e) return;
  json_t *stage = json_object_get(ev, "stage");
  if (json_is_integer(stage)) p->stage = (int)json_integer_value(stage);
  const char *node = json_string_value(json_object_get(ev, "node"));
  if (node) snprintf(p->node, sizeof(p->node), "%s", node);
  if (!strcmp(e, "peer.ready")) p->ready = true;
  if (!strcmp(e, "debug.crash")) {
    p->crashed_itself = true;
    sw->crashes++;
    swarm_waste_peer_lost(sw->waste, p->node);
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
      swarm_say(sw, "out of memory: a weight hash of %s is not kept", p->name);
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
      swarm_say(sw, "stage %d's state is lost (no live peer, no replica): stopping the swarm", sw->stage_lost);
      sw->failed = true;
      swarm_stop_all(sw);
    }
  } else if (!strcmp(e, "run.finished") && p->data) {
    ++sw->finished_data_nodes;
    if (!sw->stopping) swarm_finish_or_wait(sw, p);
  }
}
