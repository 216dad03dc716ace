/* Unit tests for PCP (RFC 6887 MAP): the codec (p2p/pcp.h) byte for byte,
 * and the client through p2p/portmap.h against a fake PCP server on
 * 127.0.0.1:5351 on the same loop: map, renew with the same nonce, delete
 * on stop, refusal, garbled and mismatched replies, and --port-mapping auto
 * falling back from PCP to NAT-PMP on a NAT-PMP-only router. The port is
 * fixed by the protocol, so ctest runs this test alone (RESOURCE_LOCK). */
#include "testutil.h"

#include <arpa/inet.h>

#include "p2p/pcp.h"
#include "p2p/portmap.h"
#include "p2ptest.h"
#include "pmtest.h"

#define TCP_PORT (40011)
#define UDP_PORT (40012)
#define PUBLIC_IP "203.0.113.9" /* TEST-NET-3: documentation only */
#define PORT_SHIFT (10000)      /* the fake maps port p to p + 10000 */

typedef enum fake_mode { FAKE_GRANT, FAKE_REFUSE, FAKE_NATPMP_ONLY, FAKE_GARBLE } fake_mode;

typedef struct request {
  uint8_t version;
  uint8_t protocol; /* PCP: 6/17; NAT-PMP: op 0/1/2 */
  uint16_t internal;
  uint32_t lifetime;
  uint8_t nonce[P2P_PCP_NONCE_LEN];
  uint8_t client_ip[16];
} request;

typedef struct fake_pcp {
  pm_gw sock;
  fake_mode mode;
  uint32_t grant_s;
  uint32_t epoch;
  request reqs[256];
  int n;
} fake_pcp;

/* A NAT-PMP gateway: public address and mappings, PUBLIC_IP, port + shift. */
static void natpmp_answer(fake_pcp *g, const struct sockaddr *to, const uint8_t *p, size_t n) {
  uint8_t o[16] = {0};
  o[1] = (uint8_t)(128 + p[1]);
  pm_put32(o + 4, g->epoch);
  if (p[1] == 0) {
    inet_pton(AF_INET, PUBLIC_IP, o + 8);
    pm_gw_send(&g->sock, to, o, 12);
  } else if (n >= 12) {
    uint16_t internal = pm_get16(p + 4);
    uint32_t life = pm_get32(p + 8);
    pm_put16(o + 8, internal);
    pm_put16(o + 10, life ? (uint16_t)(internal + PORT_SHIFT) : 0);
    pm_put32(o + 12, life < g->grant_s ? life : g->grant_s);
    pm_gw_send(&g->sock, to, o, 16);
  }
}

static void fake_answer(pm_gw *sock, const struct sockaddr *from, const uint8_t *p, size_t n) {
  fake_pcp *g = sock->ud;
  request *r = &g->reqs[g->n < 255 ? g->n++ : 255];
  memset(r, 0, sizeof(*r));
  r->version = p[0];
  if (p[0] == 0) { /* NAT-PMP */
    r->protocol = p[1];
    if (n >= 12) {
      r->internal = pm_get16(p + 4);
      r->lifetime = pm_get32(p + 8);
    }
    natpmp_answer(g, from, p, n);
    return;
  }
  if (n != P2P_PCP_MAP_LEN) return;
  const uint8_t *m = p + P2P_PCP_HEADER_LEN;
  r->lifetime = pm_get32(p + 4);
  memcpy(r->client_ip, p + 8, 16);
  memcpy(r->nonce, m, P2P_PCP_NONCE_LEN);
  r->protocol = m[12];
  r->internal = pm_get16(m + 16);
  if (g->mode == FAKE_NATPMP_ONLY) {
    /* RFC 6886 §3.5: a request of another version gets "unsupported version" */
    uint8_t o[8] = {0, (uint8_t)(128 + p[1]), 0, 1};
    pm_put32(o + 4, g->epoch);
    pm_gw_send(sock, from, o, 8);
    return;
  }
  uint8_t o[P2P_PCP_MAP_LEN];
  memcpy(o, p, P2P_PCP_MAP_LEN); /* the opcode data comes back as sent */
  o[1] = 0x80 | P2P_PCP_OP_MAP;
  o[2] = 0;
  o[3] = g->mode == FAKE_REFUSE ? P2P_PCP_NOT_AUTHORIZED : P2P_PCP_SUCCESS;
  uint32_t life = g->mode == FAKE_REFUSE ? 30 : (r->lifetime < g->grant_s ? r->lifetime : g->grant_s);
  pm_put32(o + 4, life);
  pm_put32(o + 8, g->epoch);
  memset(o + 12, 0, 12);
  uint8_t *om = o + P2P_PCP_HEADER_LEN;
  pm_put16(om + 18, r->lifetime ? (uint16_t)(r->internal + PORT_SHIFT) : 0);
  uint8_t ip4[4];
  inet_pton(AF_INET, PUBLIC_IP, ip4);
  p2p_pcp_ip_map4(ip4, om + 20);
  if (g->mode == FAKE_GARBLE) {
    pm_gw_send(sock, from, o, 58); /* truncated, not a multiple of 4 */
    uint8_t other[P2P_PCP_MAP_LEN];
    memcpy(other, o, sizeof(other));
    other[P2P_PCP_HEADER_LEN] ^= 0xff; /* someone else's nonce */
    pm_put16(other + P2P_PCP_HEADER_LEN + 18, 1);
    pm_gw_send(sock, from, other, sizeof(other));
    uint8_t opt[P2P_PCP_MAP_LEN + 8] = {0};
    memcpy(opt, o, P2P_PCP_MAP_LEN);
    opt[P2P_PCP_MAP_LEN] = 0x12;
    pm_put16(opt + P2P_PCP_MAP_LEN + 2, 40); /* an option longer than the packet */
    pm_gw_send(sock, from, opt, sizeof(opt));
  }
  pm_gw_send(sock, from, o, sizeof(o));
}

