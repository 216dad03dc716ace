/* p2p/session.c — see p2p/session.h: one encrypted session, from the
 * connect or accept through the handshake and Hello to sealed frames both
 * ways, its write queue and shaping, the reassembly budget, and the API.
 * Its companion session_legs.c (state in p2p/session_internal.h) holds the
 * other uses of a session: relay legs, punched connections, held reads. */
#include "p2p/session.h"
#include "p2p/session_internal.h"

#include <stdlib.h>
#include <string.h>

#include "p2p/sockaddr.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/clock.h"
#include "util/err.h"

/* Socket reads land here unless a large record takes them directly. */
#define STAGING_BYTES ((size_t)64 << 10)
/* Frames smaller than this finish too fast to say anything about a link's
 * throughput; only larger ones feed the rate estimates. */
#define RATE_MIN_FRAME ((size_t)64 << 10)
/* EWMA weight of a new throughput sample. */
#define RATE_ALPHA (0.25)
#define AGENT_MAX (P2P_AGENT_MAX)
/* Relay legs read in slices of this size, each handed on whole (no copy). */
#define PIPE_READ_BYTES ((size_t)64 << 10)

/* One sealed frame (or raw handshake bytes) waiting for the socket. */
struct txframe {
  struct txframe *next;
  uint8_t *buf;
  size_t len;
  size_t issued; /* handed to uv_write */
  size_t done;   /* written */
  uint64_t start_ns;
  p2p_span span; /* shaped sends: when each byte may go */
};

typedef struct txreq {
  uv_write_t req;
  txframe *f;
  size_t n;
} txreq;

/* ---- small helpers ---- */

static void rate_add(double *ewma, uint64_t bytes, uint64_t ns) {
  if (ns == 0) ns = 1;
  double sample = (double)bytes * 1e9 / (double)ns;
  *ewma = *ewma > 0 ? (1 - RATE_ALPHA) * *ewma + RATE_ALPHA * sample : sample;
}

static const char *role_name(const p2p_session *s) { return s->info.role == P2P_INITIATOR ? "out" : "in"; }

static void peer_short(const p2p_session *s, char out[GW_ID_SHORT_LEN + 1]) {
  if (gw_id_is_zero(&s->info.peer_id))
    snprintf(out, GW_ID_SHORT_LEN + 1, "-");
  else
    gw_id_to_short(&s->info.peer_id, out);
}

/* Keeps what a peer claims as its agent printable and free of spaces and
 * quotes: it ends up in our log lines. */
static void copy_agent(char *out, const char *in) {
  size_t i = 0;
  for (; in && in[i] && i < AGENT_MAX - 1; i++) {
    char c = in[i];
    out[i] = (c > 32 && c < 127 && c != '"' && c != '=') ? c : '_';
  }
  out[i] = '\0';
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status);

static void issue(p2p_session *s, txframe *f, size_t n) {
  txreq *r = malloc(sizeof(*r));
  if (!r) {
    session_close_now(s, P2P_END_LOST, GW_ENOMEM, "out-of-memory");
    return;
  }
  r->f = f;
  r->n = n;
  uv_buf_t b = uv_buf_init((char *)f->buf + f->issued, (unsigned)n);
  if (f->issued == 0) f->start_ns = gw_clock_mono_ns();
  f->issued += n;
  int rc = uv_write(&r->req, (uv_stream_t *)&s->tcp, &b, 1, on_write);
  if (rc != 0) {
    free(r);
    session_close_now(s, P2P_END_LOST, rc, "write");
  }
}

static void pump(p2p_session *s);
static void on_pump(uv_timer_t *t) { pump(t->data); }

/* Hands the socket every byte the link has let through by now, in slices of
 * at least a quarter burst (or the rest of a frame), then sleeps until the
 * next slice is due: fine enough that the receiver sees the emulated rate,
 * coarse enough not to wake the loop for every packet. */
static void pump(p2p_session *s) {
  uint64_t now = gw_clock_mono_ns();
  size_t burst = s->shaper.lp.burst_bytes ? s->shaper.lp.burst_bytes : P2P_LINK_BURST_DEFAULT;
  size_t slice = burst / 4 > 1500 ? burst / 4 : 1500;
  txframe *f = s->tx_unissued;
  while (f && s->state != S_CLOSING) {
    uint64_t avail = p2p_span_bytes_at(&f->span, now);
    if (avail > f->issued && (avail == f->len || avail - f->issued >= slice)) issue(s, f, avail - f->issued);
    if (f->issued < f->len) break;
    f = f->next;
  }
  s->tx_unissued = f;
  if (!f || s->state == S_CLOSING) return;
  size_t k = f->issued + slice < f->len ? f->issued + slice : f->len;
  uint64_t due = p2p_span_time(&f->span, k);
  uint64_t ms = due > now ? (due - now + 999999) / 1000000 : 1;
  uv_timer_start(&s->pump, on_pump, ms, 0);
}

