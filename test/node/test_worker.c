/* The compute worker runs jobs in order on another thread and hands them
 * back on the loop thread. */
#include "testutil.h"

#include <uv.h>

#include "node/worker.h"
#include "util/err.h"

typedef struct ctx {
  uv_thread_t loop_thread;
  int ran, done, order_errors, wrong_thread;
  uint64_t last_key;
  uv_loop_t *loop;
  node_worker *w;
} ctx;

static void run(void *arg, train_job *job) {
  ctx *c = arg;
  uv_thread_t self = uv_thread_self();
  if (uv_thread_equal(&self, &c->loop_thread)) c->wrong_thread++;
  c->ran++;
  job->rc = (int)job->key; /* a visible result */
}

static void done(void *arg, train_job *job) {
  ctx *c = arg;
  uv_thread_t self = uv_thread_self();
  if (!uv_thread_equal(&self, &c->loop_thread)) c->wrong_thread++;
  if (job->key != c->last_key + 1 || job->rc != (int)job->key) c->order_errors++;
  c->last_key = job->key;
  c->done++;
  free(job);
  if (c->done == 1000) uv_stop(c->loop);
}

static void test_runs_in_order_off_the_loop(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  ctx c = {.loop_thread = uv_thread_self(), .loop = &loop};
  assert_int_equal(node_worker_new(&loop, run, &c, done, &c, &c.w), 0);
  for (uint64_t k = 1; k <= 1000; k++) {
    train_job *job = calloc(1, sizeof(*job));
    job->key = k;
    assert_int_equal(node_worker_submit(c.w, job), 0);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(c.done, 1000);
  assert_int_equal(c.ran, 1000);
  assert_int_equal(c.order_errors, 0);
  assert_int_equal(c.wrong_thread, 0);
  assert_int_equal(node_worker_pending(c.w), 0);
  node_worker_free(c.w);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void slow_run(void *arg, train_job *job) {
  (void)arg;
  job->rc = 0;
}

static void never_done(void *arg, train_job *job) {
  (void)arg;
  free(job);
}

static void test_free_drops_queued_jobs(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  node_worker *w;
  assert_int_equal(node_worker_new(&loop, slow_run, NULL, never_done, NULL, &w), 0);
  for (int k = 0; k < 100; k++) {
    train_job *job = calloc(1, sizeof(*job));
    job->blob = malloc(16); /* freed with the job */
    assert_int_equal(node_worker_submit(w, job), 0);
  }
  node_worker_free(w); /* jobs not run or not delivered are freed, no leak */
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_in_order_off_the_loop),
      cmocka_unit_test(test_free_drops_queued_jobs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
