/* train/hf_export.h — the whole model as a Hugging Face–style directory
 * (module prefix hf_).
 *
 * An export directory holds
 *   model.safetensors  every parameter under the architecture's standard
 *                      name, fp32, __metadata__ {"format": "pt"}:
 *     gpt    GPT-2 (GPT2LMHeadModel's base model): wte.weight, wpe.weight,
 *            h.N.ln_1.{weight,bias}, h.N.attn.c_attn.{weight,bias},
 *            h.N.attn.c_proj.*, h.N.ln_2.*, h.N.mlp.c_fc.*, h.N.mlp.c_proj.*,
 *            ln_f.*. GPT-2's Conv1D stores weights as [in, out], so every
 *            matrix is the transpose of gwtf's [out, in]; the LM head is
 *            tied to wte and has no tensor of its own.
 *     llama  LlamaForCausalLM: model.embed_tokens.weight,
 *            model.layers.N.input_layernorm.weight,
 *            model.layers.N.self_attn.{q,k,v,o}_proj.weight,
 *            model.layers.N.post_attention_layernorm.weight,
 *            model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight,
 *            lm_head.weight. nn.Linear layout [out, in], as gwtf's; gwtf's
 *            RoPE is already rotate-half, so q and k need no permutation.
 *   config.json        GPT2Config / LlamaConfig fields, plus a "gwtf" object
 *                      (the gwtf model JSON, run, iteration, tokenizer).
 *   tokenizer.txt      which tokenizer the run used (gwtf trains on raw
 *                      bytes, vocab 256, or on GPT-2 BPE token files).
 *
 * In memory a whole model is one flat fp32 array in gwtf's storage order:
 * the data-node part (model_head_tensors), then blocks 0..L-1
 * (model_block_tensors), each block model_block_numel floats. */
#ifndef GWTF_TRAIN_HF_EXPORT_H
#define GWTF_TRAIN_HF_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "train/model.h"

#define HF_NAME_MAX (96)
#define HF_HASH_BYTES (32)
#define HF_MODEL_FILE "model.safetensors"
#define HF_CONFIG_FILE "config.json"
#define HF_TOKENIZER_FILE "tokenizer.txt"

/* The HF name of gwtf tensor `name` (full-model name, "blocks.3.ln1.weight")
 * and whether its data is stored transposed. Returns 0, or GW_ENOENT for a
 * name the architecture does not export (none today). */
int hf_tensor_name(const model_config *cfg, const char *name, char *hf, size_t hf_len, bool *transpose);

/* Floats of the whole model and the offset of block `layer` in it. */
size_t hf_model_numel(const model_config *cfg);
size_t hf_block_offset(const model_config *cfg, int layer);

/* "bytes" (vocab 256: one token per byte of UTF-8 text), "gpt2" (vocab
 * 50257: GPT-2 BPE, as in llm.c token files), or "unknown". */
const char *hf_tokenizer_for(const model_config *cfg);

/* ---- assembling a model from stage states ------------------------------------
 * A stage state (a checkpoint file, or the bytes a member serves to a
 * joining peer) covers the data-node part or a range of blocks. */

typedef struct hf_model {
  model_config cfg;
  bool have_cfg;
  float *params;   /* hf_model_numel floats, malloc'd once the config is known */
  bool head;       /* the data-node part is filled */
  bool *layers;    /* cfg.n_layers flags: block filled */
  long long step;  /* optimizer step of the first state added (stages may
                    * differ: a stage that saw no microbatch in a round
                    * skips its step; the caller matches iterations) */
} hf_model;

void hf_model_init(hf_model *m);
void hf_model_free(hf_model *m);

/* Parses a serialised stage state (train/stage.h's format), checks that it
 * describes the same model as the states added before, that its parameters
 * hash (BLAKE2b-256 of the fp32 bytes in storage order, stage_weight_hash)
 * to want_hash when want_hash is not NULL, and copies its parameters into
 * m. The AdamW moments are ignored. *first_layer / *n_layers / *has_head say
 * what it covered (may be NULL). GW_EINVAL + sentence on any mismatch; m is
 * unchanged on error. */
int hf_model_add_stage(hf_model *m, const uint8_t *buf, size_t len, const uint8_t *want_hash,
                       int *first_layer, int *n_layers, bool *has_head, char *err, size_t err_len);

/* The weight hash of a serialised stage state (BLAKE2b-256 of its
 * parameters' fp32 bytes in storage order: stage_weight_hash of the stage
 * that wrote it), after the checks hf_model_add_stage makes. */
int hf_state_weight_hash(const uint8_t *buf, size_t len, uint8_t out[HF_HASH_BYTES], char *err, size_t err_len);

/* Bytes a stage state of blocks [first, first + n_layers) (+ the head) of
 * cfg takes at most: the three fp32 regions and a header allowance. Lets a
 * downloader check a size before it allocates. */
size_t hf_state_max_bytes(const model_config *cfg, int n_layers, bool head);

/* 0 when the head and every block are filled, else GW_ENOENT with the
 * first missing part named in err. */
int hf_model_complete(const hf_model *m, char *err, size_t err_len);

/* ---- the directory ------------------------------------------------------------ */

typedef struct hf_export_info {
  const char *run;        /* may be NULL */
  long long iteration;    /* -1 when unknown */
  const char *source;     /* "checkpoints" / "swarm", for config.json */
} hf_export_info;

/* config.json's text (malloc'd, NUL-terminated) or NULL when out of memory. */
char *hf_config_json(const model_config *cfg, const hf_export_info *info);
/* Reads a GPT2Config / LlamaConfig JSON into a validated model_config.
 * Refuses what gwtf cannot run (other model types or activations, grouped
 * KV heads, rope scaling, a tied llama head) with a sentence. */
int hf_config_parse(const char *json, size_t len, model_config *cfg, char *err, size_t err_len);

/* Creates dir (mkdir -p) and writes model.safetensors, config.json and
 * tokenizer.txt, each atomically. params: hf_model_numel floats. */
int hf_write_dir(const char *dir, const model_config *cfg, const float *params, const hf_export_info *info,
                 char *err, size_t err_len);
/* Reads dir back: the config from config.json, the parameters (malloc'd,
 * gwtf storage order) from model.safetensors by their HF names, every
 * shape and dtype checked. Unknown extra tensors (GPT-2's attn.bias masks)
 * are ignored. */
int hf_read_dir(const char *dir, model_config *cfg, float **params, char *err, size_t err_len);

#endif
