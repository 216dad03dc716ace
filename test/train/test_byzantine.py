#!/usr/bin/env python3
"""A swarm with a hostile relay (`gwtf swarm --byzantine 1:MODE`): for each of
the modes nan, scale=100, random and wrong-shape, one relay corrupts the
gradient it contributes to its stage's aggregation. With the aggregators'
checks on, training still converges (the median loss of the last three
iterations within a few % of the honest run's: `gwtf train-ref` on the same
microbatches), the honest peers of every stage agree on their weights after
every aggregation, and a NaN or wrong-shape relay is rejected
(agg.rejected) and banned (run.banned); scale and random are rejected where
their aggregator has a median of three to compare them with, and clipped
where it has less (see ALWAYS_CAUGHT).
With the checks off (--no-validate-contributions)
nothing is rejected and the nan run diverges: that is what the defence
saves. (wrong-shape is not run without checks: a vector of the wrong length
is then ignored, not averaged.) A relay that lies about its costs
(lying-costs: ~0 ms of compute in HELLO) has its claim raised by its
neighbours (flow.cost_claim_clamped), and no honest peer's ever is, nor are
anyone's flow messages rate-limited.

All scenarios run in this one process, one swarm at a time, each on its own
port block (below test_swarm.py's and test_experiment.py's). Relays hold
two microbatches at once (--capacity 2), so the four of an iteration spread
over the relays of a stage and the hostile one has a gradient to corrupt."""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_swarm import GWTF, Failure, check, parse_log  # noqa: E402

ITERS = 12
# The learning rate of every run here and of the honest reference. At the
# swarm's default (1e-3) this model's own training spikes at iteration 8 for
# half the data seeds (`gwtf train-ref --data-seed 1002..1006`: 3.84 -> 4.35 ..
# 6.06 -> 3.60; no peer, no hostile), and a hostile run, whose stage
# averages leave out a few microbatches, follows another trajectory that
# spikes or not: that, not the defence, failed this test (a nan run's loss
# 3.54 -> 6.76 -> 4.52 in the last three iterations). At 5e-4 no seed of the
# eight spikes and the hostile runs track the honest loss to 1-2 %.
LR = "5e-4"
BASE_PORT = 25000  # one block of 100 per run (8 peers): 25000..25899, clear of test_swarm.py and test_web_browser.py
MODES = ["nan", "scale=100", "random", "wrong-shape"]
# Unchecked, NaN diverges at once: the run shows the checks are off (nothing
# rejected) and what they save. scale=100 and random are not run unchecked:
# they do not diverge within a dozen iterations (AdamW divides each
# coordinate by its running RMS, so a stage whose average is ~50x larger
# takes nearly the same steps, and one whose average is noise random-walks by
# lr per step), so their runs asserted nothing the nan run does not, and cost
# the suite about 45 s (two swarms, in the plain and in the ASan build).
DIVERGING = ["nan"]
UNCHECKED = ["nan"]
# the loss with a hostile relay (median of the last LAST iterations), against
# the honest run's over the same iterations
LAST = 3
TOLERANCE = 0.06
# without the checks: the loss is not a number, or this much worse than honest
DIVERGED = 1.25


# A NaN or a wrong length is refused wherever it lands. A finite gradient is
# rejected by its norm only against the round's median of three or more;
# against the aggregator's own or past rounds' it is clipped (agg.clipped),
# and an aggregator that took no microbatch itself, with the hostile one its
# only contributor and no round compared before, has nothing to hold it to
# (docs/TRAINING.md, known limits). Where the flows put the hostile relay decides that, so for scale
# and random this test asserts convergence and agreement, and prints the
# rejections; test_peer_trust asserts them deterministically.
ALWAYS_CAUGHT = ("nan", "wrong-shape")


