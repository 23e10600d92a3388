"""torchtitan's own Llama 3 model (torchtitan 0.2.2's `Transformer`) in a single-process training
loop: the peer titan is measured against in scripts/bench_train.sh (engines torchtitan and
torchtitan_compile).

Same CLI and JSON line as scripts/bench/eager_llama.py (same flavors and shapes, which are titan's:
model/args.cpp), but the model is torchtitan's `torchtitan/models/llama3/model/model.py`, built as
torchtitan's trainer builds it (on the meta device, `to_empty`, `init_weights`), and the step is
torchtitan's `forward_backward_step` without parallelism:
  - zero_grad(set_to_none) first; forward and loss under `torch.autocast(device, bfloat16)` when
    --dtype bfloat16 (torchtitan's maybe_enable_amp without FSDP: float32 master weights);
  - loss: torchtitan's cross_entropy_loss (float32 logits, reduction="sum") divided by the
    number of label tokens; `del pred` before backward, as torchtitan does;
  - clip_grad_norm_(max_norm=1.0, foreach=True); AdamW(lr 8e-4, betas (0.9, 0.95), eps 1e-8,
    weight_decay 0.1) with torchtitan's default implementation "fused" (torch.optim.AdamW
    fused=True, which has a CPU kernel in torch 2.11);
  - --compile: torchtitan's apply_compile: torch.compile(block, backend="inductor",
    fullgraph=True) of every TransformerBlock, registered back into model.layers.
Not included: torchtitan's LR scheduler (one scalar per step) and its data loader (random tokens
here, as eager_llama.py).

After the timed steps, one extra step runs under torch.profiler (not timed, after the peak RSS is
read) and its Chrome trace gives the GEMM share; see `trace_gemm_share`, which bench_train.sh
also applies to titan's own trace (`--gemm-share-of-trace FILE`).

Import of torchtitan: only the model files. torchtitan 0.2.2's package __init__ files and
torchtitan.config / torchtitan.components.* / torchtitan.protocols.train_spec pull in its
training stack (tyro, tokenizers, torchdata, datasets, ...), which are not installed (the wheel is
installed with --no-deps into .deps/torchtitan). So `load_torchtitan_llama3` registers empty
package modules whose __path__ points into the installed sources (their __init__.py files are not
run), minimal stubs for the three modules the model files need only for type annotations or a
base class (torchtitan.config.JobConfig, torchtitan.components.tokenizer.BaseTokenizer,
torchtitan.protocols.train_spec.ModelProtocol, the latter re-exporting the real class from
torchtitan/protocols/model.py), and imports the real files: tools/logging.py, models/attention.py,
protocols/model.py, protocols/state_dict_adapter.py, models/utils.py and
models/llama3/model/{args,model}.py.
"""
import time

PROCESS_START = time.perf_counter()  # before importing torch: "time to first step" counts that too

import argparse
import glob
import importlib
import json
import os
import resource
import sys
import tempfile
import types

# GEMM share: self time of these ops (the matmul family as ATen names them in a profiler trace;
# aten::linear and aten::matmul are composites whose own time is dispatch only, their kernels
# run in aten::mm / aten::addmm / aten::bmm). Not counted: the matrix products inside the fused
# attention kernels (aten::_scaled_dot_product_flash_attention_for_cpu and its backward), and any
# GEMM a compiled region (torch.compile) runs as generated code rather than as an ATen op.
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")


