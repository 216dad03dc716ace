/* train/hf_export.c — gwtf names <-> Hugging Face names, stage states into a
 * whole model, and the export directory (safetensors + config.json). */
#include "train/hf_export.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/safetensors.h"
#include "util/err.h"
#include "util/file.h"

/* Largest model file hf_read_dir accepts: a 4 GiB fp32 model is ~1B
 * parameters, far past any preset. */
#define HF_MAX_MODEL_BYTES ((size_t)4 << 30)
#define HF_MAX_CONFIG_BYTES ((size_t)1 << 20)
#define HF_MAX_PATH (4096)

/* ---- names ------------------------------------------------------------------------ */

typedef struct name_map {
  const char *gwtf; /* suffix after "blocks.N." (blocks) or the whole name (head) */
  const char *hf;   /* suffix after the HF layer prefix, or the whole name */
  bool transpose;
} name_map;

static const name_map gpt_block_names[] = {
    {"ln1.weight", "ln_1.weight", false},          {"ln1.bias", "ln_1.bias", false},
    {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias", false},
    {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias", false},
    {"ln2.weight", "ln_2.weight", false},          {"ln2.bias", "ln_2.bias", false},
    {"mlp.fc.weight", "mlp.c_fc.weight", true},    {"mlp.fc.bias", "mlp.c_fc.bias", false},
    {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false},
};
static const name_map gpt_head_names[] = {
    {"tok_emb.weight", "wte.weight", false},
    {"pos_emb.weight", "wpe.weight", false},
    {"ln_f.weight", "ln_f.weight", false},
    {"ln_f.bias", "ln_f.bias", false},
};
static const name_map llama_block_names[] = {
    {"norm1.weight", "input_layernorm.weight", false},
    {"attn.q.weight", "self_attn.q_proj.weight", false},
    {"attn.k.weight", "self_attn.k_proj.weight", false},
    {"attn.v.weight", "self_attn.v_proj.weight", false},
    {"attn.o.weight", "self_attn.o_proj.weight", false},
    {"norm2.weight", "post_attention_layernorm.weight", false},
    {"mlp.gate.weight", "mlp.gate_proj.weight", false},
    {"mlp.up.weight", "mlp.up_proj.weight", false},
    {"mlp.down.weight", "mlp.down_proj.weight", false},
};
static const name_map llama_head_names[] = {
    {"tok_emb.weight", "model.embed_tokens.weight", false},
    {"norm_f.weight", "model.norm.weight", false},
    {"lm_head.weight", "lm_head.weight", false},
};

#define NMAP(a) (sizeof(a) / sizeof((a)[0]))

static const name_map *map_find(const name_map *m, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(m[i].gwtf, name) == 0) return &m[i];
  return NULL;
}

int hf_tensor_name(const model_config *cfg, const char *name, char *hf, size_t hf_len, bool *transpose) {
  bool gpt = cfg->arch == MODEL_GPT;
  int layer = -1, used = 0;
  const name_map *m;
  if (sscanf(name, "blocks.%d.%n", &layer, &used) == 1 && used > 0) {
    m = gpt ? map_find(gpt_block_names, NMAP(gpt_block_names), name + used)
            : map_find(llama_block_names, NMAP(llama_block_names), name + used);
    if (!m) return GW_ENOENT;
    snprintf(hf, hf_len, gpt ? "h.%d.%s" : "model.layers.%d.%s", layer, m->hf);
  } else {
    m = gpt ? map_find(gpt_head_names, NMAP(gpt_head_names), name)
            : map_find(llama_head_names, NMAP(llama_head_names), name);
    if (!m) return GW_ENOENT;
    snprintf(hf, hf_len, "%s", m->hf);
  }
  *transpose = m->transpose;
  return 0;
}

size_t hf_model_numel(const model_config *cfg) {
  return model_head_numel(cfg) + (size_t)cfg->n_layers * model_block_numel(cfg);
}

size_t hf_block_offset(const model_config *cfg, int layer) {
  return model_head_numel(cfg) + (size_t)layer * model_block_numel(cfg);
}

const char *hf_tokenizer_for(const model_config *cfg) {
  if (cfg->vocab_size == 256) return "bytes";
  if (cfg->vocab_size == 50257) return "gpt2";
  return "unknown";
}

/* Every tensor of the whole model with its offset in the flat array; the
 * caller frees the array. */
static model_tensor *all_tensors(const model_config *cfg, int *n_out) {
  size_t max = MODEL_HEAD_TENSORS_MAX + (size_t)cfg->n_layers * MODEL_BLOCK_TENSORS_MAX;
  model_tensor *t = calloc(max, sizeof(*t));
  if (!t) return NULL;
  int n = model_head_tensors(cfg, t);
  for (int l = 0; l < cfg->n_layers; l++) {
    int k = model_block_tensors(cfg, l, t + n);
    for (int i = 0; i < k; i++) t[n + i].offset += hf_block_offset(cfg, l);
    n += k;
  }
  *n_out = n;
  return t;
}

/* dst (cols, rows) = src (rows, cols)^T */
static void transpose(float *dst, const float *src, int rows, int cols) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
}

