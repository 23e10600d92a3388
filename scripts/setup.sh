#!/usr/bin/env bash
# Idempotent set-up: Debian packages, the pinned LibTorch wheel in .deps/venv, configure + build.
#   scripts/setup.sh                 CPU build in build/
#   TITAN_CUDA=1 scripts/setup.sh    CUDA-enabled build in build-cuda/
#   TITAN_SETUP_NO_BUILD=1 ...       install dependencies only
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The one pinned LibTorch: PyPI torch 2.11.0 is built for CUDA 13.0 (matches the local toolkit
# and the GPU machines' image).
TORCH_VERSION="2.11.0"
APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config libtomlplusplus-dev libspdlog-dev
              libfmt-dev libcli11-dev catch2 nlohmann-json3-dev libpcre2-dev zlib1g-dev libgloo-dev fortunes
              clang-14 libclang-rt-14-dev)  # the last two: libFuzzer for scripts/fuzz.sh
VENV="$ROOT/.deps/venv"

log() { echo "[setup] $*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION into $VENV (about 4.5 GB with its CUDA libraries)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
fi
# TensorBoard's own reader checks titan's event files in tests (tests/test_tensorboard.cpp).
TENSORBOARD_VERSION="2.21.0"
if ! "$VENV/bin/python" -c "import tensorboard,sys; sys.exit(0 if tensorboard.__version__ == '$TENSORBOARD_VERSION' else 1)" 2>/dev/null; then
  log "installing tensorboard==$TENSORBOARD_VERSION into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "tensorboard==$TENSORBOARD_VERSION"
fi
# Parquet datasets link the C++ Arrow/Parquet libraries this wheel ships (cmake/Dependencies.cmake).
PYARROW_VERSION="26.0.1"
if ! "$VENV/bin/python" -c "import pyarrow,sys; sys.exit(0 if pyarrow.__version__ == '$PYARROW_VERSION' else 1)" 2>/dev/null; then
  log "installing pyarrow==$PYARROW_VERSION into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "pyarrow==$PYARROW_VERSION"
fi
# Holistic Trace Analysis reads titan's profiler traces in a test (scripts/hta_check.py). Its
# package requires jupyterlab and pytest for its notebooks; TraceAnalysis needs only these, so
# they go, pinned and without their dependency lists, into their own folder (PYTHONPATH).
HTA_DIR="$ROOT/.deps/hta"
HTA_PACKAGES=(holistictraceanalysis==0.5.0 pandas==3.1.1 plotly==7.1.0 narwhals==2.29.0
              networkx==3.6.1 pydot==4.0.1 pyparsing==3.3.3 python-dateutil==2.9.0.post0 six==1.17.0
              tzdata==2026.6 psutil==7.2.2 pyyaml==6.0.3)
if [[ "$(cat "$HTA_DIR/.installed" 2>/dev/null)" != "${HTA_PACKAGES[*]}" ]]; then
  log "installing Holistic Trace Analysis into $HTA_DIR"
  rm -rf "$HTA_DIR"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --target "$HTA_DIR" "${HTA_PACKAGES[@]}"
  echo "${HTA_PACKAGES[*]}" > "$HTA_DIR/.installed"
fi
# torchao's MX emulation is the reference of titan's block-scaled casts and GEMMs
# (tests/test_block_scaled.cpp runs scripts/reference/block_scaled_reference.py). Only its Python
# sources are imported, so it goes without dependencies into its own folder (PYTHONPATH).
TORCHAO_VERSION="0.18.0"
TORCHAO_DIR="$ROOT/.deps/torchao"
if [[ "$(cat "$TORCHAO_DIR/.installed" 2>/dev/null)" != "$TORCHAO_VERSION" ]]; then
  log "installing torchao==$TORCHAO_VERSION into $TORCHAO_DIR"
  rm -rf "$TORCHAO_DIR"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --target "$TORCHAO_DIR" "torchao==$TORCHAO_VERSION"
  echo "$TORCHAO_VERSION" > "$TORCHAO_DIR/.installed"
fi
TORCH_DIR="$("$VENV/bin/python" -c 'import torch,os; print(os.path.dirname(torch.__file__))' 2>/dev/null)"

[[ "${TITAN_SETUP_NO_BUILD:-0}" == 1 ]] && exit 0

if [[ "${TITAN_CUDA:-0}" == 1 ]]; then BUILD="$ROOT/build-cuda"; CUDA=ON; else BUILD="$ROOT/build"; CUDA=OFF; fi
# The CUDA-enabled build is what the GPU bundle carries (scripts/gpu_bundle.sh), and Arrow's
# libraries (~62 MB) do not fit its 64 MiB: Parquet datasets are off there unless TITAN_PARQUET=1.
if [[ -n "${TITAN_PARQUET:-}" ]]; then PARQUET=$([[ "$TITAN_PARQUET" == 1 ]] && echo ON || echo OFF)
elif [[ "$CUDA" == ON ]]; then PARQUET=OFF; else PARQUET=ON; fi
if [[ ! -f "$BUILD/build.ninja" ]]; then
  log "configuring $BUILD (TITAN_CUDA=$CUDA)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DTITAN_CUDA=$CUDA -DTITAN_PARQUET=$PARQUET -DTITAN_TORCH_DIR="$TORCH_DIR" >/dev/null
fi
log "building $BUILD"
cmake --build "$BUILD" -j"$(nproc)" ${TITAN_BUILD_TARGET:+--target $TITAN_BUILD_TARGET}
