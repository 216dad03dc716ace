/* Node placement (§V-B): the leader's ranking rule and the placement state
 * machines on the simulator (flood, leader election, assignment of the
 * bottleneck stage). test_flow_place_eval runs the Fig. 5 experiment. */
#include "flowtest.h"

#include "flow/place.h"
#include "sim/sim.h"

static void test_rank(void **state) {
  (void)state;
  place_stage_util u[4] = {{0}};
  u[1] = (place_stage_util){.flows = 2, .capacity = 4, .utilization = 0.5};
  u[2] = (place_stage_util){.flows = 9, .capacity = 10, .utilization = 0.9};
  u[3] = (place_stage_util){.flows = 7, .capacity = 10, .utilization = 0.7};
  uint32_t caps[4] = {3, 10, 5, 1};
  int stage[4];
  place_rank(u, 3, caps, 4, stage);
  /* largest to the most utilized, and so on, wrapping around */
  assert_int_equal(stage[1], 2);
  assert_int_equal(stage[2], 3);
  assert_int_equal(stage[0], 1);
  assert_int_equal(stage[3], 2);
  /* equal utilization: the stage with less capacity first, then the lower one */
  u[1] = (place_stage_util){.flows = 5, .capacity = 10, .utilization = 0.5};
  u[2] = (place_stage_util){.flows = 2, .capacity = 4, .utilization = 0.5};
  u[3] = (place_stage_util){.flows = 0, .capacity = 0, .utilization = INFINITY}; /* no capacity at all */
  place_rank(u, 3, caps, 3, stage);
  assert_int_equal(stage[1], 3);
  assert_int_equal(stage[2], 2);
  assert_int_equal(stage[0], 1);
}

/* ---- the state machines on the simulator ---- */

typedef struct pnode {
  place *p;
  gw_peer peer;
  int stage;
  uint32_t capacity, flows;
  int assigned_cb;
} pnode;

static void stats(void *ud, uint32_t *capacity, uint32_t *flows) {
  pnode *n = ud;
  *capacity = n->capacity;
  *flows = n->flows;
}

static void assigned(void *ud, int stage) { ((pnode *)ud)->assigned_cb = stage; }

static void pmsg(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  place_on_message(((pnode *)ud)->p, from, buf, len, now);
}

static void ptick(void *ud, uint64_t now) { place_on_tick(((pnode *)ud)->p, now); }

#define PN (10)

typedef struct world {
  sim *s;
  pnode n[PN];
  int count;
} world;

/* Two data nodes, relays in 3 stages: stage 1 two relays of 4 (2 flows
 * each), stage 2 one relay of 2 carrying 2 (the bottleneck), stage 3 two
 * relays of 3 (1 flow each); candidates of the given capacities. */
static void build(world *w, const uint32_t *cand, int n_cand) {
  static const sim_node_ops ops = {pmsg, ptick};
  static const struct {
    int stage;
    uint32_t cap, flows;
  } layout[] = {{0, 0, 0}, {0, 0, 0}, {1, 4, 2}, {1, 4, 2}, {2, 2, 2}, {3, 3, 1}, {3, 3, 1}};
  int fixed = (int)(sizeof(layout) / sizeof(layout[0]));
  memset(w, 0, sizeof(*w));
  w->s = sim_new(&(sim_config){.seed = 5, .delay_min_ms = 1, .delay_max_ms = 50});
  w->count = fixed + n_cand;
  for (int i = 0; i < w->count; i++) {
    pnode *n = &w->n[i];
    char name[32];
    snprintf(name, sizeof(name), "place-%d", i);
    gw_id_hash_str(name, &n->peer.id);
    n->peer.addr.family = 4;
    n->peer.addr.ip[3] = (uint8_t)(i + 1);
    n->peer.addr.port = 9000;
    n->stage = i < fixed ? layout[i].stage : PLACE_CANDIDATE;
    n->capacity = i < fixed ? layout[i].cap : cand[i - fixed];
    n->flows = i < fixed ? layout[i].flows : 0;
    n->assigned_cb = PLACE_CANDIDATE;
    int idx = sim_add_node(w->s, &n->peer, &ops, n);
    assert_int_equal(idx, i);
    place_config cfg = {.self = n->peer.id,
                        .stage = n->stage,
                        .n_stages = 3,
                        .capacity = n->capacity,
                        .io = sim_io(w->s, idx),
                        .stats = stats,
                        .stats_ud = n,
                        .on_assigned = assigned,
                        .assigned_ud = n};
    place_tunables_default(&cfg.tun);
    assert_int_equal(place_new(&cfg, &n->p), 0);
  }
  /* what the DHT stage directory tells each node */
  for (int i = 0; i < w->count; i++)
    for (int j = 0; j < fixed; j++) {
      if (i == j) continue;
      int si = w->n[i].stage, sj = w->n[j].stage;
      bool knows = sj == 0 || (si >= 0 && (sj == (si + 1) % 4 || si == (sj + 1) % 4));
      if (knows) assert_int_equal(place_add_peer(w->n[i].p, &w->n[j].peer.id, sj), 0);
    }
  for (int i = 0; i < w->count; i++) place_start(w->n[i].p, 0);
}

