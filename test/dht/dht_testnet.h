/* test/dht/dht_testnet.h — harnesses for the DHT tests.
 *
 * probe:   one dht whose gw_io records every message it sends, so a test can
 *          read the requests, forge the replies and check every rule at the
 *          level of single messages.
 * testnet: n dhts on the deterministic sim/ engine (seeded, virtual time). */
#ifndef GWTF_TEST_DHT_TESTNET_H
#define GWTF_TEST_DHT_TESTNET_H

#include "testutil.h"

#include "dht.pb-c.h"
#include "dht/dht.h"
#include "dht/stage_dir.h"
#include "dht/routing.h"
#include "dht/wire.h"
#include "sim/sim.h"
#include "util/err.h"
#include "util/rng.h"

/* ---- identities and addresses ---- */

static inline p2p_identity tn_identity(uint64_t seed, uint32_t n) {
  uint8_t s[32] = {0};
  memcpy(s, &seed, sizeof(seed));
  memcpy(s + 8, &n, sizeof(n));
  p2p_identity id;
  p2p_identity_from_seed(s, &id);
  return id;
}

static inline gw_addr tn_addr(uint32_t n) {
  gw_addr a;
  memset(&a, 0, sizeof(a));
  a.family = 4;
  a.ip[0] = 10;
  a.ip[1] = (uint8_t)(n >> 16);
  a.ip[2] = (uint8_t)(n >> 8);
  a.ip[3] = (uint8_t)n;
  a.port = 4000;
  return a;
}

static inline gw_peer tn_peer(const p2p_identity *id, uint32_t n) {
  gw_peer p = {.id = id->id, .addr = tn_addr(n)};
  return p;
}

/* ---- probe ---- */

#define PROBE_MAX_SENT (512)

typedef struct probe_sent {
  gw_peer to;
  uint8_t buf[2048];
  size_t len;
} probe_sent;

typedef struct probe {
  p2p_identity me;
  gw_peer self;
  dht *d;
  gw_rng rng;
  probe_sent sent[PROBE_MAX_SENT];
  size_t n_sent;
  uint64_t tick_at; /* UINT64_MAX: none asked */
} probe;

static inline int probe_io_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  probe *p = ud;
  if (p->n_sent == PROBE_MAX_SENT || len > sizeof(p->sent[0].buf)) return GW_EFULL;
  probe_sent *s = &p->sent[p->n_sent++];
  s->to = *to;
  memcpy(s->buf, buf, len);
  s->len = len;
  return 0;
}

static inline void probe_io_tick(void *ud, uint64_t at) {
  probe *p = ud;
  if (at < p->tick_at) p->tick_at = at;
}

static inline void probe_io_random(void *ud, void *buf, size_t len) {
  probe *p = ud;
  gw_rng_bytes(&p->rng, buf, len);
}

/* cfg may be NULL; its me and io are filled in. */
static inline void probe_init(probe *p, uint64_t seed, const dht_config *cfg) {
  memset(p, 0, sizeof(*p));
  p->me = tn_identity(seed, 0xffff);
  p->self = tn_peer(&p->me, 0xffff);
  p->tick_at = UINT64_MAX;
  gw_rng_seed(&p->rng, seed);
  dht_config c = cfg ? *cfg : (dht_config){0};
  c.me = &p->me;
  c.io = (gw_io){.ud = p, .send = probe_io_send, .want_tick = probe_io_tick, .random = probe_io_random};
  assert_int_equal(dht_new(&c, 0, &p->d), 0);
}

static inline void probe_free(probe *p) { dht_free(p->d); }

/* Decodes sent message i (the caller frees it). */
static inline dht_msg *probe_msg(probe *p, size_t i) {
  dht_msg *m = NULL;
  assert_true(i < p->n_sent);
  assert_int_equal(dht_wire_decode(p->sent[i].buf, p->sent[i].len, &m), 0);
  return m;
}

/* Runs the tick the probe asked for, if due by now. */
static inline void probe_tick(probe *p, uint64_t now) {
  if (p->tick_at <= now) {
    p->tick_at = UINT64_MAX;
    dht_on_tick(p->d, now);
  }
}

