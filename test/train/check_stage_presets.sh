#!/usr/bin/env bash
# test/train/check_stage_presets.sh — a one-block stage of each real-size
# preset (gpt2-small, llama-160m: d_model 768, 12 heads) passes `gwtf check
# stage` against PyTorch (issue 20). The fixtures (~57 MB each) are too big
# to commit: scripts/gen_fixtures.py --presets writes them here, which needs
# PyTorch (Debian's python3-torch); without it the test is skipped (77).
set -euo pipefail
: "${GWTF_BIN:?}" "${GWTF_SOURCE_DIR:?}"
py=/usr/bin/python3
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "SKIP: $py has no torch (apt-get install python3-torch) to generate the preset fixtures"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$GWTF_SOURCE_DIR/scripts/gen_fixtures.py" --presets --out "$tmp"
fixtures=("$tmp"/gpt2_small_block.safetensors "$tmp"/llama_160m_block.safetensors)
for f in "${fixtures[@]}"; do [ -s "$f" ] || { echo "gen_fixtures.py --presets wrote no $f"; exit 1; }; done

rc=0
out=$("$GWTF_BIN" check stage --threads 2 "${fixtures[@]}") || rc=$?
echo "$out" | tail -n 1
[ "$rc" = 0 ] || { echo "$out"; echo "check stage: exit $rc"; exit 1; }
grep -q "FAIL" <<<"$out" && { echo "$out"; exit 1; }
# Each block checked in full (gpt: output, input gradient and 12 parameter
# gradients; llama: 2 and 9), every tensor within tolerance.
for want in "gpt2_small_block.safetensors on" "14 of 14 within 1e-04" "llama_160m_block.safetensors on" \
            "11 of 11 within 1e-04" "all: 25 of 25 within 1e-04, 0 fixture(s) unreadable"; do
  grep -qF "$want" <<<"$out" || { echo "$out"; echo "missing: $want"; exit 1; }
done
echo "check stage presets ok"
