/* p2p/session_internal.h — what p2p/session.c and p2p/session_legs.c share:
 * the session's state and the few steps both call. session.c is the
 * ordinary session (writing, closing, the handshake, frames, the budget,
 * reading, setup, the API); session_legs.c the other uses of one: relay
 * legs (p2p/relay.h), punched connections (p2p/punch.h) and held reads.
 * They call each other where a record, a read or a connect leads from one
 * to the other. Not an API: only these two files include it. */
#ifndef GWTF_P2P_SESSION_INTERNAL_H
#define GWTF_P2P_SESSION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/relay.h"
#include "p2p/session.h"

/* S_PREFACE: a relay leg waiting for the relay's status (p2p/relay.h).
 * S_PIPE: a relay leg on the relay itself: raw bytes in and out. */
/* S_PUNCH: a punched connection waiting for the peer's punch preface (p2p/punch.h). */
enum state { S_CONNECTING, S_PREFACE, S_PUNCH, S_HANDSHAKE, S_HEADER, S_HELLO, S_UP, S_PIPE, S_CLOSING };

/* One sealed frame (or raw handshake bytes) waiting for the socket: only
 * session.c looks inside. */
typedef struct txframe txframe;

struct p2p_session {
  uv_tcp_t tcp;
  uv_timer_t timer; /* connect, handshake and goodbye deadlines */
  uv_timer_t pump;  /* shaped sends */
  uv_connect_t connect_req;
  uv_shutdown_t shutdown_req;
  int open_handles;
  bool pump_ready;
  int state;
  bool finishing; /* goodbye queued: no more sends */
  bool shut;      /* write side shut down after the goodbye */
  p2p_end end;
  int end_err;
  const char *end_why;

  p2p_session_config cfg;
  p2p_session_cbs cbs;
  void *ud;

  p2p_handshake hs;
  p2p_channel ch;
  p2p_rx rx;
  uint8_t *staging;
  p2p_head pending; /* a head whose payload record is still coming */
  bool has_pending;
  uint64_t rx_frame_start_ns;
  size_t rx_frame_wire; /* wire bytes of the frame being received */

  txframe *txq_head, *txq_tail;
  txframe *tx_unissued; /* shaped: first frame not fully handed to the socket */
  bool above_low;
  bool shaping;
  p2p_shaper shaper;
  uint64_t last_tx_done_ns;

  p2p_session_info info;
  p2p_session_stats stats;
  int goodbye_reason_rx;
  char addr_str[GW_ADDR_STRLEN];

  /* Relay circuits (p2p/relay.h). */
  bool via;         /* dialled through a relay: preface, status, then the handshake */
  bool pipe;        /* became a relay pipe (stays true while closing) */
  bool pipe_paused; /* pipe mode: reading stopped (backpressure, rate limit) */
  uint8_t preface[P2P_RELAY_PREFACE_BYTES];

  /* Hole punching (p2p/punch.h). */
  bool punch;         /* a punched connection: preface both ways, then the handshake in a given role */
  bool rx_held;       /* reading stopped, frames wait in the socket: hold_punch || hold_budget */
  bool hold_punch;    /* p2p_session_hold_rx */
  uint8_t *held;      /* bytes read before the hold and not yet fed (processed on release) */
  size_t held_len;
  uv_timer_t resume;  /* feeds `held` from the loop after a release */
  bool resume_ready;

  /* Limits (p2p/limits.h). */
  size_t rx_charged;        /* receive-buffer bytes charged to the budget */
  bool hold_budget;         /* a payload waits for budget: reading stopped */
  uint64_t budget_since_ms;
  uint64_t prog_ms;         /* slow-sender window: its start ... */
  uint64_t prog_bytes;      /* ... and bytes_rx then */
};

/* session.c */
int session_new(uv_loop_t *loop, const p2p_session_config *cfg, const p2p_session_cbs *cbs, void *ud,
                p2p_role role, p2p_session **out);
void session_discard(p2p_session *s, int rc); /* failed before anyone was told about it */
int session_start_connect(p2p_session *s, const struct sockaddr *to, const p2p_session_config *cfg,
                          p2p_session **out);
int session_start_reading(p2p_session *s, uint32_t timeout_ms);
int session_enqueue(p2p_session *s, uint8_t *buf, size_t len, bool shape);
int session_enqueue_copy(p2p_session *s, const uint8_t *data, size_t len);
void session_close_now(p2p_session *s, p2p_end end, int err, const char *why);
void session_got_record(p2p_session *s);
void session_rx_sync(p2p_session *s); /* the budget's charge follows the receive buffer */
void session_on_eof(p2p_session *s, int err);
/* libuv callbacks */
void session_on_timer(uv_timer_t *t);
void session_on_shutdown(uv_shutdown_t *req, int status);
void session_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void session_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

/* session_legs.c: relay legs */
bool session_relay_preface(p2p_session *s, const uint8_t *rec); /* true: it was one, s is a pipe now */
void session_relay_connected(p2p_session *s);
void session_got_relay_status(p2p_session *s, const uint8_t *rec);
void session_pipe_read(p2p_session *s, ssize_t nread, const uv_buf_t *buf);
void session_pipe_leftover(p2p_session *s, const uint8_t *data, size_t n);
/* session_legs.c: punched connections */
bool session_punch_preface_in(p2p_session *s, const uint8_t *rec); /* true: it was one, handed to cbs.punch */
void session_punch_connected(p2p_session *s);
void session_got_punch_preface(p2p_session *s, const uint8_t *rec);
/* session_legs.c: holding reads */
void session_hold_leftover(p2p_session *s, const uint8_t *data, size_t n);
void session_rx_hold_update(p2p_session *s);

#endif
