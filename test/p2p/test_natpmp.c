/* Unit tests for p2p/natpmp against a fake NAT-PMP gateway on
 * 127.0.0.1:5351 (RFC 6886 wire format), run on the same loop. The port is
 * fixed by the protocol, so ctest runs this test alone (RESOURCE_LOCK). */
#include "testutil.h"

#include <arpa/inet.h>

#include "p2p/natpmp.h"
#include "p2ptest.h"

#define GATEWAY "127.0.0.1"
#define TCP_PORT (40001)
#define UDP_PORT (40002)
#define PUBLIC_IP "203.0.113.7" /* TEST-NET-3: documentation only */
#define PORT_SHIFT (10000)      /* the fake maps port p to p + 10000 */

typedef enum fake_mode { FAKE_GRANT, FAKE_SILENT, FAKE_REFUSE } fake_mode;

typedef struct request {
  uint8_t op; /* 0 public address, 1 UDP, 2 TCP */
  uint16_t internal, external;
  uint32_t lifetime;
  uint64_t t_ns;
} request;

typedef struct fake_gw {
  uv_udp_t udp;
  fake_mode mode;
  uint32_t grant_s;
  request reqs[256];
  int n;
} fake_gw;

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v) {
  put16(p, (uint16_t)(v >> 16));
  put16(p + 2, (uint16_t)v);
}

static void fake_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static uint8_t space[64];
  (void)h, (void)suggested;
  *buf = uv_buf_init((char *)space, sizeof(space));
}

typedef struct reply {
  uv_udp_send_t req;
  uint8_t buf[16];
} reply;

static void fake_sent(uv_udp_send_t *req, int status) {
  (void)status;
  free(req);
}

static void fake_recv(uv_udp_t *u, ssize_t n, const uv_buf_t *buf, const struct sockaddr *from, unsigned flags) {
  fake_gw *g = u->data;
  (void)flags;
  if (n < 2 || !from) return;
  const uint8_t *p = (const uint8_t *)buf->base;
  request *r = &g->reqs[g->n < 255 ? g->n++ : 255];
  memset(r, 0, sizeof(*r));
  r->op = p[1];
  r->t_ns = gw_clock_mono_ns();
  if (r->op != 0 && n >= 12) {
    r->internal = (uint16_t)(p[4] << 8 | p[5]);
    r->external = (uint16_t)(p[6] << 8 | p[7]);
    r->lifetime = (uint32_t)p[8] << 24 | (uint32_t)p[9] << 16 | (uint32_t)p[10] << 8 | p[11];
  }
  if (g->mode == FAKE_SILENT) return;
  reply *rep = calloc(1, sizeof(*rep));
  uint8_t *o = rep->buf;
  o[0] = 0;
  o[1] = (uint8_t)(128 + r->op);
  put16(o + 2, g->mode == FAKE_REFUSE && r->op != 0 ? 2 : 0); /* 2: not authorized */
  put32(o + 4, 1000);                                         /* seconds since the gateway's epoch */
  size_t len = 12;
  if (r->op == 0) {
    inet_pton(AF_INET, PUBLIC_IP, o + 8);
  } else {
    put16(o + 8, r->internal);
    put16(o + 10, r->lifetime ? (uint16_t)(r->internal + PORT_SHIFT) : 0);
    put32(o + 12, r->lifetime < g->grant_s ? r->lifetime : g->grant_s); /* a shorter lease than asked */
    len = 16;
  }
  uv_buf_t b = uv_buf_init((char *)rep->buf, (unsigned)len);
  uv_udp_send(&rep->req, u, &b, 1, from, fake_sent);
}

static void fake_start(fake_gw *g, uv_loop_t *loop, fake_mode mode, uint32_t grant_s) {
  memset(g, 0, sizeof(*g));
  g->mode = mode;
  g->grant_s = grant_s;
  struct sockaddr_in sa;
  uv_ip4_addr(GATEWAY, 5351, &sa);
  uv_udp_init(loop, &g->udp);
  g->udp.data = g;
  int rc = uv_udp_bind(&g->udp, (const struct sockaddr *)&sa, 0);
  if (rc != 0) fprintf(stderr, "cannot bind the fake gateway on %s:5351: %s\n", GATEWAY, uv_strerror(rc));
  assert_int_equal(rc, 0);
  uv_udp_recv_start(&g->udp, fake_alloc, fake_recv);
}

static void fake_stop(fake_gw *g) { uv_close((uv_handle_t *)&g->udp, NULL); }

static int count(const fake_gw *g, uint8_t op, uint16_t internal, bool deletion) {
  int k = 0;
  for (int i = 0; i < g->n; i++)
    if (g->reqs[i].op == op && g->reqs[i].internal == internal && (g->reqs[i].lifetime == 0) == deletion) k++;
  return k;
}

/* What the module told us. */
typedef struct watch {
  p2p_natpmp_status last;
  int calls;
  uint64_t mapped_ns, renewed_ns;
  bool stopped;
} watch;

static void on_status(void *ud, const p2p_natpmp_status *st) {
  watch *w = ud;
  w->last = *st;
  w->calls++;
  if (st->state == P2P_NATPMP_MAPPED && st->renewals == 0 && !w->mapped_ns) w->mapped_ns = gw_clock_mono_ns();
  if (st->renewals == 1 && !w->renewed_ns) w->renewed_ns = gw_clock_mono_ns();
}

static void on_stopped(void *ud) { ((watch *)ud)->stopped = true; }

static bool is_mapped(void *ud) { return ((watch *)ud)->mapped_ns != 0; }
static bool is_renewed(void *ud) { return ((watch *)ud)->renewed_ns != 0; }
static bool is_stopped(void *ud) { return ((watch *)ud)->stopped; }
static bool is_settled(void *ud) {
  watch *w = ud;
  return w->calls > 0 && w->last.state != P2P_NATPMP_WORKING;
}

