/* train/peer_rebalance.c — live rebalancing between stages (issue 18,
 * item 3; SWARM's rebalancing, with hysteresis).
 *
 * Relays put their measured compute time per microbatch (forward+backward,
 * train_peer_mb_compute_ms) in every HELLO. Data nodes hear those of stages 1
 * and S as neighbours; a relay of a middle stage also sends its HELLO to the
 * leader (rebalance_hello_leader). Data nodes keep the latest claim of each
 * relay (rebalance_on_hello).
 *
 * Once per iteration (when its microbatches are back) the leader computes
 * each relay stage's rate: the sum over its live directory members of
 * 1000 / compute_ms, microbatches per second. The stage with the lowest rate
 * is the bottleneck B. The candidate move is the member m of another stage D
 * with at least two live members (never its aggregator, the lowest ID) that
 * maximises min(rate_B + r_m, rate_D - r_m); it is worth making when that
 * minimum exceeds rate_B x (1 + margin). Such a move can never be undone by
 * the same rule (the way back would need rate_B > (rate_D - r_m) x
 * (1 + margin) > rate_B), so peers do not oscillate; noise is kept out by
 * asking that the same stage be the bottleneck with a move worth making for
 * `rebalance_after` iterations in a row, by one move in flight at a time,
 * and by a cooldown of `rebalance_after` iterations after a move landed.
 * The move itself is the refill's TRAIN_MOVE (peer_move.c): the relay
 * finishes its round, leaves, and downloads its new stage's state from a
 * member. Nothing is decided while a stage is empty (the refill's job), a
 * joiner waits, or no member of a stage has measured its speed yet; a
 * member that has not (the flows gave it no microbatch) counts at the
 * median speed.
 *
 * A relay's speed carries over to its new stage scaled by the stages'
 * block counts (cfg.stage_layers). Claims, per block, count as within a
 * factor of CLAIM_RATIO (4) of the median claim: a relay that lies about its
 * speed (--byzantine lying-costs) makes its stage look at most four times
 * faster, and one slowed by its first job's warm-up at most four times
 * slower. */
#include "train/peer_leader.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/peer_join.h"
#include "train/peer_trust.h"
#include "util/err.h"

/* A HELLO's compute time counts this long (HELLOs come every 2 s). */
#define RATE_TTL_MS 30000
/* A move not seen landed (its HELLO from the new stage) by then is given up. */
#define PENDING_MS 60000
/* A claim counts as within this factor of the median claim (per block). */
#define CLAIM_RATIO 4.0

_Static_assert(sizeof(((train_peer_config *)0)->stage_layers) / sizeof(uint16_t) > PEER_MAX_STAGES,
               "stage_layers must cover every stage");

/* Blocks of stage s (unknown: 1, every stage alike). */
static double layers(const train_peer *p, int s) {
  return s >= 1 && s <= PEER_MAX_STAGES && p->cfg.stage_layers[s] ? p->cfg.stage_layers[s] : 1.0;
}

/* stage.rebalance_wait is an info line when its reason changes (why a
 * skewed run does not rebalance, without debug logging), else debug. */
static gw_log_level wait_level(train_peer *p, const char *reason) {
  if (p->rebal.waiting && !strcmp(p->rebal.waiting, reason)) return GW_LOG_DEBUG;
  p->rebal.waiting = reason;
  return GW_LOG_INFO;
}

#define WAIT_LOG(p, reason, fmt, ...)                                                      \
  do {                                                                                     \
    gw_log_level lvl_ = wait_level((p), (reason));                                         \
    if (gw_log_enabled(&(p)->log, lvl_))                                                   \
      gw_log_event(&(p)->log, lvl_, "stage.rebalance_wait", "reason=%s" fmt, (reason), __VA_ARGS__); \
  } while (0)

/* ---- what relays say about their speed ---- */

static peer_rate *rate_find(train_peer *p, const gw_id *id) {
  peer_rebalance *r = &p->rebal;
  for (uint32_t i = 0; i < r->n_rates; i++)
    if (gw_id_eq(&r->rates[i].id, id)) return &r->rates[i];
  return NULL;
}