/* ---- stage states ------------------------------------------------------------------- */

void hf_model_init(hf_model *m) { memset(m, 0, sizeof(*m)); }

void hf_model_free(hf_model *m) {
  free(m->params);
  free(m->layers);
  memset(m, 0, sizeof(*m));
}

static int meta_int(const st_file *f, const char *key, int *out) {
  const char *s = st_meta(f, key);
  if (!s || !*s) return GW_EINVAL;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < INT_MIN || v > INT_MAX) return GW_EINVAL;
  *out = (int)v;
  return 0;
}

/* The model and layer range a stage state's metadata describes. */
static int state_meta(const st_file *f, model_config *cfg, int *first, int *n_layers, bool *head,
                      long long *step, char *err, size_t len) {
  const char *fmt = st_meta(f, "format"), *arch = st_meta(f, "arch");
  if (!fmt || strcmp(fmt, "gwtf-stage-1") != 0)
    return gw_fail(err, len, GW_EINVAL, "not a gwtf stage state (format '%s')", fmt ? fmt : "");
  memset(cfg, 0, sizeof(*cfg));
  if (!arch || model_arch_parse(arch, &cfg->arch) != 0)
    return gw_fail(err, len, GW_EINVAL, "stage state has unknown arch '%s'", arch ? arch : "");
  int has_head = 0;
  if (meta_int(f, "d_model", &cfg->d_model) || meta_int(f, "n_heads", &cfg->n_heads) ||
      meta_int(f, "n_layers", &cfg->n_layers) || meta_int(f, "d_ff", &cfg->d_ff) ||
      meta_int(f, "vocab_size", &cfg->vocab_size) || meta_int(f, "max_seq_len", &cfg->max_seq_len) ||
      meta_int(f, "first_layer", first) || meta_int(f, "stage_layers", n_layers) ||
      meta_int(f, "has_head", &has_head))
    return gw_fail(err, len, GW_EINVAL, "stage state metadata lacks an integer model field");
  const char *eps = st_meta(f, "eps"), *theta = st_meta(f, "rope_theta"), *st = st_meta(f, "step");
  if (!eps || !theta || !st) return gw_fail(err, len, GW_EINVAL, "stage state metadata lacks eps, rope_theta or step");
  cfg->eps = strtof(eps, NULL);
  cfg->rope_theta = strtof(theta, NULL);
  *step = strtoll(st, NULL, 10);
  *head = has_head != 0;
  int rc = model_config_validate(cfg, err, len);
  if (rc) return rc;
  if (*first < 0 || *n_layers < 0 || *first > cfg->n_layers || *n_layers > cfg->n_layers - *first ||
      (*n_layers == 0 && !*head))
    return gw_fail(err, len, GW_EINVAL, "stage state covers blocks [%d, %d) of a %d-layer model", *first,
                   *first + *n_layers, cfg->n_layers);
  return 0;
}

