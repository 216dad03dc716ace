#include "p2p/relay.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "p2p/frame.h"
#include "p2p/host.h"
#include "p2p/session.h"
#include "proto/gwtf.pb-c.h"
#include "proto/p2p.pb-c.h"
#include "util/clock.h"
#include "util/err.h"

/* A leg whose peer reads slower than the other side writes stops being read
 * once this much waits for the slow side; it resumes at the session's low
 * water mark (`drained`). Bounds the relay's memory per circuit. */
#define PIPE_HIGH_WATER ((size_t)4 << 20)
/* The rate limit's bucket holds this fraction of a second of traffic. */
#define RATE_BURST_S (0.25)
#define RATE_BURST_MIN ((double)(64 << 10))
/* A reservation request unanswered for this long is asked again. */
#define RESERVE_ANSWER_MS (10000)
/* After a refusal, ask the same relay again this much later. */
#define RESERVE_RETRY_MS (30000)

static const uint8_t MAGIC_CONNECT[4] = {'G', 'W', 'R', 'C'};
static const uint8_t MAGIC_ACCEPT[4] = {'G', 'W', 'R', 'A'};
static const uint8_t MAGIC_STATUS[4] = {'G', 'W', 'R', 'S'};

enum { DIR_D2P = 0, DIR_P2D = 1 };

typedef struct reservation {
  gw_id peer;
  uint64_t expires_ms;
  struct reservation *next;
} reservation;

typedef struct circuit {
  p2p_session *leg[2]; /* [DIR_D2P] the dialler's leg, [DIR_P2D] the target's; NULL once closed */
  bool open;           /* both legs spliced */
  bool closing;
  bool backpressure[2]; /* leg[i] is not read because the other leg's queue is full */
  bool rate_paused;
  gw_id target;
  uint8_t token[P2P_RELAY_TOKEN_BYTES];
  uint64_t started_ms, opened_ms;
  uint64_t bytes[2];
  double tokens;
  uint64_t tokens_ms;
  char from[GW_ADDR_STRLEN];
  struct circuit *next;
} circuit;

enum { W_NONE, W_ASKED, W_RESERVED };

/* A relay we want a reservation on (client side). */
typedef struct wanted {
  gw_id relay;
  gw_addr addr;
  int state;
  int refused; /* the relay's last refusal (a gwtf.RelayStatus), 0 after a grant */
  uint64_t next_ms; /* ask (again) at */
  uint64_t expires_ms;
  struct wanted *next;
} wanted;

struct p2p_relay {
  struct p2p_host *h;
  p2p_relay_config cfg;
  bool serve;
  const gw_log *log;
  reservation *res;
  uint32_t n_res;
  circuit *circ;
  uint32_t n_circ;
  wanted *want;
  p2p_relay_stats st;
};

void p2p_relay_config_defaults(p2p_relay_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->enabled = true;
  cfg->max_reservations = 128;
  cfg->max_circuits = 16;
  cfg->max_bytes_per_s = (uint64_t)16 << 20;
  cfg->max_bytes = (uint64_t)8 << 30;
  cfg->circuit_lifetime_s = 6 * 3600;
  cfg->reservation_s = 3600;
  cfg->connect_back_ms = 5000;
}

const char *p2p_relay_status_name(int status) {
  switch (status) {
  case GWTF__RELAY_STATUS__RELAY_OK: return "ok";
  case GWTF__RELAY_STATUS__RELAY_OFF: return "relay-off";
  case GWTF__RELAY_STATUS__RELAY_NO_RESERVATION: return "no-reservation";
  case GWTF__RELAY_STATUS__RELAY_TOO_MANY_RESERVATIONS: return "too-many-reservations";
  case GWTF__RELAY_STATUS__RELAY_TOO_MANY_CIRCUITS: return "too-many-circuits";
  case GWTF__RELAY_STATUS__RELAY_TARGET_TIMEOUT: return "target-timeout";
  case GWTF__RELAY_STATUS__RELAY_BAD_TOKEN: return "bad-token";
  case GWTF__RELAY_STATUS__RELAY_BAD_PREFACE: return "bad-preface";
  case GWTF__RELAY_STATUS__RELAY_PRIVATE: return "private";
  default: return "relay-refused";
  }
}

/* ---- addresses ---- */

#define CIRCUIT_SEP "/p2p-circuit/"

