#!/usr/bin/env python3
"""scripts/bench_wire.py — wire compression of activations (--wire-dtype), measured.

    scripts/bench_wire.py [--build DIR] [--iterations N] [--dtypes fp32,bf16,...,rot4/lr32]
                          [--links FILE] [--relays N] [--base-port P] [--json FILE]
                          [--data-seeds 1000,1001,...]
    scripts/bench_wire.py --ref-only --data-seeds 1000,...,1007 [--jobs 2] [--iterations N] [--dtypes ...]
                          [--grad-clip N]

For each wire dtype (or ACT/GRAD pair: activations in ACT, gradients in GRAD), one `gwtf swarm` (1 data node, --relays relays over 3
stages, the tiny model, 4 microbatches of 4 x 64 tokens per iteration) over
emulated links (default data/links/wan50.json: every link 50 Mbit/s, 10 ms
one way), and one `gwtf train-ref --wire-dtype` of the same run (the same
arithmetic in one process, no network). Reports per dtype:
  - bytes per activation (or gradient) tensor on one hop, and per microbatch
    over all hops, from the peers' own `wire.sent` counters;
  - the flow protocol's link cost (Eq. 1, ms; median over the next-stage
    links of the run's second half): it counts the negotiated bytes;
  - seconds per microbatch (the swarm summary's median time_per_microbatch_s,
    first two iterations left out: flows and HELLOs settle there);
  - the final loss (last iteration, and the mean of the last 10) of the
    swarm and of train-ref, and how far each is from fp32's;
  - with --data-seeds, train-ref's last-10 mean for each of those data
    seeds too (the swarm's data node samples with --data-seed 1000), and
    their mean: at 200 iterations one run's loss moves by several percent
    with any perturbation, so one seed cannot tell 2 % apart.
A dtype "D@K" or "D@K:R" is --wire-dtype D with --subspace K[:R]: the
activations confined to a K-dimensional subspace (docs/TRAINING.md,
"Subspace crossings"); its bytes count the token ids and, apart, the
table's refresh. A swarm takes only "D@K:0" (the table fixed) so far.
With --ref-only, no swarm: train-ref alone for every dtype and data seed
(1000 and --data-seeds; --jobs at once), and per dtype the last-10 mean
of each seed, their mean over the seeds and its difference from fp32's,
and the median over the seeds of the per-seed ratio to fp32. The loss of
one seed at 200 iterations swings by tens of percent with any perturbation
(fp32 itself ends between 0.63 and 1.13 over eight seeds), so only many
seeds, or more iterations, can tell a few percent apart.
Numbers go to docs/TRAINING.md, "Wire compression". Not a pass/fail test."""

import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LINE = re.compile(r"^(?P<name>\S+)\s+\| (?P<ts>\S+) (?P<level>\S+)\s+(?P<node>\S+) (?P<stage>\S+) (?P<event>\S+)(?P<rest>.*)$")


def fields(rest):
    return dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)


