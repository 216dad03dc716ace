/* Unit tests for p2p/limits and how the host and sessions apply them:
 * the accounting alone (caps per IP, per /24 and per /64, release, the
 * rate-limited limit.hit line, the reassembly budget arithmetic); a host
 * flooded with half-open connections from one loopback address refuses
 * beyond the per-IP cap, logs limit.hit a few times (not once per
 * connection), releases the slots on timeout and on close, while a peer
 * from another address connects; the total reassembly budget makes a third
 * large frame wait for the first to finish; a slow sender is cut.
 *
 * 127.0.0.x addresses stand for different IPs (Linux routes all of
 * 127.0.0.0/8 to lo); the hosts here set limit_loopback. */
#include "testutil.h"

#include <fcntl.h>
#include <sys/resource.h>

#include "p2p/host.h"
#include "p2p/limits.h"
#include "p2ptest.h"

#define WAIT_MS (10000)
#define APP_TYPE (300)

static logrec rec;

static int setup(void **state) { return (void)state, p2ptest_setup(&rec); }
static int teardown(void **state) { return (void)state, p2ptest_teardown(&rec); }

static gw_addr ip(const char *s) {
  gw_addr a;
  assert_int_equal(gw_addr_parse(s, &a), 0);
  return a;
}

/* ---- the accounting alone ---- */

