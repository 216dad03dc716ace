/* The authenticated UDP endpoint (codec and live sockets on loopback) and
 * the libuv DHT runtime (joining, contacts file, restart, publish/fetch). */
#include "testutil.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include "node/dht_runtime.h"
#include "p2p/sockaddr.h"
#include "p2p/udp.h"
#include "util/err.h"

static p2p_identity ident(uint8_t n) {
  uint8_t seed[32];
  memset(seed, n, sizeof(seed));
  p2p_identity id;
  p2p_identity_from_seed(seed, &id);
  return id;
}

/* ---- codec ---- */

static void test_codec(void **state) {
  (void)state;
  p2p_identity a = ident(1), b = ident(2), c = ident(3);
  uint8_t dg[P2P_UDP_MAX_DGRAM], payload[P2P_UDP_MAX_PAYLOAD + 1];
  memset(payload, 0x5a, sizeof(payload));
  size_t len;
  const uint8_t *pl;
  size_t plen;
  gw_id sender;
  assert_int_equal(p2p_udp_seal(&a, &b.id, payload, 100, dg, sizeof(dg), &len), 0);
  assert_int_equal(len, 100 + P2P_UDP_OVERHEAD);
  assert_int_equal(p2p_udp_unseal(dg, len, &b.id, &sender, &pl, &plen), 0);
  assert_true(gw_id_eq(&sender, &a.id));
  assert_int_equal(plen, 100);
  assert_memory_equal(pl, payload, 100);
  /* Bound to b: does not verify at c (no replay to another node). */
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EAUTH);
  /* Unbound (recipient known by address only): verifies anywhere. */
  assert_int_equal(p2p_udp_seal(&a, NULL, payload, 10, dg, sizeof(dg), &len), 0);
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), 0);
  /* Flipping the bound flag breaks the signature. */
  dg[1] ^= P2P_UDP_FLAG_BOUND;
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EAUTH);
  dg[1] ^= P2P_UDP_FLAG_BOUND;
  /* Any flipped byte after the header: refused. */
  for (size_t i = 2; i < len; i++) {
    dg[i] ^= 1;
    assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EAUTH);
    dg[i] ^= 1;
  }
  /* Framing. */
  assert_int_equal(p2p_udp_unseal(dg, P2P_UDP_OVERHEAD - 1, &c.id, &sender, &pl, &plen), GW_EPROTO);
  dg[0] = 'x';
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EPROTO);
  dg[0] = P2P_UDP_MAGIC;
  dg[1] = (uint8_t)((P2P_UDP_VERSION + 1) << 4);
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EPROTO);
  dg[1] = (uint8_t)((P2P_UDP_VERSION << 4) | 0x4);
  assert_int_equal(p2p_udp_unseal(dg, len, &c.id, &sender, &pl, &plen), GW_EPROTO);
  uint8_t big[P2P_UDP_MAX_DGRAM + 1] = {0};
  assert_int_equal(p2p_udp_parse(big, sizeof(big), &pl, &pl, &plen), GW_ERANGE);
  /* The largest payload fits exactly; one more byte does not. */
  assert_int_equal(p2p_udp_seal(&a, &b.id, payload, P2P_UDP_MAX_PAYLOAD, dg, sizeof(dg), &len), 0);
  assert_int_equal(len, P2P_UDP_MAX_DGRAM);
  assert_int_equal(p2p_udp_seal(&a, &b.id, payload, P2P_UDP_MAX_PAYLOAD + 1, dg, sizeof(dg), &len), GW_ERANGE);
}

/* ---- live endpoints ---- */

typedef struct inbox {
  int got;
  gw_peer from;
  uint8_t payload[P2P_UDP_MAX_PAYLOAD];
  size_t len, wire_len;
  int rejects;
} inbox;

static void on_recv(void *ud, const gw_peer *from, const uint8_t *payload, size_t len, size_t wire_len) {
  inbox *in = ud;
  in->got++;
  in->from = *from;
  memcpy(in->payload, payload, len);
  in->len = len;
  in->wire_len = wire_len;
}

static void on_reject(void *ud, const gw_addr *from, int reason, size_t wire_len) {
  inbox *in = ud;
  (void)from, (void)reason, (void)wire_len;
  in->rejects++;
}

typedef bool (*pred_fn)(void *ud);

static void on_deadline(uv_timer_t *t) { *(bool *)t->data = true; }

/* Runs the loop until pred holds; fails the test after timeout_ms. */
static void run_until(uv_loop_t *loop, pred_fn pred, void *ud, uint64_t timeout_ms) {
  bool expired = false;
  uv_timer_t t;
  uv_timer_init(loop, &t);
  t.data = &expired;
  uv_timer_start(&t, on_deadline, timeout_ms, 0);
  while (!pred(ud) && !expired) uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&t, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  assert_false(expired);
}

static void close_loop(uv_loop_t *loop) {
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(loop), 0);
}

typedef struct want_count {
  int *counter, target;
} want_count;

static bool count_reached(void *ud) {
  want_count *w = ud;
  return *w->counter >= w->target;
}

