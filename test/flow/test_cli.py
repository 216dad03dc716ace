#!/usr/bin/env python3
"""`gwtf sim gen|flow|join` from the outside: the issue's JSON formats, valid
flows whose costs are the sums of their links, byte-identical replays, and
clear errors for bad input. Needs GWTF_BIN (set by ctest)."""
import json
import os
import subprocess
import sys
import tempfile

GWTF = os.environ.get("GWTF_BIN", "build/node/gwtf")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run(*args, expect=0):
    p = subprocess.run([GWTF, *args], capture_output=True, text=True, timeout=120)
    check(p.returncode == expect, f"gwtf {' '.join(args)}: exit {p.returncode}, wanted {expect}: {p.stderr.strip()}")
    return p


def check_flows(inst, out, algo):
    keys = ["algo", "objective", "rounds", "messages", "num_flows", "total_cost", "max_flow_cost", "flows"]
    check(list(out.keys())[:len(keys)] == keys, f"{algo}: keys {list(out.keys())}")
    check(out["algo"] == algo, f"{algo}: algo field {out['algo']}")
    cost = {(l["from"], l["to"]): l["cost"] for l in inst["links"]}
    cap = {n["id"]: n["capacity"] for n in inst["nodes"]}
    stage = {n["id"]: n["stage"] for n in inst["nodes"]}
    load = {}
    total, worst = 0.0, 0.0
    for f in out["flows"]:
        p = f["path"]
        check(len(p) == inst["stages"] + 2 and p[0] == p[-1] == f["source"], f"{algo}: path {p}")
        check(all(stage[p[i]] == i for i in range(1, len(p) - 1)), f"{algo}: stages along {p}")
        c = sum(cost[(p[i], p[i + 1])] for i in range(len(p) - 1))
        check(abs(c - f["cost"]) < 1e-6, f"{algo}: flow {p} cost {f['cost']} but links sum to {c}")
        for n in p[:-1]:
            load[n] = load.get(n, 0) + 1
        total += c
        worst = max(worst, c)
    check(all(load[n] <= cap[n] for n in load), f"{algo}: capacity exceeded")
    check(out["num_flows"] == len(out["flows"]), f"{algo}: num_flows")
    check(abs(out["total_cost"] - total) < 1e-6, f"{algo}: total_cost")
    check(abs(out["max_flow_cost"] - worst) < 1e-6, f"{algo}: max_flow_cost")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        inst_path = os.path.join(tmp, "s1.json")
        run("sim", "gen", "--setting", "1", "--seed", "3", "--out", inst_path)
        again = run("sim", "gen", "--setting", "1", "--seed", "3").stdout
        with open(inst_path) as fh:
            text = fh.read()
        check(text == again, "gen: --out and stdout differ")
        inst = json.loads(text)
        check(inst["stages"] == 8 and len(inst["nodes"]) == 41, "gen: setting 1 shape")

        results = {}
        for algo in ["gwtf", "optimal", "greedy"]:
            args = ["sim", "flow", "--instance", inst_path, "--algo", algo, "--json"]
            if algo == "gwtf":
                args += ["--objective", "sum", "--seed", "5"]
            out = run(*args).stdout
            results[algo] = json.loads(out)
            check_flows(inst, results[algo], algo)
            if algo == "gwtf":
                check(run(*args).stdout == out, "gwtf: a seeded run does not replay byte for byte")
        check(results["gwtf"]["num_flows"] == results["optimal"]["num_flows"], "gwtf: fewer flows than the optimum")
        check(results["optimal"]["total_cost"] <= results["gwtf"]["total_cost"] + 1e-9, "optimal is not optimal")
        check(results["gwtf"]["rounds"] == 120 and results["gwtf"]["messages"] > 0, "gwtf: rounds/messages")

        # crashes and the trace
        out = json.loads(run("sim", "flow", "--instance", inst_path, "--algo", "gwtf", "--rounds", "80",
                             "--crash", "40:5", "--crash", "40:6", "--loss", "0.02", "--trace", "--json").stdout)
        check(len(out["trace"]) == 80 and out["last_crash_round"] == 40, "trace: shape")
        check(all(5 not in f["path"] and 6 not in f["path"] for f in out["flows"]), "crashed nodes still carry flows")
        p = run("sim", "flow", "--instance", inst_path, "--algo", "gwtf", "--crash", "3:999", expect=2)
        check("999" in p.stderr, "crash of an unknown node: no clear error")

        # bad input
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as fh:
            fh.write('{"stages": 2, "nodes": [{"id": 0, "stage": 0, "capacity": 1}, {"id": 2, "stage": 2, '
                     '"capacity": 1}], "links": [{"from": 0, "to": 2, "cost": 1}]}')
        p = run("sim", "flow", "--instance", bad, "--algo", "greedy", expect=1)
        check("links[0]" in p.stderr and "stage" in p.stderr, f"bad link: error was {p.stderr!r}")
        with open(bad, "w") as fh:
            fh.write("{ not json")
        p = run("sim", "flow", "--instance", bad, "--algo", "greedy", expect=1)
        check("not valid JSON" in p.stderr, f"broken JSON: error was {p.stderr!r}")
        p = run("sim", "flow", "--instance", os.path.join(tmp, "missing.json"), "--algo", "greedy", expect=1)
        check("missing.json" in p.stderr, "missing file: error does not name it")
        run("sim", "flow", "--instance", inst_path, "--algo", "fastest", expect=2)
        run("sim", "flow", "--instance", inst_path, "--algo", "gwtf", "--loss", "1.5", expect=2)
        run("sim", "flow", "--instance", inst_path, "--algo", "gwtf", "--set", "nonsense=1", expect=2)
        two = os.path.join(tmp, "s5.json")
        run("sim", "gen", "--setting", "5", "--seed", "1", "--out", two)
        p = run("sim", "flow", "--instance", two, "--algo", "optimal", expect=2)
        check("one data node" in p.stderr, "optimal on two data nodes: no clear error")

        # placement
        out = json.loads(run("sim", "join", "--setting", "1", "--seed", "2", "--candidates", "4", "--no-optimal",
                             "--json").stdout)
        methods = [m["method"] for m in out["methods"]]
        check(methods == ["gwtf", "capacity_first", "random"], f"join: methods {methods}")
        check(all(sum(m["per_stage"]) == 4 for m in out["methods"]), "join: every candidate placed")
        check("temp_relay=1.7" in run("help", "sim", "flow").stdout, "help sim flow: no tunables")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all CLI checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
