#include "p2p/punch.h"

#include <netinet/in.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "p2p/frame.h"
#include "p2p/host.h"
#include "p2p/session.h"
#include "p2p/sockaddr.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/clock.h"
#include "util/err.h"

/* A direct session may be up on one end only for a moment before the other
 * end's handshake completes; attempts beyond this many per address are not
 * worth the SYNs. */
#define MAX_TRIES_PER_ADDR (40)
/* Sessions that can come out of one punch: our dials plus accepted ones. */
#define MAX_ATTEMPTS (2 * P2P_PUNCH_MAX_ADDRS)
/* The non-chooser keeps the relayed session until the chooser closes it
 * (after reading our marker); past this it closes it itself. */
#define LINGER_MS (60000)
#define BODY_MAX (512)

static const uint8_t MAGIC[4] = {'G', 'W', 'P', 'H'};

enum pstate {
  P_START,      /* starter: CONNECT due */
  P_CONNECTING, /* starter: CONNECT sent, waiting for the answer */
  P_WAIT_SYNC,  /* other: answered, waiting for SYNC */
  P_DIAL_WAIT,  /* starter: SYNC sent, dialling at dial_at_ms */
  P_DIALLING,   /* dials out, waiting for a direct session */
  P_MIGRATING,  /* a direct session chosen, markers under way */
  P_LINGER,     /* migrated; the relayed session ends when the chooser closes it */
};

typedef struct attempt {
  gw_addr remote;
  struct p2p_session *s;
  bool accepted; /* came in on our listener: never redialled */
  bool up;
  unsigned tries;
  uint64_t next_ms;
} attempt;

typedef struct punch {
  gw_id peer;
  struct p2p_session *s1; /* the relayed session */
  uint8_t id[P2P_PUNCH_ID_BYTES];
  uint8_t preface[P2P_PUNCH_PREFACE_BYTES];
  bool starter, chooser;
  int state;
  int my_nat, peer_nat;
  uint64_t begun_ms, connect_sent_ns, due_ms, deadline_ms;
  gw_addr local; /* where our dials come from */
  uv_tcp_t *anchor; /* holds a punch port for a node without a listener */
  gw_addr my_addrs[P2P_PUNCH_MAX_ADDRS];
  size_t n_my;
  attempt att[MAX_ATTEMPTS];
  size_t n_att;
  struct p2p_session *s2;
  uint8_t want_hash[32];
  bool have_want;
  bool sent_marker, got_marker;
  struct punch *next;
} punch;

struct p2p_punch {
  struct p2p_host *h;
  uv_loop_t *loop;
  p2p_punch_config cfg;
  const p2p_identity *me;
  const gw_log *log;
  uv_timer_t *timer;
  bool stopped;
  punch *list;
  p2p_punch_stats stats;
};

static uint64_t now_ms(void) { return gw_clock_mono_ms(); }

void p2p_punch_config_defaults(p2p_punch_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->enabled = false;
  cfg->timeout_ms = 5000;
  cfg->retry_ms = 100;
  cfg->answer_ms = 5000;
  cfg->migrate_ms = 30000;
}

void p2p_punch_preface(const uint8_t id[P2P_PUNCH_ID_BYTES], uint8_t out[P2P_PUNCH_PREFACE_BYTES]) {
  memset(out, 0, P2P_PUNCH_PREFACE_BYTES);
  memcpy(out, MAGIC, 4);
  out[4] = P2P_PUNCH_VERSION;
  memcpy(out + 8, id, P2P_PUNCH_ID_BYTES);
}

bool p2p_punch_is_preface(const uint8_t rec[P2P_PUNCH_PREFACE_BYTES]) {
  return memcmp(rec, MAGIC, 4) == 0 && rec[4] == P2P_PUNCH_VERSION && rec[5] == 0 && rec[6] == 0 && rec[7] == 0;
}

int p2p_punch_socket(int family) {
  int fd = socket(family == 6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return GW_EIO;
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
    close(fd);
    return GW_EIO;
  }
  return fd;
}

