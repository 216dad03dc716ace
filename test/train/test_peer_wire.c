/* Wire compression negotiated per link (train/peer_wire.c), on the
 * deterministic harness:
 *   - every peer would like to send int8; one stage-2 relay accepts only
 *     fp32 and bf16: it never receives int8 (fp32 from the peers that want
 *     int8, bf16 from the stage-1 relays that want bf16), everybody else gets
 *     int8 where the sender wants it, and the run trains like the fp32 run;
 *   - activations and gradients in different dtypes (--wire-dtype rot4/rot2):
 *     each direction negotiated on its own, a receiver that accepts rot4 but
 *     not rot2 gets rot4 activations and fp32 gradients;
 *   - a format bigger than fp32 (rank 8 on the harness's 8 x 3 tensors) is
 *     never sent: fp32 instead;
 *   - a tensor sent before the receiver's HELLO goes as fp32 and is
 *     counted as early, so the bytes add up;
 *   - a hostile FORWARD or BACKWARD (short payload, wrong shape, NaN row
 *     scale, a dtype the receiver does not accept, rotated rows with a
 *     negative scale or padding bits set, a low-rank tensor with an Inf
 *     mean) is refused with one train.malformed line each, and the run goes
 *     on;
 *   - subspace crossings (--subspace, the toy model's rows crossing as 1
 *     number each): the run trains with every activation [B,T,1] wide, and
 *     a FORWARD without token ids, with too few or with one outside the
 *     vocabulary, or a full-width one, is refused the same way. */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "peer_harness.h"
#include "train.pb-c.h"
#include "train/wire_codec.h"

#define M 4
#define ITERS 8
#define STAGES 2

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

typedef struct net {
  h_harness h;
  int data;
  int s1[2], s2[2]; /* s2[1]: accepts fp32 and bf16 only */
} net;

static int subspace_k; /* the next build's subspace crossings (0: off) */

/* want: what every peer wants to send (stage-1 relays: want1). */
static void build(net *n, uint64_t seed, train_dtype want, train_dtype want1, bool picky) {
  h_harness *h = &n->h;
  h_init(h, STAGES, seed, verbose());
  h->subspace_k = subspace_k;
  h->wire_dtype = want;
  n->data = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h->wire_dtype = want1;
  for (int k = 0; k < 2; k++) n->s1[k] = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  h->wire_dtype = want;
  n->s2[0] = h_add(h, TRAIN_RELAY, 2, M, 0, true);
  if (picky) h->wire_accept = WIRE_BIT(TRAIN_F32) | WIRE_BIT(TRAIN_BF16);
  n->s2[1] = h_add(h, TRAIN_RELAY, 2, M, 0, true);
  h->wire_accept = 0;
  for (int i = 0; i < h->n_nodes; i++) h_start(h, i);
}

