/* Unit tests for relay circuits (p2p/relay.h) on one libuv loop over
 * loopback: a dial-only node P reserves on a public node R, a dialler D
 * reaches P through R; the session is end-to-end (R holds no key, a byte R
 * flips breaks it), refusals carry reasons, limits close circuits, and a
 * relay that goes away drops the relayed session cleanly. */
#include "testutil.h"

#include <time.h>

#include "p2p/host.h"
#include "p2p/relay.h"
#include "p2ptest.h"

#define WAIT_MS (15000)
#define APP_TYPE (300)

typedef struct rnode {
  p2p_identity id;
  p2p_host *h;
  gw_log log;
  int ups, downs_left, downs_lost, msgs;
  size_t last_len;
  bool last_ok;
} rnode;

static logrec rec;

static int setup(void **state) { return (void)state, p2ptest_setup(&rec); }
static int teardown(void **state) { return (void)state, p2ptest_teardown(&rec); }

static uint8_t pat(size_t i) { return (uint8_t)(i * 13 + 5); }

static void r_up(void *ud, const gw_peer *peer, bool back) {
  (void)peer, (void)back;
  ((rnode *)ud)->ups++;
}

static void r_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  (void)id;
  rnode *n = ud;
  if (reason == P2P_DOWN_LEFT)
    n->downs_left++;
  else
    n->downs_lost++;
}

static void r_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  (void)from;
  rnode *n = ud;
  n->msgs++;
  n->last_len = msg->data_len;
  n->last_ok = true;
  for (size_t i = 0; i < msg->data_len; i++)
    if (msg->data[i] != pat(i)) n->last_ok = false;
}

/* listen: a public node (relays); else dial-only, like a node behind NAT. */
static void rstart(rnode *n, uv_loop_t *loop, bool listen, const p2p_relay_config *rc) {
  memset(n, 0, sizeof(*n));
  p2p_host_config hc;
  p2ptest_host_config(&hc, &n->id, NULL, &n->log, &rec);
  if (listen) gw_addr_parse("127.0.0.1:0", &hc.listen);
  hc.ping_interval_ms = 100;
  hc.handshake_timeout_ms = 2000;
  hc.max_frame = 4 << 20;
  hc.log_rtt = false;
  if (rc) hc.relay = *rc;
  p2p_host_cbs cbs = {.ud = n, .peer_up = r_up, .peer_down = r_down, .message = r_msg};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &n->h), 0);
}

static void rstop(rnode *n) {
  if (n->h) p2p_host_close(n->h, NULL, NULL);
  n->h = NULL;
}

static gw_addr addr_of(const rnode *n) { return p2p_host_listen_addr(n->h); }

typedef struct cond {
  rnode *n;
  int want;
  const char *event, *needle;
  size_t count;
} cond;

static bool c_ups(void *ud) { return ((cond *)ud)->n->ups >= ((cond *)ud)->want; }
static bool c_msgs(void *ud) { return ((cond *)ud)->n->msgs >= ((cond *)ud)->want; }
static bool c_lost(void *ud) { return ((cond *)ud)->n->downs_lost >= ((cond *)ud)->want; }
static bool c_down(void *ud) {
  cond *c = ud;
  return c->n->downs_lost + c->n->downs_left >= c->want;
}
static bool c_log(void *ud) {
  cond *c = ud;
  return logrec_count(&rec, c->event, c->needle) >= c->count;
}
static bool c_reserved(void *ud) {
  p2p_relay_stats st;
  p2p_host_relay_stats(((cond *)ud)->n->h, &st);
  return st.reserved_on >= 1;
}

static void wait_log(uv_loop_t *loop, const char *event, const char *needle, size_t count) {
  cond c = {.event = event, .needle = needle, .count = count};
  assert_true(run_until(loop, c_log, &c, WAIT_MS));
}

/* P reserves on R and waits for the grant. */
static void reserve(uv_loop_t *loop, rnode *p, rnode *r) {
  gw_addr ra = addr_of(r);
  assert_int_equal(p2p_host_relay_reserve(p->h, &r->id.id, &ra), 0);
  cond c = {.n = p};
  assert_true(run_until(loop, c_reserved, &c, WAIT_MS));
}

