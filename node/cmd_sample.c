/* node/cmd_sample.c — `gwtf sample`: generate text from an exported model
 * directory (gwtf export) with a KV cache (train/generate.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/backend.h"
#include "node/cmd.h"
#include "train/generate.h"
#include "train/hf_export.h"
#include "train/safetensors.h"
#include "util/clock.h"
#include "util/err.h"

/* Exit code when the requested device cannot be opened (as gwtf check stage). */
#define SAMPLE_EXIT_NO_DEVICE (3)
#define SAMPLE_MAX_PROMPT (65536)

void cmd_sample_help(void) {
  printf("usage: gwtf sample --model DIR (--prompt TEXT | --prompt-tokens ID,ID,...)\n"
         "                   [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
         "                   [--device cpu|cuda[:N]] [--threads N] [--dump-logits FILE]\n\n"
         "Generates a continuation of the prompt with the model in DIR (written by\n"
         "gwtf export, or any GPT-2 / LLaMA directory of the same layout in fp32):\n"
         "the prompt at once, then one position at a time against a cache of earlier\n"
         "keys and values. The\n"
         "text goes to stdout (byte-level models print the prompt and the generated\n"
         "bytes; other vocabularies print token ids), a summary line with tokens/s to\n"
         "stderr. The same seed gives the same text.\n\n"
         "  --model DIR          exported model directory\n"
         "  --prompt TEXT        prompt as UTF-8 text (byte-level models only)\n"
         "  --prompt-tokens IDS  prompt as comma-separated token ids (any vocabulary)\n"
         "  --tokens N           tokens to generate (default 64; prompt + N is capped at\n"
         "                       the model's context)\n"
         "  --temperature T      softmax temperature (default 0.8; 0 = greedy)\n"
         "  --top-k K            sample among the K most likely tokens (default 40; 0 = all)\n"
         "  --seed S             sampling seed (default 1)\n"
         "  --device D           cpu (default), cuda or cuda:N\n"
         "  --threads N          CPU threads (default: all cores this process may use)\n"
         "  --dump-logits FILE   also write a safetensors file with the prompt's tokens and\n"
         "                       the logits of every prompt position, from the cache\n"
         "                       (logits_cached) and from one whole-sequence forward\n"
         "                       (logits_full), for checking against other tools\n\n"
         "Exit status: 0 ok, 1 failure, 2 usage, %d when the device is not available.\n",
         SAMPLE_EXIT_NO_DEVICE);
}

typedef struct sample_opts {
  const char *model, *prompt, *prompt_tokens, *dump;
  int tokens, top_k;
  float temperature;
  uint64_t seed;
  gpu_device dev;
  gpu_options gopt;
} sample_opts;

/* The prompt as token ids: bytes of TEXT, or the comma list. */
static int prompt_ids(const sample_opts *o, const model_config *cfg, int32_t **out, int *n) {
  int32_t *ids = malloc(SAMPLE_MAX_PROMPT * sizeof(int32_t));
  if (!ids) return GW_ENOMEM;
  int k = 0;
  if (o->prompt) {
    if (cfg->vocab_size != 256) {
      fprintf(stderr, "gwtf sample: this model's vocabulary is %d tokens (%s), not bytes: give "
                      "--prompt-tokens\n", cfg->vocab_size, hf_tokenizer_for(cfg));
      free(ids);
      return GW_EINVAL;
    }
    for (const unsigned char *p = (const unsigned char *)o->prompt; *p && k < SAMPLE_MAX_PROMPT; p++) ids[k++] = *p;
  } else {
    const char *p = o->prompt_tokens;
    while (*p && k < SAMPLE_MAX_PROMPT) {
      char *end;
      errno = 0;
      long v = strtol(p, &end, 10);
      if (end == p || errno || v < 0 || v >= cfg->vocab_size || (*end && *end != ',')) {
        fprintf(stderr, "gwtf sample: --prompt-tokens must be ids in [0, %d) separated by commas\n",
                cfg->vocab_size);
        free(ids);
        return GW_EINVAL;
      }
      ids[k++] = (int32_t)v;
      p = *end ? end + 1 : end;
    }
  }
  if (k == 0) {
    fprintf(stderr, "gwtf sample: the prompt is empty\n");
    free(ids);
    return GW_EINVAL;
  }
  *out = ids;
  *n = k;
  return 0;
}

