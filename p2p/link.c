#include "p2p/link.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/err.h"
#include "util/file.h"

#define LINKS_FILE_MAX ((size_t)4 << 20)
#define LINKS_MAX_NODES (65536)
#define LINKS_MAX_PAIRS (65536)
#define ID_PREFIX_MIN (8)

/* Which nodes a rule names. */
typedef enum sel_kind { SEL_ANY, SEL_REGION, SEL_ID, SEL_ADDR } sel_kind;

typedef struct selector {
  sel_kind kind;
  int region;                      /* SEL_REGION */
  char id_hex[GW_ID_HEX_LEN + 1];  /* SEL_ID: a prefix of the hex ID */
  gw_addr addr;                    /* SEL_ADDR: ip, and port lo..hi */
  uint16_t port_hi;
} selector;

typedef struct node_rule {
  selector sel; /* SEL_ID or SEL_ADDR */
  int region;   /* -1: spread over all regions by port */
} node_rule;

typedef struct pair_rule {
  selector from, to;
  p2p_link_params lp;
} pair_rule;

/* A matrix cell; has = false where the file says null. */
typedef struct cell {
  bool has;
  p2p_link_params lp;
} cell;

struct p2p_links {
  size_t n_regions;
  char **regions;
  cell *matrix; /* n_regions^2, row = from */
  bool has_intra;
  p2p_link_params intra;
  p2p_link_params deflt;
  node_rule *nodes;
  size_t n_nodes;
  pair_rule *pairs;
  size_t n_pairs;
};

/* ---- parsing ---- */

typedef struct parse_ctx {
  p2p_links *l;
  double scale;
  uint32_t burst;
  char *err;
  size_t err_len;
} parse_ctx;

static void perr_message(parse_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void perr_message(parse_ctx *c, const char *fmt, ...) {
  if (c->err && c->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
  }
}
/* Every parse error is GW_EINVAL, and the caller's compiler must see that:
 * a helper such as get_number writes its output only when it returns 0, and
 * with the code hidden inside a variadic (never inlined) function the
 * optimiser could not prove that an error return is non-zero, so it took the
 * caller's "rc == 0, read the output" path as reachable without the write. */
#define perr(c, ...) (perr_message((c), __VA_ARGS__), GW_EINVAL)

/* A misspelt key ("latency" for "latency_ms") must not silently mean "no
 * emulation": every object accepts only the keys it knows. */
static int check_keys(parse_ctx *c, json_t *o, const char *const *allowed, const char *where) {
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i] && !ok; i++) ok = strcmp(key, allowed[i]) == 0;
    if (!ok) return perr(c, "%s: unknown key \"%s\"", where, key);
  }
  return 0;
}

static int region_index(const p2p_links *l, const char *name) {
  for (size_t i = 0; i < l->n_regions; i++)
    if (strcmp(l->regions[i], name) == 0) return (int)i;
  return -1;
}

static bool is_hex_prefix(const char *s) {
  size_t n = strlen(s);
  if (n < ID_PREFIX_MIN || n > GW_ID_HEX_LEN) return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
      return false;
  return true;
}

/* "IP:PORT" or "IP:LO-HI" (IPv6 in brackets). */
static int parse_addr_range(const char *s, gw_addr *addr, uint16_t *hi) {
  char buf[96];
  if (strlen(s) >= sizeof(buf)) return GW_EINVAL;
  snprintf(buf, sizeof(buf), "%s", s);
  char *colon = strrchr(buf, ':');
  char *dash = colon ? strchr(colon, '-') : NULL;
  long top = -1;
  if (dash) {
    char *end = NULL;
    top = strtol(dash + 1, &end, 10);
    if (end == dash + 1 || *end || top < 0 || top > 65535) return GW_EINVAL;
    *dash = '\0';
  }
  if (gw_addr_parse(buf, addr) != 0) return GW_EINVAL;
  *hi = dash ? (uint16_t)top : addr->port;
  return *hi >= addr->port ? 0 : GW_EINVAL;
}