/* D reaches P through R; both see one more peer. */
static void connect_via(uv_loop_t *loop, rnode *d, rnode *r, rnode *p) {
  gw_addr ra = addr_of(r);
  int dw = d->ups + 1, pw = p->ups + 1;
  assert_int_equal(p2p_host_connect_via(d->h, &r->id.id, &ra, &p->id.id), 0);
  cond cd = {.n = d, .want = dw}, cp = {.n = p, .want = pw};
  assert_true(run_until(loop, c_ups, &cd, WAIT_MS));
  assert_true(run_until(loop, c_ups, &cp, WAIT_MS));
}

/* R public (relay config rc), P dial-only with a reservation on R, D
 * connected to P through R. */
static void trio_start(uv_loop_t *loop, rnode *r, rnode *p, rnode *d, const p2p_relay_config *rc) {
  rstart(r, loop, true, rc);
  rstart(p, loop, false, NULL);
  rstart(d, loop, false, NULL);
  reserve(loop, p, r);
  connect_via(loop, d, r, p);
}

static void trio_stop(uv_loop_t *loop, rnode *r, rnode *p, rnode *d) {
  p2p_host_disconnect(d->h, &p->id.id);
  rstop(d);
  rstop(p);
  rstop(r);
  drain_loop(loop);
}

static int send_data(rnode *from, const rnode *to, size_t n) {
  uint8_t *data = malloc(n);
  for (size_t i = 0; i < n; i++) data[i] = pat(i);
  p2p_msg m = {.type = APP_TYPE, .request_id = 1, .data = data, .data_len = n};
  int rc = p2p_host_send(from->h, &to->id.id, &m);
  free(data);
  return rc;
}

/* ---- addresses ---- */

static void test_addr(void **state) {
  (void)state;
  p2p_relay_addr a, b;
  memset(&a, 0, sizeof(a));
  for (int i = 0; i < GW_ID_BYTES; i++) {
    a.relay.b[i] = (uint8_t)i;
    a.target.b[i] = (uint8_t)(255 - i);
  }
  assert_int_equal(gw_addr_parse("203.0.113.7:4100", &a.relay_addr), 0);
  char s[P2P_RELAY_ADDR_STRLEN];
  p2p_relay_addr_format(&a, s);
  assert_non_null(strstr(s, "@203.0.113.7:4100/p2p-circuit/"));
  assert_int_equal(p2p_relay_addr_parse(s, &b), 0);
  assert_true(gw_id_eq(&a.relay, &b.relay) && gw_id_eq(&a.target, &b.target));
  assert_true(gw_addr_eq(&a.relay_addr, &b.relay_addr));
  assert_int_equal(gw_addr_parse("[2001:db8::1]:7", &a.relay_addr), 0);
  p2p_relay_addr_format(&a, s);
  assert_int_equal(p2p_relay_addr_parse(s, &b), 0);
  assert_true(gw_addr_eq(&a.relay_addr, &b.relay_addr));

  char hex[GW_ID_HEX_LEN + 1], bad[2 * P2P_RELAY_ADDR_STRLEN];
  gw_id_to_hex(&a.relay, hex);
  static const char *const bads[] = {
      "", "@1.2.3.4:5/p2p-circuit/", "%s@1.2.3.4:5/p2p-circuit/%s0", "%s@1.2.3.4:5/p2p-circuit/zz",
      "%s@1.2.3.4/p2p-circuit/%s", "%s@1.2.3.4:0/p2p-circuit/%s", "%s@/p2p-circuit/%s", "%s@1.2.3.4:5/p2p/%s",
      "%s/p2p-circuit/%s@1.2.3.4:5", "%s@host.example:5/p2p-circuit/%s",
  };
  for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(bad, sizeof(bad), bads[i], hex, hex);
#pragma GCC diagnostic pop
    assert_int_equal(p2p_relay_addr_parse(bad, &b), GW_EINVAL);
  }
  assert_int_equal(p2p_relay_addr_parse(NULL, &b), GW_EINVAL);

  /* Wire records: a preface is told apart from handshake msg1 by its magic. */
  uint8_t pre[P2P_RELAY_PREFACE_BYTES], st[P2P_RELAY_STATUS_BYTES];
  p2p_relay_preface_connect(&a.target, pre);
  assert_true(p2p_relay_is_preface(pre));
  memcpy(pre, "GWTF", 4);
  assert_false(p2p_relay_is_preface(pre));
  p2p_relay_status_record(GWTF__RELAY_STATUS__RELAY_TOO_MANY_CIRCUITS, st);
  assert_int_equal(p2p_relay_status_parse(st), GWTF__RELAY_STATUS__RELAY_TOO_MANY_CIRCUITS);
  st[0] = 'X';
  assert_int_equal(p2p_relay_status_parse(st), -1);
  assert_string_equal(p2p_relay_status_name(GWTF__RELAY_STATUS__RELAY_NO_RESERVATION), "no-reservation");
}

