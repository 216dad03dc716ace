#include "flow/instance.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/file.h"
#include "util/rng.h"

/* Instance files are small; anything bigger than this is not one. */
#define INSTANCE_FILE_MAX ((size_t)256 << 20)

int flow_error(char *err, size_t err_len, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  gw_vfail(err, err_len, code, fmt, ap);
  va_end(ap);
  return code;
}

void flow_instance_free(flow_instance *in) {
  if (!in) return;
  free(in->nodes);
  free(in->links);
  memset(in, 0, sizeof(*in));
}

int flow_instance_find(const flow_instance *in, int id) {
  for (int i = 0; i < in->n_nodes; i++)
    if (in->nodes[i].id == id) return i;
  return -1;
}

int flow_instance_sources(const flow_instance *in) {
  int n = 0;
  for (int i = 0; i < in->n_nodes; i++) n += in->nodes[i].stage == 0;
  return n;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static int check_ids_unique(const flow_instance *in, char *err, size_t err_len) {
  int *ids = malloc((size_t)in->n_nodes * sizeof(int) + 1);
  if (!ids) return flow_error(err, err_len, GW_ENOMEM, "out of memory");
  for (int i = 0; i < in->n_nodes; i++) ids[i] = in->nodes[i].id;
  qsort(ids, (size_t)in->n_nodes, sizeof(int), cmp_int);
  int dup = -1;
  for (int i = 1; i < in->n_nodes && dup < 0; i++)
    if (ids[i] == ids[i - 1]) dup = ids[i];
  free(ids);
  if (dup >= 0) return flow_error(err, err_len, GW_EINVAL, "nodes: id %d appears more than once", dup);
  return 0;
}

/* Duplicate links would make "the" cost of a hop ambiguous. */
static int cmp_link(const void *a, const void *b) {
  const flow_inst_link *x = a, *y = b;
  if (x->from != y->from) return (x->from > y->from) - (x->from < y->from);
  return (x->to > y->to) - (x->to < y->to);
}

static int check_links_unique(const flow_instance *in, char *err, size_t err_len) {
  if (in->n_links < 2) return 0;
  flow_inst_link *copy = malloc((size_t)in->n_links * sizeof(*copy));
  if (!copy) return flow_error(err, err_len, GW_ENOMEM, "out of memory");
  memcpy(copy, in->links, (size_t)in->n_links * sizeof(*copy));
  qsort(copy, (size_t)in->n_links, sizeof(*copy), cmp_link);
  int rc = 0;
  for (int i = 1; i < in->n_links && rc == 0; i++)
    if (copy[i].from == copy[i - 1].from && copy[i].to == copy[i - 1].to)
      rc = flow_error(err, err_len, GW_EINVAL, "links: more than one link from node %d to node %d",
                in->nodes[copy[i].from].id, in->nodes[copy[i].to].id);
  free(copy);
  return rc;
}

int flow_instance_validate(const flow_instance *in, char *err, size_t err_len) {
  if (in->stages < 1 || in->stages > FLOW_INST_MAX_STAGES)
    return flow_error(err, err_len, GW_EINVAL, "stages: %d is out of range [1, %d]", in->stages, FLOW_INST_MAX_STAGES);
  if (in->n_nodes < 1 || in->n_nodes > FLOW_INST_MAX_NODES)
    return flow_error(err, err_len, GW_EINVAL, "nodes: %d nodes is out of range [1, %d]", in->n_nodes, FLOW_INST_MAX_NODES);
  if (in->n_links < 0 || in->n_links > FLOW_INST_MAX_LINKS)
    return flow_error(err, err_len, GW_EINVAL, "links: %d links is out of range [0, %d]", in->n_links, FLOW_INST_MAX_LINKS);
  for (int i = 0; i < in->n_nodes; i++) {
    const flow_inst_node *n = &in->nodes[i];
    if (n->id < 0) return flow_error(err, err_len, GW_EINVAL, "nodes[%d]: id %d is negative", i, n->id);
    if (n->stage < 0 || n->stage > in->stages)
      return flow_error(err, err_len, GW_EINVAL, "nodes[%d]: stage %d is out of range [0, %d]", i, n->stage, in->stages);
    if (n->capacity < 0 || n->capacity > FLOW_INST_MAX_CAPACITY)
      return flow_error(err, err_len, GW_EINVAL, "nodes[%d]: capacity %d is out of range [0, %d]", i, n->capacity,
                  FLOW_INST_MAX_CAPACITY);
    if (!isfinite(n->cost) || n->cost < 0 || n->cost > FLOW_INST_MAX_COST)
      return flow_error(err, err_len, GW_EINVAL, "nodes[%d]: cost must be a finite number in [0, 1e12]", i);
  }
  if (flow_instance_sources(in) == 0) return flow_error(err, err_len, GW_EINVAL, "nodes: no data node (stage 0)");
  int rc = check_ids_unique(in, err, err_len);
  if (rc != 0) return rc;
  for (int k = 0; k < in->n_links; k++) {
    const flow_inst_link *l = &in->links[k];
    if (l->from < 0 || l->from >= in->n_nodes || l->to < 0 || l->to >= in->n_nodes)
      return flow_error(err, err_len, GW_EINVAL, "links[%d]: endpoint out of range", k);
    if (!isfinite(l->cost) || l->cost < 0 || l->cost > FLOW_INST_MAX_COST)
      return flow_error(err, err_len, GW_EINVAL, "links[%d]: cost must be a finite number in [0, 1e12]", k);
    int sf = in->nodes[l->from].stage, st = in->nodes[l->to].stage;
    if (st != (sf + 1) % (in->stages + 1))
      return flow_error(err, err_len, GW_EINVAL,
                  "links[%d]: node %d is in stage %d but node %d is in stage %d; links go from stage s to s+1 "
                  "(and from stage %d back to stage 0)",
                  k, in->nodes[l->from].id, sf, in->nodes[l->to].id, st, in->stages);
  }
  return check_links_unique(in, err, err_len);
}

/* ---- JSON ---- */

static int get_int(json_t *obj, const char *key, const char *where, int idx, bool required, int dflt, int *out,
                   char *err, size_t err_len) {
  json_t *v = json_object_get(obj, key);
  if (!v) {
    if (required) return flow_error(err, err_len, GW_EINVAL, "%s[%d]: missing \"%s\"", where, idx, key);
    *out = dflt;
    return 0;
  }
  /* Integers written as 3.0 are accepted; 3.5 is not. */
  double d;
  if (json_is_integer(v))
    d = (double)json_integer_value(v);
  else if (json_is_real(v))
    d = json_real_value(v);
  else
    return flow_error(err, err_len, GW_EINVAL, "%s[%d]: \"%s\" must be an integer", where, idx, key);
  if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0)
    return flow_error(err, err_len, GW_EINVAL, "%s[%d]: \"%s\" must be an integer in 32-bit range", where, idx, key);
  *out = (int)d;
  return 0;
}

