/* Reachability by dial-back (p2p/reach.h, p2p/host.c).
 *
 * The state machine alone: verdicts need two agreeing peers, an "ok"
 * counts only when the dial-back really arrived, forged and stale answers
 * change nothing, one peer's observed address changes nothing, the
 * prober's rate limits. Then real hosts on loopback: a listening node is
 * public (checked_by=2), a node whose advertised port nobody listens on is
 * private and says what to do, and hand-written hostile peers: a forged
 * request cannot make the prober dial another IP, a prober's handshake
 * proves the requester itself answered, per-requester rate limit, and
 * probers that claim "ok" without dialling change nothing. */
#include "testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>

#include "p2p/host.h"
#include "p2p/reach.h"
#include "p2ptest.h"

#define WAIT_MS (15000)

static logrec rec;

static int setup(void **state) { return (void)state, p2ptest_setup(&rec); }
static int teardown(void **state) { return (void)state, p2ptest_teardown(&rec); }

static gw_addr addr_of_str(const char *s) {
  gw_addr a;
  assert_int_equal(gw_addr_parse(s, &a), 0);
  return a;
}

static gw_id id_n(uint8_t n) {
  gw_id id;
  memset(&id, 0, sizeof(id));
  id.b[0] = n;
  id.b[31] = 0x5a;
  return id;
}

/* ================= the state machine alone ================= */

#define SM_MAX_REQ (64)

typedef struct sm {
  p2p_reach *r;
  gw_log log;
  struct {
    gw_id to;
    uint16_t port;
    uint64_t nonce;
  } req[SM_MAX_REQ];
  size_t n_req;
  int decided;
  p2p_reachability last;
  uint64_t next_nonce;
} sm;

static int sm_request(void *ud, const gw_id *to, uint16_t port, uint64_t nonce) {
  sm *m = ud;
  assert_true(m->n_req < SM_MAX_REQ);
  m->req[m->n_req].to = *to;
  m->req[m->n_req].port = port;
  m->req[m->n_req].nonce = nonce;
  m->n_req++;
  return 0;
}

static void sm_decided(void *ud, const p2p_reachability *r) {
  sm *m = ud;
  m->decided++;
  m->last = *r;
}

static uint64_t sm_random(void *ud) { return ++((sm *)ud)->next_nonce * 1000003u; }

static void sm_init(sm *m, uint16_t port) {
  memset(m, 0, sizeof(*m));
  gw_log_init(&m->log, &rec.sink, NULL);
  p2p_reach_config cfg = {.port = port, .result_timeout_ms = 1000, .retry_ms = 5000, .refresh_ms = 60000,
                          .log = &m->log};
  p2p_reach_io io = {.ud = m, .request = sm_request, .decided = sm_decided, .random64 = sm_random};
  assert_int_equal(p2p_reach_new(&cfg, &io, &m->r), 0);
}

/* The request sent to peer `to` (the latest one). */
static uint64_t sm_nonce_for(const sm *m, const gw_id *to) {
  for (size_t i = m->n_req; i-- > 0;)
    if (gw_id_eq(&m->req[i].to, to)) return m->req[i].nonce;
  fail_msg("no request to that peer");
  return 0;
}

static size_t sm_requests_to(const sm *m, const gw_id *to) {
  size_t n = 0;
  for (size_t i = 0; i < m->n_req; i++) n += gw_id_eq(&m->req[i].to, to);
  return n;
}

static const int OK = GWTF__DIAL_BACK_STATUS__DIAL_BACK_OK;
static const int FAILED = GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED;
static const int REFUSED = GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED;

/* A peer that really dialled back and says so. */
static void sm_honest_ok(sm *m, const gw_id *p, const gw_addr *dialled, uint64_t now) {
  uint64_t n = sm_nonce_for(m, p);
  assert_true(p2p_reach_on_probe(m->r, p, n, now));
  p2p_reach_on_result(m->r, p, n, OK, dialled, now);
}

