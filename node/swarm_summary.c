/* node/swarm_summary.c — the end of a `gwtf swarm`: the verdict on the
 * stages' weights and the summary of the run, printed and written as JSON
 * (--summary-json), from what node/swarm_events.c counted. Both run once
 * every child has stopped: log lines of different peers arrive in any
 * order, and a peer's last lines may come after the run ended. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/swarm_internal.h"
#include "util/file.h"

static void say_line(void *ud, const char *line) { swarm_say(ud, "%s", line); }

/* Every stage's peers hold the same weights after every iteration (judged
 * once the swarm has stopped: node/swarm_hashes.h). */
bool swarm_check_hashes(swarm *sw) {
  swarm_hash_peer peers[SWARM_MAX_PEERS];
  for (int i = 0; i < sw->n_peers; i++)
    peers[i] = (swarm_hash_peer){.name = sw->peers[i].name, .generation = sw->peers[i].generation,
                                 .killed_generation = sw->peers[i].killed_generation};
  sw->splits = swarm_hashes_check(&sw->hashes, peers, &sw->splits_unhealed, say_line, sw);
  return sw->splits == 0;
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
  json_object_set_new(root, "wasted_compute_on_crashed_s", json_real(swarm_waste_on_lost_s(sw->waste)));
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

int swarm_write_summary(swarm *sw) {
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
  printf("  wasted compute %.4f s (off the final paths; %.4f s of it by peers that died), %.2f s never aggregated; "
         "throughput %.1f tokens/s\n",
         swarm_waste_wasted_s(sw->waste), swarm_waste_on_lost_s(sw->waste), sw->unaggregated_s, tps);
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
