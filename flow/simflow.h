/* flow/simflow.h — the flow protocol on an instance, in the deterministic
 * simulator (sim/sim.h): what `gwtf sim flow --algo gwtf` runs, and what the
 * tests drive round by round.
 *
 * Every instance node becomes one flow instance (flow/flow.h) on its own
 * sim node, with node id BLAKE2b("gwtf-sim-node-<instance id>"). Each node
 * learns its instance neighbours (the ends of its links) and its same-stage
 * peers; link costs come from the instance, with a node's processing cost
 * (the optional node "cost") folded into every link entering it (a data
 * node's into every link leaving it), so each flow pays it exactly once.
 *
 * A round is one tick at every live node: round r starts at virtual time
 * r * tick_ms, every node ticks, and the messages this causes (and their
 * answers) are delivered before round r + 1 begins, after 1 ms plus a
 * seeded extra delay in [0, delay_ms), or dropped with probability loss. */
#ifndef GWTF_FLOW_SIMFLOW_H
#define GWTF_FLOW_SIMFLOW_H

#include <stdbool.h>
#include <stdint.h>

#include "flow/flow.h"
#include "flow/instance.h"
#include "flow/solution.h"
#include "sim/sim.h"

typedef struct flow_sim_event {
  int round;
  int node; /* instance node index */
} flow_sim_event;

typedef struct flow_sim_opts {
  flow_tunables tun; /* objective included */
  uint64_t seed;
  double loss;                   /* message loss probability */
  uint64_t delay_ms;             /* extra delay bound; keep below tick_ms */
  /* The event arrays are not copied: they must outlive the simulation. */
  const flow_sim_event *crashes; /* nodes that stop at the start of a round */
  int n_crashes;
  const flow_sim_event *joins; /* nodes that take part only from a round on */
  int n_joins;
  /* The transport's notice of a crash: a node that had a session with a
   * crashed node (they exchanged a message) hears of it one one-way delay
   * later, as a TCP RST/EOF reaches a real node, and calls flow_peer_failed.
   * Off: a crash is silent (a machine lost with its network) and only the
   * flow layer's own detection finds it. */
  bool crash_notice;
  const gw_log_sink *log; /* NULL: silent */
  /* Every node's protocol events (may be NULL); node is the instance index. */
  void (*on_event)(void *ud, int node, const flow_event *ev);
  void *event_ud;
} flow_sim_opts;

/* Defaults: protocol defaults, seed 1, no loss, no extra delay. */
void flow_sim_opts_default(flow_sim_opts *o);

typedef struct flow_simulation flow_simulation;

int flow_sim_new(const flow_instance *in, const flow_sim_opts *o, flow_simulation **out);
void flow_sim_free(flow_simulation *s);

/* Runs the next round (applying crashes and joins scheduled for it first).
 * When a step hook is set it is called after every delivered event; a hook
 * that returns true stops the round early (a failed check). Returns 0, or 1
 * when the hook stopped the round. */
typedef bool (*flow_sim_hook)(void *ud);
void flow_sim_set_hook(flow_simulation *s, flow_sim_hook hook, void *ud);
int flow_sim_round(flow_simulation *s);
int flow_sim_rounds_done(const flow_simulation *s);
/* Crash or activate a node now (tests); the schedules in opts do the same. */
void flow_sim_crash(flow_simulation *s, int node);
void flow_sim_join(flow_simulation *s, int node);
bool flow_sim_alive(const flow_simulation *s, int node);

/* The complete flows right now, walked hop by hop through the nodes' own
 * state (each hop's segment must be known to both of its ends), with costs
 * from the instance. reported (may be NULL; n_flows entries, freed by the
 * caller) gets each flow's cost as its data node believes it. */
int flow_sim_flows(const flow_simulation *s, flow_solution *out, double **reported);

/* Every live node's own invariants (flow_check_local). */
int flow_sim_check_local(const flow_simulation *s, char *err, size_t err_len);
/* Cross-node invariants, valid when no message is in flight and none was
 * lost: both ends of every segment between live nodes agree on it and its
 * target, and every unit's cost equals its link combined with the next
 * hop's cost. */
int flow_sim_check_consistent(const flow_simulation *s, char *err, size_t err_len);
/* Messages in flight (sent, neither delivered nor dropped yet). */
uint64_t flow_sim_in_flight(const flow_simulation *s);

flow *flow_sim_node(const flow_simulation *s, int node);
const gw_id *flow_sim_id(const flow_simulation *s, int node);
uint64_t flow_sim_messages(const flow_simulation *s);
sim *flow_sim_engine(flow_simulation *s);
/* Peers presumed dead so far (every node's flow.peer_dead, through the
 * transport's notice too) that were in fact alive when it happened. */
int flow_sim_false_alarms(const flow_simulation *s);

/* ---- whole runs (gwtf sim flow) ---- */

typedef struct flow_round_stat {
  int num_flows;
  double total_cost, max_cost;
  uint64_t messages; /* sent so far */
} flow_round_stat;

typedef struct flow_run_result {
  flow_solution sol; /* the flows after the last round */
  int rounds;
  uint64_t messages;
  flow_round_stat *trace; /* one per round */
  int converged_round;    /* rounds after which the flows never changed again */
  uint64_t messages_to_converge;
  int settled_round; /* rounds after which num_flows was final and the cost within 1% of final */
  uint64_t messages_to_settle;
  int last_crash_round; /* -1: none */
  int recovered_round;  /* first round after the last crash with the flows back (-1: never) */
  int recovery_target;  /* the number of flows that counts as recovered */
  /* The optimum of the surviving graph: with one data node the exact
   * min-cost max-flow without the crashed nodes (count and cost), with
   * several the relaxed flow_max_flows count (cost NAN: unknown). */
  int optimum_flows;
  double optimum_cost;
  /* First round after the last crash whose flows are within
   * FLOW_RECOVERY_TOLERANCE of that optimum: count, and cost where known
   * (-1: never). */
  int recovered_optimal_round;
  /* Failure detection: how many nodes that shared segments with a crashed
   * node presumed it dead (flow.peer_dead, also through the transport's
   * notice), how long after the crash (mean and max, ms), how many never
   * did by the last round, and how many times a live peer was presumed
   * dead (false alarms). */
  int detections, undetected;
  double detect_mean_ms;
  uint64_t detect_max_ms;
  int false_alarms;
} flow_run_result;

/* How close to its final cost a run must stay to count as settled. */
#define FLOW_SETTLE_TOLERANCE (0.01)
/* How close to the surviving graph's optimum counts as recovered. */
#define FLOW_RECOVERY_TOLERANCE (0.02)

int flow_sim_run(const flow_instance *in, const flow_sim_opts *o, int rounds, flow_run_result *out);
void flow_run_result_free(flow_run_result *r);

#endif
