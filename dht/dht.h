/* dht/dht.h — Kademlia as a pure state machine.
 *
 * A dht never touches a socket, the wall clock or a global. Its driver
 * (node/dht_runtime.c over UDP, or sim/ in tests) hands it verified messages
 * and the timer ticks it asked for; it acts only through its gw_io:
 *
 *     dht_on_message(d, from, payload, len, now_ms);  // from: the sender's proven ID + address
 *     dht_on_tick(d, now_ms);
 *
 * Protocol (docs/DHT.md has the details and the reasons):
 * - 256-bit IDs, XOR metric, k = 20 per bucket, α = 3 requests in flight;
 * - PING, FIND_NODE, FIND_VALUE, STORE (proto/dht.proto) with random 64-bit
 *   transaction IDs; a reply is accepted only from the ID and address asked
 *   (bootstrap peers, known by address alone, are the one case where the ID
 *   is learned from the reply); timeouts of at most rpc_timeout_ms (1 s);
 * - a lookup keeps α requests in flight among the `width` closest candidates
 *   not yet asked, and ends when the `width` closest it has seen have all
 *   answered or failed (width 3 for finding nodes and values; `replicas`
 *   (= k) for choosing where to store);
 * - records (dht/record.h) are signed by their publisher, stored on the
 *   `replicas` closest nodes, replaced only by a higher sequence from the same
 *   publisher, dropped when they expire, and republished by their publisher
 *   every record_ttl_ms / 2;
 * - abuse: cookies and rate limits (dht/guard.h), no state for unverified
 *   senders, every datagram within max_payload.
 *
 * Callbacks run inside dht_on_message / dht_on_tick (or the call that started
 * the operation, never synchronously), i.e. on the driver's loop. They may
 * start new operations but must not free the dht. */
#ifndef GWTF_DHT_DHT_H
#define GWTF_DHT_DHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dht/record.h"
#include "p2p/identity.h"
#include "util/addr.h"
#include "util/io.h"
#include "util/log.h"

#define DHT_K (20)
#define DHT_ALPHA (3)
#define DHT_WIDTH (3)
#define DHT_RPC_TIMEOUT_MS (1000)
#define DHT_RECORD_TTL_MS (30 * 60 * 1000)
#define DHT_MAX_RECORD_TTL_MS (24 * 60 * 60 * 1000)
#define DHT_REFRESH_MS (10 * 60 * 1000)
#define DHT_MAX_LOOKUPS (64)  /* concurrent lookups per node */
#define DHT_MAX_RPCS (512)    /* requests in flight per node */
#define DHT_MAX_SEEDS (32)    /* bootstrap addresses kept for retries */

typedef struct dht dht;

typedef struct dht_config {
  const p2p_identity *me; /* our ID and the key our records are signed with; must outlive the dht */
  gw_io io;
  const gw_log *log;      /* may be NULL */
  /* Tunables; 0 picks the default in brackets. */
  size_t k;                   /* bucket size [DHT_K] */
  size_t alpha;               /* lookup parallelism [DHT_ALPHA] */
  size_t width;               /* node/value lookups end when this many closest answered [DHT_WIDTH] */
  size_t replicas;            /* nodes a record is stored on [k] */
  uint64_t rpc_timeout_ms;    /* [DHT_RPC_TIMEOUT_MS], at most 1000 */
  uint64_t record_ttl_ms;     /* lifetime of the records we publish [DHT_RECORD_TTL_MS] */
  uint64_t max_record_ttl_ms; /* longest lifetime we store for others [DHT_MAX_RECORD_TTL_MS] */
  uint64_t refresh_ms;        /* bucket refresh period [DHT_REFRESH_MS] */
  size_t max_payload;         /* largest message [P2P_UDP_MAX_PAYLOAD] */
  size_t wire_overhead;       /* bytes the transport adds per datagram, for byte counts [P2P_UDP_OVERHEAD] */
  /* Record sequence numbers are seq_base + now_ms (kept strictly increasing),
   * so a restarted publisher's records replace its old ones: node/ passes the
   * wall clock at now_ms = 0. */
  uint64_t seq_base;
  bool allow_loopback;        /* accept 127.0.0.0/8 contacts (local swarms, tests) */
  bool client_only;           /* never answer requests: a brief visitor (`gwtf lookup`); marks its messages `client` */
  /* Incoming requests per second (rate) and bucket depth (burst), globally and
   * per source IP [400/800 and 50/100]; UINT32_MAX rate disables a limit. */
  uint32_t rate_global, burst_global, rate_ip, burst_ip;
  /* Storage caps [1024 keys, 64 subkeys per key, 4 MiB]. */
  size_t max_keys, max_subkeys, max_store_bytes;
  /* Called once, the first time a bootstrap completes. */
  void (*on_joined)(void *ud);
  void *ud;
} dht_config;

