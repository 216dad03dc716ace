/* Writes the seed corpora for the session, training, flow and file targets
 * (fuzz_targets.h):
 *
 *   fuzz_gen_corpus2 OUT_DIR   # OUT_DIR/{frame,train_msg,flow_msg,safetensors,run_record,member_*}
 *
 * Small valid inputs that reach deep, plus a few broken ones:
 *   frame        real sealed sessions (HELLO, messages, a tensor, GOODBYE)
 *                as wire bytes and as scripts, and honest handshakes;
 *   train_msg    each training message, well formed, to a peer in the state
 *                that handles it (a microbatch's journey through a relay
 *                and a data node, aggregation, joins, repairs);
 *   flow_msg     what one node of a real six-node flow swarm receives while
 *                its flows form (the target rebuilds the same node, so the
 *                segment ids match);
 *   safetensors  files from the writer (st_writer) and a few hand-made
 *                broken headers;
 *   run_record   encoded run records (open and private) and a few broken ones;
 *   member_token invite tokens signed with the targets' fixed run key, as
 *                text and packed, and field inputs for the round trip;
 *   member_cert  certificates and revocation lists signed with that key,
 *                and field inputs for their round trips.
 * The committed corpus under test/fuzz/corpus was made by this program (and
 * may grow with the fuzzer's own finds). */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flow.pb-c.h"
#include "flow/flow.h"
#include "fuzz_flow.h"
#include "fuzz_targets.h"
#include "fuzz_train.h"
#include "p2p/frame.h"
#include "p2p/handshake.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "proto/train.pb-c.h"
#include "train/avg_sig.h"
#include "train/member.h"
#include "train/run.h"
#include "train/safetensors.h"
#include "util/rng.h"

static const char *out_root;
static unsigned n_written;

static void write_file(const char *sub, const uint8_t *buf, size_t len) {
  fuzz_corpus_write(out_root, sub, buf, len);
  n_written++;
}

/* ---- a growable byte buffer ---- */

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    if (!b->p) exit(1);
  }
  if (n) memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put8(buf *b, uint8_t v) { put(b, &v, 1); }

static void put16(buf *b, uint16_t v) {
  put8(b, (uint8_t)v);
  put8(b, (uint8_t)(v >> 8));
}

static void put32(buf *b, uint32_t v) {
  put16(b, (uint16_t)v);
  put16(b, (uint16_t)(v >> 16));
}

static void put_msg(buf *b, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *tmp = malloc(n ? n : 1);
  protobuf_c_message_pack(m, tmp);
  put(b, tmp, n);
  free(tmp);
}

