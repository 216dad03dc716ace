/* p2p/reach.c — the reachability check (see reach.h). */
#include "p2p/reach.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/p2p.pb-c.h"
#include "util/err.h"

enum ask_state { ASK_PENDING = 0, ASK_OK, ASK_FAILED, ASK_NONE };

/* One peer asked in the current round. */
typedef struct ask {
  gw_id id;
  uint64_t nonce;
  uint64_t deadline_ms;
  uint8_t state;
  bool probe_seen; /* its dial-back connection reached us */
  bool said_ok;    /* its result said ok; waiting for the connection to show */
  gw_addr addr;    /* the address it says it dialled */
} ask;

typedef struct known_peer {
  gw_id id;
  gw_addr observed; /* family 0: it did not say */
} known_peer;

/* A token bucket of the prober's rate limit, keyed by node ID or by IP. */
typedef struct bucket {
  uint8_t key[GW_ID_BYTES + 1]; /* [0]: 'n' node ID, 'i' IP (+ family in [1]) */
  double tokens;
  uint64_t at_ms;
  bool used;
} bucket;

struct p2p_reach {
  p2p_reach_config cfg;
  p2p_reach_io io;
  p2p_reachability cur;
  bool reported; /* cur has been decided at least once */
  known_peer peers[P2P_REACH_PEERS_MAX];
  size_t n_peers;
  /* the round in progress */
  bool active;
  uint16_t round_port;
  uint64_t round_started_ms;
  ask asks[P2P_REACH_MAX_ASK];
  size_t n_asks;
  uint64_t next_round_ms; /* UINT64_MAX: none due */
  uint64_t retry_ms;      /* current backoff of undecided rounds */
  /* prober side */
  bucket buckets[P2P_REACH_SERVE_KEYS];
  unsigned serving;
};

const char *p2p_reach_status_name(p2p_reach_status s) {
  switch (s) {
  case P2P_REACH_PUBLIC: return "public";
  case P2P_REACH_PRIVATE: return "private";
  default: return "unknown";
  }
}

static bool same_ip(const gw_addr *a, const gw_addr *b) { return a->family && gw_addr_same_ip(a, b); }

int p2p_reach_new(const p2p_reach_config *cfg, const p2p_reach_io *io, p2p_reach **out) {
  *out = NULL;
  if (!io || !io->request) return GW_EINVAL;
  p2p_reach *r = calloc(1, sizeof(*r));
  if (!r) return GW_ENOMEM;
  r->cfg = *cfg;
#define DEFAULT(field, value) \
  if (!r->cfg.field) r->cfg.field = (value)
  DEFAULT(result_timeout_ms, P2P_REACH_RESULT_TIMEOUT_MS);
  DEFAULT(refresh_ms, P2P_REACH_REFRESH_MS);
  DEFAULT(retry_ms, P2P_REACH_RETRY_MS);
  DEFAULT(serve_burst, P2P_REACH_SERVE_BURST);
  DEFAULT(serve_refill_ms, P2P_REACH_SERVE_REFILL_MS);
  DEFAULT(serve_ip_burst, P2P_REACH_SERVE_IP_BURST);
  DEFAULT(serve_inflight, P2P_REACH_SERVE_INFLIGHT);
#undef DEFAULT
  r->io = *io;
  r->retry_ms = r->cfg.retry_ms;
  r->next_round_ms = 0; /* due as soon as there are peers to ask */
  *out = r;
  return 0;
}

void p2p_reach_free(p2p_reach *r) { free(r); }

/* ---- observed addresses ---- */

static known_peer *find_peer(p2p_reach *r, const gw_id *id) {
  for (size_t i = 0; i < r->n_peers; i++)
    if (gw_id_eq(&r->peers[i].id, id)) return &r->peers[i];
  return NULL;
}

int p2p_reach_observed(const p2p_reach *r, gw_addr *out) {
  size_t best = 0, best_n = 0;
  for (size_t i = 0; i < r->n_peers; i++) {
    if (!r->peers[i].observed.family) continue;
    size_t n = 0;
    for (size_t j = 0; j < r->n_peers; j++) n += same_ip(&r->peers[i].observed, &r->peers[j].observed);
    if (n > best_n) best = i, best_n = n;
  }
  if (best_n < P2P_REACH_AGREE) return GW_ENOENT;
  *out = r->peers[best].observed;
  out->port = 0;
  return 0;
}

uint16_t p2p_reach_port(const p2p_reach *r) { return r->cfg.port; }

/* ---- rounds ---- */

static uint64_t nonce(p2p_reach *r) {
  uint64_t n = 0;
  while (n == 0) {
    if (r->io.random64)
      n = r->io.random64(r->io.ud);
    else
      randombytes_buf(&n, sizeof(n));
  }
  return n;
}

