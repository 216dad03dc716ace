#!/usr/bin/env python3
"""The live web view in a real browser (headless Chromium through Selenium):

  1. a small `gwtf swarm --http 0` trains; relay r1 is made to SIGKILL itself
     at its first forward of iteration 3 (--fault, the swarm's own kill
     option), so the crash and the re-route / restart that repair it happen
     while the page is open;
  2. the page shows the stages' members and a loss point, then the crash and
     a repair on its timeline;
  3. 10 000 synthetic events from 100 peers are fed to the same page
     (flood()): the DOM stays bounded and the page keeps drawing;
  4. the browser's console has no errors.

    test_web_browser.py [--screenshot PATH]

Exits 77 (skipped) with the reason when Chromium, chromedriver or Selenium is
missing (scripts/setup.sh --test-deps installs them)."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

GWTF = os.environ.get("GWTF_BIN", "gwtf")
TIMEOUT = float(os.environ.get("GWTF_TEST_TIMEOUT", "20"))
BASE_PORT = 23200  # a block of its own, below the ephemeral range (test_swarm.py uses 21000-22799)
SWARM_TIMEOUT = 240


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def import_selenium():
    try:
        import selenium  # noqa: F401
    except ImportError:
        # Debian's python3-selenium, when python3 is another interpreter (pyenv)
        sys.path.append("/usr/lib/python3/dist-packages")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        skip(f"Selenium is not installed ({e}); apt-get install python3-selenium")
    return webdriver, Options, Service


def browser(profile):
    """Headless Chromium with its profile, and the temporary files it makes
    (its singleton socket's directory, which it does not remove), in
    profile: the caller removes it, and /tmp keeps nothing of the run."""
    webdriver, Options, Service = import_selenium()
    chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_bin = shutil.which("chromedriver")
    if not chrome or not driver_bin:
        skip("Chromium or chromedriver is missing; apt-get install chromium chromium-driver")
    opts = Options()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1100", "--no-first-run", "--disable-extensions",
              f"--user-data-dir={os.path.join(profile, 'profile')}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(driver_bin, env=dict(os.environ, TMPDIR=profile)), options=opts)
    except Exception as e:  # noqa: BLE001 - a browser that cannot start here is a skip, with its reason
        skip(f"Chromium did not start: {str(e).splitlines()[0]}")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def wait_js(driver, script, what, timeout=TIMEOUT):
    """Polls a JS expression in the page until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        v = driver.execute_script("return " + script)
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what} within {timeout:.0f}s")
        time.sleep(0.2)  # the page redraws on its own animation frames; we look again


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


