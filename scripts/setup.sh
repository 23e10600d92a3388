#!/usr/bin/env bash
# Idempotent set-up: Debian packages, the pinned LibTorch wheel in .deps/venv, configure + build.
#   scripts/setup.sh                 everything the tests use; builds every target of build/
#   scripts/setup.sh --train         only what training needs (run_train.sh): titan-train, titan-run
#   TITAN_CUDA=1 scripts/setup.sh    the CUDA-enabled variant in build-cuda/
#   TITAN_SETUP_NO_BUILD=1 ...       install dependencies only
#   TITAN_BUILD_TARGET="a b" ...     build only these targets
#   TITAN_PARQUET=0|1 ...            Parquet datasets off / on (default: on for the CPU build)
#   TITAN_UNITY=0 ...                compile file by file (an edit rebuilds one file, not its batch)
# Each phase prints one line when it starts (what, and how big); its output goes to
# .deps/logs/<phase>.log and is printed whole when the phase fails. With nothing to do it prints
# nothing. docs/development.md times each phase, cold and warm.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PROFILE=test
case "${1:-}" in
  "") ;;
  --train) PROFILE=train ;;
  --test) PROFILE=test ;;
  *) echo "setup.sh: unknown argument '$1' (valid: --train, --test)" >&2; exit 2 ;;
esac
if [[ "${TITAN_CUDA:-0}" == 1 ]]; then BUILD="$ROOT/build-cuda"; CUDA=ON; else BUILD="$ROOT/build"; CUDA=OFF; fi

# The one pinned LibTorch: PyPI torch 2.11.0 is built for CUDA 13.0 (matches the local toolkit
# and the GPU machines' image).
TORCH_VERSION="2.11.0"
# What titan compiles and links against, and the default data (fortunes).
APT_PACKAGES=(build-essential cmake ninja-build ccache pkg-config libtomlplusplus-dev libspdlog-dev
              libfmt-dev libcli11-dev nlohmann-json3-dev libpcre2-dev zlib1g-dev libgloo-dev fortunes)
# What only the tests use: Catch2, and clang's libFuzzer for scripts/fuzz.sh.
[[ "$PROFILE" == test ]] && APT_PACKAGES+=(catch2 clang-14 libclang-rt-14-dev)
VENV="$ROOT/.deps/venv"
LOG_DIR="$ROOT/.deps/logs"

log() { echo "[setup] $*"; }
setup_start=$SECONDS
phase_times=()
# run_phase NAME COMMAND...: the command's output into $LOG_DIR/NAME.log, shown whole on failure.
run_phase() {
  local name=$1 t0=$SECONDS; shift
  mkdir -p "$LOG_DIR"
  if ! "$@" >"$LOG_DIR/$name.log" 2>&1; then
    cat "$LOG_DIR/$name.log" >&2
    echo "[setup] $name failed: its whole log is above (and in ${LOG_DIR#"$ROOT"/}/$name.log)" >&2
    exit 1
  fi
  phase_times+=("$name $((SECONDS - t0)) s")
}
pip_install() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@"; }

# --- Debian packages ---------------------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  log "updating Debian's package lists"
  run_phase apt-update $SUDO apt-get update -qq
  download_mb=$(apt-get install --print-uris -qq "${missing[@]}" 2>/dev/null |
                awk '{ bytes += $3 } END { printf "%.0f", bytes / 1048576 }')
  log "installing ${#missing[@]} Debian packages (~${download_mb} MB to download): ${missing[*]}"
  run_phase apt-install env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# --- the torch wheel ---------------------------------------------------------------------------
# Note [LibTorch without its CUDA libraries]: titan's CPU build links libtorch_cpu + libc10, which
# load libcudart and libcupti at start (the profiler's CUPTI) and nothing else of CUDA. So the
# training set-up installs the wheel alone (--no-deps: a 530 MB download) plus those two runtime
# wheels (13 MB); torch's CUDA libraries (cuDNN, cuBLAS, NCCL, ...: ~3.3 GB more) and Python
# dependencies come with the test set-up (its Python runs `import torch`) and with the
# CUDA-enabled build (libtorch_cuda links them). Both install into the same venv: the test set-up
# only adds packages, so LibTorch's files, and the build against them, stay as they are.
CUDA_RUNTIME_WHEELS=(nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85)  # torch 2.11.0's pins
site_packages() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
SITE="$(site_packages 2>/dev/null || true)"
if [[ -z "$SITE" || ! -d "$SITE/torch-$TORCH_VERSION.dist-info" || ! -f "$SITE/torch/lib/libtorch_cpu.so" ||
      ! -d "$SITE/nvidia/cu13/lib" ]]; then
  log "downloading torch $TORCH_VERSION (~530 MB: LibTorch's headers and libraries) into .deps/venv"
  make_venv() { [[ -x "$VENV/bin/python" ]] || { mkdir -p "$ROOT/.deps" && python3 -m venv "$VENV"; }; }
  run_phase venv make_venv
  run_phase torch pip_install --no-deps --no-compile "torch==$TORCH_VERSION" "${CUDA_RUNTIME_WHEELS[@]}"
  SITE="$(site_packages)"
