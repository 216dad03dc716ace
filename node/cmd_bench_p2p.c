/* `gwtf bench p2p`: handshake time and framed throughput of one session on
 * loopback, printed as JSON.
 *
 * Two hosts run in two threads, each with its own loop, so that sealing and
 * opening run in parallel as they would in two processes. The handshake
 * time is from p2p_host_connect() to the peer-up callback on the dialler: a
 * TCP connect, the three handshake messages, the stream headers and both
 * Hello frames. The throughput is one session carrying frames with a raw
 * tensor payload, with the sender keeping a few frames queued (the
 * writable callback refills), from the first send to the receiver's
 * acknowledgement of the last frame. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "node/cmd.h"
#include "node/node.h"
#include "p2p/host.h"
#include "proto/gwtf.pb-c.h"
#include "util/clock.h"
#include "util/err.h"

#define DEFAULT_HANDSHAKES (200)
#define DEFAULT_FRAME ((uint64_t)4 << 20)
#define DEFAULT_FRAMES (256)
/* Frames kept queued by the sender: enough to keep the socket busy. */
#define WINDOW_FRAMES (4)

void cmd_bench_p2p_help(void) {
  printf("usage: gwtf bench p2p [--handshakes N] [--frame-size BYTES] [--frames N]\n\n"
         "Measures, on loopback, the handshake time (median of N sequential\n"
         "handshakes, default %d) and the framed throughput of one encrypted session\n"
         "(N frames, default %d, each carrying a raw tensor payload of BYTES, default\n"
         "4M). Prints one JSON object.\n",
         DEFAULT_HANDSHAKES, DEFAULT_FRAMES);
}

/* ---- the receiving side (its own thread and loop) ---- */

typedef struct server {
  uv_loop_t loop;
  uv_async_t stop;
  uv_sem_t ready;
  p2p_identity me;
  p2p_host *host;
  gw_addr addr;
  int rc;
  uint64_t frames, bytes, first_ns, last_ns;
  uint64_t expect_next; /* frames count down in request_id */
  bool out_of_order;
} server;

static void server_message(void *ud, const gw_id *from, p2p_msg *msg) {
  server *sv = ud;
  uint64_t now = gw_clock_mono_ns();
  if (msg->type != GWTF__MSG_TYPE__MSG_BENCH) return;
  if (sv->frames == 0) {
    sv->first_ns = now;
    sv->expect_next = msg->request_id;
  }
  if (msg->request_id != sv->expect_next) sv->out_of_order = true;
  sv->expect_next = msg->request_id - 1;
  sv->frames++;
  sv->bytes += msg->data_len;
  sv->last_ns = now;
  if (msg->request_id == 0) { /* the last one: acknowledge */
    p2p_msg ack = {.type = GWTF__MSG_TYPE__MSG_BENCH};
    p2p_host_send(sv->host, from, &ack);
  }
}

static void server_stop(uv_async_t *a) {
  server *sv = a->data;
  p2p_host_close(sv->host, NULL, NULL);
  uv_close((uv_handle_t *)a, NULL);
}

static void server_thread(void *arg) {
  server *sv = arg;
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &sv->me;
  gw_addr_parse("127.0.0.1:0", &hc.listen);
  hc.ping_interval_ms = 0;
  hc.log_rtt = false;
  p2p_host_cbs cbs = {.ud = sv, .message = server_message};
  uv_async_init(&sv->loop, &sv->stop, server_stop);
  sv->stop.data = sv;
  sv->rc = p2p_host_new(&sv->loop, &hc, &cbs, &sv->host);
  if (sv->rc == 0) sv->addr = p2p_host_listen_addr(sv->host);
  uv_sem_post(&sv->ready);
  if (sv->rc != 0) uv_close((uv_handle_t *)&sv->stop, NULL);
  uv_run(&sv->loop, UV_RUN_DEFAULT);
}

/* ---- the dialling side (this thread) ---- */

typedef enum phase { PH_HANDSHAKES, PH_THROUGHPUT, PH_DONE } phase;

