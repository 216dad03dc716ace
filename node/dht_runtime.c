#include "node/dht_runtime.h"

#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/err.h"
#include "util/file.h"

/* Bad datagrams are logged one line each, but no more than this many per
 * second: a flood must not turn into a flood of log lines. */
#define REJECT_LOG_PER_S (5)
#define CONTACTS_HEADER "# gwtf dht contacts v1: <node-id> <ip:port>\n"
#define CONTACTS_FILE_MAX (64 * 1024)

struct dht_runtime {
  uv_loop_t *loop;
  uv_timer_t tick;  /* the dht's timer */
  uv_timer_t chore; /* contacts file and stats line */
  p2p_udp *udp;
  dht *d;
  uint64_t tick_at; /* when `tick` fires; UINT64_MAX: idle */
  uint64_t next_save, next_stats, stats_every;
  char contacts_path[PATH_MAX];
  const gw_log *log;
  int open_handles;
  bool stopping;
  void (*on_joined)(void *ud);
  void *joined_ud;
  uint64_t reject_window; /* second of the last reject log line */
  unsigned reject_lines, reject_quiet;
};

/* ---- gw_io over UDP and a timer ---- */

static int io_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  dht_runtime *rt = ud;
  return rt->udp ? p2p_udp_send(rt->udp, to, buf, len) : GW_ECLOSED;
}

static void on_tick(uv_timer_t *t) {
  dht_runtime *rt = t->data;
  rt->tick_at = UINT64_MAX;
  if (!rt->stopping) dht_on_tick(rt->d, uv_now(rt->loop));
}

static void io_want_tick(void *ud, uint64_t at_ms) {
  dht_runtime *rt = ud;
  if (rt->stopping || at_ms >= rt->tick_at) return;
  uint64_t now = uv_now(rt->loop);
  rt->tick_at = at_ms;
  uv_timer_start(&rt->tick, on_tick, at_ms > now ? at_ms - now : 0, 0);
}

static void io_random(void *ud, void *buf, size_t len) {
  (void)ud;
  randombytes_buf(buf, len);
}

static void on_datagram(void *ud, const gw_peer *from, const uint8_t *payload, size_t len, size_t wire_len) {
  dht_runtime *rt = ud;
  (void)wire_len;
  if (!rt->stopping) dht_on_message(rt->d, from, payload, len, uv_now(rt->loop));
}

static const char *reject_reason(int reason) {
  return reason == GW_ERANGE ? "oversize" : reason == GW_EAUTH ? "bad-signature" : "malformed";
}

static void on_reject(void *ud, const gw_addr *from, int reason, size_t wire_len) {
  dht_runtime *rt = ud;
  uint64_t second = uv_now(rt->loop) / 1000;
  if (second != rt->reject_window) {
    rt->reject_window = second;
    rt->reject_lines = 0;
  }
  if (rt->reject_lines >= REJECT_LOG_PER_S) {
    rt->reject_quiet++;
    return;
  }
  rt->reject_lines++;
  char addr[GW_ADDR_STRLEN] = "-";
  if (from) gw_addr_format(from, addr);
  GW_WARN(rt->log, "dht.udp.rejected", "from=%s reason=%s bytes=%zu unlogged_before=%u", addr,
          reject_reason(reason), wire_len, rt->reject_quiet);
  rt->reject_quiet = 0;
}

/* ---- the contacts file ---- */

int dht_runtime_load_contacts(const char *path, gw_peer *out, size_t max, size_t *n) {
  uint8_t *text;
  size_t len;
  *n = 0;
  int rc = gw_file_read_all(path, CONTACTS_FILE_MAX, &text, &len);
  if (rc == -ENOENT) return 0;
  if (rc != 0) return rc;
  char *save = NULL;
  for (char *line = strtok_r((char *)text, "\n", &save); line && *n < max; line = strtok_r(NULL, "\n", &save)) {
    char hex[GW_ID_HEX_LEN + 2], addr[GW_ADDR_STRLEN];
    if (line[0] == '#' || sscanf(line, "%65s %55s", hex, addr) != 2) continue;
    gw_peer p;
    if (gw_id_from_hex(hex, &p.id) != 0 || gw_addr_parse(addr, &p.addr) != 0) continue;
    out[(*n)++] = p;
  }
  free(text);
  return 0;
}

