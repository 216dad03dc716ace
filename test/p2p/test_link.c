/* Unit tests for p2p/link: the links file, the shaper's arithmetic and the
 * delay queue. (test_link_loop.c measures shaped sessions on the loop.) */
#include "testutil.h"

#include <math.h>

#include "p2p/link.h"
#include "p2ptest.h"

static p2p_links *load_cities(double scale) {
  const char *src = getenv("GWTF_SOURCE_DIR");
  char path[1024], err[512];
  snprintf(path, sizeof(path), "%s/data/links/cities8.json", src ? src : ".");
  p2p_links *l = NULL;
  int rc = p2p_links_load(path, scale, &l, err, sizeof(err));
  if (rc != 0) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  return l;
}

static gw_addr at(const char *s) {
  gw_addr a;
  assert_int_equal(gw_addr_parse(s, &a), 0);
  return a;
}

static void test_cities8(void **state) {
  (void)state;
  p2p_links *l = load_cities(0);
  gw_id none = {{0}};
  gw_addr oregon = at("127.0.0.1:7000"), tokyo = at("127.0.0.1:7003"), oregon2 = at("127.0.0.1:7008");
  gw_addr ireland = at("127.0.0.1:7007"), elsewhere = at("127.0.0.1:5000");
  assert_string_equal(p2p_links_region(l, &none, &oregon), "oregon");
  assert_string_equal(p2p_links_region(l, &none, &tokyo), "tokyo");
  assert_string_equal(p2p_links_region(l, &none, &oregon2), "oregon");
  assert_string_equal(p2p_links_region(l, &none, &ireland), "ireland");
  assert_null(p2p_links_region(l, &none, &elsewhere));
  p2p_link_params lp;
  assert_true(p2p_links_lookup(l, &none, &oregon, &none, &tokyo, &lp));
  assert_true(fabs(lp.latency_ms - 96) < 1e-9);
  assert_true(fabs(lp.bandwidth_bps - 0.523e9) < 1);
  assert_true(p2p_links_lookup(l, &none, &tokyo, &none, &ireland, &lp));
  assert_true(fabs(lp.latency_ms - 199) < 1e-9);
  assert_true(fabs(lp.bandwidth_bps - 0.465e9) < 1);
  /* Same region: the intra-region link. */
  assert_true(p2p_links_lookup(l, &none, &oregon, &none, &oregon2, &lp));
  assert_true(fabs(lp.latency_ms - 5) < 1e-9 && fabs(lp.bandwidth_bps - 2e9) < 1);
  /* A node outside every rule: the default, which is no shaping. */
  assert_false(p2p_links_lookup(l, &none, &oregon, &none, &elsewhere, &lp));
  assert_true(lp.latency_ms == 0 && lp.bandwidth_bps == 0);
  p2p_links_free(l);
  /* The GWTF paper's scale: bandwidth / 32. */
  l = load_cities(1.0 / 32);
  assert_true(p2p_links_lookup(l, &none, &oregon, &none, &tokyo, &lp));
  assert_true(fabs(lp.bandwidth_bps - 0.523e9 / 32) < 1);
  assert_true(fabs(lp.latency_ms - 96) < 1e-9);
  p2p_links_free(l);
}