static gw_addr loopback0(void) {
  gw_addr a;
  assert_int_equal(gw_addr_parse("127.0.0.1:0", &a), 0);
  return a;
}

static void raw_send(int fd, const gw_addr *to, const void *buf, size_t len) {
  struct sockaddr_storage ss;
  assert_int_equal(p2p_addr_to_sockaddr(to, &ss), 0);
  assert_int_equal(sendto(fd, buf, len, 0, (struct sockaddr *)&ss, sizeof(struct sockaddr_in)), (ssize_t)len);
}

static void test_round_trip_and_hostile(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  p2p_identity a = ident(1), b = ident(2), c = ident(3);
  inbox ia = {0}, ib = {0};
  p2p_udp *ua, *ub;
  p2p_udp_config ca = {.bind = loopback0(), .me = &a, .on_recv = on_recv, .on_reject = on_reject, .ud = &ia};
  p2p_udp_config cb = {.bind = loopback0(), .me = &b, .on_recv = on_recv, .on_reject = on_reject, .ud = &ib};
  assert_int_equal(p2p_udp_open(&loop, &ca, &ua), 0);
  assert_int_equal(p2p_udp_open(&loop, &cb, &ub), 0);
  gw_addr addr_a, addr_b;
  p2p_udp_local_addr(ua, &addr_a);
  p2p_udp_local_addr(ub, &addr_b);
  assert_true(addr_b.port != 0);
  gw_peer to_b = {.id = b.id, .addr = addr_b};
  assert_int_equal(p2p_udp_send(ua, &to_b, (const uint8_t *)"hello", 5), 0);
  want_count w = {&ib.got, 1};
  run_until(&loop, count_reached, &w, 5000);
  assert_true(gw_id_eq(&ib.from.id, &a.id));
  assert_true(gw_addr_eq(&ib.from.addr, &addr_a));
  assert_int_equal(ib.len, 5);
  assert_memory_equal(ib.payload, "hello", 5);
  assert_int_equal(ib.wire_len, 5 + P2P_UDP_OVERHEAD);
  /* Too large to send at all. */
  uint8_t big[P2P_UDP_MAX_PAYLOAD + 1] = {0};
  assert_int_equal(p2p_udp_send(ua, &to_b, big, sizeof(big)), GW_ERANGE);

  /* Hostile datagrams from a plain socket: random bytes, oversize, forged
   * signature, one sealed for someone else. Each is counted and dropped. */
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  assert_true(fd >= 0);
  uint8_t junk[1500];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)(i * 131 + 7);
  raw_send(fd, &addr_b, junk, 200);
  raw_send(fd, &addr_b, junk, 1201);
  raw_send(fd, &addr_b, junk, 1500);
  uint8_t dg[P2P_UDP_MAX_DGRAM];
  size_t len;
  assert_int_equal(p2p_udp_seal(&c, &b.id, (const uint8_t *)"forged", 6, dg, sizeof(dg), &len), 0);
  dg[len - 1] ^= 0xff;
  raw_send(fd, &addr_b, dg, len);
  assert_int_equal(p2p_udp_seal(&c, &a.id, (const uint8_t *)"for a", 5, dg, sizeof(dg), &len), 0);
  raw_send(fd, &addr_b, dg, len);
  raw_send(fd, &addr_b, junk, 0);
  w = (want_count){&ib.rejects, 6};
  run_until(&loop, count_reached, &w, 5000);
  const p2p_udp_stats *st = p2p_udp_get_stats(ub);
  assert_int_equal(st->rejected_oversize, 2);
  assert_int_equal(st->rejected_auth, 2);
  assert_int_equal(st->rejected_malformed, 2);
  assert_int_equal(ib.got, 1);
  /* A good datagram from a raw socket is fine: only the signature counts. */
  assert_int_equal(p2p_udp_seal(&c, &b.id, (const uint8_t *)"ok", 2, dg, sizeof(dg), &len), 0);
  raw_send(fd, &addr_b, dg, len);
  close(fd);
  /* And the endpoint still serves good peers. */
  gw_peer to_a = {.id = a.id, .addr = addr_a};
  assert_int_equal(p2p_udp_send(ub, &to_a, (const uint8_t *)"back", 4), 0);
  w = (want_count){&ib.got, 2};
  run_until(&loop, count_reached, &w, 5000);
  assert_true(gw_id_eq(&ib.from.id, &c.id));
  w = (want_count){&ia.got, 1};
  run_until(&loop, count_reached, &w, 5000);
  assert_memory_equal(ia.payload, "back", 4);
  assert_int_equal(p2p_udp_get_stats(ub)->dgrams_in, 2);
  assert_int_equal(p2p_udp_get_stats(ua)->dgrams_out, 1);
  assert_int_equal(p2p_udp_get_stats(ua)->max_dgram_out, 5 + P2P_UDP_OVERHEAD);
  p2p_udp_close(ua);
  p2p_udp_close(ub);
  close_loop(&loop);
}