int session_enqueue(p2p_session *s, uint8_t *buf, size_t len, bool shape) {
  txframe *f = calloc(1, sizeof(*f));
  if (!f) {
    free(buf);
    return GW_ENOMEM;
  }
  f->buf = buf;
  f->len = len;
  if (s->txq_tail)
    s->txq_tail->next = f;
  else
    s->txq_head = f;
  s->txq_tail = f;
  s->stats.queued_bytes += len;
  s->stats.queued_frames++;
  if (s->stats.queued_bytes > s->cfg.low_water) s->above_low = true;
  uint64_t now = gw_clock_mono_ns();
  if (!(shape && s->shaping) && !s->tx_unissued) {
    issue(s, f, len);
    return 0;
  }
  /* Through the pump, strictly behind anything already waiting there: the
   * stream's records must reach the socket in the order they were sealed. */
  if (shape && s->shaping)
    f->span = p2p_shaper_reserve(&s->shaper, now, len);
  else
    f->span = (p2p_span){.enq_ns = now, .base_ns = (double)now, .bytes = len}; /* due at once */
  if (!s->tx_unissued) {
    s->tx_unissued = f;
    pump(s);
  }
  return 0;
}

int session_enqueue_copy(p2p_session *s, const uint8_t *data, size_t len) {
  uint8_t *buf = malloc(len);
  if (!buf) return GW_ENOMEM;
  memcpy(buf, data, len);
  return session_enqueue(s, buf, len, false);
}

static void frame_written(p2p_session *s, txframe *f) {
  uint64_t now = gw_clock_mono_ns();
  if (f->len >= RATE_MIN_FRAME) {
    /* Service time: from when the socket could start on this frame. */
    uint64_t start = f->start_ns > s->last_tx_done_ns ? f->start_ns : s->last_tx_done_ns;
    rate_add(&s->stats.tx_Bps, f->len, now - start);
  }
  s->last_tx_done_ns = now;
  s->stats.frames_tx++;
  s->txq_head = f->next;
  if (!s->txq_head) s->txq_tail = NULL;
  s->stats.queued_frames--;
  free(f->buf);
  free(f);
}

void session_on_shutdown(uv_shutdown_t *req, int status) {
  (void)req, (void)status; /* the peer's EOF (or the goodbye timer) ends the session */
}

static void on_write(uv_write_t *req, int status) {
  txreq *r = (txreq *)req;
  p2p_session *s = req->handle->data;
  txframe *f = r->f;
  size_t n = r->n;
  free(r);
  if (s->state == S_CLOSING) return; /* the queue is freed with the session */
  if (status < 0) {
    session_close_now(s, P2P_END_LOST, status, "write");
    return;
  }
  f->done += n;
  s->stats.bytes_tx += n;
  s->stats.queued_bytes -= n;
  if (f->done == f->len) frame_written(s, f);
  if (s->above_low && s->stats.queued_bytes <= s->cfg.low_water) {
    s->above_low = false;
    if (s->cbs.drained && (s->state == S_UP || s->state == S_PIPE) && !s->finishing) s->cbs.drained(s);
  }
  /* After a goodbye: send FIN once flushed, then wait for the peer's EOF
   * so that our last frames are read rather than reset away. */
  if (s->finishing && !s->txq_head && !s->shut && s->state != S_CLOSING) {
    s->shut = true;
    if (uv_shutdown(&s->shutdown_req, (uv_stream_t *)&s->tcp, session_on_shutdown) != 0)
      session_close_now(s, P2P_END_CLOSED, 0, "goodbye");
  }
}

static int seal_and_queue(p2p_session *s, const p2p_msg *msg, bool final, size_t max_frame) {
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = p2p_frame_seal(&s->ch, &s->cfg.me->id, msg, final, max_frame, &buf, &len);
  if (rc != 0) return rc;
  return session_enqueue(s, buf, len, true);
}

/* ---- closing ---- */

static void free_session(p2p_session *s) {
  for (txframe *f = s->txq_head, *next; f; f = next) {
    next = f->next;
    free(f->buf);
    free(f);
  }
  if (s->has_pending) p2p_head_clear(&s->pending);
  p2p_rx_free(&s->rx);
  p2p_hs_wipe(&s->hs);
  p2p_channel_wipe(&s->ch);
  free(s->staging);
  free(s->held);
  free(s);
}