typedef struct client {
  uv_loop_t loop;
  p2p_identity me;
  p2p_host *host;
  server *sv;
  phase ph;
  int handshakes, done_handshakes;
  double *hs_ms;
  uint64_t t0;
  uint64_t frame_size;
  int frames, sent;
  uint8_t *payload;
  p2p_tensor desc;
  uint64_t start_ns, end_ns;
  int rc;
} client;

static void client_connect(client *c) {
  c->t0 = gw_clock_mono_ns();
  int rc = p2p_host_connect(c->host, &c->sv->addr, &c->sv->me.id);
  if (rc != 0) {
    c->rc = rc;
    c->ph = PH_DONE;
    p2p_host_close(c->host, NULL, NULL);
  }
}

static void client_fill(client *c) {
  const gw_id *to = &c->sv->me.id;
  while (c->sent < c->frames && p2p_host_queued(c->host, to) < WINDOW_FRAMES * c->frame_size) {
    p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_BENCH,
                 .request_id = (uint64_t)(c->frames - 1 - c->sent),
                 .tensor = &c->desc,
                 .data = c->payload,
                 .data_len = c->frame_size};
    int rc = p2p_host_send(c->host, to, &m);
    if (rc != 0) {
      fprintf(stderr, "gwtf bench p2p: send failed: %s\n", gw_strerror(rc));
      c->rc = rc;
      c->ph = PH_DONE;
      p2p_host_close(c->host, NULL, NULL);
      return;
    }
    c->sent++;
  }
}

static void client_up(void *ud, const gw_peer *peer, bool back) {
  client *c = ud;
  (void)back;
  if (c->ph == PH_HANDSHAKES) {
    c->hs_ms[c->done_handshakes++] = (double)(gw_clock_mono_ns() - c->t0) / 1e6;
    p2p_host_disconnect(c->host, &peer->id);
  } else if (c->ph == PH_THROUGHPUT) {
    c->start_ns = gw_clock_mono_ns();
    client_fill(c);
  }
}

static void client_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  client *c = ud;
  (void)id, (void)reason;
  if (c->ph == PH_HANDSHAKES) {
    if (c->done_handshakes == c->handshakes) c->ph = PH_THROUGHPUT;
    client_connect(c);
  } else if (c->ph == PH_THROUGHPUT) {
    fprintf(stderr, "gwtf bench p2p: the session dropped during the throughput run\n");
    c->rc = GW_EIO;
    c->ph = PH_DONE;
    p2p_host_close(c->host, NULL, NULL);
  }
}

static void client_writable(void *ud, const gw_id *id) {
  (void)id;
  client *c = ud;
  if (c->ph == PH_THROUGHPUT) client_fill(c);
}

