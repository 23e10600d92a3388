"""Readers of what scripts/gpu_check.sh's steps print, for scripts/bench/gpu_results.py.

Each reader takes a step's text and a Findings collector and never raises on its input: a cell,
a line or a record it cannot read becomes an "unreadable: <text>" value beside the numbers it
could read, and a Findings row naming the step. A format change in a bench tool therefore shows
up as a named row (and a non-zero exit of gpu_results.py), never as a lost table.

The formats, as the tools print them today:
  titan-bench-matmul   'model linear M K N | hp ms TFLOP/s | <cell> | <cell> | <cell>', cells
                       '<ms> ms <speedup>x' for float8 tensorwise, float8 rowwise, int8
  titan-bench-linear   table 1 'M K N | hp ms | <recipe> ... | int8', cells
                       '<ms> <yes|no> <skip|convert>' (int8: '<ms> <yes|no>'); after the line
                       'block-scaled recipes: ...' table 2 'M K N | hp ms | <recipe> ...', cells
                       '<ms> <SQNR out> <SQNR grad_input> <SQNR grad_weight>' or 'n/a: <why>'
                       (a recipe the machine cannot run: MXFP8's GEMM before sm100), then one
                       line 'n/a <recipe>: <why in full>' per such recipe
  titan-train          metrics.jsonl: one JSON object per logged step (step, loss, elapsed_s,
                       tokens, tflops, mfu_pct, memory_peak_bytes; comm_s and comm_exposed_s on
                       multi-rank runs) and one per validation (validation_metrics/*)
  eager_llama.py       one JSON line (bench_result: tps, tflops, mfu_pct, final_loss, ...)
  memory snapshot      torch.cuda._memory_viz stats: 'segments: N', 'total_reserved: <size>',
                       'total_allocated: <size>' with sizes as '<x.y><Ki|Mi|Gi|..>B'
Needs only the standard library.
"""
import json
import math
import re

UNREADABLE = "unreadable: "
NOT_AVAILABLE = "n/a"


class Findings:
    """What assembly could not read, one row per (step, what, text)."""

    def __init__(self):
        self.rows = []

    def unreadable(self, step, what, text):
        text = " ".join(str(text).split())[:200]
        self.rows.append({"step": step, "what": what, "text": text})
        return UNREADABLE + text


def number(text):
    """A float from a cell token ('12.5', 'inf', 'nan'), or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value


def split_row(line):
    return [p.strip() for p in line.split("|")]


def is_not_available(cell):
    return cell == NOT_AVAILABLE or cell.startswith(NOT_AVAILABLE + ":")


def dims_of(first, count):
    """The leading integer fields of a table row's first part, or None."""
    fields = first.split()
    if len(fields) < count or not all(f.isdigit() for f in fields[-count:]):
        return None
    return fields[:-count], [int(f) for f in fields[-count:]]


# ------------------------------------------------------------------------- titan-bench-matmul
MATMUL_CELL = re.compile(r"^([\d.]+) ms\s+([\d.]+)x$")


def matmul_column_key(header_cell):
    name = header_cell.lower()
    if "tensorwise" in name:
        return "float8_tensorwise"
    if "rowwise" in name:
        return "float8_rowwise"
    if name.startswith("int8"):
        return "int8"
    return re.sub(r"\W+", "_", name).strip("_") or "column"


def parse_bench_matmul(text, step, findings):
    """Rows of titan-bench-matmul: model, linear, M, K, N, hp_ms, hp_tflops, <column>_ms and
    <column>_speedup per variant (or <column> = 'n/a: ...' / 'unreadable: ...')."""
    columns, rows = None, []
    for line in text.splitlines():
        parts = split_row(line)
        if len(parts) < 3:
            continue
        if parts[0].split() == ["model", "linear", "M", "K", "N"]:
            columns = [matmul_column_key(c) for c in parts[2:]]
            continue
        if columns is None:
            continue
        lead = dims_of(parts[0], 3)
        hp = parts[1].split()
        if not lead or len(lead[0]) != 2 or len(hp) != 2 or None in (number(hp[0]), number(hp[1])):
            findings.unreadable(step, "bench_matmul row", line)
            continue
        (model, linear), (M, K, N) = lead
        row = {"model": model, "linear": linear, "M": M, "K": K, "N": N,
               "hp_ms": number(hp[0]), "hp_tflops": number(hp[1])}
        cells = parts[2:]
        if len(cells) != len(columns):
            row["unreadable"] = findings.unreadable(
                step, f"bench_matmul row with {len(cells)} cells, header has {len(columns)}", line)
        for key, cell in zip(columns, cells):
            m = MATMUL_CELL.match(cell)
            if m:
                row[key + "_ms"], row[key + "_speedup"] = float(m.group(1)), float(m.group(2))
            elif is_not_available(cell):
                row[key] = cell
            else:
                row[key] = findings.unreadable(step, f"bench_matmul cell {key} (M={M} K={K} N={N})", cell)
        rows.append(row)
    if text.strip() and columns is None:
        findings.unreadable(step, "bench_matmul: no table header 'model linear M K N | ...'",
                            text.strip().splitlines()[0])
    return rows


