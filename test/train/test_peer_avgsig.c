/* The aggregator's signature over the stage's average (issue 17, item 3).
 *   - the signed body: a signature verifies only over the exact fields it
 *     was made over (run, stage, iteration, counts, length, each
 *     contributor and its hash, the average's hash) and only with the
 *     signer's key;
 *   - on the deterministic harness, every time stage 2's aggregator sends
 *     its average, forged copies for the same round reach the member first:
 *     from a connected member that does not aggregate, and on the
 *     aggregator's own session (what a relay of its average could hand on):
 *     NaN with a made-up signature, a plausible vector with a made-up
 *     signature, the forger's real signature over another hash, and the
 *     aggregator's real signature with other floats. No member applies any
 *     of them: every stage agrees after every iteration, every peer's
 *     weights and the losses equal those of the same run unattacked, and
 *     the members count what they refused. */
#include "testutil.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "peer_harness.h"
#include "train.pb-c.h"
#include "train/avg_sig.h"
#include "util/err.h"

#define M 4
#define ITERS 8
#define STAGES 2
#define PER_STAGE 3

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

/* ---- the signed body ---- */

static void test_signature_covers_every_field(void **state) {
  (void)state;
  uint8_t seed[32], pk[32], sk[64], other_pk[32], other_sk[64], sig[64];
  memset(seed, 3, sizeof(seed));
  crypto_sign_seed_keypair(pk, sk, seed);
  seed[0] = 4;
  crypto_sign_seed_keypair(other_pk, other_sk, seed);
  gw_id run, ids[3];
  uint8_t hashes[3][32], avg_hash[32];
  gw_id_hash_str("run/x", &run);
  for (int i = 0; i < 3; i++) {
    memset(ids[i].b, 0x10 + i, sizeof(ids[i].b));
    memset(hashes[i], 0x20 + i, 32);
  }
  float v[5] = {1, 2, 3, 4, 5};
  avg_sig_hash_floats(v, 5, avg_hash);
  avg_sig_fields f = {.run_id = run.b, .stage = 2, .iteration = 7, .total_count = 9, .n_floats = 5,
                      .contributors = ids, .hashes = (const uint8_t(*)[32])hashes, .n_contributors = 3,
                      .avg_hash = avg_hash};
  assert_int_equal(avg_sig_sign(&f, sk, sig), 0);
  assert_int_equal(avg_sig_verify(&f, pk, sig), 0);
  assert_int_equal(avg_sig_verify(&f, other_pk, sig), GW_EAUTH); /* another key */
  /* each field, changed, breaks it */
  avg_sig_fields g;
  gw_id run2;
  gw_id_hash_str("run/y", &run2);
  g = f, g.run_id = run2.b;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  g = f, g.stage = 1;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  g = f, g.iteration = 8;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  g = f, g.total_count = 10;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  g = f, g.n_floats = 4;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  g = f, g.n_contributors = 2; /* one left out */
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  gw_id swapped[3] = {ids[1], ids[0], ids[2]}; /* another order */
  g = f, g.contributors = swapped;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  uint8_t h2[3][32];
  memcpy(h2, hashes, sizeof(h2));
  h2[2][31] ^= 1;
  g = f, g.hashes = (const uint8_t(*)[32])h2;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  float w[5] = {1, 2, 3, 4, 5.0001f};
  uint8_t wh[32];
  avg_sig_hash_floats(w, 5, wh);
  g = f, g.avg_hash = wh;
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EAUTH);
  sig[10] ^= 0x40;
  assert_int_equal(avg_sig_verify(&f, pk, sig), GW_EAUTH);
  /* the key stands for its node ID */
  gw_id id, want;
  avg_sig_signer_id(pk, &id);
  gw_id_hash(pk, 32, &want);
  assert_true(gw_id_eq(&id, &want));
  /* a list past the limit is never signed nor verified */
  gw_id many[AVG_SIG_MAX_CONTRIB + 1];
  memset(many, 0, sizeof(many));
  g = f, g.contributors = many, g.hashes = NULL, g.n_contributors = AVG_SIG_MAX_CONTRIB + 1;
  assert_int_equal(avg_sig_sign(&g, sk, sig), GW_EINVAL);
  assert_int_equal(avg_sig_verify(&g, pk, sig), GW_EINVAL);
}