int p2p_punch_share_port(uv_tcp_t *listener) {
  uv_os_fd_t fd;
  int rc = uv_fileno((uv_handle_t *)listener, &fd);
  if (rc != 0) return rc;
  int one = 1;
  return setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) == 0 ? 0 : GW_EIO;
}

const char *p2p_punch_nat_name(int nat) {
  switch (nat) {
  case GWTF__PUNCH_NAT__PUNCH_NAT_NONE: return "none";
  case GWTF__PUNCH_NAT__PUNCH_NAT_CONE: return "cone";
  case GWTF__PUNCH_NAT__PUNCH_NAT_SYMMETRIC: return "symmetric";
  default: return "unknown";
  }
}

/* ---- the punch list ---- */

static punch *find(const p2p_punch *p, const gw_id *peer) {
  for (punch *q = p->list; q; q = q->next)
    if (gw_id_eq(&q->peer, peer)) return q;
  return NULL;
}

static void free_anchor(uv_handle_t *hd) { free(hd); }

static void close_attempts(punch *q, const struct p2p_session *keep) {
  for (size_t i = 0; i < q->n_att; i++) {
    struct p2p_session *s = q->att[i].s;
    if (!s || s == keep) continue;
    q->att[i].s = NULL;
    if (p2p_session_is_up(s))
      p2p_session_goodbye(s, GWTF__GOODBYE_REASON__GOODBYE_DUPLICATE);
    else if (p2p_session_is_open(s))
      p2p_session_close(s, P2P_END_CLOSED, 0, "punch-done");
  }
}

static void drop_anchor(punch *q) {
  if (!q->anchor) return;
  uv_close((uv_handle_t *)q->anchor, free_anchor);
  q->anchor = NULL;
}

static void unlink_free(p2p_punch *p, punch *q) {
  for (punch **pp = &p->list; *pp; pp = &(*pp)->next)
    if (*pp == q) {
      *pp = q->next;
      break;
    }
  drop_anchor(q);
  p->stats.active--;
  free(q);
}

static void short_id(const gw_id *id, char out[GW_ID_SHORT_LEN + 1]) { gw_id_to_short(id, out); }

static void fail(p2p_punch *p, punch *q, const char *reason) {
  char id[GW_ID_SHORT_LEN + 1];
  short_id(&q->peer, id);
  GW_INFO(p->log, "nat.punch_failed", "peer=\"%s\" nat=%s/%s reason=%s after_ms=%llu", id,
          p2p_punch_nat_name(q->my_nat), p2p_punch_nat_name(q->peer_nat), reason,
          (unsigned long long)(now_ms() - q->begun_ms));
  p->stats.failed++;
  close_attempts(q, NULL);
  unlink_free(p, q);
}

/* ---- our addresses ---- */

static bool ip_eq(const gw_addr *a, const gw_addr *b) {
  return a->family == b->family && memcmp(a->ip, b->ip, a->family == 4 ? 4 : 16) == 0;
}

static bool ip_unspecified(const gw_addr *a) {
  static const uint8_t zero[16] = {0};
  return memcmp(a->ip, zero, a->family == 4 ? 4 : 16) == 0;
}

static int classify_nat(const p2p_punch *p, gw_addr *observed, gw_addr *local, size_t n) {
  (void)p;
  int nat = GWTF__PUNCH_NAT__PUNCH_NAT_UNKNOWN;
  for (size_t i = 0; i < n; i++) {
    int k;
    if (ip_eq(&observed[i], &local[i]))
      k = observed[i].port == local[i].port ? GWTF__PUNCH_NAT__PUNCH_NAT_NONE : GWTF__PUNCH_NAT__PUNCH_NAT_SYMMETRIC;
    else
      k = observed[i].port == local[i].port ? GWTF__PUNCH_NAT__PUNCH_NAT_CONE : GWTF__PUNCH_NAT__PUNCH_NAT_SYMMETRIC;
    if (k > nat) nat = k; /* the worst seen: symmetric > cone > none */
  }
  return nat;
}

