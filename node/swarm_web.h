/* node/swarm_web.h — `gwtf swarm --http`: the live web view of a local
 * swarm, fed with the merged log streams of its children (docs/WEB.md).
 *
 * Each child's JSON log line goes into one web_feed with "src" naming the
 * process (d0, r3, ...); the swarm's own notices about its processes (start,
 * kill, exit) go in as events of the same shape: swarm.start, swarm.kill,
 * swarm.exit. Only the loop's thread calls these. */
#ifndef GWTF_NODE_SWARM_WEB_H
#define GWTF_NODE_SWARM_WEB_H

#include <stdbool.h>
#include <stddef.h>

typedef struct swarm_web swarm_web;

/* Checks the --http value (node/web_http.h rules) before anything starts.
 * Returns 0 or GW_EINVAL with the reason in err. */
int swarm_web_check(const char *spec, bool allow_public, bool *is_public, char *err, size_t err_len);
int swarm_web_start(const char *spec, bool allow_public, swarm_web **out, char *err, size_t err_len);
const char *swarm_web_url(const swarm_web *w);

/* One JSON log line of child src (node and event as parsed from it). */
void swarm_web_line(swarm_web *w, const char *src, const char *node, const char *event, const char *line);

/* The swarm's own event about process src; fields: JSON members without
 * braces, e.g. "\"generation\":2" (may be ""). */
void swarm_web_note(swarm_web *w, const char *src, const char *level, const char *event, const char *fields);

void swarm_web_stop(swarm_web *w); /* NULL is a no-op */

#endif