def trace_gemm_share(path):
    """Self time (duration minus the durations of the directly nested events on the same thread)
    of every complete CPU event ("ph": "X", "cat" "cpu_op" or "user_annotation") in a Chrome
    trace written by torch.profiler / Kineto; returns the GEMM ops' share of their sum. The step's
    ProfilerStep#N range is a user_annotation, so the time between ops (interpreter, framework)
    is counted in the total as that range's self time."""
    with open(path) as f:
        trace = json.load(f)
    by_thread = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    self_us = {}
    for events in by_thread.values():
        events.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack = []  # [end, event name, children's time]
        def close(entry):
            name, own = entry[1], entry[3] - entry[2]
            self_us[name] = self_us.get(name, 0.0) + max(own, 0.0)
        for e in events:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            while stack and stack[-1][0] <= ts:
                close(stack.pop())
            if stack:
                stack[-1][2] += dur
            stack.append([ts + dur, e["name"], 0.0, dur])
        while stack:
            close(stack.pop())
    total = sum(self_us.values())
    gemm = sum(v for k, v in self_us.items() if k in GEMM_OPS)
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:8]
    steps = [e for evs in by_thread.values() for e in evs if e["name"].startswith("ProfilerStep#")]
    return {
        "gemm_share": gemm / total if total > 0 else None,
        "gemm_self_s": gemm / 1e6,
        "self_total_s": total / 1e6,
        "profiled_step_s": sum(float(e["dur"]) for e in steps) / 1e6 if steps else None,
        "gemm_ops": list(GEMM_OPS),
        "top_self_ops": [[k, round(v / total, 4)] for k, v in top] if total > 0 else [],
    }


def torchtitan_dir():
    return os.environ.get("TORCHTITAN_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", ".deps", "torchtitan")


