/* Writes the seed corpora for the DHT fuzz targets:
 *
 *   fuzz_gen_corpus OUT_DIR     # creates OUT_DIR/dht_payload and OUT_DIR/datagram
 *
 * Real messages of every kind, built against the harness's node (its
 * transaction IDs and cookies are deterministic, see fuzz_harness.h), so the
 * fuzzer starts from inputs that reach deep into the handlers: replies that
 * match outstanding requests, stores with valid signatures and cookies,
 * paged FIND_VALUEs, plus a few malformed ones. The committed corpus under
 * test/fuzz/corpus was made by this program plus the fuzzer's own finds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dht.pb-c.h"
#include "dht/record.h"
#include "dht/routing.h"
#include "dht/wire.h"
#include "fuzz_harness.h"
#include "fuzz_targets.h"
#include "p2p/udp.h"

typedef struct capture {
  uint8_t cookie[DHT_COOKIE_BYTES]; /* the node's cookie for whoever pinged */
  bool have_cookie;
} capture;

static void on_sent(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  capture *c = ud;
  dht_msg *m;
  (void)to;
  if (dht_wire_decode(buf, len, &m) != 0) return;
  if (m->kind == GWTF__DHT_KIND__DHT_PONG && m->your_cookie.len == DHT_COOKIE_BYTES) {
    memcpy(c->cookie, m->your_cookie.data, DHT_COOKIE_BYTES);
    c->have_cookie = true;
  }
  dht_wire_free(m);
}

static const char *out_root;
static unsigned n_written;

static void write_file(const char *sub, const uint8_t *buf, size_t len) {
  fuzz_corpus_write(out_root, sub, buf, len);
  n_written++;
}

/* One payload input (who + message) and, when the sender's key is known,
 * the datagram that would carry it. */
static void emit(uint8_t who, dht_msg *m, const p2p_identity *signer) {
  uint8_t buf[2048 + 1], dg[P2P_UDP_MAX_DGRAM];
  size_t len = gwtf__dht_message__pack(m, buf + 1);
  buf[0] = who;
  write_file("dht_payload", buf, len + 1);
  size_t dlen;
  if (signer && p2p_udp_seal(signer, &fuzz_node()->id, buf + 1, len, dg, sizeof(dg), &dlen) == 0) {
    write_file("datagram", dg, dlen);
    dg[dlen - 1] ^= 0x40; /* and a forged one */
    write_file("datagram", dg, dlen);
  }
}

static void emit_raw(uint8_t who, const uint8_t *p, size_t len) {
  uint8_t buf[64];
  buf[0] = who;
  memcpy(buf + 1, p, len);
  write_file("dht_payload", buf, len + 1);
}

static capture learn(uint8_t who) {
  capture c = {0};
  uint8_t pad[64] = {0};
  dht_msg ping = GWTF__DHT_MESSAGE__INIT;
  ping.kind = GWTF__DHT_KIND__DHT_PING;
  ping.txid = 7;
  ping.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  uint8_t buf[256];
  size_t len = gwtf__dht_message__pack(&ping, buf);
  fuzz_feed_payload(who, buf, len, on_sent, &c);
  return c;
}

static void requests(uint8_t who, const p2p_identity *signer, const uint8_t *cookie) {
  gw_id target, key;
  gw_id_hash_str("somewhere", &target);
  fuzz_record_key(&key);
  uint8_t pad[400] = {0};
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = GWTF__DHT_KIND__DHT_PING;
  m.txid = 1;
  emit(who, &m, signer);
  m.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie};
  emit(who, &m, signer);
  m.kind = GWTF__DHT_KIND__DHT_FIND_NODE;
  m.target = (ProtobufCBinaryData){GW_ID_BYTES, target.b};
  m.want = 20;
  emit(who, &m, signer);
  m.cookie = (ProtobufCBinaryData){0};
  m.padding = (ProtobufCBinaryData){sizeof(pad), pad};
  emit(who, &m, signer);
  m.kind = GWTF__DHT_KIND__DHT_FIND_VALUE;
  m.target = (ProtobufCBinaryData){GW_ID_BYTES, key.b};
  emit(who, &m, signer);
  m.padding = (ProtobufCBinaryData){0};
  m.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie};
  emit(who, &m, signer);
  uint8_t after[GW_ID_BYTES];
  memset(after, 0x80, sizeof(after));
  m.after = (ProtobufCBinaryData){GW_ID_BYTES, after};
  emit(who, &m, signer);
}

