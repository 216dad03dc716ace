"""A `gwtf node` process inside a netlab namespace (test/nat/netlab.py),
driven like test/node/gwtfproc.py's Node: JSON log stream, wait() on events
with a timeout, stop() = SIGTERM and a clean exit 0.

    from nsnode import NsNode
    n = NsNode("h1", workdir, lab_host, ["--port-mapping", "off"]).start()
    n.wait("nat.mapped", timeout=20)

and the scaffolding of a netns test script: skip(why) (exit 77, a skip for
ctest) and main(test) (an AssertionError is a FAIL, exit 1).
"""

import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node"))

from gwtfproc import GWTF, Node  # noqa: E402

PORT = 7447
START_TIMEOUT = 20.0
WAIT_TIMEOUT = 30.0


def sanitizer_env():
    """The environment for a node, with ASan's strict_string_checks off:
    libminiupnpc (Debian's 2.2.4) calls strtol on an HTTP buffer that is not
    NUL-terminated, which that check reports as a read past its end although
    strtol stops at the first non-digit of the header. Not our code; every
    other ASan check stays on."""
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("strict_string_checks=1", "strict_string_checks=0")
    return env


class NsNode(Node):
    """`gwtf node --listen 0.0.0.0:PORT` run with `ip netns exec` in netns."""

    def __init__(self, name, workdir, netns, extra=()):
        super().__init__(name, workdir, extra)
        self.netns = netns

    def start(self, port=PORT, bootstrap=()):
        args = [GWTF, "node", "--listen", f"0.0.0.0:{port}", "--data-dir", self.data_dir,
                "--log-format", "json"] + self.extra
        for b in bootstrap:
            args += ["--bootstrap", b]
        self.proc = self.netns.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=sanitizer_env())
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        ev = self.wait("node.listening", since=self.mark_before_start, timeout=START_TIMEOUT)
        self.port = int(ev["addr"].rsplit(":", 1)[1])
        self.id = ev["id"]
        return self

    @property
    def addr(self):
        return f"{self.netns.addr}:{self.port}"

    @property
    def spec(self):
        """ID@IP:PORT, for another node's --bootstrap."""
        return f"{self.id}@{self.addr}"

    def wait_where(self, event, pred, since=0, timeout=WAIT_TIMEOUT):
        """Waits for a line of `event` for which pred(line) holds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for e in self.events[since:]:
                    if e.get("event") == event and pred(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no matching {event} within {timeout}s")
                self.cond.wait(left)


def skip(why):
    """Ends the test as skipped: ctest's SKIP_RETURN_CODE 77."""
    print(f"SKIPPED: {why}")
    sys.exit(77)


def netlab_or_skip(**kw):
    """The netlab module, or a skip (exit 77) saying why a lab cannot run here."""
    try:
        import netlab
    except ImportError as e:
        skip(e)
    why = netlab.skip_reason(**kw)
    if why:
        skip(why)
    return netlab


def main(test):
    """Runs test(); a failed check prints FAIL and exits 1."""
    try:
        test()
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
