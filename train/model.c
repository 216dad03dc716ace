/* train/model.c — architectures, presets, tensor layout and initialisation. */
#include "train/model.h"

#include <jansson.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/id.h"
#include "util/rng.h"

#define MODEL_INIT_STD (0.02f)

static void set_err(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t len, const char *fmt, ...) {
  if (!err || !len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

const char *model_arch_name(model_arch arch) { return arch == MODEL_LLAMA ? "llama" : "gpt"; }

int model_arch_parse(const char *s, model_arch *out) {
  if (s && strcmp(s, "gpt") == 0) return (*out = MODEL_GPT), 0;
  if (s && strcmp(s, "llama") == 0) return (*out = MODEL_LLAMA), 0;
  return GW_EINVAL;
}

static int check_range(const char *what, int v, int max, char *err, size_t len) {
  if (v >= 1 && v <= max) return 0;
  set_err(err, len, "%s must be between 1 and %d (got %d)", what, max, v);
  return GW_EINVAL;
}

int model_config_validate(const model_config *c, char *err, size_t len) {
  if (c->arch != MODEL_GPT && c->arch != MODEL_LLAMA) {
    set_err(err, len, "unknown architecture %d", (int)c->arch);
    return GW_EINVAL;
  }
  if (check_range("d_model", c->d_model, MODEL_MAX_DIM, err, len) ||
      check_range("n_heads", c->n_heads, MODEL_MAX_DIM, err, len) ||
      check_range("n_layers", c->n_layers, MODEL_MAX_LAYERS, err, len) ||
      check_range("d_ff", c->d_ff, 4 * MODEL_MAX_DIM, err, len) ||
      check_range("vocab_size", c->vocab_size, MODEL_MAX_VOCAB, err, len) ||
      check_range("max_seq_len", c->max_seq_len, MODEL_MAX_SEQ, err, len))
    return GW_EINVAL;
  if (c->d_model % c->n_heads) {
    set_err(err, len, "d_model %d is not divisible by n_heads %d", c->d_model, c->n_heads);
    return GW_EINVAL;
  }
  if (c->arch == MODEL_LLAMA && (c->d_model / c->n_heads) % 2) {
    set_err(err, len, "llama needs an even head_dim for RoPE (d_model %d / n_heads %d)", c->d_model,
            c->n_heads);
    return GW_EINVAL;
  }
  if (!(c->eps > 0.0f && c->eps < 1.0f)) {
    set_err(err, len, "eps must be in (0, 1) (got %g)", (double)c->eps);
    return GW_EINVAL;
  }
  if (c->arch == MODEL_LLAMA && !(c->rope_theta > 1.0f && isfinite(c->rope_theta))) {
    set_err(err, len, "rope_theta must be a finite number > 1 (got %g)", (double)c->rope_theta);
    return GW_EINVAL;
  }
  return 0;
}

/* ---- presets ------------------------------------------------------------------ */

static const model_preset presets[] = {
    {"tiny", "gpt, byte-level, 0.84M params: trains on two CPU cores in minutes",
     {MODEL_GPT, 128, 4, 4, 512, 256, 128, 1e-5f, 10000.0f}},
    {"tiny-llama", "llama, byte-level, 0.87M params: the llama twin of tiny",
     {MODEL_LLAMA, 128, 4, 4, 352, 256, 128, 1e-5f, 10000.0f}},
    {"small", "gpt, byte-level, 10.8M params",
     {MODEL_GPT, 384, 6, 6, 1536, 256, 256, 1e-5f, 10000.0f}},
    /* GPT-2 small exactly (124M); "gpt2-124m" is its older name (aliases). */
    {"gpt2-small", "GPT-2 small (124M; 12 layers, d_model 768) on GPT-2 BPE tokens (llm.c .bin files)",
     {MODEL_GPT, 768, 12, 12, 3072, 50257, 1024, 1e-5f, 10000.0f}},
    /* A LLaMA twin of gpt2-small: SwiGLU hidden 2048 (LLaMA's 8C/3 rule),
     * untied lm_head, GPT-2's vocabulary so it reads the same token files. */
    {"llama-160m", "llama, 162M (12 layers, d_model 768, 12 heads, SwiGLU 2048) on GPT-2 BPE tokens",
     {MODEL_LLAMA, 768, 12, 12, 2048, 50257, 1024, 1e-5f, 10000.0f}},
    /* The GWTF paper's models: d_model 1024 and 16 layers as in its §VI.
     * Its 18 heads do not divide 1024 (head_dim 56.9), so 16 heads of 64.
     * The paper names no tokenizer; GPT-2's vocabulary lets these presets
     * train on the same llm.c token files. Sequence length 512 as there. */
    {"paper-llama", "the GWTF paper's LLaMA-like model (d_model 1024, 16 layers, 16 heads; 308M)",
     {MODEL_LLAMA, 1024, 16, 16, 2816, 50257, 512, 1e-5f, 10000.0f}},
    {"paper-gpt", "the GWTF paper's GPT-like model (d_model 1024, 16 layers, 16 heads; 254M)",
     {MODEL_GPT, 1024, 16, 16, 4096, 50257, 512, 1e-5f, 10000.0f}},
};

const model_preset *model_presets(size_t *n) {
  *n = sizeof(presets) / sizeof(presets[0]);
  return presets;
}

/* Older names that keep working; `gwtf help` lists only the presets. */
static const struct {
  const char *alias, *name;
} preset_aliases[] = {{"gpt2-124m", "gpt2-small"}};

int model_preset_get(const char *name, model_config *out) {
  for (size_t i = 0; i < sizeof(preset_aliases) / sizeof(preset_aliases[0]); i++)
    if (strcmp(preset_aliases[i].alias, name) == 0) name = preset_aliases[i].name;
  for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
    if (strcmp(presets[i].name, name) == 0) {
      *out = presets[i].cfg;
      return 0;
    }
  }
  return GW_ENOENT;
}

/* ---- JSON ----------------------------------------------------------------------- */

char *model_config_to_json(const model_config *c) {
  json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f}", "arch",
                        model_arch_name(c->arch), "d_model", c->d_model, "n_heads", c->n_heads,
                        "n_layers", c->n_layers, "d_ff", c->d_ff, "vocab_size", c->vocab_size,
                        "max_seq_len", c->max_seq_len, "eps", (double)c->eps, "rope_theta",
                        (double)c->rope_theta);
  if (!o) return NULL;
  char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  return s;
}

