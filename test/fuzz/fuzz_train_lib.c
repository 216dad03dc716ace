/* test/fuzz/fuzz_train_lib.c — every training message handler
 * (train_peer_on_message) under hostile input, in several states; the input
 * format is in fuzz_train.h. Built like test/train/peer_harness.c's peers:
 * a fake io whose compute jobs the input completes, a fixed router over the
 * cast, the harness's tiny shapes (B=2, T=4, C=3, two parameters a stage). */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_targets.h"
#include "fuzz_train.h"
#include "p2p/frame.h"
#include "train/member.h"
#include "train/peer.h"
#include "train.pb-c.h"
#include "util/err.h"
#include "util/rng.h"

#define RING (8)
#define RING_BODY_MAX (4096)
#define RING_TENSOR_MAX ((size_t)64 << 10)
#define MAX_JOBS (64)
#define TENSOR_MAX ((size_t)1 << 20) /* larger payloads are refused (the fuzzer gains nothing from them) */

static struct {
  bool ready;
  gw_id ids[FUZZ_TRAIN_CAST];
  gw_log_sink sink;
  bool verbose;
} cast;

static void cast_init(void) {
  if (cast.ready) return;
  static const char *names[FUZZ_TRAIN_CAST] = {"fuzz-train-d0", "fuzz-train-d1", "fuzz-train-r1a",
                                               "fuzz-train-r1b", "fuzz-train-r2a", "fuzz-train-r2b"};
  for (int i = 0; i < FUZZ_TRAIN_CAST; i++) gw_id_hash_str(names[i], &cast.ids[i]);
  /* Every log line is formatted (hostile strings go through the logger
   * too) and thrown away; FUZZ_VERBOSE=1 shows them. */
  cast.verbose = getenv("FUZZ_VERBOSE") != NULL;
  FILE *fp = cast.verbose ? stderr : fopen("/dev/null", "w");
  gw_log_sink_init(&cast.sink, fp ? fp : stderr, fp ? GW_LOG_DEBUG : GW_LOG_OFF, GW_LOG_TEXT);
  cast.ready = true;
}

const gw_id *fuzz_train_cast(int i) {
  cast_init();
  return &cast.ids[i];
}

static int stage_of(int i) { return i / 2; }

static int cast_index(const gw_id *id) {
  for (int i = 0; i < FUZZ_TRAIN_CAST; i++)
    if (gw_id_eq(id, &cast.ids[i])) return i;
  return -1;
}

/* ---- the world around the peer ---- */

typedef struct sent_msg {
  int to;
  uint32_t type;
  size_t len;
  uint8_t body[RING_BODY_MAX];
  bool has_tensor;
  train_tensor t;
  uint8_t *data; /* owned copy of t.data */
} sent_msg;

typedef struct world {
  int who;
  train_peer *tp;
  gw_rng rng;
  bool down[FUZZ_TRAIN_CAST];
  train_job *jobs[MAX_JOBS];
  int n_jobs;
  sent_msg ring[RING];
  unsigned n_sent;
  uint64_t now;
} world;

static int io_send(void *ud, const gw_id *to, uint32_t type, const uint8_t *body, size_t len,
                   const train_tensor *t) {
  world *w = ud;
  int k = cast_index(to);
  if (k < 0) return GW_ENOENT; /* a peer named in a message: not one we have a session to */
  if (t && t->nbytes && !t->data) abort();
  if (cast.verbose) fprintf(stderr, "fuzz_train_msg: sends type %u to %d (%zu bytes%s)\n", type, k, len, t ? ", tensor" : "");
  sent_msg *m = &w->ring[w->n_sent++ % RING];
  free(m->data);
  m->data = NULL;
  m->to = k;
  m->type = type;
  m->len = len < RING_BODY_MAX ? len : RING_BODY_MAX;
  if (m->len) memcpy(m->body, body, m->len);
  m->has_tensor = t && t->nbytes <= RING_TENSOR_MAX;
  if (m->has_tensor) {
    m->t = *t;
    m->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!m->data) {
      m->has_tensor = false;
    } else {
      if (t->nbytes) memcpy(m->data, t->data, t->nbytes);
      m->t.data = m->data;
    }
  }
  return 0;
}

