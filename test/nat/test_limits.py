"""Per-IP limits against a connection flood, with real addresses (network
namespaces, test/nat/netlab.py).

A `gwtf node` (n) on the public segment; a flooder host (f) opens 3000 TCP
connections to it that send nothing (half-open sessions), holds them, and
stops by itself; an honest node (h) on a third address joins meanwhile.
Asserted:
  - n logs limit.hit kind=handshakes-per-ip ip=<flooder> (a handful of
    lines, not one per connection) and holds at most 8 handshakes from it;
  - h gets peer.connected within 5 s of starting, while the flood goes on;
  - n's memory stays bounded: VmRSS grows by less than RSS_BOUND_MB over
    the flood, and its open fds stay under FD_BOUND;
  - out of file descriptors (n's limit lowered with prlimit to 12 above
    what it holds, then a flood from 24 addresses, which the per-IP caps
    alone do not stop), n closes what lands within P2P_LIMIT_FD_RESERVE
    (32) of the limit and logs limit.hit kind=fds (libuv would otherwise
    drop them silently with its reserve-fd trick), does not spin (CPU
    below half a core), and after the flood a fresh honest node connects.

Needs root, `ip netns` and iptables-legacy: else "SKIPPED: <why>", exit 77.
About 25 s."""

import os
import resource
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nsnode import NsNode, main, netlab_or_skip  # noqa: E402
from gwtfproc import check  # noqa: E402

FLOOD_N = 3000
RSS_BOUND_MB = 48
FD_BOUND = 200
EMFILE_HEADROOM = 12  # fds the node may open beyond what it holds when the limit is lowered
EXTRA_IPS = 24

# Runs in the flooder's namespace: connects FLOOD_N sockets (non-blocking,
# nothing sent) from the given source addresses in turn, keeps them HOLD
# seconds, reports how many the node closed, and exits by itself.
FLOODER = r"""
import errno, os, resource, select, socket, sys, time
dst, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
srcs = sys.argv[5].split(",")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks, t0 = [], time.monotonic()
for i in range(n):
    if time.monotonic() - t0 > 8:
        break
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.bind((srcs[i % len(srcs)], 0))
    try:
        s.connect((dst, port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        time.sleep(0.01)
        continue
    socks.append(s)
print(f"opened {len(socks)} in {time.monotonic() - t0:.1f}s", flush=True)
end = time.monotonic() + hold
while time.monotonic() < end:
    time.sleep(0.2)
closed = 0
for s in socks:
    try:
        closed += s.recv(1) == b""
    except BlockingIOError:
        pass
    except OSError:
        closed += 1
    s.close()
print(f"closed_by_node {closed} of {len(socks)}", flush=True)
"""


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def nfds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def flood(fns, dst, srcs, n, hold):
    return fns.popen(["python3", "-c", FLOODER, dst, "7447", str(n), str(hold), ",".join(srcs)],
                     stdout=__import__("subprocess").PIPE, text=True)


def honest_join(name, workdir, netns, target):
    """Starts an honest node dialling target; seconds from its start to peer.connected."""
    h = NsNode(name, workdir, netns, ["--port-mapping", "off"])
    t0 = time.monotonic()
    h.start(bootstrap=[target.spec])
    h.wait("peer.connected", timeout=10)
    return h, time.monotonic() - t0


def test():
    netlab = netlab_or_skip()
    workdir = tempfile.mkdtemp(prefix="gwtf-limits-")
    nodes = []
    with netlab.Lab() as lab:
        nns, fns, hns, h2ns = lab.host("n"), lab.host("f"), lab.host("h"), lab.host("h2")
        try:
            n = NsNode("n", workdir, nns, ["--port-mapping", "off"]).start()
            nodes.append(n)
            pid = n.proc.pid
            soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
            print(f"  node pid {pid}: fd limit {soft}/{hard}, {nfds(pid)} fds open")
            rss0 = proc_status(pid, "VmRSS")

            # 1. One flooder, 3000 half-open connections.
            mark = len(n.events)
            fl = flood(fns, nns.addr, [fns.addr], FLOOD_N, 8)
            n.wait_where("limit.hit", lambda e: e.get("kind") == "handshakes-per-ip" and e.get("ip") == fns.addr,
                         since=mark, timeout=10)
            h, took = honest_join("h", workdir, hns, n)
            nodes.append(h)
            print(f"  honest node from {hns.addr}: peer.connected {took:.2f}s after start, during the flood")
            check(took < 5, f"honest peer took {took:.1f}s")
            rss_max, fd_max = rss0, 0
            while fl.poll() is None:
                rss_max = max(rss_max, proc_status(pid, "VmRSS"))
                fd_max = max(fd_max, nfds(pid))
                time.sleep(0.1)
            out = fl.stdout.read()
            print("  flooder: " + " / ".join(out.split("\n")[:2]))
            opened = int(out.split()[1])
            closed = int(out.split("closed_by_node")[1].split()[0])
            check(opened >= 2000, f"the flooder opened only {opened}")
            # The rest wait in the kernel (SYN and accept queues, SYN retries):
            # what the node accepted beyond its 8 it closed at once.
            check(closed >= 200, f"the node closed only {closed} of {opened}")
            hits = [e for e in n.events[mark:] if e.get("event") == "limit.hit" and e.get("ip") == fns.addr]
            print(f"  n: {len(hits)} limit.hit lines for {fns.addr}; VmRSS {rss0} -> max {rss_max} kB; "
                  f"fds max {fd_max}")
            check(1 <= len(hits) <= 20, f"{len(hits)} limit.hit lines")
            check(rss_max - rss0 < RSS_BOUND_MB * 1024, f"RSS grew {(rss_max - rss0) // 1024} MB")
            check(fd_max < FD_BOUND, f"{fd_max} fds open")
            check(n.alive() and h.alive(), "a node died")

            # 2. Out of fds: a flood from many addresses, the node's limit lowered.
            srcs = [f"{lab.public_net}.{200 + i}" for i in range(EXTRA_IPS)]
            for a in srcs:
                fns.run(["ip", "addr", "add", f"{a}/24", "dev", "eth0"])
            emfile_limit = nfds(pid) + EMFILE_HEADROOM
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (emfile_limit, hard))
            time.sleep(0.5)  # the node reads its limit every 200 ms
            mark = len(n.events)
            cpu0, t0 = cpu_s(pid), time.monotonic()
            fl = flood(fns, nns.addr, srcs, FLOOD_N, 4)
            n.wait_where("limit.hit", lambda e: e.get("kind") == "fds", since=mark, timeout=10)
            fl.wait(timeout=30)
            cpu = (cpu_s(pid) - cpu0) / (time.monotonic() - t0)
            kinds = sorted({e.get("kind") for e in n.events[mark:] if e.get("event") == "limit.hit"})
            print(f"  fd limit {emfile_limit}, flood from {len(srcs)} IPs: limit.hit kinds {kinds}; "
                  f"node CPU {cpu:.2f} cores during it")
            check(cpu < 0.5, f"the node spun at {cpu:.2f} cores")
            check(n.alive(), "the node died out of fds")
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
            h2, took = honest_join("h2", workdir, h2ns, n)
            nodes.append(h2)
            print(f"  after it, a fresh node connects in {took:.2f}s")
            check(took < 5, f"took {took:.1f}s")
        finally:
            for x in nodes:
                if x.alive():
                    x.stop()
    shutil.rmtree(workdir, ignore_errors=True)  # passed: the nodes' logs are of no more use
    print("OK")


if __name__ == "__main__":
    main(test)
