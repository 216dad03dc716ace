/* p2p/host_listen.c — the host's listening socket: binding it (shared with
 * hole punching), accepting, and turning away what is over the caps: the
 * global handshake and session caps, the file descriptors left, and the
 * per-IP and per-subnet limits (p2p/limits.h). */
#include <stdlib.h>

#include "p2p/host_internal.h"
#include "p2p/sockaddr.h"
#include "util/err.h"

#define LISTEN_BACKLOG (128)

static void free_handle(uv_handle_t *hd) { free(hd); }

/* Over a global cap: accept and close at once, so the listener keeps
 * accepting; one limit.hit line a second says so. */
static void refuse(p2p_host *h, uv_stream_t *server, const char *kind, uint64_t count) {
  uv_tcp_t *tmp = malloc(sizeof(*tmp));
  if (!tmp) return;
  uv_tcp_init(h->loop, tmp);
  gw_addr a = {0};
  if (uv_accept(server, (uv_stream_t *)tmp) == 0) {
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(tmp, (struct sockaddr *)&ss, &len) != 0 ||
        p2p_addr_from_sockaddr((struct sockaddr *)&ss, &a) != 0)
      a.family = 0;
  }
  p2p_limits_hit(h->limits, kind, &a, count, host_now_ms());
  uv_close((uv_handle_t *)tmp, free_handle);
}

static void on_connection(uv_stream_t *server, int status) {
  p2p_host *h = server->data;
  if (status < 0) {
    /* Out of file descriptors: libuv has accepted and closed what was
     * pending (its reserve-fd trick) and reads on; we only say so. */
    bool fds = status == UV_EMFILE || status == UV_ENFILE;
    p2p_limits_hit(h->limits, fds ? "fds" : "accept-failed", NULL, (uint64_t)h->n_conns, host_now_ms());
    return;
  }
  if (h->closing) return;
  if (h->handshakes >= h->cfg.max_handshakes) return refuse(h, server, "handshakes-total", h->handshakes);
  if (h->n_conns >= h->cfg.max_sessions) return refuse(h, server, "sessions-total", h->n_conns);
  conn *c = calloc(1, sizeof(*c));
  if (!c) return refuse(h, server, "out-of-memory", h->n_conns);
  c->h = h;
  int rc = p2p_session_accept(server, &h->scfg, &host_session_cbs, c, &c->s);
  if (rc != 0) {
    free(c);
    p2p_limits_hit(h->limits, rc == UV_EMFILE || rc == UV_ENFILE ? "fds" : "accept-failed", NULL,
                   (uint64_t)h->n_conns, host_now_ms());
    return;
  }
  /* Per IP and subnet: refused connections close at once, log nothing
   * but the (rate-limited) limit.hit, and count for nothing. */
  const char *kind;
  c->from = p2p_session_get_info(c->s)->remote;
  int fd = p2p_session_fileno(c->s);
  if (h->fd_limit && fd >= 0 && (uint64_t)fd + P2P_LIMIT_FD_RESERVE >= h->fd_limit) {
    p2p_limits_hit(h->limits, "fds", &c->from, (uint64_t)fd, host_now_ms());
    c->refused = true;
    p2p_session_close(c->s, P2P_END_CLOSED, GW_EFULL, "fds");
    return;
  }
  if (p2p_limits_admit(h->limits, &c->from, host_now_ms(), &kind) != 0) {
    c->refused = true;
    p2p_session_close(c->s, P2P_END_CLOSED, GW_EFULL, kind);
    return;
  }
  c->counted = true;
  c->handshaking_in = true;
  h->handshakes++;
  host_conn_link(h, c);
}

int host_start_listening(p2p_host *h) {
  struct sockaddr_storage ss;
  int rc = p2p_addr_to_sockaddr(&h->cfg.listen, &ss);
  if (rc != 0) return rc;
  if ((rc = uv_tcp_init(h->loop, &h->listener)) != 0) return rc;
  h->listener.data = h;
  h->listening = true;
  h->open_handles++;
  if ((rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&ss, 0)) != 0) return rc;
  if ((rc = uv_listen((uv_stream_t *)&h->listener, LISTEN_BACKLOG, on_connection)) != 0) return rc;
  if (h->cfg.punch.enabled && (rc = p2p_punch_share_port(&h->listener)) != 0) return rc; /* punches dial from it */
  int len = sizeof(ss);
  if ((rc = uv_tcp_getsockname(&h->listener, (struct sockaddr *)&ss, &len)) != 0) return rc;
  return p2p_addr_from_sockaddr((struct sockaddr *)&ss, &h->bound);
}
