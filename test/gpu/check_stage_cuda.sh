#!/usr/bin/env bash
# test/gpu/check_stage_cuda.sh — every committed PyTorch fixture on the CUDA
# backend (`gwtf check stage --device cuda`); skipped (exit 77) with the
# driver's reason when no CUDA device can be opened.
set -uo pipefail
: "${GWTF_BIN:?}" "${GWTF_SOURCE_DIR:?}"
out=$("$GWTF_BIN" check stage --device cuda "$GWTF_SOURCE_DIR"/test/fixtures/*.safetensors 2>&1)
rc=$?
if [ "$rc" = 3 ]; then  # CHECK_EXIT_NO_DEVICE in node/cmd_check.c
  echo "SKIPPED: no CUDA device (${out#gwtf check stage: })"
  exit 77
fi
echo "$out"
exit "$rc"
