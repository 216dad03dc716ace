"""netlab — a small internet in network namespaces, for tests that need real
NAT routers (port mapping, reachability, relays, hole punching).

Standard library plus the `ip` and `iptables-legacy` commands; needs root.
Every namespace this module makes is named with the test's pid, and all of
them (with their veths and miniupnpd processes) go when the Lab closes, when
the script exits (atexit) or fails. No namespace is linked to the machine's
own network: traffic to any address stays inside the lab.

    import netlab
    why = netlab.skip_reason(need_miniupnpd=True)   # None, or why the lab cannot run
    with netlab.Lab(public_net="11.77.0") as lab:
        r1 = lab.router("r1", nat="cone")           # or nat="symmetric" (--random-fully)
        h1 = lab.host("h1", r1)                      # on r1's LAN, default route via r1
        p1 = lab.host("p1")                          # on the public segment
        lab.start_miniupnpd(r1, natpmp=True, upnp=True)   # NAT-PMP and PCP share natpmp
        h1.popen(["gwtf", "node", ...])              # any command inside a namespace
        p1.run(["python3", "-c", "..."])             # subprocess.run inside it
        r1.mapped_ports()                            # {(proto, ext_port): "ip:port"} from miniupnpd's chain
        lab.stop_miniupnpd(r1)

To run `gwtf node` in a namespace and wait on its log lines, use
test/nat/nsnode.py (NsNode, built on test/node/gwtfproc.py).

Addresses: the public segment is PUBLIC_NET.0/24 (routers .2, .3, ...;
public hosts from .100); router k's LAN is 10.77.k.0/24 with the router at
.1 and its hosts from .2. The public segment must not be a private or
reserved range when miniupnpd runs: miniupnpd 2.3.1 refuses to forward
anything for a WAN address in one ("Reserved / private IP address ... Port
forwarding is impossible"), so port-mapping tests pass a routable-looking
prefix; it is only ever assigned inside the lab's namespaces.

Routers: `cone` is iptables MASQUERADE (Linux keeps the source port and an
endpoint-independent mapping when it can); `symmetric` is MASQUERADE
--random-fully (a new random port per destination). Rules use
iptables-legacy because miniupnpd-iptables talks to the legacy tables.
"""

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time

DEFAULT_PUBLIC_NET = "100.64.0"
MINIUPNPD = shutil.which("miniupnpd") or "/usr/sbin/miniupnpd"
IPT = "iptables-legacy"


