/* node/dht_node.c — see dht_node.h. */
#include "node/dht_node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht/stage_dir.h"
#include "util/clock.h"
#include "util/err.h"

/* An announcement that needs our external address waits for the first
 * PONG that tells it; it is tried again this often. */
#define ANNOUNCE_RETRY_MS (1000)

typedef struct dht_node {
  node *n;
  dht_runtime *rt;
  uv_timer_t retry;
  bool announced[NODE_MAX_ANNOUNCE];
} dht_node;

static bool is_loopback(const gw_addr *a) {
  return (a->family == 4 && a->ip[0] == 127) ||
         (a->family == 6 && !memcmp(a->ip, (const uint8_t[16]){[15] = 1}, 16));
}

int dht_node_parse_announce(const char *spec, char *run, size_t run_len, uint32_t *stage) {
  const char *colon = strrchr(spec, ':');
  char key[STAGE_DIR_KEY_MAX];
  int64_t s;
  if (!colon || snprintf(key, sizeof(key), "run/%.*s/stage/%s", (int)(colon - spec), spec, colon + 1) >= (int)sizeof(key))
    return GW_EINVAL;
  if (stage_dir_parse(key, run, run_len, &s) != 0 || s < 0) return GW_EINVAL;
  *stage = (uint32_t)s;
  return 0;
}

/* Numeric bootstrap specs become DHT seeds; a host name is left to the
 * sessions (the DHT then learns the peer from the contacts it exchanges). */
static size_t seeds_from_config(const node_config *cfg, const gw_log *log, gw_peer *out, size_t max) {
  size_t n = 0;
  for (size_t i = 0; i < cfg->n_bootstrap && n < max; i++) {
    char host[256], spec[300];
    uint16_t port;
    bool has_id;
    gw_peer p = {0};
    if (node_parse_peer_spec(cfg->bootstrap[i], host, sizeof(host), &port, &p.id, &has_id) != 0) continue;
    snprintf(spec, sizeof(spec), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, (unsigned)port);
    if (gw_addr_parse(spec, &p.addr) != 0) {
      GW_DEBUG(log, "dht.seed_skipped", "spec=%s reason=not_numeric", cfg->bootstrap[i]);
      continue;
    }
    if (!has_id) memset(&p.id, 0, sizeof(p.id));
    out[n++] = p;
  }
  return n;
}

/* Publishes every --announce not yet published; true when all are. A bare
 * node does not know its capacity: it announces 0 ("not stated"); the
 * training layer announces its own records with real figures. */
static bool announce_all(dht_node *s) {
  const node_config *cfg = node_get_config(s->n);
  bool all = true;
  for (size_t i = 0; i < cfg->n_announce; i++) {
    char run[STAGE_DIR_NAME_MAX + 1], addr[GW_ADDR_STRLEN];
    uint32_t stage;
    if (s->announced[i] || dht_node_parse_announce(cfg->announce[i], run, sizeof(run), &stage) != 0) continue;
    stage_member me = {.addr = p2p_host_listen_addr(node_host(s->n))};
    int rc = stage_dir_announce(dht_runtime_dht(s->rt), run, stage, &me, dht_runtime_now(s->rt));
    if (rc == GW_EAGAIN) {
      all = false;
      continue;
    }
    s->announced[i] = true;
    gw_addr_format(&me.addr, addr);
    if (rc != 0)
      GW_WARN(node_log(s->n), "dht.announce_failed", "run=%s stage=%u err=\"%s\"", run, stage, gw_strerror(rc));
    else
      GW_INFO(node_log(s->n), "dht.announced", "run=%s stage=%u addr=%s", run, stage, addr);
  }
  return all;
}

static void on_retry(uv_timer_t *t) {
  dht_node *s = t->data;
  if (announce_all(s)) uv_timer_stop(t);
}

static void announce_now(dht_node *s) {
  if (!announce_all(s)) uv_timer_start(&s->retry, on_retry, ANNOUNCE_RETRY_MS, ANNOUNCE_RETRY_MS);
}

/* Announced again once joined: what a node with no contacts yet published
 * could only be stored locally. */
static void on_joined(void *ud) {
  dht_node *s = ud;
  memset(s->announced, 0, sizeof(s->announced));
  announce_now(s);
}

static int comp_start(node *n, void **state) {
  const node_config *cfg = node_get_config(n);
  dht_node *s = calloc(1, sizeof(*s));
  if (!s) return GW_ENOMEM;
  s->n = n;
  gw_peer seeds[NODE_MAX_BOOTSTRAP];
  dht_runtime_config rc = {0};
  rc.bind = p2p_host_listen_addr(node_host(n));
  rc.data_dir = cfg->data_dir;
  rc.n_bootstrap = seeds_from_config(cfg, node_log(n), seeds, NODE_MAX_BOOTSTRAP);
  rc.bootstrap = seeds;
  rc.dht.log = node_log(n);
  rc.dht.record_ttl_ms = cfg->record_ttl_ms;
  rc.dht.allow_loopback = is_loopback(&rc.bind) || cfg->allow_loopback_peers;
  rc.dht.seq_base = gw_clock_wall_ms();
  rc.dht.on_joined = on_joined;
  rc.dht.ud = s;
  rc.stats_every_ms = cfg->dht_stats_ms ? cfg->dht_stats_ms : DHT_NODE_STATS_MS;
  int err = dht_runtime_start(node_loop(n), node_identity(n), &rc, &s->rt);
  if (err != 0) {
    GW_ERROR(node_log(n), "dht.failed", "err=\"%s\"", gw_strerror(err));
    free(s);
    return err;
  }
  uv_timer_init(node_loop(n), &s->retry);
  s->retry.data = s;
  *state = s;
  /* The first node of a network has nobody to join: announce at once (it
   * keeps the records itself and republishes them as others arrive). */
  if (rc.n_bootstrap == 0) announce_now(s);
  return 0;
}

static void on_retry_closed(uv_handle_t *h) {
  dht_node *s = h->data;
  node *n = s->n;
  free(s);
  node_component_stopped(n);
}

static void comp_stop(node *n, void *state) {
  dht_node *s = state;
  (void)n;
  /* Announcements are not withdrawn: they lapse after the record TTL, the
   * same as for a peer that crashed. */
  dht_runtime_stop(s->rt);
  s->rt = NULL;
  uv_close((uv_handle_t *)&s->retry, on_retry_closed);
}

const node_component dht_component = {
    .name = "dht",
    .start = comp_start,
    .stop = comp_stop,
};

void dht_node_set_client_mode(node *n, bool on) {
  dht_runtime *rt = node_dht(n);
  if (!rt || dht_client_mode(dht_runtime_dht(rt)) == on) return;
  /* Stage announcements of a private node should carry relay addresses
   * instead of its direct one: that is the relay work's (issue 16). */
  dht_set_client_mode(dht_runtime_dht(rt), on, dht_runtime_now(rt));
}

dht_runtime *node_dht(node *n) {
  dht_node *s = node_component_state(n, "dht");
  return s ? s->rt : NULL;
}
