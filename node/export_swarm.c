/* node/export_swarm.c — the "export" component: a live run's weights,
 * stage by stage, from its members (see node/export_swarm.h). */
#include "node/export_swarm.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dht/stage_dir.h"
#include "node/dht_node.h"
#include "train/run.h"
#include "train.pb-c.h"
#include "util/err.h"

#define EXPORT_TICK_MS (250)
#define EXPORT_MAX_STAGES (64)
#define EXPORT_MAX_MEMBERS (16)
#define EXPORT_MAX_FETCH (4)
/* Verified downloads kept per stage across rounds: a stage that was behind
 * in one round may match the others' iteration in the next. */
#define EXPORT_POOL (6)
#define EXPORT_MAX_QUERIES (EXPORT_MAX_STAGES + 2)
/* A download with no chunk for this long is abandoned for another member. */
#define EXPORT_STALL_MS (15000)
/* Members serve one requester at most once a second (peer_join.c):
 * asking again sooner only queues the request. */
#define EXPORT_REFETCH_MS (1200)
/* How often the run record and an empty stage directory are looked up. */
#define EXPORT_LOOKUP_MS (1000)
/* The certificate this tool gives itself for a private run: long enough
 * for any download, short enough to be worthless afterwards. */
#define EXPORT_CERT_TTL_S (3600)

typedef struct member_ref {
  gw_id id;
  gw_addr addr;
  bool no_direct;
  stage_relay relay; /* the first relay a private member names */
  bool has_relay;
} member_ref;

/* One download of one stage's state from one member. */
typedef struct fetch {
  bool active, requested, done;
  int member; /* index into the stage's members */
  uint64_t last_ms, not_before;
  uint8_t *buf;
  size_t total, received;
  uint8_t blob_hash[32];
  uint64_t iteration, step;
  uint8_t weight_hash[HF_HASH_BYTES];
} fetch;

/* A verified download, kept until a consistent set is found. */
typedef struct pooled {
  bool used;
  int member;
  uint64_t iteration;
  uint8_t weight_hash[HF_HASH_BYTES];
  uint8_t *buf;
  size_t len;
} pooled;

typedef struct stage_fetch {
  member_ref members[EXPORT_MAX_MEMBERS];
  pooled pool[EXPORT_POOL];
  int n_members, next_member;
  bool discovering;
  uint64_t discovered_ms;
  int want; /* downloads that must agree */
  fetch f[EXPORT_MAX_FETCH];
} stage_fetch;

typedef struct export_rt export_rt;

/* A DHT query outlives the component when it stops first: the callback
 * sees rt == NULL and only frees this. */
typedef struct ex_query {
  export_rt *rt;
  int stage; /* -1: the run record */
} ex_query;

struct export_rt {
  node *n;
  export_swarm_opts *o;
  gw_log log;
  dht *d;
  p2p_host *host;
  uv_timer_t tick;
  uint64_t started_ms, last_run_query;
  int round;
  bool have_run, run_busy, finished, stopping;
  train_run run;
  uint8_t *cert; /* a private run: our membership certificate (packed) */
  size_t cert_len;
  stage_fetch st[EXPORT_MAX_STAGES + 1];
  ex_query *queries[EXPORT_MAX_QUERIES];
};

static uint64_t now_ms(export_rt *x) { return uv_now(node_loop(x->n)); }

static ex_query *query_new(export_rt *x, int stage) {
  for (size_t i = 0; i < EXPORT_MAX_QUERIES; i++) {
    if (x->queries[i]) continue;
    ex_query *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->rt = x;
    q->stage = stage;
    x->queries[i] = q;
    return q;
  }
  return NULL;
}

/* Frees q; returns its runtime, NULL when the component is gone. */
static export_rt *query_done(ex_query *q) {
  export_rt *x = q->rt;
  if (x)
    for (size_t i = 0; i < EXPORT_MAX_QUERIES; i++)
      if (x->queries[i] == q) x->queries[i] = NULL;
  free(q);
  return x;
}

static void finish(export_rt *x, int rc) {
  if (x->finished) return;
  x->finished = true;
  x->o->rc = rc;
  node_stop(x->n);
}

/* ---- the run and its stages ---- */

/* A private run admits only holders of a certificate signed by its key:
 * with the run's key we sign one for our own identity (as `gwtf invite`
 * and the leader would); without it, or with another run's, we stop with
 * what to pass. */