static void flush(const char *sub, buf *b) {
  write_file(sub, b->p, b->n);
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* ---- frame ---- */

static void envelope(buf *out, uint32_t type, const ProtobufCMessage *body, const Gwtf__TensorHeader *th) {
  Gwtf__Envelope env = GWTF__ENVELOPE__INIT;
  uint8_t peer[32];
  fuzz_frame_peer(peer);
  env.type = type;
  env.sender.data = peer;
  env.sender.len = 32;
  buf bb = {0};
  if (body) put_msg(&bb, body);
  env.body.data = bb.p;
  env.body.len = bb.n;
  env.tensor = (Gwtf__TensorHeader *)th;
  put_msg(out, &env.base);
  free(bb.p);
}

/* One record of a mode-1 script. */
static void script_rec(buf *s, uint8_t kind, const buf *rec) {
  put8(s, kind);
  put16(s, (uint16_t)rec->n);
  put(s, rec->p, rec->n);
}

static void gen_frame(void) {
  Gwtf__Hello hello = GWTF__HELLO__INIT;
  hello.listen_port = 4000;
  hello.agent = "gwtf/fuzz";
  hello.max_frame = 1 << 20;
  Gwtf__Ping ping = GWTF__PING__INIT;
  ping.nonce = 7;
  Gwtf__Goodbye bye = GWTF__GOODBYE__INIT;
  uint64_t shape[2] = {2, 3};
  Gwtf__TensorHeader th = GWTF__TENSOR_HEADER__INIT;
  th.dtype = GWTF__DTYPE__DTYPE_F32;
  th.n_shape = 2;
  th.shape = shape;
  th.nbytes = 24;
  uint8_t payload[24] = {1, 2, 3};
  /* Mode 1 scripts: HELLO, a ping, a tensor, goodbye; chunk sizes vary. */
  for (int variant = 0; variant < 4; variant++) {
    buf s = {0}, r = {0};
    put8(&s, 1);
    put8(&s, (uint8_t)(variant * 60));
    envelope(&r, GWTF__MSG_TYPE__MSG_HELLO, &hello.base, NULL);
    script_rec(&s, 0, &r);
    r.n = 0;
    envelope(&r, GWTF__MSG_TYPE__MSG_PING, &ping.base, NULL);
    script_rec(&s, 0, &r);
    r.n = 0;
    if (variant == 1) { /* a chunk of a larger tensor */
      th.offset = 24;
      th.total = 48;
      shape[0] = 4;
    }
    if (variant == 3) th.name = "w";
    envelope(&r, 300, NULL, &th);
    script_rec(&s, 0, &r);
    r.n = 0;
    put(&r, payload, sizeof(payload));
    script_rec(&s, 2, &r);
    r.n = 0;
    if (variant == 2) { /* bytes nobody sealed */
      put(&r, payload, 8);
      script_rec(&s, 3, &r);
      r.n = 0;
    }
    envelope(&r, GWTF__MSG_TYPE__MSG_GOODBYE, &bye.base, NULL);
    script_rec(&s, 1, &r);
    free(r.p);
    flush("frame", &s);
    th.offset = th.total = 0;
    shape[0] = 2;
    th.name = NULL;
  }
  /* Mode 0: the wire as a peer sends it, sealed with the fixed key. */
  uint8_t key[32], peer[32];
  fuzz_frame_key(key);
  fuzz_frame_peer(peer);
  gw_id sender;
  memcpy(sender.b, peer, 32);
  for (int variant = 0; variant < 3; variant++) {
    buf s = {0};
    put8(&s, 0);
    put8(&s, variant == 0 ? 255 : (uint8_t)(variant * 3));
    p2p_channel ch;
    uint8_t header[P2P_STREAM_HEADER_BYTES];
    p2p_channel_init_tx(&ch, key, header);
    put(&s, header, sizeof(header));
    buf hb = {0};
    put_msg(&hb, &hello.base);
    p2p_msg msgs[3];
    memset(msgs, 0, sizeof(msgs));
    msgs[0] = (p2p_msg){.type = GWTF__MSG_TYPE__MSG_HELLO, .body = hb.p, .body_len = hb.n};
    p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 2, .shape = {2, 3}};
    msgs[1] = (p2p_msg){.type = 310, .body = (const uint8_t *)"x", .body_len = 1, .tensor = &t, .data = payload,
                        .data_len = sizeof(payload)};
    msgs[2] = (p2p_msg){.type = GWTF__MSG_TYPE__MSG_GOODBYE};
    for (int k = 0; k < 3; k++) {
      uint8_t *w;
      size_t wl;
      if (p2p_frame_seal(&ch, &sender, &msgs[k], k == 2, FUZZ_FRAME_MAX, &w, &wl) != 0) exit(1);
      put(&s, w, wl);
      free(w);
    }
    if (variant == 2) s.n -= 5; /* cut mid-frame */
    free(hb.p);
    flush("frame", &s);
  }
  /* Mode 2: an honest msg1 for a responder; honest pairs (zero masks), one
   * with a flipped bit; a dialler reading zeros. */
  p2p_identity id;
  uint8_t seed[32];
  memset(seed, 0x33, sizeof(seed));
  p2p_identity_from_seed(seed, &id);
  p2p_handshake hs;
  p2p_hs_init(&hs, P2P_INITIATOR, &id, NULL);
  uint8_t m1[P2P_HS_MSG1_BYTES];
  p2p_hs_start(&hs, m1);
  buf s = {0};
  put8(&s, 2);
  put8(&s, 0);
  put(&s, m1, sizeof(m1));
  flush("frame", &s);
  for (int sub = 2; sub <= 3; sub++) {
    put8(&s, 2);
    put8(&s, (uint8_t)sub);
    uint8_t zeros[P2P_HS_MSG1_BYTES + P2P_HS_MSG2_BYTES + P2P_HS_MSG3_BYTES] = {0};
    if (sub == 3) zeros[P2P_HS_MSG1_BYTES + 3] = 1; /* the version byte of msg2 */
    put(&s, zeros, sizeof(zeros));
    flush("frame", &s);
  }
  put8(&s, 2);
  put8(&s, 1);
  put(&s, m1, 8);
  flush("frame", &s);
}

