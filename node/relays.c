/* node/relays.c — choosing relays for a private node (see relays.h). */
#include "node/relays.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

/* A chosen relay whose session is down this long is replaced: the host
 * keeps redialling it, but peers cannot reach us through it meanwhile. */
#define DOWN_GRACE_MS (1000)
/* A reservation not granted within this long is given up. */
#define GRANT_WAIT_MS (15000)
/* How long a dropped relay is not chosen again. */
#define AVOID_REFUSED_MS (60000)
#define AVOID_GONE_MS (30000)
#define AVOID_MAX (32)
#define CANDIDATES_MAX (256)

typedef struct chosen {
  gw_id id;
  gw_addr addr;
  uint64_t since_ms;      /* chosen at */
  uint64_t down_since_ms; /* its session went down at (0: up) */
} chosen;

typedef struct avoided {
  gw_id id;
  uint64_t until_ms;
} avoided;

struct node_relays {
  p2p_host *h;
  gw_id me;
  const gw_log *log;
  p2p_reach_status status;
  chosen ch[NODE_RELAYS_WANT];
  size_t n_ch;
  avoided av[AVOID_MAX];
  size_t n_av;
  p2p_relay_addr granted[NODE_RELAYS_MAX];
  size_t n_granted;
  uint64_t generation;
};

int node_relays_new(p2p_host *h, const gw_id *me, const gw_log *log, node_relays **out) {
  node_relays *r = calloc(1, sizeof(*r));
  if (!r) return GW_ENOMEM;
  r->h = h;
  r->me = *me;
  r->log = log;
  *out = r;
  return 0;
}

void node_relays_free(node_relays *r) { free(r); }

static bool is_avoided(node_relays *r, const gw_id *id, uint64_t now) {
  for (size_t i = 0; i < r->n_av; i++)
    if (gw_id_eq(&r->av[i].id, id) && now < r->av[i].until_ms) return true;
  return false;
}

static void avoid(node_relays *r, const gw_id *id, uint64_t until) {
  size_t slot = r->n_av < AVOID_MAX ? r->n_av++ : 0;
  for (size_t i = 0; i < r->n_av; i++) /* the same peer, or the entry that ends first */
    if (gw_id_eq(&r->av[i].id, id) || r->av[i].until_ms < r->av[slot].until_ms) slot = i;
  r->av[slot] = (avoided){*id, until};
}

static void drop(node_relays *r, size_t i, const char *reason, uint64_t avoid_until) {
  char id[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&r->ch[i].id, id);
  if (reason) GW_INFO(r->log, "nat.relay_dropped", "relay=\"%s\" reason=%s", id, reason);
  p2p_host_relay_unreserve(r->h, &r->ch[i].id);
  if (avoid_until) avoid(r, &r->ch[i].id, avoid_until);
  r->ch[i] = r->ch[--r->n_ch];
}

static const p2p_relay_resv *resv_of(const p2p_relay_resv *list, size_t n, const gw_id *id) {
  for (size_t i = 0; i < n; i++)
    if (gw_id_eq(&list[i].relay, id)) return &list[i];
  return NULL;
}

static bool direct_up(node_relays *r, const gw_id *id) {
  p2p_peer_stats st;
  return p2p_host_peer_stats(r->h, id, &st) == 0 && st.connected && !st.relayed;
}

typedef struct cand {
  gw_peer p;
  double rtt;
} cand;

static int cmp_cand(const void *x, const void *y) {
  const cand *a = x, *b = y;
  if (a->rtt != b->rtt) return a->rtt < b->rtt ? -1 : 1;
  return gw_id_cmp(&a->p.id, &b->p.id);
}

/* Fills free slots with the connected public peers of lowest RTT. */
static void choose(node_relays *r, uint64_t now) {
  gw_peer *peers = calloc(CANDIDATES_MAX, sizeof(*peers));
  cand *c = calloc(CANDIDATES_MAX, sizeof(*c));
  size_t n = 0, np = peers && c ? p2p_host_peers(r->h, peers, CANDIDATES_MAX) : 0;
  if (np > CANDIDATES_MAX) np = CANDIDATES_MAX;
  for (size_t i = 0; i < np; i++) {
    p2p_peer_stats st;
    bool taken = false;
    for (size_t k = 0; k < r->n_ch; k++) taken |= gw_id_eq(&r->ch[k].id, &peers[i].id);
    if (taken || is_avoided(r, &peers[i].id, now)) continue;
    if (p2p_host_peer_stats(r->h, &peers[i].id, &st) != 0 || !st.connected || st.relayed) continue;
    if (!peers[i].addr.family || !peers[i].addr.port) continue;
    /* Unmeasured peers come after measured ones. */
    c[n++] = (cand){peers[i], st.rtt_samples ? st.rtt_ms : 1e9};
  }
  qsort(c, n, sizeof(*c), cmp_cand);
  for (size_t i = 0; i < n && r->n_ch < NODE_RELAYS_WANT; i++) {
    if (p2p_host_relay_reserve(r->h, &c[i].p.id, &c[i].p.addr) != 0) continue;
    r->ch[r->n_ch++] = (chosen){.id = c[i].p.id, .addr = c[i].p.addr, .since_ms = now};
    char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
    gw_id_to_short(&c[i].p.id, id);
    gw_addr_format(&c[i].p.addr, addr);
    GW_INFO(r->log, "nat.relay_chosen", "relay=\"%s\" addr=%s rtt_ms=%.3f", id, addr, c[i].rtt < 1e9 ? c[i].rtt : -1.0);
  }
  free(peers);
  free(c);
}

