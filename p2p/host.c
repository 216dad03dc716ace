/* p2p/host.c — see p2p/host.h: peers, the addresses we keep sessions to and
 * their redials, duplicate sessions, pings, the API. Its companions (state
 * in p2p/host_internal.h): host_listen.c accepts, host_reach.c does
 * dial-backs, host_paths.c relay circuits and hole punching. */
#include "p2p/host.h"
#include "p2p/host_internal.h"

#include <sodium.h>
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/resource.h>
#include <unistd.h>
#include <string.h>

#include "p2p/limits.h"
#include "p2p/session.h"
#include "p2p/relay.h"
#include "p2p/sockaddr.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/clock.h"
#include "util/err.h"

/* Housekeeping period: pings, idle checks and redials are due on a tick.
 * Fine-grained enough for second-scale timers, cheap when idle. */
#define TICK_MS (200)
/* RTT smoothing as in TCP's SRTT (RFC 6298): new = 7/8 old + 1/8 sample,
 * and its mean deviation: new = 3/4 old + 1/4 |srtt - sample|. */
#define RTT_ALPHA (0.125)
#define RTT_BETA (0.25)
/* Peers no longer connected are remembered (for "back" and their stats) up
 * to this many; the longest-gone are forgotten first. */
#define PEERS_KEEP (4096)

void p2p_host_config_defaults(p2p_host_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->max_frame = P2P_MAX_FRAME_DEFAULT;
  cfg->max_queue = (size_t)256 << 20;
  cfg->low_water = (size_t)1 << 20;
  cfg->connect_timeout_ms = 5000;
  cfg->handshake_timeout_ms = 5000;
  cfg->goodbye_timeout_ms = 2000;
  cfg->ping_interval_ms = 5000;
  cfg->idle_timeout_ms = 20000;
  cfg->backoff_min_ms = 250;
  cfg->backoff_max_ms = 30000;
  cfg->max_handshakes = 64;
  cfg->max_sessions = 1024;
  cfg->dial_back_timeout_ms = P2P_REACH_DIAL_TIMEOUT_MS;
  cfg->log_rtt = true;
  p2p_limits_config_defaults(&cfg->limits);
  p2p_relay_config_defaults(&cfg->relay);
  p2p_punch_config_defaults(&cfg->punch);
}

/* ---- peers ---- */

peer *host_find_peer(const p2p_host *h, const gw_id *id) {
  for (peer *p = h->peers; p; p = p->next)
    if (gw_id_eq(&p->id, id)) return p;
  return NULL;
}

/* Forgets the peer that has been gone longest, to bound the table. */
static void prune_peers(p2p_host *h) {
  peer **oldest = NULL;
  for (peer **pp = &h->peers; *pp; pp = &(*pp)->next)
    if (!(*pp)->s && !(*pp)->switching && (!oldest || (*pp)->down_since_ms < (*oldest)->down_since_ms))
      oldest = pp;
  if (!oldest) return;
  peer *p = *oldest;
  *oldest = p->next;
  free(p);
  h->n_peers--;
}

static peer *get_peer(p2p_host *h, const gw_id *id) {
  peer *p = host_find_peer(h, id);
  if (p) return p;
  if (h->n_peers >= PEERS_KEEP) prune_peers(h);
  if (!(p = calloc(1, sizeof(*p)))) return NULL;
  p->id = *id;
  p->next = h->peers;
  h->peers = p;
  h->n_peers++;
  return p;
}


/* A new connection joins the host's list (counted against max_sessions). */
void host_conn_link(p2p_host *h, conn *c) {
  c->next = h->conns;
  h->conns = c;
  h->n_conns++;
}

/* ---- peer up / down ---- */