static void add_addr(punch *q, const gw_addr *ip, uint16_t port) {
  if (q->n_my >= P2P_PUNCH_MAX_ADDRS || !ip->family || ip_unspecified(ip)) return;
  gw_addr a = *ip;
  a.port = port;
  for (size_t i = 0; i < q->n_my; i++)
    if (gw_addr_eq(&q->my_addrs[i], &a)) return;
  q->my_addrs[q->n_my++] = a;
}

/* Where we dial from and what we tell the peer: our observed IPs (what two
 * peers agree on first) with our listen or punch port, then our own
 * addresses (a peer on the same LAN). */
static int prepare_local(p2p_punch *p, punch *q) {
  gw_addr obs[P2P_PUNCH_MAX_ADDRS], loc[P2P_PUNCH_MAX_ADDRS];
  size_t n = p2p_host_punch_observed(p->h, loc, obs, P2P_PUNCH_MAX_ADDRS);
  q->my_nat = classify_nat(p, obs, loc, n);
  gw_addr listen = p2p_host_listen_addr(p->h);
  if (listen.family) {
    q->local = listen;
  } else {
    /* No listener: hold a port of our own for this punch. */
    int family = n ? loc[0].family : 4;
    uv_tcp_t *t = malloc(sizeof(*t));
    if (!t) return GW_ENOMEM;
    uv_tcp_init(p->loop, t);
    int fd = p2p_punch_socket(family), rc = fd < 0 ? fd : 0;
    if (rc == 0 && (rc = uv_tcp_open(t, fd)) != 0) close(fd);
    gw_addr any = {.family = (uint8_t)family};
    struct sockaddr_storage ss;
    if (rc == 0) rc = p2p_addr_to_sockaddr(&any, &ss);
    if (rc == 0) rc = uv_tcp_bind(t, (struct sockaddr *)&ss, 0);
    int len = sizeof(ss);
    if (rc == 0) rc = uv_tcp_getsockname(t, (struct sockaddr *)&ss, &len);
    if (rc == 0) rc = p2p_addr_from_sockaddr((struct sockaddr *)&ss, &q->local);
    if (rc != 0) {
      uv_close((uv_handle_t *)t, free_anchor);
      return rc;
    }
    q->anchor = t;
  }
  if (p->cfg.test_advertise.family) {
    q->my_addrs[q->n_my++] = p->cfg.test_advertise;
    return 0;
  }
  gw_addr agreed;
  if (p2p_host_observed_addr(p->h, &agreed) == 0) add_addr(q, &agreed, q->local.port);
  for (size_t i = 0; i < n; i++) add_addr(q, &obs[i], q->local.port);
  add_addr(q, &q->local, q->local.port);
  for (size_t i = 0; i < n; i++) add_addr(q, &loc[i], q->local.port);
  return 0;
}

/* ---- messages over the relayed session ---- */

static int send_msg(punch *q, uint32_t type, const uint8_t *body, size_t len) {
  p2p_msg m = {.type = type, .body = body, .body_len = len};
  return q->s1 ? p2p_session_send(q->s1, &m) : GW_ECLOSED;
}

static int send_connect(punch *q) {
  Gwtf__PunchConnect pc = GWTF__PUNCH_CONNECT__INIT;
  Gwtf__PunchAddr pa[P2P_PUNCH_MAX_ADDRS], *pp[P2P_PUNCH_MAX_ADDRS];
  for (size_t i = 0; i < q->n_my; i++) {
    gwtf__punch_addr__init(&pa[i]);
    pa[i].ip = (ProtobufCBinaryData){q->my_addrs[i].family == 4 ? 4 : 16, q->my_addrs[i].ip};
    pa[i].port = q->my_addrs[i].port;
    pp[i] = &pa[i];
  }
  pc.id = (ProtobufCBinaryData){P2P_PUNCH_ID_BYTES, q->id};
  pc.n_addrs = q->n_my;
  pc.addrs = pp;
  pc.nat = (Gwtf__PunchNat)q->my_nat;
  uint8_t body[BODY_MAX];
  if (gwtf__punch_connect__get_packed_size(&pc) > sizeof(body)) return GW_ERANGE;
  return send_msg(q, GWTF__MSG_TYPE__MSG_PUNCH_CONNECT, body, gwtf__punch_connect__pack(&pc, body));
}

