#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

enum { EV_MESSAGE = 0, EV_TICK = 1, EV_PEER_DOWN = 2 };

typedef struct sim_event {
  uint64_t at, seq;
  int kind, node, from;
  uint8_t *buf;
  size_t len;
} sim_event;

typedef struct sim_node {
  gw_peer peer;
  sim_node_ops ops;
  void *node;
  bool alive;
  bool tick_pending;
  uint64_t tick_at;
  gw_rng rng;
  uint64_t sent, bytes_sent;
} sim_node;

typedef struct io_ctx {
  sim *s;
  int index;
} io_ctx;

/* Open addressing from id / address to node index; sized to stay under half full. */
typedef struct index_map {
  int *slots; /* -1 = empty */
  size_t cap;
} index_map;

struct sim {
  sim_config cfg;
  gw_rng rng;
  uint64_t now, seq;
  sim_node *nodes;
  io_ctx **ctx; /* one allocation per node, so gw_io handles survive node growth */
  size_t n_nodes, cap_nodes;
  sim_event *heap;
  size_t n_heap, cap_heap;
  index_map by_id, by_addr;
  sim_delay_fn delay_fn;
  void *delay_ud;
  sim_peer_down_fn down_fn;
  void *down_ud;
  sim_stats stats;
  /* fifo: last delivery time per (from, to), open addressing on the pair */
  uint64_t *fifo_key, *fifo_at;
  size_t fifo_n, fifo_cap;
  /* session_notice: unordered pairs that exchanged a message (key as fifo's) */
  uint64_t *sess_key;
  size_t sess_n, sess_cap;
};

/* ---- event heap ---- */

static bool ev_less(const sim_event *a, const sim_event *b) {
  return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static int heap_push(sim *s, sim_event ev) {
  if (s->n_heap == s->cap_heap) {
    size_t cap = s->cap_heap ? 2 * s->cap_heap : 1024;
    sim_event *h = realloc(s->heap, cap * sizeof(*h));
    if (!h) return GW_ENOMEM;
    s->heap = h;
    s->cap_heap = cap;
  }
  ev.seq = s->seq++;
  size_t i = s->n_heap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!ev_less(&ev, &s->heap[p])) break;
    s->heap[i] = s->heap[p];
    i = p;
  }
  s->heap[i] = ev;
  return 0;
}

static sim_event heap_pop(sim *s) {
  sim_event top = s->heap[0];
  sim_event last = s->heap[--s->n_heap];
  size_t i = 0, n = s->n_heap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const sim_event *best = &last;
    if (l < n && ev_less(&s->heap[l], best)) m = l, best = &s->heap[l];
    if (r < n && ev_less(&s->heap[r], best)) m = r;
    if (m == i) break;
    s->heap[i] = s->heap[m];
    i = m;
  }
  if (n > 0) s->heap[i] = last;
  return top;
}

/* ---- index maps ---- */

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

static uint64_t hash_id(const gw_id *id) { return hash_bytes(id->b, GW_ID_BYTES); }

static uint64_t hash_addr(const gw_addr *a) {
  uint8_t key[19];
  key[0] = a->family;
  key[1] = (uint8_t)(a->port >> 8);
  key[2] = (uint8_t)a->port;
  memcpy(key + 3, a->ip, 16);
  return hash_bytes(key, sizeof(key));
}

static int map_grow(index_map *m, size_t want) {
  if (want * 2 <= m->cap) return 0;
  size_t cap = m->cap ? m->cap : 64;
  while (cap < want * 2) cap *= 2;
  int *slots = malloc(cap * sizeof(int));
  if (!slots) return GW_ENOMEM;
  for (size_t i = 0; i < cap; i++) slots[i] = -1;
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return 1; /* caller must rehash */
}

static void map_put(index_map *m, uint64_t h, int index) {
  size_t i = h & (m->cap - 1);
  while (m->slots[i] != -1) i = (i + 1) & (m->cap - 1);
  m->slots[i] = index;
}

static int find_by_id(const sim *s, const gw_id *id) {
  if (!s->by_id.cap) return -1;
  size_t i = hash_id(id) & (s->by_id.cap - 1);
  for (int k; (k = s->by_id.slots[i]) != -1; i = (i + 1) & (s->by_id.cap - 1))
    if (gw_id_eq(&s->nodes[k].peer.id, id)) return k;
  return -1;
}

static int find_by_addr(const sim *s, const gw_addr *a) {
  if (!s->by_addr.cap) return -1;
  size_t i = hash_addr(a) & (s->by_addr.cap - 1);
  for (int k; (k = s->by_addr.slots[i]) != -1; i = (i + 1) & (s->by_addr.cap - 1))
    if (gw_addr_eq(&s->nodes[k].peer.addr, a)) return k;
  return -1;
}