/* ---- train_msg ---- */

/* A message op up to its tensor byte: [op][from][type - 300][len][body]. */
static void t_msg_head(buf *s, int from, uint32_t type, const ProtobufCMessage *body) {
  put8(s, FUZZ_TRAIN_OP_MSG);
  put8(s, (uint8_t)from);
  put8(s, (uint8_t)(type - 300));
  buf bb = {0};
  if (body) put_msg(&bb, body);
  put16(s, (uint16_t)bb.n);
  put(s, bb.p, bb.n);
  free(bb.p);
}

static void t_msg(buf *s, int from, uint32_t type, const ProtobufCMessage *body, bool act) {
  t_msg_head(s, from, type, body);
  if (!act) {
    put8(s, 0);
    return;
  }
  put8(s, 1); /* F32 */
  put8(s, 3);
  put8(s, FUZZ_TRAIN_B), put8(s, FUZZ_TRAIN_T), put8(s, FUZZ_TRAIN_C);
  put32(s, 0x3c23d70a); /* 0.01f */
}

/* An activation or gradient in a compressed wire format (fuzz_train_lib.c:
 * spec bit 0x40 picks Q8ROW R4ROW R3ROW R2ROW LR8 LR16 LR32 LR32R4 R5ROW LR16R4
 * by index),
 * its bytes the 4-byte pattern `fill` repeated. */
static void t_msg_wire(buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint8_t index, uint8_t ndim,
                       const uint8_t *shape, uint32_t fill) {
  t_msg_head(s, from, type, body);
  put8(s, (uint8_t)(0x40 | index));
  put8(s, ndim);
  for (uint8_t i = 0; i < ndim; i++) put8(s, shape[i]);
  put32(s, fill);
}

/* A gradient or weights chunk: F32 over `total` floats, this chunk at offset. */
/* fuzz_train.h's tensor byte for a chunk of `dtype` (0 raw, then the
 * gwtf.DType values): bit 7 set, bit 6 clear, and byte % 7 == dtype. Not
 * 0x80 | dtype: 0x81 % 7 is 3, so the "F32" seeds were BF16. */
static uint8_t chunk_dtype_byte(uint8_t dtype) { return (uint8_t)(0x80 + (dtype + 7 - 0x80 % 7) % 7); }

static void t_msg_chunk(buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint8_t dtype, uint16_t nbytes,
                        uint16_t offset, uint16_t total) {
  t_msg_head(s, from, type, body);
  put8(s, chunk_dtype_byte(dtype));
  put8(s, 1);
  put8(s, (uint8_t)(dtype == 1 ? total / 4 : total));
  put16(s, nbytes);
  put16(s, offset);
  put16(s, total);
  put32(s, 0x3c23d70a);
}

static void t_f32_chunk(buf *s, int from, uint32_t type, const ProtobufCMessage *body, uint16_t nbytes,
                        uint16_t offset, uint16_t total) {
  t_msg_chunk(s, from, type, body, 1, nbytes, offset, total);
}

static void t_op(buf *s, uint8_t op, int arg) {
  put8(s, op);
  if (arg >= 0) put8(s, (uint8_t)arg);
}