# ------------------------------------------------------------------------- titan-bench-linear
NOT_AVAILABLE_LINE = re.compile(r"^n/a (\S+): (.*)$")  # a recipe's full reason, after table 2
FLOAT8_CELL = re.compile(r"^([\d.]+)\s+(yes|no)(?:\s+(skip|convert))?$")


def block_scaled_cell(cell):
    """'<ms> <sqnr> <sqnr> <sqnr>' -> dict, or None."""
    tokens = cell.split()
    values = [number(t) for t in tokens]
    if len(tokens) != 4 or None in values or math.isnan(values[0]):
        return None
    return {"ms": values[0], "sqnr_out_db": values[1], "sqnr_grad_input_db": values[2],
            "sqnr_grad_weight_db": values[3]}


def parse_bench_linear(text, step, findings):
    """titan-bench-linear's two tables: {'float8': rows, 'block_scaled': rows}. A float8 row
    holds <recipe>_ms, <recipe>_speedup (hp ms / ms), <recipe>_faster, <recipe>_auto_filter; a
    block-scaled row <recipe>_ms, <recipe>_speedup and the three SQNRs; a cell the machine could
    not run is kept as <recipe> = 'n/a: <why>', the full reasons in 'not_available'."""
    tables = {"float8": [], "block_scaled": [], "not_available": {}}
    table, recipes = "float8", None
    for line in text.splitlines():
        m = NOT_AVAILABLE_LINE.match(line)
        if m:
            tables["not_available"][m.group(1)] = m.group(2)
            continue
        if line.startswith("block-scaled recipes"):
            table, recipes = "block_scaled", None
            continue
        parts = split_row(line)
        if len(parts) < 3:
            continue
        if parts[0].split() == ["M", "K", "N"]:
            recipes = [p.split()[0] if p.split() else "" for p in parts[2:]]
            continue
        if recipes is None:
            continue
        lead = dims_of(parts[0], 3)
        if not lead or lead[0] or number(parts[1]) is None:
            findings.unreadable(step, f"bench_linear {table} row", line)
            continue
        M, K, N = lead[1]
        row = {"M": M, "K": K, "N": N, "hp_ms": number(parts[1])}
        cells = parts[2:]
        if len(cells) != len(recipes):
            row["unreadable"] = findings.unreadable(
                step, f"bench_linear {table} row with {len(cells)} cells, header has {len(recipes)}", line)
        for recipe, cell in zip(recipes, cells):
            where = f"bench_linear {table} cell {recipe} (M={M} K={K} N={N})"
            if is_not_available(cell):
                row[recipe] = cell
                continue
            if table == "float8":
                m = FLOAT8_CELL.match(cell)
                parsed = m and {"ms": float(m.group(1)), "faster": m.group(2) == "yes",
                                "auto_filter": m.group(3)}
            else:
                parsed = block_scaled_cell(cell)
            if not parsed:
                row[recipe] = findings.unreadable(step, where, cell)
                continue
            ms = parsed.pop("ms")
            row[recipe + "_ms"] = ms
            row[recipe + "_speedup"] = row["hp_ms"] / ms if ms > 0 else None
            for key, value in parsed.items():
                if value is not None:
                    row[f"{recipe}_{key}"] = value
        tables[table].append(row)
    if text.strip() and not tables["float8"] and not tables["block_scaled"]:
        findings.unreadable(step, "bench_linear: no table rows under a header 'M K N | hp ms | ...'",
                            text.strip().splitlines()[0])
    return tables