static bool same_config(const model_config *a, const model_config *b) {
  return a->arch == b->arch && a->d_model == b->d_model && a->n_heads == b->n_heads &&
         a->n_layers == b->n_layers && a->d_ff == b->d_ff && a->vocab_size == b->vocab_size &&
         a->max_seq_len == b->max_seq_len && a->eps == b->eps && a->rope_theta == b->rope_theta;
}

/* The stage's parameter tensors, in its storage order (head, then its
 * blocks), with offsets into the WHOLE model's flat array. */
static model_tensor *stage_tensors(const model_config *cfg, int first, int n_layers, bool head, int *n_out) {
  model_tensor *t = calloc(MODEL_HEAD_TENSORS_MAX + (size_t)n_layers * MODEL_BLOCK_TENSORS_MAX, sizeof(*t));
  if (!t) return NULL;
  int n = head ? model_head_tensors(cfg, t) : 0;
  for (int l = first; l < first + n_layers; l++) {
    int k = model_block_tensors(cfg, l, t + n);
    for (int i = 0; i < k; i++) t[n + i].offset += hf_block_offset(cfg, l);
    n += k;
  }
  *n_out = n;
  return t;
}

/* Checks every parameter tensor and that they lie back to back at the
 * start of the data section, as stage_weight_hash reads them; returns the
 * address of the first and their byte count. */
static int locate_params(const st_file *f, const model_tensor *t, int n, const uint8_t **start, size_t *bytes,
                         char *err, size_t len) {
  size_t pos = 0;
  for (int i = 0; i < n; i++) {
    int64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
    int rc = st_check(f, t[i].name, ST_F32, shape, t[i].ndim, err, len);
    if (rc) return rc;
    const st_tensor *s = st_find(f, t[i].name);
    if (s->begin != pos)
      return gw_fail(err, len, GW_EINVAL, "tensor '%s' is not where a stage state keeps it", t[i].name);
    if (i == 0) *start = s->data;
    pos = s->end;
  }
  *bytes = pos;
  return 0;
}

/* A serialized stage state, parsed: its model, its block range, its
 * tensors and where its parameters lie (the bytes its weight hash covers).
 * stage_view_close frees it whether or not the open succeeded. */
typedef struct stage_view {
  st_file f;
  bool parsed;
  model_config cfg;
  int first, nl, n;
  bool head;
  long long step;
  model_tensor *t;
  const uint8_t *start;
  size_t bytes;
} stage_view;

static int stage_view_open(stage_view *v, const uint8_t *buf, size_t len, char *err, size_t err_len) {
  memset(v, 0, sizeof(*v));
  int rc = st_parse(buf, len, &v->f, err, err_len);
  if (rc) return rc;
  v->parsed = true;
  rc = state_meta(&v->f, &v->cfg, &v->first, &v->nl, &v->head, &v->step, err, err_len);
  if (!rc && !(v->t = stage_tensors(&v->cfg, v->first, v->nl, v->head, &v->n))) rc = GW_ENOMEM;
  if (!rc) rc = locate_params(&v->f, v->t, v->n, &v->start, &v->bytes, err, err_len);
  return rc;
}

static void stage_view_close(stage_view *v) {
  free(v->t);
  if (v->parsed) st_free(&v->f);
  memset(v, 0, sizeof(*v));
}

