/* Unit tests for the simulator: ordering, ticks, loss, crashes, replay. */
#include "testutil.h"

#include "sim/sim.h"
#include "util/err.h"

#define MAX_LOG 4096

typedef struct echo_node {
  sim *s;
  int index;
  gw_io io;
  int received, ticks;
  uint64_t last_at;
  char trace[MAX_LOG]; /* "<time>:<byte>;" per message, to compare replays */
  size_t trace_len;
  bool reply;
} echo_node;

static void echo_on_message(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  echo_node *n = ud;
  n->received++;
  n->last_at = now;
  if (n->trace_len < MAX_LOG - 32)
    n->trace_len += (size_t)snprintf(n->trace + n->trace_len, MAX_LOG - n->trace_len, "%llu:%u;",
                                     (unsigned long long)now, len ? buf[0] : 0);
  if (n->reply && from) n->io.send(n->io.ud, from, buf, len);
}

static void echo_on_tick(void *ud, uint64_t now) {
  echo_node *n = ud;
  n->ticks++;
  n->last_at = now;
}

static const sim_node_ops echo_ops = {echo_on_message, echo_on_tick};

static void make_peer(gw_peer *p, int i) {
  char name[32];
  memset(p, 0, sizeof(*p));
  snprintf(name, sizeof(name), "node-%d", i);
  gw_id_hash_str(name, &p->id);
  p->addr.family = 4;
  p->addr.ip[0] = 10;
  p->addr.ip[2] = (uint8_t)(i >> 8);
  p->addr.ip[3] = (uint8_t)i;
  p->addr.port = 4000;
}

static sim *make_sim(echo_node *nodes, int n, sim_config cfg) {
  sim *s = sim_new(&cfg);
  for (int i = 0; i < n; i++) {
    gw_peer p;
    make_peer(&p, i);
    memset(&nodes[i], 0, sizeof(nodes[i]));
    nodes[i].index = sim_add_node(s, &p, &echo_ops, &nodes[i]);
    assert_int_equal(nodes[i].index, i);
    nodes[i].io = sim_io(s, i);
    nodes[i].s = s;
  }
  return s;
}

static void test_delivery_and_delay(void **state) {
  (void)state;
  echo_node nodes[2];
  sim *s = make_sim(nodes, 2, (sim_config){.seed = 1, .delay_min_ms = 10, .delay_max_ms = 10});
  uint8_t msg[3] = {7, 8, 9};
  assert_int_equal(nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 1), msg, 3), 0);
  sim_run_until(s, 9);
  assert_int_equal(nodes[1].received, 0);
  sim_run_until(s, 10);
  assert_int_equal(nodes[1].received, 1);
  assert_int_equal(nodes[1].last_at, 10);
  /* addressing by address alone (a bootstrap contact whose ID is unknown) */
  gw_peer by_addr = *sim_peer(s, 0);
  memset(&by_addr.id, 0, sizeof(by_addr.id));
  nodes[1].io.send(nodes[1].io.ud, &by_addr, msg, 1);
  sim_run_until(s, 100);
  assert_int_equal(nodes[0].received, 1);
  assert_int_equal(sim_get_stats(s)->delivered, 2);
  sim_free(s);
}

static void test_ticks_earliest_wins(void **state) {
  (void)state;
  echo_node nodes[1];
  sim *s = make_sim(nodes, 1, (sim_config){.seed = 1});
  nodes[0].io.want_tick(nodes[0].io.ud, 50);
  nodes[0].io.want_tick(nodes[0].io.ud, 20);
  nodes[0].io.want_tick(nodes[0].io.ud, 80); /* later than the pending one: ignored */
  sim_run_until(s, 1000);
  assert_int_equal(nodes[0].ticks, 1);
  assert_int_equal(nodes[0].last_at, 20);
  sim_free(s);
}

static void test_crash_drops(void **state) {
  (void)state;
  echo_node nodes[2];
  sim *s = make_sim(nodes, 2, (sim_config){.seed = 1, .delay_min_ms = 5});
  uint8_t m = 1;
  nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 1), &m, 1);
  nodes[1].io.want_tick(nodes[1].io.ud, 3);
  sim_crash(s, 1);
  sim_run_until(s, 100);
  assert_int_equal(nodes[1].received, 0);
  assert_int_equal(nodes[1].ticks, 0);
  assert_int_equal(sim_get_stats(s)->dropped_dead, 1);
  assert_int_equal(nodes[1].io.send(nodes[1].io.ud, sim_peer(s, 0), &m, 1), GW_ECLOSED);
  assert_false(sim_alive(s, 1));
  sim_free(s);
}

static void run_chatter(uint64_t seed, echo_node *nodes, int n, double loss) {
  sim *s = make_sim(nodes, n, (sim_config){.seed = seed, .delay_min_ms = 1, .delay_max_ms = 40, .loss = loss});
  for (int i = 0; i < n; i++) nodes[i].reply = (i % 2) == 1;
  for (int k = 0; k < 200; k++) {
    uint8_t b = (uint8_t)k;
    int from = (int)gw_rng_below(sim_rng(s), (uint64_t)n);
    int to = (int)gw_rng_below(sim_rng(s), (uint64_t)n);
    nodes[from].io.send(nodes[from].io.ud, sim_peer(s, to), &b, 1);
  }
  sim_run_until(s, 10000);
  sim_free(s);
}