/* ---- forged copies on the harness ---- */

typedef struct attack {
  bool on;
  int agg, forger; /* node indices: stage 2's aggregator, a stage-2 member that is not */
  int stranger;    /* a connected peer in no stage */
  uint64_t injected;
} attack;

static void pack_send(h_harness *h, int from, int to, const Gwtf__TrainGrad *g, const float *v, size_t n) {
  uint8_t body[8192];
  assert_true(gwtf__train_grad__get_packed_size(g) <= sizeof(body));
  size_t len = gwtf__train_grad__pack(g, body);
  train_tensor t = {.dtype = TRAIN_F32, .ndim = 1, .shape = {n}, .data = v, .nbytes = n * sizeof(float)};
  assert_int_equal(h_inject(h, from, to, GWTF__TRAIN_MSG__TRAIN_AVG, body, len, &t), 0);
}

/* The forged copies of the average g (floats v) that `to` is about to get,
 * each from `from`. */
static void forge(h_harness *h, attack *at, int from, int to, const Gwtf__TrainGrad *g, const float *v, size_t n) {
  float nan_v[H_NP], wild[H_NP];
  for (size_t k = 0; k < n; k++) {
    nan_v[k] = NAN;
    wild[k] = v[k] * 1000.0f + 1.0f;
  }
  uint8_t made_up[64], hash_nan[32], hash_wild[32];
  memset(made_up, 0x5a, sizeof(made_up));
  avg_sig_hash_floats(nan_v, n, hash_nan);
  avg_sig_hash_floats(wild, n, hash_wild);
  Gwtf__TrainGrad f = *g;
  /* NaN, then a plausible vector, each with the aggregator's key, its own
   * hash and a made-up signature */
  f.avg_hash = (ProtobufCBinaryData){32, hash_nan};
  f.avg_sig = (ProtobufCBinaryData){64, made_up};
  pack_send(h, from, to, &f, nan_v, n);
  f.avg_hash = (ProtobufCBinaryData){32, hash_wild};
  pack_send(h, from, to, &f, wild, n);
  /* the forger's real signature over the plausible vector's hash */
  gw_id ids[64];
  uint8_t hs[64][32], sig[64];
  assert_true(g->n_contributors <= 64 && g->n_contributor_hashes == g->n_contributors);
  for (size_t i = 0; i < g->n_contributors; i++) {
    memcpy(ids[i].b, g->contributors[i].data, 32);
    memcpy(hs[i], g->contributor_hashes[i].data, 32);
  }
  avg_sig_fields sf = {.run_id = h_run_id()->b, .stage = g->stage, .iteration = g->iteration,
                       .total_count = g->total_count, .n_floats = g->total, .contributors = ids,
                       .hashes = (const uint8_t(*)[32])hs, .n_contributors = (uint32_t)g->n_contributors,
                       .avg_hash = hash_wild};
  assert_int_equal(avg_sig_sign(&sf, h->nodes[at->forger].sk, sig), 0);
  f.avg_key = (ProtobufCBinaryData){32, h->nodes[at->forger].pk};
  f.avg_sig = (ProtobufCBinaryData){64, sig};
  pack_send(h, from, to, &f, wild, n);
  /* the aggregator's real signature (its own header, untouched) with other floats */
  pack_send(h, from, to, g, wild, n);
  at->injected += 4;
}

/* Every first chunk of an average stage 2's aggregator sends: forged copies
 * go first, on its session and from the forger and the stranger. */
static void on_send(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                    const train_tensor *t) {
  attack *at = h->hook_ud;
  if (!at->on || from != at->agg || type != GWTF__TRAIN_MSG__TRAIN_AVG || !t || t->nbytes != H_NP * sizeof(float))
    return;
  Gwtf__TrainGrad *g = gwtf__train_grad__unpack(NULL, len, body);
  assert_non_null(g);
  if (g->offset == 0 && g->avg_sig.len == 64) {
    float v[H_NP];
    memcpy(v, t->data, sizeof(v));
    forge(h, at, at->agg, to, g, v, H_NP);
    if (to != at->forger) forge(h, at, at->forger, to, g, v, H_NP);
    forge(h, at, at->stranger, to, g, v, H_NP);
  }
  gwtf__train_grad__free_unpacked(g, NULL);
}