static void test_accounting(void **state) {
  (void)state;
  gw_log log;
  p2p_identity me;
  p2p_identity_generate(&me);
  gw_log_init(&log, &rec.sink, &me.id);
  p2p_limits_config c;
  p2p_limits_config_defaults(&c);
  assert_int_equal(c.handshakes_per_ip, P2P_LIMIT_HANDSHAKES_PER_IP);
  assert_false(c.limit_loopback);
  c.handshakes_per_ip = 2;
  c.handshakes_per_subnet = 3;
  c.sessions_per_ip = 3;
  c.sessions_per_subnet = 4;
  c.rx_budget = 1000;
  p2p_limits *l;
  assert_int_equal(p2p_limits_new(&c, &log, &l), 0);
  gw_addr a1 = ip("10.1.2.3:1000"), a1b = ip("10.1.2.3:2000"), a2 = ip("10.1.2.4:1"), b = ip("10.1.3.1:1");
  const char *kind;
  p2p_limit_counts lc;
  uint64_t t = 5000;

  /* Two handshakes from one IP (any port), the third refused. */
  assert_int_equal(p2p_limits_admit(l, &a1, t, &kind), 0);
  assert_int_equal(p2p_limits_admit(l, &a1b, t, &kind), 0);
  size_t hits = logrec_count(&rec, "limit.hit", NULL);
  assert_int_equal(p2p_limits_admit(l, &a1, t, &kind), GW_EFULL);
  assert_string_equal(kind, "handshakes-per-ip");
  assert_int_equal(logrec_count(&rec, "limit.hit", "kind=handshakes-per-ip ip=10.1.2.3 count=2"), 1);
  /* A flood within the second: no more lines; the next second: one, with the tally. */
  for (int i = 0; i < 100; i++) assert_int_equal(p2p_limits_admit(l, &a1, t + 10, &kind), GW_EFULL);
  assert_int_equal(logrec_count(&rec, "limit.hit", NULL), hits + 1);
  assert_int_equal(p2p_limits_admit(l, &a1, t + P2P_LIMIT_LOG_MS, &kind), GW_EFULL);
  assert_int_equal(logrec_count(&rec, "limit.hit", "refused=101"), 1);
  p2p_limits_counts(l, &a1, &lc);
  assert_int_equal(lc.ip_handshakes, 2);
  assert_int_equal(lc.refused, 102);

  /* The same /24: the subnet's third handshake, then its cap. */
  assert_int_equal(p2p_limits_admit(l, &a2, t, &kind), 0);
  assert_int_equal(p2p_limits_admit(l, &a2, t, &kind), GW_EFULL);
  assert_string_equal(kind, "handshakes-per-subnet");
  assert_int_equal(logrec_count(&rec, "limit.hit", "kind=handshakes-per-subnet ip=10.1.2.0/24"), 1);
  /* Another /24 is not affected. */
  assert_int_equal(p2p_limits_admit(l, &b, t, &kind), 0);

  /* Handshakes done: sessions stay counted, up to their cap. */
  p2p_limits_handshake_done(l, &a1);
  p2p_limits_handshake_done(l, &a1);
  assert_int_equal(p2p_limits_admit(l, &a1, t, &kind), 0); /* a1: 3 sessions */
  p2p_limits_handshake_done(l, &a1);
  assert_int_equal(p2p_limits_admit(l, &a1, t, &kind), GW_EFULL);
  assert_string_equal(kind, "sessions-per-ip");
  p2p_limits_counts(l, &a1, &lc);
  assert_int_equal(lc.ip_sessions, 3);
  assert_int_equal(lc.ip_handshakes, 0);
  assert_int_equal(lc.subnet_sessions, 4);
  assert_int_equal(lc.subnet_handshakes, 1);
  assert_int_equal(p2p_limits_admit(l, &a2, t, &kind), GW_EFULL);
  assert_string_equal(kind, "sessions-per-subnet");

  /* Release on close: everything back to nothing. */
  for (int i = 0; i < 3; i++) p2p_limits_release(l, &a1, false);
  p2p_limits_release(l, &a2, true);
  p2p_limits_release(l, &b, true);
  p2p_limits_counts(l, &a1, &lc);
  assert_int_equal(lc.ip_sessions + lc.ip_handshakes + lc.subnet_sessions + lc.subnet_handshakes, 0);
  assert_int_equal(lc.handshakes + lc.sessions, 0);

  /* IPv6: /64 subnets; a mapped IPv4 address is that IPv4 address. */
  gw_addr v6a = ip("[2001:db8::1]:1"), v6b = ip("[2001:db8::2]:1"), v6c = ip("[2001:db8:0:1::1]:1");
  assert_int_equal(p2p_limits_admit(l, &v6a, t, &kind), 0);
  assert_int_equal(p2p_limits_admit(l, &v6a, t, &kind), 0);
  assert_int_equal(p2p_limits_admit(l, &v6b, t, &kind), 0);
  assert_int_equal(p2p_limits_admit(l, &v6b, t, &kind), GW_EFULL);
  assert_string_equal(kind, "handshakes-per-subnet");
  assert_int_equal(p2p_limits_admit(l, &v6c, t, &kind), 0);
  gw_addr m = ip("[::ffff:10.9.9.9]:1"), m4 = ip("10.9.9.9:2");
  assert_int_equal(p2p_limits_admit(l, &m, t, &kind), 0);
  p2p_limits_counts(l, &m4, &lc);
  assert_int_equal(lc.ip_handshakes, 1);

  /* Loopback is exempt unless limit_loopback. */
  gw_addr lo = ip("127.0.0.1:1");
  assert_true(p2p_limits_is_loopback(&lo));
  for (int i = 0; i < 50; i++) assert_int_equal(p2p_limits_admit(l, &lo, t, &kind), 0);

  /* The reassembly budget: 1000 bytes. */
  assert_true(p2p_limits_rx_may_grow(l, 0, 1000));
  p2p_limits_rx_charge(l, 600);
  assert_false(p2p_limits_rx_may_grow(l, 0, 401));
  assert_true(p2p_limits_rx_may_grow(l, 0, 400));
  assert_true(p2p_limits_rx_may_grow(l, 600, 1000)); /* the holder of the 600 may grow to it all */
  p2p_limits_rx_charge(l, -600);
  p2p_limits_counts(l, NULL, &lc);
  assert_int_equal(lc.rx_used, 0);

  /* Global kinds: also once a second. */
  hits = logrec_count(&rec, "limit.hit", "kind=fds");
  for (int i = 0; i < 10; i++) p2p_limits_hit(l, "fds", NULL, 7, t);
  assert_int_equal(logrec_count(&rec, "limit.hit", "kind=fds"), hits + 1);
  p2p_limits_free(l);
}

/* ---- a host on a loop ---- */

