/* Unit tests for hole punching (p2p/punch.h) on one libuv loop over
 * loopback: D (with a listener, but P does not know it) reaches the
 * dial-only P through the relay R; the punch moves the session to a direct
 * connection while both ends keep sending, and every message arrives
 * exactly once and in order, with no peer_down/peer_up. A punch that
 * cannot succeed leaves the session relayed and says why. */
#include "testutil.h"

#include "p2p/host.h"
#include "p2p/punch.h"
#include "p2p/relay.h"
#include "p2ptest.h"

#define WAIT_MS (20000)
#define APP_TYPE (300)
#define MSG_BYTES (16 << 10)

typedef struct pnode {
  p2p_identity id;
  p2p_host *h;
  gw_log log;
  int ups, downs;
  uint64_t next_rx;  /* the sequence number expected next */
  uint64_t disorder; /* messages out of order, duplicated or missing */
  uint64_t sent;
} pnode;

static logrec rec;

static int setup(void **state) {
  (void)state;
  return p2ptest_setup(&rec);
}

static int teardown(void **state) {
  (void)state;
  return p2ptest_teardown(&rec);
}

static void n_up(void *ud, const gw_peer *peer, bool back) {
  (void)peer, (void)back;
  ((pnode *)ud)->ups++;
}

static void n_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  (void)id, (void)reason;
  ((pnode *)ud)->downs++;
}

static void n_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  (void)from;
  pnode *n = ud;
  if (msg->type != APP_TYPE) return;
  if (msg->request_id != n->next_rx || msg->data_len != MSG_BYTES) n->disorder++;
  for (size_t i = 0; i < msg->data_len; i += 4096)
    if (msg->data[i] != (uint8_t)(msg->request_id + i)) n->disorder++;
  n->next_rx = msg->request_id + 1;
}

static void nstart(pnode *n, uv_loop_t *loop, bool listen, bool punch, const p2p_relay_config *rc) {
  memset(n, 0, sizeof(*n));
  p2p_identity_generate(&n->id);
  gw_log_init(&n->log, &rec.sink, &n->id.id);
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &n->id;
  if (listen) gw_addr_parse("127.0.0.1:0", &hc.listen);
  hc.ping_interval_ms = 200;
  hc.handshake_timeout_ms = 3000;
  hc.backoff_min_ms = 50;
  hc.backoff_max_ms = 400;
  hc.max_frame = 4 << 20;
  hc.log = &n->log;
  hc.log_rtt = false;
  if (rc) hc.relay = *rc;
  hc.punch.enabled = punch;
  hc.punch.timeout_ms = 1500;
  p2p_host_cbs cbs = {.ud = n, .peer_up = n_up, .peer_down = n_down, .message = n_msg};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &n->h), 0);
}

static void nstop(pnode *n) {
  if (n->h) p2p_host_close(n->h, NULL, NULL);
  n->h = NULL;
}

/* Sends the next sequence-numbered message while the peer's queue is short. */
static void pump(pnode *from, const pnode *to, uint64_t limit) {
  static uint8_t data[MSG_BYTES];
  while (from->sent < limit && p2p_host_is_connected(from->h, &to->id.id) &&
         p2p_host_queued(from->h, &to->id.id) < (256u << 10)) {
    for (size_t i = 0; i < MSG_BYTES; i += 4096) data[i] = (uint8_t)(from->sent + i);
    p2p_msg m = {.type = APP_TYPE, .request_id = from->sent, .data = data, .data_len = MSG_BYTES};
    if (p2p_host_send(from->h, &to->id.id, &m) != 0) break;
    from->sent++;
  }
}

typedef struct world {
  pnode r, p, d;
  uint64_t limit; /* messages each way; 0: do not send */
  const char *event, *needle;
  size_t count;
} world;

static bool w_log(void *ud) {
  world *w = ud;
  if (w->limit) {
    pump(&w->d, &w->p, w->limit);
    pump(&w->p, &w->d, w->limit);
  }
  return logrec_count(&rec, w->event, w->needle) >= w->count;
}

static bool w_connected(void *ud) {
  world *w = ud;
  return w->d.ups >= 1 && w->p.ups >= 2 && p2p_host_is_connected(w->d.h, &w->p.id.id) &&
         p2p_host_is_connected(w->p.h, &w->d.id.id);
}