static void test_sm_public_needs_two(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 7447);
  gw_id a = id_n(1), b = id_n(2);
  gw_addr obs = addr_of_str("203.0.113.7:40000"), dialled = addr_of_str("203.0.113.7:7447");
  p2p_reach_peer_up(m.r, &a, &obs, 0);
  assert_int_equal(m.n_req, 0); /* one peer: nobody asked yet */
  p2p_reach_peer_up(m.r, &b, &obs, 10);
  assert_int_equal(m.n_req, 2);
  assert_int_equal(m.req[0].port, 7447);
  sm_honest_ok(&m, &a, &dialled, 20);
  assert_int_equal(m.decided, 0); /* one "ok" decides nothing */
  sm_honest_ok(&m, &b, &dialled, 30);
  assert_int_equal(m.decided, 1);
  assert_int_equal(m.last.status, P2P_REACH_PUBLIC);
  assert_int_equal(m.last.checked_by, 2);
  assert_true(gw_addr_eq(&m.last.addr, &dialled));
  assert_true(logrec_count(&rec, "nat.reachability", "status=public addr=203.0.113.7:7447 checked_by=2") > 0);
  /* Late, repeated or forged answers to a finished round change nothing. */
  p2p_reach_on_result(m.r, &a, sm_nonce_for(&m, &a), FAILED, &dialled, 40);
  assert_int_equal(m.decided, 1);
  p2p_reach_free(m.r);
}

static void test_sm_ok_without_connection(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 7447);
  gw_id a = id_n(1), b = id_n(2);
  gw_addr dialled = addr_of_str("198.51.100.1:7447");
  p2p_reach_peer_up(m.r, &a, NULL, 0);
  p2p_reach_peer_up(m.r, &b, NULL, 0);
  /* Both say "ok" but no dial-back connection ever arrives: liars, or the
   * connection went elsewhere. No verdict when their time is up. */
  p2p_reach_on_result(m.r, &a, sm_nonce_for(&m, &a), OK, &dialled, 10);
  p2p_reach_on_result(m.r, &b, sm_nonce_for(&m, &b), OK, &dialled, 10);
  p2p_reach_tick(m.r, 999);
  assert_int_equal(m.decided, 0);
  p2p_reach_tick(m.r, 1000);
  assert_int_equal(m.decided, 0);
  /* A connection with a wrong nonce, or from a peer never asked, is no proof. */
  gw_id c = id_n(3);
  assert_false(p2p_reach_on_probe(m.r, &a, 12345, 1001));
  assert_false(p2p_reach_on_probe(m.r, &c, sm_nonce_for(&m, &a), 1001));
  /* "failed" from a peer whose dial-back did reach us is no verdict either. */
  sm m2;
  sm_init(&m2, 7447);
  p2p_reach_peer_up(m2.r, &a, NULL, 0);
  p2p_reach_peer_up(m2.r, &b, NULL, 0);
  assert_true(p2p_reach_on_probe(m2.r, &a, sm_nonce_for(&m2, &a), 5));
  p2p_reach_on_result(m2.r, &a, sm_nonce_for(&m2, &a), FAILED, &dialled, 6);
  p2p_reach_on_result(m2.r, &b, sm_nonce_for(&m2, &b), FAILED, &dialled, 6);
  assert_int_equal(m2.decided, 0);
  p2p_reach_get(m2.r, &m2.last);
  assert_int_equal(m2.last.status, P2P_REACH_UNKNOWN);
  p2p_reach_free(m.r);
  p2p_reach_free(m2.r);
}

