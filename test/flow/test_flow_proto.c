/* Unit tests of the flow protocol state machine, driven message by message
 * through a capturing io: Request Flow accept/reject, cost push, cancel and
 * DENY, Request Change and Request Redirect on the accepting side, reliable
 * notify-switch, the annealing rule, liveness, data-node flows and probes,
 * hostile input. */
#include "flowtest.h"

#include "flow/flow_internal.h"
#include "flow/place.h"

#define T0 (0)
#define TICK (2000)

typedef struct fx {
  cap_io cap;
  flow *f;
  gw_id self, d, n, n2, c;
} fx;

/* Relay R at stage 1 of 2: data node D before it (d(D,R) = 3), next-stage
 * N (d(R,N) = 5) and N2 (d(R,N2) = 1), same-stage peer C. */
static void fx_relay(fx *x, int capacity, double temp) {
  gw_io io = cap_gw_io(&x->cap, 42);
  x->self = test_id("R");
  x->d = test_id("D");
  x->n = test_id("N");
  x->n2 = test_id("N2");
  x->c = test_id("C");
  flow_config cfg;
  flow_config_default(&cfg);
  cfg.self = x->self;
  cfg.role = FLOW_RELAY;
  cfg.stage = 1;
  cfg.n_stages = 2;
  cfg.capacity = capacity;
  cfg.tun.objective = FLOW_OBJ_SUM;
  cfg.tun.temp_relay = temp;
  cfg.tun.p_propose_unmet = cfg.tun.p_propose_satisfied = 0; /* proposals are driven by hand */
  cfg.io = io;
  cfg.on_event = cap_event;
  cfg.event_ud = &x->cap;
  assert_int_equal(flow_new(&cfg, &x->f), 0);
  assert_int_equal(flow_add_peer(x->f, &x->d, 0), 0);
  assert_int_equal(flow_add_peer(x->f, &x->n, 2), 0);
  assert_int_equal(flow_add_peer(x->f, &x->n2, 2), 0);
  assert_int_equal(flow_add_peer(x->f, &x->c, 1), 0);
  assert_int_equal(flow_set_cost(x->f, &x->d, FLOW_DIR_PREV, 3), 0);
  assert_int_equal(flow_set_cost(x->f, &x->n, FLOW_DIR_NEXT, 5), 0);
  assert_int_equal(flow_set_cost(x->f, &x->n2, FLOW_DIR_NEXT, 1), 0);
  assert_int_equal(flow_start(x->f, T0), 0);
}

static void fx_free(fx *x) {
  char err[256];
  assert_int_equal(flow_check_local(x->f, err, sizeof(err)), 0);
  flow_free(x->f);
  cap_clear(&x->cap);
}

static void send_offer(fx *x, const gw_id *from, const gw_id *target, uint32_t count, double cost, uint32_t spare) {
  Gwtf__FlowOfferEntry e = GWTF__FLOW_OFFER_ENTRY__INIT;
  Gwtf__FlowOfferEntry *ep = &e;
  e.target = idb(target);
  e.count = count;
  e.cost = cost;
  Gwtf__FlowOffer o = GWTF__FLOW_OFFER__INIT;
  o.stage = 2;
  o.spare = spare;
  o.n_entries = count ? 1 : 0;
  o.entries = &ep;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &o;
  assert_int_equal(deliver(x->f, from, &m, T0 + 10), 0);
}

static void send_reply(fx *x, const gw_id *from, uint64_t seg, bool accept, double cost, uint32_t count) {
  Gwtf__FlowReply r = GWTF__FLOW_REPLY__INIT;
  r.seg = seg;
  r.target = idb(&x->d);
  r.accept = accept;
  r.cost = cost;
  r.count = count;
  r.spare = 1;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY;
  m.reply = &r;
  assert_int_equal(deliver(x->f, from, &m, T0 + 20), 0);
}

static int send_request(fx *x, const gw_id *from, uint64_t seg, double cost) {
  Gwtf__FlowRequest r = GWTF__FLOW_REQUEST__INIT;
  r.seg = seg;
  r.target = idb(&x->d);
  r.cost = cost;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &r;
  return deliver(x->f, from, &m, T0 + 30);
}

/* N offers a path to D at cost `rest`; R asks for it at once and N grants:
 * R now holds an unpaired outflow. Returns the segment id R chose. */
static uint64_t make_standby(fx *x, const gw_id *next, double rest) {
  cap_clear(&x->cap);
  send_offer(x, next, &x->d, 1, rest, 1);
  Gwtf__FlowMessage *req = cap_find(&x->cap, next, GWTF__FLOW_MESSAGE__MSG_REQUEST, 0);
  assert_non_null(req);
  uint64_t seg = req->request->seg;
  assert_true(seg != 0);
  assert_near(req->request->cost, rest, 1e-12);
  gw_id target;
  memcpy(target.b, req->request->target.data, GW_ID_BYTES);
  assert_true(gw_id_eq(&target, &x->d));
  gwtf__flow_message__free_unpacked(req, NULL);
  send_reply(x, next, seg, true, rest, 0);
  return seg;
}

