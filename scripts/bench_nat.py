#!/usr/bin/env python3
"""scripts/bench_nat.py — the figures of issue 16 (home PCs behind NAT), in one table.

    scripts/bench_nat.py [--build DIR] [--relay-mb N] [--punch-runs N]

Runs, one after another, and reads the figures they print:
  1. test/p2p/test_relay's bench (loopback): direct vs relayed throughput
     and minimum RTT, and the relay's CPU per relayed MB;
  2. test/nat/test_punch.py (network namespaces): hole-punch success per
     NAT pair (cone/cone, cone/symmetric, symmetric/symmetric);
  3. test/nat/test_nat_train.py (network namespaces): time from a private
     peer's start to its first microbatch, relayed (cone, symmetric) and
     punched (cone routers with a firewall).
2 and 3 need root and `ip netns` (scripts/setup.sh --test-deps installs the
rest); without them those rows say why they are missing. Numbers go to
docs/P2P.md, "Measured". Nothing here is a pass/fail test."""

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(argv, env=None, timeout=900):
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def relay_bench(build, mb):
    rc, out = run([os.path.join(build, "test/p2p/test_relay")], {"GWTF_RELAY_BENCH_MB": str(mb)})
    m = re.search(r"relay bench .*", out)
    return m.group(0) if m and rc == 0 else f"test_relay failed (exit {rc})"


def punch_bench(build, runs):
    probe = os.path.join(build, "test/nat/punch_probe")
    rc, out = run([sys.executable, os.path.join(ROOT, "test/nat/test_punch.py"), probe],
                  {"GWTF_PUNCH_RUNS": str(runs)})
    rows = re.findall(r"BENCH punch (\S+) success=(\d+)/(\d+)", out)
    if rc == 77 or "SKIPPED" in out:
        return [("-", re.search(r"SKIPPED.*", out).group(0))]
    if not rows:
        return [("-", f"test_punch.py failed (exit {rc})")]
    return [(pair, f"{ok}/{n} direct") for pair, ok, n in rows]


def train_bench(build):
    rc, out = run([sys.executable, os.path.join(ROOT, "test/nat/test_nat_train.py"), "cone", "symmetric", "punch"],
                  {"GWTF_BIN": os.path.join(build, "node/gwtf")})
    if rc == 77 or "SKIPPED" in out:
        return [("-", re.search(r"SKIPPED.*", out).group(0))]
    rows, case = [], None
    for line in out.splitlines():
        m = re.match(r"== (\w+): B \(data\)", line)
        if m:
            case = m.group(1)
        m = re.search(r"time from start to first microbatch: (.*)", line)
        if m and case:
            rows.append((case, m.group(1)))
        m = re.search(r"nat\.direct after_ms=(\S+)", line)
        if m and case:
            rows.append((case, f"punched to direct {m.group(1)} ms after the relayed session"))
    if rc != 0:
        rows.append(("-", f"test_nat_train.py failed (exit {rc})"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--relay-mb", type=int, default=256)
    ap.add_argument("--punch-runs", type=int, default=3)
    a = ap.parse_args()
    print("relayed vs direct (loopback):")
    print("  " + relay_bench(a.build, a.relay_mb))
    print("hole punching per NAT pair (netns):")
    for pair, what in punch_bench(a.build, a.punch_runs):
        print(f"  {pair}: {what}")
    print("a private peer's start to its first microbatch (netns, 3-stage tiny run):")
    for case, what in train_bench(a.build):
        print(f"  {case}: {what}")


if __name__ == "__main__":
    main()
