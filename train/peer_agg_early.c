/* train/peer_agg_early.c — gradients for a round we have not reached yet.
 *
 * A member that got ready on an older state than its stage's steps through
 * the averages it missed (catch-up, train/peer_join.c) while listed as a
 * member; with the lowest ID it is the aggregator its stage-mates pick for
 * the round the stage is in, rounds before it gets there. Their gradients
 * used to be dropped (not our iteration): once in the round it averaged
 * only its own, sent that back as the round's average and the stage
 * skipped the step, its microbatches lost (test_peer_resync's joiners,
 * swarm_rebalance_skewed on a loaded machine, 2026-12-07). Kept here, a
 * few rounds ahead at most, they go into the round as it begins. */
#include "train/peer_agg.h"

#include <stdlib.h>
#include <string.h>

#include "util/err.h"

#define EARLY_SLOTS (sizeof(((peer_agg *)0)->early) / sizeof(((peer_agg *)0)->early[0]))

static void early_drop(peer_agg *a, size_t i) {
  free(a->early[i].c.buf);
  memset(&a->early[i], 0, sizeof(a->early[i]));
}

/* The slot of `id`'s gradient for `iteration`, a free one, or NULL. */
static agg_contrib *early_slot(peer_agg *a, const gw_id *id, uint64_t iteration) {
  size_t free_at = EARLY_SLOTS;
  for (size_t i = 0; i < EARLY_SLOTS; i++) {
    if (!a->early[i].used) {
      if (free_at == EARLY_SLOTS) free_at = i;
      continue;
    }
    if (a->early[i].iteration == iteration && gw_id_eq(&a->early[i].c.id, id)) return &a->early[i].c;
  }
  if (free_at == EARLY_SLOTS) return NULL;
  a->early[free_at].used = true;
  a->early[free_at].iteration = iteration;
  a->early[free_at].c.id = *id;
  return &a->early[free_at].c;
}

bool agg_early_keep(train_peer *p, const gw_id *from, const Gwtf__TrainGrad *g, const train_tensor *t) {
  if (p->state != PEER_READY || g->iteration <= p->iteration || g->iteration > p->iteration + PEER_KEEP_AVGS ||
      !agg_grad_shape_ok(p, g, t))
    return false;
  agg_contrib *c = early_slot(&p->agg, from, g->iteration);
  if (!c) return false; /* as many rounds ahead as we keep: dropped, as before */
  if (g->offset == 0) {
    char who[GW_ID_SHORT_LEN + 1];
    peer_short(from, who);
    GW_DEBUG(&p->log, "aggregation.early_kept", "iter=%llu from=%s at=%llu", (unsigned long long)g->iteration, who,
             (unsigned long long)p->iteration);
  }
  agg_contrib_take(c, g, t, p->cfg.shape.n_params);
  return true;
}

void agg_early_take(train_peer *p) {
  peer_agg *a = &p->agg;
  for (size_t i = 0; i < EARLY_SLOTS; i++) {
    if (!a->early[i].used || a->early[i].iteration > a->iteration) continue;
    agg_contrib *c = a->early[i].iteration == a->iteration ? agg_contrib_for(a, &a->early[i].c.id) : NULL;
    if (c) {
      char who[GW_ID_SHORT_LEN + 1];
      peer_short(&a->early[i].c.id, who);
      GW_INFO(&p->log, "aggregation.early_taken", "iter=%llu from=%s complete=%d", (unsigned long long)a->iteration,
              who, a->early[i].c.complete);
      free(c->buf);
      *c = a->early[i].c;
      a->early[i].c.buf = NULL; /* the round owns it now */
    }
    early_drop(a, i);
  }
}

void agg_early_free(train_peer *p) {
  for (size_t i = 0; i < EARLY_SLOTS; i++) early_drop(&p->agg, i);
}