static bool w_delivered(void *ud) {
  world *w = ud;
  pump(&w->d, &w->p, w->limit);
  pump(&w->p, &w->d, w->limit);
  return w->p.next_rx >= w->limit && w->d.next_rx >= w->limit;
}

static bool w_reserved(void *ud) {
  p2p_relay_stats st;
  p2p_host_relay_stats(((world *)ud)->p.h, &st);
  return st.reserved_on >= 1;
}

static bool w_true(void *ud) {
  (void)ud;
  return false;
}

/* R public and rate-limited (so frames queue up on the relayed path),
 * P dial-only with a reservation on R, D with a listener P does not know;
 * D connects to P through R. d_lower: make D's node ID the lower one (D
 * chooses the direct session), else P's. */
static void world_start(uv_loop_t *loop, world *w, bool d_listens, bool d_lower) {
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  rc.max_bytes_per_s = 4 << 20;
  nstart(&w->r, loop, true, false, &rc);
  nstart(&w->p, loop, false, true, NULL);
  do {
    if (w->d.h) {
      nstop(&w->d);
      uv_run(loop, UV_RUN_NOWAIT);
    }
    nstart(&w->d, loop, d_listens, true, NULL);
  } while ((gw_id_cmp(&w->d.id.id, &w->p.id.id) < 0) != d_lower);
  gw_addr ra = p2p_host_listen_addr(w->r.h);
  assert_int_equal(p2p_host_relay_reserve(w->p.h, &w->r.id.id, &ra), 0);
  assert_true(run_until(loop, w_reserved, w, WAIT_MS));
  /* D needs an observed address: a direct session to R gives it one. */
  assert_int_equal(p2p_host_connect(w->d.h, &ra, &w->r.id.id), 0);
  assert_int_equal(p2p_host_connect_via(w->d.h, &w->r.id.id, &ra, &w->p.id.id), 0);
  assert_true(run_until(loop, w_connected, w, WAIT_MS));
}

static void world_stop(uv_loop_t *loop, world *w) {
  p2p_host_disconnect(w->d.h, &w->p.id.id);
  nstop(&w->d);
  nstop(&w->p);
  nstop(&w->r);
  drain_loop(loop);
}

/* ---- wire records ---- */

static void test_preface(void **state) {
  (void)state;
  uint8_t id[P2P_PUNCH_ID_BYTES], pre[P2P_PUNCH_PREFACE_BYTES], relay[P2P_RELAY_PREFACE_BYTES];
  randombytes_buf(id, sizeof(id));
  p2p_punch_preface(id, pre);
  assert_true(p2p_punch_is_preface(pre));
  assert_memory_equal(pre + 8, id, sizeof(id));
  gw_id target;
  memset(&target, 7, sizeof(target));
  p2p_relay_preface_connect(&target, relay);
  assert_false(p2p_punch_is_preface(relay));
  assert_false(p2p_relay_is_preface(pre));
  pre[4] = 2; /* another version */
  assert_false(p2p_punch_is_preface(pre));
  assert_string_equal(p2p_punch_nat_name(GWTF__PUNCH_NAT__PUNCH_NAT_SYMMETRIC), "symmetric");
  assert_string_equal(p2p_punch_nat_name(99), "unknown");
}

/* ---- the punch and the migration ---- */

static void check_direct(world *w) {
  p2p_peer_stats sd, sp;
  assert_int_equal(p2p_host_peer_stats(w->d.h, &w->p.id.id, &sd), 0);
  assert_int_equal(p2p_host_peer_stats(w->p.h, &w->d.id.id, &sp), 0);
  assert_true(sd.connected && sp.connected);
  assert_false(sd.relayed);
  assert_false(sp.relayed);
  assert_memory_equal(sd.session_hash, sp.session_hash, 32);
}