/* The peer's addresses become our dial attempts (same family as our port;
 * never our own addresses). */
static void take_addrs(punch *q, const Gwtf__PunchConnect *pc) {
  q->peer_nat = (int)pc->nat;
  for (size_t i = 0; i < pc->n_addrs && i < P2P_PUNCH_MAX_ADDRS && q->n_att < P2P_PUNCH_MAX_ADDRS; i++) {
    const Gwtf__PunchAddr *pa = pc->addrs[i];
    size_t l = pa->ip.len;
    if ((l != 4 && l != 16) || pa->port == 0 || pa->port > 65535) continue;
    gw_addr a = {.family = l == 4 ? 4 : 6, .port = (uint16_t)pa->port};
    memcpy(a.ip, pa->ip.data, l);
    if (a.family != q->local.family || ip_unspecified(&a)) continue;
    bool dup = false;
    for (size_t k = 0; k < q->n_my; k++) dup |= gw_addr_eq(&q->my_addrs[k], &a);
    for (size_t k = 0; k < q->n_att; k++) dup |= gw_addr_eq(&q->att[k].remote, &a);
    if (!dup) q->att[q->n_att++] = (attempt){.remote = a};
  }
}

static void send_marker(punch *q) {
  Gwtf__PunchMigrate pm = GWTF__PUNCH_MIGRATE__INIT;
  pm.id = (ProtobufCBinaryData){P2P_PUNCH_ID_BYTES, q->id};
  pm.session_hash = (ProtobufCBinaryData){32, (uint8_t *)p2p_session_get_info(q->s2)->session_hash};
  uint8_t body[128];
  send_msg(q, GWTF__MSG_TYPE__MSG_PUNCH_MIGRATE, body, gwtf__punch_migrate__pack(&pm, body));
  q->sent_marker = true;
}

/* ---- the timer ---- */

static void schedule(p2p_punch *p);

static void start_dialling(p2p_punch *p, punch *q) {
  uint64_t now = now_ms();
  q->state = P_DIALLING;
  q->deadline_ms = now + p->cfg.timeout_ms;
  for (size_t i = 0; i < q->n_att; i++) q->att[i].next_ms = now;
  char id[GW_ID_SHORT_LEN + 1], addrs[P2P_PUNCH_MAX_ADDRS * (GW_ADDR_STRLEN + 1) + 2] = "", a[GW_ADDR_STRLEN];
  short_id(&q->peer, id);
  for (size_t i = 0; i < q->n_att; i++) {
    gw_addr_format(&q->att[i].remote, a);
    if (i) strcat(addrs, ",");
    strcat(addrs, a);
  }
  char local[GW_ADDR_STRLEN];
  gw_addr_format(&q->local, local);
  GW_INFO(p->log, "nat.punch_started", "peer=\"%s\" from=%s to=%s nat=%s/%s role=%s", id, local,
          q->n_att ? addrs : "-", p2p_punch_nat_name(q->my_nat), p2p_punch_nat_name(q->peer_nat),
          q->chooser ? "chooser" : "follower");
}

static void dial_due(p2p_punch *p, punch *q, uint64_t now) {
  for (size_t i = 0; i < q->n_att; i++) {
    attempt *a = &q->att[i];
    if (a->s || a->accepted || now < a->next_ms || a->tries >= MAX_TRIES_PER_ADDR) continue;
    a->tries++;
    a->next_ms = now + p->cfg.retry_ms;
    int rc = p2p_host_punch_dial(p->h, &q->local, &a->remote, q->preface,
                                 q->chooser ? P2P_INITIATOR : P2P_RESPONDER, &q->peer, &a->s);
    if (rc != 0) a->s = NULL;
  }
}

