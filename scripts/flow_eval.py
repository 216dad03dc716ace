#!/usr/bin/env python3
"""scripts/flow_eval.py — the Fig. 7 comparison: gwtf vs the exact optimum vs greedy.

For every Table V setting and seed it generates the instance with
`gwtf sim gen`, routes it with `gwtf sim flow` (gwtf with objective sum,
optimal where there is one data node, greedy) and prints per-setting means:
flows found, total cost, cost per flow, gwtf's gap to the optimum, gwtf's
advantage over greedy, rounds and messages to converge.

  scripts/flow_eval.py [--gwtf build/node/gwtf] [--seeds 20] [--settings 1,2,3,4,5,6]
                       [--rounds 120] [--objective sum] [--markdown] [--extra ARGS]
  scripts/flow_eval.py --crash 0.1 [--crash-round 60] ...   recovery after crashing relays

With --crash F it instead runs gwtf to --crash-round, crashes the fraction F
of the relays that carry the most flows, runs on to --rounds and reports how
many rounds the flows took to come back: to the pre-crash count (or the most
the survivors allow when that is fewer), and to within 2% of the surviving
graph's optimum (its count and, with one data node, its cost). Once as
process crashes the transport reports to the crashed node's session
partners (--crash-notice on), once as silent machine losses that the flow
layer must detect alone (off); both by default.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def bottleneck(flows, link):
    """The costliest link any flow uses (what the max objective minimises)."""
    return max((max(link[(f["path"][i], f["path"][i + 1])] for i in range(len(f["path"]) - 1)) for f in flows),
               default=0)


def busiest(flows, n):
    load = {}
    for f in flows:
        for node in f["path"][1:-1]:
            load[node] = load.get(node, 0) + 1
    return [node for node, _ in sorted(load.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def crash_runs(a, k, seed, tmp, notice):
    """One crash run: gwtf to --crash-round, then the busiest relays crash."""
    inst = os.path.join(tmp, f"c{k}-{seed}.json")
    if not os.path.exists(inst):
        subprocess.run([a.gwtf, "sim", "gen", "--setting", str(k), "--seed", str(seed), "--out", inst], check=True)
    relays = sum(1 for n in json.load(open(inst))["nodes"] if n["stage"] > 0)
    n_crash = max(1, round(a.crash * relays))
    base = [a.gwtf, "sim", "flow", "--instance", inst, "--json", "--algo", "gwtf", "--objective", a.objective,
            "--seed", str(seed)] + a.extra.split()
    pre = run(base + ["--rounds", str(a.crash_round)])
    crash = []
    for node in busiest(pre["flows"], n_crash):
        crash += ["--crash", f"{a.crash_round}:{node}"]
    post = run(base + ["--rounds", str(a.rounds), "--trace"] + crash + (["--crash-notice"] if notice else []))
    return n_crash, pre, post


def mean_max(xs, n):
    """'runs: mean / max' of the runs that got there."""
    return f"{len(xs)}/{n}: {statistics.mean(xs):.1f} / {max(xs)}" if xs else f"0/{n}"


def crash_table(a):
    hdr = ("setting", "crashed relays", "flows before", "flows after", "optimum after (flows/cost)",
           "detection rounds (mean/max)", "back to pre-crash count: runs, rounds (mean/max)",
           "within 2% of the new optimum: runs, rounds (mean/max)", "messages per round after", "false alarms")
    modes = {"on": [True], "off": [False], "both": [True, False]}[a.crash_notice]
    with tempfile.TemporaryDirectory() as tmp:
        for notice in modes:
            lines = []
            for k in [int(x) for x in a.settings.split(",")]:
                rec, opt_rec, det, det_max = [], [], [], 0
                before = after = opt_flows = opt_cost = n_opt_cost = n_crash = false = 0
                msg_rate = 0.0
                for seed in range(1, a.seeds + 1):
                    n_crash, pre, post = crash_runs(a, k, seed, tmp, notice)
                    before += pre["num_flows"]
                    after += post["num_flows"]
                    opt_flows += post.get("optimum_flows") or 0
                    if post.get("optimum_cost") is not None:
                        opt_cost += post["optimum_cost"]
                        n_opt_cost += 1
                    t = post["trace"]
                    msg_rate += (t[-1]["messages"] - t[a.crash_round - 1]["messages"]) / (len(t) - a.crash_round)
                    if post.get("recovered_round") is not None:
                        rec.append(post["recovered_round"] - a.crash_round)
                    if post.get("recovered_optimal_round") is not None:
                        opt_rec.append(post["recovered_optimal_round"] - a.crash_round)
                    if post.get("detections"):
                        tick = 2000.0  # the default tick_ms: a round
                        det.append(post["detect_mean_ms"] / tick)
                        det_max = max(det_max, post["detect_max_ms"] / tick)
                    false += post.get("false_alarms", 0)
                n = a.seeds
                opt = f"{opt_flows/n:.1f}/" + (f"{opt_cost/n_opt_cost:.1f}" if n_opt_cost == n else "-")
                lines.append((str(k), str(n_crash), f"{before/n:.1f}", f"{after/n:.1f}", opt,
                              f"{statistics.mean(det):.1f} / {det_max:.1f}" if det else "-", mean_max(rec, n),
                              mean_max(opt_rec, n), f"{msg_rate/n:.0f}", str(false)))
            print("process crash (the transport notices)" if notice else
                  "silent machine loss (the flow layer detects it alone)")
            print()
            show(hdr, lines, a.markdown)
            print()
    return 0


def show(hdr, lines, markdown):
    """Prints a table as aligned text or as Markdown."""
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for l in lines:
            print("| " + " | ".join(l) + " |")
    else:
        w = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
        for l in lines:
            print("  ".join(x.ljust(w[i]) for i, x in enumerate(l)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--gwtf", default=os.path.join(here, "..", "build", "node", "gwtf"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--settings", default="1,2,3,4,5,6")
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--objective", default="sum")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--extra", default="", help="more flags for the gwtf run")
    ap.add_argument("--crash", type=float, default=0, help="fraction of relays to crash")
    ap.add_argument("--crash-round", type=int, default=60)
    ap.add_argument("--crash-notice", choices=("both", "on", "off"), default="both",
                    help="on: crashes are process crashes the transport reports (gwtf sim flow --crash-notice); "
                         "off: silent machine losses; both: one table each")
    a = ap.parse_args()
    if a.crash > 0:
        return crash_table(a)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in [int(x) for x in a.settings.split(",")]:
            acc = {"n": 0, "opt_flows": 0, "gw_flows": 0, "gr_flows": 0, "opt_cost": 0.0, "gw_cost": 0.0,
                   "gr_cost": 0.0, "gw_cpf": 0.0, "gr_cpf": 0.0, "opt_cpf": 0.0, "flows_match": 0, "rounds": 0,
                   "msgs": 0, "settle": 0, "smsgs": 0, "gap": [], "adv": [], "gw_bn": 0, "gr_bn": 0}
            has_opt = k <= 4
            for seed in range(1, a.seeds + 1):
                inst = os.path.join(tmp, f"s{k}-{seed}.json")
                subprocess.run([a.gwtf, "sim", "gen", "--setting", str(k), "--seed", str(seed), "--out", inst],
                               check=True)
                base = [a.gwtf, "sim", "flow", "--instance", inst, "--json"]
                gw = run(base + ["--algo", "gwtf", "--objective", a.objective, "--rounds", str(a.rounds), "--seed",
                                 str(seed), "--trace"] + a.extra.split())
                gr = run(base + ["--algo", "greedy"])
                link = {(l["from"], l["to"]): l["cost"] for l in json.load(open(inst))["links"]}
                acc["gw_bn"] += bottleneck(gw["flows"], link)
                acc["gr_bn"] += bottleneck(gr["flows"], link)
                acc["n"] += 1
                acc["gw_flows"] += gw["num_flows"]
                acc["gr_flows"] += gr["num_flows"]
                acc["gw_cost"] += gw["total_cost"]
                acc["gr_cost"] += gr["total_cost"]
                gw_cpf = gw["total_cost"] / max(gw["num_flows"], 1)
                gr_cpf = gr["total_cost"] / max(gr["num_flows"], 1)
                acc["gw_cpf"] += gw_cpf
                acc["gr_cpf"] += gr_cpf
                acc["adv"].append((gr_cpf - gw_cpf) / gr_cpf)
                acc["rounds"] += gw["converged_round"]
                acc["msgs"] += gw["messages_to_converge"]
                acc["settle"] += gw["settled_round"]
                acc["smsgs"] += gw["messages_to_settle"]
                if has_opt:
                    op = run(base + ["--algo", "optimal"])
                    acc["opt_flows"] += op["num_flows"]
                    acc["opt_cost"] += op["total_cost"]
                    acc["opt_cpf"] += op["total_cost"] / max(op["num_flows"], 1)
                    acc["flows_match"] += op["num_flows"] == gw["num_flows"]
                    acc["gap"].append((gw["total_cost"] - op["total_cost"]) / op["total_cost"])
            rows.append((k, has_opt, acc))
    n = a.seeds
    hdr = ("setting", "flows opt/gwtf/greedy", "flows=opt", "cost opt", "cost gwtf", "cost greedy",
           "gwtf vs opt", "worst gap", "per flow gwtf/greedy", "gwtf better", "bottleneck gwtf/greedy",
           "settled (rounds/msgs)", "last change (rounds/msgs)")
    lines = []
    for k, has_opt, acc in rows:
        opt_f = f"{acc['opt_flows']/n:.1f}" if has_opt else "-"
        lines.append((str(k), f"{opt_f}/{acc['gw_flows']/n:.1f}/{acc['gr_flows']/n:.1f}",
                      f"{acc['flows_match']}/{n}" if has_opt else "-",
                      f"{acc['opt_cost']/n:.1f}" if has_opt else "-", f"{acc['gw_cost']/n:.1f}",
                      f"{acc['gr_cost']/n:.1f}",
                      f"+{100*sum(acc['gap'])/n:.2f}%" if has_opt else "-",
                      f"+{100*max(acc['gap']):.2f}%" if has_opt else "-",
                      f"{acc['gw_cpf']/n:.2f}/{acc['gr_cpf']/n:.2f}", f"{100*sum(acc['adv'])/n:.1f}%",
                      f"{acc['gw_bn']/n:.1f}/{acc['gr_bn']/n:.1f}",
                      f"{acc['settle']/n:.1f} / {acc['smsgs']/n:.0f}", f"{acc['rounds']/n:.1f} / {acc['msgs']/n:.0f}"))
    show(hdr, lines, a.markdown)


if __name__ == "__main__":
    sys.exit(main())
