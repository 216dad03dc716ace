#!/usr/bin/env python3
"""`gwtf export --bootstrap` against a live swarm (issue 19, item 1).

A `gwtf swarm` (1 data node, 6 relays, 3 stages: two members per relay
stage) trains; once every stage has aggregated a few times, gwtf export
joins through the data node, finds the run and its stage directory in the
DHT and downloads every stage from members while they keep training. The
test checks, from the two processes' logs:
  - every stage was downloaded, relay stages from two members whose weight
    hashes agree, all stages at one iteration;
  - each downloaded weight hash is the hash the swarm's members logged at
    that step's aggregation (aggregation.done), so the export holds exactly
    the weights the swarm trained;
  - config.json says source swarm and that iteration; gwtf sample runs on it;
  - an unknown run gives up after --timeout-ms with exit 1;
and, with two plain `gwtf node`s writing checkpoints every 2 iterations,
that the sidecars carry the aggregation's hash and iteration and that
`gwtf export --from-checkpoints` over both data directories exports the
last one.
No sleep stands in for synchronisation: the test waits for log lines."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

GWTF = os.environ.get("GWTF_BIN", "gwtf")
PORT = 31400  # below the ephemeral range (32768+); the block 31000-31499 was given to this work
LINE = re.compile(r"^(?P<name>\S+)\s+\| \S+ \S+\s+\S+ s(?P<stage>\d+) (?P<event>\S+)(?P<rest>.*)$")
TIMEOUT = 180


def fields(rest):
    return dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)


class Swarm:
    """gwtf swarm in the background; its lines collected as they come."""

    def __init__(self, tmp):
        self.lines, self.cond, self.eof = [], threading.Condition(), False
        cmd = [GWTF, "swarm", "--relays", "6", "--stages", "3", "--iterations", "5000", "--model", "tiny",
               "--seq", "32", "--batch", "2", "--microbatches", "2", "--base-port", str(PORT),
               "--workdir", os.path.join(tmp, "peers"), "--dataset", os.path.join(tmp, "corpus.txt")]
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def aggregations(self):
        """(stage, step) -> set of weight-hash prefixes logged by members."""
        out = {}
        with self.cond:
            lines = list(self.lines)
        for line in lines:
            m = LINE.match(line)
            if m and m["event"] == "aggregation.done":
                f = fields(m["rest"])
                out.setdefault((int(m["stage"]), int(f["step"])), set()).add(f["hash"])
        return out

    def wait_logged(self, keys):
        """Until the swarm's merged log shows aggregation.done for every (stage, step)."""
        with self.cond:
            ok = self.cond.wait_for(lambda: set(keys) <= set(self.aggregations()) or self.eof,
                                    timeout=TIMEOUT)
        if not set(keys) <= set(self.aggregations()):
            raise SystemExit(f"FAIL: no aggregation.done for {sorted(keys)} in the swarm's log")

    def wait_aggregated(self, stages, step):
        """Until every stage logged aggregation.done with at least this step."""
        def ready():
            done = {s for (s, st) in self.aggregations() if st >= step}
            return done >= set(stages)
        with self.cond:
            if not self.cond.wait_for(lambda: ready() or self.eof, timeout=TIMEOUT):
                raise SystemExit(f"FAIL: the swarm did not aggregate step {step} in {TIMEOUT} s")
        if self.eof:
            raise SystemExit("FAIL: the swarm exited:\n" + "\n".join(self.lines[-20:]))

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t.join(timeout=5)


def export(*args, timeout=120):
    p = subprocess.run([GWTF, "export", *args], capture_output=True, text=True, timeout=timeout)
    events = []
    for line in p.stderr.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[4].startswith("export."):
            events.append((parts[4], fields(" ".join(parts[5:]))))
    return p, events


