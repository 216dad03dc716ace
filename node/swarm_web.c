#include "node/swarm_web.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "node/web_feed.h"
#include "node/web_http.h"
#include "util/err.h"

struct swarm_web {
  web_feed *feed;
  web_http *http;
};

int swarm_web_check(const char *spec, bool allow_public, bool *is_public, char *err, size_t err_len) {
  return web_http_parse_bind(spec, allow_public, is_public, err, err_len);
}

int swarm_web_start(const char *spec, bool allow_public, swarm_web **out, char *err, size_t err_len) {
  swarm_web *w = calloc(1, sizeof(*w));
  if (!w || !(w->feed = web_feed_new("swarm"))) {
    free(w);
    snprintf(err, err_len, "out of memory");
    return GW_ENOMEM;
  }
  int rc = web_http_start(w->feed, spec, allow_public, &w->http, err, err_len);
  if (rc != 0) {
    web_feed_free(w->feed);
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

const char *swarm_web_url(const swarm_web *w) { return web_http_url(w->http); }

void swarm_web_line(swarm_web *w, const char *src, const char *node, const char *event, const char *line) {
  if (w && event) web_feed_push(w->feed, src, node, event, line, strlen(line));
}

void swarm_web_note(swarm_web *w, const char *src, const char *level, const char *event, const char *fields) {
  if (!w) return;
  struct timeval tv;
  struct tm tm;
  char ts[40], line[512];
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t k = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + k, sizeof(ts) - k, ".%03dZ", (int)(tv.tv_usec / 1000));
  int n = snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"%s\",\"node\":\"-\",\"stage\":null,\"event\":\"%s\"%s%s}",
                   ts, level, event, *fields ? "," : "", fields);
  if (n > 0 && (size_t)n < sizeof(line)) web_feed_push(w->feed, src, "-", event, line, (size_t)n);
}

void swarm_web_stop(swarm_web *w) {
  if (!w) return;
  web_http_stop(w->http);
  web_feed_free(w->feed);
  free(w);
}
