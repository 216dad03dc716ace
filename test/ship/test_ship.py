"""Checks of what a user installs and runs (docs/INSTALL.md).

    test_ship.py CHECK BUILD_DIR SOURCE_DIR     (GWTF_BIN: the gwtf under test)

version       gwtf --version names the version and the git commit
man           gwtf.1 holds, for every command, exactly what `gwtf help` prints
cuda_missing  gwtf links no CUDA library; --device cuda without the backend says why
service       the service's start script passes node.conf's settings as options
              gwtf node knows; systemd-analyze verify accepts the unit
startup       a node logs its device, threads and memory budget at start

Exit 0: passed; 77: skipped (the reason is printed); anything else: failed.
Standard library only."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

GWTF = os.environ.get("GWTF_BIN", "gwtf")
TIMEOUT = 30


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def skip(msg):
    print(f"SKIPPED: {msg}")
    sys.exit(77)


def run(args, env=None, check=True):
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if check and p.returncode != 0:
        fail(f"{' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def check_version(build, src):
    out = run([GWTF, "--version"]).stdout.strip()
    m = re.fullmatch(r"gwtf (\d+\.\d+\.\d+) \(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\)", out)
    if not m:
        fail(f"--version printed {out!r}")
    cmake = open(os.path.join(src, "CMakeLists.txt")).read()
    want = re.search(r"project\(gwtf VERSION (\S+)", cmake).group(1)
    if m.group(1) != want:
        fail(f"--version says {m.group(1)}, CMakeLists.txt {want}")
    if shutil.which("git") and os.path.isdir(os.path.join(src, ".git")):
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        if m.group(2) != "unknown" and not head.startswith(m.group(2).split("-")[0]):
            # The tree may have moved on since the build; the commit must still exist.
            r = subprocess.run(["git", "-C", src, "cat-file", "-e", m.group(2).split("-")[0]])
            if r.returncode != 0:
                fail(f"--version names commit {m.group(2)}, not in this repository")
    print(f"ok: {out}")


def unroff(line):
    if line.startswith("\\&"):
        line = line[2:]
    return line.replace("\\-", "-").replace("\\(em", "\u2014").replace("\\e", "\\")


def man_sections(page):
    """{command: text} from the page's `.SS "gwtf CMD"` / .nf ... .fi blocks."""
    out, cmd, body = {}, None, None
    for line in page.splitlines():
        m = re.fullmatch(r'\.SS "gwtf (.+)"', line)
        if m:
            cmd, body = m.group(1), None
        elif cmd and line == ".nf":
            body = []
        elif cmd and line == ".fi" and body is not None:
            out[cmd] = "\n".join(body) + "\n"
            cmd = body = None
        elif body is not None:
            body.append(unroff(line))
    return out


def check_man(build, src):
    page_path = os.path.join(build, "node", "gwtf.1")
    if not os.path.exists(page_path):
        fail(f"{page_path} was not generated")
    page = open(page_path, encoding="utf-8").read()
    commands = run([GWTF, "help", "--list"]).stdout.splitlines()
    listed = run([GWTF, "--help"]).stdout
    if len(commands) < 10:
        fail(f"gwtf help --list names only {commands}")
    sections = man_sections(page)
    for cmd in commands:
        if f"  {cmd} " not in listed:
            fail(f"'{cmd}' is missing from gwtf --help")
        want = run([GWTF, "help"] + cmd.split()).stdout
        if sections.get(cmd) != want:
            fail(f"the man page's section for '{cmd}' differs from `gwtf help {cmd}`")
    if set(sections) != set(commands):
        fail(f"man page sections {sorted(set(sections) - set(commands))} name no command")
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-ww", "-z", page_path], capture_output=True, text=True)
        if r.returncode != 0 or r.stderr.strip():
            fail(f"groff warns about gwtf.1: {r.stderr.strip()}")
    print(f"ok: {len(commands)} commands, each section equal to gwtf help")


def check_cuda_missing(build, src):
    if shutil.which("readelf"):
        dyn = run(["readelf", "-d", GWTF]).stdout
        needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dyn)
        cuda = [n for n in needed if re.match(r"lib(cudart|cublas|cuda)\b", n)]
        if cuda:
            fail(f"gwtf links {cuda}: it would not start where CUDA is missing")
        print(f"ok: gwtf needs {len(needed)} libraries, none from CUDA")
    env = dict(os.environ, GWTF_CUDA_MODULE=os.path.join(build, "no-such-dir", "gwtf-cuda.so"))
    p = run([GWTF, "bench", "stage", "--device", "cuda", "--iters", "1", "--warmup", "0"], env=env, check=False)
    if p.returncode == 0:
        fail("bench stage --device cuda succeeded without the CUDA backend")
    said = p.stderr.strip()
    if not ("CUDA backend cannot be loaded" in said or "built without the CUDA backend" in said):
        fail(f"--device cuda without the backend said: {said!r}")
    if "--device cpu" not in said:
        fail(f"--device cuda without the backend does not point to --device cpu: {said!r}")
    print(f"ok: {said}")
    # The CPU still works in the same binary.
    run([GWTF, "bench", "stage", "--device", "cpu", "--iters", "1", "--warmup", "0", "--threads", "1"], env=env)
    print("ok: --device cpu runs")


