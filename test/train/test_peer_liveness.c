/* Failure detection from measured RTTs (train/peer_liveness.c) and the
 * load-aware fallback (train/route_flow.c), on the peer harness: a next hop
 * that hangs without its session dropping is declared failed after a few
 * RTTs and a probe it leaves unanswered, not after the fixed hop timeout; a
 * next hop that is only slow answers its probes and is never declared
 * failed; the fallback sends a microbatch to the cheapest peer after load
 * (its link's queue, our microbatches there, DENY full). */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "peer_harness.h"
#include "train.pb-c.h"
#include "train/route_flow.h"
#include "util/err.h"

#define M 4
#define ITERS 4
#define STAGES 3
#define FLOOR_MS 20 /* the harness's RTTs are 2-6 ms: k x RTT, not the floor, decides */

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }
static const train_counters *C(h_harness *h, int i) { return train_peer_counters(h->nodes[i].tp); }

/* 1 data node, `per` relays in each of STAGES stages, placed at start. */
static int build(h_harness *h, uint64_t seed, int per, bool links) {
  h_init(h, STAGES, seed, verbose());
  h->no_links = !links;
  h->tun.live_floor_ms = FLOOR_MS;
  h->tun.live_rto_k = 4;
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < per; k++) h_start(h, h_add(h, TRAIN_RELAY, s, M, 0, true));
  return d;
}

/* ---- a relay that hangs ---- */

typedef struct hang {
  int victim;
  uint64_t at_ms;
} hang;

/* The stage-2 relay hangs as it starts a forward in iteration 1: the
 * stage-1 relay that sent it waits on it. */
static bool hang_on_forward(h_harness *h, h_node *n, const train_job *job, int *crash) {
  hang *g = h->hook_ud;
  if (job->kind != TRAIN_JOB_FORWARD || n->stage != 2 || train_peer_iteration(n->tp) != 1) return false;
  *crash = (int)(n - h->nodes);
  g->victim = *crash;
  g->at_ms = sim_now(h->s);
  return true;
}

static uint64_t stage_sum(h_harness *h, int stage, uint64_t (*field)(const train_counters *)) {
  uint64_t n = 0;
  for (int i = 0; i < h->n_nodes; i++)
    if (h->nodes[i].stage == stage && h->nodes[i].alive && !h->nodes[i].silent) n += field(C(h, i));
  return n;
}
static uint64_t f_rerouted(const train_counters *c) { return c->forward_rerouted; }
static uint64_t f_probes_failed(const train_counters *c) { return c->probes_failed; }
static uint64_t f_probes_sent(const train_counters *c) { return c->probes_sent; }

/* How long after the hang the stage-1 relay re-routed (ms); the run then
 * finishes. */
static uint64_t time_to_reroute(bool links, h_harness *h, int *d, hang *g) {
  *d = build(h, 11, 2, links);
  h->hook = hang_on_forward;
  h->hook_ud = g;
  h->hook_silences = true;
  while (!h->hook_fired && sim_now(h->s) < 60000) h_run_for(h, 1);
  assert_true(h->hook_fired);
  while (stage_sum(h, 1, f_rerouted) == 0 && sim_now(h->s) < g->at_ms + 10000) h_run_for(h, 1);
  assert_true(stage_sum(h, 1, f_rerouted) >= 1);
  uint64_t took = sim_now(h->s) - g->at_ms;
  print_message("%s: re-routed %llu ms after the hang\n", links ? "rtt" : "fixed", (unsigned long long)took);
  assert_true(h_run_until_finished(h, 300000));
  return took;
}

static void test_hung_next_hop_fails_after_rtts(void **state) {
  (void)state;
  h_harness h;
  hang g = {-1, 0};
  int d;
  uint64_t took = time_to_reroute(true, &h, &d, &g);
  /* a deadline of k x (srtt + 4 rttvar) (tens of ms here), then a probe of
   * the same: far under the hop timeout (500 ms; 3x that once received) */
  assert_true(took < h.tun.hop_timeout_ms / 2);
  assert_true(stage_sum(&h, 1, f_probes_failed) >= 1);
  assert_true(h.nodes[g.victim].silent);
  /* nothing lost: every microbatch went round another way */
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->lost_microbatches + C(&h, d)->deferred_microbatches, 0);
  h_free(&h);
}

/* The same hang with no RTTs to go by (a driver without train_io.link):
 * the fixed hop timeout, as before. */
static void test_without_rtts_the_hop_timeout_decides(void **state) {
  (void)state;
  h_harness h;
  hang g = {-1, 0};
  int d;
  uint64_t took = time_to_reroute(false, &h, &d, &g);
  assert_true(took >= h.tun.hop_timeout_ms);
  assert_int_equal(stage_sum(&h, 1, f_probes_sent), 0);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  h_free(&h);
}

