#!/usr/bin/env bash
# Packs everything a bare GPU machine lacks into one git-ignored folder, so that
# scripts/gpu_check.sh runs there with nothing but that folder, the checkout and the machine's
# own python + torch 2.11 (no apt, no pip, no network).
#   scripts/gpu_bundle.sh [--out DIR] [--rehearse]      (DIR default: .gpu_bundle)
# Runs on the CPU machine (CI too): builds the CUDA-enabled variant's executables into
# build-cuda/ (scripts/setup.sh), then writes DIR:
#   bin/   titan-train titan-run titan-bench-matmul titan-bench-linear titan-bench-experts titan-bench-attention test_float8 test_nccl test_model
#          test_trainer,
#          without RPATH and without debug sections (LibTorch comes from LD_LIBRARY_PATH, which
#          scripts/gpu_env.sh computes from `python3 -c 'import torch'` on the machine)
#   lib/   the shared libraries they need that are neither torch's nor the C library's
#          (spdlog, fmt, pcre2, ...); lib/compat/ libstdc++ and libgcc_s, used only when the
#          machine's are older than what the build needs (gpu_check.sh decides)
#   data/  the fortunes corpus (the default dataset; a Debian package there is none of) and a
#          128,256-token vocabulary for the 8B-shaped benchmarks (scripts/bench/bench_vocab.py)
#   configs/, env.sh (= scripts/gpu_env.sh), bundle.json (versions, files, sizes)
# --rehearse then proves the bundle without a GPU: no bundled file has a library search path
# (RPATH/RUNPATH) or needs a library by path, LibTorch is unreachable without gpu_env.sh, and
# scripts/gpu_check.sh --rehearse passes in a copy of exactly what travels to a GPU machine
# (tracked + untracked-not-ignored files + the bundle; no .deps, no build folders), against the
# torch a python reports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="$ROOT/.gpu_bundle"
REHEARSE=0
while (($#)); do
  case "$1" in
    --out) OUT_DIR="$(realpath -m "$2")"; shift 2 ;;
    --rehearse) REHEARSE=1; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (valid: --out DIR, --rehearse)" >&2; exit 2 ;;
  esac
done
log() { echo "[gpu_bundle] $*"; }
start=$(date +%s)

TARGETS="titan-train titan-run titan-bench-matmul titan-bench-linear titan-bench-experts titan-bench-attention test_float8 test_nccl test_model test_trainer"
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "gpu_bundle: no CUDA toolkit (nvcc) here: the CUDA-enabled variant cannot be built" >&2
  exit 1
fi
mkdir -p "$ROOT/build-cuda"
if ! TITAN_CUDA=1 TITAN_BUILD_TARGET="$TARGETS" "$ROOT/scripts/setup.sh" >"$ROOT/build-cuda/gpu_bundle_build.log" 2>&1; then
  tail -40 "$ROOT/build-cuda/gpu_bundle_build.log" >&2
  echo "gpu_bundle: the CUDA-enabled build failed (log: build-cuda/gpu_bundle_build.log)" >&2
  exit 1
fi
built=$(date +%s)
log "CUDA-enabled build: $((built - start)) s"

VENV_PY="$ROOT/.deps/venv/bin/python"
TORCH_DIR="$("$VENV_PY" -c 'import torch,os; print(os.path.dirname(torch.__file__))')"
TORCH_VERSION="$("$VENV_PY" -c 'import torch; print(torch.__version__)')"
SITE="$(dirname "$TORCH_DIR")"
TORCH_LIBS="$TORCH_DIR/lib$(for d in "$SITE"/nvidia/*/lib; do printf ':%s' "$d"; done)"

STAGE="$OUT_DIR.tmp.$$"
rm -rf "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,lib/compat,data/fortunes,configs}

