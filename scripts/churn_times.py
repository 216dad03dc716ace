#!/usr/bin/env python3
"""Failure handling times from `gwtf swarm` logs (swarm.log of each run of a
`gwtf experiment --workdir DIR`): iteration times after the first (the
slowest data node's), backward repairs (backward.recovered secs:
from the origin's first recovery_started to the microbatch complete, and
its parts find_s, to the first REPAIR taken on, and rebuild_s, from the last
one to the completion; and to the gradient flowing again, backward.resumed, when the log names its origin),
forward re-routes after a lost next hop (from the first sign of the loss at
the re-routing peer: its session dropping, peer.lost, or its probe going
unanswered, to forward.rerouted), how peers were declared failed, and
how long a relay restarted under churn (a new identity: its data dir is not
NAME.0) took from its start (node.listening) to finding the run
(run.found), being placed (stage.assigned), ready (peer.ready) and its
first forward (compute.done kind=forward). And how long a gradient waited at
the peer after a gap (from its own backward, or a data node's loss, to
backward.resumed; 0 when the gap was mended before it was due,
backward.rebuilt_ahead): what a break cost the microbatch.

    scripts/churn_times.py DIR [DIR...]      # one line per DIR, and all of them
    scripts/churn_times.py --json DIR...
"""
import glob
import json
import os
import re
import sys
from datetime import datetime

LINE = re.compile(r"^(\S+)\s+\|\s+(\d\d:\d\d:\d\d\.\d+)Z\s+\S+\s+(\S+)\s+\S+\s+(\S+)\s*(.*)$")


def ms(t):
    d = datetime.strptime(t, "%H:%M:%S.%f")
    return ((d.hour * 60 + d.minute) * 60 + d.second) * 1000.0 + d.microsecond / 1000.0


def kv(rest):
    return dict(p.split("=", 1) for p in rest.split() if "=" in p)


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


REJOIN_STEPS = (("run.found", "found"), ("stage.assigned", "assigned"), ("peer.ready", "ready"))


def rejoin_event(rejoins, node, ev, rest, t):
    """Notes the steps of restarted relays (rejoins: node id -> step -> ms)."""
    if ev == "node.listening":
        data_dir = kv(rest).get("data_dir", "")
        if data_dir and not data_dir.endswith(".0"):
            rejoins[node] = {"start": t}
        return
    steps = rejoins.get(node)
    if steps is None:
        return
    for name, step in REJOIN_STEPS:
        if ev == name:
            steps.setdefault(step, t)
    if ev == "compute.done" and kv(rest).get("kind") == "forward":
        steps.setdefault("work", t)


def scan(log):
    repairs, reroute_after, known = [], [], {}
    rejoins = {}
    parts = {"find_s": [], "rebuild_s": []}  # backward.recovered's breakdown (newer logs)
    started, resumed = {}, []  # (origin, mb) -> recovery_started; resumed after it (s)
    due, held = {}, []  # (node, mb) -> its gradient ready to go upstream; how long it waited at a gap (s)
    iters = {}  # iteration -> the slowest data node's secs
    counts = {"presumed_dead": 0, "presumed_dead_probe": 0, "probes": 0, "probes_unanswered": 0, "peer_slow": 0,
              "fallbacks": 0, "deny_full": 0}
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            who, t, node, ev, rest = m.group(1), ms(m.group(2)), m.group(3), m.group(4), m.group(5)
            a = kv(rest)
            rejoin_event(rejoins, node, ev, rest, t)
            if ev == "iteration.done" and "secs" in a and a.get("iter", "0") != "0":
                iters[a["iter"]] = max(iters.get(a["iter"], 0.0), float(a["secs"]))
            elif ev == "backward.recovered" and "secs" in a:
                repairs.append(float(a["secs"]))
                for k in parts:
                    if k in a:
                        parts[k].append(float(a[k]))
            elif ev == "compute.done" and a.get("kind") in ("backward", "loss"):
                due[(node, a.get("mb", ""))] = t
            elif ev == "backward.rebuilt_ahead":
                held.append(0.0)
            elif ev == "backward.recovery_started" and "mb" in a:
                started[(node, a["mb"])] = t
            elif ev == "backward.resumed":
                if (node, a.get("mb", "")) in due:
                    held.append((t - due[(node, a.get("mb", ""))]) / 1000.0)
                k = (a.get("origin"), a.get("mb", ""))
                if "origin" not in a:  # older logs: the latest repair of that microbatch id
                    ks = [x for x in started if x[1] == k[1] and started[x] <= t]
                    k = max(ks, key=lambda x: started[x]) if ks else None
                if k in started:
                    resumed.append((t - started.pop(k)) / 1000.0)
            elif ev == "peer.lost" and "peer" in a:
                known.setdefault((who, a["peer"].strip('"')), t)
            elif ev == "peer.probe_unanswered":
                counts["probes_unanswered"] += 1
                known.setdefault((who, a.get("peer", "")), t)
            elif ev == "peer.suspected":
                counts["probes"] += 1
            elif ev == "peer.slow":
                counts["peer_slow"] += 1
            elif ev == "peer.presumed_dead":
                counts["presumed_dead"] += 1
                counts["presumed_dead_probe"] += a.get("reason") == "probe"
            elif ev == "route.fallback":
                counts["fallbacks"] += 1
            elif ev == "deny.received" and a.get("reason") == "full":
                counts["deny_full"] += 1
            elif ev == "forward.rerouted" and a.get("reason") in ("peer_lost", "timeout", "probe", "session_lost"):
                k = (who, a.get("from_peer", ""))
                if k in known:
                    reroute_after.append(t - known[k])
    # seconds from the start to each step, of the restarts that got ready
    rejoin = {step: [(s[step] - s["start"]) / 1000.0 for s in rejoins.values() if step in s and "ready" in s]
              for step in ("found", "assigned", "ready", "work")}
    return repairs, resumed, reroute_after, counts, list(iters.values()), parts, rejoin, held