void host_apply_links(p2p_host *h, peer *p, p2p_session *s) {
  if (!h->cfg.links) return;
  p2p_link_params lp;
  p2p_links_lookup(h->cfg.links, &h->cfg.me->id, &h->bound, &p->id, &p->addr, &lp);
  p2p_session_set_link(s, &lp);
  char peer_s[GW_ID_SHORT_LEN + 1], lps[96];
  gw_id_to_short(&p->id, peer_s);
  p2p_link_params_format(&lp, lps, sizeof(lps));
  const char *from = p2p_links_region(h->cfg.links, &h->cfg.me->id, &h->bound);
  const char *to = p2p_links_region(h->cfg.links, &p->id, &p->addr);
  GW_INFO(h->cfg.log, "link.emulated", "peer=\"%s\" from=%s to=%s %s", peer_s, from ? from : "-", to ? to : "-", lps);
}

static void peer_went_down(p2p_host *h, peer *p, p2p_down_reason reason, const char *why) {
  char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
  gw_id_to_short(&p->id, id);
  gw_addr_format(&p->addr, addr);
  uint64_t now = host_now_ms();
  p->switching = false;
  p->down_since_ms = now;
  if (why && strcmp(why, "disconnected") == 0)
    GW_INFO(h->cfg.log, "peer.disconnected", "peer=\"%s\" addr=%s up_ms=%llu", id, addr,
            (unsigned long long)(now - p->up_since_ms));
  else if (reason == P2P_DOWN_LEFT)
    GW_INFO(h->cfg.log, "peer.left", "peer=\"%s\" addr=%s up_ms=%llu", id, addr,
            (unsigned long long)(now - p->up_since_ms));
  else
    GW_WARN(h->cfg.log, "peer.lost", "peer=\"%s\" addr=%s reason=%s up_ms=%llu", id, addr, why ? why : "-",
            (unsigned long long)(now - p->up_since_ms));
  host_schedule_redial(h, &p->id);
  if (h->relay) p2p_relay_on_peer_down(h->relay, &p->id);
  if (h->punch) p2p_punch_peer_down(h->punch, &p->id);
  if (h->reach) p2p_reach_peer_down(h->reach, &p->id, now);
  if (h->cbs.peer_down) h->cbs.peer_down(h->cbs.ud, &p->id, reason);
}

static void become_current(p2p_host *h, peer *p, p2p_session *s) {
  const p2p_session_info *info = p2p_session_get_info(s);
  uint64_t now = host_now_ms();
  p->s = s;
  p->addr = info->listen.family ? info->listen : info->remote;
  p->next_ping_ms = now; /* a first RTT sample right away */
  host_apply_links(h, p, s);
  if (p->switching) { /* the duplicate that won has arrived: nothing changed for the upper layers */
    p->switching = false;
    return;
  }
  bool back = p->ever_up;
  p->ever_up = true;
  p->up_since_ms = now;
  char id[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN], sess[9];
  gw_id_to_short(&p->id, id);
  gw_addr_format(&p->addr, addr);
  sodium_bin2hex(sess, sizeof(sess), info->session_hash, 4);
  const char *dir = info->role == P2P_INITIATOR ? "out" : "in";
  if (back)
    GW_INFO(h->cfg.log, "peer.back", "peer=\"%s\" addr=%s dir=%s session=\"%s\" away_ms=%llu", id, addr, dir, sess,
            (unsigned long long)(now - p->down_since_ms));
  else
    GW_INFO(h->cfg.log, "peer.connected", "peer=\"%s\" addr=%s dir=%s session=\"%s\" agent=%s%s", id, addr, dir,
            sess, info->agent[0] ? info->agent : "-", info->relayed ? " via=relay" : "");
  /* Over a relay the peer sees the relay, not us: no word on our address. */
  if (h->reach) p2p_reach_peer_up(h->reach, &p->id, info->relayed ? NULL : &info->observed, now);
  if (h->punch && info->relayed) p2p_punch_relayed_up(h->punch, &p->id, s);
  if (h->cbs.peer_up) {
    gw_peer gp = {.id = p->id, .addr = p->addr};
    h->cbs.peer_up(h->cbs.ud, &gp, back);
  }
}

/* Both sides apply the same rule to the same pair of sessions, so both
 * keep the same one: a direct session over a relayed one (the relay's hop
 * and limits cost); else the session dialled by the lower node ID; when one
 * node dialled both, the newer (the older is most likely half-open). */