static void on_handle_closed(uv_handle_t *h) {
  p2p_session *s = h->data;
  if (--s->open_handles > 0) return;
  /* Before `closed`: the owner may free the limits from there. */
  if (s->rx_charged && s->cfg.limits) p2p_limits_rx_charge(s->cfg.limits, -(long long)s->rx_charged);
  if (s->hold_budget && s->cfg.limits) p2p_limits_rx_waiting(s->cfg.limits, -1);
  s->rx_charged = 0;
  s->hold_budget = false;
  if (s->cbs.closed) s->cbs.closed(s, s->end, s->end_err, s->end_why);
  free_session(s);
}

static void log_rejected(const p2p_session *s) {
  char peer[GW_ID_SHORT_LEN + 1];
  peer_short(s, peer);
  GW_WARN(s->cfg.log, "session.rejected", "peer=\"%s\" addr=%s dir=%s reason=%s err=\"%s\"", peer, s->addr_str,
          role_name(s), s->end_why ? s->end_why : "-", gw_strerror(s->end_err));
}

void session_close_now(p2p_session *s, p2p_end end, int err, const char *why) {
  if (s->state == S_CLOSING) return;
  s->state = S_CLOSING;
  s->end = end;
  s->end_err = err;
  s->end_why = why;
  if (end == P2P_END_REJECTED) log_rejected(s);
  uv_close((uv_handle_t *)&s->tcp, on_handle_closed);
  uv_close((uv_handle_t *)&s->timer, on_handle_closed);
  if (s->pump_ready) uv_close((uv_handle_t *)&s->pump, on_handle_closed);
  if (s->resume_ready) uv_close((uv_handle_t *)&s->resume, on_handle_closed);
}

void p2p_session_close(p2p_session *s, p2p_end end, int err, const char *why) { session_close_now(s, end, err, why); }

void session_on_timer(uv_timer_t *t) {
  p2p_session *s = t->data;
  if (s->finishing) {
    session_close_now(s, P2P_END_CLOSED, GW_ETIMEDOUT, "goodbye-timeout");
  } else if (s->state == S_CONNECTING) {
    session_close_now(s, P2P_END_LOST, GW_ETIMEDOUT, "connect-timeout");
  } else if (s->state < S_UP) {
    /* An inbound connection that never finished its handshake is a bad
     * peer; an outbound one is a failed dial the host reports. */
    session_close_now(s, s->info.role == P2P_RESPONDER && !s->via && !s->punch ? P2P_END_REJECTED : P2P_END_LOST,
                      GW_ETIMEDOUT, s->state == S_PREFACE ? "relay-timeout" : "handshake-timeout");
  }
}

/* ---- the handshake and Hello ---- */

static int send_hello(p2p_session *s) {
  Gwtf__Hello h = GWTF__HELLO__INIT;
  h.listen_port = s->cfg.listen_port;
  h.instance = s->cfg.instance;
  h.agent = (char *)(s->cfg.agent ? s->cfg.agent : "");
  h.max_frame = s->cfg.max_frame;
  /* Tell the peer where we see it: with another peer's word, it learns its
   * external address (p2p/reach.h). */
  const gw_addr *rem = &s->info.remote;
  if (!s->info.relayed && (rem->family == 4 || rem->family == 6)) { /* relayed: remote is the relay */
    h.observed_ip = (ProtobufCBinaryData){rem->family == 4 ? 4 : 16, (uint8_t *)rem->ip};
    h.observed_port = rem->port;
  }
  h.dial_back_nonce = s->cfg.dial_back_nonce;
  uint8_t body[160 + AGENT_MAX];
  if (gwtf__hello__get_packed_size(&h) > sizeof(body)) h.agent = "";
  size_t n = gwtf__hello__pack(&h, body);
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_HELLO, .body = body, .body_len = n};
  return seal_and_queue(s, &m, false, P2P_MAX_FRAME_MIN);
}