static void test_sm_private_and_more_peers(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 7447);
  gw_id a = id_n(1), b = id_n(2), c = id_n(3), d = id_n(4);
  gw_addr dialled = addr_of_str("198.51.100.9:7447");
  gw_addr wrong_port = addr_of_str("198.51.100.9:80");
  p2p_reach_peer_up(m.r, &a, NULL, 0);
  p2p_reach_peer_up(m.r, &b, NULL, 0);
  p2p_reach_peer_up(m.r, &c, NULL, 0);
  assert_int_equal(m.n_req, 2); /* two in flight at a time */
  /* a refuses (rate limit), b says it dialled a port we never asked for:
   * neither is a verdict, so c and then d are asked. */
  p2p_reach_on_result(m.r, &a, sm_nonce_for(&m, &a), REFUSED, NULL, 1);
  assert_int_equal(sm_requests_to(&m, &c), 1);
  p2p_reach_on_result(m.r, &b, sm_nonce_for(&m, &b), FAILED, &wrong_port, 2);
  p2p_reach_on_result(m.r, &c, sm_nonce_for(&m, &c), FAILED, &dialled, 3);
  assert_int_equal(m.decided, 0);
  p2p_reach_peer_up(m.r, &d, NULL, 4);
  assert_int_equal(sm_requests_to(&m, &d), 1);
  p2p_reach_on_result(m.r, &d, sm_nonce_for(&m, &d), FAILED, &dialled, 5);
  assert_int_equal(m.decided, 1);
  assert_int_equal(m.last.status, P2P_REACH_PRIVATE);
  assert_int_equal(m.last.checked_by, 2);
  assert_true(gw_addr_eq(&m.last.addr, &dialled));
  assert_true(logrec_count(&rec, "nat.advice", "forward TCP and UDP port 7447") > 0);
  /* The mapping changed: check again at the mapped port; the status stays
   * private until the new verdict. */
  size_t before = m.n_req;
  p2p_reach_recheck(m.r, 40123, 100);
  assert_int_equal(m.n_req, before + 2);
  assert_int_equal(m.req[m.n_req - 1].port, 40123);
  p2p_reach_get(m.r, &m.last);
  assert_int_equal(m.last.status, P2P_REACH_PRIVATE);
  /* Answers to the old round no longer count. */
  p2p_reach_on_result(m.r, &a, m.req[0].nonce, OK, &dialled, 101);
  assert_int_equal(m.decided, 1);
  p2p_reach_free(m.r);
}

static void test_sm_observed_needs_two(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 7447);
  gw_id a = id_n(1), b = id_n(2), c = id_n(3);
  gw_addr home = addr_of_str("203.0.113.7:1111"), home2 = addr_of_str("203.0.113.7:2222");
  gw_addr spoof = addr_of_str("192.0.2.66:3333");
  gw_addr obs;
  p2p_reach_peer_up(m.r, &a, &home, 0);
  assert_int_equal(p2p_reach_observed(m.r, &obs), GW_ENOENT);
  p2p_reach_peer_up(m.r, &c, &spoof, 0);
  assert_int_equal(p2p_reach_observed(m.r, &obs), GW_ENOENT); /* one word against one word */
  p2p_reach_peer_up(m.r, &b, &home2, 0);
  assert_int_equal(p2p_reach_observed(m.r, &obs), 0);
  assert_true(gw_addr_same_ip(&obs, &home)); /* two agree on the IP (NAT ports differ) */
  /* Decide public at home, then one peer (re)connects claiming another
   * address: nothing is checked again. */
  gw_addr dialled = home;
  dialled.port = 7447;
  sm_honest_ok(&m, &a, &dialled, 1);
  sm_honest_ok(&m, &c, &dialled, 1);
  assert_int_equal(m.last.status, P2P_REACH_PUBLIC);
  size_t before = m.n_req;
  gw_addr other = addr_of_str("192.0.2.77:5555");
  p2p_reach_peer_up(m.r, &b, &other, 10); /* now three peers, three stories */
  assert_int_equal(p2p_reach_observed(m.r, &obs), GW_ENOENT);
  p2p_reach_tick(m.r, 20000);
  assert_int_equal(m.n_req, before);
  assert_int_equal(logrec_count(&rec, "nat.observed", NULL), 0);
  /* A second peer agreeing with c's address does move it: check again
   * (not before the retry period since the last round, against flapping). */
  p2p_reach_peer_up(m.r, &a, &spoof, 20001);
  assert_int_equal(logrec_count(&rec, "nat.observed", "now=192.0.2.66:0"), 1);
  p2p_reach_tick(m.r, 20002);
  assert_int_equal(m.n_req, before + 2);
  p2p_reach_free(m.r);
}

static void test_sm_not_listening(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 0);
  gw_id a = id_n(1);
  p2p_reach_tick(m.r, 0);
  assert_int_equal(m.decided, 0); /* nobody to tell yet */
  p2p_reach_peer_up(m.r, &a, NULL, 1);
  assert_int_equal(m.n_req, 0);
  assert_int_equal(m.decided, 1);
  assert_int_equal(m.last.status, P2P_REACH_PRIVATE);
  assert_int_equal(m.last.checked_by, 0);
  p2p_reach_free(m.r);
}

