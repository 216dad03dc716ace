/* Unit tests for p2p/host and p2p/session on a real libuv loop over
 * loopback: sessions, messages with tensors, RTT, backpressure, one session
 * per pair, reconnects, and hostile bytes from a hand-written peer. */
#include "testutil.h"

#include <sys/wait.h>

#include "p2p/host.h"
#include "p2ptest.h"

#define WAIT_MS (10000)
#define APP_TYPE (300) /* a training-range message */

typedef struct tnode {
  const char *name;
  p2p_identity id;
  p2p_host *h;
  gw_log log;
  int ups, backs, downs_left, downs_lost, msgs, writable;
  gw_peer last_up;
  uint32_t last_type;
  uint64_t last_request;
  size_t last_len;
  uint8_t *kept; /* a payload taken with p2p_msg_keep */
  bool last_ok;  /* payload matched the pattern */
} tnode;

static logrec rec;

static int setup(void **state) { return (void)state, p2ptest_setup(&rec); }
static int teardown(void **state) { return (void)state, p2ptest_teardown(&rec); }

static void on_up(void *ud, const gw_peer *peer, bool back) {
  tnode *n = ud;
  n->ups++;
  n->backs += back;
  n->last_up = *peer;
}

static void on_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  tnode *n = ud;
  (void)id;
  if (reason == P2P_DOWN_LEFT)
    n->downs_left++;
  else
    n->downs_lost++;
}

static uint8_t pattern(size_t i) { return (uint8_t)(i * 7 + 3); }

static void on_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  tnode *n = ud;
  (void)from;
  n->msgs++;
  n->last_type = msg->type;
  n->last_request = msg->request_id;
  n->last_len = msg->data_len;
  n->last_ok = true;
  for (size_t i = 0; i < msg->data_len; i++)
    if (msg->data[i] != pattern(i)) n->last_ok = false;
  if (msg->data_len && !n->kept) {
    n->kept = p2p_msg_keep(msg); /* the buffer is ours now; data stays valid */
    n->last_ok = n->last_ok && n->kept && ((uintptr_t)msg->data % P2P_PAYLOAD_ALIGN) == 0;
  }
}

static void on_writable(void *ud, const gw_id *id) {
  tnode *n = ud;
  (void)id;
  n->writable++;
}

/* A host on 127.0.0.1 (port 0: any) with short timers for tests. */
static void node_start(tnode *n, uv_loop_t *loop, const char *name, uint16_t port, const p2p_identity *id) {
  memset(n, 0, sizeof(*n));
  n->name = name;
  p2p_host_config hc;
  p2ptest_host_config(&hc, &n->id, id, &n->log, &rec);
  char addr[32];
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)port);
  gw_addr_parse(addr, &hc.listen);
  hc.ping_interval_ms = 100;
  hc.handshake_timeout_ms = 2000; /* 400 timed out under valgrind, whose crypto is ~30x slower */
  hc.low_water = 64 << 10;
  hc.max_frame = 4 << 20;
  hc.agent = name;
  p2p_host_cbs cbs = {.ud = n, .peer_up = on_up, .peer_down = on_down, .message = on_msg, .writable = on_writable};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &n->h), 0);
}

static void node_stop(tnode *n) {
  if (n->h) p2p_host_close(n->h, NULL, NULL);
  n->h = NULL;
  free(n->kept);
  n->kept = NULL;
}

static gw_addr addr_of(const tnode *n) { return p2p_host_listen_addr(n->h); }

typedef struct two {
  tnode *a, *b;
  int want;
} two;

static bool both_up(void *ud) {
  two *t = ud;
  return t->a->ups >= t->want && t->b->ups >= t->want;
}

static void connect_ab(uv_loop_t *loop, tnode *a, tnode *b) {
  gw_addr aa = addr_of(a);
  assert_int_equal(p2p_host_connect(b->h, &aa, &a->id.id), 0);
  two t = {a, b, (a->ups > b->ups ? a->ups : b->ups) + 1};
  assert_true(run_until(loop, both_up, &t, WAIT_MS));
}