static void handshake_step(p2p_session *s, const uint8_t *rec) {
  uint8_t out[P2P_HS_MAX_MSG_BYTES];
  size_t out_len = 0;
  if (session_relay_preface(s, rec) || session_punch_preface_in(s, rec)) return;
  int rc = p2p_hs_read(&s->hs, rec, out, &out_len);
  if (rc != 0) {
    s->info.peer_id = s->hs.peer_id; /* who answered, when we got that far: for the log line */
    session_close_now(s, P2P_END_REJECTED, rc, s->hs.why);
    return;
  }
  if (out_len && (rc = session_enqueue_copy(s, out, out_len)) != 0) {
    session_close_now(s, P2P_END_LOST, rc, "out-of-memory");
    return;
  }
  if (!p2p_hs_done(&s->hs)) {
    p2p_rx_expect_raw(&s->rx, p2p_hs_want(&s->hs));
    return;
  }
  s->info.peer_id = s->hs.peer_id;
  memcpy(s->info.session_hash, s->hs.session_hash, sizeof(s->info.session_hash));
  uint8_t header[P2P_STREAM_HEADER_BYTES];
  p2p_channel_init_tx(&s->ch, s->hs.tx_key, header);
  rc = session_enqueue_copy(s, header, sizeof(header));
  if (rc == 0) rc = send_hello(s);
  if (rc != 0) {
    session_close_now(s, P2P_END_LOST, rc, "out-of-memory");
    return;
  }
  s->state = S_HEADER;
  p2p_rx_expect_raw(&s->rx, P2P_STREAM_HEADER_BYTES);
}

static void got_stream_header(p2p_session *s, const uint8_t *header) {
  p2p_channel_init_rx(&s->ch, s->hs.rx_key, header);
  p2p_hs_wipe(&s->hs); /* the keys now live only in the channel */
  s->state = S_HELLO;
  p2p_rx_expect_head(&s->rx);
}

static void got_hello(p2p_session *s, p2p_head *h) {
  Gwtf__Envelope *env = h->env;
  Gwtf__Hello *hello = NULL;
  if (env->type != GWTF__MSG_TYPE__MSG_HELLO || h->has_tensor || h->final ||
      !(hello = gwtf__hello__unpack(NULL, env->body.len, env->body.data))) {
    session_close_now(s, P2P_END_REJECTED, GW_EPROTO, "expected-hello");
    return;
  }
  if (hello->listen_port > 0 && hello->listen_port <= 65535 && !s->info.relayed) { /* relayed: remote is the relay */
    s->info.listen = s->info.remote;
    s->info.listen.port = (uint16_t)hello->listen_port;
  }
  s->info.instance = hello->instance;
  s->info.dial_back_nonce = hello->dial_back_nonce;
  size_t ol = hello->observed_ip.len;
  if ((ol == 4 || ol == 16) && hello->observed_port > 0 && hello->observed_port <= 65535) {
    s->info.observed.family = ol == 4 ? 4 : 6;
    memcpy(s->info.observed.ip, hello->observed_ip.data, ol);
    s->info.observed.port = (uint16_t)hello->observed_port;
  }
  s->info.peer_max_frame = hello->max_frame < P2P_MAX_FRAME_MIN ? P2P_MAX_FRAME_MIN : hello->max_frame;
  copy_agent(s->info.agent, hello->agent);
  gwtf__hello__free_unpacked(hello, NULL);
  s->state = S_UP;
  s->stats.up_ns = gw_clock_mono_ns();
  uv_timer_stop(&s->timer);
  p2p_rx_expect_head(&s->rx);
  if (s->cbs.up) s->cbs.up(s);
}

/* ---- frames ---- */

static void deliver(p2p_session *s, const p2p_head *h, const uint8_t *payload) {
  uint64_t now = gw_clock_mono_ns();
  size_t wire = s->rx_frame_wire;
  if (wire >= RATE_MIN_FRAME) rate_add(&s->stats.rx_Bps, wire, now - s->rx_frame_start_ns);
  s->stats.frames_rx++;
  if (s->finishing) return; /* we said goodbye: nothing more goes up */
  p2p_msg m;
  p2p_head_to_msg(h, payload ? &s->rx : NULL, payload, &m);
  if (s->cbs.message) s->cbs.message(s, &m);
}

static void got_goodbye(p2p_session *s, p2p_head *h) {
  Gwtf__Goodbye *g = gwtf__goodbye__unpack(NULL, h->env->body.len, h->env->body.data);
  s->goodbye_reason_rx = g ? (int)g->reason : 0;
  if (g) gwtf__goodbye__free_unpacked(g, NULL);
  session_close_now(s, P2P_END_LEFT, 0, "goodbye");
}

/* ---- limits: the reassembly budget (p2p/limits.h) ---- */

