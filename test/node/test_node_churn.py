#!/usr/bin/env python3
"""Three `gwtf node` processes on loopback, two bootstrapping from the first.

All authenticate and ping. kill -9 the hub: the other two log the loss and
keep running; restart it with the same identity: they reconnect and log it
back. kill -9 a leaf: the hub logs the loss; restart it: it comes back.
Finally SIGTERM everyone: each shuts down cleanly with exit 0."""

from gwtfproc import Swarm, check, main

FAST = ["--ping-interval", "200", "--handshake-timeout", "1000"]


def test():
    with Swarm() as s:
        a, b, c = s.node("a", FAST), s.node("b", FAST), s.node("c", FAST)
        a.start()
        b.start(bootstrap=[a.spec])  # with the ID: b checks it reached a
        c.start(bootstrap=[a.addr])  # without: c takes whoever answers
        for leaf in (b, c):
            a.wait("peer.connected", peer=leaf.short)
            leaf.wait("peer.connected", peer=a.short)
            leaf.wait("peer.rtt", peer=a.short)
            a.wait("peer.rtt", peer=leaf.short)

        # The hub dies without a word.
        mb, mc = b.mark(), c.mark()
        a.kill9()
        b.wait("peer.lost", since=mb, peer=a.short)
        c.wait("peer.lost", since=mc, peer=a.short)
        b.wait("peer.dial_failed", since=mb)  # still trying ...
        check(b.alive() and c.alive(), "b and c must keep running without the hub")

        # ... and it comes back with the same identity on the same port.
        a.restart()
        b.wait("peer.back", since=mb, peer=a.short)
        c.wait("peer.back", since=mc, peer=a.short)
        a.wait("peer.connected", since=a.mark_before_start, count=2)
        b.wait("peer.rtt", since=b.mark(), peer=a.short)

        # A leaf dies; the hub notices, keeps serving the other leaf, and
        # sees the leaf come back.
        ma, mc = a.mark(), c.mark()
        b.kill9()
        a.wait("peer.lost", since=ma, peer=b.short)
        b.restart(bootstrap=[a.spec])
        a.wait("peer.back", since=ma, peer=b.short)
        check(not c.find("peer.lost", since=mc), "c must not notice b's crash")
        c.wait("peer.rtt", since=mc, peer=a.short)

        for n in (b, c, a):
            m = n.mark()
            n.stop()
            n.wait("node.stopped", since=m)


if __name__ == "__main__":
    main(test)