static void test_sm_rate_limits(void **state) {
  (void)state;
  sm m;
  sm_init(&m, 7447);
  const char *why;
  gw_id a = id_n(1), b = id_n(2);
  gw_addr ip1 = addr_of_str("198.51.100.1:5000"), ip2 = addr_of_str("198.51.100.2:5000");
  for (int i = 0; i < P2P_REACH_SERVE_BURST; i++) {
    assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 7447, 0, &why), 0);
    p2p_reach_serve_done(m.r);
  }
  assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 7447, 0, &why), GW_EAGAIN);
  assert_string_equal(why, "rate-limit-peer");
  assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 0, 0, &why), GW_EINVAL);
  assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 70000, 0, &why), GW_EINVAL);
  /* One token back after the refill period. */
  assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 7447, P2P_REACH_SERVE_REFILL_MS, &why), 0);
  p2p_reach_serve_done(m.r);
  assert_int_equal(p2p_reach_admit(m.r, &a, &ip1, 7447, P2P_REACH_SERVE_REFILL_MS, &why), GW_EAGAIN);
  /* Many node IDs from one IP share that IP's bucket. */
  int admitted = 0;
  for (uint8_t k = 10; k < 30; k++) {
    gw_id x = id_n(k);
    if (p2p_reach_admit(m.r, &x, &ip1, 7447, P2P_REACH_SERVE_REFILL_MS, &why) == 0) {
      admitted++;
      p2p_reach_serve_done(m.r);
    }
  }
  /* The IP bucket: burst, minus a's three, plus one refill, minus a's fourth. */
  assert_int_equal(admitted, P2P_REACH_SERVE_IP_BURST - P2P_REACH_SERVE_BURST);
  assert_string_equal(why, "rate-limit-ip");
  /* In flight at once. */
  for (int i = 0; i < P2P_REACH_SERVE_INFLIGHT; i++) {
    gw_id x = id_n((uint8_t)(100 + i));
    gw_addr ipx = ip2;
    ipx.ip[3] = (uint8_t)(10 + i);
    assert_int_equal(p2p_reach_admit(m.r, &x, &ipx, 7447, 0, &why), 0);
  }
  assert_int_equal(p2p_reach_admit(m.r, &b, &ip2, 7447, 0, &why), GW_EFULL);
  p2p_reach_serve_done(m.r);
  assert_int_equal(p2p_reach_admit(m.r, &b, &ip2, 7447, 0, &why), 0);
  p2p_reach_free(m.r);
}

/* ================= real hosts on loopback ================= */

typedef struct rnode {
  p2p_identity id;
  p2p_host *h;
  gw_log log;
  int ups, downs, verdicts;
  p2p_reachability last;
} rnode;

static void rn_up(void *ud, const gw_peer *peer, bool back) {
  (void)peer, (void)back;
  ((rnode *)ud)->ups++;
}

static void rn_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  (void)id, (void)reason;
  ((rnode *)ud)->downs++;
}

static void rn_reach(void *ud, const p2p_reachability *r) {
  rnode *n = ud;
  n->verdicts++;
  n->last = *r;
}

static void rn_start(rnode *n, uv_loop_t *loop, const char *listen, uint32_t dial_back_timeout_ms) {
  memset(n, 0, sizeof(*n));
  p2p_host_config hc;
  p2ptest_host_config(&hc, &n->id, NULL, &n->log, &rec);
  hc.listen = addr_of_str(listen);
  hc.ping_interval_ms = 200;
  hc.handshake_timeout_ms = 2000;
  if (dial_back_timeout_ms) hc.dial_back_timeout_ms = dial_back_timeout_ms;
  hc.log_rtt = false;
  hc.agent = "reach-test";
  p2p_host_cbs cbs = {.ud = n, .peer_up = rn_up, .peer_down = rn_down, .reachability = rn_reach};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &n->h), 0);
}

static void rn_stop(rnode *n) {
  if (n->h) p2p_host_close(n->h, NULL, NULL);
  n->h = NULL;
}

static gw_addr rn_addr(const rnode *n) { return p2p_host_listen_addr(n->h); }

static bool has_verdict(void *ud) { return ((rnode *)ud)->verdicts > 0; }

typedef struct up_count {
  rnode *n;
  int want;
} up_count;

static bool ups_reached(void *ud) {
  up_count *u = ud;
  return u->n->ups >= u->want;
}

static bool verdicts_reached(void *ud) {
  up_count *u = ud;
  return u->n->verdicts >= u->want;
}

/* A free loopback port that nobody listens on. */
static uint16_t dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd); /* bound, never listened: connections are refused */
  return ntohs(sa.sin_port);
}

