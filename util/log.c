#include "util/log.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/err.h"

/* Long enough for any control event; longer field lists are cut, never overrun. */
#define LOG_LINE_MAX 2048
#define LOG_FIELDS_MAX 1536

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
static const char *const level_json[] = {"debug", "info", "warn", "error"};
static const char *const level_colors[] = {"\033[2m", "\033[32m", "\033[33m", "\033[31;1m"};

void gw_log_sink_init(gw_log_sink *sink, FILE *fp, gw_log_level level, gw_log_format format) {
  memset(sink, 0, sizeof(*sink));
  sink->fp = fp;
  sink->level = level;
  sink->format = format;
  sink->color = fp && format == GW_LOG_TEXT && isatty(fileno(fp));
}

void gw_log_sink_subscribe(gw_log_sink *sink, gw_log_feed fn, void *ud, gw_log_level level) {
  sink->feed = fn;
  sink->feed_ud = ud;
  sink->feed_level = level;
}

int gw_log_level_parse(const char *s, gw_log_level *out) {
  static const char *const names[] = {"debug", "info", "warn", "error", "off"};
  for (int i = 0; i < 5; i++)
    if (strcmp(s, names[i]) == 0) return (*out = (gw_log_level)i), 0;
  return GW_EINVAL;
}

int gw_log_format_parse(const char *s, gw_log_format *out) {
  if (strcmp(s, "text") == 0) return (*out = GW_LOG_TEXT), 0;
  if (strcmp(s, "json") == 0) return (*out = GW_LOG_JSON), 0;
  return GW_EINVAL;
}

void gw_log_init(gw_log *lg, const gw_log_sink *sink, const gw_id *node) {
  lg->sink = sink;
  lg->stage = -1;
  gw_log_set_node(lg, node);
}

void gw_log_set_node(gw_log *lg, const gw_id *node) {
  if (node)
    gw_id_to_short(node, lg->node);
  else
    snprintf(lg->node, sizeof(lg->node), "-");
}

void gw_log_set_stage(gw_log *lg, int stage) { lg->stage = stage; }

static bool to_terminal(const gw_log_sink *sink, gw_log_level level) {
  return sink->fp && level >= sink->level && level < GW_LOG_OFF;
}

static bool to_feed(const gw_log_sink *sink, gw_log_level level) {
  return sink->feed && level >= sink->feed_level && level < GW_LOG_OFF;
}

bool gw_log_enabled(const gw_log *lg, gw_log_level level) {
  return lg && lg->sink && (to_terminal(lg->sink, level) || to_feed(lg->sink, level));
}

static void format_time(char *out, size_t n) {
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + k, n - k, ".%03dZ", (int)(tv.tv_usec / 1000));
}

/* Appends s to buf[*len..cap) as a JSON string body (without quotes). */
static void json_escape(char *buf, size_t *len, size_t cap, const char *s, size_t n) {
  for (size_t i = 0; i < n && *len + 7 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      buf[(*len)++] = '\\';
      buf[(*len)++] = (char)c;
    } else if (c < 0x20) {
      *len += (size_t)snprintf(buf + *len, cap - *len, "\\u%04x", c);
    } else {
      buf[(*len)++] = (char)c;
    }
  }
}

static bool is_json_number(const char *s, size_t n) {
  char tmp[64];
  if (n == 0 || n >= sizeof(tmp)) return false;
  if (!(isdigit((unsigned char)s[0]) || (s[0] == '-' && n > 1 && isdigit((unsigned char)s[1]))))
    return false;
  const char *digits = s[0] == '-' ? s + 1 : s;
  if (digits[0] == '0' && digits + 1 < s + n && isdigit((unsigned char)digits[1]))
    return false; /* JSON has no leading zeros: "0042" stays a string */
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end = NULL;
  double v = strtod(tmp, &end);
  /* no hex floats, inf or nan, and nothing that overflows to one ("1e999") */
  return end == tmp + n && !strpbrk(tmp, "xXnN") && isfinite(v);
}

/* Keys whose values name something (node IDs, hashes, segment and
 * microbatch IDs in hex): always strings, even when every digit is 0-9. */
