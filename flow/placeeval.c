#include "flow/placeeval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/instance.h"
#include "flow/mcf.h"
#include "flow/place.h"
#include "sim/sim.h"
#include "util/err.h"
#include "util/rng.h"

/* Table IV (top): stages, capacities ⌊U(cap_lo, cap_hi)⌋, interlayer costs
 * ⌊U(cost_lo, cost_hi)⌋; intralayer φ + ⌊U(50, 100)⌋ in every row. */
typedef struct table4_row {
  int stages, cap_lo, cap_hi, cost_lo, cost_hi;
  bool random_spread;
} table4_row;

static const table4_row table4[5] = {
    {8, 1, 20, 1, 100, false},  {8, 1, 20, 20, 100, false}, {8, 1, 5, 1, 100, false},
    {12, 1, 20, 1, 100, false}, {8, 1, 20, 1, 100, true},
};

#define PE_RELAYS (96) /* "a total of 97 nodes are used (with 1 of them being a dataholder)" */
#define PE_INTRA_LO (50)
#define PE_INTRA_HI (100)
#define PE_DEMAND (1000000) /* the data node never limits the flow */
#define PE_MAX_ROUNDS (200)

enum { SALT_LINK = 1, SALT_CAP = 2, SALT_INTRA = 3, SALT_STAGE = 4, SALT_RANDOM = 5, SALT_SIM = 6 };

static const char *const method_names[PLACE_M_COUNT] = {"gwtf", "capacity_first", "random", "optimal"};

const char *place_method_name(place_method m) { return m < PLACE_M_COUNT ? method_names[m] : "?"; }

void place_eval_opts_default(place_eval_opts *o) {
  *o = (place_eval_opts){.setting = 1, .seed = 1, .candidates = 20, .batch = 2, .optimal = true};
}

/* ⌊U(lo, hi)⌋ drawn from a generator seeded by (seed, a, b, salt), so every
 * node pair has one fixed cost however the system grows. */
static int draw(uint64_t seed, int a, int b, int salt, int lo, int hi) {
  gw_rng r;
  gw_rng_seed(&r, seed ^ ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9e3779b97f4a7c15ULL ^
                      (uint64_t)salt * 0xd1b54a32d192ed03ULL);
  return (int)gw_rng_range(&r, lo, hi - 1);
}

typedef struct pe_node {
  int id, stage, capacity;
  double cost; /* intralayer */
} pe_node;

typedef struct pe_system {
  int stages;
  pe_node *nodes;
  int n, cap;
} pe_system;

typedef struct pe_ctx {
  const table4_row *row;
  uint64_t seed;
} pe_ctx;

static int link_cost(const pe_ctx *c, int from_id, int to_id) {
  return draw(c->seed, from_id, to_id, SALT_LINK, c->row->cost_lo, c->row->cost_hi);
}

static int sys_push(pe_system *s, pe_node n) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 128;
    pe_node *nn = realloc(s->nodes, (size_t)cap * sizeof(*nn));
    if (!nn) return GW_ENOMEM;
    s->nodes = nn;
    s->cap = cap;
  }
  s->nodes[s->n++] = n;
  return 0;
}

static int sys_copy(const pe_system *from, pe_system *to) {
  *to = (pe_system){.stages = from->stages};
  for (int i = 0; i < from->n; i++)
    if (sys_push(to, from->nodes[i]) != 0) return GW_ENOMEM;
  return 0;
}

static bool adjacent(int stages, int a, int b) { return b == (a + 1) % (stages + 1) || a == (b + 1) % (stages + 1); }

/* φ: the largest interlayer cost between a node (id, at stage) and the
 * nodes of its neighbouring stages. */
static double phi(const pe_ctx *c, const pe_system *s, int id, int stage) {
  int next = (stage + 1) % (s->stages + 1), prev = (stage + s->stages) % (s->stages + 1);
  double m = 0;
  for (int i = 0; i < s->n; i++) {
    const pe_node *o = &s->nodes[i];
    if (o->id == id) continue;
    if (o->stage == next && link_cost(c, id, o->id) > m) m = link_cost(c, id, o->id);
    if (o->stage == prev && link_cost(c, o->id, id) > m) m = link_cost(c, o->id, id);
  }
  return m;
}

static double intralayer(const pe_ctx *c, const pe_system *s, int id, int stage) {
  return phi(c, s, id, stage) + draw(c->seed, id, stage, SALT_INTRA, PE_INTRA_LO, PE_INTRA_HI);
}