/* ---- a circuit end to end ---- */

static void test_circuit(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  rnode r, p, d;
  rstart(&r, &loop, true, NULL);
  rstart(&p, &loop, false, NULL);
  rstart(&d, &loop, false, NULL);
  reserve(&loop, &p, &r);
  assert_true(logrec_count(&rec, "relay.reserved", "expires_s=3600") > 0);
  size_t opened = logrec_count(&rec, "relay.circuit_open", NULL);
  connect_via(&loop, &d, &r, &p);
  assert_int_equal(logrec_count(&rec, "relay.circuit_open", NULL), opened + 1);
  assert_true(logrec_count(&rec, "peer.connected", "via=relay") >= 2);

  /* The same session on both ends; the relay holds no session with that hash. */
  p2p_peer_stats sd, sp, sr;
  assert_int_equal(p2p_host_peer_stats(d.h, &p.id.id, &sd), 0);
  assert_int_equal(p2p_host_peer_stats(p.h, &d.id.id, &sp), 0);
  assert_true(sd.connected && sp.connected && sd.relayed && sp.relayed);
  assert_memory_equal(sd.session_hash, sp.session_hash, 32);
  assert_int_equal(p2p_host_peer_stats(r.h, &d.id.id, &sr), GW_ENOENT); /* R never learned who D is */
  assert_int_equal(p2p_host_peer_stats(r.h, &p.id.id, &sr), 0);
  assert_false(sr.relayed);
  assert_memory_not_equal(sr.session_hash, sd.session_hash, 32);
  p2p_peer_stats spr;
  assert_int_equal(p2p_host_peer_stats(p.h, &r.id.id, &spr), 0);
  assert_false(spr.relayed);

  /* A message each way, a tensor-sized one byte for byte. */
  assert_int_equal(send_data(&d, &p, 300000), 0);
  assert_int_equal(send_data(&p, &d, 1000), 0);
  cond mp = {.n = &p, .want = 1}, md = {.n = &d, .want = 1};
  assert_true(run_until(&loop, c_msgs, &mp, WAIT_MS));
  assert_true(run_until(&loop, c_msgs, &md, WAIT_MS));
  assert_true(p.last_ok && p.last_len == 300000);
  assert_true(d.last_ok && d.last_len == 1000);
  p2p_relay_stats rs;
  p2p_host_relay_stats(r.h, &rs);
  assert_int_equal(rs.circuits, 1);
  assert_int_equal(rs.reservations, 1);
  assert_true(rs.bytes_relayed > 301000);

  /* Pings run through the circuit: the relayed link has a measured RTT. */
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  while (gw_clock_mono_ms() < deadline) {
    p2p_host_peer_stats(d.h, &p.id.id, &sd);
    if (sd.rtt_samples >= 2) break;
    uv_run(&loop, UV_RUN_ONCE);
  }
  assert_true(sd.rtt_samples >= 2 && sd.rtt_ms > 0);

  /* D says goodbye through the circuit: P hears "left"; R logs the close. */
  size_t closed = logrec_count(&rec, "relay.circuit_closed", NULL);
  assert_int_equal(p2p_host_disconnect(d.h, &p.id.id), 0);
  cond pd = {.n = &p, .want = 1};
  assert_true(run_until(&loop, c_down, &pd, WAIT_MS));
  assert_int_equal(p.downs_left, 1);
  wait_log(&loop, "relay.circuit_closed", "bytes=", closed + 1);
  assert_true(p2p_host_is_connected(p.h, &r.id.id)); /* the reservation's session stays */
  rstop(&d);
  rstop(&p);
  rstop(&r);
  drain_loop(&loop);
}

/* A relay that flips one byte breaks the session: P rejects the frame
 * (authentication), never delivers it, and nothing crashes. */