/* Keeps what the budget is charged equal to the buffer the reassembler holds. */
void session_rx_sync(p2p_session *s) {
  size_t cap = s->rx.big ? s->rx.big_cap : 0;
  if (cap == s->rx_charged || !s->cfg.limits) return;
  p2p_limits_rx_charge(s->cfg.limits, (long long)cap - (long long)s->rx_charged);
  s->rx_charged = cap;
}

static size_t payload_buffer(uint64_t plain) { return (size_t)plain + P2P_ABYTES + P2P_PAYLOAD_ALIGN; }

static bool budget_allows(const p2p_session *s, uint64_t plain) {
  return !s->cfg.limits || p2p_limits_rx_may_grow(s->cfg.limits, s->rx_charged, payload_buffer(plain));
}

/* The payload announced by the head just read does not fit the budget:
 * stop reading (the sender waits on TCP) until p2p_session_poll finds room. */
static void budget_wait(p2p_session *s) {
  uint64_t now = gw_clock_mono_ms();
  s->hold_budget = true;
  s->budget_since_ms = now;
  p2p_limits_rx_waiting(s->cfg.limits, 1);
  p2p_limit_counts lc;
  p2p_limits_counts(s->cfg.limits, NULL, &lc);
  p2p_limits_hit(s->cfg.limits, "rx-budget", &s->info.remote, lc.rx_used, now);
  session_rx_hold_update(s);
}

static void got_head(p2p_session *s, uint8_t *rec, size_t len) {
  p2p_head h;
  const char *why = NULL;
  s->rx_frame_wire = P2P_LEN_BYTES + len;
  int rc = p2p_frame_open_head(&s->ch, rec, len, &s->info.peer_id, s->cfg.max_frame, &h, &why);
  if (rc != 0) {
    session_close_now(s, P2P_END_REJECTED, rc, why);
    return;
  }
  if (s->state == S_HELLO) {
    got_hello(s, &h);
  } else if (h.final) {
    got_goodbye(s, &h);
  } else if (h.has_tensor) {
    s->pending = h;
    s->has_pending = true;
    if (h.payload_bytes <= s->cfg.max_frame && !budget_allows(s, h.payload_bytes)) {
      budget_wait(s);
      return;
    }
    if ((rc = p2p_rx_expect_payload(&s->rx, h.payload_bytes)) != 0)
      session_close_now(s, P2P_END_REJECTED, rc, rc == GW_ERANGE ? "oversize" : "out-of-memory");
    session_rx_sync(s);
    return; /* pending owns the envelope now */
  } else {
    deliver(s, &h, NULL);
    if (s->state != S_CLOSING) p2p_rx_expect_head(&s->rx);
  }
  p2p_head_clear(&h);
}

static void got_payload(p2p_session *s, uint8_t *rec, size_t len) {
  const char *why = NULL;
  s->rx_frame_wire += len;
  int rc = p2p_frame_open_payload(&s->ch, rec, len, &why);
  if (rc != 0) {
    session_close_now(s, P2P_END_REJECTED, rc, why);
    return;
  }
  deliver(s, &s->pending, rec + 1);
  /* Others wait for budget: do not keep this buffer for the next frame. */
  if (s->cfg.limits && p2p_limits_rx_waiters(s->cfg.limits)) free(p2p_rx_take(&s->rx));
  p2p_head_clear(&s->pending);
  s->has_pending = false;
  if (s->state != S_CLOSING) p2p_rx_expect_head(&s->rx);
}

void session_got_record(p2p_session *s) {
  uint8_t *rec;
  size_t len;
  p2p_rx_record(&s->rx, &rec, &len);
  switch (s->state) {
  case S_PREFACE: session_got_relay_status(s, rec); break;
  case S_PUNCH: session_got_punch_preface(s, rec); break;
  case S_HANDSHAKE: handshake_step(s, rec); break;
  case S_HEADER: got_stream_header(s, rec); break;
  case S_HELLO:
  case S_UP:
    if (s->has_pending)
      got_payload(s, rec, len);
    else
      got_head(s, rec, len);
    break;
  default: break;
  }
}

/* ---- reading ---- */

void session_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  p2p_session *s = h->data;
  (void)suggested;
  uint8_t *p;
  size_t n;
  if (s->state == S_PIPE) { /* each read is handed on whole to the other leg */
    p = malloc(PIPE_READ_BYTES);
    *buf = uv_buf_init((char *)p, p ? (unsigned)PIPE_READ_BYTES : 0);
    return;
  }
  if (p2p_rx_window(&s->rx, &p, &n)) {
    *buf = uv_buf_init((char *)p, (unsigned)(n > (1u << 30) ? (1u << 30) : n));
    return;
  }
  if (!s->staging) s->staging = malloc(STAGING_BYTES);
  *buf = uv_buf_init((char *)s->staging, s->staging ? (unsigned)STAGING_BYTES : 0);
}

