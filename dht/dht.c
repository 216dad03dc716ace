/* dht/dht.c — messages in, requests out, and the node's upkeep.
 *
 * Iterative lookups, fetches and publications live in lookup.c; this file
 * owns the request table (every request we sent and still wait for), answers
 * other nodes' requests, matches replies to requests, and runs the periodic
 * work: request timeouts, bootstrap retries, bucket refresh, republication,
 * record expiry and cookie rotation. */
#include <stdlib.h>
#include <string.h>

#include "dht/internal.h"
#include "p2p/udp.h"
#include "util/err.h"

/* ---- configuration ---- */

static void apply_defaults(dht_config *c) {
#define DEFAULT(field, value) \
  if (!(c->field)) c->field = (value)
  DEFAULT(k, DHT_K);
  DEFAULT(alpha, DHT_ALPHA);
  DEFAULT(width, DHT_WIDTH);
  DEFAULT(replicas, c->k);
  DEFAULT(rpc_timeout_ms, DHT_RPC_TIMEOUT_MS);
  DEFAULT(record_ttl_ms, DHT_RECORD_TTL_MS);
  DEFAULT(max_record_ttl_ms, DHT_MAX_RECORD_TTL_MS);
  DEFAULT(refresh_ms, DHT_REFRESH_MS);
  DEFAULT(max_payload, P2P_UDP_MAX_PAYLOAD);
  DEFAULT(wire_overhead, P2P_UDP_OVERHEAD);
  DEFAULT(rate_global, 400);
  DEFAULT(burst_global, 800);
  DEFAULT(rate_ip, 50);
  DEFAULT(burst_ip, 100);
  DEFAULT(max_keys, 1024);
  DEFAULT(max_subkeys, 64);
  DEFAULT(max_store_bytes, 4u << 20);
#undef DEFAULT
  /* A reply carries at most DHT_WIRE_MAX_NODES contacts. */
  if (c->k > DHT_WIRE_MAX_NODES) c->k = DHT_WIRE_MAX_NODES;
  if (c->replicas > DHT_LOOKUP_SLOTS / 2) c->replicas = DHT_LOOKUP_SLOTS / 2;
  if (c->rpc_timeout_ms > DHT_RPC_TIMEOUT_MS) c->rpc_timeout_ms = DHT_RPC_TIMEOUT_MS;
  if (c->max_payload >= DHT_BUF) c->max_payload = DHT_BUF - 1;
}

static void rnd(dht *d, void *buf, size_t len) { d->cfg.io.random(d->cfg.io.ud, buf, len); }

int dht_new(const dht_config *cfg, uint64_t now_ms, dht **out) {
  *out = NULL;
  if (!cfg->me || !cfg->io.send || !cfg->io.want_tick || !cfg->io.random) return GW_EINVAL;
  dht *d = calloc(1, sizeof(*d));
  if (!d) return GW_ENOMEM;
  d->cfg = *cfg;
  apply_defaults(&d->cfg);
  d->self = cfg->me->id;
  d->armed_at = UINT64_MAX;
  d->boot_backoff = DHT_BOOT_RETRY_MIN_MS;
  d->rejoin_at = UINT64_MAX;
  d->rejoin_backoff = DHT_BOOT_RETRY_MIN_MS;
  dht_store_limits lim = {d->cfg.max_keys, d->cfg.max_subkeys, d->cfg.max_store_bytes};
  int rc = dht_routing_init(&d->rt, &d->self, d->cfg.k, DHT_REPLACEMENTS, d->cfg.refresh_ms, now_ms);
  if (rc == 0) rc = dht_store_new(&lim, &d->store);
  if (rc != 0) {
    dht_free(d);
    return rc;
  }
  uint8_t seed[DHT_GUARD_SEED_BYTES];
  rnd(d, seed, sizeof(seed));
  dht_rate_limits rl = {d->cfg.rate_global, d->cfg.burst_global, d->cfg.rate_ip, d->cfg.burst_ip};
  if (rl.global_rate == UINT32_MAX) rl.global_rate = 0;
  if (rl.ip_rate == UINT32_MAX) rl.ip_rate = 0;
  dht_guard_init(&d->guard, &rl, seed, now_ms);
  *out = d;
  return 0;
}

