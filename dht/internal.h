/* dht/internal.h — the dht's insides, shared by dht.c (messages, RPCs,
 * maintenance) and lookup.c (iterative lookups, fetches, publications).
 * Not a public API: other layers use dht/dht.h. */
#ifndef GWTF_DHT_INTERNAL_H
#define GWTF_DHT_INTERNAL_H

#include "dht/dht.h"
#include "dht/guard.h"
#include "dht/routing.h"
#include "dht/store.h"
#include "dht/wire.h"

#define DHT_LOOKUP_SLOTS (64)      /* candidates one lookup keeps, closest first */
#define DHT_MAX_PAGES (16)         /* FIND_VALUE pages asked of one node per lookup */
#define DHT_LOOKUP_MAX_RPCS (128)  /* requests one lookup may send in all */
#define DHT_UNPROVEN_WANT (8)      /* contacts asked of a node we hold no cookie from */
#define DHT_REPLACEMENTS (8)       /* replacement cache per bucket */
#define DHT_FRESH_MS (60 * 1000)   /* a contact heard this recently is not pinged before eviction */
#define DHT_MAX_VERIFY (16)        /* pings in flight to verify unknown requesters */
#define DHT_MAX_REFRESH (2)        /* bucket refresh lookups at once */
#define DHT_BOOT_RETRY_MIN_MS (1000)
#define DHT_BOOT_RETRY_MAX_MS (60 * 1000)
#define DHT_RETRY_MS (1000)        /* a republication that found no lookup slot waits this long */
#define DHT_OBSERVED (8)           /* PONG answers kept to guess our external address */
#define DHT_PING_PAD (48)          /* a PONG with `observed` fits in a padded PING */
#define DHT_BUF (2048)             /* encode buffer, > any max_payload */
#define DHT_RTO_MIN_MS (200)       /* lookups wait at least this long for a reply */

enum dht_purpose {
  RPC_LOOKUP = 0, /* a lookup's FIND_NODE / FIND_VALUE */
  RPC_STORE,      /* a publication's STORE */
  RPC_BOOT,       /* FIND_NODE(self) to a bootstrap address */
  RPC_EVICT,      /* is the least recently seen contact of a full bucket alive? */
  RPC_VERIFY,     /* an unknown requester: does it answer at its address? */
  RPC_OBSERVE,    /* how does the world see our address? */
};

typedef struct dht_rpc {
  uint64_t txid;
  uint64_t sent_at;
  uint64_t slow_at;  /* a lookup stops waiting (the RTO) ... */
  uint64_t deadline; /* ... and here the request has failed (rpc_timeout_ms) */
  gw_peer to; /* to.id zero: a bootstrap address, the reply teaches the ID */
  uint8_t kind, purpose;
  bool slow;    /* past slow_at: its lookup has moved on, a late reply still counts */
  bool retried; /* STORE resent once with a fresh cookie */
  uint32_t lookup; /* serial of the owning lookup (RPC_LOOKUP, RPC_STORE) */
  size_t wire_bytes;
} dht_rpc;

enum { CAND_NEW = 0, CAND_ASKED, CAND_DONE, CAND_FAILED };

typedef struct dht_cand {
  gw_peer peer;
  uint8_t state, depth, pages;
  bool resent; /* one retransmission when it went slow */
  bool has_cookie, has_after;
  uint8_t cookie[DHT_COOKIE_BYTES];
  gw_id after; /* FIND_VALUE paging cursor */
} dht_cand;

enum dht_lookup_kind { LK_NODES = 0, LK_VALUES, LK_STORE, LK_JOIN, LK_REFRESH };

typedef struct dht_lookup {
  uint32_t serial;
  uint8_t kind;
  bool finished; /* done: deliver on the next tick */
  bool storing;  /* LK_STORE: lookup over, STOREs in flight */
  gw_id target;
  size_t width, inflight;
  size_t slow; /* requests past their RTO and not yet answered or timed out */
  dht_cand cands[DHT_LOOKUP_SLOTS];
  size_t n_cands;
  uint64_t started_ms;
  dht_lookup_stats st;
  dht_nodes_cb nodes_cb;
  dht_records_cb records_cb;
  void *ud;
  dht_rec **recs; /* LK_VALUES: best record per publisher */
  size_t n_recs, cap_recs;
  dht_rec *rec; /* LK_STORE: what to store */
  size_t stores_pending, stores_ok;
} dht_lookup;