int p2p_relay_addr_parse(const char *s, p2p_relay_addr *out) {
  memset(out, 0, sizeof(*out));
  if (!s || strlen(s) >= P2P_RELAY_ADDR_STRLEN) return GW_EINVAL;
  const char *at = strchr(s, '@');
  const char *sep = strstr(s, CIRCUIT_SEP);
  if (!at || !sep || at - s != GW_ID_HEX_LEN || sep < at) return GW_EINVAL;
  char hex[GW_ID_HEX_LEN + 1], host[GW_ADDR_STRLEN];
  memcpy(hex, s, GW_ID_HEX_LEN);
  hex[GW_ID_HEX_LEN] = '\0';
  if (gw_id_from_hex(hex, &out->relay) != 0) return GW_EINVAL;
  size_t hl = (size_t)(sep - at - 1);
  if (hl == 0 || hl >= sizeof(host)) return GW_EINVAL;
  memcpy(host, at + 1, hl);
  host[hl] = '\0';
  if (gw_addr_parse(host, &out->relay_addr) != 0 || out->relay_addr.port == 0) return GW_EINVAL;
  const char *t = sep + strlen(CIRCUIT_SEP);
  if (strlen(t) != GW_ID_HEX_LEN || gw_id_from_hex(t, &out->target) != 0) return GW_EINVAL;
  return 0;
}

void p2p_relay_addr_format(const p2p_relay_addr *a, char *out) {
  char r[GW_ID_HEX_LEN + 1], t[GW_ID_HEX_LEN + 1], addr[GW_ADDR_STRLEN];
  gw_id_to_hex(&a->relay, r);
  gw_id_to_hex(&a->target, t);
  gw_addr_format(&a->relay_addr, addr);
  snprintf(out, P2P_RELAY_ADDR_STRLEN, "%s@%s" CIRCUIT_SEP "%s", r, addr, t);
}

/* ---- wire records ---- */

static void preface(const uint8_t magic[4], const uint8_t body[32], uint8_t out[P2P_RELAY_PREFACE_BYTES]) {
  memset(out, 0, P2P_RELAY_PREFACE_BYTES);
  memcpy(out, magic, 4);
  out[4] = P2P_RELAY_VERSION;
  memcpy(out + 8, body, 32);
}

void p2p_relay_preface_connect(const gw_id *target, uint8_t out[P2P_RELAY_PREFACE_BYTES]) {
  preface(MAGIC_CONNECT, target->b, out);
}

void p2p_relay_preface_accept(const uint8_t token[P2P_RELAY_TOKEN_BYTES], uint8_t out[P2P_RELAY_PREFACE_BYTES]) {
  preface(MAGIC_ACCEPT, token, out);
}

bool p2p_relay_is_preface(const uint8_t rec[P2P_RELAY_PREFACE_BYTES]) {
  return memcmp(rec, MAGIC_CONNECT, 4) == 0 || memcmp(rec, MAGIC_ACCEPT, 4) == 0;
}

void p2p_relay_status_record(int status, uint8_t out[P2P_RELAY_STATUS_BYTES]) {
  memset(out, 0, P2P_RELAY_STATUS_BYTES);
  memcpy(out, MAGIC_STATUS, 4);
  out[4] = P2P_RELAY_VERSION;
  out[5] = (uint8_t)status;
}

int p2p_relay_status_parse(const uint8_t rec[P2P_RELAY_STATUS_BYTES]) {
  if (memcmp(rec, MAGIC_STATUS, 4) != 0 || rec[4] != P2P_RELAY_VERSION) return -1;
  return rec[5];
}

/* ---- setup ---- */

int p2p_relay_new(struct p2p_host *h, const p2p_relay_config *cfg, bool can_serve, const gw_log *log,
                  p2p_relay **out) {
  p2p_relay *r = calloc(1, sizeof(*r));
  if (!r) return GW_ENOMEM;
  r->h = h;
  r->cfg = *cfg;
  r->serve = cfg->enabled && can_serve;
  r->log = log;
  *out = r;
  return 0;
}

