/* dht/lookup.c — iterative lookups, fetches and publications.
 *
 * A lookup keeps its candidates sorted by distance to the target. It asks
 * the closest candidates it has not asked yet, never more than α at once and
 * only among the `width` closest still standing (asking farther ones cannot
 * change the answer), adds every contact a reply names, and ends when the
 * `width` closest candidates have all answered or failed. A request not
 * answered within the RTO (an adaptive estimate between 200 ms and the 1 s
 * request timeout) marks its candidate failed, which lets the next one in
 * line be asked: that is the retry to another contact. An answer that comes
 * late, before the request times out, still revives the candidate.
 *
 * Kinds: LK_NODES (dht_find_node), LK_VALUES (dht_fetch: FIND_VALUE, paging
 * through keys with many records), LK_STORE (find the `replicas` closest,
 * then STORE the record on them), LK_JOIN (the bootstrap self-lookup) and
 * LK_REFRESH (a random ID in a quiet bucket). */
#include <stdlib.h>
#include <string.h>

#include "dht/internal.h"
#include "util/err.h"

/* ---- candidates ---- */

static dht_cand *cand_find(dht_lookup *lk, const gw_id *id) {
  for (size_t i = 0; i < lk->n_cands; i++)
    if (gw_id_eq(&lk->cands[i].peer.id, id)) return &lk->cands[i];
  return NULL;
}

/* Adds p in distance order. A second ID claiming an address already in the
 * list is ignored, so one host cannot fill a lookup with made-up IDs. When
 * the list is full the farthest candidate makes room (its request, if any,
 * still completes; its reply just has nobody to update). */
static void cand_add(dht *d, dht_lookup *lk, const gw_peer *p, uint8_t depth) {
  if (!dht_peer_acceptable(d, p)) return;
  for (size_t i = 0; i < lk->n_cands; i++) {
    dht_cand *c = &lk->cands[i];
    if (gw_id_eq(&c->peer.id, &p->id)) {
      if (depth < c->depth) c->depth = depth;
      return;
    }
    if (gw_addr_eq(&c->peer.addr, &p->addr)) return;
  }
  size_t pos = lk->n_cands;
  while (pos > 0 && dht_dist_cmp(&lk->target, &p->id, &lk->cands[pos - 1].peer.id) < 0) pos--;
  if (pos == DHT_LOOKUP_SLOTS) return;
  if (lk->n_cands == DHT_LOOKUP_SLOTS) lk->n_cands--;
  memmove(&lk->cands[pos + 1], &lk->cands[pos], (lk->n_cands - pos) * sizeof(*lk->cands));
  lk->n_cands++;
  dht_cand *c = &lk->cands[pos];
  memset(c, 0, sizeof(*c));
  c->peer = *p;
  c->depth = depth;
  const uint8_t *cookie = dht_cookie_for(d, p);
  if (cookie) {
    memcpy(c->cookie, cookie, DHT_COOKIE_BYTES);
    c->has_cookie = true;
  }
}

/* The closest unasked candidate among the `width` closest still standing. */
static dht_cand *next_to_ask(dht_lookup *lk) {
  size_t standing = 0;
  for (size_t i = 0; i < lk->n_cands && standing < lk->width; i++) {
    dht_cand *c = &lk->cands[i];
    if (c->state == CAND_FAILED) continue;
    if (c->state == CAND_NEW) return c;
    standing++;
  }
  return NULL;
}

/* Done when the `width` closest still standing have all answered, or when
 * fewer remain and nothing is in flight (slow requests included: when the
 * list has run dry, a late answer is all that is left to wait for). */
static bool lookup_done(const dht_lookup *lk) {
  size_t answered = 0;
  for (size_t i = 0; i < lk->n_cands; i++) {
    const dht_cand *c = &lk->cands[i];
    if (c->state == CAND_FAILED) continue;
    if (c->state != CAND_DONE) return false;
    if (++answered == lk->width) return true;
  }
  return lk->inflight == 0 && lk->slow == 0;
}