typedef struct tnode {
  p2p_identity id;
  gw_log log;
  p2p_host *h;
  int ups, msgs, downs;
  size_t rx_max; /* largest rx_used seen by the sampler */
  uv_timer_t sampler;
} tnode;

static void on_up(void *ud, const gw_peer *peer, bool back) {
  (void)peer, (void)back;
  ((tnode *)ud)->ups++;
}
static void on_down(void *ud, const gw_id *id, p2p_down_reason r) {
  (void)id, (void)r;
  ((tnode *)ud)->downs++;
}
static void on_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  (void)from, (void)msg;
  ((tnode *)ud)->msgs++;
}

static void sample(uv_timer_t *t) {
  tnode *n = t->data;
  p2p_limit_counts lc;
  p2p_host_limit_counts(n->h, NULL, &lc);
  if (lc.rx_used > n->rx_max) n->rx_max = lc.rx_used;
}

static void node_start(tnode *n, uv_loop_t *loop, const char *listen, void (*tweak)(p2p_host_config *)) {
  p2p_host_config hc;
  p2ptest_host_config(&hc, &n->id, NULL, &n->log, &rec);
  if (listen) hc.listen = ip(listen);
  hc.log_rtt = false;
  hc.limits.limit_loopback = true;
  if (tweak) tweak(&hc);
  p2p_host_cbs cbs = {.ud = n, .peer_up = on_up, .peer_down = on_down, .message = on_msg};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &n->h), 0);
  uv_timer_init(loop, &n->sampler);
  n->sampler.data = n;
  uv_timer_start(&n->sampler, sample, 5, 5);
}

static void node_stop(tnode *n) {
  uv_close((uv_handle_t *)&n->sampler, NULL);
  p2p_host_close(n->h, NULL, NULL);
}