int hf_model_add_stage(hf_model *m, const uint8_t *buf, size_t len, const uint8_t *want_hash, int *first_layer,
                       int *n_layers, bool *has_head, char *err, size_t err_len) {
  stage_view v;
  int rc = stage_view_open(&v, buf, len, err, err_len);
  if (!rc && m->have_cfg && !same_config(&v.cfg, &m->cfg))
    rc = gw_fail(err, err_len, GW_EINVAL, "stage state is for another model than the states before it");
  const model_config cfg = v.cfg;
  const int first = v.first, nl = v.nl, n = v.n;
  const bool head = v.head;
  const model_tensor *t = v.t;
  if (!rc && want_hash) {
    uint8_t got[HF_HASH_BYTES];
    crypto_generichash(got, sizeof(got), v.start, v.bytes, NULL, 0);
    if (sodium_memcmp(got, want_hash, HF_HASH_BYTES) != 0)
      rc = gw_fail(err, err_len, GW_EAUTH, "weights do not match the announced hash (blocks [%d, %d)%s)", first,
                   first + nl, head ? " + head" : "");
  }
  if (!rc && !m->have_cfg) {
    size_t total = hf_model_numel(&cfg);
    m->params = calloc(total ? total : 1, sizeof(float));
    m->layers = calloc((size_t)cfg.n_layers, sizeof(bool));
    if (!m->params || !m->layers) {
      free(m->params);
      free(m->layers);
      m->params = NULL, m->layers = NULL;
      rc = GW_ENOMEM;
    } else {
      m->cfg = cfg;
      m->have_cfg = true;
      m->step = v.step;
    }
  }
  for (int i = 0; !rc && i < n; i++) {
    const st_tensor *s = st_find(&v.f, t[i].name);
    memcpy(m->params + t[i].offset, s->data, t[i].numel * sizeof(float));
  }
  if (!rc) {
    m->head |= head;
    for (int l = first; l < first + nl; l++) m->layers[l] = true;
    if (first_layer) *first_layer = first;
    if (n_layers) *n_layers = nl;
    if (has_head) *has_head = head;
  }
  stage_view_close(&v);
  return rc;
}

int hf_state_weight_hash(const uint8_t *buf, size_t len, uint8_t out[HF_HASH_BYTES], char *err, size_t err_len) {
  stage_view v;
  int rc = stage_view_open(&v, buf, len, err, err_len);
  if (!rc) crypto_generichash(out, HF_HASH_BYTES, v.start, v.bytes, NULL, 0);
  stage_view_close(&v);
  return rc;
}

/* A stage state's JSON header names every tensor three times; 1 MiB is far
 * more than the largest preset needs and bounds what a peer makes us take. */
#define HF_STATE_HEADER_MAX ((size_t)1 << 20)

size_t hf_state_max_bytes(const model_config *cfg, int n_layers, bool head) {
  size_t params = (size_t)n_layers * model_block_numel(cfg) + (head ? model_head_numel(cfg) : 0);
  return HF_STATE_HEADER_MAX + 3 * params * sizeof(float);
}

int hf_model_complete(const hf_model *m, char *err, size_t err_len) {
  if (!m->have_cfg) return gw_fail(err, err_len, GW_ENOENT, "no stage state was found");
  if (!m->head) return gw_fail(err, err_len, GW_ENOENT, "the data-node part (embedding, final norm, head) is missing");
  for (int l = 0; l < m->cfg.n_layers; l++)
    if (!m->layers[l]) return gw_fail(err, err_len, GW_ENOENT, "block %d of %d is missing", l, m->cfg.n_layers);
  return 0;
}

/* ---- config.json ------------------------------------------------------------------ */

/* The float as the shortest decimal that reads back as it ("1e-05"), so
 * config.json says what a person wrote, not 9.99999975e-06. */
static json_t *json_float(float v) {
  char s[32];
  for (int prec = 6; prec <= 9; prec++) {
    snprintf(s, sizeof(s), "%.*g", prec, (double)v);
    if (strtof(s, NULL) == v) break;
  }
  return json_real(strtod(s, NULL));
}

static int set(json_t *o, const char *k, json_t *v) { return json_object_set_new(o, k, v); }