fi
TORCH_DIR="$SITE/torch"
TORCH_FULL_STAMP="$VENV/.torch-$TORCH_VERSION-with-dependencies"
if [[ ("$PROFILE" == test || "$CUDA" == ON) && ! -f "$TORCH_FULL_STAMP" ]]; then
  log "downloading torch's CUDA libraries and Python dependencies (~3.3 GB, for tests and CUDA builds)"
  run_phase torch-dependencies pip_install "torch==$TORCH_VERSION" numpy
  touch "$TORCH_FULL_STAMP"
fi

# --- pinned Python packages --------------------------------------------------------------------
# Parquet datasets link the C++ Arrow/Parquet libraries this wheel ships (cmake/Dependencies.cmake):
# part of training. The CUDA-enabled build is what the GPU bundle carries (scripts/gpu_bundle.sh),
# and Arrow's libraries (~62 MB) do not fit its 64 MiB: Parquet is off there unless TITAN_PARQUET=1.
if [[ -n "${TITAN_PARQUET:-}" ]]; then PARQUET=$([[ "$TITAN_PARQUET" == 1 ]] && echo ON || echo OFF)
elif [[ "$CUDA" == ON ]]; then PARQUET=OFF; else PARQUET=ON; fi
PYARROW_VERSION="26.0.1"
if [[ ("$PARQUET" == ON || "$PROFILE" == test) && ! -d "$SITE/pyarrow-$PYARROW_VERSION.dist-info" ]]; then
  log "downloading pyarrow $PYARROW_VERSION (~45 MB: Arrow's and Parquet's C++ libraries, for Parquet datasets)"
  run_phase pyarrow pip_install --no-deps --no-compile "pyarrow==$PYARROW_VERSION"
fi
if [[ "$PROFILE" == test ]]; then
  # TensorBoard's own reader checks titan's event files (tests/test_tensorboard.cpp).
  TENSORBOARD_VERSION="2.21.0"
  if [[ ! -d "$SITE/tensorboard-$TENSORBOARD_VERSION.dist-info" ]]; then
    log "downloading tensorboard $TENSORBOARD_VERSION (~12 MB with its dependencies, for tests)"
    run_phase tensorboard pip_install "tensorboard==$TENSORBOARD_VERSION"
  fi
  # Holistic Trace Analysis reads titan's profiler traces in a test (scripts/hta_check.py). Its
  # package requires jupyterlab and pytest for its notebooks; TraceAnalysis needs only these, so
  # they go, pinned and without their dependency lists, into their own folder (PYTHONPATH).
  HTA_DIR="$ROOT/.deps/hta"
  HTA_PACKAGES=(holistictraceanalysis==0.5.0 pandas==3.1.1 plotly==7.1.0 narwhals==2.29.0
                networkx==3.6.1 pydot==4.0.1 pyparsing==3.3.3 python-dateutil==2.9.0.post0 six==1.17.0
                tzdata==2026.6 psutil==7.2.2 pyyaml==6.0.3)
  if [[ "$(cat "$HTA_DIR/.installed" 2>/dev/null)" != "${HTA_PACKAGES[*]}" ]]; then
    log "downloading Holistic Trace Analysis (~30 MB with pandas and plotly, for tests) into .deps/hta"
    rm -rf "$HTA_DIR"
    run_phase hta pip_install --no-deps --target "$HTA_DIR" "${HTA_PACKAGES[@]}"
    echo "${HTA_PACKAGES[*]}" > "$HTA_DIR/.installed"
  fi
  # torchao's MX emulation is the reference of titan's block-scaled casts and GEMMs
  # (tests/test_block_scaled.cpp runs scripts/reference/block_scaled_reference.py). Only its Python
  # sources are imported, so it goes without dependencies into its own folder (PYTHONPATH).
  TORCHAO_VERSION="0.18.0"
  TORCHAO_DIR="$ROOT/.deps/torchao"
  if [[ "$(cat "$TORCHAO_DIR/.installed" 2>/dev/null)" != "$TORCHAO_VERSION" ]]; then
    log "downloading torchao $TORCHAO_VERSION's sources (~8 MB, for tests) into .deps/torchao"
    rm -rf "$TORCHAO_DIR"
    run_phase torchao pip_install --no-deps --target "$TORCHAO_DIR" "torchao==$TORCHAO_VERSION"
    echo "$TORCHAO_VERSION" > "$TORCHAO_DIR/.installed"
  fi