static void test_tamper(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  rc.test_flip_at = 150000; /* inside the 300 kB frame below, past the handshake and Hello */
  rnode r, p, d;
  trio_start(&loop, &r, &p, &d, &rc);
  size_t rejected = logrec_count(&rec, "session.rejected", "reason=auth");
  assert_int_equal(send_data(&d, &p, 300000), 0);
  wait_log(&loop, "session.rejected", "reason=auth", rejected + 1);
  cond dl = {.n = &d, .want = 1}, pl = {.n = &p, .want = 1};
  assert_true(run_until(&loop, c_down, &dl, WAIT_MS));
  assert_true(run_until(&loop, c_down, &pl, WAIT_MS));
  assert_int_equal(p.msgs, 0);
  trio_stop(&loop, &r, &p, &d); /* D stops redialling P */
}

/* ---- refusals ---- */

static void test_refusals(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  rc.max_circuits = 1;
  rc.max_reservations = 1;
  rnode r, p, p2, d, d2;
  rstart(&r, &loop, true, &rc);
  rstart(&p, &loop, false, NULL);
  rstart(&p2, &loop, false, NULL);
  rstart(&d, &loop, false, NULL);
  rstart(&d2, &loop, false, NULL);
  gw_addr ra = addr_of(&r);

  /* A target without a reservation (unknown to the relay). */
  gw_id nobody;
  randombytes_buf(nobody.b, sizeof(nobody.b));
  assert_int_equal(p2p_host_connect_via(d.h, &r.id.id, &ra, &nobody), 0);
  wait_log(&loop, "peer.dial_failed", "reason=no-reservation", 1);
  wait_log(&loop, "relay.refused", "reason=no-reservation kind=circuit", 1);
  p2p_host_disconnect(d.h, &nobody);
  assert_int_equal(d.ups, 0);

  /* Reservations beyond the limit. */
  reserve(&loop, &p, &r);
  assert_int_equal(p2p_host_relay_reserve(p2.h, &r.id.id, &ra), 0);
  wait_log(&loop, "relay.reserve_refused", "reason=too-many-reservations", 1);
  wait_log(&loop, "relay.refused", "reason=too-many-reservations kind=reservation", 1);

  /* Circuits beyond the limit: the first works, the second is refused. */
  connect_via(&loop, &d, &r, &p);
  assert_int_equal(p2p_host_connect_via(d2.h, &r.id.id, &ra, &p.id.id), 0);
  wait_log(&loop, "peer.dial_failed", "reason=too-many-circuits", 1);
  wait_log(&loop, "relay.refused", "reason=too-many-circuits", 1);
  assert_int_equal(d2.ups, 0);
  assert_true(p2p_host_is_connected(d.h, &p.id.id)); /* the open circuit is untouched */
  p2p_host_disconnect(d2.h, &p.id.id);

  /* A connect-back with a token the relay never gave. */
  rawpeer raw;
  assert_int_equal(rawpeer_connect(&raw, &ra), 0);
  uint8_t tok[P2P_RELAY_TOKEN_BYTES] = {1}, pre[P2P_RELAY_PREFACE_BYTES], st[P2P_RELAY_STATUS_BYTES];
  p2p_relay_preface_accept(tok, pre);
  assert_int_equal(rawpeer_send(&raw, pre, sizeof(pre)), 0);
  wait_log(&loop, "relay.refused", "reason=bad-token", 1);
  assert_int_equal(rawpeer_recv(&raw, st, sizeof(st), 5000), 0);
  assert_int_equal(p2p_relay_status_parse(st), GWTF__RELAY_STATUS__RELAY_BAD_TOKEN);
  rawpeer_close(&raw);

  /* A peer that does not relay says so. */
  p2p_relay_config off;
  p2p_relay_config_defaults(&off);
  off.enabled = false;
  rnode r2;
  rstart(&r2, &loop, true, &off);
  gw_addr r2a = addr_of(&r2);
  assert_int_equal(p2p_host_relay_reserve(p2.h, &r2.id.id, &r2a), 0);
  wait_log(&loop, "relay.reserve_refused", "reason=relay-off", 1);

  rnode *all[] = {&d, &d2, &p, &p2, &r, &r2};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) rstop(all[i]);
  drain_loop(&loop);
}

/* ---- limits ---- */

