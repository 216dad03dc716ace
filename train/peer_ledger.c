/* train/peer_ledger.c — exactly once and --deterministic; see peer_ledger.h
 * and docs/TRAINING.md, "Exactly once and --deterministic". */
#include "train/peer_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/agg_robust.h"
#include "train/peer_data.h"
#include "util/err.h"

/* Per-microbatch gradients an aggregator holds at most (each n_params
 * floats): a member cannot make it allocate without bound. */
#define LEDGER_MAX_GRADS 1024

static bool det(const train_peer *p) { return p->cfg.tun.deterministic; }
/* Data node: whether a microbatch whose gradient died with a member is run again. */
static bool reruns_on(const train_peer *p) { return p->cfg.role == TRAIN_DATA && (det(p) || p->cfg.tun.rerun_lost); }

static int mb_cmp(const ledger_mb *a, const ledger_mb *b) {
  if (a->id != b->id) return a->id < b->id ? -1 : 1;
  return gw_id_cmp(&a->origin, &b->origin);
}

static bool mb_eq(const ledger_mb *a, const ledger_mb *b) { return mb_cmp(a, b) == 0; }

static int mine_index(const peer_ledger *L, const ledger_mb *m) {
  for (uint32_t i = 0; i < L->n_mine; i++)
    if (mb_eq(&L->mine[i], m)) return (int)i;
  return -1;
}

static bool in_mine(const peer_ledger *L, const ledger_mb *m) { return mine_index(L, m) >= 0; }

static bool grow(void **arr, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap) return true;
  uint32_t c = *cap ? *cap : 16;
  while (c < need) c *= 2;
  void *n = realloc(*arr, (size_t)c * elem);
  if (!n) return false;
  *arr = n;
  *cap = c;
  return true;
}

static void drop_round(peer_ledger *L) {
  for (uint32_t i = 0; i < L->n_grads; i++) free(L->grads[i].g);
  L->n_grads = 0;
  for (uint32_t i = 0; i < L->n_lists; i++) free(L->lists[i].mbs);
  L->n_lists = 0;
  free(L->chosen);
  L->chosen = NULL;
  L->n_chosen = 0;
}

/* Everything is for one iteration: ours moved on, so it starts over. */
static void sync(train_peer *p) {
  peer_ledger *L = &p->ledger;
  if (L->iteration == p->iteration && L->stage == p->stage) return;
  drop_round(L);
  L->iteration = p->iteration;
  L->stage = p->stage;
  L->n_mine = 0;
  L->n_book = 0;
  L->n_sources = 0;
}

void ledger_free(train_peer *p) {
  peer_ledger *L = &p->ledger;
  drop_round(L);
  free(L->mine);
  free(L->paths);
  free(L->reruns);
  free(L->grads);
  free(L->book);
  free(L->out_ids);
  free(L->out_reruns);
  free(L->out_origins);
  free(L->out_sources);
  memset(L, 0, sizeof(*L));
}

static void mb_hex(const ledger_mb *m, char origin[GW_ID_SHORT_LEN + 1]) { peer_short(&m->origin, origin); }

/* ---- a member's own microbatches ---- */

static bool is_grad_job(train_job_kind kind) {
  return kind == TRAIN_JOB_LOSS || kind == TRAIN_JOB_BACKWARD || kind == TRAIN_JOB_EMBED_BACKWARD;
}

bool ledger_drops_grad(train_peer *p, peer_mb *mb, train_job_kind kind) {
  if (!mb || mb->eval || !is_grad_job(kind) || !ledger_is_rerun(mb) || mb->iteration != p->iteration) return false;
  sync(p);
  ledger_mb e = {mb->origin, mb->id, true};
  bool ours = p->stage >= 0 && p->stage < 64 && (mb->rerun_stages >> p->stage) & 1;
  /* not our stage's to redo (its holder lives), or we hold it already */
  bool drop = (mb->rerun_stages && !ours) || in_mine(&p->ledger, &e);
  mb->grad_dropped = drop;
  return drop;
}

