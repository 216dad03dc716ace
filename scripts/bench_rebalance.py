#!/usr/bin/env python3
"""scripts/bench_rebalance.py — live rebalancing's figures (issue 18, item 3).

    scripts/bench_rebalance.py [--gwtf PATH] [--repeats N] [--iterations I]
                               [--base-port P] [--skew NAME] [--json FILE]

Runs the same skewed `gwtf swarm` with live rebalancing
(--rebalance-after 3) and without (--no-rebalance), N times each (default 3),
alternating, and prints one table: the run's throughput (tokens/s, from the
swarm summary), the mean seconds per iteration over the second half of the
run (after the moves), the moves made and the final split.

Skews (--skew):
  2x5  --stages 2 --relays 5 --join-stages 1,1,1,1,2 (4,1; rebalanced: 3,2)
  4x8  --stages 4 --relays 8 --join-stages 1,1,1,1,1,2,3,4 (5,1,1,1; 2,2,2,2)
both with --model tiny (4 blocks: equal stages), --slowdown 30, --batch 2
--seq 32 --microbatches 8, so that compute (slowed down, as a slower device)
and not this machine's cores sets the pace. Nothing here is a pass/fail
test: the figures go to docs/TRAINING.md, "Live rebalancing"."""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SKEWS = {
    "2x5": ["--stages", "2", "--relays", "5", "--join-stages", "1,1,1,1,2"],
    "4x8": ["--stages", "4", "--relays", "8", "--join-stages", "1,1,1,1,1,2,3,4"],
}
COMMON = ["--model", "tiny", "--slowdown", "30", "--batch", "2", "--seq", "32", "--microbatches", "8"]


def one(gwtf, skew, iterations, port, rebalance):
    with tempfile.TemporaryDirectory(prefix="gwtf-bench-rebal-") as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [gwtf, "swarm", "--summary-json", summary, "--base-port", str(port), "--workdir",
               os.path.join(tmp, "peers"), "--iterations", str(iterations), *SKEWS[skew], *COMMON,
               *(["--rebalance-after", "3"] if rebalance else ["--no-rebalance"])]
        print("$", " ".join(cmd), file=sys.stderr, flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
        if p.returncode != 0 or not os.path.exists(summary):
            sys.exit(f"gwtf swarm exited {p.returncode}:\n{p.stdout[-3000:]}")
        with open(summary) as f:
            s = json.load(f)
    moves = len(re.findall(r"stage\.rebalance[\" ].*?from", p.stdout))
    splits = re.findall(r"iteration\.done.*?peers[=\":]+\"?([0-9,]+)", p.stdout)
    secs = [x["iteration_s"] for x in s["iterations"]]
    half = secs[len(secs) // 2:]
    return {"tokens_per_s": s["throughput_tokens_per_s"], "late_iteration_s": statistics.mean(half),
            "moves": moves, "split": splits[-1] if splits else "?", "agree": s["stage_hashes_agree"],
            "final_loss": s["iterations"][-1]["loss"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gwtf", default=os.path.join(ROOT, "build", "node", "gwtf"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--base-port", type=int, default=27200)
    ap.add_argument("--skew", choices=sorted(SKEWS), default="2x5")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args()
    runs = {True: [], False: []}
    for i in range(a.repeats):
        for reb in (True, False):
            r = one(a.gwtf, a.skew, a.iterations, a.base_port, reb)
            runs[reb].append(r)
            print(f"run {i + 1} {'rebalance' if reb else 'off      '}: {r}", file=sys.stderr, flush=True)
    print(f"skew {a.skew}, {a.iterations} iterations, {a.repeats} runs each")
    print(f"{'':12} {'tokens/s (each)':32} {'mean':>8} {'s/iter 2nd half':>16} {'moves':>6} {'final split':>12}")
    for reb in (True, False):
        rs = runs[reb]
        tps = [r["tokens_per_s"] for r in rs]
        late = statistics.mean(r["late_iteration_s"] for r in rs)
        print(f"{'rebalance' if reb else 'no-rebalance':12} {', '.join('%.0f' % x for x in tps):32} "
              f"{statistics.mean(tps):8.0f} {late:16.3f} {','.join(str(r['moves']) for r in rs):>6} "
              f"{'/'.join(r['split'] for r in rs):>12}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"skew": a.skew, "iterations": a.iterations,
                       "rebalance": runs[True], "no_rebalance": runs[False]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