static void io_want_tick(void *ud, uint64_t at) { (void)ud, (void)at; }

static void io_random(void *ud, void *buf, size_t len) {
  world *w = ud;
  gw_rng_bytes(&w->rng, buf, len);
}

static bool io_connected(void *ud, const gw_id *peer) {
  world *w = ud;
  int k = cast_index(peer);
  return k >= 0 && !w->down[k];
}

static int io_compute(void *ud, train_job *job) {
  world *w = ud;
  if (cast.verbose) fprintf(stderr, "fuzz_train_msg: job %d\n", (int)job->kind);
  if (w->n_jobs == MAX_JOBS) return GW_EFULL;
  w->jobs[w->n_jobs++] = job;
  return 0;
}

/* The peer signs its averages (as aggregator) with a fixed key; its cast
 * ID is not that key's hash, so a copy echoed back never verifies as its
 * own (the signer check sees a stranger): the decoding and checking of
 * the signature fields is what runs. */
static const uint8_t *fuzz_sk(uint8_t pk[32]) {
  static uint8_t spk[32], ssk[64];
  static bool ready;
  if (!ready) {
    uint8_t seed[32];
    memset(seed, 0x17, sizeof(seed));
    crypto_sign_seed_keypair(spk, ssk, seed);
    ready = true;
  }
  if (pk) memcpy(pk, spk, 32);
  return ssk;
}

static void io_sign(void *ud, const uint8_t *msg, size_t len, uint8_t sig[64]) {
  (void)ud;
  crypto_sign_detached(sig, NULL, msg, len, fuzz_sk(NULL));
}

static void io_event(void *ud, const train_event *ev) {
  world *w = ud;
  if (ev->kind == TRAIN_EV_STAGE_ASSIGNED) {
    train_shape shape = {FUZZ_TRAIN_B, FUZZ_TRAIN_T, FUZZ_TRAIN_C, FUZZ_TRAIN_NP};
    train_peer_set_shape(w->tp, &shape);
  }
}

/* The worker: fills what each job kind fills (no arithmetic: the protocol,
 * not the model, is under test), FIFO. */
static void complete_oldest(world *w, bool fail) {
  if (w->n_jobs == 0) return;
  train_job *job = w->jobs[0];
  memmove(&w->jobs[0], &w->jobs[1], (size_t)(w->n_jobs - 1) * sizeof(w->jobs[0]));
  w->n_jobs--;
  job->rc = fail ? GW_EIO : 0;
  job->seconds = 0.005;
  if (!fail) {
    if (job->out && job->out_bytes) {
      float *o = job->out;
      for (size_t i = 0; i < job->out_bytes / sizeof(float); i++) o[i] = 0.01f * (float)(i % 7);
    }
    job->loss = 1.5f;
    memset(job->hash, 7, sizeof(job->hash));
    if (job->kind == TRAIN_JOB_SNAPSHOT) {
      job->blob = malloc(16);
      if (job->blob) {
        memset(job->blob, 3, 16);
        job->blob_len = 16;
      }
    }
  }
  train_peer_on_job_done(w->tp, job, w->now);
}

static void complete_all(world *w) {
  int n = w->n_jobs; /* the ones queued by these completions wait */
  for (int i = 0; i < n && w->n_jobs; i++) complete_oldest(w, false);
}

/* ---- the router: the live next-stage members of the cast ---- */

static int route(void *ctx, const gw_id *origin, const gw_id *from, uint32_t slot, uint64_t in_flow,
                 const gw_id *avoid, size_t n_avoid, gw_id *out, uint64_t *out_flow) {
  world *w = ctx;
  (void)in_flow;
  *out_flow = 0;
  int me = train_peer_stage(w->tp);
  if (me < 0) return GW_ENOENT;
  int next = (me + 1) % (FUZZ_TRAIN_STAGES + 1);
  int cand[FUZZ_TRAIN_CAST], n = 0;
  for (int j = 0; j < FUZZ_TRAIN_CAST; j++) {
    bool avoided = false;
    for (size_t a = 0; a < n_avoid; a++) avoided |= gw_id_eq(&avoid[a], &cast.ids[j]);
    if (stage_of(j) == next && !w->down[j] && !avoided && j != w->who) cand[n++] = j;
  }
  if (n == 0) return GW_ENOENT;
  unsigned pick = slot + origin->b[0] + (from ? from->b[1] : 0u);
  *out = cast.ids[cand[pick % (unsigned)n]];
  return 0;
}