/* ---- asking ---- */

static int ask(dht *d, dht_lookup *lk, dht_cand *c, uint64_t now_ms) {
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  m.kind = lk->kind == LK_VALUES ? GWTF__DHT_KIND__DHT_FIND_VALUE : GWTF__DHT_KIND__DHT_FIND_NODE;
  m.target = (ProtobufCBinaryData){GW_ID_BYTES, lk->target.b};
  const uint8_t *cookie = c->has_cookie ? c->cookie : NULL;
  /* Without its cookie the node may answer only as much as we send, so ask
   * for fewer contacts rather than pad for a full bucket. */
  m.want = (uint32_t)(cookie || d->cfg.k < DHT_UNPROVEN_WANT ? d->cfg.k : DHT_UNPROVEN_WANT);
  if (c->has_after) m.after = (ProtobufCBinaryData){GW_ID_BYTES, c->after.b};
  dht_rpc *rpc;
  int rc = dht_rpc_send(d, &c->peer, &m, cookie, DHT_WIRE_REPLY_BASE + m.want * DHT_WIRE_CONTACT_V4,
                        RPC_LOOKUP, lk->serial, now_ms, &rpc);
  if (rc != 0) return rc;
  c->state = CAND_ASKED;
  lk->inflight++;
  lk->st.rpcs++;
  lk->st.bytes += rpc->wire_bytes;
  return 0;
}

static void begin_store(dht *d, dht_lookup *lk, uint64_t now_ms);

static void progress(dht *d, dht_lookup *lk, uint64_t now_ms) {
  if (lk->finished || lk->storing) return;
  /* The request cap bounds a lookup that liars keep feeding closer "nodes". */
  while (lk->inflight < d->cfg.alpha && lk->st.rpcs < DHT_LOOKUP_MAX_RPCS) {
    dht_cand *c = next_to_ask(lk);
    if (!c) break;
    if (ask(d, lk, c, now_ms) != 0) c->state = CAND_FAILED;
  }
  bool capped = lk->st.rpcs >= DHT_LOOKUP_MAX_RPCS && lk->inflight == 0;
  if (!capped && !lookup_done(lk)) return;
  if (lk->kind == LK_STORE) {
    lk->storing = true;
    if (lk->rec) begin_store(d, lk, now_ms); /* else store_value calls it */
  } else {
    lk->finished = true; /* delivered from the next tick, never re-entrantly */
  }
}

/* ---- lifecycle ---- */

dht_lookup *dht_lookup_create(dht *d, uint8_t kind, const gw_id *target, size_t width, uint64_t now_ms) {
  if (d->n_lookups >= DHT_MAX_LOOKUPS) return NULL;
  dht_lookup *lk = calloc(1, sizeof(*lk));
  if (!lk) return NULL;
  if (++d->next_serial == 0) d->next_serial = 1;
  lk->serial = d->next_serial;
  lk->kind = kind;
  lk->target = *target;
  lk->width = width == 0 ? 1 : width > DHT_LOOKUP_SLOTS / 2 ? DHT_LOOKUP_SLOTS / 2 : width;
  lk->started_ms = now_ms;
  gw_peer seeds[DHT_LOOKUP_SLOTS];
  size_t want = d->cfg.k > lk->width ? d->cfg.k : lk->width;
  size_t n = dht_routing_closest(&d->rt, target, NULL, seeds, want);
  for (size_t i = 0; i < n; i++) cand_add(d, lk, &seeds[i], 1);
  d->lookups[d->n_lookups++] = lk;
  return lk;
}

dht_lookup *dht_lookup_start(dht *d, uint8_t kind, const gw_id *target, size_t width, uint64_t now_ms) {
  dht_lookup *lk = dht_lookup_create(d, kind, target, width, now_ms);
  if (lk) progress(d, lk, now_ms);
  return lk;
}

