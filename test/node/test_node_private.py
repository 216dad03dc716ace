#!/usr/bin/env python3
"""A private run with real `gwtf node` processes (issue 17, item 1).

C creates the private run (one relay stage, so two relays share it). Then:
  - `gwtf invite --uses 3` prints a token; R1 and R2 join with `--join`,
    are certified, placed and train (C's iterations list two relays);
  - `gwtf export --bootstrap` of the live run stops with "pass --run-key"
    without the run's key, and writes the model with it;
  - a node with `--run` but no token finds the run private and stops;
  - a hostile wire client without a certificate (p2p_probe train:KIND, a
    fresh identity each time) is refused at every entry point: JOIN,
    WEIGHTS_REQ and a flow message at C, a FORWARD straight to a relay, a
    GRAD and a HELLO at a stage member: one `run.refused reason=
    no_certificate` per attempt, none of them placed or served, and the
    sessions stay up;
  - R2 restarts with `--run` and no invite: the certificate it kept in its
    data dir lets it in again (no new redemption);
  - an expired invite is refused (`token_expired`), a used-up one too;
  - `gwtf revoke` drops R2: C sends the list on, R1 refuses R2, and C's
    next iterations count one relay;
  - failover: a second data node started with `--run-key` (a copy of the
    creator's key) leads once the creator is killed, and admits a relay
    invited with `gwtf invite --run-key` on its machine; that relay trains,
    and `gwtf revoke` there adds to the creator's list (sequence 2).

usage: test_node_private.py PATH_TO_P2P_PROBE"""

import os
import subprocess
import sys
import time

from gwtfproc import GWTF, TIMEOUT, Swarm, check, main

PROBE = sys.argv[1] if len(sys.argv) > 1 else "p2p_probe"
RUN = "priv"
# --flow-tick 100, the swarms' tick: this test is about who is let in, not
# the flows' pace; at the default 2 s tick the first iteration waited out
# the whole settle time (15 s: the flows count as settled after 6 quiet ticks)
# and the suite with it.
COMMON = ["--model", "tiny", "--threads", "1", "--capacity", "2", "--hop-timeout", "3000", "--record-ttl", "20",
          "--flow-tick", "100"]


