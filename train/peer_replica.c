/* train/peer_replica.c — stage replicas: a stage's state outlives its peers
 * (issue 18, items 1 and 2).
 *
 * Pushing. Every K aggregations (the driver decides when, `--replicate-every`)
 * the member that aggregated the round (train_peer_replica_pusher: one per
 * stage, the one the members agreed on, so they do not all push) snapshots
 * the stage right after the step and sends it to R peers outside the stage:
 * the live ones it knows (the stages its directory follows: data nodes and
 * the neighbouring stages) closest by XOR to the stage's replica key. The
 * bytes travel in REPLICA_PUSH chunks (the weights-download chunks of
 * peer_join.c with the weights hash the stage logged for them).
 *
 * Holding. A holder takes a push only from a directory member of the stage
 * it names, other than its own stage, in order, up to the store's byte
 * bound; checks the bytes against the announced BLAKE2b-256
 * (replica_store_put); keeps it in its bounded store (oldest dropped); and
 * tells the driver, which writes it atomically under the data dir and
 * announces it under run/<name>/replica/<s>.
 *
 * Restoring. A peer placed into a stage with no live member (peer_join.c's
 * fetch_or_init) asks the holder of the newest replica the driver found in
 * the DHT (REPLICA_REQ); the holder answers in REPLICA_CHUNKs, taken only from
 * the holder asked (join_on_chunk). The restored weights must hash to what
 * the stage logged for them, else the next holder is asked. */
#include "train/peer_replica.h"

#include <stdlib.h>
#include <string.h>

#include "train/peer_join.h"
#include "train/peer_trust.h"
#include "util/err.h"

/* A push that stalls this long is given up (its slot may be taken). */
#define REPLICA_INBOUND_STALE_MS 30000
/* One REPLICA_REQ per requester per this interval is served. */
#define REPLICA_REQ_MIN_INTERVAL_MS 1000

void replica_free(train_peer *p) {
  for (int i = 0; i < REPLICA_MAX_INBOUND; i++) free(p->rep.in[i].buf);
  replica_store_free(&p->rep.store);
  memset(&p->rep, 0, sizeof(p->rep));
}

void train_peer_set_replica_store(train_peer *p, size_t max_entries, uint64_t max_bytes) {
  replica_store_free(&p->rep.store);
  replica_store_init(&p->rep.store, max_entries, max_bytes);
}

const struct replica_entry *train_peer_replica(const train_peer *p, int stage) {
  return replica_store_newest(&p->rep.store, stage);
}

uint64_t train_peer_step(const train_peer *p) { return p->step; }

/* ---- pushing ---- */

bool train_peer_replica_pusher(const train_peer *p) {
  /* relays of stages 1..S, and the data node that aggregated stage 0 */
  bool stage_ok = p->cfg.role == TRAIN_RELAY ? p->stage >= 1 : p->stage == 0;
  return stage_ok && p->state == PEER_READY && gw_id_eq(&p->agg.applied_from, &p->cfg.self);
}

typedef struct holder_cand {
  gw_id id;
  gw_id dist;
} holder_cand;

static int cmp_dist(const void *x, const void *y) {
  const holder_cand *a = x, *b = y;
  return gw_id_cmp(&a->dist, &b->dist);
}

/* Live peers outside our stage that we know, closest to key first. */
static size_t holder_candidates(train_peer *p, const gw_id *key, holder_cand *out, size_t max) {
  size_t n = 0;
  for (int s = 0; s <= p->cfg.n_stages; s++) {
    if (s == p->stage) continue;
    const peer_stage_view *v = &p->members[s];
    for (size_t i = 0; i < v->n && n < max; i++) {
      const gw_id *id = &v->v[i].id;
      if (v->v[i].heard || gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id) || trust_banned(p, id)) continue;
      bool dup = false;
      for (size_t k = 0; k < n && !dup; k++) dup = gw_id_eq(&out[k].id, id);
      if (dup) continue;
      out[n].id = *id;
      for (int b = 0; b < GW_ID_BYTES; b++) out[n].dist.b[b] = (uint8_t)(id->b[b] ^ key->b[b]);
      n++;
    }
  }
  qsort(out, n, sizeof(*out), cmp_dist);
  return n;
}

