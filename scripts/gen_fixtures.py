#!/usr/bin/python3
"""Generate the PyTorch reference fixtures that `gwtf check stage` runs.

    /usr/bin/python3 scripts/gen_fixtures.py [--out test/fixtures] [--seed 5]
    /usr/bin/python3 scripts/gen_fixtures.py --presets --out DIR

--presets writes, instead of the committed fixtures, one-block stages of the
real-size presets (gpt2-small, llama-160m: d_model 768, 12 heads, their d_ff
and T_max) at B = 2, T = 24: ~57 MB each, too big to commit, so
test/train/check_stage_presets.sh generates them when it runs.

Needs PyTorch (Debian's python3-torch: run /usr/bin/python3, which has it).
The references are computed in float64 from float32 inputs and weights, then
stored as float32, so a fixture measures gwtf's own fp32 error. Weights are
random around their usual values (norm weights near 1, non-zero biases) so
that every gradient is exercised. Fixture format: train/fixture.h.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gwtf_torch as G  # noqa: E402
import st_torch  # noqa: E402


def randomize(module, gen):
    """Weights ~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2)."""
    for name, p in module.named_parameters():
        with torch.no_grad():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))


def f32(t):
    return t.detach().to(torch.float32).contiguous()


def blocks_fixture(cfg, B, T, gen):
    model = G.Blocks(cfg)
    randomize(model, gen)
    params32 = {n: f32(p) for n, p in model.named_parameters()}
    x32 = torch.randn(B, T, cfg.d_model, generator=gen)
    dy32 = torch.randn(B, T, cfg.d_model, generator=gen)
    ref = model.double()
    x = x32.double().requires_grad_(True)
    y = ref(x)
    y.backward(dy32.double())
    out = dict(params32)
    out["input"], out["grad_output"] = x32, dy32
    out["expected.output"] = f32(y)
    out["expected.grad_input"] = f32(x.grad)
    for n, p in ref.named_parameters():
        out["expected.grad." + n] = f32(p.grad)
    return out


def head_fixture(cfg, B, T, gen):
    model = G.Head(cfg)
    randomize(model, gen)
    params32 = {n: f32(p) for n, p in model.named_parameters()}
    tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=gen, dtype=torch.int64)
    y32 = torch.randn(B, T, cfg.d_model, generator=gen)
    demb32 = torch.randn(B, T, cfg.d_model, generator=gen)
    ref = model.double()
    y = y32.double().requires_grad_(True)
    emb = ref.embed(tokens)
    loss = ref.loss(y, targets)
    # One backward for both uses, so tied weights get the sum of their grads.
    (loss + (emb * demb32.double()).sum()).backward()
    out = dict(params32)
    out["tokens"], out["targets"] = tokens.to(torch.int32), targets.to(torch.int32)
    out["input"], out["grad_embedding"] = y32, demb32
    out["expected.embedding"] = f32(emb)
    out["expected.loss"] = f32(loss.reshape(()))
    out["expected.grad_input"] = f32(y.grad)
    for n, p in ref.named_parameters():
        out["expected.grad." + n] = f32(p.grad)
    return out


def adamw_fixture(shape, step, hp, gen):
    p32 = torch.randn(shape, generator=gen)
    g32 = torch.randn(shape, generator=gen)
    m32 = 0.1 * torch.randn(shape, generator=gen)
    v32 = 0.01 * torch.rand(shape, generator=gen)
    p = torch.nn.Parameter(p32.double().clone())
    p.grad = g32.double().clone()
    opt = torch.optim.AdamW([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["adam_eps"],
                            weight_decay=hp["weight_decay"])
    # The moments and step as if step - 1 updates had already run.
    opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": m32.double().clone(),
                    "exp_avg_sq": v32.double().clone()}
    opt.step()
    st = opt.state[p]
    return {"param": p32, "grad": g32, "m": m32, "v": v32, "expected.param": f32(p),
            "expected.m": f32(st["exp_avg"]), "expected.v": f32(st["exp_avg_sq"])}


def write(out_dir, name, kind, cfg, B, T, tensors, extra=None):
    meta = cfg.meta()
    meta.update(kind=kind, batch=B, seq_len=T)
    meta.update(extra or {})
    path = os.path.join(out_dir, name + ".safetensors")
    st_torch.save(path, tensors, meta)
    print(f"{path}: {os.path.getsize(path)} bytes, {len(tensors)} tensors")


# (name, arch, d_ff) of the presets --presets writes one block of; the
# other sizes are shared (train/model.c): d_model 768, 12 heads, T_max 1024.
PRESET_STAGES = (("gpt2_small", "gpt", 3072), ("llama_160m", "llama", 2048))


def preset_fixtures(out_dir, seed):
    gen = torch.Generator().manual_seed(seed)
    B, T = 2, 24
    for name, arch, d_ff in PRESET_STAGES:
        cfg = G.Cfg(arch, d_model=768, n_heads=12, n_layers=1, d_ff=d_ff, vocab_size=50257, max_seq_len=1024)
        write(out_dir, f"{name}_block", "blocks", cfg, B, T, blocks_fixture(cfg, B, T, gen))


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "test", "fixtures"))
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--presets", action="store_true",
                    help="write one-block stages of gpt2-small and llama-160m instead")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.presets:
        preset_fixtures(args.out, args.seed)
        return 0
    gen = torch.Generator().manual_seed(args.seed)

    # Odd sizes: C = 36 and T = 67 are not powers of two, 3 heads, B = 2,
    # and T > 64 so the CPU attention crosses a row-block boundary.
    for arch, d_ff in (("gpt", 100), ("llama", 96)):
        cfg = G.Cfg(arch, d_model=36, n_heads=3, n_layers=2, d_ff=d_ff, vocab_size=50, max_seq_len=80)
        write(args.out, f"{arch}_blocks", "blocks", cfg, 2, 67, blocks_fixture(cfg, 2, 67, gen))
        write(args.out, f"{arch}_head", "head", cfg, 2, 67, head_fixture(cfg, 2, 67, gen))
        # Tiny: T = 5 within one block, head_dim 4, B = 3, one layer.
        small = G.Cfg(arch, d_model=12, n_heads=3, n_layers=1, d_ff=20, vocab_size=7, max_seq_len=9)
        write(args.out, f"{arch}_blocks_small", "blocks", small, 3, 5, blocks_fixture(small, 3, 5, gen))
        write(args.out, f"{arch}_head_small", "head", small, 3, 5, head_fixture(small, 3, 5, gen))

    # A large lr makes the update a visible part of the parameters, so the
    # 1e-4 relative check resolves errors of ~1% of the update itself.
    hp = {"lr": 5e-2, "beta1": 0.9, "beta2": 0.95, "adam_eps": 1e-8, "weight_decay": 0.1}
    cfg = G.Cfg("gpt", d_model=36, n_heads=3, n_layers=1, d_ff=100)
    write(args.out, "adamw", "adamw", cfg, 1, 1, adamw_fixture((37, 29), 5, hp, gen),
          dict(step=5, **hp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
