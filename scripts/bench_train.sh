#!/usr/bin/env bash
# titan vs plain PyTorch eager and torch.compile (Python, same wheel, same threads, same model and
# batch shape) on the CPU: steady-state tokens/s, time to first step and peak memory (resident
# set) for the debug model and a ~100M model.
#   scripts/bench_train.sh [threads]          # ENGINES="titan eager compile" by default
# Time to first step: from process start to the end of the first optimizer step (Python: from
# before `import torch`; includes torch.compile's warm-up; titan: the process's wall time minus
# its timed steps, so it also counts titan's exit). Steady state: tokens/s over the timed steps
# after the warm-up steps (2; torch.compile: 3, its backward graph compiles in step 1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
THREADS="${1:-$(nproc)}"
ENGINES="${ENGINES:-titan eager compile}"
"$ROOT/scripts/setup.sh" >/dev/null
PY="$ROOT/.deps/venv/bin/python"
TRAIN="$ROOT/build/apps/titan-train"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# name flavor batch seq_len timed_steps
CASES=("debug debugmodel 4 128 30" "100M 100M 2 256 8")

for c in "${CASES[@]}"; do
  read -r name flavor batch seq steps <<<"$c"
  for engine in $ENGINES; do
    warmup=2
    case "$engine" in
      titan)
        start=$(date +%s.%N)
        "$TRAIN" --model.flavor "$flavor" --training.local_batch_size "$batch" --training.seq_len "$seq" \
          --training.steps $((steps + warmup)) --training.num_threads "$THREADS" --metrics.log_freq 1 \
          --metrics.peak_flops 1e12 --job.dump_folder "$OUT/$name" >"$OUT/$name.log" 2>&1
        end=$(date +%s.%N)
        "$PY" - "$OUT/$name/metrics.jsonl" "$warmup" "$start" "$end" >"$OUT/$name.$engine.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warmup, wall = int(sys.argv[2]), float(sys.argv[4]) - float(sys.argv[3])
timed = [r for r in rows if r["step"] > warmup]
after_first = sum(r["elapsed_s"] for r in rows if r["step"] > 1)
print(json.dumps({"tps": sum(r["tokens"] for r in timed) / sum(r["elapsed_s"] for r in timed),
                  "first_step_s": wall - after_first, "peak_rss_bytes": rows[-1]["peak_rss_bytes"]}))
PY
        ;;
      eager | compile)
        flags=()
        if [[ "$engine" == compile ]]; then flags=(--compile); warmup=3; fi
        OMP_NUM_THREADS=$THREADS "$PY" "$ROOT/scripts/bench/eager_llama.py" --flavor "$flavor" \
          --batch "$batch" --seq-len "$seq" --steps "$steps" --warmup "$warmup" --threads "$THREADS" \
          "${flags[@]}" 2>"$OUT/$name.$engine.err" >"$OUT/$name.$engine.json" ||
          { cat "$OUT/$name.$engine.err" >&2; exit 1; }
        ;;
      *) echo "bench_train.sh: unknown engine '$engine' in ENGINES (choose from: titan eager compile)" >&2; exit 2 ;;
    esac
  done
done

"$PY" - "$OUT" "$THREADS" "$ENGINES" "${CASES[@]}" <<'PY'
import json, os, sys
out, threads, engines, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
print(f"threads: {threads}")
print("| case | engine | tok/s | vs eager | first step s | peak RSS GiB |")
print("|---|---|---|---|---|---|")
for c in cases:
    name = c.split()[0]
    res = {e: json.load(open(os.path.join(out, f"{name}.{e}.json"))) for e in engines}
    for e in engines:
        r = res[e]
        ratio = f"{r['tps'] / res['eager']['tps']:.2f}x" if "eager" in res else "-"
        print(f"| {name} | {e} | {r['tps']:,.0f} | {ratio} | {r['first_step_s']:.1f} | "
              f"{r['peak_rss_bytes'] / 2**30:.3f} |")
PY