class Node:
    """One gwtf node; its lines collected as they come."""

    def __init__(self, *args):
        self.lines, self.cond, self.eof = [], threading.Condition(), False
        self.p = subprocess.Popen([GWTF, "node", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    _read = Swarm._read

    def wait_line(self, *needles):
        """Until one line holds every needle (as whole words)."""
        def has():
            return any(all(n in l.split() for n in needles) for l in self.lines)
        with self.cond:
            self.cond.wait_for(lambda: has() or self.eof, timeout=TIMEOUT)
            found = has()
        if not found:
            raise SystemExit(f"FAIL: no line with {needles} from gwtf node:\n" + "\n".join(self.lines[-15:]))

    def events(self, name):
        with self.cond:
            return [fields(l.split(name, 1)[1]) for l in self.lines if f" {name} " in l]

    stop = Swarm.stop


def checkpoints_from_nodes(tmp):
    """A data node and a relay (one stage) write checkpoints every 2 of 6
    iterations; export reads both data directories."""
    base = PORT + 10
    common = ["--nat-pmp", "off", "--threads", "1", "--checkpoint-every", "2", "--log-format", "text"]
    d = Node("--listen", f"127.0.0.1:{base}", "--data-dir", os.path.join(tmp, "a"), "--create-run", "ck", "--open",
             "--model", "tiny-llama", "--stages", "1", "--iterations", "6", "--dataset",
             os.path.join(tmp, "corpus.txt"), "--batch", "2", "--seq", "32", "--microbatches", "2", *common)
    r = Node("--listen", f"127.0.0.1:{base + 1}", "--data-dir", os.path.join(tmp, "b"), "--run", "ck",
             "--bootstrap", f"127.0.0.1:{base}", *common)
    try:
        r.wait_line("checkpoint.saved", "iter=6")
        d.wait_line("checkpoint.saved", "iter=6")
    finally:
        r.stop()
        d.stop()
    aggs = {(0, f["step"]): f["hash"] for f in d.events("aggregation.done")}
    aggs.update({(1, f["step"]): f["hash"] for f in r.events("aggregation.done")})
    for s, dd in ((0, "a"), (1, "b")):
        with open(os.path.join(tmp, dd, "checkpoints", f"ck.stage{s}.safetensors.json")) as fh:
            side = json.load(fh)
        assert side["run"] == "ck" and side["stage"] == s and side["iteration"] == 6, side
        assert side["weight_hash"].startswith(aggs[(s, "6")]), (side, aggs)
    out = os.path.join(tmp, "ck-export")
    p, ev = export("--run", "ck", "--out", out, "--from-checkpoints", os.path.join(tmp, "a"), os.path.join(tmp, "b"))
    assert p.returncode == 0 and any(e == "export.written" for e, _ in ev), p.stderr[-2000:]
    with open(os.path.join(out, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == "llama" and cfg["gwtf"]["iteration"] == 6, cfg
    print("node checkpoints: sidecars carry the aggregation's hash; export --from-checkpoints a b: iteration 6")


def main():
    tmp = tempfile.mkdtemp(prefix="gwtf_export_live_")
    subprocess.run([GWTF, "data", "synth", "--out", os.path.join(tmp, "corpus.txt"), "--bytes", "200000"],
                   check=True, capture_output=True)
    sw = Swarm(tmp)
    try:
        sw.wait_aggregated([0, 1, 2, 3], 3)
        out = os.path.join(tmp, "export")
        p, ev = export("--run", "swarm", "--out", out, "--bootstrap", f"127.0.0.1:{PORT}", "--listen",
                       "127.0.0.1:0", "--timeout-ms", "60000")
        if p.returncode != 0:
            raise SystemExit(f"FAIL: export exited {p.returncode}\n{p.stderr[-3000:]}")
        with open(os.path.join(out, "config.json")) as fh:
            g = json.load(fh)["gwtf"]
        assert g["source"] == "swarm", g
        it = g["iteration"]
        # the downloads of the exported iteration (other rounds may have
        # fetched stages that were behind or ahead)
        downloads = [f for e, f in ev if e == "export.downloaded" and int(f["iter"]) == it]
        by_stage = {}
        for f in downloads:
            by_stage.setdefault(int(f["stage"]), []).append(f)
        assert sorted(by_stage) == [0, 1, 2, 3], (it, by_stage)
        final = {}
        for st, fs in by_stage.items():
            assert len({f["hash"] for f in fs}) == 1, f"stage {st}: members disagree {fs}"
            if st:
                assert len({f["peer"] for f in fs}) >= 2, f"stage {st}: not two members {fs}"
            final[st] = fs[0]
        # the swarm's log lines of the aggregations the export saw (merged
        # from the peers' pipes, they may come a moment after the export)
        sw.wait_logged({(st, int(f["step"])) for st, f in final.items()})
        agg = sw.aggregations()
        for st, f in final.items():
            logged = agg.get((st, int(f["step"])), set())
            assert f["hash"] in logged, f"stage {st} step {f['step']}: exported {f['hash']}, swarm logged {logged}"
        rounds = sum(1 for e, _ in ev if e == "export.refetch")
        s = subprocess.run([GWTF, "sample", "--model", out, "--prompt", "The ", "--tokens", "16", "--seed", "2"],
                           capture_output=True, timeout=60)
        assert s.returncode == 0 and len(s.stdout) >= 20, s
        print(f"exported iteration {it} after {rounds} re-fetch round(s): " +
              " ".join(f"s{k}={v['hash']}" for k, v in sorted(final.items())) +
              " (each equals the swarm's aggregation.done hash; relay stages from two agreeing members)")
        p, ev = export("--run", "nosuchrun", "--out", os.path.join(tmp, "none"), "--bootstrap",
                       f"127.0.0.1:{PORT}", "--listen", "127.0.0.1:0", "--timeout-ms", "3000")
        assert p.returncode == 1 and any(e == "export.timeout" for e, _ in ev), p.stderr[-2000:]
        assert not os.path.exists(os.path.join(tmp, "none", "model.safetensors"))
    finally:
        sw.stop()
    checkpoints_from_nodes(tmp)
    shutil.rmtree(tmp, ignore_errors=True)  # passed: the swarm's files are of no more use
    print("ok")


if __name__ == "__main__":
    main()