static int build_system(const pe_ctx *c, pe_system *s) {
  const table4_row *row = c->row;
  *s = (pe_system){.stages = row->stages};
  if (sys_push(s, (pe_node){0, 0, PE_DEMAND, 0}) != 0) return GW_ENOMEM;
  for (int k = 0; k < PE_RELAYS; k++) {
    int stage = 1 + k % row->stages;
    /* 5*: the first relay of each stage keeps it non-empty, the rest land anywhere. */
    if (row->random_spread && k >= row->stages) stage = 1 + draw(c->seed, k, 0, SALT_STAGE, 0, row->stages);
    int id = 1 + k;
    if (sys_push(s, (pe_node){id, stage, draw(c->seed, id, 0, SALT_CAP, row->cap_lo, row->cap_hi), 0}) != 0)
      return GW_ENOMEM;
  }
  for (int i = 1; i < s->n; i++) s->nodes[i].cost = intralayer(c, s, s->nodes[i].id, s->nodes[i].stage);
  return 0;
}

static int to_instance(const pe_ctx *c, const pe_system *s, flow_instance *in) {
  memset(in, 0, sizeof(*in));
  in->stages = s->stages;
  in->n_nodes = s->n;
  in->nodes = calloc((size_t)s->n, sizeof(*in->nodes));
  size_t max_links = 0;
  for (int a = 0; a < s->n; a++)
    for (int b = 0; b < s->n; b++) max_links += s->nodes[b].stage == (s->nodes[a].stage + 1) % (s->stages + 1);
  in->links = calloc(max_links + 1, sizeof(*in->links));
  if (!in->nodes || !in->links) {
    flow_instance_free(in);
    return GW_ENOMEM;
  }
  for (int i = 0; i < s->n; i++)
    in->nodes[i] = (flow_inst_node){s->nodes[i].id, s->nodes[i].stage, s->nodes[i].capacity, s->nodes[i].cost};
  for (int a = 0; a < s->n; a++)
    for (int b = 0; b < s->n; b++)
      if (s->nodes[b].stage == (s->nodes[a].stage + 1) % (s->stages + 1))
        in->links[in->n_links++] = (flow_inst_link){a, b, link_cost(c, s->nodes[a].id, s->nodes[b].id)};
  return 0;
}

/* The system's cost (see the header) and its flows; flows_per_node (may be
 * NULL, s->n entries) gets how many flows cross each node. */
static int sys_cost(const pe_ctx *c, const pe_system *s, double *cost, int *flows, int *flows_per_node) {
  flow_instance in;
  int rc = to_instance(c, s, &in);
  if (rc != 0) return rc;
  flow_solution sol;
  rc = flow_optimal(&in, NULL, &sol);
  if (rc == 0) {
    double total = flow_solution_total(&sol);
    *flows = sol.n_flows;
    *cost = sol.n_flows ? total / ((double)sol.n_flows * sol.n_flows) : INFINITY;
    if (flows_per_node) {
      memset(flows_per_node, 0, (size_t)s->n * sizeof(int));
      for (int k = 0; k < sol.n_flows; k++)
        for (int i = 1; i + 1 < sol.path_len; i++) flows_per_node[flow_solution_path(&sol, k)[i]]++;
    }
  }
  flow_solution_free(&sol);
  flow_instance_free(&in);
  return rc;
}

typedef struct pe_cand {
  int id, capacity;
} pe_cand;

static int place_batch(const pe_ctx *c, pe_system *s, const pe_cand *cands, const int *stages, int n) {
  /* φ of each newcomer is taken against the system as it was before the batch. */
  double *costs = malloc((size_t)n * sizeof(double) + 1);
  if (!costs) return GW_ENOMEM;
  for (int k = 0; k < n; k++) costs[k] = intralayer(c, s, cands[k].id, stages[k]);
  int rc = 0;
  for (int k = 0; k < n && rc == 0; k++)
    rc = sys_push(s, (pe_node){cands[k].id, stages[k], cands[k].capacity, costs[k]});
  free(costs);
  return rc;
}

/* ---- the methods ---- */

static void capacity_first(const pe_system *s, const pe_cand *cands, int n, int *stages) {
  int count[64] = {0};
  for (int i = 0; i < s->n; i++) count[s->nodes[i].stage]++;
  int order[64];
  for (int k = 0; k < n; k++) order[k] = k;
  for (int a = 0; a < n; a++) /* highest capacity first; stable for ties */
    for (int b = a + 1; b < n; b++)
      if (cands[order[b]].capacity > cands[order[a]].capacity) {
        int t = order[a];
        order[a] = order[b];
        order[b] = t;
      }
  for (int k = 0; k < n; k++) {
    int best = 1;
    for (int st = 2; st <= s->stages; st++)
      if (count[st] < count[best]) best = st;
    stages[order[k]] = best;
    count[best]++;
  }
}

