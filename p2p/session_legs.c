/* p2p/session_legs.c — the uses of a session besides the ordinary one:
 * relay legs (p2p/relay.h: a pipe on the relay, or a circuit's end that
 * waits for the relay's status before its handshake), punched connections
 * (p2p/punch.h: a preface both ways, then the handshake in the roles the
 * punch code gave), and holding reads (while a relayed session migrates
 * to a punched one, or a payload waits for the budget). Apart from
 * session.c so that each file holds one job; the state both use is in
 * p2p/session_internal.h. */
#include "p2p/session.h"
#include "p2p/session_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "p2p/punch.h"
#include "p2p/relay.h"
#include "p2p/sockaddr.h"
#include "util/clock.h"
#include "util/err.h"

/* ---- relay legs (p2p/relay.h) ----
 *
 * Two uses of a session besides the ordinary one. On the relay, an
 * accepted connection whose first 40 bytes are a relay preface becomes a
 * pipe: no keys, no frames, raw bytes handed to the relay code and written
 * as they come. On the two ends of a circuit, a dial "via" a relay first
 * sends its preface and waits for the relay's status, and only then runs
 * the ordinary handshake, as initiator (the dialler) or responder (the
 * target connecting back). */

bool session_relay_preface(p2p_session *s, const uint8_t *rec) {
  if (s->via || s->punch || s->info.role != P2P_RESPONDER || !s->cbs.preface || !p2p_relay_is_preface(rec))
    return false;
  s->state = S_PIPE;
  s->pipe = true;
  uv_timer_stop(&s->timer); /* the relay code owns this connection's deadlines now */
  s->cbs.preface(s, rec);
  return true;
}

void session_relay_connected(p2p_session *s) {
  s->state = S_PREFACE;
  p2p_rx_expect_raw(&s->rx, P2P_RELAY_STATUS_BYTES);
  int rc = session_enqueue_copy(s, s->preface, sizeof(s->preface));
  /* The relay may wait for the target to connect back before it answers. */
  if (rc == 0) rc = session_start_reading(s, s->cfg.connect_timeout_ms + s->cfg.handshake_timeout_ms);
  if (rc != 0) session_close_now(s, P2P_END_LOST, rc, "connect");
}

/* The handshake over a relay circuit or a punched connection, in the role
 * the session was given (TCP's roles say nothing there). */
static void handshake_in_role(p2p_session *s) {
  s->state = S_HANDSHAKE;
  if (s->info.role == P2P_INITIATOR) {
    uint8_t msg1[P2P_HS_MSG1_BYTES];
    p2p_hs_start(&s->hs, msg1);
    int rc = session_enqueue_copy(s, msg1, sizeof(msg1));
    if (rc != 0) {
      session_close_now(s, P2P_END_LOST, rc, "out-of-memory");
      return;
    }
  }
  p2p_rx_expect_raw(&s->rx, p2p_hs_want(&s->hs));
}

void session_got_relay_status(p2p_session *s, const uint8_t *rec) {
  int status = p2p_relay_status_parse(rec);
  if (status < 0) {
    session_close_now(s, P2P_END_LOST, GW_EPROTO, "relay-bad-status");
    return;
  }
  if (status != 0) {
    session_close_now(s, P2P_END_LOST, GW_EPERM, p2p_relay_status_name(status));
    return;
  }
  uv_timer_start(&s->timer, session_on_timer, s->cfg.handshake_timeout_ms, 0);
  handshake_in_role(s);
}

void session_pipe_read(p2p_session *s, ssize_t nread, const uv_buf_t *buf) {
  if (nread > 0 && s->cbs.pipe_data) {
    s->stats.bytes_rx += (uint64_t)nread;
    s->stats.last_rx_ns = gw_clock_mono_ns();
    s->cbs.pipe_data(s, (uint8_t *)buf->base, (size_t)nread); /* the buffer is the callee's now */
    return;
  }
  free(buf->base);
  if (nread == UV_ENOBUFS)
    session_close_now(s, P2P_END_LOST, GW_ENOMEM, "out-of-memory");
  else if (nread < 0)
    session_on_eof(s, (int)nread);
}

void session_pipe_leftover(p2p_session *s, const uint8_t *data, size_t n) {
  if (n == 0 || !s->cbs.pipe_data) return;
  uint8_t *copy = malloc(n);
  if (!copy) {
    session_close_now(s, P2P_END_LOST, GW_ENOMEM, "out-of-memory");
    return;
  }
  memcpy(copy, data, n);
  s->stats.bytes_rx += n;
  s->cbs.pipe_data(s, copy, n);
}