static int get_num(json_t *obj, const char *key, const char *where, int idx, bool required, double *out, char *err,
                   size_t err_len) {
  json_t *v = json_object_get(obj, key);
  if (!v) {
    if (required) return flow_error(err, err_len, GW_EINVAL, "%s[%d]: missing \"%s\"", where, idx, key);
    *out = 0;
    return 0;
  }
  if (!json_is_number(v)) return flow_error(err, err_len, GW_EINVAL, "%s[%d]: \"%s\" must be a number", where, idx, key);
  *out = json_number_value(v);
  return 0;
}

static int parse_nodes(json_t *arr, flow_instance *out, char *err, size_t err_len) {
  size_t n = json_array_size(arr);
  if (n == 0 || n > FLOW_INST_MAX_NODES)
    return flow_error(err, err_len, GW_EINVAL, "nodes: %zu nodes is out of range [1, %d]", n, FLOW_INST_MAX_NODES);
  out->nodes = calloc(n, sizeof(*out->nodes));
  if (!out->nodes) return flow_error(err, err_len, GW_ENOMEM, "out of memory");
  out->n_nodes = (int)n;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    flow_inst_node *nd = &out->nodes[i];
    if (!json_is_object(o)) return flow_error(err, err_len, GW_EINVAL, "nodes[%zu]: must be an object", i);
    int rc;
    if ((rc = get_int(o, "id", "nodes", (int)i, true, 0, &nd->id, err, err_len)) ||
        (rc = get_int(o, "stage", "nodes", (int)i, true, 0, &nd->stage, err, err_len)) ||
        (rc = get_int(o, "capacity", "nodes", (int)i, true, 0, &nd->capacity, err, err_len)) ||
        (rc = get_num(o, "cost", "nodes", (int)i, false, &nd->cost, err, err_len)))
      return rc;
  }
  return 0;
}

/* Maps ids to indices with a sorted copy, so large instances load in n log n. */
typedef struct id_index {
  int id, index;
} id_index;

static int cmp_id_index(const void *a, const void *b) {
  const id_index *x = a, *y = b;
  return (x->id > y->id) - (x->id < y->id);
}

static int lookup(const id_index *map, int n, int id) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (map[mid].id == id) return map[mid].index;
    if (map[mid].id < id)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

