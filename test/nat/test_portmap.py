"""Port mapping through a real NAT router in network namespaces.

A home host (h1) behind a router (r1, MASQUERADE) that runs miniupnpd, and
a host on the public segment (p1). For each of --port-mapping pcp, natpmp,
upnp and auto, a `gwtf node` on h1 must log nat.mapped with that protocol
(auto: PCP first) and the router's public address; p1 must be able to open
a TCP connection to that external address (the mapping is real, not just
claimed); on SIGTERM the node deletes the mapping (it leaves miniupnpd's
iptables chain). The same behind a symmetric router (--random-fully). With
miniupnpd stopped the node logs nat.no_mapping tried=pcp,natpmp,upnp.

Needs root, `ip netns`, iptables-legacy and miniupnpd: where any is missing
it prints "SKIPPED: <why>" and exits 77 (ctest SKIP_RETURN_CODE)."""

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import netlab  # noqa: E402
from nsnode import PORT, NsNode, main, skip  # noqa: E402
from gwtfproc import check  # noqa: E402

# Routable-looking on purpose, see netlab.py: miniupnpd forwards nothing for
# a private WAN address. Assigned only inside the lab's namespaces.
PUBLIC_NET = "11.77.0"
WAIT = 20.0


def tcp_connect(ns, ip, port):
    """True when ns can open a TCP connection to ip:port."""
    code = ("import socket,sys\n"
            f"s=socket.create_connection(('{ip}',{port}),timeout=3)\n"
            "s.close()\n")
    r = ns.run([sys.executable, "-c", code], check=False)
    return r.returncode == 0


def poll(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling router state (iptables) with a deadline


def map_once(lab, workdir, router, home, public, mode, want_proto):
    t0 = time.monotonic()
    node = NsNode(f"{home.name}-{mode}", workdir, home, ["--port-mapping", mode])
    node.start()
    try:
        ev = node.wait("nat.mapped", timeout=WAIT)
        print(f"  {mode}: {ev['event']} proto={ev['proto']} external={ev['external']} "
              f"udp={ev['udp']} lifetime={ev['lifetime']} ({time.monotonic() - t0:.1f}s)")
        check(ev["proto"] == want_proto, f"{mode}: mapped with {ev['proto']}, want {want_proto}")
        check(ev["external"] == f"{router.wan_ip}:{PORT}",
              f"{mode}: external {ev['external']}, want the router's public address {router.wan_ip}:{PORT}")
        check(ev["udp"] == f"{router.wan_ip}:{PORT}", f"{mode}: udp {ev['udp']}")
        ports = router.mapped_ports()
        check(ports.get(("tcp", PORT)) == f"{home.addr}:{PORT}", f"{mode}: router forwards {ports}")
        check(ports.get(("udp", PORT)) == f"{home.addr}:{PORT}", f"{mode}: router forwards {ports}")
        check(tcp_connect(public, router.wan_ip, PORT),
              f"{mode}: {public.name} cannot connect to {router.wan_ip}:{PORT} through the mapping")
        node.stop()
        node.wait("nat.unmapped", proto=want_proto, timeout=1)
        poll(lambda: not router.mapped_ports(), 5, f"{mode}: the router to drop the mapping")
        check(not tcp_connect(public, router.wan_ip, PORT), f"{mode}: still reachable after unmapping")
        print(f"  {mode}: deleted on exit, router forwards nothing")
    finally:
        if node.alive():
            node.proc.kill()
            node.proc.wait()


def test():
    why = netlab.skip_reason(need_miniupnpd=True)
    if why:
        skip(why)
    workdir = tempfile.mkdtemp(prefix="gwtf-portmap-")
    with netlab.Lab(public_net=PUBLIC_NET) as lab:
        r1 = lab.router("r1", nat="cone")
        h1 = lab.host("h1", r1)
        r2 = lab.router("r2", nat="symmetric")
        h2 = lab.host("h2", r2)
        p1 = lab.host("p1")
        # Without a mapping the NAT keeps p1 out.
        check(not tcp_connect(p1, r1.wan_ip, PORT), "r1 forwards before any mapping")
        lab.start_miniupnpd(r1, natpmp=True, upnp=True)
        try:
            print("cone router r1 (MASQUERADE) with miniupnpd:")
            for mode, want in (("pcp", "pcp"), ("natpmp", "natpmp"), ("upnp", "upnp"), ("auto", "pcp")):
                map_once(lab, workdir, r1, h1, p1, mode, want)
            # UPnP only: auto falls through PCP and NAT-PMP to UPnP.
            lab.stop_miniupnpd(r1)
            lab.start_miniupnpd(r1, natpmp=False, upnp=True)
            print("r1 with UPnP only:")
            map_once(lab, workdir, r1, h1, p1, "auto", "upnp")
            print("symmetric router r2 (MASQUERADE --random-fully) with miniupnpd:")
            lab.start_miniupnpd(r2, natpmp=True, upnp=True)
            map_once(lab, workdir, r2, h2, p1, "auto", "pcp")
            # The mapping service off: nothing maps, the node says so and runs on.
            lab.stop_miniupnpd(r1)
            print("r1 with miniupnpd stopped:")
            node = NsNode("h1-none", workdir, h1, ["--port-mapping", "auto"])
            t0 = time.monotonic()
            node.start()
            ev = node.wait("nat.no_mapping", timeout=WAIT)
            took = time.monotonic() - t0
            print(f"  auto: nat.no_mapping tried={ev['tried']} reason={ev['reason']} ({took:.1f}s)")
            # PCP and NAT-PMP end at the ICMP port unreachable, UPnP after one
            # 2 s SSDP search (not four searches one after another).
            check(took < 6, f"no_mapping took {took:.1f}s")
            check(ev["tried"] == "pcp,natpmp,upnp", f"tried {ev['tried']}")
            check(not node.find("nat.mapped"), "mapped without a mapping service")
            check(node.alive(), "the node died without a mapping")
            node.stop()
        except Exception:
            for r in (r1, r2):
                sys.stderr.write(f"--- miniupnpd on {r.name} ---\n{lab.miniupnpd_log(r)}\n")
            raise
    shutil.rmtree(workdir, ignore_errors=True)  # passed: the nodes' logs are of no more use
    print("PASS")


if __name__ == "__main__":
    main(test)