/* A rule endpoint: "*", a region name, "IP:PORT[-HI]" or a hex ID prefix. */
static int parse_selector(parse_ctx *c, const char *s, selector *out, const char *where) {
  memset(out, 0, sizeof(*out));
  if (strcmp(s, "*") == 0) return (out->kind = SEL_ANY), 0;
  int r = region_index(c->l, s);
  if (r >= 0) {
    out->kind = SEL_REGION;
    out->region = r;
    return 0;
  }
  if (parse_addr_range(s, &out->addr, &out->port_hi) == 0) return (out->kind = SEL_ADDR), 0;
  if (is_hex_prefix(s)) {
    out->kind = SEL_ID;
    for (size_t i = 0; s[i]; i++) out->id_hex[i] = (char)((s[i] >= 'A' && s[i] <= 'F') ? s[i] + 32 : s[i]);
    return 0;
  }
  return perr(c, "%s: '%s' is not a region, an IP:PORT[-HI] address or a hex node ID prefix (>= %d digits)",
              where, s, ID_PREFIX_MIN);
}

static int get_number(parse_ctx *c, json_t *v, double *out, const char *what) {
  if (!json_is_number(v)) return perr(c, "%s must be a number", what);
  double d = json_number_value(v);
  if (!isfinite(d) || d < 0) return perr(c, "%s must be a finite number >= 0", what);
  *out = d;
  return 0;
}

static const char *const param_keys[] = {"latency_ms", "bandwidth_gbps", "bandwidth_mbps", NULL};
static const char *const pair_keys[] = {"from", "to", "symmetric", "latency_ms", "bandwidth_gbps",
                                        "bandwidth_mbps", NULL};

/* {"latency_ms": x, "bandwidth_gbps" | "bandwidth_mbps": y}, plus whatever
 * else `keys` allows. */
static int parse_params(parse_ctx *c, json_t *o, p2p_link_params *lp, const char *what,
                        const char *const *keys) {
  char w[160];
  if (!json_is_object(o)) return perr(c, "%s must be an object", what);
  int krc = check_keys(c, o, keys, what);
  if (krc != 0) return krc;
  if (json_object_get(o, "bandwidth_gbps") && json_object_get(o, "bandwidth_mbps"))
    return perr(c, "%s: give bandwidth_gbps or bandwidth_mbps, not both", what);
  memset(lp, 0, sizeof(*lp));
  lp->burst_bytes = c->burst;
  json_t *v;
  int rc = 0;
  if ((v = json_object_get(o, "latency_ms"))) {
    snprintf(w, sizeof(w), "%s.latency_ms", what);
    rc = get_number(c, v, &lp->latency_ms, w);
  }
  if (rc == 0 && (v = json_object_get(o, "bandwidth_gbps"))) {
    snprintf(w, sizeof(w), "%s.bandwidth_gbps", what);
    rc = get_number(c, v, &lp->bandwidth_bps, w);
    lp->bandwidth_bps *= 1e9 * c->scale;
  } else if (rc == 0 && (v = json_object_get(o, "bandwidth_mbps"))) {
    snprintf(w, sizeof(w), "%s.bandwidth_mbps", what);
    rc = get_number(c, v, &lp->bandwidth_bps, w);
    lp->bandwidth_bps *= 1e6 * c->scale;
  }
  return rc;
}

static int parse_regions(parse_ctx *c, json_t *root) {
  json_t *names = json_object_get(root, "regions");
  if (!names) return 0;
  size_t n = json_array_size(names);
  if (!json_is_array(names) || n == 0 || n > P2P_LINKS_MAX_REGIONS)
    return perr(c, "\"regions\" must be an array of 1..%d names", P2P_LINKS_MAX_REGIONS);
  c->l->regions = calloc(n, sizeof(char *));
  if (!c->l->regions) return GW_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const char *s = json_string_value(json_array_get(names, i));
    if (!s || !*s) return perr(c, "regions[%zu] must be a non-empty string", i);
    if (region_index(c->l, s) >= 0) return perr(c, "region '%s' is listed twice", s);
    if (!(c->l->regions[i] = strdup(s))) return GW_ENOMEM;
    c->l->n_regions = i + 1;
  }
  return 0;
}

/* One n x n matrix of numbers (or nulls) into the latency or bandwidth of
 * each cell. */