void dht_free(dht *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_lookups; i++) {
    dht_lookup *lk = d->lookups[i];
    /* Like a closed libuv handle's requests: callers get their callback, so
     * whatever they attached to the operation can be released. */
    if (lk->nodes_cb) lk->nodes_cb(lk->ud, GW_ECLOSED, NULL, 0, &lk->st);
    if (lk->records_cb) lk->records_cb(lk->ud, GW_ECLOSED, NULL, 0, &lk->st);
    dht_lookup_free(lk);
  }
  for (size_t i = 0; i < d->n_pubs; i++) free(d->pubs[i].value);
  free(d->pubs);
  free(d->rpcs);
  dht_store_free(d->store);
  if (d->rt.buckets) dht_routing_free(&d->rt);
  free(d);
}

/* ---- small helpers ---- */

bool dht_peer_acceptable(const dht *d, const gw_peer *p) {
  return !gw_id_is_zero(&p->id) && !gw_id_eq(&p->id, &d->self) &&
         !gw_addr_is_martian(&p->addr, d->cfg.allow_loopback);
}

uint64_t dht_next_seq(dht *d, uint64_t now_ms) {
  uint64_t s = d->cfg.seq_base + now_ms;
  d->last_seq = s > d->last_seq ? s : d->last_seq + 1;
  return d->last_seq;
}

const uint8_t *dht_cookie_for(dht *d, const gw_peer *p) {
  dht_contact *c = dht_routing_find(&d->rt, &p->id);
  return c && c->has_cookie && gw_addr_eq(&c->peer.addr, &p->addr) ? c->cookie : NULL;
}

static bool is_client(const dht *d) { return d->client_mode || d->cfg.client_only; }

/* A sender marked `client` never enters our table; one that is there (it
 * was reachable before) leaves it, and a replacement takes its slot. */
static void drop_client(dht *d, const gw_peer *from) {
  d->st.client_senders++;
  if (dht_routing_find(&d->rt, &from->id)) {
    dht_routing_remove(&d->rt, &from->id);
    char id[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&from->id, id);
    GW_DEBUG(d->cfg.log, "dht.client_dropped", "peer=\"%s\"", id);
  }
}

static int find_rpc(const dht *d, uint64_t txid) {
  for (size_t i = 0; i < d->n_rpcs; i++)
    if (d->rpcs[i].txid == txid) return (int)i;
  return -1;
}

static bool rpc_pending_to(const dht *d, const gw_id *id) {
  for (size_t i = 0; i < d->n_rpcs; i++)
    if (gw_id_eq(&d->rpcs[i].to.id, id)) return true;
  return false;
}

static void rpc_remove(dht *d, size_t i) { d->rpcs[i] = d->rpcs[--d->n_rpcs]; }

/* How long a lookup waits before asking someone else: the smoothed RTT plus
 * four deviations, as TCP does, but never less than DHT_RTO_MIN_MS nor more
 * than the request timeout. Until the first reply: the request timeout. */
static uint64_t rto(const dht *d) {
  if (!d->have_rtt) return d->cfg.rpc_timeout_ms;
  double r = d->srtt + 4 * d->rttvar;
  if (r < DHT_RTO_MIN_MS) r = DHT_RTO_MIN_MS;
  return r > (double)d->cfg.rpc_timeout_ms ? d->cfg.rpc_timeout_ms : (uint64_t)r;
}

static void rtt_sample(dht *d, uint64_t rtt_ms) {
  double r = (double)rtt_ms;
  if (!d->have_rtt) {
    d->srtt = r;
    d->rttvar = r / 2;
    d->have_rtt = true;
    return;
  }
  d->rttvar = 0.75 * d->rttvar + 0.25 * (d->srtt > r ? d->srtt - r : r - d->srtt);
  d->srtt = 0.875 * d->srtt + 0.125 * r;
}

static void send_bytes(dht *d, const gw_peer *to, const uint8_t *buf, size_t len) {
  /* A failed send behaves like a lost datagram: the request times out. */
  (void)d->cfg.io.send(d->cfg.io.ud, to, buf, len);
}

/* ---- requests we send ---- */

