#include "node/web_feed.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/err.h"

/* A kept event: its own copy of the JSON text. */
typedef struct wf_ent {
  uint64_t seq;
  size_t len;
  char *json;
  char *key; /* sticky entries: "src|node|event" */
} wf_ent;

/* A bounded ring of events, oldest evicted first. */
typedef struct wf_ring {
  wf_ent *e;
  size_t cap, n, head; /* head: where the next one goes */
} wf_ring;

struct web_feed {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  char kind[16];
  uint64_t seq;
  bool closed;
  wf_ring ring, curve;
  wf_ent sticky[WEB_FEED_STICKY];
  size_t n_sticky;
};

/* The kinds of event that say who a member is: the latest of each, per
 * process and node, outlives the ring. */
static const char *const sticky_events[] = {
    "node.listening", "compute.ready", "stage.announced", "stage.assigned", "nat.reachability", "peer.ready",
    "run.created",    "run.found",     "leader.elected",  "train.resync",   "node.stopping",    "node.stopped",
    "debug.crash",    "swarm.start",   "swarm.exit",      "swarm.kill",     "run.finished",
};

static bool is_sticky(const char *event) {
  for (size_t i = 0; i < sizeof(sticky_events) / sizeof(sticky_events[0]); i++)
    if (!strcmp(event, sticky_events[i])) return true;
  return false;
}

static bool is_curve(const char *event) { return !strcmp(event, "iteration.done") || !strcmp(event, "eval.done"); }

static int ring_init(wf_ring *r, size_t cap) {
  r->e = calloc(cap, sizeof(*r->e));
  r->cap = cap;
  r->n = r->head = 0;
  return r->e ? 0 : GW_ENOMEM;
}

static void ring_free(wf_ring *r) {
  for (size_t i = 0; i < r->cap && r->e; i++) free(r->e[i].json);
  free(r->e);
}

static void ring_put(wf_ring *r, uint64_t seq, char *json, size_t len) {
  wf_ent *e = &r->e[r->head];
  free(e->json);
  *e = (wf_ent){.seq = seq, .len = len, .json = json};
  r->head = (r->head + 1) % r->cap;
  if (r->n < r->cap) r->n++;
}

/* The i-th oldest entry. */
static const wf_ent *ring_at(const wf_ring *r, size_t i) { return &r->e[(r->head + r->cap - r->n + i) % r->cap]; }

web_feed *web_feed_new(const char *kind) {
  web_feed *wf = calloc(1, sizeof(*wf));
  if (!wf) return NULL;
  snprintf(wf->kind, sizeof(wf->kind), "%s", kind ? kind : "node");
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* waits survive wall-clock steps */
  pthread_cond_init(&wf->cond, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&wf->mu, NULL);
  if (ring_init(&wf->ring, WEB_FEED_RING) != 0 || ring_init(&wf->curve, WEB_FEED_CURVE) != 0) {
    web_feed_free(wf);
    return NULL;
  }
  return wf;
}

void web_feed_free(web_feed *wf) {
  if (!wf) return;
  ring_free(&wf->ring);
  ring_free(&wf->curve);
  for (size_t i = 0; i < wf->n_sticky; i++) {
    free(wf->sticky[i].json);
    free(wf->sticky[i].key);
  }
  pthread_cond_destroy(&wf->cond);
  pthread_mutex_destroy(&wf->mu);
  free(wf);
}

