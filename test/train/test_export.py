#!/usr/bin/python3
"""gwtf export + gwtf sample against PyTorch (issue 19, items 1 and 2).

For each architecture (gpt = preset tiny, llama = preset tiny-llama):
  1. a short real training run (gwtf train-ref, 3 iterations, 3 stages) writes
     every stage's checkpoint and sidecar, as peers do;
  2. gwtf export assembles them into a Hugging Face-style directory;
  3. this script loads model.safetensors WITHOUT gwtf's naming: it builds
     GPT-2 (Conv1D [in, out] weights, gelu_new, tied head) or LLaMA
     (q/k/v/o_proj, HF's rotate_half RoPE, RMSNorm, untied lm_head) in
     PyTorch from the Hugging Face names and the config.json fields alone,
     and compares its logits on a fixed input with gwtf sample's (the cached
     and the whole-sequence forward) and with the project's PyTorch model
     (scripts/gwtf_torch.py) fed the checkpoints themselves;
  4. gwtf sample with a seed prints the same text twice;
  5. export refuses a missing stage and a corrupted file, and falls back to
     the newest iteration every stage has (saying so).
Prints the max abs differences it measured. Needs Debian's python3-torch
(/usr/bin/python3); exits 77 (skip) with the reason when torch is missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # ctest SKIP, never a silent pass
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({e}); "
          "apt-get install python3-torch (scripts/setup.sh --test-deps)")
    sys.exit(77)

SRC = os.environ.get("GWTF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "scripts"))
import st_torch  # noqa: E402  (the project's safetensors reader, no safetensors package)
import gwtf_torch as G  # noqa: E402

GWTF = os.environ.get("GWTF_BIN", "gwtf")
TOL = 1e-4
PROMPT = "Once upon a time, the little model said"
torch.set_default_dtype(torch.float32)


def run(*args, ok=True, cwd=None):
    p = subprocess.run([GWTF, *args], cwd=cwd, capture_output=True, timeout=300)
    if ok and p.returncode != 0:
        raise SystemExit(f"FAIL: gwtf {' '.join(args)} exited {p.returncode}\n{p.stderr.decode()}")
    return p


# ---- the Hugging Face models, from HF names only ----------------------------------------

def gpt2_logits(sd, cfg, ids):
    """GPT2LMHeadModel's forward (eval, fp32) from GPT-2 tensor names."""
    C, nh, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"]
    T = ids.shape[0]
    h = sd["wte.weight"][ids] + sd["wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(L):
        p = f"h.{i}."
        a = F.layer_norm(h, (C,), sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps)
        qkv = a @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = (z.view(T, nh, C // nh).transpose(0, 1) for z in qkv.split(C, dim=-1))
        w = (q @ k.transpose(-1, -2)) / math.sqrt(C // nh)
        y = w.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        y = y.transpose(0, 1).reshape(T, C)
        h = h + y @ sd[p + "attn.c_proj.weight"] + sd[p + "attn.c_proj.bias"]
        m = F.layer_norm(h, (C,), sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
        m = F.gelu(m @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"], approximate="tanh")
        h = h + m @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), sd["ln_f.weight"], sd["ln_f.bias"], eps)
    return h @ sd["wte.weight"].t()


def llama_logits(sd, cfg, ids):
    """LlamaForCausalLM's forward (eval, fp32) from LLaMA tensor names, with
    transformers' rotate_half RoPE (inv_freq in fp32, cos/sin of cat(f, f))."""
    C, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    assert cfg["num_key_value_heads"] == nh and cfg["hidden_act"] == "silu" and not cfg["tie_word_embeddings"]
    hd, eps, T = C // nh, cfg["rms_norm_eps"], ids.shape[0]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rotate_half(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)

    mask = torch.ones(T, T, dtype=torch.bool).tril()
    x = sd["model.embed_tokens.weight"][ids]
    for i in range(L):
        p = f"model.layers.{i}."
        n = rms(x, sd[p + "input_layernorm.weight"])
        q, k, v = (F.linear(n, sd[p + f"self_attn.{z}_proj.weight"]).view(T, nh, hd).transpose(0, 1)
                   for z in "qkv")
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        w = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        y = (w.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(0, 1).reshape(T, C)
        x = x + F.linear(y, sd[p + "self_attn.o_proj.weight"])
        m = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = F.silu(F.linear(m, sd[p + "mlp.gate_proj.weight"])) * F.linear(m, sd[p + "mlp.up_proj.weight"])
        x = x + F.linear(g, sd[p + "mlp.down_proj.weight"])
    return F.linear(rms(x, sd["model.norm.weight"]), sd["lm_head.weight"])


def hf_names(arch, L):
    """The tensor names transformers expects, written out independently."""
    if arch == "gpt":
        names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
        for i in range(L):
            for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                      "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                      "mlp.c_proj.weight", "mlp.c_proj.bias"):
                names.add(f"h.{i}.{n}")
        return names
    names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(L):
        for n in ("input_layernorm", "post_attention_layernorm"):
            names.add(f"model.layers.{i}.{n}.weight")
        for n in ("q", "k", "v", "o"):
            names.add(f"model.layers.{i}.self_attn.{n}_proj.weight")
        for n in ("gate", "up", "down"):
            names.add(f"model.layers.{i}.mlp.{n}_proj.weight")
    return names


# ---- the project's own model fed the checkpoints ---------------------------------------

def gwtf_torch_logits(ckdir, run_name, ids):
    """scripts/gwtf_torch.py (gwtf names) loaded from the stage checkpoints."""
    params, meta = {}, None
    for f in sorted(os.listdir(ckdir)):
        if f.startswith(run_name + ".stage") and f.endswith(".safetensors"):
            t, m = st_torch.load(os.path.join(ckdir, f))
            params.update({k: v for k, v in t.items() if not k.startswith("adam.")})
            meta = m
    cfg = G.Cfg(meta["arch"], int(meta["d_model"]), int(meta["n_heads"]), int(meta["n_layers"]),
                int(meta["d_ff"]), int(meta["vocab_size"]), int(meta["max_seq_len"]), float(meta["eps"]),
                float(meta["rope_theta"]))
    blocks, head = G.Blocks(cfg), G.Head(cfg)
    blocks.load_state_dict({k: v for k, v in params.items() if k.startswith("blocks.")}, strict=True)
    head.load_state_dict({k: v for k, v in params.items() if not k.startswith("blocks.")}, strict=True)
    with torch.no_grad():
        y = blocks(head.embed(ids[None]))[0]
        if cfg.arch == "gpt":
            return head.ln_f(y) @ head.tok_emb.weight.t()
        return head.lm_head(head.norm_f(y))


def max_diff(a, b):
    return float((a - b).abs().max())


def check_arch(tmp, preset, arch):
    work = os.path.join(tmp, arch)
    os.makedirs(work)
    corpus = os.path.join(tmp, "corpus.txt")
    dd = os.path.join(work, "peer")
    run("train-ref", "--dataset", corpus, "--model", preset, "--iterations", "3", "--stages", "3", "--batch", "2",
        "--seq", "32", "--microbatches", "2", "--checkpoint-dir", dd, "--run", "r" + arch)
    ex = os.path.join(work, "export")
    p = run("export", "--run", "r" + arch, "--out", ex, "--from-checkpoints", dd)
    assert b"export.written" in p.stderr, p.stderr
    for f in ("model.safetensors", "config.json", "tokenizer.txt"):
        assert os.path.isfile(os.path.join(ex, f)), f"export lacks {f}"
    with open(os.path.join(ex, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == ("gpt2" if arch == "gpt" else "llama"), cfg["model_type"]
    sd, meta = st_torch.load(os.path.join(ex, "model.safetensors"))
    assert meta.get("format") == "pt", meta
    L = cfg["n_layer"] if arch == "gpt" else cfg["num_hidden_layers"]
    want = hf_names(arch, L)
    assert set(sd) == want, f"names differ: extra {sorted(set(sd) - want)[:5]} missing {sorted(want - set(sd))[:5]}"
    assert all(t.dtype == torch.float32 for t in sd.values())
    if arch == "gpt":  # Conv1D layout [in, out]
        C, Fd = cfg["n_embd"], cfg["n_inner"]
        assert list(sd["h.0.attn.c_attn.weight"].shape) == [C, 3 * C]
        assert list(sd["h.0.mlp.c_fc.weight"].shape) == [C, Fd]
        assert list(sd["h.0.mlp.c_proj.weight"].shape) == [Fd, C]

    ids = torch.tensor(list(PROMPT.encode()), dtype=torch.int64)
    with torch.no_grad():
        hf = gpt2_logits(sd, cfg, ids) if arch == "gpt" else llama_logits(sd, cfg, ids)
    ref = gwtf_torch_logits(os.path.join(dd, "checkpoints"), "r" + arch, ids)

    dump = os.path.join(work, "logits.safetensors")
    args = ["sample", "--model", ex, "--prompt", PROMPT, "--tokens", "48", "--temperature", "1.0", "--top-k", "20",
            "--seed", "7", "--threads", "1"]
    a = run(*args, "--dump-logits", dump)
    b = run(*args)
    assert a.stdout == b.stdout, "the same seed printed different text"
    assert a.stdout.startswith(PROMPT.encode()) and len(a.stdout) > len(PROMPT) + 40, a.stdout
    c = run(*args[:-4], "--seed", "8", "--threads", "1")
    assert c.stdout != a.stdout, "another seed printed the same 48 sampled bytes"
    lg, _ = st_torch.load(dump)
    assert lg["tokens"].tolist() == ids.tolist()
    full, cached = lg["logits_full"], lg["logits_cached"]
    d = {
        "hf_vs_sample_full": max_diff(hf, full),
        "hf_vs_sample_cached": max_diff(hf, cached),
        "cached_vs_full": max_diff(cached, full),
        "hf_vs_gwtf_torch_ckpt": max_diff(hf, ref),
    }
    scale = float(hf.abs().max())
    print(f"{arch}: T={len(ids)} V={hf.shape[1]} max|logit|={scale:.3f} " +
          " ".join(f"{k}={v:.2e}" for k, v in d.items()))
    for k, v in d.items():
        assert v <= TOL, f"{arch}: {k} = {v:.3e} > {TOL}"
    tps = [w for w in a.stderr.decode().split() if w.startswith("tokens_per_s=")]
    print(f"{arch}: sample {tps[0] if tps else '?'} (seeded text identical twice)")
    return dd


def check_refusals(tmp, dd):
    """A missing stage, a corrupted stage, and an older consistent set."""
    ck = os.path.join(dd, "checkpoints")
    bad = os.path.join(tmp, "bad")
    shutil.copytree(ck, bad)
    os.remove(os.path.join(bad, "rgpt.stage2.safetensors"))
    p = run("export", "--run", "rgpt", "--out", os.path.join(tmp, "x1"), "--from-checkpoints", bad, ok=False)
    assert p.returncode == 1 and b"stage 2 has no checkpoint" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(tmp, "x1", "model.safetensors"))
    shutil.copy(os.path.join(ck, "rgpt.stage2.safetensors"), bad)
    path = os.path.join(bad, "rgpt.stage1.safetensors")
    with open(path, "r+b") as f:  # one flipped bit in the middle of the weights
        f.seek(os.path.getsize(path) // 6)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    p = run("export", "--run", "rgpt", "--out", os.path.join(tmp, "x2"), "--from-checkpoints", bad, ok=False)
    assert p.returncode == 1 and b"do not match the announced hash" in p.stderr, p.stderr
    # newer checkpoints of only some stages (another peer's data dir): the
    # newest iteration every stage has is exported, and the log says so
    newer = os.path.join(tmp, "newer")
    run("train-ref", "--dataset", os.path.join(tmp, "corpus.txt"), "--model", "tiny", "--iterations", "4", "--stages",
        "3", "--batch", "2", "--seq", "32", "--microbatches", "2", "--checkpoint-dir", newer, "--run", "rgpt")
    os.remove(os.path.join(newer, "checkpoints", "rgpt.stage3.safetensors"))
    p = run("export", "--run", "rgpt", "--out", os.path.join(tmp, "x3"), "--from-checkpoints", newer, dd)
    assert b"export.older iter=3 newest=4" in p.stderr, p.stderr
    with open(os.path.join(tmp, "x3", "config.json")) as f:
        assert json.load(f)["gwtf"]["iteration"] == 3
    print("export refuses a missing stage and a corrupted one, and falls back to the newest complete iteration")


def main():
    tmp = tempfile.mkdtemp(prefix="gwtf_export_")
    try:
        run("data", "synth", "--out", os.path.join(tmp, "corpus.txt"), "--bytes", "200000")
        dd = check_arch(tmp, "tiny", "gpt")
        check_arch(tmp, "tiny-llama", "llama")
        check_refusals(tmp, dd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
