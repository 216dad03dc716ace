/* p2p_probe — a hand-driven peer for the multi-process tests.
 *
 *   p2p_probe ADDR NODEID MODE
 *
 * Connects to a running `gwtf node`, authenticates (so that the attacks
 * reach the code behind the handshake), then:
 *   good      sends a Ping and waits for the Pong          exit 0 on a Pong
 *   biglen    sends a 4 GiB length prefix                  exit 0 when the node hangs up
 *   replay    sends one frame twice                        exit 0 when the node hangs up
 *   tamper    flips a bit in a frame                       exit 0 when the node hangs up
 *   train:KIND  a peer without a run certificate: prints its node ID, then
 *             sends one message of KIND: join (JOIN), weights (WEIGHTS_REQ
 *             for stage 1), forward (a FORWARD with a (1,4,64) activation),
 *             grad (a GRAD for stage 1), hello (a HELLO claiming stage 1),
 *             flow (a flow message); then a Ping; exit 0 on the Pong (the
 *             node refused it and kept the session: its log says so)
 * Exit 1 otherwise (with a message on stderr). */
#include "testutil.h"

#include "p2p/p2ptest.h"
#include "train.pb-c.h"

#define TIMEOUT_MS (5000)

static int probe_fail(const char *what, int rc) {
  fprintf(stderr, "p2p_probe: %s: %s\n", what, gw_strerror(rc));
  return 1;
}

/* Reads frames until a Pong arrives (the node's Hello comes first). */
static int wait_pong(rawpeer *r) {
  p2p_rx rx;
  p2p_rx_init(&rx, P2P_MAX_FRAME_DEFAULT);
  p2p_rx_expect_head(&rx);
  uint8_t buf[4096];
  int rc = GW_ETIMEDOUT;
  uint64_t deadline = gw_clock_mono_ms() + TIMEOUT_MS;
  while (rc == GW_ETIMEDOUT && gw_clock_mono_ms() < deadline) {
    struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      rc = GW_ECLOSED;
      break;
    }
    for (size_t off = 0; off < (size_t)n && rc == GW_ETIMEDOUT;) {
      long used = p2p_rx_feed(&rx, buf + off, (size_t)n - off);
      if (used < 0) {
        rc = (int)used;
        break;
      }
      off += (size_t)used;
      if (!rx.ready) continue;
      uint8_t *rec;
      size_t len;
      p2p_head h;
      const char *why = NULL;
      p2p_rx_record(&rx, &rec, &len);
      if ((rc = p2p_frame_open_head(&r->ch, rec, len, &r->hs.peer_id, rx.max_frame, &h, &why)) != 0) break;
      rc = h.env->type == GWTF__MSG_TYPE__MSG_PONG ? 0 : GW_ETIMEDOUT;
      p2p_head_clear(&h);
      p2p_rx_expect_head(&rx);
    }
  }
  p2p_rx_free(&rx);
  return rc;
}

static int send_one(rawpeer *r, uint32_t type, const ProtobufCMessage *msg, const p2p_tensor *t, const void *data,
                    size_t n) {
  uint8_t body[512];
  size_t len = msg ? protobuf_c_message_pack(msg, body) : 3;
  if (!msg) memcpy(body, "\x08\x01\x10", 3);
  p2p_msg m = {.type = type, .body = body, .body_len = len, .tensor = t, .data = data, .data_len = n};
  return rawpeer_send_msg(r, &m);
}