void dht_lookup_free(dht_lookup *lk) {
  if (!lk) return;
  for (size_t i = 0; i < lk->n_recs; i++) dht_rec_free(lk->recs[i]);
  free(lk->recs);
  dht_rec_free(lk->rec);
  free(lk);
}

dht_lookup *dht_lookup_by_serial(dht *d, uint32_t serial) {
  for (size_t i = 0; i < d->n_lookups; i++)
    if (d->lookups[i]->serial == serial) return d->lookups[i];
  return NULL;
}

size_t dht_lookups_of_kind(const dht *d, uint8_t kind) {
  size_t n = 0;
  for (size_t i = 0; i < d->n_lookups; i++) n += d->lookups[i]->kind == kind;
  return n;
}

/* ---- records found by FIND_VALUE ---- */

static dht_rec **rec_slot(dht_lookup *lk, const gw_id *publisher) {
  for (size_t i = 0; i < lk->n_recs; i++)
    if (gw_id_eq(&lk->recs[i]->publisher, publisher)) return &lk->recs[i];
  return NULL;
}

/* Keeps rec if it is the newest from its publisher; takes ownership. */
static void keep_record(dht *d, dht_lookup *lk, dht_rec *rec) {
  dht_rec **slot = rec_slot(lk, &rec->publisher);
  if (slot) {
    if (rec->seq > (*slot)->seq) {
      dht_rec_free(*slot);
      *slot = rec;
    } else {
      dht_rec_free(rec);
    }
    return;
  }
  if (lk->n_recs >= d->cfg.max_subkeys) {
    dht_rec_free(rec);
    return;
  }
  if (lk->n_recs == lk->cap_recs) {
    size_t cap = lk->cap_recs ? 2 * lk->cap_recs : 8;
    dht_rec **r = realloc(lk->recs, cap * sizeof(*r));
    if (!r) {
      dht_rec_free(rec);
      return;
    }
    lk->recs = r;
    lk->cap_recs = cap;
  }
  lk->recs[lk->n_recs++] = rec;
}

/* A copy we already verified (same signed bytes) need not be verified again:
 * the replicas of one record usually all answer. */
static const dht_rec *known_copy(const dht_lookup *lk, const Gwtf__DhtRecord *w) {
  for (size_t i = 0; i < lk->n_recs; i++) {
    const dht_rec *r = lk->recs[i];
    if (r->body_len == w->body.len && w->sig.len == P2P_SIG_BYTES &&
        memcmp(r->body, w->body.data, r->body_len) == 0 && memcmp(r->sig, w->sig.data, P2P_SIG_BYTES) == 0)
      return r;
  }
  return NULL;
}

/* Pages are in publisher order: the cursor is the highest publisher seen. */
static void advance_cursor(dht_cand *c, const gw_id *publisher) {
  if (c && (!c->has_after || gw_id_cmp(publisher, &c->after) > 0)) {
    c->after = *publisher;
    c->has_after = true;
  }
}

/* Takes the records of one VALUES page. Returns true when the node has more
 * and should be asked for the next page (c's cursor is moved). Every node
 * that answers is paged through to the end: replicas need not agree (a lost
 * STORE, a publisher that saw other closest nodes), and a page of records we
 * know says nothing about the next one. */
static bool take_records(dht *d, dht_lookup *lk, dht_cand *c, const dht_msg *m, uint64_t now_ms) {
  for (size_t i = 0; i < m->n_records; i++) {
    const Gwtf__DhtRecord *w = m->records[i];
    const dht_rec *known = w ? known_copy(lk, w) : NULL;
    dht_rec *rec;
    if (known) advance_cursor(c, &known->publisher);
    if (!w || known) continue;
    if (dht_rec_open(w->body.data, w->body.len, w->sig.data, w->sig.len, w->remaining_ms,
                     d->cfg.max_record_ttl_ms, now_ms, &rec) != 0) {
      d->st.records_rejected++;
      continue;
    }
    if (!gw_id_eq(&rec->key, &lk->target)) { /* a record for another key: ignore it */
      d->st.records_rejected++;
      dht_rec_free(rec);
      continue;
    }
    advance_cursor(c, &rec->publisher);
    keep_record(d, lk, rec);
  }
  if (!m->more || !c || c->pages + 1 >= DHT_MAX_PAGES) return false;
  c->pages++;
  return true;
}

