/* The training protocol in one process, on the deterministic simulator:
 * forwards lost past one or two deaths (sent again, not waited out; not
 * when a live peer holds them), a microbatch dropped past a death, the
 * probe walk (a break reported during another's walk is taken when that
 * walk is cancelled; the walk steps past a dead re-send source; a stale
 * DENY keeps the repair), a gradient reaching a sender that re-routed, a
 * lost self-repair repaired again, a second break with its own repair
 * (also when a replacement reports it), the spare copy of a re-route
 * dropped, the last relay dying after passing the gradient on. Backward
 * repairs themselves, and the SWARM baseline's restart, are in
 * test_peer_repair.c. */
#include "testutil.h"

#include "util/rng.h"

#include "peer_harness.h"
#include "peer_sim_common.h"
#include "train.pb-c.h"

/* Iteration 2: stages 1 and 2 of a microbatch's path die as its loss is
 * computed, so its data node re-sends its own embedding into the gap; then
 * the peer after the gap (stage 3) dies as the gap is recomputed, and the
 * repaired backward never comes. */
typedef struct gap_crash {
  int phase, target; /* target: the stage-3 relay after the gap */
  uint64_t key;
} gap_crash;

static bool crash_gap_then_target(h_harness *h, h_node *n, const train_job *job, int *crash) {
  gap_crash *g = h->hook_ud;
  if (train_peer_iteration(n->tp) != 2) return false;
  if (g->phase == 0 && job->kind == TRAIN_JOB_LOSS) {
    int s1 = holder(h, 1, job->key), s2 = holder(h, 2, job->key);
    g->target = holder(h, 3, job->key);
    if (s1 < 0 || s2 < 0 || g->target < 0) return false;
    g->key = job->key;
    /* crashed here, not through *crash: the harness runs a hook until it first fires */
    h_crash(h, s1);
    h_crash(h, s2);
    g->phase = 1;
    return false;
  }
  if (g->phase == 1 && job->kind == TRAIN_JOB_FORWARD && n->stage == 2 && job->key == g->key) {
    *crash = g->target;
    g->phase = 2;
    return true;
  }
  return false;
}

/* A data node and two relays per stage, placed; the relays of stage
 * `slow_stage` (0: none) take 60 ms a job. */
static int build_two_per_stage(h_harness *h, int slow_stage) {
  h_init(h, STAGES, 3, verbose());
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= STAGES; s++)
    for (int k = 0; k < 2; k++) {
      int r = h_add(h, TRAIN_RELAY, s, M, 0, true);
      if (s == slow_stage) h->nodes[r].job_ms = 60;
      h_start(h, r);
    }
  return d;
}

/* Every microbatch of the run completed, iteration 2 within a trip
 * deadline, with the reference's losses and one set of weights per stage. */
