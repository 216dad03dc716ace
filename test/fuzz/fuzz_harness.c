#include "fuzz_harness.h"

#include <stdbool.h>
#include <string.h>

#include "dht/dht.h"
#include "dht/wire.h"
#include "p2p/udp.h"
#include "util/rng.h"

#define FUZZ_MAX_OUT (64)

/* Fixed cast, made once per process (test code: plain statics are fine). */
static struct {
  bool ready;
  p2p_identity me, seed_ids[FUZZ_SEEDS], stranger_id;
  gw_peer me_peer, seeds[FUZZ_SEEDS], stranger;
} cast;

static gw_peer peer_of(const p2p_identity *id, uint8_t last) {
  gw_peer p;
  memset(&p, 0, sizeof(p));
  p.id = id->id;
  p.addr.family = 4;
  p.addr.ip[0] = 10;
  p.addr.ip[3] = last;
  p.addr.port = 4000;
  return p;
}

static void identity_n(uint8_t n, p2p_identity *out) {
  uint8_t seed[32];
  memset(seed, n, sizeof(seed));
  p2p_identity_from_seed(seed, out);
}

static void cast_init(void) {
  if (cast.ready) return;
  p2p_crypto_init();
  identity_n(1, &cast.me);
  cast.me_peer = peer_of(&cast.me, 1);
  for (unsigned i = 0; i < FUZZ_SEEDS; i++) {
    identity_n((uint8_t)(10 + i), &cast.seed_ids[i]);
    cast.seeds[i] = peer_of(&cast.seed_ids[i], (uint8_t)(10 + i));
  }
  identity_n(99, &cast.stranger_id);
  cast.stranger = peer_of(&cast.stranger_id, 99);
  cast.ready = true;
}

const gw_peer *fuzz_seed_peer(unsigned i) {
  cast_init();
  return &cast.seeds[i % FUZZ_SEEDS];
}

const gw_peer *fuzz_stranger(void) {
  cast_init();
  return &cast.stranger;
}

const gw_peer *fuzz_node(void) {
  cast_init();
  return &cast.me_peer;
}

const p2p_identity *fuzz_seed_identity(unsigned i) {
  cast_init();
  return &cast.seed_ids[i % FUZZ_SEEDS];
}

const p2p_identity *fuzz_stranger_identity(void) {
  cast_init();
  return &cast.stranger_id;
}

void fuzz_record_key(gw_id *out) { gw_id_hash_str("run/fuzz/stage/0", out); }

void fuzz_lookup_target(gw_id *out) { gw_id_hash_str("fuzz/target", out); }

/* ---- the node's io: a seeded random source and a log of what it sends ---- */

typedef struct fuzz_io {
  gw_rng rng;
  fuzz_request out[FUZZ_MAX_OUT]; /* requests the node sent, in order */
  size_t n_out, answered;
  fuzz_sent_fn sent;
  void *ud;
} fuzz_io;

static int io_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  fuzz_io *f = ud;
  dht_msg *m;
  if (f->sent) f->sent(f->ud, to, buf, len);
  if (f->n_out < FUZZ_MAX_OUT && dht_wire_decode(buf, len, &m) == 0) {
    if (dht_wire_is_request(m->kind)) f->out[f->n_out++] = (fuzz_request){*to, (int)m->kind, m->txid};
    dht_wire_free(m);
  }
  return 0;
}

static void io_tick(void *ud, uint64_t at) { (void)ud, (void)at; }

static void io_random(void *ud, void *buf, size_t len) {
  fuzz_io *f = ud;
  gw_rng_bytes(&f->rng, buf, len);
}

/* Answers, as the seeds, every FIND_NODE the node sent since the last call:
 * an empty NODES reply each, so the seeds enter the table and lookups end. */
static void answer_find_nodes(dht *d, fuzz_io *f, uint64_t now) {
  uint8_t buf[128];
  for (; f->answered < f->n_out; f->answered++) {
    const fuzz_request *r = &f->out[f->answered];
    if (r->kind != GWTF__DHT_KIND__DHT_FIND_NODE) continue;
    dht_msg m = GWTF__DHT_MESSAGE__INIT;
    m.kind = GWTF__DHT_KIND__DHT_NODES;
    m.txid = r->txid;
    size_t len = gwtf__dht_message__pack(&m, buf);
    for (unsigned i = 0; i < FUZZ_SEEDS; i++)
      if (gw_addr_eq(&r->to.addr, &cast.seeds[i].addr)) dht_on_message(d, &cast.seeds[i], buf, len, now);
  }
}