/* Feeds a message built by the test as if `from` sent it. */
static inline void probe_feed(probe *p, const gw_peer *from, dht_msg *m, uint64_t now) {
  uint8_t buf[2048];
  size_t n = gwtf__dht_message__pack(m, buf);
  dht_on_message(p->d, from, buf, n, now);
}

/* A reply skeleton to request r (kind, txid). */
static inline dht_msg tn_reply_to(const dht_msg *r) {
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = (Gwtf__DhtKind)dht_wire_reply_kind(r->kind);
  m.txid = r->txid;
  return m;
}

/* ---- testnet: many dhts on the simulator ---- */

typedef struct testnet {
  sim *s;
  size_t n;
  p2p_identity **ids; /* one allocation each: the dhts keep pointers to them */
  dht **nodes;
  dht_config cfg; /* template */
} testnet;

static inline void tn_on_message(void *node, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  if (node) dht_on_message(node, from, buf, len, now);
}

static inline void tn_on_tick(void *node, uint64_t now) {
  if (node) dht_on_tick(node, now);
}

static const sim_node_ops tn_ops = {tn_on_message, tn_on_tick};

/* Adds one node (index = current count); returns its index. */
static inline size_t tn_add(testnet *t, uint64_t seed) {
  size_t i = t->n++;
  t->ids = realloc(t->ids, t->n * sizeof(*t->ids));
  t->nodes = realloc(t->nodes, t->n * sizeof(*t->nodes));
  assert_non_null(t->ids);
  assert_non_null(t->nodes);
  t->ids[i] = malloc(sizeof(p2p_identity));
  assert_non_null(t->ids[i]);
  *t->ids[i] = tn_identity(seed, (uint32_t)i);
  gw_peer p = tn_peer(t->ids[i], (uint32_t)i);
  assert_int_equal(sim_add_node(t->s, &p, &tn_ops, NULL), (int)i);
  dht_config c = t->cfg;
  c.me = t->ids[i];
  c.io = sim_io(t->s, (int)i);
  assert_int_equal(dht_new(&c, sim_now(t->s), &t->nodes[i]), 0);
  sim_set_node(t->s, (int)i, t->nodes[i]);
  return i;
}

static inline void tn_init(testnet *t, size_t n, uint64_t seed, const sim_config *sc, const dht_config *cfg) {
  memset(t, 0, sizeof(*t));
  sim_config s = sc ? *sc : (sim_config){.seed = seed, .delay_min_ms = 5, .delay_max_ms = 30};
  s.seed = seed;
  if (!s.max_message) s.max_message = 1102;
  t->s = sim_new(&s);
  assert_non_null(t->s);
  if (cfg) t->cfg = *cfg;
  for (size_t i = 0; i < n; i++) tn_add(t, seed);
}

static inline void tn_free(testnet *t) {
  for (size_t i = 0; i < t->n; i++) {
    dht_free(t->nodes[i]);
    free(t->ids[i]);
  }
  sim_free(t->s);
  free(t->nodes);
  free(t->ids);
}

static inline void tn_crash(testnet *t, size_t i) { sim_crash(t->s, (int)i); }

/* Node i joins through node `via` (its ID known, as from a contacts file, or
 * not: a bootstrap address). */
static inline void tn_bootstrap(testnet *t, size_t i, size_t via, bool with_id) {
  gw_peer seed = tn_peer(t->ids[via], (uint32_t)via);
  if (!with_id) memset(&seed.id, 0, sizeof(seed.id));
  assert_int_equal(dht_bootstrap(t->nodes[i], &seed, 1, sim_now(t->s)), 0);
}

typedef struct tn_all {
  testnet *t;
  size_t from, to;
} tn_all;

static inline bool tn_all_joined(void *ud) {
  tn_all *a = ud;
  for (size_t i = a->from; i < a->to; i++)
    if (sim_alive(a->t->s, (int)i) && !dht_joined(a->t->nodes[i])) return false;
  return true;
}