typedef struct dht_lookup_stats {
  unsigned hops;       /* referral chain to the closest node found (1: it was in our table) */
  unsigned rpcs;       /* requests sent, timeouts and pages included */
  unsigned timeouts;
  uint64_t bytes;      /* wire bytes of those requests and their replies */
  uint64_t elapsed_ms;
} dht_lookup_stats;

/* A record as delivered to callers: pointers valid during the callback. */
typedef struct dht_record {
  gw_id key;
  gw_id publisher; /* the subkey: the publisher's node ID */
  uint64_t seq;
  uint64_t remaining_ms;
  const uint8_t *value;
  size_t value_len;
} dht_record;

/* status 0, or GW_ENOENT when the lookup found nobody to ask. */
typedef void (*dht_nodes_cb)(void *ud, int status, const gw_peer *closest, size_t n,
                             const dht_lookup_stats *st);
/* Live records (tombstones and expired ones left out), ordered by publisher. */
typedef void (*dht_records_cb)(void *ud, int status, const dht_record *recs, size_t n,
                               const dht_lookup_stats *st);
/* After each (re)publication round: how many nodes acknowledged the record. */
typedef void (*dht_publish_cb)(void *ud, int status, size_t stored);

typedef struct dht_stats {
  size_t contacts, good_contacts, buckets, replacements;
  size_t records, record_keys, record_bytes;
  size_t publications, lookups_active, rpcs_pending;
  uint64_t requests_in, replies_in;
  uint64_t dropped_malformed, dropped_unexpected, dropped_rate, dropped_martian;
  uint64_t rpcs_sent, rpc_timeouts, records_rejected, lookups_done;
  uint64_t client_senders; /* messages from nodes marked client: never added to the table */
} dht_stats;

int dht_new(const dht_config *cfg, uint64_t now_ms, dht **out);
/* Frees everything. Lookups still running call back with GW_ECLOSED (those
 * callbacks must not use the dht). */
void dht_free(dht *d);

void dht_on_message(dht *d, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms);
void dht_on_tick(dht *d, uint64_t now_ms);

/* Joins through these peers (an ID may be zero: known by address only), and
 * keeps retrying them with backoff whenever the table is empty. Persisted
 * contacts go here too, with their IDs. */
int dht_bootstrap(dht *d, const gw_peer *seeds, size_t n, uint64_t now_ms);
bool dht_joined(const dht *d);

/* The `width` closest live nodes to target. GW_EFULL: too many lookups. */
int dht_find_node(dht *d, const gw_id *target, dht_nodes_cb cb, void *ud, uint64_t now_ms);
/* Every live record under key (from the closest nodes and our own store). */
int dht_fetch(dht *d, const gw_id *key, dht_records_cb cb, void *ud, uint64_t now_ms);
/* Publishes our record under key (value may be empty only through
 * dht_unpublish) and republishes it before it expires until dht_unpublish.
 * Publishing again under the same key replaces the value. cb may be NULL. */
int dht_publish(dht *d, const gw_id *key, const uint8_t *value, size_t len, dht_publish_cb cb, void *ud,
                uint64_t now_ms);
/* Stops republishing and overwrites our record with a tombstone, so readers
 * stop seeing it now rather than when it expires. GW_ENOENT if not published. */
int dht_unpublish(dht *d, const gw_id *key, uint64_t now_ms);

const gw_id *dht_id(const dht *d);
void dht_get_stats(const dht *d, dht_stats *out);
/* Up to max good contacts, most recently seen first (for the contacts file). */
size_t dht_contacts(const dht *d, gw_peer *out, size_t max);
/* Client mode (a node the p2p reachability check found private, see
 * p2p/reach.h): every message we send is marked `client`, so other nodes
 * never put us in their routing tables (and drop us where we are), while we
 * still look up, fetch, publish and store our own records, and still answer
 * requests. Switching on pings our contacts once so that nodes that had
 * added us drop us now. Nodes receiving a `client` message never add its
 * sender and remove it if present (a node that went private). */
void dht_set_client_mode(dht *d, bool on, uint64_t now_ms);
bool dht_client_mode(const dht *d);

/* Our address as other nodes see it (most common answer in recent PONGs).
 * GW_ENOENT when nobody told us yet. */
int dht_observed_addr(const dht *d, gw_addr *out);

#endif