void session_on_eof(p2p_session *s, int err) {
  if (s->state == S_PIPE && !s->finishing) {
    session_close_now(s, P2P_END_LOST, err, err == UV_EOF ? "eof" : "read");
  } else if (s->state < S_UP) {
    bool inbound = s->info.role == P2P_RESPONDER && !s->via && !s->punch;
    session_close_now(s, inbound ? P2P_END_REJECTED : P2P_END_LOST, err, "handshake-eof");
  } else if (s->finishing) {
    session_close_now(s, P2P_END_CLOSED, 0, "goodbye");
  } else if (p2p_rx_partial(&s->rx)) {
    session_close_now(s, P2P_END_REJECTED, GW_EPROTO, "truncated");
  } else {
    session_close_now(s, P2P_END_LOST, err, err == UV_EOF ? "eof" : "read");
  }
}

void session_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  p2p_session *s = stream->data;
  if (s->state == S_PIPE) { /* the buffer came from the pipe branch of session_on_alloc */
    session_pipe_read(s, nread, buf);
    return;
  }
  if (s->state == S_CLOSING) return;
  if (nread < 0) {
    session_on_eof(s, (int)nread);
    return;
  }
  if (nread == 0) return;
  uint64_t now = gw_clock_mono_ns();
  s->stats.bytes_rx += (uint64_t)nread;
  s->stats.last_rx_ns = now;
  if ((uint8_t *)buf->base != s->staging) { /* read straight into the record */
    p2p_rx_commit(&s->rx, (size_t)nread);
    if (s->rx.ready) session_got_record(s);
    if (s->state != S_CLOSING) session_rx_sync(s);
    return;
  }
  size_t off = 0;
  while (off < (size_t)nread && s->state != S_CLOSING && !s->rx_held) {
    if (s->rx.kind == P2P_RX_HEAD && s->rx.in_len && s->rx.len_have == 0) s->rx_frame_start_ns = now;
    long used = p2p_rx_feed(&s->rx, s->staging + off, (size_t)nread - off);
    if (used < 0) {
      session_close_now(s, P2P_END_REJECTED, (int)used, used == GW_ERANGE ? "oversize" : "bad-length");
      return;
    }
    off += (size_t)used;
    if (s->rx.ready) session_got_record(s);
    if (s->state == S_PIPE) { /* bytes behind a relay preface belong to the pipe */
      session_pipe_leftover(s, s->staging + off, (size_t)nread - off);
      return;
    }
  }
  if (s->rx_held && s->state != S_CLOSING && off < (size_t)nread)
    session_hold_leftover(s, s->staging + off, (size_t)nread - off);
  if (s->state != S_CLOSING) session_rx_sync(s);
}

/* ---- setup ---- */

int session_new(uv_loop_t *loop, const p2p_session_config *cfg, const p2p_session_cbs *cbs, void *ud,
                       p2p_role role, p2p_session **out) {
  p2p_session *s = calloc(1, sizeof(*s));
  if (!s) return GW_ENOMEM;
  s->cfg = *cfg;
  s->cbs = *cbs;
  s->ud = ud;
  s->info.role = role;
  s->state = role == P2P_INITIATOR ? S_CONNECTING : S_HANDSHAKE;
  p2p_rx_init(&s->rx, cfg->max_frame);
  snprintf(s->addr_str, sizeof(s->addr_str), "-");
  int rc = uv_tcp_init(loop, &s->tcp);
  if (rc != 0) {
    free(s);
    return rc;
  }
  uv_timer_init(loop, &s->timer); /* cannot fail once the loop is alive */
  s->tcp.data = s->timer.data = s;
  s->open_handles = 2;
  *out = s;
  return 0;
}

/* For a session that failed before anyone was told about it. */
void session_discard(p2p_session *s, int rc) {
  s->cbs.closed = NULL;
  session_close_now(s, P2P_END_LOST, rc, "setup");
}

int session_start_reading(p2p_session *s, uint32_t timeout_ms) {
  struct sockaddr_storage local;
  int local_len = sizeof(local);
  if (uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&local, &local_len) == 0)
    p2p_addr_from_sockaddr((struct sockaddr *)&local, &s->info.local);
  uv_tcp_nodelay(&s->tcp, 1); /* pings and control frames must not wait for Nagle */
  uv_timer_start(&s->timer, session_on_timer, timeout_ms, 0);
  return uv_read_start((uv_stream_t *)&s->tcp, session_on_alloc, session_on_read);
}