/* D binds segment in_seg to R's standby path at the expected cost. */
static void make_paired(fx *x, uint64_t in_seg, double expect_cost) {
  cap_clear(&x->cap);
  assert_int_equal(send_request(x, &x->d, in_seg, expect_cost), 0);
  Gwtf__FlowMessage *rep = cap_find(&x->cap, &x->d, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_non_null(rep);
  assert_true(rep->reply->accept);
  assert_near(rep->reply->cost, expect_cost, 1e-9);
  gwtf__flow_message__free_unpacked(rep, NULL);
  assert_int_equal(cap_events(&x->cap, FLOW_EV_ESTABLISHED), 1);
}

/* A relay R with a standby path through N (cost 4) and a paired unit from D
 * (segment 10001, cost 9): the start of the liveness tests. */
static void fx_relay_paired(fx *x) {
  fx_relay(x, 2, 1.7);
  make_standby(x, &x->n, 4);
  make_paired(x, 10001, 9);
}

static void test_request_flow(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 2, 1.7);
  /* Nothing offered yet: the first tick requests nothing. */
  flow_on_tick(x.f, T0);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_REQUEST), 0);
  uint64_t out = make_standby(&x, &x.n, 4);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.unpaired_out, 1);
  assert_int_equal(c.outflow, 1);
  /* Unpaired outflow: not stable, so R builds no second path yet. */
  cap_clear(&x.cap);
  send_offer(&x, &x.n2, &x.d, 1, 4, 1);
  assert_int_equal(cap_count(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_REQUEST), 0);

  /* D asks at R's cost, d(R,N) + 4 = 9: accepted, paired. */
  make_paired(&x, 1001, 9);
  uint64_t seg;
  gw_id next;
  assert_int_equal(flow_next_hop(x.f, &x.d, 1001, &next, &seg), 0);
  assert_true(gw_id_eq(&next, &x.n));
  assert_true(seg == out);
  /* A repeated request (its grant was lost) is granted again, not twice. */
  cap_clear(&x.cap);
  assert_int_equal(send_request(&x, &x.d, 1001, 9), 0);
  Gwtf__FlowMessage *rep = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_true(rep && rep->reply->accept);
  gwtf__flow_message__free_unpacked(rep, NULL);
  flow_get_counts(x.f, &c);
  assert_int_equal(c.paired, 1);
  assert_int_equal(c.inflow, 1);
  /* No unpaired outflow left: a further request is rejected, count 0. */
  cap_clear(&x.cap);
  assert_int_equal(send_request(&x, &x.d, 1002, 9), 0);
  rep = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_true(rep && !rep->reply->accept);
  assert_int_equal(rep->reply->count, 0);
  gwtf__flow_message__free_unpacked(rep, NULL);
  fx_free(&x);
}

static void test_reject_carries_cost(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 2, 1.7);
  make_standby(&x, &x.n, 4); /* cost 9 */
  cap_clear(&x.cap);
  /* D expects a cheaper path than R has: rejected with R's current cost. */
  assert_int_equal(send_request(&x, &x.d, 2001, 5), 0);
  Gwtf__FlowMessage *rep = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_non_null(rep);
  assert_false(rep->reply->accept);
  assert_near(rep->reply->cost, 9, 1e-9);
  assert_int_equal(rep->reply->count, 1);
  gwtf__flow_message__free_unpacked(rep, NULL);
  /* A request from a node that is not a previous-stage neighbour is refused. */
  cap_clear(&x.cap);
  assert_int_equal(send_request(&x, &x.c, 2002, 9), 0);
  rep = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_true(rep && !rep->reply->accept);
  gwtf__flow_message__free_unpacked(rep, NULL);
  fx_free(&x);
}

static void test_cost_pushed_upstream(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 2, 1.7);
  uint64_t out = make_standby(&x, &x.n, 4);
  make_paired(&x, 3001, 9);
  cap_clear(&x.cap);
  Gwtf__FlowCost c = GWTF__FLOW_COST__INIT;
  c.seg = out;
  c.cost = 2;
  c.version = 5;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_COST;
  m.cost = &c;
  assert_int_equal(deliver(x.f, &x.n, &m, T0 + 40), 0);
  Gwtf__FlowMessage *up = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_COST, 0);
  assert_non_null(up);
  assert_true(up->cost->seg == 3001);
  assert_near(up->cost->cost, 7, 1e-9); /* 5 + 2 */
  gwtf__flow_message__free_unpacked(up, NULL);
  /* The same cost again changes nothing and is not pushed again. */
  cap_clear(&x.cap);
  c.version = 6;
  assert_int_equal(deliver(x.f, &x.n, &m, T0 + 50), 0);
  assert_int_equal(cap_count(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_COST), 0);
  /* An older update that arrives late (version 4 < 6) is ignored. */
  c.cost = 40;
  c.version = 4;
  assert_int_equal(deliver(x.f, &x.n, &m, T0 + 55), 0);
  assert_int_equal(cap_count(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_COST), 0);
  gw_id next;
  uint64_t seg;
  flow_path_info none[1];
  assert_int_equal(flow_data_flows(x.f, none, 1), 0); /* a relay has no flows of its own */
  assert_int_equal(flow_next_hop(x.f, &x.d, 3001, &next, &seg), 0);
  flow_unit_view v[2];
  assert_int_equal(flow_units(x.f, v, 2), 1);
  assert_near(v[0].cost, 7, 1e-9);
  fx_free(&x);
}

static void deliver_cancel(fx *x, const gw_id *from, uint64_t seg) {
  Gwtf__FlowCancel c = GWTF__FLOW_CANCEL__INIT;
  c.seg = seg;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_CANCEL;
  m.cancel = &c;
  assert_int_equal(deliver(x->f, from, &m, T0 + 60), 0);
}

static void deliver_deny(fx *x, const gw_id *from, uint64_t seg, bool full) {
  Gwtf__FlowDeny d = GWTF__FLOW_DENY__INIT;
  d.seg = seg;
  d.full = full;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_DENY;
  m.deny = &d;
  assert_int_equal(deliver(x->f, from, &m, T0 + 70), 0);
}

static void test_cancel_and_deny(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 2, 1.7);
  uint64_t out = make_standby(&x, &x.n, 4);
  make_paired(&x, 4001, 9);
  /* Upstream cancels: the unit keeps its path as a standby (unpaired outflow). */
  cap_clear(&x.cap);
  deliver_cancel(&x, &x.d, 4001);
  assert_int_equal(cap_events(&x.cap, FLOW_EV_TORN_DOWN), 1);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.paired, 0);
  assert_int_equal(c.unpaired_out, 1);
  /* Downstream denies, full: the unit goes, and N is avoided until it
   * offers spare capacity again. */
  cap_clear(&x.cap);
  deliver_deny(&x, &x.n, out, true);
  flow_get_counts(x.f, &c);
  assert_int_equal(c.units, 0);
  cap_clear(&x.cap);
  send_offer(&x, &x.n, &x.d, 1, 4, 0);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_REQUEST), 0);
  send_offer(&x, &x.n, &x.d, 1, 4, 2);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_REQUEST), 1);
  fx_free(&x);
}

