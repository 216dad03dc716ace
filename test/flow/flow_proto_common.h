/* test/flow/flow_proto_common.h — the fixture shared by test_flow_proto.c
 * and test_flow_failure.c: one relay R driven message by message through a
 * capturing io (flowtest.h), and the messages its neighbours send it. */
#ifndef GWTF_TEST_FLOW_PROTO_COMMON_H
#define GWTF_TEST_FLOW_PROTO_COMMON_H

#include "flowtest.h"

#define T0 (0)
#define TICK (2000)

typedef struct fx {
  cap_io cap;
  flow *f;
  gw_id self, d, n, n2, c;
} fx;

/* Relay R at stage 1 of 2: data node D before it (d(D,R) = 3), next-stage
 * N (d(R,N) = 5) and N2 (d(R,N2) = 1), same-stage peer C. */
void fx_relay(fx *x, int capacity, double temp);
/* Checks R's local invariants, then frees it and its captures. */
void fx_free(fx *x);

/* `from` offers `count` paths to `target` at cost `cost`, with `spare` room. */
void send_offer(fx *x, const gw_id *from, const gw_id *target, uint32_t count, double cost, uint32_t spare);
/* `from` answers R's request for segment `seg` (target D). */
void send_reply(fx *x, const gw_id *from, uint64_t seg, bool accept, double cost, uint32_t count);
/* `from` asks R for a path to D over segment `seg`, expecting cost `cost`;
 * returns what flow_on_message did. */
int send_request(fx *x, const gw_id *from, uint64_t seg, double cost);

/* N offers a path to D at cost `rest`; R asks for it at once and N grants:
 * R now holds an unpaired outflow. Returns the segment id R chose. */
uint64_t make_standby(fx *x, const gw_id *next, double rest);
/* D binds segment in_seg to R's standby path at the expected cost. */
void make_paired(fx *x, uint64_t in_seg, double expect_cost);

/* An audit from D: it is alive and still sends segment `seg` to R. */
void keep_alive(fx *x, uint64_t seg, uint64_t now);

#endif
