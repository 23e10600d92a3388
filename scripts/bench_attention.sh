#!/usr/bin/env bash
# Document masking in real training: causal vs block-causal attention (model.attn_mask_type), per
# sequence length, data mix and context-parallel degree: the step time of each, the speed-up, the
# fraction of the causal square block-causal attention actually computes, and each one's peak
# tracked tensor bytes. The peer is the causal run of the same sequence, data and cp, run right
# before it (back to back, so both see the same load on a shared machine).
#
#   scripts/bench_attention.sh [BUILD_DIR] [extra --section.key overrides...]
#   SEQ_LENS="2048 4096" CPS="1" DATASETS="long" STEPS=3 scripts/bench_attention.sh
#
# Two data mixes: "fortunes" (the default dataset: short documents, ~10-20 per 2048 tokens) and
# "long docs 256-1024" (DATASETS name "long"): a jsonl file built here under $OUT whose documents
# are 256-1024 tokens long (uniform, fixed seed LONG_DOCS_SEED), cut from the repository's own
# README.md and docs/*.md concatenated. debugmodel uses the byte-level tokenizer (model.tokenizer_path
# = ""): a text of n bytes is n + 2 tokens (BOS, its UTF-8 bytes, EOS), so the text is folded to
# ASCII and a document of L tokens gets L - 2 characters; the script checks every length through
# titan-tokenize before training on it. The lengths depend only on LONG_DOCS_SEED; the text
# follows the checkout's docs, so the loss (not the attention work) moves when they are edited.
#
# One row of SEQ_LEN tokens per step (local batch 1), debugmodel, no activation checkpointing, one
# intra-op thread per rank; cp > 1 runs cp CPU ranks (Gloo on 127.0.0.1) with the ring's alltoall
# rotate method (the ring skips the chunk pairs that share no document). The first STEPS_WARMUP
# steps are excluded from the step time; the peak is the largest rank's memory_peak_bytes.
#
# "attention work" is the fraction of the causal square block-causal attention computes,
# mean over the rows trained of sum_d len_d (len_d + 1) / (S (S + 1)) (titan's own
# model::attention_work_fraction), computed here from the rows the runs actually trained on, not
# from the generated lengths: titan-tokenize --seed SEED writes the dataset in the loader's
# epoch-0 document order, and the first STEPS windows of SEQ_LEN + 1 tokens of that stream are the
# STEPS rows of the run (inputs = window[:-1]; a document is everything up to and including an
# EOS, the row's leading tail of an earlier document included). It assumes the extra overrides
# leave training.seed and the data alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
shift || true
SEQ_LENS="${SEQ_LENS:-2048 4096 8192}"
CPS="${CPS:-1 2}"
DATASETS="${DATASETS:-fortunes long}"
STEPS="${STEPS:-4}"
STEPS_WARMUP="${STEPS_WARMUP:-1}"
SEED="${SEED:-3}"                       # training.seed: weights and the document shuffle
LONG_DOCS_SEED="${LONG_DOCS_SEED:-1234}"
LONG_DOCS="${LONG_DOCS:-600}"           # documents in the long-docs file (~384k tokens)
CONFIG="${CONFIG:-$ROOT/configs/llama3_debugmodel.toml}"
OUT="${OUT:-$(mktemp -d /tmp/titan_bench_attention.XXXXXX)}"
mkdir -p "$OUT"
RUN="$BUILD/apps/titan-run"
TRAIN="$BUILD/apps/titan-train"
TOKENIZE="$BUILD/apps/titan-tokenize"
[[ -x "$RUN" && -x "$TRAIN" && -x "$TOKENIZE" ]] ||
  { echo "bench_attention.sh: build titan-run, titan-train and titan-tokenize in $BUILD first" >&2; exit 1; }
(( STEPS > STEPS_WARMUP )) || { echo "bench_attention.sh: STEPS ($STEPS) must exceed STEPS_WARMUP ($STEPS_WARMUP)" >&2; exit 1; }

