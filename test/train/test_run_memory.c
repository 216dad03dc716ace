/* test/train/test_run_memory.c — per-stage memory of a run and the stage
 * count chosen from a memory budget (train/run_memory.h, issue 20). */
#include "train_testutil.h"

#include "train/run_memory.h"
#include "util/err.h"

static train_run gpt2_run(int stages) {
  train_run r;
  memset(&r, 0, sizeof(r));
  assert_int_equal(model_preset_get("gpt2-small", &r.model), 0);
  r.stages = stages, r.batch = 1, r.seq = 64, r.microbatches = 1, r.lr = 1e-3;
  return r;
}

#define MIB ((size_t)1 << 20)

/* The parts add up, the head is stage 0's alone, and the state is 16 bytes
 * a parameter: weights 4, gradients and AdamW m, v 12. */
static void test_stage_memory(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  train_run r = gpt2_run(3);
  train_stage_memory m0, m1;
  assert_int_equal(train_run_stage_memory(&r, 0, 6, be, &m0), 0);
  assert_int_equal(m0.n_layers, 0);
  assert_int_equal(m0.params, model_head_numel(&r.model));
  assert_int_equal(train_run_stage_memory(&r, 1, 5, be, &m1), 0);
  assert_int_equal(m1.first_layer, 0);
  assert_int_equal(m1.n_layers, 4);
  assert_int_equal(m1.params, 4 * model_block_numel(&r.model));
  assert_int_equal(m1.weights_bytes, m1.params * 4);
  assert_int_equal(m1.optimizer_bytes, m1.params * 12);
  assert_true(m1.per_mb_bytes > 0);
  assert_int_equal(m1.total_bytes, m1.weights_bytes + m1.optimizer_bytes + m1.workspace_bytes + 5 * m1.per_mb_bytes);
  /* GPT-2's 50257-token embedding outweighs four of its blocks */
  assert_true(m0.weights_bytes > m1.weights_bytes);
  assert_int_equal(train_run_stage_memory(&r, 4, 5, be, &m1), GW_EINVAL);
  assert_int_equal(train_run_stage_memory(&r, 1, 0, be, &m1), GW_EINVAL);
  gpu_backend_close(be);
}

/* The fewest stages whose largest (first) stage fits: one block of
 * gpt2-small is ~113 MB of state, so a budget between three and four
 * blocks' worth gives ceil(12 / 3) = 4 stages. */
static void test_stages_for_memory(void **state) {
  (void)state;
  gpu_backend *be = tt_cpu(1);
  train_run r = gpt2_run(1);
  train_stage_memory one, three, four;
  r.stages = 12;
  assert_int_equal(train_run_stage_memory(&r, 1, 2, be, &one), 0);
  r.stages = 4;
  assert_int_equal(train_run_stage_memory(&r, 1, 2, be, &three), 0);
  assert_int_equal(three.n_layers, 3);
  r.stages = 3;
  assert_int_equal(train_run_stage_memory(&r, 1, 2, be, &four), 0);
  r.stages = 7;
  assert_int_equal(train_run_stages_for_memory(&r, (three.total_bytes + four.total_bytes) / 2, 2, be), 0);
  assert_int_equal(r.stages, 4);
  assert_int_equal(train_run_stages_for_memory(&r, three.total_bytes, 2, be), 0);
  assert_int_equal(r.stages, 4);
  assert_int_equal(train_run_stages_for_memory(&r, (size_t)64 << 30, 2, be), 0);
  assert_int_equal(r.stages, 1);
  assert_int_equal(train_run_stages_for_memory(&r, one.total_bytes - 1, 2, be), GW_ERANGE);
  assert_int_equal(train_run_stages_for_memory(&r, one.total_bytes, 2, be), 0);
  assert_int_equal(r.stages, 12);
  gpu_backend_close(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_stage_memory), cmocka_unit_test(test_stages_for_memory)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