/* ---- replies and timeouts ---- */

void dht_lookup_on_reply(dht *d, dht_lookup *lk, const dht_rpc *rpc, const gw_peer *from, const dht_msg *m,
                         size_t len, uint64_t now_ms) {
  /* A slow request already gave its slot back; its late answer still counts. */
  if (!rpc->slow && lk->inflight > 0) lk->inflight--;
  if (rpc->slow && lk->slow > 0) lk->slow--;
  lk->st.bytes += len + d->cfg.wire_overhead;
  dht_cand *c = cand_find(lk, &from->id);
  uint8_t next_depth = c && c->depth < UINT8_MAX ? (uint8_t)(c->depth + 1) : UINT8_MAX;
  bool again = false;
  if (c) {
    if (m->your_cookie.len == DHT_COOKIE_BYTES) {
      memcpy(c->cookie, m->your_cookie.data, DHT_COOKIE_BYTES);
      c->has_cookie = true;
    }
    if (lk->kind == LK_VALUES) again = take_records(d, lk, c, m, now_ms);
    /* A client's answer is used (its contacts and records) but it is not a
     * result: nobody should store on, or route to, a node others cannot reach. */
    c->state = m->client ? CAND_FAILED : CAND_DONE;
  }
  for (size_t i = 0; i < m->n_nodes; i++) {
    gw_peer p;
    if (dht_wire_peer(m->nodes[i], true, &p) == 0) cand_add(d, lk, &p, next_depth);
  }
  /* The node holds more records: ask for the next page (with the cookie it
   * just gave us, so the page can be full size). */
  c = again ? cand_find(lk, &from->id) : NULL;
  if (c && ask(d, lk, c, now_ms) != 0) c->state = m->client ? CAND_FAILED : CAND_DONE;
  progress(d, lk, now_ms);
}

/* Whether c is among the `width` closest candidates still standing: the
 * ones the answer depends on. */
static bool in_window(const dht_lookup *lk, const dht_cand *c) {
  size_t standing = 0;
  for (size_t i = 0; i < lk->n_cands && standing < lk->width; i++) {
    if (&lk->cands[i] == c) return true;
    standing += lk->cands[i].state != CAND_FAILED;
  }
  return false;
}

void dht_lookup_on_slow(dht *d, dht_lookup *lk, const dht_rpc *rpc, uint64_t now_ms) {
  if (lk->inflight > 0) lk->inflight--;
  lk->slow++;
  lk->st.timeouts++;
  dht_cand *c = cand_find(lk, &rpc->to.id);
  if (c) {
    /* One lost datagram must not cost a node the answer depends on its
     * place: it is asked once more (and the lookup waits one more RTO for
     * it) before it counts as failed. A late answer to either request
     * revives it. */
    bool resend = in_window(lk, c) && !c->resent;
    c->state = CAND_FAILED;
    if (resend) {
      c->resent = true;
      if (ask(d, lk, c, now_ms) != 0) c->state = CAND_FAILED;
    }
  }
  progress(d, lk, now_ms);
}

void dht_lookup_on_expired(dht *d, dht_lookup *lk, uint64_t now_ms) {
  if (lk->slow > 0) lk->slow--;
  progress(d, lk, now_ms);
}

void dht_lookup_add_answered(dht *d, dht_lookup *lk, const gw_peer *from, const dht_msg *m, uint64_t now_ms) {
  cand_add(d, lk, from, 1);
  dht_cand *c = cand_find(lk, &from->id);
  if (c && c->state == CAND_NEW) c->state = CAND_DONE;
  for (size_t i = 0; i < m->n_nodes; i++) {
    gw_peer p;
    if (dht_wire_peer(m->nodes[i], true, &p) == 0) cand_add(d, lk, &p, 2);
  }
  progress(d, lk, now_ms);
}