# The long-docs jsonl: lengths (in tokens) drawn first from LONG_DOCS_SEED, then text cut to them.
LONG_JSONL="$OUT/long_docs.jsonl"
python3 - "$ROOT" "$LONG_JSONL" "$LONG_DOCS" "$LONG_DOCS_SEED" <<'PY'
import json, pathlib, random, sys, unicodedata
root, out, n_docs, seed = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sources = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
text = "\n\n".join(p.read_text(encoding="utf-8") for p in sources)
# ASCII only, so one character is one byte is one token of the byte-level tokenizer.
fold = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
        "\u2026": "...", "\u00d7": "x", "\u2192": "->", "\u2190": "<-", "\u2264": "<=", "\u2265": ">=",
        "\u2248": "~", "\u00b1": "+-", "\u2260": "!="}
text = "".join(c if ord(c) < 128 else fold.get(c) or unicodedata.normalize("NFKD", c).encode("ascii", "ignore").decode()
               for c in text)
rng = random.Random(seed)
lengths = [rng.randint(256, 1024) for _ in range(n_docs)]  # tokens, BOS and EOS included
pos, docs = 0, []
for n in lengths:
    chars = n - 2
    piece = ""
    while len(piece) < chars:  # wrap around the concatenated text
        take = text[pos:pos + chars - len(piece)]
        piece += take
        pos = (pos + len(take)) % len(text)
    docs.append(piece)