/* Returns false when q was freed. */
static bool step(p2p_punch *p, punch *q, uint64_t now) {
  switch (q->state) {
  case P_START: {
    if (now < q->due_ms) return true;
    randombytes_buf(q->id, sizeof(q->id));
    p2p_punch_preface(q->id, q->preface);
    if (prepare_local(p, q) != 0) {
      fail(p, q, "no-port");
      return false;
    }
    if (q->n_my == 0) {
      fail(p, q, "no-addrs");
      return false;
    }
    q->connect_sent_ns = gw_clock_mono_ns();
    if (send_connect(q) != 0) {
      fail(p, q, "send");
      return false;
    }
    q->state = P_CONNECTING;
    q->deadline_ms = now + p->cfg.answer_ms;
    return true;
  }
  case P_CONNECTING:
  case P_WAIT_SYNC:
    if (now >= q->deadline_ms) {
      fail(p, q, "no-answer");
      return false;
    }
    return true;
  case P_DIAL_WAIT:
    if (now < q->due_ms) return true;
    start_dialling(p, q);
    /* fall through */
  case P_DIALLING:
    if (now >= q->deadline_ms) {
      fail(p, q, q->n_att ? "timeout" : "no-addrs");
      return false;
    }
    dial_due(p, q, now);
    return true;
  case P_MIGRATING:
    if (now >= q->deadline_ms) {
      /* The other end never answered our marker (or its direct session
       * never came up): back to the relay; what went on the direct
       * session meanwhile is lost with it. */
      if (q->s1 && p2p_session_is_up(q->s1)) p2p_host_punch_switch(p->h, &q->peer, q->s1);
      struct p2p_session *s2 = q->s2;
      q->s2 = NULL;
      if (s2 && p2p_session_is_open(s2)) p2p_session_close(s2, P2P_END_CLOSED, 0, "migrate-timeout");
      fail(p, q, "migrate-timeout");
      return false;
    }
    return true;
  case P_LINGER:
    if (now >= q->deadline_ms) {
      struct p2p_session *s1 = q->s1;
      q->s1 = NULL;
      if (s1) p2p_session_goodbye(s1, GWTF__GOODBYE_REASON__GOODBYE_DIRECT);
      unlink_free(p, q);
      return false;
    }
    return true;
  default: return true;
  }
}

static uint64_t next_due(const p2p_punch *p, const punch *q) {
  (void)p;
  uint64_t d = q->deadline_ms;
  if (q->state == P_START || q->state == P_DIAL_WAIT) d = q->due_ms;
  if (q->state == P_DIALLING)
    for (size_t i = 0; i < q->n_att; i++) {
      const attempt *a = &q->att[i];
      if (!a->s && !a->accepted && a->tries < MAX_TRIES_PER_ADDR && a->next_ms < d) d = a->next_ms;
    }
  return d;
}

static void on_timer(uv_timer_t *t) {
  p2p_punch *p = t->data;
  if (p->stopped) return;
  uint64_t now = now_ms();
  for (punch *q = p->list, *next; q; q = next) {
    next = q->next;
    step(p, q, now);
  }
  schedule(p);
}

static void schedule(p2p_punch *p) {
  if (p->stopped || !p->timer) return;
  uint64_t best = UINT64_MAX, now = now_ms();
  for (punch *q = p->list; q; q = q->next) {
    uint64_t d = next_due(p, q);
    if (d < best) best = d;
  }
  if (best == UINT64_MAX) {
    uv_timer_stop(p->timer);
    return;
  }
  uv_timer_start(p->timer, on_timer, best > now ? best - now : 0, 0);
}

/* ---- API ---- */

int p2p_punch_new(struct p2p_host *h, uv_loop_t *loop, const p2p_punch_config *cfg, const p2p_identity *me,
                  const gw_log *log, p2p_punch **out) {
  p2p_punch *p = calloc(1, sizeof(*p));
  if (!p) return GW_ENOMEM;
  p->timer = malloc(sizeof(*p->timer));
  if (!p->timer) {
    free(p);
    return GW_ENOMEM;
  }
  uv_timer_init(loop, p->timer);
  p->timer->data = p;
  p->h = h;
  p->loop = loop;
  p->cfg = *cfg;
  p->me = me;
  p->log = log;
  *out = p;
  return 0;
}

