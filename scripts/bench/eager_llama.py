"""Plain PyTorch (eager, Python) Llama-3 training loop: the baseline titan is measured against.

Same model as titan (RMSNorm, RoPE, GQA causal SDPA, SwiGLU, no bias, untied output), same
optimizer (AdamW, fused kernel), same loss (token-mean cross entropy), same batch shape and
thread count. Prints one JSON line: tokens/s over the timed steps and peak RSS.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FLAVORS = {  # dim, n_layers, n_heads, n_kv_heads, multiple_of
    "debugmodel": (256, 6, 16, 16, 256),
    "100M": (768, 14, 12, 12, 256),
}


def ffn_hidden(dim, multiple_of):
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


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
        dim, n_layers, n_heads, n_kv, multiple_of = FLAVORS[flavor]
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            Block(dim, n_heads, n_kv, ffn_hidden(dim, multiple_of)) for _ in range(n_layers))
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
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a.flavor, a.vocab, a.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq_len + 1))
    start = None
    for step in range(a.steps + a.warmup):
        if step == a.warmup:
            start = time.perf_counter()
        tokens, labels = data[step, :, :-1], data[step, :, 1:]
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    print(json.dumps({
        "tps": a.steps * a.batch * a.seq_len / elapsed,
        "step_s": elapsed / a.steps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": loss.item(),
    }))


if __name__ == "__main__":
    main()
