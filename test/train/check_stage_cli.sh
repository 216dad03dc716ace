#!/usr/bin/env bash
# test/train/check_stage_cli.sh — `gwtf check stage` passes every committed
# fixture (exit 0), fails a malformed one (exit 1, with the reason) and
# refuses bad usage (exit 2).
set -euo pipefail
: "${GWTF_BIN:?}" "${GWTF_SOURCE_DIR:?}"
fixtures=("$GWTF_SOURCE_DIR"/test/fixtures/*.safetensors)
[ ${#fixtures[@]} -ge 9 ] || { echo "expected the committed fixtures, found ${#fixtures[@]}"; exit 1; }

out=$("$GWTF_BIN" check stage --threads 2 "${fixtures[@]}")
echo "$out" | tail -n 1
grep -q "FAIL" <<<"$out" && { echo "$out"; exit 1; }
grep -q "all: 100 of 100 within 1e-04, 0 fixture(s) unreadable" <<<"$out" || { echo "$out"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":1}' > "$tmp/bad.safetensors"
rc=0
out=$("$GWTF_BIN" check stage "$tmp/bad.safetensors") || rc=$?
[ "$rc" = 1 ] || { echo "malformed fixture: exit $rc, expected 1"; exit 1; }
grep -q "error: header length 16 runs past the end" <<<"$out" || { echo "$out"; exit 1; }

rc=0
"$GWTF_BIN" check stage 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "no fixture: exit $rc, expected 2"; exit 1; }
rc=0
"$GWTF_BIN" check stage --device tpu "${fixtures[0]}" 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "bad device: exit $rc, expected 2"; exit 1; }
echo "check stage CLI ok"
