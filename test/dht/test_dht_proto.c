/* Message-level tests of the DHT protocol rules, on a probe dht whose
 * datagrams the test reads and answers by hand. */
#include "dht_testnet.h"

#include "dht/internal.h" /* DHT_RTO_MIN_MS */
#include "dht/record.h"

/* Index of the first message sent since `from` with this kind (or -1). */
static int find_sent(probe *p, size_t from, int kind, const gw_addr *to) {
  for (size_t i = from; i < p->n_sent; i++) {
    dht_msg *m = probe_msg(p, i);
    bool hit = (int)m->kind == kind && (!to || gw_addr_eq(&p->sent[i].to.addr, to));
    dht_wire_free(m);
    if (hit) return (int)i;
  }
  return -1;
}

/* Answers request i as `from` with the given contacts (may be none). */
static void answer(probe *p, size_t i, const gw_peer *from, const gw_peer *nodes, size_t n, uint64_t now) {
  dht_msg *req = probe_msg(p, i);
  dht_msg r = tn_reply_to(req);
  Gwtf__DhtContact cs[32], *ptrs[32];
  for (size_t j = 0; j < n; j++) {
    dht_wire_contact(&cs[j], &nodes[j], true);
    ptrs[j] = &cs[j];
  }
  r.n_nodes = n;
  r.nodes = ptrs;
  probe_feed(p, from, &r, now);
  dht_wire_free(req);
}

/* Fills the probe's table with `n` peers (seed-numbered from base) by
 * bootstrapping from each and answering its FIND_NODE. */
static void fill_table(probe *p, p2p_identity *ids, gw_peer *peers, size_t n, uint32_t base) {
  for (size_t i = 0; i < n; i++) {
    ids[i] = tn_identity(99, base + (uint32_t)i);
    peers[i] = tn_peer(&ids[i], base + (uint32_t)i);
  }
  gw_peer seeds[32];
  for (size_t i = 0; i < n; i++) {
    seeds[i] = peers[i];
    memset(&seeds[i].id, 0, sizeof(gw_id));
  }
  size_t mark = p->n_sent;
  assert_int_equal(dht_bootstrap(p->d, seeds, n, 0), 0);
  probe_tick(p, 0);
  for (size_t i = 0; i < n; i++) {
    int at = find_sent(p, mark, GWTF__DHT_KIND__DHT_FIND_NODE, &peers[i].addr);
    assert_true(at >= 0);
    answer(p, (size_t)at, &peers[i], NULL, 0, 1);
  }
}

static void test_bootstrap_learns_id_and_joins(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 1, NULL);
  p2p_identity seed_id = tn_identity(5, 1), other_id = tn_identity(5, 2);
  gw_peer seed = tn_peer(&seed_id, 1), other = tn_peer(&other_id, 2);
  gw_peer by_addr = seed;
  memset(&by_addr.id, 0, sizeof(by_addr.id));
  assert_int_equal(dht_bootstrap(p.d, &by_addr, 1, 0), 0);
  assert_int_equal(p.tick_at, 0);
  probe_tick(&p, 0);
  /* A FIND_NODE for our own ID goes to the seed, not bound to any ID. */
  assert_int_equal(p.n_sent, 1);
  dht_msg *req = probe_msg(&p, 0);
  assert_int_equal(req->kind, GWTF__DHT_KIND__DHT_FIND_NODE);
  assert_memory_equal(req->target.data, p.me.id.b, GW_ID_BYTES);
  assert_true(gw_id_is_zero(&p.sent[0].to.id));
  /* Without a cookie for us, the request is padded so the answer can be big. */
  assert_true(p.sent[0].len >= DHT_WIRE_REPLY_BASE + 8 * DHT_WIRE_CONTACT_V4);
  dht_wire_free(req);
  /* The seed answers: its ID is learned, it enters the table, and the join
   * lookup asks the contact it named. */
  answer(&p, 0, &seed, &other, 1, 10);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 1);
  int at = find_sent(&p, 1, GWTF__DHT_KIND__DHT_FIND_NODE, &other.addr);
  assert_true(at >= 0);
  assert_true(gw_id_eq(&p.sent[at].to.id, &other.id));
  assert_false(dht_joined(p.d));
  answer(&p, (size_t)at, &other, NULL, 0, 20);
  probe_tick(&p, 20);
  assert_true(dht_joined(p.d));
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 2);
  probe_free(&p);
}

