#!/usr/bin/env python3
"""scripts/place_eval.py — the Fig. 5 comparison: where joining nodes should go.

Runs `gwtf sim join --setting K --seed S --json` for Table IV settings 1-5
and prints, per setting, each method's mean improvement (and its spread), and
gwtf's improvement relative to the optimal placement's.

  scripts/place_eval.py [--gwtf build/node/gwtf] [--seeds 10] [--settings 1,2,3,4,5]
                        [--batch 2] [--markdown]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from flow_eval import show

METHODS = ["gwtf", "capacity_first", "random", "optimal"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--gwtf", default=os.path.join(here, "..", "build", "node", "gwtf"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--settings", default="1,2,3,4,5")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    hdr = ["setting"] + [f"{m} improvement" for m in METHODS] + ["gwtf / optimal", "gwtf worst / optimal",
                                                                 "gwtf beats both", "messages"]
    lines = []
    for k in [int(x) for x in a.settings.split(",")]:
        imp = {m: [] for m in METHODS}
        ratio, beats, msgs = [], 0, []
        for seed in range(1, a.seeds + 1):
            out = subprocess.run([a.gwtf, "sim", "join", "--setting", str(k), "--seed", str(seed), "--batch",
                                  str(a.batch), "--json"], check=True, capture_output=True, text=True).stdout
            d = json.loads(out)
            by = {m["method"]: m for m in d["methods"]}
            for m in METHODS:
                imp[m].append(by[m]["improvement"])
            ratio.append(by["gwtf"]["improvement"] / by["optimal"]["improvement"])
            beats += by["gwtf"]["improvement"] > max(by["capacity_first"]["improvement"], by["random"]["improvement"])
            msgs.append(d["gwtf_messages"])
        row = [str(k)]
        for m in METHODS:
            row.append(f"{100*statistics.mean(imp[m]):.1f}% ± {100*statistics.pstdev(imp[m]):.1f}")
        row += [f"{100*statistics.mean(ratio):.1f}%", f"{100*min(ratio):.1f}%", f"{beats}/{a.seeds}",
                f"{statistics.mean(msgs):.0f}"]
        lines.append(row)
    show(hdr, lines, a.markdown)


if __name__ == "__main__":
    sys.exit(main())