/* Two hosts on a fresh loop, b connected to a. */
static void start_pair(uv_loop_t *loop, tnode *a, tnode *b) {
  uv_loop_init(loop);
  node_start(a, loop, "a", 0, NULL);
  node_start(b, loop, "b", 0, NULL);
  connect_ab(loop, a, b);
}

static bool got_msg(void *ud) { return ((tnode *)ud)->msgs > 0; }
static bool got_left(void *ud) { return ((tnode *)ud)->downs_left > 0; }
static bool got_writable(void *ud) { return ((tnode *)ud)->writable > 0; }

typedef struct rtt_wait {
  tnode *n;
  const gw_id *peer;
} rtt_wait;

static bool has_rtt(void *ud) {
  rtt_wait *w = ud;
  p2p_peer_stats st;
  return p2p_host_peer_stats(w->n->h, w->peer, &st) == 0 && st.rtt_samples >= 3;
}

typedef struct rtt_wait_more {
  tnode *n;
  const gw_id *peer;
  uint64_t samples;
} rtt_wait_more;

static bool has_more_rtt(void *ud) {
  rtt_wait_more *w = ud;
  p2p_peer_stats st;
  return p2p_host_peer_stats(w->n->h, w->peer, &st) == 0 && st.rtt_samples > w->samples;
}