/* The host closes every session (pipes included) before it frees us. */
void p2p_relay_free(p2p_relay *r) {
  if (!r) return;
  for (reservation *v = r->res, *next; v; v = next) {
    next = v->next;
    free(v);
  }
  for (circuit *c = r->circ, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  for (wanted *w = r->want, *next; w; w = next) {
    next = w->next;
    free(w);
  }
  free(r);
}

void p2p_relay_get_stats(const p2p_relay *r, p2p_relay_stats *out) {
  *out = r->st;
  out->reservations = r->n_res;
  out->circuits = r->n_circ;
  out->reserved_on = 0;
  for (const wanted *w = r->want; w; w = w->next) out->reserved_on += w->state == W_RESERVED;
}

static void short_id(const gw_id *id, char out[GW_ID_SHORT_LEN + 1]) { gw_id_to_short(id, out); }

static int send_body(p2p_relay *r, const gw_id *to, int type, const uint8_t *body, size_t len) {
  p2p_msg m = {.type = (uint32_t)type, .body = body, .body_len = len};
  return p2p_host_relay_send(r->h, to, &m);
}

/* ---- server: reservations ---- */

static reservation *find_reservation(p2p_relay *r, const gw_id *peer) {
  for (reservation *v = r->res; v; v = v->next)
    if (gw_id_eq(&v->peer, peer)) return v;
  return NULL;
}

static void drop_reservation(p2p_relay *r, const gw_id *peer) {
  for (reservation **pp = &r->res; *pp; pp = &(*pp)->next)
    if (gw_id_eq(&(*pp)->peer, peer)) {
      reservation *v = *pp;
      *pp = v->next;
      free(v);
      r->n_res--;
      return;
    }
}

static void got_reserve(p2p_relay *r, const gw_id *from) {
  uint64_t now = gw_clock_mono_ms();
  int status = GWTF__RELAY_STATUS__RELAY_OK;
  reservation *v = find_reservation(r, from);
  p2p_reachability reach;
  p2p_host_reachability(r->h, &reach);
  if (!r->serve)
    status = GWTF__RELAY_STATUS__RELAY_OFF;
  else if (reach.status == P2P_REACH_PRIVATE) /* nobody could reach us to open a circuit */
    status = GWTF__RELAY_STATUS__RELAY_PRIVATE;
  else if (!v && r->n_res >= r->cfg.max_reservations)
    status = GWTF__RELAY_STATUS__RELAY_TOO_MANY_RESERVATIONS;
  else if (!v && !(v = calloc(1, sizeof(*v))))
    status = GWTF__RELAY_STATUS__RELAY_TOO_MANY_RESERVATIONS; /* out of memory: say busy */
  else if (!v->expires_ms) {
    v->peer = *from;
    v->next = r->res;
    r->res = v;
    r->n_res++;
  }
  char peer[GW_ID_SHORT_LEN + 1];
  short_id(from, peer);
  Gwtf__RelayReserved m = GWTF__RELAY_RESERVED__INIT;
  m.status = (Gwtf__RelayStatus)status;
  if (status == GWTF__RELAY_STATUS__RELAY_OK) {
    v->expires_ms = now + (uint64_t)r->cfg.reservation_s * 1000;
    m.expires_s = r->cfg.reservation_s;
    m.max_circuits = r->cfg.max_circuits;
    m.max_bytes_per_s = r->cfg.max_bytes_per_s;
    m.max_bytes = r->cfg.max_bytes;
    m.lifetime_s = r->cfg.circuit_lifetime_s;
    GW_INFO(r->log, "relay.reservation", "peer=\"%s\" expires_s=%u reservations=%u", peer, r->cfg.reservation_s,
            r->n_res);
  } else {
    r->st.reservations_refused++;
    GW_WARN(r->log, "relay.refused", "reason=%s kind=reservation peer=\"%s\" reservations=%u",
            p2p_relay_status_name(status), peer, r->n_res);
  }
  uint8_t body[64];
  size_t n = gwtf__relay_reserved__pack(&m, body);
  send_body(r, from, GWTF__MSG_TYPE__MSG_RELAY_RESERVED, body, n);
}

/* ---- server: circuits ---- */

static circuit *circuit_of(p2p_relay *r, const p2p_session *s, int *dir) {
  for (circuit *c = r->circ; c; c = c->next)
    for (int i = 0; i < 2; i++)
      if (c->leg[i] == s) {
        if (dir) *dir = i;
        return c;
      }
  return NULL;
}

static void write_status(p2p_session *s, int status) {
  uint8_t *rec = malloc(P2P_RELAY_STATUS_BYTES);
  if (!rec) return;
  p2p_relay_status_record(status, rec);
  p2p_session_pipe_write(s, rec, P2P_RELAY_STATUS_BYTES);
}

/* Says no on a leg that belongs to no circuit, and lets it go. */
static void refuse_leg(p2p_relay *r, p2p_session *s, int status, const char *kind, const gw_id *target) {
  char addr[GW_ADDR_STRLEN], t[GW_ID_SHORT_LEN + 1] = "-";
  gw_addr_format(&p2p_session_get_info(s)->remote, addr);
  if (target) short_id(target, t);
  r->st.circuits_refused++;
  GW_WARN(r->log, "relay.refused", "reason=%s kind=%s target=\"%s\" from=%s circuits=%u",
          p2p_relay_status_name(status), kind, t, addr, r->n_circ);
  write_status(s, status);
  p2p_session_pipe_end(s);
}

static void circuit_free(p2p_relay *r, circuit *c) {
  for (circuit **pp = &r->circ; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      r->n_circ--;
      break;
    }
  free(c);
}

/* Ends a circuit: both legs flush what they hold and half-close, so each end
 * sees its session's stream end (and the dialler of a circuit that never
 * opened reads why first). */
static void circuit_close(p2p_relay *r, circuit *c, const char *reason, int status) {
  if (c->closing) return;
  c->closing = true;
  char t[GW_ID_SHORT_LEN + 1];
  short_id(&c->target, t);
  uint64_t now = gw_clock_mono_ms();
  if (c->open)
    GW_INFO(r->log, "relay.circuit_closed",
            "target=\"%s\" from=%s reason=%s bytes=%llu bytes_d2p=%llu bytes_p2d=%llu up_ms=%llu", t, c->from, reason,
            (unsigned long long)(c->bytes[0] + c->bytes[1]), (unsigned long long)c->bytes[0],
            (unsigned long long)c->bytes[1], (unsigned long long)(now - c->opened_ms));
  else {
    r->st.circuits_refused++;
    GW_WARN(r->log, "relay.refused", "reason=%s kind=circuit target=\"%s\" from=%s circuits=%u", reason, t, c->from,
            r->n_circ);
  }
  for (int i = 0; i < 2; i++) {
    if (!c->leg[i]) continue;
    if (!c->open && i == DIR_D2P && status) write_status(c->leg[i], status);
    p2p_session_pipe_end(c->leg[i]);
  }
  if (!c->leg[0] && !c->leg[1]) circuit_free(r, c);
}

static void got_connect(p2p_relay *r, p2p_session *s, const gw_id *target) {
  reservation *v = find_reservation(r, target);
  uint64_t now = gw_clock_mono_ms();
  if (!r->serve) return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_OFF, "circuit", target);
  if (!v || v->expires_ms <= now || !p2p_host_relay_peer_up(r->h, target))
    return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_NO_RESERVATION, "circuit", target);
  if (r->n_circ >= r->cfg.max_circuits)
    return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_TOO_MANY_CIRCUITS, "circuit", target);
  circuit *c = calloc(1, sizeof(*c));
  if (!c) return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_TOO_MANY_CIRCUITS, "circuit", target);
  c->leg[DIR_D2P] = s;
  c->target = *target;
  c->started_ms = now;
  randombytes_buf(c->token, sizeof(c->token));
  gw_addr_format(&p2p_session_get_info(s)->remote, c->from);
  c->next = r->circ;
  r->circ = c;
  r->n_circ++;
  p2p_session_pipe_pause(s, true); /* nothing may pass before the target is there */
  Gwtf__RelayIncoming m = GWTF__RELAY_INCOMING__INIT;
  m.token = (ProtobufCBinaryData){sizeof(c->token), c->token};
  m.from = c->from;
  uint8_t body[128];
  size_t n = gwtf__relay_incoming__pack(&m, body);
  if (send_body(r, target, GWTF__MSG_TYPE__MSG_RELAY_INCOMING, body, n) != 0)
    circuit_close(r, c, "no-reservation", GWTF__RELAY_STATUS__RELAY_NO_RESERVATION);
}