static void assert_trained(net *n) {
  char why[200] = "";
  if (!h_hashes_agree(&n->h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  h_node *d = &n->h.nodes[n->data];
  assert_true(isfinite(d->last_loss));
  assert_true(d->last_loss < d->loss_of[0]);
}

static double run_plain(uint64_t seed, train_dtype want) {
  net n;
  build(&n, seed, want, want, false);
  assert_true(h_run_until_finished(&n.h, 120000));
  assert_trained(&n);
  double loss = n.h.nodes[n.data].last_loss;
  uint64_t wanted = 0;
  for (int i = 0; i < n.h.n_nodes; i++) { /* nothing but the wanted dtype, and fp32 before the first HELLO */
    wanted += n.h.nodes[i].act_recv[want];
    for (int d = 0; d < 8; d++)
      if (d != TRAIN_F32 && d != (int)want) assert_int_equal(n.h.nodes[i].act_recv[d], 0);
  }
  assert_true(wanted > 0);
  h_free(&n.h);
  return loss;
}

static void test_negotiation(void **state) {
  (void)state;
  net n;
  build(&n, 31, TRAIN_Q8ROW, TRAIN_BF16, true);
  assert_true(h_run_until_finished(&n.h, 120000));
  assert_trained(&n);
  h_node *picky = &n.h.nodes[n.s2[1]];
  for (int i = 0; verbose() && i < n.h.n_nodes; i++)
    fprintf(stderr, "node %d stage %d: f32 %llu bf16 %llu int8 %llu\n", i, n.h.nodes[i].stage,
            (unsigned long long)n.h.nodes[i].act_recv[TRAIN_F32], (unsigned long long)n.h.nodes[i].act_recv[TRAIN_BF16],
            (unsigned long long)n.h.nodes[i].act_recv[TRAIN_Q8ROW]);
  assert_int_equal(picky->act_recv[TRAIN_Q8ROW], 0);  /* the data node wants int8: fp32 instead */
  assert_true(picky->act_recv[TRAIN_F32] > 0);
  assert_true(picky->act_recv[TRAIN_BF16] > 0);       /* stage 1 wants bf16, which it accepts */
  /* the others took int8 wherever the sender wanted it: the data node from
   * stage 2 (both relays, the picky one included) and stage 1 from stage 2 */
  assert_true(n.h.nodes[n.data].act_recv[TRAIN_Q8ROW] > 0);
  assert_true(n.h.nodes[n.s1[0]].act_recv[TRAIN_Q8ROW] + n.h.nodes[n.s1[1]].act_recv[TRAIN_Q8ROW] > 0);
  assert_int_equal(train_peer_wire_to(n.h.nodes[n.data].tp, &picky->peer.id, true), TRAIN_F32);
  assert_int_equal(train_peer_wire_to(n.h.nodes[n.data].tp, &n.h.nodes[n.s1[0]].peer.id, false), TRAIN_Q8ROW);
  assert_int_equal(train_peer_wire_from(n.h.nodes[n.data].tp, &n.h.nodes[n.s1[0]].peer.id, true), TRAIN_BF16);
  assert_int_equal(train_peer_wire_to(picky->tp, &n.h.nodes[n.data].peer.id, false), TRAIN_Q8ROW);
  assert_int_equal(train_peer_wire_from(picky->tp, &n.h.nodes[n.data].peer.id, true), TRAIN_F32);
  h_free(&n.h);
}

/* A relay whose session with the data node came up, and whose HELLO from it
 * came, while the relay had no stage yet, and whose directory does not list
 * the data node (its record not fetched yet): its HELLO goes to the data
 * node as it gets ready, so the data node's first activations to it are
 * bf16, not F32 until its directory catches up (swarm_wire_bf16 under ASan). */
typedef struct owed_watch {
  int relay, data;
  uint64_t hello_at; /* virtual ms of the relay's first HELLO to the data node */
} owed_watch;

static void watch_hello(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                        const train_tensor *t) {
  (void)body, (void)len, (void)t;
  owed_watch *w = h->hook_ud;
  if (from == w->relay && to == w->data && type == GWTF__TRAIN_MSG__TRAIN_HELLO && !w->hello_at)
    w->hello_at = sim_now(h->s);
}

static void test_hello_owed_goes_at_ready(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 41, verbose());
  h.wire_dtype = TRAIN_BF16;
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  for (int s = 1; s <= STAGES; s++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  int r = h_add(&h, TRAIN_RELAY, -1, M, 0, false); /* the leader places it */
  owed_watch w = {.relay = r, .data = d};
  h.hook_ud = &w;
  h.send_hook = watch_hello;
  h.nodes[d].hidden_from[r] = true;
  h_start(&h, r);
  uint64_t now = sim_now(h.s);
  train_peer_on_peer_up(h.nodes[r].tp, &h.nodes[d].peer.id, now); /* no stage: nothing to say yet */
  train_peer_on_peer_up(h.nodes[d].tp, &h.nodes[r].peer.id, now); /* its HELLO reaches the relay */
  for (int k = 0; k < 20000 && !h.nodes[r].ready; k++) h_run_for(&h, 1);
  assert_true(h.nodes[r].ready);
  assert_true(w.hello_at > 0 && w.hello_at <= sim_now(h.s));
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(train_peer_wire_to(h.nodes[d].tp, &h.nodes[r].peer.id, false), TRAIN_BF16);
  assert_int_equal(h.nodes[r].act_recv[TRAIN_F32], 0);
  h_free(&h);
}

/* A tensor sent before the receiver's HELLO goes as fp32 and is counted
 * apart (train_counters.wire_early_*), so the bytes add up: the stage-1
 * relays' first HELLO to the data node is held back 3 s, and the data node
 * sends them its first activations as fp32. Every fp32 tensor of this bf16
 * run is an early one, every other tensor takes half its fp32 bytes
 * (swarm_wire_bf16 under ASan, where this happened by chance). */
typedef struct slow_hello {
  h_harness *h;
  int data, held; /* HELLOs held back so far */
} slow_hello;

static uint64_t slow_hello_delay(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)len;
  slow_hello *w = ud;
  h_node *f = NULL;
  for (int i = 0; i < w->h->n_nodes; i++)
    if (w->h->nodes[i].index == from) f = &w->h->nodes[i];
  bool to_data = w->h->nodes[w->data].index == to;
  if (f && f->stage == 1 && to_data && w->h->sending == GWTF__TRAIN_MSG__TRAIN_HELLO && w->held < 2) {
    w->held++;
    return 3000;
  }
  return 1 + gw_rng_below(rng, 3);
}

static void test_early_tensors_counted(void **state) {
  (void)state;
  h_harness h;
  h_init(&h, STAGES, 43, verbose());
  slow_hello w = {.h = &h};
  sim_set_delay_fn(h.s, slow_hello_delay, &w);
  h.wire_dtype = TRAIN_BF16;
  w.data = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < 2; k++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(w.held, 2);
  uint64_t f32_recv = 0, early = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    const train_counters *c = train_peer_counters(h.nodes[i].tp);
    f32_recv += h.nodes[i].act_recv[TRAIN_F32];
    early += c->wire_early_tensors;
    assert_int_equal(2 * (c->wire_bytes - c->wire_early_bytes), c->wire_f32_bytes - c->wire_early_bytes);
  }
  const train_counters *dc = train_peer_counters(h.nodes[w.data].tp);
  if (verbose()) fprintf(stderr, "early tensors %llu (data node %llu), fp32 received %llu\n", (unsigned long long)early,
                         (unsigned long long)dc->wire_early_tensors, (unsigned long long)f32_recv);
  assert_true(dc->wire_early_tensors > 0);
  assert_true(dc->wire_early_tensors < dc->wire_tensors); /* bf16 once the HELLO came */
  assert_int_equal(f32_recv, early);
  h_free(&h);
}