static void test_connect_and_exchange(void **state) {
  (void)state;
  uv_loop_t loop;
  tnode a, b;
  start_pair(&loop, &a, &b);
  assert_int_equal(a.ups, 1);
  assert_int_equal(b.ups, 1);
  assert_int_equal(a.backs, 0);
  /* A learned where B listens (its Hello), not just B's ephemeral port. */
  gw_addr ba = addr_of(&b);
  assert_true(gw_id_eq(&a.last_up.id, &b.id.id));
  assert_true(gw_addr_eq(&a.last_up.addr, &ba));
  assert_true(p2p_host_is_connected(a.h, &b.id.id));

  /* A tensor frame B -> A, checked byte for byte, kept without a copy. */
  size_t n = 1 << 20;
  uint8_t *data = malloc(n);
  for (size_t i = 0; i < n; i++) data[i] = pattern(i);
  p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 2, .shape = {512, 512}};
  p2p_msg m = {.type = APP_TYPE, .request_id = 77, .body = (const uint8_t *)"act", .body_len = 3, .tensor = &t,
               .data = data, .data_len = n};
  assert_int_equal(p2p_host_send(b.h, &a.id.id, &m), 0);
  assert_true(p2p_host_queued(b.h, &a.id.id) > 0); /* sealed and queued before the loop runs */
  memset(data, 0, n); /* the caller may reuse its buffer at once */
  assert_true(run_until(&loop, got_msg, &a, WAIT_MS));
  assert_int_equal(a.last_type, APP_TYPE);
  assert_int_equal(a.last_request, 77);
  assert_int_equal(a.last_len, n);
  assert_true(a.last_ok);
  assert_non_null(a.kept);

  /* RTT: pings every 100 ms. */
  rtt_wait w = {&b, &a.id.id};
  assert_true(run_until(&loop, has_rtt, &w, WAIT_MS));
  p2p_peer_stats st;
  assert_int_equal(p2p_host_peer_stats(b.h, &a.id.id, &st), 0);
  assert_true(st.connected);
  assert_true(st.rtt_ms > 0 && st.rtt_ms < 1000);
  assert_true(st.rtt_min_ms <= st.rtt_ms + 1e-9);
  assert_true(st.frames_tx >= 2 && st.bytes_tx > n);
  assert_true(st.tx_Bps > 0); /* a 1 MiB frame gave a throughput sample */
  assert_true(logrec_count(&rec, "peer.rtt", NULL) > 0);
  assert_true(st.rttvar_ms >= 0 && st.rttvar_ms < 1000);

  /* A ping on demand (train/peer_liveness.c's probe): one more RTT sample
   * and bytes back from the peer; nobody to ping without a session. */
  uint64_t samples = st.rtt_samples, rx = st.bytes_rx, frames = st.frames_tx + st.queued_frames;
  assert_int_equal(p2p_host_ping(b.h, &a.id.id), 0);
  assert_int_equal(p2p_host_peer_stats(b.h, &a.id.id, &st), 0);
  assert_int_equal(st.frames_tx + st.queued_frames, frames + 1); /* sealed now, not at the next keepalive */
  rtt_wait_more more = {&b, &a.id.id, samples};
  assert_true(run_until(&loop, has_more_rtt, &more, WAIT_MS));
  assert_int_equal(p2p_host_peer_stats(b.h, &a.id.id, &st), 0);
  assert_true(st.bytes_rx > rx);
  gw_id no_one = {{2}};
  assert_int_equal(p2p_host_ping(b.h, &no_one), GW_ENOENT);

  /* Sends the host refuses. */
  gw_id nobody = {{1}};
  assert_int_equal(p2p_host_send(b.h, &nobody, &m), GW_ENOENT);
  p2p_msg ping = {.type = GWTF__MSG_TYPE__MSG_PING};
  assert_int_equal(p2p_host_send(b.h, &a.id.id, &ping), GW_EINVAL);
  p2p_tensor bad = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 1, .shape = {3}};
  p2p_msg badm = {.type = APP_TYPE, .tensor = &bad, .data = data, .data_len = 5};
  assert_int_equal(p2p_host_send(b.h, &a.id.id, &badm), GW_EINVAL);
  p2p_msg huge = {.type = APP_TYPE, .data = data, .data_len = 5 << 20};
  uint8_t *hd = calloc(1, huge.data_len);
  huge.data = hd;
  assert_int_equal(p2p_host_send(b.h, &a.id.id, &huge), GW_ERANGE); /* over A's 4 MiB */
  free(hd);

  /* Backpressure: fill B's queue past low water, then wait for writable. */
  m.tensor = NULL;
  for (int i = 0; i < 4; i++) assert_int_equal(p2p_host_send(b.h, &a.id.id, &m), 0);
  assert_true(p2p_host_queued(b.h, &a.id.id) > (64u << 10));
  b.writable = 0;
  assert_true(run_until(&loop, got_writable, &b, WAIT_MS));
  assert_true(p2p_host_queued(b.h, &a.id.id) <= (64u << 10));

  /* B leaves A: A hears a goodbye (left), B reports its own disconnect. */
  assert_int_equal(p2p_host_disconnect(b.h, &a.id.id), 0);
  assert_true(run_until(&loop, got_left, &a, WAIT_MS));
  assert_true(run_until(&loop, got_left, &b, WAIT_MS));
  assert_int_equal(a.downs_lost, 0);
  assert_true(logrec_count(&rec, "peer.left", NULL) > 0);
  free(data);
  node_stop(&a);
  node_stop(&b);
  drain_loop(&loop);
}

static bool dial_failed(void *ud) { return logrec_count(&rec, "peer.dial_failed", ud) > 0; }

static void test_wrong_expected_key(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tnode a, c;
  p2p_identity someone;
  p2p_identity_generate(&someone);
  node_start(&a, &loop, "a", 0, NULL);
  node_start(&c, &loop, "c", 0, NULL);
  size_t rejected = logrec_count(&rec, "session.rejected", "reason=unexpected-id");
  gw_addr aa = addr_of(&a);
  assert_int_equal(p2p_host_connect(c.h, &aa, &someone.id), 0);
  assert_true(run_until(&loop, dial_failed, "reason=unexpected-id", WAIT_MS));
  assert_int_equal(logrec_count(&rec, "session.rejected", "reason=unexpected-id"), rejected + 1);
  assert_int_equal(c.ups, 0);
  assert_int_equal(a.ups, 0);
  assert_false(p2p_host_is_connected(c.h, &a.id.id));
  node_stop(&a);
  node_stop(&c);
  drain_loop(&loop);
}