# ------------------------------------------------------------------------- titan-train metrics
STEP_KEYS = ("step", "loss", "elapsed_s", "tokens", "tflops", "mfu_pct", "memory_peak_bytes")


def parse_metrics(lines, step, findings, warmup_steps):
    """Throughput, memory and losses of one run's metrics.jsonl lines; None when it has no
    training record. Records of validation are kept apart; a line that is not a JSON object or
    lacks a key is a finding (and left out of the averages)."""
    records, validation = [], []
    for number_, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            findings.unreadable(step, f"metrics.jsonl line {number_}: not JSON", line)
            continue
        if not isinstance(r, dict):
            findings.unreadable(step, f"metrics.jsonl line {number_}: not an object", line)
        elif "validation_metrics/loss" in r:
            validation.append(r)
        elif all(isinstance(r.get(k), (int, float)) for k in STEP_KEYS):
            records.append(r)
        else:
            missing = [k for k in STEP_KEYS if not isinstance(r.get(k), (int, float))]
            findings.unreadable(step, f"metrics.jsonl line {number_}: no number for {', '.join(missing)}",
                                line)
    if not records:
        return None
    timed = [r for r in records if r["step"] > warmup_steps] or records
    seconds = sum(r["elapsed_s"] for r in timed)

    def per_step(key):
        values = [r[key] for r in timed if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    return {"steps": len(records), "timed_steps": len(timed),
            "tps": sum(r["tokens"] for r in timed) / seconds if seconds > 0 else None,
            "tflops": sum(r["tflops"] * r["elapsed_s"] for r in timed) / seconds if seconds > 0 else None,
            "mfu_pct": sum(r["mfu_pct"] * r["elapsed_s"] for r in timed) / seconds if seconds > 0 else None,
            "memory_peak_gib": max(r["memory_peak_bytes"] for r in records) / 2**30,
            # Overlap (multi-rank runs): communication in flight and exposed, per step.
            "comm_s_per_step": per_step("comm_s"), "comm_exposed_s_per_step": per_step("comm_exposed_s"),
            "step_s": seconds / len(timed),
            "losses": [r["loss"] for r in records], "final_loss": records[-1]["loss"],
            "validation_losses": [r["validation_metrics/loss"] for r in validation]}


# ------------------------------------------------------------------------- eager_llama.py
def parse_eager(text, step, findings):
    """The last JSON line of an eager / torch.compile run, or None (a finding when the run
    printed something that should have been it)."""
    lines = [l for l in text.splitlines() if l.strip().startswith("{")]
    if not lines:
        if text.strip():
            findings.unreadable(step, "eager result: no JSON line", text.strip().splitlines()[-1])
        return None
    try:
        result = json.loads(lines[-1])
    except ValueError:
        findings.unreadable(step, "eager result: not JSON", lines[-1])
        return None
    if not isinstance(result, dict) or not isinstance(result.get("tps"), (int, float)):
        findings.unreadable(step, "eager result: no number for tps", lines[-1])
        return None
    return result


# ------------------------------------------------------------------------- memory snapshot
SIZE = re.compile(r"^(-?[\d.]+)(|Ki|Mi|Gi|Ti|Pi|Ei|Zi|Yi)B$")
UNITS = {u: 1024**i for i, u in enumerate(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"])}


def size_bytes(text):
    m = SIZE.match(text.strip())
    return None if not m else float(m.group(1)) * UNITS[m.group(2)]


def parse_memory_stats(text, step, findings):
    """segments, total_reserved and total_allocated (bytes, to _memory_viz's 0.1-unit
    rounding) from `python -m torch.cuda._memory_viz stats`; None when the log has none."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key == "segments":
            found["segments"] = int(value) if value.strip().isdigit() else \
                findings.unreadable(step, "memory stats: segments", line)
        elif key in ("total_reserved", "total_allocated"):
            size = size_bytes(value)
            found[key + "_bytes"] = size if size is not None else \
                findings.unreadable(step, f"memory stats: {key}", line)
    if not found:
        if "Summary of segments" in text:
            findings.unreadable(step, "memory stats: no 'segments:' / 'total_reserved:' lines",
                                text.split("Summary of segments", 1)[1][:120])
        return None
    return found