int p2p_session_accept(uv_stream_t *server, const p2p_session_config *cfg, const p2p_session_cbs *cbs, void *ud,
                       p2p_session **out) {
  p2p_session *s;
  int rc = session_new(server->loop, cfg, cbs, ud, P2P_RESPONDER, &s);
  if (rc != 0) return rc;
  if ((rc = uv_accept(server, (uv_stream_t *)&s->tcp)) != 0) {
    session_discard(s, rc);
    return rc;
  }
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (uv_tcp_getpeername(&s->tcp, (struct sockaddr *)&ss, &len) == 0)
    p2p_addr_from_sockaddr((struct sockaddr *)&ss, &s->info.remote);
  gw_addr_format(&s->info.remote, s->addr_str);
  p2p_hs_init(&s->hs, P2P_RESPONDER, cfg->me, NULL);
  p2p_rx_expect_raw(&s->rx, p2p_hs_want(&s->hs));
  if ((rc = session_start_reading(s, cfg->handshake_timeout_ms)) != 0) {
    session_discard(s, rc);
    return rc;
  }
  *out = s;
  return 0;
}

static void on_connect(uv_connect_t *req, int status) {
  p2p_session *s = req->data;
  if (s->state == S_CLOSING) return;
  if (status != 0) {
    session_close_now(s, P2P_END_LOST, status, "connect");
    return;
  }
  if (s->via) {
    session_relay_connected(s);
    return;
  }
  if (s->punch) {
    session_punch_connected(s);
    return;
  }
  s->state = S_HANDSHAKE;
  uint8_t msg1[P2P_HS_MSG1_BYTES];
  p2p_hs_start(&s->hs, msg1);
  p2p_rx_expect_raw(&s->rx, p2p_hs_want(&s->hs));
  int rc = session_enqueue_copy(s, msg1, sizeof(msg1));
  if (rc == 0) rc = session_start_reading(s, s->cfg.handshake_timeout_ms);
  if (rc != 0) session_close_now(s, P2P_END_LOST, rc, "connect");
}

/* Starts the TCP connect of a dialled session, bounded by the connect
 * timeout; on failure the session is discarded. */
int session_start_connect(p2p_session *s, const struct sockaddr *to, const p2p_session_config *cfg,
                         p2p_session **out) {
  s->connect_req.data = s;
  int rc = uv_tcp_connect(&s->connect_req, &s->tcp, to, on_connect);
  if (rc != 0) {
    session_discard(s, rc);
    return rc;
  }
  uv_timer_start(&s->timer, session_on_timer, cfg->connect_timeout_ms, 0);
  *out = s;
  return 0;
}

int p2p_session_dial(uv_loop_t *loop, const gw_addr *addr, const gw_id *expect, const p2p_session_config *cfg,
                     const p2p_session_cbs *cbs, void *ud, p2p_session **out) {
  struct sockaddr_storage ss;
  if (p2p_addr_to_sockaddr(addr, &ss) != 0) return GW_EINVAL;
  p2p_session *s;
  int rc = session_new(loop, cfg, cbs, ud, P2P_INITIATOR, &s);
  if (rc != 0) return rc;
  s->info.remote = *addr;
  gw_addr_format(addr, s->addr_str);
  p2p_hs_init(&s->hs, P2P_INITIATOR, cfg->me, expect);
  return session_start_connect(s, (const struct sockaddr *)&ss, cfg, out);
}

/* ---- API ---- */

int p2p_session_send(p2p_session *s, const p2p_msg *msg) {
  if (s->state != S_UP || s->finishing) return GW_ECLOSED;
  size_t limit = s->cfg.max_frame;
  if (s->info.peer_max_frame < limit) limit = (size_t)s->info.peer_max_frame;
  return seal_and_queue(s, msg, false, limit);
}

void p2p_session_set_link(p2p_session *s, const p2p_link_params *lp) {
  if (s->state == S_CLOSING) return;
  p2p_link_params off = {0};
  p2p_shaper_init(&s->shaper, lp ? lp : &off);
  s->shaping = p2p_shaper_active(&s->shaper);
  if (s->shaping && !s->pump_ready) {
    uv_timer_init(s->tcp.loop, &s->pump);
    s->pump.data = s;
    s->pump_ready = true;
    s->open_handles++;
  }
}

