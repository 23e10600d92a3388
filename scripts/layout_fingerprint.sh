#!/usr/bin/env bash
# Every layout's losses and grad norms, to the last bit, as one text file: run it before and
# after a restructuring that must not change a number, and diff the two files.
#   scripts/layout_fingerprint.sh OUT.txt [BUILD_DIR]      (BUILD_DIR default: build)
# One line per (layout, step): "<layout> <step> <loss> <grad_norm>" with the values as
# metrics.jsonl holds them (nlohmann::json's shortest round-trip form: equal text = equal bits).
# Layouts: 1 process; FSDP 2; HSDP 2x2; TP 2 (sync, async); PP 2 under each of torchtitan's six
# schedules; CP 2 under each rotate method; PP 2 x CP 2; float8 tensorwise / rowwise /
# rowwise_with_gw_hp / blockwise, MXFP8 and MXFP4 (emulated), int8 on 1 process; float8 under
# FSDP 2 (with the float8 all-gather) and TP 2; AC op and full; Qwen3 dense and MoE under TP, EP,
# EP x TP, PP, FSDP and float8. All on the CPU (Gloo), 4 steps.
set -euo pipefail
OUT="${1:?usage: scripts/layout_fingerprint.sh OUT.txt [BUILD_DIR]}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${2:-$ROOT/build}"
WORK="$(mktemp -d /tmp/titan-fingerprint.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
BASE=(--job.config_file "$ROOT/configs/llama3_debugmodel.toml" --training.steps 4 --training.seq_len 64
      --training.local_batch_size 8 --training.num_threads 1 --metrics.log_freq 1)
run() {  # NAME NPROC ARGS...
  local name="$1" nproc="$2"
  shift 2
  local cmd=("$BUILD/apps/titan-train" "${BASE[@]}" --job.dump_folder "$WORK/$name" "$@")
  ((nproc > 1)) && cmd=("$BUILD/apps/titan-run" --nproc-per-node "$nproc" -- "${cmd[@]}")
  if ! "${cmd[@]}" >"$WORK/$name.log" 2>&1; then
    echo "layout_fingerprint: $name failed:" >&2; tail -5 "$WORK/$name.log" >&2; exit 1
  fi
  "$ROOT/.deps/venv/bin/python" - "$WORK/$name/metrics.jsonl" "$name" >>"$WORK/out.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r:
        raw = line  # the values as titan wrote them (no float re-formatting)
        loss = raw.split('"loss":')[1].split(",")[0].split("}")[0]
        norm = raw.split('"grad_norm":')[1].split(",")[0].split("}")[0]
        print(sys.argv[2], r["step"], loss, norm)
PY
  echo "[fingerprint] $name"
}
P=--parallelism
PP=("$P.pipeline_parallel_degree" 2 "$P.data_parallel_shard_degree" 1 "$P.pipeline_parallel_microbatch_size" 2)
run single 1
run fsdp2 2 "$P.data_parallel_shard_degree" 2
run hsdp2x2 4 "$P.data_parallel_replicate_degree" 2 "$P.data_parallel_shard_degree" 2
run tp2 2 "$P.tensor_parallel_degree" 2
run tp2_async 2 "$P.tensor_parallel_degree" 2 "$P.enable_async_tensor_parallel"
for s in GPipe 1F1B Interleaved1F1B LoopedBFS InterleavedZeroBubble ZBVZeroBubble; do
  run "pp2_$s" 2 "${PP[@]}" "$P.pipeline_parallel_schedule" "$s"
done
for m in allgather alltoall titan_ulysses; do
  run "cp2_$m" 2 "$P.context_parallel_degree" 2 "$P.data_parallel_shard_degree" 1 "$P.context_parallel_rotate_method" "$m"
done
run pp2_cp2 4 "${PP[@]}" "$P.pipeline_parallel_schedule" 1F1B "$P.context_parallel_degree" 2
for r in tensorwise rowwise rowwise_with_gw_hp blockwise; do
  run "float8_$r" 1 --float8.enable_float8_linear --float8.recipe_name "$r"
done
run mxfp8 1 --model.converters mx --mx.recipe_name mxfp8_emulated
run mxfp4 1 --model.converters mx --mx.recipe_name mxfp4_emulated
run int8 1 --int8.enable_int8_linear
run fsdp2_float8_all_gather 2 "$P.data_parallel_shard_degree" 2 --float8.enable_float8_linear \
  --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp
run tp2_float8_rowwise 2 "$P.tensor_parallel_degree" 2 --float8.enable_float8_linear --float8.recipe_name rowwise
run ac_full_fsdp2 2 "$P.data_parallel_shard_degree" 2 --activation_checkpoint.mode full
run ac_op 1 --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op
# The other families' declarations: Qwen3 dense (qk-norms, a tied embedding) and Qwen3-MoE (every
# block an MoE layer) under the layouts that read a family's plan: TP (its rules), EP (its
# experts), EP x TP (the MoE rules skipped), PP (its blocks), FSDP.
QWEN=(--model.name qwen3 --model.flavor debugmodel)
MOE=(--model.name qwen3 --model.flavor debugmodel_moe_small)
run qwen3_single 1 "${QWEN[@]}"
run qwen3_tp2 2 "${QWEN[@]}" "$P.tensor_parallel_degree" 2
run qwen3_moe_single 1 "${MOE[@]}"
run qwen3_moe_fsdp2 2 "${MOE[@]}" "$P.data_parallel_shard_degree" 2
run qwen3_moe_tp2 2 "${MOE[@]}" "$P.tensor_parallel_degree" 2
run qwen3_moe_ep2 2 "${MOE[@]}" "$P.data_parallel_shard_degree" 2 "$P.expert_parallel_degree" 2
run qwen3_moe_ep2_tp2 2 "${MOE[@]}" "$P.tensor_parallel_degree" 2 "$P.expert_parallel_degree" 2
run qwen3_moe_pp2 2 "${MOE[@]}" "${PP[@]}" "$P.pipeline_parallel_schedule" 1F1B
run qwen3_moe_float8 1 "${MOE[@]}" --float8.enable_float8_linear --float8.recipe_name rowwise
mv "$WORK/out.txt" "$OUT"
echo "layout_fingerprint: $(wc -l <"$OUT") lines -> $OUT"
