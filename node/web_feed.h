/* node/web_feed.h — the live web view's event store: the log events, kept
 * for the page (docs/WEB.md).
 *
 * The log stream is the single source of truth: a node subscribes its log
 * sink to a feed (web_feed_log_cb), `gwtf swarm` pushes its children's JSON
 * lines into one. The feed numbers events (seq, from 1) and keeps, bounded:
 *   - a ring of the latest WEB_FEED_RING events of every kind;
 *   - the curves' points (iteration.done, eval.done): WEB_FEED_CURVE of them,
 *     so a long run keeps its loss curve when the ring has moved on;
 *   - the latest event per (process, node, kind) for the kinds that say who a
 *     member is (node.listening, compute.ready, stage.announced, ...), so the
 *     page can show a stage's members however long ago they joined.
 * A snapshot is the union of the three in seq order; then the page follows
 * new events with server-sent events (web_feed_next).
 *
 * Thread-safe: events arrive from the loop and the compute worker, readers
 * are the HTTP server's threads. Nothing here blocks for long: a push takes
 * the lock for one copy; web_feed_next waits on a condition variable. */
#ifndef GWTF_NODE_WEB_FEED_H
#define GWTF_NODE_WEB_FEED_H

#include <stddef.h>
#include <stdint.h>

#include "util/log.h"

#define WEB_FEED_RING 8192
#define WEB_FEED_CURVE 4096
#define WEB_FEED_STICKY 2048
#define WEB_FEED_EVENT_MAX 8192 /* bytes of one event's JSON; longer ones are dropped */

typedef struct web_feed web_feed;

/* kind: "node" or "swarm", told to the page. Returns NULL without memory. */
web_feed *web_feed_new(const char *kind);
void web_feed_free(web_feed *wf);

/* Adds one event: json is one JSON object ({...}, no newline), event its
 * name, node the short node ID ("-" or NULL if none), src the process that
 * logged it in a swarm (NULL for a single node: then the line is kept as it
 * is; else "src":"NAME" is added to the object). Returns its seq, or 0 when
 * it was dropped (not an object, too long, no memory, feed closed). */
uint64_t web_feed_push(web_feed *wf, const char *src, const char *node, const char *event, const char *json,
                       size_t len);

/* A gw_log_feed (util/log.h) that pushes into the web_feed given as ud. */
void web_feed_log_cb(void *ud, gw_log_level level, const char *node, const char *event, const char *json,
                     size_t len);

/* {"kind":K,"seq":LAST,"events":[...]} of the kept events with seq > since,
 * oldest first. Returns a malloc'd string (length in *len) or NULL. */
char *web_feed_snapshot(web_feed *wf, uint64_t since, size_t *len);

/* Server-sent events after *after, written to buf as "id: SEQ\ndata: JSON\n\n"
 * frames, as many whole frames as fit in cap. Waits up to timeout_ms for the
 * first. A reader that fell behind the ring gets one "event: reset" frame
 * (the page then takes a new snapshot) and continues from the newest event.
 * Returns the bytes written (0: nothing new within timeout_ms) or GW_ECLOSED
 * once web_feed_close was called. *after advances past what was written. */
long web_feed_next(web_feed *wf, uint64_t *after, char *buf, size_t cap, int timeout_ms);

/* The newest seq (0: none yet). */
uint64_t web_feed_last(web_feed *wf);

/* Wakes every waiting reader and makes further ones return GW_ECLOSED. */
void web_feed_close(web_feed *wf);

#endif