int dht_runtime_save_contacts(dht_runtime *rt) {
  if (!rt->contacts_path[0] || !rt->d) return GW_ENOENT;
  gw_peer peers[DHT_RT_CONTACTS_MAX];
  size_t n = dht_contacts(rt->d, peers, DHT_RT_CONTACTS_MAX);
  if (n == 0) return 0; /* never replace a useful file with an empty one */
  size_t cap = sizeof(CONTACTS_HEADER) + n * (GW_ID_HEX_LEN + GW_ADDR_STRLEN + 2);
  char *text = malloc(cap);
  if (!text) return GW_ENOMEM;
  size_t len = (size_t)snprintf(text, cap, "%s", CONTACTS_HEADER);
  for (size_t i = 0; i < n; i++) {
    char hex[GW_ID_HEX_LEN + 1], addr[GW_ADDR_STRLEN];
    gw_id_to_hex(&peers[i].id, hex);
    gw_addr_format(&peers[i].addr, addr);
    len += (size_t)snprintf(text + len, cap - len, "%s %s\n", hex, addr);
  }
  int rc = gw_file_write_atomic1(rt->contacts_path, text, len, 0600);
  free(text);
  if (rc != 0) GW_WARN(rt->log, "dht.contacts.save_failed", "path=%s error=\"%s\"", rt->contacts_path, gw_strerror(rc));
  return rc;
}

/* ---- periodic chores ---- */

static void log_stats(dht_runtime *rt) {
  dht_stats st;
  const p2p_udp_stats *u = p2p_udp_get_stats(rt->udp);
  dht_get_stats(rt->d, &st);
  GW_INFO(rt->log, "dht.stats",
          "contacts=%zu good=%zu buckets=%zu records=%zu record_keys=%zu publications=%zu lookups=%zu "
          "dgrams_in=%llu dgrams_out=%llu rejected=%llu rate_limited=%llu client_msgs=%llu client_mode=%d",
          st.contacts, st.good_contacts, st.buckets, st.records, st.record_keys, st.publications,
          st.lookups_active, (unsigned long long)u->dgrams_in, (unsigned long long)u->dgrams_out,
          (unsigned long long)(u->rejected_auth + u->rejected_malformed + u->rejected_oversize),
          (unsigned long long)st.dropped_rate, (unsigned long long)st.client_senders, (int)dht_client_mode(rt->d));
}

static void schedule_chore(dht_runtime *rt);

static void on_chore(uv_timer_t *t) {
  dht_runtime *rt = t->data;
  uint64_t now = uv_now(rt->loop);
  if (now >= rt->next_save) {
    dht_runtime_save_contacts(rt);
    rt->next_save = now + DHT_RT_SAVE_MS;
  }
  if (rt->stats_every && now >= rt->next_stats) {
    log_stats(rt);
    rt->next_stats = now + rt->stats_every;
  }
  schedule_chore(rt);
}

static void schedule_chore(dht_runtime *rt) {
  uint64_t now = uv_now(rt->loop), next = rt->contacts_path[0] ? rt->next_save : UINT64_MAX;
  if (rt->stats_every && rt->next_stats < next) next = rt->next_stats;
  if (next == UINT64_MAX) return;
  uv_timer_start(&rt->chore, on_chore, next > now ? next - now : 0, 0);
}

static void on_joined(void *ud) {
  dht_runtime *rt = ud;
  dht_runtime_save_contacts(rt); /* a crash soon after joining still has its contacts */
  if (rt->on_joined) rt->on_joined(rt->joined_ud);
}

/* ---- lifecycle ---- */

/* The dht goes last, once the loop has unwound: dht_runtime_stop may be
 * called from inside one of its callbacks. */
static void on_handle_closed(uv_handle_t *h) {
  dht_runtime *rt = h->data;
  if (--rt->open_handles > 0) return;
  dht_free(rt->d);
  free(rt);
}