float *ledger_part_for(train_peer *p, peer_mb *mb, train_job_kind kind) {
  if (!det(p) || !mb || mb->eval || !is_grad_job(kind)) return NULL;
  /* A data node's microbatch gradient is its loss job's plus its embedding
   * backward's (the LM head is tied to the token embedding): without the
   * first, the second alone would be a wrong gradient, so it is not taken. */
  if (kind == TRAIN_JOB_EMBED_BACKWARD) return mb->gpart;
  if (mb->gpart) {
    /* a restart: the old part may still be written by a job that runs on */
    if (mb->job) peer_job_keep(mb->job, (void *[]){mb->gpart}, 1);
    else free(mb->gpart);
  }
  size_t n = p->cfg.shape.n_params;
  mb->gpart = calloc(n ? n : 1, sizeof(float));
  return mb->gpart;
}

static ledger_grad *grad_find(peer_ledger *L, const gw_id *holder, const ledger_mb *m) {
  for (uint32_t i = 0; i < L->n_grads; i++)
    if (gw_id_eq(&L->grads[i].holder, holder) && mb_eq(&L->grads[i].mb, m)) return &L->grads[i];
  return NULL;
}

static ledger_grad *grad_add(peer_ledger *L, const gw_id *holder, const ledger_mb *m) {
  if (L->n_grads >= LEDGER_MAX_GRADS ||
      !grow((void **)&L->grads, &L->cap_grads, L->n_grads + 1, sizeof(*L->grads)))
    return NULL;
  ledger_grad *e = &L->grads[L->n_grads++];
  memset(e, 0, sizeof(*e));
  e->holder = *holder;
  e->mb = *m;
  return e;
}

static void share_grad(train_peer *p, const ledger_grad *e);

bool ledger_is_rerun(const peer_mb *mb) { return (mb->attempt & LEDGER_RERUN_ATTEMPT) != 0; }

static void log_path(train_peer *p, const char *event, const peer_mb *mb) {
  char path[PEER_MAX_PATH * (GW_ID_SHORT_LEN + 1) + 1] = "";
  size_t off = 0;
  for (uint32_t s = 0; s < mb->path_len; s++) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(&mb->path[s], who);
    off += (size_t)snprintf(path + off, sizeof(path) - off, "%s%s", s ? "," : "", who);
  }
  if (!strcmp(event, "ledger.recorded"))
    GW_DEBUG(&p->log, event, "iter=%llu mb=%llx path=%s", (unsigned long long)p->iteration,
             (unsigned long long)mb->id, path);
  else
    GW_INFO(&p->log, event, "iter=%llu mb=%llx path=%s", (unsigned long long)p->iteration,
            (unsigned long long)mb->id, path);
}

static uint8_t *path_row(peer_ledger *L, uint32_t i, size_t plen) { return L->paths + (size_t)i * plen * GW_ID_BYTES; }

/* Data node: entry i's stages, the bits of stages whose holder (the peer
 * that accumulated it) is gone: it died after its backward, before the
 * iteration's round, and took that stage's gradient with it. */
static uint64_t dead_holders(train_peer *p, uint32_t i) {
  peer_ledger *L = &p->ledger;
  size_t plen = (size_t)p->cfg.n_stages + 1;
  const uint8_t *row = path_row(L, i, plen);
  uint64_t dead = 0;
  for (size_t s = 1; s < plen && s < 64; s++) {
    gw_id h;
    memcpy(h.b, row + s * GW_ID_BYTES, GW_ID_BYTES);
    if (!gw_id_is_zero(&h) && !peer_alive(p, &h)) dead |= 1ull << s;
  }
  return dead;
}

/* Data node: entry i's holders are mb's path; a re-run's replaces only the
 * stages it was for (the others dropped theirs). One already gone wants a
 * re-run. */
static void store_path(train_peer *p, uint32_t i, const peer_mb *mb) {
  peer_ledger *L = &p->ledger;
  size_t plen = (size_t)p->cfg.n_stages + 1;
  uint8_t *row = path_row(L, i, plen);
  bool whole = !ledger_is_rerun(mb) || !mb->rerun_stages;
  if (whole) memset(row, 0, plen * GW_ID_BYTES);
  for (uint32_t s = 0; s < mb->path_len && s < plen; s++)
    if (whole || (s < 64 && (mb->rerun_stages >> s) & 1)) memcpy(row + s * GW_ID_BYTES, mb->path[s].b, GW_ID_BYTES);
  if (reruns_on(p) && dead_holders(p, i)) L->reruns[i] |= 0x80;
}

