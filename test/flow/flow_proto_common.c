/* test/flow/flow_proto_common.c — see flow_proto_common.h. */
#include "flow_proto_common.h"

void fx_relay(fx *x, int capacity, double temp) {
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

void fx_free(fx *x) {
  char err[256];
  assert_int_equal(flow_check_local(x->f, err, sizeof(err)), 0);
  flow_free(x->f);
  cap_clear(&x->cap);
}

void send_offer(fx *x, const gw_id *from, const gw_id *target, uint32_t count, double cost, uint32_t spare) {
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

void send_reply(fx *x, const gw_id *from, uint64_t seg, bool accept, double cost, uint32_t count) {
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

int send_request(fx *x, const gw_id *from, uint64_t seg, double cost) {
  Gwtf__FlowRequest r = GWTF__FLOW_REQUEST__INIT;
  r.seg = seg;
  r.target = idb(&x->d);
  r.cost = cost;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &r;
  return deliver(x->f, from, &m, T0 + 30);
}

uint64_t make_standby(fx *x, const gw_id *next, double rest) {
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

void make_paired(fx *x, uint64_t in_seg, double expect_cost) {
  cap_clear(&x->cap);
  assert_int_equal(send_request(x, &x->d, in_seg, expect_cost), 0);
  Gwtf__FlowMessage *rep = cap_find(&x->cap, &x->d, GWTF__FLOW_MESSAGE__MSG_REPLY, 0);
  assert_non_null(rep);
  assert_true(rep->reply->accept);
  assert_near(rep->reply->cost, expect_cost, 1e-9);
  gwtf__flow_message__free_unpacked(rep, NULL);
  assert_int_equal(cap_events(&x->cap, FLOW_EV_ESTABLISHED), 1);
}

void keep_alive(fx *x, uint64_t seg, uint64_t now) {
  Gwtf__FlowAudit a = GWTF__FLOW_AUDIT__INIT;
  a.n_up_segs = 1;
  a.up_segs = &seg;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_AUDIT;
  m.audit = &a;
  assert_int_equal(deliver(x->f, &x->d, &m, now), 0);
}
