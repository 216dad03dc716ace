/* Unit tests for util/: ids, addresses, logging, RNG, atomic files. */
#include "testutil.h"

#include <sys/stat.h>

#include "util/addr.h"
#include "util/err.h"
#include "util/file.h"
#include "util/id.h"
#include "util/log.h"
#include "util/rng.h"

static void test_id_hex_roundtrip(void **state) {
  (void)state;
  gw_id a, b;
  char hex[GW_ID_HEX_LEN + 1], shortid[GW_ID_SHORT_LEN + 1];
  gw_id_hash_str("run/demo", &a);
  gw_id_to_hex(&a, hex);
  assert_int_equal(strlen(hex), GW_ID_HEX_LEN);
  assert_int_equal(gw_id_from_hex(hex, &b), 0);
  assert_true(gw_id_eq(&a, &b));
  gw_id_to_short(&a, shortid);
  assert_int_equal(strncmp(hex, shortid, GW_ID_SHORT_LEN), 0);
  assert_int_equal(gw_id_from_hex("abc", &b), GW_EINVAL);
  hex[5] = 'z';
  assert_int_equal(gw_id_from_hex(hex, &b), GW_EINVAL);
}

static void test_id_hash_distinct(void **state) {
  (void)state;
  gw_id a, b;
  gw_id_hash_str("run/x/stage/1", &a);
  gw_id_hash_str("run/x/stage/2", &b);
  assert_false(gw_id_eq(&a, &b));
  assert_false(gw_id_is_zero(&a));
  assert_true(gw_id_cmp(&a, &b) != 0);
}

static void test_addr_parse_format(void **state) {
  (void)state;
  gw_addr a, b;
  char s[GW_ADDR_STRLEN];
  assert_int_equal(gw_addr_parse("127.0.0.1:4000", &a), 0);
  assert_int_equal(a.family, 4);
  assert_int_equal(a.port, 4000);
  gw_addr_format(&a, s);
  assert_string_equal(s, "127.0.0.1:4000");
  assert_int_equal(gw_addr_parse("[::1]:9", &b), 0);
  assert_int_equal(b.family, 6);
  gw_addr_format(&b, s);
  assert_string_equal(s, "[::1]:9");
  assert_false(gw_addr_eq(&a, &b));
  assert_int_equal(gw_addr_parse("127.0.0.1", &a), GW_EINVAL);
  assert_int_equal(gw_addr_parse("127.0.0.1:70000", &a), GW_EINVAL);
  assert_int_equal(gw_addr_parse("host.example:80", &a), GW_EINVAL);
  assert_int_equal(gw_addr_parse("::1:80", &a), GW_EINVAL);
}

static void test_addr_split_names(void **state) {
  (void)state;
  char host[64];
  uint16_t port;
  assert_int_equal(gw_addr_split("seed.example.org:7000", host, sizeof(host), &port), 0);
  assert_string_equal(host, "seed.example.org");
  assert_int_equal(port, 7000);
  assert_int_equal(gw_addr_split(":7000", host, sizeof(host), &port), GW_EINVAL);
}

static void test_addr_martians(void **state) {
  (void)state;
  gw_addr a;
  gw_addr_parse("127.0.0.1:1", &a);
  assert_true(gw_addr_is_martian(&a, false));
  assert_false(gw_addr_is_martian(&a, true));
  gw_addr_parse("224.0.0.1:1", &a);
  assert_true(gw_addr_is_martian(&a, true));
  gw_addr_parse("8.8.8.8:0", &a);
  assert_true(gw_addr_is_martian(&a, true));
  gw_addr_parse("8.8.8.8:53", &a);
  assert_false(gw_addr_is_martian(&a, false));
}