static void random_stages(const pe_ctx *c, const pe_system *s, const pe_cand *cands, int n, int *stages) {
  for (int k = 0; k < n; k++) stages[k] = 1 + draw(c->seed, cands[k].id, 0, SALT_RANDOM, 0, s->stages);
}

static int optimal_stages(const pe_ctx *c, const pe_system *s, const pe_cand *cands, int n, int *stages) {
  int try[64], S = s->stages;
  double best = INFINITY;
  for (int k = 0; k < n; k++) try[k] = 1, stages[k] = 1;
  for (;;) {
    pe_system t;
    int flows, rc = sys_copy(s, &t);
    double cost = INFINITY;
    if (rc == 0) rc = place_batch(c, &t, cands, try, n);
    if (rc == 0) rc = sys_cost(c, &t, &cost, &flows, NULL);
    free(t.nodes);
    if (rc != 0) return rc;
    if (cost < best) {
      best = cost;
      memcpy(stages, try, (size_t)n * sizeof(int));
    }
    int k = 0; /* next assignment, like an odometer */
    while (k < n && ++try[k] > S) try[k++] = 1;
    if (k == n) return 0;
  }
}

/* gwtf: the placement state machines of every node on the simulator. */
typedef struct pe_member {
  place *p;
  uint32_t capacity, flows;
} pe_member;

static void member_stats(void *ud, uint32_t *capacity, uint32_t *flows) {
  pe_member *m = ud;
  *capacity = m->capacity;
  *flows = m->flows;
}

static void sim_msg(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  place_on_message(((pe_member *)ud)->p, from, buf, len, now);
}

static void sim_tick(void *ud, uint64_t now) { place_on_tick(((pe_member *)ud)->p, now); }

static void pe_id(int id, gw_id *out) {
  char name[48];
  snprintf(name, sizeof(name), "gwtf-place-node-%d", id);
  gw_id_hash_str(name, out);
}

static int gwtf_members(const pe_system *s, const pe_cand *cands, int n, const int *flows, sim *engine, pe_member *m) {
  static const sim_node_ops ops = {sim_msg, sim_tick};
  int total = s->n + n;
  place_tunables tun;
  place_tunables_default(&tun);
  for (int i = 0; i < total; i++) {
    bool cand = i >= s->n;
    gw_peer peer;
    memset(&peer, 0, sizeof(peer));
    pe_id(cand ? cands[i - s->n].id : s->nodes[i].id, &peer.id);
    peer.addr.family = 4;
    peer.addr.ip[0] = 10;
    peer.addr.ip[2] = (uint8_t)(i >> 8);
    peer.addr.ip[3] = (uint8_t)i;
    peer.addr.port = 7100;
    int idx = sim_add_node(engine, &peer, &ops, &m[i]);
    if (idx < 0) return idx;
    m[i].capacity = cand ? 0 : (uint32_t)s->nodes[i].capacity;
    m[i].flows = cand ? 0 : (uint32_t)flows[i];
    place_config cfg = {.self = peer.id,
                        .stage = cand ? PLACE_CANDIDATE : s->nodes[i].stage,
                        .n_stages = s->stages,
                        .capacity = cand ? (uint32_t)cands[i - s->n].capacity : 0,
                        .tun = tun,
                        .io = sim_io(engine, idx),
                        .stats = member_stats,
                        .stats_ud = &m[i]};
    int rc = place_new(&cfg, &m[i].p);
    if (rc != 0) return rc;
  }
  /* Membership as the DHT stage directory would give it. */
  for (int i = 0; i < total; i++) {
    int si = i < s->n ? s->nodes[i].stage : PLACE_CANDIDATE;
    for (int j = 0; j < s->n; j++) {
      if (j == i) continue;
      int sj = s->nodes[j].stage;
      bool knows = sj == 0 || (si >= 0 && adjacent(s->stages, si, sj));
      gw_id jid;
      pe_id(s->nodes[j].id, &jid);
      if (knows && place_add_peer(m[i].p, &jid, sj) != 0) return GW_ENOMEM;
    }
  }
  for (int i = 0; i < total; i++) place_start(m[i].p, 0);
  return 0;
}

