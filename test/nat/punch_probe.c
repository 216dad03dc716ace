/* punch_probe — one p2p host for the hole-punching tests in network
 * namespaces (test/nat/test_punch.py): a relay, a private target that
 * reserves on it, or a dialler that reaches the target through it and
 * waits for the punch.
 *
 *   punch_probe relay  LISTEN
 *   punch_probe target LISTEN RELAY_ADDR RELAY_ID
 *   punch_probe dial   LISTEN RELAY_ADDR RELAY_ID TARGET_ID COUNT
 *
 * Each prints "ready id=HEX" on stdout once it can be used. The target
 * echoes every message back. The dialler, once connected through the relay,
 * sends COUNT numbered messages (a few at a time, so some are in flight
 * when the session moves), checks that the echoes come back exactly once
 * and in order, and prints one line:
 *   result=direct after_ms=N echoes=COUNT disorder=0 relayed=0
 *   result=relayed reason=R echoes=COUNT disorder=0 relayed=1
 * then exits 0 (or 1 when something is wrong). Log lines go to stderr. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "p2p/host.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"

#define APP_TYPE (300)
#define MSG_BYTES (16 << 10)
#define RUN_MS (30000)

typedef struct probe {
  uv_loop_t loop;
  p2p_identity me;
  gw_log log;
  gw_log_sink sink;
  p2p_host *h;
  const char *mode;
  gw_id relay, target;
  gw_addr relay_addr;
  bool connected, done;
  uint64_t count, sent, next_rx, disorder, start_ms;
  int rc;
  uv_timer_t timer;
} probe;

static void on_msg(void *ud, const gw_id *from, p2p_msg *msg) {
  probe *p = ud;
  if (msg->type != APP_TYPE) return;
  if (strcmp(p->mode, "target") == 0) {
    p2p_msg m = {.type = APP_TYPE, .request_id = msg->request_id, .data = msg->data, .data_len = msg->data_len};
    p2p_host_send(p->h, from, &m);
    return;
  }
  if (msg->request_id != p->next_rx || msg->data_len != MSG_BYTES || msg->data[0] != (uint8_t)msg->request_id)
    p->disorder++;
  p->next_rx = msg->request_id + 1;
}

static void on_up(void *ud, const gw_peer *peer, bool back) {
  probe *p = ud;
  (void)back;
  if (strcmp(p->mode, "dial") == 0 && gw_id_eq(&peer->id, &p->target)) p->connected = true;
}

static void on_down(void *ud, const gw_id *id, p2p_down_reason reason) {
  probe *p = ud;
  (void)reason;
  if (strcmp(p->mode, "dial") == 0 && gw_id_eq(id, &p->target)) {
    fprintf(stderr, "punch_probe: the target went down\n");
    p->disorder++; /* a switch must not look like this */
  }
}

static void finish(probe *p, int rc) {
  if (p->done) return;
  p->done = true;
  p->rc = rc;
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, NULL);
  p2p_host_close(p->h, NULL, NULL);
}

static void on_tick(uv_timer_t *t) {
  probe *p = t->data;
  if (strcmp(p->mode, "dial") != 0) return;
  uint64_t now = gw_clock_mono_ms();
  if (now > p->start_ms + RUN_MS) {
    printf("result=timeout echoes=%llu disorder=%llu\n", (unsigned long long)p->next_rx,
           (unsigned long long)p->disorder);
    finish(p, 1);
    return;
  }
  if (!p->connected) return;
  static uint8_t data[MSG_BYTES];
  /* A few at a time, paced by the loop: some are always in flight. */
  for (int k = 0; k < 4 && p->sent < p->count && p2p_host_queued(p->h, &p->target) < (128u << 10); k++) {
    memset(data, (int)(uint8_t)p->sent, 64);
    p2p_msg m = {.type = APP_TYPE, .request_id = p->sent, .data = data, .data_len = MSG_BYTES};
    if (p2p_host_send(p->h, &p->target, &m) != 0) break;
    p->sent++;
  }
  p2p_punch_stats ps;
  p2p_host_punch_stats(p->h, &ps);
  p2p_peer_stats st;
  p2p_host_peer_stats(p->h, &p->target, &st);
  bool settled = ps.direct > 0 ? !st.relayed : ps.failed > 0;
  if (p->next_rx >= p->count && settled) {
    if (!st.relayed)
      printf("result=direct echoes=%llu disorder=%llu relayed=0\n", (unsigned long long)p->next_rx,
             (unsigned long long)p->disorder);
    else
      printf("result=relayed echoes=%llu disorder=%llu relayed=1\n", (unsigned long long)p->next_rx,
             (unsigned long long)p->disorder);
    finish(p, p->disorder ? 1 : 0);
  }
}