static void test_limits(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  rc.max_bytes = 200000;
  rc.max_bytes_per_s = 1 << 20;
  rnode r, p, d;
  trio_start(&loop, &r, &p, &d, &rc);

  /* Total bytes: a frame that would cross the limit closes the circuit. */
  assert_int_equal(send_data(&d, &p, 400000), 0);
  wait_log(&loop, "relay.circuit_closed", "reason=max-bytes", 1);
  cond dl = {.n = &d, .want = 1}, pl = {.n = &p, .want = 1};
  assert_true(run_until(&loop, c_lost, &dl, WAIT_MS));
  assert_true(run_until(&loop, c_lost, &pl, WAIT_MS));
  assert_int_equal(p.msgs, 0);
  /* D still wants P: it comes back through a fresh circuit. */
  cond db = {.n = &d, .want = 2};
  assert_true(run_until(&loop, c_ups, &db, WAIT_MS));
  p2p_host_disconnect(d.h, &p.id.id);
  cond pd = {.n = &p, .want = 2};
  assert_true(run_until(&loop, c_down, &pd, WAIT_MS));
  rstop(&d);
  rstop(&r);
  rstop(&p);
  drain_loop(&loop);

  /* Rate and lifetime: 1 MiB/s holds 600 kB back for a while (a lower
   * bound only: a slow machine only makes it longer), then the 2 s
   * lifetime ends the circuit. */
  uv_loop_init(&loop);
  p2p_relay_config_defaults(&rc);
  rc.max_bytes_per_s = 1 << 20;
  rc.circuit_lifetime_s = 2;
  trio_start(&loop, &r, &p, &d, &rc);
  uint64_t t0 = gw_clock_mono_ms();
  assert_int_equal(send_data(&d, &p, 600000), 0);
  cond mp = {.n = &p, .want = 1};
  bool got = run_until(&loop, c_msgs, &mp, WAIT_MS);
  uint64_t took = gw_clock_mono_ms() - t0;
  if (got) assert_true(took >= 250); /* burst 256 KiB, then 1 MiB/s */
  wait_log(&loop, "relay.circuit_closed", "reason=lifetime", 1);
  cond dl2 = {.n = &d, .want = 1};
  assert_true(run_until(&loop, c_down, &dl2, WAIT_MS));
  trio_stop(&loop, &r, &p, &d); /* D stops redialling P */
}

/* The relay goes away mid-circuit: both ends lose the relayed session (and
 * P its relay), nobody crashes. */
static void test_relay_gone(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  rnode r, p, d;
  trio_start(&loop, &r, &p, &d, NULL);
  assert_int_equal(send_data(&d, &p, 200000), 0); /* in flight when the relay dies */
  rstop(&r);
  cond dl = {.n = &d, .want = 1}, pl = {.n = &p, .want = 2};
  assert_true(run_until(&loop, c_down, &dl, WAIT_MS));
  assert_true(run_until(&loop, c_down, &pl, WAIT_MS)); /* D (lost) and R (left) */
  assert_int_equal(d.downs_lost, 1);
  assert_false(p2p_host_is_connected(d.h, &p.id.id));
  assert_false(p2p_host_is_connected(p.h, &d.id.id));
  assert_true(logrec_count(&rec, "relay.reservation_lost", NULL) > 0);
  p2p_host_disconnect(d.h, &p.id.id);
  rstop(&d);
  rstop(&p);
  drain_loop(&loop);
}

/* ---- figures: relayed vs direct on loopback ----
 * The relay runs on its own thread so its CPU time is its own. Prints
 * figures; asserts only that the data arrived. GWTF_RELAY_BENCH_MB sets the
 * volume (default 8 MiB, small enough for valgrind). */

typedef struct relay_thread {
  uv_loop_t loop;
  uv_async_t stop;
  rnode r;
  uv_sem_t ready;
  double cpu_s;
} relay_thread;

static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void rt_stop(uv_async_t *a) {
  relay_thread *t = a->data;
  uv_close((uv_handle_t *)a, NULL);
  rstop(&t->r);
}

static void rt_main(void *arg) {
  relay_thread *t = arg;
  uv_loop_init(&t->loop);
  uv_async_init(&t->loop, &t->stop, rt_stop);
  t->stop.data = t;
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  rc.max_bytes_per_s = 0;
  rstart(&t->r, &t->loop, true, &rc);
  uv_sem_post(&t->ready);
  double c0 = thread_cpu_s();
  uv_run(&t->loop, UV_RUN_DEFAULT);
  t->cpu_s = thread_cpu_s() - c0;
  uv_loop_close(&t->loop);
}

typedef struct xfer {
  rnode *n;
  int want;
} xfer;

