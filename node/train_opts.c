/* node/train_opts.c — the training options of `gwtf node`. */
#include <getopt.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "node/train_node.h"
#include "train/model.h"
#include "train/run.h"
#include "train/subspace.h"
#include "train/wire_codec.h"
#include "util/err.h"

enum {
  T_CREATE = TRAIN_NODE_OPT_BASE,
  T_RUN,
  T_ROLE,
  T_MODEL,
  T_STAGES,
  T_DATASET,
  T_DEVICE,
  T_CAPACITY,
  T_MICRO,
  T_BATCH,
  T_SEQ,
  T_ITERS,
  T_LR,
  T_GRAD_CLIP,
  T_SUBSPACE,
  T_SEED,
  T_DATA_SEED,
  T_ROUTING,
  T_THREADS,
  T_CKPT,
  T_RESUME,
  T_FLOW_TICK,
  T_HOP_TIMEOUT,
  T_LIVE_K,
  T_LIVE_FLOOR,
  T_STAY,
  T_DEBUG_CRASH,
  T_EXIT_WITH_PARENT,
  T_SLOWDOWN,
  T_JOIN,
  T_OPEN,
  T_RUN_KEY,
  T_AGGREGATE,
  T_NO_VALIDATE,
  T_DETERMINISTIC,
  T_RERUN_LOST,
  T_BYZANTINE,
  T_VAL_FRACTION,
  T_VAL_DATASET,
  T_EVAL_EVERY,
  T_WIRE_DTYPE,
  T_WIRE_ACCEPT,
  T_EVAL_MB,
  T_STAGE_MEM,
  T_REPL_EVERY,
  T_REPLICAS,
  T_REPLICA_MAX,
  T_REBAL_AFTER,
  T_NO_REBAL,
  T_MOVE_SHORT,
  T_REBAL_MARGIN,
  T_JOIN_STAGE,
  T_GRANT_JOIN_STAGES,
};

const struct option train_node_options[] = {
    {"create-run", required_argument, 0, T_CREATE},
    {"run", required_argument, 0, T_RUN},
    {"role", required_argument, 0, T_ROLE},
    {"model", required_argument, 0, T_MODEL},
    {"stages", required_argument, 0, T_STAGES},
    {"dataset", required_argument, 0, T_DATASET},
    {"device", required_argument, 0, T_DEVICE},
    {"capacity", required_argument, 0, T_CAPACITY},
    {"microbatches", required_argument, 0, T_MICRO},
    {"batch", required_argument, 0, T_BATCH},
    {"seq", required_argument, 0, T_SEQ},
    {"iterations", required_argument, 0, T_ITERS},
    {"lr", required_argument, 0, T_LR},
    {"grad-clip", required_argument, 0, T_GRAD_CLIP},
    {"subspace", required_argument, 0, T_SUBSPACE},
    {"seed", required_argument, 0, T_SEED},
    {"data-seed", required_argument, 0, T_DATA_SEED},
    {"routing", required_argument, 0, T_ROUTING},
    {"threads", required_argument, 0, T_THREADS},
    {"checkpoint-every", required_argument, 0, T_CKPT},
    {"resume", no_argument, 0, T_RESUME},
    {"flow-tick", required_argument, 0, T_FLOW_TICK},
    {"hop-timeout", required_argument, 0, T_HOP_TIMEOUT},
    {"live-k", required_argument, 0, T_LIVE_K},
    {"live-floor", required_argument, 0, T_LIVE_FLOOR},
    {"stay", no_argument, 0, T_STAY},
    {"debug-crash", required_argument, 0, T_DEBUG_CRASH},
    {"exit-with-parent", no_argument, 0, T_EXIT_WITH_PARENT},
    {"slowdown", required_argument, 0, T_SLOWDOWN},
    {"join", required_argument, 0, T_JOIN},
    {"open", no_argument, 0, T_OPEN},
    {"run-key", required_argument, 0, T_RUN_KEY},
    {"aggregate", required_argument, 0, T_AGGREGATE},
    {"no-validate-contributions", no_argument, 0, T_NO_VALIDATE},
    {"deterministic", no_argument, 0, T_DETERMINISTIC},
    {"rerun-lost", no_argument, 0, T_RERUN_LOST},
    {"byzantine", required_argument, 0, T_BYZANTINE},
    {"val-fraction", required_argument, 0, T_VAL_FRACTION},
    {"val-dataset", required_argument, 0, T_VAL_DATASET},
    {"eval-every", required_argument, 0, T_EVAL_EVERY},
    {"wire-dtype", required_argument, 0, T_WIRE_DTYPE},
    {"wire-accept", required_argument, 0, T_WIRE_ACCEPT},
    {"eval-microbatches", required_argument, 0, T_EVAL_MB},
    {"stage-memory-mb", required_argument, 0, T_STAGE_MEM},
    {"replicate-every", required_argument, 0, T_REPL_EVERY},
    {"replicas", required_argument, 0, T_REPLICAS},
    {"replica-max", required_argument, 0, T_REPLICA_MAX},
    {"rebalance-after", required_argument, 0, T_REBAL_AFTER},
    {"no-rebalance", no_argument, 0, T_NO_REBAL},
    {"move-to-short", no_argument, 0, T_MOVE_SHORT},
    {"rebalance-margin", required_argument, 0, T_REBAL_MARGIN},
    {"join-stage", required_argument, 0, T_JOIN_STAGE},
    {"grant-join-stages", no_argument, 0, T_GRANT_JOIN_STAGES},
    {0},
};
_Static_assert(sizeof(train_node_options) / sizeof(train_node_options[0]) - 1 <= TRAIN_NODE_MAX_OPTIONS,
               "raise TRAIN_NODE_MAX_OPTIONS: cmd_node would drop training options");

