#!/usr/bin/env bash
# test/ship/deb_install.sh DEB CACHE_DIR — installs the package into a clean
# Debian 12 root and runs what a new user runs first:
#   gwtf --version, gwtf help node, gwtf node --device cuda (without CUDA)
# The root comes from debootstrap (minbase) once and is kept as a tarball in
# CACHE_DIR; every run unpacks a fresh copy, so nothing of the build machine
# leaks in. apt resolves the package's Depends from the mirror, which is the
# point: a missing dependency fails here.
# Needs root, debootstrap and the Debian mirror; without them prints
# "SKIPPED: reason" and exits 77.
set -euo pipefail

deb=$(realpath "$1")
cache=$2
mirror=${GWTF_DEB_MIRROR:-http://deb.debian.org/debian}
suite=${GWTF_DEB_SUITE:-bookworm}

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap and chroot)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (scripts/setup.sh --test-deps)"
[ -f "$deb" ] || { echo "FAIL: no package at $1"; exit 1; }

mkdir -p "$cache"
base="$cache/debroot-$suite.tar"
work=$(mktemp -d "$cache/root.XXXXXX")
root="$work/root"
cleanup() {
  for m in proc dev/pts dev; do mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"; done
  rm -rf "$work"
}
trap cleanup EXIT

if [ ! -f "$base" ]; then
  echo "deb_install: making a clean $suite root with debootstrap (once; cached in $base)"
  if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 5 "$work/debootstrap.log"
    skip "debootstrap could not build a $suite root from $mirror (no network?)"
  fi
  rm -rf "$root/var/cache/apt/archives/"*.deb
  tar -C "$root" -cf "$base.tmp" . && mv "$base.tmp" "$base"
  rm -rf "$root"
fi
mkdir -p "$root"
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mount -t proc proc "$root/proc"
# Packages downloaded by an earlier run, so a second run is fast.
mkdir -p "$cache/apt-archives"
cp "$cache/apt-archives/"*.deb "$root/var/cache/apt/archives/" 2>/dev/null || true
cp "$deb" "$root/tmp/"
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

echo "deb_install: apt install $(basename "$deb") into the clean root"
if ! in_root apt-get update -q >"$work/apt.log" 2>&1; then
  tail -n 5 "$work/apt.log"
  skip "apt-get update in the clean root could not reach $mirror"
fi
if ! in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
       "/tmp/$(basename "$deb")" >>"$work/apt.log" 2>&1; then
  tail -n 20 "$work/apt.log"
  echo "FAIL: the package does not install on a clean $suite"
  exit 1
fi
cp "$root/var/cache/apt/archives/"*.deb "$cache/apt-archives/" 2>/dev/null || true

fail() { echo "FAIL: $*"; exit 1; }
out=$(in_root gwtf --version) || fail "gwtf --version exited $?"
grep -Eq '^gwtf [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-f]{7,}(-dirty)?|unknown\)$' <<<"$out" ||
  fail "gwtf --version printed: $out"
echo "ok: $out"
help=$(in_root gwtf help node) || fail "gwtf help node exited $?"
grep -q -- '--device cpu|cuda' <<<"$help" || fail "gwtf help node lacks --device"
echo "ok: gwtf help node ($(echo "$help" | wc -l) lines)"
for f in /usr/share/man/man1/gwtf.1 /etc/gwtf/node.conf /lib/systemd/system/gwtf-node.service \
         /usr/share/doc/gwtf/README.md; do
  [ -e "$root$f" ] || [ -e "$root/usr$f" ] || fail "$f is not installed"
done
echo "ok: man page, node.conf, gwtf-node.service and docs installed"
# No CUDA in this root: the CPU-only machine case, with the same package.
in_root gwtf data synth --out /tmp/data.txt --bytes 20000 >/dev/null 2>&1 || fail "gwtf data synth exited $?"
set +e
said=$(in_root gwtf node --listen 127.0.0.1:0 --port-mapping off --data-dir /tmp/n --device cuda \
        --create-run x --dataset /tmp/data.txt 2>&1)
rc=$?
set -e
[ $rc -ne 0 ] || fail "gwtf node --device cuda succeeded without CUDA"
grep -q 'compute.unavailable device=cuda' <<<"$said" || fail "--device cuda without CUDA said: $said"
echo "ok: --device cuda without CUDA: $(echo "$said" | grep compute.unavailable | grep -o "err=.*" | head -c 300)"
echo "deb_install: passed"