void p2p_punch_stop(p2p_punch *p) {
  if (!p) return;
  p->stopped = true;
  uv_timer_stop(p->timer);
}

void p2p_punch_free(p2p_punch *p) {
  if (!p) return;
  while (p->list) unlink_free(p, p->list);
  uv_close((uv_handle_t *)p->timer, free_anchor);
  free(p);
}

void p2p_punch_get_stats(const p2p_punch *p, p2p_punch_stats *out) {
  if (p)
    *out = p->stats;
  else
    memset(out, 0, sizeof(*out));
}

static punch *new_punch(p2p_punch *p, const gw_id *peer, struct p2p_session *s1) {
  punch *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  q->peer = *peer;
  q->s1 = s1;
  q->chooser = gw_id_cmp(&p->me->id, peer) < 0;
  q->begun_ms = now_ms();
  q->next = p->list;
  p->list = q;
  p->stats.active++;
  p->stats.started++;
  return q;
}

void p2p_punch_relayed_up(p2p_punch *p, const gw_id *peer, struct p2p_session *s1) {
  if (!p || p->stopped || !p->cfg.enabled) return;
  punch *old = find(p, peer);
  if (old) {
    close_attempts(old, NULL);
    unlink_free(p, old);
  }
  /* The circuit's target starts (it answered the relay's call); the
   * dialler answers. One starter per pair, so the two never cross. */
  if (p2p_session_get_info(s1)->role != P2P_RESPONDER) return;
  punch *q = new_punch(p, peer, s1);
  if (!q) return;
  q->starter = true;
  q->state = P_START;
  q->due_ms = now_ms();
  schedule(p);
}

static bool id_is(const punch *q, ProtobufCBinaryData id) {
  return id.len == P2P_PUNCH_ID_BYTES && memcmp(id.data, q->id, P2P_PUNCH_ID_BYTES) == 0;
}

static attempt *attempt_of(punch *q, const struct p2p_session *s) {
  for (size_t i = 0; i < q->n_att; i++)
    if (q->att[i].s == s) return &q->att[i];
  return NULL;
}

/* Our sends go on s2 from now on; what we had sent on s1 (up to the marker)
 * is read first by the peer. */
static void switch_to(p2p_punch *p, punch *q, struct p2p_session *s2) {
  q->s2 = s2;
  close_attempts(q, s2);
  drop_anchor(q);
  send_marker(q);
  p2p_host_punch_switch(p->h, &q->peer, s2);
  p->stats.direct++;
  char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
  short_id(&q->peer, id);
  gw_addr_format(&p2p_session_get_info(s2)->remote, addr);
  GW_INFO(p->log, "nat.direct", "peer=\"%s\" addr=%s after_ms=%llu nat=%s/%s", id, addr,
          (unsigned long long)(now_ms() - q->begun_ms), p2p_punch_nat_name(q->my_nat),
          p2p_punch_nat_name(q->peer_nat));
}

static void finish_chooser(p2p_punch *p, punch *q) {
  /* The other end read all we sent on S1 (its marker came after ours) and
   * sent its last S1 frame: read S2 now, close S1. */
  if (q->s2) p2p_session_hold_rx(q->s2, false);
  struct p2p_session *s1 = q->s1;
  q->s1 = NULL;
  if (s1) p2p_session_goodbye(s1, GWTF__GOODBYE_REASON__GOODBYE_DIRECT);
  unlink_free(p, q);
}

/* Follower: the chooser's marker and its direct session are both here. */
static void follow(p2p_punch *p, punch *q, struct p2p_session *s2) {
  switch_to(p, q, s2);
  p2p_session_hold_rx(s2, false);
  q->state = P_LINGER;
  q->deadline_ms = now_ms() + LINGER_MS;
}

static struct p2p_session *up_with_hash(punch *q, const uint8_t *hash) {
  for (size_t i = 0; i < q->n_att; i++)
    if (q->att[i].s && q->att[i].up &&
        memcmp(p2p_session_get_info(q->att[i].s)->session_hash, hash, 32) == 0)
      return q->att[i].s;
  return NULL;
}