static int usage(void) {
  fprintf(stderr, "usage: punch_probe relay LISTEN | target LISTEN RELAY_ADDR RELAY_ID |"
                  " dial LISTEN RELAY_ADDR RELAY_ID TARGET_ID COUNT\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, NULL, _IOLBF, 0);
  static probe p;
  p.mode = argv[1];
  bool relay = strcmp(p.mode, "relay") == 0, target = strcmp(p.mode, "target") == 0,
       dial = strcmp(p.mode, "dial") == 0;
  if (!(relay || (target && argc == 5) || (dial && argc == 7))) return usage();
  if (p2p_crypto_init() != 0) return 1;
  p2p_identity_generate(&p.me);
  gw_log_sink_init(&p.sink, stderr, GW_LOG_DEBUG, GW_LOG_TEXT);
  gw_log_init(&p.log, &p.sink, &p.me.id);
  uv_loop_init(&p.loop);
  p2p_host_config hc;
  p2p_host_config_defaults(&hc);
  hc.me = &p.me;
  hc.log = &p.log;
  hc.log_rtt = false;
  hc.backoff_min_ms = 100;
  hc.backoff_max_ms = 1000;
  hc.punch.enabled = !relay;
  if (gw_addr_parse(argv[2], &hc.listen) != 0) return usage();
  if (!relay && (gw_addr_parse(argv[3], &p.relay_addr) != 0 || gw_id_from_hex(argv[4], &p.relay) != 0))
    return usage();
  if (dial && (gw_id_from_hex(argv[5], &p.target) != 0 || (p.count = strtoull(argv[6], NULL, 10)) == 0))
    return usage();
  p2p_host_cbs cbs = {.ud = &p, .peer_up = on_up, .peer_down = on_down, .message = on_msg};
  int rc = p2p_host_new(&p.loop, &hc, &cbs, &p.h);
  if (rc != 0) {
    fprintf(stderr, "punch_probe: host: %s\n", gw_strerror(rc));
    return 1;
  }
  if (target && (rc = p2p_host_relay_reserve(p.h, &p.relay, &p.relay_addr)) != 0) return 1;
  if (dial) {
    /* A direct session to the relay tells us our observed address. */
    if ((rc = p2p_host_connect(p.h, &p.relay_addr, &p.relay)) != 0) return 1;
    if ((rc = p2p_host_connect_via(p.h, &p.relay, &p.relay_addr, &p.target)) != 0) return 1;
  }
  char hex[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(&p.me.id, hex);
  if (!target) printf("ready id=%s\n", hex);
  uv_timer_init(&p.loop, &p.timer);
  p.timer.data = &p;
  p.start_ms = gw_clock_mono_ms();
  uv_timer_start(&p.timer, on_tick, 5, 5);
  if (target) { /* ready once the reservation holds */
    while (uv_run(&p.loop, UV_RUN_ONCE)) {
      p2p_relay_stats st;
      p2p_host_relay_stats(p.h, &st);
      if (st.reserved_on) break;
    }
    printf("ready id=%s\n", hex);
  }
  uv_run(&p.loop, UV_RUN_DEFAULT);
  uv_loop_close(&p.loop);
  return p.rc;
}
