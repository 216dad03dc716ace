/* A job never outlives the memory it computes on. A peer drops work it has
 * queued on its compute worker when a round begins (BEGIN_AGG, GRAD, AVG),
 * when it resyncs (HELLO or BEGIN_AGG from a later iteration) or when a
 * microbatch is given up. Any peer can send those messages. Each case here
 * delivers one while the job it abandons is still queued: the job must run
 * on live buffers (ASan and valgrind run this test), its result must be
 * ignored, and the compute state it leaves behind must be released. */
#include "testutil.h"

#include "peer_harness.h"
#include "train.pb-c.h"

#define STAGES 2
#define M 4

static bool verbose(void) { return getenv("GWTF_TEST_VERBOSE") != NULL; }

typedef struct abandon_case {
  train_job_kind kind; /* the job to abandon */
  int victim;          /* node index that runs it */
  int sender;          /* node index the message comes from */
  uint32_t msg;        /* BEGIN_AGG or HELLO */
  uint64_t ahead;      /* the message's iteration: the victim's + ahead */
  /* filled by the hook */
  bool sent;
  uint64_t jobs_before;
} abandon_case;

static size_t pack_message(const abandon_case *c, const h_node *n, uint8_t *buf) {
  uint64_t it = train_peer_iteration(n->tp) + c->ahead;
  if (c->msg == GWTF__TRAIN_MSG__TRAIN_HELLO) {
    Gwtf__TrainHello h = GWTF__TRAIN_HELLO__INIT;
    h.role = n->role == TRAIN_DATA ? GWTF__TRAIN_ROLE__TRAIN_ROLE_DATA : GWTF__TRAIN_ROLE__TRAIN_ROLE_RELAY;
    h.stage = n->stage;
    h.capacity = M;
    h.iteration = it;
    return gwtf__train_hello__pack(&h, buf);
  }
  Gwtf__TrainIteration m = GWTF__TRAIN_ITERATION__INIT;
  m.iteration = it;
  return gwtf__train_iteration__pack(&m, buf);
}

/* When the victim queues the job: the message goes out at once and arrives
 * (1-3 ms) before the job ends (H_JOB_MS). */
static bool send_while_queued(h_harness *h, h_node *n, const train_job *job, int *crash) {
  abandon_case *c = h->hook_ud;
  (void)crash;
  if (c->sent || n->index != c->victim || job->kind != c->kind) return false;
  uint8_t buf[128];
  size_t len = pack_message(c, n, buf);
  assert_int_equal(h_inject(h, c->sender, c->victim, c->msg, buf, len, NULL), 0);
  c->sent = true;
  c->jobs_before = n->jobs_done;
  return false; /* true would crash a node */
}

static void run_case(abandon_case *c) {
  h_harness h;
  h_init(&h, STAGES, 7, verbose());
  int d = h_add(&h, TRAIN_DATA, 0, M, 3, true);
  for (int s = 1; s <= STAGES; s++) h_add(&h, TRAIN_RELAY, s, M, 0, true);
  /* a second member of the victim's stage, to say "later iteration" in a HELLO */
  int twin = h_add(&h, TRAIN_RELAY, h.nodes[c->victim].stage, M, 0, true);
  if (c->sender < 0) c->sender = twin;
  (void)d;
  h.hook = send_while_queued;
  h.hook_ud = c;
  for (int i = 0; i < h.n_nodes; i++) h_start(&h, i);
  for (int t = 0; t < 20000 && !(c->sent && h.nodes[c->victim].jobs_done > c->jobs_before + 4); t++)
    h_run_for(&h, 1);
  assert_true(c->sent);
  h_node *v = &h.nodes[c->victim];
  assert_true(v->alive);
  /* the abandoned job ran to its end, and the peer went on with other jobs */
  assert_true(v->jobs_done > c->jobs_before + 4);
  if (c->ahead) assert_true(train_peer_counters(v->tp)->resyncs > 0); /* it did resync */
  h_free(&h);
}

/* BEGIN_AGG for a relay's current iteration starts its round, which drops
 * the microbatch whose forward is queued: out and in must outlive the job,
 * and the state the forward keeps is released when it ends. */
static void test_round_drops_queued_forward(void **state) {
  (void)state;
  abandon_case c = {TRAIN_JOB_FORWARD, 1, 0, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, 0, false, 0};
  run_case(&c);
}

/* BEGIN_AGG two iterations on, from the other member of its stage (a
 * directory member, the only other one: enough evidence; one on would be
 * the round after the one the relay is in, no evidence), while the relay's
 * gradient export for its own round is queued, makes it resync: the
 * export's buffer must outlive the export, and its result must not be sent
 * as the round's gradient. */
static void test_resync_drops_queued_export(void **state) {
  (void)state;
  abandon_case c = {TRAIN_JOB_GRAD_EXPORT, 2, -1, GWTF__TRAIN_MSG__TRAIN_BEGIN_AGG, 2, false, 0};
  run_case(&c);
}

/* A HELLO from a later iteration of the data node's stage, while an
 * embedding is queued: the data node resyncs and drops every microbatch,
 * the embedding's tokens and output must outlive the job. */
static void test_resync_drops_queued_embedding(void **state) {
  (void)state;
  abandon_case c = {TRAIN_JOB_EMBED, 0, -1, GWTF__TRAIN_MSG__TRAIN_HELLO, 1, false, 0};
  run_case(&c);
}

/* The same for a relay's backward: its gradient buffer. */
static void test_resync_drops_queued_backward(void **state) {
  (void)state;
  abandon_case c = {TRAIN_JOB_BACKWARD, 1, -1, GWTF__TRAIN_MSG__TRAIN_HELLO, 1, false, 0};
  run_case(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_drops_queued_forward),
      cmocka_unit_test(test_resync_drops_queued_export),
      cmocka_unit_test(test_resync_drops_queued_embedding),
      cmocka_unit_test(test_resync_drops_queued_backward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
