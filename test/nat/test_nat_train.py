"""Two home PCs behind two different NATs train in the same run, relayed
(issue 16, items 3 and 4), in a small internet of network namespaces
(test/nat/netlab.py).

On the public segment: B, the run's creator and data node (`--create-run`,
model tiny, 3 stages); Q, a training relay; R3 and R4, plain nodes that
only serve relay circuits. Behind their own routers r1 and r2, with no port
mapping (`--port-mapping off`, no miniupnpd): H1 and H2, training relays.
Q joins first and takes stage 1, so H1 and H2 take stages 2 and 3 and are
neighbours: every byte between them has to go through a relay.

Asserted, from the nodes' JSON logs:
  - H1 and H2 log nat.reachability status=private and reserve relays
    (nat.relays relays=ID@ADDR,... with one or two of B, Q, R3, R4);
  - they announce themselves with those relays (stage.announced relays>=1
    private=1, or a re-announcement), H1 and H2 reach each other through a
    circuit (peer.connected ... via=relay), B reaches them (directly: their
    own sessions to B win over relayed ones);
  - training completes ITERS iterations; every iteration has all its
    microbatches done and none deferred; aggregation.done hashes agree
    within each stage (each peer of a stage, and B's view);
  - case "cone": both routers MASQUERADE; then, mid-run, the relay (R3 or
    R4) one private peer reserved on is killed: that peer drops it
    (nat.relay_dropped reason=session-down) and reserves on another public
    peer (nat.relays without it), and training continues to the end;
  - case "punch": both routers MASQUERADE and, like a home router's
    firewall, drop unsolicited SYNs to their WAN address (the "cone" case's
    routers answer them with a reset, which kills a TCP simultaneous open).
    H1 and H2 meet through a relay, then punch a direct connection and move
    their session onto it (nat.direct); every microbatch of every iteration
    is still done, none deferred: nothing was lost in the move;
  - case "symmetric": both routers MASQUERADE --random-fully; the punch
    fails (nat.punch_failed) and the run still trains over the relay.

Needs root, `ip netns` and iptables-legacy: otherwise it prints "SKIPPED:
<why>" and exits 77 (ctest SKIP_RETURN_CODE). No sleeps: every wait is on a
log event, with a deadline.

    test_nat_train.py [cone|punch|symmetric]...   (default: all three)"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import netlab  # noqa: E402
from nsnode import NsNode  # noqa: E402
from gwtfproc import GWTF, check  # noqa: E402

PUBLIC_NET = "11.77.0"
RUN = "natrun"
MICROBATCHES = 4
ITERS = {"cone": 60, "punch": 12, "symmetric": 6}  # cone: long enough to outlive the relay kill (~0.1 s an iteration)
KILL_AFTER_ITER = 3  # cone: the relay dies once this many iterations are done
WAIT = 40.0
COMMON = ["--port-mapping", "off", "--threads", "1", "--flow-tick", "100", "--hop-timeout", "2000",
          "--record-ttl", "20", "--checkpoint-every", "0", "--ping-interval", "1000"]


def short(n):
    return n.id[:8]


def relays_of(ev):
    """nat.relays relays=ID@ADDR,... -> [(short id, addr)]"""
    r = str(ev.get("relays", "-"))
    return [] if r in ("-", "") else [tuple(x.split("@", 1)) for x in r.split(",")]


def run_case(nat, workdir, corpus):
    iters = ITERS[nat]
    t_case = time.monotonic()
    print(f"== {nat}: B (data), Q, R3, R4 public; H1 behind r1, H2 behind r2 ({nat} NAT, no port mapping)")
    nodes = []
    with netlab.Lab(public_net=PUBLIC_NET) as lab:
        r1 = lab.router("r1", nat="symmetric" if nat == "symmetric" else "cone")
        r2 = lab.router("r2", nat="symmetric" if nat == "symmetric" else "cone")
        if nat == "punch":
            for r in (r1, r2):
                r.run([netlab.IPT, "-A", "INPUT", "-i", "wan", "-p", "tcp", "--syn", "-j", "DROP"])
        ns = {name: lab.host(name) for name in ("b", "q", "r3", "r4")}
        ns["h1"] = lab.host("h1", r1)
        ns["h2"] = lab.host("h2", r2)
        d = os.path.join(workdir, nat)
        try:
            b = NsNode("B", d, ns["b"], COMMON + [
                "--create-run", RUN, "--open", "--model", "tiny", "--stages", "3", "--iterations", str(iters),
                "--microbatches", str(MICROBATCHES), "--batch", "4", "--seq", "64", "--dataset", corpus,
                "--data-seed", "1000"]).start()
            nodes.append(b)
            r3 = NsNode("R3", d, ns["r3"], COMMON).start(bootstrap=[b.spec])
            r4 = NsNode("R4", d, ns["r4"], COMMON).start(bootstrap=[b.spec])
            nodes += [r3, r4]
            q = NsNode("Q", d, ns["q"], COMMON + ["--run", RUN, "--capacity", "2"]).start(bootstrap=[b.spec])
            nodes.append(q)
            ev = b.wait("join.placed", peer=short(q), timeout=WAIT)
            print(f"  Q {short(q)} placed in stage {ev['to_stage']}")
            t_private = time.monotonic()
            boot = [b.spec, r3.spec, r4.spec]
            h1 = NsNode("H1", d, ns["h1"], COMMON + ["--run", RUN, "--capacity", "2"]).start(bootstrap=boot)
            h2 = NsNode("H2", d, ns["h2"], COMMON + ["--run", RUN, "--capacity", "2"]).start(bootstrap=boot)
            nodes += [h1, h2]
            public_ids = {short(x): x for x in (b, q, r3, r4)}

            for h, r in ((h1, r1), (h2, r2)):
                ev = h.wait("nat.reachability", timeout=WAIT)
                print(f"  {h.name}: nat.reachability status={ev['status']} addr={ev['addr']} checked_by={ev['checked_by']}")
                check(ev["status"] == "private", f"{h.name} behind {r.name} is {ev['status']}")
                ev = h.wait_where("nat.relays", lambda e: len(relays_of(e)) >= 1)
                rs = relays_of(ev)
                print(f"  {h.name}: nat.relays relays={ev['relays']}")
                for rid, _ in rs:
                    check(rid in public_ids, f"{h.name} reserved on {rid}, not a public peer")
            for h in (h1, h2):
                ev = b.wait("join.placed", peer=short(h), timeout=WAIT)
                print(f"  {h.name} {short(h)} placed in stage {ev['to_stage']}")
            for h in (h1, h2):
                h.wait_where("stage.announced", lambda e: True)
            # H1 and H2 are neighbours (stages 2 and 3): they meet through a relay.
            ev = h1.wait_where("peer.connected", lambda e: e.get("peer") == short(h2))
            check("via" in ev and ev["via"] == "relay", f"H1 reached H2 without a relay: {ev}")
            ev2 = h2.wait_where("peer.connected", lambda e: e.get("peer") == short(h1))
            check(ev2.get("via") == "relay", f"H2 reached H1 without a relay: {ev2}")
            print(f"  H1<->H2: peer.connected via=relay (session {ev['session']}, {ev2['session']})")
            if nat == "punch":
                ev = h1.wait_where("nat.direct", lambda e: e.get("peer") == short(h2))
                print(f"  H1<->H2: nat.direct after_ms={ev.get('after_ms')} addr={ev.get('addr')}")
            elif nat == "symmetric":
                ev = h1.wait_where("nat.punch_failed", lambda e: e.get("peer") == short(h2))
                print(f"  H1<->H2: nat.punch_failed nat={ev.get('nat')} reason={ev.get('reason')}: stays relayed")
            dials = [e for e in b.find("train.dial_via") if e.get("peer") in (short(h1), short(h2))]
            print(f"  B: {len(dials)} train.dial_via lines for H1/H2, e.g. circuit={dials[0]['circuit'] if dials else '-'}")
            first_mb = {}
            for h in (h1, h2):
                ev = h.wait("compute.done", timeout=WAIT)
                first_mb[h.name] = time.monotonic() - t_private
            print(f"  time from start to first microbatch: H1 {first_mb['H1']:.1f}s, H2 {first_mb['H2']:.1f}s")

            killed = None
            if nat == "cone":
                b.wait("iteration.done", count=KILL_AFTER_ITER, timeout=WAIT)
                # kill a relay (not the data node, not a training peer) that one private peer holds
                for h in (h1, h2):
                    cur = [x for x in h.find("nat.relays")][-1]
                    for rid, raddr in relays_of(cur):
                        if rid in (short(r3), short(r4)):
                            killed, victim = public_ids[rid], h
                            break
                    if killed:
                        break
                check(killed is not None, "no private peer holds a reservation on R3 or R4")
                mark = victim.mark()
                before = {r for r, _ in relays_of(victim.find("nat.relays")[-1])}
                done_before = len(b.find("iteration.done"))
                print(f"  killing {killed.name} ({short(killed)}), a relay of {victim.name}, after iteration {done_before}")
                killed.kill9()
                ev = victim.wait_where("nat.relay_dropped", lambda e: e.get("relay") == short(killed), since=mark)
                print(f"  {victim.name}: nat.relay_dropped relay={ev['relay']} reason={ev['reason']}")
                ev = victim.wait_where("nat.relays", lambda e: relays_of(e) and all(r != short(killed) for r, _ in relays_of(e))
                                and any(r not in before for r, _ in relays_of(e)), since=mark)
                check(all(r in public_ids and public_ids[r] is not killed for r, _ in relays_of(ev)),
                      f"{victim.name} re-reserved on {ev['relays']}")
                print(f"  {victim.name}: re-reserved on another public peer, nat.relays relays={ev['relays']}"
                      f" (iteration {len(b.find('iteration.done'))})")
                at_replace = len(b.find("iteration.done"))
                check(b.alive() and at_replace < iters, "the run ended before the relay was replaced: make it longer")

            b.wait("iteration.done", count=iters, timeout=90)
            its = b.find("iteration.done")
            print("  iterations: " + " ".join(f"{e['iter']}:done={e.get('done')},deferred={e.get('deferred')},"
                                             f"secs={e.get('secs')}" for e in its))
            # No microbatch lost: every iteration completes all of its microbatches,
            # except that while a relay is replaced (cone case) an iteration may
            # defer some to the next one (microbatch.deferred), which must then
            # complete them (microbatch.done with the same id).
            done_ids = {e["mb"] for e in b.find("microbatch.done")}
            deferred = [e["mb"] for e in b.find("microbatch.deferred")]
            check(all(m in done_ids for m in deferred), f"deferred microbatches never done: "
                  f"{[m for m in deferred if m not in done_ids]}")
            check(len(done_ids) == sum(int(e.get("done", 0)) for e in its), "microbatch.done and iteration.done disagree")
            for e in its:
                ok = int(e.get("done", 0)) == MICROBATCHES and int(e.get("deferred", 0)) == 0
                if killed is not None and not ok:
                    ok = int(e["iter"]) >= done_before and int(e["iter"]) < iters - 1
                check(ok, f"iteration {e['iter']}: done={e.get('done')} deferred={e.get('deferred')}")
            if nat == "punch":
                lost = [e for h, o in ((h1, h2), (h2, h1)) for e in h.find("peer.lost") if e.get("peer") == short(o)]
                check(not lost, f"the move to the direct path was seen as a lost peer: {lost}")
            if killed is not None:
                print(f"  training continued: iterations {at_replace}..{iters - 1} after the relay was replaced")
            if deferred:
                print(f"  {len(deferred)} microbatches deferred while the relay was replaced, all done later")
            # weights agree within each stage: every aggregation.done of one (iter, stage) has one hash
            hashes = {}
            for n in (b, q, h1, h2):
                for e in n.find("aggregation.done"):
                    hashes.setdefault((int(e["iter"]), int(e.get("stage", -1))), set()).add(e["hash"])
            check(hashes, "no aggregation.done")
            bad = {k: v for k, v in hashes.items() if len(v) != 1}
            check(not bad, f"stage weights disagree: {bad}")
            stages = sorted({s for _, s in hashes})
            print(f"  aggregation.done: {len(hashes)} (iteration, stage) rounds, stages {stages}, one hash each")
            check(stages == [0, 1, 2, 3], f"aggregations seen for stages {stages}")
            # the link costs a private peer measured include its relayed neighbour
            costs = [e for e in h1.find("flow.link_costs") + h2.find("flow.link_costs")]
            rtts = [e for e in h1.find("peer.rtt") if e.get("peer") == short(h2)]
            if rtts:
                print(f"  H1->H2 ({'direct' if nat == 'punch' else 'relayed'}) srtt_ms={rtts[-1]['srtt_ms']}; last costs: "
                      + "; ".join(f"{c.get('to')}" for c in costs[-2:]))
            for n in (h1, h2, q, r3, r4):
                if n is not killed and n.alive():
                    n.stop()
            print(f"== {nat}: PASS in {time.monotonic() - t_case:.1f}s")
        finally:
            for n in nodes:
                if n.alive():
                    n.proc.kill()
                    n.proc.wait()


def main():
    why = netlab.skip_reason()
    if why:
        print(f"SKIPPED: {why}")
        sys.exit(77)
    cases = sys.argv[1:] or ["cone", "punch", "symmetric"]
    workdir = tempfile.mkdtemp(prefix="gwtf-nattrain-")
    try:
        corpus = os.path.join(workdir, "corpus.txt")
        subprocess.run([GWTF, "data", "synth", "--out", corpus, "--bytes", "200000", "--seed", "1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in cases:
            run_case(c, workdir, corpus)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
