#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test (ctest). Extra args go to ctest,
# e.g. scripts/test.sh -R float8
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
"$ROOT/scripts/setup.sh"
echo "[test] set-up + build took $(( $(date +%s) - start )) s"
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"
if [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]] && ! command -v nvcc >/dev/null 2>&1; then
  echo "[test] WARNING: no CUDA toolkit (nvcc) found: the CUDA-enabled build is NOT checked" >&2
elif [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]]; then
  # Every CUDA path must compile even on a machine without a GPU.
  # The binaries and the float8 tests hold every CUDA-specific translation unit; the other test
  # executables are identical in both variants, so they are built once (CPU).
  TITAN_CUDA=1 TITAN_BUILD_TARGET="titan-train titan-run titan-bench-matmul titan-bench-linear test_float8 test_nccl" \
    "$ROOT/scripts/setup.sh"
  echo "[test] CUDA-enabled build done after $(( $(date +%s) - start )) s"
fi
cd "$ROOT/build"
ctest --output-on-failure --timeout 900 "$@"
# --- GPU bundle + rehearsal (scripts/gpu_bundle.sh; docs/development.md "GPU check") ---------
# The bundle a bare GPU machine runs must build, and its executables must run here against the
# torch a python reports, from a copy of the checkout without .deps. Reuses build-cuda/ above.
if [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 && "${TITAN_TEST_GPU_REHEARSAL:-1}" == 1 ]] &&
   command -v nvcc >/dev/null 2>&1; then
  rehearsal_start=$(date +%s)
  "$ROOT/scripts/gpu_bundle.sh" --rehearse
  echo "[test] GPU bundle + rehearsal took $(( $(date +%s) - rehearsal_start )) s"
fi
# --- end GPU bundle + rehearsal ---------------------------------------------------------------
echo "[test] total $(( $(date +%s) - start )) s"
