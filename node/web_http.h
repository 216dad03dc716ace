/* node/web_http.h — the live web view's HTTP server (`--http`, docs/WEB.md).
 *
 * Serves the page (web/, embedded in the binary: node/web_assets.h), a JSON
 * snapshot of a web_feed and its server-sent-events stream:
 *
 *   GET /                     the page (also /app.js, /style.css)
 *   GET /api/snapshot?since=N {"kind","seq","events":[...]}   application/json
 *   GET /api/events?since=N   text/event-stream (Last-Event-ID is honoured)
 *
 * Anything else is 404; a method other than GET/HEAD is 405; a request with
 * a body is 413; a request whose headers pass WEB_HTTP_REQUEST_MAX is refused
 * by libmicrohttpd itself.
 *
 * libmicrohttpd runs its own threads (one per connection, at most
 * WEB_HTTP_MAX_CONNECTIONS): the libuv loop never waits on a browser, and the
 * feed is already locked because the compute worker logs too. An SSE
 * connection's thread sleeps on the feed's condition variable.
 *
 * The page has no authentication: it binds to loopback unless the caller
 * passes allow_public (the --http-public flag), and then says so. */
#ifndef GWTF_NODE_WEB_HTTP_H
#define GWTF_NODE_WEB_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "node/web_feed.h"

#define WEB_HTTP_MAX_CONNECTIONS 32
#define WEB_HTTP_MAX_SSE 8            /* event streams at once; more get 503 */
#define WEB_HTTP_REQUEST_MAX (16 * 1024) /* request line and headers */
#define WEB_HTTP_SSE_BLOCK (WEB_FEED_EVENT_MAX + 4096)
#define WEB_HTTP_KEEPALIVE_MS 2000    /* a comment on an idle stream: a closed one frees its slot */
#define WEB_HTTP_IDLE_TIMEOUT_S 60

typedef struct web_http web_http;

/* Parses the --http value: "PORT" (on 127.0.0.1) or "IP:PORT" / "[v6]:PORT".
 * A non-loopback address needs allow_public; *is_public says whether it is
 * one. Returns 0, or GW_EINVAL with the reason in err. */
int web_http_parse_bind(const char *spec, bool allow_public, bool *is_public, char *err, size_t err_len);

/* Starts serving feed (which must outlive the server) on spec. Returns 0 and
 * the server in *out, or a negative code with the reason in err. */
int web_http_start(web_feed *feed, const char *spec, bool allow_public, web_http **out, char *err, size_t err_len);

/* "http://127.0.0.1:8080/" (the bound port, also when spec asked for port 0). */
const char *web_http_url(const web_http *h);

/* Closes the feed's streams, stops the threads, frees h. NULL is a no-op. */
void web_http_stop(web_http *h);

#endif