static void test_replay_is_exact(void **state) {
  (void)state;
  echo_node a[8], b[8], c[8];
  run_chatter(99, a, 8, 0.1);
  run_chatter(99, b, 8, 0.1);
  run_chatter(100, c, 8, 0.1);
  int differs = 0;
  for (int i = 0; i < 8; i++) {
    assert_string_equal(a[i].trace, b[i].trace);
    differs += strcmp(a[i].trace, c[i].trace) != 0;
  }
  assert_true(differs > 0);
}

static void test_loss_rate(void **state) {
  (void)state;
  echo_node nodes[2];
  sim *s = make_sim(nodes, 2, (sim_config){.seed = 3, .loss = 0.25});
  uint8_t m = 0;
  for (int i = 0; i < 4000; i++) nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 1), &m, 1);
  sim_run_until(s, 10);
  assert_true(nodes[1].received > 2800 && nodes[1].received < 3200);
  assert_int_equal(sim_get_stats(s)->dropped_loss + (uint64_t)nodes[1].received, 4000);
  sim_free(s);
}

static void test_size_limit_and_duplicates(void **state) {
  (void)state;
  echo_node nodes[1];
  sim *s = make_sim(nodes, 1, (sim_config){.seed = 3, .max_message = 8});
  uint8_t big[9] = {0};
  assert_int_equal(nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 0), big, 9), GW_ERANGE);
  gw_peer dup = *sim_peer(s, 0);
  assert_int_equal(sim_add_node(s, &dup, &echo_ops, NULL), GW_EEXIST);
  sim_free(s);
}

static void test_many_nodes_grow(void **state) {
  (void)state;
  /* io handles taken early must stay valid while the node table grows */
  enum { N = 300 };
  echo_node *nodes = calloc(N, sizeof(*nodes));
  sim *s = make_sim(nodes, N, (sim_config){.seed = 5});
  uint8_t m = 1;
  for (int i = 0; i < N; i++) nodes[i].io.send(nodes[i].io.ud, sim_peer(s, (i + 1) % N), &m, 1);
  sim_run_until(s, 10);
  for (int i = 0; i < N; i++) assert_int_equal(nodes[i].received, 1);
  sim_free(s);
  free(nodes);
}

/* Messages carry (sender, sequence); the receiver counts inversions. */
typedef struct order_node {
  gw_io io;
  int last[4];
  int inversions, received;
} order_node;

static void order_on_message(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  (void)from, (void)now;
  order_node *n = ud;
  if (len != 2) return;
  if (buf[1] < n->last[buf[0]]) n->inversions++;
  n->last[buf[0]] = buf[1];
  n->received++;
}

static int count_inversions(bool fifo) {
  static const sim_node_ops ops = {order_on_message, NULL};
  order_node nodes[3] = {0};
  sim *s = sim_new(&(sim_config){.seed = 11, .delay_min_ms = 1, .delay_max_ms = 50, .fifo = fifo});
  for (int i = 0; i < 3; i++) {
    gw_peer p;
    make_peer(&p, i);
    sim_add_node(s, &p, &ops, &nodes[i]);
    nodes[i].io = sim_io(s, i);
  }
  for (int k = 0; k < 200; k++)
    for (int from = 0; from < 3; from += 2) {
      uint8_t msg[2] = {(uint8_t)from, (uint8_t)k};
      nodes[from].io.send(nodes[from].io.ud, sim_peer(s, 1), msg, 2);
    }
  sim_run_until(s, 100000);
  assert_int_equal(nodes[1].received, 400);
  sim_free(s);
  return nodes[1].inversions;
}

static void test_fifo_keeps_pair_order(void **state) {
  (void)state;
  assert_int_equal(count_inversions(true), 0);
  assert_true(count_inversions(false) > 0); /* datagrams do overtake each other */
}

/* A crash noticed as over TCP: node 1 hears of node 0's death only after
 * the two messages node 0 sent it before dying, and at once when nothing
 * of node 0's is on its way. */
typedef struct down_seen {
  echo_node *nodes;
  int received_then;
  uint64_t at;
} down_seen;

static void note_down(void *ud, void *node, const gw_peer *peer, uint64_t now_ms) {
  (void)peer;
  down_seen *d = ud;
  d->received_then = ((echo_node *)node)->received;
  d->at = now_ms;
}

static void test_notice_after_in_flight(void **state) {
  (void)state;
  echo_node nodes[3];
  sim *s = make_sim(nodes, 3, (sim_config){.seed = 5, .delay_min_ms = 20, .delay_max_ms = 40, .fifo = true});
  down_seen d = {nodes, -1, 0};
  sim_set_peer_down_fn(s, note_down, &d);
  uint8_t m = 7;
  nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 1), &m, 1);
  nodes[0].io.send(nodes[0].io.ud, sim_peer(s, 1), &m, 1);
  sim_crash(s, 0);
  assert_int_equal(sim_notice_down_after_in_flight(s, 1, 0), 1);
  assert_int_equal(sim_notice_down_after_in_flight(s, 2, 0), 0); /* nothing on its way to node 2 */
  sim_run_until(s, 1000);
  assert_int_equal(nodes[1].received, 2);
  assert_int_equal(d.received_then, 2);
  assert_true(d.at >= 20);
  sim_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_delivery_and_delay), cmocka_unit_test(test_ticks_earliest_wins),
      cmocka_unit_test(test_crash_drops),        cmocka_unit_test(test_replay_is_exact),
      cmocka_unit_test(test_loss_rate),          cmocka_unit_test(test_size_limit_and_duplicates),
      cmocka_unit_test(test_many_nodes_grow),   cmocka_unit_test(test_fifo_keeps_pair_order),
      cmocka_unit_test(test_notice_after_in_flight),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
