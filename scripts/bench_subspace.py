#!/usr/bin/python3
"""scripts/bench_subspace.py — what confining the activations between stages
to a k-dimensional subspace costs the tiny model's loss (the idea of
Pluralis' Protocol Models, arXiv 2506.01260), measured in PyTorch before
anything is built in C. Numbers: docs/TRAINING.md, "A subspace fixed by
the architecture".

    /usr/bin/python3 scripts/bench_subspace.py [--ks 16,32,64] [--wires fp32,bf16,int8,rot5,rot4]
        [--modes reparam,project,fullemb,delayed10,anchor,...] [--variants K:WIRE:MODE,...]
        [--data-seeds 1000,...,1007] [--iterations 400] [--jobs 2] [--cache FILE] [--check]

Why it could reach 10x with no error on the wire: a GPT block adds to the
residual stream, x_s = x_{s-1} + attn.proj(...) + mlp.proj(...). If every
output projection writes into one fixed k-dimensional subspace U (C x k,
orthonormal, from a seed every peer knows), and the embedding is a fixed
full-rank table E0, P0 (from the same seed) plus a trainable part in U,
every activation between stages is  x = E0[token] + P0[position] + U z:
the receiver rebuilds it exactly from the token ids and the k numbers z.
Backward, a stage's parameters move its output only inside U, so it needs
only U^T g of its output's gradient g, and what it sends back, U^T of its
input's gradient, is exact from U^T g alone (the identity path and the
block's path both go through U). Both directions carry k numbers a row
instead of C; what it costs is the model: each block writes k of the C
dimensions, and the embedding's trainable part has k.

Modes (k 0 is always run: the unconstrained model, the baseline):
  reparam   the output projections are k wide, lifted by U; the trainable
            embeddings are k-dimensional (the construction above);
  project   the plain model's shapes, held in U by projecting the output
            projections and the embeddings' trainable part after every
            step (what the C stages could do without new kernels);
  fullemb   reparam's blocks with a full trainable embedding that every
            stage is assumed to know (not buildable: it would have to be
            sent every step; it tells what the fixed E0 costs);
  delayedR  reparam's blocks; the embedding's part outside U is trained
            but stepped only every R iterations, with the gradient summed
            over them (each stage would add its share, (I - U U^T) of its
            input's gradient, and send the sum to the data node, which
            steps and publishes the table); "delayedRx": at R times the
            learning rate;
  anchor    the plain model; each crossing sends the top-k directions of
            x minus the current embedding of its tokens (a per-microbatch
            projection; the basis would travel too), backward V V^T g;
  noanchor  the same without subtracting the embedding.

Each run trains the tiny preset (gpt, d_model 128, 4 layers; 3 relay
stages of 2/1/1 blocks as `gwtf train-ref` splits them), 4 microbatches of
4 x 64 tokens of `gwtf data synth --seed 1` per iteration, AdamW (lr 1e-3,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices), each stage's
gradient clipped to norm 1 — train-ref's settings, with PyTorch's
arithmetic and sampling. --wires passes z (and U^T g) through bf16, int8
(per-row absmax) or rot5/rot4 (train/wire_rot.h's rotated Lloyd-Max rows,
emulated) too. Prints per variant the last-10 mean loss per data seed, the
mean, the median per-seed ratio to the baseline, and the bytes a
microbatch puts on the wire (4 activations and 4 gradients, token ids
included) against fp32 (reparam/project; the anchor modes' basis is not
counted). --cache keeps finished runs so a table can grow run by run.
--check trains 30 iterations with the crossings done as the wire would
(z and U^T g only) and without, and asserts reparam's losses agree (the
rebuild is exact) and project's first loss does (its output projections
get the projected gradient, so Adam's steps differ after).
"""

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gwtf_torch import causal_attention  # noqa: E402

C, HEADS, LAYERS, FF, VOCAB, MAXT = 128, 4, 4, 512, 256, 128
STAGE_BLOCKS = [[0, 1], [2], [3]]  # train_run_stage_layers: the first stages take one more
B, T, M = 4, 64, 4
STD, RES_STD = 0.02, 0.02 / math.sqrt(2 * LAYERS)