static bool newer_wins(const p2p_host *h, const p2p_session_info *nw, const p2p_session_info *old) {
  if (nw->relayed != old->relayed) return !nw->relayed;
  const gw_id *a = nw->role == P2P_INITIATOR ? &h->cfg.me->id : &nw->peer_id;
  const gw_id *b = old->role == P2P_INITIATOR ? &h->cfg.me->id : &old->peer_id;
  int c = gw_id_cmp(a, b);
  return c == 0 || c < 0;
}

static void resolve_duplicate(p2p_host *h, peer *p, p2p_session *nw) {
  p2p_session *old = p->s;
  const p2p_session_info *ni = p2p_session_get_info(nw), *oi = p2p_session_get_info(old);
  if (ni->instance != oi->instance) {
    /* The peer restarted and we had not noticed yet: the old session is
     * dead on its side. Tell the upper layers it was lost, then back. */
    p2p_session_close(old, P2P_END_CLOSED, 0, "replaced");
    p->s = NULL;
    peer_went_down(h, p, P2P_DOWN_LOST, "restarted");
    become_current(h, p, nw);
    return;
  }
  bool nw_wins = newer_wins(h, ni, oi);
  p2p_session *loser = nw_wins ? old : nw;
  if (nw_wins) {
    p->s = nw;
    host_apply_links(h, p, nw);
    /* Two circuits that crossed (both ends dialled through relays at the
     * same moment): the punch begun on the one that loses would fail with
     * it ("relay-lost") and none would start on the one kept, which then
     * stayed relayed for good. The punch moves to the winner; its
     * responder starts it, as for any relayed session. */
    if (h->punch && ni->relayed && oi->relayed) p2p_punch_relayed_up(h->punch, &p->id, nw);
  }
  char id[GW_ID_SHORT_LEN + 1];
  gw_id_to_short(&p->id, id);
  GW_DEBUG(h->cfg.log, "session.duplicate", "peer=\"%s\" kept=%s", id, nw_wins ? "new" : "old");
  p2p_session_goodbye(loser, GWTF__GOODBYE_REASON__GOODBYE_DUPLICATE);
}

/* ---- session callbacks ---- */

/* An inbound connection left its handshake (up, or became a relay leg). */
void host_handshake_over(p2p_host *h, conn *c) {
  if (!c->handshaking_in) return;
  c->handshaking_in = false;
  h->handshakes--;
  if (c->counted) p2p_limits_handshake_done(h->limits, &c->from);
}

static void on_session_up(p2p_session *s) {
  conn *c = host_conn_of(s);
  p2p_host *h = c->h;
  const p2p_session_info *info = p2p_session_get_info(s);
  host_handshake_over(h, c);
  if (c->t) {
    c->t->learned = info->peer_id;
    c->t->failures = 0;
    c->t->dialing = NULL;
    c->t = NULL;
  }
  if (h->closing) return;
  if (c->probe_out) {
    host_probe_done(h, c, true);
    p2p_session_goodbye(s, GWTF__GOODBYE_REASON__GOODBYE_DIAL_BACK);
    return;
  }
  if (info->dial_back_nonce) {
    /* A dial-back: it proves we are reachable if we asked this peer for it
     * in the current round; either way it is closed, and it never touches
     * the peer's real session (no duplicate tie-break, no peer_up). */
    c->probe_in = true;
    bool ours = h->reach && p2p_reach_on_probe(h->reach, &info->peer_id, info->dial_back_nonce, host_now_ms());
    char id[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&info->peer_id, id);
    GW_DEBUG(h->cfg.log, "nat.dial_back_in", "peer=\"%s\" expected=%d", id, (int)ours);
    p2p_session_goodbye(s, GWTF__GOODBYE_REASON__GOODBYE_DIAL_BACK);
    return;
  }
  if (c->punch) { /* a punched connection: p2p/punch.c decides whether it replaces the relayed session */
    p2p_punch_on_up(h->punch, s);
    return;
  }
  peer *p = get_peer(h, &info->peer_id);
  if (!p) {
    p2p_session_close(s, P2P_END_CLOSED, GW_ENOMEM, "out-of-memory");
    return;
  }
  if (p->s && p->s != s)
    resolve_duplicate(h, p, s);
  else
    become_current(h, p, s);
}

