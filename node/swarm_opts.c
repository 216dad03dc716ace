/* node/swarm_opts.c — `gwtf swarm`'s command line (node/swarm_opts.h). */
#include "node/swarm_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/cmd.h"
#include "node/swarm_web.h"
#include "train/peer.h"
#include "train/run.h"
#include "train/subspace.h"
#include "train/wire_codec.h"

void cmd_swarm_help(void) {
  printf(
      "usage: gwtf swarm --relays N --stages S --data-nodes D --model PRESET --iterations I\n"
      "                  [--churn P] [--links FILE] [--seed S] [--summary-json FILE]\n"
      "                  [--dataset PATH] [--capacity N] [--microbatches M] [--batch B]\n"
      "                  [--seq T] [--lr X] [--grad-clip N] [--routing gwtf|swarm] [--threads N]\n"
      "                  [--device cpu|cuda[:N]] [--base-port P] [--workdir DIR]\n"
      "                  [--flow-tick MS] [--hop-timeout MS] [--restart-after ITERS]\n"
      "                  [--fault NAME:KIND:ITER]... [--late-relays K --late-after I]\n"
      "                  [--slowdown F] [--slowdowns F1,F2,...] [--capacities C1,C2,...]\n"
      "                  [--aggregate mean|trimmed-mean] [--byzantine N:MODE]\n"
      "                  [--no-validate-contributions] [--deterministic] [--log-level LEVEL] [--quiet]\n"
      "                  [--http [IP:]PORT [--http-public]]\n"
      "                  [--val-fraction F | --val-dataset PATH] [--eval-every N]\n"
      "                  [--eval-microbatches N] [--checkpoint-every N]\n"
      "                  [--wire-dtype DTYPE[/GRAD]] [--wire-accept LIST] [--subspace K:0]\n"
      "                  [--replicate-every K] [--replicas R]\n"
      "                  [--kill-stage S --at-iteration N [--late-relays K]]\n"
      "                  [--kill-data-node --at-iteration N [--replace-after MS]]\n"
      "                  [--kill-fraction F --at-iteration N]\n"
      "                  [--rebalance-after M | --no-rebalance] [--move-to-short]\n"
      "                  [--join-stages S1,S2,...]\n\n"
      "Runs a training swarm on this machine: D data nodes (the first creates the run)\n"
      "and N relays, each a separate `gwtf node` process on 127.0.0.1, their log\n"
      "streams merged on screen. With --churn P each relay is killed (SIGKILL) with\n"
      "probability P per iteration at a random moment and restarted later with a fresh\n"
      "identity. Prints a summary at the end and writes it as JSON with\n"
      "--summary-json. Without --dataset a synthetic corpus is generated.\n"
      "For tests: --fault r2:backward:3 makes relay r2 SIGKILL itself at its first\n"
      "backward of iteration 3 (KIND: embed, forward, loss, backward, aggregate, eval);\n"
      "--late-relays K --late-after I starts K more relays after iteration I.\n"
      "--slowdown F makes every peer's compute F times slower; --slowdowns gives\n"
      "each relay its own factor (cycled), for heterogeneous swarms; --capacities\n"
      "likewise gives each relay its own capacity.\n"
      "--aggregate, --deterministic and --rerun-lost are passed to every peer (see gwtf\n"
      "help node); the summary's \"ledger\" counts what each stage's average covered:\n"
      "duplicates (0 expected), missing (a member died with its gradient), microbatches\n"
      "re-run for a dead member (--rerun-lost, --deterministic) and recovered from a\n"
      "dead member's shared gradients (--deterministic).\n"
      "TEST TOOLS: --byzantine N:MODE makes the last N relays hostile (gwtf node\n"
      "--byzantine MODE: nan, scale=K, random, wrong-shape, lying-costs), with node IDs\n"
      "above the honest ones so that they contribute rather than aggregate;\n"
      "--no-validate-contributions turns the aggregators' checks off, to show the\n"
      "same run without its defence.\n"
      "--http PORT serves a live web view of the whole swarm (stages and members,\n"
      "flows, microbatches in flight, loss and validation curves, throughput, a\n"
      "timeline of crashes, re-routes, repairs, joins and aggregations) at\n"
      "http://127.0.0.1:PORT/, built from the merged log streams (docs/WEB.md);\n"
      "IP:PORT binds elsewhere, which needs --http-public (no authentication).\n\n"
      "--val-fraction F holds out the last F of the dataset's tokens (--val-dataset:\n"
      "another file) and the data nodes report the validation loss (eval.done) before\n"
      "every Nth iteration and after the last (--eval-every N, default 10) on\n"
      "--eval-microbatches validation microbatches (default: --microbatches); the\n"
      "summary carries the curve (\"validation\"). Off by default.\n"
      "--checkpoint-every N makes every peer write its stage's checkpoint every N\n"
      "iterations into its data dir under --workdir (default 0: none), for gwtf export.\n"
      "--grad-clip N goes into the run record: every peer clips its stage's gradient to\n"
      "L2 norm N before each step (default 1; 0: off; see gwtf help node).\n"
      "--subspace K:0 goes into the run record too: activations between stages cross as\n"
      "K numbers a row and the token ids (see gwtf help node).\n"
      "--wire-dtype and --wire-accept go to every peer (see gwtf help node): activations\n"
      "and their gradients between stages compressed where the receiver accepts it\n"
      "(" WIRE_DTYPE_LIST "; ACT/GRAD: activations in ACT,\n"
      "gradients in GRAD, e.g. rot4/lr32r4).\n"
      "--replicate-every K and --replicas R go to every peer (see gwtf help node): each\n"
      "stage's state is pushed to R peers outside it every K aggregations.\n"
      "TEST TOOL: --kill-stage S --at-iteration N kills every peer of stage S at once\n"
      "(SIGKILL) while the run is in iteration N, and never restarts those identities;\n"
      "--late-relays K then start right after the kill (spares the leader places into\n"
      "the empty stage, which restores its newest replica; without spares the leader\n"
      "moves a relay of the stage with the most members there). The summary reports the\n"
      "seconds from the kill to the next completed iteration (stage_kill).\n"
      "TEST TOOL: --kill-data-node --at-iteration N kills every data node at once\n"
      "(SIGKILL) in iteration N; --replace-after MS later (default 2000) a fresh data\n"
      "node (new identity, empty data dir, same dataset) joins, restores stage 0 from\n"
      "its newest replica and resumes in the relays' iteration (data_node_kill).\n"
      "TEST TOOL: --kill-fraction F --at-iteration N kills ceil(F x --relays) live relays\n"
      "drawn at random, at once (a correlated outage, no stage spared); they come back\n"
      "with fresh identities as churn's victims do (fraction_kill). Both report the\n"
      "seconds from the kill to the next completed iteration and the aggregations lost.\n"
      "At most one of --kill-stage, --kill-data-node, --kill-fraction.\n"
      "--rebalance-after M goes to the data nodes (see gwtf help node): the leader moves a\n"
      "relay into the bottleneck stage (stage.rebalance). Off in a swarm unless given\n"
      "(--no-rebalance, the default here, keeps the placement of the scenarios as before).\n"
      "--move-to-short goes to the data nodes too: the leader moves a relay into a stage that a\n"
      "death left with fewer slots than the microbatches started (off unless given).\n"
      "TEST TOOL: --join-stages S1,S2,... makes each relay (cycled) ask the leader for that\n"
      "stage when it first joins (gwtf node --join-stage; the data nodes get\n"
      "--grant-join-stages), to start a skewed swarm, e.g.\n"
      "--relays 6 --join-stages 1,1,1,1,2,3 (restarted relays are placed by the leader).\n\n"
      "defaults: --data-nodes 1 --stages 3 --relays 6 --model tiny --iterations 20\n"
      "          --capacity 4 --microbatches 4 --batch 4 --seq 64 --lr 1e-3\n"
      "          --routing gwtf --threads 1 --device cpu --seed 1 --base-port 27000\n"
      "          --flow-tick 100 (a local swarm converges in seconds; the prototype's 2000 suits\n"
      "          real networks) --hop-timeout 2000 --restart-after 1\n");
}

