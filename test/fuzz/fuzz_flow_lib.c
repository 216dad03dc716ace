/* test/fuzz/fuzz_flow_lib.c — the flow protocol's message handling under
 * hostile MSG_FLOW bodies; see fuzz_targets.h and fuzz_flow.h.
 *
 * Input: byte 0 picks who the node is among the cast (fuzz_flow.h) and its
 * capacity; then ops until the input ends, each an op byte (op % 8):
 *   0-2  message: [from u8][len u16le][len bytes] from cast member from % 6
 *   3    echo: [slot u8][off u8][val u8] one of the last messages the node
 *        sent comes back from its addressee, byte off XORed with val (the
 *        segment ids and transaction ids the node drew are in there)
 *   4    tick: [dt u8] time moves (dt + 1) * 100 ms, flow_on_tick
 *   5    membership: [who u8][what u8] peer failed / denied / removed / added
 *   6    cost: [who u8][c u8] flow_set_cost (c = 255: no usable link)
 *   7    route: [from u8][seg u64le] flow_next_hop / flow_route /
 *        flow_pick_first_hop, as the training router asks
 * After every op flow_check_local must hold (else abort()). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/flow.h"
#include "fuzz_flow.h"
#include "fuzz_targets.h"
#include "util/rng.h"

#define ECHO_SLOTS (16)
#define ECHO_MAX (4096)

static struct {
  bool ready;
  gw_id ids[FUZZ_FLOW_CAST];
} cast;

static void cast_init(void) {
  if (cast.ready) return;
  static const char *names[FUZZ_FLOW_CAST] = {"fuzz-flow-d0", "fuzz-flow-d1", "fuzz-flow-r1a",
                                              "fuzz-flow-r1b", "fuzz-flow-r2a", "fuzz-flow-r2b"};
  for (int i = 0; i < FUZZ_FLOW_CAST; i++) gw_id_hash_str(names[i], &cast.ids[i]);
  cast.ready = true;
}

const gw_id *fuzz_flow_cast(int i) {
  cast_init();
  return &cast.ids[i];
}

int fuzz_flow_stage(int i) { return i / 2; }

/* d(i, j): fixed, different per pair, so choices are not all ties. */
double fuzz_flow_link(int i, int j) { return 0.05 + 0.01 * (double)((i * 7 + j * 3) % 11); }

int fuzz_flow_make(int who, int capacity, const gw_io *io, flow **out) {
  cast_init();
  flow_config cfg;
  flow_config_default(&cfg);
  cfg.self = cast.ids[who];
  cfg.stage = fuzz_flow_stage(who);
  cfg.role = cfg.stage == 0 ? FLOW_DATA : FLOW_RELAY;
  cfg.n_stages = FUZZ_FLOW_STAGES;
  cfg.capacity = capacity;
  cfg.io = *io;
  int rc = flow_new(&cfg, out);
  if (rc != 0) return rc;
  int S = FUZZ_FLOW_STAGES + 1, me = cfg.stage;
  for (int j = 0; j < FUZZ_FLOW_CAST; j++) {
    if (j == who) continue;
    int st = fuzz_flow_stage(j);
    flow_add_peer(*out, &cast.ids[j], st);
    if (st == (me + 1) % S) flow_set_cost(*out, &cast.ids[j], FLOW_DIR_NEXT, fuzz_flow_link(who, j));
    if (st == (me + S - 1) % S) flow_set_cost(*out, &cast.ids[j], FLOW_DIR_PREV, fuzz_flow_link(j, who));
  }
  return 0;
}

/* ---- the io: seeded randomness, a ring of what the node sent ---- */

typedef struct sent_msg {
  int to;
  size_t len;
  uint8_t buf[ECHO_MAX];
} sent_msg;

typedef struct fuzz_flow_io {
  gw_rng rng;
  sent_msg ring[ECHO_SLOTS];
  unsigned n_sent;
} fuzz_flow_io;

static int cast_index(const gw_id *id) {
  for (int i = 0; i < FUZZ_FLOW_CAST; i++)
    if (gw_id_eq(id, &cast.ids[i])) return i;
  return -1;
}

static int io_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  fuzz_flow_io *f = ud;
  int k = cast_index(&to->id);
  if (k < 0) abort(); /* the node only knows the cast */
  sent_msg *m = &f->ring[f->n_sent++ % ECHO_SLOTS];
  m->to = k;
  m->len = len < ECHO_MAX ? len : ECHO_MAX;
  memcpy(m->buf, buf, m->len);
  return 0;
}

static void io_tick(void *ud, uint64_t at) { (void)ud, (void)at; }

static void io_random(void *ud, void *buf, size_t len) {
  fuzz_flow_io *f = ud;
  gw_rng_bytes(&f->rng, buf, len);
}