typedef struct settle {
  tnode *a, *b;
} settle;

static bool one_session_each(void *ud) {
  settle *s = ud;
  return s->a->ups == 1 && s->b->ups == 1 && p2p_host_session_count(s->a->h) == 1 &&
         p2p_host_session_count(s->b->h) == 1;
}

/* Both dial at once: each ends with one session, the same one, and the
 * upper layers saw exactly one peer_up and no peer_down. */
static void test_simultaneous_dial(void **state) {
  (void)state;
  for (int round = 0; round < 6; round++) {
    uv_loop_t loop;
    uv_loop_init(&loop);
    tnode a, b;
    node_start(&a, &loop, "a", 0, NULL);
    node_start(&b, &loop, "b", 0, NULL);
    gw_addr aa = addr_of(&a), ba = addr_of(&b);
    assert_int_equal(p2p_host_connect(a.h, &ba, round % 2 ? &b.id.id : NULL), 0);
    assert_int_equal(p2p_host_connect(b.h, &aa, NULL), 0);
    settle s = {&a, &b};
    assert_true(run_until(&loop, one_session_each, &s, WAIT_MS));
    /* Messages flow both ways on the surviving session. */
    p2p_msg m = {.type = APP_TYPE, .request_id = 5};
    assert_int_equal(p2p_host_send(a.h, &b.id.id, &m), 0);
    assert_int_equal(p2p_host_send(b.h, &a.id.id, &m), 0);
    assert_true(run_until(&loop, got_msg, &a, WAIT_MS));
    assert_true(run_until(&loop, got_msg, &b, WAIT_MS));
    assert_int_equal(a.downs_lost + a.downs_left, 0);
    assert_int_equal(b.downs_lost + b.downs_left, 0);
    assert_int_equal(a.ups, 1);
    assert_int_equal(b.ups, 1);
    node_stop(&a);
    node_stop(&b);
    drain_loop(&loop);
  }
}

static bool got_back(void *ud) { return ((tnode *)ud)->backs > 0; }

/* A leaves cleanly; B keeps redialling with backoff; A comes back with the
 * same identity on the same port; B reports it back. */
static void test_reconnect_after_leave(void **state) {
  (void)state;
  uv_loop_t loop;
  tnode a, b;
  start_pair(&loop, &a, &b);
  uint16_t port = addr_of(&a).port;
  p2p_identity ida = a.id;
  node_stop(&a);
  assert_true(run_until(&loop, got_left, &b, WAIT_MS));
  size_t fails = logrec_count(&rec, "peer.dial_failed", NULL);
  /* Let B fail at least twice (nobody listens), proving it keeps trying. */
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  while (logrec_count(&rec, "peer.dial_failed", NULL) < fails + 2 && gw_clock_mono_ms() < deadline)
    uv_run(&loop, UV_RUN_ONCE);
  assert_true(logrec_count(&rec, "peer.dial_failed", NULL) >= fails + 2);
  node_start(&a, &loop, "a2", port, &ida);
  assert_true(run_until(&loop, got_back, &b, WAIT_MS));
  assert_true(p2p_host_is_connected(b.h, &ida.id));
  assert_true(logrec_count(&rec, "peer.back", NULL) > 0);
  node_stop(&a);
  node_stop(&b);
  drain_loop(&loop);
}

/* A node that restarted with a fresh identity on its old port is named at
 * that address under both IDs while directories keep its old record. The
 * dials for the old ID fail (unexpected-id); those for the live one must
 * not be stopped by them. With one target per address, whose expectation
 * each call overwrote, the interleaving below (a refresh that names the
 * live ID, then the stale one again) kept every redial expecting the
 * stale ID: c never reached a. */