void ledger_on_backward(train_peer *p, peer_mb *mb) {
  if (mb->iteration != p->iteration) return; /* an old iteration's: counted nowhere (bwd_count too) */
  sync(p);
  peer_ledger *L = &p->ledger;
  ledger_mb e = {mb->origin, mb->id, ledger_is_rerun(mb)};
  char origin[GW_ID_SHORT_LEN + 1];
  mb_hex(&e, origin);
  int i = mine_index(L, &e);
  if (i >= 0 && ledger_is_rerun(mb)) {
    /* expected: we keep the gradient we have (the re-run's job dropped its) */
    if (p->cfg.role == TRAIN_DATA) store_path(p, (uint32_t)i, mb);
    return;
  }
  if (mb->grad_dropped) return; /* a re-run for other stages: a stage-mate holds ours */
  if (i >= 0) {
    /* Its gradient is in our sum twice; with --deterministic the copy by
     * ID is kept once (the second one is not stored). */
    p->counters.ledger_duplicates++;
    GW_WARN(&p->log, "ledger.duplicate", "iter=%llu mb=%llx origin=%s scope=member attempt=%u",
            (unsigned long long)p->iteration, (unsigned long long)mb->id, origin, mb->attempt);
    return;
  }
  size_t plen = (size_t)p->cfg.n_stages + 1;
  uint32_t cap = L->cap_mine;
  if (!grow((void **)&L->mine, &L->cap_mine, L->n_mine + 1, sizeof(*L->mine))) return;
  if (p->cfg.role == TRAIN_DATA && L->cap_mine != cap) {
    uint8_t *np = realloc(L->paths, (size_t)L->cap_mine * plen * GW_ID_BYTES);
    if (np) L->paths = np;
    uint8_t *nr = np ? realloc(L->reruns, L->cap_mine) : NULL;
    if (nr) L->reruns = nr;
    if (!np || !nr) {
      L->cap_mine = cap; /* mine keeps its larger block; paths and reruns decide the capacity */
      return;
    }
  }
  if (p->cfg.role == TRAIN_DATA) {
    /* the ledger proper: which peer of each stage accumulated it */
    L->reruns[L->n_mine] = 0;
    store_path(p, L->n_mine, mb);
    log_path(p, "ledger.recorded", mb);
  }
  L->mine[L->n_mine++] = e;
  if (!mb->gpart) return;
  ledger_grad *g = grad_add(L, &p->cfg.self, &e);
  if (!g) return; /* the round will find no vector for it: averaged as usual (ledger.inexact) */
  g->g = mb->gpart;
  mb->gpart = NULL;
  g->received = p->cfg.shape.n_params;
  g->complete = true;
  share_grad(p, g);
}

/* ---- re-runs (data node) ---- */

void ledger_peer_down(train_peer *p, const gw_id *peer) {
  if (!reruns_on(p) || p->ledger.iteration != p->iteration) return;
  peer_ledger *L = &p->ledger;
  size_t plen = (size_t)p->cfg.n_stages + 1;
  for (uint32_t i = 0; i < L->n_mine; i++) {
    const uint8_t *row = path_row(L, i, plen);
    for (size_t s = 1; s < plen; s++)
      if (memcmp(row + s * GW_ID_BYTES, peer->b, GW_ID_BYTES) == 0) L->reruns[i] |= 0x80;
  }
  ledger_launch_reruns(p);
}

/* Entry i is wanted again: launch it for the stages whose holder is gone. */
static void launch_one(train_peer *p, uint32_t i) {
  peer_ledger *L = &p->ledger;
  uint32_t done = L->reruns[i] & 0x7f;
  unsigned long long it = (unsigned long long)p->iteration, id = (unsigned long long)L->mine[i].id;
  L->reruns[i] = (uint8_t)done;
  uint64_t stages = dead_holders(p, i);
  if (!stages) return; /* its holders live (a peer that was down is back) */
  if (done >= LEDGER_MAX_RERUNS) {
    GW_WARN(&p->log, "ledger.rerun_given_up", "iter=%llu mb=%llx reruns=%u", it, id, done);
    return;
  }
  uint32_t attempt = LEDGER_RERUN_ATTEMPT + ((done + 1) << 8);
  int rc = data_rerun(p, L->mine[i].id, attempt, stages);
  if (rc == GW_EAGAIN) {
    /* the iteration is over (or wrapping up): the aggregators report it missing */
    GW_WARN(&p->log, "ledger.rerun_too_late", "iter=%llu mb=%llx", it, id);
    return;
  }
  if (rc == GW_EEXIST) return; /* its re-run's holders are checked when it completes */
  if (rc != 0) {
    L->reruns[i] |= 0x80; /* out of memory: the next completion tries again */
    return;
  }
  L->reruns[i] = (uint8_t)(done + 1);
  p->counters.ledger_reruns++;
  GW_INFO(&p->log, "ledger.rerun", "iter=%llu mb=%llx attempt=%u stages=%llx msg=\"a member on its path died "
          "with its gradient\"", it, id, attempt, (unsigned long long)stages);
}

