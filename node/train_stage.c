/* node/train_stage.c — our stage: the dataset, the device and capacity, entering and switching stages, routing. */
#include "node/train_rt.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "dht/stage_dir.h"
#include "flow/flow.h"
#include "node/train_plan.h"
#include "node/worker.h"
#include "train/checkpoint.h"
#include "train/compute.h"
#include "train/data.h"
#include "train/route_flow.h"
#include "train/run.h"
#include "train/route_swarm.h"
#include "train/stage.h"
#include "util/err.h"

int train_rt_sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets) {
  train_rt *rt = ud;
  return train_dataset_sample(&rt->ds, rt->data_seed, iteration, index, rt->run.batch, rt->run.seq, inputs, targets);
}

int train_rt_val_sample(void *ud, uint32_t index, int32_t *inputs, int32_t *targets) {
  train_rt *rt = ud;
  return train_dataset_val_sample(&rt->val, index, rt->run.batch, rt->run.seq, inputs, targets);
}

/* The validation set: --eval-microbatches, by default the run's microbatches
 * per iteration (one iteration's forward work); fewer if the held-out tokens
 * hold fewer. */
int train_rt_open_validation(train_rt *rt) {
  const train_node_opts *o = rt->o;
  char err[512];
  if (train_validation_open(&rt->ds, o->val_dataset, o->val_fraction, &rt->val, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.dataset", "err=\"%s\"", err);
    return GW_EINVAL;
  }
  if ((int)rt->val.vocab_needed > rt->run.model.vocab_size) {
    GW_ERROR(&rt->log, "train.dataset", "err=\"the validation set needs a vocabulary of %u, the model has %d\"",
             rt->val.vocab_needed, rt->run.model.vocab_size);
    return GW_EINVAL;
  }
  uint32_t avail = train_dataset_val_count(&rt->val, rt->run.batch, rt->run.seq);
  uint32_t want = (uint32_t)(o->eval_microbatches > 0 ? o->eval_microbatches : rt->run.microbatches);
  rt->val_n = avail < want ? avail : want;
  if (rt->val.n_tokens > 0)
    GW_INFO(&rt->log, "validation.opened", "tokens=%zu train_tokens=%zu microbatches=%u eval_every=%llu",
            rt->val.n_tokens, rt->ds.n_tokens, rt->val_n, (unsigned long long)o->eval_every);
  if (rt->val.n_tokens > 0 && rt->val_n == 0)
    GW_WARN(&rt->log, "validation.empty", "msg=\"the held-out tokens hold no whole microbatch\"");
  return 0;
}

/* Microbatches in flight a stage must hold: a little more than the peer
 * admits, for releases still queued on the worker. */
static void spec_for_stage(const train_rt *rt, int s, stage_spec *spec) {
  int cap = s == 0 ? 2 * rt->run.microbatches + 4 : (int)(rt->capacity + rt->repair_reserve) + 4;
  train_run_stage_spec(&rt->run, s, cap, spec);
}

/* The capacity a relay offers: what its memory budget holds of the largest
 * stage's per-microbatch needs. */
static uint32_t derive_capacity(train_rt *rt, gpu_backend *be, size_t budget) {
  int best = INT_MAX;
  for (int s = 1; s <= rt->run.stages; s++) {
    stage_spec spec;
    rt->capacity = 1;
    spec_for_stage(rt, s, &spec);
    spec.capacity = 1;
    int c = stage_capacity_for(&spec, be, budget);
    if (c < best) best = c;
  }
  int most = 64 + REPAIR_RESERVE;
  return best <= 0 ? 1 : best > most ? (uint32_t)most : (uint32_t)best;
}

/* What the memory holds, split between the flows' slots and the repair
 * reserve: a repair's rebuilt microbatch must fit in memory like any other.
 * A small memory keeps every slot for the flows (a reserve of one would
 * cost a relay of 4 slots a quarter of its throughput to speed up repairs
 * that are rare); from REPAIR_RESERVE_MIN slots on, one goes to repairs. */
static void set_capacity_from_memory(train_rt *rt, uint32_t fits) {
  rt->repair_reserve = fits >= REPAIR_RESERVE_MIN ? REPAIR_RESERVE : 0;
  rt->capacity = fits - rt->repair_reserve > 64 ? 64 : fits - rt->repair_reserve;
}

/* Opens the device once at start to say what this node computes with
 * (device, threads, memory and the budget taken from it) and to size a
 * relay's capacity (unless --capacity says). A device that cannot be opened
 * stops the node here with the backend's reason, not at the first job. */
int train_rt_probe_compute(train_rt *rt, bool data) {
  gpu_device dev;
  gpu_backend *be = NULL;
  char err[512];
  gpu_options gopt = {.threads = rt->o->threads};
  if (gpu_device_parse(rt->o->device, &dev) != 0) return GW_EINVAL;
  int rc = gpu_backend_open(&dev, &gopt, &be, err, sizeof(err));
  if (rc != 0) {
    GW_ERROR(&rt->log, "compute.unavailable", "device=%s err=\"%s\"", rt->o->device, err);
    return rc;
  }
  size_t free_b = 0, total_b = 0;
  gpu_mem_info(be, &free_b, &total_b);
  gpu_device_info info = {0};
  gpu_device_info_get(be, &info);
  size_t budget = free_b / 10 * 8; /* leave a fifth for everything else */
  rt->budget_bytes = budget;
  rt->repair_reserve = REPAIR_RESERVE;
  if (data)
    rt->capacity = (uint32_t)rt->run.microbatches;
  else if (rt->o->capacity > 0)
    rt->capacity = (uint32_t)rt->o->capacity;
  else
    set_capacity_from_memory(rt, derive_capacity(rt, be, budget));
  char devname[GPU_DEVICE_STR_MAX];
  gpu_device_format(&be->dev, devname, sizeof(devname));
  GW_INFO(&rt->log, "compute.ready",
          "device=%s name=\"%s\" threads=%d mem_total_mb=%zu mem_free_mb=%zu budget_mb=%zu capacity=%u "
          "repair_reserve=%u%s",
          devname, info.name, be->threads, total_b >> 20, free_b >> 20, budget >> 20, rt->capacity, rt->repair_reserve,
          data || rt->o->capacity > 0 ? "" : " capacity_from=memory");
  gpu_backend_close(be);
  return 0;
}