static void assert_iteration2_whole(h_harness *h, int d) {
  const train_counters *dc = C(h, d);
  assert_int_equal(dc->deferred_microbatches + dc->lost_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_true(h->nodes[d].secs_of[2] * 1000.0 < (double)trip_deadline_ms(h));
  assert_losses_match_reference(h, d, NULL);
  assert_agree(h, ITERS);
}

/* The first FORWARD of iteration 2 from a stage-`stage` relay to the next
 * stage: who sent it, to whom, when; the relays of the stage after the
 * receiver's are offered to nobody for `unroute_ms` from then. */
typedef struct forward_seen {
  int stage, unroute_ms;
  int from, to;
  uint64_t at;
} forward_seen;

static void note_forward(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                         const train_tensor *t) {
  (void)body, (void)len, (void)t;
  forward_seen *f = h->hook_ud;
  if (f->at || type != GWTF__TRAIN_MSG__TRAIN_FORWARD || h->nodes[from].stage != f->stage ||
      h->nodes[to].stage != f->stage + 1 || train_peer_iteration(h->nodes[from].tp) != 2)
    return;
  f->from = from, f->to = to, f->at = sim_now(h->s);
  for (int i = 0; f->unroute_ms && i < h->n_nodes; i++)
    if (h->nodes[i].stage == f->stage + 2) h->nodes[i].unrouted_until = f->at + (uint64_t)f->unroute_ms;
}

/* Runs until `after_ms` past that FORWARD. */
static void run_past_forward(h_harness *h, forward_seen *f, uint64_t after_ms) {
  h->hook_ud = f;
  h->send_hook = note_forward;
  while (!f->at || sim_now(h->s) < f->at + after_ms) {
    h_run_for(h, 1);
    assert_true(sim_now(h->s) < 60000);
  }
  h->send_hook = NULL;
}

/* Iteration 2: a microbatch's stage-2 relay has passed it on to stage 3
 * (its stage-1 relay holds FORWARD_DONE), and both die before stage 3's
 * forward ends, as churn kills several peers at once. Nobody holds the
 * forward. Stage 1 tells the data node its next hop is gone
 * (forward.at_risk), and the data node sends the microbatch again once a
 * hop timeout more than its slowest recent forward has passed
 * (forward.lost): every microbatch completes in its iteration, within a
 * trip deadline. Before, the data node waited out the trip deadline (a hop
 * timeout per stage) and deferred it. */
/* Kills the stage-2 relay (and, `both`, the stage-3 relay it passed the
 * microbatch to) 12 ms after the forward left it; returns the data node's
 * counters' restarts, checks what holds either way. */
static uint64_t run_forward_kill(bool both) {
  h_harness h;
  int d = build_two_per_stage(&h, 3); /* stage 3's forward outlasts the acknowledgements before it */
  forward_seen k = {.stage = 2};
  run_past_forward(&h, &k, 12);
  h_crash(&h, k.from);
  if (both) h_crash(&h, k.to);
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *dc = C(&h, d);
  uint64_t reported = 0, restarted = dc->forwards_restarted;
  for (int i = 0; i < h.n_nodes; i++)
    if (h.nodes[i].stage == 1) reported += C(&h, i)->forwards_at_risk;
  if (verbose())
    fprintf(stderr, "%s: stage 1 reported %llu, data node took %llu, restarted %llu; iteration 2 %.3f s\n",
            both ? "both" : "stage 2 only", (unsigned long long)reported, (unsigned long long)dc->forwards_at_risk,
            (unsigned long long)restarted, h.nodes[d].secs_of[2]);
  assert_true(reported >= 1);
  assert_iteration2_whole(&h, d);
  h_free(&h);
  return restarted;
}

static void test_forward_lost_past_two_deaths_is_sent_again(void **state) {
  (void)state;
  assert_true(run_forward_kill(true) >= 1);
}

/* Only the stage-2 relay dies: the stage-3 relay holds the microbatch and
 * said so (its early gap report), and nothing is sent again. */
static void test_forward_past_one_death_is_not_sent_again(void **state) {
  (void)state;
  assert_int_equal(run_forward_kill(false), 0);
}

/* Stage 1's relay passes a microbatch of iteration 2 on to stage 2 and
 * dies 8 ms later; stage 2's relay finds no hop in stage 3 for the next
 * 800 ms (its directory lags), longer than its wait for one, and drops the
 * microbatch. With the peer before it gone, its DENY (no_route) goes to the
 * data node, which sends the microbatch again at once (forward.dropped).
 * Before, the DENY went to the dead peer; the stage-2 relay had said it
 * held the microbatch (its early gap report), so the data node waited for
 * the whole trip deadline and deferred it. */
static void test_dropped_past_a_death_is_sent_again(void **state) {
  (void)state;
  h_harness h;
  int d = build_two_per_stage(&h, 0);
  forward_seen f = {.stage = 1, .unroute_ms = 800};
  run_past_forward(&h, &f, 8);
  h_crash(&h, f.from);
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *dc = C(&h, d);
  if (verbose())
    fprintf(stderr, "at risk %llu, restarted %llu, deferred %llu; iteration 2 %.3f s\n",
            (unsigned long long)dc->forwards_at_risk, (unsigned long long)dc->forwards_restarted,
            (unsigned long long)dc->deferred_microbatches, h.nodes[d].secs_of[2]);
  assert_true(dc->forwards_restarted >= 1);
  assert_iteration2_whole(&h, d);
  h_free(&h);
}

/* Iteration 2: as stage 2's relay passes a microbatch's gradient to
 * stage 1, a RECOVER naming stage 2's relay (a false alarm, injected as
 * stage 3's) starts a walk; stage 1's relay answers that it has the
 * gradient (the walk is cancelled, `already_past`), but its answer takes
 * 100 ms, and it dies as it sends it (the data node hears of the death
 * after the answer, as at the end of a TCP session). Stage 2's relay
 * reports that death while the walk is on: the report is held, and taken
 * once the walk is cancelled. Before, the cancel dropped it, and the reporter asked again
 * only three hop timeouts later (a 6 s stall in a homo-churn20 run). */
typedef struct held_past {
  h_harness *h;
  int d, a1;
  uint64_t replied_at;
  bool injected;
  struct { uint64_t id; int from; } c3[16]; /* who sent stage 2 each gradient of iteration 2 */
  int n_c3;
} held_past;

/* A delay function: messages of one type from one node (*node, read at
 * send time: a hook may pick it during the run) take `ms`, the rest the
 * harness's 1-3 ms. */
typedef struct slow_kind {
  h_harness *h;
  const int *node;
  uint32_t type;
  uint64_t ms;
} slow_kind;

static uint64_t slow_one_kind(void *ud, int from, int to, size_t len, gw_rng *rng) {
  (void)to, (void)len;
  slow_kind *sk = ud;
  if (sk->h->sending == sk->type && *sk->node >= 0 && from == sk->h->nodes[*sk->node].index) return sk->ms;
  return 1 + gw_rng_below(rng, 3);
}

static void false_alarm_on_backward(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                                    const train_tensor *t) {
  (void)t;
  held_past *hp = h->hook_ud;
  if (type == GWTF__TRAIN_MSG__TRAIN_PROBE_REPLY && from == hp->a1 && !hp->replied_at) hp->replied_at = sim_now(h->s);
  if (hp->injected || type != GWTF__TRAIN_MSG__TRAIN_BACKWARD || train_peer_iteration(h->nodes[to].tp) != 2) return;
  Gwtf__TrainMicrobatch *m = gwtf__train_microbatch__unpack(NULL, len, body);
  assert_non_null(m);
  if (h->nodes[from].stage == 3 && h->nodes[to].stage == 2 && hp->n_c3 < 16)
    hp->c3[hp->n_c3].id = m->id, hp->c3[hp->n_c3++].from = from;
  int reporter = -1;
  for (int i = 0; i < hp->n_c3; i++)
    if (hp->c3[i].id == m->id) reporter = hp->c3[i].from;
  if (h->nodes[from].stage == 2 && h->nodes[to].stage == 1 && reporter >= 0) {
    uint8_t buf[512];
    Gwtf__TrainRecover r = GWTF__TRAIN_RECOVER__INIT;
    r.id = m->id;
    r.origin = m->origin;
    r.iteration = m->iteration;
    r.suspect = (ProtobufCBinaryData){GW_ID_BYTES, h->nodes[from].peer.id.b};
    r.suspect_stage = 2;
    r.reporter = (ProtobufCBinaryData){GW_ID_BYTES, h->nodes[reporter].peer.id.b};
    size_t n = gwtf__train_recover__pack(&r, buf);
    assert_int_equal(h_inject(h, reporter, hp->d, GWTF__TRAIN_MSG__TRAIN_RECOVER, buf, n, NULL), 0);
    hp->a1 = to;
    hp->injected = true;
  }
  gwtf__train_microbatch__free_unpacked(m, NULL);
}

static void test_report_held_behind_a_cancelled_walk(void **state) {
  (void)state;
  h_harness h;
  int d = build_two_per_stage(&h, 0);
  held_past hp = {&h, d, -1, 0, false, {{0, 0}}, 0};
  h.hook_ud = &hp;
  h.send_hook = false_alarm_on_backward;
  slow_kind sk = {&h, &hp.a1, GWTF__TRAIN_MSG__TRAIN_PROBE_REPLY, 100};
  sim_set_delay_fn(h.s, slow_one_kind, &sk);
  while (!hp.replied_at || sim_now(h.s) < hp.replied_at + 2) {
    h_run_for(&h, 1);
    assert_true(sim_now(h.s) < 60000);
  }
  h.send_hook = NULL;
  h_crash(&h, hp.a1); /* tcp_order: the data node gets its answer before the end of its session */
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *dc = C(&h, d);
  if (verbose())
    fprintf(stderr, "repairs %llu, recovered %llu; iteration 2 %.3f s\n", (unsigned long long)dc->repairs_started,
            (unsigned long long)dc->backward_recoveries, h.nodes[d].secs_of[2]);
  assert_true(dc->backward_recoveries >= 1);
  assert_iteration2_whole(&h, d);
  /* the held report was taken at the cancel, not asked for again */
  assert_true(h.nodes[d].secs_of[2] * 1000.0 < 3.0 * (double)h.tun.hop_timeout_ms);
  h_free(&h);
}

/* Iteration 2: a microbatch's stage-2 relay dies as its loss is computed;
 * the data node's walk asks the stage-1 relay to re-send into the gap, and
 * that relay dies before the REPAIR reaches it (delayed 50 ms). The data
 * node knows of the death at once and re-sends its own embedding then.
 * Before, the walk waited for the stage-1 relay's answer until the probe
 * deadline (1 s): in a homo-churn10 run a repair stood still 0.8 s so. */
typedef struct resend_death {
  h_harness *h;
  int d, L;
  uint64_t id, repair_at, resent_at;
  bool crashed;
} resend_death;

static void note_repair_and_resend(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                                   const train_tensor *t) {
  (void)t;
  resend_death *rd = h->hook_ud;
  if (from != rd->d || (type != GWTF__TRAIN_MSG__TRAIN_REPAIR && type != GWTF__TRAIN_MSG__TRAIN_FORWARD)) return;
  Gwtf__TrainMicrobatch *m = NULL;
  Gwtf__TrainRepair *r = NULL;
  uint64_t id = 0;
  if (type == GWTF__TRAIN_MSG__TRAIN_REPAIR) {
    assert_non_null(r = gwtf__train_repair__unpack(NULL, len, body));
    id = r->id;
    gwtf__train_repair__free_unpacked(r, NULL);
    if (!rd->repair_at) rd->L = to, rd->id = id, rd->repair_at = sim_now(h->s);
  } else {
    assert_non_null(m = gwtf__train_microbatch__unpack(NULL, len, body));
    id = m->id;
    gwtf__train_microbatch__free_unpacked(m, NULL);
    if (rd->crashed && !rd->resent_at && id == rd->id) rd->resent_at = sim_now(h->s);
  }
}

static void test_walk_steps_past_a_dead_resend_source(void **state) {
  (void)state;
  h_harness h;
  int d = build_two_per_stage(&h, 0);
  resend_death rd = {.h = &h, .d = d, .L = -1};
  h.hook = crash_before_backward;
  h.hook_ud = &rd;
  h.send_hook = note_repair_and_resend;
  slow_kind sk = {&h, &rd.d, GWTF__TRAIN_MSG__TRAIN_REPAIR, 50};
  sim_set_delay_fn(h.s, slow_one_kind, &sk);
  while (!rd.repair_at || sim_now(h.s) < rd.repair_at + 10) {
    h_run_for(&h, 1);
    assert_true(sim_now(h.s) < 60000);
  }
  assert_int_equal(h.nodes[rd.L].stage, 1);
  uint64_t crashed_at = sim_now(h.s);
  rd.crashed = true;
  h_crash(&h, rd.L);
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *dc = C(&h, d);
  if (verbose())
    fprintf(stderr, "re-sent %llu ms after the death; walks stepped on a death %llu; iteration 2 %.3f s\n",
            (unsigned long long)(rd.resent_at - crashed_at), (unsigned long long)dc->walks_stepped_on_death,
            h.nodes[d].secs_of[2]);
  assert_true(dc->walks_stepped_on_death >= 1);
  assert_true(rd.resent_at >= crashed_at);
  assert_true(rd.resent_at - crashed_at < h.tun.probe_timeout_ms / 4);
  assert_iteration2_whole(&h, d);
  h_free(&h);
}

/* A repair's re-send into stage 2 (its relay died as the loss was
 * computed) meets a DENY "full" from the peer it goes to, injected as the
 * re-send leaves: `stale`, a refusal of the plain FORWARD sent before the
 * repair (it came late; its repair flag is clear), which the sender
 * ignores; or one of the re-send itself, after which the sender re-routes
 * and waits (no other stage-2 relay lives) while that peer, which took
 * the re-send after all, sends it the gradient: the sender takes it
 * (forward.through_by_backward). Either way the microbatch completes in
 * its iteration, within a trip deadline. Before, in a homo-churn20 run,
 * the late refusal re-routed the repair, the gradient found its sender
 * re-routing and was dropped, and the microbatch waited out its 16 s trip
 * deadline. */
typedef struct deny_resend {
  bool stale;
  int injected;
} deny_resend;

static void deny_repair_resend(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                               const train_tensor *t) {
  (void)t;
  deny_resend *dr = h->hook_ud;
  if (dr->injected || type != GWTF__TRAIN_MSG__TRAIN_FORWARD || h->nodes[from].stage != 1 ||
      h->nodes[to].stage != 2)
    return;
  Gwtf__TrainMicrobatch *m = gwtf__train_microbatch__unpack(NULL, len, body);
  assert_non_null(m);
  if (m->repair) {
    uint8_t buf[256];
    Gwtf__TrainAck a = GWTF__TRAIN_ACK__INIT;
    a.id = m->id;
    a.origin = m->origin;
    a.iteration = m->iteration;
    a.reason = "full";
    a.repair = !dr->stale;
    size_t n = gwtf__train_ack__pack(&a, buf);
    assert_int_equal(h_inject(h, to, from, GWTF__TRAIN_MSG__TRAIN_DENY, buf, n, NULL), 0);
    dr->injected = from;
  }
  gwtf__train_microbatch__free_unpacked(m, NULL);
}

static void run_denied_resend(bool stale) {
  h_harness h;
  int d = build_two_per_stage(&h, 0);
  deny_resend dr = {stale, 0};
  h.hook = crash_before_backward;
  h.hook_ud = &dr;
  h.send_hook = deny_repair_resend;
  assert_true(h_run_until_finished(&h, 120000));
  assert_true(h.hook_fired);
  assert_true(dr.injected > 0);
  const train_counters *lc = C(&h, dr.injected);
  if (verbose())
    fprintf(stderr, "%s DENY: the re-sender re-routed %llu, denies taken %llu; iteration 2 %.3f s\n",
            stale ? "stale" : "the re-send's", (unsigned long long)lc->forward_rerouted,
            (unsigned long long)lc->denies_received, h.nodes[d].secs_of[2]);
  if (stale) assert_int_equal(lc->denies_received, 0); /* not taken as the re-send's */
  else assert_true(lc->forward_rerouted >= 1);        /* it did re-route, and still took the gradient */
  assert_iteration2_whole(&h, d);
  h_free(&h);
}

static void test_stale_deny_keeps_the_repair(void **state) {
  (void)state;
  run_denied_resend(true);
}

static void test_gradient_reaches_a_rerouting_sender(void **state) {
  (void)state;
  run_denied_resend(false);
}

/* A data node that re-sent its own output into a repair watches the last
 * relay of its path again once the re-send is passed on: when that relay,
 * the peer after the gap here, dies as the gap is recomputed, the data node
 * repairs the last stage too, and the microbatch completes in its
 * iteration. Before, the data node had no last relay to watch after such a
 * re-send, and its trip deadline deferred the microbatch (hetero-churn20
 * seed 120 of an A/B, 2026-11-28: 16 s). */
static void test_lost_self_repair_is_repaired_again(void **state) {
  (void)state;
  h_harness h;
  gap_crash g = {0, -1, 0};
  int d = build(&h, 4, 3, M);
  h.hook = crash_gap_then_target;
  h.hook_ud = &g;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(g.phase, 2);
  assert_int_equal(train_peer_iteration(h.nodes[d].tp), ITERS);
  const train_counters *dc = C(&h, d);
  if (verbose())
    fprintf(stderr, "repairs %llu, recovered %llu, deferred %llu; iteration 2 %.3f s\n",
            (unsigned long long)dc->repairs_started, (unsigned long long)dc->backward_recoveries,
            (unsigned long long)dc->deferred_microbatches, h.nodes[d].secs_of[2]);
  assert_int_equal(dc->deferred_microbatches + dc->lost_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_true(h.nodes[d].secs_of[2] * 1000.0 < (double)trip_deadline_ms(&h));
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* Iteration 2, four stages, one repair allowed per break: a microbatch's
 * stage-3 relay dies as its loss is computed (the first break, mended from
 * its stage-2 relay); then, as the mended backward reaches stage 2, its
 * stage-1 relay dies too (a second break, at another peer). The second
 * break gets a repair of its own and the microbatch completes. Before,
 * the budget was per microbatch, and the second break lost it (the grid's
 * one lost microbatch at 20 % churn). */
typedef struct two_breaks {
  int victim_stage, trigger_stage; /* the second death: stage victim_stage's relay, as stage trigger_stage runs the backward */
  int phase, victim;
  uint64_t key;
} two_breaks;

static bool crash_two_breaks(h_harness *h, h_node *n, const train_job *job, int *crash) {
  two_breaks *t = h->hook_ud;
  if (train_peer_iteration(n->tp) != 2) return false;
  if (t->phase == 0 && job->kind == TRAIN_JOB_LOSS) {
    int s3 = holder(h, 3, job->key);
    t->victim = holder(h, t->victim_stage, job->key);
    if (s3 < 0 || t->victim < 0) return false;
    t->key = job->key;
    h_crash(h, s3); /* here, not through *crash: the harness stops calling a hook once it fires */
    t->phase = 1;
    return false;
  }
  if (t->phase == 1 && job->kind == TRAIN_JOB_BACKWARD && n->stage == t->trigger_stage && job->key == t->key) {
    *crash = t->victim;
    t->phase = 2;
    return true;
  }
  return false;
}

/* Four stages of three relays, the two deaths of t; the data node's index. */
static int run_two_breaks(h_harness *h, uint64_t seed, uint32_t max_repairs, two_breaks *t) {
  h_init(h, 4, seed, verbose());
  if (max_repairs) h->tun.max_repairs = max_repairs;
  int d = h_add(h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(h, d);
  for (int s = 1; s <= 4; s++)
    for (int k = 0; k < 3; k++) h_start(h, h_add(h, TRAIN_RELAY, s, M, 0, true));
  h->hook = crash_two_breaks;
  h->hook_ud = t;
  assert_true(h_run_until_finished(h, 120000));
  assert_int_equal(t->phase, 2);
  const train_counters *dc = C(h, d);
  if (verbose())
    fprintf(stderr, "repairs %llu, recovered %llu, lost %llu, deferred %llu\n", (unsigned long long)dc->repairs_started,
            (unsigned long long)dc->backward_recoveries, (unsigned long long)dc->lost_microbatches,
            (unsigned long long)dc->deferred_microbatches);
  assert_int_equal(dc->lost_microbatches + dc->deferred_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  assert_agree(h, ITERS);
  return d;
}

static void test_second_break_gets_its_own_repair(void **state) {
  (void)state;
  h_harness h;
  two_breaks t = {.victim_stage = 1, .trigger_stage = 2};
  int d = run_two_breaks(&h, 11, 1, &t);
  assert_true(C(&h, d)->repairs_started >= 2);
  h_free(&h);
}

/* Iteration 2: stage 3 of a microbatch's path dies as its loss is
 * computed, and a repair rebuilds it on a replacement; then stage 2 dies as
 * that replacement computes the backward. The replacement reports RECOVER,
 * though the origin's path still names the dead stage-3 peer (REPAIR_READY
 * went to stage 4): the origin takes the report and repairs the second
 * break alone, stage 2. Before, the report was dropped; stage 4 later
 * gave up on the live replacement and a repair rebuilt stages 2 and 3 (in
 * the grid, with no such fallback, the trip deadline deferred the
 * microbatch). */
static void test_recover_from_a_replacement(void **state) {
  (void)state;
  h_harness h;
  two_breaks t = {.victim_stage = 2, .trigger_stage = 3};
  int d = run_two_breaks(&h, 13, 0, &t);
  /* The microbatch's two breaks got a repair each, and every repair rebuilt
   * one stage: stage 3, then stage 2 (the other microbatches the stage-2
   * relay held need a repair of their own when the relays after it report
   * its death before their gradients are due). Before, the second report
   * was dropped and a repair rebuilt stages 2 and 3. */
  uint64_t started = C(&h, d)->repairs_started, recomputed = 0;
  for (int i = 0; i < h.n_nodes; i++) recomputed += C(&h, i)->forward_recomputed;
  assert_true(started >= 2);
  assert_int_equal(recomputed, started);
  assert_int_equal(started, C(&h, d)->backward_recoveries + 1);
  h_free(&h);
}

/* Iteration 2: a stage-2 relay passes a microbatch on, but its FORWARD_DONE
 * to the stage-1 relay before it is held up, and it dies as the loss is
 * computed. The stage-1 relay, still waiting, re-routes a spare copy, which
 * meets the first copy's path (or the data node) and is refused as a
 * duplicate. By the time the repaired microbatch is home, no relay after
 * stage 2 may still hold the spare: it is dropped, not carried on and kept
 * until the aggregation. */
typedef struct spare_check {
  int phase, sender, prev; /* the stage-2 relay and the stage-1 relay before it */
  uint64_t key;
  int spares_held;
} spare_check;

static uint64_t hold_forward_done(void *ud, int from, int to, size_t len, gw_rng *rng) {
  const spare_check *c = ud;
  (void)len;
  if (c->phase >= 1 && from == c->sender && to == c->prev) return 60000; /* past the end of the run */
  return 1 + gw_rng_below(rng, 3);
}

static bool lose_hop_after_passing_on(h_harness *h, h_node *n, const train_job *job, int *crash) {
  spare_check *c = h->hook_ud;
  (void)crash; /* crashed here: the harness stops calling a hook once it fires */
  if (train_peer_iteration(n->tp) != 2) return false;
  if (c->phase == 0 && job->kind == TRAIN_JOB_FORWARD && n->stage == 2) {
    c->prev = holder(h, 1, job->key);
    if (c->prev < 0) return false;
    c->sender = n->index;
    c->key = job->key;
    c->phase = 1;
  } else if (c->phase == 1 && job->kind == TRAIN_JOB_LOSS && job->key == c->key) {
    h_crash(h, c->sender);
    c->phase = 2;
  } else if (c->phase == 2 && job->kind == TRAIN_JOB_EMBED_BACKWARD && job->key == c->key) {
    for (int s = 3; s <= STAGES; s++) c->spares_held += holder(h, s, c->key) >= 0;
    c->phase = 3;
  }
  return false;
}

static void test_spare_copy_is_dropped(void **state) {
  (void)state;
  h_harness h;
  spare_check c = {0, -1, -1, 0, 0};
  int d = build(&h, 7, 2, M);
  /* the held FORWARD_DONE stands for one lost for good: the sender's death
   * reaches prev at once, not after it */
  h.tcp_order = false;
  sim_set_delay_fn(h.s, hold_forward_done, &c);
  h.hook = lose_hop_after_passing_on;
  h.hook_ud = &c;
  assert_true(h_run_until_finished(&h, 120000));
  assert_int_equal(c.phase, 3); /* the microbatch came home */
  assert_int_equal(c.spares_held, 0);
  assert_true(C(&h, c.prev)->forward_rerouted >= 1); /* a spare was sent */
  assert_int_equal(C(&h, d)->microbatches_done, (uint64_t)M * ITERS);
  assert_int_equal(C(&h, d)->deferred_microbatches + C(&h, d)->lost_microbatches, 0);
  assert_agree(&h, ITERS);
  h_free(&h);
}

/* The last relay of a microbatch takes the data node's loss gradient,
 * passes its own on to the stage before it and dies before its
 * BACKWARD_DONE reaches the data node (that stage's BACKWARD_RECEIVED to it
 * is slow, and so is the gradient's way on from stage 2). The data node
 * reports its own wait; the walk finds the
 * gradient already past the dead relay and ends, and so does the wait.
 * Before, the data node's deadline fired again at every tick, and four
 * such repairs of one break lost the microbatch (a homo-churn10 run,
 * 2026-11-28). */
typedef struct past_last {
  int victim;
  uint64_t sent_at;
} past_last;

static uint64_t slow_received_to_last(void *ud, int from, int to, size_t len, gw_rng *rng) {
  h_harness *h = ud;
  (void)len, (void)rng;
  if (train_peer_iteration(h->nodes[from].tp) != 2) return 2;
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_BACKWARD_RECEIVED && h->nodes[to].stage == h->n_stages) return 300;
  /* and the gradient's way on is long: the microbatch is still out when the data node reports */
  if (h->sending == GWTF__TRAIN_MSG__TRAIN_BACKWARD && h->nodes[from].stage == 2) return 800;
  return 2;
}

static void note_last_backward(h_harness *h, int from, int to, uint32_t type, const uint8_t *body, size_t len,
                               const train_tensor *t) {
  past_last *pl = h->hook_ud;
  (void)to, (void)body, (void)len, (void)t;
  if (pl->victim < 0 && type == GWTF__TRAIN_MSG__TRAIN_BACKWARD && h->nodes[from].stage == h->n_stages &&
      train_peer_iteration(h->nodes[from].tp) == 2) {
    pl->victim = from;
    pl->sent_at = sim_now(h->s);
  }
}

static void test_last_relay_dies_after_passing_the_gradient(void **state) {
  (void)state;
  h_harness h;
  past_last pl = {.victim = -1};
  h_init(&h, STAGES, 3, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, ITERS, true);
  h_start(&h, d);
  for (int st = 1; st <= STAGES; st++)
    for (int k = 0; k < 2; k++) h_start(&h, h_add(&h, TRAIN_RELAY, st, M, 0, true));
  sim_set_delay_fn(h.s, slow_received_to_last, &h);
  h.hook_ud = &pl;
  h.send_hook = note_last_backward;
  while (pl.victim < 0 && sim_now(h.s) < 60000) h_run_for(&h, 1);
  assert_true(pl.victim >= 0);
  h_run_for(&h, 50); /* its gradient is at the stage before it; its confirmation is not out */
  h_crash(&h, pl.victim);
  assert_true(h_run_until_finished(&h, 120000));
  const train_counters *dc = C(&h, d);
  assert_true(dc->repairs_started >= 1); /* the data node reported its own wait */
  assert_int_equal(dc->lost_microbatches + dc->deferred_microbatches, 0);
  assert_int_equal(dc->microbatches_done, (uint64_t)M * ITERS);
  /* (not the reference's losses: the stage-3 gradients the victim summed
   * died with it before its round, as any relay's do) */
  assert_agree(&h, ITERS);
  h_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_lost_past_two_deaths_is_sent_again),
      cmocka_unit_test(test_forward_past_one_death_is_not_sent_again),
      cmocka_unit_test(test_dropped_past_a_death_is_sent_again),
      cmocka_unit_test(test_report_held_behind_a_cancelled_walk),
      cmocka_unit_test(test_walk_steps_past_a_dead_resend_source),
      cmocka_unit_test(test_stale_deny_keeps_the_repair),
      cmocka_unit_test(test_gradient_reaches_a_rerouting_sender),
      cmocka_unit_test(test_lost_self_repair_is_repaired_again),
      cmocka_unit_test(test_second_break_gets_its_own_repair),
      cmocka_unit_test(test_recover_from_a_replacement),
      cmocka_unit_test(test_spare_copy_is_dropped),
      cmocka_unit_test(test_last_relay_dies_after_passing_the_gradient),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