int train_peer_push_replica(train_peer *p, const gw_id *key, uint32_t replicas, const void *blob, size_t len,
                            uint64_t iteration, uint64_t step, const uint8_t weights_hash[32]) {
  if (!blob || len == 0 || p->stage < 0) return 0;
  holder_cand c[4 * PEER_MAX_CONTRIB];
  size_t n = holder_candidates(p, key, c, sizeof(c) / sizeof(c[0]));
  int sent = 0;
  for (size_t i = 0; i < n && (uint32_t)sent < replicas; i++) {
    if (join_send_state(p, &c[i].id, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, p->stage, blob, len, iteration, step,
                        weights_hash) != 0)
      continue;
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(&c[i].id, who);
    GW_INFO(&p->log, "replica.pushed", "stage=%d iter=%llu to=%s bytes=%zu", p->stage, (unsigned long long)iteration,
            who, len);
    sent++;
  }
  if ((uint32_t)sent < replicas)
    GW_WARN(&p->log, "replica.short", "stage=%d iter=%llu pushed=%d wanted=%u candidates=%zu", p->stage,
            (unsigned long long)iteration, sent, replicas, n);
  return sent;
}

/* ---- holding ---- */

static void emit_replica(train_peer *p, train_event_kind kind, int stage, uint64_t iteration, const uint8_t *hash) {
  if (!p->io.event) return;
  train_event ev = {.kind = kind, .stage = stage, .iteration = iteration, .leader = p->leader};
  if (hash) memcpy(ev.hash, hash, 32);
  p->io.event(p->io.ud, &ev);
}

static replica_inbound *inbound_slot(train_peer *p, const gw_id *from, int stage, bool create) {
  replica_inbound *free_slot = NULL, *stalest = NULL;
  for (int i = 0; i < REPLICA_MAX_INBOUND; i++) {
    replica_inbound *in = &p->rep.in[i];
    if (in->used && gw_id_eq(&in->from, from) && in->stage == stage) return in;
    if (!in->used && !free_slot) free_slot = in;
    if (in->used && (!stalest || in->last_ms < stalest->last_ms)) stalest = in;
  }
  if (!create) return NULL;
  if (free_slot) return free_slot;
  if (stalest && p->now - stalest->last_ms >= REPLICA_INBOUND_STALE_MS) {
    free(stalest->buf);
    memset(stalest, 0, sizeof(*stalest));
    return stalest;
  }
  return NULL;
}

static void inbound_drop(replica_inbound *in) {
  free(in->buf);
  memset(in, 0, sizeof(*in));
}

static void store_inbound(train_peer *p, replica_inbound *in) {
  char who[GW_ID_SHORT_LEN + 1], hash[17];
  peer_short(&in->from, who);
  replica_entry e = {.stage = in->stage, .iteration = in->iteration, .step = in->step, .from = in->from,
                     .blob = in->buf, .len = (size_t)in->total};
  memcpy(e.blob_hash, in->hash, 32);
  memcpy(e.weights_hash, in->weights_hash, 32);
  replica_entry dropped[REPLICA_DEFAULT_MAX_ENTRIES * 4];
  size_t n_dropped = 0;
  int rc = replica_store_put(&p->rep.store, &e, dropped, sizeof(dropped) / sizeof(dropped[0]), &n_dropped);
  if (rc != 0) {
    GW_WARN(&p->log, "replica.rejected", "stage=%d iter=%llu from=%s reason=%s", in->stage,
            (unsigned long long)in->iteration, who,
            rc == GW_EPROTO ? "hash_mismatch" : rc == GW_EEXIST ? "conflict" : gw_strerror(rc));
    inbound_drop(in);
    return;
  }
  in->buf = NULL; /* the store owns it */
  peer_hex8(in->weights_hash, hash);
  GW_INFO(&p->log, "replica.stored", "stage=%d iter=%llu from=%s hash=%s bytes=%llu", in->stage,
          (unsigned long long)in->iteration, who, hash, (unsigned long long)in->total);
  int stage = in->stage;
  uint64_t iteration = in->iteration;
  uint8_t wh[32];
  memcpy(wh, in->weights_hash, 32);
  inbound_drop(in);
  for (size_t i = 0; i < n_dropped; i++) {
    GW_INFO(&p->log, "replica.dropped", "stage=%d iter=%llu reason=bound entries=%zu bytes=%llu", dropped[i].stage,
            (unsigned long long)dropped[i].iteration, p->rep.store.n, (unsigned long long)p->rep.store.bytes);
    emit_replica(p, TRAIN_EV_REPLICA_DROPPED, dropped[i].stage, dropped[i].iteration, dropped[i].weights_hash);
  }
  emit_replica(p, TRAIN_EV_REPLICA_STORED, stage, iteration, wh);
}