static void send_pong(p2p_session *s, const p2p_msg *msg) {
  Gwtf__Ping *ping = gwtf__ping__unpack(NULL, msg->body_len, msg->body);
  if (!ping) return; /* a malformed ping is just not answered */
  Gwtf__Pong pong = GWTF__PONG__INIT;
  pong.nonce = ping->nonce;
  pong.echo_sent_ns = ping->sent_ns;
  gwtf__ping__free_unpacked(ping, NULL);
  uint8_t body[32];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_PONG, .body = body, .body_len = gwtf__pong__pack(&pong, body)};
  p2p_session_send(s, &m);
}

static void got_pong(p2p_host *h, peer *p, const p2p_msg *msg) {
  Gwtf__Pong *pong = gwtf__pong__unpack(NULL, msg->body_len, msg->body);
  if (!pong) return;
  uint64_t now = gw_clock_mono_ns();
  /* Only the answer to our latest ping counts; it echoes our own clock. */
  bool ok = pong->nonce == p->ping_nonce && pong->echo_sent_ns <= now && pong->echo_sent_ns > 0;
  double rtt = ok ? (double)(now - pong->echo_sent_ns) / 1e6 : 0;
  gwtf__pong__free_unpacked(pong, NULL);
  if (!ok) return;
  p->rtt_last_ms = rtt;
  /* RFC 6298 2.2-2.3: the deviation is updated with the old srtt */
  p->rttvar_ms = p->rtt_samples ? (1 - RTT_BETA) * p->rttvar_ms + RTT_BETA * fabs(p->srtt_ms - rtt) : rtt / 2;
  p->srtt_ms = p->rtt_samples ? (1 - RTT_ALPHA) * p->srtt_ms + RTT_ALPHA * rtt : rtt;
  if (!p->rtt_samples || rtt < p->rtt_min_ms) p->rtt_min_ms = rtt;
  p->rtt_samples++;
  if (h->cfg.log_rtt) {
    char id[GW_ID_SHORT_LEN + 1];
    gw_id_to_short(&p->id, id);
    GW_INFO(h->cfg.log, "peer.rtt", "peer=\"%s\" rtt_ms=%.3f srtt_ms=%.3f min_ms=%.3f", id, rtt, p->srtt_ms,
            p->rtt_min_ms);
  }
}

static void on_session_message(p2p_session *s, p2p_msg *msg) {
  conn *c = host_conn_of(s);
  p2p_host *h = c->h;
  const gw_id *from = &p2p_session_get_info(s)->peer_id;
  if (h->closing || c->probe_out || c->probe_in || c->punch) return; /* a dial-back carries nothing */
  switch (msg->type) {
  case GWTF__MSG_TYPE__MSG_PING: send_pong(s, msg); return;
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVE:
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVED:
  case GWTF__MSG_TYPE__MSG_RELAY_INCOMING: {
    peer *p = host_find_peer(h, from);
    if (p && p->s == s && h->relay) p2p_relay_on_message(h->relay, from, msg);
    return;
  }
  case GWTF__MSG_TYPE__MSG_DIAL_BACK: {
    peer *p = host_find_peer(h, from);
    if (p && p->s == s) host_serve_dial_back(h, s, msg);
    return;
  }
  case GWTF__MSG_TYPE__MSG_DIAL_BACK_RESULT: {
    peer *p = host_find_peer(h, from);
    if (p && p->s == s) host_got_dial_back_result(h, from, msg);
    return;
  }
  case GWTF__MSG_TYPE__MSG_PUNCH_CONNECT:
  case GWTF__MSG_TYPE__MSG_PUNCH_SYNC:
  case GWTF__MSG_TYPE__MSG_PUNCH_MIGRATE:
    if (h->punch) p2p_punch_on_message(h->punch, s, from, msg);
    return;
  case GWTF__MSG_TYPE__MSG_PONG: {
    peer *p = host_find_peer(h, from);
    if (p && p->s == s) got_pong(h, p, msg);
    return;
  }
  default:
    if (h->cbs.message) h->cbs.message(h->cbs.ud, from, msg);
  }
}

