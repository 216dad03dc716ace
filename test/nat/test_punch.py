#!/usr/bin/env python3
"""Hole punching through real NAT routers (test/nat/netlab.py).

A public relay R, a target P behind router r1 and a dialler D behind
router r2, each a punch_probe (test/nat/punch_probe.c) in its namespace.
P reserves on R; D reaches P through R, then both punch. D sends numbered
messages that P echoes, before, during and after the punch, and checks
every echo comes back once and in order.

  cone/cone            -> direct (nat.direct), nothing lost or reordered
  symmetric/symmetric  -> stays relayed (nat.punch_failed), nothing lost
  cone/symmetric       -> measured and printed, not asserted

Prints `BENCH punch NAT/NAT success=K/N` per pair (GWTF_PUNCH_RUNS runs
each, default 2). Needs root, `ip netns` and iptables-legacy; prints
SKIPPED and exits 77 otherwise.

    python3 test/nat/test_punch.py BUILD/test/nat/punch_probe
"""
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlab  # noqa: E402

PORT = 4001
COUNT = 400  # echoed messages of 16 KiB each
# GWTF_PUNCH_ROUTERS=reset: routers answer unsolicited SYNs with a reset
# (a Linux box without a firewall); default stealth (they drop them).
STEALTH = os.environ.get("GWTF_PUNCH_ROUTERS", "stealth") != "reset"
PAIRS = [("cone", "cone"), ("cone", "symmetric"), ("symmetric", "symmetric")]


def read_line(proc, want, timeout):
    """The first stdout line of proc starting with want, within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        if line.startswith(want):
            return line.strip()
    raise RuntimeError(f"no '{want}' line from the probe (exit {proc.poll()})")


def one_run(probe, nat_p, nat_d, logdir, run):
    with netlab.Lab() as lab:
        r1 = lab.router("r1", nat=nat_p)
        r2 = lab.router("r2", nat=nat_d)
        if STEALTH:
            # Like a home router's firewall: an unsolicited SYN to the WAN
            # address is dropped, not answered with a reset.
            for r in (r1, r2):
                r.run([netlab.IPT, "-A", "INPUT", "-i", "wan", "-p", "tcp", "--syn", "-j", "DROP"])
        hp = lab.host("p", r1)
        hd = lab.host("d", r2)
        hr = lab.host("relay")
        logs = {}

        def start(host, name, args):
            logs[name] = os.path.join(logdir, f"{nat_p}-{nat_d}-{run}-{name}.log")
            return host.popen([probe] + args, stdout=subprocess.PIPE, stderr=open(logs[name], "w"), text=True)

        relay = start(hr, "relay", ["relay", f"0.0.0.0:{PORT}"])
        rid = read_line(relay, "ready", 10).split("id=")[1]
        raddr = f"{hr.addr}:{PORT}"
        target = start(hp, "target", ["target", f"0.0.0.0:{PORT}", raddr, rid])
        tid = read_line(target, "ready", 15).split("id=")[1]
        dial = start(hd, "dial", ["dial", f"0.0.0.0:{PORT}", raddr, rid, tid, str(COUNT)])
        read_line(dial, "ready", 10)
        result = read_line(dial, "result=", 40)
        rc = dial.wait(timeout=10)
        text = {k: open(v).read() for k, v in logs.items()}
        return result, rc, text


def main():
    why = netlab.skip_reason()
    if why:
        print(f"SKIPPED: {why}")
        return 77
    probe = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("GWTF_PUNCH_PROBE", "")
    if not probe or not os.access(probe, os.X_OK):
        print("SKIPPED: no punch_probe binary given")
        return 77
    runs = int(os.environ.get("GWTF_PUNCH_RUNS", "2"))
    logdir = os.environ.get("GWTF_PUNCH_LOGDIR") or os.path.join("/tmp", f"gwtf-punch-{os.getpid()}")
    os.makedirs(logdir, exist_ok=True)
    failures = []
    for nat_p, nat_d in PAIRS:
        ok = 0
        for run in range(runs):
            result, rc, text = one_run(probe, nat_p, nat_d, logdir, run)
            both = text["target"] + text["dial"]
            direct = result.startswith("result=direct")
            print(f"{nat_p}/{nat_d} run {run}: {result}")
            for line in both.splitlines():
                if re.search(r"nat\.(direct|punch_failed|punch_started)", line):
                    print("   ", line.split(" - ", 1)[-1])
            if rc != 0 or "disorder=0" not in result or f"echoes={COUNT}" not in result:
                failures.append(f"{nat_p}/{nat_d} run {run}: lost or reordered messages ({result}, exit {rc})")
            if direct:
                ok += 1
                if both.count("nat.direct") < 2:
                    failures.append(f"{nat_p}/{nat_d} run {run}: direct without nat.direct on both ends")
            elif "nat.punch_failed" not in both:
                failures.append(f"{nat_p}/{nat_d} run {run}: relayed without nat.punch_failed")
            if "peer.lost" in text["dial"] and "peer=\"" in text["dial"] and "target went down" in text["dial"]:
                failures.append(f"{nat_p}/{nat_d} run {run}: peer went down during the switch")
            if (nat_p, nat_d) == ("cone", "cone") and not direct and STEALTH:
                failures.append(f"cone/cone run {run}: stayed relayed ({result})")
            if (nat_p, nat_d) == ("symmetric", "symmetric") and direct:
                failures.append(f"symmetric/symmetric run {run}: went direct")
        print(f"BENCH punch {nat_p}/{nat_d} success={ok}/{runs}")
    if failures:
        print(f"logs in {logdir}")
        for f in failures:
            print("FAIL:", f)
        return 1
    if not os.environ.get("GWTF_PUNCH_LOGDIR"):  # ours, and passed: nothing to read there
        shutil.rmtree(logdir, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
