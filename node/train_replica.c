/* node/train_replica.c — see train_replica.h. */
#include "node/train_replica.h"

#include <string.h>

#include "train/replica_store.h"
#include "util/err.h"

static void put_be64(uint8_t *b, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) b[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | b[i];
  return v;
}

void train_replica_extra_encode(uint8_t out[TRAIN_REPLICA_EXTRA_BYTES], uint64_t iteration, uint64_t step,
                                const uint8_t hash[32]) {
  put_be64(out, iteration);
  put_be64(out + 8, step);
  memcpy(out + 16, hash, 32);
}

int train_replica_extra_decode(const stage_member *m, train_replica_holder *h) {
  if (!m->extra || m->extra_len != TRAIN_REPLICA_EXTRA_BYTES) return GW_EPROTO;
  memset(h, 0, sizeof(*h));
  h->id = m->id;
  h->iteration = get_be64(m->extra);
  h->step = get_be64(m->extra + 8);
  memcpy(h->weights_hash, m->extra + 16, 32);
  return 0;
}

bool train_replica_due(const train_peer *p, int every, uint64_t iteration) {
  return every > 0 && iteration > 0 && iteration % (uint64_t)every == 0 && train_peer_replica_pusher(p);
}

static int announce_newest(dht *d, const char *run, const replica_entry *e, const stage_member *me, uint64_t now_ms) {
  uint8_t extra[TRAIN_REPLICA_EXTRA_BYTES];
  train_replica_extra_encode(extra, e->iteration, e->step, e->weights_hash);
  stage_member m = *me;
  m.extra = extra;
  m.extra_len = sizeof(extra);
  return stage_dir_announce_replica(d, run, (uint32_t)e->stage, &m, now_ms);
}

int train_replica_keep(dht *d, const char *run, const char *data_dir, const train_peer *p, int stage,
                       const stage_member *me, const gw_log *log, uint64_t now_ms) {
  const replica_entry *e = train_peer_replica(p, stage);
  if (!e) return GW_ENOENT;
  int rc = replica_save(data_dir, run, e);
  if (rc != 0)
    GW_ERROR(log, "replica.save_failed", "stage=%d iter=%llu err=\"%s\"", stage, (unsigned long long)e->iteration,
             gw_strerror(rc));
  int rc2 = announce_newest(d, run, e, me, now_ms);
  if (rc2 != 0)
    GW_WARN(log, "replica.announce_failed", "stage=%d iter=%llu err=\"%s\"", stage, (unsigned long long)e->iteration,
            gw_strerror(rc2));
  return rc ? rc : rc2;
}

void train_replica_drop(dht *d, const char *run, const char *data_dir, const train_peer *p, int stage,
                        uint64_t iteration, const stage_member *me, const gw_log *log, uint64_t now_ms) {
  int rc = replica_remove(data_dir, run, stage, iteration);
  if (rc != 0)
    GW_WARN(log, "replica.remove_failed", "stage=%d iter=%llu err=\"%s\"", stage, (unsigned long long)iteration,
            gw_strerror(rc));
  const replica_entry *e = train_peer_replica(p, stage);
  if (e)
    announce_newest(d, run, e, me, now_ms);
  else
    stage_dir_withdraw_replica(d, run, (uint32_t)stage, now_ms);
}