static uint32_t slots(void *ctx) {
  world *w = ctx;
  return w->tp ? 2 : 0;
}

static int sample(void *ud, uint64_t iteration, uint32_t index, int32_t *inputs, int32_t *targets) {
  (void)ud;
  for (int i = 0; i < FUZZ_TRAIN_B * FUZZ_TRAIN_T; i++) {
    inputs[i] = (int32_t)((iteration * 31 + index * 7 + (uint64_t)i * 3) % 256);
    targets[i] = (inputs[i] * 5 + 11) % 256;
  }
  return 0;
}

static void set_members(world *w, int stage, uint8_t mask) {
  train_member list[FUZZ_TRAIN_CAST];
  size_t k = 0;
  for (int j = 0; j < FUZZ_TRAIN_CAST; j++) {
    if (stage_of(j) != stage || !(mask & (1u << j))) continue;
    if (j == w->who && train_peer_stage(w->tp) != stage) continue;
    list[k++] = (train_member){.id = cast.ids[j], .capacity = 2, .load = 0};
    w->down[j] = false;
  }
  train_peer_set_members(w->tp, stage, list, k, w->now);
}

/* ---- the input ---- */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint8_t rd8(reader *r) {
  if (r->n == 0) return 0;
  r->n--;
  return *r->p++;
}

static uint16_t rd16(reader *r) {
  uint16_t lo = rd8(r);
  return (uint16_t)(lo | rd8(r) << 8);
}

static const uint32_t dtypes[7] = {0, 1, 2, 3, 4, 5, 6}; /* raw, then gwtf.DType F32 F16 BF16 I32 U16 U8 */
/* the compressed activation formats (train/wire_codec.h): Q8ROW, R4ROW,
 * R3ROW, R2ROW, LR8, LR16, LR32, LR32R4, R5ROW, LR16R4; picked when the spec has bit 0x40 */
static const uint32_t wire_dtypes[10] = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* Reads a tensor description and builds the payload; false when the frame
 * layer would have refused it (or it is too big to bother). */
static bool read_tensor(reader *r, uint8_t spec, train_tensor *t, uint8_t **data) {
  p2p_tensor pt;
  memset(&pt, 0, sizeof(pt));
  pt.dtype = (spec & 0x40) ? wire_dtypes[(spec & 0x3f) % 10] : dtypes[spec % 7];
  bool chunk = spec & 0x80;
  pt.ndim = rd8(r) % 6;
  size_t esize = p2p_dtype_size(pt.dtype);
  uint64_t whole = esize ? esize : 1;
  for (uint32_t i = 0; i < pt.ndim; i++) {
    pt.shape[i] = rd8(r);
    whole *= pt.shape[i];
  }
  uint64_t nbytes = whole;
  if (chunk) {
    nbytes = rd16(r);
    pt.offset = rd16(r);
    pt.total = rd16(r);
  }
  uint32_t fill = rd16(r);
  fill |= (uint32_t)rd16(r) << 16;
  if (nbytes > TENSOR_MAX || p2p_tensor_check(&pt, nbytes) != 0) return false;
  if (pt.ndim > 4) return false; /* node/train_node.c: no training tensor has more */
  uint8_t *buf = malloc(nbytes ? nbytes : 1);
  if (!buf) return false;
  for (size_t i = 0; i < nbytes; i++) buf[i] = (uint8_t)(fill >> (8 * (i % 4)));
  memset(t, 0, sizeof(*t));
  t->dtype = (train_dtype)pt.dtype;
  t->ndim = pt.ndim;
  for (uint32_t i = 0; i < pt.ndim; i++) t->shape[i] = pt.shape[i];
  t->data = buf;
  t->nbytes = nbytes;
  *data = buf;
  return true;
}

