/* Unit tests for the NAT-PMP client (p2p_pm_natpmp through p2p/portmap.h,
 * --port-mapping natpmp) against a fake NAT-PMP gateway on 127.0.0.1:5351
 * (RFC 6886 wire format), run on the same loop, and for the strict reply
 * check (p2p_natpmp_parse_reply). The port is fixed by the protocol, so
 * ctest runs this test alone (RESOURCE_LOCK). */
#include "testutil.h"

#include <arpa/inet.h>

#include "p2p/natpmp.h"
#include "p2p/portmap.h"
#include "p2ptest.h"
#include "pmtest.h"

#define TCP_PORT (40001)
#define UDP_PORT (40002)
#define PUBLIC_IP "203.0.113.7" /* TEST-NET-3: documentation only */
#define PORT_SHIFT (10000)      /* the fake maps port p to p + 10000 */

typedef enum fake_mode { FAKE_GRANT, FAKE_SILENT, FAKE_REFUSE, FAKE_GARBLE } fake_mode;

typedef struct request {
  uint8_t op; /* 0 public address, 1 UDP, 2 TCP */
  uint16_t internal, external;
  uint32_t lifetime;
  uint64_t t_ns;
} request;

typedef struct fake_gw {
  pm_gw sock;
  fake_mode mode;
  uint32_t grant_s;
  request reqs[256];
  int n;
} fake_gw;

static void fake_answer(pm_gw *sock, const struct sockaddr *from, const uint8_t *p, size_t n) {
  fake_gw *g = sock->ud;
  request *r = &g->reqs[g->n < 255 ? g->n++ : 255];
  memset(r, 0, sizeof(*r));
  r->op = p[1];
  r->t_ns = gw_clock_mono_ns();
  if (r->op != 0 && n >= 12) {
    r->internal = pm_get16(p + 4);
    r->external = pm_get16(p + 6);
    r->lifetime = pm_get32(p + 8);
  }
  if (g->mode == FAKE_SILENT) return;
  uint8_t o[16] = {0};
  o[1] = (uint8_t)(128 + r->op);
  if (g->mode == FAKE_GARBLE) {
    /* Before each good reply, a truncated one that libnatpmp alone would
     * have taken for a mapping (it does not check lengths). */
    pm_gw_send(sock, from, o, 4);
  }
  pm_put16(o + 2, g->mode == FAKE_REFUSE && r->op != 0 ? 2 : 0); /* 2: not authorized */
  pm_put32(o + 4, 1000);                                        /* seconds since the gateway's epoch */
  size_t len = 12;
  if (r->op == 0) {
    inet_pton(AF_INET, PUBLIC_IP, o + 8);
  } else {
    pm_put16(o + 8, r->internal);
    pm_put16(o + 10, r->lifetime ? (uint16_t)(r->internal + PORT_SHIFT) : 0);
    pm_put32(o + 12, r->lifetime < g->grant_s ? r->lifetime : g->grant_s); /* a shorter lease than asked */
    len = 16;
  }
  pm_gw_send(sock, from, o, len);
}

static void fake_start(fake_gw *g, uv_loop_t *loop, fake_mode mode, uint32_t grant_s) {
  memset(g, 0, sizeof(*g));
  g->mode = mode;
  g->grant_s = grant_s;
  pm_gw_start(&g->sock, loop, fake_answer, g);
}

static void fake_stop(fake_gw *g) { pm_gw_stop(&g->sock); }

static int count(const fake_gw *g, uint8_t op, uint16_t internal, bool deletion) {
  int k = 0;
  for (int i = 0; i < g->n; i++)
    if (g->reqs[i].op == op && g->reqs[i].internal == internal && (g->reqs[i].lifetime == 0) == deletion) k++;
  return k;
}

typedef pm_watch watch;
#define is_mapped pm_is_mapped
#define is_renewed pm_is_renewed
#define is_settled pm_is_settled

static logrec rec;
static gw_log lg;

/* Starts mapping TCP_PORT and UDP_PORT through the gateway on 127.0.0.1. */
static p2p_portmap *start(uv_loop_t *loop, watch *w, uint32_t give_up_ms) {
  return pm_start(loop, w, P2P_PORTMAP_NATPMP, TCP_PORT, UDP_PORT, give_up_ms, &lg);
}

#define stop pm_stop