static logrec rec;
static gw_log lg;

/* Starts mapping TCP_PORT and UDP_PORT through the gateway on 127.0.0.1. */
static p2p_natpmp *start(uv_loop_t *loop, watch *w, uint32_t give_up_ms) {
  p2p_natpmp_config cfg = {.tcp_port = TCP_PORT, .udp_port = UDP_PORT, .gateway = GATEWAY,
                           .give_up_ms = give_up_ms, .log = &lg};
  p2p_natpmp *n = NULL;
  assert_int_equal(p2p_natpmp_start(loop, &cfg, on_status, w, &n), 0);
  assert_non_null(n);
  return n;
}

static void stop(uv_loop_t *loop, p2p_natpmp *n, watch *w) {
  p2p_natpmp_stop(n, on_stopped, w);
  assert_true(run_until(loop, is_stopped, w, 5000));
}

static void test_map_renew_delete(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_gw g;
  fake_start(&g, &loop, FAKE_GRANT, 2);
  watch w = {0};
  p2p_natpmp *n = start(&loop, &w, 5000);
  assert_true(run_until(&loop, is_mapped, &w, 5000));
  char tcp[GW_ADDR_STRLEN], udp[GW_ADDR_STRLEN];
  gw_addr_format(&w.last.external_tcp, tcp);
  gw_addr_format(&w.last.external_udp, udp);
  assert_string_equal(tcp, PUBLIC_IP ":50001");
  assert_string_equal(udp, PUBLIC_IP ":50002");
  assert_int_equal(w.last.lease_s, 2); /* what the gateway granted, not the 3600 s asked for */
  assert_int_equal(count(&g, 0, 0, true), 1);
  assert_int_equal(count(&g, 2, TCP_PORT, false), 1);
  assert_int_equal(count(&g, 1, UDP_PORT, false), 1);
  assert_true(logrec_count(&rec, "nat.mapped", "tcp=" PUBLIC_IP ":50001") == 1);

  /* Renewal at half the granted lease: ~1 s after the mapping. */
  assert_true(run_until(&loop, is_renewed, &w, 5000));
  double after = (double)(w.renewed_ns - w.mapped_ns) / 1e9;
  fprintf(stderr, "renewed %.3f s after mapping (lease 2 s)\n", after);
  assert_true(after >= 0.9 && after <= 1.6);
  assert_int_equal(count(&g, 2, TCP_PORT, false), 2);
  assert_int_equal(count(&g, 1, UDP_PORT, false), 2);
  assert_int_equal(w.last.state, P2P_NATPMP_MAPPED);

  /* A clean exit deletes both mappings (lifetime 0). */
  stop(&loop, n, &w);
  assert_int_equal(count(&g, 2, TCP_PORT, true), 1);
  assert_int_equal(count(&g, 1, UDP_PORT, true), 1);
  assert_int_equal(logrec_count(&rec, "nat.unmapped", NULL), 1);
  fake_stop(&g);
  drain_loop(&loop);
}

static void test_gateway_refuses(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_gw g;
  fake_start(&g, &loop, FAKE_REFUSE, 60);
  watch w = {0};
  p2p_natpmp *n = start(&loop, &w, 5000);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_NATPMP_FAILED);
  assert_string_equal(w.last.why, "not-authorized");
  assert_int_equal(logrec_count(&rec, "nat.failed", "reason=not-authorized"), 1);
  stop(&loop, n, &w);
  assert_int_equal(count(&g, 2, TCP_PORT, true), 0); /* nothing was mapped, nothing to delete */
  fake_stop(&g);
  drain_loop(&loop);
}

/* Nobody on 5351: the kernel's "port unreachable" ends it at once. */
static void test_no_gateway_port_closed(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  watch w = {0};
  uint64_t t0 = gw_clock_mono_ns();
  p2p_natpmp *n = start(&loop, &w, 10000);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_NATPMP_UNAVAILABLE);
  assert_true(gw_clock_mono_ns() - t0 < 2000000000ULL);
  stop(&loop, n, &w);
  drain_loop(&loop);
}

/* A gateway that never answers: give up after give_up_ms and carry on. */
static void test_silent_gateway_gives_up(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_gw g;
  fake_start(&g, &loop, FAKE_SILENT, 0);
  watch w = {0};
  uint64_t t0 = gw_clock_mono_ns();
  p2p_natpmp *n = start(&loop, &w, 700);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  double took = (double)(gw_clock_mono_ns() - t0) / 1e6;
  fprintf(stderr, "gave up after %.0f ms (give_up_ms 700), %d requests sent\n", took, g.n);
  assert_int_equal(w.last.state, P2P_NATPMP_UNAVAILABLE);
  assert_string_equal(w.last.why, "no-answer");
  assert_true(took >= 690 && took < 2500);
  assert_true(g.n >= 2); /* libnatpmp resent (250 ms, then 500 ms) */
  assert_true(logrec_count(&rec, "nat.unavailable", "reason=no-answer") == 1);
  int sent = g.n;
  stop(&loop, n, &w);
  assert_int_equal(g.n, sent); /* no deletions for mappings that never existed */
  fake_stop(&g);
  drain_loop(&loop);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  logrec_init(&rec, GW_LOG_DEBUG);
  gw_log_init(&lg, &rec.sink, NULL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_renew_delete),
      cmocka_unit_test(test_gateway_refuses),
      cmocka_unit_test(test_no_gateway_port_closed),
      cmocka_unit_test(test_silent_gateway_gives_up),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  logrec_free(&rec);
  return rc;
}