/* An audit from D: it is alive and still sends segment `seg` to R. */
static void keep_alive(fx *x, uint64_t seg, uint64_t now) {
  Gwtf__FlowAudit a = GWTF__FLOW_AUDIT__INIT;
  a.n_up_segs = 1;
  a.up_segs = &seg;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_AUDIT;
  m.audit = &a;
  assert_int_equal(deliver(x->f, &x->d, &m, now), 0);
}

static void test_inflow_without_next_hop_is_denied(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  uint64_t out = make_standby(&x, &x.n, 4);
  make_paired(&x, 5001, 9);
  /* N drops the outflow: R holds an inflow it cannot place. */
  deliver_deny(&x, &x.n, out, false);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.unpaired_in, 1);
  cap_clear(&x.cap);
  flow_tunables t;
  flow_tunables_default(&t);
  for (int k = 1; k <= t.inflow_timeout_ticks + 1; k++) {
    keep_alive(&x, 5001, T0 + (uint64_t)k * TICK - 1); /* D is alive and still sends */
    flow_on_tick(x.f, T0 + (uint64_t)k * TICK);
  }
  /* Nobody offered a next hop: DENY pushes the flow back upstream. */
  Gwtf__FlowMessage *d = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_DENY, 0);
  assert_non_null(d);
  assert_true(d->deny->seg == 5001);
  assert_true(d->deny->full);
  gwtf__flow_message__free_unpacked(d, NULL);
  assert_int_equal(cap_events(&x.cap, FLOW_EV_DENY), 1);
  flow_get_counts(x.f, &c);
  assert_int_equal(c.units, 0);
  fx_free(&x);
}

static void propose_change(fx *x, uint64_t txn, uint64_t my_seg, const gw_id *my_next, uint64_t your_seg,
                           const gw_id *your_next, double my_link, double my_new_link, double my_rest) {
  Gwtf__FlowProposeChange pc = GWTF__FLOW_PROPOSE_CHANGE__INIT;
  pc.txn = txn;
  pc.my_seg = my_seg;
  pc.my_next = idb(my_next);
  pc.your_seg = your_seg;
  pc.your_next = idb(your_next);
  pc.target = idb(&x->d);
  pc.my_link = my_link;
  pc.my_new_link = my_new_link;
  pc.my_rest = my_rest;
  pc.my_live = true;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_CHANGE;
  m.propose_change = &pc;
  assert_int_equal(deliver(x->f, &x->c, &m, T0 + 80), 0);
}

static void test_request_change_accepted(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  uint64_t s_c = make_standby(&x, &x.n, 4);
  make_paired(&x, 6001, 9);
  cap_clear(&x.cap);
  /* C sends s_a to N2 at d(C,N2) = 6 and could reach N at 2; R sends to N at
   * 5 and could reach N2 at 1: (6+4)+(5+4) = 19 before, (2+4)+(1+4) = 11 after. */
  propose_change(&x, 77, 0xa1, &x.n2, s_c, &x.n, 6, 2, 4);
  Gwtf__FlowMessage *r = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY, 0);
  assert_non_null(r);
  assert_true(r->change_reply->accept);
  assert_near(r->change_reply->rest, 4, 1e-12);
  gwtf__flow_message__free_unpacked(r, NULL);
  /* notify-switch to both next hops: N2's s_a now comes from R, N's s_c from C */
  Gwtf__FlowMessage *up = cap_find(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP, 0);
  assert_non_null(up);
  assert_true(up->switch_up->seg == 0xa1);
  assert_memory_equal(up->switch_up->old_up.data, x.c.b, GW_ID_BYTES);
  assert_memory_equal(up->switch_up->new_up.data, x.self.b, GW_ID_BYTES);
  gwtf__flow_message__free_unpacked(up, NULL);
  up = cap_find(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP, 0);
  assert_non_null(up);
  assert_true(up->switch_up->seg == s_c);
  assert_memory_equal(up->switch_up->new_up.data, x.c.b, GW_ID_BYTES);
  gwtf__flow_message__free_unpacked(up, NULL);
  gw_id next;
  uint64_t seg;
  assert_int_equal(flow_next_hop(x.f, &x.d, 6001, &next, &seg), 0);
  assert_true(gw_id_eq(&next, &x.n2));
  assert_true(seg == 0xa1);
  /* the new cost to sink (1 + 4) went upstream, and T cooled once */
  Gwtf__FlowMessage *cost = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_COST, 0);
  assert_non_null(cost);
  assert_near(cost->cost->cost, 5, 1e-12);
  gwtf__flow_message__free_unpacked(cost, NULL);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_near(c.temperature, 1.7 * 0.95, 1e-12);
  /* The same proposal again (its answer was lost): same answer, no second swap. */
  cap_clear(&x.cap);
  propose_change(&x, 77, 0xa1, &x.n2, s_c, &x.n, 6, 2, 4);
  r = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY, 0);
  assert_true(r && r->change_reply->accept);
  gwtf__flow_message__free_unpacked(r, NULL);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 0);
  flow_get_counts(x.f, &c);
  assert_near(c.temperature, 1.7 * 0.95, 1e-12);
  fx_free(&x);
}

static void test_request_change_worse_rejected_when_cold(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1e-9); /* frozen: a worse change is (almost) never accepted */
  uint64_t s_c = make_standby(&x, &x.n, 4);
  make_paired(&x, 7001, 9);
  cap_clear(&x.cap);
  /* (1+4)+(5+4) = 14 before; (9+4)+(1+4) = 18 after: worse. */
  propose_change(&x, 78, 0xb1, &x.n2, s_c, &x.n, 1, 9, 4);
  Gwtf__FlowMessage *r = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY, 0);
  assert_true(r && !r->change_reply->accept);
  gwtf__flow_message__free_unpacked(r, NULL);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 0);
  /* A proposal about a unit R does not have is rejected too. */
  cap_clear(&x.cap);
  propose_change(&x, 79, 0xb2, &x.n2, 0xdead, &x.n, 9, 1, 4);
  r = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_CHANGE_REPLY, 0);
  assert_true(r && !r->change_reply->accept);
  gwtf__flow_message__free_unpacked(r, NULL);
  fx_free(&x);
}

