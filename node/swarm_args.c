/* node/swarm_args.c — the command line of one `gwtf swarm` child (see swarm_args.h). */
#include "node/swarm_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "p2p/identity.h"
#include "util/err.h"

/* Entry i of a comma list, cycled ("1,2,3": relay 4 gets 2); NULL list: 0. */
static double list_entry(const char *list, int i) {
  if (!list || !*list) return 0;
  int n = 1;
  for (const char *c = list; *c; c++) n += *c == ',';
  i %= n;
  const char *c = list;
  while (i-- > 0) c = strchr(c, ',') + 1;
  return atof(c);
}

/* --slowdowns: each relay's compute slowdown (data nodes 1). */
static double relay_slowdown(const swarm_opts *o, const swarm_child *c) {
  double v = c->data ? 0 : list_entry(o->slowdowns, c->index - o->data_nodes);
  return v >= 1 ? v : 1.0;
}

/* --capacities: each relay's capacity, else --capacity. */
static int relay_capacity(const swarm_opts *o, const swarm_child *c) {
  double v = list_entry(o->capacities, c->index - o->data_nodes);
  return v >= 1 ? (int)v : o->capacity;
}

/* --join-stages: the stage relay c asks for on its first start (0: none). */
static int relay_join_stage(const swarm_opts *o, const swarm_child *c) {
  if (c->data || c->generation > 0) return 0;
  return (int)list_entry(o->join_stages, c->index - o->data_nodes);
}

/* Arguments longer than PATH_MAX are cut; the node then reports the bad path. */
static void set_arg(char *dst, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_arg(char *dst, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst, PATH_MAX, fmt, ap);
  va_end(ap);
}

/* --byzantine N:MODE: the last N of the relays started at once. */
bool swarm_child_byzantine(const swarm_opts *o, const swarm_child *c) {
  int first = o->data_nodes + o->relays - o->byzantine;
  return !c->data && !c->late && o->byzantine > 0 && c->index >= first && c->index < o->data_nodes + o->relays;
}

/* A hostile relay gets an identity whose node ID starts with 0xff, above
 * (with odds 255/256 for each) every honest one: it then contributes to its
 * stage's aggregation rather than aggregating, and what --byzantine tests is
 * the defence against contributions. */
int swarm_byzantine_identity(const char *workdir, const swarm_child *c) {
  char path[PATH_MAX], err[256];
  if (snprintf(path, sizeof(path), "%s/%s.%d/identity.key", workdir, c->name, c->generation) >= (int)sizeof(path))
    return GW_EINVAL;
  for (int tries = 0; tries < 100000; tries++) {
    p2p_identity me;
    unlink(path);
    int rc = p2p_identity_create(path, &me, err, sizeof(err));
    uint8_t first = me.id.b[0];
    p2p_identity_wipe(&me);
    if (rc != 0) return rc;
    if (first == 0xff) return 0;
  }
  return GW_EIO;
}