def lloyd_max(bits):
    """The Lloyd-Max levels of a unit Gaussian (what wire_rot quantizes to)."""
    x = torch.linspace(-8, 8, 200001, dtype=torch.float64)
    w = torch.exp(-x * x / 2)
    n = 1 << bits
    lv = torch.linspace(-2.5, 2.5, n, dtype=torch.float64)
    for _ in range(300):
        edges = (lv[1:] + lv[:-1]) / 2
        idx = torch.bucketize(x, edges)
        lv = torch.stack([(x[idx == i] * w[idx == i]).sum() / w[idx == i].sum() for i in range(n)])
    return lv.float()


LEVELS = {}


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def rot(z, bits):
    """wire_rot's rows in PyTorch: rotate by H D, scale to unit mean square,
    round to the nearest Lloyd-Max level, least-squares gain, rotate back."""
    n = z.shape[-1]
    if bits not in LEVELS:
        g = torch.Generator().manual_seed(7)
        LEVELS[bits] = (lloyd_max(bits), hadamard(n), torch.randint(0, 2, (n,), generator=g).float() * 2 - 1)
    lv, H, D = LEVELS[bits]
    u = (z * D) @ H.t()
    s = u.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    c = lv[(u / s).unsqueeze(-1).sub(lv).abs().argmin(-1)]
    gain = (u / s * c).sum(-1, keepdim=True) / c.pow(2).sum(-1, keepdim=True).clamp_min(1e-30)
    return ((s * gain * c) @ H) * D


def quant(z, wire):
    """z through the wire format, per row (last dimension)."""
    if wire == "fp32":
        return z
    if wire in ("rot4", "rot5"):
        return rot(z, int(wire[3:]))
    if wire == "bf16":
        return z.to(torch.bfloat16).to(torch.float32)
    if wire == "int8":
        s = z.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127.0
        return (z / s).round().clamp(-127, 127) * s
    raise ValueError(wire)


class Crossing(torch.autograd.Function):
    """A stage boundary: forward sends z = U^T (x - x0), backward U^T g."""

    @staticmethod
    def forward(ctx, x, x0, U, wire):
        ctx.save_for_backward(U)
        ctx.wire = wire
        return x0 + quant((x - x0) @ U, wire) @ U.t()

    @staticmethod
    def backward(ctx, g):
        (U,) = ctx.saved_tensors
        # x gets what crosses back; x0, where it is trained (fullemb,
        # delayed), the rest, which each stage would accumulate itself
        return quant(g @ U, ctx.wire) @ U.t(), g - (g @ U) @ U.t(), None, None


class AnchorCross(torch.autograd.Function):
    """A stage boundary that sends only the top-k directions of x - a (a: a
    function of the token ids both ends can compute), each microbatch its
    own; backward the exact gradient of that map, V V^T g."""

    @staticmethod
    def forward(ctx, x, a, k, wire):
        r = (x - a).reshape(-1, C)
        V = torch.linalg.eigh(r.t() @ r)[1][:, -k:]  # C x k: the top-k right singular vectors
        ctx.save_for_backward(V)
        ctx.wire = wire
        return a + (quant(r @ V, wire) @ V.t()).reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        (V,) = ctx.saved_tensors
        return (quant(g.reshape(-1, C) @ V, ctx.wire) @ V.t()).reshape(g.shape), None, None, None


class Block(nn.Module):
    """GPTBlock of gwtf_torch with the two output projections writing k numbers,
    lifted into the residual stream by U (k 0: the plain block)."""

    def __init__(self, k):
        super().__init__()
        out = k or C
        self.ln1, self.ln2 = nn.LayerNorm(C, eps=1e-5), nn.LayerNorm(C, eps=1e-5)
        self.qkv, self.fc = nn.Linear(C, 3 * C), nn.Linear(C, FF)
        self.aproj, self.mproj = nn.Linear(C, out), nn.Linear(FF, out)
        for lin, std in ((self.qkv, STD), (self.fc, STD), (self.aproj, RES_STD), (self.mproj, RES_STD)):
            nn.init.normal_(lin.weight, std=std)
            nn.init.zeros_(lin.bias)

    def forward(self, x, lift):
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        h = x + lift(self.aproj(causal_attention(q, k, v, HEADS)))
        return h + lift(self.mproj(F.gelu(self.fc(self.ln2(h)), approximate="tanh")))