static int gwtf_stages(const pe_ctx *c, const pe_system *s, const pe_cand *cands, int n, int *stages,
                       uint64_t *messages) {
  int total = s->n + n, flows;
  double cost;
  int *per_node = malloc((size_t)s->n * sizeof(int));
  pe_member *m = calloc((size_t)total, sizeof(*m));
  sim_config sc = {.seed = c->seed ^ (uint64_t)SALT_SIM, .delay_min_ms = 1, .delay_max_ms = 20};
  sim *engine = sim_new(&sc);
  int rc = per_node && m && engine ? sys_cost(c, s, &cost, &flows, per_node) : GW_ENOMEM;
  if (rc == 0) rc = gwtf_members(s, cands, n, per_node, engine, m);
  place_tunables tun;
  place_tunables_default(&tun);
  for (int r = 1; rc == 0 && r <= PE_MAX_ROUNDS; r++) {
    sim_run_until(engine, (uint64_t)r * tun.tick_ms - 1);
    int done = 0;
    for (int k = 0; k < n; k++) done += place_assigned_stage(m[s->n + k].p) != PLACE_CANDIDATE;
    if (done == n) break;
  }
  for (int k = 0; rc == 0 && k < n; k++) {
    stages[k] = place_assigned_stage(m[s->n + k].p);
    if (stages[k] == PLACE_CANDIDATE) rc = GW_ETIMEDOUT;
  }
  if (engine) *messages += sim_get_stats(engine)->sent;
  for (int i = 0; m && i < total; i++) place_free(m[i].p);
  free(m);
  free(per_node);
  sim_free(engine);
  return rc;
}

static int choose(const pe_ctx *c, place_method method, const pe_system *s, const pe_cand *cands, int n, int *stages,
                  uint64_t *messages) {
  switch (method) {
  case PLACE_M_GWTF: return gwtf_stages(c, s, cands, n, stages, messages);
  case PLACE_M_CAPACITY_FIRST: capacity_first(s, cands, n, stages); return 0;
  case PLACE_M_RANDOM: random_stages(c, s, cands, n, stages); return 0;
  case PLACE_M_OPTIMAL: return optimal_stages(c, s, cands, n, stages);
  default: return GW_EINVAL;
  }
}

int place_eval_run(const place_eval_opts *o, place_eval_result *out) {
  memset(out, 0, sizeof(*out));
  if (o->setting < 1 || o->setting > 5 || o->candidates < 1 || o->candidates > 1000 || o->batch < 1 || o->batch > 8)
    return GW_EINVAL;
  pe_ctx c = {&table4[o->setting - 1], o->seed};
  pe_system base;
  int rc = build_system(&c, &base);
  pe_cand *cands = calloc((size_t)o->candidates, sizeof(*cands));
  if (!cands) rc = GW_ENOMEM;
  for (int k = 0; rc == 0 && k < o->candidates; k++) {
    int id = 1 + PE_RELAYS + k;
    cands[k] = (pe_cand){id, draw(o->seed, id, 0, SALT_CAP, c.row->cap_lo, c.row->cap_hi)};
  }
  out->stages = c.row->stages;
  out->relays = PE_RELAYS;
  double cost0 = 0;
  int flows0 = 0;
  if (rc == 0) rc = sys_cost(&c, &base, &cost0, &flows0, NULL);
  for (int meth = 0; rc == 0 && meth < PLACE_M_COUNT; meth++) {
    place_method_result *res = &out->m[meth];
    res->cost_before = cost0;
    res->flows_before = flows0;
    if (meth == PLACE_M_OPTIMAL && !o->optimal) continue;
    pe_system s;
    rc = sys_copy(&base, &s);
    for (int at = 0; rc == 0 && at < o->candidates; at += o->batch) {
      int n = o->candidates - at < o->batch ? o->candidates - at : o->batch, stages[64];
      rc = choose(&c, (place_method)meth, &s, cands + at, n, stages, &out->gwtf_messages);
      if (rc == 0) rc = place_batch(&c, &s, cands + at, stages, n);
      for (int k = 0; rc == 0 && k < n; k++) res->per_stage[stages[k] < 64 ? stages[k] : 0]++;
    }
    if (rc == 0) rc = sys_cost(&c, &s, &res->cost_after, &res->flows_after, NULL);
    res->improvement = (res->cost_before - res->cost_after) / res->cost_before;
    free(s.nodes);
  }
  free(base.nodes);
  free(cands);
  return rc;
}