static int json_int_field(json_t *o, const char *key, int *dst, char *err, size_t len) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30)) {
    set_err(err, len, "model field \"%s\" must be a non-negative integer", key);
    return GW_EINVAL;
  }
  *dst = (int)json_integer_value(v);
  return 0;
}

static int json_float_field(json_t *o, const char *key, float *dst, char *err, size_t len) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_number(v)) {
    set_err(err, len, "model field \"%s\" must be a number", key);
    return GW_EINVAL;
  }
  double d = json_number_value(v);
  if (!isfinite(d) || fabs(d) > FLT_MAX) {
    /* 1e78 is a valid JSON number but an infinite float, which no record
     * could carry again (jansson writes no infinities). */
    set_err(err, len, "model field \"%s\" must be a finite float (got %g)", key, d);
    return GW_EINVAL;
  }
  *dst = (float)d;
  return 0;
}

int model_config_from_json(const char *json, size_t len, model_config *out, char *err,
                           size_t err_len) {
  json_error_t je;
  json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
  if (!o || !json_is_object(o)) {
    set_err(err, err_len, "model config is not a JSON object (%s)", o ? "wrong type" : je.text);
    json_decref(o);
    return GW_EINVAL;
  }
  model_config c = *out;
  int rc = 0;
  json_t *arch = json_object_get(o, "arch");
  if (arch && model_arch_parse(json_string_value(arch), &c.arch) != 0) {
    set_err(err, err_len, "model field \"arch\" must be \"gpt\" or \"llama\"");
    rc = GW_EINVAL;
  }
  if (!rc) rc = json_int_field(o, "d_model", &c.d_model, err, err_len);
  if (!rc) rc = json_int_field(o, "n_heads", &c.n_heads, err, err_len);
  if (!rc) rc = json_int_field(o, "n_layers", &c.n_layers, err, err_len);
  if (!rc) rc = json_int_field(o, "d_ff", &c.d_ff, err, err_len);
  if (!rc) rc = json_int_field(o, "vocab_size", &c.vocab_size, err, err_len);
  if (!rc) rc = json_int_field(o, "max_seq_len", &c.max_seq_len, err, err_len);
  if (!rc) rc = json_float_field(o, "eps", &c.eps, err, err_len);
  if (!rc) rc = json_float_field(o, "rope_theta", &c.rope_theta, err, err_len);
  json_decref(o);
  if (!rc) rc = model_config_validate(&c, err, err_len);
  if (!rc) *out = c;
  return rc;
}

/* ---- tensors ------------------------------------------------------------------ */

/* Appends one tensor to a part's list; offsets follow the storage order. */
static void add_tensor(model_tensor *out, int *n, size_t *offset, const char *prefix,
                       const char *name, int rows, int cols, model_init init, float std) {
  model_tensor *t = &out[(*n)++];
  memset(t, 0, sizeof(*t));
  snprintf(t->name, sizeof(t->name), "%s%s", prefix, name);
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
  t->offset = *offset;
  t->init = init;
  t->init_std = std;
  t->weight_decay = cols != 0 && init == MODEL_INIT_NORMAL;
  *offset += t->numel;
}

