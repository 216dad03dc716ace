/* node/web_feed: what the live view keeps of the log events, how a snapshot
 * and the server-sent-events frames look, and its bounds. */
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "node/web_feed.h"
#include "util/err.h"

static uint64_t push(web_feed *wf, const char *src, const char *node, const char *event, const char *extra) {
  char line[512];
  int n = snprintf(line, sizeof(line), "{\"ts\":\"t\",\"level\":\"info\",\"node\":\"%s\",\"stage\":1,\"event\":\"%s\"%s}",
                   node, event, extra);
  return web_feed_push(wf, src, node, event, line, (size_t)n);
}

static json_t *snapshot(web_feed *wf, uint64_t since) {
  size_t len = 0;
  char *s = web_feed_snapshot(wf, since, &len);
  assert_non_null(s);
  assert_int_equal(strlen(s), len);
  json_error_t err;
  json_t *j = json_loads(s, 0, &err);
  if (!j) fail_msg("snapshot is not JSON: %s", err.text);
  free(s);
  return j;
}

static size_t count_event(json_t *events, const char *name) {
  size_t n = 0, i;
  json_t *e;
  json_array_foreach(events, i, e) n += !strcmp(json_string_value(json_object_get(e, "event")), name);
  return n;
}

static void test_snapshot_in_order(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("swarm");
  assert_int_equal(push(wf, "r1", "aaaa1111", "node.listening", ",\"addr\":\"127.0.0.1:1\""), 1);
  assert_int_equal(push(wf, NULL, "bbbb2222", "flow.changed", ""), 2);
  assert_int_equal(push(wf, "r2", "cccc3333", "x.y", ""), 3);
  json_t *j = snapshot(wf, 0);
  assert_string_equal(json_string_value(json_object_get(j, "kind")), "swarm");
  assert_int_equal(json_integer_value(json_object_get(j, "seq")), 3);
  json_t *ev = json_object_get(j, "events");
  assert_int_equal(json_array_size(ev), 3);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "src")), "r1");
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "addr")), "127.0.0.1:1");
  assert_null(json_object_get(json_array_get(ev, 1), "src"));
  json_decref(j);
  j = snapshot(wf, 2); /* since: only what came after */
  assert_int_equal(json_array_size(json_object_get(j, "events")), 1);
  json_decref(j);
  web_feed_free(wf);
}

static void test_rejects_what_is_not_one_object(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("node");
  assert_int_equal(web_feed_push(wf, NULL, "-", "a.b", "[1]", 3), 0);
  assert_int_equal(web_feed_push(wf, NULL, "-", "a.b", "{\"a\":\n1}", 8), 0);
  assert_int_equal(web_feed_push(wf, "bad\"name", "-", "a.b", "{}", 2), 0);
  char *big = malloc(WEB_FEED_EVENT_MAX + 2);
  memset(big, ' ', WEB_FEED_EVENT_MAX + 1);
  big[0] = '{';
  big[WEB_FEED_EVENT_MAX] = '}';
  assert_int_equal(web_feed_push(wf, NULL, "-", "a.b", big, WEB_FEED_EVENT_MAX + 1), 0);
  free(big);
  assert_int_equal(web_feed_push(wf, "r0", "-", "a.b", "{}", 2), 1); /* the smallest object, with a src */
  json_t *j = snapshot(wf, 0);
  assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(j, "events"), 0), "src")), "r0");
  json_decref(j);
  web_feed_free(wf);
}

/* Past the ring, members and curve points are still there; the rest is not. */
static void test_bounds_keep_members_and_curves(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("swarm");
  push(wf, "r1", "aaaa1111", "compute.ready", ",\"device\":\"old\"");
  push(wf, "r1", "aaaa1111", "compute.ready", ",\"device\":\"cpu\"");
  push(wf, "d0", "dddd0000", "iteration.done", ",\"iter\":0,\"loss\":5.5");
  push(wf, "r1", "aaaa1111", "flow.changed", "");
  for (int i = 0; i < WEB_FEED_RING + 100; i++) push(wf, "r2", "bbbb2222", "compute.done", "");
  json_t *j = snapshot(wf, 0);
  json_t *ev = json_object_get(j, "events");
  assert_int_equal(count_event(ev, "compute.ready"), 1); /* the latest per node */
  assert_int_equal(count_event(ev, "iteration.done"), 1);
  assert_int_equal(count_event(ev, "flow.changed"), 0); /* fell off the ring */
  assert_int_equal(count_event(ev, "compute.done"), WEB_FEED_RING);
  assert_string_equal(json_string_value(json_object_get(json_array_get(ev, 0), "device")), "cpu");
  json_decref(j);
  /* the curve ring is bounded too */
  for (int k = 0; k < WEB_FEED_CURVE + 10; k++) push(wf, "d0", "dddd0000", "iteration.done", ",\"iter\":1");
  for (int k = 0; k < WEB_FEED_RING; k++) push(wf, "r2", "bbbb2222", "compute.done", "");
  j = snapshot(wf, 0);
  assert_int_equal(count_event(json_object_get(j, "events"), "iteration.done"), WEB_FEED_CURVE);
  json_decref(j);
  web_feed_free(wf);
}

