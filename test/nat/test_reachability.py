"""Reachability by dial-back through a real NAT router (network namespaces).

Three `gwtf node`s on the public segment (p1, p2, p3) and one (h1) behind a
home router r1 (iptables MASQUERADE, no port mapping, no miniupnpd). p2 and
p3 join through p1; h1 joins through p1 and p2. Asserted:
  - p1, dialled back by p2 and p3, logs
      nat.reachability status=public addr=<p1>:7447 checked_by=2;
  - h1, whose peers can only dial the router (which forwards nothing), logs
      nat.reachability status=private addr=<r1's public IP>:7447 checked_by=2
    and the plain sentence (nat.advice: UPnP / NAT-PMP, or forward port
    7447), switches its DHT to client mode and keeps its sessions;
  - the public nodes hear h1's DHT messages marked client and, when they
    stop, h1 is not among the contacts they save (it never entered, or
    left, their routing tables);
  - h2, behind a second router r2 that runs miniupnpd, maps its port
    (nat.mapped) and is then dialled back through the mapping:
      nat.reachability status=public addr=<r2's public IP>:7447 checked_by=2
    (Without miniupnpd this case prints why it is skipped.)

Needs root, `ip netns` and iptables-legacy (test/nat/netlab.py): where any
is missing it prints "SKIPPED: <why>" and exits 77 (ctest SKIP_RETURN_CODE).
No sleeps: every wait is on a log event, with a timeout."""

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nsnode import PORT, NsNode, main, netlab_or_skip  # noqa: E402
from gwtfproc import check  # noqa: E402

WAIT = 30.0
# miniupnpd 2.3.1 forwards nothing for a WAN address in a private or
# reserved range, so the public segment gets a routable-looking prefix;
# it exists only inside the lab's namespaces (netlab.py).
PUBLIC_NET = "11.77.0"


def start_node(name, workdir, netns, extra=(), bootstrap=()):
    """A node without port mapping (the router has none to give)."""
    return NsNode(name, workdir, netns, ["--port-mapping", "off"] + list(extra)).start(bootstrap=bootstrap)


def mapped_case(lab, workdir, r2, h2ns, p2, p3, nodes):
    """h2 behind r2 with miniupnpd: mapped, then public by dial-back."""
    why = netlab_skip_reason(need_miniupnpd=True)
    if why:
        print(f"  h2 (mapped) case SKIPPED: {why}")
        return
    lab.start_miniupnpd(r2, natpmp=True, upnp=True)
    h2 = NsNode("h2", workdir, h2ns, ["--port-mapping", "auto"]).start(bootstrap=[p2.spec, p3.spec])
    nodes.append(h2)
    ev = h2.wait("nat.mapped", timeout=WAIT)
    print(f"  h2: nat.mapped proto={ev['proto']} external={ev['external']}")
    want = f"{r2.wan_ip}:{PORT}"
    check(ev["external"] == want, f"h2 mapped {ev['external']}, want {want}")
    ev = h2.wait_where("nat.reachability", lambda e: e.get("status") == "public", timeout=WAIT)
    print(f"  h2: status={ev['status']} addr={ev['addr']} checked_by={ev['checked_by']}")
    check(ev["addr"] == want, f"h2 checked at {ev['addr']}, want {want}")
    check(str(ev["checked_by"]) == "2", f"h2 checked_by={ev['checked_by']}")
    h2.stop()


def netlab_skip_reason(**kw):
    import netlab
    return netlab.skip_reason(**kw)


def test():
    netlab = netlab_or_skip()
    workdir = tempfile.mkdtemp(prefix="gwtf-reach-")
    nodes = []
    with netlab.Lab(public_net=PUBLIC_NET) as lab:
        r1 = lab.router("r1", nat="cone")
        h1ns = lab.host("h1", r1)
        r2 = lab.router("r2", nat="cone")
        h2ns = lab.host("h2", r2)
        pns = [lab.host(f"p{i}") for i in (1, 2, 3)]
        try:
            p1 = start_node("p1", workdir, pns[0], ["--dht-stats", "1"])
            nodes.append(p1)
            p2 = start_node("p2", workdir, pns[1], ["--dht-stats", "1"], [p1.spec])
            p3 = start_node("p3", workdir, pns[2], bootstrap=[p1.spec])
            nodes += [p2, p3]

            ev = p1.wait("nat.reachability", timeout=WAIT)
            print(f"  p1: status={ev['status']} addr={ev['addr']} checked_by={ev['checked_by']}")
            check(ev["status"] == "public", f"p1 on the public segment is {ev['status']}")
            check(ev["addr"] == f"{pns[0].addr}:{PORT}", f"p1 checked at {ev['addr']}")
            check(str(ev["checked_by"]) == "2", f"p1 checked_by={ev['checked_by']}")
            check(not p1.find("nat.advice"), "p1 got advice although it is public")

            h1 = start_node("h1", workdir, h1ns, ["--dht-stats", "1"], [p1.spec, p2.spec])
            nodes.append(h1)
            ev = h1.wait("nat.reachability", timeout=WAIT)
            print(f"  h1: status={ev['status']} addr={ev['addr']} checked_by={ev['checked_by']}")
            check(ev["status"] == "private", f"h1 behind r1 without a mapping is {ev['status']}")
            check(ev["addr"] == f"{r1.wan_ip}:{PORT}", f"h1 checked at {ev['addr']}, want the router's")
            check(str(ev["checked_by"]) == "2", f"h1 checked_by={ev['checked_by']}")
            advice = h1.wait("nat.advice", timeout=1)["msg"]
            print(f"  h1: {advice}")
            check("UPnP or NAT-PMP" in advice and f"forward TCP and UDP port {PORT}" in advice,
                  f"advice: {advice}")
            mode = h1.wait("dht.client_mode", timeout=WAIT)
            check(mode["on"] in (True, "true"), f"dht.client_mode {mode}")
            check(len(h1.find("peer.connected")) >= 2, "h1 lost its sessions")
            check(not h1.find("peer.lost"), "a dial-back cost h1 a session")

            mapped_case(lab, workdir, r2, h2ns, p2, p3, nodes)

            # The public nodes hear h1 as a client, then save contacts without it.
            for p in (p1, p2):
                p.wait_where("dht.stats", lambda e: int(e.get("client_msgs", 0)) >= 1, timeout=WAIT)
            for p in (p1, p2):
                p.stop()
                path = os.path.join(p.data_dir, "dht-contacts")
                text = open(path).read() if os.path.exists(path) else ""
                check(h1.id not in text, f"{p.name} saved h1 as a DHT contact:\n{text}")
                print(f"  {p.name}: h1 not among its saved DHT contacts")
            check(h1.alive(), "h1 died")
            h1.stop()
            p3.stop()
        finally:
            for n in nodes:
                if n.alive():
                    n.proc.kill()
                    n.proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)  # passed: the nodes' logs are of no more use
    print("PASS")


if __name__ == "__main__":
    main(test)