/* Node a connects to b and c; returns once a has its verdict. */
static void trio(uv_loop_t *loop, rnode *a, rnode *b, rnode *c, const gw_addr *mapped) {
  uv_loop_init(loop);
  rn_start(a, loop, "127.0.0.1:0", 0);
  rn_start(b, loop, "127.0.0.1:0", 0);
  rn_start(c, loop, "127.0.0.1:0", 0);
  if (mapped) p2p_host_recheck_reachability(a->h, mapped);
  gw_addr ba = rn_addr(b), ca = rn_addr(c);
  assert_int_equal(p2p_host_connect(a->h, &ba, &b->id.id), 0);
  assert_int_equal(p2p_host_connect(a->h, &ca, &c->id.id), 0);
  up_count u = {a, 2};
  assert_true(run_until(loop, ups_reached, &u, WAIT_MS));
  assert_true(run_until(loop, has_verdict, a, WAIT_MS));
}

static void trio_stop(uv_loop_t *loop, rnode *a, rnode *b, rnode *c) {
  rn_stop(a);
  rn_stop(b);
  rn_stop(c);
  drain_loop(loop);
}

static void test_loopback_public(void **state) {
  (void)state;
  uv_loop_t loop;
  rnode a, b, c;
  trio(&loop, &a, &b, &c, NULL);
  gw_addr me = rn_addr(&a);
  assert_int_equal(a.last.status, P2P_REACH_PUBLIC);
  assert_int_equal(a.last.checked_by, 2);
  assert_true(gw_addr_eq(&a.last.addr, &me));
  char line[96], as[GW_ADDR_STRLEN];
  gw_addr_format(&me, as);
  snprintf(line, sizeof(line), "status=public addr=%s checked_by=2", as);
  assert_int_equal(logrec_count(&rec, "nat.reachability", line), 1);
  p2p_reachability got;
  p2p_host_reachability(a.h, &got);
  assert_int_equal(got.status, P2P_REACH_PUBLIC);
  /* The dial-backs were not sessions: b and c each saw one peer (a), a saw
   * two, nobody saw a peer go away, and a's real sessions still work. */
  assert_int_equal(a.ups, 2);
  assert_int_equal(b.ups, 1);
  assert_int_equal(c.ups, 1);
  assert_int_equal(a.downs + b.downs + c.downs, 0);
  assert_true(p2p_host_is_connected(a.h, &b.id.id));
  assert_true(p2p_host_is_connected(b.h, &a.id.id));
  assert_true(p2p_host_is_connected(c.h, &a.id.id));
  /* Both peers told a where they see it: 127.0.0.1. */
  gw_addr obs;
  assert_int_equal(p2p_host_observed_addr(a.h, &obs), 0);
  assert_true(gw_addr_same_ip(&obs, &me));
  trio_stop(&loop, &a, &b, &c);
}

static void test_loopback_private(void **state) {
  (void)state;
  uv_loop_t loop;
  rnode a, b, c;
  /* A "mapping" to a port nobody listens on: what a router without a
   * forwarded port looks like from outside. */
  char ms[32];
  snprintf(ms, sizeof(ms), "127.0.0.1:%u", (unsigned)dead_port());
  gw_addr mapped = addr_of_str(ms);
  size_t advice = logrec_count(&rec, "nat.advice", NULL);
  trio(&loop, &a, &b, &c, &mapped);
  assert_int_equal(a.last.status, P2P_REACH_PRIVATE);
  assert_int_equal(a.last.checked_by, 2);
  assert_true(gw_addr_eq(&a.last.addr, &mapped));
  char line[96];
  snprintf(line, sizeof(line), "status=private addr=%s checked_by=2", ms);
  assert_int_equal(logrec_count(&rec, "nat.reachability", line), 1);
  char port[32];
  snprintf(port, sizeof(port), "forward TCP and UDP port %u", (unsigned)mapped.port);
  assert_int_equal(logrec_count(&rec, "nat.advice", port), 1);
  assert_int_equal(logrec_count(&rec, "nat.advice", NULL), advice + 1);
  assert_int_equal(a.downs + b.downs + c.downs, 0);
  /* The mapping goes away: back to the listen port, which works. */
  up_count more = {&a, a.verdicts + 1};
  p2p_host_recheck_reachability(a.h, NULL);
  assert_true(run_until(&loop, verdicts_reached, &more, WAIT_MS));
  assert_int_equal(a.last.status, P2P_REACH_PUBLIC);
  gw_addr me = rn_addr(&a);
  assert_true(gw_addr_eq(&a.last.addr, &me));
  trio_stop(&loop, &a, &b, &c);
}