def swarm(gwtf, tmp, dtype, a):
    tag = dtype.replace("/", "_").replace("@", "_at_").replace(":", "_")
    d, _, sub = dtype.partition("@")
    summary = os.path.join(tmp, f"summary-{tag}.json")
    cmd = [gwtf, "swarm", "--dataset", os.path.join(tmp, "corpus.txt"), "--summary-json", summary,
           "--base-port", str(a.base_port), "--workdir", os.path.join(tmp, f"peers-{tag}"),
           "--relays", str(a.relays), "--stages", "3", "--iterations", str(a.iterations),
           "--links", a.links, "--wire-dtype", d, "--grad-clip", str(a.grad_clip)] + (["--subspace", sub] if sub else [])
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=a.timeout)
    if p.returncode != 0:
        tail = "\n".join(p.stdout.splitlines()[-20:])
        raise SystemExit(f"gwtf swarm --wire-dtype {dtype} exited {p.returncode}:\n{tail}")
    last, costs = {}, []
    for line in p.stdout.splitlines():
        m = LINE.match(line)
        if m and m.group("event") == "wire.sent":
            last[m.group("name")] = fields(m.group("rest"))
        if m and m.group("event") == "flow.link_costs":  # Eq. 1 per next-stage link, in ms
            costs += [float(c.rsplit(":", 1)[1]) for c in fields(m.group("rest"))["to"].split(",")]
    with open(summary) as f:
        s = json.load(f)
    return s, last, costs[len(costs) // 2:]  # the second half: links measured under load


def train_ref_run(gwtf, tmp, dtype, iterations, seed=1000, grad_clip=0.0, model="tiny"):
    """One train-ref; dtype "D@K[:R]" is --wire-dtype D with --subspace K[:R].
    Returns (losses, its "wire" byte counts)."""
    d, _, sub = dtype.partition("@")
    cmd = [gwtf, "train-ref", "--dataset", os.path.join(tmp, "corpus.txt"), "--iterations", str(iterations),
           "--data-seed", str(seed), "--json", "--wire-dtype", d, "--grad-clip", str(grad_clip), "--model", model]
    r = subprocess.run(cmd + (["--subspace", sub] if sub else []), stdout=subprocess.PIPE, text=True, check=True)
    out = json.loads(r.stdout)
    return [it["loss"] for it in out["iterations"]], out["wire"]


def train_ref(gwtf, tmp, dtype, iterations, seed=1000, grad_clip=0.0):
    return train_ref_run(gwtf, tmp, dtype, iterations, seed, grad_clip)[0]


def ref_only(gwtf, tmp, a):
    """train-ref for every dtype x seed, --jobs at a time; prints the table."""
    seeds = [1000] + [int(x) for x in a.data_seeds.split(",") if x and int(x) != 1000]
    dtypes = a.dtypes.split(",")
    if "fp32" not in dtypes:
        dtypes = ["fp32"] + dtypes
    last10, wire = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        futs = {ex.submit(train_ref_run, gwtf, tmp, d, a.iterations, sd, a.grad_clip, a.model): (d, sd)
                for d in dtypes for sd in seeds}
        for f in concurrent.futures.as_completed(futs):
            d, sd = futs[f]
            ls, wire[d] = f.result()
            last10[(d, sd)] = sum(ls[-10:]) / len(ls[-10:])
            print(json.dumps({"dtype": d, "data_seed": sd, "iterations": a.iterations, "last10": last10[(d, sd)]}),
                  flush=True)
    base = statistics.mean(last10[("fp32", sd)] for sd in seeds)
    print(f"\ntrain-ref --model {a.model}, {a.iterations} iterations, last-10 mean loss per data seed ({', '.join(map(str, seeds))})")
    print("| --wire-dtype[@subspace] | bytes / microbatch (+ table) | vs fp32 | per seed | mean | Δ fp32 (of the means) "
          "| median per-seed ratio to fp32 |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for d in dtypes:
        per = [last10[(d, sd)] for sd in seeds]
        m = statistics.mean(per)
        ratio = statistics.median(last10[(d, sd)] / last10[("fp32", sd)] for sd in seeds)
        w = wire[d]
        nbytes = w["bytes_per_microbatch"] + w["table_bytes_per_microbatch"]
        rows.append({"dtype": d, "iterations": a.iterations, "by_seed": dict(zip(seeds, per)), "mean": m,
                     "delta_fp32": m / base - 1, "median_ratio": ratio, "wire": w})
        table = f" (+{w['table_bytes_per_microbatch']:.0f})" if w["table_bytes_per_microbatch"] else ""
        print(f"| {d} | {w['bytes_per_microbatch']:.0f}{table} | {w['fp32_bytes_per_microbatch'] / nbytes:.2f} x | "
              f"{' / '.join(f'{x:.4f}' for x in per)} | {m:.4f} | {(m / base - 1) * 100:+.1f} % | {ratio:.3f} |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--dtypes", default="fp32,bf16,fp16,int8,rot4,rot3,rot4/lr32,rot4/lr16")
    ap.add_argument("--data-seeds", default="", help="more train-ref data seeds, e.g. 1001,1002")
    ap.add_argument("--links", default=os.path.join(ROOT, "data/links/wan50.json"))
    ap.add_argument("--relays", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=29000)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--ref-only", action="store_true", help="train-ref only, every dtype x data seed")
    ap.add_argument("--jobs", type=int, default=2, help="train-ref runs at once (--ref-only)")
    ap.add_argument("--grad-clip", type=float, default=0.0, help="the run's --grad-clip (default 0: off)")
    ap.add_argument("--model", default="tiny", help="train-ref's --model (--ref-only; default tiny)")
    a = ap.parse_args()
    gwtf = os.path.join(a.build, "node/gwtf")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-wire-") as tmp:
        subprocess.run([gwtf, "data", "synth", "--out", os.path.join(tmp, "corpus.txt"), "--bytes", "1000000",
                        "--seed", "1"], check=True, stderr=subprocess.DEVNULL)
        if a.ref_only:
            rows = ref_only(gwtf, tmp, a)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1)
            return 0
        if any("@" in d and not d.endswith(":0") for d in a.dtypes.split(",")):
            sys.exit("bench_wire.py: a swarm keeps the subspace's table fixed so far: DTYPE@K:0, or --ref-only")
        for d in a.dtypes.split(","):
            s, sent, costs = swarm(gwtf, tmp, d, a)
            its = s["iterations"]
            losses = [it["loss"] for it in its if it["loss"] is not None]
            done = sum(it["microbatches_done"] for it in its)
            tensors = sum(int(f["tensors"]) for f in sent.values())
            nbytes = sum(int(f["bytes"]) for f in sent.values())
            f32 = sum(int(f["fp32_bytes"]) for f in sent.values())
            per_mb = [it["time_per_microbatch_s"] for it in its[2:] if it["time_per_microbatch_s"] is not None]
            ref = train_ref(gwtf, tmp, d, a.iterations, grad_clip=a.grad_clip)
            seeds = [int(x) for x in a.data_seeds.split(",") if x]
            last10 = {1000: sum(ref[-10:]) / len(ref[-10:])}
            for sd in seeds:
                rs = train_ref(gwtf, tmp, d, a.iterations, sd, a.grad_clip)
                last10[sd] = sum(rs[-10:]) / len(rs[-10:])
            rows.append({"ref_last10_by_seed": last10, "ref_last10_seed_mean": statistics.mean(last10.values()),"dtype": d, "iterations": len(its), "microbatches": done, "tensors": tensors,
                         "bytes_per_tensor": nbytes / tensors if tensors else None,
                         "bytes_per_microbatch": nbytes / done if done else None,
                         "fp32_over_bytes": f32 / nbytes if nbytes else None,
                         "s_per_microbatch_median": statistics.median(per_mb) if per_mb else None,
                         "iteration_s_median": statistics.median(it["iteration_s"] for it in its[2:]),
                         "link_cost_ms_median": statistics.median(costs) if costs else None,
                         "loss_last": losses[-1], "loss_last10": sum(losses[-10:]) / len(losses[-10:]),
                         "ref_loss_last": ref[-1], "ref_loss_last10": sum(ref[-10:]) / len(ref[-10:])})
            print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["dtype"] == "fp32"), None)
    print(f"\n{a.iterations} iterations, links {os.path.basename(a.links)}, {a.relays} relays / 3 stages, "
          "tiny model, 4 microbatches of 4 x 64 tokens")
    print("| dtype | bytes/tensor | bytes/microbatch | vs fp32 | s/microbatch | iteration s | link cost ms "
          "| swarm loss (last, last-10 mean) | Δ fp32 | train-ref loss (last, last-10) | Δ fp32 "
          "| train-ref last-10, mean over seeds | Δ fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        dl = (r["loss_last10"] / base["loss_last10"] - 1) * 100 if base else float("nan")
        dr = (r["ref_loss_last10"] / base["ref_loss_last10"] - 1) * 100 if base else float("nan")
        ds = (r["ref_last10_seed_mean"] / base["ref_last10_seed_mean"] - 1) * 100 if base else float("nan")
        print(f"| {r['dtype']} | {r['bytes_per_tensor']:.0f} | {r['bytes_per_microbatch']:.0f} | "
              f"{r['fp32_over_bytes']:.2f}x fewer | {r['s_per_microbatch_median']:.3f} | {r['iteration_s_median']:.2f} | "
              f"{r['link_cost_ms_median']:.1f} | "
              f"{r['loss_last']:.4f}, {r['loss_last10']:.4f} | {dl:+.2f} % | "
              f"{r['ref_loss_last']:.4f}, {r['ref_loss_last10']:.4f} | {dr:+.2f} % | "
              f"{r['ref_last10_seed_mean']:.4f} ({len(r['ref_last10_by_seed'])}) | {ds:+.2f} % |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