static void test_expected_id_rule(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 2, NULL);
  p2p_identity x_id = tn_identity(5, 1), z_id = tn_identity(5, 3);
  gw_peer x = tn_peer(&x_id, 1), z = tn_peer(&z_id, 1); /* z claims x's address */
  assert_int_equal(dht_bootstrap(p.d, &x, 1, 0), 0); /* x's ID is known (contacts file) */
  probe_tick(&p, 0);
  assert_int_equal(p.n_sent, 1);
  assert_true(gw_id_eq(&p.sent[0].to.id, &x.id));
  /* Another ID answering from x's address: dropped. */
  answer(&p, 0, &z, NULL, 0, 5);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  assert_int_equal(st.dropped_unexpected, 1);
  /* x's ID from another address: dropped too. */
  gw_peer x_elsewhere = x;
  x_elsewhere.addr.port++;
  answer(&p, 0, &x_elsewhere, NULL, 0, 6);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  assert_int_equal(st.dropped_unexpected, 2);
  /* A reply to a transaction we never started: dropped. */
  dht_msg bogus = GWTF__DHT_MESSAGE__INIT;
  bogus.kind = GWTF__DHT_KIND__DHT_NODES;
  bogus.txid = 12345;
  probe_feed(&p, &x, &bogus, 7);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.dropped_unexpected, 3);
  /* The real x: accepted, once. */
  answer(&p, 0, &x, NULL, 0, 8);
  answer(&p, 0, &x, NULL, 0, 9);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 1);
  assert_int_equal(st.replies_in, 1);
  assert_int_equal(st.dropped_unexpected, 4);
  probe_free(&p);
}

static void test_no_state_for_unsolicited(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 3, NULL);
  p2p_identity u_id = tn_identity(6, 1);
  gw_peer u = tn_peer(&u_id, 7);
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  ping.txid = 77;
  uint8_t pad[64] = {0};
  ping.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  probe_feed(&p, &u, &ping, 0);
  /* We answer, and we ask u to prove its address; u is not in the table. */
  int pong = find_sent(&p, 0, GWTF__DHT_KIND__DHT_PONG, &u.addr);
  int verify = find_sent(&p, 0, GWTF__DHT_KIND__DHT_PING, &u.addr);
  assert_true(pong >= 0 && verify >= 0);
  dht_msg *m = probe_msg(&p, (size_t)pong);
  assert_int_equal(m->txid, 77);
  assert_non_null(m->observed); /* the address the ping came from */
  assert_int_equal(m->observed->port, u.addr.port);
  dht_wire_free(m);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  /* A second request while the ping is out does not send a second ping. */
  size_t before = p.n_sent;
  ping.txid = 78;
  probe_feed(&p, &u, &ping, 1);
  assert_int_equal(find_sent(&p, before, GWTF__DHT_KIND__DHT_PING, &u.addr), -1);
  /* u answers the ping at its address: now it is a contact. */
  answer(&p, (size_t)verify, &u, NULL, 0, 2);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 1);
  probe_free(&p);
}