int swarm_child_args(const swarm_opts *o, const swarm_paths *paths, const swarm_child *c, char **argv,
                     char store[][PATH_MAX], int max) {
  int n = 0;
#define ARG(...)                         \
  do {                                   \
    if (n + 1 < max) {                   \
      set_arg(store[n], __VA_ARGS__);    \
      argv[n] = store[n];                \
      n++;                               \
    }                                    \
  } while (0)
  ARG("%s", paths->exe);
  ARG("node");
  ARG("--listen");
  ARG("127.0.0.1:%d", c->port);
  ARG("--data-dir");
  ARG("%s/%s.%d", paths->workdir, c->name, c->generation);
  ARG("--log-format");
  ARG("json");
  ARG("--exit-with-parent");
  ARG("--log-level");
  ARG("%s", o->log_level);
  ARG("--nat-pmp");
  ARG("off");
  ARG("--routing");
  ARG("%s", o->routing);
  ARG("--threads");
  ARG("%d", o->threads);
  ARG("--device");
  ARG("%s", o->device);
  ARG("--flow-tick");
  ARG("%d", o->flow_tick);
  ARG("--hop-timeout");
  ARG("%d", o->hop_timeout);
  ARG("--record-ttl");
  ARG("%d", 20); /* a killed relay leaves the stage directory within seconds */
  ARG("--checkpoint-every");
  ARG("%d", o->checkpoint_every);
  if (o->links) {
    ARG("--links");
    ARG("%s", o->links);
  }
  if (c->index == 0 && !c->replacement) {
    ARG("--create-run");
    ARG("swarm");
    ARG("--open"); /* one machine, one owner: a public run (docs/TRAINING.md, Private runs) */
    ARG("--model");
    ARG("%s", o->model);
    ARG("--stages");
    ARG("%d", o->stages);
    ARG("--iterations");
    ARG("%d", o->iterations);
    ARG("--microbatches");
    ARG("%d", o->microbatches);
    ARG("--batch");
    ARG("%d", o->batch);
    ARG("--seq");
    ARG("%d", o->seq);
    ARG("--lr");
    ARG("%g", o->lr);
    ARG("--grad-clip"); /* always: 0 (off) is not the node's default */
    ARG("%.17g", o->grad_clip);
    if (o->subspace) {
      ARG("--subspace");
      ARG("%s", o->subspace);
    }
    ARG("--seed");
    ARG("%llu", (unsigned long long)o->seed);
  } else {
    ARG("--run");
    ARG("swarm");
    ARG("--bootstrap");
    ARG("127.0.0.1:%d", c->bootstrap_port);
    if (c->data) {
      ARG("--role");
      ARG("data");
      ARG("--iterations");
      ARG("%d", o->iterations);
    } else {
      ARG("--capacity");
      ARG("%d", relay_capacity(o, c));
    }
  }
  if (o->wire_dtype) {
    ARG("--wire-dtype");
    ARG("%s", o->wire_dtype);
  }
  if (o->wire_accept) {
    ARG("--wire-accept");
    ARG("%s", o->wire_accept);
  }
  double slow = o->slowdown * relay_slowdown(o, c);
  if (slow > 1.0) {
    ARG("--slowdown");
    ARG("%g", slow);
  }
  for (int f = 0; f < o->n_faults && c->generation == 0; f++) {
    size_t nl = strlen(c->name);
    if (strncmp(o->faults[f], c->name, nl) == 0 && o->faults[f][nl] == ':') {
      ARG("--debug-crash");
      ARG("%s", o->faults[f] + nl + 1);
    }
  }
  if (o->aggregate) {
    ARG("--aggregate");
    ARG("%s", o->aggregate);
  }
  if (o->no_validation) ARG("--no-validate-contributions");
  if (o->deterministic) ARG("--deterministic");
  if (o->rerun_lost) ARG("--rerun-lost");
  if (o->replicate_every >= 0) {
    ARG("--replicate-every");
    ARG("%d", o->replicate_every);
  }
  if (o->replicas > 0) {
    ARG("--replicas");
    ARG("%d", o->replicas);
  }
  if (c->data && o->join_stages) ARG("--grant-join-stages");
  if (c->data) {
    ARG("--rebalance-after");
    ARG("%d", o->rebalance_after);
    if (o->move_to_short) ARG("--move-to-short");
  }
  if (relay_join_stage(o, c) > 0) {
    ARG("--join-stage");
    ARG("%d", relay_join_stage(o, c));
  }
  if (swarm_child_byzantine(o, c)) {
    ARG("--byzantine");
    ARG("%s", o->byzantine_mode);
  }
  if (c->data) {
    ARG("--dataset");
    ARG("%s", paths->dataset);
    ARG("--data-seed");
    ARG("%llu", (unsigned long long)(o->seed * 1000 + (uint64_t)c->index));
    if (o->val_fraction > 0) {
      ARG("--val-fraction");
      ARG("%.17g", o->val_fraction);
    }
    if (o->val_dataset) {
      ARG("--val-dataset");
      ARG("%s", o->val_dataset);
    }
    if (o->eval_every >= 0) {
      ARG("--eval-every");
      ARG("%d", o->eval_every);
    }
    if (o->eval_microbatches > 0) {
      ARG("--eval-microbatches");
      ARG("%d", o->eval_microbatches);
    }
  }
#undef ARG
  argv[n] = NULL;
  return n;
}