typedef struct dht_pub {
  gw_id key;
  uint8_t *value;
  size_t len;
  uint64_t next_at; /* next republication */
  dht_publish_cb cb;
  void *ud;
} dht_pub;

typedef struct dht_vote {
  gw_id from;
  gw_addr addr;
} dht_vote;

struct dht {
  dht_config cfg;
  gw_id self;
  dht_routing rt;
  dht_store *store;
  dht_guard guard;
  dht_rpc *rpcs; /* requests in flight, unordered */
  size_t n_rpcs, cap_rpcs;
  dht_lookup *lookups[DHT_MAX_LOOKUPS];
  size_t n_lookups;
  uint32_t next_serial;
  dht_pub *pubs;
  size_t n_pubs, cap_pubs;
  gw_peer seeds[DHT_MAX_SEEDS];
  size_t n_seeds;
  uint64_t boot_at, boot_backoff;
  uint64_t rejoin_at, rejoin_backoff; /* self-lookup again while the table is thin */
  bool joined;
  bool client_mode; /* dht_set_client_mode: our messages are marked `client` */
  bool seed_answered; /* until one has, joining through newcomers may be an island */
  uint64_t last_seq;
  uint64_t armed_at; /* the tick we asked for; UINT64_MAX: none */
  size_t n_verify;
  double srtt, rttvar; /* round-trip estimate over all replies (RFC 6298) */
  bool have_rtt;
  dht_vote votes[DHT_OBSERVED];
  size_t n_votes, next_vote;
  dht_stats st; /* counters; gauges are filled in by dht_get_stats */
};

/* ---- dht.c, used by lookup.c ---- */

/* Sends a request and registers it. cookie (may be NULL) is the recipient's
 * cookie for our address; without one the request is padded to
 * reply_estimate so the answer may be that large. */
int dht_rpc_send(dht *d, const gw_peer *to, dht_msg *m, const uint8_t *cookie, size_t reply_estimate,
                 uint8_t purpose, uint32_t lookup, uint64_t now_ms, dht_rpc **out);
/* The cookie we hold for p at its current address, or NULL. */
const uint8_t *dht_cookie_for(dht *d, const gw_peer *p);
/* Asks the driver for a tick when something is due earlier than asked so far. */
void dht_arm(dht *d, uint64_t now_ms);
uint64_t dht_next_seq(dht *d, uint64_t now_ms);
/* Not us, not a martian address, a non-zero ID. */
bool dht_peer_acceptable(const dht *d, const gw_peer *p);
/* The join lookup ended (joined when the table holds a good contact). */
void dht_join_done(dht *d, uint64_t now_ms);

/* ---- lookup.c, used by dht.c ---- */

/* A lookup seeded from our table; _start also sends its first requests. */
dht_lookup *dht_lookup_create(dht *d, uint8_t kind, const gw_id *target, size_t width, uint64_t now_ms);
dht_lookup *dht_lookup_start(dht *d, uint8_t kind, const gw_id *target, size_t width, uint64_t now_ms);
dht_lookup *dht_lookup_by_serial(dht *d, uint32_t serial);
void dht_lookup_on_reply(dht *d, dht_lookup *lk, const dht_rpc *rpc, const gw_peer *from, const dht_msg *m,
                         size_t len, uint64_t now_ms);
/* A request of the lookup is slow (past its RTO): ask someone else. */
void dht_lookup_on_slow(dht *d, dht_lookup *lk, const dht_rpc *rpc, uint64_t now_ms);
/* A slow request timed out for good. */
void dht_lookup_on_expired(dht *d, dht_lookup *lk, uint64_t now_ms);
void dht_lookup_on_stored(dht *d, dht_lookup *lk, const dht_rpc *rpc, const gw_peer *from, const dht_msg *m,
                          uint64_t now_ms);
/* Feeds a bootstrap peer's answer into the join lookup: the peer counts as
 * answered, the contacts it returned become candidates. */
void dht_lookup_add_answered(dht *d, dht_lookup *lk, const gw_peer *from, const dht_msg *m, uint64_t now_ms);
/* Delivers finished lookups. */
void dht_lookups_deliver(dht *d, uint64_t now_ms);
/* Republishes what is due; returns when the next republication is due. */
uint64_t dht_pubs_tick(dht *d, uint64_t now_ms);
void dht_lookup_free(dht_lookup *lk);
size_t dht_lookups_of_kind(const dht *d, uint8_t kind);

#endif
