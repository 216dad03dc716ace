#!/usr/bin/env python3
"""Benchmark of the live web view's page (docs/WEB.md): a headless Chromium
opens `gwtf node --http`'s page and is fed N synthetic events from P peers
(node.listening ... iteration.done, flow.changed, re-routes, repairs,
aggregations), then draws once. Prints the time to take the events in, to
draw them, the next animation frame, and the sizes the DOM kept (the
timeline and microbatch chips are capped; curves are drawn on a canvas).

    scripts/bench_web.py [--gwtf build/node/gwtf] [--peers 100] [--events 10000 50000]

Needs chromium, chromium-driver and python3-selenium (setup.sh --test-deps)."""
import argparse
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "test", "node"))

ap = argparse.ArgumentParser()
ap.add_argument("--gwtf", default=os.path.join(here, "..", "build", "node", "gwtf"))
ap.add_argument("--peers", type=int, default=100)
ap.add_argument("--events", type=int, nargs="+", default=[10000, 50000])
args = ap.parse_args()
os.environ["GWTF_BIN"] = args.gwtf

import gwtfproc  # noqa: E402
import test_web_browser as tb  # noqa: E402

driver = tb.browser()
try:
    with gwtfproc.Swarm() as sw:
        n = sw.node("bench", ["--http", "127.0.0.1:0"]).start()
        url = n.wait("http.listening")["url"]
        print(f"{'peers':>5} {'events':>7} {'ingest ms':>9} {'draw ms':>8} {'frame ms':>8} "
              f"{'timeline':>8} {'members':>7} {'DOM nodes':>9}")
        for count in args.events:
            driver.get(url)
            tb.wait_js(driver, "document.getElementById('status').textContent === 'live'", "a live stream")
            r = tb.flood(driver, args.peers, count)
            print(f"{args.peers:>5} {count:>7} {r['ingest_ms']:>9.1f} {r['render_ms']:>8.1f} "
                  f"{r['next_frame_ms']:>8.1f} {r['timeline']:>8} {r['members']:>7} {r['dom_nodes']:>9}")
            errs = tb.console_errors(driver)
            if errs:
                sys.exit(f"console errors: {errs}")
        n.stop()
finally:
    driver.quit()
