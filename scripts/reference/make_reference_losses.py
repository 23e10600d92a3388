"""Reference losses of titan's debug model, computed by an independent plain-PyTorch program.

Writes two files that tests/test_reference_loss.cpp reads:
  tests/reference/debugmodel_tokens.bin    the training tokens, in titan's token-shard format
  tests/reference/debugmodel_losses.json   per-step loss, grad norm and LR of this program, with
                                           the titan config that must reproduce them

    .deps/venv/bin/python scripts/reference/make_reference_losses.py           # rewrite both
    .deps/venv/bin/python scripts/reference/make_reference_losses.py --check   # compare, write nothing

Nothing here imports titan: the model (Llama 3: RMSNorm, RoPE, causal SDPA, SwiGLU, untied output),
the initialization (torchtitan's scheme), the data order, AdamW, gradient clipping and the LR
schedule (torchtitan 0.2.x linear_warmup_stable_decay) are written from their definitions with
stock torch.nn / torch.optim. What titan must share by convention, and nothing more:
  * the initial weights follow titan's counter-based init (docs/architecture.md, "Weight
    init"): element i of parameter `fqn` is a function of (training.seed, fqn, i), with
    torchtitan's distributions (normal_ / trunc_normal_ / ones_ and their stds and bounds);
    philox_init.py beside this file implements that generator from its definition in numpy;
  * the data is the token file written here, read as consecutive windows of seq_len + 1 tokens,
    global batch b being windows [b * G, (b + 1) * G) (titan's "tokens" dataset).
Everything runs in float32 on the CPU with one thread, the whole global batch in one forward.
"""
import argparse
import json
import math
import os
import random
import struct
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from philox_init import init_values  # noqa: E402  (the generator, beside this file)

ROOT = Path(__file__).resolve().parents[2]
TOKENS_FILE = "tests/reference/debugmodel_tokens.bin"
LOSSES_FILE = "tests/reference/debugmodel_losses.json"

# The run. Global batch 12 divides over every data-parallel degree the test uses (1, 2, 3, 4).
STEPS, GLOBAL_BATCH, SEQ_LEN, SEED = 20, 12, 32, 7
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 8e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
WARMUP_STEPS, DECAY_RATIO, MIN_LR_FACTOR = 5, None, 0.0  # decay: linear over the steps after warmup

# torchtitan's llama3 "debugmodel" with the byte-level tokenizer (bytes 0..255, BOS 256, EOS 257).
DIM, N_LAYERS, N_HEADS, VOCAB, MULTIPLE_OF, NORM_EPS, ROPE_THETA = 256, 6, 16, 258, 256, 1e-5, 500000.0
BOS, EOS = 256, 257


# ------------------------------------------------------------------------------------- data

def synthetic_documents(n_tokens, seed):
    """Byte-level documents ([BOS] text [EOS]) of made-up sentences from a small word list, until
    n_tokens tokens: structured enough that the loss falls visibly within 20 steps."""
    rng = random.Random(seed)
    subjects = ["the model", "a rank", "the optimizer", "every layer", "the loader", "one process"]
    verbs = ["reads", "writes", "gathers", "scatters", "reduces", "casts", "checks", "learns"]
    objects = ["the weights", "a shard", "the tokens", "its gradients", "the loss", "a scale"]
    tail = ["", " again", " in float32", " bit for bit", " step by step", " on the cpu"]
    tokens = []
    while len(tokens) < n_tokens:
        sentences = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(tail)}."
                     for _ in range(rng.randint(1, 4))]
        text = " ".join(s[0].upper() + s[1:] for s in sentences)
        tokens += [BOS] + list(text.encode("ascii")) + [EOS]
    return tokens[:n_tokens]


def token_shard_bytes(tokens, vocab):
    """titan's token shard: "TITANTOK", u32 version 1, u32 bytes per token (2), u64 count,
    u64 vocab_size, then the ids as little-endian uint16."""
    header = b"TITANTOK" + struct.pack("<IIQQ", 1, 2, len(tokens), vocab)
    return header + struct.pack(f"<{len(tokens)}H", *tokens)