static void t_echo(buf *s, uint8_t slot, uint32_t type) {
  put8(s, FUZZ_TRAIN_OP_ECHO);
  put8(s, slot);
  put8(s, type ? (uint8_t)(type - 300) : 0);
  put8(s, 0), put8(s, 0);
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

static void gen_train(void) {
  enum { D0 = 0, D1 = 1, R1A = 2, R1B = 3, R2A = 4, R2B = 5 };
  ProtobufCBinaryData path[4] = {idb(D0), idb(R1A), idb(R2A)};
  buf s = {0};
  /* A relay of stage 1 carries a microbatch forward and back. */
  for (int variant = 0; variant < 2; variant++) {
    put8(&s, (uint8_t)(R1A + 6 * (variant ? 4 : 0)));
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
    flush("train_msg", &s);
  }
  /* A private run: a relay of stage 1 takes a microbatch from d0 (a
   * member) and is sent one by r2a (a stranger), a JOIN and a redeem. */
  for (int variant = 0; variant < 2; variant++) {
    put8(&s, (uint8_t)((variant ? D0 : R1A) + 6 * 32));
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
    flush("train_msg", &s);
  }
  /* Compressed tensors at a stage-1 relay: a valid rot3 activation (rows of
   * a bf16 scale 1.0, a code byte, a padding byte with only its used bit),
   * the same with a padding bit set, then an lr8 and an lr32r4 gradient of
   * zeros (valid) and one of each whose means are Inf (refused). */
  put8(&s, R1A);
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
    flush("train_msg", &s);
  }
  /* The last relay (stage 2) sends back to the data node. */
  put8(&s, R2A);
  {
    Gwtf__TrainMicrobatch m = mb_for(D0, 0, path, 2);
    t_msg(&s, R1A, 310, &m.base, true);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_echo(&s, 0, 313);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    flush("train_msg", &s);
  }
  /* A data node starts an iteration, its microbatches go round. */
  for (int variant = 0; variant < 2; variant++) {
    put8(&s, (uint8_t)(D0 + 6 * (variant ? 8 : 0)));
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
    flush("train_msg", &s);
  }
  /* Aggregation at a relay: BEGIN_AGG, a member's gradient, the average. */
  {
    put8(&s, R1A);
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
    flush("train_msg", &s);
  }
  /* Signed averages (train/avg_sig.h): a relay in a round hears, from its
   * aggregator, one with a real signature by a key outside the cast, one
   * with its fields cut short, and one that claims a skipped step. */
  {
    put8(&s, R1B); /* r1a, the lower ID, aggregates: its averages pass the row */
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
    flush("train_msg", &s);
  }
  /* The leader (d0, if its ID is the lower) hears ITER_DONE, JOIN. */
  for (int who = D0; who <= D1; who++) {
    put8(&s, (uint8_t)who);
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
    flush("train_msg", &s);
  }
  /* A joiner: unassigned relay, the leader assigns it, it fetches weights. */
  {
    put8(&s, (uint8_t)(R2B + 6 * 3));
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
    flush("train_msg", &s);
  }
  /* A ready relay serves its weights. */
  {
    put8(&s, R2A);
    Gwtf__TrainWeightsReq wr = GWTF__TRAIN_WEIGHTS_REQ__INIT;
    wr.stage = 2;
    t_msg(&s, R2B, 303, &wr.base, false);
    t_op(&s, FUZZ_TRAIN_OP_JOBS, -1);
    t_op(&s, FUZZ_TRAIN_OP_TICK, 5);
    flush("train_msg", &s);
  }
  /* Repairs: a relay reports, the origin probes, the last live peer repairs. */
  {
    put8(&s, D0);
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
    flush("train_msg", &s);
  }
  {
    put8(&s, R1A);
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
    flush("train_msg", &s);
  }
  /* Junk: an unknown type, a malformed body, a tensor the shape refuses. */
  put8(&s, R1B);
  put8(&s, 0), put8(&s, D0), put8(&s, 7), put16(&s, 3), put(&s, "abc", 3), put8(&s, 0);
  put8(&s, 0), put8(&s, D0), put8(&s, 10), put16(&s, 2), put(&s, "\x0a\xff", 2), put8(&s, 0);
  put8(&s, 0), put8(&s, D0), put8(&s, 10), put16(&s, 0), put8(&s, 1), put8(&s, 2), put8(&s, 200), put8(&s, 200);
  put32(&s, 0x7fc00000); /* NaN */
  flush("train_msg", &s);
}

/* ---- flow_msg: one node of a real swarm, recorded ---- */

typedef struct qmsg {
  int from, to;
  size_t len;
  uint8_t *p;
} qmsg;

typedef struct swarm {
  flow *f[FUZZ_FLOW_CAST];
  gw_rng rng[FUZZ_FLOW_CAST];
  int ctx[FUZZ_FLOW_CAST];
  qmsg *q;
  size_t nq, cap;
} swarm;

static swarm sw;

static int cast_of(const gw_id *id) {
  for (int i = 0; i < FUZZ_FLOW_CAST; i++)
    if (gw_id_eq(id, fuzz_flow_cast(i))) return i;
  return -1;
}