static void test_map_renew_delete(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_gw g;
  fake_start(&g, &loop, FAKE_GRANT, 2);
  watch w = {0};
  p2p_portmap *n = start(&loop, &w, 5000);
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
  assert_string_equal(w.last.proto, "natpmp");
  assert_true(logrec_count(&rec, "nat.mapped", "proto=natpmp external=" PUBLIC_IP ":50001") == 1);
  assert_true(logrec_count(&rec, "nat.mapped", "lifetime=2") == 1);

  /* Renewal at half the granted lease: ~1 s after the mapping. */
  assert_true(run_until(&loop, is_renewed, &w, 5000));
  double after = (double)(w.renewed_ns - w.mapped_ns) / 1e9;
  fprintf(stderr, "renewed %.3f s after mapping (lease 2 s)\n", after);
  assert_true(after >= 0.9 && after <= 1.6);
  assert_int_equal(count(&g, 2, TCP_PORT, false), 2);
  assert_int_equal(count(&g, 1, UDP_PORT, false), 2);
  assert_int_equal(w.last.state, P2P_PORTMAP_MAPPED);
  assert_int_equal(count(&g, 0, 0, true), 2); /* the public address is asked again on renewal */

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
  p2p_portmap *n = start(&loop, &w, 5000);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_PORTMAP_NONE);
  assert_string_equal(w.last.why, "not-authorized");
  assert_int_equal(logrec_count(&rec, "nat.proto_failed", "proto=natpmp reason=not-authorized absent=false"), 1);
  assert_int_equal(logrec_count(&rec, "nat.no_mapping", "tried=natpmp reason=not-authorized"), 1);
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
  p2p_portmap *n = start(&loop, &w, 10000);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_PORTMAP_NONE);
  assert_string_equal(w.last.why, "no-gateway");
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
  p2p_portmap *n = start(&loop, &w, 700);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  double took = (double)(gw_clock_mono_ns() - t0) / 1e6;
  fprintf(stderr, "gave up after %.0f ms (give_up_ms 700), %d requests sent\n", took, g.n);
  assert_int_equal(w.last.state, P2P_PORTMAP_NONE);
  assert_string_equal(w.last.why, "no-answer");
  assert_true(took >= 690 && took < 2500);
  assert_true(g.n >= 2); /* libnatpmp resent (250 ms, then 500 ms) */
  assert_true(logrec_count(&rec, "nat.proto_failed", "proto=natpmp reason=no-answer absent=true") == 1);
  int sent = g.n;
  stop(&loop, n, &w);
  assert_int_equal(g.n, sent); /* no deletions for mappings that never existed */
  fake_stop(&g);
  drain_loop(&loop);
}

/* Truncated replies are dropped before libnatpmp reads them: the mapping is
 * made from the good replies only, with the right ports. */
static void test_garbled_replies_dropped(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_gw g;
  fake_start(&g, &loop, FAKE_GARBLE, 60);
  watch w = {0};
  size_t bad_before = logrec_count(&rec, "nat.bad_reply", "proto=natpmp");
  p2p_portmap *n = start(&loop, &w, 5000);
  assert_true(run_until(&loop, is_mapped, &w, 5000));
  char tcp[GW_ADDR_STRLEN];
  gw_addr_format(&w.last.external_tcp, tcp);
  assert_string_equal(tcp, PUBLIC_IP ":50001");
  assert_int_equal(w.last.lease_s, 60);
  assert_true(logrec_count(&rec, "nat.bad_reply", "proto=natpmp") >= bad_before + 3);
  stop(&loop, n, &w);
  fake_stop(&g);
  drain_loop(&loop);
}

static void test_parse_reply(void **state) {
  (void)state;
  p2p_natpmp_reply r;
  const uint8_t pub[12] = {0, 128, 0, 0, 0, 0, 3, 232, 203, 0, 113, 7};
  assert_int_equal(p2p_natpmp_parse_reply(pub, sizeof(pub), &r), 0);
  assert_int_equal(r.op, 128);
  assert_int_equal(r.epoch, 1000);
  assert_memory_equal(r.public_ip, pub + 8, 4);
  const uint8_t map[16] = {0, 130, 0, 0, 0, 0, 0, 1, 0x9c, 0x41, 0xc3, 0x51, 0, 0, 0x0e, 0x10};
  assert_int_equal(p2p_natpmp_parse_reply(map, sizeof(map), &r), 0);
  assert_int_equal(r.internal_port, 40001);
  assert_int_equal(r.external_port, 50001);
  assert_int_equal(r.lifetime, 3600);
  /* an error as the bare header */
  const uint8_t err[8] = {0, 130, 0, 2, 0, 0, 0, 1};
  assert_int_equal(p2p_natpmp_parse_reply(err, sizeof(err), &r), 0);
  assert_int_equal(r.result, 2);
  /* rejected: truncated, padded, wrong version, a request, unknown op, a
   * success as the bare header, PCP's version */
  assert_int_equal(p2p_natpmp_parse_reply(map, 15, &r), GW_EPROTO);
  assert_int_equal(p2p_natpmp_parse_reply(map, 2, &r), GW_EPROTO);
  assert_int_equal(p2p_natpmp_parse_reply(pub, 11, &r), GW_EPROTO);
  uint8_t big[17] = {0};
  memcpy(big, map, 16);
  assert_int_equal(p2p_natpmp_parse_reply(big, 17, &r), GW_EPROTO);
  uint8_t m[16];
  memcpy(m, map, 16);
  m[0] = 2;
  assert_int_equal(p2p_natpmp_parse_reply(m, 16, &r), GW_EPROTO);
  m[0] = 0;
  m[1] = 2; /* a request */
  assert_int_equal(p2p_natpmp_parse_reply(m, 16, &r), GW_EPROTO);
  m[1] = 131;
  assert_int_equal(p2p_natpmp_parse_reply(m, 16, &r), GW_EPROTO);
  assert_int_equal(p2p_natpmp_parse_reply(map, 8, &r), GW_EPROTO);
  memcpy(m, map, 16);
  m[1] = 128; /* a public-address reply must be 12 bytes */
  assert_int_equal(p2p_natpmp_parse_reply(m, 16, &r), GW_EPROTO);
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
      cmocka_unit_test(test_garbled_replies_dropped),
      cmocka_unit_test(test_parse_reply),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  logrec_free(&rec);
  return rc;
}
