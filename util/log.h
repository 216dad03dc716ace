/* util/log.h — one line per event, for people (text) or tools (JSON).
 *
 * Every line carries the wall time, the level, the short node ID, the stage
 * and an event name, then key=value fields:
 *
 *   2026-11-22T10:00:00.123Z INFO  a1b2c3d4 s2 flow.established flow=9f3a peer=77c0e1aa cost=12.5
 *
 * With GW_LOG_JSON the same line is one JSON object whose fields are typed
 * (numbers stay numbers; identifier keys such as peer, node, mb, hash are
 * always strings, even when a hex ID happens to be all digits). Field values
 * must not contain spaces unless they are double-quoted: key="two words".
 *
 * A gw_log is a cheap per-node context (many DHT nodes share one process in
 * benchmarks, each with its own ID in its lines); the sink it points to holds
 * the process-wide settings. Lines are written with a single fwrite, so lines
 * from the compute worker thread never interleave with the loop's. */
#ifndef GWTF_UTIL_LOG_H
#define GWTF_UTIL_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util/id.h"

typedef enum gw_log_level {
  GW_LOG_DEBUG = 0,
  GW_LOG_INFO = 1,
  GW_LOG_WARN = 2,
  GW_LOG_ERROR = 3,
  GW_LOG_OFF = 4,
} gw_log_level;

typedef enum gw_log_format { GW_LOG_TEXT = 0, GW_LOG_JSON = 1 } gw_log_format;

/* Called after a line is written (tests and `gwtf swarm` count events with it).
 * line has no trailing newline. */
typedef void (*gw_log_hook)(void *ud, gw_log_level level, const char *event, const char *line);

/* The fan-out to a second consumer (the live web view, node/web_feed.h): it
 * receives every event at or above its own level as one JSON object (the
 * --log-format json rendering, whatever the terminal's format), with the
 * short node ID and event name beside it. It is called from whichever thread
 * logged the event (the loop or the compute worker), so it must lock what it
 * touches, and it must not block. */
typedef void (*gw_log_feed)(void *ud, gw_log_level level, const char *node, const char *event, const char *json,
                            size_t len);

typedef struct gw_log_sink {
  FILE *fp;
  gw_log_level level;
  gw_log_format format;
  bool color; /* ANSI colours; only ever on when fp is a TTY */
  gw_log_hook hook;
  void *hook_ud;
  gw_log_feed feed; /* NULL: no subscriber */
  void *feed_ud;
  gw_log_level feed_level;
} gw_log_sink;

typedef struct gw_log {
  const gw_log_sink *sink; /* NULL: the logger is silent */
  char node[GW_ID_SHORT_LEN + 1];
  int stage; /* -1 prints "-" */
} gw_log;

/* Colour is enabled only when fp is a terminal. */
void gw_log_sink_init(gw_log_sink *sink, FILE *fp, gw_log_level level, gw_log_format format);
/* Subscribes fn to every event at or above level (one subscriber per sink;
 * fn NULL unsubscribes). Events below the terminal's level still reach it. */
void gw_log_sink_subscribe(gw_log_sink *sink, gw_log_feed fn, void *ud, gw_log_level level);
/* Parses "debug|info|warn|error|off" / "text|json". Return 0 or GW_EINVAL. */
int gw_log_level_parse(const char *s, gw_log_level *out);
int gw_log_format_parse(const char *s, gw_log_format *out);

/* node may be NULL ("-" until the identity is known). */
void gw_log_init(gw_log *lg, const gw_log_sink *sink, const gw_id *node);
void gw_log_set_node(gw_log *lg, const gw_id *node);
void gw_log_set_stage(gw_log *lg, int stage);
bool gw_log_enabled(const gw_log *lg, gw_log_level level);

void gw_log_event(const gw_log *lg, gw_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define GW_DEBUG(lg, ev, ...) \
  do { if (gw_log_enabled((lg), GW_LOG_DEBUG)) gw_log_event((lg), GW_LOG_DEBUG, (ev), __VA_ARGS__); } while (0)
#define GW_INFO(lg, ev, ...) gw_log_event((lg), GW_LOG_INFO, (ev), __VA_ARGS__)
#define GW_WARN(lg, ev, ...) gw_log_event((lg), GW_LOG_WARN, (ev), __VA_ARGS__)
#define GW_ERROR(lg, ev, ...) gw_log_event((lg), GW_LOG_ERROR, (ev), __VA_ARGS__)

#endif