static void test_reply_never_larger_than_request(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 4, NULL);
  p2p_identity ids[20];
  gw_peer peers[20];
  fill_table(&p, ids, peers, 20, 100);
  p2p_identity u_id = tn_identity(6, 2);
  gw_peer u = tn_peer(&u_id, 500);
  gw_id target;
  gw_id_hash_str("anything", &target);
  dht_msg req = GWTF__DHT_MESSAGE__INIT;
  req.kind = GWTF__DHT_KIND__DHT_FIND_NODE;
  req.txid = 1;
  req.target = (ProtobufCBinaryData){32, target.b};
  req.want = 20;
  uint8_t buf[2048];
  size_t req_len = gwtf__dht_message__pack(&req, buf);
  /* No cookie: the reply fits in the request's size (a spoofed source gains
   * nothing by reflection) and hands over a cookie. */
  size_t mark = p.n_sent;
  probe_feed(&p, &u, &req, 10);
  int at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_NODES, &u.addr);
  assert_true(at >= 0);
  assert_true(p.sent[at].len <= req_len);
  dht_msg *r = probe_msg(&p, (size_t)at);
  assert_true(r->n_nodes < 20);
  assert_int_equal(r->your_cookie.len, DHT_COOKIE_BYTES);
  uint8_t cookie[DHT_COOKIE_BYTES];
  memcpy(cookie, r->your_cookie.data, sizeof(cookie));
  dht_wire_free(r);
  /* A padded request may get a reply as large as itself, no larger. */
  uint8_t pad[400] = {0};
  req.txid = 2;
  req.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  size_t padded_len = gwtf__dht_message__pack(&req, buf);
  mark = p.n_sent;
  probe_feed(&p, &u, &req, 11);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_NODES, &u.addr);
  assert_true(p.sent[at].len <= padded_len);
  r = probe_msg(&p, (size_t)at);
  assert_true(r->n_nodes >= 8 && r->n_nodes < 20);
  dht_wire_free(r);
  /* With the cookie echoed (u proved it receives at its address): the full answer. */
  req.txid = 3;
  req.padding = (ProtobufCBinaryData){0};
  req.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, cookie};
  req_len = gwtf__dht_message__pack(&req, buf);
  mark = p.n_sent;
  probe_feed(&p, &u, &req, 12);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_NODES, &u.addr);
  r = probe_msg(&p, (size_t)at);
  assert_int_equal(r->n_nodes, 20);
  assert_true(p.sent[at].len > req_len);
  assert_true(p.sent[at].len <= 1102);
  dht_wire_free(r);
  /* The cookie is bound to u's address: from another port it is worthless. */
  gw_peer u_moved = u;
  u_moved.addr.port++;
  req.txid = 4;
  mark = p.n_sent;
  probe_feed(&p, &u_moved, &req, 13);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_NODES, &u_moved.addr);
  assert_true(p.sent[at].len <= req_len);
  probe_free(&p);
}

static void make_store(dht_msg *m, Gwtf__DhtRecord *w, const dht_rec *rec, const uint8_t *cookie) {
  gwtf__dht_message__init(m);
  gwtf__dht_record__init(w);
  w->body = (ProtobufCBinaryData){rec->body_len, rec->body};
  w->sig = (ProtobufCBinaryData){P2P_SIG_BYTES, (uint8_t *)rec->sig};
  w->remaining_ms = 60000;
  m->kind = GWTF__DHT_KIND__DHT_STORE;
  m->txid = 9;
  m->record = w;
  if (cookie) m->cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie};
}

static int store_status(probe *p, const gw_peer *from, dht_msg *m, uint64_t now, uint8_t *cookie_out) {
  size_t mark = p->n_sent;
  probe_feed(p, from, m, now);
  int at = find_sent(p, mark, GWTF__DHT_KIND__DHT_STORED, &from->addr);
  assert_true(at >= 0);
  dht_msg *r = probe_msg(p, (size_t)at);
  int status = r->status;
  if (cookie_out) memcpy(cookie_out, r->your_cookie.data, DHT_COOKIE_BYTES);
  dht_wire_free(r);
  return status;
}

