#!/usr/bin/env python3
"""The DHT across real processes on loopback (issue 3's multi-process test).

20 `gwtf node` processes: one is started first, the other 19 bootstrap from
it, and every node announces itself in one of 4 stages of run "demo" (5 per
stage). `gwtf lookup` must find every member of every stage, with its
address. Then 5 nodes are killed with SIGKILL; once the record TTL has
passed, `gwtf lookup` no longer lists them and still lists all the others.
Hostile datagrams (random bytes, oversize, a forged signature, an empty one)
sent to a node's UDP port are rejected with a log line each and the node
keeps serving lookups. Everyone then shuts down cleanly (exit 0).

Standard library only; $GWTF_BIN is the binary under test. Every wait is on
an event (a log line, a lookup result) with a deadline, never a fixed sleep."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

GWTF = os.environ.get("GWTF_BIN", "gwtf")
NODES, STAGES, KILLED = 20, 4, 5
TTL_S = 6  # record TTL: records are republished every TTL/2
DEADLINE_S = float(os.environ.get("GWTF_TEST_TIMEOUT", "60"))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Node:
    """One `gwtf node` process and the JSON events it logged."""

    def __init__(self, workdir, index):
        self.index = index
        self.stage = index % STAGES
        self.data_dir = os.path.join(workdir, f"n{index}")
        self.events = []
        self.cond = threading.Condition()
        self.proc = None
        self.addr = self.id = None

    def start(self, bootstrap=None):
        args = [GWTF, "node", "--listen", "127.0.0.1:0", "--data-dir", self.data_dir, "--nat-pmp", "off",
                "--log-format", "json", "--record-ttl", str(TTL_S), "--dht-stats", "1",
                "--announce", f"demo:{self.stage}"]
        if bootstrap:
            args += ["--bootstrap", bootstrap]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.proc.stderr:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait(self, event, count=1, pred=lambda ev: True):
        """Waits until `count` events named `event` (matching pred) were logged."""
        end = time.monotonic() + DEADLINE_S
        with self.cond:
            while True:
                hits = [ev for ev in self.events if ev.get("event") == event and pred(ev)]
                if len(hits) >= count:
                    return hits[-1]
                left = end - time.monotonic()
                check(left > 0 and self.proc.poll() is None,
                      f"node {self.index}: no {count} x {event} (exit code {self.proc.poll()})")
                self.cond.wait(left)

    def started(self):
        ev = self.wait("node.listening")
        self.addr, self.id = ev["addr"], ev["id"]
        return self

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE_S)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=DEADLINE_S)
        check(code == 0, f"node {self.index} exited with {code} after SIGTERM")


def lookup(boot, stage):
    """`gwtf lookup` of a stage: {node id: address}, or None when it failed."""
    out = subprocess.run([GWTF, "lookup", "--bootstrap", boot, f"run/demo/stage/{stage}", "--json",
                          "--timeout", "10"], capture_output=True, text=True, timeout=DEADLINE_S)
    if out.returncode == 2:
        return {}
    if out.returncode != 0:
        return None
    return {m["id"]: m["addr"] for m in json.loads(out.stdout)["members"]}


def expect_members(boot, stage, want, what):
    """Looks the stage up until it lists exactly `want` ({id: addr}); the
    network is eventually consistent, so a first answer may be incomplete."""
    end = time.monotonic() + DEADLINE_S
    got = None
    while time.monotonic() < end:
        got = lookup(boot, stage)
        if got == want:
            return
        time.sleep(0.2)  # between lookups, not in place of an event
    raise AssertionError(f"stage {stage} {what}: expected {sorted(want)}, got {sorted(got or {})}")


def hostile(node):
    """Bad datagrams at node's UDP port: each one must be logged and dropped."""
    host, port = node.addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    forged = bytes([0x67, 0x11]) + os.urandom(32) + b"not a real message" + os.urandom(64)
    for dgram in (os.urandom(200), os.urandom(1500), forged, b""):
        s.sendto(dgram, (host, int(port)))
    s.close()
    for reason in ("malformed", "oversize", "bad-signature"):
        node.wait("dht.udp.rejected", pred=lambda ev, r=reason: ev.get("reason") == r)


def test(workdir):
    nodes = [Node(workdir, i) for i in range(NODES)]
    try:
        first = nodes[0].start().started()
        for n in nodes[1:]:
            n.start(bootstrap=first.addr)
        for n in nodes:
            n.started()
            n.wait("dht.announced")
        members = {s: {n.id: n.addr for n in nodes if n.stage == s} for s in range(STAGES)}
        for s in range(STAGES):
            check(len(members[s]) == NODES // STAGES, "5 members per stage")
            expect_members(first.addr, s, members[s], "after everyone announced")

        # The log shows the routing table and the stored records, periodically.
        first.wait("dht.stats", pred=lambda ev: ev["contacts"] >= NODES // 2 and ev["records"] > 0)

        # Five die at once, without a word; nobody withdraws their records.
        dead = [nodes[i] for i in (1, 6, 11, 16, 19)]
        for n in dead:
            n.kill9()
        killed_at = time.monotonic()
        live = [n for n in nodes if n not in dead]
        for s in range(STAGES):
            want = {n.id: n.addr for n in live if n.stage == s}
            expect_members(first.addr, s, want, "after the record TTL")
        # Their records lapsed with the TTL, not sooner than it allows.
        check(time.monotonic() - killed_at >= TTL_S / 2, "dead members vanished before their records could expire")

        hostile(first)
        for s in range(STAGES):  # ... and the node keeps serving
            expect_members(first.addr, s, {n.id: n.addr for n in live if n.stage == s}, "after hostile datagrams")
        for n in live:
            n.stop()
    finally:
        for n in nodes:
            if n.proc and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()


def main():
    workdir = tempfile.mkdtemp(prefix="gwtf-dht-mp-")
    try:
        test(workdir)
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