static void print_token(const model_config *cfg, int32_t t, bool first) {
  if (cfg->vocab_size == 256)
    fputc(t, stdout);
  else
    printf(first ? "%d" : " %d", (int)t);
}

/* The prompt's logits through the cache and through one whole forward. */
static int dump_logits(const sample_opts *o, gen_model *g, const model_config *cfg, const int32_t *ids, int n) {
  size_t V = (size_t)cfg->vocab_size;
  float *cached = malloc((size_t)n * V * sizeof(float)), *full = malloc((size_t)n * V * sizeof(float));
  int rc = cached && full ? 0 : GW_ENOMEM;
  gen_reset(g);
  for (int i = 0; !rc && i < n; i++) rc = gen_step(g, ids[i], cached + (size_t)i * V);
  if (!rc) rc = gen_forward(g, ids, n, full);
  gen_reset(g);
  if (!rc) {
    st_writer w;
    st_writer_init(&w);
    int64_t tshape[1] = {n}, lshape[2] = {n, (int64_t)V};
    st_writer_add(&w, "tokens", ST_I32, tshape, 1, ids);
    st_writer_add(&w, "logits_cached", ST_F32, lshape, 2, cached);
    st_writer_add(&w, "logits_full", ST_F32, lshape, 2, full);
    rc = st_writer_save(&w, o->dump);
    st_writer_free(&w);
  }
  if (rc) fprintf(stderr, "gwtf sample: cannot write %s: %s\n", o->dump, gw_strerror(rc));
  free(cached);
  free(full);
  return rc;
}

/* Prompt through the cache, then N draws; the text as it comes. */
static int generate(const sample_opts *o, gen_model *g, const model_config *cfg, const int32_t *ids, int n,
                    int n_new, const char *devname) {
  size_t V = (size_t)cfg->vocab_size;
  float *logits = malloc(V * sizeof(float));
  void *scratch = malloc(gen_pick_scratch_bytes(cfg->vocab_size));
  if (!logits || !scratch) {
    free(logits);
    free(scratch);
    return GW_ENOMEM;
  }
  gw_rng rng;
  gw_rng_seed(&rng, o->seed);
  gen_sampling s = {.temperature = o->temperature, .top_k = o->top_k};
  uint64_t t0 = gw_clock_mono_ns();
  /* the prompt at once through the whole-sequence kernels, its keys and
   * values into the cache */
  int rc = gen_prefill(g, ids, n, logits);
  for (int i = 0; !rc && i < n; i++) print_token(cfg, ids[i], i == 0);
  uint64_t t1 = gw_clock_mono_ns();
  int made = 0;
  for (; !rc && made < n_new; made++) {
    int32_t t = gen_pick(logits, cfg->vocab_size, &s, &rng, scratch);
    print_token(cfg, t, false);
    fflush(stdout);
    if (made + 1 < n_new) rc = gen_step(g, t, logits); /* the last token needs no logits */
  }
  uint64_t t2 = gw_clock_mono_ns();
  printf("\n");
  fflush(stdout);
  double pre = (double)(t1 - t0) / 1e9, dec = (double)(t2 - t1) / 1e9;
  if (rc)
    fprintf(stderr, "gwtf sample: generation failed: %s\n", gw_strerror(rc));
  else
    fprintf(stderr,
            "sample.done device=%s arch=%s prompt_tokens=%d tokens=%d prompt_s=%.3f decode_s=%.3f "
            "tokens_per_s=%.1f seed=%llu\n",
            devname, model_arch_name(cfg->arch), n, made, pre, dec, dec > 0 ? made / dec : 0.0,
            (unsigned long long)o->seed);
  free(logits);
  free(scratch);
  return rc;
}