static int rehash(sim *s) {
  int rc_id = map_grow(&s->by_id, s->n_nodes + 1);
  int rc_addr = map_grow(&s->by_addr, s->n_nodes + 1);
  if (rc_id < 0 || rc_addr < 0) return GW_ENOMEM;
  if (rc_id == 1)
    for (size_t k = 0; k < s->n_nodes; k++) map_put(&s->by_id, hash_id(&s->nodes[k].peer.id), (int)k);
  if (rc_addr == 1)
    for (size_t k = 0; k < s->n_nodes; k++) map_put(&s->by_addr, hash_addr(&s->nodes[k].peer.addr), (int)k);
  return 0;
}

/* ---- gw_io implementation ---- */

static uint64_t pick_delay(sim *s, int from, int to, size_t len) {
  if (s->delay_fn) return s->delay_fn(s->delay_ud, from, to, len, &s->rng);
  uint64_t lo = s->cfg.delay_min_ms, hi = s->cfg.delay_max_ms;
  return lo + gw_rng_below(&s->rng, hi - lo + 1);
}

/* The slot for pair (from, to) in the fifo table, growing it when half full. */
static uint64_t *fifo_slot(sim *s, int from, int to) {
  uint64_t key = ((uint64_t)(uint32_t)from << 32 | (uint32_t)to) + 1; /* 0 = empty */
  if (2 * (s->fifo_n + 1) > s->fifo_cap) {
    size_t cap = s->fifo_cap ? 2 * s->fifo_cap : 256;
    uint64_t *keys = calloc(cap, sizeof(*keys)), *at = calloc(cap, sizeof(*at));
    if (!keys || !at) {
      free(keys);
      free(at);
      return NULL;
    }
    for (size_t i = 0; i < s->fifo_cap; i++) {
      if (!s->fifo_key[i]) continue;
      size_t j = (size_t)(s->fifo_key[i] * 0x9e3779b97f4a7c15ULL) & (cap - 1);
      while (keys[j]) j = (j + 1) & (cap - 1);
      keys[j] = s->fifo_key[i];
      at[j] = s->fifo_at[i];
    }
    free(s->fifo_key);
    free(s->fifo_at);
    s->fifo_key = keys;
    s->fifo_at = at;
    s->fifo_cap = cap;
  }
  size_t j = (size_t)(key * 0x9e3779b97f4a7c15ULL) & (s->fifo_cap - 1);
  while (s->fifo_key[j] && s->fifo_key[j] != key) j = (j + 1) & (s->fifo_cap - 1);
  if (!s->fifo_key[j]) {
    s->fifo_key[j] = key;
    s->fifo_n++;
  }
  return &s->fifo_at[j];
}

static int deliver_later(sim *s, int from, int to, const uint8_t *buf, size_t len) {
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) return GW_ENOMEM;
  memcpy(copy, buf, len);
  uint64_t at = s->now + pick_delay(s, from, to, len);
  if (s->cfg.fifo && from >= 0) {
    /* Never before the previous message on this pair; equal times keep
     * their scheduling order. */
    uint64_t *last = fifo_slot(s, from, to);
    if (last) {
      if (at < *last) at = *last;
      *last = at;
    }
  }
  sim_event ev = {.at = at, .kind = EV_MESSAGE, .node = to, .from = from, .buf = copy, .len = len};
  int rc = heap_push(s, ev);
  if (rc != 0) free(copy);
  return rc;
}

/* ---- sessions (session_notice) ---- */

static uint64_t pair_key(int a, int b) {
  if (a > b) {
    int t = a;
    a = b;
    b = t;
  }
  return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; /* 0 = empty */
}

static size_t sess_probe(const uint64_t *keys, size_t cap, uint64_t key) {
  size_t j = (size_t)(key * 0x9e3779b97f4a7c15ULL) & (cap - 1);
  while (keys[j] && keys[j] != key) j = (j + 1) & (cap - 1);
  return j;
}

/* a and b have a session from now on (a message between them arrived). */
static void session_add(sim *s, int a, int b) {
  if (2 * (s->sess_n + 1) > s->sess_cap) {
    size_t cap = s->sess_cap ? 2 * s->sess_cap : 256;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    if (!keys) return; /* out of memory: this pair's crash goes unnoticed, as a silent one */
    for (size_t i = 0; i < s->sess_cap; i++)
      if (s->sess_key[i]) keys[sess_probe(keys, cap, s->sess_key[i])] = s->sess_key[i];
    free(s->sess_key);
    s->sess_key = keys;
    s->sess_cap = cap;
  }
  uint64_t key = pair_key(a, b);
  size_t j = sess_probe(s->sess_key, s->sess_cap, key);
  if (!s->sess_key[j]) {
    s->sess_key[j] = key;
    s->sess_n++;
  }
}

