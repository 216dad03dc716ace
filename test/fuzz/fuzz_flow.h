/* test/fuzz/fuzz_flow.h — the cast of the flow fuzz target (fuzz_flow_lib.c),
 * shared with the corpus generator, which runs the whole cast as a real
 * swarm and records what one node receives: replayed through the target,
 * those inputs drive the node through the same states (same seeds, same
 * segment ids). Stages 0 (data nodes d0, d1), 1 (r1a, r1b), 2 (r2a, r2b). */
#ifndef GWTF_TEST_FUZZ_FLOW_H
#define GWTF_TEST_FUZZ_FLOW_H

#include "flow/flow.h"
#include "util/io.h"

#define FUZZ_FLOW_CAST (6)
#define FUZZ_FLOW_STAGES (2)
#define FUZZ_FLOW_SEED(who) (1000u + (unsigned)(who))

const gw_id *fuzz_flow_cast(int i);
int fuzz_flow_stage(int i);
double fuzz_flow_link(int i, int j);
/* Builds cast member who's flow (peers added, link costs set), not started. */
int fuzz_flow_make(int who, int capacity, const gw_io *io, flow **out);

#endif
