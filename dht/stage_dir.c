#include "dht/stage_dir.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dht.pb-c.h"
#include "util/err.h"

/* ---- keys ---- */

static bool name_ok(const char *s, size_t len) {
  if (len == 0 || len > STAGE_DIR_NAME_MAX) return false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

int stage_dir_run_key(const char *run, gw_id *out) {
  char key[STAGE_DIR_KEY_MAX];
  if (!run || !name_ok(run, strlen(run))) return GW_EINVAL;
  snprintf(key, sizeof(key), "run/%s", run);
  gw_id_hash_str(key, out);
  return 0;
}

int stage_dir_stage_key(const char *run, uint32_t stage, gw_id *out) {
  char key[STAGE_DIR_KEY_MAX];
  if (!run || !name_ok(run, strlen(run))) return GW_EINVAL;
  snprintf(key, sizeof(key), "run/%s/stage/%" PRIu32, run, stage);
  gw_id_hash_str(key, out);
  return 0;
}

int stage_dir_replica_key(const char *run, uint32_t stage, gw_id *out) {
  char key[STAGE_DIR_KEY_MAX + 8];
  if (!run || !name_ok(run, strlen(run))) return GW_EINVAL;
  snprintf(key, sizeof(key), "run/%s/replica/%" PRIu32, run, stage);
  gw_id_hash_str(key, out);
  return 0;
}

int stage_dir_parse(const char *s, char *run, size_t run_len, int64_t *stage) {
  if (!s || strncmp(s, "run/", 4) != 0) return GW_EINVAL;
  const char *name = s + 4, *slash = strchr(name, '/');
  size_t len = slash ? (size_t)(slash - name) : strlen(name);
  if (!name_ok(name, len) || len >= run_len) return GW_EINVAL;
  *stage = -1;
  if (slash) {
    const char *num = slash + 1;
    if (strncmp(num, "stage/", 6) != 0) return GW_EINVAL;
    num += 6;
    char *end = NULL;
    unsigned long long v = strtoull(num, &end, 10);
    if (end == num || *end != '\0' || *num == '-' || *num == '+' || v > UINT32_MAX) return GW_EINVAL;
    *stage = (int64_t)v;
  }
  memcpy(run, name, len);
  run[len] = '\0';
  return 0;
}

/* ---- member records ---- */

static bool addr_ok(const gw_addr *a) { return (a->family == 4 || a->family == 6) && a->port != 0; }

int stage_member_encode(const stage_member *m, uint8_t *out, size_t cap, size_t *len) {
  if (!addr_ok(&m->addr)) return GW_EINVAL;
  if (m->extra_len > STAGE_DIR_EXTRA_MAX || m->n_relays > STAGE_DIR_MAX_RELAYS) return GW_ERANGE;
  Gwtf__DhtStageMember w = GWTF__DHT_STAGE_MEMBER__INIT;
  Gwtf__DhtRelay rw[STAGE_DIR_MAX_RELAYS], *rp[STAGE_DIR_MAX_RELAYS];
  for (size_t i = 0; i < m->n_relays; i++) {
    const stage_relay *r = &m->relays[i];
    if (!addr_ok(&r->addr)) return GW_EINVAL;
    gwtf__dht_relay__init(&rw[i]);
    rw[i].id = (ProtobufCBinaryData){sizeof(r->id.b), (uint8_t *)r->id.b};
    rw[i].ip = (ProtobufCBinaryData){r->addr.family == 4 ? 4 : 16, (uint8_t *)r->addr.ip};
    rw[i].port = r->addr.port;
    rp[i] = &rw[i];
  }
  w.ip = (ProtobufCBinaryData){m->addr.family == 4 ? 4 : 16, (uint8_t *)m->addr.ip};
  w.port = m->addr.port;
  w.capacity = m->capacity;
  w.load = m->load;
  w.extra = (ProtobufCBinaryData){m->extra_len, (uint8_t *)m->extra};
  w.no_direct = m->no_direct;
  w.n_relays = m->n_relays;
  w.relays = m->n_relays ? rp : NULL;
  size_t n = gwtf__dht_stage_member__get_packed_size(&w);
  if (n > cap) return GW_ERANGE;
  *len = gwtf__dht_stage_member__pack(&w, out);
  return 0;
}

static bool wire_addr(const ProtobufCBinaryData *ip, uint32_t port, gw_addr *out) {
  if ((ip->len != 4 && ip->len != 16) || port == 0 || port > 65535) return false;
  memset(out, 0, sizeof(*out));
  out->family = ip->len == 4 ? 4 : 6;
  memcpy(out->ip, ip->data, ip->len);
  out->port = (uint16_t)port;
  return true;
}

int stage_member_decode(const uint8_t *value, size_t len, stage_member *out, void **owned) {
  *owned = NULL;
  memset(out, 0, sizeof(*out));
  Gwtf__DhtStageMember *m = gwtf__dht_stage_member__unpack(NULL, len, value);
  if (!m) return GW_EPROTO;
  if (!wire_addr(&m->ip, m->port, &out->addr) || m->extra.len > STAGE_DIR_EXTRA_MAX) {
    gwtf__dht_stage_member__free_unpacked(m, NULL);
    return GW_EPROTO;
  }
  out->capacity = m->capacity;
  out->load = m->load;
  out->extra = m->extra.len ? m->extra.data : NULL;
  out->extra_len = m->extra.len;
  out->no_direct = m->no_direct;
  /* The publisher's word on its relays: malformed entries are skipped, the
   * count is capped, so a hostile record costs a reader nothing. */
  for (size_t i = 0; i < m->n_relays && out->n_relays < STAGE_DIR_MAX_RELAYS; i++) {
    const Gwtf__DhtRelay *r = m->relays[i];
    stage_relay *o = &out->relays[out->n_relays];
    if (!r || r->id.len != sizeof(o->id.b) || !wire_addr(&r->ip, r->port, &o->addr)) continue;
    memcpy(o->id.b, r->id.data, sizeof(o->id.b));
    if (gw_id_is_zero(&o->id)) continue;
    out->n_relays++;
  }
  *owned = m;
  return 0;
}

void stage_member_free_owned(void *owned) {
  if (owned) gwtf__dht_stage_member__free_unpacked(owned, NULL);
}

/* Decodes one record's value; *w must be freed by the caller on success. */
static int member_decode(const dht_record *r, stage_member *out, void **w) {
  int rc = stage_member_decode(r->value, r->value_len, out, w);
  if (rc != 0) return rc;
  out->id = r->publisher;
  out->remaining_ms = r->remaining_ms;
  return 0;
}

/* ---- announcing ---- */

static bool ip_unspecified(const gw_addr *a) {
  static const uint8_t zero[16];
  return memcmp(a->ip, zero, a->family == 4 ? 4 : 16) == 0;
}

static int announce_at(dht *d, const gw_id *key, const stage_member *me, uint64_t now_ms);

int stage_dir_announce(dht *d, const char *run, uint32_t stage, const stage_member *me, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_stage_key(run, stage, &key);
  return rc != 0 ? rc : announce_at(d, &key, me, now_ms);
}

int stage_dir_announce_replica(dht *d, const char *run, uint32_t stage, const stage_member *me, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_replica_key(run, stage, &key);
  return rc != 0 ? rc : announce_at(d, &key, me, now_ms);
}

int stage_dir_withdraw_replica(dht *d, const char *run, uint32_t stage, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_replica_key(run, stage, &key);
  return rc != 0 ? rc : dht_unpublish(d, &key, now_ms);
}

static int announce_at(dht *d, const gw_id *key, const stage_member *me, uint64_t now_ms) {
  uint8_t value[DHT_MAX_VALUE_BYTES];
  size_t len;
  int rc;
  stage_member m = *me;
  if (ip_unspecified(&m.addr)) {
    gw_addr seen;
    if (dht_observed_addr(d, &seen) != 0) return GW_EAGAIN;
    seen.port = me->addr.port;
    m.addr = seen;
  }
  rc = stage_member_encode(&m, value, sizeof(value), &len);
  return rc != 0 ? rc : dht_publish(d, key, value, len, NULL, NULL, now_ms);
}

int stage_dir_withdraw(dht *d, const char *run, uint32_t stage, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_stage_key(run, stage, &key);
  return rc != 0 ? rc : dht_unpublish(d, &key, now_ms);
}

int stage_dir_publish_run(dht *d, const char *run, const uint8_t *value, size_t len, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_run_key(run, &key);
  return rc != 0 ? rc : dht_publish(d, &key, value, len, NULL, NULL, now_ms);
}

/* ---- discovering ---- */

typedef struct discover_ctx {
  stage_members_cb members_cb;
  stage_runs_cb runs_cb;
  void *ud;
} discover_ctx;

static void on_member_records(void *ud, int status, const dht_record *recs, size_t n,
                              const dht_lookup_stats *st) {
  discover_ctx *ctx = ud;
  (void)st;
  stage_member *out = calloc(n ? n : 1, sizeof(*out));
  void **wire = calloc(n ? n : 1, sizeof(*wire));
  size_t m = 0;
  if (!out || !wire) status = status ? status : GW_ENOMEM;
  for (size_t i = 0; status == 0 && i < n; i++)
    if (member_decode(&recs[i], &out[m], &wire[m]) == 0) m++;
  ctx->members_cb(ctx->ud, status, out, status ? 0 : m);
  for (size_t i = 0; wire && i < m; i++) stage_member_free_owned(wire[i]);
  free(wire);
  free(out);
  free(ctx);
}

static void on_run_records(void *ud, int status, const dht_record *recs, size_t n, const dht_lookup_stats *st) {
  discover_ctx *ctx = ud;
  (void)st;
  stage_run *out = calloc(n ? n : 1, sizeof(*out));
  if (!out && status == 0) status = GW_ENOMEM;
  for (size_t i = 0; out && i < n; i++)
    out[i] = (stage_run){recs[i].publisher, recs[i].seq, recs[i].remaining_ms, recs[i].value, recs[i].value_len};
  ctx->runs_cb(ctx->ud, status, out, status ? 0 : n);
  free(out);
  free(ctx);
}

static int fetch_with(dht *d, const gw_id *key, dht_records_cb adapter, discover_ctx *proto, uint64_t now_ms) {
  discover_ctx *ctx = malloc(sizeof(*ctx));
  if (!ctx) return GW_ENOMEM;
  *ctx = *proto;
  int rc = dht_fetch(d, key, adapter, ctx, now_ms);
  if (rc != 0) free(ctx);
  return rc;
}

int stage_dir_discover(dht *d, const char *run, uint32_t stage, stage_members_cb cb, void *ud,
                       uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_stage_key(run, stage, &key);
  discover_ctx proto = {.members_cb = cb, .ud = ud};
  return rc != 0 ? rc : fetch_with(d, &key, on_member_records, &proto, now_ms);
}

int stage_dir_discover_replicas(dht *d, const char *run, uint32_t stage, stage_members_cb cb, void *ud,
                                uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_replica_key(run, stage, &key);
  discover_ctx proto = {.members_cb = cb, .ud = ud};
  return rc != 0 ? rc : fetch_with(d, &key, on_member_records, &proto, now_ms);
}

int stage_dir_find_run(dht *d, const char *run, stage_runs_cb cb, void *ud, uint64_t now_ms) {
  gw_id key;
  int rc = stage_dir_run_key(run, &key);
  discover_ctx proto = {.runs_cb = cb, .ud = ud};
  return rc != 0 ? rc : fetch_with(d, &key, on_run_records, &proto, now_ms);
}
