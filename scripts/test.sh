#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs every test (ctest). Extra args go to ctest,
# e.g. scripts/test.sh -R float8, or scripts/test.sh -L unit (the fast cases, about a minute).
# Every Catch2 test case is its own ctest entry, labelled unit, dist (several processes), slow
# (whole training runs) or cuda (needs a GPU; reported Skipped without one): see tests/CMakeLists.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)
# The checkpoint cases write up to a few GB at once under the temp folder (each test process
# removes its own when it passes: tests/catch_main.cpp). Say so up front when the disk is short,
# so a later "No space left on device" is not a mystery.
free_kib=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 { print $4 }')
if [[ -n "$free_kib" ]] && ((free_kib < 4 * 1024 * 1024)); then
  echo "[test] WARNING: only $((free_kib / 1024)) MiB free under ${TMPDIR:-/tmp}; the checkpoint cases need a few GiB" >&2
fi
"$ROOT/scripts/setup.sh"
echo "[test] set-up + build took $(( $(date +%s) - start )) s"
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"
if [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]] && ! command -v nvcc >/dev/null 2>&1; then
  echo "[test] WARNING: no CUDA toolkit (nvcc) found: the CUDA-enabled build is NOT checked" >&2
elif [[ "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]]; then
  # Every CUDA path must compile even on a machine without a GPU.
  # The binaries and the float8 and model (init kernel) tests hold every CUDA-specific translation unit; the other test
  # executables are identical in both variants, so they are built once (CPU).
  TITAN_CUDA=1 TITAN_BUILD_TARGET="titan-train titan-run titan-bench-matmul titan-bench-linear titan-bench-experts titan-bench-attention test_float8 test_nccl test_model" \
    "$ROOT/scripts/setup.sh"
  echo "[test] CUDA-enabled build done after $(( $(date +%s) - start )) s"
fi
if [[ -d "$ROOT/build-cuda" && "${TITAN_TEST_CUDA_BUILD:-1}" == 1 ]] && command -v nvcc >/dev/null 2>&1; then
  # The CUDA-enabled build's [cuda] cases: they run where there is a GPU and are reported as
  # Skipped (never Passed) where there is none.
  echo "[test] CUDA-enabled build: [cuda] test cases"
  (cd "$ROOT/build-cuda" && ctest --output-on-failure --timeout 900 -L cuda "$@")
fi
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
# --- fuzz targets (scripts/fuzz.sh; docs/reliability.md): a time-boxed libFuzzer run of each
# reader (build + 10 s per target, under 2 min). On by default for the full run (no ctest
# arguments); TITAN_TEST_FUZZ=0/1 overrides. A crash fails the run after the ctest below.
fuzz_rc=0
if [[ "${TITAN_TEST_FUZZ:-$(( $# == 0 ))}" == 1 ]]; then
  fuzz_start=$(date +%s)
  "$ROOT/scripts/fuzz.sh" "${TITAN_FUZZ_SECONDS:-10}" || fuzz_rc=$?
  echo "[test] fuzz stage took $(( $(date +%s) - fuzz_start )) s (exit $fuzz_rc)"
fi
# --- end fuzz targets -------------------------------------------------------------------------
# --- every CPU test case: last, so that the run's final ctest summary is the full suite's -------
cd "$ROOT/build"
# Two at a time (TITAN_TEST_JOBS); a [dist] case takes both slots (PROCESSORS 2), so multi-process
# runs never share the two cores with another test.
ctest_rc=0
ctest --output-on-failure --timeout 900 -j"${TITAN_TEST_JOBS:-2}" "$@" || ctest_rc=$?
echo "[test] total $(( $(date +%s) - start )) s"
((fuzz_rc == 0)) || echo "[test] the fuzz stage FAILED (exit $fuzz_rc): see its reproducer above" >&2
((ctest_rc != 0)) && exit "$ctest_rc"
exit "$fuzz_rc"