void rebalance_on_hello(train_peer *p, const gw_id *from, int stage, double compute_ms, bool joining) {
  peer_rebalance *r = &p->rebal;
  if (p->cfg.role != TRAIN_DATA || stage < 1 || stage > p->cfg.n_stages) return;
  if (!(compute_ms > 0) || !isfinite(compute_ms)) compute_ms = 0; /* not measured yet */
  peer_rate *e = rate_find(p, from);
  if (!e) {
    uint32_t k = r->n_rates < REBALANCE_MAX_RATES ? r->n_rates++ : 0;
    for (uint32_t i = 0; i < r->n_rates; i++) /* full: the stalest goes */
      if (r->rates[i].at_ms < r->rates[k].at_ms) k = i;
    e = &r->rates[k];
    e->id = *from;
  }
  e->stage = stage;
  e->compute_ms = compute_ms;
  e->at_ms = p->now ? p->now : 1;
  if (r->pending && gw_id_eq(&r->moving, from) && stage == r->to && !joining) { /* it trains there */
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_INFO(&p->log, "stage.rebalance_landed", "peer=%s to=%d iter=%llu seconds=%.1f", who, stage,
            (unsigned long long)p->iteration, (double)(p->now - r->sent_ms) / 1000.0);
    r->pending = false;
    r->cool_until = p->iteration + p->cfg.tun.rebalance_after;
  }
}

bool rebalance_heard_in_stage(train_peer *p, int stage, uint64_t within_ms) {
  for (uint32_t i = 0; i < p->rebal.n_rates; i++) {
    const peer_rate *e = &p->rebal.rates[i];
    if (e->stage == stage && p->now - e->at_ms <= within_ms && peer_alive(p, &e->id) && !trust_banned(p, &e->id))
      return true;
  }
  return false;
}

void rebalance_hello_leader(train_peer *p, const Gwtf__TrainHello *h) {
  int S = p->cfg.n_stages;
  if (p->cfg.role != TRAIN_RELAY || !p->have_leader || p->stage == 1 || p->stage == S) return;
  peer_send(p, &p->leader, GWTF__TRAIN_MSG__TRAIN_HELLO, &h->base, NULL);
}

/* ---- the leader's view of the stages ---- */

typedef struct stage_rate {
  double rate;   /* microbatches per second */
  uint32_t live; /* members counted */
} stage_rate;

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* The median of the fresh claims, per block (0: none). */
static double median_claim(train_peer *p) {
  static double v[REBALANCE_MAX_RATES];
  size_t n = 0;
  for (uint32_t i = 0; i < p->rebal.n_rates; i++) {
    const peer_rate *e = &p->rebal.rates[i];
    if (e->compute_ms > 0 && p->now - e->at_ms <= RATE_TTL_MS) v[n++] = e->compute_ms / layers(p, e->stage);
  }
  if (n == 0) return 0;
  qsort(v, n, sizeof(v[0]), cmp_double);
  return v[n / 2];
}

/* A counted member of stage s: listed, live, not banned, its last HELLO
 * from stage s. Its rate in *out, its claim kept within CLAIM_RATIO of the
 * median (med: per block); the median's when it has not measured one (the
 * flows gave it no microbatch yet: an idle relay is the first to spare). */
static bool member_rate(train_peer *p, int s, const peer_member *m, double med, double *out, bool *measured) {
  if (m->heard || gw_id_eq(&m->id, &p->cfg.self) || !peer_alive(p, &m->id) || trust_banned(p, &m->id)) return false;
  const peer_rate *e = rate_find(p, &m->id);
  if (e && e->stage != s) return false; /* it serves another stage now (moved: the directory lags) */
  double per_block = med;
  if (e && e->compute_ms > 0 && p->now - e->at_ms <= RATE_TTL_MS)
    per_block = fmin(fmax(e->compute_ms / layers(p, s), med / CLAIM_RATIO), med * CLAIM_RATIO);
  *out = 1000.0 / (per_block * layers(p, s));
  if (measured) *measured = e && e->compute_ms > 0 && p->now - e->at_ms <= RATE_TTL_MS;
  return true;
}