static int parse_matrix(parse_ctx *c, json_t *root, const char *key, double unit, bool is_bw) {
  json_t *m = json_object_get(root, key);
  size_t n = c->l->n_regions;
  if (!m) return 0;
  if (n == 0) return perr(c, "\"%s\" needs a \"regions\" list", key);
  if (!json_is_array(m) || json_array_size(m) != n) return perr(c, "\"%s\" must have %zu rows", key, n);
  for (size_t i = 0; i < n; i++) {
    json_t *row = json_array_get(m, i);
    if (!json_is_array(row) || json_array_size(row) != n)
      return perr(c, "\"%s\" row %zu must have %zu entries", key, i, n);
    for (size_t j = 0; j < n; j++) {
      json_t *v = json_array_get(row, j);
      if (json_is_null(v)) continue;
      char w[96];
      snprintf(w, sizeof(w), "%s[%zu][%zu]", key, i, j);
      double d;
      int rc = get_number(c, v, &d, w);
      if (rc != 0) return rc;
      cell *cl = &c->l->matrix[i * n + j];
      cl->has = true;
      cl->lp.burst_bytes = c->burst;
      if (is_bw)
        cl->lp.bandwidth_bps = d * unit * c->scale;
      else
        cl->lp.latency_ms = d;
    }
  }
  return 0;
}

static int parse_nodes(parse_ctx *c, json_t *root) {
  json_t *nodes = json_object_get(root, "nodes");
  if (!nodes) return 0;
  size_t n = json_array_size(nodes);
  if (!json_is_array(nodes) || n > LINKS_MAX_NODES) return perr(c, "\"nodes\" must be an array");
  c->l->nodes = calloc(n ? n : 1, sizeof(node_rule));
  if (!c->l->nodes) return GW_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(nodes, i);
    node_rule *r = &c->l->nodes[i];
    char w[48];
    snprintf(w, sizeof(w), "nodes[%zu]", i);
    const char *id = json_string_value(json_object_get(o, "id"));
    const char *addr = json_string_value(json_object_get(o, "addr"));
    const char *region = json_string_value(json_object_get(o, "region"));
    bool spread = json_is_true(json_object_get(o, "spread"));
    static const char *const keys[] = {"id", "addr", "region", "spread", NULL};
    if (!json_is_object(o) || (!id == !addr)) return perr(c, "%s needs exactly one of \"id\" or \"addr\"", w);
    int krc = check_keys(c, o, keys, w);
    if (krc != 0) return krc;
    int rc = parse_selector(c, id ? id : addr, &r->sel, w);
    if (rc != 0) return rc;
    if (r->sel.kind != (id ? SEL_ID : SEL_ADDR)) return perr(c, "%s: bad %s", w, id ? "id" : "addr");
    if (spread) {
      if (c->l->n_regions == 0 || id) return perr(c, "%s: \"spread\" needs \"addr\" and a regions list", w);
      r->region = -1;
    } else if (!region || (r->region = region_index(c->l, region)) < 0) {
      return perr(c, "%s: \"region\" must name one of the regions (or set \"spread\": true)", w);
    }
    c->l->n_nodes = i + 1;
  }
  return 0;
}

static int parse_pairs(parse_ctx *c, json_t *root) {
  json_t *pairs = json_object_get(root, "pairs");
  if (!pairs) return 0;
  size_t n = json_array_size(pairs);
  if (!json_is_array(pairs) || n > LINKS_MAX_PAIRS) return perr(c, "\"pairs\" must be an array");
  /* A symmetric rule becomes two directed rules. */
  c->l->pairs = calloc(2 * n + 1, sizeof(pair_rule));
  if (!c->l->pairs) return GW_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(pairs, i);
    char w[48];
    snprintf(w, sizeof(w), "pairs[%zu]", i);
    const char *from = json_string_value(json_object_get(o, "from"));
    const char *to = json_string_value(json_object_get(o, "to"));
    if (!from || !to) return perr(c, "%s needs \"from\" and \"to\"", w);
    pair_rule *r = &c->l->pairs[c->l->n_pairs];
    int rc = parse_selector(c, from, &r->from, w);
    if (rc == 0) rc = parse_selector(c, to, &r->to, w);
    if (rc == 0) rc = parse_params(c, o, &r->lp, w, pair_keys);
    if (rc != 0) return rc;
    c->l->n_pairs++;
    if (json_is_true(json_object_get(o, "symmetric"))) {
      pair_rule *rev = &c->l->pairs[c->l->n_pairs++];
      *rev = *r;
      rev->from = r->to;
      rev->to = r->from;
    }
  }
  return 0;
}