static ask *find_ask(p2p_reach *r, const gw_id *id, uint64_t nonce_v) {
  if (!r->active) return NULL;
  for (size_t i = 0; i < r->n_asks; i++)
    if (r->asks[i].nonce == nonce_v && gw_id_eq(&r->asks[i].id, id)) return &r->asks[i];
  return NULL;
}

static bool asked(const p2p_reach *r, const gw_id *id) {
  for (size_t i = 0; i < r->n_asks; i++)
    if (gw_id_eq(&r->asks[i].id, id)) return true;
  return false;
}

static size_t pending(const p2p_reach *r) {
  size_t n = 0;
  for (size_t i = 0; i < r->n_asks; i++) n += r->asks[i].state == ASK_PENDING;
  return n;
}

static void start_round(p2p_reach *r, uint64_t now_ms) {
  r->active = true;
  r->round_port = r->cfg.port;
  r->round_started_ms = now_ms;
  r->n_asks = 0;
  r->next_round_ms = UINT64_MAX;
}

/* Asks connected peers not yet asked this round, keeping P2P_REACH_AGREE
 * requests in flight. Returns how many peers are left to ask. */
static size_t ask_more(p2p_reach *r, uint64_t now_ms) {
  size_t left = 0;
  for (size_t i = 0; i < r->n_peers; i++) {
    const known_peer *p = &r->peers[i];
    if (asked(r, &p->id)) continue;
    if (r->n_asks >= P2P_REACH_MAX_ASK || pending(r) >= P2P_REACH_AGREE) {
      left++;
      continue;
    }
    ask *a = &r->asks[r->n_asks++];
    memset(a, 0, sizeof(*a));
    a->id = p->id;
    a->nonce = nonce(r);
    a->deadline_ms = now_ms + r->cfg.result_timeout_ms;
    a->state = ASK_PENDING;
    if (r->io.request(r->io.ud, &p->id, r->round_port, a->nonce) != 0) a->state = ASK_NONE;
  }
  return r->n_asks >= P2P_REACH_MAX_ASK ? 0 : left;
}

static void log_verdict(p2p_reach *r) {
  char addr[GW_ADDR_STRLEN] = "-";
  if (r->cur.addr.family) gw_addr_format(&r->cur.addr, addr);
  GW_INFO(r->cfg.log, "nat.reachability", "status=%s addr=%s checked_by=%u%s", p2p_reach_status_name(r->cur.status),
          addr, r->cur.checked_by, r->cfg.port ? "" : " reason=not-listening");
  if (r->cur.status != P2P_REACH_PRIVATE) return;
  if (!r->cfg.port) {
    GW_INFO(r->cfg.log, "nat.advice",
            "msg=\"This node does not listen for connections, so other peers cannot start sessions with it: "
            "start it with --listen to take part fully.\"");
    return;
  }
  unsigned port = r->cur.addr.family ? r->cur.addr.port : r->cfg.port;
  GW_INFO(r->cfg.log, "nat.advice",
          "msg=\"Other peers cannot connect to this node at %s, so it uses the DHT as a client only: enable "
          "UPnP or NAT-PMP on your router, or forward TCP and UDP port %u on the router to this computer.\"",
          addr, port);
}

static void decide(p2p_reach *r, p2p_reach_status status, const gw_addr *addr, unsigned checked_by,
                   uint64_t now_ms) {
  r->active = false;
  r->cur.status = status;
  r->cur.addr = addr ? *addr : (gw_addr){0};
  r->cur.checked_by = checked_by;
  r->reported = true;
  r->retry_ms = r->cfg.retry_ms;
  r->next_round_ms = now_ms + r->cfg.refresh_ms;
  log_verdict(r);
  if (r->io.decided) r->io.decided(r->io.ud, &r->cur);
}

/* Two agreeing verdicts for one address decide. An "ok" is strong evidence
 * (the connection arrived, authenticated), so one "ok" for an address
 * keeps "failed" reports for it from deciding "private". */
static bool try_decide(p2p_reach *r, uint64_t now_ms) {
  for (int want = ASK_OK; want <= ASK_FAILED; want++) {
    for (size_t i = 0; i < r->n_asks; i++) {
      const ask *a = &r->asks[i];
      if (a->state != want) continue;
      unsigned same = 0, oks = 0;
      for (size_t j = 0; j < r->n_asks; j++) {
        if (!gw_addr_eq(&r->asks[j].addr, &a->addr)) continue;
        same += r->asks[j].state == want;
        oks += r->asks[j].state == ASK_OK;
      }
      if (same < P2P_REACH_AGREE || (want == ASK_FAILED && oks > 0)) continue;
      gw_addr addr = a->addr;
      decide(r, want == ASK_OK ? P2P_REACH_PUBLIC : P2P_REACH_PRIVATE, &addr, same, now_ms);
      return true;
    }
  }
  return false;
}