static int certify(export_rt *x, const train_run *info) {
  const member_key *key = x->o->run_key;
  if (!key || memcmp(key->pk, info->run_key, MEMBER_PK_BYTES) != 0) {
    GW_ERROR(&x->log, "export.failed",
             "run=%s reason=\"a private run: its members serve only certified peers\" msg=\"%s\"", info->name,
             key ? "the --run-key given is not this run's key"
                 : "pass --run-key FILE (the run's key: DATA_DIR/runs/NAME/run.key on its creator's machine)");
    finish(x, GW_EPERM);
    return GW_EPERM;
  }
  member_cert c = {.issued = (uint64_t)time(NULL)};
  snprintf(c.run, sizeof(c.run), "%s", info->name);
  memcpy(c.run_key, key->pk, MEMBER_PK_BYTES);
  c.peer = node_identity(x->n)->id;
  c.expires = c.issued + EXPORT_CERT_TTL_S;
  free(x->cert);
  x->cert = NULL;
  int rc = member_cert_make(&c, key, &x->cert, &x->cert_len);
  if (rc != 0) {
    GW_ERROR(&x->log, "export.failed", "run=%s reason=\"cannot sign our certificate\" err=\"%s\"", info->name,
             gw_strerror(rc));
    finish(x, rc);
    return rc;
  }
  GW_INFO(&x->log, "export.certified", "run=%s expires_s=%d", info->name, EXPORT_CERT_TTL_S);
  return 0;
}

/* As a peer does: the record whose publisher is the leader it names. */
static void run_cb(void *ud, int status, const stage_run *runs, size_t n) {
  export_rt *x = query_done(ud);
  if (!x || status != 0 || x->stopping) return;
  x->run_busy = false;
  char err[256];
  for (size_t i = 0; i < n && !x->have_run; i++) {
    train_run info;
    if (train_run_decode(runs[i].value, runs[i].len, &info, err, sizeof(err)) != 0) continue;
    if (!gw_id_eq(&info.leader, &runs[i].publisher)) continue;
    if (info.stages > EXPORT_MAX_STAGES) {
      GW_ERROR(&x->log, "export.failed", "run=%s reason=\"%d stages; this tool handles %d\"", x->o->run,
               info.stages, EXPORT_MAX_STAGES);
      finish(x, GW_ERANGE);
      return;
    }
    if (info.private_run && certify(x, &info) != 0) return;
    x->run = info;
    x->have_run = true;
    GW_INFO(&x->log, "export.run_found", "run=%s model=%s stages=%d layers=%d", info.name,
            model_arch_name(info.model.arch), info.stages, info.model.n_layers);
  }
}

static void members_cb(void *ud, int status, const stage_member *m, size_t n) {
  ex_query *q = ud;
  int s = q->stage;
  export_rt *x = query_done(q);
  if (!x || x->stopping) return;
  stage_fetch *sf = &x->st[s];
  sf->discovering = false;
  sf->discovered_ms = now_ms(x);
  if (status != 0) return;
  for (size_t i = 0; i < n && sf->n_members < EXPORT_MAX_MEMBERS; i++) {
    bool known = false;
    for (int k = 0; k < sf->n_members; k++) known |= gw_id_eq(&sf->members[k].id, &m[i].id);
    if (known) continue;
    member_ref *r = &sf->members[sf->n_members++];
    memset(r, 0, sizeof(*r));
    r->id = m[i].id;
    r->addr = m[i].addr;
    r->no_direct = m[i].no_direct;
    if (m[i].n_relays) r->relay = m[i].relays[0], r->has_relay = true;
  }
  int want = x->o->verify_members < sf->n_members ? x->o->verify_members : sf->n_members;
  sf->want = want > EXPORT_MAX_FETCH ? EXPORT_MAX_FETCH : want;
  if (n) GW_DEBUG(&x->log, "export.members", "stage=%d members=%d", s, sf->n_members);
}

static void lookups(export_rt *x, uint64_t now) {
  if (!x->have_run) {
    if (x->run_busy || now - x->last_run_query < EXPORT_LOOKUP_MS) return;
    ex_query *q = query_new(x, -1);
    if (!q) return;
    x->run_busy = true;
    x->last_run_query = now;
    if (stage_dir_find_run(x->d, x->o->run, run_cb, q, now) != 0) {
      query_done(q);
      x->run_busy = false;
    }
    return;
  }
  for (int s = 0; s <= x->run.stages; s++) {
    stage_fetch *sf = &x->st[s];
    if (sf->discovering || (sf->n_members > 0 && sf->want > 0) || now - sf->discovered_ms < EXPORT_LOOKUP_MS)
      continue;
    ex_query *q = query_new(x, s);
    if (!q) return;
    sf->discovering = true;
    if (stage_dir_discover(x->d, x->o->run, (uint32_t)s, members_cb, q, now) != 0) {
      query_done(q);
      sf->discovering = false;
    }
  }
}