static void fake_start(fake_pcp *g, uv_loop_t *loop, fake_mode mode, uint32_t grant_s) {
  memset(g, 0, sizeof(*g));
  g->mode = mode;
  g->grant_s = grant_s;
  g->epoch = 5000;
  pm_gw_start(&g->sock, loop, fake_answer, g);
}

static void fake_stop(fake_pcp *g) { pm_gw_stop(&g->sock); }

static int count(const fake_pcp *g, uint8_t version, uint8_t protocol, bool deletion) {
  int k = 0;
  for (int i = 0; i < g->n; i++)
    if (g->reqs[i].version == version && g->reqs[i].protocol == protocol && (g->reqs[i].lifetime == 0) == deletion)
      k++;
  return k;
}

typedef pm_watch watch;
#define is_mapped pm_is_mapped
#define is_renewed pm_is_renewed
#define is_settled pm_is_settled
#define stop pm_stop

static logrec rec;
static gw_log lg;

static p2p_portmap *start(uv_loop_t *loop, watch *w, p2p_portmap_mode mode) {
  return pm_start(loop, w, mode, TCP_PORT, UDP_PORT, 3000, &lg);
}

/* ---- the codec ---- */

static void test_encode_map(void **state) {
  (void)state;
  p2p_pcp_map_req req = {.lifetime = 3600, .protocol = P2P_PCP_PROTO_TCP, .internal_port = 7447,
                         .suggested_port = 7447};
  const uint8_t me[4] = {192, 168, 1, 20}, any[4] = {0};
  p2p_pcp_ip_map4(me, req.client_ip);
  p2p_pcp_ip_map4(any, req.suggested_ip);
  for (int i = 0; i < P2P_PCP_NONCE_LEN; i++) req.nonce[i] = (uint8_t)(i + 1);
  uint8_t out[P2P_PCP_MAP_LEN];
  assert_int_equal(p2p_pcp_encode_map(&req, out), 60);
  const uint8_t want[60] = {
      2, 1, 0, 0, 0, 0, 0x0e, 0x10,                                  /* ver, MAP, reserved, lifetime 3600 */
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 20,     /* client ::ffff:192.168.1.20 */
      1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,                         /* nonce */
      6, 0, 0, 0, 0x1d, 0x17, 0x1d, 0x17,                            /* TCP, ports 7447 */
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0,          /* suggested ::ffff:0.0.0.0 */
  };
  assert_memory_equal(out, want, 60);
}

/* A good MAP response to req, granting port 50000 on 198.51.100.1 for 1200 s. */
static void good_reply(const p2p_pcp_map_req *req, uint8_t out[P2P_PCP_MAP_LEN]) {
  p2p_pcp_encode_map(req, out);
  out[1] = 0x81;
  out[3] = 0;
  pm_put32(out + 4, 1200);
  pm_put32(out + 8, 77);
  memset(out + 12, 0, 12);
  pm_put16(out + P2P_PCP_HEADER_LEN + 18, 50000);
  const uint8_t ip[4] = {198, 51, 100, 1};
  p2p_pcp_ip_map4(ip, out + P2P_PCP_HEADER_LEN + 20);
}