static int parse_scale(parse_ctx *c, json_t *root, double override) {
  c->scale = 1.0;
  c->burst = P2P_LINK_BURST_DEFAULT;
  json_t *v = json_object_get(root, "bandwidth_scale");
  int rc = 0;
  if (v && (rc = get_number(c, v, &c->scale, "bandwidth_scale")) != 0) return rc;
  if (override > 0) c->scale = override;
  if (!(c->scale > 0)) return perr(c, "bandwidth_scale must be > 0");
  if ((v = json_object_get(root, "burst_bytes"))) {
    double b;
    if ((rc = get_number(c, v, &b, "burst_bytes")) != 0) return rc;
    if (b < 1500 || b > (double)(64u << 20)) return perr(c, "burst_bytes must be in 1500..64Mi");
    c->burst = (uint32_t)b;
  }
  return 0;
}

static int parse_root(parse_ctx *c, json_t *root, double bw_scale) {
  static const char *const keys[] = {"about", "bandwidth_scale", "burst_bytes", "default", "regions",
                                     "latency_ms", "bandwidth_gbps", "bandwidth_mbps", "intra_region",
                                     "nodes", "pairs", NULL};
  int rc;
  if (!json_is_object(root)) return perr(c, "the links file must hold one JSON object");
  if ((rc = check_keys(c, root, keys, "links file")) != 0) return rc;
  if ((rc = parse_scale(c, root, bw_scale)) != 0) return rc;
  c->l->deflt.burst_bytes = c->burst;
  json_t *d = json_object_get(root, "default");
  if (d && (rc = parse_params(c, d, &c->l->deflt, "default", param_keys)) != 0) return rc;
  if ((rc = parse_regions(c, root)) != 0) return rc;
  size_t n = c->l->n_regions;
  c->l->matrix = calloc(n * n + 1, sizeof(cell));
  if (!c->l->matrix) return GW_ENOMEM;
  if ((rc = parse_matrix(c, root, "latency_ms", 1.0, false)) != 0) return rc;
  bool gbps = json_object_get(root, "bandwidth_gbps") != NULL;
  if (gbps && json_object_get(root, "bandwidth_mbps")) return perr(c, "give bandwidth_gbps or bandwidth_mbps, not both");
  if ((rc = parse_matrix(c, root, gbps ? "bandwidth_gbps" : "bandwidth_mbps", gbps ? 1e9 : 1e6, true)) != 0)
    return rc;
  json_t *intra = json_object_get(root, "intra_region");
  if (intra) {
    if ((rc = parse_params(c, intra, &c->l->intra, "intra_region", param_keys)) != 0) return rc;
    c->l->has_intra = true;
  }
  if ((rc = parse_nodes(c, root)) != 0) return rc;
  return parse_pairs(c, root);
}

int p2p_links_parse(const char *text, size_t len, double bw_scale, p2p_links **out, char *err, size_t err_len) {
  json_error_t jerr;
  *out = NULL;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
  parse_ctx c = {.err = err, .err_len = err_len};
  if (!root) return perr(&c, "line %d: %s", jerr.line, jerr.text);
  c.l = calloc(1, sizeof(p2p_links));
  int rc = c.l ? parse_root(&c, root, bw_scale) : GW_ENOMEM;
  json_decref(root);
  if (rc == GW_ENOMEM) perr_message(&c, "out of memory");
  if (rc != 0) {
    p2p_links_free(c.l);
    return rc;
  }
  *out = c.l;
  return 0;
}

int p2p_links_load(const char *path, double bw_scale, p2p_links **out, char *err, size_t err_len) {
  uint8_t *text = NULL;
  size_t len = 0;
  *out = NULL;
  int rc = gw_file_read_all(path, LINKS_FILE_MAX, &text, &len);
  if (rc != 0) {
    if (err && err_len) snprintf(err, err_len, "cannot read %s: %s", path, gw_strerror(rc));
    return rc;
  }
  char inner[400];
  rc = p2p_links_parse((const char *)text, len, bw_scale, out, inner, sizeof(inner));
  if (rc != 0 && err && err_len) snprintf(err, err_len, "%s: %s", path, inner);
  free(text);
  return rc;
}

void p2p_links_free(p2p_links *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n_regions; i++) free(l->regions[i]);
  free(l->regions);
  free(l->matrix);
  free(l->nodes);
  free(l->pairs);
  free(l);
}

/* ---- lookup ---- */

static bool addr_in(const selector *s, const gw_addr *a) {
  return a && a->family != 0 && gw_addr_same_ip(&s->addr, a) && a->port >= s->addr.port && a->port <= s->port_hi;
}