static void test_request_redirect_accepted(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  uint64_t out = make_standby(&x, &x.n, 4);
  make_paired(&x, 8001, 9);
  cap_clear(&x.cap);
  /* C would carry D -> C -> N at 1 + 1 instead of R's 3 + 5. */
  Gwtf__FlowProposeRedirect pr = GWTF__FLOW_PROPOSE_REDIRECT__INIT;
  pr.txn = 90;
  pr.in_seg = 8001;
  pr.prev = idb(&x.d);
  pr.out_seg = out;
  pr.next = idb(&x.n);
  pr.target = idb(&x.d);
  pr.new_in_link = 1;
  pr.new_out_link = 1;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_REDIRECT;
  m.propose_redirect = &pr;
  assert_int_equal(deliver(x.f, &x.c, &m, T0 + 90), 0);
  Gwtf__FlowMessage *r = cap_find(&x.cap, &x.c, GWTF__FLOW_MESSAGE__MSG_REDIRECT_REPLY, 0);
  assert_true(r && r->redirect_reply->accept);
  assert_near(r->redirect_reply->rest, 4, 1e-12);
  gwtf__flow_message__free_unpacked(r, NULL);
  Gwtf__FlowMessage *up = cap_find(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP, 0);
  assert_true(up && up->switch_up->seg == out);
  assert_memory_equal(up->switch_up->new_up.data, x.c.b, GW_ID_BYTES);
  gwtf__flow_message__free_unpacked(up, NULL);
  Gwtf__FlowMessage *down = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_SWITCH_DOWN, 0);
  assert_true(down && down->switch_down->seg == 8001);
  assert_memory_equal(down->switch_down->new_down.data, x.c.b, GW_ID_BYTES);
  assert_near(down->switch_down->cost, 5, 1e-12); /* C's cost to sink: 1 + 4 */
  gwtf__flow_message__free_unpacked(down, NULL);
  /* R gave the unit away: it no longer routes segment 8001. */
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.units, 0);
  gw_id next;
  uint64_t seg;
  assert_int_equal(flow_next_hop(x.f, &x.d, 8001, &next, &seg), GW_ENOENT);
  fx_free(&x);
}

static void test_notify_switch_is_reliable(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  uint64_t s_c = make_standby(&x, &x.n, 4);
  make_paired(&x, 9001, 9);
  propose_change(&x, 91, 0xc1, &x.n2, s_c, &x.n, 6, 2, 4);
  /* Not acknowledged: re-sent on the next tick. */
  cap_clear(&x.cap);
  flow_on_tick(x.f, T0 + TICK);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 1);
  assert_int_equal(cap_count(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 1);
  /* N acknowledges: only N2's is re-sent. */
  Gwtf__FlowSwitchAck a = GWTF__FLOW_SWITCH_ACK__INIT;
  a.seg = s_c;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_ACK;
  m.switch_ack = &a;
  assert_int_equal(deliver(x.f, &x.n, &m, T0 + TICK + 5), 0);
  cap_clear(&x.cap);
  flow_on_tick(x.f, T0 + 2 * TICK);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 0);
  assert_int_equal(cap_count(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_SWITCH_UP), 1);
  fx_free(&x);
}

static void test_switch_for_unknown_segment_denied(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  /* D says "segment 0xd1 from C now comes from D": R never had it, so the
   * new upstream end is told to drop it, and the switch is acknowledged. */
  Gwtf__FlowSwitchUp su = GWTF__FLOW_SWITCH_UP__INIT;
  su.seg = 0xd1;
  su.old_up = idb(&x.c);
  su.new_up = idb(&x.d);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_UP;
  m.switch_up = &su;
  cap_clear(&x.cap);
  assert_int_equal(deliver(x.f, &x.d, &m, T0 + 5), 0);
  Gwtf__FlowMessage *d = cap_find(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_DENY, 0);
  assert_true(d && d->deny->seg == 0xd1);
  gwtf__flow_message__free_unpacked(d, NULL);
  assert_int_equal(cap_count(&x.cap, &x.d, GWTF__FLOW_MESSAGE__MSG_SWITCH_ACK), 1);
  /* A cancel for a segment R does not know leaves a tombstone: a grant for
   * that id arriving later is handed straight back. */
  uint64_t seg = 0;
  cap_clear(&x.cap);
  send_offer(&x, &x.n, &x.d, 1, 4, 1);
  Gwtf__FlowMessage *req = cap_find(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_REQUEST, 0);
  assert_non_null(req);
  seg = req->request->seg;
  gwtf__flow_message__free_unpacked(req, NULL);
  deliver_deny(&x, &x.n, seg, false); /* overtakes the grant */
  cap_clear(&x.cap);
  send_reply(&x, &x.n, seg, true, 4, 0);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_CANCEL), 1);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.units, 0);
  fx_free(&x);
}

static void test_annealing_rule(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  /* better: always; equal: never; worse by 1 at T = 1.7: e^(-1/1.7) */
  assert_true(flow_anneal_accept(x.f, 0.5));
  assert_false(flow_anneal_accept(x.f, 0));
  int n = 20000, acc = 0;
  for (int i = 0; i < n; i++) acc += flow_anneal_accept(x.f, -1.0);
  double p = exp(-1.0 / 1.7), sd = sqrt(p * (1 - p) / n);
  assert_true(fabs((double)acc / n - p) < 4 * sd);
  /* the same seed draws the same decisions */
  fx y;
  fx_relay(&y, 1, 1.7);
  fx z;
  fx_relay(&z, 1, 1.7);
  for (int i = 0; i < 100; i++) assert_int_equal(flow_anneal_accept(y.f, -0.7), flow_anneal_accept(z.f, -0.7));
  fx_free(&x);
  fx_free(&y);
  fx_free(&z);
}

