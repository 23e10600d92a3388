"""What the torchtitan MoE peers share (torchtitan_qwen3_moe.py, torchtitan_deepseek_v3.py): their
command line, torchtitan 0.2.2's MoE modules loaded from a release, its load-balancing optimizer
pre-hook, and the timed single-process training loop whose JSON line scripts/bench_moe.sh reads.

The step is torchtitan's without parallelism: zero_grad, forward, the summed cross entropy /
tokens, backward, clip_grad_norm_(1.0, foreach), the MoE load-balancing pre-hook
(`_update_expert_bias`: counts, sign, zero-mean delta), then AdamW(fused=True) with torchtitan's
defaults. With --experts grouped the CPU's grouped GEMM backward fails in torch 2.11: the JSON
line then holds "error" with the exception, which bench_moe.sh prints as n/a.
"""
import argparse
import importlib
import json
import resource
import sys
import time

from torchtitan_llama import import_torchtitan_models, torchtitan_dir


def parse_args(flavors, default_flavor):
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default=default_flavor, choices=sorted(flavors))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=258)
    p.add_argument("--experts", default="loop", choices=["loop", "grouped"])
    return p.parse_args()


def load_torchtitan_family(family):
    """torchtitan.models.<family>.model's args and model modules with its MoE, from the installed
    release (scripts/bench/install_torchtitan.sh): (model, args, moe, version)."""
    import torch
    # The router's torch.histc of int64 expert indices has a float-only CPU kernel (the CUDA one
    # takes integers): counted in float32 (exact below 2^24) and returned as int64, as on CUDA.
    histc = torch.histc
    torch.histc = lambda t, *a, **k: histc(t, *a, **k) if t.is_floating_point() else histc(t.float(), *a, **k).long()
    version = import_torchtitan_models(torchtitan_dir(), [f"{family}.model", "moe"])
    moe = importlib.import_module("torchtitan.models.moe.moe")
    package = sys.modules["torchtitan.models.moe"]  # its __init__ re-exports these
    package.MoE, package.MoEArgs, package.FeedForward, package.build_moe = moe.MoE, moe.MoEArgs, moe.FeedForward, moe.build_moe
    args = importlib.import_module(f"torchtitan.models.{family}.model.args")
    model = importlib.import_module(f"torchtitan.models.{family}.model.model")
    return model, args, moe, version


def update_expert_bias(model):
    """torchtitan 0.2.2's _update_expert_bias (components/optimizer.py), one process, no AC."""
    import torch
    with torch.no_grad():
        for block in model.layers.values():
            if not block.moe_enabled or block.moe.load_balance_coeff is None:
                continue
            counts = block.moe.tokens_per_expert.float()
            delta = block.moe.load_balance_coeff * torch.sign(counts.mean() - counts)
            block.moe.expert_bias.add_(delta - delta.mean())
            block.moe.tokens_per_expert.zero_()


def train_and_report(build_model, a, version, process_start):
    """Builds the model as torchtitan's trainer does (build_model() on the meta device, to_empty,
    init_weights), trains a.warmup + a.steps steps and prints the JSON line."""
    import torch
    with torch.device("meta"):
        model = build_model()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq_len + 1))

    def train_step(step):
        opt.zero_grad(set_to_none=True)
        tokens, labels = data[step, :, :-1], data[step, :, 1:]
        pred = model(tokens)
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1),
                                                 reduction="sum") / labels.numel()
        del pred
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        update_expert_bias(model)  # the optimizer's step pre-hook
        opt.step()
        return loss

    result = {"torchtitan": version, "experts": a.experts, "config": vars(a), "torch": torch.__version__}
    try:
        start = first_step_s = None
        for step in range(a.steps + a.warmup):
            if step == a.warmup:
                start = time.perf_counter()
            loss = train_step(step)
            if step == 0:
                first_step_s = time.perf_counter() - process_start
        elapsed = time.perf_counter() - start
    except Exception as e:  # the grouped GEMM on the CPU: report, do not crash the table
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(json.dumps(result))
        return
    result.update({
        "tps": a.steps * a.batch * a.seq_len / elapsed,
        "step_s": elapsed / a.steps,
        "first_step_s": first_step_s,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "params": sum(q.numel() for q in params),
        "final_loss": loss.item(),
    })
    print(json.dumps(result))