static void test_parse_reply(void **state) {
  (void)state;
  p2p_pcp_map_req req = {.lifetime = 3600, .protocol = P2P_PCP_PROTO_UDP, .internal_port = 7447};
  memset(req.nonce, 0xab, sizeof(req.nonce));
  uint8_t b[P2P_PCP_MAP_LEN + 16];
  good_reply(&req, b);
  p2p_pcp_reply r;
  assert_int_equal(p2p_pcp_parse_reply(b, P2P_PCP_MAP_LEN, &r), 0);
  assert_int_equal(r.opcode, P2P_PCP_OP_MAP);
  assert_int_equal(r.result, 0);
  assert_int_equal(r.lifetime, 1200);
  assert_int_equal(r.epoch, 77);
  assert_int_equal(r.external_port, 50000);
  assert_true(p2p_pcp_reply_matches(&r, &req));
  assert_true(p2p_pcp_reply_usable(&r, &req));

  /* options: one of 5 bytes padded to 8, then one empty */
  memset(b + 60, 0, 16);
  b[60] = 0x81;
  pm_put16(b + 62, 5);
  b[72] = 0x02;
  assert_int_equal(p2p_pcp_parse_reply(b, 76, &r), 0);
  assert_int_equal(r.n_options, 2);
  pm_put16(b + 62, 13); /* runs past the end */
  assert_int_equal(p2p_pcp_parse_reply(b, 76, &r), GW_EPROTO);
  pm_put16(b + 62, 5);
  assert_int_equal(p2p_pcp_parse_reply(b, 68, &r), GW_EPROTO); /* the first option's data cut short */

  /* structure */
  assert_int_equal(p2p_pcp_parse_reply(b, 0, &r), GW_EPROTO);
  assert_int_equal(p2p_pcp_parse_reply(b, 20, &r), GW_EPROTO);
  assert_int_equal(p2p_pcp_parse_reply(b, 58, &r), GW_EPROTO); /* not a multiple of 4 */
  assert_int_equal(p2p_pcp_parse_reply(b, 56, &r), GW_EPROTO); /* MAP success without its data */
  uint8_t big[P2P_PCP_MAX_LEN + 4] = {0};
  memcpy(big, b, 60);
  assert_int_equal(p2p_pcp_parse_reply(big, sizeof(big), &r), GW_EPROTO);
  uint8_t c[P2P_PCP_MAP_LEN];
  good_reply(&req, c);
  c[1] = 0x01; /* a request */
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), GW_EPROTO);
  good_reply(&req, c);
  c[0] = 3;
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), GW_EPROTO);
  c[3] = P2P_PCP_UNSUPP_VERSION;
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), GW_EUNSUPPORTED);
  const uint8_t natpmp[8] = {0, 129, 0, 1, 0, 0, 0, 9};
  assert_int_equal(p2p_pcp_parse_reply(natpmp, 8, &r), GW_EUNSUPPORTED);
  /* an error without opcode data is well-formed but has no MAP fields */
  good_reply(&req, c);
  c[3] = P2P_PCP_MALFORMED_REQUEST;
  assert_int_equal(p2p_pcp_parse_reply(c, 24, &r), 0);
  assert_false(r.has_map);
  assert_false(p2p_pcp_reply_matches(&r, &req));

  /* matching and usability */
  good_reply(&req, c);
  c[P2P_PCP_HEADER_LEN] ^= 1;
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), 0);
  assert_false(p2p_pcp_reply_matches(&r, &req)); /* nonce */
  good_reply(&req, c);
  c[P2P_PCP_HEADER_LEN + 12] = P2P_PCP_PROTO_TCP;
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), 0);
  assert_false(p2p_pcp_reply_matches(&r, &req)); /* protocol */
  good_reply(&req, c);
  pm_put32(c + 4, 0);
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), 0);
  assert_false(p2p_pcp_reply_usable(&r, &req)); /* no lease */
  good_reply(&req, c);
  memset(c + P2P_PCP_HEADER_LEN + 20, 0x20, 16);
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), 0);
  assert_false(p2p_pcp_reply_usable(&r, &req)); /* an IPv6 address for an IPv4 mapping */
  good_reply(&req, c);
  memset(c + P2P_PCP_HEADER_LEN + 32, 0, 4);
  assert_int_equal(p2p_pcp_parse_reply(c, 60, &r), 0);
  assert_false(p2p_pcp_reply_usable(&r, &req)); /* 0.0.0.0 */
  assert_string_equal(p2p_pcp_result_name(2), "not-authorized");
  assert_string_equal(p2p_pcp_result_name(200), "unknown-result");
}

