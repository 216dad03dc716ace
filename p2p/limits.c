#include "p2p/limits.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* Keys live in a chained hash table; an entry exists while anything is
 * counted under it, so the table is bounded by the connections we hold. */
#define BUCKETS (1024)

enum { K_HS, K_SESS, K_N }; /* the two kinds each key counts */

typedef struct key {
  uint8_t family; /* 4 or 6 */
  uint8_t bits;   /* prefix length: 32/128 for an IP, 24/64 for a subnet */
  uint8_t ip[16]; /* masked to bits */
} key;

typedef struct entry {
  key k;
  uint32_t n[K_N];
  uint64_t last_log_ms[K_N]; /* 0: never; kept after the counts fall to 0 so the rate limit holds */
  uint64_t suppressed[K_N];  /* refusals since the last line */
  struct entry *next;
} entry;

/* Rate-limit state of the kinds without a per-IP key. */
#define GLOBAL_KINDS (16)
typedef struct gkind {
  const char *kind;
  uint64_t last_log_ms;
  uint64_t suppressed;
} gkind;

struct p2p_limits {
  p2p_limits_config cfg;
  const gw_log *log;
  entry *tab[BUCKETS];
  uint32_t handshakes, sessions;
  size_t rx_used;
  unsigned rx_waiters;
  uint64_t refused, hits_logged;
  gkind g[GLOBAL_KINDS];
  uint32_t sweep; /* the next bucket swept of entries with nothing counted and no recent line */
};

void p2p_limits_config_defaults(p2p_limits_config *c) {
  memset(c, 0, sizeof(*c));
  c->handshakes_per_ip = P2P_LIMIT_HANDSHAKES_PER_IP;
  c->handshakes_per_subnet = P2P_LIMIT_HANDSHAKES_PER_SUBNET;
  c->sessions_per_ip = P2P_LIMIT_SESSIONS_PER_IP;
  c->sessions_per_subnet = P2P_LIMIT_SESSIONS_PER_SUBNET;
  c->rx_budget = P2P_LIMIT_RX_BUDGET;
  c->rx_wait_ms = P2P_LIMIT_RX_WAIT_MS;
  c->rx_min_Bps = P2P_LIMIT_RX_MIN_BPS;
  c->rx_window_ms = P2P_LIMIT_RX_WINDOW_MS;
}

int p2p_limits_new(const p2p_limits_config *cfg, const gw_log *log, p2p_limits **out) {
  p2p_limits *l = calloc(1, sizeof(*l));
  if (!l) return GW_ENOMEM;
  l->cfg = *cfg;
  l->log = log;
  *out = l;
  return 0;
}

void p2p_limits_free(p2p_limits *l) {
  if (!l) return;
  for (size_t i = 0; i < BUCKETS; i++)
    for (entry *e = l->tab[i], *next; e; e = next) {
      next = e->next;
      free(e);
    }
  free(l);
}

const p2p_limits_config *p2p_limits_get_config(const p2p_limits *l) { return &l->cfg; }

/* ---- keys ---- */

static const uint8_t V4MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* An IPv4-mapped IPv6 address counts as the IPv4 address it is. */
static void norm(const gw_addr *a, uint8_t *family, uint8_t ip[16]) {
  memset(ip, 0, 16);
  if (a->family == 6 && memcmp(a->ip, V4MAPPED, 12) == 0) {
    *family = 4;
    memcpy(ip, a->ip + 12, 4);
    return;
  }
  *family = a->family;
  memcpy(ip, a->ip, a->family == 4 ? 4 : 16);
}

static key make_key(const gw_addr *a, bool subnet) {
  key k;
  memset(&k, 0, sizeof(k));
  norm(a, &k.family, k.ip);
  k.bits = k.family == 4 ? (subnet ? P2P_LIMIT_SUBNET4_BITS : 32) : (subnet ? P2P_LIMIT_SUBNET6_BITS : 128);
  unsigned full = k.bits / 8, rem = k.bits % 8;
  if (full < 16) {
    if (rem) k.ip[full++] &= (uint8_t)(0xff << (8 - rem));
    memset(k.ip + full, 0, 16 - full);
  }
  return k;
}

static uint32_t key_hash(const key *k) {
  uint32_t h = 2166136261u; /* FNV-1a */
  const uint8_t *p = (const uint8_t *)k;
  for (size_t i = 0; i < sizeof(*k); i++) h = (h ^ p[i]) * 16777619u;
  return h % BUCKETS;
}

static entry *lookup(const p2p_limits *l, const key *k) {
  for (entry *e = l->tab[key_hash(k)]; e; e = e->next)
    if (memcmp(&e->k, k, sizeof(*k)) == 0) return e;
  return NULL;
}