declare -A EXE_PATH=(
  [titan-train]=build-cuda/apps/titan-train [titan-run]=build-cuda/apps/titan-run
  [titan-bench-matmul]=build-cuda/apps/titan-bench-matmul
  [titan-bench-linear]=build-cuda/apps/titan-bench-linear
  [titan-bench-experts]=build-cuda/apps/titan-bench-experts
  [titan-bench-attention]=build-cuda/apps/titan-bench-attention
  [test_float8]=build-cuda/tests/test_float8 [test_nccl]=build-cuda/tests/test_nccl
  [test_model]=build-cuda/tests/test_model [test_trainer]=build-cuda/tests/test_trainer)
for name in "${!EXE_PATH[@]}"; do
  # Debug sections (-g1 line tables) are most of each file; symbols stay for backtraces.
  objcopy --strip-debug "${EXE_PATH[$name]}" "$STAGE/bin/$name"
  cmake -DF="$STAGE/bin/$name" -P "$ROOT/cmake/RpathRemove.cmake" >/dev/null
done

# Shared libraries: what the loader resolves for each executable, minus torch's wheel (the
# machine's torch provides those) and the C runtime every Linux has.
is_base_runtime() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
  esac
  return 1
}
declare -A PACKED=()
for exe in "$STAGE"/bin/*; do
  while read -r soname path; do
    [[ -z "$path" || "$path" == "$SITE"/* ]] && continue
    is_base_runtime "$soname" && continue
    [[ -n "${PACKED[$soname]:-}" ]] && continue
    case "$soname" in
      libstdc++.so*|libgcc_s.so*) dest="$STAGE/lib/compat/$soname" ;;
      *) dest="$STAGE/lib/$soname" ;;
    esac
    objcopy --strip-debug "$path" "$dest" 2>/dev/null || cp -L "$path" "$dest"
    PACKED[$soname]="$path"
  done < <(LD_LIBRARY_PATH="$TORCH_LIBS" ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  if LD_LIBRARY_PATH="$TORCH_LIBS" ldd "$exe" | grep -q "not found"; then
    echo "gpu_bundle: $(basename "$exe") has unresolved libraries here:" >&2
    LD_LIBRARY_PATH="$TORCH_LIBS" ldd "$exe" | grep "not found" >&2
    exit 1
  fi
done

# Data: fortune files are the extensionless ones (the .dat indexes and .u8 links are not read).
FORTUNES=/usr/share/games/fortunes
find "$FORTUNES" -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$STAGE/data/fortunes/" \;
python3 "$ROOT/scripts/bench/bench_vocab.py" "$STAGE/data/bench_vocab_128k.tiktoken"
cp "$ROOT"/configs/*.toml "$STAGE/configs/"
cp "$ROOT/scripts/gpu_env.sh" "$STAGE/env.sh"

# Manifest: what was built from what, and the newest glibc / libstdc++ symbol versions needed.
need_versions() {
  for f in "$STAGE"/bin/* "$STAGE"/lib/*.so*; do objdump -T "$f" 2>/dev/null; done |
    grep -o "$1_[0-9.]*" | sort -uV | tail -1
}
commit="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)"
python3 - "$STAGE" "$TORCH_VERSION" "$commit" "$dirty" "$(need_versions GLIBC)" \
  "$(need_versions GLIBCXX)" "$(for s in "${!PACKED[@]}"; do echo "$s=${PACKED[$s]}"; done)" <<'PY'
import json, os, sys, datetime
stage, torch_version, commit, dirty, glibc, glibcxx, packed = sys.argv[1:8]
files = {}
for d, _, names in os.walk(stage):
    for n in sorted(names):
        p = os.path.join(d, n)
        files[os.path.relpath(p, stage)] = os.path.getsize(p)
manifest = {
    "torch_version": torch_version, "git_commit": commit, "git_dirty": dirty == "true",
    "built": datetime.datetime.now().isoformat(timespec="seconds"), "cuda_arch": "sm_90",
    "needs": {"glibc": glibc, "glibcxx": glibcxx},
    "packed_libraries": dict(l.split("=", 1) for l in packed.splitlines() if l),
    "total_bytes": sum(files.values()), "files": files,
}
with open(os.path.join(stage, "bundle.json"), "w") as f:
    json.dump(manifest, f, indent=1)
PY
rm -rf "$OUT_DIR"
mv "$STAGE" "$OUT_DIR"
trap - EXIT
size_kib=$(du -sk "$OUT_DIR" | cut -f1)
log "bundle $OUT_DIR: $((size_kib / 1024)) MiB ($(find "$OUT_DIR" -type f | wc -l) files), packed" \
    "libraries: ${!PACKED[*]}; built + packed in $(( $(date +%s) - start )) s"
if ((size_kib > 48 * 1024)); then
  echo "gpu_bundle: the bundle is $((size_kib / 1024)) MiB: with the checkout it must stay under the 64 MiB a GPU run carries" >&2
  exit 1
fi
[[ $REHEARSE == 1 ]] || exit 0

# ---------------------------------------------------------------------------------- rehearsal
r_start=$(date +%s)
bad=0
for f in "$OUT_DIR"/bin/* "$OUT_DIR"/lib/*.so* "$OUT_DIR"/lib/compat/*; do
  if readelf -d "$f" 2>/dev/null | grep -E "RPATH|RUNPATH"; then
    echo "gpu_bundle: $f still has a library search path" >&2; bad=1
  fi
  if readelf -d "$f" 2>/dev/null | grep NEEDED | grep -F "/"; then
    echo "gpu_bundle: $f needs a library by path, not by soname" >&2; bad=1
  fi
done
if env -u LD_LIBRARY_PATH ldd "$OUT_DIR/bin/titan-train" | grep -q "libtorch_cpu.so => /"; then
  echo "gpu_bundle: titan-train finds LibTorch without gpu_env.sh" >&2; bad=1
fi
((bad == 0)) || exit 1
log "rehearsal: no RPATH/RUNPATH, no library needed by path, LibTorch unreachable without gpu_env.sh"

# The python: python3 if it has torch (a GPU machine's image), else this checkout's venv,
# reached from outside the copy.
PY=python3
python3 -c "import torch" 2>/dev/null || PY="$VENV_PY"
COPY="$(mktemp -d /tmp/titan-gpu-rehearsal.XXXXXX)"
trap 'rm -rf "$COPY"' EXIT
mkdir -p "$COPY/checkout"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$COPY/checkout"
else  # not a git checkout: everything but what .gitignore keeps out
  tar -C "$ROOT" --exclude=./.deps --exclude='./build*' --exclude=./outputs --exclude=./.git \
    --exclude='./.gpu_bundle*' -cf - . | tar -C "$COPY/checkout" -xf -
fi
cp -r "$OUT_DIR" "$COPY/checkout/.gpu_bundle"
log "rehearsal copy: $(du -sm "$COPY/checkout" | cut -f1) MiB travel (checkout + bundle), no .deps: $([[ -e "$COPY/checkout/.deps" ]] && echo PRESENT || echo absent)"
set +e
(cd "$COPY/checkout" && TITAN_PYTHON="$PY" GPU_CHECK_OUT="$COPY/out" \
   scripts/gpu_check.sh --bundle .gpu_bundle --rehearse)
rc=$?
set -e
n_out=$(find "$COPY/out" -type f | wc -l)
if ((rc == 0 && n_out > 8)); then
  echo "gpu_bundle: gpu_check wrote $n_out result files (at most 8 come back)" >&2; rc=1
fi
mkdir -p "$ROOT/outputs"
rm -rf "$ROOT/outputs/gpu_rehearsal"
cp -r "$COPY/out" "$ROOT/outputs/gpu_rehearsal"
log "rehearsal: rc $rc, $n_out result files (outputs/gpu_rehearsal), $(( $(date +%s) - r_start )) s"
exit $rc