static int sw_send(void *ud, const gw_peer *to, const uint8_t *b, size_t len) {
  int from = *(int *)ud;
  if (sw.nq == sw.cap) {
    sw.cap = sw.cap ? 2 * sw.cap : 256;
    sw.q = realloc(sw.q, sw.cap * sizeof(*sw.q));
  }
  qmsg *m = &sw.q[sw.nq++];
  m->from = from;
  m->to = cast_of(&to->id);
  m->len = len;
  m->p = malloc(len ? len : 1);
  memcpy(m->p, b, len);
  return 0;
}

static void sw_tick(void *ud, uint64_t at) { (void)ud, (void)at; }

static void sw_random(void *ud, void *b, size_t len) { gw_rng_bytes(&sw.rng[*(int *)ud], b, len); }

/* How many of the recorded messages to self are of oneof case `kind`. */
static int count_kind(const qmsg *got, size_t n, int kind) {
  int c = 0;
  for (size_t k = 0; k < n; k++) {
    Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, got[k].len, got[k].p);
    if (m && (int)m->msg_case == kind) c++;
    gwtf__flow_message__free_unpacked(m, NULL);
  }
  return c;
}

/* The swarm for `rounds` rounds of 2 s, self's input recorded. From round
 * `quiet_from` on (when silent >= 0) node `silent` neither ticks nor is
 * heard, though what is sent to it still arrives: its neighbours ping it
 * and, once its pings go unanswered, tell each other it is gone. Returns
 * how many messages to self were of oneof case `want` (0: none asked). */
static int gen_flow_run(int self, int capacity, int rounds, int silent, int quiet_from, int want) {
  memset(&sw, 0, sizeof(sw));
  buf s = {0};
  qmsg got[512];
  size_t n_got = 0;
  put8(&s, (uint8_t)(self + FUZZ_FLOW_CAST * (capacity - 1)));
  for (int i = 0; i < FUZZ_FLOW_CAST; i++) {
    sw.ctx[i] = i;
    gw_rng_seed(&sw.rng[i], FUZZ_FLOW_SEED(i));
    gw_io io = {.ud = &sw.ctx[i], .send = sw_send, .want_tick = sw_tick, .random = sw_random};
    if (fuzz_flow_make(i, capacity, &io, &sw.f[i]) != 0) exit(1);
    flow_start(sw.f[i], 0);
  }
  uint64_t now = 0;
  for (int r = 0; r < rounds; r++) {
    bool quiet = silent >= 0 && r >= quiet_from;
    now += 2000;
    for (int i = 0; i < FUZZ_FLOW_CAST; i++)
      if (!(quiet && i == silent)) flow_on_tick(sw.f[i], now);
    put8(&s, 4), put8(&s, 19); /* self's tick: (19 + 1) * 100 ms */
    for (size_t k = 0; k < sw.nq && k < 4000; k++) {
      qmsg m = sw.q[k];
      gw_peer from = {.id = *fuzz_flow_cast(m.from)};
      if (quiet && m.from == silent) continue; /* freed below */
      if (m.to == self) {
        put8(&s, 0), put8(&s, (uint8_t)m.from), put16(&s, (uint16_t)m.len), put(&s, m.p, m.len);
        if (want && quiet && n_got < sizeof(got) / sizeof(got[0])) {
          got[n_got] = m;
          got[n_got].p = malloc(m.len ? m.len : 1);
          memcpy(got[n_got++].p, m.p, m.len);
        }
      }
      if (m.to >= 0) flow_on_message(sw.f[m.to], &from, m.p, m.len, now);
    }
    for (size_t k = 0; k < sw.nq; k++) free(sw.q[k].p);
    sw.nq = 0;
  }
  for (int i = 0; i < FUZZ_FLOW_CAST; i++) flow_free(sw.f[i]);
  free(sw.q);
  flush("flow_msg", &s);
  int c = want ? count_kind(got, n_got, want) : 0;
  for (size_t k = 0; k < n_got; k++) free(got[k].p);
  return c;
}

static void gen_flow_one(int self, int capacity, int rounds) { gen_flow_run(self, capacity, rounds, -1, 0, 0); }

