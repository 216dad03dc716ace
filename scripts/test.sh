#!/usr/bin/env bash
# scripts/test.sh — install, build and run the whole test suite.
#
# 1. a normal build (build/), every ctest test;
# 2. an ASan+UBSan build (build-san/), every ctest test again;
# 3. the unit tests of the normal build under valgrind (no leaks allowed);
# 4. a clang build (build-clang/) and its unit tests: a second
#    compiler's warnings, and its floating-point defaults (clang contracts
#    a*b+c into FMA unless told not to, which split weights across CPUs);
# 5. a Release build for /usr (build-rel/) made into the Debian package, which
#    is installed into a clean Debian 12 root (test/ship/deb_install.sh).
# Every build has -DGWTF_WERROR=ON: a compiler warning fails the suite.
# GPU tests print a skip reason when no GPU is present. Exits non-zero on the
# first failing stage.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
jobs=$(nproc)

echo "== setup and build (build/)"
scripts/setup.sh --test-deps --werror
echo "== tests (build/)"
(cd build && ctest --output-on-failure -j "$jobs")

# CUDA kernels are compiled by nvcc and are not instrumented by the
# sanitizers, so the sanitizer build leaves the CUDA backend out.
echo "== setup and build (build-san/, ASan+UBSan)"
scripts/setup.sh --test-deps --werror --build-dir "$here/build-san" --sanitize --cuda OFF
echo "== tests (build-san/, ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-san && ctest --output-on-failure -j "$jobs")
unset ASAN_OPTIONS UBSAN_OPTIONS

echo "== unit tests under valgrind (build/)"
(cd build && ctest --output-on-failure -j "$jobs" -L unit -LE novalgrind -T memcheck)

echo "== setup and build (build-clang/, clang)"
scripts/setup.sh --test-deps --werror --cc clang --build-dir "$here/build-clang" --cuda OFF
echo "== unit tests (build-clang/)"
(cd build-clang && ctest --output-on-failure -j "$jobs" -L unit)

echo "== Release build and Debian package (build-rel/)"
deb=$(scripts/package.sh --build-dir "$here/build-rel" --werror | tail -n 1)
echo "$deb"
echo "== the package on a clean Debian root"
rc=0
test/ship/deb_install.sh "$deb" "$here/build-rel/deb-test" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then exit "$rc"; fi
echo "== all tests passed"