static char *dup_mem(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* Keeps the latest event of its key; a full table forgets its oldest entry. */
static void sticky_put(web_feed *wf, const char *key, uint64_t seq, const char *json, size_t len) {
  wf_ent *slot = NULL;
  for (size_t i = 0; i < wf->n_sticky && !slot; i++)
    if (!strcmp(wf->sticky[i].key, key)) slot = &wf->sticky[i];
  if (!slot && wf->n_sticky < WEB_FEED_STICKY) {
    slot = &wf->sticky[wf->n_sticky];
    *slot = (wf_ent){0};
    if (!(slot->key = strdup(key))) return;
    wf->n_sticky++;
  } else if (!slot) {
    slot = &wf->sticky[0];
    for (size_t i = 1; i < wf->n_sticky; i++)
      if (wf->sticky[i].seq < slot->seq) slot = &wf->sticky[i];
    char *k = strdup(key);
    if (!k) return;
    free(slot->key);
    slot->key = k;
  }
  char *copy = dup_mem(json, len);
  if (!copy) return;
  free(slot->json);
  slot->json = copy;
  slot->len = len;
  slot->seq = seq;
}

/* The line, with "src":"NAME" added first when src is given. */
static char *with_src(const char *src, const char *json, size_t len, size_t *out_len) {
  if (!src) {
    *out_len = len;
    return dup_mem(json, len);
  }
  char head[48];
  int h = snprintf(head, sizeof(head), "{\"src\":\"%s\"%s", src, len > 2 ? "," : "");
  if (h < 0 || (size_t)h >= sizeof(head)) return NULL;
  for (const char *c = src; *c; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) return NULL; /* names are ours: r0, d1, swarm */
  *out_len = (size_t)h + len - 1;
  char *d = malloc(*out_len + 1);
  if (!d) return NULL;
  memcpy(d, head, (size_t)h);
  memcpy(d + h, json + 1, len - 1);
  d[*out_len] = '\0';
  return d;
}

uint64_t web_feed_push(web_feed *wf, const char *src, const char *node, const char *event, const char *json,
                       size_t len) {
  if (!wf || !event || !json || len < 2 || len > WEB_FEED_EVENT_MAX || json[0] != '{' || json[len - 1] != '}' ||
      memchr(json, '\n', len))
    return 0; /* one frame of server-sent events must be one line */
  size_t n;
  char *line = with_src(src, json, len, &n);
  if (!line) return 0;
  char *curve_copy = is_curve(event) ? dup_mem(line, n) : NULL;
  char key[128];
  snprintf(key, sizeof(key), "%s|%s|%s", src ? src : "", node ? node : "-", event);
  pthread_mutex_lock(&wf->mu);
  if (wf->closed) {
    pthread_mutex_unlock(&wf->mu);
    free(line);
    free(curve_copy);
    return 0;
  }
  uint64_t seq = ++wf->seq;
  if (is_sticky(event)) sticky_put(wf, key, seq, line, n);
  if (curve_copy) ring_put(&wf->curve, seq, curve_copy, n);
  ring_put(&wf->ring, seq, line, n);
  pthread_cond_broadcast(&wf->cond);
  pthread_mutex_unlock(&wf->mu);
  return seq;
}

void web_feed_log_cb(void *ud, gw_log_level level, const char *node, const char *event, const char *json,
                     size_t len) {
  (void)level;
  web_feed_push(ud, NULL, node, event, json, len);
}

/* ---- snapshot ---- */

static int by_seq(const void *a, const void *b) {
  uint64_t x = (*(const wf_ent *const *)a)->seq, y = (*(const wf_ent *const *)b)->seq;
  return x < y ? -1 : x > y;
}

char *web_feed_snapshot(web_feed *wf, uint64_t since, size_t *len) {
  const wf_ent **all = malloc((WEB_FEED_RING + WEB_FEED_CURVE + WEB_FEED_STICKY) * sizeof(*all));
  if (!all) return NULL;
  pthread_mutex_lock(&wf->mu);
  size_t n = 0, bytes = 64 + strlen(wf->kind);
  for (size_t i = 0; i < wf->ring.n; i++) all[n++] = ring_at(&wf->ring, i);
  for (size_t i = 0; i < wf->curve.n; i++) all[n++] = ring_at(&wf->curve, i);
  for (size_t i = 0; i < wf->n_sticky; i++) all[n++] = &wf->sticky[i];
  qsort(all, n, sizeof(*all), by_seq);
  for (size_t i = 0; i < n; i++) bytes += all[i]->len + 1;
  char *out = malloc(bytes);
  size_t off = 0;
  if (out) {
    off += (size_t)snprintf(out, bytes, "{\"kind\":\"%s\",\"seq\":%llu,\"events\":[", wf->kind,
                            (unsigned long long)wf->seq);
    uint64_t prev = 0;
    bool first = true;
    for (size_t i = 0; i < n; i++) {
      const wf_ent *e = all[i];
      if (e->seq <= since || e->seq == prev) continue; /* one event may be kept twice */
      prev = e->seq;
      if (!first) out[off++] = ',';
      first = false;
      memcpy(out + off, e->json, e->len);
      off += e->len;
    }
    memcpy(out + off, "]}", 3);
    off += 2;
    *len = off;
  }
  pthread_mutex_unlock(&wf->mu);
  free(all);
  return out;
}

/* ---- server-sent events ---- */

uint64_t web_feed_last(web_feed *wf) {
  pthread_mutex_lock(&wf->mu);
  uint64_t s = wf->seq;
  pthread_mutex_unlock(&wf->mu);
  return s;
}

static void deadline_after(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Frames of the ring's events after *after; the caller holds the lock. */
static long frames_locked(web_feed *wf, uint64_t *after, char *buf, size_t cap) {
  const wf_ring *r = &wf->ring;
  uint64_t oldest = r->n ? ring_at(r, 0)->seq : wf->seq + 1;
  if (*after + 1 < oldest) { /* the ring moved past this reader */
    static const char reset[] = "event: reset\ndata: {}\n\n";
    if (cap < sizeof(reset)) return 0;
    memcpy(buf, reset, sizeof(reset) - 1);
    *after = wf->seq;
    return (long)(sizeof(reset) - 1);
  }
  size_t off = 0;
  for (size_t i = (size_t)(*after + 1 - oldest); i < r->n; i++) {
    const wf_ent *e = ring_at(r, i);
    char head[40];
    int h = snprintf(head, sizeof(head), "id: %llu\ndata: ", (unsigned long long)e->seq);
    if (off + (size_t)h + e->len + 2 > cap) break;
    memcpy(buf + off, head, (size_t)h);
    memcpy(buf + off + h, e->json, e->len);
    memcpy(buf + off + h + e->len, "\n\n", 2);
    off += (size_t)h + e->len + 2;
    *after = e->seq;
  }
  return (long)off;
}

long web_feed_next(web_feed *wf, uint64_t *after, char *buf, size_t cap, int timeout_ms) {
  struct timespec deadline;
  deadline_after(&deadline, timeout_ms);
  pthread_mutex_lock(&wf->mu);
  if (*after > wf->seq) *after = wf->seq; /* a Last-Event-ID from another run */
  while (!wf->closed && wf->seq == *after) {
    if (pthread_cond_timedwait(&wf->cond, &wf->mu, &deadline) == ETIMEDOUT) break;
  }
  long n = wf->closed ? GW_ECLOSED : frames_locked(wf, after, buf, cap);
  pthread_mutex_unlock(&wf->mu);
  return n;
}

void web_feed_close(web_feed *wf) {
  pthread_mutex_lock(&wf->mu);
  wf->closed = true;
  pthread_cond_broadcast(&wf->cond);
  pthread_mutex_unlock(&wf->mu);
}