void p2p_session_goodbye(p2p_session *s, int reason) {
  if (s->state == S_CLOSING || s->finishing) return;
  if (s->state != S_UP) {
    session_close_now(s, P2P_END_CLOSED, 0, "closed");
    return;
  }
  Gwtf__Goodbye g = GWTF__GOODBYE__INIT;
  g.reason = (Gwtf__GoodbyeReason)reason;
  uint8_t body[16];
  size_t n = gwtf__goodbye__pack(&g, body);
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_GOODBYE, .body = body, .body_len = n};
  if (seal_and_queue(s, &m, true, P2P_MAX_FRAME_MIN) != 0) {
    session_close_now(s, P2P_END_CLOSED, 0, "closed");
    return;
  }
  s->finishing = true;
  uv_timer_start(&s->timer, session_on_timer, s->cfg.goodbye_timeout_ms, 0);
}

void p2p_session_poll(p2p_session *s, uint64_t now_ms) {
  if (s->state == S_CLOSING || s->pipe || !s->cfg.limits) return;
  const p2p_limits_config *lc = p2p_limits_get_config(s->cfg.limits);
  if (s->hold_budget) {
    s->stats.last_rx_ns = gw_clock_mono_ns(); /* our pause, not the peer's silence */
    s->prog_ms = now_ms;
    s->prog_bytes = s->stats.bytes_rx;
    if (budget_allows(s, s->pending.payload_bytes)) {
      s->hold_budget = false;
      p2p_limits_rx_waiting(s->cfg.limits, -1);
      int rc = p2p_rx_expect_payload(&s->rx, s->pending.payload_bytes);
      if (rc != 0) {
        session_close_now(s, P2P_END_LOST, rc, "out-of-memory");
        return;
      }
      session_rx_sync(s);
      session_rx_hold_update(s);
    } else if (now_ms >= s->budget_since_ms + lc->rx_wait_ms) {
      session_close_now(s, P2P_END_LOST, GW_EFULL, "rx-budget");
    }
    return;
  }
  /* Between frames, a kept buffer goes back when others wait for budget. */
  if (s->rx.big && !s->rx.rec && !s->rx.ready && p2p_limits_rx_waiters(s->cfg.limits)) {
    free(s->rx.big);
    s->rx.big = NULL;
    s->rx.big_cap = 0;
    session_rx_sync(s);
  }
  /* Slow senders: only while a frame is on its way (a head started, or a
   * payload announced) and we are reading. */
  bool in_frame = (s->state == S_HELLO || s->state == S_UP) && !s->rx_held &&
                  (s->has_pending || p2p_rx_partial(&s->rx));
  if (!in_frame || !lc->rx_min_Bps || !lc->rx_window_ms || !s->prog_ms || now_ms < s->prog_ms) {
    s->prog_ms = now_ms;
    s->prog_bytes = s->stats.bytes_rx;
    return;
  }
  uint64_t span = now_ms - s->prog_ms;
  if (span < lc->rx_window_ms) return;
  uint64_t got = s->stats.bytes_rx - s->prog_bytes, want = (uint64_t)lc->rx_min_Bps * span / 1000;
  if (got < want) {
    p2p_limits_hit(s->cfg.limits, "slow-sender", &s->info.remote, got, now_ms);
    session_close_now(s, P2P_END_REJECTED, GW_ETIMEDOUT, "slow-sender");
    return;
  }
  s->prog_ms = now_ms;
  s->prog_bytes = s->stats.bytes_rx;
}

size_t p2p_session_rx_charged(const p2p_session *s) { return s->rx_charged; }

int p2p_session_fileno(const p2p_session *s) {
  uv_os_fd_t fd;
  return uv_fileno((const uv_handle_t *)&s->tcp, &fd) == 0 ? (int)fd : -1;
}

bool p2p_session_is_up(const p2p_session *s) { return s->state == S_UP && !s->finishing; }
bool p2p_session_is_open(const p2p_session *s) { return s->state != S_CLOSING; }
const p2p_session_info *p2p_session_get_info(const p2p_session *s) { return &s->info; }
size_t p2p_session_queued(const p2p_session *s) { return s->stats.queued_bytes; }
int p2p_session_goodbye_reason(const p2p_session *s) { return s->goodbye_reason_rx; }
void *p2p_session_ud(const p2p_session *s) { return s->ud; }
void p2p_session_set_ud(p2p_session *s, void *ud) { s->ud = ud; }

void p2p_session_get_stats(const p2p_session *s, p2p_session_stats *out) {
  *out = s->stats;
  out->rx_buffer_hwm = s->rx.hwm;
}