void train_node_print_help(void) {
  printf("\ntraining (a node without these options only keeps sessions and the DHT):\n"
         "  --create-run NAME          start a run and be its first data node (the leader)\n"
         "  --run NAME                 join a run found in the DHT (through --bootstrap); a\n"
         "                             private run also needs --join or --run-key\n"
         "  --join TOKEN               join the private run of an invite (gwtf invite on the\n"
         "                             run's creator): its name, key and the creator's address\n"
         "                             (dialled as a bootstrap peer) come from the token\n"
         "  --open                     with --create-run: a public run anyone may join (the\n"
         "                             default is private: members need an invite)\n"
         "  --run-key FILE             hold the run key (default for --create-run:\n"
         "                             DIR/runs/NAME/run.key, created 0600): a data node with it\n"
         "                             admits members and revokes like the creator (failover)\n"
         "  --role relay|data          joining as a relay (default) or as another data node\n"
         "  --device cpu|cuda[:N]      where this peer computes (default cpu)\n"
         "  --capacity N               relays: microbatches held at once, plus one for repairs only\n"
         "                             (default: what free memory holds, one kept for repairs from 8 on)\n"
         "  --dataset PATH             data nodes: UTF-8 text or llm.c uint16 token file\n"
         "  --iterations N             data nodes: stop after N iterations (0: forever)\n"
         "  --data-seed S              data nodes: microbatch sampling seed (default: from the node ID,\n"
         "                             so each data node of a run draws its own microbatches)\n"
         "  --val-fraction F           data nodes: hold out the last F of the dataset's tokens (0..0.5,\n"
         "                             default 0: none) and report the validation loss on them\n"
         "  --val-dataset PATH         data nodes: the validation tokens come from this file instead\n"
         "  --eval-every N             data nodes: validation loss before every Nth iteration and after\n"
         "                             the last (default 10; 0: never; needs one of the two above)\n"
         "  --eval-microbatches N      data nodes: the validation set's microbatches (default 0: as\n"
         "                             many as --microbatches; fewer if the held-out tokens hold fewer)\n"
         "  --threads N                compute threads (default 0 = all cores this process may use)\n"
         "  --routing gwtf|swarm       GWTF flows (default) or SWARM's stochastic wiring\n"
         "  --checkpoint-every N       write the stage's checkpoint every N iterations (default 10)\n"
         "  --resume                   start from this data dir's checkpoint when recent enough\n"
         "  --replicate-every K        relays: every K aggregations the stage's aggregator pushes the\n"
         "                             stage's weights and optimizer state to --replicas peers outside\n"
         "                             the stage, so it outlives them (default 5; 0: never)\n"
         "  --replicas R               holders of each replica (default 2, at least 2)\n"
         "  --replica-max N            replicas of other stages this peer holds, oldest dropped (default 4)\n"
         "  --rebalance-after M        data nodes, as the leader: move a relay into the bottleneck stage\n"
         "                             once the same stage was it, with a move worth making, M\n"
         "                             iterations in a row; M more after a move (default 3;\n"
         "                             0: never); docs/TRAINING.md, Live rebalancing\n"
         "  --no-rebalance             the same as --rebalance-after 0\n"
         "  --move-to-short            data nodes, as the leader: move a relay from a stage with slots\n"
         "                             to spare into one that a death left holding fewer than the\n"
         "                             microbatches the data nodes start, after its round (default off;\n"
         "                             docs/TRAINING.md, Live rebalancing)\n"
         "  --rebalance-margin H       a move is worth making when it raises the bottleneck's rate\n"
         "                             (and leaves the donor's) above (1 + H) x the bottleneck's (0.2)\n"
         "  --join-stage S             TEST TOOL, relays: ask the leader for stage S when joining (to\n"
         "                             start a swarm skewed)\n"
         "  --grant-join-stages        TEST TOOL, data nodes: as the leader, place a joiner in the stage\n"
         "                             it asks for (otherwise ignored: a peer must not choose its stage)\n"
         "  --flow-tick MS             flow protocol tick (default 2000, the GWTF prototype's)\n"
         "  --hop-timeout MS           no acknowledgement by then: the peer is presumed dead (5000);\n"
         "                             the cap of the RTT-based deadlines below\n"
         "  --live-k K                 a hop's deadline is K x (srtt + 4 rttvar) of the session plus the\n"
         "                             next peer's compute; past it the peer is probed (a ping) and\n"
         "                             declared failed only if nothing comes back in its own deadline\n"
         "                             (default 4; 0: fixed hop timeouts only)\n"
         "  --live-floor MS            neither deadline is ever shorter (default 500)\n"
         "  --stay                     a data node keeps running after its iterations\n"
         "  --slowdown F               emulate a device F times slower (F >= 1; experiments)\n"
         "  --aggregate mean|trimmed-mean\n"
         "                             how this peer combines its stage's gradients when it aggregates:\n"
         "                             the mean (default) or a coordinate-wise trimmed mean that drops\n"
         "                             floor(0.2 x M) of the M contributions at each end, per coordinate\n"
         "                             (nothing below 5 contributions)\n"
         "  --deterministic             every member keeps each microbatch's own gradient and the\n"
         "                             aggregator sums them in microbatch-ID order, each once: the\n"
         "                             run equals gwtf train-ref --deterministic bit for bit on the\n"
         "                             same microbatches; a data node re-runs a microbatch whose\n"
         "                             member died, members share each gradient with their stage\n"
         "                             (each holds n_params floats per microbatch of its stage;\n"
         "                             with --aggregate mean only)\n"
         "  --rerun-lost                a data node re-runs a completed microbatch whose gradient died\n"
         "                             with a member before the round, while the iteration runs, so\n"
         "                             every stage counts it once (on with --deterministic; costs\n"
         "                             time under churn: docs/TRAINING.md, Re-runs)\n"
         "  --no-validate-contributions\n"
         "                             TEST ONLY: take stage members' gradients unchecked (shows what\n"
         "                             the checks save; never use it in a real run)\n"
         "  --byzantine MODE           TEST TOOL: misbehave on purpose as a hostile relay. MODE: nan,\n"
         "                             scale=K, random, wrong-shape (corrupt our gradient contribution),\n"
         "                             lying-costs (claim ~0 compute time and capacity 4096 in HELLO)\n"
         "  --wire-dtype DTYPE[/GRAD]  activations and their gradients to the next/previous stage in\n"
         "                             this format where the receiver accepts it, else fp32 (default\n"
         "                             fp32; weights always fp32). ACT/GRAD: activations in ACT, their\n"
         "                             gradients in GRAD (e.g. rot4/lr32r4). DTYPE: fp32, bf16, fp16,\n"
         "                             int8 (a scale per row), rot5|rot4|rot3|rot2 (rows rotated, then\n"
         "                             5/4/3/2 bits each), lr8|lr16|lr32 (column mean + rank-8/16/32\n"
         "                             factors, int8; for gradients), lr16r4|lr32r4 (factors rot4);\n"
         "                             docs/TRAINING.md, Wire compression\n"
         "  --wire-accept LIST         the wire dtypes we take, e.g. fp32,bf16 (default all; fp32 always)\n"
         "  --exit-with-parent         stop (SIGTERM) when the launching process dies (gwtf swarm)\n"
         "  --debug-crash KIND:ITER    tests: SIGKILL ourselves at our first KIND job (embed, forward,\n"
         "                             loss, backward, aggregate; eval: a relay's validation forward)\n"
         "                             from iteration ITER on\n"
         "run creation only (the others read them from the run record):\n"
         "  --model PRESET|FILE        model preset (");
  size_t n;
  const model_preset *p = model_presets(&n);
  for (size_t i = 0; i < n; i++) printf("%s%s", i ? ", " : "", p[i].name);
  printf(") or a JSON config file\n"
         "  --stages S                 relay stages (default 3)\n"
         "  --stage-memory-mb M        the fewest stages whose even split fits M MB per relay (weights,\n"
         "                             AdamW state, gradients, activations); with --stages: checks it\n"
         "  --microbatches M           per data node per iteration (default 4)\n"
         "  --batch B --seq T          microbatch shape (default 4 x 64)\n"
         "  --lr X                     AdamW learning rate (default 1e-3)\n"
         "  --grad-clip N              clip each stage's gradient to L2 norm N before its step\n"
         "                             (default 1; 0: off; llm.c and GPT-2 clip the whole model to 1)\n"
         "  --subspace K:0             activations between stages cross as K numbers a row and the\n"
         "                             token ids, rebuilt exactly by the receiver (docs/TRAINING.md,\n"
         "                             \"Subspace crossings\"); the embedding's table stays fixed\n"
         "  --seed S                   weight init seed (default 1)\n");
}

