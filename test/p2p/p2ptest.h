/* test/p2p/p2ptest.h — helpers for the p2p tests: run a loop until
 * something happened, record log events (thread-safe), and a blocking "raw"
 * peer that speaks the wire protocol by hand so tests can send exactly the
 * bytes an attacker would. */
#ifndef GWTF_TEST_P2PTEST_H
#define GWTF_TEST_P2PTEST_H

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "p2p/frame.h"
#include "p2p/handshake.h"
#include "p2p/host.h"
#include "p2p/sockaddr.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"

/* ---- running a loop until a condition holds ---- */

static void p2ptest_noop(uv_timer_t *t) { (void)t; }

/* Runs loop until pred(ud) is true or timeout_ms passed; true when pred
 * held. A 5 ms guard timer keeps the loop from blocking past the deadline. */
static inline bool run_until(uv_loop_t *loop, bool (*pred)(void *), void *ud, uint64_t timeout_ms) {
  uint64_t deadline = gw_clock_mono_ms() + timeout_ms;
  uv_timer_t guard;
  uv_timer_init(loop, &guard);
  uv_timer_start(&guard, p2ptest_noop, 5, 5);
  bool ok;
  while (!(ok = pred(ud)) && gw_clock_mono_ms() < deadline) uv_run(loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return ok;
}

/* Runs the loop until every handle is closed, then closes it. */
static inline void drain_loop(uv_loop_t *loop) {
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(loop), 0);
}

/* ---- recording log events ---- */

#define LOGREC_MAX (4096)

typedef struct logrec {
  uv_mutex_t mu;
  uv_cond_t cv;
  gw_log_sink sink;
  char *lines[LOGREC_MAX]; /* "event<TAB>line" */
  size_t n;
} logrec;

static void logrec_hook(void *ud, gw_log_level level, const char *event, const char *line) {
  (void)level;
  logrec *r = ud;
  size_t len = strlen(event) + strlen(line) + 2;
  char *copy = malloc(len);
  snprintf(copy, len, "%s\t%s", event, line);
  uv_mutex_lock(&r->mu);
  if (r->n < LOGREC_MAX)
    r->lines[r->n++] = copy;
  else
    free(copy);
  uv_cond_broadcast(&r->cv);
  uv_mutex_unlock(&r->mu);
}

/* Lines go to stderr (ctest shows them for a failing test) and to the recorder. */
static inline void logrec_init(logrec *r, gw_log_level level) {
  memset(r, 0, sizeof(*r));
  uv_mutex_init(&r->mu);
  uv_cond_init(&r->cv);
  gw_log_sink_init(&r->sink, stderr, level, GW_LOG_TEXT);
  r->sink.hook = logrec_hook;
  r->sink.hook_ud = r;
}

static inline void logrec_free(logrec *r) {
  for (size_t i = 0; i < r->n; i++) free(r->lines[i]);
  uv_mutex_destroy(&r->mu);
  uv_cond_destroy(&r->cv);
}

static inline size_t logrec_count_locked(logrec *r, const char *event, const char *needle) {
  size_t k = 0, el = strlen(event);
  for (size_t i = 0; i < r->n; i++)
    if (strncmp(r->lines[i], event, el) == 0 && r->lines[i][el] == '\t' && (!needle || strstr(r->lines[i], needle)))
      k++;
  return k;
}

/* Lines of this event containing needle (NULL: any). */
static inline size_t logrec_count(logrec *r, const char *event, const char *needle) {
  uv_mutex_lock(&r->mu);
  size_t k = logrec_count_locked(r, event, needle);
  uv_mutex_unlock(&r->mu);
  return k;
}