static void test_epoch(void **state) {
  (void)state;
  assert_true(p2p_pcp_epoch_ok(100, 5000, 160, 5060));  /* both moved 60 s */
  assert_true(p2p_pcp_epoch_ok(100, 5000, 160, 5058));  /* a little drift */
  assert_false(p2p_pcp_epoch_ok(100, 5000, 160, 10));   /* the server restarted */
  assert_false(p2p_pcp_epoch_ok(100, 5000, 1100, 5010)); /* the server's clock ran slow: state lost */
  assert_true(p2p_pcp_epoch_ok(100, 5000, 100, 4999));  /* one second back is tolerated */
}

/* ---- the client against the fake ---- */

static void test_map_renew_delete(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_pcp g;
  fake_start(&g, &loop, FAKE_GRANT, 2);
  watch w = {0};
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_PCP);
  assert_true(run_until(&loop, is_mapped, &w, 5000));
  char tcp[GW_ADDR_STRLEN], udp[GW_ADDR_STRLEN];
  gw_addr_format(&w.last.external_tcp, tcp);
  gw_addr_format(&w.last.external_udp, udp);
  assert_string_equal(tcp, PUBLIC_IP ":50011");
  assert_string_equal(udp, PUBLIC_IP ":50012");
  assert_string_equal(w.last.proto, "pcp");
  assert_string_equal(w.last.tried, "pcp");
  assert_int_equal(w.last.lease_s, 2);
  assert_int_equal(p2p_portmap_get_status(pm)->state, P2P_PORTMAP_MAPPED);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_TCP, false), 1);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_UDP, false), 1);
  assert_int_equal(g.reqs[0].lifetime, 3600);
  /* the client address it claims is the one the server sees */
  const uint8_t lo[4] = {127, 0, 0, 1};
  uint8_t lo16[16];
  p2p_pcp_ip_map4(lo, lo16);
  assert_memory_equal(g.reqs[0].client_ip, lo16, 16);
  assert_int_equal(logrec_count(&rec, "nat.mapped", "proto=pcp external=" PUBLIC_IP ":50011 udp=" PUBLIC_IP
                                                    ":50012 lifetime=2"),
                   1);

  assert_true(run_until(&loop, is_renewed, &w, 5000));
  double after = (double)(w.renewed_ns - w.mapped_ns) / 1e9;
  fprintf(stderr, "renewed %.3f s after mapping (lease 2 s)\n", after);
  assert_true(after >= 0.9 && after <= 1.6);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_TCP, false), 2);
  assert_memory_equal(g.reqs[0].nonce, g.reqs[2].nonce, P2P_PCP_NONCE_LEN); /* same mapping, refreshed */
  assert_int_equal(logrec_count(&rec, "nat.renewed", "proto=pcp"), 1);

  stop(&loop, pm, &w);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_TCP, true), 1);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_UDP, true), 1);
  assert_memory_equal(g.reqs[g.n - 1].nonce, g.reqs[0].nonce, P2P_PCP_NONCE_LEN);
  assert_int_equal(logrec_count(&rec, "nat.unmapped", "proto=pcp"), 1);
  fake_stop(&g);
  drain_loop(&loop);
}

static void test_refused(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_pcp g;
  fake_start(&g, &loop, FAKE_REFUSE, 60);
  watch w = {0};
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_PCP);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_PORTMAP_NONE);
  assert_string_equal(w.last.why, "not-authorized");
  assert_null(w.last.proto);
  assert_int_equal(logrec_count(&rec, "nat.no_mapping", "tried=pcp reason=not-authorized"), 1);
  stop(&loop, pm, &w);
  assert_int_equal(count(&g, 2, P2P_PCP_PROTO_TCP, true), 0);
  fake_stop(&g);
  drain_loop(&loop);
}

/* Truncated, foreign-nonce and bad-option replies are ignored; the good
 * reply behind them maps the port. */