/* ---- storing ---- */

static int send_store(dht *d, dht_lookup *lk, const gw_peer *to, const uint8_t *cookie, uint64_t now_ms,
                      dht_rpc **out) {
  dht_msg m = GWTF__DHT_MESSAGE__INIT;
  Gwtf__DhtRecord w = GWTF__DHT_RECORD__INIT;
  w.body = (ProtobufCBinaryData){lk->rec->body_len, lk->rec->body};
  w.sig = (ProtobufCBinaryData){P2P_SIG_BYTES, lk->rec->sig};
  w.remaining_ms = dht_rec_remaining(lk->rec, now_ms);
  m.kind = GWTF__DHT_KIND__DHT_STORE;
  m.record = &w;
  int rc = dht_rpc_send(d, to, &m, cookie, DHT_WIRE_REPLY_BASE, RPC_STORE, lk->serial, now_ms, out);
  if (rc == 0) {
    lk->stores_pending++;
    lk->st.rpcs++;
    lk->st.bytes += (*out)->wire_bytes;
  }
  return rc;
}

/* The lookup found the closest nodes: store on the `replicas` closest that
 * answered, and keep a copy ourselves when we are as close as they are. */
static void begin_store(dht *d, dht_lookup *lk, uint64_t now_ms) {
  const gw_id *farthest = NULL;
  size_t chosen = 0;
  for (size_t i = 0; i < lk->n_cands && chosen < d->cfg.replicas; i++) {
    dht_cand *c = &lk->cands[i];
    if (c->state != CAND_DONE) continue;
    dht_rpc *rpc;
    chosen++;
    farthest = &c->peer.id;
    send_store(d, lk, &c->peer, c->has_cookie ? c->cookie : NULL, now_ms, &rpc);
  }
  if (chosen < d->cfg.replicas || (farthest && dht_dist_cmp(&lk->target, &d->self, farthest) < 0)) {
    dht_rec *mine = dht_rec_dup(lk->rec);
    if (mine && dht_store_put(d->store, mine, now_ms) == 0)
      lk->stores_ok++;
    else
      dht_rec_free(mine);
  }
  if (lk->stores_pending == 0) lk->finished = true;
}

void dht_lookup_on_stored(dht *d, dht_lookup *lk, const dht_rpc *rpc, const gw_peer *from, const dht_msg *m,
                          uint64_t now_ms) {
  if (m) lk->st.bytes += d->cfg.wire_overhead; /* replies are small; count the datagram */
  if (lk->stores_pending > 0) lk->stores_pending--;
  if (m && m->status == GWTF__DHT_STORE_STATUS__DHT_STORE_COOKIE && !rpc->retried &&
      m->your_cookie.len == DHT_COOKIE_BYTES) {
    /* Our cookie had expired (the secret rotated): once more with the new one. */
    dht_rpc *again;
    if (send_store(d, lk, from, m->your_cookie.data, now_ms, &again) == 0) {
      again->retried = true;
      return;
    }
  }
  if (m && (m->status == GWTF__DHT_STORE_STATUS__DHT_STORE_OK ||
            m->status == GWTF__DHT_STORE_STATUS__DHT_STORE_STALE))
    lk->stores_ok++;
  if (lk->stores_pending == 0) lk->finished = true;
}

/* ---- delivery ---- */

static unsigned closest_hops(const dht_lookup *lk) {
  for (size_t i = 0; i < lk->n_cands; i++)
    if (lk->cands[i].state == CAND_DONE) return lk->cands[i].depth;
  return 0;
}

static void deliver_nodes(dht_lookup *lk) {
  gw_peer out[DHT_LOOKUP_SLOTS];
  size_t n = 0;
  for (size_t i = 0; i < lk->n_cands && n < lk->width; i++)
    if (lk->cands[i].state == CAND_DONE) out[n++] = lk->cands[i].peer;
  if (lk->nodes_cb) lk->nodes_cb(lk->ud, n ? 0 : GW_ENOENT, out, n, &lk->st);
}