void p2p_punch_on_message(p2p_punch *p, struct p2p_session *s, const gw_id *peer, const struct p2p_msg *msg) {
  if (!p || p->stopped) return;
  punch *q = find(p, peer);
  switch (msg->type) {
  case GWTF__MSG_TYPE__MSG_PUNCH_CONNECT: {
    Gwtf__PunchConnect *pc = gwtf__punch_connect__unpack(NULL, msg->body_len, msg->body);
    if (!pc) return;
    if (pc->id.len != P2P_PUNCH_ID_BYTES) {
      gwtf__punch_connect__free_unpacked(pc, NULL);
      return;
    }
    if (q && q->starter && q->state == P_CONNECTING && q->s1 == s && id_is(q, pc->id)) {
      /* The answer: half its round trip from now, the peer dials too. */
      uint64_t rtt_ms = (gw_clock_mono_ns() - q->connect_sent_ns) / 1000000;
      take_addrs(q, pc);
      Gwtf__PunchSync ps = GWTF__PUNCH_SYNC__INIT;
      ps.id = (ProtobufCBinaryData){P2P_PUNCH_ID_BYTES, q->id};
      uint8_t body[64];
      send_msg(q, GWTF__MSG_TYPE__MSG_PUNCH_SYNC, body, gwtf__punch_sync__pack(&ps, body));
      q->state = P_DIAL_WAIT;
      q->due_ms = now_ms() + rtt_ms / 2;
    } else if (!q || !q->starter) {
      /* A new punch from the peer, over its current relayed session. */
      if (!p->cfg.enabled || p2p_host_punch_current(p->h, peer) != s || !p2p_session_get_info(s)->relayed) {
        gwtf__punch_connect__free_unpacked(pc, NULL);
        return;
      }
      if (q) {
        close_attempts(q, NULL);
        unlink_free(p, q);
      }
      q = new_punch(p, peer, s);
      if (q) {
        memcpy(q->id, pc->id.data, P2P_PUNCH_ID_BYTES);
        p2p_punch_preface(q->id, q->preface);
        if (prepare_local(p, q) != 0) {
          fail(p, q, "no-port");
        } else {
          take_addrs(q, pc);
          send_connect(q);
          q->state = P_WAIT_SYNC;
          q->deadline_ms = now_ms() + p->cfg.answer_ms;
        }
      }
    }
    gwtf__punch_connect__free_unpacked(pc, NULL);
    break;
  }
  case GWTF__MSG_TYPE__MSG_PUNCH_SYNC: {
    Gwtf__PunchSync *ps = gwtf__punch_sync__unpack(NULL, msg->body_len, msg->body);
    if (!ps) return;
    if (q && !q->starter && q->state == P_WAIT_SYNC && q->s1 == s && id_is(q, ps->id)) start_dialling(p, q);
    gwtf__punch_sync__free_unpacked(ps, NULL);
    if (q && q->state == P_DIALLING) dial_due(p, q, now_ms());
    break;
  }
  case GWTF__MSG_TYPE__MSG_PUNCH_MIGRATE: {
    Gwtf__PunchMigrate *pm = gwtf__punch_migrate__unpack(NULL, msg->body_len, msg->body);
    if (!pm) return;
    bool ok = q && q->s1 == s && id_is(q, pm->id) && pm->session_hash.len == 32 && !q->got_marker;
    if (ok) {
      q->got_marker = true;
      if (q->chooser) {
        if (q->state == P_MIGRATING && q->s2 &&
            memcmp(p2p_session_get_info(q->s2)->session_hash, pm->session_hash.data, 32) == 0) {
          finish_chooser(p, q);
          q = NULL;
        }
      } else {
        memcpy(q->want_hash, pm->session_hash.data, 32);
        q->have_want = true;
        struct p2p_session *s2 = up_with_hash(q, q->want_hash);
        if (s2) {
          follow(p, q, s2);
        } else {
          /* Its direct session is not up on our side yet: wait for it. */
          q->state = P_MIGRATING;
          q->deadline_ms = now_ms() + p->cfg.migrate_ms;
        }
      }
    }
    gwtf__punch_migrate__free_unpacked(pm, NULL);
    break;
  }
  default: break;
  }
  schedule(p);
}

