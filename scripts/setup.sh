#!/usr/bin/env bash
# scripts/setup.sh — install what is missing, configure and build gwtf.
#
#   scripts/setup.sh [--build-dir DIR] [--sanitize] [--cuda AUTO|ON|OFF] [--werror] [--cc gcc|clang]
#                    [--test-deps]
#
# --werror turns compiler warnings into errors (the suite and CI use it).
# --cc builds with another C compiler (the suite builds once with clang).
# Run as root on a fresh Debian 12 machine (or with sudo available). Installs
# only the Debian packages that are missing, then builds into DIR (default
# build/). Quiet when everything is already there; on failure it prints the
# tail of the log it kept.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$here/build"
sanitize=OFF
cuda=AUTO
test_deps=0
werror=OFF
cc=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --sanitize) sanitize=ON; shift ;;
    --cuda) cuda=$2; shift 2 ;;
    --test-deps) test_deps=1; shift ;;
    --werror) werror=ON; shift ;;
    --cc) cc=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake pkg-config libuv1-dev libsodium-dev libprotobuf-c-dev
          protobuf-c-compiler libnatpmp-dev libminiupnpc-dev libopenblas-dev libjansson-dev libcmocka-dev
          libmicrohttpd-dev python3 dpkg-dev)
if [ "$test_deps" = 1 ]; then
  packages+=(valgrind clang debootstrap iproute2 iptables miniupnpd-iptables python3-torch
             chromium chromium-driver python3-selenium)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then sudo=(sudo); else
      echo "setup.sh: missing packages (${missing[*]}) and not root; run as root" >&2; exit 1
    fi
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  if ! { "${sudo[@]}" apt-get update -q && \
         "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2; echo "setup.sh: package installation failed (log: $log)" >&2; exit 1
  fi
  rm -f "$log"
fi

mkdir -p "$build_dir"
log="$build_dir/setup.log"
cc_args=()
[ -n "$cc" ] && cc_args=(-DCMAKE_C_COMPILER="$cc")
if ! { cmake -S "$here" -B "$build_dir" -DGWTF_SANITIZE="$sanitize" -DGWTF_CUDA="$cuda" \
         -DGWTF_WERROR="$werror" "${cc_args[@]}" &&
       cmake --build "$build_dir" -j "$(nproc)"; } >"$log" 2>&1; then
  grep -E 'error|Error' "$log" | head -n 20 >&2 || true
  tail -n 20 "$log" >&2
  echo "setup.sh: build failed (full log: $log)" >&2
  exit 1
fi
