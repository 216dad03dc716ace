#!/usr/bin/env python3
"""Where a churned run's time goes, iteration by iteration, from `gwtf swarm`
logs (swarm.log of each run of a `gwtf experiment --workdir DIR`).

Each iteration i >= 1 runs from the data nodes' end of iteration i-1 (the
first `iteration.done`) to the last data node's end of i, in three phases:

  boundary  to the first data node's `iteration.started`: the stages'
            aggregation, CAN_TAKE back to stage 1, a data node's validation;
  skew      to the last data node's `iteration.started`: one data node
            started, another still waited (for flows after churn tore its own
            down: `flows.waiting`, `flows.none`);
  run       to the last `iteration.done`: the microbatches' trips, repairs,
            a second wave where the iteration started with fewer routes than
            microbatches (`backlog` > 0).

Against the same phases of a fault-free run (--clean DIR: the scenario's
churn-0 run, e.g. `gwtf experiment --scenario .../homo-churn0.json`; the
mean of its iterations), the churn's cost is what the iterations took
beyond the mean fault-free one, split by phase (the phases' excesses add up
to the whole), and which causes the iterations
that paid it had: a peer lost anywhere in the swarm within it (`peer.lost`),
a backward repaired, a data node that waited for flows, one that started
with a backlog. An iteration with two causes counts under both: the causes
overlap, the phases do not. Without --clean the reference is the churned
run's own iterations that had none of those causes (at 10 % churn there are
few).

    scripts/churn_cost.py [--clean DIR] DIR [DIR...]   # a line per DIR, then all of them
    scripts/churn_cost.py --json [--clean DIR] DIR...
"""
import glob
import json
import os
import re
import statistics
import sys

LINE = re.compile(r"^(\S+)\s+\|\s+(\d\d):(\d\d):(\d\d\.\d+)Z\s+\S+\s+\S+\s+\S+\s+(\S+)\s*(.*)$")
PHASES = ("boundary", "skew", "run")
CAUSES = ("lost", "repair", "flow_wait", "backlog")


def kv(rest):
    return dict(p.split("=", 1) for p in rest.split() if "=" in p)


def events(log):
    """(name, seconds, event, fields) of every log line, in file order."""
    out = []
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                t = (int(m.group(2)) * 60 + int(m.group(3))) * 60 + float(m.group(4))
                out.append((m.group(1), t, m.group(5), kv(m.group(6))))
    return out


def iterations(evs):
    """Per iteration: the data nodes' start and end times, whether one started
    with a backlog or waited for flows."""
    data = {n for n, _, e, _ in evs if e == "iteration.done"}
    its = {}
    for name, t, ev, a in evs:
        if name not in data or "iter" not in a or not a["iter"].isdigit():
            continue
        it = its.setdefault(int(a["iter"]), {"started": {}, "done": {}, "backlog": False, "flow_wait": False})
        if ev == "iteration.started":
            it["started"].setdefault(name, t)
            it["backlog"] |= a.get("backlog", "0") != "0"
        elif ev == "iteration.done":
            it["done"].setdefault(name, t)
        elif ev in ("flows.waiting", "flows.none"):
            it["flow_wait"] = True
    return its


def phases(its, evs):
    """One row per iteration i >= 1 with all three phases and its causes."""
    lost = sorted(t for _, t, ev, _ in evs if ev == "peer.lost")
    repaired = sorted(t for _, t, ev, _ in evs if ev == "backward.recovery_started")
    rows = []
    for i in sorted(its):
        prev, it = its.get(i - 1), its[i]
        if i == 0 or not prev or not prev["done"] or not it["started"] or not it["done"]:
            continue
        if len(it["done"]) < len(prev["done"]):  # the run stopped mid-iteration
            continue
        d0, s0, s1, e = min(prev["done"].values()), min(it["started"].values()), max(it["started"].values()), max(
            it["done"].values())
        causes = {
            "lost": any(d0 <= t <= e for t in lost),
            "repair": any(d0 <= t <= e for t in repaired),
            "flow_wait": it["flow_wait"],
            "backlog": it["backlog"],
        }
        rows.append({"iter": i, "total": e - d0, "boundary": s0 - d0, "skew": s1 - s0, "run": e - s1, **causes})
    return rows


def means(rows):
    """Means, not medians: the phases' excesses then add up to the total's."""
    return {k: statistics.fmean(r[k] for r in rows) for k in ("total",) + PHASES} if rows else None


def summary(rows, ref=None):
    """ref: the fault-free phases' means; None: this run's clean iterations'."""
    if not rows:
        return {"iterations": 0}
    clean = [r for r in rows if not any(r[c] for c in CAUSES)]
    out = {"iterations": len(rows), "clean": len(clean), "total_s": sum(r["total"] for r in rows)}
    med = ref or means(clean)
    if not med:
        return out
    out["reference"] = "fault-free run" if ref else "clean iterations"
    out["clean_mean_s"] = med
    out["excess_s"] = sum(r["total"] - med["total"] for r in rows)
    out["excess_by_phase_s"] = {k: sum(r[k] - med[k] for r in rows) for k in PHASES}
    out["excess_with_cause_s"] = {c: sum(r["total"] - med["total"] for r in rows if r[c]) for c in CAUSES}
    out["iterations_with_cause"] = {c: sum(1 for r in rows if r[c]) for c in CAUSES}
    out["ratio_to_clean"] = out["total_s"] / (med["total"] * len(rows))
    return out


def rows_of(dirs):
    rows = []
    for d in dirs:
        for log in sorted(glob.glob(os.path.join(d, "**", "swarm.log"), recursive=True)):
            evs = events(log)
            rows += phases(iterations(evs), evs)
    return rows


def fmt(s):
    if "clean_mean_s" not in s:
        return f"{s['iterations']} iterations, {s.get('clean', 0)} clean: nothing to compare with"
    m, x, c, n = s["clean_mean_s"], s["excess_by_phase_s"], s["excess_with_cause_s"], s["iterations_with_cause"]
    return (f"{s['iterations']} iterations ({s['clean']} clean), {s['total_s']:.1f} s; the mean of the {s['reference']} "
            f"{m['total']:.2f} s (boundary {m['boundary']:.2f} + skew {m['skew']:.2f} + run {m['run']:.2f}); "
            f"{s['ratio_to_clean']:.2f}x its mean; excess {s['excess_s']:.1f} s = boundary "
            f"{x['boundary']:.1f} + skew {x['skew']:.1f} + run {x['run']:.1f}; iterations with a peer lost "
            f"{n['lost']} ({c['lost']:.1f} s), a repair {n['repair']} ({c['repair']:.1f} s), a wait for flows "
            f"{n['flow_wait']} ({c['flow_wait']:.1f} s), a backlog {n['backlog']} ({c['backlog']:.1f} s)")


def main(argv):
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    ref = None
    if "--clean" in argv:
        k = argv.index("--clean")
        if k + 1 >= len(argv):
            print("churn_cost.py: --clean needs a directory", file=sys.stderr)
            return 2
        ref_rows = rows_of([argv[k + 1]])
        if not ref_rows:
            print(f"churn_cost.py: no iterations in {argv[k + 1]}", file=sys.stderr)
            return 2
        ref = means(ref_rows)
        del argv[k:k + 2]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    rows = {d: summary(rows_of([d]), ref) for d in argv}
    if len(argv) > 1:
        rows["all"] = summary(rows_of(argv), ref)
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        for d, s in rows.items():
            print(f"{d}: {fmt(s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