/* Compressed runs train like the fp32 one: the same seeded run, each dtype. */
static void test_loss_close_to_fp32(void **state) {
  (void)state;
  double f32 = run_plain(32, TRAIN_F32);
  const train_dtype ds[] = {TRAIN_BF16, TRAIN_F16, TRAIN_Q8ROW};
  for (size_t i = 0; i < sizeof(ds) / sizeof(ds[0]); i++) {
    double l = run_plain(32, ds[i]);
    if (verbose()) fprintf(stderr, "%s: loss %.6f, fp32 %.6f\n", wire_dtype_name(ds[i]), l, f32);
    if (fabs(l - f32) > 0.02 * fabs(f32)) fail_msg("%s: final loss %g, fp32 %g", wire_dtype_name(ds[i]), l, f32);
  }
}

/* rot4 forward, rot2 backward; s2[1] takes fp32 and rot4 only. */
static void test_grad_dtype(void **state) {
  (void)state;
  net n;
  h_harness *h = &n.h;
  h_init(h, STAGES, 34, verbose());
  h->wire_dtype = TRAIN_R4ROW;
  h->wire_grad_dtype = TRAIN_R2ROW;
  n.data = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  for (int k = 0; k < 2; k++) n.s1[k] = h_add(h, TRAIN_RELAY, 1, M, 0, true);
  n.s2[0] = h_add(h, TRAIN_RELAY, 2, M, 0, true);
  h->wire_accept = WIRE_BIT(TRAIN_F32) | WIRE_BIT(TRAIN_R4ROW);
  n.s2[1] = h_add(h, TRAIN_RELAY, 2, M, 0, true);
  h->wire_accept = 0;
  for (int i = 0; i < h->n_nodes; i++) h_start(h, i);
  assert_true(h_run_until_finished(h, 120000));
  assert_trained(&n);
  h_node *d = &h->nodes[n.data], *picky = &h->nodes[n.s2[1]], *s1 = &h->nodes[n.s1[0]], *s1b = &h->nodes[n.s1[1]];
  if (verbose())
    for (int i = 0; i < h->n_nodes; i++)
      fprintf(stderr, "node %d: fwd+bwd f32 %llu r4 %llu r2 %llu; bwd f32 %llu r2 %llu\n", i,
              (unsigned long long)h->nodes[i].act_recv[TRAIN_F32], (unsigned long long)h->nodes[i].act_recv[TRAIN_R4ROW],
              (unsigned long long)h->nodes[i].act_recv[TRAIN_R2ROW], (unsigned long long)h->nodes[i].bwd_recv[TRAIN_F32],
              (unsigned long long)h->nodes[i].bwd_recv[TRAIN_R2ROW]);
  /* the picky relay: rot4 activations from stage 1, fp32 gradients from the data node */
  assert_true(picky->act_recv[TRAIN_R4ROW] > 0);
  assert_int_equal(picky->act_recv[TRAIN_R2ROW], 0);
  assert_true(picky->bwd_recv[TRAIN_F32] > 0);
  assert_int_equal(picky->bwd_recv[TRAIN_R4ROW], 0);
  /* everyone else: activations rot4 only, gradients rot2 only */
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *x = &h->nodes[i];
    assert_int_equal(x->act_recv[TRAIN_R2ROW], x->bwd_recv[TRAIN_R2ROW]); /* rot2 is never an activation */
    assert_int_equal(x->bwd_recv[TRAIN_R4ROW], 0);                        /* rot4 never a gradient */
    if (x != picky) assert_int_equal(x->bwd_recv[TRAIN_F32], 0);
  }
  assert_true(d->bwd_recv[TRAIN_R2ROW] > 0 && d->act_recv[TRAIN_R4ROW] > 0);
  assert_true(s1->bwd_recv[TRAIN_R2ROW] + s1b->bwd_recv[TRAIN_R2ROW] > 0);
  /* the negotiated dtypes, each way and each kind */
  assert_int_equal(train_peer_wire_to(d->tp, &s1->peer.id, false), TRAIN_R4ROW);
  assert_int_equal(train_peer_wire_from(d->tp, &s1->peer.id, true), TRAIN_R2ROW);
  assert_int_equal(train_peer_wire_to(d->tp, &picky->peer.id, true), TRAIN_F32);
  assert_int_equal(train_peer_wire_to(d->tp, &picky->peer.id, false), TRAIN_R4ROW);
  assert_int_equal(train_peer_wire_from(picky->tp, &d->peer.id, true), TRAIN_F32);
  assert_int_equal(train_peer_wire_to(picky->tp, &s1->peer.id, true), TRAIN_R2ROW);
  h_free(h);
}