/* What a stranger tries at one entry point of a private run. */
static int send_train(rawpeer *r, const char *kind) {
  static float act[1 * 4 * 64];
  Gwtf__TrainJoin j = GWTF__TRAIN_JOIN__INIT;
  j.capacity = 4;
  if (!strcmp(kind, "join")) return send_one(r, GWTF__TRAIN_MSG__TRAIN_JOIN, &j.base, NULL, NULL, 0);
  Gwtf__TrainWeightsReq w = GWTF__TRAIN_WEIGHTS_REQ__INIT;
  w.stage = 1;
  if (!strcmp(kind, "weights")) return send_one(r, GWTF__TRAIN_MSG__TRAIN_WEIGHTS_REQ, &w.base, NULL, NULL, 0);
  Gwtf__TrainMicrobatch mb = GWTF__TRAIN_MICROBATCH__INIT;
  ProtobufCBinaryData me = {GW_ID_BYTES, r->me.id.b};
  mb.id = 1;
  mb.origin = me;
  mb.n_path = 1;
  mb.path = &me;
  for (size_t i = 0; i < sizeof(act) / sizeof(act[0]); i++) act[i] = 100.0f;
  p2p_tensor t = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 3, .shape = {1, 4, 64}};
  if (!strcmp(kind, "forward")) return send_one(r, GWTF__TRAIN_MSG__TRAIN_FORWARD, &mb.base, &t, act, sizeof(act));
  Gwtf__TrainGrad g = GWTF__TRAIN_GRAD__INIT;
  g.stage = 1;
  g.count = 1;
  g.total = 4;
  p2p_tensor gt = {.dtype = GWTF__DTYPE__DTYPE_F32, .ndim = 1, .shape = {4}};
  if (!strcmp(kind, "grad")) return send_one(r, GWTF__TRAIN_MSG__TRAIN_GRAD, &g.base, &gt, act, 4 * sizeof(float));
  Gwtf__TrainHello h = GWTF__TRAIN_HELLO__INIT;
  h.stage = 1;
  h.iteration = 1;
  if (!strcmp(kind, "hello")) return send_one(r, GWTF__TRAIN_MSG__TRAIN_HELLO, &h.base, NULL, NULL, 0);
  if (!strcmp(kind, "flow")) return send_one(r, GWTF__MSG_TYPE__MSG_FLOW, NULL, NULL, NULL, 0);
  return GW_EINVAL;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: p2p_probe ADDR NODEID good|biglen|replay|tamper|train:KIND\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (p2p_crypto_init() != 0) return 1;
  gw_addr addr;
  gw_id id;
  if (gw_addr_parse(argv[1], &addr) != 0 || gw_id_from_hex(argv[2], &id) != 0) {
    fprintf(stderr, "p2p_probe: bad address or node ID\n");
    return 2;
  }
  const char *mode = argv[3];
  rawpeer r;
  int rc = rawpeer_connect(&r, &addr);
  if (rc != 0) return probe_fail("connect", rc);
  if ((rc = rawpeer_handshake(&r, &id)) != 0) return probe_fail("handshake", rc);
  if ((rc = rawpeer_send_hello(&r)) != 0) return probe_fail("hello", rc);

  if (!strcmp(mode, "good")) {
    Gwtf__Ping ping = GWTF__PING__INIT;
    ping.nonce = 1;
    ping.sent_ns = gw_clock_mono_ns();
    uint8_t body[32];
    p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_PING, .body = body, .body_len = gwtf__ping__pack(&ping, body)};
    if ((rc = rawpeer_send_msg(&r, &m)) != 0) return probe_fail("ping", rc);
    if ((rc = wait_pong(&r)) != 0) return probe_fail("pong", rc);
    rawpeer_close(&r);
    return 0;
  }
  if (!strncmp(mode, "train:", 6)) {
    char hex[GW_ID_HEX_LEN + 1];
    gw_id_to_hex(&r.me.id, hex);
    printf("%s\n", hex);
    fflush(stdout);
    if ((rc = send_train(&r, mode + 6)) != 0) return probe_fail(mode, rc);
    Gwtf__Ping ping = GWTF__PING__INIT;
    ping.nonce = 2;
    uint8_t body[32];
    p2p_msg pm = {.type = GWTF__MSG_TYPE__MSG_PING, .body = body, .body_len = gwtf__ping__pack(&ping, body)};
    if ((rc = rawpeer_send_msg(&r, &pm)) != 0) return probe_fail("ping", rc);
    if ((rc = wait_pong(&r)) != 0) return probe_fail("pong", rc);
    rawpeer_close(&r);
    return 0;
  }
  p2p_msg m = {.type = 300, .body = (const uint8_t *)"probe", .body_len = 5};
  uint8_t *w = NULL;
  size_t len = 0;
  if ((rc = rawpeer_seal(&r, &m, NULL, &w, &len)) != 0) return probe_fail("seal", rc);
  if (!strcmp(mode, "biglen")) {
    static const uint8_t four_gib[4] = {0xff, 0xff, 0xff, 0xff};
    rawpeer_send(&r, four_gib, sizeof(four_gib));
  } else if (!strcmp(mode, "replay")) {
    rawpeer_send(&r, w, len);
    rawpeer_send(&r, w, len);
  } else if (!strcmp(mode, "tamper")) {
    w[len - 2] ^= 0x10;
    rawpeer_send(&r, w, len);
  } else {
    fprintf(stderr, "p2p_probe: unknown mode %s\n", mode);
    return 2;
  }
  free(w);
  rc = rawpeer_wait_closed(&r, TIMEOUT_MS);
  rawpeer_close(&r);
  return rc == 0 ? 0 : probe_fail("the node did not hang up", rc);
}
