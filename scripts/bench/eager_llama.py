"""Plain PyTorch (eager, Python) Llama-3 training loop: the baseline titan is measured against.

Same model as titan (RMSNorm, RoPE, GQA causal SDPA, SwiGLU, no bias, untied output), same
optimizer (AdamW, fused kernel), same loss (token-mean cross entropy), same batch shape and
thread count. Prints one JSON line: tokens/s over the timed steps, MFU, peak memory.

CPU (scripts/bench_train.sh): float32, eager. GPU (scripts/gpu_check.sh):
  --device cuda --dtype bfloat16   float32 master weights, matrix products in bfloat16 under
                                   autocast (titan: training.mixed_precision_param bfloat16)
  --ac op                          torchtitan's per-op selective activation checkpointing
  --compile                        torch.compile of every block (torchtitan's training.compile)
  --flavor 8B_4layers --vocab 128256   8B's layer shapes, 4 layers (titan's flavor of that name)
"""
import time

PROCESS_START = time.perf_counter()  # before importing torch: "time to first step" counts that too

import argparse
import collections
import json
import math
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

FLAVORS = {  # dim, n_layers, n_heads, n_kv_heads, multiple_of, ffn_dim_multiplier (model/args.cpp)
    "debugmodel": (256, 6, 16, 16, 256, None),
    "100M": (768, 14, 12, 12, 256, None),
    "8B_4layers": (4096, 4, 32, 8, 1024, 1.3),
}

# Dense bf16 peak FLOP/s by device name, as titan's trainer/observe/metrics.cpp (first match wins).
GPU_PEAK_FLOPS = [("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12),
                  ("A100", 312e12)]


def ffn_hidden(dim, multiple_of, ffn_dim_multiplier=None):
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def flops_per_token(model, n_layers, n_heads, head_dim, seq_len):
    """torchtitan's (and titan's) formula: 6 x non-embedding params + attention's 12 L H Q T."""
    params = sum(p.numel() for p in model.parameters()) - model.tok_embeddings.weight.numel()
    return 6 * params + 12 * n_layers * n_heads * head_dim * seq_len


def bench_result(a, model, elapsed, first_step_s, peak_rss_bytes, final_loss):
    """The JSON fields every Python engine prints (scripts/bench_train.sh reads them)."""
    dim, n_layers, n_heads = FLAVORS[a.flavor][:3]
    tps = a.steps * a.batch * a.seq_len / elapsed
    fpt = flops_per_token(model, n_layers, n_heads, dim // n_heads, a.seq_len)
    peak = a.peak_flops
    if peak <= 0 and a.device == "cuda":
        name = torch.cuda.get_device_name()
        peak = next((f for key, f in GPU_PEAK_FLOPS if key in name), 0)
    return {
        "tps": tps,
        "step_s": elapsed / a.steps,
        "first_step_s": first_step_s,
        "tflops": fpt * tps / 1e12,
        "mfu_pct": 100 * fpt * tps / peak if peak > 0 else None,
        "peak_rss_bytes": peak_rss_bytes,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": final_loss,
        "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "config": {k: v for k, v in vars(a).items()},
    }


# torchtitan's per-op selective AC: keep these ops' outputs, except every second matrix product.
def _sac_save_list():
    ops = [torch.ops.aten.mm.default, torch.ops.aten.max.default]
    for name in ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_cudnn_attention"):
        if hasattr(torch.ops.aten, name):
            ops.append(getattr(torch.ops.aten, name).default)
    return set(ops)


def per_op_sac_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save, counts = _sac_save_list(), collections.defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Checkpointed(nn.Module):
    """A block recomputed in backward: mode "op" (per-op selective) or "full"."""

    def __init__(self, block, mode):
        super().__init__()
        self.block, self.mode = block, mode

    def forward(self, x, cos, sin):
        from torch.utils.checkpoint import checkpoint, noop_context_fn
        ctx = per_op_sac_context if self.mode == "op" else noop_context_fn
        return checkpoint(self.block, x, cos, sin, use_reentrant=False, context_fn=ctx,
                          preserve_rng_state=False)


def rope_tables(head_dim, seq_len, theta=500000.0):
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):  # x [B, S, H, hd]
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), -1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv, hidden):
        super().__init__()
        hd = dim // n_heads
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, hd
        self.wq = nn.Linear(dim, n_heads * hd, bias=False)
        self.wk = nn.Linear(dim, n_kv * hd, bias=False)
        self.wv = nn.Linear(dim, n_kv * hd, bias=False)
        self.wo = nn.Linear(n_heads * hd, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(b, s, -1, self.hd), cos, sin).transpose(1, 2)
        k = apply_rope(self.wk(h).view(b, s, -1, self.hd), cos, sin).transpose(1, 2)
        v = self.wv(h).view(b, s, -1, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, flavor, vocab, seq_len):
        super().__init__()
        dim, n_layers, n_heads, n_kv, multiple_of, ffn_mult = FLAVORS[flavor]
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            Block(dim, n_heads, n_kv, ffn_hidden(dim, multiple_of, ffn_mult)) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(dim // n_heads, seq_len)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flavor", default="debugmodel", choices=sorted(FLAVORS))
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
    p.add_argument("--compile", action="store_true", help="torch.compile every block")
    p.add_argument("--peak-flops", type=float, default=0,
                   help="for MFU; 0 = the GPU's known bf16 peak (no MFU on the CPU)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch.cuda.is_available() is False")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device(a.device)
    with device:  # parameters are created (and initialized) where they train
        model = Llama(a.flavor, a.vocab, a.seq_len)
    for i, block in enumerate(model.layers):
        if a.ac != "none":
            block = Checkpointed(block, a.ac)
        if a.compile:
            block = torch.compile(block)
        model.layers[i] = block
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq_len + 1), device=device)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    start = None
    first_step_s = None
    for step in range(a.steps + a.warmup):
        if step == a.warmup:
            sync()
            if a.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
        tokens, labels = data[step, :, :-1], data[step, :, 1:]
        with autocast:
            logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            sync()
            first_step_s = time.perf_counter() - PROCESS_START  # includes torch.compile's warm-up
    sync()
    elapsed = time.perf_counter() - start
    result = bench_result(a, model, elapsed, first_step_s,
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, loss.item())
    if a.device == "cuda":
        result["memory_peak_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