int dht_rpc_send(dht *d, const gw_peer *to, dht_msg *m, const uint8_t *cookie, size_t reply_estimate,
                 uint8_t purpose, uint32_t lookup, uint64_t now_ms, dht_rpc **out) {
  uint8_t buf[DHT_BUF], your[DHT_COOKIE_BYTES];
  if (out) *out = NULL;
  if (d->n_rpcs >= DHT_MAX_RPCS) return GW_EFULL;
  if (d->n_rpcs == d->cap_rpcs) {
    size_t cap = d->cap_rpcs ? 2 * d->cap_rpcs : 8;
    dht_rpc *r = realloc(d->rpcs, cap * sizeof(*r));
    if (!r) return GW_ENOMEM;
    d->rpcs = r;
    d->cap_rpcs = cap;
  }
  uint64_t txid;
  do rnd(d, &txid, sizeof(txid));
  while (txid == 0 || find_rpc(d, txid) >= 0);
  m->txid = txid;
  m->client = is_client(d);
  m->cookie = cookie ? (ProtobufCBinaryData){DHT_COOKIE_BYTES, (uint8_t *)cookie} : (ProtobufCBinaryData){0};
  m->your_cookie = (ProtobufCBinaryData){0};
  if (!gw_id_is_zero(&to->id)) {
    dht_cookie_make(&d->guard, to, your);
    m->your_cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, your};
  }
  m->padding = (ProtobufCBinaryData){0};
  /* Without a cookie the answer may not outgrow the question: ask big. */
  if (!cookie) dht_wire_pad(m, reply_estimate < d->cfg.max_payload ? reply_estimate : d->cfg.max_payload);
  size_t len = dht_wire_pack_fit(m, buf, d->cfg.max_payload);
  if (len == 0) return GW_ERANGE;
  dht_rpc *r = &d->rpcs[d->n_rpcs++];
  memset(r, 0, sizeof(*r));
  r->txid = txid;
  r->sent_at = now_ms;
  r->slow_at = now_ms + rto(d);
  r->deadline = now_ms + d->cfg.rpc_timeout_ms;
  r->to = *to;
  r->kind = (uint8_t)m->kind;
  r->purpose = purpose;
  r->lookup = lookup;
  r->wire_bytes = len + d->cfg.wire_overhead;
  d->st.rpcs_sent++;
  send_bytes(d, to, buf, len);
  if (out) *out = r;
  return 0;
}

static int send_ping(dht *d, const gw_peer *to, uint8_t purpose, uint64_t now_ms) {
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = GWTF__DHT_KIND__DHT_PING;
  return dht_rpc_send(d, to, &m, dht_cookie_for(d, to), DHT_PING_PAD, purpose, 0, now_ms, NULL);
}

/* ---- answering requests ---- */

/* Room for a reply's contacts and records on the stack. */
typedef struct reply_space {
  gw_peer peers[DHT_WIRE_MAX_NODES];
  Gwtf__DhtContact contacts[DHT_WIRE_MAX_NODES];
  Gwtf__DhtContact *contact_ptrs[DHT_WIRE_MAX_NODES];
  const dht_rec *recs[DHT_WIRE_MAX_RECORDS];
  Gwtf__DhtRecord records[DHT_WIRE_MAX_RECORDS];
  Gwtf__DhtRecord *record_ptrs[DHT_WIRE_MAX_RECORDS];
  Gwtf__DhtContact observed;
} reply_space;

static void add_nodes(dht *d, reply_space *sp, dht_msg *r, const dht_msg *m, const gw_peer *from) {
  size_t want = m->want == 0 || m->want > d->cfg.k ? d->cfg.k : m->want;
  gw_id target;
  memcpy(target.b, m->target.data, GW_ID_BYTES);
  size_t n = dht_routing_closest(&d->rt, &target, &from->id, sp->peers, want);
  for (size_t i = 0; i < n; i++) {
    dht_wire_contact(&sp->contacts[i], &sp->peers[i], true);
    sp->contact_ptrs[i] = &sp->contacts[i];
  }
  r->n_nodes = n;
  r->nodes = sp->contact_ptrs;
}

/* Records first, contacts after: when the datagram is full the contacts are
 * dropped first, then the last records, and `more` tells the asker to come
 * back for the rest. */
static void add_records(dht *d, reply_space *sp, dht_msg *r, const dht_msg *m, uint64_t now_ms) {
  gw_id key, after;
  bool more = false;
  memcpy(key.b, m->target.data, GW_ID_BYTES);
  if (m->after.len == GW_ID_BYTES) memcpy(after.b, m->after.data, GW_ID_BYTES);
  size_t n = dht_store_get(d->store, &key, m->after.len ? &after : NULL, now_ms, sp->recs,
                           DHT_WIRE_MAX_RECORDS, &more);
  for (size_t i = 0; i < n; i++) {
    Gwtf__DhtRecord *w = &sp->records[i];
    gwtf__dht_record__init(w);
    w->body = (ProtobufCBinaryData){sp->recs[i]->body_len, sp->recs[i]->body};
    w->sig = (ProtobufCBinaryData){P2P_SIG_BYTES, (uint8_t *)sp->recs[i]->sig};
    w->remaining_ms = dht_rec_remaining(sp->recs[i], now_ms);
    sp->record_ptrs[i] = w;
  }
  r->n_records = n;
  r->records = sp->record_ptrs;
  r->more = more;
}