void replica_on_push(train_peer *p, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const train_tensor *t) {
  /* Who may push: a directory member of the stage it names, which is not
   * ours (our own stage's state we hold anyway). Stage 0 (the data nodes'
   * state) too: relays hold it, so that the run outlives its data nodes. */
  if (c->stage < 0 || c->stage > p->cfg.n_stages || !peer_is_member(p, c->stage, from, true)) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, "not_stage_member");
    return;
  }
  if (c->stage == p->stage) {
    trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_REPLICA_PUSH, "own_stage");
    return;
  }
  if (!t || t->dtype != TRAIN_U8 || c->hash.len != 32 || c->weights_hash.len != 32 || c->total == 0 ||
      c->total > p->rep.store.max_bytes || c->offset > c->total || t->nbytes > c->total - c->offset) {
    GW_WARN(&p->log, "replica.bad_chunk", "stage=%d offset=%llu total=%llu", c->stage, (unsigned long long)c->offset,
            (unsigned long long)c->total);
    return;
  }
  replica_inbound *in = inbound_slot(p, from, c->stage, c->offset == 0);
  if (!in) return; /* every slot busy with a live push, or a chunk of a push we never saw begin */
  if (c->offset == 0) {
    free(in->buf);
    memset(in, 0, sizeof(*in));
    in->buf = malloc(c->total);
    if (!in->buf) return;
    in->used = true;
    in->from = *from;
    in->stage = c->stage;
    in->iteration = c->iteration;
    in->step = c->step;
    in->total = c->total;
    memcpy(in->hash, c->hash.data, 32);
    memcpy(in->weights_hash, c->weights_hash.data, 32);
  }
  /* one session delivers in order: anything else is another push or junk */
  if (c->total != in->total || c->offset != in->received || c->iteration != in->iteration ||
      memcmp(in->hash, c->hash.data, 32) != 0) {
    inbound_drop(in);
    return;
  }
  memcpy(in->buf + c->offset, t->data, t->nbytes);
  in->received += t->nbytes;
  in->last_ms = p->now;
  if (in->received == in->total) store_inbound(p, in);
}

/* ---- serving a restorer ---- */

void replica_on_req(train_peer *p, const gw_id *from, const Gwtf__TrainReplicaReq *r) {
  const replica_entry *e = replica_store_newest(&p->rep.store, r->stage);
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(from, who);
  if (!e) {
    GW_DEBUG(&p->log, "replica.none", "stage=%d peer=%s", r->stage, who);
    return;
  }
  size_t n = sizeof(p->rep.served) / sizeof(p->rep.served[0]), oldest = 0;
  for (size_t k = 0; k < n; k++) {
    if (p->rep.served[k].at_ms && gw_id_eq(&p->rep.served[k].id, from) &&
        p->now - p->rep.served[k].at_ms < REPLICA_REQ_MIN_INTERVAL_MS) {
      trust_refuse(p, from, GWTF__TRAIN_MSG__TRAIN_REPLICA_REQ, "rate_limited");
      return;
    }
    if (p->rep.served[k].at_ms < p->rep.served[oldest].at_ms) oldest = k;
  }
  p->rep.served[oldest].id = *from;
  p->rep.served[oldest].at_ms = p->now ? p->now : 1;
  if (join_send_state(p, from, GWTF__TRAIN_MSG__TRAIN_REPLICA_CHUNK, e->stage, e->blob, e->len, e->iteration, e->step,
                      e->weights_hash) == 0)
    GW_INFO(&p->log, "replica.served", "stage=%d iter=%llu to=%s bytes=%zu", e->stage,
            (unsigned long long)e->iteration, who, e->len);
}

