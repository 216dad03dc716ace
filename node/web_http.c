#include "node/web_http.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/web_assets.h"
#include "util/addr.h"
#include "util/err.h"

struct web_http {
  struct MHD_Daemon *d;
  web_feed *feed;
  pthread_mutex_t mu;
  int n_sse;
  char url[GW_ADDR_STRLEN + 16];
};

/* One event stream being served. */
typedef struct sse_conn {
  web_http *h;
  uint64_t after;
  bool greeted;
} sse_conn;

/* ---- binding ---- */

static bool is_loopback(const gw_addr *a) {
  static const uint8_t v6_loop[16] = {[15] = 1};
  return (a->family == 4 && a->ip[0] == 127) || (a->family == 6 && memcmp(a->ip, v6_loop, 16) == 0);
}

/* spec -> address; "PORT" alone means 127.0.0.1:PORT. */
static int parse_spec(const char *spec, gw_addr *a) {
  char buf[80];
  const char *s = spec;
  if (spec[0] && strspn(spec, "0123456789") == strlen(spec)) {
    snprintf(buf, sizeof(buf), "127.0.0.1:%s", spec);
    s = buf;
  }
  return gw_addr_parse(s, a);
}

int web_http_parse_bind(const char *spec, bool allow_public, bool *is_public, char *err, size_t err_len) {
  gw_addr a;
  if (!spec || parse_spec(spec, &a) != 0) {
    snprintf(err, err_len, "--http '%s': expected PORT or IP:PORT, e.g. 8080 or 127.0.0.1:8080", spec ? spec : "");
    return GW_EINVAL;
  }
  *is_public = !is_loopback(&a);
  if (*is_public && !allow_public) {
    snprintf(err, err_len,
             "--http '%s': the live view has no authentication and binds to loopback only; add --http-public to "
             "serve it on other addresses",
             spec);
    return GW_EINVAL;
  }
  return 0;
}

/* ---- responses ---- */

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned status, const char *type, const void *data,
                                size_t len, enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, mode);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  /* The page loads nothing from elsewhere, and nothing may frame it. */
  MHD_add_response_header(r, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *text) {
  return send_buf(c, status, "text/plain; charset=utf-8", text, strlen(text), MHD_RESPMEM_PERSISTENT);
}

/* ?since=N, else 0. Garbage is 0 too: the client then gets everything. */
static uint64_t arg_u64(struct MHD_Connection *c, enum MHD_ValueKind kind, const char *name) {
  const char *v = MHD_lookup_connection_value(c, kind, name);
  if (!v || !*v) return 0;
  char *end = NULL;
  unsigned long long n = strtoull(v, &end, 10);
  return end && *end == '\0' ? (uint64_t)n : 0;
}

static enum MHD_Result serve_snapshot(web_http *h, struct MHD_Connection *c) {
  size_t len = 0;
  char *json = web_feed_snapshot(h->feed, arg_u64(c, MHD_GET_ARGUMENT_KIND, "since"), &len);
  if (!json) return send_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n");
  return send_buf(c, MHD_HTTP_OK, "application/json", json, len, MHD_RESPMEM_MUST_FREE);
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  sse_conn *s = cls;
  (void)pos;
  if (!s->greeted) { /* the browser reconnects after 2 s if the stream breaks */
    static const char hello[] = "retry: 2000\n\n";
    s->greeted = true;
    if (max >= sizeof(hello)) {
      memcpy(buf, hello, sizeof(hello) - 1);
      return (ssize_t)(sizeof(hello) - 1);
    }
  }
  long n = web_feed_next(s->h->feed, &s->after, buf, max, WEB_HTTP_KEEPALIVE_MS);
  if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
  if (n == 0) {
    static const char ka[] = ": keepalive\n\n";
    if (max < sizeof(ka)) return MHD_CONTENT_READER_END_WITH_ERROR;
    memcpy(buf, ka, sizeof(ka) - 1);
    return (ssize_t)(sizeof(ka) - 1);
  }
  return (ssize_t)n;
}

static void sse_free(void *cls) {
  sse_conn *s = cls;
  pthread_mutex_lock(&s->h->mu);
  s->h->n_sse--;
  pthread_mutex_unlock(&s->h->mu);
  free(s);
}