static void test_peer_silence_and_failure(void **state) {
  (void)state;
  fx x;
  fx_relay_paired(&x);
  flow_tunables t;
  flow_tunables_default(&t);
  /* D keeps auditing; N falls silent: by peer_timeout_ticks (sooner,
   * through the pings of test_probe_suspect) R presumes it dead and the
   * unit loses its next hop. Ticks only: the wakes between them are not
   * run, so the pings go out at ticks. */
  cap_clear(&x.cap);
  for (int k = 1; k <= t.peer_timeout_ticks + 1 && cap_events(&x.cap, FLOW_EV_PEER_DEAD) == 0; k++) {
    keep_alive(&x, 10001, T0 + (uint64_t)k * TICK - 1);
    flow_on_tick(x.f, T0 + (uint64_t)k * TICK);
  }
  assert_int_equal(cap_events(&x.cap, FLOW_EV_PEER_DEAD), 1);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.outflow, 0);
  assert_int_equal(c.unpaired_in, 1);
  /* The training layer reports D failed: its segments go at once. */
  assert_int_equal(flow_peer_failed(x.f, &x.d, T0 + 30 * TICK), 0);
  flow_get_counts(x.f, &c);
  assert_int_equal(c.units, 0);
  assert_int_equal(flow_peer_failed(x.f, &x.n2, T0 + 30 * TICK), 0);
  gw_id stranger = test_id("nobody");
  assert_int_equal(flow_peer_failed(x.f, &stranger, T0), GW_ENOENT);
  fx_free(&x);
}

/* Runs R at the wakes it asks for (D auditing at each) until `done` or a
 * bound; returns the time reached. */
static uint64_t run_wakes(fx *x, uint64_t now, uint64_t until, bool (*done)(fx *x)) {
  for (int guard = 0; guard < 1000 && now < until && !done(x); guard++) {
    uint64_t at = x->cap.tick_at > now ? x->cap.tick_at : now + 1;
    now = at;
    keep_alive(x, 10001, now);
    flow_on_tick(x->f, now);
  }
  return now;
}

static bool pinged(fx *x) { return cap_count(&x->cap, &x->n, GWTF__FLOW_MESSAGE__MSG_PING) > 0; }
static bool dead(fx *x) { return cap_events(&x->cap, FLOW_EV_PEER_DEAD) > 0; }

/* The probe path: N, the next hop, misses its audits. R suspects it once an
 * audit is overdue by more than its RTO and pings it at a wake between ticks;
 * an answer keeps it (and is a round-trip sample); left unanswered, three
 * pings, each waiting twice the last, and N is presumed dead, well before
 * peer_timeout_ticks of silence. */
static void test_probe_suspect(void **state) {
  (void)state;
  fx x;
  fx_relay_paired(&x);
  flow_tunables t;
  flow_tunables_default(&t);
  uint64_t period = (uint64_t)t.audit_period_ticks * TICK;
  cap_clear(&x.cap);
  uint64_t now = run_wakes(&x, T0, T0 + 20 * TICK, pinged);
  assert_true(pinged(&x));
  /* overdue: a period and the RTO (no sample yet: rto_initial_ms) after the segment */
  assert_true(now >= T0 + period && now <= T0 + period + t.rto_initial_ms + TICK);
  Gwtf__FlowMessage *ping = cap_find(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_PING, 0);
  assert_non_null(ping);
  assert_false(ping->ping->reply);
  Gwtf__FlowPing ans = GWTF__FLOW_PING__INIT;
  ans.nonce = ping->ping->nonce;
  ans.reply = true;
  gwtf__flow_message__free_unpacked(ping, NULL);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PING;
  m.ping = &ans;
  /* N answers late, but within the first ping's wait: it stays. */
  assert_int_equal(deliver(x.f, &x.n, &m, now + 150), 0);
  assert_false(dead(&x));
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.outflow, 1);
  /* A ping from N is answered at once with its nonce. */
  cap_clear(&x.cap);
  ans.nonce = 77;
  ans.reply = false;
  assert_int_equal(deliver(x.f, &x.n, &m, now + 200), 0);
  Gwtf__FlowMessage *back = cap_find(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_PING, 0);
  assert_non_null(back);
  assert_true(back->ping->reply);
  assert_int_equal(back->ping->nonce, 77);
  gwtf__flow_message__free_unpacked(back, NULL);
  /* Now N falls silent for good. */
  uint64_t last_heard = now + 200;
  cap_clear(&x.cap);
  now = run_wakes(&x, now + 200, last_heard + 20 * TICK, dead);
  assert_true(dead(&x));
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_PING), t.probe_tries);
  assert_true(now - last_heard < (uint64_t)t.peer_timeout_ticks * TICK);
  flow_get_counts(x.f, &c);
  assert_int_equal(c.outflow, 0);
  fx_free(&x);
}

/* FlowGone: a neighbour names a peer it presumed dead. R forgets what that
 * peer offered and gives up its request to it (no re-send at the next
 * tick), pings a named peer it shares segments with instead of believing
 * the word, and shrugs off a malformed one. */
static void send_gone(fx *x, const gw_id *from, const uint8_t *peer, size_t len, uint64_t now) {
  Gwtf__FlowGone g = GWTF__FLOW_GONE__INIT;
  g.peer.data = (uint8_t *)peer;
  g.peer.len = len;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_GONE;
  m.gone = &g;
  assert_int_equal(deliver(x->f, from, &m, now), 0);
}

static void test_gone_heard(void **state) {
  (void)state;
  fx x;
  fx_relay_paired(&x);
  /* N2 offers; R, stable with room, asks for it at once. */
  cap_clear(&x.cap);
  send_offer(&x, &x.n2, &x.d, 1, 3, 1);
  assert_int_equal(cap_count(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_REQUEST), 1);
  /* D says N2 is gone: the request is given up and the offer forgotten. */
  send_gone(&x, &x.d, x.n2.b, GW_ID_BYTES, T0 + 10);
  cap_clear(&x.cap);
  flow_on_tick(x.f, T0 + TICK);
  assert_int_equal(cap_count(&x.cap, &x.n2, GWTF__FLOW_MESSAGE__MSG_REQUEST), 0);
  /* D says N is gone: R shares a segment with N, so it asks N itself. */
  cap_clear(&x.cap);
  send_gone(&x, &x.d, x.n.b, GW_ID_BYTES, T0 + TICK + 10);
  assert_int_equal(cap_count(&x.cap, &x.n, GWTF__FLOW_MESSAGE__MSG_PING), 1);
  assert_int_equal(cap_events(&x.cap, FLOW_EV_PEER_DEAD), 0);
  flow_counts c;
  flow_get_counts(x.f, &c);
  assert_int_equal(c.outflow, 1);
  /* A malformed name changes nothing. */
  send_gone(&x, &x.d, x.n.b, 3, T0 + TICK + 20);
  char err[200];
  assert_int_equal(flow_check_local(x.f, err, sizeof(err)), 0);
  fx_free(&x);
}

