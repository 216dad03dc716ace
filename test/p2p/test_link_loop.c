/* Link emulation measured on a real loop: two hosts on loopback, a links
 * file that shapes A -> B (60 ms, 16 Mbit/s) and B -> A (20 ms, no rate
 * limit); the delays and the rate the receiver sees must match what was
 * configured. Timing assertions: not run under valgrind (label novalgrind),
 * whose slowdown is larger than the tolerances. */
#include "testutil.h"

#include <math.h>

#include "p2p/host.h"
#include "p2ptest.h"

#define WAIT_MS (10000)
#define A_TO_B_MS (60.0)
#define B_TO_A_MS (20.0)
#define A_TO_B_BPS (16e6) /* 2 MB/s */
#define APP_TYPE (300)

typedef struct side {
  p2p_identity id;
  p2p_host *h;
  gw_log log;
  int ups;
  int msgs;
  uint64_t last_ns;
  size_t bytes;
} side;

static logrec rec;

static void on_up(void *ud, const gw_peer *peer, bool back) {
  (void)peer, (void)back;
  ((side *)ud)->ups++;
}

static void on_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  side *s = ud;
  (void)from;
  s->msgs++;
  s->bytes += msg->data_len;
  s->last_ns = gw_clock_mono_ns();
}

static void start(side *s, uv_loop_t *loop, const p2p_links *links) {
  gw_log_init(&s->log, &rec.sink, &s->id.id);
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &s->id;
  gw_addr_parse("127.0.0.1:0", &hc.listen);
  hc.ping_interval_ms = 0; /* no pings sharing the shaped link */
  hc.links = links;
  hc.log = &s->log;
  p2p_host_cbs cbs = {.ud = s, .peer_up = on_up, .message = on_msg};
  assert_int_equal(p2p_host_new(loop, &hc, &cbs, &s->h), 0);
}

typedef struct wait_msgs {
  side *s;
  int want;
} wait_msgs;

static bool has_msgs(void *ud) {
  wait_msgs *w = ud;
  return w->s->msgs >= w->want;
}

static bool both_up(void *ud) {
  side *s = ud;
  return s[0].ups > 0 && s[1].ups > 0;
}

/* One small message: send time to arrival time, in ms. */
static double one_way_ms(uv_loop_t *loop, side *from, side *to) {
  p2p_msg m = {.type = APP_TYPE, .body = (const uint8_t *)"t", .body_len = 1};
  wait_msgs w = {to, to->msgs + 1};
  uint64_t t0 = gw_clock_mono_ns();
  assert_int_equal(p2p_host_send(from->h, &to->id.id, &m), 0);
  assert_true(run_until(loop, has_msgs, &w, WAIT_MS));
  return (double)(to->last_ns - t0) / 1e6;
}

static void test_shaped_session(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  side s[2];
  memset(s, 0, sizeof(s));
  p2p_identity_generate(&s[0].id);
  p2p_identity_generate(&s[1].id);
  char ha[GW_ID_HEX_LEN + 1], hb[GW_ID_HEX_LEN + 1], json[1024], err[256];
  gw_id_to_hex(&s[0].id.id, ha);
  gw_id_to_hex(&s[1].id.id, hb);
  snprintf(json, sizeof(json),
           "{\"pairs\": [{\"from\": \"%s\", \"to\": \"%s\", \"latency_ms\": %g, \"bandwidth_mbps\": %g},"
           "            {\"from\": \"%s\", \"to\": \"%s\", \"latency_ms\": %g}]}",
           ha, hb, A_TO_B_MS, A_TO_B_BPS / 1e6, hb, ha, B_TO_A_MS);
  p2p_links *links = NULL;
  assert_int_equal(p2p_links_parse(json, strlen(json), 0, &links, err, sizeof(err)), 0);
  start(&s[0], &loop, links);
  start(&s[1], &loop, links);
  gw_addr ba = p2p_host_listen_addr(s[1].h);
  assert_int_equal(p2p_host_connect(s[0].h, &ba, &s[1].id.id), 0);
  assert_true(run_until(&loop, both_up, s, WAIT_MS));
  assert_int_equal(logrec_count(&rec, "link.emulated", "latency_ms=60.0 bw_mbps=16.0"), 1);

  /* Latency, each direction its own. */
  for (int i = 0; i < 3; i++) {
    double ab = one_way_ms(&loop, &s[0], &s[1]);
    double ba_ms = one_way_ms(&loop, &s[1], &s[0]);
    fprintf(stderr, "one-way: a->b %.1f ms (configured %.0f), b->a %.1f ms (configured %.0f)\n", ab, A_TO_B_MS,
            ba_ms, B_TO_A_MS);
    assert_true(ab >= A_TO_B_MS - 0.5 && ab <= A_TO_B_MS + 25);
    assert_true(ba_ms >= B_TO_A_MS - 0.5 && ba_ms <= B_TO_A_MS + 25);
  }

  /* Rate: 1 MiB in four 256 KiB frames. The last byte lands after the
   * latency plus (wire bytes - burst) at 2 MB/s. */
  size_t chunk = 256 << 10;
  uint8_t *data = calloc(1, chunk);
  p2p_msg m = {.type = APP_TYPE, .data = data, .data_len = chunk};
  wait_msgs w = {&s[1], s[1].msgs + 4};
  uint64_t t0 = gw_clock_mono_ns();
  size_t wire = 0;
  for (int i = 0; i < 4; i++) {
    size_t q0 = p2p_host_queued(s[0].h, &s[1].id.id);
    assert_int_equal(p2p_host_send(s[0].h, &s[1].id.id, &m), 0);
    wire += p2p_host_queued(s[0].h, &s[1].id.id) - q0;
  }
  assert_true(run_until(&loop, has_msgs, &w, WAIT_MS));
  double took_ms = (double)(s[1].last_ns - t0) / 1e6;
  double expect_ms = A_TO_B_MS + (double)(wire - P2P_LINK_BURST_DEFAULT) * 8 / A_TO_B_BPS * 1e3;
  fprintf(stderr, "1 MiB a->b: %.1f ms (expected %.1f ms)\n", took_ms, expect_ms);
  assert_true(took_ms >= expect_ms * 0.97 && took_ms <= expect_ms * 1.15);

  /* The receiver's throughput estimate (what the flow cost model reads)
   * sees the emulated rate, not loopback's. */
  p2p_peer_stats st;
  assert_int_equal(p2p_host_peer_stats(s[1].h, &s[0].id.id, &st), 0);
  fprintf(stderr, "b observes a at %.2f MB/s (configured %.2f)\n", st.rx_Bps / 1e6, A_TO_B_BPS / 8e6);
  assert_true(fabs(st.rx_Bps - A_TO_B_BPS / 8) < 0.25 * A_TO_B_BPS / 8);
  free(data);
  p2p_host_close(s[0].h, NULL, NULL);
  p2p_host_close(s[1].h, NULL, NULL);
  drain_loop(&loop);
  p2p_links_free(links);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (p2p_crypto_init() != 0) return 1;
  logrec_init(&rec, GW_LOG_INFO);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_shaped_session)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  logrec_free(&rec);
  return rc;
}