static Gwtf__DhtStoreStatus accept_store(dht *d, const dht_msg *m, bool proven, uint64_t now_ms) {
  /* A store from an address that never proved it receives could be a forged
   * source; the cookie costs the honest publisher nothing (its lookup got one). */
  if (!proven) return GWTF__DHT_STORE_STATUS__DHT_STORE_COOKIE;
  const Gwtf__DhtRecord *w = m->record;
  dht_rec *rec;
  if (dht_rec_open(w->body.data, w->body.len, w->sig.data, w->sig.len, w->remaining_ms,
                   d->cfg.max_record_ttl_ms, now_ms, &rec) != 0) {
    d->st.records_rejected++;
    return GWTF__DHT_STORE_STATUS__DHT_STORE_INVALID;
  }
  int rc = dht_store_put(d->store, rec, now_ms);
  if (rc == 0) return GWTF__DHT_STORE_STATUS__DHT_STORE_OK;
  dht_rec_free(rec);
  d->st.records_rejected++;
  return rc == GW_EEXIST ? GWTF__DHT_STORE_STATUS__DHT_STORE_STALE : GWTF__DHT_STORE_STATUS__DHT_STORE_FULL;
}

/* An unknown sender (or a known one at a new address) enters the table only
 * once it answers a ping from us at that address; the ping is the only thing
 * we spend on it, and only when it would get a slot. */
static void consider_verify(dht *d, const gw_peer *from, const dht_contact *known, uint64_t now_ms) {
  if (d->n_verify >= DHT_MAX_VERIFY || rpc_pending_to(d, &from->id)) return;
  if (!known && !dht_routing_would_accept(&d->rt, &from->id, &from->addr)) return;
  if (send_ping(d, from, RPC_VERIFY, now_ms) == 0) d->n_verify++;
}

/* The body of the reply to request m. */
static void fill_reply(dht *d, reply_space *sp, dht_msg *r, const dht_msg *m, const gw_peer *from, bool proven,
                       uint64_t now_ms) {
  switch (m->kind) {
  case GWTF__DHT_KIND__DHT_PING:
    dht_wire_contact(&sp->observed, from, false);
    r->observed = &sp->observed;
    break;
  case GWTF__DHT_KIND__DHT_FIND_VALUE:
    add_records(d, sp, r, m, now_ms);
    add_nodes(d, sp, r, m, from);
    break;
  case GWTF__DHT_KIND__DHT_FIND_NODE:
    add_nodes(d, sp, r, m, from);
    break;
  default: /* DHT_STORE */
    r->status = accept_store(d, m, proven, now_ms);
    break;
  }
}

static void handle_request(dht *d, const gw_peer *from, const dht_msg *m, size_t len, uint64_t now_ms) {
  d->st.requests_in++;
  if (d->cfg.client_only) return;
  if (!dht_guard_admit(&d->guard, &from->addr, now_ms)) {
    d->st.dropped_rate++;
    return;
  }
  dht_contact *c = dht_routing_find(&d->rt, &from->id);
  bool known = c && gw_addr_eq(&c->peer.addr, &from->addr);
  bool proven = known || dht_cookie_check(&d->guard, from, m->cookie.data, m->cookie.len);
  if (m->client)
    drop_client(d, from); /* answered, never verified nor added */
  else if (known)
    c->last_seen_ms = now_ms;
  else
    consider_verify(d, from, c, now_ms);

  reply_space sp; /* each entry is initialised before it is used */
  uint8_t your[DHT_COOKIE_BYTES], buf[DHT_BUF];
  dht_msg r = GWTF__DHT_MESSAGE__INIT;
  r.kind = (Gwtf__DhtKind)dht_wire_reply_kind(m->kind);
  r.txid = m->txid;
  r.client = is_client(d);
  dht_cookie_make(&d->guard, from, your);
  r.your_cookie = (ProtobufCBinaryData){DHT_COOKIE_BYTES, your};
  fill_reply(d, &sp, &r, m, from, proven, now_ms);
  /* The anti-amplification rule: toward an unproven address, no larger than the request. */
  size_t out = dht_wire_pack_fit(&r, buf, proven ? d->cfg.max_payload : len);
  if (out > 0) send_bytes(d, from, buf, out);
}