fi

finish() {
  if ((${#phase_times[@]})); then
    local total=$((SECONDS - setup_start)) phases
    phases=$(printf '%s, ' "${phase_times[@]}")
    log "set-up took $((total / 60)) min $((total % 60)) s (${phases%, })"
  fi
}
[[ "${TITAN_SETUP_NO_BUILD:-0}" == 1 ]] && { finish; exit 0; }

# --- configure ---------------------------------------------------------------------------------
# The tests' targets exist only in a build configured for them; a build configured for training
# gains them when the test set-up first runs (the other targets' commands are unchanged by it).
TESTS=OFF
[[ "$PROFILE" == test ]] && TESTS=ON
BUILD_NAME="${BUILD#"$ROOT"/}/"
if [[ ! -f "$BUILD/build.ninja" ]]; then
  log "configuring $BUILD_NAME (CUDA $CUDA, tests $TESTS)"
  run_phase configure cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTITAN_CUDA=$CUDA -DTITAN_PARQUET=$PARQUET -DTITAN_BUILD_TESTS=$TESTS -DTITAN_TORCH_DIR="$TORCH_DIR" \
    -DTITAN_UNITY_BUILD=$([[ "${TITAN_UNITY:-1}" == 0 ]] && echo OFF || echo ON)
elif [[ "$TESTS" == ON ]] && ! grep -q '^TITAN_BUILD_TESTS:BOOL=ON' "$BUILD/CMakeCache.txt"; then
  log "configuring $BUILD_NAME with the tests"
  run_phase configure cmake "$BUILD" -DTITAN_BUILD_TESTS=ON
fi

# --- build -------------------------------------------------------------------------------------
# ninja's status lines become one updating line on a terminal (every tenth of the way elsewhere);
# every line also goes to the phase's log.
TARGETS="${TITAN_BUILD_TARGET:-}"
[[ -z "$TARGETS" && "$PROFILE" == train ]] && TARGETS="titan-train titan-run"
show_build_progress() {
  local log_file=$1 tty=0 started=0 shown_tenth=-1 line what done total
  [[ -t 2 ]] && tty=1
  : >"$log_file"
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log_file"
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]] || continue
    done=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]} what=${BASH_REMATCH[3]}
    if ((!started)); then started=1; log "building $BUILD_NAME ($total steps${TARGETS:+: $TARGETS})"; fi
    # "Building CXX object trainer/CMakeFiles/titan_trainer.dir/checkpoint/manager.cpp.o" -> the
    # source; a unity source (Note [Unity builds] in CMakeLists.txt) -> the files it compiles.
    if [[ $what =~ ^Building\ [A-Z]+\ object\ ((.*)CMakeFiles/[^/]+\.dir/Unity/unity_[0-9]+_[a-z]+\.[a-z]+)\.o$ ]]; then
      what="${BASH_REMATCH[2]}{$(sed -n 's|^#include "'"$ROOT"'/'"${BASH_REMATCH[2]}"'\(.*\)"$|\1|p' \
                                  "$BUILD/${BASH_REMATCH[1]}" 2>/dev/null | paste -sd, | sed 's/,/, /g')}"
    elif [[ $what =~ ^Building\ [A-Z]+\ object\ (.*)CMakeFiles/[^/]+\.dir/(.*)\.o$ ]]; then
      what="${BASH_REMATCH[1]}${BASH_REMATCH[2]}"
    fi
    if ((tty)); then
      printf '\r\033[K[setup] [%s/%s] %s' "$done" "$total" "${what:0:100}" >&2
    elif ((done * 10 / total > shown_tenth)); then
      shown_tenth=$((done * 10 / total))
      log "[$done/$total] $what"
    fi
  done
  ((tty && started)) && printf '\r\033[K' >&2
  return 0
}
build_start=$SECONDS
mkdir -p "$LOG_DIR"
build_log="$LOG_DIR/${BUILD##*/}.log"
set +e
NINJA_STATUS="[%f/%t] " cmake --build "$BUILD" -j"$(nproc)" ${TARGETS:+--target $TARGETS} 2>&1 |
  show_build_progress "$build_log"
build_rc=${PIPESTATUS[0]}
set -e
if ((build_rc != 0)); then
  cat "$build_log" >&2
  echo "[setup] building $BUILD_NAME failed: its whole log is above (and in ${build_log#"$ROOT"/})" >&2
  exit 1
fi
grep -q '^ninja: no work to do' "$build_log" || phase_times+=("build $((SECONDS - build_start)) s")
finish