/* ---- downloads ---- */

static int send_packed(export_rt *x, const gw_id *to, uint32_t type, const ProtobufCMessage *msg) {
  uint8_t stack[256];
  size_t len = protobuf_c_message_get_packed_size(msg);
  uint8_t *buf = len <= sizeof(stack) ? stack : malloc(len);
  if (!buf) return GW_ENOMEM;
  protobuf_c_message_pack(msg, buf);
  p2p_msg m = {.type = type, .body = buf, .body_len = len};
  int rc = p2p_host_send(x->host, to, &m);
  if (buf != stack) free(buf);
  return rc;
}

/* The request a joining peer sends; in a private run our certificate goes
 * first on the same session (a member checks it, admits us, then serves). */
static int send_weights_req(export_rt *x, const gw_id *member, int stage) {
  if (x->cert) {
    Gwtf__TrainCert c = GWTF__TRAIN_CERT__INIT;
    c.cert = (ProtobufCBinaryData){x->cert_len, x->cert};
    c.refused = (char *)"";
    int rc = send_packed(x, member, GWTF__TRAIN_MSG__TRAIN_CERT, &c.base);
    if (rc != 0) return rc;
  }
  Gwtf__TrainWeightsReq r = GWTF__TRAIN_WEIGHTS_REQ__INIT;
  r.stage = stage;
  uint8_t buf[64];
  size_t len = protobuf_c_message_get_packed_size(&r.base);
  if (len > sizeof(buf)) return GW_ERANGE;
  protobuf_c_message_pack(&r.base, buf);
  p2p_msg m = {.type = GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ, .body = buf, .body_len = len};
  return p2p_host_send(x->host, member, &m);
}

static void dial(export_rt *x, const member_ref *r) {
  if (p2p_host_is_connected(x->host, &r->id)) return;
  if (r->no_direct && r->has_relay)
    p2p_host_connect_via(x->host, &r->relay.id, &r->relay.addr, &r->id);
  else
    p2p_host_connect(x->host, &r->addr, &r->id);
}

static void fetch_reset(fetch *f) {
  free(f->buf);
  f->buf = NULL;
  f->active = f->requested = f->done = false;
  f->total = f->received = 0;
}

/* The member index for a new download of stage s: one no other download of
 * this stage is using, round robin. -1 when none is free. */
static int pick_member(stage_fetch *sf) {
  for (int tries = 0; tries < sf->n_members; tries++) {
    int m = sf->next_member++ % sf->n_members;
    bool busy = false;
    for (int k = 0; k < sf->want; k++) busy |= (sf->f[k].active || sf->f[k].done) && sf->f[k].member == m;
    if (!busy) return m;
  }
  return -1;
}

static void drive_fetch(export_rt *x, int s, fetch *f, uint64_t now) {
  stage_fetch *sf = &x->st[s];
  if (f->done) return;
  if (!f->active) {
    if (now < f->not_before) return;
    int m = pick_member(sf);
    if (m < 0) return;
    f->active = true;
    f->member = m;
    f->last_ms = now;
    dial(x, &sf->members[m]);
  }
  const member_ref *r = &sf->members[f->member];
  if (!f->requested && p2p_host_is_connected(x->host, &r->id)) {
    f->requested = send_weights_req(x, &r->id, s) == 0;
    f->last_ms = now;
    if (f->requested) {
      char who[GW_ID_SHORT_LEN + 1];
      gw_id_to_short(&r->id, who);
      GW_INFO(&x->log, "export.requested", "stage=%d peer=%s", s, who);
    }
  }
  if (now - f->last_ms > EXPORT_STALL_MS) {
    char who[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&r->id, who);
    GW_WARN(&x->log, "export.stalled", "stage=%d peer=%s msg=\"no weights in time: asking another member\"", s, who);
    fetch_reset(f);
  }
}

/* Keeps a verified download (taking its buffer), evicting the oldest
 * iteration when the pool is full. */