static bool c_up(void *ud) { return ((tnode *)ud)->ups > 0; }

/* The shortest retry_ms of the unexpected-id dial failures logged since
 * line `from` (UINT32_MAX: none). */
static unsigned min_stale_retry_ms(size_t from) {
  unsigned best = UINT32_MAX;
  for (size_t i = from; i < rec.n; i++) {
    const char *r = strstr(rec.lines[i], "retry_ms=");
    unsigned ms;
    if (strncmp(rec.lines[i], "peer.dial_failed\t", 17) == 0 && strstr(rec.lines[i], "reason=unexpected-id") && r &&
        sscanf(r, "retry_ms=%u", &ms) == 1 && ms < best)
      best = ms;
  }
  return best;
}

static void test_old_and_new_identity_at_one_address(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tnode a, c;
  p2p_identity gone;
  p2p_identity_generate(&gone);
  node_start(&a, &loop, "a", 0, NULL);
  node_start(&c, &loop, "c", 0, NULL);
  gw_addr aa = addr_of(&a);
  size_t from = rec.n;
  assert_int_equal(p2p_host_connect(c.h, &aa, &gone.id), 0);
  assert_int_equal(p2p_host_connect(c.h, &aa, &a.id.id), 0);
  assert_int_equal(p2p_host_connect(c.h, &aa, &gone.id), 0);
  assert_true(run_until(&loop, c_up, &c, WAIT_MS));
  assert_true(p2p_host_is_connected(c.h, &a.id.id));
  assert_true(run_until(&loop, dial_failed, "reason=unexpected-id", WAIT_MS));
  /* Someone else answering for the old ID sends it to the slowest retry
   * (backoff_max 400 ms, jittered to 200..400) at once, not after doublings. */
  unsigned retry = min_stale_retry_ms(from);
  assert_true(retry >= 200 && retry <= 400);
  /* Forgetting the old ID leaves the live one's redials alone: a leaves
   * and comes back on its port, and c dials it again. */
  p2p_host_forget(c.h, &aa, &gone.id);
  p2p_identity ida = a.id;
  node_stop(&a);
  assert_true(run_until(&loop, got_left, &c, WAIT_MS));
  node_start(&a, &loop, "a2", aa.port, &ida);
  assert_true(run_until(&loop, got_back, &c, WAIT_MS));
  assert_true(p2p_host_is_connected(c.h, &ida.id));
  node_stop(&a);
  node_stop(&c);
  drain_loop(&loop);
}

static bool got_lost(void *ud) { return ((tnode *)ud)->downs_lost > 0; }
static bool is_up(void *ud) { return ((tnode *)ud)->ups > 0; }

/* A peer process killed with SIGKILL is reported lost (not left). */
static void test_lost_on_crash(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* the victim: a host that serves until killed */
    close(fds[0]);
    uv_loop_t cl;
    uv_loop_init(&cl);
    tnode v;
    node_start(&v, &cl, "victim", 0, NULL);
    uint16_t port = addr_of(&v).port;
    char line[128];
    char hex[GW_ID_HEX_LEN + 1];
    gw_id_to_hex(&v.id.id, hex);
    int len = snprintf(line, sizeof(line), "%u %s\n", (unsigned)port, hex);
    if (write(fds[1], line, (size_t)len) != len) _exit(1);
    uv_run(&cl, UV_RUN_DEFAULT);
    _exit(0);
  }
  close(fds[1]);
  char line[128] = {0};
  ssize_t k = read(fds[0], line, sizeof(line) - 1);
  close(fds[0]);
  assert_true(k > 0);
  unsigned port;
  char hex[GW_ID_HEX_LEN + 1];
  assert_int_equal(sscanf(line, "%u %64s", &port, hex), 2);
  gw_id vid;
  assert_int_equal(gw_id_from_hex(hex, &vid), 0);

  uv_loop_t loop;
  uv_loop_init(&loop);
  tnode b;
  node_start(&b, &loop, "b", 0, NULL);
  char as[32];
  snprintf(as, sizeof(as), "127.0.0.1:%u", port);
  gw_addr va;
  gw_addr_parse(as, &va);
  assert_int_equal(p2p_host_connect(b.h, &va, &vid), 0);
  assert_true(run_until(&loop, is_up, &b, WAIT_MS));
  assert_int_equal(b.ups, 1);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  assert_true(run_until(&loop, got_lost, &b, WAIT_MS));
  assert_int_equal(b.downs_left, 0);
  assert_true(logrec_count(&rec, "peer.lost", NULL) > 0);
  node_stop(&b);
  drain_loop(&loop);
}