static void test_store_rules(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 5, NULL);
  p2p_identity pub = tn_identity(7, 1), other = tn_identity(7, 2);
  gw_peer from = tn_peer(&pub, 3);
  gw_id key;
  gw_id_hash_str("run/x/stage/0", &key);
  dht_rec *r2, *r1, *r3;
  assert_int_equal(dht_rec_make(&pub, &key, (const uint8_t *)"v2", 2, 2, 60000, 0, &r2), 0);
  assert_int_equal(dht_rec_make(&pub, &key, (const uint8_t *)"v1", 2, 1, 60000, 0, &r1), 0);
  assert_int_equal(dht_rec_make(&pub, &key, (const uint8_t *)"v3", 2, 3, 60000, 0, &r3), 0);
  dht_msg m;
  Gwtf__DhtRecord w;
  uint8_t cookie[DHT_COOKIE_BYTES];
  /* Without a cookie nothing is stored, but the reply carries one. */
  make_store(&m, &w, r2, NULL);
  assert_int_equal(store_status(&p, &from, &m, 0, cookie), GWTF__DHT_STORE_STATUS__DHT_STORE_COOKIE);
  make_store(&m, &w, r2, cookie);
  assert_int_equal(store_status(&p, &from, &m, 1, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_OK);
  /* Replayed and older: refused. */
  assert_int_equal(store_status(&p, &from, &m, 2, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_STALE);
  make_store(&m, &w, r1, cookie);
  assert_int_equal(store_status(&p, &from, &m, 3, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_STALE);
  /* A forged signature: refused. */
  dht_rec *forged = dht_rec_dup(r3);
  p2p_sign(&other, forged->body, forged->body_len, forged->sig);
  make_store(&m, &w, forged, cookie);
  assert_int_equal(store_status(&p, &from, &m, 4, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_INVALID);
  /* Expired in flight: refused. */
  make_store(&m, &w, r3, cookie);
  w.remaining_ms = 0;
  assert_int_equal(store_status(&p, &from, &m, 5, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_INVALID);
  /* Newer: replaces. A relay may store it too (the signature, not the sender, counts). */
  p2p_identity relay_id = tn_identity(7, 9);
  gw_peer relay = tn_peer(&relay_id, 4);
  make_store(&m, &w, r3, NULL);
  assert_int_equal(store_status(&p, &relay, &m, 6, cookie), GWTF__DHT_STORE_STATUS__DHT_STORE_COOKIE);
  make_store(&m, &w, r3, cookie);
  assert_int_equal(store_status(&p, &relay, &m, 7, NULL), GWTF__DHT_STORE_STATUS__DHT_STORE_OK);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.records, 1);
  assert_int_equal(st.records_rejected, 4);
  /* A FIND_VALUE returns the newest record, with the time it has left. */
  dht_msg fv = GWTF__DHT_MESSAGE__INIT;
  fv.kind = GWTF__DHT_KIND__DHT_FIND_VALUE;
  fv.txid = 11;
  fv.target = (ProtobufCBinaryData){32, key.b};
  fv.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, cookie};
  size_t mark = p.n_sent;
  probe_feed(&p, &relay, &fv, 1007);
  int at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_VALUES, &relay.addr);
  dht_msg *vals = probe_msg(&p, (size_t)at);
  assert_int_equal(vals->n_records, 1);
  assert_int_equal(vals->records[0]->remaining_ms, 59000);
  dht_rec *got;
  assert_int_equal(dht_rec_open(vals->records[0]->body.data, vals->records[0]->body.len,
                                vals->records[0]->sig.data, vals->records[0]->sig.len,
                                vals->records[0]->remaining_ms, 60000, 0, &got),
                   0);
  assert_int_equal(got->seq, 3);
  dht_rec_free(got);
  dht_wire_free(vals);
  dht_rec_free(forged);
  dht_rec_free(r1);
  dht_rec_free(r2);
  dht_rec_free(r3);
  probe_free(&p);
}

static void test_rate_limit(void **state) {
  (void)state;
  dht_config cfg = {.rate_ip = 10, .burst_ip = 10, .rate_global = 1000, .burst_global = 1000};
  probe p;
  probe_init(&p, 6, &cfg);
  p2p_identity u_id = tn_identity(8, 1), v_id = tn_identity(8, 2);
  gw_peer u = tn_peer(&u_id, 1), v = tn_peer(&v_id, 2);
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  for (int i = 0; i < 100; i++) {
    ping.txid = (uint64_t)i + 1;
    probe_feed(&p, &u, &ping, 0);
  }
  size_t pongs = 0;
  for (size_t i = 0; i < p.n_sent; i++) {
    dht_msg *m = probe_msg(&p, i);
    pongs += m->kind == GWTF__DHT_KIND__DHT_PONG;
    dht_wire_free(m);
  }
  assert_int_equal(pongs, 10);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.dropped_rate, 90);
  /* Another IP is not starved by the flood. */
  size_t mark = p.n_sent;
  ping.txid = 1000;
  probe_feed(&p, &v, &ping, 0);
  assert_true(find_sent(&p, mark, GWTF__DHT_KIND__DHT_PONG, &v.addr) >= 0);
  /* A second later the flooder has ten more. */
  mark = p.n_sent;
  for (int i = 0; i < 30; i++) {
    ping.txid = 2000 + (uint64_t)i;
    probe_feed(&p, &u, &ping, 1000);
  }
  pongs = 0;
  for (size_t i = mark; i < p.n_sent; i++) {
    dht_msg *m = probe_msg(&p, i);
    pongs += m->kind == GWTF__DHT_KIND__DHT_PONG;
    dht_wire_free(m);
  }
  assert_int_equal(pongs, 10);
  probe_free(&p);
}