/* ---- replies to our requests ---- */

static void vote_observed(dht *d, const gw_peer *from, const Gwtf__DhtContact *obs) {
  gw_peer seen;
  if (!obs || dht_wire_peer(obs, false, &seen) != 0) return;
  for (size_t i = 0; i < d->n_votes; i++)
    if (gw_id_eq(&d->votes[i].from, &from->id)) {
      d->votes[i].addr = seen.addr;
      return;
    }
  d->votes[d->next_vote] = (dht_vote){from->id, seen.addr};
  d->next_vote = (d->next_vote + 1) % DHT_OBSERVED;
  if (d->n_votes < DHT_OBSERVED) d->n_votes++;
}

/* It answered at the address we asked: it may enter the table. */
static void learn(dht *d, const gw_peer *from, const dht_msg *m, uint64_t now_ms) {
  const uint8_t *cookie = m->your_cookie.len == DHT_COOKIE_BYTES ? m->your_cookie.data : NULL;
  dht_contact *lrs = NULL;
  dht_routing_update(&d->rt, from, cookie, now_ms, DHT_FRESH_MS, &lrs);
  if (lrs) {
    gw_peer target = lrs->peer;
    lrs->ping_pending = true;
    if (send_ping(d, &target, RPC_EVICT, now_ms) != 0) {
      dht_contact *again = dht_routing_find(&d->rt, &target.id);
      if (again) again->ping_pending = false;
    }
  }
}

static void on_boot_reply(dht *d, const gw_peer *from, const dht_msg *m, uint64_t now_ms) {
  dht_lookup *lk = NULL;
  d->seed_answered = true;
  for (size_t i = 0; i < d->n_lookups && !lk; i++)
    if (d->lookups[i]->kind == LK_JOIN && !d->lookups[i]->finished) lk = d->lookups[i];
  /* Created without asking anyone yet: the seed has just answered. */
  if (!lk) lk = dht_lookup_create(d, LK_JOIN, &d->self, d->cfg.k, now_ms);
  if (lk) dht_lookup_add_answered(d, lk, from, m, now_ms);
}

static void handle_reply(dht *d, const gw_peer *from, const dht_msg *m, size_t len, uint64_t now_ms) {
  int i = find_rpc(d, m->txid);
  if (i < 0) {
    d->st.dropped_unexpected++;
    return;
  }
  dht_rpc rpc = d->rpcs[i];
  /* The expected-ID rule: only the node we asked, at the address we asked,
   * may answer. A bootstrap address is the one case where we learn the ID. */
  bool id_ok = gw_id_is_zero(&rpc.to.id) ? rpc.purpose == RPC_BOOT : gw_id_eq(&rpc.to.id, &from->id);
  if (!id_ok || !gw_addr_eq(&rpc.to.addr, &from->addr) || (int)m->kind != dht_wire_reply_kind(rpc.kind)) {
    d->st.dropped_unexpected++;
    return;
  }
  rpc_remove(d, (size_t)i);
  d->st.replies_in++;
  rtt_sample(d, now_ms - rpc.sent_at);
  if (m->client)
    drop_client(d, from); /* its answer still serves the lookup; it is just not a contact */
  else
    learn(d, from, m, now_ms);
  if (m->kind == GWTF__DHT_KIND__DHT_PONG) vote_observed(d, from, m->observed);
  dht_lookup *lk = rpc.lookup ? dht_lookup_by_serial(d, rpc.lookup) : NULL;
  switch (rpc.purpose) {
  case RPC_LOOKUP:
    if (lk) dht_lookup_on_reply(d, lk, &rpc, from, m, len, now_ms);
    break;
  case RPC_STORE:
    if (lk) dht_lookup_on_stored(d, lk, &rpc, from, m, now_ms);
    break;
  case RPC_BOOT:
    on_boot_reply(d, from, m, now_ms);
    break;
  case RPC_VERIFY:
    d->n_verify--;
    break;
  default:
    break;
  }
}