/* Nodes 1..n-1 join, `stagger_ms` apart, each through node 0 or a random
 * node that joined before it; returns when all have joined (or asserts). */
static inline void tn_join_all(testnet *t, uint64_t stagger_ms, uint64_t deadline_ms) {
  gw_rng *rng = sim_rng(t->s);
  for (size_t i = 1; i < t->n; i++) {
    sim_run_until(t->s, sim_now(t->s) + stagger_ms);
    size_t via = i == 1 ? 0 : (size_t)gw_rng_below(rng, i - 1);
    tn_bootstrap(t, i, via, false);
  }
  tn_all all = {t, 1, t->n};
  assert_true(sim_run_while_not(t->s, tn_all_joined, &all, sim_now(t->s) + deadline_ms));
}

/* The live node closest to target, by brute force. */
static inline size_t tn_true_closest(const testnet *t, const gw_id *target) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < t->n; i++) {
    if (!sim_alive(t->s, (int)i)) continue;
    if (best == SIZE_MAX || dht_dist_cmp(target, &t->ids[i]->id, &t->ids[best]->id) < 0) best = i;
  }
  return best;
}

/* ---- callbacks that record results ---- */

typedef struct tn_nodes_result {
  bool done;
  int status;
  gw_peer closest[DHT_K];
  size_t n;
  dht_lookup_stats st;
} tn_nodes_result;

static inline void tn_on_nodes(void *ud, int status, const gw_peer *closest, size_t n, const dht_lookup_stats *st) {
  tn_nodes_result *r = ud;
  r->done = true;
  r->status = status;
  r->n = n < DHT_K ? n : DHT_K;
  if (n) memcpy(r->closest, closest, r->n * sizeof(*closest));
  r->st = *st;
}

#define TN_MAX_RECS (128)

typedef struct tn_records_result {
  bool done;
  int status;
  size_t n;
  gw_id publishers[TN_MAX_RECS];
  uint64_t seqs[TN_MAX_RECS];
  char values[TN_MAX_RECS][64];
  dht_lookup_stats st;
} tn_records_result;

static inline void tn_on_records(void *ud, int status, const dht_record *recs, size_t n,
                                 const dht_lookup_stats *st) {
  tn_records_result *r = ud;
  r->done = true;
  r->status = status;
  r->n = n < TN_MAX_RECS ? n : TN_MAX_RECS;
  for (size_t i = 0; i < r->n; i++) {
    r->publishers[i] = recs[i].publisher;
    r->seqs[i] = recs[i].seq;
    size_t len = recs[i].value_len < 63 ? recs[i].value_len : 63;
    memcpy(r->values[i], recs[i].value, len);
    r->values[i][len] = '\0';
  }
  r->st = *st;
}

static inline bool tn_flag(void *ud) { return *(bool *)ud; }

/* What stage_dir_discover delivered (members copied, extra bytes included). */
#define TN_MAX_MEMBERS (64)

typedef struct tn_members_result {
  bool done;
  int status;
  size_t n;
  stage_member m[TN_MAX_MEMBERS];
  uint8_t extra[TN_MAX_MEMBERS][16];
} tn_members_result;

static inline void tn_on_members(void *ud, int status, const stage_member *m, size_t n) {
  tn_members_result *r = ud;
  r->done = true;
  r->status = status;
  r->n = n < TN_MAX_MEMBERS ? n : TN_MAX_MEMBERS;
  for (size_t i = 0; i < r->n; i++) {
    r->m[i] = m[i];
    if (m[i].extra_len) memcpy(r->extra[i], m[i].extra, m[i].extra_len < 16 ? m[i].extra_len : 16);
    r->m[i].extra = r->extra[i];
  }
}

static inline bool tn_has_member(const tn_members_result *r, const gw_id *id) {
  for (size_t i = 0; i < r->n; i++)
    if (gw_id_eq(&r->m[i].id, id)) return true;
  return false;
}

static inline bool tn_has_publisher(const tn_records_result *r, const gw_id *id) {
  for (size_t i = 0; i < r->n; i++)
    if (gw_id_eq(&r->publishers[i], id)) return true;
  return false;
}

#endif
