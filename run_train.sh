#!/usr/bin/env bash
# Train with titan, torchtitan-style:
#   ./run_train.sh                                   # debug model on the default data (CPU)
#   CONFIG_FILE=configs/llama3_8b.toml NGPU=8 ./run_train.sh --float8.enable_float8_linear
# Environment: NGPU (processes on this node; CPU ranks on a machine without GPUs, default 1
# there), LOG_RANK (which ranks' output to show, default 0), CONFIG_FILE, MAX_RESTARTS (titan-run
# --max-restarts: restart the job after a failure up to this many times, resuming from the last
# checkpoint; default 0). Every argument is a config override (--section.key value). The first
# run sets up what training needs (scripts/setup.sh --train; scripts/test.sh adds the test tools).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ "${TITAN_CUDA:-0}" == 1 ]]; then BUILD="$ROOT/build-cuda"; else BUILD="$ROOT/build"; fi
if command -v nvidia-smi >/dev/null 2>&1 && [[ "${TITAN_CUDA:-0}" == 1 ]]; then
  DEFAULT_NGPU="$(nvidia-smi -L | wc -l)"
else
  DEFAULT_NGPU=1
fi
NGPU="${NGPU:-$DEFAULT_NGPU}"
LOG_RANK="${LOG_RANK:-0}"
CONFIG_FILE="${CONFIG_FILE:-$ROOT/configs/llama3_debugmodel.toml}"

# Set up and (incrementally) build only what training needs: one line per set-up phase as it
# starts, the build as one updating line, the whole log of a phase that fails; nothing when there
# is nothing to do (scripts/setup.sh).
if ! "$ROOT/scripts/setup.sh" --train; then
  echo "run_train.sh: set-up failed (see above)" >&2
  exit 1
fi

TRAIN=("$BUILD/apps/titan-train" --job.config_file "$CONFIG_FILE" "$@")
MAX_RESTARTS="${MAX_RESTARTS:-0}"
if [[ "$NGPU" == 1 && "$MAX_RESTARTS" == 0 ]]; then
  exec "${TRAIN[@]}"
fi
exec "$BUILD/apps/titan-run" --nproc-per-node "$NGPU" --local-ranks-filter "$LOG_RANK" \
  --max-restarts "$MAX_RESTARTS" -- "${TRAIN[@]}"