/* A non-blocking TCP connection from src_ip to dst that sends nothing. */
static int half_open(const char *src_ip, const gw_addr *dst) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  struct sockaddr_in src = {.sin_family = AF_INET};
  inet_pton(AF_INET, src_ip, &src.sin_addr);
  struct sockaddr_storage ss;
  p2p_addr_to_sockaddr(dst, &ss);
  if (bind(fd, (struct sockaddr *)&src, sizeof(src)) != 0 ||
      (connect(fd, (struct sockaddr *)&ss, sizeof(struct sockaddr_in)) != 0 && errno != EINPROGRESS)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Closed by the other side (EOF or reset)? */
static bool closed_by_peer(int fd) {
  char b;
  ssize_t k = recv(fd, &b, 1, MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

typedef struct flood_ctx {
  tnode *a, *b;
  const gw_addr *flood_ip;
  uint32_t want_hs;
} flood_ctx;

static bool connected(void *ud) {
  flood_ctx *f = ud;
  return p2p_host_is_connected(f->b->h, &f->a->id.id) && f->a->ups > 0;
}

static bool flood_hs_is(void *ud) {
  flood_ctx *f = ud;
  p2p_limit_counts lc;
  p2p_host_limit_counts(f->a->h, f->flood_ip, &lc);
  return lc.ip_handshakes == f->want_hs && lc.ip_sessions == f->want_hs;
}

/* Long enough that the flood's admitted handshakes are still held when the
 * honest peer is up, even under valgrind (which took 1.9 s to get there). */
static void short_handshake(p2p_host_config *hc) { hc->handshake_timeout_ms = 5000; }

#define FLOOD_N (300)

static void test_flood_one_ip(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tnode *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
  node_start(a, &loop, "127.0.0.1:0", short_handshake);
  node_start(b, &loop, NULL, NULL);
  gw_addr aa = p2p_host_listen_addr(a->h);
  gw_addr flood_ip = ip("127.0.0.3:0");
  size_t hits0 = logrec_count(&rec, "limit.hit", "kind=handshakes-per-ip ip=127.0.0.3 ");
  size_t rejected0 = logrec_count(&rec, "session.rejected", NULL);
  size_t timeouts0 = logrec_count(&rec, "session.rejected", "reason=handshake-timeout");

  /* 300 half-open connections from 127.0.0.3, sent nothing. */
  int fds[FLOOD_N];
  uint64_t t0 = gw_clock_mono_ms();
  for (int i = 0; i < FLOOD_N; i++) {
    fds[i] = half_open("127.0.0.3", &aa);
    assert_true(fds[i] >= 0);
    if (i % 32 == 0) uv_run(&loop, UV_RUN_NOWAIT); /* the listener keeps accepting */
  }
  /* B dials from 127.0.0.1 meanwhile and gets in. */
  assert_int_equal(p2p_host_connect(b->h, &aa, &a->id.id), 0);
  flood_ctx f = {.a = a, .b = b, .flood_ip = &flood_ip, .want_hs = P2P_LIMIT_HANDSHAKES_PER_IP};
  assert_true(run_until(&loop, connected, &f, WAIT_MS));
  uint64_t took = gw_clock_mono_ms() - t0;
  print_message("flood of %d from 127.0.0.3; honest peer from 127.0.0.1 up after %llu ms\n", FLOOD_N,
                (unsigned long long)took);
  /* The honest peer got in while the flooder still held its 8 slots: none
   * has timed out yet, and the cap holds. */
  assert_int_equal(logrec_count(&rec, "session.rejected", "reason=handshake-timeout"),
                   timeouts0);
  assert_true(flood_hs_is(&f));
  /* Everything beyond the cap was closed at once. */
  run_until(&loop, flood_hs_is, &f, 100);
  int closed = 0;
  for (int i = 0; i < FLOOD_N; i++) closed += closed_by_peer(fds[i]);
  print_message("%d of %d flood connections closed by the host\n", closed, FLOOD_N);
  assert_true(closed >= FLOOD_N - P2P_LIMIT_HANDSHAKES_PER_IP);
  /* One line (maybe two, across a second boundary), not one per connection. */
  size_t hits = logrec_count(&rec, "limit.hit", "kind=handshakes-per-ip ip=127.0.0.3 ") - hits0;
  assert_true(hits >= 1 && hits <= 3);
  assert_int_equal(logrec_count(&rec, "session.rejected", "reason=handshakes-per-ip"), 0);

  /* The 8 admitted ones time out (5 s) and their slots are freed. */
  f.want_hs = 0;
  assert_true(run_until(&loop, flood_hs_is, &f, WAIT_MS));
  assert_true(logrec_count(&rec, "session.rejected", "reason=handshake-timeout") >= rejected0 + 1);
  /* New ones fill the slots again; closing them frees them at once. */
  int again[P2P_LIMIT_HANDSHAKES_PER_IP];
  for (int i = 0; i < P2P_LIMIT_HANDSHAKES_PER_IP; i++) assert_true((again[i] = half_open("127.0.0.3", &aa)) >= 0);
  f.want_hs = P2P_LIMIT_HANDSHAKES_PER_IP;
  assert_true(run_until(&loop, flood_hs_is, &f, WAIT_MS));
  for (int i = 0; i < P2P_LIMIT_HANDSHAKES_PER_IP; i++) close(again[i]);
  f.want_hs = 0;
  assert_true(run_until(&loop, flood_hs_is, &f, 1000)); /* well before the handshake timeout */
  for (int i = 0; i < FLOOD_N; i++) close(fds[i]);
  assert_true(p2p_host_is_connected(b->h, &a->id.id)); /* the honest session never noticed */
  assert_int_equal(b->downs, 0);

  node_stop(a);
  node_stop(b);
  drain_loop(&loop);
  free(a);
  free(b);
}

/* The default: loopback is exempt, so local swarms are not limited. */
static void test_loopback_exempt(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tnode *a = calloc(1, sizeof(*a));
  p2p_host_config hc;
  p2ptest_host_config(&hc, &a->id, NULL, &a->log, &rec);
  hc.listen = ip("127.0.0.1:0");
  hc.log_rtt = false;
  p2p_host_cbs cbs = {.ud = a};
  assert_int_equal(p2p_host_new(&loop, &hc, &cbs, &a->h), 0);
  gw_addr aa = p2p_host_listen_addr(a->h);
  int fds[20];
  for (int i = 0; i < 20; i++) assert_true((fds[i] = half_open("127.0.0.4", &aa)) >= 0);
  gw_addr src = ip("127.0.0.4:0");
  flood_ctx f = {.a = a, .flood_ip = &src};
  uint64_t end = gw_clock_mono_ms() + 300;
  while (gw_clock_mono_ms() < end) uv_run(&loop, UV_RUN_NOWAIT);
  p2p_limit_counts lc;
  p2p_host_limit_counts(a->h, &src, &lc);
  assert_int_equal(lc.handshakes, 20); /* all admitted, none keyed */
  assert_int_equal(lc.ip_handshakes, 0);
  (void)f;
  for (int i = 0; i < 20; i++) close(fds[i]);
  p2p_host_close(a->h, NULL, NULL);
  drain_loop(&loop);
  free(a);
}

/* ---- reassembly: the budget and slow senders (hosts served on a thread) ---- */

typedef struct served {
  p2ptest_served t;
  tnode a;
  void (*tweak)(p2p_host_config *);
} served;

static void served_start(p2ptest_served *t) {
  served *s = (served *)t;
  node_start(&s->a, &t->loop, "127.0.0.1:0", s->tweak);
}

/* Host A on its own thread, configured by tweak; *a and *aid: where and who. */
static served *serve_a(void (*tweak)(p2p_host_config *), gw_addr *a, gw_id *aid) {
  served *s = calloc(1, sizeof(*s));
  s->tweak = tweak;
  p2ptest_serve(&s->t, served_start);
  *a = p2p_host_listen_addr(s->a.h);
  *aid = s->a.id.id;
  return s;
}

#define FRAME_BYTES ((size_t)1 << 20)

/* The smallest budget a host takes: one frame, one envelope and 4 KiB
 * (about 2 MiB here): two 1 MiB payloads in reassembly at once, the third waits. */
static void budget_config(p2p_host_config *hc) {
  hc->max_frame = FRAME_BYTES + 4096;
  hc->limits.rx_budget = 1; /* raised by the host to max_frame + P2P_HEAD_MAX + 4 KiB */
  hc->limits.rx_min_Bps = 0;
}

/* Sends a head announcing a FRAME_BYTES payload and the first `part`
 * bytes of the frame; *rest and *rest_len are what remains. */
static void send_partial_frame(rawpeer *r, size_t part, uint8_t **wire, size_t *len) {
  static uint8_t data[FRAME_BYTES];
  p2p_msg m = {.type = APP_TYPE, .data = data, .data_len = sizeof(data)};
  assert_int_equal(rawpeer_seal(r, &m, NULL, wire, len), 0);
  assert_true(*len > part);
  assert_int_equal(rawpeer_send(r, *wire, part), 0);
}

static void authed_peer(rawpeer *r, const gw_addr *a, const gw_id *aid) {
  assert_int_equal(rawpeer_connect(r, a), 0);
  assert_int_equal(rawpeer_handshake(r, aid), 0);
  assert_int_equal(rawpeer_send_hello(r), 0);
}

/* Writes all of buf on a blocking socket set non-blocking, running the
 * host's loop (here, on this thread) whenever the socket is full. */
static void send_driving(uv_loop_t *loop, int fd, const uint8_t *buf, size_t len) {
  uint64_t deadline = gw_clock_mono_ms() + WAIT_MS;
  while (len > 0 && gw_clock_mono_ms() < deadline) {
    ssize_t k = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      buf += k;
      len -= (size_t)k;
    } else {
      assert_true(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
      uv_run(loop, UV_RUN_NOWAIT);
    }
  }
  assert_int_equal(len, 0);
}

static bool three_msgs(void *ud) { return ((tnode *)ud)->msgs >= 3; }

static void test_rx_budget(void **state) {
  (void)state;
  gw_addr a;
  gw_id aid;
  served *s = serve_a(budget_config, &a, &aid);
  rawpeer r[3];
  uint8_t *w[3];
  size_t wl[3];
  size_t hits0 = logrec_count(&rec, "limit.hit", "kind=rx-budget");
  for (int i = 0; i < 3; i++) {
    authed_peer(&r[i], &a, &aid);
    send_partial_frame(&r[i], 4096, &w[i], &wl[i]); /* head + 4 KiB of each payload */
    if (i < 2) usleep(100 * 1000);                   /* in this order */
  }
  /* The third does not fit beside the first two: it waits, and says so. */
  assert_true(logrec_wait(&rec, "limit.hit", "kind=rx-budget", hits0 + 1, WAIT_MS));
  p2ptest_serve_join(&s->t); /* the loop runs on this thread from here */
  assert_int_equal(s->a.msgs, 0);
  /* The rest of each frame: the third is read once the first two are done. */
  for (int i = 0; i < 3; i++) send_driving(&s->t.loop, r[i].fd, w[i] + 4096, wl[i] - 4096);
  assert_true(run_until(&s->t.loop, three_msgs, &s->a, WAIT_MS));
  size_t budget = FRAME_BYTES + 4096 + P2P_HEAD_MAX + 4096;
  print_message("reassembly high-water %zu bytes, budget %zu\n", s->a.rx_max, budget);
  assert_true(s->a.rx_max <= budget);
  assert_true(s->a.rx_max >= 2 * FRAME_BYTES); /* two at once did fit */
  assert_int_equal(s->a.downs, 0);           /* nobody was cut for waiting */
  p2p_limit_counts lc;
  p2p_host_limit_counts(s->a.h, NULL, &lc);
  assert_true(lc.rx_used <= (size_t)3 * (8u << 20)); /* what sessions keep between frames */
  for (int i = 0; i < 3; i++) {
    free(w[i]);
    rawpeer_close(&r[i]);
  }
  node_stop(&s->a);
  p2ptest_serve_free(&s->t);
  free(s);
}

/* A floor of 64 KiB/s over 600 ms windows. */
static void slow_config(p2p_host_config *hc) {
  hc->max_frame = FRAME_BYTES + 4096;
  hc->limits.rx_min_Bps = 64 << 10;
  hc->limits.rx_window_ms = 600;
}

static void test_slow_sender(void **state) {
  (void)state;
  gw_addr a;
  gw_id aid;
  served *s = serve_a(slow_config, &a, &aid);
  size_t before = logrec_count(&rec, "session.rejected", "reason=slow-sender");
  rawpeer r;
  uint8_t *w;
  size_t wl;
  authed_peer(&r, &a, &aid);
  /* Idle between frames is fine (the idle timeout covers silence)... */
  usleep(1500 * 1000);
  /* ...but a frame trickled a byte every 50 ms is cut. */
  send_partial_frame(&r, 4096, &w, &wl);
  uint64_t t0 = gw_clock_mono_ms();
  bool cut = false;
  for (size_t i = 4096; i < wl && gw_clock_mono_ms() < t0 + 5000; i++) {
    if (rawpeer_send(&r, w + i, 1) != 0) break;
    if (logrec_count(&rec, "session.rejected", "reason=slow-sender") > before) {
      cut = true;
      break;
    }
    usleep(50 * 1000);
  }
  assert_true(cut || logrec_wait(&rec, "session.rejected", "reason=slow-sender", before + 1, 1000));
  uint64_t took = gw_clock_mono_ms() - t0;
  print_message("slow sender cut after %llu ms\n", (unsigned long long)took);
  assert_true(took < 2500);
  assert_true(logrec_count(&rec, "limit.hit", "kind=slow-sender") >= 1);
  assert_int_equal(rawpeer_wait_closed(&r, WAIT_MS), 0);
  rawpeer_close(&r);
  free(w);
  p2ptest_serve_join(&s->t);
  node_stop(&s->a);
  p2ptest_serve_free(&s->t);
  free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accounting),
      cmocka_unit_test(test_flood_one_ip),
      cmocka_unit_test(test_loopback_exempt),
      cmocka_unit_test(test_rx_budget),
      cmocka_unit_test(test_slow_sender),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