def summary(dirs):
    repairs, resumes, reroutes, counts, its, helds = [], [], [], {}, [], []
    parts = {"find_s": [], "rebuild_s": []}
    rejoin = {"found": [], "assigned": [], "ready": [], "work": []}
    for d in dirs:
        for log in sorted(glob.glob(os.path.join(d, "**", "swarm.log"), recursive=True)):
            r, u, f, c, i, b, j, h = scan(log)
            its += i
            helds += h
            for k in rejoin:
                rejoin[k] += j[k]
            for k in parts:
                parts[k] += b[k]
            repairs += r
            resumes += u
            reroutes += f
            for k, v in c.items():
                counts[k] = counts.get(k, 0) + v
    return {
        "repairs": len(repairs),
        "repair_median_s": pct(repairs, 0.5),
        "repair_p95_s": pct(repairs, 0.95),
        "repair_max_s": max(repairs) if repairs else None,
        "repair_find_median_s": pct(parts["find_s"], 0.5),
        "repair_rebuild_median_s": pct(parts["rebuild_s"], 0.5),
        "iterations": len(its),
        "iteration_median_s": pct(its, 0.5),
        "iteration_p90_s": pct(its, 0.9),
        "resumed": len(resumes),
        "resumed_median_s": pct(resumes, 0.5),
        "resumed_p95_s": pct(resumes, 0.95),
        "held": len(helds),
        "held_median_s": pct(helds, 0.5),
        "held_p95_s": pct(helds, 0.95),
        "held_mean_s": sum(helds) / len(helds) if helds else None,
        "reroutes_after_loss": len(reroutes),
        "reroute_median_ms": pct(reroutes, 0.5),
        "reroute_p95_ms": pct(reroutes, 0.95),
        "rejoins": len(rejoin["ready"]),
        **{f"rejoin_{k}_median_s": pct(v, 0.5) for k, v in rejoin.items()},
        **counts,
    }


def fmt(x, f="%.3f"):
    return "-" if x is None else f % x


def main(argv):
    as_json = "--json" in argv
    dirs = [a for a in argv if a != "--json"]
    if not dirs:
        print(__doc__, file=sys.stderr)
        return 2
    rows = {d: summary([d]) for d in dirs}
    if len(dirs) > 1:
        rows["all"] = summary(dirs)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    for d, s in rows.items():
        print("%s: iterations %d median %s s p90 %s s; repairs %d median %s s p95 %s s max %s s (finding the peer before the gap: median %s s; from there to the end: median %s s; to the gradient flowing again: %d, median %s s, p95 %s s); re-routes after a loss %d median %s ms p95 %s ms; "
              "presumed dead %d (by probe %d), probes %d unanswered %d, slow %d, fallbacks %d, DENY full %d" %
              (d, s["iterations"], fmt(s["iteration_median_s"], "%.2f"), fmt(s["iteration_p90_s"], "%.2f"),
               s["repairs"], fmt(s["repair_median_s"]), fmt(s["repair_p95_s"]), fmt(s["repair_max_s"]),
               fmt(s["repair_find_median_s"]), fmt(s["repair_rebuild_median_s"]),
               s["resumed"], fmt(s["resumed_median_s"]), fmt(s["resumed_p95_s"]),
               s["reroutes_after_loss"], fmt(s["reroute_median_ms"], "%.0f"), fmt(s["reroute_p95_ms"], "%.0f"),
               s["presumed_dead"], s["presumed_dead_probe"], s["probes"], s["probes_unanswered"], s["peer_slow"],
               s["fallbacks"], s["deny_full"]))
        print("%s: gradients held at a gap %d, median %s s, p95 %s s, mean %s s" %
              (d, s["held"], fmt(s["held_median_s"]), fmt(s["held_p95_s"]), fmt(s["held_mean_s"])))
        print("%s: rejoins %d, from the restart, median: run found %s s, placed %s s, ready %s s, first forward %s s" %
              (d, s["rejoins"], fmt(s["rejoin_found_median_s"], "%.2f"), fmt(s["rejoin_assigned_median_s"], "%.2f"),
               fmt(s["rejoin_ready_median_s"], "%.2f"), fmt(s["rejoin_work_median_s"], "%.2f")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