static void rate_refill(p2p_relay *r, circuit *c, uint64_t now) {
  if (!r->cfg.max_bytes_per_s) return;
  double rate = (double)r->cfg.max_bytes_per_s, cap = rate * RATE_BURST_S;
  if (cap < RATE_BURST_MIN) cap = RATE_BURST_MIN;
  c->tokens += rate * (double)(now - c->tokens_ms) / 1000.0;
  if (c->tokens > cap) c->tokens = cap;
  c->tokens_ms = now;
}

static void got_accept(p2p_relay *r, p2p_session *s, const uint8_t *token) {
  circuit *c = NULL;
  for (circuit *k = r->circ; k; k = k->next)
    if (!k->open && !k->closing && !k->leg[DIR_P2D] && sodium_memcmp(k->token, token, sizeof(k->token)) == 0) c = k;
  if (!c) return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_BAD_TOKEN, "accept", NULL);
  c->leg[DIR_P2D] = s;
  c->open = true;
  c->opened_ms = c->tokens_ms = gw_clock_mono_ms();
  c->tokens = 1e300;
  rate_refill(r, c, c->opened_ms); /* starts with a full bucket */
  r->st.circuits_opened++;
  /* Each end reads the status before any byte of the other. */
  write_status(c->leg[DIR_P2D], GWTF__RELAY_STATUS__RELAY_OK);
  write_status(c->leg[DIR_D2P], GWTF__RELAY_STATUS__RELAY_OK);
  p2p_session_pipe_pause(c->leg[DIR_D2P], false);
  char t[GW_ID_SHORT_LEN + 1];
  short_id(&c->target, t);
  GW_INFO(r->log, "relay.circuit_open", "target=\"%s\" from=%s circuits=%u setup_ms=%llu", t, c->from, r->n_circ,
          (unsigned long long)(c->opened_ms - c->started_ms));
}