/* The crashed node's session partners hear of it one delay later. */
static void sessions_notice(sim *s, int index) {
  for (size_t i = 0; i < s->sess_cap; i++) {
    uint64_t key = s->sess_key[i];
    if (!key) continue;
    int a = (int)((key - 1) >> 32), b = (int)(uint32_t)(key - 1);
    int other = a == index ? b : b == index ? a : -1;
    if (other < 0 || !s->nodes[other].alive) continue;
    heap_push(s, (sim_event){.at = s->now + pick_delay(s, index, other, 0),
                             .kind = EV_PEER_DOWN, .node = other, .from = index});
  }
}

static int io_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  io_ctx *c = ud;
  sim *s = c->s;
  sim_node *self = &s->nodes[c->index];
  if (!self->alive) return GW_ECLOSED;
  if (s->cfg.max_message && len > s->cfg.max_message) {
    s->stats.refused_size++;
    return GW_ERANGE;
  }
  s->stats.sent++;
  s->stats.bytes_sent += len;
  if (len > s->stats.max_message_bytes) s->stats.max_message_bytes = len;
  self->sent++;
  self->bytes_sent += len;
  int target = gw_id_is_zero(&to->id) ? find_by_addr(s, &to->addr) : find_by_id(s, &to->id);
  if (target < 0) {
    s->stats.dropped_unknown++;
    return 0; /* like a datagram to nobody: silently lost */
  }
  if (s->cfg.loss > 0 && gw_rng_uniform(&s->rng) < s->cfg.loss) {
    s->stats.dropped_loss++;
    return 0;
  }
  return deliver_later(s, c->index, target, buf, len);
}

static void io_want_tick(void *ud, uint64_t at_ms) {
  io_ctx *c = ud;
  sim *s = c->s;
  sim_node *n = &s->nodes[c->index];
  if (!n->alive) return;
  if (at_ms < s->now) at_ms = s->now;
  if (n->tick_pending && n->tick_at <= at_ms) return;
  n->tick_pending = true;
  n->tick_at = at_ms;
  heap_push(s, (sim_event){.at = at_ms, .kind = EV_TICK, .node = c->index, .from = -1});
}

static void io_random(void *ud, void *buf, size_t len) {
  io_ctx *c = ud;
  gw_rng_bytes(&c->s->nodes[c->index].rng, buf, len);
}

/* ---- public API ---- */

sim *sim_new(const sim_config *cfg) {
  sim *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
  s->cfg = *cfg;
  if (s->cfg.delay_min_ms == 0 && s->cfg.delay_max_ms == 0) s->cfg.delay_min_ms = 1;
  if (s->cfg.delay_max_ms < s->cfg.delay_min_ms) s->cfg.delay_max_ms = s->cfg.delay_min_ms;
  gw_rng_seed(&s->rng, cfg->seed);
  return s;
}

void sim_free(sim *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n_heap; i++) free(s->heap[i].buf);
  free(s->heap);
  free(s->fifo_key);
  free(s->fifo_at);
  free(s->sess_key);
  for (size_t i = 0; i < s->n_nodes; i++) free(s->ctx[i]);
  free(s->nodes);
  free(s->ctx);
  free(s->by_id.slots);
  free(s->by_addr.slots);
  free(s);
}

int sim_add_node(sim *s, const gw_peer *peer, const sim_node_ops *ops, void *node) {
  if ((!gw_id_is_zero(&peer->id) && find_by_id(s, &peer->id) >= 0) || find_by_addr(s, &peer->addr) >= 0)
    return GW_EEXIST;
  if (s->n_nodes == s->cap_nodes) {
    size_t cap = s->cap_nodes ? 2 * s->cap_nodes : 64;
    sim_node *nodes = realloc(s->nodes, cap * sizeof(*nodes));
    io_ctx **ctx = nodes ? realloc(s->ctx, cap * sizeof(*ctx)) : NULL;
    if (nodes) s->nodes = nodes;
    if (!ctx) return GW_ENOMEM;
    s->ctx = ctx;
    s->cap_nodes = cap;
  }
  io_ctx *c = malloc(sizeof(*c));
  if (!c || rehash(s) != 0) {
    free(c);
    return GW_ENOMEM;
  }
  int index = (int)s->n_nodes++;
  c->s = s;
  c->index = index;
  s->ctx[index] = c;
  sim_node *n = &s->nodes[index];
  memset(n, 0, sizeof(*n));
  n->peer = *peer;
  n->ops = *ops;
  n->node = node;
  n->alive = true;
  gw_rng_fork(&s->rng, &n->rng);
  if (!gw_id_is_zero(&peer->id)) map_put(&s->by_id, hash_id(&peer->id), index);
  map_put(&s->by_addr, hash_addr(&peer->addr), index);
  return index;
}