/* Another thread logs: waits until at least `want` such lines exist. */
static inline bool logrec_wait(logrec *r, const char *event, const char *needle, size_t want, uint64_t timeout_ms) {
  uint64_t deadline = gw_clock_mono_ms() + timeout_ms;
  uv_mutex_lock(&r->mu);
  bool ok;
  while (!(ok = logrec_count_locked(r, event, needle) >= want)) {
    uint64_t now = gw_clock_mono_ms();
    if (now >= deadline) break;
    uv_cond_timedwait(&r->cv, &r->mu, (deadline - now) * 1000000ULL);
  }
  uv_mutex_unlock(&r->mu);
  return ok;
}

/* ---- a test program's group setup ---- */

/* cmocka group setup for tests with hosts: SIGPIPE ignored (a peer that
 * hangs up must not end the test), rec records from DEBUG up, libsodium
 * ready. p2ptest_teardown frees rec. */
static inline int p2ptest_setup(logrec *rec) {
  signal(SIGPIPE, SIG_IGN);
  logrec_init(rec, GW_LOG_DEBUG);
  return p2p_crypto_init();
}

static inline int p2ptest_teardown(logrec *rec) {
  logrec_free(rec);
  return 0;
}

/* ---- a host for tests ---- */

/* Gives a test host its identity (a copy of id, or a new one when NULL)
 * and a log into rec, and fills hc: the defaults, that identity and log,
 * and a short reconnect backoff (50 to 400 ms). The caller sets the rest
 * (listen address, ping and handshake timers, ...). */
static inline void p2ptest_host_config(p2p_host_config *hc, p2p_identity *me, const p2p_identity *id, gw_log *log,
                                       logrec *rec) {
  if (id)
    *me = *id;
  else
    p2p_identity_generate(me);
  gw_log_init(log, &rec->sink, &me->id);
  p2p_host_config_defaults(hc);
  hc->me = me;
  hc->log = log;
  hc->backoff_min_ms = 50;
  hc->backoff_max_ms = 400;
}

/* ---- hosts served on a loop in another thread ---- */

/* The test's thread plays a hand-written peer with blocking sockets while
 * the hosts run on their own loop here. */
typedef struct p2ptest_served {
  uv_loop_t loop;
  uv_async_t stop;
  uv_sem_t ready;
  uv_thread_t tid;
  void (*start)(struct p2ptest_served *s); /* on the thread: starts the hosts on s->loop */
} p2ptest_served;

static void p2ptest_served_stop(uv_async_t *as) {
  uv_close((uv_handle_t *)as, NULL);
  uv_stop(as->loop);
}

static void p2ptest_served_thread(void *arg) {
  p2ptest_served *s = arg;
  s->start(s);
  uv_sem_post(&s->ready);
  uv_run(&s->loop, UV_RUN_DEFAULT);
}

/* Starts the thread and returns once start() has run there. */
static inline void p2ptest_serve(p2ptest_served *s, void (*start)(p2ptest_served *s)) {
  uv_loop_init(&s->loop);
  uv_async_init(&s->loop, &s->stop, p2ptest_served_stop);
  uv_sem_init(&s->ready, 0);
  s->start = start;
  uv_thread_create(&s->tid, p2ptest_served_thread, s);
  uv_sem_wait(&s->ready);
}

/* Stops the loop and joins the thread: the hosts are the caller's again
 * (to look at, then to close before p2ptest_serve_free). */
static inline void p2ptest_serve_join(p2ptest_served *s) {
  uv_async_send(&s->stop);
  uv_thread_join(&s->tid);
}

/* After the hosts were closed: drains and closes the loop. */
static inline void p2ptest_serve_free(p2ptest_served *s) {
  drain_loop(&s->loop);
  uv_sem_destroy(&s->ready);
}

/* ---- a peer that writes the wire format by hand (blocking sockets) ---- */

typedef struct rawpeer {
  int fd;
  p2p_identity me;
  p2p_handshake hs;
  p2p_channel ch;
} rawpeer;