static void on_session_drained(p2p_session *s) {
  conn *c = host_conn_of(s);
  p2p_host *h = c->h;
  if (p2p_session_is_pipe(s)) { /* a relay leg */
    if (!h->closing && h->relay) p2p_relay_on_pipe_drained(h->relay, s);
    return;
  }
  const gw_id *id = &p2p_session_get_info(s)->peer_id;
  peer *p = host_find_peer(h, id);
  if (!h->closing && p && p->s == s && h->cbs.writable) h->cbs.writable(h->cbs.ud, id);
}

static void unlink_conn(p2p_host *h, conn *c) {
  for (conn **pp = &h->conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      h->n_conns--;
      return;
    }
}

static void maybe_finish(p2p_host *h);

static void on_session_closed(p2p_session *s, p2p_end end, int err, const char *why) {
  conn *c = host_conn_of(s);
  if (c->refused) { /* the host may be gone already: touch nothing of it */
    free(c);
    return;
  }
  p2p_host *h = c->h;
  unlink_conn(h, c);
  if (c->handshaking_in) h->handshakes--;
  if (c->counted) p2p_limits_release(h->limits, &c->from, c->handshaking_in);
  if (p2p_session_is_pipe(s) && h->relay) p2p_relay_on_pipe_closed(h->relay, s, why);
  if (c->probe_out && !c->probe_reported) host_probe_done(h, c, false);
  if (h->punch) p2p_punch_on_closed(h->punch, s);
  if (h->closing) {
    free(c);
    maybe_finish(h);
    return;
  }
  if (c->probe_out || c->probe_in || c->punch) {
    free(c);
    return;
  }
  if (c->t) {
    c->t->dialing = NULL;
    host_dial_failed(h, c->t, err, why);
  }
  const p2p_session_info *info = p2p_session_get_info(s);
  peer *p = gw_id_is_zero(&info->peer_id) ? NULL : host_find_peer(h, &info->peer_id);
  if (p && p->s == s) {
    p->s = NULL;
    if (end == P2P_END_LEFT && p2p_session_goodbye_reason(s) == GWTF__GOODBYE_REASON__GOODBYE_DUPLICATE) {
      /* The peer kept another session with us, which is not up on our side
       * yet: wait for it rather than report the peer gone. */
      p->switching = true;
      p->switch_deadline_ms = host_now_ms() + h->cfg.handshake_timeout_ms;
    } else if (end == P2P_END_CLOSED) {
      /* We closed it (p2p_host_disconnect): the peer is fine, just not ours. */
      peer_went_down(h, p, P2P_DOWN_LEFT, "disconnected");
    } else {
      peer_went_down(h, p, end == P2P_END_LEFT ? P2P_DOWN_LEFT : P2P_DOWN_LOST, why);
    }
  }
  free(c);
}

const p2p_session_cbs host_session_cbs = {
    .up = on_session_up,
    .message = on_session_message,
    .drained = on_session_drained,
    .closed = on_session_closed,
    .preface = host_on_session_preface,
    .pipe_data = host_on_session_pipe_data,
    .punch = host_on_session_punch,
};



/* ---- housekeeping ---- */

static void send_ping(peer *p) {
  Gwtf__Ping ping = GWTF__PING__INIT;
  ping.nonce = ++p->ping_nonce;
  ping.sent_ns = gw_clock_mono_ns();
  uint8_t body[32];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_PING, .body = body, .body_len = gwtf__ping__pack(&ping, body)};
  p2p_session_send(p->s, &m);
}

static void check_peer(p2p_host *h, peer *p, uint64_t now) {
  if (p->switching && now >= p->switch_deadline_ms) {
    peer_went_down(h, p, P2P_DOWN_LOST, "duplicate-timeout");
    return;
  }
  if (!p->s || !p2p_session_is_up(p->s)) return;
  p2p_session_stats st;
  p2p_session_get_stats(p->s, &st);
  uint64_t last_rx_ms = st.last_rx_ns / 1000000;
  if (now > last_rx_ms + h->cfg.idle_timeout_ms) {
    p2p_session_close(p->s, P2P_END_LOST, GW_ETIMEDOUT, "idle-timeout");
    return;
  }
  if (h->cfg.ping_interval_ms && now >= p->next_ping_ms) {
    send_ping(p);
    p->next_ping_ms = now + h->cfg.ping_interval_ms;
  }
}