/* What stage s's compute is built from. */
static int compute_args(train_rt *rt, int s, stage_spec *spec, gpu_device *dev, adamw_config *opt) {
  spec_for_stage(rt, s, spec);
  char err[256];
  if (stage_spec_validate(spec, err, sizeof(err)) != 0) {
    GW_ERROR(&rt->log, "train.bad_stage", "for_stage=%d err=\"%s\"", s, err);
    return GW_EINVAL;
  }
  if (gpu_device_parse(rt->o->device, dev) != 0) return GW_EINVAL;
  adamw_defaults(opt);
  opt->lr = (float)rt->run.lr;
  opt->grad_clip = (float)rt->run.grad_clip;
  train_plan_log_node_stage(&rt->log, rt->o, s, spec, rt->budget_bytes);
  return 0;
}

/* The peer's shape and the checkpoint path follow the stage. */
static int stage_shape(train_rt *rt, int s, const stage_spec *spec) {
  train_shape shape = {rt->run.batch, rt->run.seq, rt->run.model.d_model, train_compute_n_params(spec)};
  train_peer_set_shape(rt->peer, &shape);
  return ckpt_run_path(rt->ckpt_path, sizeof(rt->ckpt_path), node_get_config(rt->n)->data_dir, rt->run.name, s);
}

static int start_compute(train_rt *rt, int s) {
  stage_spec spec;
  gpu_device dev;
  adamw_config opt;
  if (compute_args(rt, s, &spec, &dev, &opt) != 0) return GW_EINVAL;
  train_compute_init(&rt->compute, &spec, &dev, rt->o->threads, rt->run.seed, &opt);
  train_compute_set_subspace(&rt->compute, rt->run.subspace_k, rt->run.subspace_refresh);
  rt->compute_ready = true;
  return stage_shape(rt, s, &spec);
}

static void start_routing(train_rt *rt, int s);

/* The stage is known: compute, flows and the router follow. */
void train_rt_enter_stage(train_rt *rt, int s) {
  rt->stage = s;
  gw_log_set_stage(&rt->log, s);
  if (start_compute(rt, s) != 0) {
    train_rt_stop_soon(rt);
    return;
  }
  start_routing(rt, s);
}

/* The leader moved us into another stage (train/peer_move.c): we leave the
 * directory of the old one, the worker swaps the compute once every job of
 * the old stage has run (a switch job queued behind them), and new flows
 * replace the old. The peer then restores the new stage's newest replica;
 * its RESTORE job runs after the switch. */
void train_rt_switch_stage(train_rt *rt, int s) {
  int old = rt->stage;
  if (rt->switching || compute_args(rt, s, &rt->switch_spec, &rt->switch_dev, &rt->switch_opt) != 0) {
    GW_ERROR(&rt->log, "stage.switch_failed", "from_stage=%d to_stage=%d", old, s);
    train_rt_stop_soon(rt);
    return;
  }
  train_job *job = calloc(1, sizeof(*job));
  if (!job) {
    train_rt_stop_soon(rt);
    return;
  }
  job->kind = TRAIN_JOB_RELEASE; /* never run as one: train_rt_run_job knows the marker */
  job->owner = &rt->switch_marker;
  if (node_worker_submit(rt->worker, job) != 0) {
    free(job);
    train_rt_stop_soon(rt);
    return;
  }
  rt->switching = true;
  rt->stage_gen++;
  GW_INFO(&rt->log, "stage.switch", "from_stage=%d to_stage=%d", old, s);
  if (rt->announced) stage_dir_withdraw(rt->d, rt->run.name, (uint32_t)old, now_ms(rt));
  rt->announced = false;
  rt->want_announce = false;
  rt->stage = s;
  gw_log_set_stage(&rt->log, s);
  stage_shape(rt, s, &rt->switch_spec);
  if (rt->flow) {
    flow_free(rt->flow);
    rt->flow = NULL;
  }
  start_routing(rt, s);
}

static void start_routing(train_rt *rt, int s) {
  if (rt->swarm_routing) {
    route_swarm_set_stage(rt->rs, s);
  } else {
    flow_config fc;
    flow_config_default(&fc);
    fc.self = node_identity(rt->n)->id;
    fc.role = s == 0 ? FLOW_DATA : FLOW_RELAY;
    fc.stage = s;
    fc.n_stages = rt->run.stages;
    fc.capacity = s == 0 ? rt->run.microbatches : (int)rt->capacity;
    fc.tun.tick_ms = rt->o->flow_tick_ms;
    fc.io = train_rt_flow_io(rt);
    fc.log = &rt->log;
    if (flow_new(&fc, &rt->flow) != 0) {
      GW_ERROR(&rt->log, "flow.failed", "for_stage=%d", s);
      train_rt_stop_soon(rt);
      return;
    }
    for (size_t i = 0; i < rt->n_known; i++) flow_add_peer(rt->flow, &rt->known[i].id, rt->known[i].stage);
    route_flow_attach(&rt->rf, rt->flow, s);
    flow_start(rt->flow, now_ms(rt));
  }
  uv_timer_start(&rt->cost_timer, train_rt_cost_cb, 0, COST_MS);
}
