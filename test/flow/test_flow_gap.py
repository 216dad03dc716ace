#!/usr/bin/env python3
"""scripts/flow_gap.py's moves are honest: on Table V instances, whatever
the pairwise and the stage descents make of gwtf's flows is a valid set of
flows (every path through every stage, in order, over existing links, no
relay above its capacity, as many flows as before) whose cost is what the
descent reports, never below the exact optimum and never above where it
started; and the stage descent leaves the optimum's own flows at the
optimum's cost. Needs GWTF_BIN (set by ctest)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

GWTF = os.environ.get("GWTF_BIN", "build/node/gwtf")
HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("flow_gap", os.path.join(HERE, "..", "..", "scripts", "flow_gap.py"))
fg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fg)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def valid(inst, paths, n, what):
    stage = {x["id"]: x["stage"] for x in inst["nodes"]}
    cap = {x["id"]: x["capacity"] for x in inst["nodes"]}
    link = {(l["from"], l["to"]) for l in inst["links"]}
    check(len(paths) == n, f"{what}: {len(paths)} flows, had {n}")
    use = {}
    for p in paths:
        check(len(p) == inst["stages"] + 2 and stage[p[0]] == 0 and p[0] == p[-1], f"{what}: path {p}")
        check(all(stage[p[i]] == i for i in range(1, len(p) - 1)), f"{what}: stages along {p}")
        check(all((p[i], p[i + 1]) in link for i in range(len(p) - 1)), f"{what}: a link {p} lacks")
        for x in p[1:-1]:
            use[x] = use.get(x, 0) + 1
    over = {x: u for x, u in use.items() if u > cap[x]}
    check(not over, f"{what}: relays above capacity {over}")


def main():
    with tempfile.TemporaryDirectory(prefix="gwtf-flow-gap-test-") as tmp:
        for setting, seed in (("1", 1), ("1", 5), ("4", 10)):
            path = os.path.join(tmp, f"i{setting}-{seed}.json")
            subprocess.run([GWTF, "sim", "gen", "--setting", setting, "--seed", str(seed), "--out", path], check=True)
            inst = json.load(open(path))
            link = {(l["from"], l["to"]): l["cost"] for l in inst["links"]}
            cap = {x["id"]: x["capacity"] for x in inst["nodes"]}
            by_stage = {}
            for x in inst["nodes"]:
                by_stage.setdefault(x["stage"], []).append(x["id"])
            gw = fg.run([GWTF, "sim", "flow", "--instance", path, "--json", "--algo", "gwtf", "--objective", "sum",
                         "--seed", str(seed), "--rounds", "120"])
            opt = fg.run([GWTF, "sim", "flow", "--instance", path, "--json", "--algo", "optimal", "--objective", "sum"])
            paths = [f["path"] for f in gw["flows"]]
            start, best = fg.cost(paths, link), opt["total_cost"]
            tag = f"setting {setting} seed {seed}"
            pair = fg.descend_pairs(paths, inst["stages"], by_stage, cap, link)
            stage = fg.descend_stages(GWTF, paths, inst["stages"], by_stage, cap, link, tmp)
            for name, q in (("pairwise", pair), ("stage", stage)):
                valid(inst, q, len(paths), f"{tag}, {name} descent")
                c = fg.cost(q, link)
                check(best - 1e-6 <= c <= start + 1e-6, f"{tag}, {name} descent: {c}, optimum {best}, gwtf {start}")
            same = fg.same_nodes(GWTF, inst, paths, tmp)
            check(best - 1e-6 <= same <= start + 1e-6, f"{tag}: same nodes {same}, optimum {best}, gwtf {start}")
            print(f"{tag}: optimum {best}, gwtf {start}, same nodes {same}, pairwise {fg.cost(pair, link)}, "
                  f"stage {fg.cost(stage, link)}")
            at_opt = fg.descend_stages(GWTF, [f["path"] for f in opt["flows"]], inst["stages"], by_stage, cap, link,
                                       tmp)
            check(abs(fg.cost(at_opt, link) - best) < 1e-6, f"{tag}: the stage descent moved the optimum")
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