/* Reads RLIMIT_NOFILE, and checks that we can still open a file: out of
 * fds, libuv accepts and closes pending connections itself (its reserve-fd
 * trick) without telling us, so this is where we see it. */
static void read_fd_limit(p2p_host *h) {
  struct rlimit rl;
  h->fd_limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (uint64_t)rl.rlim_cur : 0;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0)
    close(fd);
  else if (errno == EMFILE || errno == ENFILE)
    p2p_limits_hit(h->limits, "fds", NULL, h->fd_limit, host_now_ms());
}

static void on_tick(uv_timer_t *timer) {
  p2p_host *h = timer->data;
  uint64_t now = host_now_ms();
  for (peer *p = h->peers; p && !h->closing; p = p->next) check_peer(h, p, now);
  if (h->closing) return; /* a peer_down callback closed the host */
  for (conn *c = h->conns; c; c = c->next) p2p_session_poll(c->s, now); /* closes only from the loop */
  read_fd_limit(h);
  if (h->relay) p2p_relay_tick(h->relay, now);
  p2p_reach_tick(h->reach, now);
  if (h->reach_report_due) {
    h->reach_report_due = false;
    p2p_reachability r;
    p2p_reach_get(h->reach, &r);
    if (h->cbs.reachability) h->cbs.reachability(h->cbs.ud, &r);
    if (h->closing) return;
  }
  for (target *t = h->targets, *next; t; t = next) {
    next = t->next; /* a failed dial may free t (dialling ourselves) */
    if (!t->dialing && now >= t->next_ms && !host_target_satisfied(h, t)) host_dial(h, t);
  }
}

/* ---- closing ---- */

static void on_handle_closed(uv_handle_t *hd) {
  p2p_host *h = hd->data;
  h->open_handles--;
  maybe_finish(h);
}

static void maybe_finish(p2p_host *h) {
  if (!h->closing || h->open_handles > 0 || h->conns) return;
  for (peer *p = h->peers, *next; p; p = next) {
    next = p->next;
    free(p);
  }
  for (target *t = h->targets, *next; t; t = next) {
    next = t->next;
    free(t);
  }
  p2p_reach_free(h->reach);
  p2p_limits_free(h->limits);
  p2p_relay_free(h->relay);
  p2p_punch_free(h->punch);
  void (*done)(void *) = h->done;
  void *ud = h->done_ud;
  free(h);
  if (done) done(ud);
}

/* ---- API ---- */