static void test_sse_frames_reset_and_close(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("node");
  static char buf[WEB_FEED_EVENT_MAX * 4];
  uint64_t after = 0;
  assert_int_equal(web_feed_next(wf, &after, buf, sizeof(buf), 10), 0); /* nothing yet: a timeout */
  push(wf, NULL, "aaaa1111", "a.one", "");
  push(wf, NULL, "aaaa1111", "a.two", "");
  long n = web_feed_next(wf, &after, buf, sizeof(buf), 1000);
  assert_true(n > 0);
  buf[n] = '\0';
  assert_non_null(strstr(buf, "id: 1\ndata: {"));
  assert_non_null(strstr(buf, "\"event\":\"a.two\"}\n\n"));
  assert_int_equal(after, 2);
  /* a small buffer takes whole frames only */
  after = 0;
  n = web_feed_next(wf, &after, buf, 150, 1000);
  assert_true(n > 0 && n <= 150);
  assert_int_equal(after, 1);
  /* a reader left behind by the ring is told to start over */
  for (int i = 0; i < WEB_FEED_RING + 5; i++) push(wf, NULL, "aaaa1111", "a.many", "");
  after = 1;
  n = web_feed_next(wf, &after, buf, sizeof(buf), 1000);
  buf[n] = '\0';
  assert_string_equal(buf, "event: reset\ndata: {}\n\n");
  assert_int_equal(after, web_feed_last(wf));
  after = web_feed_last(wf) + 100; /* an id from another run */
  assert_int_equal(web_feed_next(wf, &after, buf, sizeof(buf), 10), 0);
  web_feed_close(wf);
  assert_int_equal(web_feed_next(wf, &after, buf, sizeof(buf), 1000), GW_ECLOSED);
  assert_int_equal(push(wf, NULL, "aaaa1111", "a.late", ""), 0);
  web_feed_free(wf);
}

static void *late_push(void *arg) {
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL); /* the reader is (almost surely) waiting by now; either way it must see the event */
  push(arg, NULL, "aaaa1111", "a.woken", "");
  return NULL;
}

static void test_waiting_reader_is_woken(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("node");
  pthread_t t;
  pthread_create(&t, NULL, late_push, wf);
  static char buf[4096];
  uint64_t after = 0;
  long n = web_feed_next(wf, &after, buf, sizeof(buf), 10000);
  pthread_join(t, NULL);
  assert_true(n > 0);
  assert_int_equal(after, 1);
  web_feed_free(wf);
}

/* The log sink's subscriber: every INFO+ event arrives as JSON, whatever
 * the terminal's format and level. */
static void test_log_fan_out(void **state) {
  (void)state;
  web_feed *wf = web_feed_new("node");
  gw_log_sink sink;
  gw_log_sink_init(&sink, NULL, GW_LOG_OFF, GW_LOG_TEXT); /* no terminal at all */
  gw_log_sink_subscribe(&sink, web_feed_log_cb, wf, GW_LOG_INFO);
  gw_log lg;
  gw_log_init(&lg, &sink, NULL);
  gw_log_set_stage(&lg, 2);
  GW_DEBUG(&lg, "x.debug", "a=1");
  GW_INFO(&lg, "iteration.done", "iter=3 loss=4.5 peer=0123");
  json_t *j = snapshot(wf, 0);
  json_t *ev = json_object_get(j, "events");
  assert_int_equal(json_array_size(ev), 1);
  json_t *e = json_array_get(ev, 0);
  assert_string_equal(json_string_value(json_object_get(e, "event")), "iteration.done");
  assert_int_equal(json_integer_value(json_object_get(e, "stage")), 2);
  assert_true(json_real_value(json_object_get(e, "loss")) == 4.5);
  assert_string_equal(json_string_value(json_object_get(e, "peer")), "0123");
  json_decref(j);
  web_feed_free(wf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_snapshot_in_order),        cmocka_unit_test(test_rejects_what_is_not_one_object),
      cmocka_unit_test(test_bounds_keep_members_and_curves), cmocka_unit_test(test_sse_frames_reset_and_close),
      cmocka_unit_test(test_waiting_reader_is_woken),  cmocka_unit_test(test_log_fan_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
