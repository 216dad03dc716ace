/* test/fuzz/fuzz_gen_corpus2_train.c — the train_msg seed corpus of
 * fuzz_gen_corpus2 (fuzz_gen_corpus2.c): each training message, well formed,
 * to a peer in the state that handles it, as scripts for fuzz_train_lib.c. */
#include <sodium.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_gen.h"
#include "fuzz_train.h"
#include "proto/train.pb-c.h"
#include "train/avg_sig.h"

/* ---- train_msg ---- */

/* A message op up to its tensor byte: [op][from][type - 300][len][body]. */
static void t_msg_head(gen_buf *s, int from, uint32_t type, const ProtobufCMessage *body) {
  gen_put8(s, FUZZ_TRAIN_OP_MSG);
  gen_put8(s, (uint8_t)from);
  gen_put8(s, (uint8_t)(type - 300));
  gen_buf bb = {0};
  if (body) gen_put_msg(&bb, body);
  gen_put16(s, (uint16_t)bb.n);
  gen_put(s, bb.p, bb.n);
  free(bb.p);
}

static void t_msg(gen_buf *s, int from, uint32_t type, const ProtobufCMessage *body, bool act) {
  t_msg_head(s, from, type, body);
  if (!act) {
    gen_put8(s, 0);
    return;
  }
  gen_put8(s, 1); /* F32 */
  gen_put8(s, 3);
  gen_put8(s, FUZZ_TRAIN_B), gen_put8(s, FUZZ_TRAIN_T), gen_put8(s, FUZZ_TRAIN_C);
  gen_put32(s, 0x3c23d70a); /* 0.01f */
}

/* An activation or gradient in a compressed wire format (fuzz_train_lib.c:
 * spec bit 0x40 picks Q8ROW R4ROW R3ROW R2ROW LR8 LR16 LR32 LR32R4 R5ROW LR16R4
 * by index),
 * its bytes the 4-byte pattern `fill` repeated. */
static void t_msg_wire(gen_buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint8_t index, uint8_t ndim,
                       const uint8_t *shape, uint32_t fill) {
  t_msg_head(s, from, type, body);
  gen_put8(s, (uint8_t)(0x40 | index));
  gen_put8(s, ndim);
  for (uint8_t i = 0; i < ndim; i++) gen_put8(s, shape[i]);
  gen_put32(s, fill);
}

/* A gradient or weights chunk: F32 over `total` floats, this chunk at offset. */
/* fuzz_train.h's tensor byte for a chunk of `dtype` (0 raw, then the
 * gwtf.DType values): bit 7 set, bit 6 clear, and byte % 7 == dtype. Not
 * 0x80 | dtype: 0x81 % 7 is 3, so the "F32" seeds were BF16. */
static uint8_t chunk_dtype_byte(uint8_t dtype) { return (uint8_t)(0x80 + (dtype + 7 - 0x80 % 7) % 7); }

static void t_msg_chunk(gen_buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint8_t dtype, uint16_t nbytes,
                        uint16_t offset, uint16_t total) {
  t_msg_head(s, from, type, body);
  gen_put8(s, chunk_dtype_byte(dtype));
  gen_put8(s, 1);
  gen_put8(s, (uint8_t)(dtype == 1 ? total / 4 : total));
  gen_put16(s, nbytes);
  gen_put16(s, offset);
  gen_put16(s, total);
  gen_put32(s, 0x3c23d70a);
}

static void t_f32_chunk(gen_buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint16_t nbytes,
                        uint16_t offset, uint16_t total) {
  t_msg_chunk(s, from, type, body, 1, nbytes, offset, total);
}

static void t_op(gen_buf *s, uint8_t op, int arg) {
  gen_put8(s, op);
  if (arg >= 0) gen_put8(s, (uint8_t)arg);
}

static void t_echo(gen_buf *s, uint8_t slot, uint32_t type) {
  gen_put8(s, FUZZ_TRAIN_OP_ECHO);
  gen_put8(s, slot);
  gen_put8(s, type ? (uint8_t)(type - 300) : 0);
  gen_put8(s, 0), gen_put8(s, 0);
}

static Gwtf__TrainMicrobatch mb_for(int origin, uint64_t id, ProtobufCBinaryData *path, size_t n_path) {
  Gwtf__TrainMicrobatch m = GWTF__TRAIN_MICROBATCH__INIT;
  m.id = id;
  m.origin.data = (uint8_t *)fuzz_train_cast(origin)->b;
  m.origin.len = 32;
  m.n_path = n_path;
  m.path = path;
  return m;
}

