/* Two flow instances wired together — a data node D and a stage-1 relay R,
 * with a scripted stage-2 peer N — and every message between D and R
 * delivered until none is left. Counts what D asks R for: the Request Flow
 * storm of a CI swarm run (test_byzantine: a relay logged 600 pairs of
 * flow.established / flow.torn_down with the data node within 0.4 s) came
 * from a data node asking, on behalf of a sink slot, for an outflow it
 * could only hand back, again and again at network speed. */
#include "flowtest.h"

#define TICK (2000)
#define PUMP_LIMIT (2000) /* deliveries: far beyond what one tick's news needs */

typedef struct pair {
  cap_io dc, rc; /* what D and R sent */
  flow *d, *r;
  gw_id did, rid, nid;
  uint64_t now;
  uint32_t n_left;    /* standby paths N still grants */
  uint64_t n_version; /* N's cost clock */
  int d_requests;     /* FlowRequests from D to R */
  int d_cancels;      /* FlowCancels from D to R */
  int delivered;
} pair;

static flow *make_flow(cap_io *cap, uint64_t seed, const gw_id *self, flow_role role, int stage, int capacity) {
  flow_config cfg;
  flow_config_default(&cfg);
  cfg.self = *self;
  cfg.role = role;
  cfg.stage = stage;
  cfg.n_stages = 2;
  cfg.capacity = capacity;
  cfg.tun.objective = FLOW_OBJ_SUM;
  cfg.tun.p_propose_unmet = cfg.tun.p_propose_satisfied = 0; /* no change / redirect: D and R only */
  cfg.io = cap_gw_io(cap, seed);
  cfg.on_event = cap_event;
  cfg.event_ud = cap;
  flow *f;
  assert_int_equal(flow_new(&cfg, &f), 0);
  return f;
}

/* D (capacity 1: one source slot, one sink slot) -> R (capacity 3) -> N -> D,
 * every link cost 1. */
static void pair_init(pair *x) {
  memset(x, 0, sizeof(*x));
  x->did = test_id("pair-D");
  x->rid = test_id("pair-R");
  x->nid = test_id("pair-N");
  x->d = make_flow(&x->dc, 11, &x->did, FLOW_DATA, 0, 1);
  x->r = make_flow(&x->rc, 12, &x->rid, FLOW_RELAY, 1, 3);
  assert_int_equal(flow_add_peer(x->d, &x->rid, 1), 0);
  assert_int_equal(flow_add_peer(x->d, &x->nid, 2), 0);
  assert_int_equal(flow_set_cost(x->d, &x->rid, FLOW_DIR_NEXT, 1), 0);
  assert_int_equal(flow_set_cost(x->d, &x->nid, FLOW_DIR_PREV, 1), 0);
  assert_int_equal(flow_add_peer(x->r, &x->did, 0), 0);
  assert_int_equal(flow_add_peer(x->r, &x->nid, 2), 0);
  assert_int_equal(flow_set_cost(x->r, &x->did, FLOW_DIR_PREV, 1), 0);
  assert_int_equal(flow_set_cost(x->r, &x->nid, FLOW_DIR_NEXT, 1), 0);
  assert_int_equal(flow_start(x->d, 0), 0);
  assert_int_equal(flow_start(x->r, 0), 0);
}

static void pair_free(pair *x) {
  char err[256];
  if (flow_check_local(x->d, err, sizeof(err)) != 0) fail_msg("D: %s", err);
  if (flow_check_local(x->r, err, sizeof(err)) != 0) fail_msg("R: %s", err);
  flow_free(x->d);
  flow_free(x->r);
  cap_clear(&x->dc);
  cap_clear(&x->rc);
}

static void deliver_raw(flow *f, const gw_id *from, const uint8_t *buf, size_t len, uint64_t now) {
  gw_peer p;
  memset(&p, 0, sizeof(p));
  p.id = *from;
  assert_int_equal(flow_on_message(f, &p, buf, len, now), 0);
}

/* N grants R's requests while it has standby paths left (its cost to D's
 * sink: 1); everything else sent to N goes unanswered. */
