#!/usr/bin/env python3
"""`gwtf node` at its edges: bad options exit 2 with a message; a key file
others can read is refused with the fix in the message; a port already in use
is a clean failure; a bootstrap peer that is not the node ID we asked for is
rejected and redialled, never accepted; `gwtf bench p2p` prints its JSON."""

import json
import os
import socket
import subprocess

from gwtfproc import GWTF, TIMEOUT, Swarm, check, main


def run(*args):
    return subprocess.run([GWTF, *args], capture_output=True, text=True, timeout=TIMEOUT)


def test():
    for bad in (["--listen", "nowhere"], ["--bootstrap", "abc@127.0.0.1:1"], ["--nat-pmp", "maybe"],
                ["--max-frame", "1k"], ["--log-format", "xml"], ["--links-bw-scale", "-1"], ["stray"]):
        r = run("node", *bad)
        check(r.returncode == 2, f"gwtf node {bad}: exit {r.returncode}, want 2")
        check("gwtf node" in r.stderr, f"gwtf node {bad}: no message: {r.stderr!r}")

    with Swarm() as s:
        key = os.path.join(s.dir, "open.key")
        check(run("keygen", "--out", key).returncode == 0, "keygen failed")
        os.chmod(key, 0o644)
        r = run("node", "--identity", key, "--data-dir", s.dir, "--listen", "127.0.0.1:0")
        check(r.returncode == 1 and "chmod 600" in r.stderr, f"readable key accepted: {r.stderr!r}")

        links = os.path.join(s.dir, "links.json")
        with open(links, "w") as f:
            f.write('{"latency": 5}')
        r = run("node", "--links", links, "--data-dir", s.dir, "--listen", "127.0.0.1:0")
        check(r.returncode == 1 and 'unknown key "latency"' in r.stderr, f"bad links file: {r.stderr!r}")

        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            r = run("node", "--data-dir", os.path.join(s.dir, "x"), "--listen", f"127.0.0.1:{port}",
                    "--nat-pmp", "off", "--log-format", "json")
            check(r.returncode == 1, f"listening on a busy port: exit {r.returncode}")
            check("node.listen_failed" in r.stderr, f"no listen_failed line: {r.stderr!r}")

        # b asks for a node ID that is not a's: a's answer is refused, and b
        # keeps trying at its slowest backoff (15-30 s with the default 30 s
        # maximum) from the first failure: the signed answer proves the node
        # it wants is not at that address (p2p/host.c, dial_failed).
        a, b, other = s.node("a"), s.node("b"), s.node("other")
        a.start()
        other.start()
        other.stop()
        b.start(bootstrap=[f"{other.id}@{a.addr}"])
        b.wait("session.rejected", reason="unexpected-id")
        failed = b.wait("peer.dial_failed", reason="unexpected-id")
        retry = int(failed["retry_ms"])
        check(15000 <= retry <= 30000, f"b retries the wrong node in {retry} ms, not at its slowest backoff")
        check(not b.find("peer.connected"), "b must not accept the wrong node")
        check(not a.find("peer.connected"), "a must not see b as a peer")
        b.stop()
        a.stop()

    r = run("bench", "p2p", "--handshakes", "5", "--frames", "4", "--frame-size", "256k")
    check(r.returncode == 0, f"bench p2p: exit {r.returncode}: {r.stderr}")
    out = json.loads(r.stdout)
    check(out["handshake"]["n"] == 5 and out["handshake"]["median_ms"] > 0, f"bench handshake: {out}")
    check(out["throughput"]["frames"] == 4 and out["throughput"]["in_order"] is True, f"bench throughput: {out}")
    check(out["throughput"]["MBps"] > 0, f"bench MBps: {out}")


if __name__ == "__main__":
    main(test)