static int parse_links(json_t *arr, flow_instance *out, char *err, size_t err_len) {
  size_t n = json_array_size(arr);
  if (n > FLOW_INST_MAX_LINKS)
    return flow_error(err, err_len, GW_EINVAL, "links: %zu links is more than %d", n, FLOW_INST_MAX_LINKS);
  id_index *map = malloc((size_t)out->n_nodes * sizeof(*map));
  out->links = calloc(n ? n : 1, sizeof(*out->links));
  if (!map || !out->links) {
    free(map);
    return flow_error(err, err_len, GW_ENOMEM, "out of memory");
  }
  for (int i = 0; i < out->n_nodes; i++) map[i] = (id_index){out->nodes[i].id, i};
  qsort(map, (size_t)out->n_nodes, sizeof(*map), cmp_id_index);
  int rc = 0;
  for (size_t k = 0; k < n && rc == 0; k++) {
    json_t *o = json_array_get(arr, k);
    flow_inst_link *l = &out->links[k];
    int from, to;
    if (!json_is_object(o)) {
      rc = flow_error(err, err_len, GW_EINVAL, "links[%zu]: must be an object", k);
      break;
    }
    if ((rc = get_int(o, "from", "links", (int)k, true, 0, &from, err, err_len)) ||
        (rc = get_int(o, "to", "links", (int)k, true, 0, &to, err, err_len)) ||
        (rc = get_num(o, "cost", "links", (int)k, true, &l->cost, err, err_len)))
      break;
    l->from = lookup(map, out->n_nodes, from);
    l->to = lookup(map, out->n_nodes, to);
    if (l->from < 0)
      rc = flow_error(err, err_len, GW_EINVAL, "links[%zu]: \"from\" names node %d, which is not in nodes", k, from);
    else if (l->to < 0)
      rc = flow_error(err, err_len, GW_EINVAL, "links[%zu]: \"to\" names node %d, which is not in nodes", k, to);
    out->n_links = (int)k + 1;
  }
  free(map);
  return rc;
}

int flow_instance_parse(const char *json, size_t len, flow_instance *out, char *err, size_t err_len) {
  memset(out, 0, sizeof(*out));
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return flow_error(err, err_len, GW_EINVAL, "not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
  int rc = 0;
  json_t *stages = json_object_get(root, "stages");
  json_t *nodes = json_object_get(root, "nodes");
  json_t *links = json_object_get(root, "links");
  if (!json_is_object(root))
    rc = flow_error(err, err_len, GW_EINVAL, "the top level must be an object with stages, nodes and links");
  else if (!json_is_integer(stages))
    rc = flow_error(err, err_len, GW_EINVAL, "\"stages\" must be an integer (the number of relay stages)");
  else if (!json_is_array(nodes))
    rc = flow_error(err, err_len, GW_EINVAL, "\"nodes\" must be an array");
  else if (!json_is_array(links))
    rc = flow_error(err, err_len, GW_EINVAL, "\"links\" must be an array");
  if (rc == 0) {
    json_int_t s = json_integer_value(stages);
    out->stages = s < 1 || s > FLOW_INST_MAX_STAGES ? -1 : (int)s;
    if (out->stages < 0)
      rc = flow_error(err, err_len, GW_EINVAL, "stages: %lld is out of range [1, %d]", (long long)s, FLOW_INST_MAX_STAGES);
  }
  if (rc == 0) rc = parse_nodes(nodes, out, err, err_len);
  if (rc == 0) rc = parse_links(links, out, err, err_len);
  if (rc == 0) rc = flow_instance_validate(out, err, err_len);
  json_decref(root);
  if (rc != 0) flow_instance_free(out);
  return rc;
}

int flow_instance_load(const char *path, flow_instance *out, char *err, size_t err_len) {
  uint8_t *buf = NULL;
  size_t len = 0;
  memset(out, 0, sizeof(*out));
  int rc = gw_file_read_all(path, INSTANCE_FILE_MAX, &buf, &len);
  if (rc != 0) return flow_error(err, err_len, rc, "%s: cannot read (%s)", path, gw_strerror(rc));
  char inner[FLOW_ERR_LEN];
  rc = flow_instance_parse((const char *)buf, len, out, inner, sizeof(inner));
  free(buf);
  if (rc != 0) flow_error(err, err_len, rc, "%s: %s", path, inner);
  return rc;
}

/* Appends one compact JSON object and a separator to a growing buffer. */
static int append(char **buf, size_t *len, size_t *cap, const char *text) {
  size_t n = strlen(text);
  if (*len + n + 1 > *cap) {
    size_t c = *cap ? *cap : 4096;
    while (*len + n + 1 > c) c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb) return GW_ENOMEM;
    *buf = nb;
    *cap = c;
  }
  memcpy(*buf + *len, text, n + 1);
  *len += n;
  return 0;
}

