/* dht/guard.h — address cookies and request rate limits, with no per-sender state.
 *
 * Cookies. A UDP source address can be forged, so before a node sends a
 * large reply it wants proof that the requester receives at the address the
 * request came from. Every message a node sends carries `your_cookie`:
 *
 *     cookie = SipHash-2-4(secret, recipient IP || port || recipient node ID)  (8 bytes)
 *
 * Whoever receives it at
 * that address can echo it in later requests (`cookie`); a forger who never
 * sees the traffic to that address cannot. The secret rotates every
 * DHT_COOKIE_ROTATE_MS and the previous one is still accepted, so a cookie is
 * good for one to two periods. Checking costs one SipHash and keeps nothing
 * per sender. Requests without a valid cookie get replies no larger than the
 * request (the requester pads its request when it wants a bigger answer).
 *
 * Rate limits. Incoming requests pass two token buckets: one global, and one
 * per source IP. The per-IP buckets are a fixed array indexed by a keyed hash
 * of the IP (hash collisions share a bucket, which only errs on the strict
 * side), so a flood from many addresses allocates nothing. */
#ifndef GWTF_DHT_GUARD_H
#define GWTF_DHT_GUARD_H

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/routing.h"
#include "util/addr.h"

#define DHT_COOKIE_ROTATE_MS (10 * 60 * 1000)
#define DHT_RATE_SLOTS (256) /* per-IP token buckets */
#define DHT_GUARD_KEY_BYTES (crypto_shorthash_KEYBYTES)
/* Random bytes dht_guard_init and dht_guard_rotate consume. */
#define DHT_GUARD_SEED_BYTES (3 * DHT_GUARD_KEY_BYTES)

typedef struct dht_rate {
  uint64_t milli; /* thousandths of a token */
  uint64_t at_ms; /* last refill */
} dht_rate;

typedef struct dht_rate_limits {
  uint32_t global_rate, global_burst; /* requests per second, bucket depth; rate 0: unlimited */
  uint32_t ip_rate, ip_burst;
} dht_rate_limits;

typedef struct dht_guard {
  uint8_t secret[2][DHT_GUARD_KEY_BYTES]; /* [0] current, [1] previous */
  uint8_t ip_key[DHT_GUARD_KEY_BYTES];
  uint64_t rotate_at_ms;
  dht_rate_limits lim;
  dht_rate global;
  dht_rate per_ip[DHT_RATE_SLOTS];
} dht_guard;

void dht_guard_init(dht_guard *g, const dht_rate_limits *lim, const uint8_t seed[DHT_GUARD_SEED_BYTES],
                    uint64_t now_ms);
/* Due when now >= g->rotate_at_ms: the current secret becomes the previous
 * one, fresh (DHT_GUARD_KEY_BYTES random bytes) the current. */
void dht_guard_rotate(dht_guard *g, const uint8_t fresh[DHT_GUARD_KEY_BYTES], uint64_t now_ms);

void dht_cookie_make(const dht_guard *g, const gw_peer *p, uint8_t out[DHT_COOKIE_BYTES]);
bool dht_cookie_check(const dht_guard *g, const gw_peer *p, const uint8_t *cookie, size_t len);

/* Takes a token for one request from addr; false when either bucket is empty. */
bool dht_guard_admit(dht_guard *g, const gw_addr *addr, uint64_t now_ms);

#endif
