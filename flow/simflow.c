#include "flow/simflow.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flow/mcf.h"
#include "util/err.h"

typedef struct sim_member {
  struct flow_simulation *s;
  int node;
  flow *f;
  gw_log log;
  int sim_index;
  bool active;  /* joined (and not crashed) */
  bool pending; /* joins in a later round; nobody knows it yet */
  bool crashed;
  uint64_t crashed_at;
} sim_member;

typedef struct id_slot {
  gw_id id;
  int node;
} id_slot;

struct flow_simulation {
  const flow_instance *in;
  flow_sim_opts opts;
  sim *engine;
  sim_member *m;
  id_slot *by_id; /* sorted by id */
  flow_adjacency adj;
  int round;
  flow_sim_hook hook;
  void *hook_ud;
  /* flow.peer_dead naming a crashed node by a node that shared segments
   * with it when it crashed (detections), or naming a live one */
  int detections, false_alarms;
  uint64_t detect_sum_ms, detect_max_ms;
  int *watch; /* pairs (detector, crashed) still to detect, flattened */
  int n_watch, cap_watch;
};

void flow_sim_opts_default(flow_sim_opts *o) {
  memset(o, 0, sizeof(*o));
  flow_tunables_default(&o->tun);
  o->seed = 1;
}

static void node_id(const flow_instance *in, int node, gw_id *out) {
  char name[64];
  snprintf(name, sizeof(name), "gwtf-sim-node-%d", in->nodes[node].id);
  gw_id_hash_str(name, out);
}

static int cmp_slot(const void *a, const void *b) {
  return gw_id_cmp(&((const id_slot *)a)->id, &((const id_slot *)b)->id);
}