static void pool_add(stage_fetch *sf, fetch *f) {
  pooled *slot = &sf->pool[0];
  for (int i = 0; i < EXPORT_POOL; i++) {
    if (!sf->pool[i].used) {
      slot = &sf->pool[i];
      break;
    }
    if (sf->pool[i].iteration < slot->iteration) slot = &sf->pool[i];
  }
  if (slot->used) free(slot->buf);
  slot->used = true;
  slot->member = f->member;
  slot->iteration = f->iteration;
  memcpy(slot->weight_hash, f->weight_hash, HF_HASH_BYTES);
  slot->buf = f->buf;
  slot->len = f->total;
  f->buf = NULL;
}

/* Stage s at iteration it: how many different members' downloads, the
 * first of them in *first; -1 when two members hold different weights. */
static int members_at(const stage_fetch *sf, uint64_t it, const pooled **first) {
  int n = 0;
  *first = NULL;
  for (int i = 0; i < EXPORT_POOL; i++) {
    const pooled *p = &sf->pool[i];
    if (!p->used || p->iteration != it) continue;
    if (*first && sodium_memcmp(p->weight_hash, (*first)->weight_hash, HF_HASH_BYTES) != 0) return -1;
    bool seen = false;
    for (int k = 0; k < i; k++)
      seen |= sf->pool[k].used && sf->pool[k].iteration == it && sf->pool[k].member == p->member;
    if (!*first) *first = p;
    n += !seen;
  }
  return n;
}

static void assemble(export_rt *x, uint64_t it, const pooled **parts) {
  char err[512];
  for (int s = 0; s <= x->run.stages; s++) {
    int rc = hf_model_add_stage(x->o->model, parts[s]->buf, parts[s]->len, parts[s]->weight_hash, NULL, NULL, NULL,
                                err, sizeof(err));
    if (rc) {
      GW_ERROR(&x->log, "export.failed", "stage=%d err=\"%s\"", s, err);
      finish(x, rc);
      return;
    }
  }
  int rc = hf_model_complete(x->o->model, err, sizeof(err));
  if (rc) GW_ERROR(&x->log, "export.failed", "err=\"%s\"", err);
  x->o->iteration = (long long)it;
  finish(x, rc);
}

/* The newest iteration at which every stage has `want` members' downloads
 * (with equal weights); 0 when found (or on a disagreement, which ends
 * the export), GW_ENOENT when none. */
static int find_consistent(export_rt *x) {
  const pooled *parts[EXPORT_MAX_STAGES + 1];
  uint64_t cands[EXPORT_POOL];
  int nc = 0;
  for (int i = 0; i < EXPORT_POOL; i++)
    if (x->st[0].pool[i].used) cands[nc++] = x->st[0].pool[i].iteration;
  for (int pass = 0; pass < nc; pass++) {
    int bi = -1; /* the newest candidate not tried yet */
    for (int i = 0; i < nc; i++)
      if (cands[i] != UINT64_MAX && (bi < 0 || cands[i] > cands[bi])) bi = i;
    if (bi < 0) break;
    uint64_t it = cands[bi];
    for (int i = 0; i < nc; i++)
      if (cands[i] == it) cands[i] = UINT64_MAX;
    bool ok = true;
    for (int s = 0; ok && s <= x->run.stages; s++) {
      int n = members_at(&x->st[s], it, &parts[s]);
      if (n < 0) {
        GW_ERROR(&x->log, "export.members_disagree", "stage=%d iter=%llu msg=\"two members of the stage hold "
                 "different weights at the same iteration: not exporting\"", s, (unsigned long long)it);
        finish(x, GW_EAUTH);
        return 0;
      }
      ok = n >= x->st[s].want;
    }
    if (ok) {
      assemble(x, it, parts);
      return 0;
    }
  }
  return GW_ENOENT;
}

/* Every download of this round is in: a consistent set, or a new round
 * asking every stage again at once (so the answers fall between the same
 * two aggregations more often than one stage at a time would). */