static void n_receive(pair *x, const uint8_t *buf, size_t len) {
  Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, len, buf);
  assert_non_null(m);
  if (m->msg_case == GWTF__FLOW_MESSAGE__MSG_REQUEST) {
    bool grant = x->n_left > 0;
    if (grant) x->n_left--;
    Gwtf__FlowReply r = GWTF__FLOW_REPLY__INIT;
    r.seg = m->request->seg;
    r.target = idb(&x->did);
    r.accept = grant;
    r.cost = 1;
    r.count = x->n_left;
    r.version = ++x->n_version;
    Gwtf__FlowMessage out = GWTF__FLOW_MESSAGE__INIT;
    out.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY;
    out.reply = &r;
    assert_int_equal(deliver(x->r, &x->nid, &out, x->now), 0);
  }
  gwtf__flow_message__free_unpacked(m, NULL);
}

static void count_d_to_r(pair *x, const uint8_t *buf, size_t len) {
  Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, len, buf);
  assert_non_null(m);
  x->d_requests += m->msg_case == GWTF__FLOW_MESSAGE__MSG_REQUEST;
  x->d_cancels += m->msg_case == GWTF__FLOW_MESSAGE__MSG_CANCEL;
  gwtf__flow_message__free_unpacked(m, NULL);
}

/* Takes what one side sent so far (its handlers may send more meanwhile). */
static int take(cap_io *c, cap_msg *out) {
  int n = c->n;
  memcpy(out, c->msgs, (size_t)n * sizeof(*out));
  c->n = 0;
  return n;
}

/* Delivers everything in flight, and what that causes, until nothing is
 * left; false when it would not stop within PUMP_LIMIT deliveries. */
static bool pump(pair *x) {
  static cap_msg batch[CAP_MAX_MSGS];
  for (;;) {
    if (x->dc.n == 0 && x->rc.n == 0) return true;
    if (x->delivered > PUMP_LIMIT) return false;
    int n = take(&x->dc, batch);
    for (int i = 0; i < n; i++, x->delivered++) {
      if (gw_id_eq(&batch[i].to, &x->rid)) {
        count_d_to_r(x, batch[i].buf, batch[i].len);
        deliver_raw(x->r, &x->did, batch[i].buf, batch[i].len, x->now);
      }
      free(batch[i].buf); /* to N: D's offers and audits, which N ignores */
    }
    n = take(&x->rc, batch);
    for (int i = 0; i < n; i++, x->delivered++) {
      if (gw_id_eq(&batch[i].to, &x->did))
        deliver_raw(x->d, &x->rid, batch[i].buf, batch[i].len, x->now);
      else if (gw_id_eq(&batch[i].to, &x->nid))
        n_receive(x, batch[i].buf, batch[i].len);
      free(batch[i].buf);
    }
  }
}

/* One tick of both nodes and all it causes; returns D's requests to R. */
static int tick_round(pair *x) {
  x->now += TICK;
  x->d_requests = x->d_cancels = x->delivered = 0;
  flow_on_tick(x->r, x->now);
  flow_on_tick(x->d, x->now);
  if (!pump(x))
    fail_msg("D and R still talking after %d deliveries in one tick: %d requests from D, %d cancels", x->delivered,
             x->d_requests, x->d_cancels);
  return x->d_requests;
}

static void n_requests_sink(pair *x, uint64_t seg) {
  Gwtf__FlowRequest rq = GWTF__FLOW_REQUEST__INIT;
  rq.seg = seg;
  rq.target = idb(&x->did);
  rq.cost = 0;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_REQUEST;
  m.request = &rq;
  assert_int_equal(deliver(x->d, &x->nid, &m, x->now), 0);
}

static void n_offers(pair *x, uint32_t count) {
  x->n_left = count;
  Gwtf__FlowOfferEntry e = GWTF__FLOW_OFFER_ENTRY__INIT, *ep = &e;
  e.target = idb(&x->did);
  e.count = count;
  e.cost = 1;
  Gwtf__FlowOffer o = GWTF__FLOW_OFFER__INIT;
  o.n_entries = 1;
  o.entries = &ep;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &o;
  assert_int_equal(deliver(x->r, &x->nid, &m, x->now), 0);
}

/* The storm's state: D's only flow is complete (its sink slot holds the
 * inflow from N) and R holds one more standby path to D, which it offers.
 * D has nothing to ask for: neither its source slot (paired, and the offer
 * is no cheaper) nor its sink slot (it takes no outflow). */
