/* node/worker.c — see worker.h. */
#include "node/worker.h"

#include <stdbool.h>
#include <stdlib.h>

#include "util/clock.h"
#include "util/err.h"

typedef struct job_queue {
  train_job **v;
  size_t head, n, cap;
} job_queue;

struct node_worker {
  uv_thread_t thread;
  uv_mutex_t mu;
  uv_cond_t cv;
  uv_async_t async;
  job_queue todo, done;
  size_t running;
  bool stop;
  node_worker_run_fn run;
  void *run_ctx;
  node_worker_done_fn on_done;
  void *done_ud;
};

/* Makes room for `want` jobs in q. */
static int q_reserve(job_queue *q, size_t want) {
  if (want > q->cap) {
    size_t cap = q->cap ? 2 * q->cap : 64;
    while (cap < want) cap *= 2;
    train_job **v = malloc(cap * sizeof(*v));
    if (!v) return GW_ENOMEM;
    for (size_t i = 0; i < q->n; i++) v[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = v;
    q->cap = cap;
    q->head = 0;
  }
  return 0;
}

static int q_push(job_queue *q, train_job *job) {
  int rc = q_reserve(q, q->n + 1);
  if (rc != 0) return rc;
  q->v[(q->head + q->n) % q->cap] = job;
  q->n++;
  return 0;
}

static train_job *q_pop(job_queue *q) {
  if (q->n == 0) return NULL;
  train_job *job = q->v[q->head];
  q->head = (q->head + 1) % q->cap;
  q->n--;
  return job;
}

static void thread_main(void *arg) {
  node_worker *w = arg;
  uv_mutex_lock(&w->mu);
  for (;;) {
    while (!w->stop && w->todo.n == 0) uv_cond_wait(&w->cv, &w->mu);
    if (w->stop) break;
    train_job *job = q_pop(&w->todo);
    w->running = 1;
    uv_mutex_unlock(&w->mu);
    uint64_t t0 = gw_clock_mono_ns();
    w->run(w->run_ctx, job);
    job->seconds = (double)(gw_clock_mono_ns() - t0) / 1e9;
    uv_mutex_lock(&w->mu);
    w->running = 0;
    q_push(&w->done, job); /* cannot fail: node_worker_submit reserved the room */
    uv_async_send(&w->async);
  }
  uv_mutex_unlock(&w->mu);
}

/* On the loop thread: hand finished jobs to their owner, in order. */
static void async_cb(uv_async_t *a) {
  node_worker *w = a->data;
  for (;;) {
    uv_mutex_lock(&w->mu);
    train_job *job = w->stop ? NULL : q_pop(&w->done);
    uv_mutex_unlock(&w->mu);
    if (!job) return;
    w->on_done(w->done_ud, job);
  }
}

int node_worker_new(uv_loop_t *loop, node_worker_run_fn run, void *run_ctx, node_worker_done_fn done, void *done_ud,
                    node_worker **out) {
  node_worker *w = calloc(1, sizeof(*w));
  if (!w) return GW_ENOMEM;
  w->run = run;
  w->run_ctx = run_ctx;
  w->on_done = done;
  w->done_ud = done_ud;
  int rc = uv_mutex_init(&w->mu);
  if (rc == 0) rc = uv_cond_init(&w->cv);
  if (rc == 0) rc = uv_async_init(loop, &w->async, async_cb);
  if (rc == 0) {
    w->async.data = w;
    rc = uv_thread_create(&w->thread, thread_main, w);
    if (rc != 0) uv_close((uv_handle_t *)&w->async, NULL);
  }
  if (rc != 0) {
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

int node_worker_submit(node_worker *w, train_job *job) {
  uv_mutex_lock(&w->mu);
  /* Room in `done` for every job in the worker, reserved now: a finished job
   * always goes back to its owner, which may still point at it. */
  int rc = w->stop ? GW_ECLOSED : q_reserve(&w->done, w->todo.n + w->running + w->done.n + 1);
  if (rc == 0) rc = q_push(&w->todo, job);
  if (rc == 0) uv_cond_signal(&w->cv);
  uv_mutex_unlock(&w->mu);
  return rc;
}

size_t node_worker_pending(node_worker *w) {
  uv_mutex_lock(&w->mu);
  size_t n = w->todo.n + w->running;
  uv_mutex_unlock(&w->mu);
  return n;
}

static void closed_cb(uv_handle_t *h) {
  node_worker *w = h->data;
  train_job *job;
  while ((job = q_pop(&w->todo))) train_job_free(job);
  while ((job = q_pop(&w->done))) train_job_free(job);
  free(w->todo.v);
  free(w->done.v);
  uv_cond_destroy(&w->cv);
  uv_mutex_destroy(&w->mu);
  free(w);
}

void node_worker_free(node_worker *w) {
  if (!w) return;
  uv_mutex_lock(&w->mu);
  w->stop = true;
  uv_cond_signal(&w->cv);
  uv_mutex_unlock(&w->mu);
  uv_thread_join(&w->thread);
  uv_close((uv_handle_t *)&w->async, closed_cb);
}