void dht_on_message(dht *d, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now_ms) {
  dht_msg *m;
  if (!from || !buf || len > d->cfg.max_payload || gw_id_is_zero(&from->id) ||
      gw_id_eq(&from->id, &d->self)) {
    d->st.dropped_malformed++;
    return;
  }
  if (gw_addr_is_martian(&from->addr, d->cfg.allow_loopback)) {
    d->st.dropped_martian++;
    return;
  }
  if (dht_wire_decode(buf, len, &m) != 0) {
    d->st.dropped_malformed++;
    return;
  }
  if (dht_wire_is_request(m->kind))
    handle_request(d, from, m, len, now_ms);
  else
    handle_reply(d, from, m, len, now_ms);
  dht_wire_free(m);
  dht_arm(d, now_ms);
}

/* ---- timers ---- */

static void on_rpc_timeout(dht *d, const dht_rpc *rpc, uint64_t now_ms) {
  d->st.rpc_timeouts++;
  if (!gw_id_is_zero(&rpc->to.id)) {
    if (rpc->purpose == RPC_EVICT)
      dht_routing_ping_failed(&d->rt, &rpc->to.id);
    else
      dht_routing_failed(&d->rt, &rpc->to.id);
  }
  dht_lookup *lk = rpc->lookup ? dht_lookup_by_serial(d, rpc->lookup) : NULL;
  if (rpc->purpose == RPC_LOOKUP && lk && !rpc->slow) dht_lookup_on_slow(d, lk, rpc, now_ms);
  if (rpc->purpose == RPC_LOOKUP && lk && rpc->slow) dht_lookup_on_expired(d, lk, now_ms);
  if (rpc->purpose == RPC_STORE && lk) dht_lookup_on_stored(d, lk, rpc, NULL, NULL, now_ms);
  if (rpc->purpose == RPC_VERIFY) d->n_verify--;
}

/* A lookup's request past its RTO: the lookup asks someone else, but the
 * request stays open until its deadline and a late reply is still used. */
static void mark_slow(dht *d, dht_rpc *r, uint64_t now_ms) {
  r->slow = true;
  dht_rpc copy = *r; /* the handler may add requests and move the table */
  dht_lookup *lk = dht_lookup_by_serial(d, copy.lookup);
  if (lk) dht_lookup_on_slow(d, lk, &copy, now_ms);
}

static void expire_rpcs(dht *d, uint64_t now_ms) {
  for (size_t i = 0; i < d->n_rpcs; i++)
    if (d->rpcs[i].purpose == RPC_LOOKUP && !d->rpcs[i].slow && d->rpcs[i].slow_at <= now_ms)
      mark_slow(d, &d->rpcs[i], now_ms);
  for (size_t i = 0; i < d->n_rpcs;) {
    if (d->rpcs[i].deadline > now_ms) {
      i++;
      continue;
    }
    dht_rpc rpc = d->rpcs[i];
    rpc_remove(d, i); /* new requests land at the end, with later deadlines */
    on_rpc_timeout(d, &rpc, now_ms);
  }
}

static bool join_running(const dht *d) { return dht_lookups_of_kind(d, LK_JOIN) > 0; }

/* Bootstrap requests go out (with backoff) until we joined through a seed
 * that answered: a node whose requests were lost could otherwise "join"
 * through newcomers that bootstrapped from it, an island of its own. */
static bool need_boot(const dht *d) {
  return d->n_seeds > 0 && (!d->joined || !d->seed_answered || dht_routing_good(&d->rt) == 0) &&
         !join_running(d);
}

static bool rejoin_due(const dht *d) { return d->joined && !join_running(d) && dht_routing_good(&d->rt) > 0; }

static void boot_tick(dht *d, uint64_t now_ms) {
  if (rejoin_due(d) && now_ms >= d->rejoin_at) {
    d->rejoin_at = UINT64_MAX;
    dht_lookup_start(d, LK_JOIN, &d->self, d->cfg.k, now_ms);
    return;
  }
  if (!need_boot(d) || now_ms < d->boot_at) return;
  d->boot_at = now_ms + d->boot_backoff;
  d->boot_backoff = d->boot_backoff * 2 < DHT_BOOT_RETRY_MAX_MS ? d->boot_backoff * 2 : DHT_BOOT_RETRY_MAX_MS;
  if (!d->joined && dht_routing_good(&d->rt) > 0) {
    dht_lookup_start(d, LK_JOIN, &d->self, d->cfg.k, now_ms);
    return;
  }
  GW_INFO(d->cfg.log, "dht.bootstrap", "seeds=%zu next_retry_ms=%llu", d->n_seeds,
          (unsigned long long)(d->boot_at - now_ms));
  for (size_t i = 0; i < d->n_seeds; i++) {
    dht_msg m = GWTF__DHT_MESSAGE__INIT;
    m.kind = GWTF__DHT_KIND__DHT_FIND_NODE;
    m.target = (ProtobufCBinaryData){GW_ID_BYTES, d->self.b};
    m.want = (uint32_t)d->cfg.k;
    dht_rpc_send(d, &d->seeds[i], &m, NULL, DHT_WIRE_REPLY_BASE + d->cfg.k * DHT_WIRE_CONTACT_V4, RPC_BOOT,
                 0, now_ms, NULL);
  }
}

