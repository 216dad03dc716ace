#!/usr/bin/env python3
"""Hostile input against a running node's TCP port.

Random bytes, a half handshake, and (after authenticating, through
p2p_probe) a 4 GiB length prefix, a replayed frame and a tampered frame.
For each bad peer the node logs one clear session.rejected line and hangs
up; it keeps running and keeps serving the good peer connected to it, and a
fresh good peer still gets its pings answered.

usage: test_node_hostile.py PATH_TO_P2P_PROBE"""

import os
import socket
import subprocess
import sys

from gwtfproc import TIMEOUT, Swarm, check, main

PROBE = sys.argv[1] if len(sys.argv) > 1 else "p2p_probe"


def raw(node, payload):
    """Connects, sends payload, and returns once the node hung up."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=TIMEOUT) as sock:
        sock.sendall(payload)
        while sock.recv(4096):
            pass


def probe(node, mode):
    r = subprocess.run([PROBE, node.addr, node.id, mode], capture_output=True, text=True, timeout=TIMEOUT)
    check(r.returncode == 0, f"p2p_probe {mode}: exit {r.returncode}: {r.stderr.strip()}")


def expect_rejected(node, mark, reason):
    ev = node.wait("session.rejected", since=mark, reason=reason)
    check(ev.get("dir") == "in", f"rejection should be for an inbound session: {ev}")


def test():
    with Swarm() as s:
        a = s.node("a", ["--handshake-timeout", "500", "--ping-interval", "200"])
        good = s.node("good", ["--ping-interval", "200"])
        a.start()
        good.start(bootstrap=[a.spec])
        a.wait("peer.connected", peer=good.short)

        m = a.mark()
        raw(a, os.urandom(200))
        expect_rejected(a, m, "bad-magic")

        m = a.mark()
        half = b"GWTF\x01\x01\x00\x00" + os.urandom(32)  # a well-formed first message, then silence
        raw(a, half)
        expect_rejected(a, m, "handshake-timeout")

        for mode, reason in (("biglen", "oversize"), ("replay", "auth"), ("tamper", "auth")):
            m = a.mark()
            probe(a, mode)
            expect_rejected(a, m, reason)

        check(a.alive(), "the node must survive hostile peers")
        m = a.mark()
        probe(a, "good")
        gm = good.mark()
        good.wait("peer.rtt", since=gm, peer=a.short)
        check(not good.find("peer.lost"), "the good peer must never lose the node")
        check(not a.find("peer.lost", peer=good.short), "the node must never lose the good peer")
        rejected = len(a.find("session.rejected"))
        check(rejected == 5, f"one rejection per bad peer, got {rejected}")
        for n in (good, a):
            n.stop()


if __name__ == "__main__":
    main(test)