int p2p_session_dial_via(uv_loop_t *loop, const gw_addr *relay, const uint8_t *preface,
                         p2p_role role, const gw_id *expect, const p2p_session_config *cfg, const p2p_session_cbs *cbs,
                         void *ud, p2p_session **out) {
  struct sockaddr_storage ss;
  if (p2p_addr_to_sockaddr(relay, &ss) != 0) return GW_EINVAL;
  p2p_session *s;
  int rc = session_new(loop, cfg, cbs, ud, role, &s);
  if (rc != 0) return rc;
  s->state = S_CONNECTING;
  s->via = true;
  s->info.relayed = true;
  s->info.remote = *relay;
  memcpy(s->preface, preface, sizeof(s->preface));
  gw_addr_format(relay, s->addr_str);
  p2p_hs_init(&s->hs, role, cfg->me, role == P2P_INITIATOR ? expect : NULL);
  return session_start_connect(s, (const struct sockaddr *)&ss, cfg, out);
}

int p2p_session_pipe_write(p2p_session *s, uint8_t *buf, size_t len) {
  if (s->state != S_PIPE || s->finishing) {
    free(buf);
    return GW_ECLOSED;
  }
  return session_enqueue(s, buf, len, false);
}

void p2p_session_pipe_end(p2p_session *s) {
  if (s->state != S_PIPE || s->finishing) return;
  s->finishing = true;
  uv_timer_start(&s->timer, session_on_timer, s->cfg.goodbye_timeout_ms, 0);
  p2p_session_pipe_pause(s, false); /* read on, to see the other side's EOF */
  if (!s->txq_head) {
    s->shut = true;
    if (uv_shutdown(&s->shutdown_req, (uv_stream_t *)&s->tcp, session_on_shutdown) != 0)
      session_close_now(s, P2P_END_CLOSED, 0, "closed");
  }
}

void p2p_session_pipe_pause(p2p_session *s, bool pause) {
  if (s->state != S_PIPE || pause == s->pipe_paused) return;
  s->pipe_paused = pause;
  int rc = pause ? uv_read_stop((uv_stream_t *)&s->tcp)
                 : uv_read_start((uv_stream_t *)&s->tcp, session_on_alloc, session_on_read);
  if (rc != 0) session_close_now(s, P2P_END_LOST, rc, "read");
}

bool p2p_session_is_pipe(const p2p_session *s) { return s->pipe; }

/* ---- punched connections (p2p/punch.h) ----
 *
 * Both ends dial each other from their listen (or punch) port at the same
 * moment. What results is one TCP connection that either both ends see as
 * their own connect (simultaneous open) or one end accepted on its
 * listener. Either way each end sends the same 40-byte preface (the punch's
 * id) and reads the other's, then the handshake runs in the roles the punch
 * code decided (the lower node ID initiates), not in the roles TCP gave. */

void session_punch_connected(p2p_session *s) {
  s->state = S_PUNCH;
  p2p_rx_expect_raw(&s->rx, P2P_PUNCH_PREFACE_BYTES);
  int rc = session_enqueue_copy(s, s->preface, sizeof(s->preface));
  if (rc == 0) rc = session_start_reading(s, s->cfg.handshake_timeout_ms);
  if (rc != 0) session_close_now(s, P2P_END_LOST, rc, "connect");
}

void session_got_punch_preface(p2p_session *s, const uint8_t *rec) {
  if (memcmp(rec, s->preface, sizeof(s->preface)) != 0) {
    session_close_now(s, P2P_END_LOST, GW_EPROTO, "punch-preface");
    return;
  }
  handshake_in_role(s);
}

bool session_punch_preface_in(p2p_session *s, const uint8_t *rec) {
  if (s->via || s->punch || s->info.role != P2P_RESPONDER || !s->cbs.punch || !p2p_punch_is_preface(rec))
    return false;
  s->punch = true;
  memcpy(s->preface, rec, sizeof(s->preface));
  s->cbs.punch(s, rec); /* p2p_session_punch_accept, or a close */
  return true;
}

int p2p_session_punch_accept(p2p_session *s, p2p_role role, const gw_id *expect) {
  if (!s->punch || s->state != S_HANDSHAKE) return GW_ECLOSED;
  s->info.role = role;
  p2p_hs_wipe(&s->hs);
  p2p_hs_init(&s->hs, role, s->cfg.me, role == P2P_INITIATOR ? expect : NULL);
  int rc = session_enqueue_copy(s, s->preface, sizeof(s->preface));
  if (rc != 0) {
    session_close_now(s, P2P_END_LOST, rc, "out-of-memory");
    return rc;
  }
  handshake_in_role(s);
  return 0;
}