static void test_garbled_replies_ignored(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_pcp g;
  fake_start(&g, &loop, FAKE_GARBLE, 600);
  watch w = {0};
  size_t bad = logrec_count(&rec, "nat.bad_reply", "proto=pcp");
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_PCP);
  assert_true(run_until(&loop, is_mapped, &w, 5000));
  char tcp[GW_ADDR_STRLEN];
  gw_addr_format(&w.last.external_tcp, tcp);
  assert_string_equal(tcp, PUBLIC_IP ":50011"); /* not the foreign reply's port 1 */
  assert_int_equal(w.last.lease_s, 600);
  assert_true(logrec_count(&rec, "nat.bad_reply", "proto=pcp") >= bad + 4); /* 2 malformed per request */
  stop(&loop, pm, &w);
  fake_stop(&g);
  drain_loop(&loop);
}

/* auto: the router speaks only NAT-PMP, answers PCP with "unsupported
 * version", and NAT-PMP maps the port. */
static void test_auto_falls_back_to_natpmp(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  fake_pcp g;
  fake_start(&g, &loop, FAKE_NATPMP_ONLY, 120);
  watch w = {0};
  uint64_t t0 = gw_clock_mono_ns();
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_AUTO);
  assert_true(run_until(&loop, is_mapped, &w, 5000));
  assert_true(gw_clock_mono_ns() - t0 < 1000000000ULL); /* no waiting for PCP to time out */
  assert_string_equal(w.last.proto, "natpmp");
  assert_string_equal(w.last.tried, "pcp,natpmp");
  char tcp[GW_ADDR_STRLEN];
  gw_addr_format(&w.last.external_tcp, tcp);
  assert_string_equal(tcp, PUBLIC_IP ":50011");
  assert_int_equal(logrec_count(&rec, "nat.proto_failed", "proto=pcp reason=unsupported-version absent=true"), 1);
  assert_int_equal(logrec_count(&rec, "nat.mapped", "proto=natpmp external=" PUBLIC_IP ":50011"), 1);
  stop(&loop, pm, &w);
  assert_int_equal(count(&g, 0, 2, true), 1); /* NAT-PMP deleted its TCP mapping */
  fake_stop(&g);
  drain_loop(&loop);
}

/* Nobody on 5351: ICMP port unreachable ends the PCP attempt at once. */
static void test_no_server(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  watch w = {0};
  uint64_t t0 = gw_clock_mono_ns();
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_PCP);
  assert_true(run_until(&loop, is_settled, &w, 5000));
  assert_int_equal(w.last.state, P2P_PORTMAP_NONE);
  assert_string_equal(w.last.why, "no-gateway");
  assert_true(gw_clock_mono_ns() - t0 < 1000000000ULL);
  assert_int_equal(logrec_count(&rec, "nat.proto_failed", "proto=pcp reason=no-gateway absent=true"), 1);
  stop(&loop, pm, &w);
  drain_loop(&loop);
}

/* Stopping while a request is in flight: no callback after stop, no leak. */
static void test_stop_while_asking(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  watch w = {0};
  p2p_portmap *pm = start(&loop, &w, P2P_PORTMAP_PCP);
  stop(&loop, pm, &w);
  assert_int_equal(w.calls, 0);
  drain_loop(&loop);
}

static void test_mode_names(void **state) {
  (void)state;
  p2p_portmap_mode m;
  const char *names[] = {"auto", "pcp", "natpmp", "upnp", "off"};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(p2p_portmap_mode_parse(names[i], &m), 0);
    assert_int_equal(m, i);
    assert_string_equal(p2p_portmap_mode_name(m), names[i]);
  }
  assert_int_equal(p2p_portmap_mode_parse("nat-pmp", &m), 0);
  assert_int_equal(m, P2P_PORTMAP_NATPMP);
  assert_int_equal(p2p_portmap_mode_parse("upnp-igd", &m), GW_EINVAL);
  assert_int_equal(p2p_portmap_mode_parse("", &m), GW_EINVAL);
  p2p_portmap_config cfg = {.mode = P2P_PORTMAP_OFF};
  p2p_portmap *pm = (p2p_portmap *)&cfg;
  assert_int_equal(p2p_portmap_start(NULL, &cfg, NULL, NULL, &pm), GW_EINVAL);
  assert_null(pm);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  logrec_init(&rec, GW_LOG_DEBUG);
  gw_log_init(&lg, &rec.sink, NULL);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encode_map),
      cmocka_unit_test(test_parse_reply),
      cmocka_unit_test(test_epoch),
      cmocka_unit_test(test_mode_names),
      cmocka_unit_test(test_map_renew_delete),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_garbled_replies_ignored),
      cmocka_unit_test(test_auto_falls_back_to_natpmp),
      cmocka_unit_test(test_no_server),
      cmocka_unit_test(test_stop_while_asking),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  logrec_free(&rec);
  return rc;
}