def check_service(build, src):
    script = os.path.join(build, "packaging", "gwtf-node-service")
    unit = os.path.join(build, "packaging", "gwtf-node.service")
    with tempfile.TemporaryDirectory() as tmp:
        echo = os.path.join(tmp, "echo-args")
        with open(echo, "w") as f:
            f.write('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        os.chmod(echo, 0o755)
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GWTF_PROGRAM": echo, "STATE_DIRECTORY": "/var/lib/gwtf"}
        # Every setting empty: only the defaults.
        empty = dict(base, GWTF_RUN="", GWTF_BOOTSTRAP="", GWTF_DEVICE="", GWTF_LISTEN="", GWTF_THREADS="",
                     GWTF_EXTRA_ARGS="")
        got = run([script], env=empty).stdout.split("\n")[:-1]
        want = ["node", "--data-dir", "/var/lib/gwtf", "--listen", "0.0.0.0:7447", "--device", "cpu"]
        if got != want:
            fail(f"empty node.conf gives {got}, want {want}")
        full = dict(base, GWTF_RUN="myrun", GWTF_BOOTSTRAP=f"{'ab' * 32}@192.0.2.1:7447  198.51.100.2:7000",
                    GWTF_DEVICE="cuda:1", GWTF_LISTEN="0.0.0.0:9000", GWTF_THREADS="6",
                    GWTF_EXTRA_ARGS="--log-format json --port-mapping off")
        got = run([script], env=full).stdout.split("\n")[:-1]
        want = ["node", "--data-dir", "/var/lib/gwtf", "--listen", "0.0.0.0:9000", "--device", "cuda:1",
                "--run", "myrun", "--bootstrap", f"{'ab' * 32}@192.0.2.1:7447", "--bootstrap",
                "198.51.100.2:7000", "--threads", "6", "--log-format", "json", "--port-mapping", "off"]
        if got != want:
            fail(f"node.conf settings give {got}, want {want}")
        # The options it passes are gwtf node's.
        node_help = run([GWTF, "help", "node"]).stdout
        for opt in [a for a in want if a.startswith("--")]:
            if f"  {opt} " not in node_help:
                fail(f"the service passes {opt}, which gwtf help node does not list")
        conf = open(os.path.join(src, "packaging", "node.conf")).read()
        for var in ["GWTF_RUN", "GWTF_BOOTSTRAP", "GWTF_DEVICE", "GWTF_LISTEN", "GWTF_THREADS", "GWTF_EXTRA_ARGS"]:
            if not re.search(rf"^{var}=", conf, re.M):
                fail(f"node.conf does not set {var}")
        print("ok: node.conf's settings become gwtf node options")

        text = open(unit).read()
        for need in ["DynamicUser=yes", "StateDirectory=gwtf", "Restart=on-failure", "NoNewPrivileges=yes",
                     "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes"]:
            if need not in text:
                fail(f"gwtf-node.service lacks {need}")
        analyze = shutil.which("systemd-analyze")
        if not analyze:
            skip("systemd-analyze is not installed; the unit's settings were checked, not verified")
        # Verify the unit as installed, with its files taken from this tree.
        local = os.path.join(tmp, "gwtf-node.service")
        text = re.sub(r"^ExecStart=.*$", f"ExecStart={script}", text, flags=re.M)
        text = re.sub(r"^EnvironmentFile=.*$", f"EnvironmentFile={src}/packaging/node.conf", text, flags=re.M)
        with open(local, "w") as f:
            f.write(text)
        r = subprocess.run([analyze, "verify", "--man=no", local], capture_output=True, text=True, timeout=TIMEOUT)
        complaints = [l for l in (r.stdout + r.stderr).splitlines() if "gwtf-node" in l]
        if r.returncode != 0 or complaints:
            fail(f"systemd-analyze verify (exit {r.returncode}): {(r.stdout + r.stderr).strip()}")
        print("ok: systemd-analyze verify accepts gwtf-node.service")


def check_startup(build, src):
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        run([GWTF, "data", "synth", "--out", data, "--bytes", "20000"], check=False)
        if not os.path.exists(data):
            with open(data, "w") as f:
                f.write("the quick brown fox jumps over the lazy dog. " * 500)
        args = [GWTF, "node", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(tmp, "n"), "--port-mapping", "off",
                "--create-run", "shiptest", "--dataset", data, "--iterations", "1"]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines, found = [], threading.Event()

        def read():
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if " compute.ready " in line or " compute.unavailable " in line:
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        found.wait(TIMEOUT)
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
        ready = [l for l in lines if " compute.ready " in l]
        if not ready:
            fail("no compute.ready line; the node printed:\n" + "\n".join(lines[-20:]))
        line = ready[0]
        cores = len(os.sched_getaffinity(0))
        m = re.search(r"device=(\S+) .*threads=(\d+) .*mem_total_mb=(\d+) .*budget_mb=(\d+)", line)
        if not m:
            fail(f"compute.ready lacks device, threads or memory: {line}")
        if m.group(1) != "cpu" or int(m.group(2)) != cores:
            fail(f"default threads should be every core ({cores}): {line}")
        if not 0 < int(m.group(4)) <= int(m.group(3)):
            fail(f"memory budget out of range: {line}")
        print(f"ok: {line}")
        # A device that cannot be used stops the node at once, saying why.
        env = dict(os.environ, GWTF_CUDA_MODULE=os.path.join(tmp, "none", "gwtf-cuda.so"))
        p = subprocess.run(args[:2] + ["--device", "cuda"] + args[2:], capture_output=True, text=True, env=env,
                           timeout=TIMEOUT)
        said = [l for l in (p.stdout + p.stderr).splitlines() if "compute.unavailable" in l]
        if p.returncode == 0 or not said or "CUDA" not in said[0]:
            fail(f"--device cuda without CUDA: exit {p.returncode}, {(p.stdout + p.stderr).strip()[-400:]}")
        print(f"ok: exit {p.returncode}: {said[0]}")


CHECKS = {"version": check_version, "man": check_man, "cuda_missing": check_cuda_missing,
          "service": check_service, "startup": check_startup}

if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in CHECKS:
        sys.exit(__doc__)
    CHECKS[sys.argv[1]](sys.argv[2], sys.argv[3])