void ledger_launch_reruns(train_peer *p) {
  if (!reruns_on(p) || p->ledger.iteration != p->iteration) return;
  peer_ledger *L = &p->ledger;
  for (uint32_t i = 0; i < L->n_mine; i++)
    if (L->reruns[i] & 0x80) launch_one(p, i);
}

void ledger_rerun_finished(train_peer *p, peer_mb *mb, bool complete) {
  if (complete) log_path(p, "ledger.rerun_done", mb);
  else
    GW_WARN(&p->log, "ledger.rerun_failed", "iter=%llu mb=%llx attempt=%u", (unsigned long long)p->iteration,
            (unsigned long long)mb->id, mb->attempt);
}

/* ---- lists on the wire ---- */

static bool out_reserve(peer_ledger *L, uint32_t n) {
  if (n <= L->out_cap) return true;
  uint64_t *ids = realloc(L->out_ids, (size_t)n * sizeof(*ids));
  if (ids) L->out_ids = ids;
  ProtobufCBinaryData *o = realloc(L->out_origins, (size_t)n * sizeof(*o));
  if (o) L->out_origins = o;
  ProtobufCBinaryData *s = realloc(L->out_sources, (size_t)n * sizeof(*s));
  if (s) L->out_sources = s;
  protobuf_c_boolean *r = realloc(L->out_reruns, (size_t)n * sizeof(*r));
  if (r) L->out_reruns = r;
  if (!ids || !o || !s || !r) return false;
  L->out_cap = n;
  return true;
}

static uint32_t fill_list(peer_ledger *L, const ledger_mb *mbs, uint32_t n) {
  if (n > LEDGER_MAX_IDS) n = LEDGER_MAX_IDS;
  if (!out_reserve(L, n > 64 ? n : 64)) return 0;
  for (uint32_t i = 0; i < n; i++) {
    L->out_ids[i] = mbs[i].id;
    L->out_origins[i] = id_bytes(&mbs[i].origin);
    L->out_reruns[i] = mbs[i].rerun;
  }
  return n;
}

void ledger_fill_grad(train_peer *p, Gwtf__TrainGrad *g) {
  sync(p);
  peer_ledger *L = &p->ledger;
  uint32_t n = fill_list(L, L->mine, L->n_mine);
  g->n_mb_ids = g->n_mb_origins = n;
  g->mb_ids = L->out_ids;
  g->mb_origins = L->out_origins;
  bool any = false;
  for (uint32_t i = 0; i < n; i++) any |= L->out_reruns[i];
  if (any) { /* absent (the common case): nothing of ours was a re-run */
    g->n_mb_rerun = n;
    g->mb_rerun = L->out_reruns;
  }
}

/* One microbatch's own gradient to `to`, chunked. */
static void send_one(train_peer *p, const gw_id *to, const ledger_grad *e) {
  size_t n = p->cfg.shape.n_params, step = p->cfg.tun.chunk_bytes / sizeof(float);
  if (!step) step = 1;
  uint64_t id = e->mb.id;
  ProtobufCBinaryData origin = id_bytes(&e->mb.origin);
  for (size_t off = 0; off < n; off += step) {
    Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
    train_tensor t;
    size_t len = n - off < step ? n - off : step;
    g.iteration = p->iteration;
    g.stage = p->stage;
    g.count = 1;
    g.offset = off;
    g.total = n;
    g.mb_grad = true;
    g.n_mb_ids = g.n_mb_origins = 1;
    g.mb_ids = &id;
    g.mb_origins = &origin;
    peer_tensor_1d(&t, e->g + off, len);
    peer_send(p, to, GWTF__TRAIN_MSG__TRAIN_GRAD, &g.base, &t);
  }
}

