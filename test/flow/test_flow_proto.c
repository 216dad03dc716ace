/* Unit tests of the flow protocol state machine as it runs when its peers
 * behave, driven message by message through a capturing io: Request Flow
 * accept/reject, cost push, cancel and DENY, inflow push-back, Request Change
 * and Request Redirect on the accepting side, reliable notify-switch,
 * tombstones, the annealing rule, a data node's flows and probes, Eq. 1 and
 * the tunables. Failure handling and hostile input: test_flow_failure.c. */
#include "flow_proto_common.h"

#include "flow/flow_internal.h"

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
      cmocka_unit_test(test_data_node_flows_and_probe),
      cmocka_unit_test(test_cost_eq1_and_tunables),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