static void op_message(world *w, reader *r) {
  int from = rd8(r) % FUZZ_TRAIN_CAST;
  uint32_t type = 300 + rd8(r) % FUZZ_TRAIN_TYPES;
  size_t len = rd16(r);
  if (len > r->n) len = r->n;
  const uint8_t *body = r->p;
  r->p += len, r->n -= len;
  uint8_t spec = rd8(r);
  train_tensor t, *tp = NULL;
  uint8_t *data = NULL;
  if (spec) {
    if (!read_tensor(r, spec, &t, &data)) return;
    tp = &t;
  }
  if (from != w->who) train_peer_on_message(w->tp, &cast.ids[from], type, body, len, tp, w->now);
  free(data);
}

static void op_echo(world *w, reader *r) {
  uint8_t slot = rd8(r), ty = rd8(r), off = rd8(r), val = rd8(r);
  if (w->n_sent == 0) return;
  unsigned have = w->n_sent < RING ? w->n_sent : RING;
  sent_msg *m = &w->ring[(w->n_sent - 1 - slot % have) % RING];
  if (m->to == w->who) return;
  uint8_t body[RING_BODY_MAX];
  if (m->len) memcpy(body, m->body, m->len);
  if (m->len) body[off % m->len] ^= val;
  uint32_t type = ty ? 300 + ty % FUZZ_TRAIN_TYPES : m->type;
  /* The message may come back to the peer and make it send again (and
   * overwrite this slot): hand it a copy of the tensor. */
  train_tensor t, *tp = NULL;
  uint8_t *data = NULL;
  if (m->has_tensor) {
    t = m->t;
    data = malloc(t.nbytes ? t.nbytes : 1);
    if (!data) return;
    if (t.nbytes) memcpy(data, m->t.data, t.nbytes);
    t.data = data;
    tp = &t;
  }
  train_peer_on_message(w->tp, &cast.ids[m->to], type, body, m->len, tp, w->now);
  free(data);
}

/* A private run with the member targets' fixed key: d0 holds it, the
 * others hold certificates; cast members 0..3 present theirs, r2a and r2b
 * are strangers whose messages are refused (unless the input forges a
 * certificate, which it cannot). */
static int private_run(world *w, int who) {
  member_key k;
  fuzz_member_key(&k);
  train_membership m;
  memset(&m, 0, sizeof(m));
  snprintf(m.run, sizeof(m.run), "fuzz");
  memcpy(m.run_key, k.pk, 32);
  uint8_t *certs[FUZZ_TRAIN_CAST] = {0};
  size_t lens[FUZZ_TRAIN_CAST] = {0};
  int rc = 0;
  for (int i = 0; i < FUZZ_TRAIN_CAST && rc == 0; i++) {
    member_cert c;
    memset(&c, 0, sizeof(c));
    snprintf(c.run, sizeof(c.run), "fuzz");
    memcpy(c.run_key, k.pk, 32);
    c.peer = cast.ids[i];
    c.expires = 1000000000;
    rc = member_cert_make(&c, &k, &certs[i], &lens[i]);
  }
  if (rc == 0) {
    if (who == 0) {
      m.have_sk = true;
      memcpy(m.sk, k.sk, sizeof(m.sk));
    } else {
      m.cert = certs[who];
      m.cert_len = lens[who];
    }
    rc = train_peer_set_membership(w->tp, &m);
  }
  for (int i = 0; i < 4 && rc == 0; i++) {
    if (i == who) continue;
    Gwtf__TrainCert tc = GWTF__TRAIN_CERT__INIT;
    tc.cert = (ProtobufCBinaryData){lens[i], certs[i]};
    uint8_t body[512];
    size_t len = gwtf__train_cert__pack(&tc, body);
    train_peer_on_message(w->tp, &cast.ids[i], GWTF__TRAIN_MSG__TRAIN_CERT, body, len, NULL, w->now);
  }
  for (int i = 0; i < FUZZ_TRAIN_CAST; i++) free(certs[i]);
  return rc;
}