void sim_set_node(sim *s, int index, void *node) { s->nodes[index].node = node; }
int sim_node_count(const sim *s) { return (int)s->n_nodes; }
const gw_peer *sim_peer(const sim *s, int index) { return &s->nodes[index].peer; }

gw_io sim_io(sim *s, int index) {
  gw_io io = {0};
  io.ud = s->ctx[index];
  io.send = io_send;
  io.want_tick = io_want_tick;
  io.random = io_random;
  return io;
}

void sim_crash(sim *s, int index) {
  if (!s->nodes[index].alive) return;
  s->nodes[index].alive = false;
  s->nodes[index].tick_pending = false;
  if (s->cfg.session_notice) sessions_notice(s, index);
}

bool sim_alive(const sim *s, int index) { return s->nodes[index].alive; }

int sim_notice_down_after_in_flight(sim *s, int node, int from) {
  if (!s->cfg.fifo) return 0;
  uint64_t *last = fifo_slot(s, from, node);
  if (!last || *last <= s->now) return 0;
  /* at the last message's time, scheduled after it: delivered after it */
  return heap_push(s, (sim_event){.at = *last, .kind = EV_PEER_DOWN, .node = node, .from = from}) == 0;
}

void sim_set_delay_fn(sim *s, sim_delay_fn fn, void *ud) {
  s->delay_fn = fn;
  s->delay_ud = ud;
}

void sim_set_peer_down_fn(sim *s, sim_peer_down_fn fn, void *ud) {
  s->down_fn = fn;
  s->down_ud = ud;
}

uint64_t sim_node_sent(const sim *s, int index) { return s->nodes[index].sent; }
uint64_t sim_node_bytes_sent(const sim *s, int index) { return s->nodes[index].bytes_sent; }
uint64_t sim_now(const sim *s) { return s->now; }
const sim_stats *sim_get_stats(const sim *s) { return &s->stats; }
gw_rng *sim_rng(sim *s) { return &s->rng; }

static void dispatch(sim *s, sim_event *ev) {
  sim_node *n = &s->nodes[ev->node];
  if (ev->kind == EV_TICK) {
    /* Only the tick the node is currently waiting for counts; earlier
     * re-arms leave stale events behind. */
    if (!n->alive || !n->tick_pending || n->tick_at != ev->at) return;
    n->tick_pending = false;
    if (n->ops.on_tick) n->ops.on_tick(n->node, s->now);
    return;
  }
  if (ev->kind == EV_PEER_DOWN) {
    if (n->alive && s->down_fn) s->down_fn(s->down_ud, n->node, &s->nodes[ev->from].peer, s->now);
    return;
  }
  /* A message already in flight still arrives after its sender crashed, as
   * on a real network; only a dead receiver drops it. */
  if (!n->alive) {
    s->stats.dropped_dead++;
    return;
  }
  s->stats.delivered++;
  if (s->cfg.session_notice && ev->from >= 0) session_add(s, ev->from, ev->node);
  const gw_peer *from = ev->from >= 0 ? &s->nodes[ev->from].peer : NULL;
  if (n->ops.on_message) n->ops.on_message(n->node, from, ev->buf, ev->len, s->now);
}

bool sim_step(sim *s) {
  if (s->n_heap == 0) return false;
  sim_event ev = heap_pop(s);
  if (ev.at > s->now) s->now = ev.at;
  dispatch(s, &ev);
  free(ev.buf);
  return true;
}

uint64_t sim_run_until(sim *s, uint64_t t_ms) {
  uint64_t n = 0;
  while (s->n_heap > 0 && s->heap[0].at <= t_ms) {
    sim_step(s);
    n++;
  }
  if (t_ms > s->now) s->now = t_ms;
  return n;
}

bool sim_run_while_not(sim *s, bool (*pred)(void *ud), void *ud, uint64_t deadline_ms) {
  if (pred(ud)) return true;
  while (s->n_heap > 0 && s->heap[0].at <= deadline_ms) {
    sim_step(s);
    if (pred(ud)) return true;
  }
  if (deadline_ms > s->now) s->now = deadline_ms;
  return pred(ud);
}

int sim_inject(sim *s, int from, int to, const uint8_t *buf, size_t len) {
  return deliver_later(s, from, to, buf, len);
}