/* ---- hostile bytes against a host served from another thread ---- */

typedef struct served {
  p2ptest_served t; /* first */
  tnode a, good;
} served;

/* On the served thread: A, and a good peer connected to it. */
static void served_start(p2ptest_served *t) {
  served *s = (served *)t;
  node_start(&s->a, &t->loop, "a", 0, NULL);
  node_start(&s->good, &t->loop, "good", 0, NULL);
  connect_ab(&t->loop, &s->a, &s->good);
}

static size_t rejected_count(const char *reason) {
  char needle[64];
  snprintf(needle, sizeof(needle), "reason=%s ", reason);
  return logrec_count(&rec, "session.rejected", needle);
}

/* One attack: returns after A logged its rejection (one more than before)
 * and dropped us. */
static void expect_rejected(rawpeer *r, const char *reason, size_t before) {
  char needle[64];
  snprintf(needle, sizeof(needle), "reason=%s ", reason);
  assert_true(logrec_wait(&rec, "session.rejected", needle, before + 1, WAIT_MS));
  assert_int_equal(rawpeer_wait_closed(r, WAIT_MS), 0);
  rawpeer_close(r);
}

static void attack_random(const gw_addr *a) {
  rawpeer r;
  assert_int_equal(rawpeer_connect(&r, a), 0);
  uint8_t junk[P2P_HS_MSG1_BYTES];
  randombytes_buf(junk, sizeof(junk));
  size_t before = logrec_count(&rec, "session.rejected", "reason=bad-magic ");
  assert_int_equal(rawpeer_send(&r, junk, sizeof(junk)), 0);
  assert_true(logrec_wait(&rec, "session.rejected", "reason=bad-magic ", before + 1, WAIT_MS));
  assert_int_equal(rawpeer_wait_closed(&r, WAIT_MS), 0);
  rawpeer_close(&r);
}

static void attack_half_handshake(const gw_addr *a) {
  rawpeer r;
  assert_int_equal(rawpeer_connect(&r, a), 0);
  p2p_hs_init(&r.hs, P2P_INITIATOR, &r.me, NULL);
  uint8_t m1[P2P_HS_MSG1_BYTES];
  p2p_hs_start(&r.hs, m1);
  size_t before = logrec_count(&rec, "session.rejected", "reason=handshake-timeout ");
  assert_int_equal(rawpeer_send(&r, m1, sizeof(m1)), 0); /* and then nothing */
  assert_true(logrec_wait(&rec, "session.rejected", "reason=handshake-timeout ", before + 1, WAIT_MS));
  assert_int_equal(rawpeer_wait_closed(&r, WAIT_MS), 0);
  rawpeer_close(&r);
}

