/* node/train_plan.h — the run creator's memory plan (issue 20): with
 * --stage-memory-mb the fewest relay stages whose even split fits the
 * budget, and one `run.stage_memory` line per stage at run creation, so the
 * memory each stage needs at batch B is printed before any node joins. */
#ifndef GWTF_NODE_TRAIN_PLAN_H
#define GWTF_NODE_TRAIN_PLAN_H

#include "node/train_node.h"
#include "train/run.h"
#include "util/log.h"

/* Fills r->stages from o->stage_memory_mb when set (and checks an explicit
 * --stages against it), then logs each stage's memory. Opens o->device's
 * backend for the estimate. Returns 0, or a negative code after logging
 * `train.config` with the reason (the budget holds no block, or contradicts
 * --stages). */
int train_plan_stages(gw_log *log, const train_node_opts *o, train_run *r);

/* Logs `compute.stage_memory`: what the stage this node enters needs (spec,
 * on o->device) next to its budget from compute.ready. A failure to estimate
 * is logged and otherwise ignored (the stage itself reports real errors). */
void train_plan_log_node_stage(gw_log *log, const train_node_opts *o, int s, const stage_spec *spec,
                               size_t budget_bytes);

/* Microbatches in flight the plan counts for stage s (what a node of that
 * stage allocates: see spec_for_stage in train_node.c). */
int train_plan_capacity(const train_node_opts *o, const train_run *r, int s);

#endif
