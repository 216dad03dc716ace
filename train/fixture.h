/* train/fixture.h — runs a PyTorch reference fixture against a backend
 * (`gwtf check stage`, test/train).
 *
 * A fixture is a safetensors file written by scripts/gen_fixtures.py whose
 * __metadata__ holds kind (blocks | head | adamw), arch, d_model, n_heads,
 * n_layers, d_ff, vocab_size, max_seq_len, seq_len, batch, eps, rope_theta
 * (and for adamw: step, lr, beta1, beta2, adam_eps, weight_decay), all as
 * strings, with these tensors:
 *   blocks  the block parameters (blocks.0..L-1.*), input, grad_output;
 *           expected.output, expected.grad_input, expected.grad.<param>
 *   head    the data-node parameters, tokens and targets (I32), input (the
 *           activation returning from the last block), grad_embedding;
 *           expected.embedding, expected.loss (scalar), expected.grad_input,
 *           expected.grad.<param> (tied weights: the sum of both uses)
 *   adamw   param, grad, m, v; expected.param, expected.m, expected.v
 * Each expected tensor is compared by max |ours - expected| divided by
 * max |expected| (the absolute error when the expected tensor is all zero). */
#ifndef GWTF_TRAIN_FIXTURE_H
#define GWTF_TRAIN_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu/backend.h"

#define FIXTURE_TOLERANCE (1e-4) /* fp32 */

typedef struct fixture_result {
  char name[96];      /* "output", "grad_input", "grad.blocks.0.ln1.weight", ... */
  double max_abs_err; /* max |ours - expected| */
  double max_abs_ref; /* max |expected| */
  double rel;         /* max_abs_err / max_abs_ref */
  bool ok;            /* rel <= tolerance (and everything finite) */
} fixture_result;

typedef void (*fixture_report_fn)(void *ud, const fixture_result *r);

/* Runs the fixture at path on be, calling report for every comparison.
 * *n_failed counts comparisons over tol. Returns 0 when the fixture ran
 * (whatever the comparisons say), or a negative code with a sentence in
 * err when the file is unreadable or malformed. */
int fixture_run(const char *path, gpu_backend *be, double tol, fixture_report_fn report, void *ud,
                int *n_failed, char *err, size_t err_len);

#endif
