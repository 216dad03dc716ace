/* flow/placeeval.h — the node-addition experiment of the paper (Table IV
 * top, Fig. 5): where should joining nodes go?
 *
 * A system of one data node and 96 relays (Table IV setting K: stages,
 * capacities ⌊U⌋, interlayer link costs ⌊U⌋, intralayer cost φ + ⌊U(50,100)⌋)
 * receives `candidates` joining nodes in batches of `batch`. Each method
 * places every batch on its own copy of the system:
 *
 *   gwtf            the placement state machines (flow/place.h) run on the
 *                   simulator: the leader floods the utilization query and
 *                   assigns the batch highest capacity first to the most
 *                   utilized stages;
 *   capacity_first  highest capacity first, each to the stage with the
 *                   fewest nodes (the "emptiest"; ties to the lower stage);
 *   random          each to a uniformly random stage;
 *   optimal         every one of the S^batch ways to place the batch, the
 *                   best kept (global knowledge; exponential in the batch).
 *
 * Cost of a system: its min-cost max-flow, F flows at total cost C, read as
 * the time to train D microbatches, D·(C/F)/F — D/F microbatches per flow,
 * each taking the mean flow cost. D cancels in the reported improvement
 * (cost_before - cost_after) / cost_before.
 *
 * Readings of the table (it leaves them open): φ is the node's largest
 * interlayer cost to its neighbouring stages, and the intralayer cost is the
 * node's processing cost per microbatch (added to every flow through it);
 * link costs are drawn once per node pair, so a candidate has a cost to
 * every node of every stage it might join. Setting 5 ("5*") spreads the 96
 * relays randomly over the stages, at least one per stage. */
#ifndef GWTF_FLOW_PLACEEVAL_H
#define GWTF_FLOW_PLACEEVAL_H

#include <stdbool.h>
#include <stdint.h>

typedef enum place_method {
  PLACE_M_GWTF = 0,
  PLACE_M_CAPACITY_FIRST,
  PLACE_M_RANDOM,
  PLACE_M_OPTIMAL,
  PLACE_M_COUNT
} place_method;

const char *place_method_name(place_method m);

typedef struct place_eval_opts {
  int setting; /* 1..5 (Table IV top) */
  uint64_t seed;
  int candidates; /* 20 */
  int batch;      /* 2: candidates placed together (the optimum tries S^batch placements) */
  bool optimal;   /* run the exhaustive method */
} place_eval_opts;

void place_eval_opts_default(place_eval_opts *o);

typedef struct place_method_result {
  double cost_before, cost_after, improvement;
  int flows_before, flows_after;
  int per_stage[64]; /* candidates placed in each stage (index = stage; up to 63 stages) */
} place_method_result;

typedef struct place_eval_result {
  int stages, relays;
  place_method_result m[PLACE_M_COUNT];
  uint64_t gwtf_messages; /* placement messages the gwtf method sent */
} place_eval_result;

/* Returns 0, GW_EINVAL (bad setting/options) or GW_ENOMEM. */
int place_eval_run(const place_eval_opts *o, place_eval_result *out);

#endif