void p2p_punch_on_preface(p2p_punch *p, struct p2p_session *s, const uint8_t *preface) {
  punch *q = NULL;
  if (p && !p->stopped)
    for (q = p->list; q; q = q->next)
      if (q->state >= P_WAIT_SYNC && q->state <= P_DIALLING && q->n_att < MAX_ATTEMPTS &&
          memcmp(q->preface, preface, P2P_PUNCH_PREFACE_BYTES) == 0)
        break;
  if (!q) {
    p2p_session_close(s, P2P_END_CLOSED, GW_EPROTO, "punch-unknown");
    return;
  }
  if (p2p_session_punch_accept(s, q->chooser ? P2P_INITIATOR : P2P_RESPONDER, &q->peer) != 0) return;
  q->att[q->n_att++] = (attempt){.remote = p2p_session_get_info(s)->remote, .s = s, .accepted = true};
}

void p2p_punch_on_up(p2p_punch *p, struct p2p_session *s) {
  const p2p_session_info *info = p2p_session_get_info(s);
  punch *q = p && !p->stopped ? find(p, &info->peer_id) : NULL;
  attempt *a = q ? attempt_of(q, s) : NULL;
  if (!a || (q->state != P_DIALLING && q->state != P_DIAL_WAIT && q->state != P_WAIT_SYNC &&
             !(q->state == P_MIGRATING && !q->chooser))) {
    p2p_session_goodbye(s, GWTF__GOODBYE_REASON__GOODBYE_DUPLICATE);
    return;
  }
  a->up = true;
  if (q->chooser) {
    /* Ours to choose: the first one up. Read it only after the other end's
     * marker; send on it from now on. */
    p2p_session_hold_rx(s, true);
    q->state = P_MIGRATING;
    q->deadline_ms = now_ms() + p->cfg.migrate_ms;
    switch_to(p, q, s);
  } else if (q->have_want && memcmp(info->session_hash, q->want_hash, 32) == 0) {
    follow(p, q, s);
  } else {
    /* Wait for the chooser's marker before reading anything on it. The
     * marker comes behind the chooser's relayed tail: the punch deadline no
     * longer applies, the migration's does. */
    p2p_session_hold_rx(s, true);
    if (q->state != P_MIGRATING) {
      q->state = P_MIGRATING;
      q->deadline_ms = now_ms() + p->cfg.migrate_ms;
    }
  }
  schedule(p);
}

void p2p_punch_on_closed(p2p_punch *p, struct p2p_session *s) {
  if (!p) return;
  for (punch *q = p->list, *next; q; q = next) {
    next = q->next;
    attempt *a = attempt_of(q, s);
    if (a) {
      a->s = NULL;
      a->up = false;
    }
    if (q->s2 == s) {
      q->s2 = NULL;
      if (q->state == P_MIGRATING && !p->stopped) {
        /* The direct session died mid-migration: stay on the relay. */
        if (q->s1 && p2p_session_is_up(q->s1)) p2p_host_punch_switch(p->h, &q->peer, q->s1);
        fail(p, q, "direct-lost");
        continue;
      }
    }
    if (q->s1 == s) {
      q->s1 = NULL;
      /* The relayed session ended: its tail is all there will be. */
      if (q->s2) p2p_session_hold_rx(q->s2, false);
      if (q->state == P_LINGER || (q->state == P_MIGRATING && q->chooser)) {
        unlink_free(p, q);
      } else if (!p->stopped) {
        fail(p, q, "relay-lost");
      } else {
        unlink_free(p, q);
      }
    }
  }
}

void p2p_punch_peer_down(p2p_punch *p, const gw_id *peer) {
  if (!p) return;
  punch *q = find(p, peer);
  if (!q) return;
  close_attempts(q, NULL);
  unlink_free(p, q);
}
