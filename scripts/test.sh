#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test (ctest). Extra args go to ctest,
# e.g. scripts/test.sh -R float8
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
"$ROOT/scripts/setup.sh"
echo "[test] set-up + build took $(( $(date +%s) - start )) s"
if [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]] && command -v nvcc >/dev/null 2>&1; then
  # Every CUDA path must compile even on a machine without a GPU.
  TITAN_CUDA=1 TITAN_BUILD_TARGET=all "$ROOT/scripts/setup.sh"
  echo "[test] CUDA-enabled build done after $(( $(date +%s) - start )) s"
fi
cd "$ROOT/build"
ctest --output-on-failure --timeout 900 "$@"
echo "[test] total $(( $(date +%s) - start )) s"