static void test_hostile_input(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 1, 1.7);
  gw_peer from;
  memset(&from, 0, sizeof(from));
  from.id = x.d;
  /* field 1, length-delimited, 127 bytes announced, none there */
  uint8_t junk[2] = {0x0a, 0x7f};
  assert_int_equal(flow_on_message(x.f, &from, junk, sizeof(junk), 1), GW_EPROTO);
  assert_int_equal(flow_on_message(x.f, &from, junk, FLOW_MAX_MESSAGE + 1, 1), GW_EPROTO);
  from.id = test_id("stranger");
  assert_int_equal(flow_on_message(x.f, &from, junk, 1, 1), GW_ENOENT);
  /* A request naming a 5-byte target, and one with a NaN cost: dropped. */
  cap_clear(&x.cap);
  Gwtf__FlowRequest r = GWTF__FLOW_REQUEST__INIT;
  r.seg = 5;
  r.target = (ProtobufCBinaryData){5, (uint8_t *)"short"};
  r.cost = 1;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &r;
  assert_int_equal(deliver(x.f, &x.d, &m, 2), 0);
  r.target = idb(&x.d);
  r.cost = NAN;
  assert_int_equal(deliver(x.f, &x.d, &m, 3), 0);
  assert_int_equal(x.cap.n, 0);
  /* An offer with a negative cost changes nothing. */
  send_offer(&x, &x.n, &x.d, 1, -4, 1);
  assert_int_equal(x.cap.n, 0);
  char err[256];
  assert_int_equal(flow_check_local(x.f, err, sizeof(err)), 0);
  fx_free(&x);
}