with open(out, "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
with open(out + ".lengths", "w") as f:
    f.write(" ".join(map(str, lengths)) + "\n")
PY

# Token shards in the loader's epoch-0 order (titan-tokenize --seed = the loader's shuffle), and, for
# the long docs, the same documents in file order to check every length is what was drawn.
"$TOKENIZE" --format fortunes --seed "$SEED" --output "$OUT/fortunes.bin" > "$OUT/tokenize_fortunes.log" 2>&1 ||
  { echo "bench_attention.sh: titan-tokenize (fortunes) failed: see $OUT/tokenize_fortunes.log" >&2; exit 1; }
"$TOKENIZE" --format jsonl --input "$LONG_JSONL" --seed "$SEED" --output "$OUT/long.bin" > "$OUT/tokenize_long.log" 2>&1 ||
  { echo "bench_attention.sh: titan-tokenize (long docs) failed: see $OUT/tokenize_long.log" >&2; exit 1; }
"$TOKENIZE" --format jsonl --input "$LONG_JSONL" --keep-order --output "$OUT/long_ordered.bin" > "$OUT/tokenize_long_ordered.log" 2>&1 ||
  { echo "bench_attention.sh: titan-tokenize (long docs, file order) failed: see $OUT/tokenize_long_ordered.log" >&2; exit 1; }

read_shard() {  # helper module for the Python snippets below
  cat <<'PY'
import struct
def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"TITANTOK", path
    _, width, count, vocab = struct.unpack("<IIQQ", data[8:32])
    fmt = {2: "H", 4: "I"}[width]
    return list(struct.unpack("<%d%s" % (count, fmt), data[32:32 + count * width])), vocab
EOS = 257  # byte-level tokenizer (data/tokenizer.h: kEosId)
PY
}

python3 - "$OUT/long_ordered.bin" "$LONG_JSONL.lengths" <<PY
$(read_shard)
import sys
tokens, vocab = read_shard(sys.argv[1])
want = [int(x) for x in open(sys.argv[2]).read().split()]
got, start = [], 0
for i, t in enumerate(tokens):
    if t == EOS:
        got.append(i + 1 - start)
        start = i + 1
if vocab != 258 or got != want:
    sys.exit("bench_attention.sh: long-docs token lengths differ from the drawn ones (vocab %d, %d vs %d documents)"
             % (vocab, len(got), len(want)))
PY

work_fraction() {  # shard seq -> mean over the first STEPS rows of sum_d len_d (len_d + 1) / (S (S + 1))
  python3 - "$1" "$2" "$STEPS" <<PY
$(read_shard)
import sys
tokens, _ = read_shard(sys.argv[1])
S, steps = int(sys.argv[2]), int(sys.argv[3])
W = len(tokens) // (S + 1)  # windows per epoch; the loader repeats epochs (reshuffled, not modelled)
if steps > W:
    sys.exit("bench_attention.sh: %d rows of %d tokens exceed one epoch (%d windows)" % (steps, S, W))
total = 0.0
for r in range(steps):
    row = tokens[r * (S + 1): r * (S + 1) + S]
    lengths, start = [], 0
    for i, t in enumerate(row):
        if t == EOS:
            lengths.append(i + 1 - start)
            start = i + 1
    if start < S:
        lengths.append(S - start)
    total += sum(n * (n + 1) for n in lengths) / (S * (S + 1))
print("%.4f" % (total / steps))
PY
}

summarize() {  # seq data cp fraction causal_dump block_dump
  python3 - "$@" "$STEPS_WARMUP" <<'PY'
import json, os, sys
seq, data, cp, frac, causal, block, warmup = (int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                                             sys.argv[5], sys.argv[6], int(sys.argv[7]))
files = ["metrics.jsonl"] if cp == 1 else ["metrics_rank%d.jsonl" % r for r in range(cp)]
def measure(dump):
    times, peaks = [], []
    for f in files:
        rows = [json.loads(l) for l in open(os.path.join(dump, f))]
        rows = [r for r in rows if "elapsed_s" in r]  # training steps only
        times.append(sum(r["elapsed_s"] for r in rows[warmup:]) / max(1, len(rows) - warmup))
        peaks.append(max(r["memory_peak_bytes"] for r in rows) / 2**20)
    return max(times), max(peaks)
tc, pc = measure(causal)
tb, pb = measure(block)
print("| %5d | %-18s | %2d | %14.0f | %20.0f | %23.2fx | %43.3f | %15.1f | %14.1f |"
      % (seq, data, cp, 1e3 * tc, 1e3 * tb, tc / tb, frac, pc, pb))
PY
}

echo "causal vs block-causal attention, debugmodel, 1 x SEQ_LEN tokens per step, no AC, 1 thread per rank, steps $((STEPS_WARMUP + 1))-$STEPS timed, $(nproc) cores, $(date -u +%F)"
echo "| seq   | data               | cp | causal step ms | block-causal step ms | speed-up (causal/block) | attention work done (fraction of causal square) | causal peak MiB | block peak MiB |"
echo "|-------|--------------------|----|----------------|----------------------|-------------------------|-------------------------------------------------|-----------------|----------------|"
for seq in $SEQ_LENS; do
  for data in $DATASETS; do
    case "$data" in
      fortunes) DATA_ARGS=(--training.dataset fortunes); label="fortunes"; shard="$OUT/fortunes.bin" ;;
      long) DATA_ARGS=(--training.dataset jsonl --training.dataset_path "$LONG_JSONL"); label="long docs 256-1024"; shard="$OUT/long.bin" ;;
      *) echo "bench_attention.sh: unknown DATASETS entry '$data' (fortunes, long)" >&2; exit 1 ;;
    esac
    frac="$(work_fraction "$shard" "$seq")" || { echo "| $seq $label: attention work fraction failed"; continue; }
    ARGS=(--job.config_file "$CONFIG" --training.seq_len "$seq" --training.local_batch_size 1 --training.steps "$STEPS"
          --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --training.num_threads 1 --training.seed "$SEED"
          "${DATA_ARGS[@]}" "$@")
    for cp in $CPS; do
      failed=0
      for mask in causal block_causal; do
        dump="$OUT/seq${seq}_${data}_cp${cp}_$mask"
        rm -rf "$dump"
        if (( cp == 1 )); then
          "$TRAIN" "${ARGS[@]}" --model.attn_mask_type "$mask" --job.dump_folder "$dump" > "$dump.log" 2>&1 ||
            { echo "| $seq $label cp $cp $mask failed: see $dump.log"; failed=1; break; }
        else
          "$RUN" --nproc-per-node "$cp" -- "$TRAIN" "${ARGS[@]}" --model.attn_mask_type "$mask" \
            --parallelism.context_parallel_degree "$cp" --parallelism.context_parallel_rotate_method alltoall \
            --job.dump_folder "$dump" > "$dump.log" 2>&1 ||
            { echo "| $seq $label cp $cp $mask failed: see $dump.log"; failed=1; break; }
        fi
      done
      (( failed == 0 )) || continue
      summarize "$seq" "$label" "$cp" "$frac" "$OUT/seq${seq}_${data}_cp${cp}_causal" "$OUT/seq${seq}_${data}_cp${cp}_block_causal" ||
        echo "| $seq $label cp $cp: reading the metrics failed: see $OUT/seq${seq}_${data}_cp${cp}_*.log"
    done
  done
done
echo "logs: $OUT"