static void stores(uint8_t who, const p2p_identity *signer, const uint8_t *cookie) {
  gw_id key;
  fuzz_record_key(&key);
  const char *values[] = {"member", "", "a value of moderate length for a stage record .................."};
  for (size_t i = 0; i < 3; i++) {
    dht_rec *r;
    if (dht_rec_make(signer, &key, (const uint8_t *)values[i], strlen(values[i]), 100 + i, 60000, 0, &r) != 0)
      exit(1);
    dht_msg m = GWTF__DHT_MESSAGE__INIT;
    Gwtf__DhtRecord w = GWTF__DHT_RECORD__INIT;
    w.body = (ProtobufCBinaryData){r->body_len, r->body};
    w.sig = (ProtobufCBinaryData){P2P_SIG_BYTES, r->sig};
    w.remaining_ms = 30000;
    m.kind = GWTF__DHT_KIND__DHT_STORE;
    m.txid = 3;
    m.record = &w;
    m.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie};
    emit(who, &m, signer);
    if (i == 0) {
      m.cookie = (ProtobufCBinaryData){0};
      emit(who, &m, signer);
      m.cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie};
      w.remaining_ms = 0;
      emit(who, &m, signer);
      w.remaining_ms = 30000;
      r->sig[5] ^= 1;
      emit(who, &m, signer);
    }
    dht_rec_free(r);
  }
}

/* Contacts for NODES replies: mostly good, a few broken ones. */
static void make_contacts(gw_peer *peers, Gwtf__DhtContact *cs, Gwtf__DhtContact **ptrs, unsigned n) {
  for (unsigned j = 0; j < n; j++) {
    char name[32];
    snprintf(name, sizeof(name), "contact-%u", j);
    gw_id_hash_str(name, &peers[j].id);
    memset(&peers[j].addr, 0, sizeof(peers[j].addr));
    peers[j].addr.family = j % 5 == 4 ? 6 : 4;
    peers[j].addr.ip[0] = peers[j].addr.family == 4 ? 10 : 0x20;
    peers[j].addr.ip[3] = (uint8_t)(100 + j);
    peers[j].addr.port = (uint16_t)(5000 + j);
    dht_wire_contact(&cs[j], &peers[j], true);
    ptrs[j] = &cs[j];
  }
  cs[3].port = 0;
  cs[7].ip.len = 5;
  cs[9].id = (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)fuzz_node()->id.b};
}

/* A page of records under the node's key, signed by the seeds and the stranger. */
static size_t make_records(dht_rec **recs, Gwtf__DhtRecord *ws, Gwtf__DhtRecord **ptrs) {
  gw_id key, other;
  fuzz_record_key(&key);
  gw_id_hash_str("another key", &other);
  size_t n = 0;
  for (unsigned i = 0; i <= FUZZ_SEEDS; i++) {
    const p2p_identity *id = i < FUZZ_SEEDS ? fuzz_seed_identity(i) : fuzz_stranger_identity();
    const char *v = i == 1 ? "" : "member";
    if (dht_rec_make(id, i == 2 ? &other : &key, (const uint8_t *)v, strlen(v), 7, 60000, 0, &recs[n]) != 0) exit(1);
    gwtf__dht_record__init(&ws[n]);
    ws[n].body = (ProtobufCBinaryData){recs[n]->body_len, recs[n]->body};
    ws[n].sig = (ProtobufCBinaryData){P2P_SIG_BYTES, recs[n]->sig};
    ws[n].remaining_ms = 30000;
    ptrs[n] = &ws[n];
    n++;
  }
  return n;
}