static entry *get(p2p_limits *l, const key *k) {
  entry *e = lookup(l, k);
  if (e) return e;
  if (!(e = calloc(1, sizeof(*e)))) return NULL;
  e->k = *k;
  uint32_t b = key_hash(k);
  e->next = l->tab[b];
  l->tab[b] = e;
  return e;
}

static bool recent_line(const entry *e, uint64_t now_ms) {
  for (int k = 0; k < K_N; k++)
    if (e->last_log_ms[k] && now_ms < e->last_log_ms[k] + P2P_LIMIT_LOG_MS) return true;
  return false;
}

/* Drops, one bucket per call, entries kept only for their rate limit. */
static void sweep(p2p_limits *l, uint64_t now_ms) {
  uint32_t b = l->sweep++ % BUCKETS;
  for (entry **pp = &l->tab[b]; *pp;) {
    entry *e = *pp;
    if (!e->n[K_HS] && !e->n[K_SESS] && !recent_line(e, now_ms)) {
      *pp = e->next;
      free(e);
    } else {
      pp = &e->next;
    }
  }
}

static void maybe_drop(p2p_limits *l, entry *e) {
  if (e->n[K_HS] || e->n[K_SESS] || e->last_log_ms[K_HS] || e->last_log_ms[K_SESS]) return; /* see sweep */
  for (entry **pp = &l->tab[key_hash(&e->k)]; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      free(e);
      return;
    }
}