static void check_round(export_rt *x, uint64_t now) {
  for (int s = 0; s <= x->run.stages; s++) {
    if (x->st[s].want == 0) return;
    for (int k = 0; k < x->st[s].want; k++)
      if (!x->st[s].f[k].done) return;
  }
  if (find_consistent(x) == 0) return;
  char its[512];
  size_t pos = 0;
  for (int s = 0; s <= x->run.stages && pos < sizeof(its); s++) {
    int n = snprintf(its + pos, sizeof(its) - pos, "%s%llu", s ? "," : "",
                     (unsigned long long)x->st[s].f[0].iteration);
    pos += n > 0 ? (size_t)n : 0;
  }
  x->round++;
  GW_INFO(&x->log, "export.refetch", "round=%d iterations=%s msg=\"stages at different iterations: asking "
          "again\"", x->round, its);
  for (int s = 0; s <= x->run.stages; s++)
    for (int k = 0; k < x->st[s].want; k++) {
      fetch_reset(&x->st[s].f[k]);
      x->st[s].f[k].not_before = now + EXPORT_REFETCH_MS;
    }
}

static void tick_cb(uv_timer_t *t) {
  export_rt *x = t->data;
  if (x->finished || x->stopping) return;
  uint64_t now = now_ms(x);
  if (now - x->started_ms > x->o->timeout_ms) {
    int pending = 0;
    for (int s = 0; x->have_run && s <= x->run.stages; s++)
      for (int k = 0; k < (x->st[s].want ? x->st[s].want : 1); k++) pending += !x->st[s].f[k].done;
    GW_ERROR(&x->log, "export.timeout", "run=%s found=%d pending_downloads=%d msg=\"no consistent set of "
             "weights in time\"", x->o->run, x->have_run, x->have_run ? pending : -1);
    finish(x, GW_ETIMEDOUT);
    return;
  }
  lookups(x, now);
  for (int s = 0; x->have_run && s <= x->run.stages; s++)
    for (int k = 0; k < x->st[s].want; k++) drive_fetch(x, s, &x->st[s].f[k], now);
  if (x->have_run) check_round(x, now);
}

/* ---- chunks ---- */

static fetch *fetch_for(export_rt *x, const gw_id *from, int stage) {
  if (!x->have_run || stage < 0 || stage > x->run.stages) return NULL;
  stage_fetch *sf = &x->st[stage];
  for (int k = 0; k < sf->want; k++)
    if (sf->f[k].active && sf->f[k].requested && gw_id_eq(&sf->members[sf->f[k].member].id, from))
      return &sf->f[k];
  return NULL;
}

/* The whole state arrived and hashes to what its chunks announced. */
static void fetch_complete(export_rt *x, int s, fetch *f) {
  gw_id got;
  gw_id_hash(f->buf, f->total, &got);
  char who[GW_ID_SHORT_LEN + 1], err[512];
  gw_id_to_short(&x->st[s].members[f->member].id, who);
  int rc = sodium_memcmp(got.b, f->blob_hash, 32) == 0 ? 0 : GW_EAUTH;
  if (rc) snprintf(err, sizeof(err), "the state does not hash to what its chunks announced");
  if (!rc) rc = hf_state_weight_hash(f->buf, f->total, f->weight_hash, err, sizeof(err));
  if (rc) {
    GW_WARN(&x->log, "export.bad_state", "stage=%d peer=%s err=\"%s\"", s, who, err);
    fetch_reset(f);
    return;
  }
  f->active = false;
  f->done = true;
  char hex[2 * HF_HASH_BYTES + 1];
  sodium_bin2hex(hex, sizeof(hex), f->weight_hash, HF_HASH_BYTES);
  GW_INFO(&x->log, "export.downloaded", "stage=%d peer=%s bytes=%zu iter=%llu step=%llu hash=%.16s", s, who,
          f->total, (unsigned long long)f->iteration, (unsigned long long)f->step, hex);
  pool_add(&x->st[s], f);
}

static void on_chunk(export_rt *x, const gw_id *from, const Gwtf__TrainWeightsChunk *c, const p2p_msg *msg) {
  fetch *f = fetch_for(x, from, c->stage);
  if (!f || c->hash.len != 32 || !msg->data) return;
  int first = 0, nl = 0;
  bool head = c->stage == 0;
  if (!head) train_run_stage_layers(&x->run, c->stage, &first, &nl);
  size_t max = hf_state_max_bytes(&x->run.model, nl, head);
  if (c->total == 0 || c->total > max || c->offset > c->total || msg->data_len > c->total - c->offset) {
    GW_WARN(&x->log, "export.bad_chunk", "stage=%d offset=%llu total=%llu max=%zu", c->stage,
            (unsigned long long)c->offset, (unsigned long long)c->total, max);
    return;
  }
  if (c->offset == 0) {
    free(f->buf);
    /* zeroed: a member that repeats a chunk instead of sending another
     * reaches the hash check with defined bytes, and fails it */
    f->buf = calloc(1, c->total);
    if (!f->buf) return;
    f->total = c->total;
    f->received = 0;
    memcpy(f->blob_hash, c->hash.data, 32);
    f->iteration = c->iteration;
    f->step = c->step;
  }
  if (!f->buf || c->total != f->total || memcmp(f->blob_hash, c->hash.data, 32) != 0) return;
  memcpy(f->buf + c->offset, msg->data, msg->data_len);
  f->received += msg->data_len;
  f->last_ms = now_ms(x);
  if (f->received >= f->total) fetch_complete(x, c->stage, f);
}

