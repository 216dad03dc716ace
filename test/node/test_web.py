#!/usr/bin/env python3
"""The live web view's server without a browser (docs/WEB.md): `gwtf node
--http` serves the page, a JSON snapshot and a server-sent-events stream of
the node's log events; wrong paths, methods and bodies are refused; an
address other than loopback needs --http-public.

Every wait is on a log event or on bytes from a socket, with a timeout."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from gwtfproc import GWTF, TIMEOUT, Swarm, check, main  # noqa: E402

MAX_SSE = 8  # node/web_http.h WEB_HTTP_MAX_SSE
KEEPALIVE_S = 2  # WEB_HTTP_KEEPALIVE_MS


def request(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read() if method != "HEAD" else b""
    c.close()
    return r.status, r.getheader("Content-Type", ""), data


class Sse:
    """One event stream, read frame by frame from a raw socket."""

    def __init__(self, port, path, headers=""):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        self.headers = head.decode().lower()

    def _until(self, sep):
        while sep not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise AssertionError(f"stream closed before {sep!r}; got {self.buf[:200]!r}")
            self.buf += chunk
        out, self.buf = self.buf.split(sep, 1)
        return out

    def frame(self):
        """The next frame with data, as (id, event dict); chunked framing is
        skipped over (a chunk-size line never looks like 'id: ' or 'data: ')."""
        while True:
            block = self._until(b"\n\n").decode()
            fid, data = None, None
            for line in block.splitlines():
                if line.startswith("id: "):
                    fid = int(line[4:])
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
            if data is not None:
                return fid, data

    def close(self):
        self.s.close()


def open_streams(port, n):
    """n event streams, each answered 200 and serving frames."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        streams = [Sse(port, "/api/events") for _ in range(n)]
        if all(s.status == 200 for s in streams):
            for s in streams:
                s.frame()
            return streams
        for s in streams:
            s.close()
        check(time.monotonic() < deadline, f"{n} event streams never fitted at once")
        time.sleep(KEEPALIVE_S + 0.5)  # closed streams free their slots at the next keepalive


def test():
    with Swarm() as sw:
        a = sw.node("a", ["--http", "127.0.0.1:0"]).start()
        url = a.wait("http.listening")["url"]
        port = int(url.rsplit(":", 1)[1].strip("/"))
        check(url == f"http://127.0.0.1:{port}/", f"odd URL {url}")

        # the page and its files, from the binary
        st, ct, body = request(port, "GET", "/")
        check(st == 200 and ct.startswith("text/html") and b'src="/app.js"' in body, f"/: {st} {ct}")
        for path, want in (("/app.js", "text/javascript"), ("/style.css", "text/css"), ("/index.html", "text/html")):
            st, ct, body = request(port, "GET", path)
            check(st == 200 and ct.startswith(want) and len(body) > 100, f"{path}: {st} {ct} {len(body)} bytes")
        st, ct, _ = request(port, "HEAD", "/")
        check(st == 200 and ct.startswith("text/html"), f"HEAD /: {st} {ct}")

        # the snapshot: the node's own log events, as JSON
        st, ct, body = request(port, "GET", "/api/snapshot")
        check(st == 200 and ct == "application/json", f"/api/snapshot: {st} {ct}")
        snap = json.loads(body)
        check(snap["kind"] == "node", f"kind {snap['kind']}")
        names = [e["event"] for e in snap["events"]]
        listening = [e for e in snap["events"] if e["event"] == "node.listening"]
        check(listening and listening[0]["id"] == a.id, f"no node.listening of {a.short} in {names}")
        seqs = snap["seq"]
        check(seqs >= len(snap["events"]), f"seq {seqs} below {len(snap['events'])} events")
        st, _, body = request(port, "GET", f"/api/snapshot?since={seqs}")
        check(st == 200 and json.loads(body)["events"] == [], "since=seq still returned events")

        # refusals
        for method, path, body, headers, want in (
                ("GET", "/nope", None, None, 404),
                ("GET", "/api", None, None, 404),
                ("GET", "/../etc/passwd", None, None, 404),
                ("POST", "/api/snapshot", "x=1", None, 405),
                ("DELETE", "/", None, None, 405),
                ("GET", "/", "12345", {"Content-Length": "5"}, 413)):
            st, ct, _ = request(port, method, path, body, headers)
            check(st == want, f"{method} {path}: {st}, wanted {want}")
        # headers past the request limit: refused by libmicrohttpd, the node lives on
        try:
            st, _, _ = request(port, "GET", "/", headers={"X-Big": "a" * 40000})
        except (ConnectionError, http.client.HTTPException):
            st = "closed"
        check(st in (413, 414, 431, "closed"), f"a 40 kB header got {st}")

        # the event stream: what happens next arrives as server-sent events
        sse = Sse(port, f"/api/events?since={seqs}")
        check(sse.status == 200 and "content-type: text/event-stream" in sse.headers,
              f"/api/events: {sse.status} {sse.headers}")
        b = sw.node("b", ["--bootstrap", a.spec]).start()
        deadline = time.monotonic() + TIMEOUT
        while True:
            fid, ev = sse.frame()
            check(fid > seqs, f"frame id {fid} not after {seqs}")
            if ev["event"] == "peer.connected" and ev["peer"] == b.short:
                break
            check(time.monotonic() < deadline, "no peer.connected on the stream")
        sse.close()
        # Last-Event-ID resumes right after the given event
        sse = Sse(port, "/api/events", "Last-Event-ID: 2\r\n")
        fid, _ = sse.frame()
        check(fid == 3, f"Last-Event-ID: 2 resumed at {fid}")
        sse.close()

        # at most MAX_SSE streams at once; the next is told to come back later.
        # Streams the client closed free their slot when the server next
        # writes to them (a keepalive), so this waits until all are free.
        streams = open_streams(port, MAX_SSE)
        st, _, _ = request(port, "GET", "/api/events")
        check(st == 503, f"stream {MAX_SSE + 1} got {st}, wanted 503")
        for s in streams:
            s.close()
        for s in open_streams(port, MAX_SSE):
            s.close()

        # SIGTERM with a stream open: the node still exits cleanly and promptly
        sse = Sse(port, "/api/events")
        a.stop()
        b.stop()

    # binding beyond loopback needs --http-public
    for cmd in ([GWTF, "node", "--listen", "127.0.0.1:0", "--http", "0.0.0.0:18099"],
                [GWTF, "swarm", "--http", "0.0.0.0:18099"],
                [GWTF, "node", "--listen", "127.0.0.1:0", "--http", "localhost:x"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
        check(p.returncode == 2, f"{' '.join(cmd[1:])}: exit {p.returncode}, wanted 2")
        check("--http" in p.stderr, f"{' '.join(cmd[1:])}: no reason given: {p.stderr}")
        print(f"refused: {' '.join(cmd[1:])}: {p.stderr.strip()}")
    with Swarm() as sw:
        pub = sw.node("pub", ["--http", "0.0.0.0:0", "--http-public"]).start()
        warn = pub.wait("http.public")
        check(warn["level"] == "warn", f"http.public at level {warn['level']}")
        pub.stop()
    print("feed: page, snapshot, event stream, 404/405/413/503 and the loopback-only default all checked")


if __name__ == "__main__":
    main(test)