class Model(nn.Module):
    """k 0: the plain model. mode "reparam": the output projections are k-wide
    and the trainable embeddings k-dimensional (lifted by U). mode "project":
    the plain model's shapes, held in the subspace by projecting the output
    projections and the embeddings' trainable part onto U after every step
    (what the C stage code could do without new kernels)."""

    def __init__(self, k, seed, mode="reparam"):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mode = mode
        self.k = k if mode in ("reparam", "fullemb") or mode.startswith("delayed") else 0  # what the blocks write
        self.sub = k if mode in ("reparam", "project") else 0
        self.anchor = mode if mode in ("anchor", "noanchor") else None
        self.fullemb = mode == "fullemb"  # the ideal: every stage knows the trained embedding
        self.delayed = int(mode[7:].rstrip("x")) if mode.startswith("delayed") else 0
        self.late_lr = 1e-3 * (self.delayed if mode.endswith("x") else 1)  # "delayedRx": R times the rate
        self.rank = k
        if self.k or self.sub:
            U, _ = torch.linalg.qr(torch.randn(C, k, generator=g))
            self.register_buffer("U", U)
            self.register_buffer("Pperp", torch.eye(C) - U @ U.t())
            # the fixed full-rank part every stage can build from the seed
            self.register_buffer("E0", torch.randn(VOCAB, C, generator=g) * STD)
            self.register_buffer("P0", torch.randn(MAXT, C, generator=g) * STD)
        torch.manual_seed(seed)
        ew = C if self.fullemb else (self.k or C)
        self.tok = nn.Parameter(torch.randn(VOCAB, ew) * STD)
        self.pos = nn.Parameter(torch.randn(MAXT, ew) * STD)
        self.blocks = nn.ModuleList([Block(self.k) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        if self.sub and not self.k:
            with torch.no_grad():
                self.tok.copy_(self.E0 + (torch.randn(VOCAB, k) * STD) @ self.U.t())
                self.pos.copy_(self.P0 + (torch.randn(MAXT, k) * STD) @ self.U.t())
            self.project()
        if self.delayed:
            # the embedding's part outside U: known to every stage, stepped
            # (and republished) every `delayed` iterations; tok/pos are its
            # part in U, which travels in z
            self.tok_out = nn.Parameter(torch.randn(VOCAB, C) * STD)
            self.pos_out = nn.Parameter(torch.randn(MAXT, C) * STD)
            with torch.no_grad():
                self.tok.copy_(self.tok_out @ self.U)
                self.pos.copy_(self.pos_out @ self.U)

    @torch.no_grad()
    def project(self):
        """mode "project": every residual write back into U after a step."""
        if not self.sub or self.k:
            return
        P = self.U @ self.U.t()
        for b in self.blocks:
            for lin in (b.aproj, b.mproj):
                lin.weight.copy_(P @ lin.weight)
                lin.bias.copy_(P @ lin.bias)
        self.tok.copy_(self.E0 + (self.tok - self.E0) @ P)
        self.pos.copy_(self.P0 + (self.pos - self.P0) @ P)

    def lift(self, z):
        return z @ self.U.t() if self.k else z

    def tok_table(self):
        if self.delayed:
            return self.tok_out @ self.Pperp + self.lift(self.tok)
        return self.E0 + self.lift(self.tok) if self.k and not self.fullemb else self.tok

    def embed(self, tokens):
        """The embedding's output x, and x0: the part of it a stage rebuilds
        from the token ids (None: the plain model, nothing rebuilt)."""
        if self.delayed:
            x0 = (self.tok_out[tokens] + self.pos_out[:T][None]) @ self.Pperp
            return x0 + self.lift(self.tok[tokens] + self.pos[:T][None]), x0
        x = self.tok[tokens] + self.pos[:T][None]
        if self.fullemb:
            return x, x
        if self.k:  # reparam
            x0 = self.fixed(tokens)
            return x0 + self.lift(x), x0
        return x, (self.fixed(tokens) if self.sub else None)

    def fixed(self, tokens):
        """x0: the part of every activation a stage rebuilds from the token ids."""
        return self.E0[tokens] + self.P0[: tokens.shape[1]][None]

    def loss(self, tokens, targets, wire):
        x, x0 = self.embed(tokens)
        if not wire:
            x0 = None  # no crossings: the plain (constrained) model
        a = None
        if self.anchor:
            a = (self.tok[tokens] + self.pos[: T][None]).detach() if self.anchor == "anchor" else torch.zeros_like(x)
        for n, stage in enumerate(STAGE_BLOCKS):
            if x0 is not None:
                x = Crossing.apply(x, x0, self.U, wire)
            if a is not None and n > 0:  # the embedding's output is the anchor itself: token ids
                x = AnchorCross.apply(x, a, self.rank, wire)
            for i in stage:
                x = self.blocks[i](x, self.lift)
        if x0 is not None:
            x = Crossing.apply(x, x0, self.U, wire)
        if a is not None:
            x = AnchorCross.apply(x, a, self.rank, wire)
        logits = self.ln_f(x) @ self.tok_table().t()  # tied head
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    def stages(self):
        """Parameter lists per pipeline stage (0: the data node's), each clipped on its own."""
        head = [self.tok, self.pos] + list(self.ln_f.parameters())  # not tok_out/pos_out: stepped apart
        return [head] + [[p for i in s for p in self.blocks[i].parameters()] for s in STAGE_BLOCKS]


def train(corpus, k, wire, data_seed, iterations, init_seed=1, mode="reparam"):
    torch.set_num_threads(1)
    model = Model(k, init_seed, mode)
    late = [model.tok_out, model.pos_out] if model.delayed else []
    main = [p for p in model.parameters() if all(p is not q for q in late)]
    decay = [p for p in main if p.dim() == 2]
    rest = [p for p in main if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    # delayed: the out-of-U embedding's gradient summed over `delayed`
    # iterations (each stage's share, sent to the data node), one step
    opt_late = (torch.optim.AdamW(late, lr=model.late_lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
                if late else None)
    g = torch.Generator().manual_seed(data_seed)
    losses = []
    for it in range(iterations):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(M):
            starts = torch.randint(0, len(corpus) - T - 1, (B,), generator=g)
            win = torch.stack([corpus[s: s + T + 1] for s in starts.tolist()]).long()
            loss = model.loss(win[:, :-1], win[:, 1:], wire) / M
            loss.backward()
            total += loss.item()
        for ps in model.stages():
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
        opt.step()
        if opt_late and (it + 1) % model.delayed == 0:
            opt_late.step()
            opt_late.zero_grad(set_to_none=True)
        model.project()
        losses.append(total)
    return losses


def wire_bytes(k, wire):
    """Bytes a microbatch puts on the wire: 4 activations and 4 gradients of B*T rows."""
    rows = B * T
    if not k:
        return 8 * rows * C * 4
    per = {"fp32": 4 * k, "bf16": 2 * k, "int8": k + 4, "rot4": 2 + k // 2, "rot5": 2 + (5 * k + 7) // 8}[wire]
    return rows * (4 * (per + 1) + 4 * per)  # +1: the token id with each activation row


def corpus_bytes(build):
    with tempfile.TemporaryDirectory(prefix="gwtf-subspace-") as tmp:
        path = os.path.join(tmp, "corpus.txt")
        subprocess.run([os.path.join(build, "node/gwtf"), "data", "synth", "--out", path, "--bytes", "1000000",
                        "--seed", "1"], check=True, stderr=subprocess.DEVNULL)
        with open(path, "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def check(corpus):
    """The wire's crossings (z, U^T g) train exactly what the constrained model trains."""
    for mode in ("reparam", "project"):
        plain = train(corpus, 16, None, 1000, 30, mode=mode)
        wired = train(corpus, 16, "fp32", 1000, 30, mode=mode)
        worst = max(abs(a - b) / abs(a) for a, b in zip(plain, wired))
        print(f"{mode}, k 16, 30 iterations: loss with the wire's crossings vs without: "
              f"first {abs(plain[0] - wired[0]) / plain[0]:.2e}, max relative difference {worst:.2e}")
        assert abs(plain[0] - wired[0]) < 1e-5 * plain[0], "the crossings do not rebuild the activations"
        # project mode's output projections are given the projected gradient
        # U U^T G by the wire and the full G without it; Adam's step differs
        # (the projection after it makes both valid), so only reparam is exact.
        assert mode == "project" or worst < 1e-4, "the crossings do not rebuild the gradients"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    ap.add_argument("--ks", default="0,16,24,32")
    ap.add_argument("--wires", default="fp32")
    ap.add_argument("--modes", default="reparam", help="reparam, project, fullemb, delayedR[x], anchor, noanchor (comma list)")
    ap.add_argument("--variants", help="K:WIRE:MODE,... instead of --ks x --wires x --modes")
    ap.add_argument("--data-seeds", default="1000,1001,1002,1003,1004,1005,1006,1007")
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cache", help="a JSON-lines file of finished runs: read, and appended to")
    a = ap.parse_args()
    corpus = corpus_bytes(a.build)
    if a.check:
        check(corpus)
        return 0
    seeds = [int(s) for s in a.data_seeds.split(",")]
    if a.variants:
        variants = [(0, "fp32", "-")] + [(int(v.split(":")[0]), v.split(":")[1], v.split(":")[2])
                                         for v in a.variants.split(",")]
    else:
        variants = [(0, "fp32", "-")] + [(int(k), w, m) for m in a.modes.split(",") for k in a.ks.split(",")
                                         if int(k) for w in a.wires.split(",")]
    last10 = {}
    if a.cache and os.path.exists(a.cache):
        with open(a.cache) as f:
            for line in f:
                r = json.loads(line)
                if r["iterations"] == a.iterations:
                    last10[(r["k"], r["wire"], r["mode"], r["seed"])] = r["last10"]
    with concurrent.futures.ProcessPoolExecutor(max_workers=a.jobs) as ex:
        futs = {ex.submit(train, corpus, k, w if k else None, sd, a.iterations, 1, m): (k, w, m, sd)
                for k, w, m in variants for sd in seeds if (k, w, m, sd) not in last10}
        for f in concurrent.futures.as_completed(futs):
            k, w, m, sd = futs[f]
            ls = f.result()
            last10[(k, w, m, sd)] = sum(ls[-10:]) / 10
            print(f"k {k} wire {w} mode {m} seed {sd}: last-10 {last10[(k, w, m, sd)]:.4f}", flush=True)
            if a.cache:
                with open(a.cache, "a") as out:
                    out.write(json.dumps({"k": k, "wire": w, "mode": m, "seed": sd, "iterations": a.iterations,
                                          "last10": last10[(k, w, m, sd)]}) + "\n")
    base = 8 * B * T * C * 4
    print(f"\n{a.iterations} iterations, last-10 mean loss per data seed ({', '.join(map(str, seeds))})")
    print("| k | mode | wire | bytes / microbatch | vs fp32 | per seed | mean | Δ baseline | median per-seed ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    ref = statistics.mean(last10[(0, "fp32", "-", sd)] for sd in seeds)
    for k, w, m in variants:
        per = [last10[(k, w, m, sd)] for sd in seeds]
        mean = statistics.mean(per)
        ratio = statistics.median(last10[(k, w, m, sd)] / last10[(0, "fp32", "-", sd)] for sd in seeds)
        nb = wire_bytes(k, w)
        print(f"| {k or 'none'} | {m} | {w} | {nb} | {base / nb:.2f} x | {' / '.join(f'{x:.4f}' for x in per)} | "
              f"{mean:.4f} | {(mean / ref - 1) * 100:+.1f} % | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