static int append_obj(char **buf, size_t *len, size_t *cap, json_t *o, bool last) {
  if (!o) return GW_ENOMEM;
  char *text = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(o);
  int rc = text ? 0 : GW_ENOMEM;
  if (rc == 0) rc = append(buf, len, cap, "  ");
  if (rc == 0) rc = append(buf, len, cap, text);
  if (rc == 0) rc = append(buf, len, cap, last ? "\n" : ",\n");
  free(text);
  return rc;
}

/* One node or link per line: readable, diffable, and a few KB per setting. */
char *flow_instance_to_json(const flow_instance *in) {
  char *buf = NULL, head[64];
  size_t len = 0, cap = 0;
  snprintf(head, sizeof(head), "{\"stages\": %d,\n \"nodes\": [\n", in->stages);
  int rc = append(&buf, &len, &cap, head);
  for (int i = 0; i < in->n_nodes && rc == 0; i++) {
    const flow_inst_node *n = &in->nodes[i];
    json_t *o = json_pack("{s:i,s:i,s:i}", "id", n->id, "stage", n->stage, "capacity", n->capacity);
    if (o && n->cost != 0) json_object_set_new(o, "cost", json_real(n->cost));
    rc = append_obj(&buf, &len, &cap, o, i + 1 == in->n_nodes);
  }
  if (rc == 0) rc = append(&buf, &len, &cap, " ],\n \"links\": [\n");
  for (int k = 0; k < in->n_links && rc == 0; k++) {
    const flow_inst_link *l = &in->links[k];
    rc = append_obj(
        &buf, &len, &cap,
        json_pack("{s:i,s:i,s:f}", "from", in->nodes[l->from].id, "to", in->nodes[l->to].id, "cost", l->cost),
        k + 1 == in->n_links);
  }
  if (rc == 0) rc = append(&buf, &len, &cap, " ]\n}");
  if (rc != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* ---- Table V ---- */

typedef struct table5_row {
  int sources, relays, stages, cap_lo, cap_hi, cost_lo, cost_hi; /* ⌊U(lo,hi)⌋ bounds as printed */
} table5_row;

static const table5_row table5[6] = {
    {1, 40, 8, 1, 3, 1, 20},  {1, 40, 10, 1, 3, 1, 20}, {1, 40, 8, 5, 15, 1, 20},
    {1, 40, 8, 1, 3, 5, 100}, {2, 40, 8, 1, 3, 1, 20},  {4, 80, 8, 1, 3, 1, 20},
};

/* ⌊U(a,b)⌋ with U continuous on [a, b): an integer in [a, b-1]. */
static int floor_uniform(gw_rng *r, int a, int b) { return (int)gw_rng_range(r, a, b - 1); }

int flow_instance_table5(int setting, uint64_t seed, flow_instance *out) {
  memset(out, 0, sizeof(*out));
  if (setting < 1 || setting > 6) return GW_EINVAL;
  const table5_row *t = &table5[setting - 1];
  gw_rng rng;
  gw_rng_seed(&rng, seed);
  int n = t->sources + t->relays;
  out->stages = t->stages;
  out->n_nodes = n;
  out->nodes = calloc((size_t)n, sizeof(*out->nodes));
  if (!out->nodes) return GW_ENOMEM;
  /* Relays round-robin over the stages, so every stage has relays/stages of them. */
  for (int i = 0; i < n; i++) {
    flow_inst_node *nd = &out->nodes[i];
    nd->id = i;
    nd->stage = i < t->sources ? 0 : 1 + (i - t->sources) % t->stages;
    if (nd->stage > 0) nd->capacity = floor_uniform(&rng, t->cap_lo, t->cap_hi);
  }
  int max_stage_cap = 0;
  for (int s = 1; s <= t->stages; s++) {
    int c = 0;
    for (int i = 0; i < n; i++) c += out->nodes[i].stage == s ? out->nodes[i].capacity : 0;
    if (c > max_stage_cap) max_stage_cap = c;
  }
  for (int i = 0; i < t->sources; i++) out->nodes[i].capacity = max_stage_cap;
  /* Complete links between consecutive stages of the ring. */
  size_t cap_links = (size_t)n * (size_t)n;
  out->links = calloc(cap_links, sizeof(*out->links));
  if (!out->links) {
    flow_instance_free(out);
    return GW_ENOMEM;
  }
  for (int s = 0; s <= t->stages; s++) {
    int next = (s + 1) % (t->stages + 1);
    for (int i = 0; i < n; i++) {
      if (out->nodes[i].stage != s) continue;
      for (int j = 0; j < n; j++) {
        if (out->nodes[j].stage != next) continue;
        out->links[out->n_links++] = (flow_inst_link){i, j, (double)floor_uniform(&rng, t->cost_lo, t->cost_hi)};
      }
    }
  }
  return 0;
}
