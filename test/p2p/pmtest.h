/* test/p2p/pmtest.h — what the port-mapping tests (test_natpmp, test_pcp)
 * share: a UDP "gateway" socket on 127.0.0.1:5351 that hands each datagram
 * to the test's answer function and sends what it answers, and a watcher
 * for the status callbacks of p2p/portmap.h. Include after p2ptest.h. */
#ifndef GWTF_TEST_PMTEST_H
#define GWTF_TEST_PMTEST_H

#include <arpa/inet.h>

#include "p2p/portmap.h"

#define PMTEST_GATEWAY "127.0.0.1"

#define pm_put16 p2p_pm_put16
#define pm_put32 p2p_pm_put32
#define pm_get16 p2p_pm_get16
#define pm_get32 p2p_pm_get32

/* ---- the fake gateway's socket ---- */

typedef struct pm_gw pm_gw;
/* Called with each datagram; answers with pm_gw_send. */
typedef void (*pm_gw_answer_fn)(pm_gw *g, const struct sockaddr *from, const uint8_t *p, size_t n);

struct pm_gw {
  uv_udp_t udp;
  pm_gw_answer_fn answer;
  void *ud; /* the test's fake state */
};

typedef struct pm_gw_reply {
  uv_udp_send_t req;
  uint8_t buf[1100];
} pm_gw_reply;

static void pm_gw_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static uint8_t space[1200];
  (void)h, (void)suggested;
  *buf = uv_buf_init((char *)space, sizeof(space));
}

static void pm_gw_sent(uv_udp_send_t *req, int status) {
  (void)status;
  free(req);
}

static inline void pm_gw_send(pm_gw *g, const struct sockaddr *to, const uint8_t *p, size_t len) {
  pm_gw_reply *rep = calloc(1, sizeof(*rep));
  memcpy(rep->buf, p, len);
  uv_buf_t b = uv_buf_init((char *)rep->buf, (unsigned)len);
  uv_udp_send(&rep->req, &g->udp, &b, 1, to, pm_gw_sent);
}

static void pm_gw_recv(uv_udp_t *u, ssize_t n, const uv_buf_t *buf, const struct sockaddr *from, unsigned flags) {
  pm_gw *g = u->data;
  (void)flags;
  if (n < 2 || !from) return;
  g->answer(g, from, (const uint8_t *)buf->base, (size_t)n);
}

static inline void pm_gw_start(pm_gw *g, uv_loop_t *loop, pm_gw_answer_fn answer, void *ud) {
  memset(g, 0, sizeof(*g));
  g->answer = answer;
  g->ud = ud;
  struct sockaddr_in sa;
  uv_ip4_addr(PMTEST_GATEWAY, 5351, &sa);
  uv_udp_init(loop, &g->udp);
  g->udp.data = g;
  int rc = uv_udp_bind(&g->udp, (const struct sockaddr *)&sa, 0);
  if (rc != 0) fprintf(stderr, "cannot bind the fake gateway on %s:5351: %s\n", PMTEST_GATEWAY, uv_strerror(rc));
  assert_int_equal(rc, 0);
  uv_udp_recv_start(&g->udp, pm_gw_alloc, pm_gw_recv);
}

static inline void pm_gw_stop(pm_gw *g) { uv_close((uv_handle_t *)&g->udp, NULL); }

/* ---- watching the status callbacks ---- */

typedef struct pm_watch {
  p2p_portmap_status last;
  int calls;
  uint64_t mapped_ns, renewed_ns;
  bool stopped;
} pm_watch;

static void pm_on_status(void *ud, const p2p_portmap_status *st) {
  pm_watch *w = ud;
  w->last = *st;
  w->calls++;
  if (st->state == P2P_PORTMAP_MAPPED && st->renewals == 0 && !w->mapped_ns) w->mapped_ns = gw_clock_mono_ns();
  if (st->renewals == 1 && !w->renewed_ns) w->renewed_ns = gw_clock_mono_ns();
}

static void pm_on_stopped(void *ud) { ((pm_watch *)ud)->stopped = true; }
static inline bool pm_is_mapped(void *ud) { return ((pm_watch *)ud)->mapped_ns != 0; }
static inline bool pm_is_renewed(void *ud) { return ((pm_watch *)ud)->renewed_ns != 0; }
static inline bool pm_is_stopped(void *ud) { return ((pm_watch *)ud)->stopped; }
static inline bool pm_is_settled(void *ud) {
  pm_watch *w = ud;
  return w->calls > 0 && w->last.state != P2P_PORTMAP_WORKING;
}

/* Starts mapping tcp_port and udp_port through the gateway on 127.0.0.1. */
static inline p2p_portmap *pm_start(uv_loop_t *loop, pm_watch *w, p2p_portmap_mode mode, uint16_t tcp_port,
                                    uint16_t udp_port, uint32_t give_up_ms, const gw_log *lg) {
  p2p_portmap_config cfg = {.mode = mode, .tcp_port = tcp_port, .udp_port = udp_port, .gateway = PMTEST_GATEWAY,
                            .give_up_ms = give_up_ms, .log = lg};
  p2p_portmap *pm = NULL;
  assert_int_equal(p2p_portmap_start(loop, &cfg, pm_on_status, w, &pm), 0);
  assert_non_null(pm);
  assert_int_equal(w->calls, 0); /* no callback from inside start */
  return pm;
}

static inline void pm_stop(uv_loop_t *loop, p2p_portmap *pm, pm_watch *w) {
  p2p_portmap_stop(pm, pm_on_stopped, w);
  assert_true(run_until(loop, pm_is_stopped, w, 5000));
}

#endif