void replica_tick(train_peer *p) {
  for (int i = 0; i < REPLICA_MAX_INBOUND; i++) {
    replica_inbound *in = &p->rep.in[i];
    if (in->used && p->now - in->last_ms >= REPLICA_INBOUND_STALE_MS) {
      char who[GW_ID_SHORT_LEN + 1];
      peer_short(&in->from, who);
      GW_WARN(&p->log, "replica.incomplete", "stage=%d iter=%llu from=%s received=%llu total=%llu", in->stage,
              (unsigned long long)in->iteration, who, (unsigned long long)in->received,
              (unsigned long long)in->total);
      inbound_drop(in);
    }
  }
}

/* ---- restoring ---- */

void train_peer_set_replica_holders(train_peer *p, const train_replica_holder *h, size_t n, uint64_t now_ms) {
  p->now = now_ms;
  if (n > REPLICA_MAX_HOLDERS) n = REPLICA_MAX_HOLDERS;
  memcpy(p->rep.holders, h, n * sizeof(*h));
  p->rep.n_holders = (uint32_t)n;
}

bool train_peer_wants_replicas(const train_peer *p) {
  if (p->cfg.role == TRAIN_DATA) /* a data node with no live stage-0 member to fetch from (peer_stage0.c) */
    return p->stage == 0 && (p->state == PEER_UNASSIGNED || p->state == PEER_DOWNLOADING);
  return p->cfg.role == TRAIN_RELAY && p->stage >= 1 && p->state == PEER_DOWNLOADING;
}

static bool holder_usable(train_peer *p, const train_replica_holder *h) {
  return !gw_id_eq(&h->id, &p->cfg.self) && !id_in(p->dl.tried, p->dl.n_tried, &h->id) && !trust_banned(p, &h->id);
}

/* Holders announcing `hash` for `iteration`. */
static uint32_t votes(const train_peer *p, uint64_t iteration, const uint8_t hash[32]) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->rep.n_holders; i++)
    n += p->rep.holders[i].iteration == iteration && memcmp(p->rep.holders[i].weights_hash, hash, 32) == 0;
  return n;
}

/* The newest iteration an untried holder has; of its weights hashes the one
 * most holders announce (a holder's hash is its own word: a hostile one
 * could announce forged weights with their own hash, and the others
 * outvote it; a tie goes to the lowest holder ID); a holder of that hash
 * we have not tried, one we are connected to first. The restore must then
 * give exactly that hash. */
bool replica_next_holder(train_peer *p, gw_id *out) {
  const train_replica_holder *newest = NULL;
  for (uint32_t i = 0; i < p->rep.n_holders; i++) {
    const train_replica_holder *h = &p->rep.holders[i];
    if (holder_usable(p, h) && (!newest || h->iteration > newest->iteration)) newest = h;
  }
  if (!newest) return false;
  const train_replica_holder *best = NULL;
  uint32_t best_votes = 0;
  bool best_alive = false;
  for (uint32_t i = 0; i < p->rep.n_holders; i++) {
    const train_replica_holder *h = &p->rep.holders[i];
    if (h->iteration != newest->iteration || !holder_usable(p, h)) continue;
    uint32_t v = votes(p, h->iteration, h->weights_hash);
    /* of holders announcing the same hash, one we have a session to first:
     * a dead holder's DHT record outlives it, and asking it costs the whole
     * download timeout (a correlated outage kills holders too) */
    bool alive = peer_alive(p, &h->id);
    if (!best || v > best_votes ||
        (v == best_votes && (alive > best_alive || (alive == best_alive && gw_id_cmp(&h->id, &best->id) < 0)))) {
      best = h;
      best_votes = v;
      best_alive = alive;
    }
  }
  *out = best->id;
  memcpy(p->rep.want_hash, best->weights_hash, 32);
  p->rep.want_votes = best_votes;
  return true;
}