def gwtf(*args):
    r = subprocess.run([GWTF, *args], capture_output=True, text=True, timeout=TIMEOUT)
    check(r.returncode == 0, f"gwtf {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout.strip()


def invite(c, *extra):
    return gwtf("invite", "--run", RUN, "--data-dir", c.data_dir, *extra)


def probe(node, kind):
    """A stranger's attempt; returns its short node ID once the node answered its Ping."""
    r = subprocess.run([PROBE, node.addr, node.id, f"train:{kind}"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    check(r.returncode == 0, f"p2p_probe train:{kind}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout.strip()[:8]


def test():
    with Swarm() as s:
        data = os.path.join(s.dir, "data.txt")
        gwtf("data", "synth", "--out", data, "--bytes", "100000")
        c = s.node("c", COMMON + ["--create-run", RUN, "--dataset", data, "--stages", "1", "--iterations", "0",
                                  "--microbatches", "2", "--batch", "2", "--seq", "16"])
        c.start()
        ev = c.wait("run.created")
        check(ev.get("access") == "private", f"--create-run must make a private run: {ev}")
        c.wait("stage.announced")

        token = invite(c, "--uses", "3")
        check(token.startswith("gwtf1:"), f"an invite token, not {token!r}")
        r1 = s.node("r1", COMMON + ["--join", token]).start()
        r2 = s.node("r2", COMMON + ["--join", token]).start()
        for r in (r1, r2):
            r.wait("run.certified", timeout=2 * TIMEOUT)
            r.wait("peer.ready", timeout=2 * TIMEOUT)
            c.wait("run.admitted", peer=r.short)
        c.wait("iteration.done", peers="2", timeout=4 * TIMEOUT)

        # export from the live private run: refused without the run key,
        # written with it (the tool certifies itself with the key)
        key = os.path.join(c.data_dir, "runs", RUN, "run.key")
        out = os.path.join(s.dir, "export")
        base = ["export", "--run", RUN, "--out", out, "--bootstrap", c.spec, "--verify-members", "1",
                "--listen", "127.0.0.1:0", "--timeout-ms", "60000"]
        r = subprocess.run([GWTF, *base], capture_output=True, text=True, timeout=TIMEOUT)
        check(r.returncode == 1 and "pass --run-key" in r.stderr and not os.path.exists(out),
              f"export of a private run without its key: exit {r.returncode}, {r.stderr.strip()[-300:]}")
        r = subprocess.run([GWTF, *base, "--run-key", key], capture_output=True, text=True, timeout=2 * TIMEOUT)
        check(r.returncode == 0 and "export.certified" in r.stderr and
              os.path.exists(os.path.join(out, "model.safetensors")),
              f"export with the run key: exit {r.returncode}, {r.stderr.strip()[-400:]}")
        check(not c.find("run.refused", reason="no_certificate"), "a member refused the certified exporter")

        # without an invite: the run's record says private, the node stops
        n = s.node("n", COMMON + ["--run", RUN]).start(bootstrap=[c.spec])
        n.wait("run.private", timeout=2 * TIMEOUT)
        n.proc.wait(timeout=TIMEOUT)
        check(not c.find("run.admitted", peer=n.short), "a node without an invite was admitted")

        # a hostile wire client at every entry point
        attempts = [(c, "join"), (c, "weights"), (c, "flow"), (r1, "forward"), (r1, "grad"), (r1, "hello")]
        types = {"join": "301", "weights": "303", "forward": "310", "grad": "322", "hello": "300", "flow": "0"}
        for node, kind in attempts:
            m = node.mark()
            who = probe(node, kind)
            ev = node.wait("run.refused", since=m, peer=who)
            check(ev.get("reason") == "no_certificate" and str(ev.get("type")) == types[kind],
                  f"{kind}: {ev}")
            check(not node.find("join.candidate", peer=who) and not node.find("join.placed", peer=who),
                  f"{kind}: the stranger was placed")
            check(not node.find("weights.served", to=who), f"{kind}: the stranger was served weights")
        for node in (c, r1, r2):
            check(node.alive(), f"{node.name} must survive the stranger")
        members = {c.short, r1.short, r2.short}
        for node in (c, r1, r2):
            bad = [e for e in node.find("run.refused") if e.get("peer") in members]
            check(not bad, f"{node.name} refused a member: {bad}")

        # R2 restarts without its invite: the certificate it kept lets it in
        # (R2, not R1: R1 stays the stage's steady member for what follows)
        r2.stop()
        mc = c.mark()
        r2 = s.node("r2", COMMON + ["--run", RUN]).start(bootstrap=[c.spec])
        ev = r2.wait("run.joining", timeout=2 * TIMEOUT)
        check(ev.get("access") == "certificate", f"a restart should use the kept certificate: {ev}")
        r2.wait("peer.ready", timeout=4 * TIMEOUT)
        c.wait("iteration.done", since=mc, peers="2", timeout=4 * TIMEOUT)
        check(not c.find("run.admitted", since=mc) and not r2.find("run.refused"), "the restart redeemed again")

        # an expired invite, and a used-up one
        t0 = time.time()
        expired = invite(c, "--expires", "1")
        m = c.mark()
        x = s.node("x", COMMON + ["--join", expired])
        while time.time() < t0 + 2.1:  # expiry is wall-clock time (unix seconds): wait until it has passed
            time.sleep(0.05)
        x.start()
        c.wait("run.refused", since=m, peer=x.short, reason="token_expired", timeout=2 * TIMEOUT)
        x.wait("run.redeem_refused", reason="token_expired", timeout=TIMEOUT)
        once = invite(c, "--uses", "1")
        y = s.node("y", COMMON + ["--join", once]).start()
        y.wait("run.certified", timeout=2 * TIMEOUT)
        z = s.node("z", COMMON + ["--join", once]).start()
        z.wait("run.redeem_refused", reason="token_used_up", timeout=2 * TIMEOUT)
        for p in (x, z, y):
            p.stop()

        # revoke R2 by the prefix its logs show
        m1, mc = r1.mark(), c.mark()
        gwtf("revoke", "--run", RUN, "--data-dir", c.data_dir, r2.short)
        c.wait("run.revocations", since=mc, seq="1", timeout=TIMEOUT)
        r1.wait("run.revoked", since=m1, peer=r2.short, timeout=TIMEOUT)
        r2.wait("run.revoked_self", timeout=TIMEOUT)
        mc = c.mark()
        c.wait("iteration.done", since=mc, count=2, peers="1", timeout=4 * TIMEOUT)
        r1.wait("run.refused", peer=r2.short, reason="revoked", timeout=2 * TIMEOUT)
        r2.stop()

        # failover: a second data node holds a copy of the run key; the
        # creator dies; it leads, invites and admits a new relay
        d2 = s.node("d2", COMMON + ["--run", RUN, "--role", "data", "--dataset", data, "--run-key", key,
                                    "--iterations", "0"]).start(bootstrap=[c.spec])
        d2.wait("peer.ready", timeout=4 * TIMEOUT)
        d2.wait("run.revocations", seq="1", timeout=2 * TIMEOUT)  # C's list reached it with C's certificate
        check(not c.find("run.refused", peer=d2.short), "the holder of the run key was refused")
        c.kill9()
        d2.wait("leader.elected", timeout=4 * TIMEOUT)
        token3 = gwtf("invite", "--run", RUN, "--data-dir", d2.data_dir, "--run-key", key)
        r3 = s.node("r3", COMMON + ["--join", token3]).start()
        r3.wait("run.certified", timeout=4 * TIMEOUT)
        d2.wait("run.admitted", peer=r3.short)
        r3.wait("peer.ready", timeout=4 * TIMEOUT)
        md = d2.mark()
        d2.wait("iteration.done", since=md, peers="2", timeout=6 * TIMEOUT)
        # a revocation on the new holder's machine adds to the creator's list
        m1 = r1.mark()
        gwtf("revoke", "--run", RUN, "--data-dir", d2.data_dir, "--run-key", key, r3.id)
        d2.wait("run.revocations", seq="2", peers="2", timeout=TIMEOUT)
        r1.wait("run.revoked", since=m1, peer=r3.short, timeout=TIMEOUT)
        for node in (r3, r1, d2):
            node.stop()


if __name__ == "__main__":
    main(test)