static void teardown(world *w) {
  for (int i = 0; i < w->count; i++) place_free(w->n[i].p);
  sim_free(w->s);
}

static int leader_index(world *w) {
  int leader = -1, leaders = 0;
  for (int i = 0; i < 2; i++)
    if (place_is_leader(w->n[i].p)) leader = i, leaders++;
  assert_int_equal(leaders, 1);
  return leader;
}

static void test_flood_and_bottleneck(void **state) {
  (void)state;
  world w;
  uint32_t cand[2] = {2, 5};
  build(&w, cand, 2);
  int leader = leader_index(&w);
  /* the leader is the data node with the lowest id, and everyone agrees */
  int other = 1 - leader;
  assert_true(gw_id_cmp(&w.n[leader].peer.id, &w.n[other].peer.id) < 0);
  for (int i = 2; i < w.count; i++) assert_true(gw_id_eq(place_leader(w.n[i].p), &w.n[leader].peer.id));
  sim_run_until(w.s, 40 * 2000);
  place_stage_util u[4];
  assert_true(place_utilization(w.n[leader].p, u));
  place_stage_util none[4];
  assert_false(place_utilization(w.n[other].p, none)); /* only the leader ranks */
  /* the flood reached every relay exactly once */
  assert_int_equal(u[1].nodes, 2);
  assert_int_equal(u[2].nodes, 1);
  assert_int_equal(u[3].nodes, 2);
  assert_true(u[1].capacity == 8 && u[1].flows == 4);
  assert_true(u[2].capacity == 2 && u[2].flows == 2);
  assert_true(u[3].capacity == 6 && u[3].flows == 2);
  /* the larger candidate widens the bottleneck (stage 2), the smaller the next */
  int big = w.count - 1, small = w.count - 2;
  assert_int_equal(place_assigned_stage(w.n[big].p), 2);
  assert_int_equal(w.n[big].assigned_cb, 2);
  assert_int_equal(place_assigned_stage(w.n[small].p), 1);
  teardown(&w);
}

static void test_leader_change(void **state) {
  (void)state;
  world w;
  uint32_t cand[1] = {7};
  build(&w, cand, 1);
  int leader = leader_index(&w), other = 1 - leader;
  /* The leader goes: everybody's directory drops it, the other data node leads. */
  for (int i = 0; i < w.count; i++)
    if (i != leader) assert_int_equal(place_remove_peer(w.n[i].p, &w.n[leader].peer.id), 0);
  sim_crash(w.s, leader);
  assert_true(place_is_leader(w.n[other].p));
  int cand_i = w.count - 1;
  assert_true(gw_id_eq(place_leader(w.n[cand_i].p), &w.n[other].peer.id));
  sim_run_until(w.s, 40 * 2000);
  assert_int_equal(place_assigned_stage(w.n[cand_i].p), 2);
  teardown(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rank),
      cmocka_unit_test(test_flood_and_bottleneck),
      cmocka_unit_test(test_leader_change),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