static void run_migration(bool d_lower) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  world w;
  memset(&w, 0, sizeof(w));
  size_t direct0 = logrec_count(&rec, "nat.direct", NULL);
  size_t started0 = logrec_count(&rec, "nat.punch_started", NULL);
  world_start(&loop, &w, true, d_lower);
  p2p_peer_stats st;
  assert_int_equal(p2p_host_peer_stats(w.d.h, &w.p.id.id, &st), 0);
  /* Messages flow both ways from the relayed session on, through the switch. */
  w.limit = 600; /* 9.4 MiB each way; the relay passes 4 MiB/s */
  w.event = "nat.direct";
  w.count = direct0 + 1; /* the chooser switched its sends ... */
  assert_true(run_until(&loop, w_log, &w, WAIT_MS));
  assert_true(w.d.sent > 0 && w.p.sent > 0 && w.d.sent < w.limit && w.p.sent < w.limit); /* ... mid-stream */
  w.count = direct0 + 2; /* the other end, once it read the chooser's relayed tail */
  assert_true(run_until(&loop, w_log, &w, WAIT_MS));
  assert_true(logrec_count(&rec, "nat.punch_started", NULL) >= started0 + 2);
  assert_true(run_until(&loop, w_delivered, &w, WAIT_MS));
  assert_int_equal(w.d.disorder, 0);
  assert_int_equal(w.p.disorder, 0);
  assert_int_equal(w.p.next_rx, w.limit);
  assert_int_equal(w.d.next_rx, w.limit);
  check_direct(&w);
  /* No peer_down/peer_up for the switch: D saw P come up once, P saw R and D. */
  assert_int_equal(w.d.downs, 0);
  assert_int_equal(w.p.downs, 0);
  assert_int_equal(w.d.ups, 2); /* R (for its observed address) and P */
  assert_int_equal(w.p.ups, 2);
  /* The relayed session is gone (its circuit closed), the direct one stays. */
  p2p_relay_stats rs;
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  do {
    uv_run(&loop, UV_RUN_NOWAIT);
    p2p_host_relay_stats(w.r.h, &rs);
  } while (rs.circuits > 0 && gw_clock_mono_ms() < deadline && !run_until(&loop, w_true, NULL, 10));
  assert_int_equal(rs.circuits, 0);
  check_direct(&w);
  p2p_punch_stats ps;
  p2p_host_punch_stats(w.d.h, &ps);
  assert_int_equal(ps.direct, 1);
  assert_int_equal(ps.active, 0);
  /* RTT now measures the direct path. */
  deadline = gw_clock_mono_ms() + WAIT_MS;
  do {
    p2p_host_peer_stats(w.d.h, &w.p.id.id, &st);
  } while (st.rtt_samples < 2 && !run_until(&loop, w_true, NULL, 50) && gw_clock_mono_ms() < deadline);
  assert_true(st.rtt_samples >= 2);
  world_stop(&loop, &w);
}

static void test_migrate_d_chooses(void **state) {
  (void)state;
  run_migration(true);
}

static void test_migrate_p_chooses(void **state) {
  (void)state;
  run_migration(false);
}

/* Neither end has a listener: nothing answers the SYNs (loopback sends a
 * reset at once), so the punch fails and the session stays relayed. */
static void test_punch_fails(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  world w;
  memset(&w, 0, sizeof(w));
  size_t failed0 = logrec_count(&rec, "nat.punch_failed", NULL);
  world_start(&loop, &w, false, true);
  w.event = "nat.punch_failed";
  w.needle = "reason=timeout";
  w.count = failed0 + 1;
  assert_true(run_until(&loop, w_log, &w, WAIT_MS));
  assert_true(logrec_count(&rec, "nat.punch_failed", "nat=none/none") >= failed0 + 1);
  assert_int_equal(logrec_count(&rec, "nat.direct", NULL), logrec_count(&rec, "nat.direct", NULL));
  /* Still relayed and still carrying messages. */
  w.limit = 20;
  assert_true(run_until(&loop, w_delivered, &w, WAIT_MS));
  assert_int_equal(w.d.disorder + w.p.disorder, 0);
  p2p_peer_stats sd;
  assert_int_equal(p2p_host_peer_stats(w.d.h, &w.p.id.id, &sd), 0);
  assert_true(sd.connected && sd.relayed);
  assert_int_equal(w.d.downs + w.p.downs, 0);
  p2p_punch_stats ps;
  p2p_host_punch_stats(w.p.h, &ps);
  assert_int_equal(ps.direct, 0);
  world_stop(&loop, &w);
}

