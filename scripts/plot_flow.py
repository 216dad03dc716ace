#!/usr/bin/env python3
"""scripts/plot_flow.py — cost against rounds for gwtf, the optimum and greedy, as a PNG.

  scripts/plot_flow.py --setting 1 --seed 1 [--out flow.png]
  scripts/plot_flow.py --instance data/instances/table5-setting1-seed1.json [--out flow.png]
      [--gwtf build/node/gwtf] [--rounds 120] [--objective sum] [--extra "--loss 0.05"]

Runs `gwtf sim flow --trace --json` for the protocol and the two reference
algorithms and draws two panels: total cost of the complete flows per round
(gwtf) against the optimum's and greedy's, and the number of flows. The
optimum needs an instance with one data node; it is left out otherwise.

Standard library only (the PNG is written by hand: zlib + a 5x7 font), so it
runs wherever the project builds.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

# ---- a tiny raster canvas ----

FONT = {  # 5x7 glyphs, one 5-bit row per entry, top to bottom
    "0": [14, 17, 19, 21, 25, 17, 14], "1": [4, 12, 4, 4, 4, 4, 14], "2": [14, 17, 1, 2, 4, 8, 31],
    "3": [31, 2, 4, 2, 1, 17, 14], "4": [2, 6, 10, 18, 31, 2, 2], "5": [31, 16, 30, 1, 1, 17, 14],
    "6": [6, 8, 16, 30, 17, 17, 14], "7": [31, 1, 2, 4, 8, 8, 8], "8": [14, 17, 17, 14, 17, 17, 14],
    "9": [14, 17, 17, 15, 1, 2, 12], ".": [0, 0, 0, 0, 0, 12, 12], "-": [0, 0, 0, 31, 0, 0, 0],
    ":": [0, 12, 12, 0, 12, 12, 0], "%": [24, 25, 2, 4, 8, 19, 3], "(": [2, 4, 8, 8, 8, 4, 2],
    ")": [8, 4, 2, 2, 2, 4, 8], "/": [0, 1, 2, 4, 8, 16, 0], " ": [0] * 7, ",": [0, 0, 0, 0, 12, 4, 8],
    "a": [0, 0, 14, 1, 15, 17, 15], "b": [16, 16, 22, 25, 17, 17, 30], "c": [0, 0, 14, 16, 16, 17, 14],
    "d": [1, 1, 13, 19, 17, 17, 15], "e": [0, 0, 14, 17, 31, 16, 14], "f": [6, 9, 8, 28, 8, 8, 8],
    "g": [0, 0, 15, 17, 15, 1, 14], "h": [16, 16, 22, 25, 17, 17, 17], "i": [4, 0, 12, 4, 4, 4, 14],
    "j": [2, 0, 6, 2, 2, 18, 12], "k": [16, 16, 18, 20, 24, 20, 18], "l": [12, 4, 4, 4, 4, 4, 14],
    "m": [0, 0, 26, 21, 21, 17, 17], "n": [0, 0, 22, 25, 17, 17, 17], "o": [0, 0, 14, 17, 17, 17, 14],
    "p": [0, 0, 30, 17, 30, 16, 16], "q": [0, 0, 15, 17, 15, 1, 1], "r": [0, 0, 22, 25, 16, 16, 16],
    "s": [0, 0, 14, 16, 14, 1, 30], "t": [8, 8, 28, 8, 8, 9, 6], "u": [0, 0, 17, 17, 17, 19, 13],
    "v": [0, 0, 17, 17, 17, 10, 4], "w": [0, 0, 17, 17, 21, 21, 10], "x": [0, 0, 17, 10, 4, 10, 17],
    "y": [0, 0, 17, 17, 15, 1, 30], "z": [0, 0, 31, 2, 4, 8, 31],
}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def dot(self, x, y, rgb):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(rgb)

    def rect(self, x0, y0, x1, y1, rgb):
        for y in range(max(0, y0), min(self.h, y1)):
            for x in range(max(0, x0), min(self.w, x1)):
                self.dot(x, y, rgb)

    def line(self, x0, y0, x1, y1, rgb, width=1, dash=0):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, step = dx + dy, 0
        while True:
            if not dash or (step // dash) % 2 == 0:
                self.rect(x0 - width // 2, y0 - width // 2, x0 + (width + 1) // 2, y0 + (width + 1) // 2, rgb)
            step += 1
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, rgb=(0, 0, 0), scale=2, right=False):
        if right:
            x -= len(s) * 6 * scale
        for ch in s.lower():
            rows = FONT.get(ch, FONT[" "])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits >> (4 - c) & 1:
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, rgb)
            x += 6 * scale

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(tag, data):
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xffffffff)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)) +
                    chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


# ---- plotting ----

BLUE, GREEN, RED, GREY, DARK = (31, 90, 180), (30, 140, 60), (200, 50, 40), (225, 225, 225), (60, 60, 60)


def nice_ticks(lo, hi, n=5):
    span = max(hi - lo, 1e-9)
    raw = span / n
    mag = 10 ** int(f"{raw:e}".split("e")[1])
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = (lo // step) * step
    ticks = []
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            ticks.append(t)
        t += step
    return ticks


def panel(cv, box, rounds, series, title, legend_low=False):
    x0, y0, x1, y1 = box
    ys = [v for _, pts, _ in series for v in pts if v is not None]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.08 or 1
    lo, hi = max(0, lo - pad), hi + pad
    sx = lambda r: x0 + (x1 - x0) * (r - 1) / max(rounds - 1, 1)
    sy = lambda v: y1 - (y1 - y0) * (v - lo) / (hi - lo)
    for t in nice_ticks(lo, hi):
        cv.line(x0, sy(t), x1, sy(t), GREY)
        cv.text(x0 - 8, int(sy(t)) - 7, f"{t:g}", DARK, 2, right=True)
    for t in nice_ticks(1, rounds):
        if t < 1:
            continue
        cv.line(sx(t), y1, sx(t), y1 + 5, DARK)
        cv.text(int(sx(t)) - len(f"{t:g}") * 6, y1 + 10, f"{t:g}", DARK, 2)
    cv.line(x0, y0, x0, y1, DARK)
    cv.line(x0, y1, x1, y1, DARK)
    cv.text(x0, y0 - 26, title, (0, 0, 0), 2)
    cv.text(x1, y1 + 32, "rounds", DARK, 2, right=True)
    for (name, pts, (rgb, dash)) in series:
        prev = None
        for r, v in enumerate(pts, start=1):
            if v is None:
                prev = None
                continue
            if prev:
                cv.line(sx(prev[0]), sy(prev[1]), sx(r), sy(v), rgb, 2, dash)
            prev = (r, v)
    lx, ly = x1 - 230, (y1 - 24 * len(series) - 8) if legend_low else y0 + 8
    for name, _, (rgb, dash) in series:
        cv.line(lx, ly + 7, lx + 30, ly + 7, rgb, 3, dash)
        cv.text(lx + 40, ly, name, (0, 0, 0), 2)
        ly += 24


def run(gwtf, args):
    out = subprocess.run([gwtf, "sim", "flow", *args, "--json"], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--gwtf", default=os.path.join(here, "..", "build", "node", "gwtf"))
    ap.add_argument("--instance")
    ap.add_argument("--setting", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=120)
    ap.add_argument("--objective", default="sum")
    ap.add_argument("--extra", default="")
    ap.add_argument("--out", default="flow.png")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        inst = a.instance
        if not inst:
            if not a.setting:
                ap.error("give --instance FILE or --setting K")
            inst = os.path.join(tmp, "instance.json")
            subprocess.run([a.gwtf, "sim", "gen", "--setting", str(a.setting), "--seed", str(a.seed), "--out", inst],
                           check=True)
        g = run(a.gwtf, ["--instance", inst, "--algo", "gwtf", "--objective", a.objective, "--rounds",
                         str(a.rounds), "--seed", str(a.seed), "--trace", *a.extra.split()])
        if g is None:
            sys.exit("gwtf sim flow failed")
        opt = run(a.gwtf, ["--instance", inst, "--algo", "optimal"])
        gr = run(a.gwtf, ["--instance", inst, "--algo", "greedy"])
    t = g["trace"]
    cost = [x["total_cost"] if x["num_flows"] else None for x in t]
    flows = [x["num_flows"] for x in t]
    cost_series = [("gwtf (" + a.objective + ")", cost, (BLUE, 0))]
    flow_series = [("gwtf", flows, (BLUE, 0))]
    if opt:
        cost_series.append(("optimal", [opt["total_cost"]] * len(t), (GREEN, 6)))
        flow_series.append(("optimal", [opt["num_flows"]] * len(t), (GREEN, 6)))
    cost_series.append(("greedy", [gr["total_cost"]] * len(t), (RED, 6)))
    flow_series.append(("greedy", [gr["num_flows"]] * len(t), (RED, 6)))
    cv = Canvas(900, 760)
    name = f"setting {a.setting} seed {a.seed}" if a.setting else os.path.basename(inst)
    panel(cv, (110, 50, 870, 350), len(t), cost_series, f"total cost of the complete flows - {name}")
    panel(cv, (110, 450, 870, 690), len(t), flow_series, "number of flows", legend_low=True)
    cv.png(a.out)
    print(f"wrote {a.out}: gwtf {g['num_flows']} flows at {g['total_cost']:g}"
          + (f", optimal {opt['num_flows']} at {opt['total_cost']:g}" if opt else "")
          + f", greedy {gr['num_flows']} at {gr['total_cost']:g}")


if __name__ == "__main__":
    main()