/* Every stage's rate; false when one has no counted member or none that
 * measured its speed yet (no decision then). */
static bool stage_rates(train_peer *p, stage_rate *out, double median) {
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    out[s] = (stage_rate){0};
    peer_stage_view *v = &p->members[s];
    uint32_t measured = 0;
    for (size_t i = 0; i < v->n; i++) {
      double r;
      bool known;
      if (!member_rate(p, s, &v->v[i], median, &r, &known)) continue;
      out[s].rate += r;
      out[s].live++;
      measured += known;
    }
    if (out[s].live == 0 || measured == 0) {
      WAIT_LOG(p, out[s].live ? "rate_unknown" : "no_member", " in_stage=%d", s);
      return false;
    }
  }
  return true;
}

typedef struct rebal_move {
  int from, to;
  const gw_id *who;
  double r, r_to, after; /* its rate here and there; min(rate_to + r_to, rate_from - r) */
} rebal_move;

/* The lowest counted ID of stage s: its aggregator, never moved. */
static const gw_id *stage_lowest(train_peer *p, int s, double median) {
  const gw_id *low = NULL;
  peer_stage_view *v = &p->members[s];
  double r;
  for (size_t i = 0; i < v->n; i++)
    if (member_rate(p, s, &v->v[i], median, &r, NULL) && (!low || gw_id_cmp(&v->v[i].id, low) < 0)) low = &v->v[i].id;
  return low;
}

/* The best move into stage `to` (who NULL: none). */
static rebal_move best_move(train_peer *p, const stage_rate *sr, int to, double median) {
  rebal_move best = {.to = to};
  for (int d = 1; d <= p->cfg.n_stages; d++) {
    if (d == to || sr[d].live < 2) continue;
    const gw_id *low = stage_lowest(p, d, median);
    peer_stage_view *v = &p->members[d];
    for (size_t i = 0; i < v->n; i++) {
      double r;
      const gw_id *id = &v->v[i].id;
      if (!member_rate(p, d, &v->v[i], median, &r, NULL) || gw_id_eq(id, low)) continue;
      double r_to = r * layers(p, d) / layers(p, to); /* its rate there: the blocks differ */
      double after = fmin(sr[to].rate + r_to, sr[d].rate - r);
      if (!best.who || after > best.after || (after == best.after && gw_id_cmp(id, best.who) > 0))
        best = (rebal_move){.from = d, .to = to, .who = id, .r = r, .r_to = r_to, .after = after};
    }
  }
  return best;
}

/* TRAIN_MOVE to m->who: it leaves after this round; one move in flight. */
static void move_relay(train_peer *p, const rebal_move *m) {
  peer_rebalance *r = &p->rebal;
  Gwtf__TrainAssign a = GWTF__TRAIN_ASSIGN__INIT;
  a.stage = m->to;
  a.iteration = p->iteration;
  a.after_round = true; /* it leaves once its stage aggregated this round */
  /* its download sources, as a placed joiner's: without them it would look
   * for a replica of a stage that has members */
  ProtobufCBinaryData ids[PEER_MAX_CONTRIB];
  size_t n = 0;
  peer_stage_view *tv = &p->members[m->to];
  for (size_t i = 0; i < tv->n && n < PEER_MAX_CONTRIB; i++)
    if (!tv->v[i].heard && peer_alive(p, &tv->v[i].id)) ids[n++] = id_bytes(&tv->v[i].id);
  a.n_stage_peers = n;
  a.stage_peers = ids;
  peer_send(p, m->who, GWTF__TRAIN_MSG__TRAIN_MOVE, &a.base, NULL);
  uint32_t cap = 0;
  peer_stage_view *v = &p->members[m->from];
  for (size_t i = 0; i < v->n; i++)
    if (gw_id_eq(&v->v[i].id, m->who)) cap = v->v[i].capacity;
  r->pending = true;
  r->moving = *m->who;
  r->from = m->from;
  r->to = m->to;
  r->sent_ms = p->now;
  r->streak = 0;
  join_note_placed(p, m->who, m->to, cap); /* placement counts it in its new stage now */
}