static void gen_flow(void) {
  gen_flow_one(0, 1, 8);  /* a data node */
  gen_flow_one(2, 1, 8);  /* a relay of the first stage */
  gen_flow_one(4, 2, 8);  /* the last stage, room for two */
  gen_flow_one(3, 2, 14); /* longer: changes and redirects between same-stage peers */
  /* Liveness (flow_live.c), which a healthy swarm never exercises: self
   * falls silent and is pinged; its same-stage peer falls silent and self
   * hears from their neighbours that it is gone. Each seed must hold what it is for. */
  if (gen_flow_run(3, 2, 14, 3, 8, GWTF__FLOW_MESSAGE__MSG_PING) == 0 ||
      gen_flow_run(3, 2, 14, 2, 8, GWTF__FLOW_MESSAGE__MSG_GONE) == 0) {
    fprintf(stderr, "fuzz_gen_corpus2: a liveness seed holds no FlowPing or no FlowGone\n");
    exit(1);
  }
  /* Junk: bytes that are no FlowMessage, from a peer and echoed. */
  buf s = {0};
  put8(&s, 2);
  put8(&s, 0), put8(&s, 0), put16(&s, 3), put(&s, "\x08\x01\x12", 3);
  put8(&s, 4), put8(&s, 19), put8(&s, 3), put8(&s, 0), put8(&s, 1), put8(&s, 0x40);
  put8(&s, 5), put8(&s, 4), put8(&s, 0), put8(&s, 7), put8(&s, 0);
  flush("flow_msg", &s);
}

/* ---- safetensors ---- */

static void gen_safetensors(void) {
  float w[6] = {1, 2, 3, 4, 5, 6};
  int32_t ids[4] = {1, 2, 3, 4};
  uint16_t half[2] = {0x3c00, 0x4000};
  for (int variant = 0; variant < 4; variant++) {
    st_writer wr;
    st_writer_init(&wr);
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s2[1] = {2}, s0[1] = {0};
    if (variant != 3) st_writer_add(&wr, "w", ST_F32, s23, 2, w);
    if (variant >= 1) st_writer_add(&wr, "ids", ST_I32, s4, 1, ids);
    if (variant == 2) {
      st_writer_add(&wr, "h", ST_BF16, s2, 1, half);
      st_writer_add(&wr, "empty", ST_F16, s0, 1, NULL);
      st_writer_meta(&wr, "format", "pt");
    }
    uint8_t *head;
    size_t hl;
    if (st_writer_header(&wr, &head, &hl) != 0) exit(1);
    buf b = {0};
    put(&b, head, hl);
    for (size_t i = 0; i < wr.n; i++) put(&b, wr.tensors[i].data, wr.tensors[i].bytes);
    free(head);
    st_writer_free(&wr);
    flush("safetensors", &b);
  }
  /* Hand-made headers the reader must refuse. */
  static const char *bad[] = {
      /* overlapping tensors (one string over two lines) */
      ("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
       "\"data_offsets\":[4,8]}}"),
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}",
      "{\"__metadata__\":{\"k\":1},\"a\":{\"dtype\":\"X9\",\"shape\":[],\"data_offsets\":[0,1]}}",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    buf b = {0};
    uint64_t n = strlen(bad[i]);
    for (int k = 0; k < 8; k++) put8(&b, (uint8_t)(n >> (8 * k)));
    put(&b, bad[i], n);
    put(&b, w, 8);
    flush("safetensors", &b);
  }
}

/* ---- run_record ---- */