static inline int rawpeer_connect(rawpeer *r, const gw_addr *addr) {
  memset(r, 0, sizeof(*r));
  p2p_identity_generate(&r->me);
  struct sockaddr_storage ss;
  p2p_addr_to_sockaddr(addr, &ss);
  r->fd = socket(ss.ss_family, SOCK_STREAM, 0);
  if (r->fd < 0) return -errno;
  int one = 1;
  setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  socklen_t len = ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
  return connect(r->fd, (struct sockaddr *)&ss, len) == 0 ? 0 : -errno;
}

static inline int rawpeer_send(rawpeer *r, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n > 0) {
    ssize_t k = send(r->fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return GW_EIO;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static inline int rawpeer_recv(rawpeer *r, void *buf, size_t n, int timeout_ms) {
  uint8_t *p = buf;
  while (n > 0) {
    struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0) return GW_ETIMEDOUT;
    ssize_t k = recv(r->fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return GW_ECLOSED;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Handshake as the dialler, then both stream headers; no Hello yet. */
static inline int rawpeer_handshake(rawpeer *r, const gw_id *expect) {
  uint8_t m1[P2P_HS_MSG1_BYTES], m2[P2P_HS_MAX_MSG_BYTES], m3[P2P_HS_MAX_MSG_BYTES];
  uint8_t hdr[P2P_STREAM_HEADER_BYTES], peer_hdr[P2P_STREAM_HEADER_BYTES];
  size_t n = 0;
  p2p_hs_init(&r->hs, P2P_INITIATOR, &r->me, expect);
  p2p_hs_start(&r->hs, m1);
  int rc = rawpeer_send(r, m1, sizeof(m1));
  if (rc == 0) rc = rawpeer_recv(r, m2, P2P_HS_MSG2_BYTES, 5000);
  if (rc == 0) rc = p2p_hs_read(&r->hs, m2, m3, &n);
  if (rc == 0) rc = rawpeer_send(r, m3, n);
  if (rc != 0) return rc;
  p2p_channel_init_tx(&r->ch, r->hs.tx_key, hdr);
  if ((rc = rawpeer_send(r, hdr, sizeof(hdr))) != 0) return rc;
  if ((rc = rawpeer_recv(r, peer_hdr, sizeof(peer_hdr), 5000)) != 0) return rc;
  p2p_channel_init_rx(&r->ch, r->hs.rx_key, peer_hdr);
  return 0;
}

/* Seals a message as our next frame (the caller frees *out). */
static inline int rawpeer_seal(rawpeer *r, const p2p_msg *m, const gw_id *sender, uint8_t **out, size_t *len) {
  return p2p_frame_seal(&r->ch, sender ? sender : &r->me.id, m, false, P2P_MAX_FRAME_DEFAULT, out, len);
}

static inline int rawpeer_send_msg(rawpeer *r, const p2p_msg *m) {
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = rawpeer_seal(r, m, NULL, &buf, &len);
  if (rc == 0) rc = rawpeer_send(r, buf, len);
  free(buf);
  return rc;
}

static inline int rawpeer_send_hello(rawpeer *r) {
  Gwtf__Hello h = GWTF__HELLO__INIT;
  h.instance = 42;
  h.max_frame = P2P_MAX_FRAME_DEFAULT;
  h.agent = "rawpeer";
  uint8_t body[64];
  p2p_msg m = {.type = GWTF__MSG_TYPE__MSG_HELLO, .body = body, .body_len = gwtf__hello__pack(&h, body)};
  return rawpeer_send_msg(r, &m);
}

/* Reads and discards until the other side closes; 0 when it did. */
static inline int rawpeer_wait_closed(rawpeer *r, int timeout_ms) {
  uint8_t buf[4096];
  uint64_t deadline = gw_clock_mono_ms() + (uint64_t)timeout_ms;
  while (gw_clock_mono_ms() < deadline) {
    struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
    if (poll(&pfd, 1, 50) <= 0) continue;
    ssize_t k = recv(r->fd, buf, sizeof(buf), 0);
    if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) return 0;
  }
  return GW_ETIMEDOUT;
}

static inline void rawpeer_close(rawpeer *r) {
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
}

#endif
