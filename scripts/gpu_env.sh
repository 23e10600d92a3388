#!/usr/bin/env bash
# The run-time environment of a GPU bundle (scripts/gpu_bundle.sh): LibTorch, CUDA, cuBLAS and
# NCCL come from the torch that a python reports, the rest from the bundle's lib/.
#   source scripts/gpu_env.sh BUNDLE_DIR      sets TITAN_PY, TITAN_TORCH_DIR, LD_LIBRARY_PATH
#   scripts/gpu_env.sh BUNDLE_DIR CMD ARGS..  runs CMD in that environment
# The python is $TITAN_PYTHON when set, else python3. The bundle's executables carry no RPATH
# (gpu_bundle.sh removes it), so this LD_LIBRARY_PATH is the only way they find LibTorch: the
# same bundle runs against whichever torch 2.11 the machine has.
titan_gpu_env() {
  local bundle="$1"
  if [[ ! -f "$bundle/bundle.json" ]]; then
    echo "gpu_env: '$bundle' is not a GPU bundle (no bundle.json): build one with scripts/gpu_bundle.sh" >&2
    return 2
  fi
  bundle="$(cd "$bundle" && pwd)"
  TITAN_PY="${TITAN_PYTHON:-python3}"
  local info
  if ! info="$("$TITAN_PY" -c 'import os, torch; d = os.path.dirname(torch.__file__); print(torch.__version__); print(d); print(os.path.dirname(d))' 2>&1)"; then
    echo "gpu_env: '$TITAN_PY -c \"import torch\"' failed (set TITAN_PYTHON to a python that has torch):" >&2
    echo "$info" | tail -3 >&2
    return 2
  fi
  local version site want
  version="$(sed -n 1p <<<"$info")"
  TITAN_TORCH_DIR="$(sed -n 2p <<<"$info")"
  site="$(sed -n 3p <<<"$info")"
  want="$(sed -n 's/.*"torch_version": *"\([^"]*\)".*/\1/p' "$bundle/bundle.json")"
  # LibTorch has no stable C++ ABI across releases: the bundle runs only against the release it
  # was compiled with (the local build suffix, +cu130 or +cpu, may differ).
  if [[ "${version%%+*}" != "${want%%+*}" ]]; then
    echo "gpu_env: $TITAN_PY has torch $version, but the bundle was built against torch $want" >&2
    return 2
  fi
  local libs="$bundle/lib:$TITAN_TORCH_DIR/lib" d
  for d in "$site"/nvidia/*/lib; do [[ -d "$d" ]] && libs="$libs:$d"; done
  if [[ -n "${TITAN_GPU_ENV_COMPAT:-}" ]]; then libs="$bundle/lib/compat:$libs"; fi
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TITAN_PY TITAN_TORCH_DIR TITAN_TORCH_VERSION="$version"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  if (($# < 2)); then
    echo "usage: scripts/gpu_env.sh BUNDLE_DIR CMD [ARGS...]" >&2
    exit 2
  fi
  titan_gpu_env "$1" || exit $?
  shift
  exec "$@"
else
  titan_gpu_env "$1"
fi