static void test_bind_conflict(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  p2p_identity a = ident(1);
  p2p_udp *u1, *u2;
  p2p_udp_config cfg = {.bind = loopback0(), .me = &a, .on_recv = on_recv};
  assert_int_equal(p2p_udp_open(&loop, &cfg, &u1), 0);
  p2p_udp_local_addr(u1, &cfg.bind);
  assert_int_equal(p2p_udp_open(&loop, &cfg, &u2), UV_EADDRINUSE);
  assert_null(u2);
  p2p_udp_close(u1);
  close_loop(&loop);
}

/* ---- the runtime ---- */

typedef struct node {
  p2p_identity me;
  dht_runtime *rt;
  bool joined;
} node;

static void node_joined(void *ud) { ((node *)ud)->joined = true; }
static bool is_joined(void *ud) { return ((node *)ud)->joined; }

static void node_start(uv_loop_t *loop, node *n, uint8_t seed, const char *dir, const gw_peer *boot, size_t nb) {
  memset(n, 0, sizeof(*n));
  n->me = ident(seed);
  dht_runtime_config cfg = {.bind = loopback0(), .data_dir = dir, .bootstrap = boot, .n_bootstrap = nb};
  cfg.dht.allow_loopback = true;
  cfg.dht.on_joined = node_joined;
  cfg.dht.ud = n;
  assert_int_equal(dht_runtime_start(loop, &n->me, &cfg, &n->rt), 0);
}

static gw_peer node_addr(node *n, bool with_id) {
  gw_peer p = {0};
  p2p_udp_local_addr(dht_runtime_udp(n->rt), &p.addr);
  if (with_id) p.id = n->me.id;
  return p;
}

typedef struct fetched {
  bool done;
  size_t n;
  char value[32];
} fetched;

static void on_fetched(void *ud, int status, const dht_record *recs, size_t n, const dht_lookup_stats *st) {
  fetched *f = ud;
  (void)status, (void)st;
  f->done = true;
  f->n = n;
  if (n) snprintf(f->value, sizeof(f->value), "%.*s", (int)recs[0].value_len, (const char *)recs[0].value);
}

static bool fetch_done(void *ud) { return ((fetched *)ud)->done; }

static void test_runtime_join_restart(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  char *dir = testutil_tmpdir();
  char bdir[600];
  snprintf(bdir, sizeof(bdir), "%s/b", dir);
  node a, b, c;
  node_start(&loop, &a, 1, NULL, NULL, 0);
  gw_peer boot = node_addr(&a, false); /* known by address only */
  node_start(&loop, &b, 2, bdir, &boot, 1);
  run_until(&loop, is_joined, &b, 10000);
  /* Joining wrote the contacts file: a, with its ID. */
  char path[700];
  snprintf(path, sizeof(path), "%s/%s", bdir, DHT_RT_CONTACTS_FILE);
  gw_peer saved[8];
  size_t n;
  assert_int_equal(dht_runtime_load_contacts(path, saved, 8, &n), 0);
  assert_int_equal(n, 1);
  assert_true(gw_id_eq(&saved[0].id, &a.me.id));
  assert_true(gw_addr_eq(&saved[0].addr, &boot.addr));
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  /* a publishes, b fetches across the real sockets. */
  gw_id key;
  gw_id_hash_str("run/rt", &key);
  assert_int_equal(dht_publish(dht_runtime_dht(a.rt), &key, (const uint8_t *)"v1", 2, NULL, NULL,
                               dht_runtime_now(a.rt)),
                   0);
  fetched f = {0};
  /* The store happens on a's loop turns; fetch until it is there. */
  for (int tries = 0; tries < 50 && f.n == 0; tries++) {
    f = (fetched){0};
    assert_int_equal(dht_fetch(dht_runtime_dht(b.rt), &key, on_fetched, &f, dht_runtime_now(b.rt)), 0);
    run_until(&loop, fetch_done, &f, 5000);
  }
  assert_int_equal(f.n, 1);
  assert_string_equal(f.value, "v1");
  /* b restarts (same data dir, a new process would do the same) with no
   * bootstrap peer at all: it joins through the saved contacts. */
  dht_runtime_stop(b.rt);
  uv_run(&loop, UV_RUN_NOWAIT);
  node_start(&loop, &c, 2, bdir, NULL, 0);
  run_until(&loop, is_joined, &c, 10000);
  /* Garbage lines in the contacts file are skipped, not fatal. */
  FILE *fp = fopen(path, "a");
  fputs("not a contact\nzz 1.2.3.4:5\n", fp);
  fclose(fp);
  assert_int_equal(dht_runtime_load_contacts(path, saved, 8, &n), 0);
  assert_int_equal(n, 1);
  dht_runtime_stop(c.rt);
  dht_runtime_stop(a.rt);
  close_loop(&loop);
  testutil_rmtree(dir);
  free(dir);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codec),
      cmocka_unit_test(test_round_trip_and_hostile),
      cmocka_unit_test(test_bind_conflict),
      cmocka_unit_test(test_runtime_join_restart),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