/* Rank 8 of an 8 x 3 tensor takes more bytes than fp32: fp32 goes instead. */
static void test_bigger_than_fp32(void **state) {
  (void)state;
  assert_true(wire_bytes(TRAIN_LR8, H_B * H_T, H_C) > wire_bytes(TRAIN_F32, H_B * H_T, H_C));
  net n;
  build(&n, 35, TRAIN_LR8, TRAIN_LR8, false);
  assert_true(h_run_until_finished(&n.h, 120000));
  assert_trained(&n);
  for (int i = 0; i < n.h.n_nodes; i++) {
    assert_int_equal(n.h.nodes[i].act_recv[TRAIN_LR8], 0);
    if (i == n.data) assert_true(n.h.nodes[i].act_recv[TRAIN_F32] > 0);
  }
  assert_int_equal(train_peer_wire_to(n.h.nodes[n.data].tp, &n.h.nodes[n.s1[0]].peer.id, false), TRAIN_LR8);
  h_free(&n.h);
}

static int malformed;

static void count_hook(void *ud, gw_log_level level, const char *event, const char *line) {
  (void)ud, (void)level, (void)line;
  if (strcmp(event, "train.malformed") == 0) malformed++;
}

static ProtobufCBinaryData inject_tokens; /* the token ids the next inject carries */

