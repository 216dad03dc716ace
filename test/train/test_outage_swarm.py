#!/usr/bin/env python3
"""Outages with real processes (issue 18, item 4): a 3-stage `gwtf swarm`
of one data node and six relays.

    test_outage_swarm.py kill_data_node       (--replicate-every 2)
    test_outage_swarm.py kill_data_node_lost  (--replicate-every 0)
    test_outage_swarm.py kill_fraction        (--kill-fraction 0.5, --replicate-every 2)

kill_data_node: the run's only data node is killed (SIGKILL) in iteration 5
and a fresh one (new identity, empty data dir, same dataset) starts 8 s
later. The relays pause (run.paused reason=no_data_node); the new data node
restores stage 0 from the newest replica the relays hold (the weights hash
the old data node logged at that aggregation), resumes in the relays'
iteration (no microbatch refused as stale or future), at most one
aggregation is lost, the run finishes its iterations and the loss keeps
falling. kill_data_node_lost: without replicas the new data node never
trains stage 0 from fresh weights: it stops naming stage 0 (stage.lost).
kill_fraction: half the relays die at once (restarted with fresh
identities); the run goes on and finishes. Synchronisation is on the log's
events and the swarm's own kills, never on sleeps."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_swarm import Failure, check, ev, keep_log, known, loss_str, scenario_main, swarm_run  # noqa: E402

GWTF = os.environ.get("GWTF_BIN", "gwtf")
# below the ephemeral port range (32768+), in this file's block 26000-26999
PORTS = {"kill_data_node": 26000, "kill_data_node_lost": 26300, "kill_fraction": 26600}
ITERS, KILL_AT = 12, 5


def refused_iterations(events):
    """Microbatches a relay refused for being from another iteration."""
    return [e for e in events if e["f"].get("reason") in ("stale_iteration", "future_iteration")]


def finished_and_falling(s):
    check(len(s["iterations"]) == ITERS, f"{len(s['iterations'])} iterations, wanted {ITERS}")
    check(s["stage_hashes_agree"], "a stage's peers disagreed on their weights")
    check(s["unexpected_exits"] == 0, "a peer exited abnormally")
    ls = [x["loss"] for x in s["iterations"]]
    check(all(x is not None for x in ls), f"an iteration without a loss: {ls}")
    # (one iteration's loss sometimes jumps and heals the next, with or
    # without a kill: TRAINING.md, Known limits)
    # (the kill's own iteration may finish no microbatch: its loss is null)
    after, last = known(ls[KILL_AT + 1:]), known(ls[-3:])
    check(after and last and ls[KILL_AT - 1] is not None and min(after) < ls[KILL_AT - 1] and
          min(last) < ls[0] - 0.5, f"losses {ls}")
    return ls


def kill_data_node(tmp):
    scenario = "kill_data_node"
    # Relays pause after three HELLO periods (6 s) without a data node. The
    # fresh one comes 8 s after the kill, so they have paused by then; with
    # the default 2 s, a fresh node whose record reached them within 6 s
    # (as under CI's load) kept them from pausing and failed the check below.
    rc, s, events, log = run(tmp, scenario, 2, "--kill-data-node", "--replace-after", "8000")
    try:
        check(rc == 0 and s is not None, f"gwtf swarm exited {rc}")
        ls = finished_and_falling(s)
        k = s["data_node_kill"]
        check(k["killed"] and k["peers_killed"] == 1, f"data_node_kill: {k}")
        check(k["secs_to_next_iteration"] is not None, f"no iteration completed after the kill: {k}")
        check(k["restored"] >= 1 and k["iterations_lost"] <= 1 and not k["stage0_lost"], f"data_node_kill: {k}")
        # stage 0 went to 2 relays every 2 aggregations before the kill
        pushed = ev(events, "replica.pushed", stage="0")
        before = sorted({int(e["f"]["iter"]) for e in pushed if int(e["f"]["iter"]) < KILL_AT})
        check(before == [2, 4], f"stage 0 pushed replicas of {before}")
        for it in before:
            to = {e["f"]["to"] for e in pushed if int(e["f"]["iter"]) == it}
            check(len(to) == 2, f"stage 0's replica of iteration {it} went to {to}")
        first = ev(events, "leader.elected")[0]["node"]
        # the relays paused without a data node, and resumed
        paused = ev(events, "run.paused", reason="no_data_node")
        check(paused and all(e["stage"] != "s0" for e in paused), f"run.paused: {[e['node'] for e in paused]}")
        check(ev(events, "run.resumed"), "no relay resumed")
        # a new identity restored stage 0 from the newest replica
        restored = ev(events, "stage.restored", stage="0")
        check(len(restored) == 1 and restored[0]["node"] != first, f"stage.restored stage=0: {restored}")
        r = restored[0]["f"]
        it, run_it = int(r["iter"]), int(r["run_iter"])
        check(run_it == KILL_AT and run_it - it <= 1, f"restored iteration {it} while the run was in {run_it}")
        stored = {e["f"]["hash"] for e in ev(events, "replica.stored", stage="0", iter=str(it))}
        check(r["hash"] in stored, f"restored hash {r['hash']} is not the replica's {stored}")
        logged = {e["f"]["hash"][:16] for e in events if e["event"] == "aggregation.done" and e["stage"] == "s0"
                  and e["node"] == first and int(e["f"]["iter"]) == it - 1}
        check(r["hash"] in logged, f"restored hash {r['hash']}, stage 0 logged {logged} at aggregation {it - 1}")
        # it led the rest of the run, in the relays' iteration
        check(ev(events, "leader.elected", leader=restored[0]["node"]), "the new data node did not become leader")
        started = [int(e["f"]["iter"]) for e in ev(events, "iteration.started") if e["node"] == restored[0]["node"]]
        check(started and started[0] == KILL_AT, f"the new data node started iterations {started[:3]}")
        check(not refused_iterations(events), f"refused as another iteration: {refused_iterations(events)[:2]}")
        check(not ev(events, "stage.reinitialized"), "a stage was re-initialised")
    except Failure:
        keep_log(scenario, log)
        raise
    print(f"{scenario}: stage 0 restored from iteration {it} (run in {run_it}) with hash {r['hash']}; "
          f"{k['secs_to_next_iteration']:.2f} s from the kill to the next completed iteration; losses "
          f"{loss_str(ls)}")


def kill_data_node_lost(tmp):
    scenario = "kill_data_node_lost"
    rc, s, events, log = run(tmp, scenario, 0, "--kill-data-node")
    try:
        check(rc != 0, "the swarm went on without stage 0's state")
        check(not ev(events, "replica.pushed"), "replication was off but a replica was pushed")
        first = ev(events, "leader.elected")[0]["node"]
        lost = ev(events, "stage.lost", stage="0")
        check(lost and lost[0]["node"] != first and "stage 0" in lost[0]["rest"], "no stage.lost naming stage 0")
        check(not ev(events, "stage.restored") and not ev(events, "stage.reinitialized"),
              "stage 0 came back without a replica")
        # nobody trained after the kill
        late = [e for e in events if e["event"] in ("iteration.started", "aggregation.done")
                and int(e["f"]["iter"]) >= KILL_AT]
        check(not late, f"trained after the kill: {late[:1]}")
        check(s is not None and s["data_node_kill"]["stage0_lost"], f"summary: {s and s.get('data_node_kill')}")
    except Failure:
        keep_log(scenario, log)
        raise
    print(f"{scenario}: the new data node stopped (swarm exit {rc}): {lost[0]['rest'].strip()[:160]}")


def kill_fraction(tmp):
    scenario = "kill_fraction"
    rc, s, events, log = run(tmp, scenario, 2, "--kill-fraction", "0.5")
    try:
        check(rc == 0 and s is not None, f"gwtf swarm exited {rc}")
        ls = finished_and_falling(s)
        k = s["fraction_kill"]
        check(k["killed"] and k["peers_killed"] == 3, f"fraction_kill: {k}")
        check(k["secs_to_next_iteration"] is not None, f"no iteration completed after the kill: {k}")
        check(k["lost_stage"] == 0 and k["iterations_lost"] <= 2, f"fraction_kill: {k}")
        check(not ev(events, "stage.reinitialized"), "a stage was re-initialised")
    except Failure:
        keep_log(scenario, log)
        raise
    print(f"{scenario}: {k['peers_killed']} relays killed at once; {k['secs_to_next_iteration']:.2f} s to the next "
          f"completed iteration, {k['restored']} stage(s) restored, {k['iterations_lost']} aggregation(s) lost; "
          f"losses {loss_str(ls)}")


def run(tmp, scenario, every, *kill):
    return swarm_run(tmp, scenario, PORTS[scenario], "--stages", "3", "--relays", "6", "--iterations", str(ITERS),
                     "--replicate-every", str(every), "--replicas", "2", *kill, "--at-iteration", str(KILL_AT))


def main():
    return scenario_main(__doc__, {"kill_data_node": kill_data_node, "kill_data_node_lost": kill_data_node_lost,
                                   "kill_fraction": kill_fraction}, "gwtf-outage-")


if __name__ == "__main__":
    sys.exit(main())