/* ---- a relay that is only slow ---- */

/* From iteration 1 on, the only stage-2 relay takes 300 ms per job (its
 * HELLO still claims the ~5 ms it measured before): its upstream and
 * downstream miss their RTT deadlines and probe it, it answers, and nobody
 * declares it failed: no re-route, no repair, nothing deferred. */
static void test_slow_next_hop_answers_probes(void **state) {
  (void)state;
  h_harness h;
  int d = build(&h, 12, 1, true);
  int slow = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 2) slow = i;
  assert_true(slow >= 0);
  while (h.nodes[d].iterations_done < 1 && sim_now(h.s) < 60000) h_run_for(&h, 1);
  h.nodes[slow].job_ms = 300;
  assert_true(h_run_until_finished(&h, 300000));
  uint64_t probes = 0, failed = 0, rerouted = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    probes += C(&h, i)->probes_sent;
    failed += C(&h, i)->probes_failed;
    rerouted += C(&h, i)->forward_rerouted;
  }
  print_message("probes %llu, failed %llu\n", (unsigned long long)probes, (unsigned long long)failed);
  assert_true(stage_sum(&h, 1, f_probes_sent) >= 1); /* it was suspected... */
  assert_true(probes >= 1);
  assert_int_equal(failed, 0);                        /* ...and answered */
  assert_int_equal(rerouted, 0);
  assert_int_equal(C(&h, d)->repairs_started, 0);
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->lost_microbatches + C(&h, d)->deferred_microbatches, 0);
  h_free(&h);
}

/* train_peer_next_load: a crashed next hop and a hung one that failed its
 * probe are gone; a live one counts what we have outstanding there. */
static void test_next_load_sees_gone_peers(void **state) {
  (void)state;
  h_harness h;
  hang g = {-1, 0};
  int d;
  (void)time_to_reroute(true, &h, &d, &g);
  /* the stage-1 relay that probed the hung one */
  int up = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1 && C(&h, i)->probes_failed > 0) up = i;
  assert_true(up >= 0);
  train_load l;
  assert_int_equal(train_peer_next_load(h.nodes[up].tp, &h.nodes[g.victim].peer.id, &l), -1);
  int other = -1;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 2 && i != g.victim) other = i;
  assert_int_equal(train_peer_next_load(h.nodes[up].tp, &h.nodes[other].peer.id, &l), 0);
  assert_int_equal(l.capacity, M);
  assert_int_equal(l.outstanding, 0); /* the run is over: nothing of ours is there */
  h_crash(&h, other);
  assert_int_equal(train_peer_next_load(h.nodes[up].tp, &h.nodes[other].peer.id, &l), -1);
  h_free(&h);
}

/* ---- how long a DENY full counts ---- */

/* The data node's view of stage 1 (two relays of one slot each, every
 * relay 100 ms a job, so a stage-1 slot is held about 0.6 s per
 * microbatch): after a DENY full from one, next_load calls it full until a
 * slot is likely free again, the hold time per slot, and no longer. Before,
 * it was full for two ticks (0.2 s), and the data node's next microbatch
 * went to the same full peer. */
typedef struct full_watch {
  int data;
  uint64_t denied_at[8]; /* by node index: its last DENY full to the data node (0: none) */
} full_watch;

static void note_full_deny(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                           const train_tensor *t) {
  full_watch *w = h->hook_ud;
  (void)t;
  if (type != GWTF__TRAIN_MSG__TRAIN_DENY || to != w->data || from >= 8) return;
  Gwtf__TrainAck *a = gwtf__train_ack__unpack(NULL, len, body);
  if (a && a->reason && strcmp(a->reason, "full") == 0) w->denied_at[from] = sim_now(h->s) + 3; /* arrives within 3 ms */
  gwtf__train_ack__free_unpacked(a, NULL);
}

/* 1 data node; stage 1: two relays of one slot; the later stages one relay
 * of M; every relay 100 ms a job. The data node's index. */
static int build_full_stage(h_harness *h, uint32_t slot_wait) {
  h_init(h, STAGES, 41, verbose());
  h->tun.slot_wait = slot_wait;
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < (s == 1 ? 2 : 1); k++) {
      int r = h_add(h, TRAIN_RELAY, s, s == 1 ? 1 : M, 0, true);
      h->nodes[r].job_ms = 100;
      h_start(h, r);
    }
  return d;
}

