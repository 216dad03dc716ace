/* Unit tests of the flow protocol's failure handling and robustness, driven
 * message by message through a capturing io: a silent peer presumed dead and
 * a failure reported by the training layer, the probe path (an overdue audit,
 * pings, an answer or a presumed death), FlowGone, and hostile input (malformed
 * messages, and thousands of mutated ones through flow and placement). The
 * state machine's normal run: test_flow_proto.c. */
#include "flow_proto_common.h"

#include "flow/place.h"

/* A relay R with a standby path through N (cost 4) and a paired unit from D
 * (segment 10001, cost 9): the start of the liveness tests. */
static void fx_relay_paired(fx *x) {
  fx_relay(x, 2, 1.7);
  make_standby(x, &x->n, 4);
  make_paired(x, 10001, 9);
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
      cmocka_unit_test(test_peer_silence_and_failure),
      cmocka_unit_test(test_probe_suspect),
      cmocka_unit_test(test_gone_heard),
      cmocka_unit_test(test_hostile_input),
      cmocka_unit_test(test_mutated_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