bool p2p_limits_is_loopback(const gw_addr *a) {
  uint8_t family, ip[16];
  norm(a, &family, ip);
  if (family == 4) return ip[0] == 127;
  static const uint8_t ONE[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return family == 6 && memcmp(ip, ONE, 16) == 0;
}

/* ---- log lines ---- */

static void format_key(const key *k, const gw_addr *a, char *out, size_t len) {
  gw_addr ip = *a;
  ip.port = 0;
  memset(ip.ip, 0, sizeof(ip.ip));
  ip.family = k->family;
  memcpy(ip.ip, k->ip, 16);
  char s[GW_ADDR_STRLEN];
  gw_addr_format(&ip, s);
  /* gw_addr_format writes IP:PORT ([IP]:PORT for IPv6): keep the IP. */
  char *colon = strrchr(s, ':');
  if (colon) *colon = '\0';
  if (k->bits == 32 || k->bits == 128)
    snprintf(out, len, "%s", s);
  else
    snprintf(out, len, "%s/%u", s, (unsigned)k->bits);
}

static const char *KIND_NAMES[2][K_N] = {{"handshakes-per-ip", "sessions-per-ip"},
                                          {"handshakes-per-subnet", "sessions-per-subnet"}};

static void hit_key(p2p_limits *l, entry *e, int kind, bool subnet, const gw_addr *a, uint64_t now_ms) {
  l->refused++;
  e->suppressed[kind]++;
  if (e->last_log_ms[kind] && now_ms < e->last_log_ms[kind] + P2P_LIMIT_LOG_MS) return;
  char ks[GW_ADDR_STRLEN + 8];
  format_key(&e->k, a, ks, sizeof(ks));
  uint32_t cap = kind == K_HS ? (subnet ? l->cfg.handshakes_per_subnet : l->cfg.handshakes_per_ip)
                              : (subnet ? l->cfg.sessions_per_subnet : l->cfg.sessions_per_ip);
  GW_WARN(l->log, "limit.hit", "kind=%s ip=%s count=%u limit=%u refused=%llu", KIND_NAMES[subnet][kind], ks,
          e->n[kind], cap, (unsigned long long)e->suppressed[kind]);
  l->hits_logged++;
  e->last_log_ms[kind] = now_ms ? now_ms : 1;
  e->suppressed[kind] = 0;
}

void p2p_limits_hit(p2p_limits *l, const char *kind, const gw_addr *addr, uint64_t count, uint64_t now_ms) {
  gkind *g = NULL;
  for (size_t i = 0; i < GLOBAL_KINDS && !g; i++)
    if (l->g[i].kind == kind || (l->g[i].kind && strcmp(l->g[i].kind, kind) == 0)) g = &l->g[i];
  for (size_t i = 0; i < GLOBAL_KINDS && !g; i++)
    if (!l->g[i].kind) {
      g = &l->g[i];
      g->kind = kind; /* kinds are string literals */
    }
  if (g) {
    g->suppressed++;
    if (g->last_log_ms && now_ms < g->last_log_ms + P2P_LIMIT_LOG_MS) return;
  }
  char a[GW_ADDR_STRLEN] = "-";
  if (addr && addr->family) gw_addr_format(addr, a);
  GW_WARN(l->log, "limit.hit", "kind=%s ip=%s count=%llu refused=%llu", kind, a, (unsigned long long)count,
          (unsigned long long)(g ? g->suppressed : 1));
  l->hits_logged++;
  if (g) {
    g->last_log_ms = now_ms ? now_ms : 1;
    g->suppressed = 0;
  }
}

/* ---- connections ---- */

int p2p_limits_admit(p2p_limits *l, const gw_addr *addr, uint64_t now_ms, const char **kind) {
  *kind = NULL;
  sweep(l, now_ms);
  bool exempt = !l->cfg.limit_loopback && p2p_limits_is_loopback(addr);
  if (!exempt && (addr->family == 4 || addr->family == 6)) {
    key ki = make_key(addr, false), ks = make_key(addr, true);
    entry *ei = get(l, &ki), *es = get(l, &ks);
    if (!ei || !es) {
      if (ei) maybe_drop(l, ei);
      if (es) maybe_drop(l, es);
      *kind = "out-of-memory";
      return GW_ENOMEM;
    }
    const uint32_t caps[2][K_N] = {{l->cfg.handshakes_per_ip, l->cfg.sessions_per_ip},
                                   {l->cfg.handshakes_per_subnet, l->cfg.sessions_per_subnet}};
    entry *es_[2] = {ei, es};
    for (int sub = 0; sub < 2; sub++)
      for (int k = 0; k < K_N; k++)
        if (caps[sub][k] && es_[sub]->n[k] >= caps[sub][k]) {
          *kind = KIND_NAMES[sub][k];
          hit_key(l, es_[sub], k, sub == 1, addr, now_ms);
          maybe_drop(l, ei);
          maybe_drop(l, es);
          return GW_EFULL;
        }
    ei->n[K_HS]++, ei->n[K_SESS]++;
    es->n[K_HS]++, es->n[K_SESS]++;
  }
  l->handshakes++;
  l->sessions++;
  return 0;
}

static void dec(p2p_limits *l, const gw_addr *addr, int kind) {
  if (!l->cfg.limit_loopback && p2p_limits_is_loopback(addr)) return;
  if (addr->family != 4 && addr->family != 6) return;
  for (int sub = 0; sub < 2; sub++) {
    key k = make_key(addr, sub == 1);
    entry *e = lookup(l, &k);
    if (!e) continue;
    if (e->n[kind]) e->n[kind]--;
    maybe_drop(l, e);
  }
}

void p2p_limits_handshake_done(p2p_limits *l, const gw_addr *addr) {
  if (l->handshakes) l->handshakes--;
  dec(l, addr, K_HS);
}

void p2p_limits_release(p2p_limits *l, const gw_addr *addr, bool handshaking) {
  if (handshaking) p2p_limits_handshake_done(l, addr);
  if (l->sessions) l->sessions--;
  dec(l, addr, K_SESS);
}

/* ---- reassembly budget ---- */

bool p2p_limits_rx_may_grow(const p2p_limits *l, size_t held, size_t want) {
  if (!l->cfg.rx_budget || want <= held) return true;
  size_t others = l->rx_used > held ? l->rx_used - held : 0;
  return others + want <= l->cfg.rx_budget;
}

void p2p_limits_rx_charge(p2p_limits *l, long long delta) {
  if (delta < 0 && (size_t)(-delta) > l->rx_used)
    l->rx_used = 0;
  else
    l->rx_used = (size_t)((long long)l->rx_used + delta);
}

void p2p_limits_rx_waiting(p2p_limits *l, int delta) {
  if (delta < 0 && l->rx_waiters < (unsigned)-delta)
    l->rx_waiters = 0;
  else
    l->rx_waiters = (unsigned)((int)l->rx_waiters + delta);
}

unsigned p2p_limits_rx_waiters(const p2p_limits *l) { return l->rx_waiters; }

void p2p_limits_counts(const p2p_limits *l, const gw_addr *addr, p2p_limit_counts *out) {
  memset(out, 0, sizeof(*out));
  out->handshakes = l->handshakes;
  out->sessions = l->sessions;
  out->rx_used = l->rx_used;
  out->refused = l->refused;
  out->hits_logged = l->hits_logged;
  if (!addr || (addr->family != 4 && addr->family != 6)) return;
  key ki = make_key(addr, false), ks = make_key(addr, true);
  const entry *ei = lookup(l, &ki), *es = lookup(l, &ks);
  if (ei) out->ip_handshakes = ei->n[K_HS], out->ip_sessions = ei->n[K_SESS];
  if (es) out->subnet_handshakes = es->n[K_HS], out->subnet_sessions = es->n[K_SESS];
}
