#!/usr/bin/python3
"""Time one stage (L blocks, forward + backward) in gwtf and in PyTorch eager.

    /usr/bin/python3 scripts/bench_vs_torch.py [--gwtf build/node/gwtf] [--arch gpt]
        [--d-model 512] [--heads 8] [--layers 4] [--d-ff F] [--seq 256] [--batch 4]
        [--device cpu|cuda] [--threads 2] [--iters 10] [--warmup 2] [--runs 1] [--json]

Both sides run the same configuration with the same thread count: the same
model (scripts/gwtf_torch.py is gwtf's definition in PyTorch), one (B, T)
microbatch, forward then backward with a random output gradient, parameter
gradients accumulating, medians over --iters after --warmup. With --runs R
each side is run R times alternately and the median of the runs is kept, so
that a load spike from elsewhere hits both sides alike. Prints both figures
and the ratio gwtf / PyTorch (above 1: gwtf is faster), by wall time and by
process CPU time per step (the latter ignores time the scheduler gave to
other processes; with one thread it is the cleaner figure on a busy machine).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gwtf_torch as G  # noqa: E402


def model_flops(a):
    """Forward FLOPs, as gwtf counts them (train/model.c: model_block_flops)."""
    N, C, Fd = a.batch * a.seq, a.d_model, a.d_ff
    mlp = 2 * C * Fd if a.arch == "gpt" else 3 * C * Fd
    return a.layers * (2.0 * N * (4 * C * C + mlp) + 4.0 * a.batch * a.seq * a.seq * C)


def bench_torch(a):
    torch.set_num_threads(a.threads)
    dev = torch.device("cuda" if a.device.startswith("cuda") else "cpu")
    cfg = G.Cfg(a.arch, a.d_model, a.heads, a.layers, a.d_ff, max_seq_len=a.seq)
    torch.manual_seed(1)
    model = G.Blocks(cfg).to(dev)
    x = torch.randn(a.batch, a.seq, a.d_model, device=dev, requires_grad=True)
    dy = torch.randn(a.batch, a.seq, a.d_model, device=dev) * 1e-3

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    fwd, bwd, cpu = [], [], []
    for it in range(a.warmup + a.iters):
        sync()
        c0 = time.process_time()
        t0 = time.perf_counter()
        y = model(x)
        sync()
        t1 = time.perf_counter()
        y.backward(dy)
        x.grad = None
        sync()
        t2 = time.perf_counter()
        if it >= a.warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    f, b = statistics.median(fwd), statistics.median(bwd)
    s = (f + b) / 1e3
    return {"fwd_ms_median": f, "bwd_ms_median": b, "tokens_per_s": a.batch * a.seq / s,
            "gflops": 3 * model_flops(a) / s / 1e9, "cpu_ms_median": statistics.median(cpu)}


def bench_gwtf(a):
    cmd = [a.gwtf, "bench", "stage", "--arch", a.arch, "--d-model", str(a.d_model), "--heads",
           str(a.heads), "--layers", str(a.layers), "--d-ff", str(a.d_ff), "--seq", str(a.seq),
           "--batch", str(a.batch), "--device", a.device, "--threads", str(a.threads), "--iters",
           str(a.iters), "--warmup", str(a.warmup), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def median_run(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--gwtf", default=os.path.join(here, "..", "build", "node", "gwtf"))
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=0)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not a.d_ff:
        a.d_ff = 4 * a.d_model if a.arch == "gpt" else math.ceil(8 * a.d_model / 3 / 64) * 64

    ours, theirs = [], []
    for _ in range(a.runs):
        ours.append(bench_gwtf(a))
        theirs.append(bench_torch(a))
    keys = ("fwd_ms_median", "bwd_ms_median", "tokens_per_s", "gflops", "cpu_ms_median")
    g = {k: median_run(ours, k) for k in keys}
    t = {k: median_run(theirs, k) for k in keys}
    ratio = g["tokens_per_s"] / t["tokens_per_s"]
    load = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"config": vars(a), "gwtf": g, "torch": t, "ratio": ratio,
                          "cpu_ratio": t["cpu_ms_median"] / g["cpu_ms_median"],
                          "torch_version": torch.__version__, "loadavg_1m": load}))
        return 0
    print(f"{a.arch} C={a.d_model} H={a.heads} L={a.layers} F={a.d_ff} T={a.seq} B={a.batch} "
          f"{a.device} threads={a.threads} iters={a.iters} runs={a.runs} (load {load:.2f})")
    print(f"{'':14s} {'fwd ms':>9s} {'bwd ms':>9s} {'tokens/s':>10s} {'GFLOP/s':>9s} {'cpu ms':>9s}")
    for name, r in (("gwtf", g), (f"torch {torch.__version__.split('+')[0]}", t)):
        print(f"{name:14s} {r['fwd_ms_median']:9.2f} {r['bwd_ms_median']:9.2f} "
              f"{r['tokens_per_s']:10.1f} {r['gflops']:9.2f} {r['cpu_ms_median']:9.1f}")
    print(f"ratio gwtf/torch (tokens/s): {ratio:.2f}x; "
          f"by CPU time per step: {t['cpu_ms_median'] / g['cpu_ms_median']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