static bool id_matches(const selector *s, const gw_id *id) {
  if (!id || gw_id_is_zero(id)) return false;
  char hex[GW_ID_HEX_LEN + 1];
  gw_id_to_hex(id, hex);
  return strncmp(hex, s->id_hex, strlen(s->id_hex)) == 0;
}

static int node_region(const p2p_links *l, const gw_id *id, const gw_addr *addr) {
  for (size_t i = 0; i < l->n_nodes; i++) {
    const node_rule *r = &l->nodes[i];
    bool hit = r->sel.kind == SEL_ID ? id_matches(&r->sel, id) : addr_in(&r->sel, addr);
    if (!hit) continue;
    if (r->region >= 0) return r->region;
    return (int)((addr->port - r->sel.addr.port) % l->n_regions); /* spread */
  }
  return -1;
}

const char *p2p_links_region(const p2p_links *l, const gw_id *id, const gw_addr *addr) {
  int r = node_region(l, id, addr);
  return r >= 0 ? l->regions[r] : NULL;
}

static bool sel_matches(const selector *s, int region, const gw_id *id, const gw_addr *addr) {
  switch (s->kind) {
  case SEL_ANY: return true;
  case SEL_REGION: return region == s->region;
  case SEL_ID: return id_matches(s, id);
  case SEL_ADDR: return addr_in(s, addr);
  }
  return false;
}

bool p2p_links_lookup(const p2p_links *l, const gw_id *a_id, const gw_addr *a_addr, const gw_id *b_id,
                      const gw_addr *b_addr, p2p_link_params *out) {
  int ra = node_region(l, a_id, a_addr), rb = node_region(l, b_id, b_addr);
  for (size_t i = 0; i < l->n_pairs; i++) {
    const pair_rule *p = &l->pairs[i];
    if (sel_matches(&p->from, ra, a_id, a_addr) && sel_matches(&p->to, rb, b_id, b_addr)) {
      *out = p->lp;
      return true;
    }
  }
  if (ra >= 0 && rb >= 0) {
    if (ra == rb && l->has_intra) {
      *out = l->intra;
      return true;
    }
    const cell *cl = &l->matrix[(size_t)ra * l->n_regions + (size_t)rb];
    if (cl->has) {
      *out = cl->lp;
      return true;
    }
  }
  *out = l->deflt;
  return false;
}

void p2p_link_params_format(const p2p_link_params *lp, char *out, size_t out_len) {
  if (lp->bandwidth_bps > 0)
    snprintf(out, out_len, "latency_ms=%.1f bw_mbps=%.1f", lp->latency_ms, lp->bandwidth_bps / 1e6);
  else
    snprintf(out, out_len, "latency_ms=%.1f bw_mbps=unlimited", lp->latency_ms);
}

/* ---- shaper ---- */

void p2p_shaper_init(p2p_shaper *s, const p2p_link_params *lp) {
  memset(s, 0, sizeof(*s));
  s->lp = *lp;
  s->latency_ns = lp->latency_ms > 0 ? (uint64_t)(lp->latency_ms * 1e6 + 0.5) : 0;
  if (lp->bandwidth_bps > 0) {
    s->ns_per_byte = 8e9 / lp->bandwidth_bps;
    s->tau_ns = (double)(lp->burst_bytes ? lp->burst_bytes : P2P_LINK_BURST_DEFAULT) * s->ns_per_byte;
  }
}

bool p2p_shaper_active(const p2p_shaper *s) { return s->latency_ns > 0 || s->ns_per_byte > 0; }

/* GCRA, the token bucket in virtual-time form: the link is booked up to
 * tat; a byte may leave up to tau early (the burst). */
p2p_span p2p_shaper_reserve(p2p_shaper *s, uint64_t now_ns, uint64_t bytes) {
  p2p_span sp = {.enq_ns = now_ns, .ns_per_byte = s->ns_per_byte, .latency_ns = s->latency_ns, .bytes = bytes};
  double now = (double)now_ns;
  if (s->ns_per_byte <= 0) {
    sp.base_ns = now;
    return sp;
  }
  double start = s->tat_ns > now ? s->tat_ns : now;
  sp.base_ns = start - s->tau_ns;
  s->tat_ns = start + (double)bytes * s->ns_per_byte;
  return sp;
}

