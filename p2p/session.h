/* p2p/session.h — one encrypted TCP session on the libuv loop.
 *
 * A session runs the handshake (p2p/handshake.h), exchanges stream headers
 * and Hello frames, then carries sealed frames (p2p/frame.h) both ways. It
 * knows nothing about other sessions: p2p/host.c decides which sessions to
 * open, keep and close. Upper layers talk to the host, not to sessions.
 *
 * Lifecycle:  dial/accept -> handshake -> Hello both ways -> up -> closed.
 * The session is up once the peer's Hello opened under the session keys
 * (key confirmation). Callbacks never run inside a p2p_session_* call: a
 * failure found while sending surfaces later, from the loop, so the owner
 * never sees its own data structures change under it. `closed` runs exactly
 * once, after every handle is closed; the session is freed right after it
 * returns.
 *
 * Sends are sealed at once (in order: secretstream numbers every record)
 * and queued; with link emulation on, the queue is released to the socket
 * at the pace of the link's shaper (p2p/link.h), in slices of the burst
 * size, so the receiver sees bytes trickle in as over a real link. */
#ifndef GWTF_P2P_SESSION_H
#define GWTF_P2P_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "p2p/frame.h"
#include "p2p/handshake.h"
#include "p2p/identity.h"
#include "p2p/limits.h"
#include "p2p/link.h"
#include "util/addr.h"
#include "util/log.h"

typedef struct p2p_session p2p_session;

#define P2P_AGENT_MAX (48)

/* Why a session ended, as the owner sees it. */
typedef enum p2p_end {
  P2P_END_LOST = 0,     /* connection dropped, timed out or failed to connect */
  P2P_END_LEFT = 1,     /* the peer said goodbye (FINAL frame) */
  P2P_END_CLOSED = 2,   /* we closed it (goodbye sent, or p2p_session_close) */
  P2P_END_REJECTED = 3, /* the peer broke the protocol: bad handshake, bad frame */
} p2p_end;

typedef struct p2p_session_cbs {
  /* The peer's Hello arrived: the session can carry frames. */
  void (*up)(p2p_session *s);
  /* One frame other than Hello/Goodbye. msg and its buffers live until the
   * callback returns (p2p_msg_keep() takes the payload). */
  void (*message)(p2p_session *s, p2p_msg *msg);
  /* The write queue fell to the low-water mark after exceeding it. */
  void (*drained)(p2p_session *s);
  /* Last call. err is 0 or the GW_E / UV_E code behind the end. */
  void (*closed)(p2p_session *s, p2p_end end, int err, const char *why);
  /* Relay legs (p2p/relay.h); both may be NULL (no relaying).
   * preface: an accepted connection began with a relay preface
   * (P2P_RELAY_PREFACE_BYTES) instead of handshake msg1. The session is a
   * pipe from now on: no handshake, raw bytes both ways.
   * pipe_data: bytes read on a pipe; buf is malloc'd and the callee's. */
  void (*preface)(p2p_session *s, const uint8_t *preface);
  void (*pipe_data)(p2p_session *s, uint8_t *buf, size_t len);
  /* Hole punching (p2p/punch.h); may be NULL. An accepted connection began
   * with a punch preface: answer with p2p_session_punch_accept (or close). */
  void (*punch)(p2p_session *s, const uint8_t *preface);
} p2p_session_cbs;

typedef struct p2p_session_config {
  const p2p_identity *me;
  size_t max_frame;              /* largest frame we accept */
  uint32_t connect_timeout_ms;   /* dial: TCP connect */
  uint32_t handshake_timeout_ms; /* TCP up -> peer's Hello */
  uint32_t goodbye_timeout_ms;   /* goodbye: time to flush before cutting */
  size_t low_water;              /* `drained` threshold in queued bytes */
  uint16_t listen_port;          /* announced in Hello (0: none) */
  uint64_t instance;             /* announced in Hello */
  const char *agent;             /* announced in Hello */
  uint64_t dial_back_nonce;      /* announced in Hello: non-zero only on a dial-back (p2p/reach.h) */
  const gw_log *log;
  /* The host's limits (p2p/limits.h): the reassembly budget every session
   * charges its receive buffers to, and the slow-sender rule. NULL: none.
   * Must outlive the session. */
  p2p_limits *limits;
} p2p_session_config;

/* Peer-visible facts, valid once up. */
typedef struct p2p_session_info {
  p2p_role role;
  gw_id peer_id;
  gw_addr remote;      /* the TCP peer address */
  gw_addr listen;      /* remote IP + the peer's announced listen port (port 0: none) */
  uint64_t instance;   /* the peer's process instance */
  uint64_t peer_max_frame;
  uint8_t session_hash[32];
  char agent[P2P_AGENT_MAX]; /* the peer's agent string, made safe for log lines */
  bool relayed;              /* runs through a relay circuit; remote is the relay (p2p/relay.h) */
  gw_addr observed;          /* where the peer says it sees us (its word only); family 0: not told */
  uint64_t dial_back_nonce;  /* non-zero: the peer opened this session as a dial-back */
  gw_addr local;             /* our end of the TCP connection (family 0: unknown) */
} p2p_session_info;