static int by_publisher(const void *a, const void *b) {
  return gw_id_cmp(&(*(dht_rec *const *)a)->publisher, &(*(dht_rec *const *)b)->publisher);
}

static void deliver_records(dht *d, dht_lookup *lk, uint64_t now_ms) {
  const dht_rec *mine[DHT_WIRE_MAX_RECORDS];
  const gw_id *after = NULL;
  bool more = true;
  /* Our own store counts as one more replica. */
  while (more) {
    size_t n = dht_store_get(d->store, &lk->target, after, now_ms, mine, DHT_WIRE_MAX_RECORDS, &more);
    for (size_t i = 0; i < n; i++) {
      dht_rec *copy = dht_rec_dup(mine[i]);
      if (copy) keep_record(d, lk, copy);
    }
    if (n == 0) break;
    after = &mine[n - 1]->publisher;
  }
  if (lk->n_recs > 1) qsort(lk->recs, lk->n_recs, sizeof(*lk->recs), by_publisher); /* recs is NULL when empty */
  dht_record *out = calloc(lk->n_recs ? lk->n_recs : 1, sizeof(*out));
  size_t n = 0;
  for (size_t i = 0; out && i < lk->n_recs; i++) {
    const dht_rec *r = lk->recs[i];
    uint64_t left = dht_rec_remaining(r, now_ms);
    if (dht_rec_is_tombstone(r) || left == 0) continue;
    out[n++] = (dht_record){r->key, r->publisher, r->seq, left, r->value, r->value_len};
  }
  if (lk->records_cb) lk->records_cb(lk->ud, out ? 0 : GW_ENOMEM, out, n, &lk->st);
  free(out);
}

static dht_pub *pub_find(dht *d, const gw_id *key) {
  for (size_t i = 0; i < d->n_pubs; i++)
    if (gw_id_eq(&d->pubs[i].key, key)) return &d->pubs[i];
  return NULL;
}

static void complete(dht *d, dht_lookup *lk, uint64_t now_ms) {
  lk->st.elapsed_ms = now_ms - lk->started_ms;
  lk->st.hops = closest_hops(lk);
  d->st.lookups_done++;
  dht_routing_touch_range(&d->rt, &lk->target, now_ms);
  GW_DEBUG(d->cfg.log, "dht.lookup.done", "kind=%d hops=%u rpcs=%u timeouts=%u bytes=%llu ms=%llu",
           lk->kind, lk->st.hops, lk->st.rpcs, lk->st.timeouts, (unsigned long long)lk->st.bytes,
           (unsigned long long)lk->st.elapsed_ms);
  switch (lk->kind) {
  case LK_NODES:
    deliver_nodes(lk);
    break;
  case LK_VALUES:
    deliver_records(d, lk, now_ms);
    break;
  case LK_STORE: {
    dht_pub *p = pub_find(d, &lk->target);
    if (p && p->cb) p->cb(p->ud, lk->stores_ok ? 0 : GW_ENOENT, lk->stores_ok);
    break;
  }
  case LK_JOIN:
    dht_join_done(d, now_ms);
    break;
  default:
    break;
  }
}

void dht_lookups_deliver(dht *d, uint64_t now_ms) {
  for (size_t i = 0; i < d->n_lookups;) {
    dht_lookup *lk = d->lookups[i];
    if (!lk->finished) {
      i++;
      continue;
    }
    /* Out of the table first: the callback may start new lookups. */
    d->lookups[i] = d->lookups[--d->n_lookups];
    complete(d, lk, now_ms);
    dht_lookup_free(lk);
  }
}

/* ---- public lookups ---- */