def import_torchtitan_models(root, packages):
    """Prepare imports of torchtitan's model files from `root` (a pip --target folder) without its
    training stack (see the module docstring): package shells for torchtitan, torchtitan.models,
    torchtitan.protocols / components / tools and each of `packages` (dotted names under
    torchtitan.models, e.g. "llama3.model"), and the stubs the model files need. Returns the
    installed version."""
    src = os.path.join(root, "torchtitan")
    if not os.path.isfile(os.path.join(src, "models", "llama3", "model", "model.py")):
        raise SystemExit(f"torchtitan is not installed in {root} (scripts/bench_train.sh installs it)")
    dist = glob.glob(os.path.join(root, "torchtitan-*.dist-info"))
    version = os.path.basename(dist[0])[len("torchtitan-"):-len(".dist-info")] if dist else "unknown"

    # Package shells: submodules resolve into the installed sources, no __init__.py runs.
    shells = [("torchtitan", ""), ("torchtitan.models", "models"), ("torchtitan.protocols", "protocols"),
              ("torchtitan.components", "components"), ("torchtitan.tools", "tools")]
    for dotted in packages:
        parts = dotted.split(".")
        for i in range(1, len(parts) + 1):
            shells.append(("torchtitan.models." + ".".join(parts[:i]), "models/" + "/".join(parts[:i])))
    for name, sub in shells:
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(src, sub)]
        sys.modules[name] = pkg

    def stub(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    # Stubs: used by the model files only as annotations (JobConfig, BaseTokenizer); the real
    # modules import tyro (torchtitan/config/manager.py) and tokenizers.
    stub("torchtitan.config", JobConfig=type("JobConfig", (), {}))
    stub("torchtitan.components.tokenizer", BaseTokenizer=type("BaseTokenizer", (), {}))
    protocols_model = importlib.import_module("torchtitan.protocols.model")
    # The real train_spec imports the data loader, metrics, optimizer and validator components.
    stub("torchtitan.protocols.train_spec", ModelProtocol=protocols_model.ModelProtocol,
         BaseModelArgs=protocols_model.BaseModelArgs)
    return version


def load_torchtitan_llama3(root):
    """torchtitan's llama3 model files from `root`. Returns (model module, args module, version)."""
    from torch import nn
    version = import_torchtitan_models(root, ["llama3.model"])
    args = importlib.import_module("torchtitan.models.llama3.model.args")
    model = importlib.import_module("torchtitan.models.llama3.model.model")
    assert issubclass(model.Transformer, nn.Module)
    return model, args, version


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="debugmodel")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=258)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the matrix products (bfloat16: autocast over float32 weights)")
    p.add_argument("--ac", default="none", choices=["none", "op", "full"])
    p.add_argument("--compile", action="store_true",
                   help="torch.compile every TransformerBlock (torchtitan's apply_compile)")
    p.add_argument("--peak-flops", type=float, default=0,
                   help="for MFU; 0 = the GPU's known bf16 peak (no MFU on the CPU)")
    p.add_argument("--no-profile", action="store_true", help="skip the extra profiled step")
    p.add_argument("--gemm-share-of-trace", metavar="TRACE_JSON",
                   help="only print trace_gemm_share of this Chrome trace (titan's) and exit")
    a = p.parse_args()
    if a.gemm_share_of_trace:
        print(json.dumps(trace_gemm_share(a.gemm_share_of_trace)))
        return

    import torch
    from torch import nn
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # The same flavor table (titan's shapes) and FLOP and GPU-peak formulas as the eager baseline.
    from eager_llama import FLAVORS, bench_result, per_op_sac_context
    if a.flavor not in FLAVORS:
        p.error(f"--flavor: choose from {sorted(FLAVORS)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    tt_model, tt_args, tt_version = load_torchtitan_llama3(torchtitan_dir())

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    dim, n_layers, n_heads, n_kv, multiple_of, ffn_mult = FLAVORS[a.flavor]
    # titan's 100M flavor has no RoPE scaling (model/args.cpp); in torchtitan's formula a
    # scaling_factor of 1 leaves every frequency as it is. The other flavors use torchtitan's
    # default scaling, as titan does.
    rope_scaling = tt_args.RoPEScalingArgs(scaling_factor=1.0) if a.flavor == "100M" else tt_args.RoPEScalingArgs()
    margs = tt_args.TransformerModelArgs(
        dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=None if n_kv == n_heads else n_kv,
        vocab_size=a.vocab, multiple_of=multiple_of, ffn_dim_multiplier=ffn_mult,
        rope_theta=500000, rope_scaling_args=rope_scaling, max_seq_len=a.seq_len)
    # As torchtitan's trainer: build on the meta device, allocate, then init_weights.
    with torch.device("meta"):
        model = tt_model.Transformer(margs)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    model.train()

    if a.ac != "none":  # torch.utils.checkpoint around each block (eager_llama.py's policies)
        from torch.utils.checkpoint import checkpoint, noop_context_fn

        class Checkpointed(nn.Module):
            def __init__(self, block):
                super().__init__()
                self.block = block

            def forward(self, *args, **kwargs):
                ctx = per_op_sac_context if a.ac == "op" else noop_context_fn
                return checkpoint(self.block, *args, use_reentrant=False, context_fn=ctx,
                                  preserve_rng_state=False, **kwargs)

        for layer_id, block in list(model.layers.named_children()):
            model.layers.register_module(layer_id, Checkpointed(block))
    if a.compile:  # torchtitan's apply_compile
        for layer_id, block in list(model.layers.named_children()):
            model.layers.register_module(layer_id, torch.compile(block, backend="inductor", fullgraph=True))

    params = [q for q in model.parameters()]
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True)
    total_steps = a.steps + a.warmup + (0 if a.no_profile else 1)
    data = torch.randint(0, a.vocab, (total_steps, a.batch, a.seq_len + 1), device=device)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def train_step(step):
        opt.zero_grad(set_to_none=True)
        tokens, labels = data[step, :, :-1], data[step, :, 1:]
        with autocast:
            pred = model(tokens)
            # torchtitan/components/loss.py cross_entropy_loss, then / global valid tokens
            loss_sum = torch.nn.functional.cross_entropy(
                pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)
            loss = loss_sum / labels.numel()
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return loss

    start = None
    first_step_s = None
    for step in range(a.steps + a.warmup):
        if step == a.warmup:
            sync()
            if a.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
        loss = train_step(step)
        if step == 0:
            sync()
            first_step_s = time.perf_counter() - PROCESS_START  # includes torch.compile's warm-up
    sync()
    elapsed = time.perf_counter() - start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before profiling
    final_loss = loss.item()

    profile = None
    if not a.no_profile:
        from torch.profiler import ProfilerActivity, profile as torch_profile, record_function
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
        step = a.steps + a.warmup
        with torch_profile(activities=acts) as prof:
            with record_function(f"ProfilerStep#{step + 1}"):
                train_step(step)
                sync()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            profile = trace_gemm_share(path)

    result = bench_result(a, model, elapsed, first_step_s, peak_rss, final_loss)
    result.update({"torchtitan": tt_version, "optimizer": "AdamW(fused=True)"})
    if profile is not None:
        result.update(profile)
    if a.device == "cuda":
        result["memory_peak_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
