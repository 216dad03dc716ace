#include "dht/guard.h"

#include <string.h>

void dht_guard_init(dht_guard *g, const dht_rate_limits *lim, const uint8_t seed[DHT_GUARD_SEED_BYTES],
                    uint64_t now_ms) {
  memset(g, 0, sizeof(*g));
  g->lim = *lim;
  memcpy(g->secret[0], seed, DHT_GUARD_KEY_BYTES);
  memcpy(g->secret[1], seed + DHT_GUARD_KEY_BYTES, DHT_GUARD_KEY_BYTES);
  memcpy(g->ip_key, seed + 2 * DHT_GUARD_KEY_BYTES, DHT_GUARD_KEY_BYTES);
  g->rotate_at_ms = now_ms + DHT_COOKIE_ROTATE_MS;
  g->global.milli = (uint64_t)lim->global_burst * 1000;
  g->global.at_ms = now_ms;
  for (size_t i = 0; i < DHT_RATE_SLOTS; i++) {
    g->per_ip[i].milli = (uint64_t)lim->ip_burst * 1000;
    g->per_ip[i].at_ms = now_ms;
  }
}

void dht_guard_rotate(dht_guard *g, const uint8_t fresh[DHT_GUARD_KEY_BYTES], uint64_t now_ms) {
  memcpy(g->secret[1], g->secret[0], DHT_GUARD_KEY_BYTES);
  memcpy(g->secret[0], fresh, DHT_GUARD_KEY_BYTES);
  g->rotate_at_ms = now_ms + DHT_COOKIE_ROTATE_MS;
}

static void cookie_with(const uint8_t *secret, const gw_peer *p, uint8_t out[DHT_COOKIE_BYTES]) {
  uint8_t in[1 + 16 + 2 + GW_ID_BYTES];
  in[0] = p->addr.family;
  memcpy(in + 1, p->addr.ip, 16);
  in[17] = (uint8_t)(p->addr.port >> 8);
  in[18] = (uint8_t)p->addr.port;
  memcpy(in + 19, p->id.b, GW_ID_BYTES);
  crypto_shorthash(out, in, sizeof(in), secret);
}

void dht_cookie_make(const dht_guard *g, const gw_peer *p, uint8_t out[DHT_COOKIE_BYTES]) {
  cookie_with(g->secret[0], p, out);
}

bool dht_cookie_check(const dht_guard *g, const gw_peer *p, const uint8_t *cookie, size_t len) {
  uint8_t want[DHT_COOKIE_BYTES];
  if (!cookie || len != DHT_COOKIE_BYTES) return false;
  for (int i = 0; i < 2; i++) {
    cookie_with(g->secret[i], p, want);
    if (sodium_memcmp(want, cookie, DHT_COOKIE_BYTES) == 0) return true;
  }
  return false;
}

/* Classic token bucket in thousandths of a token, so refills stay exact. */
static bool take(dht_rate *r, uint32_t rate, uint32_t burst, uint64_t now_ms) {
  if (rate == 0) return true;
  uint64_t cap = (uint64_t)burst * 1000;
  if (now_ms > r->at_ms) {
    uint64_t add = (now_ms - r->at_ms) * rate; /* rate/s = rate milli-tokens per ms */
    r->milli = cap - r->milli < add ? cap : r->milli + add;
    r->at_ms = now_ms;
  }
  if (r->milli < 1000) return false;
  r->milli -= 1000;
  return true;
}

static bool is_loopback(const gw_addr *a) {
  static const uint8_t loop6[16] = {[15] = 1};
  return (a->family == 4 && a->ip[0] == 127) || (a->family == 6 && memcmp(a->ip, loop6, 16) == 0);
}

bool dht_guard_admit(dht_guard *g, const gw_addr *addr, uint64_t now_ms) {
  /* Loopback skips the per-IP bucket, not the global one: it can only come
   * from this machine, and every peer of a local swarm (gwtf swarm, the
   * tests) has the one address 127.0.0.1, so a per-IP limit there is one
   * bucket for the whole swarm. In a churned swarm of 18 peers the nodes
   * holding the run's records dropped about a thousand datagrams a minute
   * to it while restarted peers looked up their stages. */
  if (is_loopback(addr)) return take(&g->global, g->lim.global_rate, g->lim.global_burst, now_ms);
  uint8_t h[crypto_shorthash_BYTES];
  crypto_shorthash(h, addr->ip, addr->family == 4 ? 4 : 16, g->ip_key);
  dht_rate *slot = &g->per_ip[h[0] % DHT_RATE_SLOTS];
  /* Per-IP first: a flooding address must not drain the global budget. */
  if (!take(slot, g->lim.ip_rate, g->lim.ip_burst, now_ms)) return false;
  return take(&g->global, g->lim.global_rate, g->lim.global_burst, now_ms);
}
