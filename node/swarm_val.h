/* node/swarm_val.h — the validation curve of a `gwtf swarm`: what its data
 * nodes' eval.done lines said (train/peer_eval.c), per evaluated iteration.
 *
 * Several data nodes evaluate the same validation set each: an iteration's
 * val_loss is their token-weighted mean, `tokens` what came back of the
 * `wanted_tokens`, and `complete` whether every report covered the whole
 * set (under churn an eval microbatch may not come back: a partial value is
 * the mean over fewer microbatches, kept but flagged). */
#ifndef GWTF_NODE_SWARM_VAL_H
#define GWTF_NODE_SWARM_VAL_H

#include <jansson.h>
#include <stdio.h>

typedef struct swarm_val swarm_val;

swarm_val *swarm_val_new(void);
void swarm_val_free(swarm_val *v);
/* One eval.done event (a child's JSON log line). */
void swarm_val_event(swarm_val *v, json_t *ev);
/* [{"iteration", "val_loss" (null: nothing came back), "tokens",
 *   "wanted_tokens", "reports", "complete"}, ...] by iteration. */
json_t *swarm_val_json(const swarm_val *v);
/* The curve as lines of the printed summary (nothing when empty). */
void swarm_val_print(const swarm_val *v, FILE *out);

#endif