static int bad(const char *opt, const char *val, const char *want) {
  fprintf(stderr, "gwtf node: %s '%s': %s\n", opt, val, want);
  return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return GW_EINVAL;
  *out = v;
  return 0;
}

static int run_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > TRAIN_RUN_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!(s[i] == '-' || s[i] == '_' || s[i] == '.' || (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
          (s[i] >= 'A' && s[i] <= 'Z')))
      return 0;
  return 1;
}

int train_node_parse_opt(train_node_opts *o, int code, const char *arg) {
  long v;
  gpu_device dev;
  switch (code) {
  case T_CREATE:
  case T_RUN:
    if (!run_name_ok(arg)) return bad(code == T_RUN ? "--run" : "--create-run", arg, "1-64 of [A-Za-z0-9._-]");
    if (code == T_RUN) o->run = arg;
    else o->create_run = arg;
    return 0;
  case T_ROLE:
    if (strcmp(arg, "relay") && strcmp(arg, "data")) return bad("--role", arg, "relay or data");
    o->data = strcmp(arg, "data") == 0;
    return 0;
  case T_MODEL: o->model = arg; return 0;
  case T_DATASET: o->dataset = arg; return 0;
  case T_VAL_DATASET: o->val_dataset = arg; return 0;
  case T_VAL_FRACTION: {
    char *end = NULL;
    o->val_fraction = strtod(arg, &end);
    return end != arg && !*end && o->val_fraction >= 0 && o->val_fraction <= 0.5 ? 0
                                                                                : bad("--val-fraction", arg, "a fraction in [0, 0.5]");
  }
  case T_DEVICE:
    if (gpu_device_parse(arg, &dev) != 0) return bad("--device", arg, "cpu, cuda or cuda:N");
    o->device = arg;
    return 0;
  case T_ROUTING:
    if (strcmp(arg, "gwtf") && strcmp(arg, "swarm")) return bad("--routing", arg, "gwtf or swarm");
    o->routing = arg;
    return 0;
  case T_NO_REBAL: o->rebalance_after = 0; return 0;
  case T_MOVE_SHORT: o->move_to_short = true; return 0;
  case T_GRANT_JOIN_STAGES: o->grant_join_stages = true; return 0;
  case T_REBAL_MARGIN: {
    char *end = NULL;
    o->rebalance_margin = strtod(arg, &end);
    return end != arg && !*end && o->rebalance_margin >= 0 && o->rebalance_margin <= 10
               ? 0
               : bad("--rebalance-margin", arg, "a fraction in [0, 10]");
  }
  case T_SLOWDOWN:
    o->slowdown = atof(arg);
    return o->slowdown >= 1 && o->slowdown <= 1000 ? 0 : bad("--slowdown", arg, "a factor in [1, 1000]");
  case T_WIRE_DTYPE:
    if (wire_pair_parse(arg, &o->wire_dtype, &o->wire_grad_dtype) != 0)
      return bad("--wire-dtype", arg, "DTYPE or ACT/GRAD of " WIRE_DTYPE_LIST);
    return 0;
  case T_WIRE_ACCEPT:
    if (wire_mask_parse(arg, &o->wire_accept) != 0)
      return bad("--wire-accept", arg, "a comma list of " WIRE_DTYPE_LIST);
    return 0;
  case T_LR:
    o->lr = atof(arg);
    return o->lr > 0 && o->lr < 10 ? 0 : bad("--lr", arg, "a rate in (0, 10)");
  case T_GRAD_CLIP:
    o->grad_clip = atof(arg);
    return o->grad_clip >= 0 && o->grad_clip < 1e30 ? 0 : bad("--grad-clip", arg, "a norm >= 0 (0: off)");
  case T_SUBSPACE:
    if (subspace_parse(arg, &o->subspace_k, &o->subspace_refresh) != 0)
      return bad("--subspace", arg, "K:0 (rank K >= 1 below d_model; the table fixed)");
    if (o->subspace_refresh != 0)
      return bad("--subspace", arg, "K:0: a swarm keeps the table fixed so far (its refresh is train-ref's)");
    return 0;
  case T_SEED: o->seed = strtoull(arg, NULL, 10); return 0;
  case T_DATA_SEED: o->data_seed = strtoull(arg, NULL, 10); return 0;
  case T_RESUME: o->resume = true; return 0;
  case T_OPEN: o->open_run = true; return 0;
  case T_RUN_KEY: o->run_key = arg; return 0;
  case T_JOIN: {
    int rc = member_token_parse(arg, &o->invite);
    if (rc == 0) rc = member_token_to_bin(arg, &o->join_token, &o->join_token_len);
    if (rc != 0)
      return bad("--join", arg, rc == GW_EAUTH ? "its signature does not verify (a damaged token?)"
                                               : "not an invite token (gwtf1:...; see gwtf help invite)");
    o->join = arg;
    o->run = o->invite.run;
    char id[GW_ID_HEX_LEN + 1];
    gw_id_to_hex(&o->invite.creator, id);
    snprintf(o->join_bootstrap, sizeof(o->join_bootstrap), "%s@%s", id, o->invite.creator_addr);
    return 0;
  }
  case T_AGGREGATE:
    if (strcmp(arg, "mean") == 0) o->aggregate = TRAIN_AGG_MEAN;
    else if (strcmp(arg, "trimmed-mean") == 0) o->aggregate = TRAIN_AGG_TRIMMED;
    else return bad("--aggregate", arg, "mean or trimmed-mean");
    return 0;
  case T_NO_VALIDATE: o->no_validation = true; return 0;
  case T_DETERMINISTIC: o->deterministic = true; return 0;
  case T_RERUN_LOST: o->rerun_lost = true; return 0;
  case T_BYZANTINE:
    if (train_byzantine_parse(arg, &o->byzantine, &o->byzantine_scale) != 0)
      return bad("--byzantine", arg, "nan, scale=K, random, wrong-shape or lying-costs");
    return 0;
  case T_STAY: o->exit_when_done = false; return 0;
  case T_EXIT_WITH_PARENT: {
    /* A launcher that is killed must not leave its peers running (they
     * would keep their ports). Linux delivers SIGTERM when the parent dies;
     * checking the parent afterwards closes the race with an early death. */
    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent) return bad("--exit-with-parent", "", "parent gone");
    return 0;
  }
  case T_DEBUG_CRASH: {
    static const struct { const char *name; int kind; } kinds[] = {
        {"embed", TRAIN_JOB_EMBED},       {"forward", TRAIN_JOB_FORWARD},   {"loss", TRAIN_JOB_LOSS},
        {"backward", TRAIN_JOB_BACKWARD}, {"aggregate", TRAIN_JOB_GRAD_EXPORT},
        {"eval", TRAIN_JOB_EVAL_FORWARD}};
    const char *colon = strchr(arg, ':');
    for (size_t i = 0; colon && i < sizeof(kinds) / sizeof(kinds[0]); i++) {
      if (strlen(kinds[i].name) != (size_t)(colon - arg) || strncmp(arg, kinds[i].name, (size_t)(colon - arg))) continue;
      if (parse_int(colon + 1, 0, 100000000, &v) != 0) break;
      o->crash_job = kinds[i].kind;
      o->crash_iteration = (uint64_t)v;
      return 0;
    }
    return bad("--debug-crash", arg, "KIND:ITER with KIND embed, forward, loss, backward, aggregate or eval");
  }
  default: break;
  }
  /* the integer options */
  static const struct { int code; const char *name; long lo, hi; } ints[] = {
      {T_STAGES, "--stages", 1, 64},          {T_CAPACITY, "--capacity", 1, 4096},
      {T_MICRO, "--microbatches", 1, 4096},   {T_BATCH, "--batch", 1, 4096},
      {T_SEQ, "--seq", 2, 65536},             {T_ITERS, "--iterations", 0, 100000000},
      {T_THREADS, "--threads", 0, 1024},      {T_CKPT, "--checkpoint-every", 0, 100000000},
      {T_FLOW_TICK, "--flow-tick", 10, 60000}, {T_HOP_TIMEOUT, "--hop-timeout", 50, 3600000},
      {T_LIVE_K, "--live-k", 0, 1000},          {T_LIVE_FLOOR, "--live-floor", 1, 3600000},
      {T_EVAL_EVERY, "--eval-every", 0, 100000000}, {T_EVAL_MB, "--eval-microbatches", 0, 65536},
      {T_STAGE_MEM, "--stage-memory-mb", 1, 1 << 24},
      {T_REPL_EVERY, "--replicate-every", 0, 100000000}, {T_REPLICAS, "--replicas", 2, 16},
      {T_REPLICA_MAX, "--replica-max", 1, 1024},
      {T_REBAL_AFTER, "--rebalance-after", 0, 1000000}, {T_JOIN_STAGE, "--join-stage", 1, 64},
  };
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
    if (ints[i].code != code) continue;
    if (parse_int(arg, ints[i].lo, ints[i].hi, &v) != 0) {
      char want[64];
      snprintf(want, sizeof(want), "an integer in [%ld, %ld]", ints[i].lo, ints[i].hi);
      return bad(ints[i].name, arg, want);
    }
    switch (code) {
    case T_STAGES: o->stages = (int)v, o->stages_given = true; break;
    case T_STAGE_MEM: o->stage_memory_mb = (int)v; break;
    case T_REPL_EVERY: o->replicate_every = (int)v; break;
    case T_REPLICAS: o->replicas = (int)v; break;
    case T_REPLICA_MAX: o->replica_max = (int)v; break;
    case T_REBAL_AFTER: o->rebalance_after = (int)v; break;
    case T_JOIN_STAGE: o->join_stage = (int)v; break;
    case T_CAPACITY: o->capacity = (int)v; break;
    case T_MICRO: o->microbatches = (int)v; break;
    case T_BATCH: o->batch = (int)v; break;
    case T_SEQ: o->seq = (int)v; break;
    case T_ITERS: o->iterations = (uint64_t)v; break;
    case T_THREADS: o->threads = (int)v; break;
    case T_CKPT: o->checkpoint_every = (int)v; break;
    case T_FLOW_TICK: o->flow_tick_ms = (uint64_t)v; break;
    case T_HOP_TIMEOUT: o->hop_timeout_ms = (uint64_t)v; break;
    case T_LIVE_K: o->live_k = (int)v; break;
    case T_LIVE_FLOOR: o->live_floor_ms = (uint64_t)v; break;
    case T_EVAL_EVERY: o->eval_every = (uint64_t)v; break;
    case T_EVAL_MB: o->eval_microbatches = (int)v; break;
    }
    return 0;
  }
  return 2;
}