def global_batch(tokens, step):
    """Global batch `step` (0-based): windows [step * G, (step + 1) * G) of seq_len + 1 tokens."""
    window = SEQ_LEN + 1
    rows = [tokens[(step * GLOBAL_BATCH + i) * window:(step * GLOBAL_BATCH + i + 1) * window]
            for i in range(GLOBAL_BATCH)]
    t = torch.tensor(rows, dtype=torch.long)  # [G, S + 1]
    return t[:, :-1], t[:, 1:]


# ------------------------------------------------------------------------------------ model

def llama31_scaled(freqs, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=8192):
    """Llama 3.1's RoPE scaling (torchtitan applies it to its Llama 3 flavors since v0.2.0):
    wavelengths above original/low_freq_factor are slowed by `factor`, those below
    original/high_freq_factor kept, the band between interpolated."""
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < original / high_freq_factor:
            out.append(f)
        elif wavelen > original / low_freq_factor:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


def rope_tables(head_dim, seq_len):
    # Angles in float64, stored as float32 (as torchtitan's precompute_freqs_cis).
    freqs = llama31_scaled(1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x [B, S, H, hd]: rotates each (even, odd) pair by its position's angle, i.e. multiplies
    the complex number even + i * odd by cos + i * sin."""
    z = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())  # [B, S, H, hd/2]
    rot = torch.complex(cos, sin)[None, :, None, :]
    return torch.view_as_real(z * rot).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DIM // N_HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = apply_rope(self.wq(x).view(b, s, N_HEADS, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, s, N_HEADS, self.head_dim), cos, sin).transpose(1, 2)
        v = self.wv(x).view(b, s, N_HEADS, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, S, hd]
        return self.wo(out.transpose(1, 2).reshape(b, s, DIM))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = int(2 * (4 * DIM) / 3)
        hidden = MULTIPLE_OF * ((hidden + MULTIPLE_OF - 1) // MULTIPLE_OF)
        self.w1 = nn.Linear(DIM, hidden, bias=False)
        self.w2 = nn.Linear(hidden, DIM, bias=False)
        self.w3 = nn.Linear(DIM, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.feed_forward = FeedForward()
        self.attention_norm = nn.RMSNorm(DIM, eps=NORM_EPS)
        self.ffn_norm = nn.RMSNorm(DIM, eps=NORM_EPS)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(N_LAYERS))
        self.norm = nn.RMSNorm(DIM, eps=NORM_EPS)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        cos, sin = rope_tables(DIM // N_HEADS, SEQ_LEN)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.cos, self.sin)
        return self.output(self.norm(h))  # [B, S, vocab]


def init_weights(model, seed):
    """torchtitan's distributions, each element drawn by the counter-based generator from
    (seed, parameter name, flat index): independent of parameter order and of any layout."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name == "tok_embeddings.weight":  # normal_(std=1)
                values = init_values(seed, name, shape, 1.0)
            elif name == "output.weight":  # trunc_normal_(std, a=-3 std, b=3 std)
                std = DIM ** -0.5
                values = init_values(seed, name, shape, std, -3 * std, 3 * std)
            elif name.endswith("norm.weight"):
                nn.init.ones_(p)
                continue
            else:  # layers.<i>.<module>.<linear>.weight: trunc_normal_(std, a=-2, b=2); depth-scaled std for wo, w2, w3
                layer_id = int(name.split(".")[1])
                depth_std = 0.02 / math.sqrt(2 * (layer_id + 1))
                scaled = name.endswith(("wo.weight", "w2.weight", "w3.weight"))
                values = init_values(seed, name, shape, depth_std if scaled else 0.02, -2.0, 2.0)
            p.copy_(torch.from_numpy(values))


def linear_warmup_stable_decay(s):
    """torchtitan 0.2.x, LambdaLR's 0-based step s: warmup (s + 1) / warmup_steps, then 1, then a
    linear decay to min_lr_factor, with one virtual extra stable step so the last LR is not 0."""
    warmup = min(WARMUP_STEPS, STEPS)
    decay = STEPS - warmup if DECAY_RATIO is None else min(round(STEPS * DECAY_RATIO), STEPS - warmup)
    stable = STEPS + 1 - warmup - decay
    if s < warmup:
        return (s + 1) / warmup
    if s < warmup + stable:
        return 1.0
    progress = (s + 1 - warmup - stable) / decay
    return MIN_LR_FACTOR + (1 - MIN_LR_FACTOR) * (1 - progress)


# -------------------------------------------------------------------------------- training

def train(tokens):
    torch.set_num_threads(1)
    model = Llama()
    init_weights(model, SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                            fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_stable_decay)
    steps = []
    for step in range(STEPS):
        inputs, labels = global_batch(tokens, step)
        lr = opt.param_groups[0]["lr"]
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())  # token mean
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM, foreach=True)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        steps.append({"step": step + 1, "loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr})
        print(f"step {step + 1:2d}  loss {loss.item():.7f}  grad_norm {grad_norm.item():.7f}  lr {lr:.3e}",
              file=sys.stderr)
    return steps


def titan_args():
    """The titan-train overrides of this run (paths relative to the repository root); the test
    adds the layout, local_batch_size, num_threads and dump folder."""
    return ["--model.flavor", "debugmodel", "--model.tokenizer_path", "",
            "--training.dataset", "tokens", "--training.dataset_path", TOKENS_FILE,
            "--training.seq_len", str(SEQ_LEN), "--training.global_batch_size", str(GLOBAL_BATCH),
            "--training.steps", str(STEPS), "--training.seed", str(SEED),
            "--training.max_norm", str(MAX_NORM), "--training.mixed_precision_param", "float32",
            "--optimizer.name", "AdamW", "--optimizer.lr", str(LR), "--optimizer.beta1", str(BETAS[0]),
            "--optimizer.beta2", str(BETAS[1]), "--optimizer.eps", str(EPS),
            "--optimizer.weight_decay", str(WEIGHT_DECAY),
            "--lr_scheduler.warmup_steps", str(WARMUP_STEPS), "--lr_scheduler.decay_ratio", "-1",
            "--lr_scheduler.decay_type", "linear", "--lr_scheduler.min_lr_factor", str(MIN_LR_FACTOR),
            "--metrics.log_freq", "1"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="recompute and compare with the files in the repository; write nothing")
    a = parser.parse_args()

    tokens = synthetic_documents(STEPS * GLOBAL_BATCH * (SEQ_LEN + 1), seed=SEED)
    shard = token_shard_bytes(tokens, VOCAB)
    steps = train(tokens)
    reference = {
        "what": "debug model, first 20 steps in float32, computed by an independent plain-PyTorch "
                "Llama 3 (model, init, data order, AdamW, clipping, LR schedule written from their "
                "definitions); titan must reproduce the losses (tests/test_reference_loss.cpp)",
        "script": "scripts/reference/make_reference_losses.py",
        "command": ".deps/venv/bin/python scripts/reference/make_reference_losses.py",
        "torch_version": torch.__version__,
        "tokens_file": TOKENS_FILE,
        "titan_args": titan_args(),
        "steps": steps,
    }
    # One line per key and per step, so a regenerated file diffs readably.
    body = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in reference.items() if k != "steps"]
    rows = ",\n".join(f"  {json.dumps(s)}" for s in steps)
    text = "{\n" + ",\n".join(body) + ',\n "steps": [\n' + rows + "\n ]\n}\n"
    if a.check:
        old = json.loads((ROOT / LOSSES_FILE).read_text())
        same_data = (ROOT / TOKENS_FILE).read_bytes() == shard
        worst = max(abs(n["loss"] - o["loss"]) / o["loss"] for n, o in zip(steps, old["steps"]))
        print(f"tokens file identical: {same_data}; max relative loss difference to the stored "
              f"reference: {worst:.3g}")
        # Another CPU's kernels sum in another order: ~1e-7 here; tests/test_reference_loss.cpp
        # allows 2e-6 between titan and this reference for the same reason.
        sys.exit(0 if same_data and worst <= 2e-6 else 1)
    for rel, data in ((TOKENS_FILE, shard), (LOSSES_FILE, text.encode())):
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        print(f"wrote {rel}", file=sys.stderr)


if __name__ == "__main__":
    main()