static double transfer_s(uv_loop_t *loop, rnode *from, rnode *to, size_t total, size_t chunk) {
  uint64_t t0 = gw_clock_mono_ns();
  int base = to->msgs;
  size_t sent = 0;
  while (sent < total) {
    if (p2p_host_queued(from->h, &to->id.id) < (8u << 20)) {
      assert_int_equal(send_data(from, to, chunk), 0);
      sent += chunk;
    } else {
      uv_run(loop, UV_RUN_ONCE);
    }
  }
  cond c = {.n = to, .want = base + (int)(total / chunk)};
  assert_true(run_until(loop, c_msgs, &c, 120000));
  assert_true(to->last_ok);
  return (double)(gw_clock_mono_ns() - t0) / 1e9;
}

static void test_bench(void **state) {
  (void)state;
  const char *env = getenv("GWTF_RELAY_BENCH_MB");
  size_t mb = env ? (size_t)strtoul(env, NULL, 10) : 8;
  if (mb == 0) mb = 8;
  size_t chunk = 1 << 20, total = mb << 20;
  relay_thread *t = calloc(1, sizeof(*t));
  uv_sem_init(&t->ready, 0);
  uv_thread_t tid;
  uv_thread_create(&tid, rt_main, t);
  uv_sem_wait(&t->ready);

  uv_loop_t loop;
  uv_loop_init(&loop);
  rnode p, d;
  rstart(&p, &loop, true, NULL); /* listens too, for the direct comparison */
  rstart(&d, &loop, false, NULL);
  reserve(&loop, &p, &t->r);
  connect_via(&loop, &d, &t->r, &p);
  double relayed = transfer_s(&loop, &d, &p, total, chunk);
  p2p_peer_stats st;
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  do {
    uv_run(&loop, UV_RUN_ONCE);
    p2p_host_peer_stats(d.h, &p.id.id, &st);
  } while (st.rtt_samples < 5 && gw_clock_mono_ms() < deadline);
  double rtt_relayed = st.rtt_min_ms;
  p2p_relay_stats rs;
  p2p_host_relay_stats(t->r.h, &rs); /* read across threads: figures only */
  uint64_t relayed_bytes = rs.bytes_relayed;
  p2p_host_disconnect(d.h, &p.id.id);
  cond pd = {.n = &p, .want = 1};
  assert_true(run_until(&loop, c_down, &pd, WAIT_MS));

  uv_async_send(&t->stop);
  uv_thread_join(&tid);
  double relay_cpu = t->cpu_s;

  /* The same transfer over a direct session. */
  gw_addr pa = addr_of(&p);
  int dw = d.ups + 1;
  assert_int_equal(p2p_host_connect(d.h, &pa, &p.id.id), 0);
  cond cd = {.n = &d, .want = dw};
  assert_true(run_until(&loop, c_ups, &cd, WAIT_MS));
  double direct = transfer_s(&loop, &d, &p, total, chunk);
  deadline = gw_clock_mono_ms() + WAIT_MS;
  uint64_t base_samples = 0;
  p2p_host_peer_stats(d.h, &p.id.id, &st);
  base_samples = st.rtt_samples;
  do {
    uv_run(&loop, UV_RUN_ONCE);
    p2p_host_peer_stats(d.h, &p.id.id, &st);
  } while (st.rtt_samples < base_samples + 5 && gw_clock_mono_ms() < deadline);
  double rtt_direct = st.rtt_min_ms;
  assert_false(st.relayed);

  printf("relay bench (loopback, %zu MiB in 1 MiB frames): direct %.1f MB/s, relayed %.1f MB/s; "
         "min RTT direct %.3f ms, relayed %.3f ms; relay CPU %.2f ms per relayed MB (%llu bytes, %.3f s CPU)\n",
         mb, (double)total / direct / 1e6, (double)total / relayed / 1e6, rtt_direct, rtt_relayed,
         relay_cpu * 1e3 / ((double)relayed_bytes / 1e6), (unsigned long long)relayed_bytes, relay_cpu);
  rstop(&d);
  rstop(&p);
  drain_loop(&loop);
  uv_sem_destroy(&t->ready);
  free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addr),   cmocka_unit_test(test_circuit),    cmocka_unit_test(test_tamper),
      cmocka_unit_test(test_refusals), cmocka_unit_test(test_limits), cmocka_unit_test(test_relay_gone),
      cmocka_unit_test(test_bench),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