static void expire(p2p_reach *r, uint64_t now_ms) {
  for (size_t i = 0; i < r->n_asks; i++) {
    ask *a = &r->asks[i];
    if (a->state != ASK_PENDING || now_ms < a->deadline_ms) continue;
    a->state = ASK_NONE;
    char id[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&a->id, id);
    GW_DEBUG(r->cfg.log, "nat.dial_back_timeout", "peer=\"%s\" said_ok=%d", id, (int)a->said_ok);
  }
}

/* Everything the state machine does on its own, after any event. */
static void step(p2p_reach *r, uint64_t now_ms) {
  if (!r->cfg.port) { /* nobody can dial a node that does not listen */
    r->active = false;
    if (!r->reported && r->n_peers > 0) decide(r, P2P_REACH_PRIVATE, NULL, 0, now_ms);
    r->next_round_ms = UINT64_MAX;
    return;
  }
  if (!r->active) {
    if (now_ms < r->next_round_ms || r->n_peers < P2P_REACH_AGREE) return;
    start_round(r, now_ms);
  }
  expire(r, now_ms);
  if (try_decide(r, now_ms)) return;
  size_t left = ask_more(r, now_ms);
  if (pending(r) > 0 || left > 0) return;
  /* Everyone reachable was asked without a verdict: wait for new peers for
   * a while, then start over with backoff. */
  if (now_ms < r->round_started_ms + r->retry_ms) return;
  r->active = false;
  r->next_round_ms = now_ms;
  r->retry_ms = r->retry_ms * 2 < r->cfg.refresh_ms ? r->retry_ms * 2 : r->cfg.refresh_ms;
  GW_DEBUG(r->cfg.log, "nat.reachability_undecided", "asked=%zu retry_ms=%llu", r->n_asks,
           (unsigned long long)r->retry_ms);
  r->round_started_ms = now_ms;
  start_round(r, now_ms);
  ask_more(r, now_ms);
}

/* ---- events ---- */

static void observed_changed(p2p_reach *r, uint64_t now_ms) {
  gw_addr obs;
  if (!r->reported || !r->cur.addr.family || p2p_reach_observed(r, &obs) != 0) return;
  if (gw_addr_same_ip(&obs, &r->cur.addr)) return;
  char was[GW_ADDR_STRLEN], now_s[GW_ADDR_STRLEN];
  gw_addr_format(&r->cur.addr, was);
  gw_addr_format(&obs, now_s);
  GW_INFO(r->cfg.log, "nat.observed", "was=%s now=%s msg=\"peers see a new address: checking reachability again\"",
          was, now_s);
  /* Two colluding peers could make this flap: at most one round a retry period. */
  if (!r->active) {
    uint64_t at = r->round_started_ms + r->cfg.retry_ms;
    r->next_round_ms = at > now_ms ? at : now_ms;
  }
}

void p2p_reach_peer_up(p2p_reach *r, const gw_id *id, const gw_addr *observed, uint64_t now_ms) {
  known_peer *p = find_peer(r, id);
  if (!p) {
    if (r->n_peers == P2P_REACH_PEERS_MAX) return; /* enough witnesses */
    p = &r->peers[r->n_peers++];
    memset(p, 0, sizeof(*p));
    p->id = *id;
  }
  p->observed = observed && (observed->family == 4 || observed->family == 6) ? *observed : (gw_addr){0};
  observed_changed(r, now_ms);
  step(r, now_ms);
}

void p2p_reach_peer_down(p2p_reach *r, const gw_id *id, uint64_t now_ms) {
  known_peer *p = find_peer(r, id);
  if (p) *p = r->peers[--r->n_peers];
  step(r, now_ms);
}

