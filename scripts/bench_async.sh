#!/usr/bin/env bash
# Communication overlap on CPU ranks (Gloo on 127.0.0.1): step time, communication in flight
# (comm_s: issue to completion) and exposed communication (comm_exposed_s: the training thread
# blocked in a wait) per step, for blocking vs overlapped FSDP 2 and synchronous vs async TP 2,
# each on the real loopback network and on a simulated slower link (comm.debug_link_*), where
# communication takes long enough for overlap to matter.
#
#   scripts/bench_async.sh [BUILD_DIR] [extra --section.key overrides...]
#
# Each rank runs one intra-op thread; on the 2-core CI machine two ranks plus Gloo's worker
# threads share two cores, so on loopback the overlap competes with compute for the same cores
# (the table says what that costs). Steps 1..STEPS_WARMUP are excluded; means over the rest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
STEPS="${STEPS:-8}"
STEPS_WARMUP="${STEPS_WARMUP:-2}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_async.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run"
TRAIN="$BUILD/apps/titan-train"
[[ -x "$RUN" && -x "$TRAIN" ]] || { echo "bench_async.sh: build titan-run and titan-train in $BUILD first" >&2; exit 1; }

ARGS=(--training.seq_len 128 --training.local_batch_size 8 --training.global_batch_size 16
      --training.steps "$STEPS" --lr_scheduler.warmup_steps 2 --metrics.log_freq 1
      --training.num_threads 1 --metrics.peak_flops 1e12 "$@")
FSDP="--parallelism.data_parallel_shard_degree 2"
TP="--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1 --training.global_batch_size 8"
LINK_FSDP="--comm.debug_link_bytes_per_second 1e9"
LINK_TP="--comm.debug_link_bytes_per_second 1e8"

# name | network | overrides
RUNS=(
  "fsdp 2 blocking|loopback|$FSDP --parallelism.fsdp_overlap false"
  "fsdp 2 overlapped|loopback|$FSDP"
  "fsdp 2 blocking|1 GB/s link|$FSDP $LINK_FSDP --parallelism.fsdp_overlap false"
  "fsdp 2 overlapped|1 GB/s link|$FSDP $LINK_FSDP"
  "tp 2 sync|loopback|$TP"
  "tp 2 async (4 chunks)|loopback|$TP --parallelism.enable_async_tensor_parallel --parallelism.async_tp_chunks 4"
  "tp 2 sync|100 MB/s link|$TP $LINK_TP"
  "tp 2 async (4 chunks)|100 MB/s link|$TP $LINK_TP --parallelism.enable_async_tensor_parallel --parallelism.async_tp_chunks 4"
)

printf '| %-22s | %-13s | %9s | %9s | %13s |\n' run network "step (s)" "comm_s" "comm_exposed_s"
printf '|%s|%s|%s|%s|%s|\n' "------------------------" "---------------" "-----------" "-----------" "---------------"
i=0
for entry in "${RUNS[@]}"; do
  IFS='|' read -r name network overrides <<<"$entry"
  dir="$OUT/run$i"; i=$((i + 1))
  # shellcheck disable=SC2086
  if ! OMP_NUM_THREADS=1 "$RUN" --nproc-per-node 2 -- "$TRAIN" "${ARGS[@]}" $overrides \
      --job.dump_folder "$dir" >"$dir.log" 2>&1; then
    echo "bench_async.sh: '$name' ($network) failed, see $dir.log" >&2
    tail -5 "$dir.log" >&2
    exit 1
  fi
  python3 - "$dir" "$STEPS_WARMUP" "$name" "$network" <<'PY'
import json, sys, glob
d, warm, name, net = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for f in sorted(glob.glob(d + "/metrics_rank*.jsonl")):
    rows += [json.loads(l) for l in open(f)][warm:]
mean = lambda k: sum(r[k] for r in rows) / len(rows)
print(f"| {name:<22} | {net:<13} | {mean('elapsed_s'):9.3f} | {mean('comm_s'):9.3f} | {mean('comm_exposed_s'):14.3f} |")
PY
done
echo "(means over steps $((STEPS_WARMUP + 1))-$STEPS and both ranks; logs in $OUT)"