/* Both ends reserved on R and both dial each other through it at once:
 * two circuits cross, each node keeps the same one (p2p/host.c), and the
 * punch goes on over it and moves the pair to a direct session. Before,
 * the punch begun on the circuit that lost failed with it ("relay-lost")
 * and none started on the one kept: a pair of private peers that found
 * each other in the same discovery round stayed relayed (test_nat_train,
 * punch case, after placement started discovery at once). */
static bool w_both_reserved(void *ud) {
  world *w = ud;
  p2p_relay_stats sp, sd;
  p2p_host_relay_stats(w->p.h, &sp);
  p2p_host_relay_stats(w->d.h, &sd);
  return sp.reserved_on >= 1 && sd.reserved_on >= 1;
}

static bool w_direct_both(void *ud) {
  world *w = ud;
  p2p_peer_stats sd, sp;
  return p2p_host_peer_stats(w->d.h, &w->p.id.id, &sd) == 0 && p2p_host_peer_stats(w->p.h, &w->d.id.id, &sp) == 0 &&
         sd.connected && sp.connected && !sd.relayed && !sp.relayed;
}

static void crossed_circuits(bool d_lower) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  world w;
  memset(&w, 0, sizeof(w));
  p2p_relay_config rc;
  p2p_relay_config_defaults(&rc);
  nstart(&w.r, &loop, true, false, &rc);
  nstart(&w.p, &loop, false, true, NULL);
  do {
    if (w.d.h) {
      nstop(&w.d);
      uv_run(&loop, UV_RUN_NOWAIT);
    }
    nstart(&w.d, &loop, true, true, NULL);
  } while ((gw_id_cmp(&w.d.id.id, &w.p.id.id) < 0) != d_lower);
  gw_addr ra = p2p_host_listen_addr(w.r.h);
  assert_int_equal(p2p_host_relay_reserve(w.p.h, &w.r.id.id, &ra), 0);
  assert_int_equal(p2p_host_relay_reserve(w.d.h, &w.r.id.id, &ra), 0);
  assert_true(run_until(&loop, w_both_reserved, &w, WAIT_MS));
  size_t duplicates0 = logrec_count(&rec, "session.duplicate", NULL);
  assert_int_equal(p2p_host_connect_via(w.d.h, &w.r.id.id, &ra, &w.p.id.id), 0);
  assert_int_equal(p2p_host_connect_via(w.p.h, &w.r.id.id, &ra, &w.d.id.id), 0);
  assert_true(run_until(&loop, w_direct_both, &w, WAIT_MS));
  assert_true(logrec_count(&rec, "session.duplicate", NULL) > duplicates0); /* the circuits did cross */
  check_direct(&w);
  world_stop(&loop, &w);
}

static void test_crossed_circuits(void **state) {
  (void)state;
  crossed_circuits(true);
  crossed_circuits(false);
}

/* An accepted connection with a punch preface nobody asked for is closed. */
static void test_unknown_preface(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  pnode n;
  nstart(&n, &loop, true, true, NULL);
  gw_addr a = p2p_host_listen_addr(n.h);
  rawpeer rp;
  assert_int_equal(rawpeer_connect(&rp, &a), 0);
  int fd = rp.fd;
  uint8_t id[P2P_PUNCH_ID_BYTES] = {1}, pre[P2P_PUNCH_PREFACE_BYTES];
  p2p_punch_preface(id, pre);
  assert_int_equal(rawpeer_send(&rp, pre, sizeof(pre)), 0);
  /* The host closes it: our read sees EOF. */
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  ssize_t r = -1;
  while (gw_clock_mono_ms() < deadline) {
    uv_run(&loop, UV_RUN_NOWAIT);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 5) == 1) {
      uint8_t b[64];
      r = read(fd, b, sizeof(b));
      break;
    }
  }
  assert_true(r <= 0);
  close(fd);
  assert_int_equal(n.ups, 0);
  nstop(&n);
  drain_loop(&loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_preface),        cmocka_unit_test(test_migrate_d_chooses),
      cmocka_unit_test(test_migrate_p_chooses), cmocka_unit_test(test_punch_fails),
      cmocka_unit_test(test_unknown_preface),   cmocka_unit_test(test_crossed_circuits),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