static bool is_identifier_key(const char *k, size_t n) {
  static const char *const keys[] = {"peer", "node", "from", "to", "by", "target", "leader", "id", "in", "out",
                                     "session", "via", "suspect", "resend_from", "aggregator", "mb", "hash", "seg",
                                     "flow", "publisher", "key", "theirs", "mine", "from_peer", "addr", "who",
                                     "origin"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    if (strlen(keys[i]) == n && memcmp(keys[i], k, n) == 0) return true;
  return false;
}

static bool is_reserved_key(const char *k, size_t n) {
  static const char *const keys[] = {"ts", "level", "node", "stage", "event"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    if (strlen(keys[i]) == n && memcmp(keys[i], k, n) == 0) return true;
  return false;
}

/* Turns "k=v k2=\"a b\"" into ,"k":v,"k2":"a b" — numbers and booleans keep
 * their type, everything else (and every identifier key) becomes a string.
 * A token without '=' is kept under the key "msg". */
static void fields_to_json(char *buf, size_t *len, size_t cap, const char *f) {
  const char *p = f;
  while (*p && *len + 16 < cap) {
    while (*p == ' ') p++;
    if (!*p) break;
    const char *key = p, *eq = NULL;
    while (*p && *p != ' ' && *p != '=') p++;
    size_t klen = (size_t)(p - key);
    const char *val;
    size_t vlen;
    bool quoted = false;
    if (*p == '=') {
      eq = p++;
      if (*p == '"') {
        quoted = true;
        val = ++p;
        while (*p && *p != '"') p++;
        vlen = (size_t)(p - val);
        if (*p == '"') p++;
      } else {
        val = p;
        while (*p && *p != ' ') p++;
        vlen = (size_t)(p - val);
      }
    } else {
      val = key;
      vlen = klen;
      key = "msg";
      klen = 3;
    }
    (void)eq;
    buf[(*len)++] = ',';
    buf[(*len)++] = '"';
    /* A field must not repeat one of the line's own keys: JSON readers keep
     * only one of two equal keys. */
    if (is_reserved_key(key, klen)) {
      memcpy(buf + *len, "field_", 6);
      *len += 6;
    }
    json_escape(buf, len, cap, key, klen);
    buf[(*len)++] = '"';
    buf[(*len)++] = ':';
    bool literal = !quoted && !is_identifier_key(key, klen) &&
                   (is_json_number(val, vlen) || (vlen == 4 && !memcmp(val, "true", 4)) ||
                    (vlen == 5 && !memcmp(val, "false", 5)));
    if (literal) {
      if (*len + vlen < cap) {
        memcpy(buf + *len, val, vlen);
        *len += vlen;
      }
    } else {
      buf[(*len)++] = '"';
      json_escape(buf, len, cap, val, vlen);
      if (*len < cap) buf[(*len)++] = '"';
    }
  }
}

static size_t render_text(const gw_log *lg, gw_log_level level, const char *event, const char *ts,
                          const char *fields, char *line) {
  char stage[12];
  const gw_log_sink *sink = lg->sink;
  if (lg->stage >= 0)
    snprintf(stage, sizeof(stage), "s%d", lg->stage);
  else
    snprintf(stage, sizeof(stage), "-");
  int n;
  if (sink->color)
    n = snprintf(line, LOG_LINE_MAX, "\033[2m%s\033[0m %s%-5s\033[0m %s %s \033[1m%s\033[0m%s%s", ts,
                 level_colors[level], level_names[level], lg->node, stage, event, *fields ? " " : "",
                 fields);
  else
    n = snprintf(line, LOG_LINE_MAX, "%s %-5s %s %s %s%s%s", ts, level_names[level], lg->node, stage,
                 event, *fields ? " " : "", fields);
  if (n < 0) return 0;
  return (size_t)n < LOG_LINE_MAX ? (size_t)n : LOG_LINE_MAX - 1;
}

static size_t render_json(const gw_log *lg, gw_log_level level, const char *event, const char *ts,
                          const char *fields, char *line) {
  size_t len = 0;
  int n = snprintf(line, LOG_LINE_MAX, "{\"ts\":\"%s\",\"level\":\"%s\",\"node\":\"%s\",\"stage\":", ts,
                   level_json[level], lg->node);
  len = (size_t)n;
  if (lg->stage >= 0)
    len += (size_t)snprintf(line + len, LOG_LINE_MAX - len, "%d", lg->stage);
  else
    len += (size_t)snprintf(line + len, LOG_LINE_MAX - len, "null");
  len += (size_t)snprintf(line + len, LOG_LINE_MAX - len, ",\"event\":\"");
  json_escape(line, &len, LOG_LINE_MAX - 4, event, strlen(event));
  line[len++] = '"';
  fields_to_json(line, &len, LOG_LINE_MAX - 4, fields);
  line[len++] = '}';
  line[len] = '\0';
  return len;
}

void gw_log_event(const gw_log *lg, gw_log_level level, const char *event, const char *fmt, ...) {
  if (!gw_log_enabled(lg, level)) return;
  char fields[LOG_FIELDS_MAX];
  char ts[40];
  char line[LOG_LINE_MAX + 1];
  va_list ap;
  va_start(ap, fmt);
  if (fmt) vsnprintf(fields, sizeof(fields), fmt, ap);
  else fields[0] = '\0';
  va_end(ap);
  format_time(ts, sizeof(ts));
  const gw_log_sink *sink = lg->sink;
  bool term = to_terminal(sink, level), feed = to_feed(sink, level);
  size_t len = 0;
  if (term) {
    len = sink->format == GW_LOG_JSON ? render_json(lg, level, event, ts, fields, line)
                                      : render_text(lg, level, event, ts, fields, line);
    line[len] = '\n';
    fwrite(line, 1, len + 1, sink->fp);
    fflush(sink->fp);
    line[len] = '\0';
    if (sink->hook) sink->hook(sink->hook_ud, level, event, line);
  }
  if (feed) {
    /* One event, one rendering: the terminal's JSON line is reused. */
    if (!term || sink->format != GW_LOG_JSON) len = render_json(lg, level, event, ts, fields, line);
    sink->feed(sink->feed_ud, level, lg->node, event, line, len);
  }
}
