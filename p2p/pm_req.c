/* The run of requests shared by the PCP and NAT-PMP clients (pm_req.h). */
#include "p2p/pm_req.h"

#include <string.h>

#include "util/err.h"

/* ---- teardown ---- */

static void on_handle_closed(uv_handle_t *h) {
  p2p_pm_req *r = h->data;
  if (--r->open_handles > 0) return;
  if (r->ops->release) r->ops->release(r);
  p2p_pm_client_free(&r->base);
}

void p2p_pm_req_quiesce(p2p_pm_req *r) {
  if (r->ops->quiet) r->ops->quiet(r);
  uv_timer_stop(&r->resend);
  uv_timer_stop(&r->deadline);
}

static void finish_close(p2p_pm_req *r) {
  p2p_pm_req_quiesce(r);
  r->ph = P2P_PM_IDLE;
  /* The socket's handle goes first (NAT-PMP's socket closes in release). */
  if (r->ops->close_io) r->ops->close_io(r, on_handle_closed);
  uv_close((uv_handle_t *)&r->resend, on_handle_closed);
  uv_close((uv_handle_t *)&r->deadline, on_handle_closed);
}

/* ---- the end of a run ---- */

void p2p_pm_req_failed(p2p_pm_req *r, const char *why, bool absent) {
  p2p_pm_phase ph = r->ph;
  p2p_pm_req_quiesce(r);
  if (ph == P2P_PM_STOP) {
    finish_close(r);
    return;
  }
  r->ph = P2P_PM_IDLE;
  if (ph != P2P_PM_MAP || !r->base.done) return;
  r->res.rc = absent ? GW_ENOENT : GW_EPROTO;
  r->res.why = why;
  r->res.absent = absent;
  r->base.done(r->base.ud, &r->res);
}

static void on_deferred_fail(uv_timer_t *t) {
  p2p_pm_req *r = t->data;
  p2p_pm_req_failed(r, r->fail_why, r->fail_absent);
}

void p2p_pm_req_fail_later(p2p_pm_req *r, const char *why, bool absent) {
  p2p_pm_req_quiesce(r);
  r->fail_why = why;
  r->fail_absent = absent;
  uv_timer_start(&r->deadline, on_deferred_fail, 0, 0);
}

static void succeeded(p2p_pm_req *r) {
  p2p_pm_req_quiesce(r);
  if (r->ph == P2P_PM_STOP) {
    finish_close(r);
    return;
  }
  r->ph = P2P_PM_IDLE;
  r->res.rc = 0;
  r->res.why = NULL;
  r->base.done(r->base.ud, &r->res);
}

void p2p_pm_req_next(p2p_pm_req *r) {
  uv_timer_stop(&r->resend);
  if (++r->cur < r->n)
    r->ops->start(r);
  else
    succeeded(r);
}

static void on_deadline(uv_timer_t *t) {
  p2p_pm_req *r = t->data;
  if (r->ph == P2P_PM_STOP)
    finish_close(r);
  else
    p2p_pm_req_failed(r, "no-answer", !r->heard);
}

/* ---- a run ---- */

static void begin(p2p_pm_req *r, p2p_pm_phase ph, uint32_t deadline_ms) {
  r->n = r->ops->plan(r, ph);
  r->ph = ph;
  r->cur = 0;
  if (ph == P2P_PM_MAP) memset(&r->res, 0, sizeof(r->res));
  uv_timer_start(&r->deadline, on_deadline, deadline_ms, 0);
  if (r->n == 0) {
    r->cur = -1;
    p2p_pm_req_next(r);
    return;
  }
  r->ops->start(r);
}

void p2p_pm_req_granted(p2p_pm_req *r, bool tcp, const uint8_t ip4[4], uint16_t port, uint32_t lease) {
  gw_addr *ext = tcp ? &r->res.external_tcp : &r->res.external_udp;
  memset(ext, 0, sizeof(*ext));
  ext->family = 4;
  memcpy(ext->ip, ip4, 4);
  ext->port = port;
  if (r->res.lease_s == 0 || lease < r->res.lease_s) r->res.lease_s = lease;
  if (tcp)
    r->base.tcp_mapped = true;
  else
    r->base.udp_mapped = true;
}

void p2p_pm_req_deleted(p2p_pm_req *r, bool tcp) {
  if (tcp)
    r->base.tcp_mapped = false;
  else
    r->base.udp_mapped = false;
}

/* ---- the interface ---- */

void p2p_pm_req_init(p2p_pm_req *r, const p2p_pm_req_ops *ops, uv_loop_t *loop, const p2p_portmap_config *cfg,
                     p2p_pm_done_fn done, void *ud) {
  p2p_pm_client_init(&r->base, loop, cfg, done, ud);
  r->ops = ops;
  uv_timer_init(loop, &r->resend);
  uv_timer_init(loop, &r->deadline);
  r->resend.data = r->deadline.data = r;
  r->open_handles = 2;
}

void p2p_pm_req_map(void *client) {
  p2p_pm_req *r = client;
  if (r->setup_error) {
    r->ph = P2P_PM_MAP;
    p2p_pm_req_fail_later(r, r->setup_error, true);
    return;
  }
  begin(r, P2P_PM_MAP, r->base.cfg.give_up_ms);
}

void p2p_pm_req_close(void *client, bool unmap, p2p_pm_closed_fn closed, void *ud) {
  p2p_pm_req *r = client;
  p2p_pm_client *b = &r->base;
  p2p_pm_client_closing(b, closed, ud);
  p2p_pm_req_quiesce(r);
  if (!unmap || r->setup_error || (!b->tcp_mapped && !b->udp_mapped)) {
    if (!unmap) b->tcp_mapped = b->udp_mapped = false; /* not asked to delete: nothing left undone */
    finish_close(r);
    return;
  }
  begin(r, P2P_PM_STOP, b->cfg.stop_timeout_ms);
}
