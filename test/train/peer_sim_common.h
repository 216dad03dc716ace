/* test/train/peer_sim_common.h — what the deterministic-simulator tests of
 * the training peer share (test_peer_sim.c, test_peer_repair*.c,
 * test_peer_membership.c): the swarm's size, the direct reference
 * computation of the harness's fake model, a swarm built and placed by the
 * leader, who holds a microbatch, and the checks every scenario ends with. */
#ifndef GWTF_TEST_PEER_SIM_COMMON_H
#define GWTF_TEST_PEER_SIM_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "peer_harness.h"

#define M 4       /* microbatches per iteration */
#define ITERS 5
#define STAGES 3

bool verbose(void);

/* ---- the direct reference: the same fake model, one process ---- */

typedef struct ref_model {
  float w[STAGES + 1][H_NP]; /* stage 0 = the data node's embedding */
} ref_model;

/* One training iteration of the reference: its mean loss into *loss_out. */
void ref_iteration(ref_model *rm, uint64_t it, double *loss_out);

/* The validation loss of the reference's current weights over n samples. */
double ref_eval(const ref_model *rm, uint32_t n);

/* ---- swarms ---- */

/* One data node and relays_per_stage relays per stage, placed by the leader;
 * the data node's index. */
int build(h_harness *h, uint64_t seed, int relays_per_stage, uint32_t relay_cap);

/* Every stage agrees on its weights after each of the first iters iterations. */
void assert_agree(h_harness *h, uint64_t iters);

/* The live relay of `stage` holding state under `key` (-1: none). */
int holder(h_harness *h, int stage, uint64_t key);

/* Node i's training counters. */
const train_counters *C(h_harness *h, int i);

/* Every iteration's loss at data node d is the reference's, to float
 * rounding; the reference's final weights into *out when it is not NULL. */
void assert_losses_match_reference(h_harness *h, int d, ref_model *out);

/* ---- crashes (h_job_hook) ---- */

/* In iteration 2, the stage-`stage` relay that carried a microbatch dies
 * as its loss is computed: after its forward, before its backward. */
bool crash_stage_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash, int stage);
/* ... the stage-2 relay. */
bool crash_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash);
/* How long a data node waits for a microbatch's backward after its loss. */
uint64_t trip_deadline_ms(const h_harness *h);

#endif