static int join(dht_runtime *rt, const dht_runtime_config *cfg) {
  gw_peer seeds[DHT_MAX_SEEDS];
  size_t n = 0;
  if (rt->contacts_path[0]) {
    int rc = dht_runtime_load_contacts(rt->contacts_path, seeds, DHT_MAX_SEEDS / 2, &n);
    if (rc != 0)
      GW_WARN(rt->log, "dht.contacts.load_failed", "path=%s error=\"%s\"", rt->contacts_path, gw_strerror(rc));
    else if (n > 0)
      GW_INFO(rt->log, "dht.contacts.loaded", "path=%s contacts=%zu", rt->contacts_path, n);
  }
  for (size_t i = 0; i < cfg->n_bootstrap && n < DHT_MAX_SEEDS; i++) seeds[n++] = cfg->bootstrap[i];
  return n ? dht_bootstrap(rt->d, seeds, n, uv_now(rt->loop)) : 0;
}

int dht_runtime_start(uv_loop_t *loop, const p2p_identity *me, const dht_runtime_config *cfg,
                      dht_runtime **out) {
  *out = NULL;
  dht_runtime *rt = calloc(1, sizeof(*rt));
  if (!rt) return GW_ENOMEM;
  rt->loop = loop;
  rt->tick_at = UINT64_MAX;
  rt->log = cfg->dht.log;
  rt->stats_every = cfg->stats_every_ms;
  rt->on_joined = cfg->dht.on_joined;
  rt->joined_ud = cfg->dht.ud;
  if (cfg->data_dir && snprintf(rt->contacts_path, sizeof(rt->contacts_path), "%s/%s", cfg->data_dir,
                                DHT_RT_CONTACTS_FILE) >= (int)sizeof(rt->contacts_path)) {
    free(rt);
    return GW_ERANGE;
  }
  p2p_udp_config ucfg = {.bind = cfg->bind, .me = me, .on_recv = on_datagram, .on_reject = on_reject, .ud = rt};
  int rc = p2p_udp_open(loop, &ucfg, &rt->udp);
  if (rc != 0) { /* nothing to close yet */
    free(rt);
    return rc;
  }
  if (cfg->data_dir) gw_mkdir_p(cfg->data_dir, 0700);
  uv_timer_init(loop, &rt->tick);
  uv_timer_init(loop, &rt->chore);
  rt->tick.data = rt->chore.data = rt;
  rt->open_handles = 2;
  {
    dht_config dc = cfg->dht;
    dc.me = me;
    dc.io = (gw_io){.ud = rt, .send = io_send, .want_tick = io_want_tick, .random = io_random};
    /* Sequence numbers continue from the wall clock, across restarts. */
    dc.seq_base = gw_clock_wall_ms() - uv_now(loop);
    dc.on_joined = on_joined;
    dc.ud = rt;
    rc = dht_new(&dc, uv_now(loop), &rt->d);
  }
  if (rc == 0) rc = join(rt, cfg);
  if (rc != 0) {
    dht_runtime_stop(rt);
    return rc;
  }
  gw_addr local;
  char addr[GW_ADDR_STRLEN];
  p2p_udp_local_addr(rt->udp, &local);
  gw_addr_format(&local, addr);
  GW_INFO(rt->log, "dht.listening", "udp=%s seeds=%zu", addr, cfg->n_bootstrap);
  rt->next_save = uv_now(loop) + DHT_RT_SAVE_MS;
  rt->next_stats = uv_now(loop) + rt->stats_every;
  schedule_chore(rt);
  *out = rt;
  return 0;
}

void dht_runtime_stop(dht_runtime *rt) {
  if (!rt || rt->stopping) return;
  rt->stopping = true;
  if (rt->d) dht_runtime_save_contacts(rt);
  if (rt->udp) p2p_udp_close(rt->udp); /* nothing more comes in or goes out */
  rt->udp = NULL;
  uv_close((uv_handle_t *)&rt->tick, on_handle_closed);
  uv_close((uv_handle_t *)&rt->chore, on_handle_closed);
}

dht *dht_runtime_dht(dht_runtime *rt) { return rt->d; }
p2p_udp *dht_runtime_udp(dht_runtime *rt) { return rt->udp; }
uint64_t dht_runtime_now(const dht_runtime *rt) { return uv_now(rt->loop); }