/* FIND_NODE requests for target sent since `from`; with `to`, only to it. */
static size_t count_asks_to(probe *p, size_t from, const gw_id *target, const gw_id *to) {
  size_t n = 0;
  for (size_t i = from; i < p->n_sent; i++) {
    dht_msg *m = probe_msg(p, i);
    n += m->kind == GWTF__DHT_KIND__DHT_FIND_NODE && memcmp(m->target.data, target->b, GW_ID_BYTES) == 0 &&
         (!to || gw_id_eq(&p->sent[i].to.id, to));
    dht_wire_free(m);
  }
  return n;
}

static size_t count_asks(probe *p, size_t from, const gw_id *target) {
  return count_asks_to(p, from, target, NULL);
}

static void test_timeout_retries_elsewhere(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 7, NULL);
  p2p_identity ids[6];
  gw_peer peers[6];
  fill_table(&p, ids, peers, 6, 200);
  probe_tick(&p, 1);
  size_t mark = p.n_sent;
  gw_id target;
  gw_id_hash_str("target", &target);
  tn_nodes_result res = {0};
  /* The join lookup from fill_table is running too; a node lookup of our own: */
  assert_int_equal(dht_find_node(p.d, &target, tn_on_nodes, &res, 100), 0);
  assert_int_equal(count_asks(&p, mark, &target), DHT_ALPHA);
  gw_id first[DHT_ALPHA];
  for (size_t i = mark, n = 0; i < p.n_sent; i++) {
    dht_msg *m = probe_msg(&p, i);
    if (m->kind == GWTF__DHT_KIND__DHT_FIND_NODE) first[n++] = p.sent[i].to.id;
    dht_wire_free(m);
  }
  /* Nobody answers. Within one request timeout (1 s) each of the first three
   * was asked once more (a lost datagram should not cost it its place), and
   * then the lookup moved on to the contacts it had not asked yet. */
  for (uint64_t t = 100; t <= 100 + DHT_RPC_TIMEOUT_MS; t += 10) probe_tick(&p, t);
  for (size_t j = 0; j < DHT_ALPHA; j++) assert_int_equal(count_asks_to(&p, mark, &target, &first[j]), 2);
  size_t others = 0;
  for (size_t j = 0; j < 6; j++) {
    bool was_first = false;
    for (size_t k = 0; k < DHT_ALPHA; k++) was_first |= gw_id_eq(&peers[j].id, &first[k]);
    if (!was_first) others += count_asks_to(&p, mark, &target, &peers[j].id) > 0;
  }
  assert_int_equal(others, 3);
  assert_false(res.done);
  /* Those time out too: the lookup ends empty-handed, on a tick. */
  for (uint64_t t = 1100; t <= 4000 && !res.done; t += 100) probe_tick(&p, t);
  assert_true(res.done);
  assert_int_equal(res.status, GW_ENOENT);
  assert_int_equal(res.st.rpcs, 12);
  assert_int_equal(res.st.timeouts, 12);
  probe_free(&p);
}