static void inject(net *n, uint32_t type, int from, int to, train_dtype d, uint32_t ndim, uint64_t last_dim,
                   size_t nbytes, const void *data) {
  h_node *dn = &n->h.nodes[n->data];
  Gwtf__TrainMicrobatch m = GWTF__TRAIN_MICROBATCH__INIT;
  m.tokens = inject_tokens;
  ProtobufCBinaryData path[1] = {{GW_ID_BYTES, dn->peer.id.b}};

  m.id = 0xabcdef;
  m.origin = path[0];
  m.iteration = train_peer_iteration(n->h.nodes[to].tp);
  m.n_path = (size_t)n->h.nodes[to].stage; /* the path up to the sender */
  ProtobufCBinaryData full[2] = {path[0], {GW_ID_BYTES, n->h.nodes[n->s1[0]].peer.id.b}};
  m.path = full;
  uint8_t body[256];
  size_t len = gwtf__train_microbatch__pack(&m, body);
  train_tensor t = {.dtype = d, .ndim = ndim, .shape = {H_B, H_T, last_dim}, .data = data, .nbytes = nbytes};
  if (ndim == 1) t.shape[0] = last_dim;
  assert_int_equal(h_inject(&n->h, from, to, type, body, len, &t), 0);
}

static void inject_forward(net *n, int from, int to, train_dtype d, uint64_t last_dim, size_t nbytes, const void *data) {
  inject(n, GWTF__TRAIN_MSG__TRAIN_FORWARD, from, to, d, 3, last_dim, nbytes, data);
}

/* Quiet logs (the sink the caller closes), train.malformed counted from
 * here; runs the net to its iteration 2, where the injections go. */
static FILE *count_malformed_from_iteration_2(net *n) {
  n->h.sink.level = GW_LOG_WARN;
  FILE *null = fopen("/dev/null", "w");
  assert_non_null(null);
  if (!verbose()) n->h.sink.fp = null;
  n->h.sink.hook = count_hook;
  malformed = 0;
  while (train_peer_iteration(n->h.nodes[n->data].tp) < 2) h_run_for(&n->h, 1);
  return null;
}

static void test_hostile_headers(void **state) {
  (void)state;
  net n;
  build(&n, 33, TRAIN_F32, TRAIN_F32, true);
  FILE *null = count_malformed_from_iteration_2(&n);
  enum { ROWS = H_B * H_T };
  uint8_t buf[ROWS * (H_C + 4) + 64];
  float x[ROWS * H_C];
  for (int i = 0; i < ROWS * H_C; i++) x[i] = (float)i;
  size_t q8 = wire_bytes(TRAIN_Q8ROW, ROWS, H_C);
  assert_int_equal(wire_encode(TRAIN_Q8ROW, x, ROWS, H_C, buf, q8), 0);
  inject_forward(&n, n.data, n.s1[0], TRAIN_Q8ROW, H_C + 4, q8 - 1, buf);     /* short */
  inject_forward(&n, n.data, n.s1[0], TRAIN_Q8ROW, H_C, q8, buf);             /* shape says C, not C + 4 */
  inject_forward(&n, n.data, n.s1[0], TRAIN_BF16, H_C, q8, buf);              /* size of another dtype */
  inject_forward(&n, n.s1[0], n.s2[1], TRAIN_Q8ROW, H_C + 4, q8, buf);         /* a dtype it does not accept */
  float nan = NAN;
  memcpy(buf + 3 * (H_C + 4), &nan, 4); /* the fourth row's scale */
  inject_forward(&n, n.data, n.s1[0], TRAIN_Q8ROW, H_C + 4, q8, buf);         /* NaN scale */
  inject_forward(&n, n.data, n.s1[0], (train_dtype)30, H_C, 4 * ROWS * H_C, x); /* unknown dtype */
  /* rotated 3-bit rows: 2 + 2 bytes each (9 bits: 7 padding bits) */
  size_t r3 = wire_bytes(TRAIN_R3ROW, ROWS, H_C), rb = r3 / ROWS;
  assert_int_equal(rb, 4);
  assert_int_equal(wire_encode(TRAIN_R3ROW, x, ROWS, H_C, buf, r3), 0);
  inject_forward(&n, n.data, n.s1[0], TRAIN_R3ROW, H_C, r3, buf);              /* shape says C, not row bytes */
  buf[2 * rb + 3] |= 0x80;                                                      /* a padding bit */
  inject_forward(&n, n.data, n.s1[0], TRAIN_R3ROW, rb, r3, buf);
  buf[2 * rb + 3] &= 0x01;
  uint16_t neg = 0xbf80u;
  memcpy(buf + 5 * rb, &neg, 2);                                                /* a negative scale */
  inject(&n, GWTF__TRAIN_MSG__TRAIN_BACKWARD, n.s2[0], n.s1[0], TRAIN_R3ROW, 3, rb, r3, buf);
  /* low rank 8: [bytes], mean first */
  uint8_t lr[512];
  size_t l8 = wire_bytes(TRAIN_LR8, ROWS, H_C);
  assert_true(l8 <= sizeof(lr));
  assert_int_equal(wire_encode(TRAIN_LR8, x, ROWS, H_C, lr, l8), 0);
  inject(&n, GWTF__TRAIN_MSG__TRAIN_FORWARD, n.data, n.s1[0], TRAIN_LR8, 3, H_C, l8, lr); /* a [B,T,C] shape */
  uint16_t inf = 0x7f80u;
  memcpy(lr + 2, &inf, 2);                                                      /* an Inf mean */
  inject(&n, GWTF__TRAIN_MSG__TRAIN_BACKWARD, n.s2[0], n.s1[0], TRAIN_LR8, 1, l8, l8, lr);
  assert_true(h_run_until_finished(&n.h, 120000));
  assert_int_equal(malformed, 11);
  assert_trained(&n);
  h_free(&n.h);
  fclose(null);
}