static void test_full_lasts_a_slot_turnover(void **state) {
  (void)state;
  h_harness h;
  full_watch w = {0};
  int d = build_full_stage(&h, 0); /* every "full" a DENY: the memory of one is what is tested */
  w.data = d;
  h.hook_ud = &w;
  h.send_hook = note_full_deny;
  int still_full = 0;
  while (!train_peer_finished(h.nodes[d].tp) && sim_now(h.s) < 120000) {
    h_run_for(&h, 1);
    if (train_peer_iteration(h.nodes[d].tp) < 1) continue; /* a hold measured first */
    for (int i = 0; i < h.n_nodes && i < 8; i++) {
      if (!w.denied_at[i] || sim_now(h.s) < w.denied_at[i]) continue;
      uint64_t since = sim_now(h.s) - w.denied_at[i];
      train_load l;
      if (since != 400) continue;
      assert_int_equal(train_peer_next_load(h.nodes[d].tp, &h.nodes[i].peer.id, &l), 0);
      assert_true(l.full); /* a slot there is held ~0.6 s: not free yet */
      still_full++;
    }
  }
  assert_true(train_peer_finished(h.nodes[d].tp));
  assert_true(still_full >= 1);
  /* well past a turnover, with nothing sent since: not full any more */
  h_run_for(&h, 2000);
  int denied = 0;
  for (int i = 0; i < h.n_nodes && i < 8; i++) {
    train_load l;
    if (!w.denied_at[i]) continue;
    denied++;
    assert_int_equal(train_peer_next_load(h.nodes[d].tp, &h.nodes[i].peer.id, &l), 0);
    assert_false(l.full);
  }
  assert_true(denied >= 1);
  h_free(&h);
}

/* ---- a full stage keeps microbatches waiting ---- */

/* The scene above (stage 1: two relays of one slot, 100 ms a job), in which
 * the data node's four microbatches cannot all be in stage 1 at once. A
 * relay that keeps the one it cannot take yet (FORWARD "wait_for_slot",
 * FORWARD_RECEIVED "queued") starts it the moment its slot frees; told
 * "full", the data node sent it again and again, a round trip each, and it
 * took the slot only when a retry came after the slot freed. */
typedef struct full_count {
  int data;
  uint32_t forwards, full;   /* FORWARDs the data node sent; DENY full it got */
  uint32_t queued, started;  /* FORWARD_RECEIVED "queued", and then "" for those */
} full_count;

static void count_full(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                       const train_tensor *t) {
  full_count *w = h->hook_ud;
  (void)t;
  if (from == w->data && type == GWTF__TRAIN_MSG__TRAIN_FORWARD) w->forwards++;
  if (to != w->data || (type != GWTF__TRAIN_MSG__TRAIN_DENY && type != GWTF__TRAIN_MSG__TRAIN_FORWARD_RECEIVED))
    return;
  Gwtf__TrainAck *a = gwtf__train_ack__unpack(NULL, len, body);
  if (!a) return;
  bool queued = a->reason && strcmp(a->reason, "queued") == 0;
  if (type == GWTF__TRAIN_MSG__TRAIN_DENY) w->full += a->reason && strcmp(a->reason, "full") == 0;
  else w->queued += queued;
  gwtf__train_ack__free_unpacked(a, NULL);
}

/* Runs the scene with relays keeping up to slot_wait microbatches waiting;
 * the virtual ms the data node took for its ITERS iterations. */
static uint64_t run_full_stage(uint32_t slot_wait, full_count *w, uint64_t *slot_waits) {
  h_harness h;
  int d = build_full_stage(&h, slot_wait);
  memset(w, 0, sizeof(*w));
  w->data = d;
  h.hook_ud = w;
  h.send_hook = count_full;
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *c = C(&h, d);
  assert_int_equal(c->microbatches_done, (uint64_t)M * ITERS); /* none lost, none deferred */
  *slot_waits = 0;
  for (int i = 0; i < h.n_nodes; i++) {
    if (h.nodes[i].stage != 1) continue;
    *slot_waits += C(&h, i)->slot_waits;
    assert_int_equal(C(&h, i)->repair_reserve_used, 0); /* a waiting one never took a slot over capacity */
  }
  uint64_t t = sim_now(h.s);
  h_free(&h);
  return t;
}

static void test_full_stage_keeps_microbatches_waiting(void **state) {
  (void)state;
  full_count deny, wait;
  uint64_t waits_deny, waits_wait;
  uint64_t t_deny = run_full_stage(0, &deny, &waits_deny);
  uint64_t t_wait = run_full_stage(2, &wait, &waits_wait);
  printf("DENY full: %llu ms, %u FORWARDs, %u full; waiting: %llu ms, %u FORWARDs, %u full, %u queued, "
         "%llu waited at stage 1\n",
         (unsigned long long)t_deny, deny.forwards, deny.full, (unsigned long long)t_wait, wait.forwards, wait.full,
         wait.queued, (unsigned long long)waits_wait);
  assert_int_equal(waits_deny, 0);
  assert_int_equal(deny.queued, 0);
  assert_true(deny.full > 0);
  /* the relays kept what came while they were full ... */
  assert_true(waits_wait > 0);
  assert_int_equal(wait.queued, waits_wait);
  /* ... so the data node sent each microbatch about once */
  assert_true(wait.full < deny.full);
  assert_true(wait.forwards < deny.forwards);
  assert_true(wait.forwards <= (uint32_t)(M * ITERS) + wait.full);
  assert_true(t_wait < t_deny);
}