/* ================= hostile peers against a host in another thread ================= */

typedef struct served {
  p2ptest_served t; /* first */
  rnode p;
  uint32_t dial_back_timeout_ms;
} served;

static void served_start(p2ptest_served *t) {
  served *s = (served *)t;
  rn_start(&s->p, &t->loop, "127.0.0.1:0", s->dial_back_timeout_ms);
}

static served *serve(uint32_t dial_back_timeout_ms) {
  served *s = calloc(1, sizeof(*s));
  s->dial_back_timeout_ms = dial_back_timeout_ms;
  p2ptest_serve(&s->t, served_start);
  return s;
}

/* Joins the thread (unless the caller did), closes the host, frees s. */
static void serve_end(served *s, bool joined) {
  if (!joined) p2ptest_serve_join(&s->t);
  rn_stop(&s->p);
  p2ptest_serve_free(&s->t);
  free(s);
}

/* Reads frames until one of type `want` arrives (others are skipped);
 * copies its body. 0, or an error. */
static int raw_recv_msg(rawpeer *r, uint32_t want, uint8_t *body, size_t *body_len, int timeout_ms) {
  uint64_t deadline = gw_clock_mono_ms() + (uint64_t)timeout_ms;
  for (;;) {
    int left = (int)(deadline - gw_clock_mono_ms());
    if (left <= 0) return GW_ETIMEDOUT;
    uint8_t lb[4];
    int rc = rawpeer_recv(r, lb, 4, left);
    if (rc != 0) return rc;
    uint32_t len = (uint32_t)lb[0] << 24 | (uint32_t)lb[1] << 16 | (uint32_t)lb[2] << 8 | lb[3];
    if (len > 65536) return GW_ERANGE;
    uint8_t *buf = malloc(len);
    if ((rc = rawpeer_recv(r, buf, len, left)) != 0) {
      free(buf);
      return rc;
    }
    p2p_head h;
    const char *why = NULL;
    rc = p2p_frame_open_head(&r->ch, buf, len, &r->hs.peer_id, P2P_MAX_FRAME_DEFAULT, &h, &why);
    if (rc != 0) {
      free(buf);
      return rc;
    }
    bool hit = h.env->type == want;
    if (hit) {
      *body_len = h.env->body.len;
      memcpy(body, h.env->body.data, h.env->body.len);
    }
    p2p_head_clear(&h);
    free(buf);
    if (hit) return 0;
  }
}

/* A hand-written peer with a session to the served host: handshake, Hello. */
static void raw_session(rawpeer *r, const served *s, const gw_addr *observed_claim) {
  gw_addr pa = rn_addr(&s->p);
  assert_int_equal(rawpeer_connect(r, &pa), 0);
  assert_int_equal(rawpeer_handshake(r, &s->p.id.id), 0);
  Gwtf__Hello h = GWTF__HELLO__INIT;
  h.instance = 42;
  h.max_frame = P2P_MAX_FRAME_DEFAULT;
  h.agent = "rawpeer";
  if (observed_claim) {
    h.observed_ip = (ProtobufCBinaryData){4, (uint8_t *)observed_claim->ip};
    h.observed_port = observed_claim->port;
  }
  uint8_t body[128];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_HELLO, .body = body, .body_len = gwtf__hello__pack(&h, body)};
  assert_int_equal(rawpeer_send_msg(r, &m), 0);
}

/* Sends a DialBackRequest; `extra` bytes are appended to the body (fields
 * the schema does not have, as an attacker would add them). */
static void raw_request(rawpeer *r, uint32_t port, uint64_t nonce, const uint8_t *extra, size_t extra_len) {
  Gwtf__DialBackRequest rq = GWTF__DIAL_BACK_REQUEST__INIT;
  rq.port = port;
  rq.nonce = nonce;
  uint8_t body[128];
  size_t n = gwtf__dial_back_request__pack(&rq, body);
  if (extra_len) memcpy(body + n, extra, extra_len);
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_DIAL_BACK, .body = body, .body_len = n + extra_len};
  assert_int_equal(rawpeer_send_msg(r, &m), 0);
}