uint64_t p2p_span_time(const p2p_span *sp, uint64_t k) {
  double t = sp->base_ns + (double)k * sp->ns_per_byte;
  uint64_t dep = t > (double)sp->enq_ns ? (uint64_t)ceil(t) : sp->enq_ns;
  return dep + sp->latency_ns;
}

uint64_t p2p_span_bytes_at(const p2p_span *sp, uint64_t t_ns) {
  if (t_ns < sp->enq_ns + sp->latency_ns) return 0;
  if (sp->ns_per_byte <= 0) return sp->bytes;
  double k = floor(((double)(t_ns - sp->latency_ns) - sp->base_ns) / sp->ns_per_byte);
  if (k <= 0) return 0;
  return k >= (double)sp->bytes ? sp->bytes : (uint64_t)k;
}

/* ---- delay queue ---- */

typedef struct p2p_delayq_ent {
  uint64_t due_ns, seq;
  void *item;
} p2p_delayq_ent;

/* Items due within this much are released now: libuv timers have 1 ms
 * resolution, and waking up again for less would only add a late tick. */
#define DELAYQ_SLACK_NS (500000)

static bool ent_before(const p2p_delayq_ent *a, const p2p_delayq_ent *b) {
  return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->seq < b->seq);
}

static void heap_swap(p2p_delayq_ent *h, size_t a, size_t b) {
  p2p_delayq_ent t = h[a];
  h[a] = h[b];
  h[b] = t;
}

static void heap_pop(p2p_delayq *q) {
  p2p_delayq_ent *h = q->heap;
  h[0] = h[--q->n];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < q->n && ent_before(&h[l], &h[m])) m = l;
    if (r < q->n && ent_before(&h[r], &h[m])) m = r;
    if (m == i) break;
    heap_swap(h, i, m);
    i = m;
  }
}

static void delayq_fire(uv_timer_t *t);

static void delayq_arm(p2p_delayq *q) {
  if (q->n == 0) {
    uv_timer_stop(&q->timer);
    return;
  }
  uint64_t now = gw_clock_mono_ns();
  uint64_t due = q->heap[0].due_ns;
  uint64_t ms = due > now ? (due - now + 999999) / 1000000 : 0;
  uv_timer_start(&q->timer, delayq_fire, ms, 0); /* restarts an armed timer */
}

static void delayq_fire(uv_timer_t *t) {
  p2p_delayq *q = t->data;
  uint64_t now = gw_clock_mono_ns();
  /* Callbacks may push; each pass takes the current head. */
  while (q->n > 0 && q->heap[0].due_ns <= now + DELAYQ_SLACK_NS) {
    void *item = q->heap[0].item;
    heap_pop(q);
    q->due(q->ud, item);
  }
  delayq_arm(q);
}

int p2p_delayq_init(p2p_delayq *q, uv_loop_t *loop, p2p_delayq_cb due, void *ud) {
  memset(q, 0, sizeof(*q));
  q->due = due;
  q->ud = ud;
  int rc = uv_timer_init(loop, &q->timer);
  if (rc != 0) return rc;
  q->timer.data = q;
  return 0;
}

int p2p_delayq_push(p2p_delayq *q, uint64_t due_ns, void *item) {
  if (q->n == q->cap) {
    size_t cap = q->cap ? 2 * q->cap : 16;
    p2p_delayq_ent *h = realloc(q->heap, cap * sizeof(*h));
    if (!h) return GW_ENOMEM;
    q->heap = h;
    q->cap = cap;
  }
  size_t i = q->n++;
  q->heap[i] = (p2p_delayq_ent){.due_ns = due_ns, .seq = q->seq++, .item = item};
  while (i > 0 && ent_before(&q->heap[i], &q->heap[(i - 1) / 2])) {
    heap_swap(q->heap, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
  if (i == 0) delayq_arm(q); /* a new earliest item */
  return 0;
}

size_t p2p_delayq_len(const p2p_delayq *q) { return q->n; }

static void delayq_closed(uv_handle_t *h) {
  p2p_delayq *q = h->data;
  free(q->heap);
  q->heap = NULL;
  if (q->closed) q->closed(q);
}

void p2p_delayq_close(p2p_delayq *q, void (*drop)(void *ud, void *item), void (*closed)(p2p_delayq *q)) {
  for (size_t i = 0; i < q->n; i++)
    if (drop) drop(q->ud, q->heap[i].item);
  q->n = 0;
  q->closed = closed;
  uv_close((uv_handle_t *)&q->timer, delayq_closed);
}