static void send_move(train_peer *p, const rebal_move *m, const stage_rate *sr) {
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(m->who, who);
  GW_INFO(&p->log, "stage.rebalance",
          "peer=%s from=%d to=%d reason=bottleneck iters=%u cap_from=%.2f cap_to=%.2f cap_from_after=%.2f "
          "cap_to_after=%.2f members_from=%u members_to=%u iter=%llu",
          who, m->from, m->to, p->rebal.streak, sr[m->from].rate, sr[m->to].rate, sr[m->from].rate - m->r,
          sr[m->to].rate + m->r_to, sr[m->from].live, sr[m->to].live, (unsigned long long)p->iteration);
  move_relay(p, m);
}

/* Nothing to decide now: a move in flight, the cooldown, a stage the refill
 * is busy with, a joiner to place. */
static bool rebalance_blocked(train_peer *p) {
  peer_rebalance *r = &p->rebal;
  if (r->pending) {
    if (p->now - r->sent_ms < PENDING_MS) return true;
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(&r->moving, who);
    GW_WARN(&p->log, "stage.rebalance_abandoned", "peer=%s from=%d to=%d reason=not_seen_in_new_stage", who, r->from,
            r->to);
    r->pending = false;
    r->cool_until = p->iteration + p->cfg.tun.rebalance_after;
  }
  if (p->iteration < r->cool_until || p->n_candidates > 0) return true;
  for (int s = 1; s <= p->cfg.n_stages; s++)
    if (p->rep.empty_since[s]) return true;
  return false;
}

void rebalance_on_iteration(train_peer *p) {
  peer_rebalance *r = &p->rebal;
  if (!p->was_leader || p->cfg.tun.rebalance_after == 0) return;
  if (rebalance_blocked(p)) {
    WAIT_LOG(p, r->pending ? "move_in_flight" : "cooldown_or_join", " iter=%llu", (unsigned long long)p->iteration);
    r->streak = 0;
    return;
  }
  stage_rate sr[PEER_MAX_STAGES + 1];
  double median = median_claim(p);
  if (median <= 0) WAIT_LOG(p, "no_rates", " iter=%llu", (unsigned long long)p->iteration);
  if (median <= 0 || !stage_rates(p, sr, median)) {
    r->streak = 0;
    return;
  }
  int b = 1;
  for (int s = 2; s <= p->cfg.n_stages; s++)
    if (sr[s].rate < sr[b].rate) b = s;
  rebal_move m = best_move(p, sr, b, median);
  if (!m.who || !(m.after > sr[b].rate * (1.0 + p->cfg.tun.rebalance_margin))) {
    WAIT_LOG(p, "balanced", " bottleneck=%d cap=%.2f best_after=%.2f", b, sr[b].rate, m.who ? m.after : 0.0);
    r->streak = 0;
    return;
  }
  if (r->streak == 0 || r->streak_stage != b) {
    r->streak_stage = b;
    r->streak = 0;
  }
  r->streak++;
  r->waiting = NULL; /* a next wait is news */
  GW_DEBUG(&p->log, "stage.bottleneck", "bottleneck=%d cap=%.2f streak=%u of=%u donor=%d", b, sr[b].rate, r->streak,
           p->cfg.tun.rebalance_after, m.from);
  if (r->streak >= p->cfg.tun.rebalance_after) send_move(p, &m, sr);
}

/* ---- a stage short of slots (churn) ---- */

/* A counted member of stage s by the directory alone (no speed needed):
 * listed, live, not banned, its last HELLO (if any) from stage s. */
static bool slot_member(train_peer *p, int s, const peer_member *m) {
  if (m->heard || gw_id_eq(&m->id, &p->cfg.self) || !peer_alive(p, &m->id) || trust_banned(p, &m->id)) return false;
  const peer_rate *e = rate_find(p, &m->id);
  return !e || e->stage == s;
}

