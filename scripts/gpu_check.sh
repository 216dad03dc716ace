#!/usr/bin/env bash
# scripts/gpu_check.sh — the CUDA checks of docs/CUDA.md in one go, on a
# machine with an NVIDIA GPU: kernels against the CPU backend, every PyTorch
# fixture on CUDA, sampling on CPU and CUDA (same text), one stage against
# PyTorch (needs python3 with torch), compute-sanitizer when installed.
#
#   scripts/gpu_check.sh [BUILD_DIR [MODEL_DIR]]   (default build; MODEL_DIR: a `gwtf export` output)
#
# Exits non-zero on the first failing check.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$here/build}
model=${2:-}
gwtf=$build/node/gwtf
kernels=$build/test/cuda/test_cuda_kernels
py=${PYTHON:-python3}

echo "== kernels against the CPU backend"
"$kernels"
echo "== PyTorch fixtures on CUDA"
"$gwtf" check stage --device cuda "$here"/test/fixtures/*.safetensors
if [ -n "$model" ]; then
  echo "== sample: the same text on cpu and cuda"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  for d in cpu cuda; do
    "$gwtf" sample --model "$model" --prompt "The " --tokens 64 --seed 7 --device "$d" >"$tmp/$d.txt"
  done
  cmp "$tmp/cpu.txt" "$tmp/cuda.txt"
fi
echo "== one stage against PyTorch"
for arch in gpt llama; do
  "$py" "$here/scripts/bench_vs_torch.py" --gwtf "$gwtf" --arch "$arch" --d-model 768 --heads 12 --layers 4 \
    --seq 1024 --batch 8 --device cuda --iters 20 --warmup 3 --runs 2
done
if command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer memcheck on the fixtures"
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 \
    "$gwtf" check stage --device cuda --quiet "$here"/test/fixtures/*.safetensors
else
  echo "== compute-sanitizer not installed: memcheck skipped"
fi
