#!/usr/bin/env python3
"""scripts/flow_gap.py — where gwtf's flows lose to the exact optimum, and
which kind of move would win it back (one data node, objective sum).

For each Table V setting and seed it routes the instance with gwtf (`gwtf sim
flow --algo gwtf`, as scripts/flow_eval.py does) and with the exact
min-cost max-flow, then asks of gwtf's final flows:

  same nodes   the optimum when every relay carries exactly the units it
               carries in gwtf's flows: what is left once the pairings are
               optimal, i.e. how much of the gap is *which* relays carry
               flow rather than how they are linked;
  pairwise     steepest descent with moves between two same-stage relays
               only: the two pool their in-links and out-links and split
               them as well as possible (this contains Change, Redirect and
               a Redirect that re-pairs inside the giver: every move one
               proposal between two peers can express);
  stage        block coordinate descent where a whole stage is re-solved at
               once (which of its relays carries how many units, and every
               pairing to the stages before and after it), stage after
               stage until nothing improves.

The stage re-solve is an exact min-cost flow on a three-stage instance (the
previous stage's ends, the stage, the next stage's ends), solved by
`gwtf sim flow --algo optimal` itself: no solver but ours.

  scripts/flow_gap.py [--gwtf build/node/gwtf] [--settings 1,4] [--seeds 10]
                      [--rounds 120] [--markdown]
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def cost(paths, link):
    return sum(link[(p[i], p[i + 1])] for p in paths for i in range(len(p) - 1))


def optimal(gwtf, inst, tmp, name):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(inst, f)
    return run([gwtf, "sim", "flow", "--instance", path, "--json", "--algo", "optimal", "--objective", "sum"])


def same_nodes(gwtf, inst, paths, tmp):
    """The optimum with every relay's capacity set to what gwtf's flows use."""
    use = {}
    for p in paths:
        for n in p[1:-1]:
            use[n] = use.get(n, 0) + 1
    keep = {n["id"] for n in inst["nodes"] if n["stage"] == 0 or use.get(n["id"], 0)}
    sub = {"stages": inst["stages"],
           "nodes": [dict(n, capacity=n["capacity"] if n["stage"] == 0 else use[n["id"]])
                     for n in inst["nodes"] if n["id"] in keep],
           "links": [l for l in inst["links"] if l["from"] in keep and l["to"] in keep]}
    return optimal(gwtf, sub, tmp, "same-nodes.json")["total_cost"]


def stage_solve(gwtf, paths, k, members, cap, link, tmp):
    """Stage k re-solved exactly, the ends before and after it fixed: a
    three-stage instance whose data node feeds each previous-stage end
    (capacity: its units) and takes back from each next-stage end."""
    prevs, nexts = {}, {}
    for p in paths:
        prevs[p[k - 1]] = prevs.get(p[k - 1], 0) + 1
        nexts[p[k + 1]] = nexts.get(p[k + 1], 0) + 1
    ids = {}

    def nid(key):
        return ids.setdefault(key, len(ids))

    nodes = [{"id": nid(("d",)), "stage": 0, "capacity": len(paths)}]
    nodes += [{"id": nid(("p", a)), "stage": 1, "capacity": c} for a, c in prevs.items()]
    nodes += [{"id": nid(("m", m)), "stage": 2, "capacity": cap[m]} for m in members]
    nodes += [{"id": nid(("n", b)), "stage": 3, "capacity": c} for b, c in nexts.items()]
    links = [{"from": nid(("d",)), "to": nid(("p", a)), "cost": 0} for a in prevs]
    links += [{"from": nid(("p", a)), "to": nid(("m", m)), "cost": link[(a, m)]}
              for a in prevs for m in members if (a, m) in link]
    links += [{"from": nid(("m", m)), "to": nid(("n", b)), "cost": link[(m, b)]}
              for m in members for b in nexts if (m, b) in link]
    links += [{"from": nid(("n", b)), "to": nid(("d",)), "cost": 0} for b in nexts]
    sol = optimal(gwtf, {"stages": 3, "nodes": nodes, "links": links}, tmp, "stage.json")
    if sol["num_flows"] < len(paths):
        return paths
    back = {v: key for key, v in ids.items()}
    suffixes = {}
    for p in paths:
        suffixes.setdefault(p[k + 1], []).append(p[k + 1:])
    heads = {}
    for p in paths:
        heads.setdefault(p[k - 1], []).append(p[:k])
    new = []
    for f in sol["flows"]:
        a, m, b = (back[x][1] for x in f["path"][1:4])
        new.append(heads[a].pop() + [m] + suffixes[b].pop())
    return new


def descend_stages(gwtf, paths, stages, by_stage, cap, link, tmp):
    while True:
        before = cost(paths, link)
        for k in range(1, stages + 1):
            paths = stage_solve(gwtf, paths, k, by_stage[k], cap, link, tmp)
        if cost(paths, link) >= before:
            return paths


def pair_split(paths, k, b, c, cap, link):
    """The best split of relays b and c's in-links and out-links at stage k
    (any throughput split within their capacities); None if they carry none."""
    idx = [i for i, p in enumerate(paths) if p[k] in (b, c)]
    if not idx:
        return None
    inf = float("inf")
    d = lambda x, y: link.get((x, y), inf)
    ins = sorted(((i, paths[i][k - 1]) for i in idx), key=lambda x: d(x[1], c) - d(x[1], b), reverse=True)
    outs = sorted(((i, paths[i][k + 1:]) for i in idx), key=lambda x: d(c, x[1][0]) - d(b, x[1][0]), reverse=True)
    best = None
    for tb in range(max(0, len(idx) - cap[c]), min(len(idx), cap[b]) + 1):
        total = (sum(d(a, b) for _, a in ins[:tb]) + sum(d(a, c) for _, a in ins[tb:]) +
                 sum(d(b, s[0]) for _, s in outs[:tb]) + sum(d(c, s[0]) for _, s in outs[tb:]))
        if best is None or total < best[0]:
            best = (total, tb)
    tb = best[1]
    new = [list(p) for p in paths]
    for (i, a), (_, s) in zip(ins[:tb], outs[:tb]):
        new[i] = paths[i][:k - 1] + [a, b] + s
    for (i, a), (_, s) in zip(ins[tb:], outs[tb:]):
        new[i] = paths[i][:k - 1] + [a, c] + s
    return new


def descend_pairs(paths, stages, by_stage, cap, link):
    while True:
        best, best_cost = None, cost(paths, link)
        for k in range(1, stages + 1):
            for b, c in itertools.combinations(by_stage[k], 2):
                q = pair_split(paths, k, b, c, cap, link)
                if q and cost(q, link) < best_cost - 1e-9:
                    best, best_cost = q, cost(q, link)
        if best is None:
            return paths
        paths = best


def analyse(gwtf, inst, paths, tmp):
    """The costs of `paths` (one data node's flows on inst) and of what each
    kind of move makes of them."""
    link = {(l["from"], l["to"]): l["cost"] for l in inst["links"]}
    cap = {x["id"]: x["capacity"] for x in inst["nodes"]}
    by_stage = {}
    for x in inst["nodes"]:
        by_stage.setdefault(x["stage"], []).append(x["id"])
    return {"gwtf": cost(paths, link), "same": same_nodes(gwtf, inst, paths, tmp),
            "pair": cost(descend_pairs(paths, inst["stages"], by_stage, cap, link), link),
            "stage": cost(descend_stages(gwtf, paths, inst["stages"], by_stage, cap, link, tmp), link)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gwtf", default=os.path.join(HERE, "..", "build", "node", "gwtf"))
    ap.add_argument("--settings", default="1,4")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gwtf-flow-gap-") as tmp:
        for setting in a.settings.split(","):
            tot = {"opt": 0.0, "gwtf": 0.0, "same": 0.0, "pair": 0.0, "stage": 0.0}
            n = 0
            for seed in range(1, a.seeds + 1):
                path = os.path.join(tmp, f"s{setting}-{seed}.json")
                subprocess.run([a.gwtf, "sim", "gen", "--setting", setting, "--seed", str(seed), "--out", path],
                               check=True)
                inst = json.load(open(path))
                if sum(1 for x in inst["nodes"] if x["stage"] == 0) != 1:
                    sys.exit(f"setting {setting} has several data nodes: the exact optimum is for one")
                gw = run([a.gwtf, "sim", "flow", "--instance", path, "--json", "--algo", "gwtf", "--objective",
                          "sum", "--seed", str(seed), "--rounds", str(a.rounds)])
                opt = run([a.gwtf, "sim", "flow", "--instance", path, "--json", "--algo", "optimal", "--objective",
                           "sum"])
                paths = [f["path"] for f in gw["flows"]]
                if len(paths) != opt["num_flows"]:
                    print(f"setting {setting} seed {seed}: gwtf has {len(paths)} flows, the optimum "
                          f"{opt['num_flows']}: left out", file=sys.stderr)
                    continue
                tot["opt"] += opt["total_cost"]
                for k, v in analyse(a.gwtf, inst, paths, tmp).items():
                    tot[k] += v
                n += 1
            gap = {k: 100 * (v / tot["opt"] - 1) for k, v in tot.items() if k != "opt"}
            rows.append((setting, n, gap))
    hdr = ("setting", "runs", "gwtf", "same nodes, best pairings", "pairwise descent", "stage descent")
    if a.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    else:
        print("  ".join(hdr))
    for setting, n, g in rows:
        cells = [setting, str(n)] + [f"+{g[k]:.2f}%" for k in ("gwtf", "same", "pair", "stage")]
        print(("| " + " | ".join(cells) + " |") if a.markdown else "  ".join(cells))


if __name__ == "__main__":
    main()