int p2p_session_dial_punch(uv_loop_t *loop, const gw_addr *local, const gw_addr *remote, const uint8_t *preface,
                           p2p_role role, const gw_id *expect, const p2p_session_config *cfg,
                           const p2p_session_cbs *cbs, void *ud, p2p_session **out) {
  struct sockaddr_storage ls, rs;
  if (p2p_addr_to_sockaddr(local, &ls) != 0 || p2p_addr_to_sockaddr(remote, &rs) != 0) return GW_EINVAL;
  p2p_session *s;
  int rc = session_new(loop, cfg, cbs, ud, role, &s);
  if (rc != 0) return rc;
  s->state = S_CONNECTING;
  s->punch = true;
  s->info.remote = *remote;
  memcpy(s->preface, preface, sizeof(s->preface));
  gw_addr_format(remote, s->addr_str);
  p2p_hs_init(&s->hs, role, cfg->me, role == P2P_INITIATOR ? expect : NULL);
  /* The socket shares the port with our listener (or punch anchor). */
  int fd = p2p_punch_socket(local->family);
  if (fd < 0) rc = fd;
  if (rc == 0 && (rc = uv_tcp_open(&s->tcp, fd)) != 0) close(fd);
  if (rc == 0) rc = uv_tcp_bind(&s->tcp, (struct sockaddr *)&ls, 0);
  if (rc != 0) {
    session_discard(s, rc);
    return rc;
  }
  return session_start_connect(s, (const struct sockaddr *)&rs, cfg, out);
}

/* ---- holding reads (the migration from a relay, p2p/punch.h) ---- */

void session_hold_leftover(p2p_session *s, const uint8_t *data, size_t n) {
  uint8_t *nb = realloc(s->held, s->held_len + n);
  if (!nb) {
    session_close_now(s, P2P_END_LOST, GW_ENOMEM, "out-of-memory");
    return;
  }
  memcpy(nb + s->held_len, data, n);
  s->held = nb;
  s->held_len += n;
}

static void on_resume(uv_timer_t *t) {
  p2p_session *s = t->data;
  if (s->state == S_CLOSING || s->rx_held) return;
  uint8_t *buf = s->held;
  size_t n = s->held_len, off = 0;
  s->held = NULL;
  s->held_len = 0;
  uint64_t now = gw_clock_mono_ns();
  while (off < n && s->state != S_CLOSING && !s->rx_held) {
    if (s->rx.kind == P2P_RX_HEAD && s->rx.in_len && s->rx.len_have == 0) s->rx_frame_start_ns = now;
    long used = p2p_rx_feed(&s->rx, buf + off, n - off);
    if (used < 0) {
      session_close_now(s, P2P_END_REJECTED, (int)used, used == GW_ERANGE ? "oversize" : "bad-length");
      break;
    }
    off += (size_t)used;
    if (s->rx.ready) session_got_record(s);
  }
  if (s->rx_held && s->state != S_CLOSING && off < n) session_hold_leftover(s, buf + off, n - off);
  free(buf);
  if (s->state != S_CLOSING) session_rx_sync(s);
  if (s->state != S_CLOSING && !s->rx_held) {
    int rc = uv_read_start((uv_stream_t *)&s->tcp, session_on_alloc, session_on_read);
    if (rc != 0) session_close_now(s, P2P_END_LOST, rc, "read");
  }
}

void p2p_session_hold_rx(p2p_session *s, bool hold) {
  if (s->state == S_CLOSING || s->pipe || hold == s->hold_punch) return;
  s->hold_punch = hold;
  session_rx_hold_update(s);
}

/* Reading stops while anyone holds it (the punch migration, the budget)
 * and resumes, first with what was read past the hold, when nobody does. */
void session_rx_hold_update(p2p_session *s) {
  bool hold = s->hold_punch || s->hold_budget;
  if (s->state == S_CLOSING || hold == s->rx_held) return;
  s->rx_held = hold;
  if (hold) {
    uv_read_stop((uv_stream_t *)&s->tcp);
    return;
  }
  if (!s->resume_ready) {
    uv_timer_init(s->tcp.loop, &s->resume);
    s->resume.data = s;
    s->resume_ready = true;
    s->open_handles++;
  }
  uv_timer_start(&s->resume, on_resume, 0, 0); /* from the loop: callbacks never run inside this call */
}

bool p2p_session_is_punched(const p2p_session *s) { return s->punch; }