/* ---- the fallback: cost plus load ---- */

static gw_id ids[3];
static train_load loads[3];
static int gone_mask;

static int fake_load(void *ud, const gw_id *peer, train_load *out) {
  (void)ud;
  for (int i = 0; i < 3; i++)
    if (gw_id_eq(peer, &ids[i])) {
      if (gone_mask & (1 << i)) return -1;
      *out = loads[i];
      return 0;
    }
  return -1;
}

static int nop_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  (void)ud, (void)to, (void)buf, (void)len;
  return 0;
}
static void nop_tick(void *ud, uint64_t at) { (void)ud, (void)at; }
static void nop_random(void *ud, void *buf, size_t len) {
  (void)ud;
  memset(buf, 7, len);
}

static gw_id pick(train_router *t) {
  gw_id origin, out;
  uint64_t fl = 1;
  gw_id_hash_str("origin", &origin);
  assert_int_equal(t->next_hop(t->ctx, &origin, NULL, 0, 0, NULL, 0, &out, &fl), 0);
  assert_int_equal(fl, 0); /* off the flows */
  return out;
}

static void test_fallback_weighs_cost_and_load(void **state) {
  (void)state;
  for (int i = 0; i < 3; i++) {
    char name[8];
    snprintf(name, sizeof(name), "n%d", i);
    gw_id_hash_str(name, &ids[i]);
  }
  flow_config fc;
  flow_config_default(&fc);
  gw_id_hash_str("origin", &fc.self);
  fc.role = FLOW_DATA;
  fc.stage = 0;
  fc.n_stages = STAGES;
  fc.capacity = 4;
  fc.io = (gw_io){.send = nop_send, .want_tick = nop_tick, .random = nop_random};
  flow *f = NULL;
  assert_int_equal(flow_new(&fc, &f), 0);
  route_flow r;
  route_flow_init(&r, STAGES, NULL);
  route_flow_attach(&r, f, 0);
  train_router t = route_flow_router(&r);
  double costs[3] = {10, 12, 30};
  route_flow_set_next(&r, ids, costs, 3);
  /* no flows, no load known: the cheapest, as before */
  gw_id got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[0]));
  /* n0 has 3 of ours queued at 5 ms each: 10 + 15 > 12 */
  route_flow_set_load(&r, fake_load, NULL);
  loads[0] = (train_load){.outstanding = 3, .capacity = 4, .compute_ms = 5};
  loads[1] = (train_load){.outstanding = 0, .capacity = 4, .compute_ms = 5};
  loads[2] = (train_load){.outstanding = 0, .capacity = 4, .compute_ms = 5};
  got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[1]));
  /* n1 just said DENY full: last resort; n0 (25) beats n2 (30) */
  loads[1].full = true;
  got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[0]));
  /* n0 gone (session lost, or a probe unanswered): n2, not the full n1 */
  gone_mask = 1;
  got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[2]));
  /* only the full one left: still a next hop (its slots may free) */
  gone_mask = 1 | 4;
  got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[1]));
  gone_mask = 7;
  gw_id origin, out;
  uint64_t fl;
  gw_id_hash_str("origin", &origin);
  assert_int_equal(t.next_hop(t.ctx, &origin, NULL, 0, 0, NULL, 0, &out, &fl), GW_ENOENT);
  /* a full peer is one whose slots we fill ourselves, too */
  gone_mask = 0;
  loads[1].full = false;
  loads[1].outstanding = 4;
  train_load l;
  assert_true(route_flow_score(&r, &ids[1], 12, &l) > 1e5);
  /* a transfer queued on the link to n0 goes first: 10 + 50 > 30 */
  gone_mask = 2;
  loads[0] = (train_load){.outstanding = 0, .capacity = 4, .compute_ms = 5, .queue_ms = 50};
  got = pick(&t);
  assert_true(gw_id_eq(&got, &ids[2]));
  flow_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hung_next_hop_fails_after_rtts),
      cmocka_unit_test(test_without_rtts_the_hop_timeout_decides),
      cmocka_unit_test(test_slow_next_hop_answers_probes),
      cmocka_unit_test(test_next_load_sees_gone_peers),
      cmocka_unit_test(test_full_lasts_a_slot_turnover),
      cmocka_unit_test(test_full_stage_keeps_microbatches_waiting),
      cmocka_unit_test(test_fallback_weighs_cost_and_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
