/* train/model.h — the model definition: architectures, configuration,
 * named presets, and the parameter tensors of each part with their names,
 * shapes, storage order and initialisation.
 *
 * Two architectures, defined exactly so that any PyTorch user can reproduce
 * them (scripts/gen_fixtures.py is that reproduction):
 *
 *   gpt   (pre-LN GPT-2)  h = x + attn.proj(attn(ln1(x)))
 *                         y = h + mlp.proj(gelu_tanh(mlp.fc(ln2(h))))
 *         LayerNorm eps, biases everywhere, qkv one Linear(C, 3C) in q, k, v
 *         order, learned positions, LM head tied to tok_emb.
 *   llama                 h = x + attn.o(attn(rope(attn.q(n)), rope(attn.k(n)), attn.v(n))),
 *                         n = norm1(x)
 *                         y = h + mlp.down(silu(mlp.gate(m)) * mlp.up(m)), m = norm2(h)
 *         RMSNorm (weight only), no biases, rotate-half RoPE, n_kv_heads =
 *         n_heads, untied lm_head.
 *
 * Both use causal attention with scale 1/sqrt(head_dim) and a loss that is
 * the mean cross-entropy over all B*T positions.
 *
 * A model is cut into parts: block i (blocks.{i}.*) and the data-node part
 * ("head": embedding, final norm and LM head, all on the data node because
 * they need the tokens). Within a part, tensors are stored back to back in
 * the order listed by model_*_tensors; that order is chosen so that
 * attn.{q,k,v} (llama) form one (3C, C) matrix and mlp.{gate,up} one
 * (2F, C) matrix, each computed by a single matmul. */
#ifndef GWTF_TRAIN_MODEL_H
#define GWTF_TRAIN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum model_arch { MODEL_GPT = 0, MODEL_LLAMA = 1 } model_arch;

typedef struct model_config {
  model_arch arch;
  int d_model;     /* C */
  int n_heads;     /* NH; head_dim = C / NH */
  int n_layers;    /* L, blocks in the whole model */
  int d_ff;        /* F, MLP hidden width */
  int vocab_size;  /* V */
  int max_seq_len; /* T_max: rows of pos_emb (gpt), of the RoPE table (llama) */
  float eps;       /* norm epsilon */
  float rope_theta;
} model_config;

/* Limits a config must respect (sizes are checked before allocation). */
#define MODEL_MAX_DIM (1 << 16)
#define MODEL_MAX_LAYERS (1024)
#define MODEL_MAX_VOCAB (1 << 20)
#define MODEL_MAX_SEQ (1 << 16)
#define MODEL_NAME_MAX (64) /* longest tensor name, NUL included */

const char *model_arch_name(model_arch arch);
/* "gpt" or "llama". Returns 0 or GW_EINVAL. */
int model_arch_parse(const char *s, model_arch *out);

/* Checks every field (positive, within limits, C divisible by NH, even
 * head_dim for RoPE, finite eps and theta). Returns 0 or GW_EINVAL with a
 * sentence in err. */
int model_config_validate(const model_config *cfg, char *err, size_t err_len);

/* ---- presets ------------------------------------------------------------------ */

typedef struct model_preset {
  const char *name;
  const char *summary;
  model_config cfg;
} model_preset;

/* The named presets, in the order `gwtf help` lists them. */
const model_preset *model_presets(size_t *n);
/* Copies the preset called name (or an older alias: gpt2-124m is
 * gpt2-small) into out. Returns 0 or GW_ENOENT. */
int model_preset_get(const char *name, model_config *out);

/* ---- JSON (run records, --model FILE) --------------------------------------------- */

/* {"arch":"gpt","d_model":128,...} with every field. Returns a malloc'd NUL-
 * terminated string, or NULL when out of memory. */
char *model_config_to_json(const model_config *cfg);
/* Parses and validates the JSON form; fields absent from the object keep
 * the values already in *out (so a file can override a preset). */
int model_config_from_json(const char *json, size_t len, model_config *out, char *err,
                           size_t err_len);

/* ---- tensors ------------------------------------------------------------------ */

typedef enum model_init {
  MODEL_INIT_NORMAL = 0, /* N(0, std^2) */
  MODEL_INIT_ZEROS = 1,
  MODEL_INIT_ONES = 2,
} model_init;

typedef struct model_tensor {
  char name[MODEL_NAME_MAX]; /* "blocks.3.attn.qkv.weight" */
  int ndim;                  /* 1 or 2 */
  int shape[2];
  size_t numel;
  size_t offset;     /* in floats, from the start of its part */
  model_init init;
  float init_std;    /* for MODEL_INIT_NORMAL */
  bool weight_decay; /* matrices decay; biases, norms and embeddings do not */
} model_tensor;

/* Upper bounds on tensors per part, for fixed-size arrays. */
#define MODEL_BLOCK_TENSORS_MAX (12)
#define MODEL_HEAD_TENSORS_MAX (4)

/* Fills out[] with the tensors of block `layer` in storage order and returns
 * how many (at most MODEL_BLOCK_TENSORS_MAX). Offsets start at 0. */
int model_block_tensors(const model_config *cfg, int layer, model_tensor *out);
/* The same for the data-node part. */
int model_head_tensors(const model_config *cfg, model_tensor *out);
/* Floats in one block / in the data-node part. */
size_t model_block_numel(const model_config *cfg);
size_t model_head_numel(const model_config *cfg);
/* Parameters of the whole model (the head counted once even when tied). */
size_t model_total_params(const model_config *cfg);

/* GPT-2 style initialisation of one tensor: N(0, 0.02^2) for matrices and
 * embeddings, the residual output projections (attn.proj / mlp.proj, attn.o /
 * mlp.down) scaled by 1/sqrt(2 L), zeros for biases, ones for norm weights.
 * The stream depends only on (seed, tensor name), so a stage holding blocks
 * 4..7 gets exactly the weights those blocks have in a full model. */
void model_init_tensor(const model_tensor *t, uint64_t seed, float *data);

/* Model FLOPs of one forward pass over B*T tokens through n_layers blocks
 * (matmuls and attention, PaLM convention: attention counted unmasked).
 * Backward is twice this. */
double model_block_flops(const model_config *cfg, int n_layers, int B, int T);

#endif