/* A node that joined through a peer that was itself still joining can end
 * up knowing almost nobody: while the table is thinner than one bucket, the
 * self-lookup (and the refresh of every bucket after it) is repeated with
 * backoff, until the table fills or the refresh period is reached. */
static void schedule_rejoin(dht *d, size_t good, uint64_t now_ms) {
  if (good >= d->cfg.k) {
    d->rejoin_at = UINT64_MAX;
    d->rejoin_backoff = DHT_BOOT_RETRY_MIN_MS;
    return;
  }
  d->rejoin_at = now_ms + d->rejoin_backoff;
  d->rejoin_backoff = d->rejoin_backoff * 2 < d->cfg.refresh_ms ? d->rejoin_backoff * 2 : d->cfg.refresh_ms;
}

void dht_join_done(dht *d, uint64_t now_ms) {
  size_t good = dht_routing_good(&d->rt);
  if (good == 0) return; /* boot_tick retries */
  d->boot_backoff = DHT_BOOT_RETRY_MIN_MS;
  schedule_rejoin(d, good, now_ms);
  /* Fill the table across the whole ID space, not just near us. */
  dht_routing_refresh_all(&d->rt, now_ms);
  if (d->joined) return;
  d->joined = true;
  GW_INFO(d->cfg.log, "dht.joined", "contacts=%zu buckets=%zu", good, d->rt.n_buckets);
  /* Learn how others see our address (stage records may need it). */
  gw_peer near[2];
  size_t n = dht_routing_closest(&d->rt, &d->self, NULL, near, 2);
  for (size_t i = 0; i < n; i++) send_ping(d, &near[i], RPC_OBSERVE, now_ms);
  if (d->cfg.on_joined) d->cfg.on_joined(d->cfg.ud);
}

static void refresh_tick(dht *d, uint64_t now_ms) {
  if (!d->joined) return;
  while (dht_lookups_of_kind(d, LK_REFRESH) < DHT_MAX_REFRESH) {
    int i = dht_routing_refresh_due(&d->rt, now_ms);
    if (i < 0) return;
    uint8_t r[GW_ID_BYTES];
    gw_id target;
    rnd(d, r, sizeof(r));
    dht_routing_random_in(&d->rt, (size_t)i, r, &target);
    d->rt.buckets[i].refresh_at_ms = now_ms + d->cfg.refresh_ms;
    if (!dht_lookup_start(d, LK_REFRESH, &target, d->cfg.k, now_ms)) {
      d->rt.buckets[i].refresh_at_ms = now_ms + DHT_RETRY_MS;
      return;
    }
  }
}

static void maintain(dht *d, uint64_t now_ms) {
  if (now_ms >= d->guard.rotate_at_ms) {
    uint8_t fresh[DHT_GUARD_KEY_BYTES];
    rnd(d, fresh, sizeof(fresh));
    dht_guard_rotate(&d->guard, fresh, now_ms);
  }
  if (now_ms >= dht_store_next_expiry(d->store)) dht_store_expire(d->store, now_ms);
  boot_tick(d, now_ms);
  refresh_tick(d, now_ms);
  dht_pubs_tick(d, now_ms);
}