static void test_rng_replays(void **state) {
  (void)state;
  gw_rng a, b;
  gw_rng_seed(&a, 42);
  gw_rng_seed(&b, 42);
  for (int i = 0; i < 1000; i++) assert_true(gw_rng_next(&a) == gw_rng_next(&b));
  gw_rng_seed(&b, 43);
  assert_true(gw_rng_next(&a) != gw_rng_next(&b));
}

static void test_rng_ranges(void **state) {
  (void)state;
  gw_rng r;
  gw_rng_seed(&r, 7);
  int seen[6] = {0};
  double sum = 0;
  for (int i = 0; i < 60000; i++) {
    int64_t v = gw_rng_range(&r, 1, 6);
    assert_true(v >= 1 && v <= 6);
    seen[v - 1]++;
    double u = gw_rng_uniform(&r);
    assert_true(u >= 0.0 && u < 1.0);
    sum += u;
  }
  for (int i = 0; i < 6; i++) assert_true(seen[i] > 9000 && seen[i] < 11000);
  assert_true(sum / 60000 > 0.49 && sum / 60000 < 0.51);
}

static char *capture_log(gw_log_format fmt, const char *event, const char *fields) {
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&buf, &len);
  gw_log_sink sink;
  gw_log lg;
  gw_id id;
  gw_id_hash_str("node", &id);
  gw_log_sink_init(&sink, fp, GW_LOG_INFO, fmt);
  gw_log_init(&lg, &sink, &id);
  gw_log_set_stage(&lg, 2);
  gw_log_event(&lg, GW_LOG_INFO, event, "%s", fields);
  GW_DEBUG(&lg, "hidden", "x=1");
  fclose(fp);
  return buf;
}

static void test_log_text(void **state) {
  (void)state;
  char *line = capture_log(GW_LOG_TEXT, "peer.connected", "peer=ab12 rtt_ms=1.5");
  char node[GW_ID_SHORT_LEN + 1];
  gw_id id;
  gw_id_hash_str("node", &id);
  gw_id_to_short(&id, node);
  assert_non_null(strstr(line, node));
  assert_non_null(strstr(line, " s2 peer.connected peer=ab12 rtt_ms=1.5\n"));
  assert_null(strstr(line, "hidden"));
  assert_null(strchr(line, '\033')); /* not a TTY: no colour */
  free(line);
}

/* The fan-out to a subscriber (the live web view): JSON whatever the
 * terminal's format, its own level, and the terminal line unchanged. */
typedef struct feed_rec {
  int calls;
  char node[16], event[32], json[512];
} feed_rec;

static void feed_cb(void *ud, gw_log_level level, const char *node, const char *event, const char *json, size_t len) {
  feed_rec *r = ud;
  (void)level;
  r->calls++;
  snprintf(r->node, sizeof(r->node), "%s", node);
  snprintf(r->event, sizeof(r->event), "%s", event);
  assert_int_equal(strlen(json), len);
  snprintf(r->json, sizeof(r->json), "%s", json);
}

static void test_log_subscriber(void **state) {
  (void)state;
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream(&buf, &len);
  gw_log_sink sink;
  gw_log lg;
  feed_rec r = {0};
  gw_log_sink_init(&sink, fp, GW_LOG_WARN, GW_LOG_TEXT);
  gw_log_sink_subscribe(&sink, feed_cb, &r, GW_LOG_INFO);
  gw_log_init(&lg, &sink, NULL);
  GW_DEBUG(&lg, "below.both", "x=1");
  GW_INFO(&lg, "feed.only", "loss=2.5 peer=0042");
  assert_int_equal(r.calls, 1);
  assert_string_equal(r.event, "feed.only");
  assert_string_equal(r.node, "-");
  assert_non_null(strstr(r.json, "\"event\":\"feed.only\",\"loss\":2.5,\"peer\":\"0042\"}"));
  assert_int_equal(r.json[0], '{');
  GW_WARN(&lg, "both.see", "a=1");
  assert_int_equal(r.calls, 2);
  fflush(fp);
  assert_null(strstr(buf, "feed.only"));           /* the terminal keeps its own level */
  assert_non_null(strstr(buf, " - both.see a=1\n")); /* and its own format */
  gw_log_sink_subscribe(&sink, NULL, NULL, GW_LOG_INFO);
  GW_WARN(&lg, "unsubscribed", "a=1");
  assert_int_equal(r.calls, 2);
  fclose(fp);
  free(buf);
}