int model_block_tensors(const model_config *c, int layer, model_tensor *out) {
  char p[32];
  snprintf(p, sizeof(p), "blocks.%d.", layer);
  int C = c->d_model, F = c->d_ff, n = 0;
  size_t off = 0;
  float std = MODEL_INIT_STD, res_std = MODEL_INIT_STD / sqrtf(2.0f * (float)c->n_layers);
  if (c->arch == MODEL_GPT) {
    add_tensor(out, &n, &off, p, "ln1.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, p, "ln1.bias", C, 0, MODEL_INIT_ZEROS, 0);
    add_tensor(out, &n, &off, p, "attn.qkv.weight", 3 * C, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "attn.qkv.bias", 3 * C, 0, MODEL_INIT_ZEROS, 0);
    add_tensor(out, &n, &off, p, "attn.proj.weight", C, C, MODEL_INIT_NORMAL, res_std);
    add_tensor(out, &n, &off, p, "attn.proj.bias", C, 0, MODEL_INIT_ZEROS, 0);
    add_tensor(out, &n, &off, p, "ln2.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, p, "ln2.bias", C, 0, MODEL_INIT_ZEROS, 0);
    add_tensor(out, &n, &off, p, "mlp.fc.weight", F, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "mlp.fc.bias", F, 0, MODEL_INIT_ZEROS, 0);
    add_tensor(out, &n, &off, p, "mlp.proj.weight", C, F, MODEL_INIT_NORMAL, res_std);
    add_tensor(out, &n, &off, p, "mlp.proj.bias", C, 0, MODEL_INIT_ZEROS, 0);
  } else {
    add_tensor(out, &n, &off, p, "norm1.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, p, "attn.q.weight", C, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "attn.k.weight", C, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "attn.v.weight", C, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "attn.o.weight", C, C, MODEL_INIT_NORMAL, res_std);
    add_tensor(out, &n, &off, p, "norm2.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, p, "mlp.gate.weight", F, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "mlp.up.weight", F, C, MODEL_INIT_NORMAL, std);
    add_tensor(out, &n, &off, p, "mlp.down.weight", C, F, MODEL_INIT_NORMAL, res_std);
  }
  return n;
}

int model_head_tensors(const model_config *c, model_tensor *out) {
  int C = c->d_model, V = c->vocab_size, n = 0;
  size_t off = 0;
  add_tensor(out, &n, &off, "", "tok_emb.weight", V, C, MODEL_INIT_NORMAL, MODEL_INIT_STD);
  if (c->arch == MODEL_GPT) {
    add_tensor(out, &n, &off, "", "pos_emb.weight", c->max_seq_len, C, MODEL_INIT_NORMAL,
               MODEL_INIT_STD);
    add_tensor(out, &n, &off, "", "ln_f.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, "", "ln_f.bias", C, 0, MODEL_INIT_ZEROS, 0);
  } else {
    add_tensor(out, &n, &off, "", "norm_f.weight", C, 0, MODEL_INIT_ONES, 0);
    add_tensor(out, &n, &off, "", "lm_head.weight", V, C, MODEL_INIT_NORMAL, MODEL_INIT_STD);
  }
  /* Embeddings are looked up, not multiplied: no decay (GPT-2 practice),
   * except llama's untied lm_head, which is an ordinary matrix. */
  for (int i = 0; i < n; i++)
    if (strstr(out[i].name, "_emb.")) out[i].weight_decay = false;
  return n;
}

static size_t part_numel(const model_tensor *t, int n) { return n ? t[n - 1].offset + t[n - 1].numel : 0; }

size_t model_block_numel(const model_config *c) {
  model_tensor t[MODEL_BLOCK_TENSORS_MAX];
  return part_numel(t, model_block_tensors(c, 0, t));
}

size_t model_head_numel(const model_config *c) {
  model_tensor t[MODEL_HEAD_TENSORS_MAX];
  return part_numel(t, model_head_tensors(c, t));
}

size_t model_total_params(const model_config *c) {
  return (size_t)c->n_layers * model_block_numel(c) + model_head_numel(c);
}

void model_init_tensor(const model_tensor *t, uint64_t seed, float *data) {
  if (t->init == MODEL_INIT_ZEROS) {
    memset(data, 0, t->numel * sizeof(float));
    return;
  }
  if (t->init == MODEL_INIT_ONES) {
    for (size_t i = 0; i < t->numel; i++) data[i] = 1.0f;
    return;
  }
  /* Seed = run seed mixed with a hash of the name: independent of which
   * stage holds the tensor and of the order tensors are created in. */
  gw_id h;
  gw_id_hash_str(t->name, &h);
  uint64_t name_bits;
  memcpy(&name_bits, h.b, sizeof(name_bits));
  gw_rng rng;
  gw_rng_seed(&rng, seed ^ name_bits);
  for (size_t i = 0; i < t->numel; i++) data[i] = (float)gw_rng_normal(&rng) * t->init_std;
}

double model_block_flops(const model_config *c, int n_layers, int B, int T) {
  double N = (double)B * T, C = c->d_model, F = c->d_ff;
  /* qkv + out projection + MLP (gpt: fc and proj; llama: gate, up, down) */
  double mlp = c->arch == MODEL_GPT ? 2.0 * C * F : 3.0 * C * F;
  double linear = 2.0 * N * (3.0 * C * C + C * C + mlp);
  /* S = Q K^T and P V, each 2*T*T*hd per head: 4 * B * T * T * C in all */
  double attn = 4.0 * (double)B * T * T * C;
  return (double)n_layers * (linear + attn);
}