static void gpt_config(json_t *o, const model_config *c) {
  set(o, "architectures", json_pack("[s]", "GPT2LMHeadModel"));
  set(o, "model_type", json_string("gpt2"));
  set(o, "vocab_size", json_integer(c->vocab_size));
  set(o, "n_positions", json_integer(c->max_seq_len));
  set(o, "n_ctx", json_integer(c->max_seq_len));
  set(o, "n_embd", json_integer(c->d_model));
  set(o, "n_layer", json_integer(c->n_layers));
  set(o, "n_head", json_integer(c->n_heads));
  set(o, "n_inner", json_integer(c->d_ff));
  set(o, "activation_function", json_string("gelu_new")); /* the tanh approximation */
  set(o, "layer_norm_epsilon", json_float(c->eps));
  set(o, "resid_pdrop", json_real(0.0));
  set(o, "embd_pdrop", json_real(0.0));
  set(o, "attn_pdrop", json_real(0.0));
  set(o, "initializer_range", json_real(0.02));
  set(o, "scale_attn_weights", json_true());
  set(o, "tie_word_embeddings", json_true());
  if (c->vocab_size == 50257) { /* GPT-2's <|endoftext|> */
    set(o, "bos_token_id", json_integer(50256));
    set(o, "eos_token_id", json_integer(50256));
  }
}

static void llama_config(json_t *o, const model_config *c) {
  set(o, "architectures", json_pack("[s]", "LlamaForCausalLM"));
  set(o, "model_type", json_string("llama"));
  set(o, "vocab_size", json_integer(c->vocab_size));
  set(o, "hidden_size", json_integer(c->d_model));
  set(o, "intermediate_size", json_integer(c->d_ff));
  set(o, "num_hidden_layers", json_integer(c->n_layers));
  set(o, "num_attention_heads", json_integer(c->n_heads));
  set(o, "num_key_value_heads", json_integer(c->n_heads));
  set(o, "head_dim", json_integer(c->d_model / c->n_heads));
  set(o, "max_position_embeddings", json_integer(c->max_seq_len));
  set(o, "rms_norm_eps", json_float(c->eps));
  set(o, "rope_theta", json_float(c->rope_theta));
  set(o, "rope_scaling", json_null());
  set(o, "hidden_act", json_string("silu"));
  set(o, "attention_bias", json_false());
  set(o, "mlp_bias", json_false());
  set(o, "tie_word_embeddings", json_false());
  set(o, "initializer_range", json_real(0.02));
}

char *hf_config_json(const model_config *c, const hf_export_info *info) {
  json_t *o = json_object();
  if (!o) return NULL;
  if (c->arch == MODEL_GPT)
    gpt_config(o, c);
  else
    llama_config(o, c);
  set(o, "torch_dtype", json_string("float32"));
  json_t *g = json_object();
  char *model = model_config_to_json(c);
  if (g && model) {
    set(g, "model", json_loads(model, 0, NULL));
    set(g, "tokenizer", json_string(hf_tokenizer_for(c)));
    if (info && info->run) set(g, "run", json_string(info->run));
    if (info && info->iteration >= 0) set(g, "iteration", json_integer(info->iteration));
    if (info && info->source) set(g, "source", json_string(info->source));
  }
  free(model);
  set(o, "gwtf", g);
  char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
  json_decref(o);
  return s;
}