/* Completes the handshake and Hello, then sends what `kind` says. */
static void attack_after_auth(const gw_addr *a, const gw_id *aid, const char *kind) {
  rawpeer r;
  assert_int_equal(rawpeer_connect(&r, a), 0);
  assert_int_equal(rawpeer_handshake(&r, aid), 0);
  const char *reason = kind;
  if (!strcmp(kind, "replay") || !strcmp(kind, "reorder") || !strcmp(kind, "tamper")) reason = "auth";
  size_t before = rejected_count(reason);
  if (strcmp(kind, "expected-hello") != 0) assert_int_equal(rawpeer_send_hello(&r), 0);
  p2p_msg m1 = {.type = APP_TYPE, .body = (const uint8_t *)"one", .body_len = 3};
  p2p_msg m2 = {.type = APP_TYPE, .body = (const uint8_t *)"two", .body_len = 3};
  uint8_t *w1 = NULL, *w2 = NULL;
  size_t l1 = 0, l2 = 0;
  assert_int_equal(rawpeer_seal(&r, &m1, strcmp(kind, "sender") ? NULL : aid, &w1, &l1), 0);
  assert_int_equal(rawpeer_seal(&r, &m2, NULL, &w2, &l2), 0);
  if (!strcmp(kind, "replay")) {
    rawpeer_send(&r, w1, l1);
    rawpeer_send(&r, w1, l1);
  } else if (!strcmp(kind, "reorder")) {
    rawpeer_send(&r, w2, l2);
    rawpeer_send(&r, w1, l1);
  } else if (!strcmp(kind, "tamper")) {
    w1[l1 / 2] ^= 0x20;
    rawpeer_send(&r, w1, l1);
  } else if (!strcmp(kind, "oversize")) {
    static const uint8_t four_gib[4] = {0xff, 0xff, 0xff, 0xff};
    rawpeer_send(&r, four_gib, 4);
  } else if (!strcmp(kind, "truncated")) {
    rawpeer_send(&r, w1, l1 - 5);
    shutdown(r.fd, SHUT_WR); /* the stream ends inside the frame */
  } else { /* "sender", "expected-hello" */
    rawpeer_send(&r, w1, l1);
  }
  free(w1);
  free(w2);
  expect_rejected(&r, reason, before);
}

static bool good_msg(void *ud) { return ((served *)ud)->a.msgs > 0; }

static void test_hostile_peers(void **state) {
  (void)state;
  served *s = calloc(1, sizeof(*s));
  p2ptest_serve(&s->t, served_start);
  gw_addr a = addr_of(&s->a);
  gw_id aid = s->a.id.id;

  attack_random(&a);
  attack_half_handshake(&a);
  static const char *const kinds[] = {"replay", "reorder", "tamper", "oversize", "truncated", "sender",
                                      "expected-hello"};
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) attack_after_auth(&a, &aid, kinds[i]);
  /* A wrong key from the dialler's side: we expected someone else. */
  rawpeer r;
  assert_int_equal(rawpeer_connect(&r, &a), 0);
  gw_id wrong = {{7}};
  assert_int_equal(rawpeer_handshake(&r, &wrong), GW_EPERM);
  rawpeer_close(&r);

  p2ptest_serve_join(&s->t);
  /* The good peer never noticed: still connected, and a frame gets through. */
  assert_int_equal(s->good.downs_lost + s->good.downs_left, 0);
  /* The six attackers that authenticated first were each reported lost. */
  assert_int_equal(s->a.ups, 7);
  assert_int_equal(s->a.downs_lost, 6);
  assert_true(p2p_host_is_connected(s->a.h, &s->good.id.id));
  p2p_msg m = {.type = APP_TYPE, .request_id = 9};
  assert_int_equal(p2p_host_send(s->good.h, &aid, &m), 0);
  assert_true(run_until(&s->t.loop, good_msg, s, WAIT_MS));
  node_stop(&s->a);
  node_stop(&s->good);
  p2ptest_serve_free(&s->t);
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_connect_and_exchange), cmocka_unit_test(test_wrong_expected_key),
      cmocka_unit_test(test_old_and_new_identity_at_one_address),
      cmocka_unit_test(test_simultaneous_dial),    cmocka_unit_test(test_reconnect_after_leave),
      cmocka_unit_test(test_lost_on_crash),        cmocka_unit_test(test_hostile_peers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
