/* node/train_plan.c — see train_plan.h. */
#include "node/train_plan.h"

#include <stdio.h>

#include "gpu/backend.h"
#include "train/run_memory.h"
#include "util/err.h"

#define MB(x) ((double)(x) / (1024.0 * 1024.0))

int train_plan_capacity(const train_node_opts *o, const train_run *r, int s) {
  /* spec_for_stage: the data node holds two iterations' microbatches, a
   * relay its capacity, both plus 4 for releases still queued. A relay's
   * capacity comes from its own memory at start; the plan counts what
   * --capacity says, else one iteration's microbatches. */
  if (s == 0) return 2 * r->microbatches + 4;
  return (o->capacity > 0 ? o->capacity : r->microbatches) + 4;
}

/* "a..b", or "head" for the data node's stage (embedding and head, no blocks). */
static const char *layers_str(int first, int n, char *buf, size_t len) {
  if (n == 0) return "head";
  snprintf(buf, len, "%d..%d", first, first + n - 1);
  return buf;
}

static void log_stage(gw_log *log, const train_run *r, int s, const train_stage_memory *m) {
  char layers[32];
  GW_INFO(log, "run.stage_memory",
          "for_stage=%d layers=%s params=%zu weights_mb=%.1f optimizer_mb=%.1f workspace_mb=%.1f "
          "activations_mb_per_mb=%.1f capacity=%d total_mb=%.1f batch=%d seq=%d",
          s, layers_str(m->first_layer, m->n_layers, layers, sizeof(layers)), m->params, MB(m->weights_bytes),
          MB(m->optimizer_bytes), MB(m->workspace_bytes), MB(m->per_mb_bytes), m->capacity, MB(m->total_bytes),
          r->batch, r->seq);
}

static int plan(gw_log *log, const train_node_opts *o, train_run *r, gpu_backend *be) {
  size_t budget = (size_t)o->stage_memory_mb << 20;
  if (o->stage_memory_mb > 0) {
    train_run probe = *r;
    int rc = train_run_stages_for_memory(&probe, budget, train_plan_capacity(o, r, 1), be);
    if (rc == GW_ERANGE) {
      GW_ERROR(log, "train.config", "err=\"--stage-memory-mb %d holds no stage of one block\"", o->stage_memory_mb);
      return rc;
    }
    if (rc != 0) return rc;
    if (o->stages_given && r->stages < probe.stages) {
      GW_ERROR(log, "train.config", "err=\"--stages %d: a stage needs more than --stage-memory-mb %d; %d stages fit\"",
               r->stages, o->stage_memory_mb, probe.stages);
      return GW_ERANGE;
    }
    if (!o->stages_given) r->stages = probe.stages;
  }
  for (int s = 0; s <= r->stages; s++) {
    train_stage_memory m;
    int rc = train_run_stage_memory(r, s, train_plan_capacity(o, r, s), be, &m);
    if (rc != 0) return rc;
    log_stage(log, r, s, &m);
    /* Stage 0 holds no layers to move elsewhere: say so rather than fail,
     * the data node's own memory (not the relays' budget) decides. */
    if (s == 0 && o->stage_memory_mb > 0 && m.total_bytes > budget)
      GW_WARN(log, "run.stage_memory_over", "for_stage=0 total_mb=%.1f budget_mb=%d hint=\"the data node's embedding "
              "and head alone exceed the relays' budget\"", MB(m.total_bytes), o->stage_memory_mb);
  }
  if (o->stage_memory_mb > 0)
    GW_INFO(log, "run.stage_split", "stages=%d layers=%d budget_mb=%d from=memory", r->stages, r->model.n_layers,
            o->stage_memory_mb);
  return 0;
}

void train_plan_log_node_stage(gw_log *log, const train_node_opts *o, int s, const stage_spec *spec,
                               size_t budget_bytes) {
  gpu_device dev;
  gpu_backend *be = NULL;
  char err[512];
  gpu_options gopt = {.threads = 1};
  stage_memory m;
  char layers[32];
  if (gpu_device_parse(o->device, &dev) != 0 || gpu_backend_open(&dev, &gopt, &be, err, sizeof(err)) != 0) return;
  if (stage_memory_estimate(spec, be, &m) == 0) {
    size_t params = m.state_bytes / (4 * sizeof(float));
    size_t total = m.state_bytes + m.workspace_bytes + (size_t)spec->capacity * m.per_mb_bytes;
    GW_INFO(log, "compute.stage_memory",
            "for_stage=%d layers=%s params=%zu weights_mb=%.1f optimizer_mb=%.1f workspace_mb=%.1f "
            "activations_mb_per_mb=%.1f capacity=%d total_mb=%.1f budget_mb=%.0f%s",
            s, layers_str(spec->first_layer, spec->n_layers, layers, sizeof(layers)), params, MB(params * sizeof(float)),
            MB(3 * params * sizeof(float)), MB(m.workspace_bytes), MB(m.per_mb_bytes), spec->capacity, MB(total),
            MB(budget_bytes), total > budget_bytes ? " over_budget=1" : "");
  }
  gpu_backend_close(be);
}

int train_plan_stages(gw_log *log, const train_node_opts *o, train_run *r) {
  gpu_device dev;
  gpu_backend *be = NULL;
  char err[512];
  gpu_options gopt = {.threads = 1};
  if (gpu_device_parse(o->device, &dev) != 0) return GW_EINVAL;
  int rc = gpu_backend_open(&dev, &gopt, &be, err, sizeof(err));
  if (rc != 0) {
    GW_ERROR(log, "compute.unavailable", "device=%s err=\"%s\"", o->device, err);
    return rc;
  }
  rc = plan(log, o, r, be);
  gpu_backend_close(be);
  return rc;
}