/* Reads an integer field; absent fields fail unless dflt >= 0 is given. */
static int cfg_int(json_t *o, const char *key, int dflt, int *out, char *err, size_t len) {
  json_t *v = json_object_get(o, key);
  if ((!v || json_is_null(v)) && dflt >= 0) return (*out = dflt), 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
    return gw_fail(err, len, GW_EINVAL, "config.json: \"%s\" must be a non-negative integer", key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int cfg_float(json_t *o, const char *key, double dflt, float *out, char *err, size_t len) {
  json_t *v = json_object_get(o, key);
  if (!v && dflt >= 0) return (*out = (float)dflt), 0;
  if (!json_is_number(v) || !isfinite(json_number_value(v)))
    return gw_fail(err, len, GW_EINVAL, "config.json: \"%s\" must be a finite number", key);
  *out = (float)json_number_value(v);
  return 0;
}

static int cfg_str_is(json_t *o, const char *key, const char *dflt, const char *const *ok, char *err, size_t len) {
  json_t *v = json_object_get(o, key);
  const char *s = v ? json_string_value(v) : dflt;
  for (int i = 0; s && ok[i]; i++)
    if (strcmp(s, ok[i]) == 0) return 0;
  return gw_fail(err, len, GW_EUNSUPPORTED, "config.json: %s \"%s\" is not supported (gwtf runs %s)", key,
                 s ? s : "(missing)", ok[0]);
}

static int parse_gpt(json_t *o, model_config *c, char *err, size_t len) {
  static const char *const acts[] = {"gelu_new", "gelu_pytorch_tanh", NULL};
  c->arch = MODEL_GPT;
  int rc = cfg_int(o, "vocab_size", -1, &c->vocab_size, err, len);
  if (!rc) rc = cfg_int(o, "n_positions", -1, &c->max_seq_len, err, len);
  if (!rc) rc = cfg_int(o, "n_embd", -1, &c->d_model, err, len);
  if (!rc) rc = cfg_int(o, "n_layer", -1, &c->n_layers, err, len);
  if (!rc) rc = cfg_int(o, "n_head", -1, &c->n_heads, err, len);
  /* GPT2Config's n_inner null means 4 * n_embd */
  if (!rc) rc = cfg_int(o, "n_inner", c->d_model <= INT_MAX / 4 ? 4 * c->d_model : -1, &c->d_ff, err, len);
  if (!rc) rc = cfg_float(o, "layer_norm_epsilon", 1e-5, &c->eps, err, len);
  if (!rc) rc = cfg_str_is(o, "activation_function", "gelu_new", acts, err, len);
  c->rope_theta = 10000.0f;
  json_t *tie = json_object_get(o, "tie_word_embeddings");
  if (!rc && tie && !json_is_true(tie))
    rc = gw_fail(err, len, GW_EUNSUPPORTED, "config.json: an untied GPT-2 head is not supported");
  return rc;
}

static int parse_llama(json_t *o, model_config *c, char *err, size_t len) {
  static const char *const acts[] = {"silu", NULL};
  c->arch = MODEL_LLAMA;
  int kv = 0, rc = cfg_int(o, "vocab_size", -1, &c->vocab_size, err, len);
  if (!rc) rc = cfg_int(o, "hidden_size", -1, &c->d_model, err, len);
  if (!rc) rc = cfg_int(o, "intermediate_size", -1, &c->d_ff, err, len);
  if (!rc) rc = cfg_int(o, "num_hidden_layers", -1, &c->n_layers, err, len);
  if (!rc) rc = cfg_int(o, "num_attention_heads", -1, &c->n_heads, err, len);
  if (!rc) rc = cfg_int(o, "num_key_value_heads", c->n_heads, &kv, err, len);
  if (!rc) rc = cfg_int(o, "max_position_embeddings", -1, &c->max_seq_len, err, len);
  if (!rc) rc = cfg_float(o, "rms_norm_eps", 1e-6, &c->eps, err, len);
  if (!rc) rc = cfg_float(o, "rope_theta", 10000.0, &c->rope_theta, err, len);
  if (!rc) rc = cfg_str_is(o, "hidden_act", "silu", acts, err, len);
  if (rc) return rc;
  json_t *hd = json_object_get(o, "head_dim"), *scaling = json_object_get(o, "rope_scaling");
  if (kv != c->n_heads)
    return gw_fail(err, len, GW_EUNSUPPORTED, "config.json: grouped KV heads (%d of %d) are not supported", kv,
                   c->n_heads);
  if (hd && !json_is_null(hd) && c->n_heads > 0 && json_integer_value(hd) != c->d_model / c->n_heads)
    return gw_fail(err, len, GW_EUNSUPPORTED, "config.json: head_dim other than hidden_size / heads");
  if (scaling && !json_is_null(scaling))
    return gw_fail(err, len, GW_EUNSUPPORTED, "config.json: rope_scaling is not supported");
  if (json_is_true(json_object_get(o, "tie_word_embeddings")) ||
      json_is_true(json_object_get(o, "attention_bias")) || json_is_true(json_object_get(o, "mlp_bias")))
    return gw_fail(err, len, GW_EUNSUPPORTED, "config.json: tied embeddings or biases are not supported for llama");
  return 0;
}

int hf_config_parse(const char *json, size_t len, model_config *cfg, char *err, size_t err_len) {
  json_error_t je;
  json_t *o = json_loadb(json, len, 0, &je);
  if (!o || !json_is_object(o)) {
    json_decref(o);
    return gw_fail(err, err_len, GW_EINVAL, "config.json is not a JSON object (%s)", o ? "wrong type" : je.text);
  }
  model_config c;
  memset(&c, 0, sizeof(c));
  const char *type = json_string_value(json_object_get(o, "model_type"));
  int rc;
  if (type && strcmp(type, "gpt2") == 0)
    rc = parse_gpt(o, &c, err, err_len);
  else if (type && strcmp(type, "llama") == 0)
    rc = parse_llama(o, &c, err, err_len);
  else
    rc = gw_fail(err, err_len, GW_EUNSUPPORTED, "config.json: model_type \"%s\" (gwtf runs gpt2 and llama)",
                 type ? type : "(missing)");
  json_decref(o);
  if (!rc) rc = model_config_validate(&c, err, err_len);
  if (!rc) *cfg = c;
  return rc;
}

/* ---- the directory ---------------------------------------------------------------- */

static int path_in(char *out, size_t len, const char *dir, const char *file) {
  int n = snprintf(out, len, "%s/%s", dir, file);
  return n > 0 && (size_t)n < len ? 0 : GW_ERANGE;
}

static int write_tokenizer_note(const char *dir, const model_config *c) {
  char path[HF_MAX_PATH], text[1024];
  const char *tok = hf_tokenizer_for(c);
  int n;
  if (strcmp(tok, "bytes") == 0)
    n = snprintf(text, sizeof(text),
                 "tokenizer: bytes\n"
                 "Byte-level: token i is the byte value i (vocab 256); text is its UTF-8 bytes.\n"
                 "No tokenizer files are needed: encode with list(text.encode()),\n"
                 "decode with bytes(ids).decode(errors=\"replace\").\n");
  else if (strcmp(tok, "gpt2") == 0)
    n = snprintf(text, sizeof(text),
                 "tokenizer: gpt2\n"
                 "GPT-2 BPE (vocab 50257, <|endoftext|> = 50256), as in llm.c token files.\n"
                 "Use the tokenizer files (vocab.json, merges.txt) of openai-community/gpt2;\n"
                 "gwtf does not ship them.\n");
  else
    n = snprintf(text, sizeof(text),
                 "tokenizer: unknown\n"
                 "Vocab %d: the run trained on token ids from its dataset file; use the\n"
                 "tokenizer that produced that file.\n",
                 c->vocab_size);
  int rc = path_in(path, sizeof(path), dir, HF_TOKENIZER_FILE);
  return rc ? rc : gw_file_write_atomic1(path, text, (size_t)n, 0644);
}

int hf_write_dir(const char *dir, const model_config *cfg, const float *params, const hf_export_info *info,
                 char *err, size_t err_len) {
  int n = 0, rc = gw_mkdir_p(dir, 0755);
  if (rc) return gw_fail(err, err_len, rc, "cannot create %s: %s", dir, gw_strerror(rc));
  model_tensor *t = all_tensors(cfg, &n);
  float *tbuf = malloc(hf_model_numel(cfg) * sizeof(float)); /* transposed copies */
  st_writer w;
  st_writer_init(&w);
  if (!t || !tbuf) rc = GW_ENOMEM;
  st_writer_meta(&w, "format", "pt"); /* transformers refuses safetensors without it */
  for (int i = 0; !rc && i < n; i++) {
    char name[HF_NAME_MAX];
    bool tr;
    rc = hf_tensor_name(cfg, t[i].name, name, sizeof(name), &tr);
    if (rc) break;
    const float *src = params + t[i].offset;
    int64_t shape[2] = {t[i].shape[0], t[i].shape[1]};
    if (tr) {
      transpose(tbuf + t[i].offset, src, t[i].shape[0], t[i].shape[1]);
      src = tbuf + t[i].offset;
      shape[0] = t[i].shape[1], shape[1] = t[i].shape[0];
    }
    st_writer_add(&w, name, ST_F32, shape, t[i].ndim, src);
  }
  char path[HF_MAX_PATH];
  if (!rc) rc = path_in(path, sizeof(path), dir, HF_MODEL_FILE);
  if (!rc) rc = st_writer_save(&w, path);
  st_writer_free(&w);
  free(tbuf);
  free(t);
  char *js = rc ? NULL : hf_config_json(cfg, info);
  if (!rc && !js) rc = GW_ENOMEM;
  if (!rc) rc = path_in(path, sizeof(path), dir, HF_CONFIG_FILE);
  if (!rc) rc = gw_file_write_atomic1(path, js, strlen(js), 0644);
  free(js);
  if (!rc) rc = write_tokenizer_note(dir, cfg);
  if (rc) return gw_fail(err, err_len, rc, "cannot write the export in %s: %s", dir, gw_strerror(rc));
  return 0;
}

int hf_read_dir(const char *dir, model_config *cfg, float **params, char *err, size_t err_len) {
  char path[HF_MAX_PATH];
  uint8_t *js = NULL;
  size_t js_len = 0;
  int rc = path_in(path, sizeof(path), dir, HF_CONFIG_FILE);
  if (!rc) rc = gw_file_read_all(path, HF_MAX_CONFIG_BYTES, &js, &js_len);
  if (rc) return gw_fail(err, err_len, rc, "cannot read %s: %s", path, gw_strerror(rc));
  model_config c;
  rc = hf_config_parse((const char *)js, js_len, &c, err, err_len);
  free(js);
  if (rc) return rc;
  st_file f;
  rc = path_in(path, sizeof(path), dir, HF_MODEL_FILE);
  if (!rc) rc = st_load(path, HF_MAX_MODEL_BYTES, &f, err, err_len);
  if (rc) return rc;
  int n = 0;
  model_tensor *t = all_tensors(&c, &n);
  size_t biggest = 1; /* the scratch for one transposed matrix */
  for (int i = 0; t && i < n; i++) biggest = t[i].numel > biggest ? t[i].numel : biggest;
  float *p = malloc(hf_model_numel(&c) * sizeof(float));
  float *tmp = malloc(biggest * sizeof(float));
  if (!t || !p || !tmp) rc = GW_ENOMEM;
  for (int i = 0; !rc && i < n; i++) {
    char name[HF_NAME_MAX];
    bool tr;
    rc = hf_tensor_name(&c, t[i].name, name, sizeof(name), &tr);
    if (rc) break;
    int64_t shape[2] = {tr ? t[i].shape[1] : t[i].shape[0], tr ? t[i].shape[0] : t[i].shape[1]};
    rc = st_copy(&f, name, ST_F32, shape, t[i].ndim, tr ? tmp : p + t[i].offset, err, err_len);
    if (!rc && tr) transpose(p + t[i].offset, tmp, (int)shape[0], (int)shape[1]);
  }
  free(tmp);
  free(t);
  st_free(&f);
  if (rc) {
    free(p);
    if (rc == GW_ENOMEM) return gw_fail(err, err_len, rc, "out of memory reading %s", dir);
    return rc;
  }
  *cfg = c;
  *params = p;
  return 0;
}