static void client_message(void *ud, const gw_id *from, p2p_msg *msg) {
  client *c = ud;
  (void)from;
  if (c->ph != PH_THROUGHPUT || msg->type != GWTF__MSG_TYPE__MSG_BENCH) return;
  c->end_ns = gw_clock_mono_ns();
  c->ph = PH_DONE;
  p2p_host_close(c->host, NULL, NULL);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double pct(const double *sorted, int n, double p) {
  int i = (int)(p * (n - 1) + 0.5);
  return sorted[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

static void report(const client *c, const server *sv) {
  qsort(c->hs_ms, (size_t)c->handshakes, sizeof(double), cmp_double);
  double sum = 0;
  for (int i = 0; i < c->handshakes; i++) sum += c->hs_ms[i];
  double secs = (double)(c->end_ns - c->start_ns) / 1e9;
  double total = (double)c->frame_size * c->frames;
  double rx_secs = (double)(sv->last_ns - sv->first_ns) / 1e9;
  printf("{\"bench\":\"p2p\",\"transport\":\"tcp-loopback\",\"cipher\":\"xchacha20poly1305-secretstream\","
         "\"handshake\":{\"n\":%d,\"median_ms\":%.3f,\"p10_ms\":%.3f,\"p90_ms\":%.3f,\"mean_ms\":%.3f},"
         "\"throughput\":{\"frame_bytes\":%llu,\"frames\":%d,\"seconds\":%.3f,\"MBps\":%.1f,\"Gbps\":%.2f,"
         "\"receiver_MBps\":%.1f,\"in_order\":%s}}\n",
         c->handshakes, pct(c->hs_ms, c->handshakes, 0.5), pct(c->hs_ms, c->handshakes, 0.1),
         pct(c->hs_ms, c->handshakes, 0.9), sum / c->handshakes, (unsigned long long)c->frame_size, c->frames, secs,
         total / secs / 1e6, total * 8 / secs / 1e9,
         sv->frames > 1 && rx_secs > 0 ? (double)sv->bytes * (sv->frames - 1) / sv->frames / rx_secs / 1e6 : 0.0,
         sv->out_of_order || sv->frames != (uint64_t)c->frames ? "false" : "true");
}

static int parse_args(int argc, char **argv, client *c) {
  static const struct option opts[] = {{"handshakes", required_argument, 0, 'n'},
                                       {"frame-size", required_argument, 0, 's'},
                                       {"frames", required_argument, 0, 'f'},
                                       {"help", no_argument, 0, 'h'},
                                       {0}};
  int o;
  while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (o) {
    case 'n': c->handshakes = atoi(optarg); break;
    case 'f': c->frames = atoi(optarg); break;
    case 's':
      if (node_parse_size(optarg, &c->frame_size) != 0) c->frame_size = 0;
      break;
    case 'h': cmd_bench_p2p_help(); return 0;
    default: cmd_bench_p2p_help(); return 2;
    }
  }
  if (c->handshakes < 1 || c->handshakes > 100000 || c->frames < 1 || c->frame_size < 1 ||
      c->frame_size > P2P_MAX_FRAME_DEFAULT - 4096) {
    fprintf(stderr, "gwtf bench p2p: need --handshakes 1..100000, --frames >= 1, --frame-size 1..64M-4K\n");
    return 2;
  }
  return -1;
}

int cmd_bench_p2p(int argc, char **argv) {
  server sv = {0};
  client c = {.sv = &sv, .handshakes = DEFAULT_HANDSHAKES, .frames = DEFAULT_FRAMES, .frame_size = DEFAULT_FRAME};
  int rc = parse_args(argc, argv, &c);
  if (rc >= 0) return rc;
  signal(SIGPIPE, SIG_IGN);
  c.hs_ms = calloc((size_t)c.handshakes, sizeof(double));
  c.payload = malloc(c.frame_size);
  if (!c.hs_ms || !c.payload) return 1;
  randombytes_buf(c.payload, c.frame_size);
  c.desc = (p2p_tensor){.dtype = GWTF__DTYPE__DTYPE_U8, .ndim = 1, .shape = {c.frame_size}};

  p2p_identity_generate(&sv.me);
  p2p_identity_generate(&c.me);
  uv_loop_init(&sv.loop);
  uv_sem_init(&sv.ready, 0);
  uv_thread_t tid;
  uv_thread_create(&tid, server_thread, &sv);
  uv_sem_wait(&sv.ready);
  if (sv.rc != 0) {
    fprintf(stderr, "gwtf bench p2p: cannot listen on loopback: %s\n", gw_strerror(sv.rc));
    uv_thread_join(&tid);
    return 1;
  }

  uv_loop_init(&c.loop);
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &c.me;
  hc.ping_interval_ms = 0;
  hc.log_rtt = false;
  hc.low_water = c.frame_size;
  hc.backoff_min_ms = 10;
  p2p_host_cbs cbs = {.ud = &c, .peer_up = client_up, .peer_down = client_down, .message = client_message,
                      .writable = client_writable};
  if ((rc = p2p_host_new(&c.loop, &hc, &cbs, &c.host)) == 0) {
    client_connect(&c);
    uv_run(&c.loop, UV_RUN_DEFAULT);
  }
  uv_async_send(&sv.stop);
  uv_thread_join(&tid);
  uv_loop_close(&sv.loop);
  uv_loop_close(&c.loop);
  if (rc == 0 && c.rc == 0 && c.end_ns) report(&c, &sv);
  free(c.hs_ms);
  free(c.payload);
  if (rc != 0 || c.rc != 0 || !c.end_ns) {
    fprintf(stderr, "gwtf bench p2p: failed: %s\n", gw_strerror(rc ? rc : c.rc ? c.rc : GW_EIO));
    return 1;
  }
  return 0;
}