static void test_sink_slot_asks_for_nothing(void **state) {
  (void)state;
  pair x;
  pair_init(&x);
  n_requests_sink(&x, 0x5151); /* D's sink slot: inflow from N */
  n_offers(&x, 3);             /* R takes a standby path to D through N */
  assert_true(pump(&x));
  flow_counts c;
  flow_get_counts(x.r, &c);
  assert_int_equal(c.unpaired_out, 1);
  /* R offers it; D's source slot takes it; R, stable with room, takes the
   * second standby path and offers that one too. */
  tick_round(&x);
  flow_path_info info[2];
  assert_int_equal(flow_data_flows(x.d, info, 2), 1);
  assert_true(gw_id_eq(&info[0].first_hop, &x.rid));
  flow_get_counts(x.r, &c);
  assert_int_equal(c.paired, 1);
  assert_int_equal(c.unpaired_out, 1);
  /* From here on D must leave R's offer alone, tick after tick. Before the
   * fix its sink slot asked for it, R granted, D handed the grant back
   * (nothing can take it), and asked again at once with a new segment. */
  for (int round = 0; round < 4; round++) {
    int asked = tick_round(&x);
    if (asked != 0) fail_msg("round %d: D sent R %d requests and %d cancels", round, asked, x.d_cancels);
  }
  assert_int_equal(flow_data_flows(x.d, info, 2), 1);
  flow_get_counts(x.r, &c);
  assert_int_equal(c.paired, 1);
  assert_int_equal(c.unpaired_out, 1);
  pair_free(&x);
}

/* A grant D hands back although it matched its pending request (here: one
 * for another target) is not asked for again from the same offer until the
 * peer offers again: at most one request per offer, never a ping-pong. */
static void test_handed_back_grant_not_asked_again(void **state) {
  (void)state;
  cap_io cap;
  gw_id d = test_id("pair-D"), x = test_id("pair-X"), other = test_id("pair-other");
  flow *f = make_flow(&cap, 13, &d, FLOW_DATA, 0, 1);
  assert_int_equal(flow_add_peer(f, &x, 1), 0);
  assert_int_equal(flow_set_cost(f, &x, FLOW_DIR_NEXT, 1), 0);
  assert_int_equal(flow_start(f, 0), 0);
  Gwtf__FlowOfferEntry e = GWTF__FLOW_OFFER_ENTRY__INIT, *ep = &e;
  e.target = idb(&d);
  e.count = 8;
  e.cost = 1;
  Gwtf__FlowOffer o = GWTF__FLOW_OFFER__INIT;
  o.n_entries = 1;
  o.entries = &ep;
  Gwtf__FlowMessage m = GWTF__FLOW_MESSAGE__INIT;
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &o;
  assert_int_equal(deliver(f, &x, &m, 1), 0);
  int requests = 0;
  for (int k = 0; k < 8; k++) {
    Gwtf__FlowMessage *req = cap_find(&cap, &x, GWTF__FLOW_MESSAGE__MSG_REQUEST, 0);
    if (!req) break;
    requests++;
    uint64_t seg = req->request->seg;
    gwtf__flow_message__free_unpacked(req, NULL);
    cap_clear(&cap);
    Gwtf__FlowReply r = GWTF__FLOW_REPLY__INIT;
    r.seg = seg;
    r.target = idb(&other); /* unusable: a grant for a data node D never asked to reach */
    r.accept = true;
    r.cost = 1;
    r.count = 8;
    m.msg_case = GWTF__FLOW_MESSAGE__MSG_REPLY;
    m.reply = &r;
    assert_int_equal(deliver(f, &x, &m, 2 + (uint64_t)k), 0);
    Gwtf__FlowMessage *cancel = cap_find(&cap, &x, GWTF__FLOW_MESSAGE__MSG_CANCEL, 0);
    assert_true(cancel && cancel->cancel->seg == seg); /* handed back */
    gwtf__flow_message__free_unpacked(cancel, NULL);
  }
  assert_int_equal(requests, 1);
  /* X's next offer makes it worth asking again. */
  cap_clear(&cap);
  m.msg_case = GWTF__FLOW_MESSAGE__MSG_OFFER;
  m.offer = &o;
  assert_int_equal(deliver(f, &x, &m, 20), 0);
  assert_int_equal(cap_count(&cap, &x, GWTF__FLOW_MESSAGE__MSG_REQUEST), 1);
  char err[256];
  assert_int_equal(flow_check_local(f, err, sizeof(err)), 0);
  flow_free(f);
  cap_clear(&cap);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sink_slot_asks_for_nothing),
      cmocka_unit_test(test_handed_back_grant_not_asked_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