static int parse_args(int argc, char **argv, sample_opts *o) {
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},       {"prompt", required_argument, 0, 'p'},
      {"prompt-tokens", required_argument, 0, 'P'}, {"tokens", required_argument, 0, 'n'},
      {"temperature", required_argument, 0, 'T'}, {"top-k", required_argument, 0, 'k'},
      {"seed", required_argument, 0, 's'},        {"device", required_argument, 0, 'd'},
      {"threads", required_argument, 0, 't'},     {"dump-logits", required_argument, 0, 'D'},
      {"help", no_argument, 0, 'h'},              {0, 0, 0, 0}};
  int c;
  char *end;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'm': o->model = optarg; break;
    case 'p': o->prompt = optarg; break;
    case 'P': o->prompt_tokens = optarg; break;
    case 'n': o->tokens = (int)strtol(optarg, &end, 10); if (*end || o->tokens < 0) return 2; break;
    case 'T': o->temperature = strtof(optarg, &end); if (*end || !(o->temperature >= 0)) return 2; break;
    case 'k': o->top_k = (int)strtol(optarg, &end, 10); if (*end || o->top_k < 0) return 2; break;
    case 's': o->seed = strtoull(optarg, &end, 10); if (*end) return 2; break;
    case 'd': if (gpu_device_parse(optarg, &o->dev) != 0) return 2; break;
    case 't':
      o->gopt.threads = (int)strtol(optarg, &end, 10);
      if (*end || o->gopt.threads < 1 || o->gopt.threads > 1024) return 2;
      break;
    case 'D': o->dump = optarg; break;
    case 'h': cmd_sample_help(); return -1;
    default: return 2;
    }
  }
  if (!o->model || (!o->prompt == !o->prompt_tokens) || optind < argc) return 2;
  return 0;
}

int cmd_sample(int argc, char **argv) {
  sample_opts o = {.tokens = 64, .top_k = 40, .temperature = 0.8f, .seed = 1, .dev = {GPU_CPU, 0}};
  int rc = parse_args(argc, argv, &o);
  if (rc) {
    if (rc > 0)
      fprintf(stderr, "gwtf sample: needs --model DIR and one of --prompt / --prompt-tokens; numbers must be "
                      "valid (see gwtf help sample)\n");
    return rc > 0 ? 2 : 0;
  }
  char err[512] = "";
  model_config cfg;
  float *params = NULL;
  if (hf_read_dir(o.model, &cfg, &params, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf sample: %s\n", err);
    return 1;
  }
  int32_t *ids = NULL;
  int n = 0;
  if (prompt_ids(&o, &cfg, &ids, &n) != 0) {
    free(params);
    return 2;
  }
  if (n > cfg.max_seq_len) {
    fprintf(stderr, "gwtf sample: the prompt has %d tokens, the model's context is %d\n", n, cfg.max_seq_len);
    free(params);
    free(ids);
    return 2;
  }
  int n_new = o.tokens < cfg.max_seq_len - n + 1 ? o.tokens : cfg.max_seq_len - n + 1;
  if (n_new < o.tokens)
    fprintf(stderr, "gwtf sample: the context holds %d positions: generating %d tokens, not %d\n", cfg.max_seq_len,
            n_new, o.tokens);
  gpu_backend *be = NULL;
  if (gpu_backend_open(&o.dev, &o.gopt, &be, err, sizeof(err)) != 0) {
    fprintf(stderr, "gwtf sample: %s\n", err);
    free(params);
    free(ids);
    return SAMPLE_EXIT_NO_DEVICE;
  }
  char devname[GPU_DEVICE_STR_MAX];
  gpu_device_format(&o.dev, devname, sizeof(devname));
  gen_model *g = NULL;
  int ctx = n + (n_new > 0 ? n_new - 1 : 0);
  rc = gen_create(&cfg, params, be, ctx > 0 ? ctx : 1, &g, err, sizeof(err));
  free(params);
  if (rc) fprintf(stderr, "gwtf sample: %s\n", err);
  if (!rc && o.dump) rc = dump_logits(&o, g, &cfg, ids, n);
  if (!rc) rc = generate(&o, g, &cfg, ids, n, n_new, devname);
  gen_destroy(g);
  gpu_backend_close(be);
  free(ids);
  return rc ? 1 : 0;
}
