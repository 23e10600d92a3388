#!/usr/bin/env bash
# Parallel layouts on CPU ranks (Gloo on 127.0.0.1): tokens/s per device, step time, per-rank
# memory (this rank's parameters, gradients, optimizer state, peak live tensor bytes) and the
# share of step time spent inside collectives (Comm's wall-clock counter), for 1, 2 and 4 ranks.
#
#   scripts/bench_parallel.sh [BUILD_DIR] [extra --section.key overrides...]
#
# Each rank runs one intra-op thread (training.num_threads 1); on a machine with fewer cores
# than ranks, ranks share cores and the per-device numbers say so. The first STEPS_WARMUP
# steps are excluded. Results are means over the measured steps and over ranks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
STEPS="${STEPS:-12}"
STEPS_WARMUP="${STEPS_WARMUP:-2}"
SEQ_LEN="${SEQ_LEN:-128}"
GLOBAL_BATCH="${GLOBAL_BATCH:-8}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_parallel.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run"
TRAIN="$BUILD/apps/titan-train"
[[ -x "$RUN" && -x "$TRAIN" ]] || { echo "bench_parallel.sh: build titan-run and titan-train in $BUILD first" >&2; exit 1; }

ARGS=(--training.seq_len "$SEQ_LEN" --training.local_batch_size 2 --training.global_batch_size "$GLOBAL_BATCH"
      --training.steps "$STEPS" --lr_scheduler.warmup_steps 2 --metrics.log_freq 1
      --training.num_threads 1 --metrics.peak_flops 1e12 "$@")

# name | ranks | overrides
LAYOUTS=(
  "single|1|"
  "fsdp 2|2|--parallelism.data_parallel_shard_degree 2"
  "replicate 2|2|--parallelism.data_parallel_replicate_degree 2"
  "tp 2|2|--parallelism.tensor_parallel_degree 2"
  "fsdp 4|4|--parallelism.data_parallel_shard_degree 4"
  "hsdp 2x2|4|--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2"
  "tp 4|4|--parallelism.tensor_parallel_degree 4"
  "fsdp 2 x tp 2|4|--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2"
)

for entry in "${LAYOUTS[@]}"; do
  IFS='|' read -r name ranks overrides <<<"$entry"
  dir="$OUT/${name// /_}"
  # shellcheck disable=SC2086
  if ! OMP_NUM_THREADS=1 "$RUN" --nproc-per-node "$ranks" -- "$TRAIN" "${ARGS[@]}" $overrides \
      --job.dump_folder "$dir" >"$dir.log" 2>&1; then
    echo "bench_parallel.sh: layout '$name' failed, see $dir.log" >&2
    tail -5 "$dir.log" >&2
    exit 1
  fi
done

python3 - "$OUT" "$STEPS_WARMUP" "${LAYOUTS[@]}" <<'PY'
import json, os, re, sys
out, warm, layouts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
mib = lambda b: b / 2**20
print(f"{'layout':<15} {'ranks':>5} {'tok/s/dev':>9} {'step s':>7} {'params MiB':>10} {'grads MiB':>9} "
      f"{'optim MiB':>9} {'peak MiB':>8} {'comm %':>6}")
for entry in layouts:
    name, ranks, _ = entry.split("|", 2)
    ranks = int(ranks)
    d = os.path.join(out, name.replace(" ", "_"))
    log = open(d + ".log").read()
    m = re.search(r"memory bytes: parameters (\d+), gradients (\d+), optimizer state (\d+)", log)
    params, grads, optim = (int(x) for x in m.groups())
    tps, step, peak, comm, elapsed = [], [], [], 0.0, 0.0
    for r in range(ranks):
        f = os.path.join(d, "metrics.jsonl" if ranks == 1 else f"metrics_rank{r}.jsonl")
        recs = [json.loads(l) for l in open(f)][warm:]
        tps += [x["tps"] for x in recs]
        step += [x["elapsed_s"] for x in recs]
        peak.append(max(x["memory_peak_bytes"] for x in recs))
        comm += sum(x.get("comm_s", 0.0) for x in recs)
        elapsed += sum(x["elapsed_s"] for x in recs)
    mean = lambda v: sum(v) / len(v)
    print(f"{name:<15} {ranks:>5} {mean(tps):>9.0f} {mean(step):>7.3f} {mib(params):>10.2f} {mib(grads):>9.2f} "
          f"{mib(optim):>9.2f} {mib(max(peak)):>8.1f} {100 * comm / elapsed:>6.1f}")
PY
echo "(logs and metrics: $OUT)"