int p2p_host_new(uv_loop_t *loop, const p2p_host_config *cfg, const p2p_host_cbs *cbs, p2p_host **out) {
  *out = NULL;
  if (!cfg->me || cfg->max_frame < P2P_MAX_FRAME_MIN) return GW_EINVAL;
  p2p_host *h = calloc(1, sizeof(*h));
  if (!h) return GW_ENOMEM;
  h->loop = loop;
  h->cfg = *cfg;
  /* A budget smaller than one frame would stall the largest frame for good. */
  size_t one = cfg->max_frame + P2P_HEAD_MAX + 4096;
  if (h->cfg.limits.rx_budget && h->cfg.limits.rx_budget < one) h->cfg.limits.rx_budget = one;
  if (p2p_limits_new(&h->cfg.limits, cfg->log, &h->limits) != 0) {
    free(h);
    return GW_ENOMEM;
  }
  if (cbs) h->cbs = *cbs;
  uint64_t instance;
  randombytes_buf(&instance, sizeof(instance));
  h->scfg = (p2p_session_config){
      .me = cfg->me,
      .max_frame = cfg->max_frame,
      .connect_timeout_ms = cfg->connect_timeout_ms,
      .handshake_timeout_ms = cfg->handshake_timeout_ms,
      .goodbye_timeout_ms = cfg->goodbye_timeout_ms,
      .low_water = cfg->low_water,
      .instance = instance,
      .agent = cfg->agent,
      .log = cfg->log,
      .limits = h->limits,
  };
  uv_timer_init(loop, &h->tick);
  h->tick.data = h;
  h->open_handles = 1;
  int rc = cfg->listen.family ? host_start_listening(h) : 0, rc_new;
  if (rc != 0) {
    /* The handles close asynchronously; the loop frees the host. */
    h->closing = true;
    if (h->listening) uv_close((uv_handle_t *)&h->listener, on_handle_closed);
    uv_close((uv_handle_t *)&h->tick, on_handle_closed);
    return rc;
  }
  h->scfg.listen_port = h->bound.port;
  if (p2p_relay_new(h, &cfg->relay, h->listening, cfg->log, &h->relay) != 0) h->relay = NULL; /* runs without */
  if (cfg->punch.enabled && p2p_punch_new(h, loop, &cfg->punch, cfg->me, cfg->log, &h->punch) != 0)
    h->punch = NULL; /* runs without */
  p2p_reach_config rcfg = {.port = h->bound.port, .log = cfg->log};
  p2p_reach_io io = {.ud = h, .request = host_reach_request, .decided = host_reach_decided};
  /* A peer's answer waits for its dial-back's connect and handshake. */
  if (cfg->dial_back_timeout_ms && cfg->dial_back_timeout_ms < 600000)
    rcfg.result_timeout_ms = 2 * cfg->dial_back_timeout_ms + 3000;
  if ((rc_new = p2p_reach_new(&rcfg, &io, &h->reach)) != 0) {
    h->closing = true;
    if (h->listening) uv_close((uv_handle_t *)&h->listener, on_handle_closed);
    uv_close((uv_handle_t *)&h->tick, on_handle_closed);
    return rc_new;
  }
  read_fd_limit(h);
  uv_timer_start(&h->tick, on_tick, TICK_MS, TICK_MS);
  *out = h;
  return 0;
}

gw_addr p2p_host_listen_addr(const p2p_host *h) { return h->bound; }

int p2p_host_disconnect(p2p_host *h, const gw_id *id) {
  for (target *t = h->targets, *next; t; t = next) {
    next = t->next;
    if (host_target_is(t, id)) host_free_target(h, t);
  }
  peer *p = host_find_peer(h, id);
  if (!p || !p->s) return GW_ENOENT;
  p2p_session_goodbye(p->s, GWTF__GOODBYE_REASON__GOODBYE_LEAVING);
  return 0;
}

int p2p_host_send(p2p_host *h, const gw_id *to, const p2p_msg *msg) {
  switch (msg->type) {
  case GWTF__MSG_TYPE__MSG_UNSPECIFIED:
  case GWTF__MSG_TYPE__MSG_PING:
  case GWTF__MSG_TYPE__MSG_PONG:
  case GWTF__MSG_TYPE__MSG_GOODBYE:
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVE:
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVED:
  case GWTF__MSG_TYPE__MSG_RELAY_INCOMING:
  case GWTF__MSG_TYPE__MSG_PUNCH_CONNECT:
  case GWTF__MSG_TYPE__MSG_PUNCH_SYNC:
  case GWTF__MSG_TYPE__MSG_PUNCH_MIGRATE:
  case GWTF__MSG_TYPE__MSG_HELLO: return GW_EINVAL; /* the host's own */
  default: break;
  }
  peer *p = host_find_peer(h, to);
  if (!p || !p->s || h->closing) return GW_ENOENT;
  if (p2p_session_queued(p->s) > h->cfg.max_queue) return GW_EFULL;
  return p2p_session_send(p->s, msg);
}

size_t p2p_host_queued(const p2p_host *h, const gw_id *to) {
  const peer *p = host_find_peer(h, to);
  return p && p->s ? p2p_session_queued(p->s) : 0;
}

int p2p_host_ping(p2p_host *h, const gw_id *id) {
  peer *p = host_find_peer(h, id);
  if (!p || !p->s || !p2p_session_is_up(p->s)) return GW_ENOENT;
  send_ping(p);
  p->next_ping_ms = host_now_ms() + h->cfg.ping_interval_ms;
  return 0;
}

