/* node/worker.h — the compute worker: one thread that runs a peer's compute
 * jobs (train/peer.h) in the order they were queued, so the event loop never
 * blocks on a forward or backward pass.
 *
 * One thread, first in first out: the stage state it touches needs no lock,
 * results are deterministic, and a RELEASE queued after a FORWARD always runs
 * after it. Finished jobs come back on the loop thread through a uv_async. */
#ifndef GWTF_NODE_WORKER_H
#define GWTF_NODE_WORKER_H

#include <stddef.h>
#include <uv.h>

#include "train/peer.h"

typedef struct node_worker node_worker;

/* Runs one job on the worker thread; fills the job's result fields. */
typedef void (*node_worker_run_fn)(void *ctx, train_job *job);
/* Receives a finished job on the loop thread; owns it from then on. */
typedef void (*node_worker_done_fn)(void *ud, train_job *job);

int node_worker_new(uv_loop_t *loop, node_worker_run_fn run, void *run_ctx, node_worker_done_fn done, void *done_ud,
                    node_worker **out);
/* Queues a job. GW_ECLOSED once the worker is stopping. */
int node_worker_submit(node_worker *w, train_job *job);
/* Jobs queued or running. */
size_t node_worker_pending(node_worker *w);
/* Stops the thread after the job it is running, frees the jobs it did not
 * run (and their blobs), and releases the worker once the loop has closed
 * its handle (keep running the loop). NULL is a no-op. */
void node_worker_free(node_worker *w);

#endif