static void test_pairs_and_ids(void **state) {
  (void)state;
  gw_id a, b, c;
  gw_id_hash_str("a", &a);
  gw_id_hash_str("b", &b);
  gw_id_hash_str("c", &c);
  char ha[GW_ID_HEX_LEN + 1], hb[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(&a, ha);
  gw_id_to_hex(&b, hb);
  char json[2048];
  snprintf(json, sizeof(json),
           "{\"regions\": [\"eu\", \"us\"],"
           " \"latency_ms\": [[1, 40], [45, 2]],"
           " \"bandwidth_mbps\": [[1000, 100], [200, 1000]],"
           " \"default\": {\"latency_ms\": 7},"
           " \"nodes\": [{\"id\": \"%.12s\", \"region\": \"eu\"}, {\"addr\": \"10.0.0.1:9000-9010\", \"region\": \"us\"}],"
           " \"pairs\": [{\"from\": \"%s\", \"to\": \"10.0.0.1:9005\", \"latency_ms\": 3, \"bandwidth_gbps\": 5,"
           "              \"symmetric\": true},"
           "             {\"from\": \"us\", \"to\": \"*\", \"latency_ms\": 99}]}",
           ha, ha);
  p2p_links *l = NULL;
  char err[256];
  int rc = p2p_links_parse(json, strlen(json), 0, &l, err, sizeof(err));
  if (rc) fprintf(stderr, "%s\n", err);
  assert_int_equal(rc, 0);
  gw_addr u5 = at("10.0.0.1:9005"), u6 = at("10.0.0.1:9006"), none = {0};
  p2p_link_params lp;
  assert_string_equal(p2p_links_region(l, &a, NULL), "eu");
  /* The pair rule, both directions. */
  assert_true(p2p_links_lookup(l, &a, NULL, &c, &u5, &lp));
  assert_true(lp.latency_ms == 3 && fabs(lp.bandwidth_bps - 5e9) < 1);
  assert_true(p2p_links_lookup(l, &c, &u5, &a, NULL, &lp));
  assert_true(lp.latency_ms == 3);
  /* us -> anything: the wildcard pair beats the matrix. */
  assert_true(p2p_links_lookup(l, &c, &u6, &a, &none, &lp));
  assert_true(lp.latency_ms == 99 && lp.bandwidth_bps == 0);
  /* eu -> us through the matrix. */
  assert_true(p2p_links_lookup(l, &a, NULL, &b, &u6, &lp));
  assert_true(lp.latency_ms == 40 && fabs(lp.bandwidth_bps - 100e6) < 1);
  /* b is in no region: the default. */
  assert_false(p2p_links_lookup(l, &a, NULL, &b, NULL, &lp));
  assert_true(lp.latency_ms == 7);
  p2p_links_free(l);
}

static void expect_error(const char *json, const char *needle) {
  p2p_links *l = NULL;
  char err[256] = "";
  assert_int_equal(p2p_links_parse(json, strlen(json), 0, &l, err, sizeof(err)), GW_EINVAL);
  assert_null(l);
  if (!strstr(err, needle)) fprintf(stderr, "error '%s' lacks '%s'\n", err, needle);
  assert_non_null(strstr(err, needle));
}

static void test_bad_files(void **state) {
  (void)state;
  expect_error("{\"regions\": [\"x\"],\n \"latency_ms\": [[1]]", "line 2");
  expect_error("[]", "one JSON object");
  expect_error("{\"latency\": 5}", "unknown key \"latency\"");
  expect_error("{\"regions\": [\"x\", \"y\"], \"latency_ms\": [[1, 2]]}", "2 rows");
  expect_error("{\"regions\": [\"x\", \"y\"], \"latency_ms\": [[1, 2], [3]]}", "row 1");
  expect_error("{\"regions\": [\"x\"], \"latency_ms\": [[-1]]}", ">= 0");
  expect_error("{\"regions\": [\"x\", \"x\"]}", "twice");
  expect_error("{\"regions\": [\"x\"], \"nodes\": [{\"addr\": \"1.2.3.4:5\", \"region\": \"y\"}]}", "region");
  expect_error("{\"nodes\": [{\"id\": \"abc\", \"region\": \"y\"}]}", "hex node ID");
  expect_error("{\"pairs\": [{\"from\": \"nowhere\", \"to\": \"*\"}]}", "'nowhere'");
  expect_error("{\"default\": {\"bandwidth_gbps\": 1, \"bandwidth_mbps\": 1}}", "not both");
  expect_error("{\"bandwidth_scale\": 0}", "> 0");
}

/* 1 MB/s (1000 ns per byte), 64 KiB burst, 50 ms latency. */
static void test_shaper_math(void **state) {
  (void)state;
  p2p_link_params lp = {.latency_ms = 50, .bandwidth_bps = 8e6, .burst_bytes = 65536};
  p2p_shaper s;
  p2p_shaper_init(&s, &lp);
  assert_true(p2p_shaper_active(&s));
  uint64_t t0 = 1000000000ULL;
  p2p_span sp = p2p_shaper_reserve(&s, t0, 1000000);
  const uint64_t ms = 1000000;
  /* Nothing before the latency has passed; then the burst at once. */
  assert_int_equal(p2p_span_bytes_at(&sp, t0 + 49 * ms), 0);
  assert_int_equal(p2p_span_bytes_at(&sp, t0 + 50 * ms), 65536);
  /* Then the rate: 500 ms later, 500 kB more. */
  uint64_t got = p2p_span_bytes_at(&sp, t0 + 550 * ms);
  assert_true(got >= 565536 - 2 && got <= 565536 + 2);
  /* The last byte: latency + (size - burst) / rate. */
  uint64_t last = p2p_span_time(&sp, 1000000);
  assert_true(llabs((long long)(last - t0) - (long long)(50 * ms + 934464000ULL)) < 2000);
  assert_int_equal(p2p_span_bytes_at(&sp, last), 1000000);
  /* span_time and bytes_at agree everywhere. */
  for (uint64_t k = 1; k <= 1000000; k += 9973) assert_true(p2p_span_bytes_at(&sp, p2p_span_time(&sp, k)) >= k);
  /* A second message queues behind the first: no new burst. */
  p2p_span sp2 = p2p_shaper_reserve(&s, t0 + 1 * ms, 1000);
  assert_true(p2p_span_time(&sp2, 1) > last);
  /* After a long idle the bucket is full again. */
  p2p_span sp3 = p2p_shaper_reserve(&s, t0 + 10000 * ms, 1000);
  assert_int_equal(p2p_span_time(&sp3, 1000), t0 + 10000 * ms + 50 * ms);
  /* Latency only. */
  p2p_link_params lat = {.latency_ms = 20};
  p2p_shaper_init(&s, &lat);
  sp = p2p_shaper_reserve(&s, t0, 1 << 30);
  assert_int_equal(p2p_span_time(&sp, 1 << 30), t0 + 20 * ms);
  /* Nothing at all. */
  p2p_link_params off = {0};
  p2p_shaper_init(&s, &off);
  assert_false(p2p_shaper_active(&s));
}

typedef struct dq_item {
  uint64_t due, fired;
  int order;
} dq_item;

typedef struct dq_ctx {
  int fired;
} dq_ctx;

static void dq_due(void *ud, void *item) {
  dq_ctx *c = ud;
  dq_item *it = item;
  it->fired = gw_clock_mono_ns();
  it->order = c->fired++;
}

static bool dq_done(void *ud) { return ((dq_ctx *)ud)->fired == 40; }

static void test_delay_queue(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  dq_ctx ctx = {0};
  p2p_delayq q;
  assert_int_equal(p2p_delayq_init(&q, &loop, dq_due, &ctx), 0);
  dq_item items[40];
  uint64_t now = gw_clock_mono_ns();
  for (int i = 0; i < 40; i++) {
    /* Out of order, with ties (pairs share a due time). */
    items[i].due = now + (uint64_t)(((i * 37) % 20) * 4 + 10) * 1000000ULL;
    items[i].fired = 0;
    assert_int_equal(p2p_delayq_push(&q, items[i].due, &items[i]), 0);
  }
  assert_int_equal(p2p_delayq_len(&q), 40);
  assert_true(run_until(&loop, dq_done, &ctx, 5000));
  for (int i = 0; i < 40; i++) {
    assert_true(items[i].fired + 500000 >= items[i].due); /* never early (beyond the slack) */
    for (int j = 0; j < 40; j++) {
      if (items[j].due < items[i].due) assert_true(items[j].order < items[i].order);
      if (items[j].due == items[i].due && j < i) assert_true(items[j].order < items[i].order); /* push order */
    }
  }
  dq_item late = {.due = gw_clock_mono_ns() + 3600ULL * 1000000000ULL};
  p2p_delayq_push(&q, late.due, &late);
  p2p_delayq_close(&q, NULL, NULL);
  drain_loop(&loop);
  assert_int_equal(late.fired, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cities8),     cmocka_unit_test(test_pairs_and_ids), cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_shaper_math), cmocka_unit_test(test_delay_queue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