static int node_of(const flow_simulation *s, const gw_id *id) {
  int lo = 0, hi = s->in->n_nodes - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = gw_id_cmp(&s->by_id[mid].id, id);
    if (c == 0) return s->by_id[mid].node;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

/* ---- sim node callbacks ---- */

static void on_message(void *ud, const gw_peer *from, const uint8_t *buf, size_t len, uint64_t now) {
  sim_member *m = ud;
  if (m->active) flow_on_message(m->f, from, buf, len, now);
}

static void on_tick(void *ud, uint64_t now) {
  sim_member *m = ud;
  if (m->active) flow_on_tick(m->f, now);
}

/* The transport's notice (opts.crash_notice): a session to `peer` broke. */
static void on_peer_down(void *ud, void *node, const gw_peer *peer, uint64_t now) {
  (void)ud;
  sim_member *m = node;
  if (m->active) flow_peer_failed(m->f, &peer->id, now);
}

static const sim_node_ops member_ops = {on_message, on_tick};

/* Counts detections and false alarms, then passes the event on. */
static void member_event(void *ud, const flow_event *ev) {
  sim_member *m = ud;
  flow_simulation *s = m->s;
  if (ev->kind == FLOW_EV_PEER_DEAD) {
    int who = node_of(s, &ev->peer);
    if (who >= 0 && s->m[who].crashed) {
      for (int k = 0; k < s->n_watch; k++) {
        if (s->watch[2 * k] != m->node || s->watch[2 * k + 1] != who) continue;
        uint64_t after = sim_now(s->engine) - s->m[who].crashed_at;
        s->detections++;
        s->detect_sum_ms += after;
        if (after > s->detect_max_ms) s->detect_max_ms = after;
        s->watch[2 * k] = s->watch[2 * (s->n_watch - 1)];
        s->watch[2 * k + 1] = s->watch[2 * (s->n_watch - 1) + 1];
        s->n_watch--;
        break;
      }
    } else if (who >= 0) {
      s->false_alarms++;
    }
  }
  if (s->opts.on_event) s->opts.on_event(s->opts.event_ud, m->node, ev);
}

/* ---- setup ---- */

/* The cost a flow pays for the hop u -> v: the link plus v's processing
 * (for v a relay) or u's (for u a data node, paid once as the flow leaves). */
static double hop_cost(const flow_instance *in, const flow_inst_link *l) {
  double c = l->cost;
  if (in->nodes[l->to].stage != 0) c += in->nodes[l->to].cost;
  if (in->nodes[l->from].stage == 0) c += in->nodes[l->from].cost;
  return c;
}

/* a learns b: as the far end of link l (when l is not NULL) or as a
 * same-stage peer. */
static int introduce(flow_simulation *s, int a, int b, const flow_inst_link *l) {
  gw_id bid;
  node_id(s->in, b, &bid);
  int rc = flow_add_peer(s->m[a].f, &bid, s->in->nodes[b].stage);
  if (rc == 0 && l)
    rc = flow_set_cost(s->m[a].f, &bid, l->from == a ? FLOW_DIR_NEXT : FLOW_DIR_PREV, hop_cost(s->in, l));
  return rc;
}

/* Node i meets every node it has a link with and every node of its stage,
 * among those that take part (joined or about to). */
static int meet(flow_simulation *s, int i) {
  const flow_instance *in = s->in;
  int rc = 0;
  for (int k = 0; k < in->n_links && rc == 0; k++) {
    const flow_inst_link *l = &in->links[k];
    if (l->from != i && l->to != i) continue;
    int other = l->from == i ? l->to : l->from;
    if (s->m[other].pending) continue;
    rc = introduce(s, i, other, l);
    if (rc == 0) rc = introduce(s, other, i, l);
  }
  for (int j = 0; j < in->n_nodes && rc == 0; j++) {
    if (j == i || s->m[j].pending || in->nodes[j].stage != in->nodes[i].stage) continue;
    rc = introduce(s, i, j, NULL);
    if (rc == 0) rc = introduce(s, j, i, NULL);
  }
  return rc;
}

static bool joins_later(const flow_sim_opts *o, int node) {
  for (int k = 0; k < o->n_joins; k++)
    if (o->joins[k].node == node && o->joins[k].round > 0) return true;
  return false;
}

/* Everyone present at the start knows everyone else present. */
static int meet_all(flow_simulation *s) {
  const flow_instance *in = s->in;
  int rc = 0;
  for (int k = 0; k < in->n_links && rc == 0; k++) {
    const flow_inst_link *l = &in->links[k];
    if (s->m[l->from].pending || s->m[l->to].pending) continue;
    rc = introduce(s, l->from, l->to, l);
    if (rc == 0) rc = introduce(s, l->to, l->from, l);
  }
  for (int i = 0; i < in->n_nodes && rc == 0; i++)
    for (int j = 0; j < in->n_nodes && rc == 0; j++)
      if (i != j && !s->m[i].pending && !s->m[j].pending && in->nodes[i].stage == in->nodes[j].stage)
        rc = introduce(s, i, j, NULL);
  return rc;
}

static int make_member(flow_simulation *s, int i) {
  const flow_instance *in = s->in;
  sim_member *m = &s->m[i];
  gw_peer peer;
  memset(&peer, 0, sizeof(peer));
  node_id(in, i, &peer.id);
  peer.addr.family = 4;
  peer.addr.ip[0] = 10;
  peer.addr.ip[1] = (uint8_t)(i >> 16);
  peer.addr.ip[2] = (uint8_t)(i >> 8);
  peer.addr.ip[3] = (uint8_t)i;
  peer.addr.port = 7000;
  m->sim_index = sim_add_node(s->engine, &peer, &member_ops, m);
  if (m->sim_index < 0) return m->sim_index;
  gw_log_init(&m->log, s->opts.log, &peer.id);
  gw_log_set_stage(&m->log, in->nodes[i].stage);
  flow_config cfg;
  flow_config_default(&cfg);
  cfg.self = peer.id;
  cfg.role = in->nodes[i].stage == 0 ? FLOW_DATA : FLOW_RELAY;
  cfg.stage = in->nodes[i].stage;
  cfg.n_stages = in->stages;
  cfg.capacity = in->nodes[i].capacity > FLOW_MAX_CAPACITY ? FLOW_MAX_CAPACITY : in->nodes[i].capacity;
  cfg.tun = s->opts.tun;
  cfg.io = sim_io(s->engine, m->sim_index);
  cfg.log = &m->log;
  m->s = s;
  m->node = i;
  cfg.on_event = member_event;
  cfg.event_ud = m;
  m->pending = joins_later(&s->opts, i);
  return flow_new(&cfg, &m->f);
}

static int activate(flow_simulation *s, int i) {
  sim_member *m = &s->m[i];
  if (m->active || m->crashed) return 0;
  int rc = 0;
  if (m->pending) { /* a join: the directory now lists it, both ways */
    m->pending = false;
    rc = meet(s, i);
  }
  m->active = true;
  flow_start(m->f, sim_now(s->engine));
  return rc;
}

int flow_sim_new(const flow_instance *in, const flow_sim_opts *o, flow_simulation **out) {
  *out = NULL;
  if (o->delay_ms >= o->tun.tick_ms) return GW_EINVAL;
  flow_simulation *s = calloc(1, sizeof(*s));
  if (!s) return GW_ENOMEM;
  s->in = in;
  s->opts = *o;
  sim_config cfg = {
      .seed = o->seed,
      .delay_min_ms = 1,
      .delay_max_ms = 1 + (o->delay_ms ? o->delay_ms - 1 : 0),
      .loss = o->loss,
      .session_notice = o->crash_notice};
  s->engine = sim_new(&cfg);
  if (s->engine) sim_set_peer_down_fn(s->engine, on_peer_down, s);
  s->m = calloc((size_t)in->n_nodes, sizeof(*s->m));
  s->by_id = malloc((size_t)in->n_nodes * sizeof(*s->by_id));
  int rc = s->engine && s->m && s->by_id ? flow_adjacency_build(in, &s->adj) : GW_ENOMEM;
  for (int i = 0; i < in->n_nodes && rc == 0; i++) {
    node_id(in, i, &s->by_id[i].id);
    s->by_id[i].node = i;
  }
  if (rc == 0) qsort(s->by_id, (size_t)in->n_nodes, sizeof(*s->by_id), cmp_slot);
  for (int i = 0; i < in->n_nodes && rc == 0; i++) rc = make_member(s, i);
  if (rc == 0) rc = meet_all(s);
  for (int i = 0; i < in->n_nodes && rc == 0; i++)
    if (!joins_later(o, i)) rc = activate(s, i);
  if (rc != 0) {
    flow_sim_free(s);
    return rc;
  }
  *out = s;
  return 0;
}

void flow_sim_free(flow_simulation *s) {
  if (!s) return;
  for (int i = 0; s->m && i < s->in->n_nodes; i++) flow_free(s->m[i].f);
  free(s->m);
  free(s->by_id);
  free(s->watch);
  flow_adjacency_free(&s->adj);
  sim_free(s->engine);
  free(s);
}

/* ---- running ---- */

void flow_sim_set_hook(flow_simulation *s, flow_sim_hook hook, void *ud) {
  s->hook = hook;
  s->hook_ud = ud;
}

/* The live nodes that share segments with `node` are the ones whose
 * detection of its crash counts (others find out only if they come to need
 * it, which may be much later or never). */
static void watch_crash(flow_simulation *s, int node) {
  const gw_id *dead = flow_sim_id(s, node);
  for (int i = 0; i < s->in->n_nodes; i++) {
    if (i == node || !s->m[i].active) continue;
    size_t n = flow_units(s->m[i].f, NULL, 0);
    flow_unit_view *v = malloc((n + 1) * sizeof(*v));
    if (!v) return;
    flow_units(s->m[i].f, v, n);
    bool shares = false;
    for (size_t k = 0; k < n && !shares; k++)
      shares = (v[k].has_in && gw_id_eq(&v[k].prev, dead)) || (v[k].has_out && gw_id_eq(&v[k].next, dead));
    free(v);
    if (!shares) continue;
    if (s->n_watch == s->cap_watch) {
      int cap = s->cap_watch ? 2 * s->cap_watch : 64;
      int *w = realloc(s->watch, (size_t)cap * 2 * sizeof(int));
      if (!w) return;
      s->watch = w;
      s->cap_watch = cap;
    }
    s->watch[2 * s->n_watch] = i;
    s->watch[2 * s->n_watch + 1] = node;
    s->n_watch++;
  }
}

void flow_sim_crash(flow_simulation *s, int node) {
  sim_member *m = &s->m[node];
  if (m->crashed) return;
  watch_crash(s, node);
  m->crashed = true;
  m->crashed_at = sim_now(s->engine);
  m->active = false;
  sim_crash(s->engine, m->sim_index);
}

void flow_sim_join(flow_simulation *s, int node) { activate(s, node); }

bool flow_sim_alive(const flow_simulation *s, int node) { return s->m[node].active; }

static void apply_schedule(flow_simulation *s) {
  for (int k = 0; k < s->opts.n_crashes; k++)
    if (s->opts.crashes[k].round == s->round) flow_sim_crash(s, s->opts.crashes[k].node);
  for (int k = 0; k < s->opts.n_joins; k++)
    if (s->opts.joins[k].round == s->round) flow_sim_join(s, s->opts.joins[k].node);
}

static bool hook_pred(void *ud) {
  flow_simulation *s = ud;
  return s->hook(s->hook_ud);
}

int flow_sim_round(flow_simulation *s) {
  apply_schedule(s);
  uint64_t end = (uint64_t)(s->round + 1) * s->opts.tun.tick_ms - 1;
  int rc = 0;
  if (s->hook)
    rc = sim_run_while_not(s->engine, hook_pred, s, end) ? 1 : 0;
  else
    sim_run_until(s->engine, end);
  if (rc == 0) {
    /* Land exactly on the next round's start, where every node ticks. */
    sim_run_until(s->engine, end);
    s->round++;
  }
  return rc;
}

int flow_sim_rounds_done(const flow_simulation *s) { return s->round; }
flow *flow_sim_node(const flow_simulation *s, int node) { return s->m[node].f; }
const gw_id *flow_sim_id(const flow_simulation *s, int node) { return flow_self(s->m[node].f); }
uint64_t flow_sim_messages(const flow_simulation *s) { return sim_get_stats(s->engine)->sent; }
sim *flow_sim_engine(flow_simulation *s) { return s->engine; }
int flow_sim_false_alarms(const flow_simulation *s) { return s->false_alarms; }

uint64_t flow_sim_in_flight(const flow_simulation *s) {
  const sim_stats *st = sim_get_stats(s->engine);
  return st->sent - st->delivered - st->dropped_loss - st->dropped_dead - st->dropped_unknown;
}

/* ---- reading the state ---- */

/* Follows one flow of data node d from its source slot; true when it comes
 * back to d through a segment d knows. */
static bool walk(const flow_simulation *s, int d, const flow_unit_view *src, int *path) {
  int len = s->in->stages + 2;
  path[0] = d;
  gw_id prev = *flow_self(s->m[d].f), next = src->next;
  uint64_t seg = src->out_seg;
  for (int hop = 1; hop < len; hop++) {
    int node = node_of(s, &next);
    if (node < 0 || !s->m[node].active || s->in->nodes[node].stage != hop % (s->in->stages + 1)) return false;
    path[hop] = node;
    gw_id nn;
    uint64_t nseg;
    int rc = flow_next_hop(s->m[node].f, &prev, seg, &nn, &nseg);
    if (hop == len - 1) return node == d && rc == GW_EAGAIN; /* the sink slot holds it */
    if (rc != 0) return false;
    prev = next;
    next = nn;
    seg = nseg;
  }
  return false;
}

int flow_sim_flows(const flow_simulation *s, flow_solution *out, double **reported) {
  const flow_instance *in = s->in;
  flow_solution_init(out, in->stages);
  if (reported) *reported = NULL;
  int *path = malloc(((size_t)in->stages + 2) * sizeof(int));
  double *rep = NULL;
  int n_rep = 0, cap_rep = 0, rc = path ? 0 : GW_ENOMEM;
  for (int d = 0; d < in->n_nodes && rc == 0; d++) {
    if (in->nodes[d].stage != 0 || !s->m[d].active) continue;
    size_t n = flow_units(s->m[d].f, NULL, 0);
    flow_unit_view *v = malloc((n + 1) * sizeof(*v));
    if (!v) {
      rc = GW_ENOMEM;
      break;
    }
    flow_units(s->m[d].f, v, n);
    for (size_t k = 0; k < n && rc == 0; k++) {
      if (!v[k].is_source || !v[k].has_out || !walk(s, d, &v[k], path)) continue;
      rc = flow_solution_add(out, path, flow_path_cost(in, &s->adj, path));
      if (rc == 0 && reported) {
        if (n_rep == cap_rep) {
          cap_rep = cap_rep ? 2 * cap_rep : 64;
          double *r = realloc(rep, (size_t)cap_rep * sizeof(double));
          if (!r)
            rc = GW_ENOMEM;
          else
            rep = r;
        }
        if (rc == 0) rep[n_rep++] = v[k].cost;
      }
    }
    free(v);
  }
  free(path);
  if (rc != 0) {
    free(rep);
    flow_solution_free(out);
    return rc;
  }
  if (reported)
    *reported = rep;
  else
    free(rep);
  /* Sorting would break the pairing with reported costs. */
  if (!reported) flow_solution_sort(out);
  return 0;
}

/* ---- invariants ---- */


int flow_sim_check_local(const flow_simulation *s, char *err, size_t err_len) {
  char inner[200];
  for (int i = 0; i < s->in->n_nodes; i++) {
    if (!s->m[i].active) continue;
    if (flow_check_local(s->m[i].f, inner, sizeof(inner)) != 0)
      return flow_error(err, err_len, GW_EINVAL, "node %d: %s", s->in->nodes[i].id, inner);
  }
  return 0;
}

static const flow_unit_view *find_view(const flow_unit_view *v, size_t n, bool in, const gw_id *peer, uint64_t seg) {
  for (size_t k = 0; k < n; k++) {
    if (in && v[k].has_in && v[k].in_seg == seg && gw_id_eq(&v[k].prev, peer)) return &v[k];
    if (!in && v[k].has_out && v[k].out_seg == seg && gw_id_eq(&v[k].next, peer)) return &v[k];
  }
  return NULL;
}

typedef struct views {
  flow_unit_view *v;
  size_t n;
} views;

static int check_unit_ends(const flow_simulation *s, const views *all, int i, const flow_unit_view *u, char *err,
                           size_t err_len) {
  const flow_instance *in = s->in;
  int id = in->nodes[i].id;
  if (u->has_out) {
    int j = node_of(s, &u->next);
    if (j < 0) return flow_error(err, err_len, GW_EINVAL, "node %d sends to an unknown node", id);
    if (s->m[j].active) {
      const flow_unit_view *w = find_view(all[j].v, all[j].n, true, flow_sim_id(s, i), u->out_seg);
      if (!w)
        return flow_error(err, err_len, GW_EINVAL, "node %d -> %d: segment %016llx unknown downstream (half-connected)", id,
                    in->nodes[j].id, (unsigned long long)u->out_seg);
      if (!gw_id_eq(&w->target, &u->target))
        return flow_error(err, err_len, GW_EINVAL, "node %d -> %d: ends disagree on the target", id, in->nodes[j].id);
      int k = flow_adjacency_link(in, &s->adj, i, j);
      double expect = k < 0 ? -1 : w->cost;
      if (k >= 0) {
        double link = hop_cost(in, &in->links[k]);
        expect = flow_cost_combine(&s->opts.tun, link, w->cost);
      }
      bool same = isinf(expect) ? isinf(u->cost) : fabs(expect - u->cost) <= 1e-6 * (1 + fabs(expect));
      if (k < 0 || !same)
        return flow_error(err, err_len, GW_EINVAL, "node %d -> %d: cost to sink %.9g, but link and next hop give %.9g", id,
                    in->nodes[j].id, u->cost, expect);
    }
  }
  if (u->has_in) {
    int j = node_of(s, &u->prev);
    if (j < 0) return flow_error(err, err_len, GW_EINVAL, "node %d receives from an unknown node", id);
    if (s->m[j].active && !find_view(all[j].v, all[j].n, false, flow_sim_id(s, i), u->in_seg))
      return flow_error(err, err_len, GW_EINVAL, "node %d <- %d: segment %016llx unknown upstream (half-connected)", id, in->nodes[j].id,
                  (unsigned long long)u->in_seg);
  }
  return 0;
}

int flow_sim_check_consistent(const flow_simulation *s, char *err, size_t err_len) {
  int n = s->in->n_nodes, rc = 0;
  views *all = calloc((size_t)n, sizeof(*all));
  if (!all) return GW_ENOMEM;
  for (int i = 0; i < n && rc == 0; i++) {
    if (!s->m[i].active) continue;
    all[i].n = flow_units(s->m[i].f, NULL, 0);
    all[i].v = malloc((all[i].n + 1) * sizeof(flow_unit_view));
    if (!all[i].v)
      rc = GW_ENOMEM;
    else
      flow_units(s->m[i].f, all[i].v, all[i].n);
  }
  for (int i = 0; i < n && rc == 0; i++)
    for (size_t k = 0; k < all[i].n && rc == 0; k++) rc = check_unit_ends(s, all, i, &all[i].v[k], err, err_len);
  for (int i = 0; i < n; i++) free(all[i].v);
  free(all);
  return rc;
}

/* ---- whole runs ---- */

static bool same_flows(const flow_solution *a, const flow_solution *b) {
  if (a->n_flows != b->n_flows) return false;
  size_t len = (size_t)a->n_flows * (size_t)a->path_len;
  return len == 0 || memcmp(a->nodes, b->nodes, len * sizeof(int)) == 0;
}

/* The old measure's target (the pre-crash count, or what the survivors can
 * carry when that is fewer) and the surviving graph's optimum. */
static void recovery_targets(const flow_instance *in, const flow_sim_opts *o, int flows_before, flow_run_result *out) {
  out->recovery_target = flows_before;
  out->optimum_flows = -1;
  out->optimum_cost = NAN;
  unsigned char *gone = calloc((size_t)in->n_nodes, 1);
  if (!gone) return;
  for (int k = 0; k < o->n_crashes; k++)
    if (o->crashes[k].round <= out->last_crash_round) gone[o->crashes[k].node] = 1;
  /* What the survivors can carry caps what can come back (exact with one
   * data node, an upper bound with several). */
  int most = flows_before;
  if (flow_max_flows(in, gone, &most) == 0) {
    if (most < flows_before) out->recovery_target = most;
    out->optimum_flows = most;
  }
  flow_solution opt;
  if (flow_optimal(in, gone, &opt) == 0) {
    out->optimum_flows = opt.n_flows;
    out->optimum_cost = flow_solution_total(&opt);
    flow_solution_free(&opt);
  }
  free(gone);
}

/* Within FLOW_RECOVERY_TOLERANCE of the optimum: as many flows (less the
 * tolerance), and no dearer (plus the tolerance) where the cost is known. */
static bool near_optimum(const flow_run_result *r, const flow_round_stat *t) {
  if (r->optimum_flows < 0) return false;
  if ((double)t->num_flows < (1 - FLOW_RECOVERY_TOLERANCE) * r->optimum_flows) return false;
  return isnan(r->optimum_cost) || t->total_cost <= (1 + FLOW_RECOVERY_TOLERANCE) * r->optimum_cost + 1e-9;
}

static void settle(flow_run_result *out, int rounds, const flow_solution *final) {
  double cost = flow_solution_total(final);
  out->settled_round = rounds;
  out->messages_to_settle = rounds ? out->trace[rounds - 1].messages : 0;
  for (int r = rounds - 1; r >= 0; r--) {
    const flow_round_stat *t = &out->trace[r];
    if (t->num_flows != final->n_flows || fabs(t->total_cost - cost) > FLOW_SETTLE_TOLERANCE * cost) break;
    out->settled_round = r + 1;
    out->messages_to_settle = t->messages;
  }
}

void flow_run_result_free(flow_run_result *r) {
  flow_solution_free(&r->sol);
  free(r->trace);
  r->trace = NULL;
}

int flow_sim_run(const flow_instance *in, const flow_sim_opts *o, int rounds, flow_run_result *out) {
  memset(out, 0, sizeof(*out));
  flow_solution_init(&out->sol, in->stages);
  out->last_crash_round = out->recovered_round = out->recovered_optimal_round = out->optimum_flows = -1;
  out->optimum_cost = NAN;
  for (int k = 0; k < o->n_crashes; k++)
    if (o->crashes[k].round > out->last_crash_round) out->last_crash_round = o->crashes[k].round;
  flow_simulation *s;
  int rc = flow_sim_new(in, o, &s);
  if (rc != 0) return rc;
  out->trace = calloc((size_t)rounds + 1, sizeof(*out->trace));
  if (!out->trace) rc = GW_ENOMEM;
  flow_solution prev;
  flow_solution_init(&prev, in->stages);
  int flows_before_crash = 0;
  for (int r = 0; r < rounds && rc == 0; r++) {
    if (r == out->last_crash_round) flows_before_crash = prev.n_flows;
    flow_sim_round(s);
    flow_solution cur;
    rc = flow_sim_flows(s, &cur, NULL);
    if (rc != 0) break;
    out->trace[r] =
        (flow_round_stat){cur.n_flows, flow_solution_total(&cur), flow_solution_max(&cur), flow_sim_messages(s)};
    if (r == 0 || !same_flows(&cur, &prev)) {
      out->converged_round = r + 1;
      out->messages_to_converge = flow_sim_messages(s);
    }
    flow_solution_free(&prev);
    prev = cur;
  }
  if (rc == 0) {
    settle(out, rounds, &prev);
    out->sol = prev;
    out->rounds = rounds;
    out->messages = flow_sim_messages(s);
    if (out->last_crash_round >= 0 && out->last_crash_round < rounds) {
      recovery_targets(in, o, flows_before_crash, out);
      for (int r = out->last_crash_round; r < rounds && out->recovered_round < 0; r++)
        if (out->trace[r].num_flows >= out->recovery_target) out->recovered_round = r + 1;
      for (int r = out->last_crash_round; r < rounds && out->recovered_optimal_round < 0; r++)
        if (near_optimum(out, &out->trace[r])) out->recovered_optimal_round = r + 1;
    }
    out->detections = s->detections;
    out->undetected = s->n_watch;
    out->detect_mean_ms = s->detections ? (double)s->detect_sum_ms / s->detections : 0;
    out->detect_max_ms = s->detect_max_ms;
    out->false_alarms = s->false_alarms;
  } else {
    flow_solution_free(&prev);
  }
  flow_sim_free(s);
  return rc;
}
