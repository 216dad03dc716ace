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
 * may grow with the fuzzer's own finds). The train_msg part is in
 * fuzz_gen_corpus2_train.c; the byte buffer all parts write with, fuzz_gen.h. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "flow.pb-c.h"
#include "flow/flow.h"
#include "fuzz_flow.h"
#include "fuzz_targets.h"
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

#include "fuzz_gen.h"

/* ---- frame ---- */

static void envelope(gen_buf *out, uint32_t type, const ProtobufCMessage *body, const Gwtf__TensorHeader *th) {
  Gwtf__Envelope env = GWTF__ENVELOPE__INIT;
  uint8_t peer[32];
  fuzz_frame_peer(peer);
  env.type = type;
  env.sender.data = peer;
  env.sender.len = 32;
  gen_buf bb = {0};
  if (body) gen_put_msg(&bb, body);
  env.body.data = bb.p;
  env.body.len = bb.n;
  env.tensor = (Gwtf__TensorHeader *)th;
  gen_put_msg(out, &env.base);
  free(bb.p);
}

/* One record of a mode-1 script. */
static void script_rec(gen_buf *s, uint8_t kind, const gen_buf *rec) {
  gen_put8(s, kind);
  gen_put16(s, (uint16_t)rec->n);
  gen_put(s, rec->p, rec->n);
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
    gen_buf s = {0}, r = {0};
    gen_put8(&s, 1);
    gen_put8(&s, (uint8_t)(variant * 60));
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
    gen_put(&r, payload, sizeof(payload));
    script_rec(&s, 2, &r);
    r.n = 0;
    if (variant == 2) { /* bytes nobody sealed */
      gen_put(&r, payload, 8);
      script_rec(&s, 3, &r);
      r.n = 0;
    }
    envelope(&r, GWTF__MSG_TYPE__MSG_GOODBYE, &bye.base, NULL);
    script_rec(&s, 1, &r);
    free(r.p);
    gen_flush("frame", &s);
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
    gen_buf s = {0};
    gen_put8(&s, 0);
    gen_put8(&s, variant == 0 ? 255 : (uint8_t)(variant * 3));
    p2p_channel ch;
    uint8_t header[P2P_STREAM_HEADER_BYTES];
    p2p_channel_init_tx(&ch, key, header);
    gen_put(&s, header, sizeof(header));
    gen_buf hb = {0};
    gen_put_msg(&hb, &hello.base);
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
      gen_put(&s, w, wl);
      free(w);
    }
    if (variant == 2) s.n -= 5; /* cut mid-frame */
    free(hb.p);
    gen_flush("frame", &s);
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
  gen_buf s = {0};
  gen_put8(&s, 2);
  gen_put8(&s, 0);
  gen_put(&s, m1, sizeof(m1));
  gen_flush("frame", &s);
  for (int sub = 2; sub <= 3; sub++) {
    gen_put8(&s, 2);
    gen_put8(&s, (uint8_t)sub);
    uint8_t zeros[P2P_HS_MSG1_BYTES + P2P_HS_MSG2_BYTES + P2P_HS_MSG3_BYTES] = {0};
    if (sub == 3) zeros[P2P_HS_MSG1_BYTES + 3] = 1; /* the version byte of msg2 */
    gen_put(&s, zeros, sizeof(zeros));
    gen_flush("frame", &s);
  }
  gen_put8(&s, 2);
  gen_put8(&s, 1);
  gen_put(&s, m1, 8);
  gen_flush("frame", &s);
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
  gen_buf s = {0};
  qmsg got[512];
  size_t n_got = 0;
  gen_put8(&s, (uint8_t)(self + FUZZ_FLOW_CAST * (capacity - 1)));
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
    gen_put8(&s, 4), gen_put8(&s, 19); /* self's tick: (19 + 1) * 100 ms */
    for (size_t k = 0; k < sw.nq && k < 4000; k++) {
      qmsg m = sw.q[k];
      gw_peer from = {.id = *fuzz_flow_cast(m.from)};
      if (quiet && m.from == silent) continue; /* freed below */
      if (m.to == self) {
        gen_put8(&s, 0), gen_put8(&s, (uint8_t)m.from), gen_put16(&s, (uint16_t)m.len), gen_put(&s, m.p, m.len);
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
  gen_flush("flow_msg", &s);
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
  gen_buf s = {0};
  gen_put8(&s, 2);
  gen_put8(&s, 0), gen_put8(&s, 0), gen_put16(&s, 3), gen_put(&s, "\x08\x01\x12", 3);
  gen_put8(&s, 4), gen_put8(&s, 19), gen_put8(&s, 3), gen_put8(&s, 0), gen_put8(&s, 1), gen_put8(&s, 0x40);
  gen_put8(&s, 5), gen_put8(&s, 4), gen_put8(&s, 0), gen_put8(&s, 7), gen_put8(&s, 0);
  gen_flush("flow_msg", &s);
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
    gen_buf b = {0};
    gen_put(&b, head, hl);
    for (size_t i = 0; i < wr.n; i++) gen_put(&b, wr.tensors[i].data, wr.tensors[i].bytes);
    free(head);
    st_writer_free(&wr);
    gen_flush("safetensors", &b);
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
    gen_buf b = {0};
    uint64_t n = strlen(bad[i]);
    for (int k = 0; k < 8; k++) gen_put8(&b, (uint8_t)(n >> (8 * k)));
    gen_put(&b, bad[i], n);
    gen_put(&b, w, 8);
    gen_flush("safetensors", &b);
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
    gen_write("run_record", (const uint8_t *)text, strlen(text));
    free(text);
  }
  const char *bad[] = {"{\"version\":1}", "[1,2,3]", "{\"version\":1,\"name\":\"x\",\"model\":{},\"stages\":0}"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    gen_write("run_record", (const uint8_t *)bad[i], strlen(bad[i]));
}

/* ---- private runs ---- */

/* mode byte + payload */
static void write_mode(const char *sub, uint8_t mode, const uint8_t *p, size_t n) {
  uint8_t *b = malloc(n + 1);
  if (!b) exit(1);
  b[0] = mode;
  memcpy(b + 1, p, n);
  gen_write(sub, b, n + 1);
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
  const char *out_root = argv[1];
  gen_set_out(out_root);
  const char *subs[] = {"frame", "train_msg", "flow_msg", "safetensors", "run_record", "member_token", "member_cert"};
  for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_root, subs[i]);
    mkdir(out_root, 0755);
    mkdir(path, 0755);
  }
  p2p_crypto_init();
  gen_frame();
  gen_train_corpus();
  gen_flow();
  gen_safetensors();
  gen_run();
  gen_member();
  printf("fuzz_gen_corpus2: %u files written under %s\n", gen_written(), out_root);
  return 0;
}