/* --deterministic: a copy of each microbatch's gradient goes to every
 * member of our stage the moment we have it, so that if we die before the
 * round the aggregator still has it (ledger.recovered) whoever aggregates. */
static void share_grad(train_peer *p, const ledger_grad *e) {
  peer_stage_view *v = peer_stage(p, p->stage);
  for (size_t i = 0; v && i < v->n; i++) {
    const gw_id *id = &v->v[i].id;
    if ((v->v[i].heard && !v->v[i].vouched) || gw_id_eq(id, &p->cfg.self) || !peer_alive(p, id)) continue;
    send_one(p, id, e);
  }
}

void ledger_send_mb_grads(train_peer *p, const gw_id *to, uint64_t iteration) {
  if (!det(p) || iteration != p->iteration) return;
  sync(p);
  peer_ledger *L = &p->ledger;
  for (uint32_t i = 0; i < L->n_grads; i++) {
    const ledger_grad *e = &L->grads[i];
    if (gw_id_eq(&e->holder, &p->cfg.self) && e->complete) send_one(p, to, e);
  }
}

static bool read_list(const uint64_t *ids, size_t n_ids, const ProtobufCBinaryData *origins, size_t n_origins,
                      ledger_mb **out, uint32_t *n_out) {
  *out = NULL;
  *n_out = 0;
  if (n_ids != n_origins || n_ids > LEDGER_MAX_IDS) return false;
  for (size_t i = 0; i < n_ids; i++)
    if (origins[i].len != GW_ID_BYTES) return false;
  if (n_ids == 0) return true;
  ledger_mb *m = malloc(n_ids * sizeof(*m));
  if (!m) return false;
  for (size_t i = 0; i < n_ids; i++) {
    m[i].id = ids[i];
    m[i].rerun = false;
    id_from_bytes(&m[i].origin, origins[i]);
  }
  *out = m;
  *n_out = (uint32_t)n_ids;
  return true;
}

/* A contribution's list, kept per member (a re-sent contribution replaces it). */
static void record_list(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g) {
  peer_ledger *L = &p->ledger;
  ledger_mb *mbs;
  uint32_t n;
  if (!read_list(g->mb_ids, g->n_mb_ids, g->mb_origins, g->n_mb_origins, &mbs, &n)) return;
  if (g->n_mb_rerun == n)
    for (uint32_t i = 0; i < n; i++) mbs[i].rerun = g->mb_rerun[i];
  ledger_list *l = NULL;
  for (uint32_t i = 0; i < L->n_lists; i++)
    if (gw_id_eq(&L->lists[i].member, from)) l = &L->lists[i];
  if (!l) {
    if (L->n_lists == sizeof(L->lists) / sizeof(L->lists[0])) {
      free(mbs);
      return;
    }
    l = &L->lists[L->n_lists++];
    l->member = *from;
  } else {
    free(l->mbs);
  }
  l->mbs = mbs;
  l->n = n;
}

/* One chunk of a member's per-microbatch gradient (--deterministic). */
static void on_mb_grad(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t) {
  peer_ledger *L = &p->ledger;
  size_t n = p->cfg.shape.n_params;
  if (!det(p) || g->n_mb_ids != 1 || g->n_mb_origins != 1 || g->mb_origins[0].len != GW_ID_BYTES) return;
  if (g->total != n || !t || t->dtype != TRAIN_F32 || t->nbytes % sizeof(float) != 0) return;
  size_t len = t->nbytes / sizeof(float);
  if (g->offset > n || len > n - g->offset) return;
  ledger_mb m = {.id = g->mb_ids[0]};
  id_from_bytes(&m.origin, g->mb_origins[0]);
  ledger_grad *e = grad_find(L, from, &m);
  if (!e) {
    if (g->offset != 0 || !(e = grad_add(L, from, &m))) return;
    if (!(e->g = malloc(n * sizeof(float)))) {
      L->n_grads--;
      return;
    }
  }
  /* chunks come in order on a session; offset 0 is a re-send */
  if (g->offset == 0) {
    e->received = 0;
    e->complete = e->bad = false;
  } else if (g->offset != e->received) {
    return;
  }
  /* a frame's tensor bytes need not be float-aligned: copy, then look */
  memcpy(e->g + g->offset, t->data, len * sizeof(float));
  for (size_t k = 0; k < len; k++) e->bad |= !isfinite(e->g[g->offset + k]);
  e->received += len;
  e->complete = e->received == n;
}