static Gwtf__DialBackResult *raw_result(rawpeer *r) {
  uint8_t body[256];
  size_t len = 0;
  assert_int_equal(raw_recv_msg(r, GWTF__MSG_TYPE__MSG_DIAL_BACK_RESULT, body, &len, WAIT_MS), 0);
  Gwtf__DialBackResult *res = gwtf__dial_back_result__unpack(NULL, len, body);
  assert_non_null(res);
  return res;
}

static int listen_on(const char *ip, uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(*port)};
  inet_pton(AF_INET, ip, &sa.sin_addr);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 8) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, (struct sockaddr *)&sa, &len);
  *port = ntohs(sa.sin_port);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

static void test_forged_requests(void **state) {
  (void)state;
  served *s = serve(1000);

  /* 1. A request cannot name an IP. An attacker adds one anyway (field 3,
   * 127.0.0.2) and asks for a port that is open only on 127.0.0.2: the
   * prober dials the IP the attacker's session comes from (127.0.0.1),
   * which refuses, and the third party never sees a connection. */
  uint16_t q = 0;
  int third = listen_on("127.0.0.2", &q);
  if (third < 0) {
    print_message("127.0.0.2 not available: skipping the third-party part\n");
  } else {
    rawpeer r;
    raw_session(&r, s, NULL);
    static const uint8_t ip_field[] = {0x1a, 4, 127, 0, 0, 2, 0x20, 0x01}; /* bytes 3 = IP, 4 = 1 */
    raw_request(&r, q, 77, ip_field, sizeof(ip_field));
    Gwtf__DialBackResult *res = raw_result(&r);
    assert_int_equal(res->nonce, 77);
    assert_int_equal(res->status, GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED);
    assert_int_equal(res->dialled_ip.len, 4);
    static const uint8_t lo[4] = {127, 0, 0, 1};
    assert_memory_equal(res->dialled_ip.data, lo, 4);
    assert_int_equal(res->dialled_port, q);
    gwtf__dial_back_result__free_unpacked(res, NULL);
    /* The result came after the dial ended: had it gone to 127.0.0.2, the
     * connection would be waiting here now. */
    int fd = accept(third, NULL, NULL);
    assert_true(fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    close(third);
    rawpeer_close(&r);
  }

  /* 2. The port of another node: the prober's handshake expects the
   * requester's node ID, so another process answering is a failure. */
  served *other = serve(0);
  rawpeer r2;
  raw_session(&r2, s, NULL);
  size_t unexpected = logrec_count(&rec, "session.rejected", "reason=unexpected-id");
  raw_request(&r2, rn_addr(&other->p).port, 78, NULL, 0);
  Gwtf__DialBackResult *res2 = raw_result(&r2);
  assert_int_equal(res2->nonce, 78);
  assert_int_equal(res2->status, GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED);
  gwtf__dial_back_result__free_unpacked(res2, NULL);
  assert_int_equal(logrec_count(&rec, "session.rejected", "reason=unexpected-id"), unexpected + 1);
  rawpeer_close(&r2);
  p2ptest_serve_join(&other->t);
  assert_int_equal(other->p.ups, 0); /* it never had a session */
  serve_end(other, true);

  /* 3. Rate limit per requester: a burst of requests, then refusals. */
  rawpeer r3;
  raw_session(&r3, s, NULL);
  uint16_t dead = dead_port();
  int failed = 0, refused = 0;
  for (int i = 0; i < P2P_REACH_SERVE_BURST + 2; i++) {
    raw_request(&r3, dead, 100 + (uint64_t)i, NULL, 0);
    Gwtf__DialBackResult *res = raw_result(&r3);
    assert_int_equal(res->nonce, 100 + (uint64_t)i);
    failed += res->status == GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED;
    refused += res->status == GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED;
    gwtf__dial_back_result__free_unpacked(res, NULL);
  }
  assert_int_equal(failed, P2P_REACH_SERVE_BURST);
  assert_int_equal(refused, 2);
  assert_true(logrec_count(&rec, "nat.dial_back_refused", "reason=rate-limit-peer") >= 2);
  /* Port 0 and garbage bodies: refused or ignored, and the session lives on. */
  raw_request(&r3, 0, 200, NULL, 0);
  Gwtf__DialBackResult *res3 = raw_result(&r3);
  assert_int_equal(res3->status, GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED);
  gwtf__dial_back_result__free_unpacked(res3, NULL);
  rawpeer_close(&r3);

  serve_end(s, false);
}

/* Two hand-written peers that answer "ok" with the right nonce but never
 * dial back, and one of them claims we are at another address: the host
 * learns nothing from them. */
static void test_lying_probers(void **state) {
  (void)state;
  served *s = serve(200); /* results are waited for 2 x 200 ms + 3 s */
  gw_addr spoof = addr_of_str("192.0.2.66:4444");
  rawpeer r1, r2;
  size_t conn_before = logrec_count(&rec, "peer.connected", "agent=rawpeer");
  raw_session(&r1, s, &spoof);
  /* An unsolicited result before anything was asked. */
  Gwtf__DialBackResult forged = GWTF__DIAL_BACK_RESULT__INIT;
  forged.nonce = 1;
  forged.status = GWTF__DIAL_BACK_STATUS__DIAL_BACK_OK;
  uint8_t body[64];
  p2p_msg fm = {.type = GWTF__MSG_TYPE__MSG_DIAL_BACK_RESULT, .body = body,
                .body_len = gwtf__dial_back_result__pack(&forged, body)};
  assert_int_equal(rawpeer_send_msg(&r1, &fm), 0);
  raw_session(&r2, s, NULL);
  assert_true(logrec_wait(&rec, "peer.connected", "agent=rawpeer", conn_before + 2, WAIT_MS));
  /* Both are asked to dial back; both lie. */
  rawpeer *rs[2] = {&r1, &r2};
  for (int i = 0; i < 2; i++) {
    uint8_t rb[64];
    size_t rl = 0;
    assert_int_equal(raw_recv_msg(rs[i], GWTF__MSG_TYPE__MSG_DIAL_BACK, rb, &rl, WAIT_MS), 0);
    Gwtf__DialBackRequest *rq = gwtf__dial_back_request__unpack(NULL, rl, rb);
    assert_non_null(rq);
    assert_int_equal(rq->port, rn_addr(&s->p).port);
    Gwtf__DialBackResult lie = GWTF__DIAL_BACK_RESULT__INIT;
    lie.nonce = rq->nonce;
    lie.status = GWTF__DIAL_BACK_STATUS__DIAL_BACK_OK;
    static const uint8_t lo[4] = {127, 0, 0, 1};
    lie.dialled_ip = (ProtobufCBinaryData){4, (uint8_t *)lo};
    lie.dialled_port = rq->port;
    gwtf__dial_back_request__free_unpacked(rq, NULL);
    p2p_msg lm = {.type = GWTF__MSG_TYPE__MSG_DIAL_BACK_RESULT, .body = body,
                  .body_len = gwtf__dial_back_result__pack(&lie, body)};
    assert_int_equal(rawpeer_send_msg(rs[i], &lm), 0);
  }
  /* Their time runs out without a connection from them: no verdict. */
  size_t timeouts = logrec_count(&rec, "nat.dial_back_timeout", "said_ok=1");
  assert_true(logrec_wait(&rec, "nat.dial_back_timeout", "said_ok=1", timeouts + 2, WAIT_MS));
  assert_true(logrec_count(&rec, "nat.dial_back_ignored", NULL) >= 1); /* the unsolicited one */
  p2ptest_serve_join(&s->t);
  assert_int_equal(s->p.verdicts, 0);
  p2p_reachability got;
  p2p_host_reachability(s->p.h, &got);
  assert_int_equal(got.status, P2P_REACH_UNKNOWN);
  gw_addr obs;
  assert_int_equal(p2p_host_observed_addr(s->p.h, &obs), GW_ENOENT); /* one claim, one silence */
  rawpeer_close(&r1);
  rawpeer_close(&r2);
  serve_end(s, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sm_public_needs_two),   cmocka_unit_test(test_sm_ok_without_connection),
      cmocka_unit_test(test_sm_private_and_more_peers), cmocka_unit_test(test_sm_observed_needs_two),
      cmocka_unit_test(test_sm_not_listening),      cmocka_unit_test(test_sm_rate_limits),
      cmocka_unit_test(test_loopback_public),       cmocka_unit_test(test_loopback_private),
      cmocka_unit_test(test_forged_requests),       cmocka_unit_test(test_lying_probers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