static void noop_nodes(void *ud, int status, const gw_peer *p, size_t n, const dht_lookup_stats *st) {
  (void)ud, (void)status, (void)p, (void)n, (void)st;
}

static void noop_records(void *ud, int status, const dht_record *r, size_t n, const dht_lookup_stats *st) {
  (void)ud, (void)status, (void)r, (void)n, (void)st;
}

/* The node before the input arrives: joined through the three seeds, and
 * with a STORE (of its publication), a FIND_VALUE (a fetch) and a FIND_NODE
 * (a node lookup) outstanding to each seed. Everything is deterministic. */
static dht *setup(fuzz_io *f) {
  dht_config cfg = {.me = &cast.me, .record_ttl_ms = 60000};
  cfg.io = (gw_io){.ud = f, .send = io_send, .want_tick = io_tick, .random = io_random};
  dht *d;
  if (dht_new(&cfg, 0, &d) != 0) return NULL;
  dht_bootstrap(d, cast.seeds, FUZZ_SEEDS, 0);
  dht_on_tick(d, 0);
  answer_find_nodes(d, f, 1); /* the bootstrap requests: the seeds enter the table */
  dht_on_tick(d, 2);          /* the join lookup ends */
  gw_id key, target;
  fuzz_record_key(&key);
  fuzz_lookup_target(&target);
  dht_publish(d, &key, (const uint8_t *)"fuzz", 4, NULL, NULL, 3);
  answer_find_nodes(d, f, 4); /* its lookup ends: STOREs go out */
  f->answered = f->n_out;     /* leave the rest unanswered */
  dht_fetch(d, &key, noop_records, NULL, 5);
  dht_find_node(d, &target, noop_nodes, NULL, 5);
  return d;
}

void fuzz_feed_payload(uint8_t who, const uint8_t *payload, size_t len, fuzz_sent_fn sent, void *ud) {
  cast_init();
  fuzz_io f = {.sent = sent, .ud = ud};
  gw_rng_seed(&f.rng, 1); /* the same transaction IDs for every input */
  dht *d = setup(&f);
  if (!d) return;
  const gw_peer *from = who < FUZZ_SEEDS ? &cast.seeds[who] : &cast.stranger;
  dht_on_message(d, from, payload, len, 10);
  /* Whatever it started: run its timers out. */
  for (uint64_t t = 250; t <= 5000; t += 250) dht_on_tick(d, t);
  dht_free(d);
}

size_t fuzz_outstanding(fuzz_request *out, size_t max) {
  cast_init();
  fuzz_io f = {0};
  gw_rng_seed(&f.rng, 1);
  dht *d = setup(&f);
  if (!d) return 0;
  size_t n = 0;
  for (size_t i = 0; i < f.n_out && n < max; i++) out[n++] = f.out[i];
  dht_free(d);
  return n;
}

int fuzz_dht_payload(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  fuzz_feed_payload(data[0], data + 1, size - 1, NULL, NULL);
  return 0;
}

int fuzz_datagram(const uint8_t *data, size_t size) {
  cast_init();
  gw_id sender;
  const uint8_t *payload, *pk;
  size_t len;
  /* The real path first: framing, then the signature (which random bytes fail). */
  bool verified = p2p_udp_unseal(data, size, &cast.me.id, &sender, &payload, &len) == 0;
  /* Past a failed signature as if it had verified, so the decoder behind
   * it is reached too: the sender is whoever the key names. */
  if (!verified) {
    if (p2p_udp_parse(data, size, &pk, &payload, &len) != 0) return 0;
    p2p_id_from_pk(pk, &sender);
  }
  uint8_t who = FUZZ_SEEDS;
  for (unsigned i = 0; i < FUZZ_SEEDS; i++)
    if (gw_id_eq(&sender, &cast.seeds[i].id)) who = (uint8_t)i;
  fuzz_feed_payload(who, payload, len, NULL, NULL);
  return 0;
}