bool ledger_on_grad(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t) {
  if (g->stage != p->stage || g->iteration != p->iteration || p->state != PEER_READY) return g->mb_grad;
  sync(p);
  if (g->mb_grad) {
    on_mb_grad(p, from, g, t);
    return true;
  }
  if (g->offset == 0 && t) record_list(p, from, g);
  return false;
}

/* ---- the iteration's ledger, front to back ---- */

static bool is_source(const peer_ledger *L, const gw_id *origin) { return id_in(L->sources, L->n_sources, origin); }

static bool in_book(const peer_ledger *L, const ledger_mb *m) {
  for (uint32_t i = 0; i < L->n_book; i++)
    if (mb_eq(&L->book[i], m)) return true;
  return false;
}

static void book_add(peer_ledger *L, const ledger_mb *m) {
  if (L->n_book >= LEDGER_MAX_IDS || in_book(L, m)) return;
  if (!grow((void **)&L->book, &L->cap_book, L->n_book + 1, sizeof(*L->book))) return;
  L->book[L->n_book++] = *m;
}

static void source_add(peer_ledger *L, const gw_id *id) {
  if (is_source(L, id) || L->n_sources == sizeof(L->sources) / sizeof(L->sources[0])) return;
  L->sources[L->n_sources++] = *id;
}

void ledger_fill_begin(train_peer *p, Gwtf__TrainIteration *m, uint64_t iteration) {
  if (iteration != p->iteration) return;
  sync(p);
  peer_ledger *L = &p->ledger;
  if (p->cfg.role == TRAIN_DATA) {
    /* our own completed microbatches are the ledger's part we vouch for */
    for (uint32_t i = 0; i < L->n_mine; i++) book_add(L, &L->mine[i]);
    source_add(L, &p->cfg.self);
  }
  uint32_t n = fill_list(L, L->book, L->n_book);
  if (n != L->n_book) return;
  m->n_ledger_ids = m->n_ledger_origins = n;
  m->ledger_ids = L->out_ids;
  m->ledger_origins = L->out_origins;
  for (uint32_t i = 0; i < L->n_sources; i++) L->out_sources[i] = id_bytes(&L->sources[i]);
  m->n_ledger_sources = L->n_sources;
  m->ledger_sources = L->out_sources;
}

/* From a peer of the stage before ours or of our own (a directory member):
 * anyone else's ledger would let it strike microbatches from our average. */
void ledger_on_begin(train_peer *p, const gw_id *from, const Gwtf__TrainIteration *m) {
  if (m->iteration != p->iteration || p->stage < 0 || !m->n_ledger_sources) return;
  if (!peer_is_member(p, p->stage - 1, from, true) && !peer_is_member(p, p->stage, from, true)) return;
  ledger_mb *mbs;
  uint32_t n;
  if (m->n_ledger_sources > 64 ||
      !read_list(m->ledger_ids, m->n_ledger_ids, m->ledger_origins, m->n_ledger_origins, &mbs, &n))
    return;
  for (size_t i = 0; i < m->n_ledger_sources; i++)
    if (m->ledger_sources[i].len != GW_ID_BYTES) {
      free(mbs);
      return;
    }
  sync(p);
  peer_ledger *L = &p->ledger;
  for (size_t i = 0; i < m->n_ledger_sources; i++) {
    gw_id s;
    id_from_bytes(&s, m->ledger_sources[i]);
    source_add(L, &s);
  }
  for (uint32_t i = 0; i < n; i++) book_add(L, &mbs[i]);
  free(mbs);
}

/* ---- the aggregator's count ---- */

typedef struct counted {
  ledger_mb mb;
  const ledger_grad *grad;
} counted;

static int counted_cmp(const void *x, const void *y) { return mb_cmp(&((const counted *)x)->mb, &((const counted *)y)->mb); }

static const ledger_list *list_of(const peer_ledger *L, const gw_id *member) {
  for (uint32_t i = 0; i < L->n_lists; i++)
    if (gw_id_eq(&L->lists[i].member, member)) return &L->lists[i];
  return NULL;
}

static const ledger_grad *usable(peer_ledger *L, const gw_id *holder, const ledger_mb *m) {
  const ledger_grad *e = grad_find(L, holder, m);
  return e && e->complete && !e->bad ? e : NULL;
}

