"""Drive `gwtf node` processes from a test: start them, read their JSON log
streams, wait for events (with a timeout, never a sleep), kill and restart.

Standard library only. The binary comes from $GWTF_BIN (set by ctest)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

GWTF = os.environ.get("GWTF_BIN", "gwtf")
TIMEOUT = float(os.environ.get("GWTF_TEST_TIMEOUT", "20"))
# Every node a test made, for the digest a failure prints (main()).
NODES = []
# Events every iteration logs: a digest of what went wrong leaves them out.
ROUTINE = {"iteration.done", "flows.cost", "ledger.counted", "flow.link_costs", "aggregation.begun",
           "aggregation.done", "wire.sent", "compute.done", "peer.rtt", "replica.stored", "replica.pushed",
           "replica.short", "replica.dropped", "checkpoint.saved"}


class Node:
    """One `gwtf node` process and everything it logged (across restarts)."""

    def __init__(self, name, workdir, extra=()):
        self.name = name
        self.data_dir = os.path.join(workdir, name)
        self.extra = list(extra)
        self.proc = None
        self.events = []  # parsed JSON log lines, in order
        self.cond = threading.Condition()
        self.port = None
        self.id = None
        NODES.append(self)

    # -- lifecycle --

    def start(self, port=0, bootstrap=()):
        args = [GWTF, "node", "--listen", f"127.0.0.1:{port}", "--data-dir", self.data_dir,
                "--log-format", "json", "--nat-pmp", "off"] + self.extra
        for b in bootstrap:
            args += ["--bootstrap", b]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        ev = self.wait("node.listening", since=self.mark_before_start)
        self.port = int(ev["addr"].rsplit(":", 1)[1])
        self.id = ev["id"]
        return self

    @property
    def mark_before_start(self):
        return getattr(self, "_mark", 0)

    def restart(self, bootstrap=()):
        """Starts again on the same port with the same identity."""
        self._mark = self.mark()
        return self.start(self.port, bootstrap)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT)

    def stop(self):
        """SIGTERM; the node must shut down cleanly and exit 0."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=TIMEOUT)
        check(code == 0, f"{self.name} exited with {code} after SIGTERM")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def short(self):
        return self.id[:8]

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    @property
    def spec(self):
        return f"{self.id}@{self.addr}"

    # -- the log stream --

    def _read(self, proc):
        for line in proc.stderr:
            line = line.rstrip("\n")
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"event": "-raw", "msg": line}
            sys.stderr.write(f"[{self.name}] {line}\n")
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()

    def mark(self):
        """A position in the log: wait(..., since=mark) ignores what came before."""
        with self.cond:
            return len(self.events)

    def find(self, event, since=0, **fields):
        with self.cond:
            return [e for e in self.events[since:]
                    if e.get("event") == event and all(str(e.get(k)) == str(v) for k, v in fields.items())]

    def wait(self, event, since=0, count=1, timeout=TIMEOUT, **fields):
        """Waits until `count` lines of `event` (with these field values)
        were logged after `since`; returns the last one."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                hits = [e for e in self.events[since:]
                        if e.get("event") == event and all(str(e.get(k)) == str(v) for k, v in fields.items())]
                if len(hits) >= count:
                    return hits[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no {count}x {event} {fields} within {timeout}s")
                self.cond.wait(left)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


class Swarm:
    """A temporary directory and the nodes living in it; stops them all on exit."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gwtf-multiproc-")
        self.nodes = []

    def node(self, name, extra=()):
        n = Node(name, self.dir, extra)
        self.nodes.append(n)
        return n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for n in self.nodes:
            if n.alive():
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


def digest(node, n=10):
    """The last n events of node that are not routine, a short line each."""
    with node.cond:
        notable = [e for e in node.events if e.get("event") not in ROUTINE][-n:]
    skip = {"ts", "level", "node", "event"}
    return [f"[{node.name} digest] {e.get('ts', '')[11:23]} {e.get('event')} " +
            " ".join(f"{k}={v}" for k, v in e.items() if k not in skip)[:160] for e in notable]


def about(node, ids, n=5):
    """node's last n notable events that name one of ids (a peer= or
    similar field): what it did to the node a failure names."""
    with node.cond:
        hits = [e for e in node.events if e.get("event") not in ROUTINE and
                any(str(v)[:8] in ids for k, v in e.items() if k != "node")][-n:]
    skip = {"ts", "level", "node", "event"}
    return [f"[{node.name} about it] {e.get('ts', '')[11:23]} {e.get('event')} " +
            " ".join(f"{k}={v}" for k, v in e.items() if k not in skip)[:160] for e in hits]


def main(test):
    """Runs test(), prints PASS/FAIL, exits 0/1. A failure ends with what CI
    shows of it (the tail): the last few notable events of every other node
    and the last few that name the failing node (the cause may be a peer's:
    test_node_private's restarted relay waited on a stage-mate that had
    banned it, which CI's digest of the stage-mate did not show), then those
    of the node it names, then the failure itself."""
    try:
        test()
    except Exception as e:  # noqa: BLE001 - any failure fails the test
        msg = str(e)
        named = [n for n in NODES if msg.startswith(f"{n.name}:")]
        ids = {n.short for n in named if n.id}
        for node in NODES:
            if node not in named and node.events:
                print("\n".join(digest(node, 3) + (about(node, ids) if ids else [])), file=sys.stderr)
        for node in named:
            print("\n".join(digest(node)), file=sys.stderr)
        print(f"FAIL: {msg}", file=sys.stderr)
        sys.exit(1)
    print("PASS")