static void test_subspace_tokens(void **state) {
  (void)state;
  net n;
  subspace_k = 1;
  build(&n, 35, TRAIN_F32, TRAIN_F32, false);
  subspace_k = 0;
  FILE *null = count_malformed_from_iteration_2(&n);
  enum { ROWS = H_B * H_T };
  float z[ROWS], x[ROWS * H_C];
  for (int i = 0; i < ROWS; i++) z[i] = (float)i;
  for (int i = 0; i < ROWS * H_C; i++) x[i] = (float)i;
  uint8_t ids[2 * ROWS];
  for (int i = 0; i < 2 * ROWS; i++) ids[i] = (uint8_t)(i % 2 ? 0 : i); /* uint16 LE, all below 256 */
  inject_tokens = (ProtobufCBinaryData){0, NULL};
  inject_forward(&n, n.data, n.s1[0], TRAIN_F32, 1, sizeof(z), z); /* no token ids */
  inject_tokens = (ProtobufCBinaryData){2 * ROWS - 2, ids};
  inject_forward(&n, n.data, n.s1[0], TRAIN_F32, 1, sizeof(z), z); /* one id short */
  ids[3] = 1;                                                       /* id 256: past the vocabulary */
  inject_tokens = (ProtobufCBinaryData){2 * ROWS, ids};
  inject_forward(&n, n.data, n.s1[0], TRAIN_F32, 1, sizeof(z), z);
  ids[3] = 0;
  inject_forward(&n, n.data, n.s1[0], TRAIN_F32, H_C, sizeof(x), x); /* full width */
  inject_tokens = (ProtobufCBinaryData){0, NULL};
  assert_true(h_run_until_finished(&n.h, 120000));
  assert_int_equal(malformed, 4);
  /* the toy model's rows are not in the subspace, so its loss need not
   * fall through a 1-wide crossing: the run finishes, members agree */
  char why[200] = "";
  if (!h_hashes_agree(&n.h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  assert_true(isfinite(n.h.nodes[n.data].last_loss));
  uint64_t received = 0;
  for (int i = 0; i < n.h.n_nodes; i++) received += n.h.nodes[i].act_recv[TRAIN_F32];
  assert_true(received > 0);
  h_free(&n.h);
  fclose(null);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_subspace_tokens),
      cmocka_unit_test(test_negotiation),
      cmocka_unit_test(test_loss_close_to_fp32),
      cmocka_unit_test(test_hostile_headers),
      cmocka_unit_test(test_grad_dtype),
      cmocka_unit_test(test_bigger_than_fp32),
      cmocka_unit_test(test_hello_owed_goes_at_ready),
      cmocka_unit_test(test_early_tensors_counted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
