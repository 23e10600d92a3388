#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang-14, -fsanitize=fuzzer,address,undefined, in
# build-fuzz/) and runs each for a bounded time on its corpus (fuzz/corpus/<target>/, the
# committed seeds; new inputs go to build-fuzz/corpus/<target>/, never into the checkout).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     default 20 s, every target
#   TITAN_FUZZ_BUILD_ONLY=1 scripts/fuzz.sh               build only
# Exits non-zero on any crash, leak or sanitizer report, naming the reproducer file
# (build-fuzz/crash-<target>-*); replay one with: build-fuzz/<target> <reproducer>.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SECONDS_PER_TARGET="${1:-20}"
shift || true
OUT="$ROOT/build-fuzz"
mkdir -p "$OUT/obj"
CXX="${TITAN_FUZZ_CXX:-clang++-14}"
command -v "$CXX" >/dev/null || { echo "[fuzz] $CXX not found (Debian: clang-14 libclang-rt-14-dev)" >&2; exit 1; }
command -v ccache >/dev/null && CXX="ccache $CXX"
# LibTorch's headers and libraries from the wheel, found without importing torch (slow).
TORCH="$(ls -d "$ROOT"/.deps/venv/lib/python3*/site-packages/torch 2>/dev/null | head -1)"
# -O1 -g: libFuzzer's recommended level (fast enough, readable stack traces).
FLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I"$ROOT" -DTOML_HEADER_ONLY=0 -DTOML_SHARED_LIB=1)
TORCH_FLAGS=(-isystem "$TORCH/include" -isystem "$TORCH/include/torch/csrc/api/include" -D_GLIBCXX_USE_CXX11_ABI=1)
TORCH_LIBS=(-L"$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10)
# The wheel's OpenMP runtime, which the model library's kernels call (as the CMake build links it).
[[ -f "$TORCH/lib/libgomp.so.1" ]] && TORCH_LIBS+=("$TORCH/lib/libgomp.so.1")

# target: sources (beside fuzz/<target>.cpp) and libraries. Only fuzz_config needs LibTorch
# (the config table names float8 dtypes and asks ATen whether CUDA is there) and the model
# families' registry (model.name and model.flavor are checked against it); the registry's
# families bring their modules, the whole model library, which fuzz_config links as the CPU
# build (build/, made by scripts/setup.sh) compiled it: uninstrumented, so the fuzzer's coverage
# is the config's own code, and no second, sanitized compile of the model library.
declare -A SOURCES=(
  [fuzz_safetensors_header]="trainer/checkpoint/safetensors_header.cpp"
  [fuzz_tiktoken]="data/tiktoken_file.cpp data/text_lines.cpp"
  [fuzz_token_shard]="data/token_shard.cpp"
  [fuzz_hf_tokenizer]="data/hf_tokenizer.cpp data/bpe_tokenizer.cpp data/pretokenizer.cpp data/tiktoken_file.cpp data/text_lines.cpp data/tokenizer.cpp"
  # titan_config's own sources, read from its CMake target so the list cannot drift from it.
  [fuzz_config]="$(sed -n 's/^add_library(titan_config STATIC \(.*\))$/\1/p' "$ROOT/trainer/config/CMakeLists.txt" |
                   tr ' ' '\n' | sed 's|^|trainer/config/|' | tr '\n' ' ')"
)
BUILT="$ROOT/build"
MODEL_LIBS=("$BUILT/model/libtitan_model.a" "$BUILT/float8/libtitan_float8.a" "$BUILT/util/libtitan_logging.a")
declare -A LIBS=([fuzz_hf_tokenizer]="-lpcre2-8" [fuzz_config]="-ltomlplusplus")
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_safetensors_header fuzz_tiktoken fuzz_token_shard fuzz_hf_tokenizer fuzz_config)

build() {  # one object per source, shared between targets; rebuilt when the source is newer
  local target=$1 objs=() src obj extra=()
  [[ $target == fuzz_config ]] && extra=("${TORCH_FLAGS[@]}")
  for src in "fuzz/$target.cpp" ${SOURCES[$target]}; do
    obj="$OUT/obj/${src//\//_}.o"
    if [[ ! -f $obj || $src -nt $obj || -n $(find "$ROOT/${src%/*}" "$ROOT/fuzz" -name '*.h' -newer "$obj" -print -quit) ]]; then
      $CXX "${FLAGS[@]}" "${extra[@]}" -c "$src" -o "$obj"
    fi
    objs+=("$obj")
  done
  local libs=(${LIBS[$target]:-})
  if [[ $target == fuzz_config ]]; then
    for lib in "${MODEL_LIBS[@]}"; do
      [[ -f $lib ]] || { echo "[fuzz] fuzz_config links $lib, which is not built: run scripts/setup.sh first" >&2; exit 2; }
    done
    # The model and float8 libraries call each other: one group, searched until nothing is left.
    libs+=(-Wl,--start-group "${MODEL_LIBS[@]}" -Wl,--end-group -lspdlog -lfmt "${TORCH_LIBS[@]}")
  fi
  $CXX "${FLAGS[@]}" "${objs[@]}" "${libs[@]}" -o "$OUT/$target"
}

start=$(date +%s)
for t in "${TARGETS[@]}"; do
  [[ -f fuzz/$t.cpp ]] || { echo "[fuzz] no target '$t' (fuzz/*.cpp: ${!SOURCES[*]})" >&2; exit 2; }
  build "$t"
done
echo "[fuzz] built ${#TARGETS[@]} target(s) in $(( $(date +%s) - start )) s"
[[ "${TITAN_FUZZ_BUILD_ONLY:-0}" == 1 ]] && exit 0

failed=()
for t in "${TARGETS[@]}"; do
  mkdir -p "$OUT/corpus/$t"
  log="$OUT/$t.log"
  # A fixed seed: a CI run is reproducible. ASan's leak check is on (a reader that leaks on a bad
  # input fails). The committed seeds are read-only inputs; new ones go to build-fuzz/corpus/.
  rc=0
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$OUT/$t" -seed=1 -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$OUT/crash-$t-" -print_final_stats=1 "$OUT/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  last=$(grep -E "cov: [0-9]+" "$log" | tail -1)
  execs=$(grep -oE "^stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo "?")
  stats="$execs execs, cov $(grep -oE "cov: [0-9]+" <<<"$last" | grep -oE "[0-9]+"), ft $(grep -oE "ft: [0-9]+" <<<"$last" | grep -oE "[0-9]+"), corpus $(grep -oE "corp: [0-9]+/[0-9]+[a-zA-Z]*" <<<"$last" | cut -d' ' -f2)"
  if ((rc != 0)); then
    failed+=("$t")
    echo "[fuzz] $t FAILED (exit $rc): $(grep -m1 -E "ERROR|runtime error|deadly signal" "$log" || true)" >&2
    grep -E "Test unit written to" "$log" | sed 's/^/[fuzz]   reproducer: /' >&2 || true
    echo "[fuzz]   log: $log" >&2
  else
    echo "[fuzz] $t: ${SECONDS_PER_TARGET} s, $stats, no crash"
  fi
done
echo "[fuzz] total $(( $(date +%s) - start )) s"
((${#failed[@]} == 0)) || { echo "[fuzz] crashes in: ${failed[*]}" >&2; exit 1; }
