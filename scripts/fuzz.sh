#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...] — builds the libFuzzer
# targets with clang (build-fuzz, -DGWTF_FUZZ=ON) and runs each, one after
# the other, for SECONDS_PER_TARGET (default 60) over a copy of its seed
# corpus. TARGETs are names like fuzz_frame (default: all of them).
#
#   scripts/fuzz.sh 600                      # the ten-minute campaign, every target
#   scripts/fuzz.sh 180 fuzz_train_msg       # one target for three minutes
#
# New inputs go to test/fuzz/corpus-new/<name>/ (git-ignored; starts as a
# copy of test/fuzz/corpus/<name>/, kept between runs so a campaign can
# resume), the log to test/fuzz/corpus-new/<name>.log and crashing inputs to
# test/fuzz/corpus-new/artifacts-<name>/. Prints executions, exec/s,
# coverage and findings per target; exits 1 if any target crashed (or
# leaked, or timed out on an input), 2 on a build failure.
#
# One process per target (no -jobs/-workers: the machine is shared).
# Environment: GWTF_FUZZ_BUILD (build dir, default build-fuzz),
# GWTF_FUZZ_JOBS (build parallelism, default 2), GWTF_FUZZ_ARGS (extra
# libFuzzer flags). Worthwhile finds can be merged into the committed corpus
# with:  build-fuzz/test/fuzz/fuzz_X -merge=1 test/fuzz/corpus/X test/fuzz/corpus-new/X
set -u

secs=${1:-60}
[ $# -gt 0 ] && shift
all=(fuzz_frame fuzz_train_msg fuzz_flow_msg fuzz_safetensors fuzz_run_record fuzz_dht_payload fuzz_datagram
     fuzz_pcp_reply fuzz_natpmp_reply fuzz_upnp_reply fuzz_member_token fuzz_member_cert)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi
case "$secs" in ''|*[!0-9]*) echo "fuzz.sh: SECONDS_PER_TARGET must be a number, not '$secs'" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
build=${GWTF_FUZZ_BUILD:-$root/build-fuzz}
jobs=${GWTF_FUZZ_JOBS:-2}

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz.sh: clang is missing; installing it (apt-get install clang)" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq clang || { echo "fuzz.sh: cannot install clang" >&2; exit 2; }
fi

mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DGWTF_FUZZ=ON -DGWTF_CUDA=OFF >"$build/fuzz-configure.log" 2>&1 ||
  { cat "$build/fuzz-configure.log" >&2; echo "fuzz.sh: configure failed" >&2; exit 2; }
cmake --build "$build" -j"$jobs" --target "${targets[@]}" >"$build/fuzz-build.log" 2>&1 ||
  { tail -40 "$build/fuzz-build.log" >&2; echo "fuzz.sh: build failed" >&2; exit 2; }

new="$root/test/fuzz/corpus-new"
mkdir -p "$new"
failed=0
summary=()
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  seeds="$root/test/fuzz/corpus/$name"
  work="$new/$name"
  arts="$new/artifacts-$name"
  log="$new/$name.log"
  mkdir -p "$work" "$arts"
  # The seeds, minus kept-aside reproducers of open findings (crash-*).
  find "$seeds" -maxdepth 1 -type f ! -name 'crash-*' -exec cp -n {} "$work/" \;
  stamp="$new/.start-$name"
  touch "$stamp"
  echo "fuzz.sh: $t for ${secs}s (log $log)"
  # shellcheck disable=SC2086
  "$build/test/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$arts/" ${GWTF_FUZZ_ARGS:-} "$work" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  finds=$(find "$arts" -type f -newer "$stamp" | wc -l) # this run's, not an earlier one's
  verdict="ok"
  if [ "$rc" -ne 0 ] || [ "$finds" -gt 0 ]; then
    verdict="FOUND (rc $rc, $finds artifact(s) in $arts)"
    failed=1
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|SUMMARY' "$log" | sed 's/^/    /'
  fi
  summary+=("$(printf '%-18s %6ss %12s execs %8s exec/s  cov %-6s ft %-6s corpus %-5s %s' "$t" "$secs" \
    "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$verdict")")
done

echo
echo "fuzz.sh: summary ($(clang --version | head -1))"
printf '  %s\n' "${summary[@]}"
exit "$failed"
