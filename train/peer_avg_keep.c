/* train/peer_avg_keep.c — the averages a member keeps for the peers it
 * just served its state.
 *
 * A joiner's download is a snapshot of round i's state; while it crosses
 * the link the stage ends rounds i, i+1, ... When the link is slower than
 * a few of the stage's rounds (a home uplink, a stage that aggregates
 * fast), every snapshot was stale on arrival and the joiner fetched again
 * for ever. Instead it steps through the rounds it missed with their
 * averages, asked of us one by one (join_round_applied), and we keep those
 * averages for it: each one we replace as our last (peer_agg.c, peer_avg.c)
 * moves here, with its list and its aggregator's signature as it came, so
 * the joiner checks it as any member would.
 *
 * Kept only while a peer we served may still ask (the window finish_round
 * sends our next average to served peers in), at most PEER_KEEP_AVGS:
 * a download that took more rounds than that is fetched again, as before.
 * The memory is PEER_KEEP_AVGS averages of the stage's parameters at most,
 * and none once nobody we served is catching up. */
#include "train/peer_agg.h"

#include <stdlib.h>
#include <string.h>

/* How long after we served a peer it may still ask for the averages since. */
static uint64_t keep_window_ms(const train_peer *p) { return 4 * p->cfg.tun.agg_timeout_ms; }

static bool served_lately(const train_peer *p, const gw_id *who) {
  for (size_t i = 0; i < sizeof(p->served) / sizeof(p->served[0]); i++)
    if (p->served[i].at_ms && p->now - p->served[i].at_ms < keep_window_ms(p) &&
        (!who || gw_id_eq(&p->served[i].id, who)))
      return true;
  return false;
}

void avgkeep_free(train_peer *p) {
  peer_agg *a = &p->agg;
  for (uint32_t i = 0; i < a->n_kept; i++) free(a->kept[i].avg);
  a->n_kept = 0;
}

void avgkeep_push_last(train_peer *p) {
  peer_agg *a = &p->agg;
  if (!served_lately(p, NULL)) {
    avgkeep_free(p);
    free(a->last_avg);
    a->last_avg = NULL;
    return;
  }
  if (!a->have_last_avg) {
    free(a->last_avg);
    a->last_avg = NULL;
    return;
  }
  if (a->n_kept == PEER_KEEP_AVGS) {
    free(a->kept[0].avg);
    memmove(&a->kept[0], &a->kept[1], (PEER_KEEP_AVGS - 1) * sizeof(a->kept[0]));
    a->n_kept--;
  }
  peer_avg_kept *k = &a->kept[a->n_kept++];
  k->iteration = a->last_avg_iteration;
  k->avg = a->last_avg; /* the floats move: last_avg gets the next one */
  k->total_count = a->last_avg_total_count;
  k->sig = a->last_sig;
  k->n_contributors = a->n_last_contributors;
  memcpy(k->contributors, a->last_contributors, a->n_last_contributors * sizeof(gw_id));
  memcpy(k->hashes, a->last_contrib_hashes, a->n_last_contributors * 32);
  a->last_avg = NULL;
}

bool avgkeep_answer(train_peer *p, const gw_id *to, uint64_t iteration) {
  peer_agg *a = &p->agg;
  if (!served_lately(p, to)) return false;
  /* newest first: a round applied twice (a split healed) counts as its last */
  for (uint32_t i = a->n_kept; i-- > 0;) {
    peer_avg_kept *k = &a->kept[i];
    if (k->iteration != iteration) continue;
    agg_send_avg(p, to, k->avg, k->total_count, k->contributors, k->hashes, k->n_contributors, k->iteration,
                 &k->sig);
    return true;
  }
  return false;
}