def _sh(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def skip_reason(need_miniupnpd=False):
    """None when a lab can be built here, else a one-line reason."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_NET_ADMIN)"
    if not shutil.which("ip"):
        return "no `ip` command (apt-get install iproute2)"
    if not shutil.which(IPT):
        return f"no {IPT} (apt-get install iptables)"
    probe = f"gwtfprobe{os.getpid()}"
    r = _sh(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    try:
        r = _sh(["ip", "netns", "exec", probe, IPT, "-t", "nat", "-L", "-n"], check=False)
        if r.returncode != 0:
            return f"{IPT} does not work in a namespace: {r.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    if need_miniupnpd and not os.access(MINIUPNPD, os.X_OK):
        return "no miniupnpd (apt-get install miniupnpd-iptables)"
    return None


class Netns:
    """One namespace: a router or a host."""

    def __init__(self, lab, name):
        self.lab = lab
        self.name = name  # the short name given by the test
        self.ns = f"{lab.prefix}-{name}"
        self.addr = None  # the address others reach it at (LAN or public)

    def cmd(self, argv):
        return ["ip", "netns", "exec", self.ns] + list(argv)

    def run(self, argv, check=True, timeout=30):
        """subprocess.run inside the namespace (text, output captured)."""
        return _sh(self.cmd(argv), check=check, timeout=timeout)

    def popen(self, argv, **kw):
        """subprocess.Popen inside the namespace; the lab kills it on close."""
        p = subprocess.Popen(self.cmd(argv), **kw)
        self.lab._procs.append(p)
        return p


class Router(Netns):
    def __init__(self, lab, name, index, nat):
        super().__init__(lab, name)
        self.index = index
        self.nat = nat
        self.wan_ip = f"{lab.public_net}.{index + 1}"
        self.lan_prefix = f"10.77.{index}"
        self.lan_ip = f"{self.lan_prefix}.1"
        self.addr = self.wan_ip
        self.hosts = 0
        self.miniupnpd = None

    def mapped_ports(self):
        """What miniupnpd forwards now: {(proto, external port): "ip:port"}.

        From its nat chain (the DNAT rules: protocol, external port) and its
        filter chain (the ACCEPT rules it adds with each: internal address and
        port); iptables-legacy 1.8.9 cannot print the DNAT revision miniupnpd
        writes ("[unsupported revision]"), so the target comes from there."""
        def rules(table):
            r = self.run([IPT, "-t", table, "-S", "MINIUPNPD"], check=False)
            return [line.split() for line in r.stdout.splitlines() if line.startswith("-A MINIUPNPD ")]

        def field(f, name):
            return f[f.index(name) + 1] if name in f else None

        inside = {}
        for f in rules("filter"):
            if field(f, "-j") == "ACCEPT" and field(f, "-d") and field(f, "--dport"):
                inside.setdefault(field(f, "-p"), []).append(f"{field(f, '-d').split('/')[0]}:{field(f, '--dport')}")
        out = {}
        for f in rules("nat"):
            if field(f, "-j") != "DNAT" or not field(f, "--dport"):
                continue
            proto = field(f, "-p")
            to = field(f, "--to-destination") or (inside.get(proto) or ["?"]).pop(0)
            out[(proto, int(field(f, "--dport")))] = to
        return out


class Lab:
    """The namespaces of one test run. Use as a context manager."""

    def __init__(self, public_net=DEFAULT_PUBLIC_NET):
        self.prefix = f"gw{os.getpid()}"
        self.public_net = public_net
        self.dir = tempfile.mkdtemp(prefix="gwtf-netlab-")
        self._ns = []
        self._procs = []
        self._routers = 0
        self._public_hosts = 0
        self._veths = 0
        self._closed = False
        atexit.register(self.close)
        self.pub = self._netns("pub")
        self.pub.run(["ip", "link", "add", "br0", "type", "bridge"])
        self.pub.run(["ip", "link", "set", "br0", "up"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- building --

    def _netns(self, name, cls=Netns, *args):
        n = cls(self, name, *args)
        _sh(["ip", "netns", "add", n.ns])
        self._ns.append(n)
        n.run(["ip", "link", "set", "lo", "up"])
        return n

    def _veth(self, a, a_if, b, b_if):
        """A veth pair with one end in namespace a named a_if, the other in b named b_if."""
        self._veths += 1
        t1, t2 = f"{self.prefix}v{self._veths}a", f"{self.prefix}v{self._veths}b"
        _sh(["ip", "link", "add", t1, "type", "veth", "peer", "name", t2])
        _sh(["ip", "link", "set", t1, "netns", a.ns, "name", a_if])
        _sh(["ip", "link", "set", t2, "netns", b.ns, "name", b_if])
        a.run(["ip", "link", "set", a_if, "up"])
        b.run(["ip", "link", "set", b_if, "up"])

    def _plug_public(self, n, ifname):
        """Connects n to the public bridge through ifname."""
        port = f"p-{n.name}"[:15]
        self._veth(n, ifname, self.pub, port)
        self.pub.run(["ip", "link", "set", port, "master", "br0"])

    def router(self, name, nat="cone"):
        """A home router: WAN on the public segment, a LAN of its own, NAT between."""
        if nat not in ("cone", "symmetric"):
            raise ValueError("nat must be cone or symmetric")
        self._routers += 1
        r = self._netns(name, Router, self._routers, nat)
        self._plug_public(r, "wan")
        r.run(["ip", "addr", "add", f"{r.wan_ip}/24", "dev", "wan"])
        r.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        masq = [IPT, "-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"]
        if nat == "symmetric":
            masq.append("--random-fully")
        r.run(masq)
        return r

    def host(self, name, router=None):
        """A host on router's LAN (default route via it), or on the public segment."""
        h = self._netns(name)
        if router is None:
            self._public_hosts += 1
            self._plug_public(h, "eth0")
            h.addr = f"{self.public_net}.{99 + self._public_hosts}"
            h.run(["ip", "addr", "add", f"{h.addr}/24", "dev", "eth0"])
            return h
        router.hosts += 1
        lan_if = f"lan{router.hosts}"
        self._veth(router, lan_if, h, "eth0")
        if router.hosts == 1:
            router.run(["ip", "link", "add", "lan", "type", "bridge"])
            router.run(["ip", "link", "set", "lan", "up"])
            router.run(["ip", "addr", "add", f"{router.lan_ip}/24", "dev", "lan"])
        router.run(["ip", "link", "set", lan_if, "master", "lan"])
        h.addr = f"{router.lan_prefix}.{router.hosts + 1}"
        h.run(["ip", "addr", "add", f"{h.addr}/24", "dev", "eth0"])
        h.run(["ip", "route", "add", "default", "via", router.lan_ip])
        return h

    # -- miniupnpd --

    def start_miniupnpd(self, router, natpmp=True, upnp=True, timeout=10):
        """Starts miniupnpd on router's LAN (NAT-PMP and PCP with natpmp,
        UPnP-IGD with upnp) and waits until it listens."""
        if router.miniupnpd is None:
            self._miniupnpd_chains(router)
        d = os.path.join(self.dir, f"miniupnpd-{router.name}")
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "miniupnpd.conf")
        with open(conf, "w") as f:
            f.write(f"""ext_ifname=wan
listening_ip=lan
port=0
enable_natpmp={'yes' if natpmp else 'no'}
enable_upnp={'yes' if upnp else 'no'}
secure_mode=yes
system_uptime=yes
notify_interval=60
clean_ruleset_interval=600
lease_file={d}/leases
uuid=6a1f2c3d-0000-4000-8000-{os.getpid() % 1000000:06d}{router.index:06d}
upnp_forward_chain=MINIUPNPD
upnp_nat_chain=MINIUPNPD
upnp_nat_postrouting_chain=MINIUPNPD-POSTROUTING
allow 1024-65535 10.77.0.0/16 1024-65535
deny 0-65535 0.0.0.0/0 0-65535
""")
        log = open(os.path.join(d, "log"), "w")
        p = router.popen([MINIUPNPD, "-f", conf, "-P", os.path.join(d, "pid"), "-d"],
                         stdout=log, stderr=subprocess.STDOUT)
        router.miniupnpd = p
        want = []
        if natpmp:
            want.append("Listening for NAT-PMP/PCP traffic")
        if upnp:
            want.append("HTTP listening on port")
        deadline = time.monotonic() + timeout
        while True:
            text = open(log.name).read()
            if all(w in text for w in want):
                return p
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"miniupnpd on {router.name} did not start:\n{text}")
            time.sleep(0.05)  # polling its log for readiness, with a deadline

    def stop_miniupnpd(self, router):
        p = router.miniupnpd
        if p is None:
            return
        router.miniupnpd = None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def miniupnpd_log(self, router):
        try:
            return open(os.path.join(self.dir, f"miniupnpd-{router.name}", "log")).read()
        except OSError:
            return ""

    def _miniupnpd_chains(self, r):
        # What Debian's /etc/miniupnpd/iptables_init.sh would do (it sources a
        # miniupnpd_functions.sh that the miniupnpd-iptables package lacks).
        for table in ("nat", "mangle", "filter"):
            r.run([IPT, "-t", table, "-N", "MINIUPNPD"], check=False)
        r.run([IPT, "-t", "nat", "-N", "MINIUPNPD-POSTROUTING"], check=False)
        r.run([IPT, "-t", "nat", "-I", "PREROUTING", "-i", "wan", "-j", "MINIUPNPD"])
        r.run([IPT, "-t", "mangle", "-I", "PREROUTING", "-i", "wan", "-j", "MINIUPNPD"])
        r.run([IPT, "-t", "filter", "-I", "FORWARD", "-i", "wan", "!", "-o", "wan", "-j", "MINIUPNPD"])
        r.run([IPT, "-t", "nat", "-I", "POSTROUTING", "-o", "wan", "-j", "MINIUPNPD-POSTROUTING"])

    # -- teardown --

    def close(self):
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for n in reversed(self._ns):
            _sh(["ip", "netns", "del", n.ns], check=False)  # takes its veths along
        shutil.rmtree(self.dir, ignore_errors=True)