static void test_slow_reply_still_counts(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 9, NULL);
  p2p_identity ids[4];
  gw_peer peers[4];
  fill_table(&p, ids, peers, 4, 300); /* answered at once: the RTO drops to its floor */
  probe_tick(&p, 1);
  gw_id target;
  gw_id_hash_str("slow", &target);
  tn_nodes_result res = {0};
  size_t mark = p.n_sent;
  assert_int_equal(dht_find_node(p.d, &target, tn_on_nodes, &res, 100), 0);
  assert_int_equal(count_asks(&p, mark, &target), DHT_ALPHA);
  /* Past the RTO (well before the 1 s timeout) the three are asked again;
   * one more RTO and the lookup asks the fourth. */
  for (uint64_t t = 100; t <= 100 + DHT_RTO_MIN_MS; t += 10) probe_tick(&p, t);
  assert_int_equal(count_asks(&p, mark, &target), 2 * DHT_ALPHA);
  for (uint64_t t = 100 + DHT_RTO_MIN_MS; t <= 100 + 2 * DHT_RTO_MIN_MS; t += 10) probe_tick(&p, t);
  assert_int_equal(count_asks(&p, mark, &target), 2 * DHT_ALPHA + 1);
  /* Every request is answered, late but before it times out: the answers
   * revive the candidates the lookup had given up on. */
  for (size_t i = mark; i < p.n_sent; i++) {
    dht_msg *m = probe_msg(&p, i);
    bool ours = m->kind == GWTF__DHT_KIND__DHT_FIND_NODE && memcmp(m->target.data, target.b, 32) == 0;
    dht_wire_free(m);
    for (size_t j = 0; j < 4 && ours; j++)
      if (gw_id_eq(&p.sent[i].to.id, &peers[j].id)) answer(&p, i, &peers[j], NULL, 0, 600);
  }
  probe_tick(&p, 600);
  assert_true(res.done);
  assert_int_equal(res.status, 0);
  assert_int_equal(res.n, DHT_WIDTH);
  size_t best = 0;
  for (size_t j = 1; j < 4; j++)
    if (dht_dist_cmp(&target, &peers[j].id, &peers[best].id) < 0) best = j;
  assert_true(gw_id_eq(&res.closest[0].id, &peers[best].id));
  assert_int_equal(res.st.rpcs, 2 * DHT_ALPHA + 1);
  /* Slow is not dead: nobody was marked failed in the table. */
  gw_peer good[8];
  assert_int_equal(dht_contacts(p.d, good, 8), 4);
  probe_free(&p);
}

static void test_client_only_and_martians(void **state) {
  (void)state;
  dht_config cfg = {.client_only = true};
  probe p;
  probe_init(&p, 8, &cfg);
  p2p_identity u_id = tn_identity(9, 1);
  gw_peer u = tn_peer(&u_id, 1);
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  ping.txid = 5;
  probe_feed(&p, &u, &ping, 0);
  assert_int_equal(p.n_sent, 0);
  probe_free(&p);
  probe_init(&p, 8, NULL);
  gw_peer loop = u;
  loop.addr.ip[0] = 127;
  probe_feed(&p, &loop, &ping, 0);
  gw_peer multicast = u;
  multicast.addr.ip[0] = 239;
  probe_feed(&p, &multicast, &ping, 0);
  assert_int_equal(p.n_sent, 0);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.dropped_martian, 2);
  /* Garbage and oversize payloads are counted and dropped. */
  uint8_t junk[2000];
  memset(junk, 0xee, sizeof(junk));
  dht_on_message(p.d, &u, junk, 50, 0);
  dht_on_message(p.d, &u, junk, sizeof(junk), 0);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.dropped_malformed, 2);
  assert_int_equal(p.n_sent, 0);
  probe_free(&p);
}

/* Client mode (a node the reachability check found private): its messages
 * are marked `client`, and nobody puts it in a routing table. */
static void test_client_senders_stay_out(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 12, NULL);
  p2p_identity u_id = tn_identity(13, 1);
  gw_peer u = tn_peer(&u_id, 7);
  /* 1. An unknown client's request is answered, but it is not asked to
   * prove its address (that is how a node enters a table). */
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  ping.txid = 77;
  ping.client = true;
  uint8_t pad[64] = {0};
  ping.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  probe_feed(&p, &u, &ping, 0);
  assert_true(find_sent(&p, 0, GWTF__DHT_KIND__DHT_PONG, &u.addr) >= 0);
  assert_int_equal(find_sent(&p, 0, GWTF__DHT_KIND__DHT_PING, &u.addr), -1);
  dht_stats st;
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  assert_int_equal(st.client_senders, 1);
  probe_free(&p);

  /* 2. A reply marked `client` to our own request: it serves the request
   * (the seed's answer completes the bootstrap) but the sender is no contact. */
  probe_init(&p, 12, NULL);
  gw_peer seed = u;
  memset(&seed.id, 0, sizeof(seed.id));
  assert_int_equal(dht_bootstrap(p.d, &seed, 1, 0), 0);
  probe_tick(&p, 0);
  int at = find_sent(&p, 0, GWTF__DHT_KIND__DHT_FIND_NODE, &u.addr);
  assert_true(at >= 0);
  dht_msg *req = probe_msg(&p, (size_t)at);
  dht_msg r = tn_reply_to(req);
  r.client = true;
  p2p_identity w_id = tn_identity(13, 2);
  gw_peer w = tn_peer(&w_id, 8);
  Gwtf__DhtContact wc, *wcp = &wc;
  dht_wire_contact(&wc, &w, true);
  r.n_nodes = 1;
  r.nodes = &wcp;
  size_t mark = p.n_sent;
  probe_feed(&p, &u, &r, 1);
  dht_wire_free(req);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  assert_int_equal(st.client_senders, 1);
  /* The contact it named is asked next (the lookup went on), and it is a
   * normal node: its answer puts it in the table. */
  probe_tick(&p, 2);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_FIND_NODE, &w.addr);
  assert_true(at >= 0);
  answer(&p, (size_t)at, &w, NULL, 0, 3);
  gw_peer got[4];
  assert_int_equal(dht_contacts(p.d, got, 4), 1);
  assert_true(gw_id_eq(&got[0].id, &w.id));

  /* 3. A contact that turns client (it found itself private) is dropped
   * the first time we hear the flag from it. */
  ping.txid = 78;
  ping.client = true;
  probe_feed(&p, &w, &ping, 4);
  assert_int_equal(dht_contacts(p.d, got, 4), 0);
  dht_get_stats(p.d, &st);
  assert_int_equal(st.contacts, 0);
  probe_free(&p);
}

