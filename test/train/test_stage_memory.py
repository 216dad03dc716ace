#!/usr/bin/env python3
"""`gwtf node --create-run` prints each stage's memory (run.stage_memory) and
--stage-memory-mb picks the fewest stages whose even split fits, or refuses
(issue 20). Model `small` (6 blocks of ~28 MB of state each) keeps it light.

The budgets are derived from what the node itself logs for 3 and 6 stages
(2 and 1 blocks a stage), so the test follows the estimator, not constants."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node"))
from gwtfproc import Swarm, check, main  # noqa: E402

SRC = os.environ.get("GWTF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BASE = ["--model", "small", "--dataset", os.path.join(SRC, "README.md"), "--batch", "1", "--seq", "32",
        "--microbatches", "1"]


def create(sw, name, extra):
    n = sw.node(name, ["--create-run", "mem"] + BASE + extra)
    n.start()
    return n


def stage_totals(n, stages):
    """Waits for run.created; returns {stage: total_mb} of the run.stage_memory lines."""
    n.wait("run.created", stages=stages)
    lines = n.find("run.stage_memory")
    check(sorted(int(e["for_stage"]) for e in lines) == list(range(stages + 1)),
          f"{n.name}: run.stage_memory for stages {[e['for_stage'] for e in lines]}, want 0..{stages}")
    for e in lines:
        s = int(e["for_stage"])
        check((e["layers"] == "head") == (s == 0), f"{n.name}: stage {s} layers={e['layers']}")
        parts = float(e["weights_mb"]) + float(e["optimizer_mb"]) + float(e["workspace_mb"]) + \
            int(e["capacity"]) * float(e["activations_mb_per_mb"])
        check(abs(parts - float(e["total_mb"])) < 0.5, f"{n.name}: stage {s} parts {parts} != total {e['total_mb']}")
    n.wait("compute.stage_memory", for_stage=0)
    return {int(e["for_stage"]): float(e["total_mb"]) for e in lines}


def refused(n):
    err = n.wait("train.config")
    n.proc.wait(timeout=20)
    check(n.proc.returncode != 0, f"{n.name}: exit {n.proc.returncode} after {err}")
    check(not n.find("run.created"), f"{n.name}: created a run it refused")
    return err


def test():
    with Swarm() as sw:
        two = stage_totals(create(sw, "even3", ["--stages", "3"]), 3)[1]  # 2 blocks a stage
        check(not sw.nodes[0].find("run.stage_split"), "a run without --stage-memory-mb was split by memory")
        one = stage_totals(create(sw, "even6", ["--stages", "6"]), 6)[1]  # 1 block
        check(one < two, f"one block {one} MB, two {two} MB")
        for n in sw.nodes:
            n.stop()

        # between one and two blocks: the fewest stages is 6
        n = create(sw, "fit6", ["--stage-memory-mb", str(int((one + two) / 2))])
        totals = stage_totals(n, 6)
        n.wait("run.stage_split", stages=6)
        check(max(totals[s] for s in range(1, 7)) <= (one + two) / 2, f"fit6: {totals}")
        n.stop()
        # just above two blocks: 3 stages (2 stages would be 3 blocks, ~28 MB more)
        n = create(sw, "fit3", ["--stage-memory-mb", str(int(two) + 1)])
        stage_totals(n, 3)
        n.wait("run.stage_split", stages=3)
        n.stop()

        err = refused(create(sw, "none", ["--stage-memory-mb", "1"]))
        check("holds no stage" in str(err.get("err")), f"none: {err}")
        err = refused(create(sw, "few", ["--stages", "2", "--stage-memory-mb", str(int(two) + 1)]))
        check("3 stages fit" in str(err.get("err")), f"few: {err}")


if __name__ == "__main__":
    main(test)