/* Anyone's complete copy of m's gradient (in node-ID order of holders, so
 * that two aggregators pick the same bits; they are the same anyway). */
static const ledger_grad *any_usable(peer_ledger *L, const ledger_mb *m) {
  const ledger_grad *best = NULL;
  for (uint32_t i = 0; i < L->n_grads; i++) {
    const ledger_grad *e = &L->grads[i];
    if (!mb_eq(&e->mb, m) || !e->complete || e->bad) continue;
    if (!best || gw_id_cmp(&e->holder, &best->holder) < 0) best = e;
  }
  return best;
}

static void log_counted(train_peer *p, const counted *c, uint32_t n, bool exact) {
  char ids[LEDGER_LOG_CHARS + 1] = "";
  size_t off = 0;
  uint32_t shown = 0;
  for (; shown < n; shown++) {
    char one[24];
    int len = snprintf(one, sizeof(one), "%s%llx", shown ? "," : "", (unsigned long long)c[shown].mb.id);
    if (off + (size_t)len > LEDGER_LOG_CHARS) break; /* a whole ID or none */
    memcpy(ids + off, one, (size_t)len + 1);
    off += (size_t)len;
  }
  /* checked=0: no data node's ledger reached us (BEGIN_AGG came from a peer
   * we could not vouch for): nothing could be found missing or extra */
  GW_INFO(&p->log, "ledger.counted", "iter=%llu microbatches=%u exact=%d checked=%d truncated=%d mbs=%s",
          (unsigned long long)p->iteration, n, exact ? 1 : 0, p->ledger.n_sources > 0 ? 1 : 0, shown < n ? 1 : 0,
          n ? ids : "-");
}

static bool listed_in(const ledger_mb *mbs, uint32_t n, const ledger_mb *m) {
  for (uint32_t k = 0; k < n; k++)
    if (mb_eq(&mbs[k], m)) return true;
  return false;
}

bool ledger_uncovered(train_peer *p) {
  sync(p);
  const peer_ledger *L = &p->ledger;
  const peer_agg *a = &p->agg;
  for (uint32_t i = 0; i < L->n_book; i++) {
    const ledger_mb *m = &L->book[i];
    bool covered = false;
    for (uint32_t c = 0; c < a->n_contrib && !covered; c++) {
      if (!a->contrib[c].complete) continue;
      const gw_id *member = &a->contrib[c].id;
      const ledger_list *l = gw_id_eq(member, &p->cfg.self) ? NULL : list_of(L, member);
      covered = l ? listed_in(l->mbs, l->n, m)
                  : gw_id_eq(member, &p->cfg.self) ? listed_in(L->mine, L->n_mine, m) : true; /* unlisted: may */
    }
    if (!covered) return true;
  }
  return false;
}