bool p2p_host_is_connected(const p2p_host *h, const gw_id *id) {
  const peer *p = host_find_peer(h, id);
  return p && p->s && p2p_session_is_up(p->s);
}

int p2p_host_peer_stats(const p2p_host *h, const gw_id *id, p2p_peer_stats *out) {
  const peer *p = host_find_peer(h, id);
  memset(out, 0, sizeof(*out));
  if (!p) return GW_ENOENT;
  out->addr = p->addr;
  out->rtt_ms = p->srtt_ms;
  out->rttvar_ms = p->rttvar_ms;
  out->rtt_min_ms = p->rtt_min_ms;
  out->rtt_last_ms = p->rtt_last_ms;
  out->rtt_samples = p->rtt_samples;
  if (!p->s) return 0;
  p2p_session_stats st;
  p2p_session_get_stats(p->s, &st);
  out->connected = p2p_session_is_up(p->s);
  out->relayed = p2p_session_get_info(p->s)->relayed;
  memcpy(out->session_hash, p2p_session_get_info(p->s)->session_hash, sizeof(out->session_hash));
  out->tx_Bps = st.tx_Bps;
  out->rx_Bps = st.rx_Bps;
  out->bytes_tx = st.bytes_tx;
  out->bytes_rx = st.bytes_rx;
  out->frames_tx = st.frames_tx;
  out->frames_rx = st.frames_rx;
  out->queued_bytes = st.queued_bytes;
  out->queued_frames = st.queued_frames;
  out->connected_ms = (gw_clock_mono_ns() - st.up_ns) / 1000000;
  return 0;
}

size_t p2p_host_session_count(const p2p_host *h) { return h->n_conns; }

void p2p_host_limit_counts(const p2p_host *h, const gw_addr *addr, p2p_limit_counts *out) {
  p2p_limits_counts(h->limits, addr, out);
}

void p2p_host_reachability(const p2p_host *h, p2p_reachability *out) { p2p_reach_get(h->reach, out); }

void p2p_host_recheck_reachability(p2p_host *h, const gw_addr *external) {
  gw_addr ext = external ? *external : (gw_addr){0};
  /* A renewal of the same mapping changes nothing. */
  if (h->closing || gw_addr_eq(&ext, &h->reach_external)) return;
  h->reach_external = ext;
  uint16_t port = external && external->port ? external->port : h->bound.port;
  char addr[GW_ADDR_STRLEN] = "-";
  if (external && external->family) gw_addr_format(external, addr);
  GW_INFO(h->cfg.log, "nat.recheck", "external=%s port=%u", addr, (unsigned)port);
  if (port) p2p_reach_recheck(h->reach, port, host_now_ms());
}

int p2p_host_observed_addr(const p2p_host *h, gw_addr *out) { return p2p_reach_observed(h->reach, out); }

size_t p2p_host_peers(const p2p_host *h, gw_peer *out, size_t max) {
  size_t n = 0;
  for (const peer *p = h->peers; p; p = p->next) {
    if (!p->s || !p2p_session_is_up(p->s)) continue;
    if (n < max) out[n] = (gw_peer){.id = p->id, .addr = p->addr};
    n++;
  }
  return n;
}

void p2p_host_close(p2p_host *h, void (*done)(void *ud), void *ud) {
  if (h->closing) return;
  h->closing = true;
  h->done = done;
  h->done_ud = ud;
  p2p_punch_stop(h->punch);
  if (h->listening) uv_close((uv_handle_t *)&h->listener, on_handle_closed);
  uv_close((uv_handle_t *)&h->tick, on_handle_closed);
  while (h->targets) host_free_target(h, h->targets);
  for (conn *c = h->conns; c; c = c->next) {
    if (p2p_session_is_up(c->s))
      p2p_session_goodbye(c->s, GWTF__GOODBYE_REASON__GOODBYE_LEAVING);
    else
      p2p_session_close(c->s, P2P_END_CLOSED, 0, "shutdown");
  }
}