/* Long-only options: codes past every letter, so new ones cannot collide. */
enum {
  SW_AGGREGATE = 256,
  SW_BYZANTINE,
  SW_NO_VALIDATE,
  SW_DETERMINISTIC,
  SW_RERUN_LOST,
  SW_WIRE_DTYPE,
  SW_GRAD_CLIP,
  SW_SUBSPACE,
  SW_WIRE_ACCEPT,
  SW_HTTP,
  SW_HTTP_PUBLIC,
  SW_VAL_FRACTION,
  SW_VAL_DATASET,
  SW_EVAL_EVERY,
  SW_EVAL_MB,
  SW_CHECKPOINT_EVERY,
  SW_REPLICATE_EVERY,
  SW_REPLICAS,
  SW_KILL_STAGE,
  SW_AT_ITERATION,
  SW_KILL_DATA_NODE,
  SW_REPLACE_AFTER,
  SW_KILL_FRACTION,
  SW_REBALANCE_AFTER,
  SW_NO_REBALANCE,
  SW_MOVE_SHORT,
  SW_JOIN_STAGES,
};

/* --join-stages: a comma list of stages in 1..stages (NULL: none). */
static bool swarm_join_stages_ok(const char *list, int stages) {
  if (!list) return true;
  const char *c = list;
  for (;;) {
    char *end = NULL;
    long v = strtol(c, &end, 10);
    if (end == c || v < 1 || v > stages || (*end != ',' && *end)) return false;
    if (!*end) return true;
    c = end + 1;
  }
}