/* The granted set, in the order chosen; logged and counted when it changes. */
static void publish(node_relays *r, const p2p_relay_resv *list, size_t nl) {
  p2p_relay_addr now[NODE_RELAYS_MAX];
  size_t n = 0;
  for (size_t i = 0; i < r->n_ch; i++) {
    const p2p_relay_resv *v = resv_of(list, nl, &r->ch[i].id);
    if (v && v->reserved) now[n++] = (p2p_relay_addr){.relay = v->relay, .relay_addr = v->addr, .target = r->me};
  }
  bool same = n == r->n_granted;
  for (size_t i = 0; same && i < n; i++)
    same = gw_id_eq(&now[i].relay, &r->granted[i].relay) && gw_addr_eq(&now[i].relay_addr, &r->granted[i].relay_addr);
  if (same) return;
  memcpy(r->granted, now, sizeof(now[0]) * n);
  r->n_granted = n;
  r->generation++;
  char line[NODE_RELAYS_MAX * (GW_ID_SHORT_LEN + GW_ADDR_STRLEN + 2) + 2] = "-";
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
    gw_id_to_short(&now[i].relay, id);
    gw_addr_format(&now[i].relay_addr, addr);
    off += (size_t)snprintf(line + off, sizeof(line) - off, "%s%s@%s", i ? "," : "", id, addr);
  }
  GW_INFO(r->log, "nat.relays", "relays=%s", line);
}

void node_relays_set_status(node_relays *r, p2p_reach_status status, uint64_t now_ms) {
  if (status == r->status) return;
  r->status = status;
  node_relays_tick(r, now_ms);
}

void node_relays_tick(node_relays *r, uint64_t now) {
  if (r->status != P2P_REACH_PRIVATE) {
    while (r->n_ch) drop(r, r->n_ch - 1, NULL, 0);
    publish(r, NULL, 0);
    return;
  }
  p2p_relay_resv list[NODE_RELAYS_WANT * 4];
  size_t nl = p2p_host_relay_list(r->h, list, sizeof(list) / sizeof(list[0]));
  if (nl > sizeof(list) / sizeof(list[0])) nl = sizeof(list) / sizeof(list[0]);
  for (size_t i = r->n_ch; i-- > 0;) {
    chosen *c = &r->ch[i];
    const p2p_relay_resv *v = resv_of(list, nl, &c->id);
    bool up = direct_up(r, &c->id);
    if (up)
      c->down_since_ms = 0;
    else if (!c->down_since_ms)
      c->down_since_ms = now;
    if (v && v->refused && !v->reserved)
      drop(r, i, p2p_relay_status_name(v->refused), now + AVOID_REFUSED_MS);
    else if (!up && now - c->down_since_ms >= DOWN_GRACE_MS)
      drop(r, i, "session-down", now + AVOID_GONE_MS);
    else if ((!v || !v->reserved) && up && now - c->since_ms >= GRANT_WAIT_MS)
      drop(r, i, "not-granted", now + AVOID_GONE_MS);
  }
  if (r->n_ch < NODE_RELAYS_WANT) choose(r, now);
  nl = p2p_host_relay_list(r->h, list, sizeof(list) / sizeof(list[0]));
  if (nl > sizeof(list) / sizeof(list[0])) nl = sizeof(list) / sizeof(list[0]);
  publish(r, list, nl);
}

size_t node_relays_get(const node_relays *r, p2p_relay_addr *out, size_t max, bool *private_out) {
  if (private_out) *private_out = r->status == P2P_REACH_PRIVATE;
  size_t n = r->n_granted < max ? r->n_granted : max;
  memcpy(out, r->granted, sizeof(out[0]) * n);
  return n;
}

uint64_t node_relays_generation(const node_relays *r) { return r->generation; }