/* A node switching to client mode marks everything it sends, still looks
 * up and publishes, and pings its contacts once so they drop it. */
static void test_client_mode_marks_messages(void **state) {
  (void)state;
  probe p;
  probe_init(&p, 14, NULL);
  p2p_identity ids[6];
  gw_peer peers[6];
  fill_table(&p, ids, peers, 6, 300);
  assert_false(dht_client_mode(p.d));
  size_t mark = p.n_sent;
  dht_set_client_mode(p.d, true, 10);
  assert_true(dht_client_mode(p.d));
  /* One ping to each contact, marked. */
  for (size_t i = 0; i < 6; i++) {
    int at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_PING, &peers[i].addr);
    assert_true(at >= 0);
    dht_msg *m = probe_msg(&p, (size_t)at);
    assert_true(m->client);
    dht_wire_free(m);
  }
  /* Lookups go on, marked; and so do our answers to others. */
  mark = p.n_sent;
  gw_id target;
  gw_id_hash_str("somewhere", &target);
  tn_nodes_result res = {0};
  assert_int_equal(dht_find_node(p.d, &target, tn_on_nodes, &res, 20), 0);
  probe_tick(&p, 20);
  int at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_FIND_NODE, NULL);
  assert_true(at >= 0);
  dht_msg *m = probe_msg(&p, (size_t)at);
  assert_true(m->client);
  dht_wire_free(m);
  p2p_identity u_id = tn_identity(15, 1);
  gw_peer u = tn_peer(&u_id, 900);
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  ping.txid = 5;
  uint8_t pad[64] = {0};
  ping.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  mark = p.n_sent;
  probe_feed(&p, &u, &ping, 21);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_PONG, &u.addr);
  assert_true(at >= 0);
  m = probe_msg(&p, (size_t)at);
  assert_true(m->client);
  dht_wire_free(m);
  /* Back to normal: unmarked again. */
  dht_set_client_mode(p.d, false, 30);
  mark = p.n_sent;
  ping.txid = 6;
  probe_feed(&p, &u, &ping, 31);
  at = find_sent(&p, mark, GWTF__DHT_KIND__DHT_PONG, &u.addr);
  m = probe_msg(&p, (size_t)at);
  assert_false(m->client);
  dht_wire_free(m);
  probe_free(&p);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bootstrap_learns_id_and_joins),
      cmocka_unit_test(test_expected_id_rule),
      cmocka_unit_test(test_no_state_for_unsolicited),
      cmocka_unit_test(test_reply_never_larger_than_request),
      cmocka_unit_test(test_store_rules),
      cmocka_unit_test(test_rate_limit),
      cmocka_unit_test(test_timeout_retries_elsewhere),
      cmocka_unit_test(test_slow_reply_still_counts),
      cmocka_unit_test(test_client_only_and_martians),
      cmocka_unit_test(test_client_senders_stay_out),
      cmocka_unit_test(test_client_mode_marks_messages),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