class SwarmProc:
    """`gwtf swarm` with its stdout collected; the live view's URL from it."""

    def __init__(self, tmp, args):
        cmd = [GWTF, "swarm", "--workdir", os.path.join(tmp, "peers"), "--base-port", str(BASE_PORT),
               "--http", "0", "--quiet", *args]
        print("$", " ".join(cmd), flush=True)
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)
            self.cond.notify_all()

    def url(self):
        deadline = time.monotonic() + TIMEOUT
        with self.cond:
            while True:
                for line in self.lines:
                    if line is None:
                        raise AssertionError("gwtf swarm exited before serving its page: " + "\n".join(
                            x for x in self.lines if x))
                    m = re.search(r"live view: open (http://\S+)", line)
                    if m:
                        return m.group(1)
                left = deadline - time.monotonic()
                check(left > 0, "gwtf swarm never printed its live view's URL")
                self.cond.wait(left)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)  # the swarm's clean stop: children first, then its page
        try:
            self.p.wait(timeout=SWARM_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        with self.cond:  # everything it wrote, up to its EOF
            self.cond.wait_for(lambda: self.lines and self.lines[-1] is None, timeout=TIMEOUT)
        bad = [x for x in self.lines if x and ("Sanitizer" in x or "runtime error" in x)]
        check(not bad, "gwtf swarm reported: " + "\n".join(bad[:10]))
        return "\n".join(x for x in self.lines[-20:] if x)


FLOOD_JS = r"""
const peers = arguments[0], n = arguments[1];
const t0 = performance.now();
const evs = [];
const id = (i) => (0x10000000 + i * 7919).toString(16).slice(-8);
for (let i = 0; i < peers; i++) {
  const st = i % 4, node = id(i), src = 'x' + i;
  evs.push({event: 'node.listening', node, src, stage: st, addr: '10.0.0.' + i + ':7000'});
  evs.push({event: 'compute.ready', node, src, stage: st, device: 'cpu', capacity: 4});
  evs.push({event: 'stage.announced', node, src, stage: st, capacity: 4, private: i % 3 === 0 ? 1 : 0});
  evs.push({event: 'peer.ready', node, src, stage: st, iter: 0});
}
for (let k = evs.length, it = 0; k < n; k++) {
  const i = k % peers, node = id(i), st = i % 4, next = id((i + 1) % peers), mb = (k % 97).toString(16);
  switch (k % 10) {
    case 0: evs.push({event: 'iteration.done', node: id(0), stage: 0, iter: it, loss: 6 - it / 500, tokens_per_s: 900 + (k % 50)}); it++; break;
    case 1: evs.push({event: 'eval.done', node: id(0), stage: 0, iter: it, val_loss: 6.1 - it / 500}); break;
    case 2: evs.push({event: 'flow.changed', node, stage: st, in: '1', out: String(k % 3), peer: next}); break;
    case 3: evs.push({event: 'forward.rerouted', node, stage: st, mb, from_peer: next, reason: 'dead'}); break;
    case 4: evs.push({event: 'backward.recovered', node, stage: st, mb, repairs: 1}); break;
    case 5: evs.push({event: 'aggregation.done', node, stage: st, iter: it, total: 4, members: 3, hash: 'abcd'}); break;
    case 6: evs.push({event: 'microbatch.done', node: id(0), stage: 0, mb}); break;
    case 7: evs.push({event: 'peer.presumed_dead', node, stage: st, peer: next, mb}); break;
    default: evs.push({event: 'compute.done', node, stage: st, origin: id(0), mb, kind: 'forward', iter: it}); break;
  }
}
const t1 = performance.now();
for (const e of evs) { e.ts = '2026-01-01T00:00:00.000Z'; window.gwtf.ingest(e); }
const t2 = performance.now();
window.gwtf.render();
const t3 = performance.now();
return {events: evs.length, make_ms: t1 - t0, ingest_ms: t2 - t1, render_ms: t3 - t2,
        timeline: document.querySelectorAll('#timeline li').length,
        members: document.querySelectorAll('tr.member').length,
        mbs: document.querySelectorAll('#mbs .mb').length,
        dom_nodes: document.getElementsByTagName('*').length,
        loss_points: Number(document.getElementById('loss').dataset.points)};
"""


def flood(driver, peers=100, n=10000):
    """Feeds n events of `peers` peers to the page; returns its timings and
    the sizes of what it drew, after checking that they stay bounded."""
    r = driver.execute_script(FLOOD_JS, peers, n)
    # and a frame after it: the page still animates
    frame_ms = driver.execute_async_script(
        "const done = arguments[0], t = performance.now();"
        "requestAnimationFrame(() => requestAnimationFrame(() => done(performance.now() - t)));")
    r["next_frame_ms"] = frame_ms
    check(r["events"] == n, f"fed {r['events']} events, wanted {n}")
    check(r["members"] >= peers, f"{r['members']} member rows for {peers} peers")
    check(r["timeline"] <= 300, f"the timeline holds {r['timeline']} entries, more than its cap of 300")
    check(r["mbs"] <= 120, f"{r['mbs']} microbatch chips, more than the cap of 120")
    check(r["dom_nodes"] < 5000, f"{r['dom_nodes']} DOM nodes")
    check(r["loss_points"] >= n // 10, f"{r['loss_points']} loss points drawn")
    return r


def test(screenshot):
    tmp = tempfile.mkdtemp(prefix="gwtf-web-")
    try:
        driver = browser(tmp)  # skips before anything starts when there is no browser
    except SystemExit:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    sw = None
    try:
        sw = SwarmProc(tmp, ["--relays", "6", "--stages", "3", "--capacity", "3", "--iterations", "10",
                             "--fault", "r1:forward:3", "--seed", "3"])
        url = sw.url()
        driver.set_script_timeout(TIMEOUT)
        driver.get(url)
        check("gwtf" in driver.title, f"page title {driver.title!r}")
        wait_js(driver, "document.getElementById('kind').textContent === 'local swarm'", "the swarm's kind")
        members = wait_js(driver, "document.querySelectorAll('tr.member').length >= 7 && "
                                  "document.querySelectorAll('.stage').length >= 3 && "
                                  "document.querySelectorAll('tr.member').length",
                          "7 members in 3 stages", timeout=60)
        wait_js(driver, "Number(document.getElementById('loss').dataset.points) > 0", "a loss point", timeout=90)
        wait_js(driver, "document.getElementById('status').textContent === 'live'", "a live event stream")
        crash = wait_js(driver, "[...document.querySelectorAll('#timeline .tl-crash')].map(e => e.textContent)"
                                ".find(t => t.includes('r1')) || ''", "r1's crash on the timeline", timeout=120)
        repair = wait_js(driver, "[...document.querySelectorAll('#timeline .tl-repair, #timeline .tl-reroute')]"
                                 ".map(e => e.textContent).join(' | ')", "a repair on the timeline", timeout=60)
        stages = driver.execute_script(
            "return [...document.querySelectorAll('.stage')].map(s => s.dataset.stage + ':' + "
            "s.querySelectorAll('tr.member').length)")
        flows = wait_js(driver, "window.gwtf.flowEdges().size", "a flow between two peers")
        print(f"page: {members} members, stages {stages}, {flows} flows")
        print(f"timeline: crash: {crash}")
        print(f"timeline: repair(s): {repair[:300]}")
        check(flows > 0, "no flow was drawn")
        # still live: the iteration count moves on after the crash
        it0 = driver.execute_script("return window.gwtf.state.iter")
        wait_js(driver, f"window.gwtf.state.iter > {it0}", "an iteration after the crash", timeout=120)
        if screenshot:  # tall enough for the stages' tables and the microbatches too
            driver.set_window_size(1400, 1280)
            wait_js(driver, "document.querySelectorAll('tr.member').length >= 8", "the restarted relay as a member")
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            driver.save_screenshot(screenshot)
            print(f"screenshot: {screenshot}")
        errs = console_errors(driver)
        check(not errs, f"console errors: {json.dumps(errs)[:800]}")
        # 100 peers, 10 000 events: bounded DOM, still drawing
        r = flood(driver)
        print("flood: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
        errs = console_errors(driver)
        check(not errs, f"console errors after the flood: {json.dumps(errs)[:800]}")
    finally:
        tail = sw.stop() if sw else ""
        driver.quit()
        shutil.rmtree(tmp, ignore_errors=True)
    print("swarm's last lines:\n" + tail)


def main():
    screenshot = None
    if len(sys.argv) > 2 and sys.argv[1] == "--screenshot":
        screenshot = sys.argv[2]
    try:
        test(screenshot)
    except AssertionError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
