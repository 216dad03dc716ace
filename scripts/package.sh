#!/usr/bin/env bash
# scripts/package.sh — build gwtf for /usr and make the Debian package.
#
#   scripts/package.sh [--build-dir DIR] [--cuda AUTO|ON|OFF] [--werror]
#
# Configures DIR (default build-deb/) as a Release build with prefix /usr,
# builds it, computes the package's Depends from what gwtf links
# (dpkg-shlibdeps), and runs CPack. Prints the path of the .deb on the last
# line. Install it with: sudo apt install ./PATH.deb
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir="$here/build-deb"
cuda=AUTO
werror=OFF
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --cuda) cuda=$2; shift 2 ;;
    --werror) werror=ON; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for tool in dpkg-shlibdeps cpack; do
  command -v "$tool" >/dev/null || { echo "package.sh: $tool is missing (apt-get install dpkg-dev cmake)" >&2; exit 1; }
done

mkdir -p "$build_dir"
log="$build_dir/package.log"
if ! { cmake -S "$here" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
         -DGWTF_CUDA="$cuda" -DGWTF_WERROR="$werror" &&
       cmake --build "$build_dir" -j "$(nproc)"; } >"$log" 2>&1; then
  grep -E 'error|warning' "$log" | head -n 20 >&2 || true
  tail -n 20 "$log" >&2
  echo "package.sh: build failed (full log: $log)" >&2
  exit 1
fi

# dpkg-shlibdeps wants to run in a source tree (debian/control); give it an
# empty one. Only gwtf is looked at: the CUDA module's libraries are a
# suggestion, not a dependency (packaging/CMakeLists.txt).
shlib_dir=$(mktemp -d)
trap 'rm -rf "$shlib_dir"' EXIT
mkdir -p "$shlib_dir/debian"
touch "$shlib_dir/debian/control"
depends=$(cd "$shlib_dir" && dpkg-shlibdeps -O "$build_dir/node/gwtf" 2>>"$log" | sed -n 's/^shlibs:Depends=//p')
if [ -z "$depends" ]; then
  echo "package.sh: dpkg-shlibdeps found no dependencies (log: $log)" >&2
  exit 1
fi

rm -rf "$build_dir/packages"
if ! { cmake -DGWTF_DEB_DEPENDS="$depends" "$build_dir" &&
       (cd "$build_dir" && cpack -G DEB); } >>"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "package.sh: cpack failed (full log: $log)" >&2
  exit 1
fi
deb=$(ls "$build_dir"/packages/gwtf_*.deb)
echo "package.sh: Depends: $depends"
echo "$deb"
