#!/usr/bin/env python3
"""scripts/churn_cost.py splits each iteration where the logs say: a
hand-made `gwtf swarm` log of two data nodes, where iteration 1 is clean,
iteration 2 lost a relay and one data node waited a second for flows, and
iteration 3 repaired a backward and started with a backlog. Every phase, the
excess over a fault-free run and the causes are checked to the millisecond;
a version that measured the boundary from the last data node's end, or that
counted the skew into the run, fails."""
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("churn_cost", os.path.join(HERE, "..", "..", "scripts", "churn_cost.py"))
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def near(a, b):
    return abs(a - b) < 1e-6


def line(who, t, ev, rest=""):
    return f"{who:<5}| 12:00:{t:06.3f}Z info  1a9d2491 s0 {ev} {rest}\n"


CHURNED = [
    ("d0", 10.000, "iteration.done", "iter=0 secs=1"), ("d1", 10.020, "iteration.done", "iter=0 secs=1"),
    # 1: clean. boundary 0.8, skew 0.05, run 1.0
    ("d0", 10.800, "iteration.started", "iter=1 microbatches=4 routes=4 backlog=0"),
    ("d1", 10.850, "iteration.started", "iter=1 microbatches=4 routes=4 backlog=0"),
    ("d0", 11.800, "iteration.done", "iter=1 secs=1.8"), ("d1", 11.850, "iteration.done", "iter=1 secs=1.83"),
    # 2: r3 lost, d1 waits for flows: boundary 0.9, skew 1.0, run 1.1
    ("r2", 12.000, "peer.lost", "peer=abcd1234 reason=eof"),
    ("d0", 12.700, "iteration.started", "iter=2 microbatches=4 routes=4 backlog=0"),
    ("d1", 12.710, "flows.waiting", "iter=2 waited_s=0 every_stage_served=1"),
    ("d1", 13.700, "flows.none", "iter=2 waited_ms=990 routing=fallback"),
    ("d1", 13.700, "iteration.started", "iter=2 microbatches=4 routes=4 backlog=0"),
    ("d0", 14.700, "iteration.done", "iter=2 secs=2.9"), ("d1", 14.800, "iteration.done", "iter=2 secs=2.95"),
    # 3: a repair and a backlog: boundary 0.8, skew 0, run 2.5
    ("d0", 15.500, "iteration.started", "iter=3 microbatches=2 routes=2 backlog=2"),
    ("d1", 15.500, "iteration.started", "iter=3 microbatches=4 routes=4 backlog=0"),
    ("d0", 16.000, "backward.recovery_started", "mb=300000 suspect=abcd1234 suspect_stage=2 repair=1"),
    ("d1", 17.990, "iteration.done", "iter=3 secs=3.17"), ("d0", 18.000, "iteration.done", "iter=3 secs=3.3"),
    # iteration 4 never ends (the swarm stopped): not counted
    ("d0", 18.800, "iteration.started", "iter=4 microbatches=4 routes=4 backlog=0"),
]
CLEAN = [
    ("d0", 20.000, "iteration.done", "iter=0 secs=1"),
    ("d0", 20.800, "iteration.started", "iter=1 microbatches=4 routes=4 backlog=0"),
    ("d0", 21.800, "iteration.done", "iter=1 secs=1.8"),
    ("d0", 22.600, "iteration.started", "iter=2 microbatches=4 routes=4 backlog=0"),
    ("d0", 23.800, "iteration.done", "iter=2 secs=2"),
    ("d0", 24.400, "iteration.started", "iter=3 microbatches=4 routes=4 backlog=0"),
    ("d0", 25.200, "iteration.done", "iter=3 secs=1.4"),
]


def write(d, lines):
    os.makedirs(os.path.join(d, "run-0"))
    with open(os.path.join(d, "run-0", "swarm.log"), "w") as f:
        f.write("swarm | 2 data node(s), 4 relays, 2 stages\n")
        for who, t, ev, rest in lines:
            f.write(line(who, t, ev, rest))
        f.write("swarm | churn: killing r3 (SIGKILL)\n")


def main():
    with tempfile.TemporaryDirectory(prefix="gwtf-churn-cost-") as tmp:
        churned, clean = os.path.join(tmp, "churned"), os.path.join(tmp, "clean")
        write(churned, CHURNED)
        write(clean, CLEAN)
        rows = cc.rows_of([churned])
        check([r["iter"] for r in rows] == [1, 2, 3], f"iterations {[r['iter'] for r in rows]}, wanted 1..3")
        want = {1: (0.8, 0.05, 1.0), 2: (0.9, 1.0, 1.1), 3: (0.8, 0.0, 2.5)}
        for r in rows:
            b, s, u = want[r["iter"]]
            check(near(r["boundary"], b) and near(r["skew"], s) and near(r["run"], u),
                  f"iteration {r['iter']}: boundary/skew/run {r['boundary']:.3f}/{r['skew']:.3f}/{r['run']:.3f}, "
                  f"wanted {b}/{s}/{u}")
            check(near(r["total"], b + s + u), f"iteration {r['iter']}: the phases do not add up to {r['total']}")
        causes = {r["iter"]: {c for c in cc.CAUSES if r[c]} for r in rows}
        check(causes == {1: set(), 2: {"lost", "flow_wait"}, 3: {"repair", "backlog"}}, f"causes {causes}")

        ref = cc.means(cc.rows_of([clean]))  # fault-free: totals 1.8 / 2.0 / 1.4, boundaries 0.8 / 0.8 / 0.6
        check(near(ref["total"], 5.2 / 3) and near(ref["boundary"], 2.2 / 3) and near(ref["skew"], 0) and
              near(ref["run"], 1.0), f"reference {ref}")
        s = cc.summary(rows, ref)
        check(s["reference"] == "fault-free run", s["reference"])
        check(near(s["excess_s"], 1.85 + 3.0 + 3.3 - 5.2), f"excess {s['excess_s']}")
        x = s["excess_by_phase_s"]
        check(near(x["boundary"], 2.5 - 2.2) and near(x["skew"], 1.05) and near(x["run"], 1.6), f"by phase {x}")
        check(near(sum(x.values()), s["excess_s"]), f"the phases' excesses {x} do not add up to {s['excess_s']}")
        check(near(s["excess_with_cause_s"]["flow_wait"], 3.0 - 5.2 / 3) and
              near(s["excess_with_cause_s"]["repair"], 3.3 - 5.2 / 3), f"by cause {s['excess_with_cause_s']}")
        check(near(s["ratio_to_clean"], (1.85 + 3.0 + 3.3) / 5.2), f"ratio {s['ratio_to_clean']}")

        own = cc.summary(rows)  # no fault-free run: the one clean iteration is the reference
        check(own["reference"] == "clean iterations" and own["clean"] == 1 and near(own["clean_mean_s"]["total"],
                                                                                     1.85), f"own reference {own}")
        check(cc.main(["--clean", clean, churned]) == 0, "the command line failed")
    if failures:
        print(f"FAILED: {len(failures)} check(s)", file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