void p2p_relay_on_preface(p2p_relay *r, p2p_session *s, const uint8_t *pre) {
  if (pre[4] != P2P_RELAY_VERSION) return refuse_leg(r, s, GWTF__RELAY_STATUS__RELAY_BAD_PREFACE, "preface", NULL);
  if (memcmp(pre, MAGIC_CONNECT, 4) == 0) {
    gw_id target;
    memcpy(target.b, pre + 8, sizeof(target.b));
    got_connect(r, s, &target);
  } else {
    got_accept(r, s, pre + 8);
  }
}

static void leg_resume(circuit *c, int i) {
  if (c->leg[i] && !c->backpressure[i] && !c->rate_paused) p2p_session_pipe_pause(c->leg[i], false);
}

void p2p_relay_on_pipe_data(p2p_relay *r, p2p_session *s, uint8_t *buf, size_t len) {
  int dir = 0;
  circuit *c = circuit_of(r, s, &dir);
  if (!c || c->closing || !c->open || !c->leg[!dir]) {
    free(buf);
    /* Bytes before the status: the dialler did not wait, which the protocol forbids. */
    if (c && !c->closing && !c->open) circuit_close(r, c, "early-data", GWTF__RELAY_STATUS__RELAY_BAD_PREFACE);
    return;
  }
  uint64_t total = c->bytes[0] + c->bytes[1] + len;
  if (r->cfg.max_bytes && total > r->cfg.max_bytes) {
    free(buf);
    circuit_close(r, c, "max-bytes", 0);
    return;
  }
  uint64_t flip = r->cfg.test_flip_at;
  if (flip && dir == DIR_D2P && flip > c->bytes[dir] && flip <= c->bytes[dir] + len)
    buf[flip - c->bytes[dir] - 1] ^= 0x01;
  c->bytes[dir] += len;
  r->st.bytes_relayed += len;
  p2p_session *out = c->leg[!dir];
  if (p2p_session_pipe_write(out, buf, len) != 0) return; /* out is closing: its close ends the circuit */
  if (p2p_session_queued(out) > PIPE_HIGH_WATER) {
    c->backpressure[dir] = true;
    p2p_session_pipe_pause(s, true);
  }
  if (r->cfg.max_bytes_per_s) {
    c->tokens -= (double)len;
    if (c->tokens < 0 && !c->rate_paused) {
      c->rate_paused = true;
      p2p_session_pipe_pause(c->leg[0], true);
      p2p_session_pipe_pause(c->leg[1], true);
    }
  }
}

void p2p_relay_on_pipe_drained(p2p_relay *r, p2p_session *s) {
  int dir = 0;
  circuit *c = circuit_of(r, s, &dir);
  if (!c || c->closing || !c->open) return;
  /* s's queue drained: the leg that feeds it may be read again. */
  if (c->backpressure[!dir]) {
    c->backpressure[!dir] = false;
    leg_resume(c, !dir);
  }
}