static void gen_run(void) {
  for (int variant = 0; variant < 3; variant++) {
    train_run r;
    memset(&r, 0, sizeof(r));
    snprintf(r.name, sizeof(r.name), "fuzz%d", variant);
    if (model_preset_get("tiny", &r.model) != 0) exit(1);
    r.stages = variant + 1;
    if (r.model.n_layers < r.stages) r.stages = r.model.n_layers;
    r.batch = 2;
    r.seq = 8;
    r.microbatches = 4;
    r.lr = 3e-4;
    r.seed = 42 + (uint64_t)variant;
    gw_id_hash_str("leader", &r.leader);
    if (variant == 2) snprintf(r.dataset, sizeof(r.dataset), "data/tiny.txt");
    if (variant == 1) {
      r.private_run = true;
      memset(r.run_key, 0xab, sizeof(r.run_key));
    }
    char *text = train_run_encode(&r);
    if (!text) exit(1);
    write_file("run_record", (const uint8_t *)text, strlen(text));
    free(text);
  }
  const char *bad[] = {"{\"version\":1}", "[1,2,3]", "{\"version\":1,\"name\":\"x\",\"model\":{},\"stages\":0}"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    write_file("run_record", (const uint8_t *)bad[i], strlen(bad[i]));
}

/* ---- private runs ---- */

/* mode byte + payload */
static void write_mode(const char *sub, uint8_t mode, const uint8_t *p, size_t n) {
  uint8_t *b = malloc(n + 1);
  if (!b) exit(1);
  b[0] = mode;
  memcpy(b + 1, p, n);
  write_file(sub, b, n + 1);
  free(b);
}

static void gen_member(void) {
  member_key k;
  fuzz_member_key(&k);
  for (int v = 0; v < 3; v++) {
    member_invite inv;
    memset(&inv, 0, sizeof(inv));
    snprintf(inv.run, sizeof(inv.run), v ? "fuzz" : "a-longer-run-name.v2");
    memcpy(inv.run_key, k.pk, 32);
    gw_id_hash_str("creator", &inv.creator);
    snprintf(inv.creator_addr, sizeof(inv.creator_addr), v == 2 ? "[2001:db8::1]:7447" : "192.0.2.1:7447");
    memset(inv.id, v + 1, sizeof(inv.id));
    inv.expires = v == 1 ? 0 : 1800000000;
    inv.uses = (uint32_t)v;
    char text[MEMBER_TOKEN_TEXT_MAX];
    if (member_token_make(&inv, &k, text, sizeof(text)) != 0) exit(1);
    write_mode("member_token", 0, (const uint8_t *)text, strlen(text));
    uint8_t *bin = NULL;
    size_t len = 0;
    if (member_token_to_bin(text, &bin, &len) != 0) exit(1);
    write_mode("member_token", 1, bin, len);
    free(bin);
    uint8_t fields[96];
    for (size_t i = 0; i < sizeof(fields); i++) fields[i] = (uint8_t)(i * 7 + (size_t)v * 13);
    write_mode("member_token", 2, fields, sizeof(fields));

    member_cert c;
    memset(&c, 0, sizeof(c));
    snprintf(c.run, sizeof(c.run), v ? "fuzz" : "other");
    memcpy(c.run_key, k.pk, 32);
    gw_id_hash_str(v == 2 ? "peer-b" : "peer-a", &c.peer);
    c.issued = 1700000000;
    c.expires = c.issued + (uint64_t)v * 86400;
    if (member_cert_make(&c, &k, &bin, &len) != 0) exit(1);
    write_mode("member_cert", 0, bin, len);
    free(bin);
    member_revocations r;
    gw_id ids[3];
    memset(&r, 0, sizeof(r));
    snprintf(r.run, sizeof(r.run), "fuzz");
    r.seq = (uint64_t)v + 1;
    for (int i = 0; i < 3; i++) gw_id_hash_str(i ? "peer-b" : "peer-a", &ids[i]);
    r.peers = ids;
    r.n = (size_t)v;
    if (member_revocations_make(&r, k.pk, &k, &bin, &len) != 0) exit(1);
    write_mode("member_cert", 1, bin, len);
    free(bin);
    write_mode("member_cert", 2, fields, sizeof(fields));
    write_mode("member_cert", 3, fields, sizeof(fields));
  }
  write_mode("member_token", 0, (const uint8_t *)"gwtf1:", 6);
  write_mode("member_token", 0, (const uint8_t *)"gwtf1:!!notbase64", 17);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_gen_corpus2 OUT_DIR\n");
    return 2;
  }
  out_root = argv[1];
  const char *subs[] = {"frame", "train_msg", "flow_msg", "safetensors", "run_record", "member_token", "member_cert"};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_root, subs[i]);
    mkdir(out_root, 0755);
    mkdir(path, 0755);
  }
  p2p_crypto_init();
  gen_frame();
  gen_train();
  gen_flow();
  gen_safetensors();
  gen_run();
  gen_member();
  printf("fuzz_gen_corpus2: %u files written under %s\n", n_written, out_root);
  return 0;
}
