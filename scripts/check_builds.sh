#!/usr/bin/env bash
# scripts/check_builds.sh — compile gwtf in every build type with gcc and
# clang, warnings as errors, and say which combinations are not clean.
#
#   scripts/check_builds.sh [--cuda AUTO|ON|OFF]
#
# Builds into build-check-<compiler>-<type>/ (compile only, no tests; the
# suite runs those). Needs clang (apt-get install clang). Exit 1 if any
# build failed; each failure's first errors are printed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cuda=OFF
[ "${1:-}" = --cuda ] && cuda=$2
failed=()
for cc in gcc clang; do
  if ! command -v "$cc" >/dev/null; then echo "check_builds: $cc not installed, skipped"; continue; fi
  for type in Debug RelWithDebInfo Release; do
    dir="$here/build-check-$cc-$(echo "$type" | tr '[:upper:]' '[:lower:]')"
    mkdir -p "$dir"
    log="$dir/check.log"
    if cmake -S "$here" -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE="$type" -DGWTF_WERROR=ON \
         -DGWTF_CUDA="$cuda" >"$log" 2>&1 && cmake --build "$dir" -j "$(nproc)" >>"$log" 2>&1; then
      echo "check_builds: $cc $type clean"
    else
      echo "check_builds: $cc $type FAILED (log: $log)"
      grep -E 'error|warning' "$log" | head -n 5
      failed+=("$cc-$type")
    fi
  done
done
[ ${#failed[@]} -eq 0 ] || { echo "check_builds: not clean: ${failed[*]}"; exit 1; }
