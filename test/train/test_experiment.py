#!/usr/bin/env python3
"""`gwtf experiment` with both routings on the smallest scenario (issue 7):
each completes, and each reports every metric of the paper's Table II as a
number, per repeat and as mean and standard deviation. The GWTF run (one
data node, no churn) also reports the exact optimum for the same peers. It
runs a copy of the scenario with 50 % churn and `--churn 0`: the flag
replaces the scenario's churn (the report says 0, and no relay is killed);
a --churn outside [0, 1) or not a number is refused."""
import json
import math
import os
import subprocess
import sys
import tempfile

GWTF = os.environ.get("GWTF_BIN", "gwtf")
SRC = os.environ.get("GWTF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
SCENARIO = os.path.join(SRC, "data", "scenarios", "ci-tiny.json")
METRICS = ("time_per_microbatch_s", "throughput", "communication_s", "wasted_compute_s",
           "wasted_compute_on_crashed_s", "unaggregated_compute_s")
PORTS = {"gwtf": 22800, "swarm": 22900}  # below the ephemeral range, apart from test_swarm.py's


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def churned_copy(tmp):
    """ci-tiny with 50 % churn (its relative paths made absolute)."""
    with open(SCENARIO) as f:
        sc = json.load(f)
    sc["links"] = os.path.join(os.path.dirname(SCENARIO), sc["links"])
    sc["churn"] = 0.5
    path = os.path.join(tmp, "ci-tiny-churned.json")
    with open(path, "w") as f:
        json.dump(sc, f)
    return path


def run(routing, tmp, scenario=SCENARIO, *extra):
    cmd = [GWTF, "experiment", "--scenario", scenario, "--routing", routing, "--repeats", "1", "--json",
           "--base-port", str(PORTS[routing]), "--workdir", os.path.join(tmp, routing), *extra]
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    check(p.returncode == 0, f"{routing}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def check_report(routing, rep):
    check(rep["routing"] == routing and rep["scenario"] == "ci-tiny" and rep["repeats"] == 1, "header fields")
    (r,) = rep["runs"]
    check(r["completed"] and r["stage_hashes_agree"], f"{routing}: run did not complete cleanly: {r}")
    check(r["iterations"] == 3, f"{routing}: {r['iterations']} iterations reported")
    for m in METRICS:
        check(number(r[m]) and r[m] >= 0, f"{routing}: {m} = {r[m]!r}")
        check(number(rep["mean"][m]) and rep["mean"][m] == r[m], f"{routing}: mean {m} is not the one run's value")
        check(rep["std"][m] == 0, f"{routing}: std of one run must be 0")
    check(r["time_per_microbatch_s"] > 0 and r["throughput"] > 0, f"{routing}: nothing trained: {r}")
    check(r["wasted_compute_on_crashed_s"] <= r["wasted_compute_s"] + 1e-9, f"{routing}: waste split {r}")
    # 2 microbatches per iteration, 1 data node: never more than that
    check(r["throughput"] <= 2, f"{routing}: throughput {r['throughput']} above the 2 microbatches per iteration")


def main():
    with tempfile.TemporaryDirectory(prefix="gwtf-experiment-test-") as tmp:
        try:
            for bad in ("1", "-0.1", "abc"):
                p = subprocess.run([GWTF, "experiment", "--scenario", SCENARIO, "--churn", bad],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
                check(p.returncode == 2 and "--churn" in p.stderr, f"--churn {bad}: exit {p.returncode} {p.stderr}")
            reps = {"gwtf": run("gwtf", tmp, churned_copy(tmp), "--churn", "0"), "swarm": run("swarm", tmp)}
            for r, rep in reps.items():
                check_report(r, rep)
            check(reps["gwtf"]["churn"] == 0 and reps["gwtf"]["runs"][0]["crashes"] == 0,
                  f"gwtf: --churn 0 did not replace the scenario's 0.5: churn {reps['gwtf']['churn']}, "
                  f"crashes {reps['gwtf']['runs'][0]['crashes']}")
            g = reps["gwtf"]["runs"][0]
            check(g["flows"] >= 1, f"gwtf: no flows reported: {g}")
            # null until a probe has measured every flow's path
            check(g["flows_cost"] is None or g["flows_cost"] > 0, f"gwtf: bad flow cost: {g}")
            check(g["optimal_flows"] >= 1 and number(g["optimal_cost"]) and g["optimal_cost"] > 0,
                  f"gwtf: no optimum computed for the measured links: {g}")
            print(f"gwtf: {reps['gwtf']['mean']}\nswarm: {reps['swarm']['mean']}\n"
                  f"flows {g['flows']} cost {g['flows_cost']}, optimum {g['optimal_flows']} cost {g['optimal_cost']:.1f}")
        except Failure as e:
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
