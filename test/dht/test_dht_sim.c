/* 500 DHT nodes on the deterministic simulator (seeded, virtual time, 5-30 ms
 * delays, 1 % loss): every lookup converges on the closest node; after 20 %
 * of the nodes die at once, every stage record is still found and lookups
 * still converge on the closest live node. */
#include "dht_testnet.h"


#define NODES (500)
#define LOOKUPS (200)
#define STAGES (4)
#define PER_STAGE (10)
#define SEED (500500)

static size_t closest_other(const testnet *t, const gw_id *target, size_t asker) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < t->n; i++) {
    if (i == asker || !sim_alive(t->s, (int)i)) continue;
    if (best == SIZE_MAX || dht_dist_cmp(target, &t->ids[i]->id, &t->ids[best]->id) < 0) best = i;
  }
  return best;
}

/* Runs `count` lookups from random live nodes; returns how many found the
 * closest live node other than the asker. */
static size_t run_lookups(testnet *t, size_t count, unsigned *max_hops, unsigned *max_rpcs) {
  gw_rng *rng = sim_rng(t->s);
  size_t ok = 0;
  for (size_t q = 0; q < count; q++) {
    gw_id target;
    gw_rng_bytes(rng, target.b, sizeof(target.b));
    size_t from;
    do from = (size_t)gw_rng_below(rng, t->n);
    while (!sim_alive(t->s, (int)from));
    tn_nodes_result r = {0};
    assert_int_equal(dht_find_node(t->nodes[from], &target, tn_on_nodes, &r, sim_now(t->s)), 0);
    assert_true(sim_run_while_not(t->s, tn_flag, &r.done, sim_now(t->s) + 30000));
    size_t truth = closest_other(t, &target, from);
    if (r.status == 0 && r.n > 0 && gw_id_eq(&r.closest[0].id, &t->ids[truth]->id)) ok++;
    else {
      size_t holders = 0;
      for (size_t i = 0; i < t->n; i++) { gw_peer pp[600]; size_t k = dht_contacts(t->nodes[i], pp, 256); for (size_t j = 0; j < k; j++) holders += gw_id_eq(&pp[j].id, &t->ids[truth]->id); }
      dht_stats st; dht_get_stats(t->nodes[truth], &st);
      dht_stats sa; dht_get_stats(t->nodes[from], &sa);
      int found_rank = -1; for (size_t j = 0; j < r.n; j++) if (gw_id_eq(&r.closest[j].id, &t->ids[truth]->id)) found_rank = (int)j;
      fprintf(stderr, "miss: asker=%zu(contacts %zu) truth=%zu holders=%zu truth_contacts=%zu rank=%d n=%zu rpcs=%u timeouts=%u hops=%u cpl(truth,target)=%u cpl(got,target)=%u\n", from, sa.contacts, truth, holders, st.contacts, found_rank, r.n, r.st.rpcs, r.st.timeouts, r.st.hops, dht_cpl(&t->ids[truth]->id, &target), r.n ? dht_cpl(&r.closest[0].id, &target) : 0);
    }
    if (r.st.hops > *max_hops) *max_hops = r.st.hops;
    if (r.st.rpcs > *max_rpcs) *max_rpcs = r.st.rpcs;
  }
  return ok;
}

static void test_500_nodes(void **state) {
  (void)state;
  testnet t;
  sim_config sc = {.delay_min_ms = 5, .delay_max_ms = 30, .loss = 0.01};
  tn_init(&t, NODES, SEED, &sc, NULL);
  tn_join_all(&t, 10, 120000);
  /* Let the post-join bucket refreshes finish. */
  sim_run_until(t.s, sim_now(t.s) + 20000);
  for (size_t i = 0; i < t.n; i++) { dht_stats st; dht_get_stats(t.nodes[i], &st); if (st.contacts < 25) fprintf(stderr, "poor node %zu: contacts=%zu buckets=%zu sent=%llu replies=%llu timeouts=%llu req_in=%llu\n", i, st.contacts, st.buckets, (unsigned long long)st.rpcs_sent, (unsigned long long)st.replies_in, (unsigned long long)st.rpc_timeouts, (unsigned long long)st.requests_in); }

  unsigned max_hops = 0, max_rpcs = 0;
  size_t ok = run_lookups(&t, LOOKUPS, &max_hops, &max_rpcs);
  print_message("lookups: %zu/%d converged, max hops %u, max rpcs %u\n", ok, LOOKUPS, max_hops, max_rpcs);
  assert_int_equal(ok, LOOKUPS);

  /* Four stages of ten members each. */
  uint64_t now = sim_now(t.s);
  for (uint32_t i = 0; i < STAGES * PER_STAGE; i++) {
    stage_member me = {.capacity = 2, .load = 0};
    me.addr = tn_addr(i);
    assert_int_equal(stage_dir_announce(t.nodes[i], "sim", i % STAGES, &me, now), 0);
  }
  sim_run_until(t.s, now + 10000);

  /* 20 % die at once, announcers included; nobody repairs anything. */
  gw_rng *rng = sim_rng(t.s);
  size_t killed = 0;
  while (killed < NODES / 5) {
    size_t v = (size_t)gw_rng_below(rng, NODES);
    if (!sim_alive(t.s, (int)v)) continue;
    tn_crash(&t, v);
    killed++;
  }
  /* Every stage record is still found, from anywhere. */
  for (uint32_t s = 0; s < STAGES; s++)
    for (int probe = 0; probe < 5; probe++) {
      size_t from;
      do from = (size_t)gw_rng_below(rng, NODES);
      while (!sim_alive(t.s, (int)from));
      tn_members_result r = {0};
      assert_int_equal(stage_dir_discover(t.nodes[from], "sim", s, tn_on_members, &r, sim_now(t.s)), 0);
      assert_true(sim_run_while_not(t.s, tn_flag, &r.done, sim_now(t.s) + 30000));
      assert_int_equal(r.status, 0);
      assert_int_equal(r.n, PER_STAGE);
      for (uint32_t i = s; i < STAGES * PER_STAGE; i += STAGES) assert_true(tn_has_member(&r, &t.ids[i]->id));
    }
  /* Lookups still find the closest live node. */
  max_hops = max_rpcs = 0;
  ok = run_lookups(&t, LOOKUPS / 2, &max_hops, &max_rpcs);
  print_message("after 20%% killed: %zu/%d converged, max hops %u, max rpcs %u\n", ok, LOOKUPS / 2, max_hops,
                max_rpcs);
  assert_true(ok >= (LOOKUPS / 2) * 99 / 100);
  assert_int_equal(sim_get_stats(t.s)->refused_size, 0);
  tn_free(&t);
}

int main(void) {
  if (p2p_crypto_init() != 0) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_500_nodes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
