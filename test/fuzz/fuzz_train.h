/* test/fuzz/fuzz_train.h — the training peer fuzz target (fuzz_train_lib.c):
 * its cast and its input format, shared with the corpus generator.
 *
 * The cast: data nodes d0, d1 (stage 0), relays r1a, r1b (stage 1) and r2a,
 * r2b (stage 2); the fuzzed peer is one of them, the others exist only as
 * the senders of its input and the addressees of what it sends.
 *
 * Input: byte 0 = who + 6 * flags: who (0..5) is the cast member the peer
 * is; flags bit 0: a relay starts unassigned (stage -1, asks the leader),
 * bit 1: it must fetch its weights (no initial_weights), bit 2: SWARM
 * recovery (restart), bits 3-4: capacity - 1, bit 5: a private run (d0
 * holds the run key, the others certificates; d0, d1, r1a and r1b present
 * theirs first, r2a and r2b are strangers). Then ops until the input ends,
 * each an op byte (op % 10):
 *   0-2 message: [from u8][type u8: 300 + type % 45][len u16le][len bytes]
 *       [tensor u8: 0 none; else dtype = t % 7 (0 raw, then the gwtf.DType
 *       values 1..6), bit 7 a chunk]; with a tensor: [ndim u8 % 6][ndim
 *       dims u8]; a chunk adds [nbytes u16le][offset u16le][total u16le]
 *       (else nbytes is what the shape says); then [fill u32le], the bytes
 *       the payload repeats. Tensors that p2p_tensor_check refuses never
 *       reach the peer (the frame layer closes the session), and those of
 *       more than 4 dimensions are dropped as node/train_node.c does.
 *   3   echo: [slot u8][type u8][off u8][val u8] one of the last messages
 *       the peer sent comes back from its addressee, as type (0: the same
 *       type, else 300 + type % 45), body byte off XORed with val, with the
 *       same tensor: microbatch ids, origins and paths are in there.
 *   4   tick: [dt u8] time moves (dt + 1) * 50 ms, train_peer_on_tick
 *   5   the oldest compute job completes: [rc u8] (>= 240: it failed)
 *   6   every queued compute job completes (in order, as the one worker does)
 *   7   peer down: [who u8]
 *   8   members: [stage u8][mask u8] the directory lists these cast members
 *   9   leader: [who u8]
 * At the end the jobs and the clock run out (timeouts fire), then the peer
 * is freed. */
#ifndef GWTF_TEST_FUZZ_TRAIN_H
#define GWTF_TEST_FUZZ_TRAIN_H

#include "util/id.h"

#define FUZZ_TRAIN_CAST (6)
/* message types 300..344: every train message, the replica and move ones included */
#define FUZZ_TRAIN_TYPES 45u
#define FUZZ_TRAIN_STAGES (2)
#define FUZZ_TRAIN_B (2)
#define FUZZ_TRAIN_T (4)
#define FUZZ_TRAIN_C (3)
#define FUZZ_TRAIN_NP (2)

enum {
  FUZZ_TRAIN_OP_MSG = 0,
  FUZZ_TRAIN_OP_ECHO = 3,
  FUZZ_TRAIN_OP_TICK = 4,
  FUZZ_TRAIN_OP_JOB = 5,
  FUZZ_TRAIN_OP_JOBS = 6,
  FUZZ_TRAIN_OP_DOWN = 7,
  FUZZ_TRAIN_OP_MEMBERS = 8,
  FUZZ_TRAIN_OP_LEADER = 9,
};

const gw_id *fuzz_train_cast(int i);

#endif