typedef struct outcome {
  float w[H_MAX_NODES][H_NP];
  double loss[ITERS];
  uint64_t forged[H_MAX_NODES], injected;
  int n;
} outcome;

static void run(bool attacked, outcome *o) {
  h_harness h;
  h_init(&h, STAGES, 31, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < PER_STAGE; k++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  attack at = {.on = attacked};
  at.stranger = h_add(&h, TRAIN_RELAY, -1, M, 0, false); /* connected, never started: in no stage */
  for (int i = 0; i < at.stranger; i++) h_start(&h, i);
  int s2[8];
  assert_int_equal(h_by_id(&h, 2, s2, 8), PER_STAGE);
  at.agg = s2[0];
  at.forger = s2[1];
  h.hook_ud = &at;
  h.send_hook = on_send;
  assert_true(h_run_until_finished(&h, 600000));
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  char why[200] = "";
  if (!h_hashes_agree(&h, ITERS, why, sizeof(why))) fail_msg("%s", why);
  memset(o, 0, sizeof(*o));
  o->n = h.n_nodes;
  o->injected = at.injected;
  for (int it = 0; it < ITERS; it++) o->loss[it] = h.nodes[d].loss_of[it];
  for (int i = 0; i < h.n_nodes; i++) {
    memcpy(o->w[i], h.nodes[i].w, sizeof(o->w[i]));
    if (i != at.stranger) o->forged[i] = train_peer_counters(h.nodes[i].tp)->averages_forged;
  }
  if (attacked) {
    /* the members of stage 2 refused what reached their checks: the copies
     * on the aggregator's session and, for the aggregator, the forger's */
    for (int k = 0; k < PER_STAGE; k++)
      if (verbose()) fprintf(stderr, "stage-2 member %d refused %llu averages for their signature\n", k,
                             (unsigned long long)o->forged[s2[k]]);
    for (int k = 1; k < PER_STAGE; k++) assert_true(o->forged[s2[k]] >= 4 * (ITERS - 1));
  }
  h_free(&h);
}

static void test_forged_averages_are_applied_by_nobody(void **state) {
  (void)state;
  static outcome base, attacked;
  run(false, &base);
  run(true, &attacked);
  /* per round: 4 copies on the aggregator's session and 4 from the stranger to each
   * of the 2 members, 4 from the forger to the other one */
  assert_true(attacked.injected >= 20 * (ITERS - 1));
  assert_int_equal(base.n, attacked.n);
  /* The same steps: a relay sums its microbatches' gradients in the order
   * they arrive, which the extra messages shift, so the bits may differ in
   * the last place; one forged step would move a weight by ~100 (1000 x the
   * learning rate). */
  for (int i = 0; i < base.n; i++) {
    assert_int_equal(base.forged[i], 0); /* an honest run refuses nothing */
    for (int k = 0; k < H_NP; k++)
      if (fabsf(base.w[i][k] - attacked.w[i][k]) > 1e-5f * fmaxf(1.0f, fabsf(base.w[i][k])))
        fail_msg("node %d weight %d: %.9g unattacked, %.9g attacked", i, k, base.w[i][k], attacked.w[i][k]);
  }
  for (int it = 0; it < ITERS; it++)
    if (fabs(base.loss[it] - attacked.loss[it]) > 1e-5 * fmax(1.0, fabs(base.loss[it])))
      fail_msg("iteration %d: loss %.9f unattacked, %.9f attacked", it, base.loss[it], attacked.loss[it]);
}

int main(void) {
  if (sodium_init() < 0) {
    fprintf(stderr, "libsodium would not start: skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_signature_covers_every_field),
      cmocka_unit_test(test_forged_averages_are_applied_by_nobody),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