/* Replies, from the seed it went to, to every request the node has out. */
static void replies(void) {
  fuzz_request out[64];
  size_t n_out = fuzz_outstanding(out, 64);
  gw_peer peers[20];
  Gwtf__DhtContact cs[20], *cptrs[20];
  dht_rec *recs[FUZZ_SEEDS + 1];
  Gwtf__DhtRecord ws[FUZZ_SEEDS + 1], *rptrs[FUZZ_SEEDS + 1];
  make_contacts(peers, cs, cptrs, 20);
  size_t n_recs = make_records(recs, ws, rptrs);
  uint8_t your[DHT_COOKIE_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t k = 0; k < n_out; k++) {
    unsigned who = FUZZ_SEEDS;
    for (unsigned i = 0; i < FUZZ_SEEDS; i++)
      if (gw_addr_eq(&out[k].to.addr, &fuzz_seed_peer(i)->addr)) who = i;
    if (who == FUZZ_SEEDS) continue;
    const p2p_identity *signer = fuzz_seed_identity(who);
    dht_msg m = GWTF__DHT_MESSAGE__INIT;
    m.kind = (Gwtf__DhtKind)dht_wire_reply_kind(out[k].kind);
    m.txid = out[k].txid;
    m.your_cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, your};
    switch (out[k].kind) {
    case GWTF__DHT_KIND__DHT_STORE:
      emit((uint8_t)who, &m, signer);
      m.status = GWTF__DHT_STORE_STATUS__DHT_STORE_COOKIE;
      emit((uint8_t)who, &m, signer);
      m.status = GWTF__DHT_STORE_STATUS__DHT_STORE_STALE;
      emit((uint8_t)who, &m, signer);
      break;
    case GWTF__DHT_KIND__DHT_FIND_VALUE:
      m.n_records = n_recs;
      m.records = rptrs;
      m.more = 1;
      emit((uint8_t)who, &m, signer);
      m.more = 0;
      m.n_nodes = 5;
      m.nodes = cptrs;
      emit((uint8_t)who, &m, signer);
      break;
    default:
      m.n_nodes = 5;
      m.nodes = cptrs;
      emit((uint8_t)who, &m, signer);
      m.n_nodes = 20;
      emit((uint8_t)who, &m, signer);
      m.kind = GWTF__DHT_KIND__DHT_PONG; /* the wrong kind for that request */
      emit((uint8_t)who, &m, signer);
      break;
    }
  }
  for (size_t i = 0; i < n_recs; i++) dht_rec_free(recs[i]);
}

static void malformed(void) {
  static const uint8_t bad[][12] = {
      {0x08},                                    /* kind, then nothing */
      {0x08, 0x03, 0x2a, 0xff, 0xff, 0xff, 0x0f}, /* length far past the end */
      {0x08, 0x03, 0x2a, 0x1f, 0x00},            /* target too short */
      {0x08, 0x63},                              /* unknown kind */
      {0x42, 0x02, 0x0a, 0x00},                  /* contact without kind */
      {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
  };
  static const size_t lens[] = {1, 7, 5, 2, 4, 11};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) emit_raw(FUZZ_SEEDS, bad[i], lens[i]);
  emit_raw(0, bad[0], 0);
  uint8_t junk[300];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)(i * 37 + 11);
  write_file("datagram", junk, sizeof(junk));
  junk[0] = P2P_UDP_MAGIC;
  junk[1] = P2P_UDP_VERSION << 4;
  write_file("datagram", junk, sizeof(junk));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_gen_corpus OUT_DIR\n");
    return 2;
  }
  out_root = argv[1];
  char path[4096];
  mkdir(out_root, 0755);
  snprintf(path, sizeof(path), "%s/dht_payload", out_root);
  mkdir(path, 0755);
  snprintf(path, sizeof(path), "%s/datagram", out_root);
  mkdir(path, 0755);

  capture c = learn(FUZZ_SEEDS);
  if (!c.have_cookie) {
    fprintf(stderr, "fuzz_gen_corpus: the node gave no cookie\n");
    return 1;
  }
  requests(FUZZ_SEEDS, fuzz_stranger_identity(), c.cookie);
  stores(FUZZ_SEEDS, fuzz_stranger_identity(), c.cookie);
  for (unsigned i = 0; i < FUZZ_SEEDS; i++) {
    capture s = learn((uint8_t)i);
    requests((uint8_t)i, fuzz_seed_identity(i), s.cookie);
  }
  replies();
  malformed();
  printf("fuzz_gen_corpus: %u files under %s\n", n_written, out_root);
  return 0;
}