/* A lookup a caller asked for: width β, its result through one of the callbacks. */
static int start_for_caller(dht *d, uint8_t kind, const gw_id *target, dht_nodes_cb nodes_cb,
                            dht_records_cb records_cb, void *ud, uint64_t now_ms) {
  dht_lookup *lk = dht_lookup_start(d, kind, target, d->cfg.width, now_ms);
  if (!lk) return GW_EFULL;
  lk->nodes_cb = nodes_cb;
  lk->records_cb = records_cb;
  lk->ud = ud;
  dht_arm(d, now_ms);
  return 0;
}

int dht_find_node(dht *d, const gw_id *target, dht_nodes_cb cb, void *ud, uint64_t now_ms) {
  return start_for_caller(d, LK_NODES, target, cb, NULL, ud, now_ms);
}

int dht_fetch(dht *d, const gw_id *key, dht_records_cb cb, void *ud, uint64_t now_ms) {
  return start_for_caller(d, LK_VALUES, key, NULL, cb, ud, now_ms);
}

/* ---- publications ---- */

/* Signs the value with a fresh sequence number and starts storing it. */
static int store_value(dht *d, const gw_id *key, const uint8_t *value, size_t len, uint64_t now_ms) {
  dht_rec *rec;
  int rc = dht_rec_make(d->cfg.me, key, value, len, dht_next_seq(d, now_ms), d->cfg.record_ttl_ms, now_ms, &rec);
  if (rc != 0) return rc;
  dht_lookup *lk = dht_lookup_start(d, LK_STORE, key, d->cfg.replicas, now_ms);
  if (!lk) {
    dht_rec_free(rec);
    return GW_EFULL;
  }
  lk->rec = rec;
  /* The lookup may already be over (an empty table): store now. */
  if (lk->storing) begin_store(d, lk, now_ms);
  return 0;
}

int dht_publish(dht *d, const gw_id *key, const uint8_t *value, size_t len, dht_publish_cb cb, void *ud,
                uint64_t now_ms) {
  if (!value || len == 0 || len > DHT_MAX_VALUE_BYTES) return GW_ERANGE;
  uint8_t *copy = malloc(len);
  if (!copy) return GW_ENOMEM;
  memcpy(copy, value, len);
  dht_pub *p = pub_find(d, key);
  if (!p) {
    if (d->n_pubs == d->cap_pubs) {
      size_t cap = d->cap_pubs ? 2 * d->cap_pubs : 4;
      dht_pub *pubs = realloc(d->pubs, cap * sizeof(*pubs));
      if (!pubs) {
        free(copy);
        return GW_ENOMEM;
      }
      d->pubs = pubs;
      d->cap_pubs = cap;
    }
    p = &d->pubs[d->n_pubs++];
    memset(p, 0, sizeof(*p));
    p->key = *key;
  }
  free(p->value);
  p->value = copy;
  p->len = len;
  p->cb = cb;
  p->ud = ud;
  /* Republish at half the lifetime: a lost round still leaves time for the next. */
  p->next_at = now_ms + d->cfg.record_ttl_ms / 2;
  if (store_value(d, key, copy, len, now_ms) != 0) p->next_at = now_ms + DHT_RETRY_MS;
  dht_arm(d, now_ms);
  return 0;
}

int dht_unpublish(dht *d, const gw_id *key, uint64_t now_ms) {
  dht_pub *p = pub_find(d, key);
  if (!p) return GW_ENOENT;
  free(p->value);
  *p = d->pubs[--d->n_pubs];
  int rc = store_value(d, key, NULL, 0, now_ms); /* the tombstone */
  dht_arm(d, now_ms);
  return rc;
}

uint64_t dht_pubs_tick(dht *d, uint64_t now_ms) {
  uint64_t next = UINT64_MAX;
  for (size_t i = 0; i < d->n_pubs; i++) {
    dht_pub *p = &d->pubs[i];
    if (p->next_at <= now_ms) {
      p->next_at = now_ms + d->cfg.record_ttl_ms / 2;
      if (store_value(d, &p->key, p->value, p->len, now_ms) != 0) p->next_at = now_ms + DHT_RETRY_MS;
    }
    if (p->next_at < next) next = p->next_at;
  }
  return next;
}