typedef struct p2p_session_stats {
  uint64_t bytes_tx, bytes_rx;   /* wire bytes, headers and tags included */
  uint64_t frames_tx, frames_rx;
  size_t queued_bytes;           /* sealed, not yet written to the socket */
  size_t queued_frames;
  double tx_Bps, rx_Bps;         /* observed throughput over recent large frames; 0 = no sample yet */
  size_t rx_buffer_hwm;          /* largest receive buffer allocated */
  uint64_t up_ns;                /* when it came up (monotonic) */
  uint64_t last_rx_ns;           /* last byte received (monotonic) */
} p2p_session_stats;

/* Starts a session on a connection accepted from server (call from the
 * connection callback). expect is ignored for the responder. */
int p2p_session_accept(uv_stream_t *server, const p2p_session_config *cfg, const p2p_session_cbs *cbs, void *ud,
                       p2p_session **out);
/* Dials addr; expect (may be NULL) is the node ID we mean to reach. */
int p2p_session_dial(uv_loop_t *loop, const gw_addr *addr, const gw_id *expect, const p2p_session_config *cfg,
                     const p2p_session_cbs *cbs, void *ud, p2p_session **out);

/* Relay circuits (p2p/relay.h). Dials the relay, sends the 40-byte preface,
 * waits for the relay's status (a refusal ends the session, end LOST, with
 * the status name as `why`), then runs the handshake over the circuit as
 * role: the dialler is the initiator (expect: the target), the target
 * connecting back is the responder. */
int p2p_session_dial_via(uv_loop_t *loop, const gw_addr *relay, const uint8_t *preface, p2p_role role,
                         const gw_id *expect, const p2p_session_config *cfg, const p2p_session_cbs *cbs, void *ud,
                         p2p_session **out);
/* Pipe mode (after `preface`): queues raw bytes, taking buf (freed on error:
 * GW_ECLOSED when the pipe is closing). */
int p2p_session_pipe_write(p2p_session *s, uint8_t *buf, size_t len);
/* Flushes what is queued, then half-closes; the session ends at the peer's
 * EOF or after the goodbye timeout. */
void p2p_session_pipe_end(p2p_session *s);
/* Stops / resumes reading a pipe (backpressure, rate limits). */
void p2p_session_pipe_pause(p2p_session *s, bool pause);
/* True once the session became a pipe (also while it closes). */
bool p2p_session_is_pipe(const p2p_session *s);

/* Hole punching (p2p/punch.h). Dials remote from local (a socket with
 * SO_REUSEADDR+SO_REUSEPORT sharing our listen or punch port), sends the
 * 40-byte punch preface, reads the peer's (it must be the same bytes), then
 * runs the handshake as role. */
int p2p_session_dial_punch(uv_loop_t *loop, const gw_addr *local, const gw_addr *remote, const uint8_t *preface,
                           p2p_role role, const gw_id *expect, const p2p_session_config *cfg,
                           const p2p_session_cbs *cbs, void *ud, p2p_session **out);
/* Answers the `punch` callback of an accepted connection: sends the same
 * preface back and runs the handshake as role (expect: for the initiator). */
int p2p_session_punch_accept(p2p_session *s, p2p_role role, const gw_id *expect);
/* Stops reading frames (they wait in the socket: TCP flow control) or
 * reads on, first what had been read past the hold. The host holds a
 * punched session until the relayed one delivered its last frame. */
void p2p_session_hold_rx(p2p_session *s, bool hold);
bool p2p_session_is_punched(const p2p_session *s);

/* Seals and queues one message. GW_ECLOSED when not up or closing,
 * GW_ERANGE when larger than the peer accepts, GW_EINVAL, GW_ENOMEM. */
int p2p_session_send(p2p_session *s, const p2p_msg *msg);
/* Shapes this session's sends from now on (NULL or inactive params: off). */
void p2p_session_set_link(p2p_session *s, const p2p_link_params *lp);
/* Sends a Goodbye (FINAL), flushes the queue, then closes (end CLOSED).
 * reason is a gwtf.GoodbyeReason. */
void p2p_session_goodbye(p2p_session *s, int reason);
/* Closes at once. end/err/why are what `closed` will report; with end
 * REJECTED a session.rejected line is logged. */
void p2p_session_close(p2p_session *s, p2p_end end, int err, const char *why);

/* Housekeeping for the limits (call every few hundred ms): a session
 * waiting for reassembly budget takes it when it is free (or is closed,
 * reason rx-budget, after rx_wait_ms); a frame in reassembly that gained
 * fewer than rx_min_Bps over the last rx_window_ms is cut (slow-sender). */
void p2p_session_poll(p2p_session *s, uint64_t now_ms);
/* The socket's file descriptor (-1 when none). */
int p2p_session_fileno(const p2p_session *s);
/* Reassembly bytes this session holds (charged to the budget). */
size_t p2p_session_rx_charged(const p2p_session *s);

bool p2p_session_is_up(const p2p_session *s);
/* Still usable: not closing and not closed. */
bool p2p_session_is_open(const p2p_session *s);
const p2p_session_info *p2p_session_get_info(const p2p_session *s);
void p2p_session_get_stats(const p2p_session *s, p2p_session_stats *out);
size_t p2p_session_queued(const p2p_session *s);
/* The goodbye reason the peer gave (valid after end LEFT). */
int p2p_session_goodbye_reason(const p2p_session *s);
void *p2p_session_ud(const p2p_session *s);
void p2p_session_set_ud(p2p_session *s, void *ud);

#endif
