/* test/train/peer_sim_common.c — helpers shared by the simulator tests of
 * the training peer (see peer_sim_common.h). */
#include "testutil.h"

#include <math.h>

#include "peer_sim_common.h"

bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

/* ---- the direct reference: the same fake model, one process ---- */

void ref_iteration(ref_model *rm, uint64_t it, double *loss_out) {
  enum { A = H_B * H_T * H_C };
  float g[STAGES + 1][H_NP] = {{0}};
  double loss_sum = 0;
  for (uint32_t j = 0; j < M; j++) {
    int32_t tok[H_B * H_T], tgt[H_B * H_T];
    h_sample(NULL, it, j, tok, tgt);
    float x[STAGES + 1][A], emb_in[A], grad[A];
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        emb_in[i * H_C + c] = (float)tok[i] / 256.0f;
        x[0][i * H_C + c] = emb_in[i * H_C + c] * (1.0f + rm->w[0][0]) + rm->w[0][1] * (float)(c + 1);
      }
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < A; k++) x[s][k] = x[s - 1][k] * (1.0f + rm->w[s][0]) + rm->w[s][1];
    double l = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = x[STAGES][i * H_C + c] - (float)tgt[i] / 256.0f;
        l += (double)d * d;
        grad[i * H_C + c] = 2.0f * d / (float)A;
      }
    loss_sum += (float)(l / A);
    for (int s = STAGES; s >= 1; s--)
      for (int k = 0; k < A; k++) {
        g[s][0] += grad[k] * x[s - 1][k];
        g[s][1] += grad[k];
        grad[k] *= 1.0f + rm->w[s][0];
      }
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        g[0][0] += grad[i * H_C + c] * emb_in[i * H_C + c];
        g[0][1] += grad[i * H_C + c] * (float)(c + 1);
      }
  }
  for (int s = 0; s <= STAGES; s++)
    for (int k = 0; k < H_NP; k++) rm->w[s][k] -= H_LR * (g[s][k] / (float)M);
  *loss_out = loss_sum / M;
}

/* The validation loss of the reference's current weights: the same forward,
 * per-microbatch losses as floats, their mean in double. */
double ref_eval(const ref_model *rm, uint32_t n) {
  enum { A = H_B * H_T * H_C };
  double sum = 0;
  for (uint32_t j = 0; j < n; j++) {
    int32_t tok[H_B * H_T], tgt[H_B * H_T];
    h_val_sample(NULL, j, tok, tgt);
    float x[A];
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++)
        x[i * H_C + c] = (float)tok[i] / 256.0f * (1.0f + rm->w[0][0]) + rm->w[0][1] * (float)(c + 1);
    for (int s = 1; s <= STAGES; s++)
      for (int k = 0; k < A; k++) x[k] = x[k] * (1.0f + rm->w[s][0]) + rm->w[s][1];
    double l = 0;
    for (int i = 0; i < H_B * H_T; i++)
      for (int c = 0; c < H_C; c++) {
        float d = x[i * H_C + c] - (float)tgt[i] / 256.0f;
        l += (double)d * d;
      }
    sum += (float)(l / A);
  }
  return sum / n;
}

/* ---- swarms ---- */

/* One data node and two relays per stage, placed by the leader. */
int build(h_harness *h, uint64_t seed, int relays_per_stage, uint32_t relay_cap) {
  h_init(h, STAGES, seed, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int i = 0; i < STAGES * relays_per_stage; i++) h_start(h, h_add(h, TRAIN_RELAY, -1, relay_cap, 0, false));
  return d;
}

void assert_agree(h_harness *h, uint64_t iters) {
  char why[200] = "";
  if (!h_hashes_agree(h, iters, why, sizeof(why))) fail_msg("%s", why);
}

const train_counters *C(h_harness *h, int i) { return train_peer_counters(h->nodes[i].tp); }

int holder(h_harness *h, int stage, uint64_t key) {
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *r = &h->nodes[i];
    if (!r->alive || r->stage != stage) continue;
    for (int k = 0; k < 64; k++)
      if (r->states[k].used && r->states[k].key == key) return i;
  }
  return -1;
}

/* Every iteration's loss at data node d is the reference's, to float
 * rounding; the reference's final weights into *out when it is not NULL. */
void assert_losses_match_reference(h_harness *h, int d, ref_model *out) {
  ref_model rm = {{{0}}};
  for (uint64_t it = 0; it < ITERS; it++) {
    double ref, got = h->nodes[d].loss_of[it];
    ref_iteration(&rm, it, &ref);
    if (fabs(got - ref) > 1e-5 * fmax(1.0, fabs(ref)))
      fail_msg("iter %llu loss %.9f, reference %.9f", (unsigned long long)it, got, ref);
  }
  if (out) *out = rm;
}

/* ---- crashes ---- */

/* Crash the stage-`stage` relay that carried a microbatch when its loss is
 * computed, i.e. after its forward and before its backward. */
bool crash_stage_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash, int stage) {
  if (job->kind != TRAIN_JOB_LOSS || train_peer_iteration(n->tp) != 2) return false;
  for (int i = 0; i < h->n_nodes; i++) {
    h_node *r = &h->nodes[i];
    if (!r->alive || r->stage != stage) continue;
    for (int k = 0; k < 64; k++)
      if (r->states[k].used && r->states[k].key == job->key) {
        *crash = i;
        return true;
      }
  }
  return false;
}

bool crash_before_backward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  return crash_stage_before_backward(h, n, job, crash, 2);
}

/* How long a data node waits for a microbatch's backward after its loss. */
uint64_t trip_deadline_ms(const h_harness *h) { return h->tun.hop_timeout_ms * (uint64_t)(h->n_stages + 2); }
