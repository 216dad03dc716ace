/* test/flow/flowtest.h — a capturing gw_io for driving one flow instance by
 * hand: what it sends is kept and decoded, what it receives is built here. */
#ifndef GWTF_TEST_FLOWTEST_H
#define GWTF_TEST_FLOWTEST_H

#include "testutil.h"

#include "flow/flow.h"
#include "proto/flow.pb-c.h"
#include "util/err.h"
#include "util/rng.h"

#include <math.h>

/* cmocka 1.1 has no assert_double_equal. */
#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (double)(eps))

#define CAP_MAX_MSGS (4096)

typedef struct cap_msg {
  gw_id to;
  uint8_t *buf;
  size_t len;
} cap_msg;

typedef struct cap_io {
  cap_msg msgs[CAP_MAX_MSGS];
  int n;
  gw_rng rng;
  uint64_t tick_at;
  int ticks_asked;
  flow_event events[256];
  int n_events;
} cap_io;

static inline int cap_send(void *ud, const gw_peer *to, const uint8_t *buf, size_t len) {
  cap_io *c = ud;
  if (c->n >= CAP_MAX_MSGS) return GW_EFULL;
  c->msgs[c->n].to = to->id;
  c->msgs[c->n].buf = malloc(len ? len : 1);
  memcpy(c->msgs[c->n].buf, buf, len);
  c->msgs[c->n].len = len;
  c->n++;
  return 0;
}

static inline void cap_want_tick(void *ud, uint64_t at) {
  cap_io *c = ud;
  c->tick_at = at;
  c->ticks_asked++;
}

static inline void cap_random(void *ud, void *buf, size_t len) { gw_rng_bytes(&((cap_io *)ud)->rng, buf, len); }

static inline void cap_event(void *ud, const flow_event *ev) {
  cap_io *c = ud;
  if (c->n_events < 256) c->events[c->n_events++] = *ev;
}

static inline void cap_clear(cap_io *c) {
  for (int i = 0; i < c->n; i++) free(c->msgs[i].buf);
  c->n = 0;
  c->n_events = 0;
}

static inline gw_io cap_gw_io(cap_io *c, uint64_t seed) {
  memset(c, 0, sizeof(*c));
  gw_rng_seed(&c->rng, seed);
  return (gw_io){.ud = c, .send = cap_send, .want_tick = cap_want_tick, .random = cap_random};
}

static inline gw_id test_id(const char *name) {
  gw_id id;
  gw_id_hash_str(name, &id);
  return id;
}

/* The captured messages to `to` of kind `kind`, decoded (NULL when none).
 * The k-th one (0-based) when there are several. Free with
 * gwtf__flow_message__free_unpacked. */
static inline Gwtf__FlowMessage *cap_find(cap_io *c, const gw_id *to, Gwtf__FlowMessage__MsgCase kind, int k) {
  for (int i = 0; i < c->n; i++) {
    if (!gw_id_eq(&c->msgs[i].to, to)) continue;
    Gwtf__FlowMessage *m = gwtf__flow_message__unpack(NULL, c->msgs[i].len, c->msgs[i].buf);
    if (m && m->msg_case == kind && k-- == 0) return m;
    if (m) gwtf__flow_message__free_unpacked(m, NULL);
  }
  return NULL;
}

static inline int cap_count(cap_io *c, const gw_id *to, Gwtf__FlowMessage__MsgCase kind) {
  int n = 0;
  for (Gwtf__FlowMessage *m; (m = cap_find(c, to, kind, n)) != NULL; n++) gwtf__flow_message__free_unpacked(m, NULL);
  return n;
}

static inline int cap_events(const cap_io *c, flow_event_kind kind) {
  int n = 0;
  for (int i = 0; i < c->n_events; i++) n += c->events[i].kind == kind;
  return n;
}

/* Packs m and hands it to f as coming from `from`. */
static inline int deliver(flow *f, const gw_id *from, Gwtf__FlowMessage *m, uint64_t now) {
  size_t len = gwtf__flow_message__get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  gwtf__flow_message__pack(m, buf);
  gw_peer p;
  memset(&p, 0, sizeof(p));
  p.id = *from;
  int rc = flow_on_message(f, &p, buf, len, now);
  free(buf);
  return rc;
}

static inline ProtobufCBinaryData idb(const gw_id *id) { return (ProtobufCBinaryData){GW_ID_BYTES, (uint8_t *)id->b}; }

#endif
