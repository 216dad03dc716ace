#!/usr/bin/env bash
# test/train/bench_stage_cli.sh — `gwtf bench stage --json` runs both
# architectures on a small configuration and prints every documented key;
# bad options are usage errors (exit 2).
set -euo pipefail
: "${GWTF_BIN:?}"
for arch in gpt llama; do
  out=$("$GWTF_BIN" bench stage --arch "$arch" --d-model 24 --heads 3 --layers 2 --seq 9 --batch 2 \
        --threads 1 --iters 2 --warmup 1 --json)
  echo "$out"
  for key in fwd_ms_median bwd_ms_median tokens_per_s gflops cpu_ms_median state_bytes per_mb_bytes; do
    grep -Eq "\"$key\":[0-9.]+[,}]" <<<"$out" || { echo "$arch: no numeric \"$key\""; exit 1; }
  done
  grep -q "\"arch\":\"$arch\"" <<<"$out" || { echo "wrong arch in $out"; exit 1; }
done
rc=0
"$GWTF_BIN" bench stage --heads 5 2>/dev/null || rc=$?  # 512 is not divisible by 5
[ "$rc" = 2 ] || { echo "bad heads: exit $rc, expected 2"; exit 1; }
rc=0
"$GWTF_BIN" bench stage --seq x 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "bad --seq: exit $rc, expected 2"; exit 1; }
echo "bench stage CLI ok"