void p2p_relay_on_pipe_closed(p2p_relay *r, p2p_session *s, const char *why) {
  int dir = 0;
  circuit *c = circuit_of(r, s, &dir);
  if (!c) return;
  c->leg[dir] = NULL;
  if (!c->closing) {
    char reason[48];
    snprintf(reason, sizeof(reason), "%s-%s", dir == DIR_D2P ? "dialler" : "target",
             why && !strcmp(why, "eof") ? "closed" : "lost");
    /* circuit_close keeps no pointer to reason: it logs it at once. */
    circuit_close(r, c, reason, GWTF__RELAY_STATUS__RELAY_TARGET_TIMEOUT);
    return; /* freed there when this was the last leg */
  }
  if (!c->leg[0] && !c->leg[1]) circuit_free(r, c);
}

/* ---- client ---- */

static wanted *find_wanted(p2p_relay *r, const gw_id *relay) {
  for (wanted *w = r->want; w; w = w->next)
    if (gw_id_eq(&w->relay, relay)) return w;
  return NULL;
}

int p2p_relay_want(p2p_relay *r, const gw_id *relay, const gw_addr *relay_addr) {
  wanted *w = find_wanted(r, relay);
  if (w) {
    w->addr = *relay_addr;
    return 0;
  }
  if (!(w = calloc(1, sizeof(*w)))) return GW_ENOMEM;
  w->relay = *relay;
  w->addr = *relay_addr;
  w->next = r->want;
  r->want = w;
  return 0;
}

void p2p_relay_unwant(p2p_relay *r, const gw_id *relay) {
  for (wanted **pp = &r->want; *pp; pp = &(*pp)->next)
    if (gw_id_eq(&(*pp)->relay, relay)) {
      wanted *w = *pp;
      *pp = w->next;
      free(w);
      return;
    }
}

size_t p2p_relay_list(const p2p_relay *r, p2p_relay_resv *out, size_t max) {
  size_t n = 0;
  uint64_t now = gw_clock_mono_ms();
  for (const wanted *w = r->want; w; w = w->next, n++)
    if (n < max) /* a renewal in flight keeps the reservation it renews */
      out[n] = (p2p_relay_resv){.relay = w->relay, .addr = w->addr,
                                .reserved = w->state == W_RESERVED || (w->state == W_ASKED && w->expires_ms > now),
                                .asked = w->state == W_ASKED, .refused = w->refused};
  return n;
}

static void got_reserved(p2p_relay *r, const gw_id *from, const p2p_msg *msg) {
  wanted *w = find_wanted(r, from);
  Gwtf__RelayReserved *m = gwtf__relay_reserved__unpack(NULL, msg->body_len, msg->body);
  if (!w || !m) {
    if (m) gwtf__relay_reserved__free_unpacked(m, NULL);
    return;
  }
  uint64_t now = gw_clock_mono_ms();
  char relay[GW_ID_SHORT_LEN + 1], addr[GW_ADDR_STRLEN];
  short_id(from, relay);
  gw_addr_format(&w->addr, addr);
  if (m->status == GWTF__RELAY_STATUS__RELAY_OK && m->expires_s > 0) {
    bool renewal = w->state == W_ASKED && w->expires_ms > now;
    w->state = W_RESERVED;
    w->refused = 0;
    w->expires_ms = now + (uint64_t)m->expires_s * 1000;
    w->next_ms = now + (uint64_t)m->expires_s * 500; /* renew halfway */
    GW_INFO(r->log, "relay.reserved",
            "relay=\"%s\" addr=%s expires_s=%u max_circuits=%u max_bytes_per_s=%llu max_bytes=%llu lifetime_s=%u "
            "renewal=%s",
            relay, addr, m->expires_s, m->max_circuits, (unsigned long long)m->max_bytes_per_s,
            (unsigned long long)m->max_bytes, m->lifetime_s, renewal ? "yes" : "no");
  } else {
    w->state = W_NONE;
    w->refused = m->status == GWTF__RELAY_STATUS__RELAY_OK ? GWTF__RELAY_STATUS__RELAY_OFF : (int)m->status;
    w->next_ms = now + RESERVE_RETRY_MS;
    GW_WARN(r->log, "relay.reserve_refused", "relay=\"%s\" addr=%s reason=%s retry_ms=%u", relay, addr,
            p2p_relay_status_name((int)m->status), (unsigned)RESERVE_RETRY_MS);
  }
  gwtf__relay_reserved__free_unpacked(m, NULL);
}