int train_node_check(const train_node_opts *o, bool *training) {
  *training = o->create_run || o->run;
  if (o->create_run && o->run) {
    fprintf(stderr, "gwtf node: --create-run and --run (or --join) exclude each other\n");
    return 2;
  }
  if (o->join && o->run != o->invite.run && strcmp(o->run, o->invite.run) != 0) {
    fprintf(stderr, "gwtf node: --run %s and the invite's run %s differ (--join alone names the run)\n", o->run,
            o->invite.run);
    return 2;
  }
  if (o->open_run && !o->create_run) {
    fprintf(stderr, "gwtf node: --open goes with --create-run (a joiner reads the run's kind from its record)\n");
    return 2;
  }
  if (o->open_run && o->run_key) {
    fprintf(stderr, "gwtf node: --open and --run-key exclude each other (an open run has no key)\n");
    return 2;
  }
  if ((o->create_run || o->data) && !o->dataset) {
    fprintf(stderr, "gwtf node: a data node needs --dataset PATH\n");
    return 2;
  }
  if (o->val_dataset && o->val_fraction > 0) {
    fprintf(stderr, "gwtf node: --val-dataset and --val-fraction exclude each other\n");
    return 2;
  }
  if (o->deterministic && o->aggregate != TRAIN_AGG_MEAN) {
    fprintf(stderr, "gwtf node: --deterministic averages exactly: it goes with --aggregate mean only\n");
    return 2;
  }
  return 0;
}