static ProtobufCBinaryData idb(int i) { return (ProtobufCBinaryData){32, (uint8_t *)fuzz_train_cast(i)->b}; }

void gen_train_corpus(void) {
  enum { D0 = 0, D1 = 1, R1A = 2, R1B = 3, R2A = 4, R2B = 5 };
  ProtobufCBinaryData path[4] = {idb(D0), idb(R1A), idb(R2A)};
  gen_buf s = {0};
  /* A relay of stage 1 carries a microbatch forward and back. */
  for (int variant = 0; variant < 2; variant++) {
    gen_put8(&s, (uint8_t)(R1A + 6 * (variant ? 4 : 0)));
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 1);
    t_msg(&s, D0, 310, &m.base, true);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 329); /* the next hop has it */
    t_echo(&s, 0, 311); /* and passed it on */
    t_op(&s, FUZZ_TRAIN_OP_TICK, 3);
    t_echo(&s, 0, 313); /* the gradient comes back */
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 314);
    if (variant) t_op(&s, FUZZ_TRAIN_OP_DOWN, R2A);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 200);
    gen_flush("train_msg", &s);
  }
  /* A private run: a relay of stage 1 takes a microbatch from d0 (a
   * member) and is sent one by r2a (a stranger), a JOIN and a redeem. */
  for (int variant = 0; variant < 2; variant++) {
    gen_put8(&s, (uint8_t)((variant ? D0 : R1A) + 6 * 32));
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 1);
    t_msg(&s, D0, 310, &m.base, true);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_msg(&s, R2A, 310, &m.base, true);
    Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
    j.capacity = 2;
    t_msg(&s, R2B, 301, &j.base, false);
    Gwtf__TrainRedeem rd = GWTF__TRAIN_REDEEM__INIT;
    rd.token = (ProtobufCBinaryData){4, (uint8_t *)"\x0a\x02\x08\x01"};
    t_msg(&s, R2B, 331, &rd.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 30);
    gen_flush("train_msg", &s);
  }
  /* Compressed tensors at a stage-1 relay: a valid rot3 activation (rows of
   * a bf16 scale 1.0, a code byte, a padding byte with only its used bit),
   * the same with a padding bit set, then an lr8 and an lr32r4 gradient of
   * zeros (valid) and one of each whose means are Inf (refused). */
  gen_put8(&s, R1A);
  {
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 1);
    const uint8_t r3[3] = {FUZZ_TRAIN_B, FUZZ_TRAIN_T, 4}; /* 2 + ceil(3 x 3 / 8) bytes a row */
    t_msg_wire(&s, D0, 310, &m.base, 2, 3, r3, 0x015a3f80u);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainMicrobatch m2 = mb_for(D0, 1, path, 1);
    t_msg_wire(&s, D0, 310, &m2.base, 2, 3, r3, 0x815a3f80u);
    Gwtf__TrainMicrobatch b = mb_for(D0, 0, path, 2);
    const uint8_t l8[1] = {2 * FUZZ_TRAIN_C + (FUZZ_TRAIN_B * FUZZ_TRAIN_T + FUZZ_TRAIN_C) * 10};
    t_msg_wire(&s, R2A, 313, &b.base, 4, 1, l8, 0);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_msg_wire(&s, R2A, 313, &b.base, 4, 1, l8, 0x7f807f80u);
    /* lr32r4: factor rows of a bf16 scale and 16 code bytes */
    const uint8_t l32r4[1] = {2 * FUZZ_TRAIN_C + (FUZZ_TRAIN_B * FUZZ_TRAIN_T + FUZZ_TRAIN_C) * 18};
    t_msg_wire(&s, R2A, 313, &b.base, 7, 1, l32r4, 0);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_msg_wire(&s, R2A, 313, &b.base, 7, 1, l32r4, 0x7f807f80u);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 30);
    gen_flush("train_msg", &s);
  }
  /* The last relay (stage 2) sends back to the data node. */
  gen_put8(&s, R2A);
  {
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 2);
    t_msg(&s, R1A, 310, &m.base, true);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 313);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    gen_flush("train_msg", &s);
  }
  /* A data node starts an iteration, its microbatches go round. */
  for (int variant = 0; variant < 2; variant++) {
    gen_put8(&s, (uint8_t)(D0 + 6 * (variant ? 8 : 0)));
    t_op(&s, FUZZ_TRAIN_OP_TICK, 2);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 329);
    t_echo(&s, 0, 311);
    t_echo(&s, 0, 310); /* back from the last stage: the loss */
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 313);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 40);
    if (variant) t_echo(&s, 1, 312); /* DENY */
    gen_flush("train_msg", &s);
  }
  /* Aggregation at a relay: BEGIN_AGG, a member's gradient, the average. */
  {
    gen_put8(&s, R1A);
    Gwtf__TrainIteration it = GWTF__TRAIN_ITERATION__INIT;
    t_msg(&s, D0, 321, &it.base, false);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
    g.stage = 1;
    g.count = 1;
    g.total = 2;
    t_msg_chunk(&s, R1B, 322, &g.base, 1, 4, 0, 8);
    g.offset = 1;
    t_msg_chunk(&s, R1B, 322, &g.base, 1, 4, 4, 8);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 323); /* an average that looks like ours */
    ProtobufCBinaryData contrib[2] = {idb(R1A), idb(R1B)};
    g.offset = 0;
    g.n_contributors = 2;
    g.contributors = contrib;
    g.total_count = 2;
    t_msg_chunk(&s, R1B, 323, &g.base, 1, 8, 0, 8);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainAggDone ad = GWTF__TRAIN_AGG_DONE__INIT;
    uint8_t hash[32];
    memset(hash, 7, sizeof(hash));
    ad.stage = 1;
    ad.hash = (ProtobufCBinaryData){32, hash};
    t_msg(&s, R1B, 324, &ad.base, false);
    t_msg(&s, R2A, 325, &it.base, false);
    it.iteration = 1;
    t_msg(&s, R1B, 327, &it.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 60);
    gen_flush("train_msg", &s);
  }
  /* Signed averages (train/avg_sig.h): a relay in a round hears, from its
   * aggregator, one with a real signature by a key outside the cast, one
   * with its fields cut short, and one that claims a skipped step. */
  {
    gen_put8(&s, R1B); /* r1a, the lower ID, aggregates: its averages pass the row */
    Gwtf__TrainIteration it = GWTF__TRAIN_ITERATION__INIT;
    t_msg(&s, D0, 321, &it.base, false);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    uint8_t seed[32], pk[32], sk[64], sig[64], hash[32], run[32] = {0};
    memset(seed, 0x33, sizeof(seed));
    crypto_sign_seed_keypair(pk, sk, seed);
    float v[2] = {0.5f, -0.25f};
    avg_sig_hash_floats(v, 2, hash);
    gw_id ids[2] = {*fuzz_train_cast(R1A), *fuzz_train_cast(R1B)};
    uint8_t hs[2][32];
    memset(hs, 9, sizeof(hs));
    avg_sig_fields f = {.run_id = run, .stage = 1, .iteration = 0, .total_count = 2, .n_floats = 2,
                        .contributors = ids, .hashes = (const uint8_t(*)[32])hs, .n_contributors = 2,
                        .avg_hash = hash};
    avg_sig_sign(&f, sk, sig);
    Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
    ProtobufCBinaryData contrib[2] = {idb(R1A), idb(R1B)}, chash[2] = {{32, hs[0]}, {32, hs[1]}};
    g.stage = 1;
    g.total = 2;
    g.total_count = 2;
    g.n_contributors = 2;
    g.contributors = contrib;
    g.n_contributor_hashes = 2;
    g.contributor_hashes = chash;
    g.avg_key = (ProtobufCBinaryData){32, pk};
    g.avg_hash = (ProtobufCBinaryData){32, hash};
    g.avg_sig = (ProtobufCBinaryData){64, sig};
    t_f32_chunk(&s, R1A, 323, &g.base, 8, 0, 8);
    g.avg_sig.len = 63;
    t_f32_chunk(&s, R1A, 323, &g.base, 8, 0, 8);
    g.avg_sig.len = 64;
    g.total = 0;
    g.total_count = 0;
    t_msg(&s, R1A, 323, &g.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 60);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    gen_flush("train_msg", &s);
  }
  /* The leader (d0, if its ID is the lower) hears ITER_DONE, JOIN. */
  for (int who = D0; who <= D1; who++) {
    gen_put8(&s, (uint8_t)who);
    Gwtf__TrainIterDone idn = GWTF__TRAIN_ITER_DONE__INIT;
    idn.done = 2;
    idn.loss_sum = 3.0;
    t_msg(&s, 1 - who, 320, &idn.base, false);
    Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
    j.capacity = 2;
    j.device = "cpu";
    t_msg(&s, R2B, 301, &j.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 20);
    Gwtf__TrainLeader l = GWTF__TRAIN_LEADER__INIT;
    l.leader = idb(1 - who);
    t_msg(&s, 1 - who, 326, &l.base, false);
    Gwtf__TrainHello h = GWTF__TRAIN_HELLO__INIT;
    h.role = GWTF__TRAIN_ROLE__TRAIN_ROLE_DATA;
    h.capacity = 2;
    h.iteration = 1;
    t_msg(&s, 1 - who, 300, &h.base, false);
    gen_flush("train_msg", &s);
  }
  /* A joiner: unassigned relay, the leader assigns it, it fetches weights. */
  {
    gen_put8(&s, (uint8_t)(R2B + 6 * 3));
    t_op(&s, FUZZ_TRAIN_OP_TICK, 20);
    Gwtf__TrainAssign a = GWTF__TRAIN_ASSIGN__INIT;
    ProtobufCBinaryData peers[1] = {idb(R2A)};
    a.stage = 2;
    a.n_stage_peers = 1;
    a.stage_peers = peers;
    int leader = gw_id_cmp(fuzz_train_cast(D0), fuzz_train_cast(D1)) < 0 ? D0 : D1;
    t_msg(&s, leader, 302, &a.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 2);
    Gwtf__TrainWeightsChunk c = GWTF__TRAIN_WEIGHTS_CHUNK__INIT;
    uint8_t hash[32] = {0};
    c.stage = 2;
    c.hash = (ProtobufCBinaryData){32, hash};
    c.total = 16;
    t_msg_chunk(&s, R2A, 304, &c.base, 6, 8, 0, 16);
    c.offset = 8;
    t_msg_chunk(&s, R2A, 304, &c.base, 6, 8, 8, 16);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 100);
    gen_flush("train_msg", &s);
  }
  /* A ready relay serves its weights. */
  {
    gen_put8(&s, R2A);
    Gwtf__TrainWeightsReq wr = GWTF__TRAIN_WEIGHTS_REQ__INIT;
    wr.stage = 2;
    t_msg(&s, R2B, 303, &wr.base, false);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 5);
    gen_flush("train_msg", &s);
  }
  /* Repairs: a relay reports, the origin probes, the last live peer repairs. */
  {
    gen_put8(&s, D0);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 2);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainRecover rc = GWTF__TRAIN_RECOVER__INIT;
    rc.origin = idb(D0);
    rc.suspect = idb(R2A);
    rc.suspect_stage = 2;
    rc.reporter = idb(R1A);
    t_msg(&s, R1A, 315, &rc.base, false);
    Gwtf__TrainProbeReply pr = GWTF__TRAIN_PROBE_REPLY__INIT;
    pr.has_output = true;
    pr.stage = 1;
    t_msg(&s, R1A, 317, &pr.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 30);
    gen_flush("train_msg", &s);
  }
  {
    gen_put8(&s, R1A);
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 1);
    t_msg(&s, D0, 310, &m.base, true);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainAck ack = GWTF__TRAIN_ACK__INIT;
    ack.origin = idb(D0);
    t_msg(&s, D0, 316, &ack.base, false);
    Gwtf__TrainRepair rp = GWTF__TRAIN_REPAIR__INIT;
    ProtobufCBinaryData avoid[1] = {idb(R2A)};
    rp.origin = idb(D0);
    rp.gap_first_stage = 2;
    rp.gap_last_stage = 2;
    rp.target = idb(D0);
    rp.n_path = 2;
    rp.path = path;
    rp.n_avoid = 1;
    rp.avoid = avoid;
    t_msg(&s, D0, 318, &rp.base, false);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    Gwtf__TrainMicrobatch rr = mb_for(D0, 0, path, 3);
    rr.repair = true;
    rr.repair_end_stage = 2;
    rr.repair_target = idb(R1A);
    t_msg(&s, R2B, 319, &rr.base, false);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 50);
    gen_flush("train_msg", &s);
  }
  /* Junk: an unknown type, a malformed body, a tensor the shape refuses. */
  gen_put8(&s, R1B);
  gen_put8(&s, 0), gen_put8(&s, D0), gen_put8(&s, 7), gen_put16(&s, 3), gen_put(&s, "abc", 3), gen_put8(&s, 0);
  gen_put8(&s, 0), gen_put8(&s, D0), gen_put8(&s, 10), gen_put16(&s, 2), gen_put(&s, "\x0a\xff", 2), gen_put8(&s, 0);
  gen_put8(&s, 0), gen_put8(&s, D0), gen_put8(&s, 10), gen_put16(&s, 0), gen_put8(&s, 1), gen_put8(&s, 2), gen_put8(&s, 200), gen_put8(&s, 200);
  gen_put32(&s, 0x7fc00000); /* NaN */
  gen_flush("train_msg", &s);
}