void ledger_round(train_peer *p, uint32_t *total) {
  sync(p);
  peer_ledger *L = &p->ledger;
  peer_agg *a = &p->agg;
  free(L->chosen);
  L->chosen = NULL;
  L->n_chosen = 0;
  L->exact = det(p);
  uint32_t cap = 0, n = 0;
  counted *c = NULL;
  char origin[GW_ID_SHORT_LEN + 1], who[GW_ID_SHORT_LEN + 1];
  unsigned long long it = (unsigned long long)p->iteration;
  for (uint32_t i = 0; i < a->n_contrib; i++) {
    const gw_id *member = &a->contrib[i].id;
    const ledger_mb *mbs;
    uint32_t len;
    if (gw_id_eq(member, &p->cfg.self)) {
      mbs = L->mine;
      len = L->n_mine;
    } else {
      const ledger_list *l = list_of(L, member);
      if (!l) {
        /* a member that predates the ledger: its sum counts, unlisted */
        if (a->contrib[i].count) L->exact = false;
        continue;
      }
      mbs = l->mbs;
      len = l->n;
    }
    peer_short(member, who);
    for (uint32_t k = 0; k < len; k++) {
      const ledger_mb *m = &mbs[k];
      mb_hex(m, origin);
      if (is_source(L, &m->origin) && !in_book(L, m)) {
        p->counters.ledger_extra++;
        GW_WARN(&p->log, "ledger.extra", "iter=%llu mb=%llx origin=%s member=%s excluded=%d", it,
                (unsigned long long)m->id, origin, who, det(p) ? 1 : 0);
        if (det(p)) continue;
      }
      uint32_t j = 0;
      while (j < n && !mb_eq(&c[j].mb, m)) j++;
      if (j < n && (c[j].mb.rerun || m->rerun) && det(p)) {
        /* the data node re-ran it for a holder it thought dead: a second
         * copy of the same bits; without --deterministic both are in */
        GW_DEBUG(&p->log, "ledger.rerun_copy", "iter=%llu mb=%llx origin=%s member=%s", it,
                 (unsigned long long)m->id, origin, who);
        if (!c[j].grad && det(p)) c[j].grad = usable(L, member, m);
        continue;
      }
      if (j < n) {
        p->counters.ledger_duplicates++;
        GW_WARN(&p->log, "ledger.duplicate", "iter=%llu mb=%llx origin=%s member=%s scope=stage", it,
                (unsigned long long)m->id, origin, who);
        if (!c[j].grad) c[j].grad = usable(L, member, m);
        continue;
      }
      if (!grow((void **)&c, &cap, n + 1, sizeof(*c))) {
        L->exact = false;
        continue;
      }
      c[n].mb = *m;
      c[n].grad = det(p) ? usable(L, member, m) : NULL;
      n++;
    }
  }
  for (uint32_t i = 0; i < L->n_book; i++) {
    uint32_t j = 0;
    while (j < n && !mb_eq(&c[j].mb, &L->book[i])) j++;
    if (j < n) continue;
    const ledger_grad *kept = det(p) ? any_usable(L, &L->book[i]) : NULL;
    if (kept && grow((void **)&c, &cap, n + 1, sizeof(*c))) {
      /* its member died before the round, after sharing it (share_grad) */
      c[n].mb = L->book[i];
      c[n].grad = kept;
      n++;
      p->counters.ledger_recovered++;
      mb_hex(&L->book[i], origin);
      peer_short(&kept->holder, who);
      GW_INFO(&p->log, "ledger.recovered", "iter=%llu mb=%llx origin=%s member=%s msg=\"its member's contribution "
              "is missing: its shared gradient counts\"", it, (unsigned long long)L->book[i].id, origin, who);
      continue;
    }
    p->counters.ledger_missing++;
    mb_hex(&L->book[i], origin);
    GW_WARN(&p->log, "ledger.missing", "iter=%llu mb=%llx origin=%s", it,
            (unsigned long long)L->book[i].id, origin);
  }
  if (n > 1) qsort(c, n, sizeof(*c), counted_cmp);
  for (uint32_t i = 0; L->exact && i < n; i++) {
    if (c[i].grad) continue;
    L->exact = false;
    mb_hex(&c[i].mb, origin);
    GW_WARN(&p->log, "ledger.inexact", "iter=%llu mb=%llx origin=%s msg=\"no per-microbatch gradient: "
            "averaging the sums\"", it, (unsigned long long)c[i].mb.id, origin);
  }
  if (L->exact && n > 0 && (L->chosen = malloc(n * sizeof(*L->chosen)))) {
    for (uint32_t i = 0; i < n; i++) L->chosen[i] = c[i].grad;
    L->n_chosen = n;
  } else if (L->exact && n > 0) {
    L->exact = false;
  }
  if (L->exact) {
    *total = n;
    p->counters.ledger_exact_rounds++;
  }
  log_counted(p, c, n, L->exact);
  free(c);
}

bool ledger_average(train_peer *p, float *out) {
  peer_ledger *L = &p->ledger;
  if (!det(p) || !L->exact || L->n_chosen == 0) return false;
  const float **v = malloc(L->n_chosen * sizeof(*v));
  if (!v) return false;
  for (uint32_t i = 0; i < L->n_chosen; i++) v[i] = L->chosen[i]->g;
  /* ((0 + g_0) + g_1) + ... in (ID, origin) order, times 1/n: as train-ref --deterministic */
  train_agg_mean(v, L->n_chosen, p->cfg.shape.n_params, L->n_chosen, out);
  free(v);
  return true;
}

void ledger_scale_holder(train_peer *p, const gw_id *holder, float factor) {
  peer_ledger *L = &p->ledger;
  for (uint32_t i = 0; i < L->n_grads; i++) {
    ledger_grad *e = &L->grads[i];
    if (!e->g || !gw_id_eq(&e->holder, holder)) continue;
    for (size_t k = 0; k < p->cfg.shape.n_params; k++) e->g[k] *= factor;
  }
}