int swarm_opts_parse(int argc, char **argv, swarm_opts *o) {
  static const struct option opts[] = {
      {"relays", required_argument, 0, 'r'},       {"stages", required_argument, 0, 's'},
      {"data-nodes", required_argument, 0, 'd'},   {"model", required_argument, 0, 'm'},
      {"iterations", required_argument, 0, 'i'},   {"churn", required_argument, 0, 'c'},
      {"links", required_argument, 0, 'l'},        {"seed", required_argument, 0, 'S'},
      {"summary-json", required_argument, 0, 'j'}, {"dataset", required_argument, 0, 'D'},
      {"capacity", required_argument, 0, 'C'},    {"microbatches", required_argument, 0, 'M'},
      {"batch", required_argument, 0, 'B'},        {"seq", required_argument, 0, 'T'},
      {"lr", required_argument, 0, 'L'},           {"routing", required_argument, 0, 'R'},
      {"threads", required_argument, 0, 't'},      {"device", required_argument, 0, 'v'},
      {"base-port", required_argument, 0, 'p'},    {"workdir", required_argument, 0, 'w'},
      {"log-level", required_argument, 0, 'g'},    {"restart-after", required_argument, 0, 'a'},
      {"flow-tick", required_argument, 0, 'F'},   {"hop-timeout", required_argument, 0, 'H'},
      {"fault", required_argument, 0, 'f'},       {"late-relays", required_argument, 0, 'K'},
      {"late-after", required_argument, 0, 'A'},  {"slowdown", required_argument, 0, 'W'},
      {"slowdowns", required_argument, 0, 'X'},   {"capacities", required_argument, 0, 'Y'},
      {"quiet", no_argument, 0, 'q'},              {"help", no_argument, 0, 'h'},
      {"aggregate", required_argument, 0, SW_AGGREGATE},
      {"byzantine", required_argument, 0, SW_BYZANTINE},
      {"no-validate-contributions", no_argument, 0, SW_NO_VALIDATE},
      {"deterministic", no_argument, 0, SW_DETERMINISTIC},
      {"rerun-lost", no_argument, 0, SW_RERUN_LOST},
      {"wire-dtype", required_argument, 0, SW_WIRE_DTYPE}, {"grad-clip", required_argument, 0, SW_GRAD_CLIP},
      {"wire-accept", required_argument, 0, SW_WIRE_ACCEPT},
      {"subspace", required_argument, 0, SW_SUBSPACE},
      {"http", required_argument, 0, SW_HTTP},
      {"http-public", no_argument, 0, SW_HTTP_PUBLIC},
      {"val-fraction", required_argument, 0, SW_VAL_FRACTION},
      {"val-dataset", required_argument, 0, SW_VAL_DATASET},
      {"eval-every", required_argument, 0, SW_EVAL_EVERY},
      {"eval-microbatches", required_argument, 0, SW_EVAL_MB},
      {"checkpoint-every", required_argument, 0, SW_CHECKPOINT_EVERY},
      {"replicate-every", required_argument, 0, SW_REPLICATE_EVERY},
      {"replicas", required_argument, 0, SW_REPLICAS},
      {"kill-stage", required_argument, 0, SW_KILL_STAGE},
      {"at-iteration", required_argument, 0, SW_AT_ITERATION},
      {"kill-data-node", no_argument, 0, SW_KILL_DATA_NODE},
      {"replace-after", required_argument, 0, SW_REPLACE_AFTER},
      {"kill-fraction", required_argument, 0, SW_KILL_FRACTION},
      {"rebalance-after", required_argument, 0, SW_REBALANCE_AFTER},
      {"no-rebalance", no_argument, 0, SW_NO_REBALANCE},
      {"move-to-short", no_argument, 0, SW_MOVE_SHORT},
      {"join-stages", required_argument, 0, SW_JOIN_STAGES},
      {0}};
  *o = (swarm_opts){.relays = 6, .stages = 3, .data_nodes = 1, .iterations = 20, .model = "tiny",
                    .routing = "gwtf", .log_level = "info", .device = "cpu", .seed = 1, .capacity = 4,
                    .microbatches = 4, .batch = 4, .seq = 64, .threads = 1, .base_port = 27000, .lr = 1e-3,
                    .grad_clip = TRAIN_RUN_GRAD_CLIP_DEFAULT, .restart_after = 1, .flow_tick = 100,
                    .hop_timeout = 2000, .slowdown = 1.0,
                    .eval_every = -1, .replicate_every = -1, .replace_after_ms = 2000,
                    .rebalance_after = 0};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'r': o->relays = atoi(optarg); break;
    case 's': o->stages = atoi(optarg); break;
    case 'd': o->data_nodes = atoi(optarg); break;
    case 'm': o->model = optarg; break;
    case 'i': o->iterations = atoi(optarg); break;
    case 'c': o->churn = atof(optarg); break;
    case 'l': o->links = optarg; break;
    case 'S': o->seed = strtoull(optarg, NULL, 10); break;
    case 'j': o->summary_json = optarg; break;
    case 'D': o->dataset = optarg; break;
    case 'C': o->capacity = atoi(optarg); break;
    case 'M': o->microbatches = atoi(optarg); break;
    case 'B': o->batch = atoi(optarg); break;
    case 'T': o->seq = atoi(optarg); break;
    case 'L': o->lr = atof(optarg); break;
    case 'R': o->routing = optarg; break;
    case 't': o->threads = atoi(optarg); break;
    case 'v': o->device = optarg; break;
    case 'p': o->base_port = atoi(optarg); break;
    case 'w': o->workdir = optarg; break;
    case 'g': o->log_level = optarg; break;
    case 'a': o->restart_after = atoi(optarg); break;
    case 'F': o->flow_tick = atoi(optarg); break;
    case 'f':
      if (o->n_faults == 16) {
        fprintf(stderr, "gwtf swarm: at most 16 --fault\n");
        return 2;
      }
      o->faults[o->n_faults++] = optarg;
      break;
    case 'K': o->late_relays = atoi(optarg); break;
    case 'W': o->slowdown = atof(optarg); break;
    case 'X': o->slowdowns = optarg; break;
    case 'Y': o->capacities = optarg; break;
    case 'A': o->late_after = atoi(optarg); break;
    case 'H': o->hop_timeout = atoi(optarg); break;
    case SW_WIRE_DTYPE: o->wire_dtype = optarg; break;
    case SW_GRAD_CLIP: o->grad_clip = atof(optarg); break;
    case SW_SUBSPACE: o->subspace = optarg; break;
    case SW_WIRE_ACCEPT: o->wire_accept = optarg; break;
    case 'q': o->quiet = true; break;
    case SW_AGGREGATE: o->aggregate = optarg; break;
    case SW_NO_VALIDATE: o->no_validation = true; break;
    case SW_DETERMINISTIC: o->deterministic = true; break;
    case SW_RERUN_LOST: o->rerun_lost = true; break;
    case SW_BYZANTINE: {
      char *colon = NULL;
      long k = strtol(optarg, &colon, 10);
      train_byzantine mode;
      double scale;
      if (colon == optarg || *colon != ':' || k < 1 || k > SWARM_MAX_PEERS ||
          train_byzantine_parse(colon + 1, &mode, &scale) != 0) {
        fprintf(stderr, "gwtf swarm: --byzantine wants N:MODE (MODE nan, scale=K, random, wrong-shape, lying-costs)\n");
        return 2;
      }
      o->byzantine = (int)k;
      o->byzantine_mode = colon + 1;
      break;
    }
    case SW_HTTP: o->http = optarg; break;
    case SW_HTTP_PUBLIC: o->http_public = true; break;
    case SW_VAL_FRACTION: o->val_fraction = atof(optarg); break;
    case SW_VAL_DATASET: o->val_dataset = optarg; break;
    case SW_EVAL_EVERY: o->eval_every = atoi(optarg); break;
    case SW_EVAL_MB: o->eval_microbatches = atoi(optarg); break;
    case SW_CHECKPOINT_EVERY: o->checkpoint_every = atoi(optarg); break;
    case SW_REPLICATE_EVERY: o->replicate_every = atoi(optarg); break;
    case SW_REPLICAS: o->replicas = atoi(optarg); break;
    case SW_KILL_STAGE: o->kill_stage = atoi(optarg); break;
    case SW_AT_ITERATION: o->kill_at = atoi(optarg); break;
    case SW_KILL_DATA_NODE: o->kill_data_node = true; break;
    case SW_REPLACE_AFTER: o->replace_after_ms = atoi(optarg); break;
    case SW_KILL_FRACTION: o->kill_fraction = atof(optarg); break;
    case SW_REBALANCE_AFTER: o->rebalance_after = atoi(optarg); break;
    case SW_NO_REBALANCE: o->rebalance_after = 0; break;
    case SW_MOVE_SHORT: o->move_to_short = true; break;
    case SW_JOIN_STAGES: o->join_stages = optarg; break;
    case 'h': cmd_swarm_help(); return 1;
    default: cmd_swarm_help(); return 2;
    }
  }
  const char *bad = NULL;
  train_dtype wd, wg;
  int sub_k, sub_r;
  uint32_t wa;
  char why[300];
  bool is_public = false;
  if (optind < argc) bad = "unexpected argument";
  else if (o->stages < 1 || o->stages > 64) bad = "--stages must be in 1..64";
  else if (o->data_nodes < 1 || o->relays < o->stages) bad = "need at least one data node and one relay per stage";
  else if (o->data_nodes + o->relays + o->late_relays > SWARM_MAX_PEERS) bad = "too many peers";
  else if (o->late_relays < 0 || (o->late_relays > 0 && o->late_after < 1 && o->kill_stage == 0))
    bad = "--late-relays needs --late-after >= 1 (or --kill-stage)";
  else if (o->kill_stage < 0 || o->kill_stage > o->stages) bad = "--kill-stage must be a relay stage (1..--stages)";
  else if (o->kill_stage > 0 && (o->kill_at < 1 || o->kill_at >= o->iterations))
    bad = "--kill-stage needs --at-iteration N with 1 <= N < --iterations";
  else if ((o->kill_stage > 0) + o->kill_data_node + (o->kill_fraction != 0) > 1)
    bad = "at most one of --kill-stage, --kill-data-node, --kill-fraction";
  else if (!(o->kill_fraction >= 0 && o->kill_fraction <= 1)) bad = "--kill-fraction must be in (0, 1]";
  else if ((o->kill_data_node || o->kill_fraction > 0) && (o->kill_at < 1 || o->kill_at >= o->iterations))
    bad = "--kill-data-node and --kill-fraction need --at-iteration N with 1 <= N < --iterations";
  else if (o->replace_after_ms < 0 || o->replace_after_ms > 600000) bad = "--replace-after must be in 0..600000 ms";
  else if (o->replicate_every < -1) bad = "--replicate-every must be >= 0";
  else if (o->replicas != 0 && (o->replicas < 2 || o->replicas > 16)) bad = "--replicas must be in 2..16";
  else if (o->iterations < 1 || o->iterations >= SWARM_MAX_ITERS) bad = "--iterations out of range";
  else if (o->churn < 0 || o->churn >= 1) bad = "--churn must be in [0, 1)";
  else if (o->capacity < 1 || o->microbatches < 1 || o->batch < 1 || o->seq < 2) bad = "sizes must be positive";
  else if (strcmp(o->routing, "gwtf") != 0 && strcmp(o->routing, "swarm") != 0) bad = "--routing is gwtf or swarm";
  /* Below Linux's ephemeral range (32768+), where an outgoing connection
   * may hold a port for a while and a listener would fail to bind it. */
  else if (o->base_port < 1024 || o->base_port + SWARM_MAX_PEERS > 32768) bad = "--base-port must be in 1024..32512";
  else if (o->restart_after < 1) bad = "--restart-after must be at least 1";
  else if (o->flow_tick < 10 || o->hop_timeout < 50) bad = "--flow-tick >= 10 ms, --hop-timeout >= 50 ms";
  else if (o->slowdown < 1) bad = "--slowdown must be >= 1";
  else if (!(o->grad_clip >= 0 && o->grad_clip < 1e30)) bad = "--grad-clip must be >= 0 (0: off)";
  else if (o->subspace && (subspace_parse(o->subspace, &sub_k, &sub_r) != 0 || sub_r != 0))
    bad = "--subspace is K:0 (rank K; a swarm keeps the table fixed so far)";
  else if (o->byzantine >= o->relays) bad = "--byzantine N needs N below --relays";
  else if (o->aggregate && strcmp(o->aggregate, "mean") != 0 && strcmp(o->aggregate, "trimmed-mean") != 0)
    bad = "--aggregate is mean or trimmed-mean";
  else if (o->deterministic && o->aggregate && strcmp(o->aggregate, "mean") != 0)
    bad = "--deterministic goes with --aggregate mean only";
  else if (o->http && swarm_web_check(o->http, o->http_public, &is_public, why, sizeof(why)) != 0) bad = why;
  else if (!(o->val_fraction >= 0 && o->val_fraction <= 0.5)) bad = "--val-fraction must be in [0, 0.5]";
  else if (o->val_fraction > 0 && o->val_dataset) bad = "--val-fraction and --val-dataset exclude each other";
  else if (o->eval_every < -1) bad = "--eval-every must be >= 0";
  else if (o->wire_dtype && wire_pair_parse(o->wire_dtype, &wd, &wg) != 0)
    bad = "--wire-dtype is DTYPE or ACT/GRAD of " WIRE_DTYPE_LIST;
  else if (o->wire_accept && wire_mask_parse(o->wire_accept, &wa) != 0)
    bad = "--wire-accept is a comma list of " WIRE_DTYPE_LIST;
  else if (o->eval_microbatches < 0 || o->eval_microbatches > 65536) bad = "--eval-microbatches must be in 0..65536";
  else if (o->checkpoint_every < 0) bad = "--checkpoint-every must be >= 0";
  else if (o->rebalance_after < 0) bad = "--rebalance-after must be >= 0";
  else if (!swarm_join_stages_ok(o->join_stages, o->stages)) bad = "--join-stages wants a comma list of 1..--stages";
  if (bad) {
    fprintf(stderr, "gwtf swarm: %s\n", bad);
    return 2;
  }
  if (is_public)
    fprintf(stderr, "gwtf swarm: warning: --http %s serves the live view beyond this machine, without "
                    "authentication: anyone who reaches it sees the run\n", o->http);
  return 0;
}
