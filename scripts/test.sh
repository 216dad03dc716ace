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
# The whole suites run three slots per core; a multi-process test takes
# two (test/CMakeLists.txt). Most of their time those tests wait (on timers,
# sockets, --slowdown's sleeps): at one test per core the normal build's
# suite kept two cores 36 % busy (216 core-s in 298 s). So three swarms run
# at once on two cores, with single-process tests beside them: 196 s. Four
# at once took 161 s but starved a swarm's directory lookups for seconds
# (swarm_kill_stage, 1 failure in 2 runs of the multi-process tests alone).
# Valgrind's and clang's unit tests compute throughout: one per core.
wide=$((3 * jobs))

# ctest in build dir $1, $2 tests at a time, with the rest as its arguments.
# On a failure, the last lines of each failed test's own output come last,
# where a CI log shown by its tail still has them (ctest's summary names the
# test only).
run_ctest() {
  local dir=$1 j=$2
  shift 2
  local rc=0
  (cd "$dir" && ctest --output-on-failure -j "$j" "$@") || rc=$?
  [ "$rc" -eq 0 ] && return 0
  local failed="$dir/Testing/Temporary/LastTestsFailed.log" log="$dir/Testing/Temporary/LastTest.log"
  echo "== failed in $dir: the end of each one's output"
  if [ -f "$failed" ] && [ -f "$log" ]; then
    while IFS=: read -r _ name; do
      echo "-- $name"
      awk -v t="$name" '$0 ~ "Testing: " t "$" {on = 1; n = 0; next}
        on && /^<end of output>/ {on = 0}
        on {buf[n++ % 50] = $0}
        END {for (i = (n > 50 ? n - 50 : 0); i < n; i++) print buf[i % 50]}' "$log"
    done < "$failed"
  fi
  exit "$rc"
}

# Each stage's header says when it began, so a CI log shows where the
# suite's time goes (its budget: 20 minutes on 2 cores).
step() { echo "== $* (at ${SECONDS} s)"; }

step "setup and build (build/)"
scripts/setup.sh --test-deps --werror
step "tests (build/)"
run_ctest build "$wide"

# CUDA kernels are compiled by nvcc and are not instrumented by the
# sanitizers, so the sanitizer build leaves the CUDA backend out.
step "setup and build (build-san/, ASan+UBSan)"
scripts/setup.sh --test-deps --werror --build-dir "$here/build-san" --sanitize --cuda OFF
step "tests (build-san/, ASan+UBSan)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_ctest build-san "$wide"
unset ASAN_OPTIONS UBSAN_OPTIONS

step "unit tests under valgrind (build/)"
run_ctest build "$jobs" -L unit -LE novalgrind -T memcheck

step "setup and build (build-clang/, clang)"
scripts/setup.sh --test-deps --werror --cc clang --build-dir "$here/build-clang" --cuda OFF
step "unit tests (build-clang/)"
run_ctest build-clang "$jobs" -L unit

step "Release build and Debian package (build-rel/)"
deb=$(scripts/package.sh --build-dir "$here/build-rel" --werror | tail -n 1)
echo "$deb"
step "the package on a clean Debian root"
rc=0
test/ship/deb_install.sh "$deb" "$here/build-rel/deb-test" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then exit "$rc"; fi
echo "== all tests passed in ${SECONDS} s"