static enum MHD_Result serve_events(web_http *h, struct MHD_Connection *c) {
  pthread_mutex_lock(&h->mu);
  bool full = h->n_sse >= WEB_HTTP_MAX_SSE;
  if (!full) h->n_sse++;
  pthread_mutex_unlock(&h->mu);
  if (full) return send_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "too many event streams\n");
  sse_conn *s = calloc(1, sizeof(*s));
  struct MHD_Response *r = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, WEB_HTTP_SSE_BLOCK, sse_read, s,
                                                                 sse_free)
                             : NULL;
  if (!r) {
    if (s) free(s);
    pthread_mutex_lock(&h->mu);
    h->n_sse--;
    pthread_mutex_unlock(&h->mu);
    return MHD_NO;
  }
  s->h = h;
  uint64_t since = arg_u64(c, MHD_GET_ARGUMENT_KIND, "since"), last_id = arg_u64(c, MHD_HEADER_KIND, "Last-Event-ID");
  s->after = last_id > since ? last_id : since;
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **req_cls) {
  web_http *h = cls;
  static int marker;
  (void)version;
  (void)upload_data;
  bool get = !strcmp(method, MHD_HTTP_METHOD_GET), head = !strcmp(method, MHD_HTTP_METHOD_HEAD);
  if (!get && !head) return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
  /* Nothing here takes a body: refuse one before reading it. */
  const char *clen = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if ((clen && strcmp(clen, "0") != 0) ||
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING))
    return send_text(c, MHD_HTTP_CONTENT_TOO_LARGE, "no body expected\n");
  if (*req_cls == NULL) { /* the first call, with the headers: answer at the next */
    *req_cls = &marker;
    return MHD_YES;
  }
  if (*upload_data_size != 0) return MHD_NO; /* a body after all: drop the connection */
  if (!strcmp(url, "/api/snapshot")) return serve_snapshot(h, c);
  if (!strcmp(url, "/api/events")) return serve_events(h, c);
  const web_asset *a = web_asset_find(url);
  if (!a) return send_text(c, MHD_HTTP_NOT_FOUND, "not found\n");
  return send_buf(c, MHD_HTTP_OK, a->type, a->data, a->len, MHD_RESPMEM_PERSISTENT);
}

/* ---- lifetime ---- */

static void to_sockaddr(const gw_addr *a, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof(*ss));
  if (a->family == 4) {
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    in->sin_family = AF_INET;
    in->sin_port = htons(a->port);
    memcpy(&in->sin_addr, a->ip, 4);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(a->port);
    memcpy(&in6->sin6_addr, a->ip, 16);
  }
}

int web_http_start(web_feed *feed, const char *spec, bool allow_public, web_http **out, char *err, size_t err_len) {
  bool pub;
  int rc = web_http_parse_bind(spec, allow_public, &pub, err, err_len);
  if (rc != 0) return rc;
  gw_addr a;
  parse_spec(spec, &a);
  web_http *h = calloc(1, sizeof(*h));
  if (!h) return GW_ENOMEM;
  h->feed = feed;
  pthread_mutex_init(&h->mu, NULL);
  struct sockaddr_storage ss;
  to_sockaddr(&a, &ss);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | (a.family == 6 ? MHD_USE_IPv6 : 0);
  h->d = MHD_start_daemon(flags, a.port, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)WEB_HTTP_MAX_CONNECTIONS,
                          MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)WEB_HTTP_REQUEST_MAX,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)WEB_HTTP_IDLE_TIMEOUT_S, MHD_OPTION_END);
  if (!h->d) {
    snprintf(err, err_len, "--http %s: cannot listen there (in use, or not an address of this machine)", spec);
    pthread_mutex_destroy(&h->mu);
    free(h);
    return GW_EIO;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  if (info && info->port) a.port = info->port;
  char as[GW_ADDR_STRLEN];
  gw_addr_format(&a, as);
  snprintf(h->url, sizeof(h->url), "http://%s/", as);
  *out = h;
  return 0;
}

const char *web_http_url(const web_http *h) { return h->url; }

void web_http_stop(web_http *h) {
  if (!h) return;
  web_feed_close(h->feed); /* event streams end now rather than at their next keepalive */
  MHD_stop_daemon(h->d);
  pthread_mutex_destroy(&h->mu);
  free(h);
}