def swarm(tmp, n, *args):
    summary = os.path.join(tmp, f"summary{n}.json")
    cmd = [GWTF, "swarm", "--dataset", os.path.join(tmp, "corpus.txt"), "--summary-json", summary,
           "--base-port", str(BASE_PORT + 100 * n), "--workdir", os.path.join(tmp, f"peers{n}"),
           "--relays", "7", "--stages", "3", "--iterations", str(ITERS), "--capacity", "2", "--lr", LR, *args]
    print("$", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise Failure(f"gwtf swarm {' '.join(args)} did not finish in 300 s")
    with open(os.path.join(tmp, "swarm.log"), "w") as f:
        f.write(p.stdout)
    check(p.returncode == 0, f"gwtf swarm exited {p.returncode}")
    with open(summary) as f:
        return json.load(f), parse_log(p.stdout)


def last_loss(summary):
    """The median loss of the last LAST iterations (None if one is missing).
    A median, because one iteration's loss can jump: the ban is the hostile
    relay's aggregator's alone, so the relay goes on carrying microbatches,
    and what a relay on a microbatch's path computes is not checked
    (docs/TRAINING.md)."""
    its = summary["iterations"]
    check(len(its) >= ITERS, f"{len(its)} iterations completed, wanted {ITERS}")
    ls = [it["loss"] for it in its[-LAST:]]
    return None if any(x is None for x in ls) else sorted(ls)[LAST // 2]


def hostile(ev):
    """--byzantine 1:MODE makes the last of the seven relays hostile: r6,
    which joins after six honest ones filled the three stages two by two,
    so its stage always has an honest aggregator."""
    ids = {e["node"] for e in ev if e["name"] == "r6" and re.fullmatch(r"[0-9a-f]{8}", e["node"])}
    check(len(ids) == 1, f"r6 logged as {ids}, wanted one node ID")
    bad = ids.pop()
    check(bad.startswith("ff"), f"the hostile relay's ID {bad} does not start with ff")
    return "r6", bad


def honest_hashes_agree(ev, bad_name):
    seen = {}
    for e in ev:
        if e["event"] == "aggregation.done" and e["name"] != bad_name:
            seen.setdefault((e["stage"], e["f"]["iter"]), set()).add(e["f"]["hash"])
    split = {k: v for k, v in seen.items() if len(v) > 1}
    check(seen, "no aggregation was logged")
    check(not split, f"honest peers disagreed after aggregating: {split}")


def main():
    with tempfile.TemporaryDirectory(prefix="gwtf-byz-test-") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        subprocess.run([GWTF, "data", "synth", "--out", corpus, "--bytes", "1000000", "--seed", "1"], check=True,
                       stderr=subprocess.DEVNULL)
        ref = subprocess.run([GWTF, "train-ref", "--dataset", corpus, "--iterations", str(ITERS), "--data-seed",
                              "1000", "--lr", LR, "--json"], stdout=subprocess.PIPE, text=True, check=True)
        honest = sorted(it["loss"] for it in json.loads(ref.stdout)["iterations"][-LAST:])[LAST // 2]
        try:
            n = 0
            for mode in MODES:
                s, ev = swarm(tmp, n, "--byzantine", f"1:{mode}")
                n += 1
                name, bad = hostile(ev)
                loss = last_loss(s)
                check(loss is not None and abs(loss - honest) <= TOLERANCE * honest,
                      f"{mode}: loss (median of last 3) {loss}, honest {honest:.4f}")
                honest_hashes_agree(ev, name)
                check(s["unexpected_exits"] == 0, f"{mode}: a peer exited abnormally")
                rejected = [e for e in ev if e["event"] == "agg.rejected" and e["f"].get("peer") == bad]
                banned = [e for e in ev if e["event"] == "run.banned" and e["f"].get("peer") == bad]
                told = [e for e in ev if e["event"] == "run.banned_by" and e["name"] == name]
                if mode in ALWAYS_CAUGHT:
                    check(rejected, f"{mode}: {name} ({bad}) was never rejected")
                    check(banned, f"{mode}: {name} ({bad}) was never banned")
                    check(told, f"{mode}: {name} ({bad}) was banned and never told (run.banned_by)")
                cut = [(e["name"], e["event"], e["rest"].strip()) for e in ev
                       if e["event"] in ("flow.cost_claim_clamped", "flow.rate_limited")]
                check(not cut, f"{mode}: an honest peer's costs were clamped or its flow messages cut: {cut}")
                how = (f"rejected {len(rejected)}x ({rejected[0]['f']['reason']}), "
                       f"{'banned' if banned else 'not banned'}") if rejected else "never compared"
                print(f"{mode}: loss (median of last 3) {loss:.4f} (honest {honest:.4f}); {name} {how}; "
                      f"honest hashes agree", flush=True)
            # lying about costs: it claims ~0 compute in HELLO; every neighbour
            # that hears it and its honest stage-mates raises the claim. A
            # claim is compared when it arrives, with the stage-mates' last
            # claims (0 until they computed): the run must last a few HELLO
            # periods (2 s), which 12 fast iterations did not always do.
            s, ev = swarm(tmp, n, "--byzantine", "1:lying-costs", "--slowdown", "4")
            n += 1
            name, bad = hostile(ev)
            loss = last_loss(s)
            clamped = [e for e in ev if e["event"] == "flow.cost_claim_clamped"]
            check(clamped, "lying-costs: no claim was clamped")
            check(all(e["f"]["peer"] == bad for e in clamped),
                  f"lying-costs: honest claims clamped: {[e['f']['peer'] for e in clamped]}")
            check(loss is not None and abs(loss - honest) <= TOLERANCE * honest,
                  f"lying-costs: loss (median of last 3) {loss}, honest {honest:.4f}")
            print(f"lying-costs: {len(clamped)} neighbours clamped {name}'s claim "
                  f"({clamped[0]['f']['claimed_ms']} ms -> {clamped[0]['f']['used_ms']} ms); "
                  f"loss (median of last 3) {loss:.4f}", flush=True)
            for mode in UNCHECKED:
                s, ev = swarm(tmp, n, "--byzantine", f"1:{mode}", "--no-validate-contributions")
                n += 1
                loss = last_loss(s)
                check(not any(e["event"] in ("agg.rejected", "run.banned") for e in ev),
                      f"{mode} without checks: a contribution was still rejected")
                diverged = loss is None or not math.isfinite(loss) or loss <= 0.0 or loss > DIVERGED * honest
                if mode in DIVERGING:
                    check(diverged, f"{mode} without checks: loss (median of last 3) {loss} did not diverge "
                                    f"(honest {honest:.4f})")
                print(f"{mode} without checks: loss (median of last 3) {loss} (honest {honest:.4f}): "
                      f"{'diverged' if diverged else 'not diverged'}", flush=True)
        except Failure as e:
            log = os.path.join(tmp, "swarm.log")
            if os.path.exists(log):
                text = open(log).read()
                kept = os.path.abspath("swarm-byzantine-failed.log")
                with open(kept, "w") as f:
                    f.write(text)
                print("\n".join(text.splitlines()[-40:]), file=sys.stderr)
                print(f"the whole log: {kept}", file=sys.stderr)
            print(f"FAILED: {e}", file=sys.stderr)  # last: CI shows a failed test's final lines only
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