/* The slots stage s holds: its counted members' capacities, and those
 * placed there that the directory does not list yet. */
static uint32_t stage_slots(train_peer *p, int s, uint32_t *members) {
  uint32_t cap = 0, n = 0;
  peer_stage_view *v = &p->members[s];
  for (size_t i = 0; i < v->n; i++)
    if (slot_member(p, s, &v->v[i])) cap += v->v[i].capacity, n++;
  if (members) *members = n;
  return cap + join_placed_slots(p, s);
}

/* The member of another stage that fills the most of `to`'s shortfall
 * `need` and leaves its own stage at least `demand` slots: never a stage's
 * lowest ID (its aggregator), never a last member. Among equals, the one
 * whose stage keeps the most to spare. who NULL: none. */
static rebal_move short_donor(train_peer *p, int to, uint32_t need, uint32_t demand, uint32_t *fills) {
  rebal_move best = {.to = to};
  uint32_t best_fill = 0, best_left = 0;
  for (int d = 1; d <= p->cfg.n_stages; d++) {
    if (d == to) continue;
    uint32_t live = 0, slots = stage_slots(p, d, &live);
    if (live < 2 || slots <= demand) continue;
    const gw_id *low = NULL;
    peer_stage_view *v = &p->members[d];
    for (size_t i = 0; i < v->n; i++)
      if (slot_member(p, d, &v->v[i]) && (!low || gw_id_cmp(&v->v[i].id, low) < 0)) low = &v->v[i].id;
    for (size_t i = 0; i < v->n; i++) {
      const peer_member *m = &v->v[i];
      if (!slot_member(p, d, m) || gw_id_eq(&m->id, low) || m->capacity == 0 || slots - m->capacity < demand) continue;
      uint32_t fill = m->capacity < need ? m->capacity : need, left = slots - m->capacity;
      if (!best.who || fill > best_fill || (fill == best_fill && left > best_left)) {
        best = (rebal_move){.from = d, .to = to, .who = &m->id};
        best_fill = fill, best_left = left;
      }
    }
  }
  *fills = best_fill;
  return best;
}

/* Under churn a stage that lost a relay can hold fewer microbatches than
 * the data nodes start (join_pipeline_demand) and runs each iteration in
 * two waves until a joiner is placed there, an iteration or more later
 * (docs/evaluation/changes.md, "Where churn's time goes"). A stage with
 * slots to spare gives it a relay now: the relay finishes this round and
 * moves (`stage.rebalance ... reason=short`). Not while a move is in
 * flight, a joiner waits for placement (it goes to the short stage) or a
 * stage is empty (the refill's job). */
void rebalance_short_stage(train_peer *p) {
  peer_rebalance *r = &p->rebal;
  if (!p->was_leader || !p->cfg.tun.move_to_short || p->state != PEER_READY || p->iteration == 0) return;
  if (r->pending && !peer_alive(p, &r->moving)) r->pending = false; /* it died on its way */
  if ((r->pending && p->now - r->sent_ms < PENDING_MS) || p->n_candidates > 0) return;
  uint32_t demand = join_pipeline_demand(p);
  int short_stage = 0;
  uint32_t need = 0;
  for (int s = 1; s <= p->cfg.n_stages; s++) {
    if (p->rep.empty_since[s]) return;
    uint32_t slots = stage_slots(p, s, NULL);
    if (slots < demand && demand - slots > need) short_stage = s, need = demand - slots;
  }
  if (!short_stage) return;
  uint32_t fills = 0;
  rebal_move m = short_donor(p, short_stage, need, demand, &fills);
  if (!m.who) return;
  char who[GW_ID_SHORT_LEN + 1];
  peer_short(m.who, who);
  GW_INFO(&p->log, "stage.rebalance", "peer=%s from=%d to=%d reason=short demand=%u short_by=%u fills=%u iter=%llu",
          who, m.from, m.to, demand, need, fills, (unsigned long long)p->iteration);
  move_relay(p, &m);
}
