/* node/swarm_val.c — see swarm_val.h. */
#include "node/swarm_val.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define SWARM_VAL_MAX 100001 /* evaluated iterations kept (the swarm's iteration limit + the final one) */

typedef struct val_rec {
  uint64_t iteration;
  double loss_tokens; /* sum of val_loss x tokens */
  double tokens, wanted;
  int reports;
  bool complete;
} val_rec;

struct swarm_val {
  val_rec *recs;
  size_t n, cap;
};

swarm_val *swarm_val_new(void) { return calloc(1, sizeof(swarm_val)); }

void swarm_val_free(swarm_val *v) {
  if (!v) return;
  free(v->recs);
  free(v);
}

static double num(json_t *ev, const char *key) {
  json_t *x = json_object_get(ev, key);
  return json_is_number(x) ? json_number_value(x) : NAN;
}

/* The record of `iteration`, kept in iteration order; NULL when full. */
static val_rec *rec_for(swarm_val *v, uint64_t iteration) {
  size_t i = 0;
  while (i < v->n && v->recs[i].iteration < iteration) i++;
  if (i < v->n && v->recs[i].iteration == iteration) return &v->recs[i];
  if (v->n == SWARM_VAL_MAX) return NULL;
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 16;
    val_rec *r = realloc(v->recs, cap * sizeof(*r));
    if (!r) return NULL;
    v->recs = r;
    v->cap = cap;
  }
  for (size_t k = v->n; k > i; k--) v->recs[k] = v->recs[k - 1];
  v->n++;
  v->recs[i] = (val_rec){.iteration = iteration, .complete = true};
  return &v->recs[i];
}

void swarm_val_event(swarm_val *v, json_t *ev) {
  double it = num(ev, "iter"), loss = num(ev, "val_loss"), tokens = num(ev, "tokens"), wanted = num(ev, "wanted");
  if (!v || !isfinite(it) || it < 0 || it >= SWARM_VAL_MAX || !isfinite(tokens) || tokens < 0) return;
  val_rec *r = rec_for(v, (uint64_t)it);
  if (!r) return;
  r->reports++;
  if (isfinite(loss) && tokens > 0) {
    r->loss_tokens += loss * tokens;
    r->tokens += tokens;
  }
  if (isfinite(wanted)) r->wanted += wanted;
  if (!isfinite(wanted) || tokens < wanted || !isfinite(loss)) r->complete = false;
}

json_t *swarm_val_json(const swarm_val *v) {
  json_t *a = json_array();
  for (size_t i = 0; v && i < v->n; i++) {
    const val_rec *r = &v->recs[i];
    json_array_append_new(a, json_pack("{s:I,s:o,s:I,s:I,s:i,s:b}", "iteration", (json_int_t)r->iteration,
                                       "val_loss", r->tokens > 0 ? json_real(r->loss_tokens / r->tokens) : json_null(),
                                       "tokens", (json_int_t)r->tokens, "wanted_tokens", (json_int_t)r->wanted,
                                       "reports", r->reports, "complete", r->complete));
  }
  return a;
}

void swarm_val_print(const swarm_val *v, FILE *out) {
  if (!v || v->n == 0) return;
  fprintf(out, "  validation loss (before iteration):");
  for (size_t i = 0; i < v->n; i++) {
    const val_rec *r = &v->recs[i];
    if (r->tokens > 0)
      fprintf(out, " %llu: %.4f%s", (unsigned long long)r->iteration, r->loss_tokens / r->tokens,
              r->complete ? "" : " (partial)");
    else
      fprintf(out, " %llu: none", (unsigned long long)r->iteration);
  }
  fprintf(out, "\n");
}