static void test_log_json_typed_fields(void **state) {
  (void)state;
  char *line = capture_log(GW_LOG_JSON, "iteration.done",
                           "iter=3 loss=2.5e-1 ok=true who=\"two words\" id=0x1f neg=-4 bad=\"q\\\" "
                           "peer=80635877 zeros=0042 zero=0 frac=0.5 stage=7");
  assert_non_null(strstr(line, "\"event\":\"iteration.done\""));
  assert_non_null(strstr(line, "\"stage\":2"));
  assert_non_null(strstr(line, "\"iter\":3"));
  assert_non_null(strstr(line, "\"loss\":2.5e-1"));
  assert_non_null(strstr(line, "\"ok\":true"));
  assert_non_null(strstr(line, "\"who\":\"two words\""));
  assert_non_null(strstr(line, "\"id\":\"0x1f\""));
  assert_non_null(strstr(line, "\"neg\":-4"));
  assert_non_null(strstr(line, "\"peer\":\"80635877\"")); /* an all-digit node ID stays a string */
  assert_non_null(strstr(line, "\"zeros\":\"0042\""));   /* not a JSON number */
  assert_non_null(strstr(line, "\"zero\":0,"));
  assert_non_null(strstr(line, "\"frac\":0.5"));
  assert_non_null(strstr(line, "\"field_stage\":7")); /* never a second "stage" key */
  assert_true(line[strlen(line) - 2] == '}');
  free(line);
}

static void test_file_atomic(void **state) {
  (void)state;
  char *dir = testutil_tmpdir();
  char path[600];
  snprintf(path, sizeof(path), "%s/sub/dir/f.bin", dir);
  char sub[600];
  snprintf(sub, sizeof(sub), "%s/sub/dir", dir);
  assert_int_equal(gw_mkdir_p(sub, 0700), 0);
  assert_int_equal(gw_file_write_atomic1(path, "hello", 5, 0600), 0);
  const void *parts[2] = {"ab", "cd"};
  size_t lens[2] = {2, 2};
  assert_int_equal(gw_file_write_atomic(path, parts, lens, 2, 0640), 0);
  uint8_t *data;
  size_t len;
  assert_int_equal(gw_file_read_all(path, 100, &data, &len), 0);
  assert_int_equal(len, 4);
  assert_memory_equal(data, "abcd", 4);
  free(data);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0640);
  assert_int_equal(gw_file_read_all(path, 3, &data, &len), GW_ERANGE);
  assert_true(gw_file_read_all("/nonexistent/x", 3, &data, &len) < 0);
  testutil_rmtree(dir);
  free(dir);
}

static void test_strerror(void **state) {
  (void)state;
  assert_string_equal(gw_strerror(GW_ETIMEDOUT), "timed out");
  assert_non_null(gw_strerror(-2)); /* an errno-style libuv code */
  assert_string_equal(gw_strerror(-99999), "unknown error");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_id_hex_roundtrip),    cmocka_unit_test(test_id_hash_distinct),
      cmocka_unit_test(test_addr_parse_format),   cmocka_unit_test(test_addr_split_names),
      cmocka_unit_test(test_addr_martians),       cmocka_unit_test(test_rng_replays),
      cmocka_unit_test(test_rng_ranges),          cmocka_unit_test(test_log_text), cmocka_unit_test(test_log_subscriber),
      cmocka_unit_test(test_log_json_typed_fields), cmocka_unit_test(test_file_atomic),
      cmocka_unit_test(test_strerror),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