int fuzz_train_msg(const uint8_t *data, size_t size) {
  cast_init();
  if (size < 1) return 0;
  world *w = calloc(1, sizeof(*w));
  if (!w) return 0;
  int who = data[0] % FUZZ_TRAIN_CAST, flags = data[0] / FUZZ_TRAIN_CAST;
  w->who = who;
  gw_rng_seed(&w->rng, 77 + (uint64_t)who);
  train_peer_config cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.self = cast.ids[who];
  cfg.role = stage_of(who) == 0 ? TRAIN_DATA : TRAIN_RELAY;
  cfg.n_stages = FUZZ_TRAIN_STAGES;
  cfg.stage = cfg.role == TRAIN_RELAY && (flags & 1) ? -1 : stage_of(who);
  cfg.capacity = 1 + (uint32_t)(flags >> 3) % 4;
  cfg.data_seed = 5;
  cfg.iterations = 3;
  cfg.recovery = (flags & 4) ? TRAIN_RECOVER_RESTART : TRAIN_RECOVER_PATH;
  cfg.initial_weights = !(flags & 2);
  train_tunables_default(&cfg.tun);
  cfg.tun.hop_timeout_ms = 500;
  cfg.tun.agg_timeout_ms = 2000;
  cfg.tun.stall_timeout_ms = 10000;
  cfg.tun.settle_ms = 0;
  cfg.tun.chunk_bytes = 4; /* one float: gradients and weights travel in several chunks */
  if (cfg.stage >= 0) cfg.shape = (train_shape){FUZZ_TRAIN_B, FUZZ_TRAIN_T, FUZZ_TRAIN_C, FUZZ_TRAIN_NP};
  fuzz_sk(cfg.node_pk);
  train_io io = {.ud = w,
                 .send = io_send,
                 .want_tick = io_want_tick,
                 .random = io_random,
                 .connected = io_connected,
                 .compute = io_compute,
                 .event = io_event,
                 .sign = io_sign};
  train_router router = {.ctx = w, .next_hop = route, .slots = slots};
  gw_log lg;
  gw_log_init(&lg, &cast.sink, &cfg.self);
  if (train_peer_new(&w->tp, &cfg, &io, &router, &lg) != 0) {
    free(w);
    return 0;
  }
  if (cfg.role == TRAIN_DATA) train_peer_set_sampler(w->tp, sample, NULL);
  if ((flags & 32) && private_run(w, who) != 0) {
    train_peer_free(w->tp);
    free(w);
    return 0;
  }
  for (int s = 0; s <= FUZZ_TRAIN_STAGES; s++) set_members(w, s, 0x3f);
  gw_id leader = gw_id_cmp(&cast.ids[0], &cast.ids[1]) < 0 ? cast.ids[0] : cast.ids[1];
  if (cfg.role == TRAIN_RELAY) train_peer_set_leader(w->tp, &leader, 0);
  train_peer_start(w->tp, 0);
  reader r = {data + 1, size - 1};
  while (r.n > 0) {
    uint8_t op = rd8(&r) % 10;
    switch (op) {
    case 0:
    case 1:
    case 2: op_message(w, &r); break;
    case FUZZ_TRAIN_OP_ECHO: op_echo(w, &r); break;
    case FUZZ_TRAIN_OP_TICK:
      w->now += ((uint64_t)rd8(&r) + 1) * 50;
      train_peer_on_tick(w->tp, w->now);
      break;
    case FUZZ_TRAIN_OP_JOB: complete_oldest(w, rd8(&r) >= 240); break;
    case FUZZ_TRAIN_OP_JOBS: complete_all(w); break;
    case FUZZ_TRAIN_OP_DOWN: {
      int k = rd8(&r) % FUZZ_TRAIN_CAST;
      if (k == who) break;
      w->down[k] = true;
      train_peer_on_peer_down(w->tp, &cast.ids[k], w->now);
      break;
    }
    case FUZZ_TRAIN_OP_MEMBERS: {
      int s = rd8(&r) % (FUZZ_TRAIN_STAGES + 1);
      set_members(w, s, rd8(&r));
      break;
    }
    default: {
      int k = rd8(&r) % FUZZ_TRAIN_CAST;
      train_peer_set_leader(w->tp, &cast.ids[k], w->now);
      break;
    }
    }
  }
  /* Run the jobs and the clock out: every timeout fires. */
  for (int round = 0; round < 8; round++) {
    complete_all(w);
    w->now += 1000;
    train_peer_on_tick(w->tp, w->now);
  }
  /* As the node shuts down: the worker frees its queue, then the peer goes. */
  for (int i = 0; i < w->n_jobs; i++) train_job_free(w->jobs[i]);
  train_peer_free(w->tp);
  for (int i = 0; i < RING; i++) free(w->ring[i].data);
  free(w);
  return 0;
}