static gw_io fuzz_flow_io_for(void *state) {
  return (gw_io){.ud = state, .send = io_send, .want_tick = io_tick, .random = io_random};
}

static void check(const flow *f) {
  char err[256];
  if (flow_check_local(f, err, sizeof(err)) != 0) {
    fprintf(stderr, "fuzz_flow_msg: flow_check_local: %s\n", err);
    abort();
  }
}

static uint8_t next(const uint8_t **in, size_t *n) {
  if (*n == 0) return 0;
  uint8_t b = **in;
  (*in)++, (*n)--;
  return b;
}

int fuzz_flow_msg(const uint8_t *data, size_t size) {
  cast_init();
  if (size < 1) return 0;
  int who = data[0] % FUZZ_FLOW_CAST, capacity = 1 + (data[0] / FUZZ_FLOW_CAST) % 4;
  const uint8_t *in = data + 1;
  size_t n = size - 1;
  fuzz_flow_io *io = calloc(1, sizeof(*io));
  if (!io) return 0;
  gw_rng_seed(&io->rng, FUZZ_FLOW_SEED(who));
  gw_io gio = fuzz_flow_io_for(io);
  flow *f;
  if (fuzz_flow_make(who, capacity, &gio, &f) != 0) {
    free(io);
    return 0;
  }
  uint64_t now = 0;
  flow_start(f, now);
  while (n > 0) {
    uint8_t op = next(&in, &n) % 8;
    if (op <= 2) {
      int from = next(&in, &n) % FUZZ_FLOW_CAST;
      size_t len = next(&in, &n);
      len |= (size_t)next(&in, &n) << 8;
      if (len > n) len = n;
      gw_peer p = {.id = cast.ids[from]};
      flow_on_message(f, &p, in, len, now);
      in += len, n -= len;
    } else if (op == 3) {
      uint8_t slot = next(&in, &n), off = next(&in, &n), val = next(&in, &n);
      if (io->n_sent == 0) continue;
      unsigned have = io->n_sent < ECHO_SLOTS ? io->n_sent : ECHO_SLOTS;
      sent_msg *m = &io->ring[(io->n_sent - 1 - slot % have) % ECHO_SLOTS];
      uint8_t copy[ECHO_MAX];
      memcpy(copy, m->buf, m->len);
      if (m->len) copy[off % m->len] ^= val;
      gw_peer p = {.id = cast.ids[m->to]};
      flow_on_message(f, &p, copy, m->len, now);
    } else if (op == 4) {
      now += ((uint64_t)next(&in, &n) + 1) * 100;
      flow_on_tick(f, now);
    } else if (op == 5) {
      int k = next(&in, &n) % FUZZ_FLOW_CAST;
      uint8_t what = next(&in, &n) % 4;
      if (k == who) continue;
      if (what == 0) flow_peer_failed(f, &cast.ids[k], now);
      if (what == 1) flow_peer_denied(f, &cast.ids[k], now);
      if (what == 2) flow_remove_peer(f, &cast.ids[k], now);
      if (what == 3) flow_add_peer(f, &cast.ids[k], fuzz_flow_stage(k));
    } else if (op == 6) {
      int k = next(&in, &n) % FUZZ_FLOW_CAST;
      uint8_t c = next(&in, &n);
      if (k == who) continue;
      int S = FUZZ_FLOW_STAGES + 1, me = fuzz_flow_stage(who), st = fuzz_flow_stage(k);
      flow_dir dir = st == (me + 1) % S ? FLOW_DIR_NEXT : FLOW_DIR_PREV;
      flow_set_cost(f, &cast.ids[k], dir, c == 255 ? -1.0 : 0.01 * (double)(c + 1));
    } else {
      int from = next(&in, &n) % FUZZ_FLOW_CAST;
      uint64_t seg = 0;
      for (int i = 0; i < 8; i++) seg |= (uint64_t)next(&in, &n) << (8 * i);
      gw_id hop;
      uint64_t out_seg;
      (void)flow_next_hop(f, &cast.ids[from], seg, &hop, &out_seg);
      (void)flow_route(f, &cast.ids[(from + 1) % FUZZ_FLOW_CAST], &cast.ids[from], &hop, &out_seg);
      if (fuzz_flow_stage(who) == 0) (void)flow_pick_first_hop(f, &hop, &out_seg);
    }
    check(f);
  }
  flow_counts counts;
  flow_get_counts(f, &counts);
  flow_unit_view units[64];
  (void)flow_units(f, units, 64);
  flow_path_info paths[8];
  (void)flow_data_flows(f, paths, 8);
  flow_free(f);
  free(io);
  return 0;
}