/* A data node: source slots ask for first hops, the probe brings paths back. */
static void test_data_node_flows_and_probe(void **state) {
  (void)state;
  cap_io cap;
  gw_io io = cap_gw_io(&cap, 7);
  gw_id d = test_id("D"), a = test_id("A"), b = test_id("B"), z = test_id("Z");
  flow_config cfg;
  flow_config_default(&cfg);
  cfg.self = d;
  cfg.role = FLOW_DATA;
  cfg.stage = 0;
  cfg.n_stages = 1;
  cfg.capacity = 2;
  cfg.tun.objective = FLOW_OBJ_SUM;
  cfg.tun.chain_requests = false; /* both offers first, then one choice on the tick */
  cfg.io = io;
  flow *f;
  assert_int_equal(flow_new(&cfg, &f), 0);
  flow_add_peer(f, &a, 1);
  flow_add_peer(f, &b, 1);
  flow_add_peer(f, &z, 1);
  flow_set_cost(f, &a, FLOW_DIR_NEXT, 10);
  flow_set_cost(f, &b, FLOW_DIR_NEXT, 2);
  flow_set_cost(f, &a, FLOW_DIR_PREV, 1);
  flow_set_cost(f, &b, FLOW_DIR_PREV, 1);
  flow_start(f, 0);
  /* Its offer to the last stage: a sink for its own flows at cost 0. */
  flow_on_tick(f, 0);
  Gwtf__FlowMessage *o = cap_find(&cap, &a, GWTF__FLOW_MESSAGE__MSG_OFFER, 0);
  assert_non_null(o);
  assert_int_equal(o->offer->n_entries, 1);
  assert_int_equal(o->offer->entries[0]->count, 2);
  assert_near(o->offer->entries[0]->cost, 0, 0);
  gwtf__flow_message__free_unpacked(o, NULL);
  /* Z has no link to D: its request is refused. */
  cap_clear(&cap);
  Gwtf__FlowRequest rq = GWTF__FLOW_REQUEST__INIT;
  rq.seg = 77;
  rq.target = idb(&d);
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &rq;
  assert_int_equal(deliver(f, &z, &m, 1), 0);
  Gwtf__FlowMessage *rep = cap_find(&cap, &z, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_true(rep && !rep->reply->accept);
  gwtf__flow_message__free_unpacked(rep, NULL);
  /* Both A and B offer a path back at cost 3: D asks B (2 + 3 < 10 + 3). */
  cap_clear(&cap);
  Gwtf__FlowOfferEntry e = GWTF__FLOW_OFFER_ENTRY__INIT, *ep = &e;
  e.target = idb(&d);
  e.count = 1;
  e.cost = 3;
  Gwtf__FlowOffer of = GWTF__FLOW_OFFER__INIT;
  of.spare = 1;
  of.n_entries = 1;
  of.entries = &ep;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &of;
  assert_int_equal(deliver(f, &a, &m, 2), 0);
  assert_int_equal(deliver(f, &b, &m, 3), 0);
  cap_clear(&cap);
  flow_on_tick(f, 2000);
  assert_int_equal(cap_count(&cap, &a, GWTF__FLOW_MESSAGE__MSG_REQUEST), 0);
  Gwtf__FlowMessage *req = cap_find(&cap, &b, GWTF__FLOW_MESSAGE__MSG_REQUEST, 0);
  assert_non_null(req);
  uint64_t seg = req->request->seg;
  gwtf__flow_message__free_unpacked(req, NULL);
  Gwtf__FlowReply rp = GWTF__FLOW_REPLY__INIT;
  rp.seg = seg;
  rp.target = idb(&d);
  rp.accept = true;
  rp.cost = 3;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY;
  m.reply = &rp;
  cap_clear(&cap);
  assert_int_equal(deliver(f, &b, &m, 4), 0);
  flow_path_info info[4];
  assert_int_equal(flow_data_flows(f, info, 4), 1);
  assert_true(gw_id_eq(&info[0].first_hop, &b));
  assert_near(info[0].cost, 5, 1e-12);
  assert_int_equal(info[0].path_len, 0);
  gw_id next;
  uint64_t s2;
  assert_int_equal(flow_pick_first_hop(f, &next, &s2), 0);
  assert_true(gw_id_eq(&next, &b) && s2 == seg);
  /* The probe: D -> B (sink side: B sends it back to D over segment 88). */
  cap_clear(&cap);
  rq.seg = 88;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &rq;
  assert_int_equal(deliver(f, &b, &m, 5), 0);
  ProtobufCBinaryData hops[2] = {idb(&d), idb(&b)};
  Gwtf__FlowProbe pr = GWTF__FLOW_PROBE__INIT;
  pr.seg = 88;
  pr.origin = idb(&d);
  pr.origin_seg = seg;
  pr.n_path = 2;
  pr.path = hops;
  pr.cost = 3;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROBE;
  m.probe = &pr;
  assert_int_equal(deliver(f, &b, &m, 6), 0);
  assert_int_equal(flow_data_flows(f, info, 4), 1);
  assert_int_equal(info[0].path_len, 3);
  assert_true(gw_id_eq(&info[0].path[0], &d) && gw_id_eq(&info[0].path[1], &b) && gw_id_eq(&info[0].path[2], &d));
  assert_near(info[0].probed_cost, 3, 0);
  char err[256];
  assert_int_equal(flow_check_local(f, err, sizeof(err)), 0);
  flow_free(f);
  cap_clear(&cap);
}

static void test_cost_eq1_and_tunables(void **state) {
  (void)state;
  /* (0.2 + 0.4)/2 + (0.01 + 0.03)/2 + 2 * 1e6 / (1e8 + 3e8) = 0.3 + 0.02 + 0.005 */
  assert_near(flow_cost_eq1(0.2, 0.4, 0.01, 0.03, 1e8, 3e8, 1e6), 0.325, 1e-12);
  assert_true(isinf(flow_cost_eq1(0, 0, 0, 0, 0, 0, 1)));
  assert_true(isnan(flow_cost_eq1(-1, 0, 0, 0, 1, 1, 1)));
  flow_tunables t;
  flow_tunables_default(&t);
  assert_near(t.temp_relay, 1.7, 0);
  assert_near(t.temp_data, 2.0, 0);
  assert_near(t.cooling, 0.95, 0);
  assert_int_equal(t.objective, FLOW_OBJ_MAX);
  assert_int_equal(flow_tunables_set(&t, "temp_relay", "0.5"), 0);
  assert_near(t.temp_relay, 0.5, 0);
  assert_int_equal(flow_tunables_set(&t, "objective", "sum"), 0);
  assert_int_equal(t.objective, FLOW_OBJ_SUM);
  assert_int_equal(flow_tunables_set(&t, "reroute", "false"), 0);
  assert_false(t.reroute);
  assert_int_equal(flow_tunables_set(&t, "no_such_thing", "1"), GW_ENOENT);
  assert_int_equal(flow_tunables_set(&t, "tick_ms", "-5"), GW_EINVAL);
  char buf[2048];
  flow_tunables_describe(&t, buf, sizeof(buf));
  assert_non_null(strstr(buf, "temp_relay=0.5\n"));
  assert_non_null(strstr(buf, "objective=sum\n"));
  assert_non_null(strstr(buf, "probe_tries=4\n"));
  /* The swarms' fast tick (--flow-tick 100) with every other default: a
   * flush no shorter than the tick is just no flush, not an error. */
  flow_config cfg;
  flow_config_default(&cfg);
  cap_io cap;
  cfg.io = cap_gw_io(&cap, 1);
  cfg.self = test_id("fast");
  cfg.stage = 1;
  cfg.n_stages = 2;
  cfg.capacity = 1;
  cfg.tun.tick_ms = 100;
  flow *f = NULL;
  assert_int_equal(flow_new(&cfg, &f), 0);
  flow_free(f);
  cfg.tun.probe_timeout_min_ms = 0;
  assert_int_equal(flow_new(&cfg, &f), GW_EINVAL);
}

/* ---- hostile input, at volume ---- */

typedef struct corpus {
  uint8_t *msg[32];
  size_t len[32];
  int n;
} corpus;

static void corpus_add(corpus *c, Gwtf__FlowMessage *m) {
  size_t len = gwtf__flow_message__get_packed_size(m);
  c->msg[c->n] = malloc(len + 1);
  gwtf__flow_message__pack(m, c->msg[c->n]);
  c->len[c->n++] = len;
}

/* One valid message of most kinds, naming the fixture's peers. */
static void build_corpus(fx *x, corpus *c) {
  memset(c, 0, sizeof(*c));
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  Gwtf__FlowOfferEntry e = GWTF__FLOW_OFFER_ENTRY__INIT, *ep = &e;
  e.target = idb(&x->d), e.count = 2, e.cost = 4;
  Gwtf__FlowOffer o = GWTF__FLOW_OFFER__INIT;
  o.spare = 1, o.n_entries = 1, o.entries = &ep;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER, m.offer = &o;
  corpus_add(c, &m);
  Gwtf__FlowRequest rq = GWTF__FLOW_REQUEST__INIT;
  rq.seg = 11, rq.target = idb(&x->d), rq.cost = 9;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST, m.request = &rq;
  corpus_add(c, &m);
  Gwtf__FlowReply rp = GWTF__FLOW_REPLY__INIT;
  rp.seg = 12, rp.target = idb(&x->d), rp.accept = true, rp.cost = 3, rp.version = 2;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY, m.reply = &rp;
  corpus_add(c, &m);
  Gwtf__FlowUnitInfo ui = GWTF__FLOW_UNIT_INFO__INIT, *uip = &ui;
  ui.target = idb(&x->d), ui.prev = idb(&x->d), ui.in_seg = 13, ui.in_link = 2, ui.next = idb(&x->n);
  ui.out_seg = 14, ui.out_link = 3, ui.rest = 4, ui.live = true;
  Gwtf__FlowLinkCost lc = GWTF__FLOW_LINK_COST__INIT, *lcp = &lc;
  lc.peer = idb(&x->n2), lc.cost = 1;
  Gwtf__FlowState st = GWTF__FLOW_STATE__INIT;
  st.stage = 1, st.capacity = 2, st.n_units = 1, st.units = &uip, st.n_next_costs = 1, st.next_costs = &lcp;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_STATE, m.state = &st;
  corpus_add(c, &m);
  Gwtf__FlowProposeChange pc = GWTF__FLOW_PROPOSE_CHANGE__INIT;
  pc.txn = 15, pc.my_seg = 16, pc.my_next = idb(&x->n2), pc.your_seg = 12, pc.your_next = idb(&x->n);
  pc.target = idb(&x->d), pc.my_link = 1, pc.my_new_link = 2, pc.my_rest = 3;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_CHANGE, m.propose_change = &pc;
  corpus_add(c, &m);
  Gwtf__FlowProposeRedirect pr = GWTF__FLOW_PROPOSE_REDIRECT__INIT;
  pr.txn = 17, pr.in_seg = 11, pr.prev = idb(&x->d), pr.out_seg = 12, pr.next = idb(&x->n);
  pr.target = idb(&x->d), pr.new_in_link = 1, pr.new_out_link = 1;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROPOSE_REDIRECT, m.propose_redirect = &pr;
  corpus_add(c, &m);
  Gwtf__FlowSwitchUp su = GWTF__FLOW_SWITCH_UP__INIT;
  su.seg = 11, su.old_up = idb(&x->d), su.new_up = idb(&x->c), su.forwarded = 1;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_UP, m.switch_up = &su;
  corpus_add(c, &m);
  Gwtf__FlowSwitchDown sd = GWTF__FLOW_SWITCH_DOWN__INIT;
  sd.seg = 12, sd.old_down = idb(&x->n), sd.new_down = idb(&x->n2), sd.cost = 5;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_SWITCH_DOWN, m.switch_down = &sd;
  corpus_add(c, &m);
  uint64_t segs[2] = {11, 12};
  Gwtf__FlowAudit au = GWTF__FLOW_AUDIT__INIT;
  au.n_up_segs = 2, au.up_segs = segs, au.n_down_segs = 1, au.down_segs = segs;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_AUDIT, m.audit = &au;
  corpus_add(c, &m);
  ProtobufCBinaryData hops[2] = {idb(&x->d), idb(&x->c)};
  Gwtf__FlowProbe pb = GWTF__FLOW_PROBE__INIT;
  pb.seg = 11, pb.origin = idb(&x->d), pb.origin_seg = 11, pb.n_path = 2, pb.path = hops, pb.cost = 2;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PROBE, m.probe = &pb;
  corpus_add(c, &m);
  Gwtf__FlowCost co = GWTF__FLOW_COST__INIT;
  co.seg = 12, co.cost = 2, co.version = 9;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_COST, m.cost = &co;
  corpus_add(c, &m);
  Gwtf__PlaceRecord rec = GWTF__PLACE_RECORD__INIT, *recp = &rec;
  rec.node = idb(&x->c), rec.stage = 1, rec.capacity = 4, rec.flows = 2;
  Gwtf__PlaceQuery q = GWTF__PLACE_QUERY__INIT;
  q.query = 3, q.leader = idb(&x->d), q.n_records = 1, q.records = &recp;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_PLACE_QUERY, m.place_query = &q;
  corpus_add(c, &m);
}

static void test_mutated_messages(void **state) {
  (void)state;
  fx x;
  fx_relay(&x, 3, 1.7);
  make_standby(&x, &x.n, 4);
  make_paired(&x, 11, 9);
  corpus c;
  build_corpus(&x, &c);
  place *pl;
  static cap_io pcap; /* placement's own capture (cap_gw_io resets the one it is given) */
  place_config pc = {.self = x.self, .stage = 1, .n_stages = 2, .io = cap_gw_io(&pcap, 3)};
  place_tunables_default(&pc.tun);
  assert_int_equal(place_new(&pc, &pl), 0);
  place_add_peer(pl, &x.d, 0);
  place_add_peer(pl, &x.n, 2);
  gw_rng r;
  gw_rng_seed(&r, 77);
  const gw_id *from[4] = {&x.d, &x.n, &x.n2, &x.c};
  uint8_t buf[1024];
  char err[256];
  for (int i = 0; i < 4000; i++) {
    int k = (int)gw_rng_below(&r, (uint64_t)c.n);
    size_t len = c.len[k];
    memcpy(buf, c.msg[k], len);
    int flips = 1 + (int)gw_rng_below(&r, 4);
    for (int j = 0; j < flips && len > 0; j++) buf[gw_rng_below(&r, len)] ^= (uint8_t)(1 + gw_rng_below(&r, 255));
    if (gw_rng_below(&r, 4) == 0) len = (size_t)gw_rng_below(&r, len + 1); /* truncated */
    gw_peer p;
    memset(&p, 0, sizeof(p));
    p.id = *from[gw_rng_below(&r, 4)];
    uint64_t now = 100 + (uint64_t)i;
    flow_on_message(x.f, &p, buf, len, now);
    place_on_message(pl, &p, buf, len, now);
    if (i % 200 == 0) flow_on_tick(x.f, now);
    if (flow_check_local(x.f, err, sizeof(err)) != 0) fail_msg("after input %d: %s", i, err);
    if (x.cap.n > CAP_MAX_MSGS / 2) cap_clear(&x.cap);
    if (pcap.n > CAP_MAX_MSGS / 2) cap_clear(&pcap);
  }
  for (int k = 0; k < c.n; k++) free(c.msg[k]);
  place_free(pl);
  cap_clear(&pcap);
  fx_free(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_request_flow),
      cmocka_unit_test(test_reject_carries_cost),
      cmocka_unit_test(test_cost_pushed_upstream),
      cmocka_unit_test(test_cancel_and_deny),
      cmocka_unit_test(test_inflow_without_next_hop_is_denied),
      cmocka_unit_test(test_request_change_accepted),
      cmocka_unit_test(test_request_change_worse_rejected_when_cold),
      cmocka_unit_test(test_request_redirect_accepted),
      cmocka_unit_test(test_notify_switch_is_reliable),
      cmocka_unit_test(test_switch_for_unknown_segment_denied),
      cmocka_unit_test(test_annealing_rule),
      cmocka_unit_test(test_peer_silence_and_failure),
      cmocka_unit_test(test_probe_suspect),
      cmocka_unit_test(test_gone_heard),
      cmocka_unit_test(test_hostile_input),
      cmocka_unit_test(test_data_node_flows_and_probe),
      cmocka_unit_test(test_cost_eq1_and_tunables),
      cmocka_unit_test(test_mutated_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
