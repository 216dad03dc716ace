"""A `gwtf node` process inside a netlab namespace (test/nat/netlab.py),
driven like test/node/gwtfproc.py's Node: JSON log stream, wait() on events
with a timeout, stop() = SIGTERM and a clean exit 0.

    from nsnode import NsNode
    n = NsNode("h1", workdir, lab_host, ["--port-mapping", "off"]).start()
    n.wait("nat.mapped", timeout=20)
"""

import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node"))

from gwtfproc import GWTF, Node  # noqa: E402

PORT = 7447
START_TIMEOUT = 20.0


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
        self.proc = self.netns.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        ev = self.wait("node.listening", since=self.mark_before_start, timeout=START_TIMEOUT)
        self.port = int(ev["addr"].rsplit(":", 1)[1])
        self.id = ev["id"]
        return self

    @property
    def addr(self):
        return f"{self.netns.addr}:{self.port}"