static void got_incoming(p2p_relay *r, const gw_id *from, const p2p_msg *msg) {
  wanted *w = find_wanted(r, from);
  Gwtf__RelayIncoming *m = gwtf__relay_incoming__unpack(NULL, msg->body_len, msg->body);
  /* Only a relay we reserved on may make us dial, and only back to itself. */
  if (w && w->state != W_NONE && m && m->token.len == P2P_RELAY_TOKEN_BYTES) {
    uint8_t pre[P2P_RELAY_PREFACE_BYTES];
    p2p_relay_preface_accept(m->token.data, pre);
    char relay[GW_ID_SHORT_LEN + 1], from_s[GW_ADDR_STRLEN + 8];
    short_id(from, relay);
    snprintf(from_s, sizeof(from_s), "%s", m->from ? m->from : "-");
    for (char *p = from_s; *p; p++)
      if (*p <= 32 || *p >= 127 || *p == '"' || *p == '=') *p = '_'; /* the relay's word, in our log */
    int rc = p2p_host_relay_dial_back(r->h, &w->addr, pre);
    GW_INFO(r->log, "relay.incoming", "relay=\"%s\" from=%s dial=%s", relay, from_s, rc == 0 ? "ok" : gw_strerror(rc));
  }
  if (m) gwtf__relay_incoming__free_unpacked(m, NULL);
}

void p2p_relay_on_message(p2p_relay *r, const gw_id *from, const p2p_msg *msg) {
  switch (msg->type) {
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVE: got_reserve(r, from); break;
  case GWTF__MSG_TYPE__MSG_RELAY_RESERVED: got_reserved(r, from, msg); break;
  case GWTF__MSG_TYPE__MSG_RELAY_INCOMING: got_incoming(r, from, msg); break;
  default: break;
  }
}

void p2p_relay_on_peer_down(p2p_relay *r, const gw_id *id) {
  drop_reservation(r, id); /* a reservation lives as long as its session */
  wanted *w = find_wanted(r, id);
  if (w && w->state != W_NONE) {
    char relay[GW_ID_SHORT_LEN + 1];
    short_id(id, relay);
    GW_INFO(r->log, "relay.reservation_lost", "relay=\"%s\"", relay);
    w->state = W_NONE;
    w->expires_ms = 0;
    w->next_ms = 0; /* ask again as soon as the session is back */
  }
}

void p2p_relay_tick(p2p_relay *r, uint64_t now) {
  for (reservation **pp = &r->res; *pp;) {
    if ((*pp)->expires_ms <= now) {
      reservation *v = *pp;
      *pp = v->next;
      free(v);
      r->n_res--;
    } else {
      pp = &(*pp)->next;
    }
  }
  for (circuit *c = r->circ, *next; c; c = next) {
    next = c->next; /* circuit_close may free c */
    if (c->closing) continue;
    if (!c->open && now >= c->started_ms + r->cfg.connect_back_ms) {
      circuit_close(r, c, "target-timeout", GWTF__RELAY_STATUS__RELAY_TARGET_TIMEOUT);
    } else if (c->open && r->cfg.circuit_lifetime_s && now >= c->opened_ms + (uint64_t)r->cfg.circuit_lifetime_s * 1000) {
      circuit_close(r, c, "lifetime", 0);
    } else if (c->open && r->cfg.max_bytes_per_s) {
      rate_refill(r, c, now);
      if (c->rate_paused && c->tokens >= 0) {
        c->rate_paused = false;
        leg_resume(c, 0);
        leg_resume(c, 1);
      }
    }
  }
  for (wanted *w = r->want; w; w = w->next) {
    if (!p2p_host_relay_peer_up(r->h, &w->relay)) continue;
    if (w->state == W_ASKED && now >= w->next_ms) w->state = W_NONE; /* unanswered: ask again */
    if (w->state == W_ASKED || now < w->next_ms) continue;
    uint8_t body[8];
    Gwtf__RelayReserve m = GWTF__RELAY_RESERVE__INIT;
    size_t n = gwtf__relay_reserve__pack(&m, body);
    if (send_body(r, &w->relay, GWTF__MSG_TYPE__MSG_RELAY_RESERVE, body, n) == 0) {
      w->state = W_ASKED;
      w->next_ms = now + RESERVE_ANSWER_MS;
    }
  }
}
