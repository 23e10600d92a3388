"""torchtitan's own Qwen3-MoE model (torchtitan 0.2.2's `Qwen3Model` with its `MoE` layers) in a
single-process training loop: the peer titan is measured against in scripts/bench_moe.sh.

Same JSON line as scripts/bench/torchtitan_llama.py (tps, step_s, first_step_s, peak_rss_bytes,
...). The model is built as torchtitan's trainer builds it (meta device, `to_empty`,
`init_weights`) with the shapes of titan's flavor of the same name (model/qwen3/family.cpp:
torchtitan's `debugmodel_moe`, and titan's `moe_100M_active`), the vocabulary of titan's byte
tokenizer (258), and the step is torchtitan's without parallelism: zero_grad, forward, the summed
cross entropy / tokens, backward, clip_grad_norm_(1.0, foreach), torchtitan's MoE load-balancing
optimizer pre-hook (`_update_expert_bias`, written out below: counts, sign, zero-mean delta), then
AdamW(fused=True) with torchtitan's defaults.

--experts loop (default) runs torchtitan's for-loop experts (MoEArgs.use_grouped_mm = False), the
form titan's CPU path also takes; --experts grouped runs torch._grouped_mm (torchtitan's default
on GPUs). On the CPU in torch 2.11 the grouped form's backward fails; the JSON line then holds
"error" with the exception, which bench_moe.sh prints as n/a.
"""
import time

PROCESS_START = time.perf_counter()

import argparse
import importlib
import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torchtitan_llama import import_torchtitan_models, torchtitan_dir  # noqa: E402

# titan's flavors (model/qwen3/family.cpp): dim, n_layers, n_heads, n_kv_heads, head_dim,
# hidden_dim (dense, unused by MoE blocks), num_experts, top_k, moe_inter_dim.
FLAVORS = {
    "debugmodel_moe": (256, 8, 16, 8, 128, 3072, 64, 8, 768),
    "moe_100M_active": (512, 14, 4, 2, 128, 1536, 8, 2, 2048),
}


def load_torchtitan_qwen3(root):
    version = import_torchtitan_models(root, ["qwen3.model", "moe"])
    moe = importlib.import_module("torchtitan.models.moe.moe")
    package = sys.modules["torchtitan.models.moe"]  # its __init__ re-exports these
    package.MoE, package.MoEArgs, package.FeedForward = moe.MoE, moe.MoEArgs, moe.FeedForward
    args = importlib.import_module("torchtitan.models.qwen3.model.args")
    model = importlib.import_module("torchtitan.models.qwen3.model.model")
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="debugmodel_moe", choices=sorted(FLAVORS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=258)
    p.add_argument("--experts", default="loop", choices=["loop", "grouped"])
    a = p.parse_args()

    import torch
    # The router's torch.histc of int64 expert indices has a float-only CPU kernel (the CUDA one
    # takes integers): counted in float32 (exact below 2^24) and returned as int64, as on CUDA.
    histc = torch.histc
    torch.histc = lambda t, *a, **k: histc(t, *a, **k) if t.is_floating_point() else histc(t.float(), *a, **k).long()
    tt_model, tt_args, tt_moe, version = load_torchtitan_qwen3(torchtitan_dir())
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dim, n_layers, n_heads, n_kv, head_dim, hidden, experts, top_k, moe_inter = FLAVORS[a.flavor]
    margs = tt_args.Qwen3ModelArgs(
        vocab_size=a.vocab, max_seq_len=a.seq_len, head_dim=head_dim, dim=dim, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, qk_norm=True, hidden_dim=hidden, rope_theta=1000000, moe_enabled=True,
        moe_inter_dim=moe_inter,
        moe_args=tt_moe.MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k, score_func="softmax",
                                route_norm=True, route_scale=1.0, score_before_experts=False,
                                use_grouped_mm=a.experts == "grouped"))
    with torch.device("meta"):
        model = tt_model.Qwen3Model(margs)
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
                first_step_s = time.perf_counter() - PROCESS_START
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


if __name__ == "__main__":
    main()