static uint64_t next_deadline(const dht *d, uint64_t now_ms) {
  uint64_t next = UINT64_MAX;
#define EARLIER(t) \
  do { \
    uint64_t t_ = (t); \
    if (t_ < next) next = t_; \
  } while (0)
  for (size_t i = 0; i < d->n_rpcs; i++) {
    const dht_rpc *r = &d->rpcs[i];
    EARLIER(r->purpose == RPC_LOOKUP && !r->slow ? r->slow_at : r->deadline);
  }
  for (size_t i = 0; i < d->n_lookups; i++)
    if (d->lookups[i]->finished) EARLIER(now_ms);
  for (size_t i = 0; i < d->n_pubs; i++) EARLIER(d->pubs[i].next_at);
  EARLIER(dht_store_next_expiry(d->store));
  EARLIER(d->guard.rotate_at_ms);
  if (need_boot(d)) EARLIER(d->boot_at);
  if (rejoin_due(d)) EARLIER(d->rejoin_at);
  if (d->joined && dht_lookups_of_kind(d, LK_REFRESH) < DHT_MAX_REFRESH)
    EARLIER(dht_routing_next_refresh(&d->rt));
#undef EARLIER
  return next < now_ms ? now_ms : next;
}

void dht_arm(dht *d, uint64_t now_ms) {
  uint64_t next = next_deadline(d, now_ms);
  if (next < d->armed_at) {
    d->armed_at = next;
    d->cfg.io.want_tick(d->cfg.io.ud, next);
  }
}

void dht_on_tick(dht *d, uint64_t now_ms) {
  d->armed_at = UINT64_MAX;
  expire_rpcs(d, now_ms);
  dht_lookups_deliver(d, now_ms);
  maintain(d, now_ms);
  dht_arm(d, now_ms);
}

/* ---- public calls ---- */

int dht_bootstrap(dht *d, const gw_peer *seeds, size_t n, uint64_t now_ms) {
  size_t added = 0;
  for (size_t i = 0; i < n && d->n_seeds < DHT_MAX_SEEDS; i++) {
    const gw_peer *s = &seeds[i];
    if (gw_addr_is_martian(&s->addr, d->cfg.allow_loopback) || gw_id_eq(&s->id, &d->self)) continue;
    bool dup = false;
    for (size_t j = 0; j < d->n_seeds && !dup; j++) dup = gw_addr_eq(&d->seeds[j].addr, &s->addr);
    if (dup) continue;
    d->seeds[d->n_seeds++] = *s;
    added++;
  }
  if (added == 0 && d->n_seeds == 0) return GW_EINVAL;
  d->boot_at = now_ms;
  d->boot_backoff = DHT_BOOT_RETRY_MIN_MS;
  dht_arm(d, now_ms);
  return 0;
}

bool dht_joined(const dht *d) { return d->joined; }

bool dht_client_mode(const dht *d) { return is_client(d); }

void dht_set_client_mode(dht *d, bool on, uint64_t now_ms) {
  if (d->client_mode == on) return;
  d->client_mode = on;
  size_t told = 0;
  if (on) {
    /* Whoever added us while we looked reachable hears the flag now. */
    gw_peer peers[128];
    size_t n = dht_routing_recent(&d->rt, peers, sizeof(peers) / sizeof(peers[0]));
    for (size_t i = 0; i < n; i++) told += send_ping(d, &peers[i], RPC_OBSERVE, now_ms) == 0;
  }
  GW_INFO(d->cfg.log, "dht.client_mode", "on=%s told=%zu", on ? "true" : "false", told);
  dht_arm(d, now_ms);
}
const gw_id *dht_id(const dht *d) { return &d->self; }

size_t dht_contacts(const dht *d, gw_peer *out, size_t max) { return dht_routing_recent(&d->rt, out, max); }

int dht_observed_addr(const dht *d, gw_addr *out) {
  size_t best = 0, best_n = 0;
  for (size_t i = 0; i < d->n_votes; i++) {
    size_t n = 0;
    for (size_t j = 0; j < d->n_votes; j++) n += gw_addr_eq(&d->votes[i].addr, &d->votes[j].addr);
    if (n > best_n) best = i, best_n = n;
  }
  if (best_n == 0) return GW_ENOENT;
  *out = d->votes[best].addr;
  return 0;
}

void dht_get_stats(const dht *d, dht_stats *out) {
  *out = d->st;
  out->contacts = dht_routing_size(&d->rt);
  out->good_contacts = dht_routing_good(&d->rt);
  out->buckets = d->rt.n_buckets;
  out->replacements = 0;
  for (size_t i = 0; i < d->rt.n_buckets; i++) out->replacements += d->rt.buckets[i].n_repl;
  out->records = dht_store_records(d->store);
  out->record_keys = dht_store_keys(d->store);
  out->record_bytes = dht_store_bytes(d->store);
  out->publications = d->n_pubs;
  out->lookups_active = d->n_lookups;
  out->rpcs_pending = d->n_rpcs;
}