static void comp_message(void *state, const gw_id *from, p2p_msg *msg) {
  export_rt *x = state;
  if (!x || x->finished || msg->type != GWTF__TRAIN_MSG__TRAIN_WEIGHTS_CHUNK) return;
  Gwtf__TrainWeightsChunk *c = gwtf__train_weights_chunk__unpack(NULL, msg->body_len, msg->body);
  if (!c) return;
  on_chunk(x, from, c, msg);
  gwtf__train_weights_chunk__free_unpacked(c, NULL);
}

/* A session came up: ask at once rather than at the next tick. */
static void comp_peer_up(void *state, const gw_peer *peer, bool back) {
  export_rt *x = state;
  (void)back;
  if (!x || x->finished || !x->have_run) return;
  uint64_t now = now_ms(x);
  for (int s = 0; s <= x->run.stages; s++)
    for (int k = 0; k < x->st[s].want; k++) {
      fetch *f = &x->st[s].f[k];
      if (f->active && !f->requested && gw_id_eq(&x->st[s].members[f->member].id, &peer->id))
        drive_fetch(x, s, f, now);
    }
}

/* A member went away mid-download: another one serves the stage. */
static void comp_peer_down(void *state, const gw_id *id, p2p_down_reason reason) {
  export_rt *x = state;
  (void)reason;
  if (!x || x->finished || !x->have_run) return;
  for (int s = 0; s <= x->run.stages; s++)
    for (int k = 0; k < x->st[s].want; k++) {
      fetch *f = &x->st[s].f[k];
      if (f->active && f->requested && gw_id_eq(&x->st[s].members[f->member].id, id)) fetch_reset(f);
    }
}

/* ---- the component ---- */

static int comp_start(node *n, void **state) {
  export_swarm_opts *o = (export_swarm_opts *)node_get_config(n)->export_swarm;
  *state = NULL;
  if (!o) return 0;
  dht_runtime *drt = node_dht(n);
  if (!drt) return GW_EINVAL;
  export_rt *x = calloc(1, sizeof(*x));
  if (!x) return GW_ENOMEM;
  x->n = n;
  x->o = o;
  x->log = *node_log(n);
  x->d = dht_runtime_dht(drt);
  x->host = node_host(n);
  x->started_ms = uv_now(node_loop(n));
  o->rc = GW_ETIMEDOUT;
  uv_timer_init(node_loop(n), &x->tick);
  x->tick.data = x;
  uv_timer_start(&x->tick, tick_cb, EXPORT_TICK_MS, EXPORT_TICK_MS);
  GW_INFO(&x->log, "export.searching", "run=%s verify_members=%d", o->run, o->verify_members);
  *state = x;
  return 0;
}

static void tick_closed(uv_handle_t *h) {
  export_rt *x = h->data;
  node *n = x->n;
  for (int s = 0; s <= EXPORT_MAX_STAGES; s++) {
    for (int k = 0; k < EXPORT_MAX_FETCH; k++) free(x->st[s].f[k].buf);
    for (int k = 0; k < EXPORT_POOL; k++) free(x->st[s].pool[k].buf);
  }
  free(x->cert);
  free(x);
  node_component_stopped(n);
}

static void comp_stop(node *n, void *state) {
  export_rt *x = state;
  if (!x) {
    node_component_stopped(n);
    return;
  }
  x->stopping = true;
  for (size_t i = 0; i < EXPORT_MAX_QUERIES; i++) /* their callbacks free them */
    if (x->queries[i]) x->queries[i]->rt = NULL;
  uv_close((uv_handle_t *)&x->tick, tick_closed);
}

const node_component export_component = {
    .name = "export",
    .type_lo = 200,
    .type_hi = 399,
    .start = comp_start,
    .stop = comp_stop,
    .peer_up = comp_peer_up,
    .peer_down = comp_peer_down,
    .message = comp_message,
};