void p2p_reach_on_result(p2p_reach *r, const gw_id *from, uint64_t nonce_v, int status, const gw_addr *dialled,
                         uint64_t now_ms) {
  ask *a = find_ask(r, from, nonce_v);
  char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN] = "-";
  gw_id_to_short(from, id);
  if (dialled && dialled->family) gw_addr_format(dialled, addr);
  if (!a || a->state != ASK_PENDING || a->said_ok) {
    GW_DEBUG(r->cfg.log, "nat.dial_back_ignored", "peer=\"%s\" status=%d addr=%s", id, status, addr);
    return;
  }
  GW_DEBUG(r->cfg.log, "nat.dial_back_result", "peer=\"%s\" status=%d addr=%s probe_seen=%d", id, status, addr,
           (int)a->probe_seen);
  /* It must have dialled the port we asked for; which IP it saw us at is
   * its word, and counts only where another peer says the same. */
  bool addr_ok = dialled && (dialled->family == 4 || dialled->family == 6) && dialled->port == r->round_port;
  if (!addr_ok || status == GWTF__DIAL_BACK_STATUS__DIAL_BACK_REFUSED) {
    a->state = ASK_NONE;
  } else if (status == GWTF__DIAL_BACK_STATUS__DIAL_BACK_OK) {
    a->addr = *dialled;
    a->said_ok = true;
    if (a->probe_seen) a->state = ASK_OK; /* else wait for the connection until the deadline */
  } else if (status == GWTF__DIAL_BACK_STATUS__DIAL_BACK_FAILED) {
    a->addr = *dialled;
    a->state = a->probe_seen ? ASK_NONE : ASK_FAILED; /* it reached us and says it did not: no verdict */
  } else {
    a->state = ASK_NONE;
  }
  step(r, now_ms);
}

bool p2p_reach_on_probe(p2p_reach *r, const gw_id *from, uint64_t nonce_v, uint64_t now_ms) {
  ask *a = find_ask(r, from, nonce_v);
  if (!a || a->state != ASK_PENDING) return false;
  a->probe_seen = true;
  if (a->said_ok) a->state = ASK_OK;
  step(r, now_ms);
  return true;
}

void p2p_reach_recheck(p2p_reach *r, uint16_t port, uint64_t now_ms) {
  if (port) r->cfg.port = port;
  r->active = false; /* answers to the old round no longer count */
  r->retry_ms = r->cfg.retry_ms;
  r->next_round_ms = now_ms;
  step(r, now_ms);
}

void p2p_reach_tick(p2p_reach *r, uint64_t now_ms) { step(r, now_ms); }

void p2p_reach_get(const p2p_reach *r, p2p_reachability *out) { *out = r->cur; }

/* ---- prober side ---- */

static bucket *get_bucket(p2p_reach *r, const uint8_t key[GW_ID_BYTES + 1], double burst, uint64_t now_ms) {
  bucket *free_b = NULL, *oldest = NULL;
  for (size_t i = 0; i < P2P_REACH_SERVE_KEYS; i++) {
    bucket *b = &r->buckets[i];
    if (!b->used) {
      if (!free_b) free_b = b;
      continue;
    }
    if (memcmp(b->key, key, GW_ID_BYTES + 1) == 0) return b;
    if (!oldest || b->at_ms < oldest->at_ms) oldest = b;
  }
  /* Forgetting the longest-idle key is safe: it has refilled the most. */
  bucket *b = free_b ? free_b : oldest;
  memcpy(b->key, key, GW_ID_BYTES + 1);
  b->tokens = burst;
  b->at_ms = now_ms;
  b->used = true;
  return b;
}

static double refill(const p2p_reach *r, bucket *b, double burst, uint64_t now_ms) {
  if (now_ms > b->at_ms) {
    b->tokens += (double)(now_ms - b->at_ms) / (double)r->cfg.serve_refill_ms;
    if (b->tokens > burst) b->tokens = burst;
    b->at_ms = now_ms;
  }
  return b->tokens;
}

int p2p_reach_admit(p2p_reach *r, const gw_id *from, const gw_addr *from_addr, uint32_t port, uint64_t now_ms,
                    const char **why) {
  *why = "-";
  if (port == 0 || port > 65535 || !from_addr->family) {
    *why = "bad-port";
    return GW_EINVAL;
  }
  if (r->serving >= r->cfg.serve_inflight) {
    *why = "busy";
    return GW_EFULL;
  }
  uint8_t kid[GW_ID_BYTES + 1] = {'n'}, kip[GW_ID_BYTES + 1] = {'i', from_addr->family};
  memcpy(kid + 1, from->b, GW_ID_BYTES);
  memcpy(kip + 2, from_addr->ip, from_addr->family == 4 ? 4 : 16);
  bucket *bi = get_bucket(r, kid, r->cfg.serve_burst, now_ms);
  bucket *bp = get_bucket(r, kip, r->cfg.serve_ip_burst, now_ms);
  if (refill(r, bi, r->cfg.serve_burst, now_ms) < 1) {
    *why = "rate-limit-peer";
    return GW_EAGAIN;
  }
  if (refill(r, bp, r->cfg.serve_ip_burst, now_ms) < 1) {
    *why = "rate-limit-ip";
    return GW_EAGAIN;
  }
  bi->tokens -= 1;
  bp->tokens -= 1;
  r->serving++;
  return 0;
}

void p2p_reach_serve_done(p2p_reach *r) {
  if (r->serving > 0) r->serving--;
}
