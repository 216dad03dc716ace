/* p2p/pm_req.h — the skeleton of the UDP request clients (PCP in pcp.c,
 * NAT-PMP in natpmp.c) behind the port-mapping interface (portmap.h).
 *
 * A run is a short list of requests to the gateway, one in flight at a
 * time, each resent on the protocol's schedule until answered, all bounded
 * by one deadline:
 *
 *   map():   plan(MAP) requests, deadline cfg.give_up_ms; done() at the end
 *   close(): plan(STOP) requests (the deletions), deadline
 *            cfg.stop_timeout_ms; then the handles close and closed()
 *
 * The protocol file owns the socket and the bytes: it fills in the
 * requests (plan), sends request `cur` (start), and on a matching answer
 * records it (p2p_pm_req_granted / _deleted) and calls p2p_pm_req_next; on
 * a failure p2p_pm_req_failed (from a loop callback) or
 * p2p_pm_req_fail_later (from inside a call: done() always comes from the
 * loop). Everything here runs on the client's loop. */
#ifndef GWTF_P2P_PM_REQ_H
#define GWTF_P2P_PM_REQ_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/portmap.h"

typedef enum p2p_pm_phase {
  P2P_PM_IDLE = 0, /* nothing in flight */
  P2P_PM_MAP = 1,  /* a map() run: ends with done() */
  P2P_PM_STOP = 2, /* close()'s deletions: end with the handles closing */
} p2p_pm_phase;

typedef struct p2p_pm_req p2p_pm_req;

/* What the protocol file does; the ones marked optional may be NULL. */
typedef struct p2p_pm_req_ops {
  /* Fills in the requests of a run in phase ph; returns how many. */
  int (*plan)(p2p_pm_req *r, p2p_pm_phase ph);
  /* Sends request r->cur for the first time. */
  void (*start)(p2p_pm_req *r);
  /* Optional: stops watching the socket (the run paused or ended). */
  void (*quiet)(p2p_pm_req *r);
  /* Optional: uv_close()s the socket's handle with cb, if it has one
   * (counted in open_handles). */
  void (*close_io)(p2p_pm_req *r, uv_close_cb cb);
  /* Optional: after the last handle closed, before the client is freed. */
  void (*release)(p2p_pm_req *r);
} p2p_pm_req_ops;

/* The first member of the protocol's client struct. */
struct p2p_pm_req {
  p2p_pm_client base;
  const p2p_pm_req_ops *ops;
  uv_timer_t resend;       /* the protocol's resend schedule (its to start) */
  uv_timer_t deadline;     /* the run's bound; 0 ms to report a failure from the loop */
  int open_handles;        /* 2 timers, +1 for each handle the protocol opens */
  const char *setup_error; /* the socket could not be set up: every map() fails with this */
  p2p_pm_phase ph;
  int n, cur;              /* requests in the run, the one in flight */
  bool heard;              /* the gateway answered something well-formed */
  p2p_pm_result res;       /* what this map() run got so far */
  const char *fail_why;    /* a failure waiting to be reported from the loop */
  bool fail_absent;
};

/* Fills r in for open() (the protocol's open then sets up its socket).
 * Both timers' data is r. */
void p2p_pm_req_init(p2p_pm_req *r, const p2p_pm_req_ops *ops, uv_loop_t *loop, const p2p_portmap_config *cfg,
                     p2p_pm_done_fn done, void *ud);
/* The protocol's map() and close() (p2p_pm_proto): client is the
 * protocol's client, which starts with its p2p_pm_req. */
void p2p_pm_req_map(void *client);
void p2p_pm_req_close(void *client, bool unmap, p2p_pm_closed_fn closed, void *ud);

/* Request r->cur was answered: send the next one, or end the run. */
void p2p_pm_req_next(p2p_pm_req *r);
/* The run failed (why: a short reason; absent: nobody speaks the
 * protocol here). Call from a loop callback. */
void p2p_pm_req_failed(p2p_pm_req *r, const char *why, bool absent);
/* The same, found inside a call: reported from the loop. */
void p2p_pm_req_fail_later(p2p_pm_req *r, const char *why, bool absent);
/* Stops the timers and, through quiet, the socket watch. */
void p2p_pm_req_quiesce(p2p_pm_req *r);

/* A mapping granted (tcp or udp) at ip4:port for lease seconds: recorded
 * in res (the shortest lease wins) and marked held. */
void p2p_pm_req_granted(p2p_pm_req *r, bool tcp, const uint8_t ip4[4], uint16_t port, uint32_t lease);
/* A mapping confirmed deleted. */
void p2p_pm_req_deleted(p2p_pm_req *r, bool tcp);

#endif
