#!/usr/bin/env python3
"""Checks a titan Hugging Face export against Hugging Face's model: same logits as titan.

    hf_llama_check.py HF_FOLDER TITAN_LOGITS.safetensors     # compare (exit 0 = match)
    hf_llama_check.py --install-transformers                 # pinned transformers into .deps/hf-python
    hf_llama_check.py --mean-ce HF_FOLDER BATCHES.safetensors  # prints {"mean_ce": ..., "tokens": ...}

config.json's model_type selects the model: "llama" (LlamaForCausalLM), "qwen3"
(Qwen3ForCausalLM) or "qwen3_moe" (Qwen3MoeForCausalLM).

--mean-ce: BATCHES holds "inputs" and "labels" [N, S] int64; the mean over all N x S tokens of
the cross entropy of the HF-layout model's logits (this file's re-implementation, float32 logits,
the sum in float64): the validation loss titan must report for the same tokens.

TITAN_LOGITS holds "tokens" [B, S] int64 and "logits" [B, S, V] float32 that titan computed
from the exported weights. The HF side is `transformers.AutoModelForCausalLM.from_pretrained`
when transformers can be imported (from .deps/hf-python, git-ignored, or the environment);
otherwise a re-implementation of HF's modeling code in plain PyTorch (rotate_half RoPE, RMSNorm
in float32, GQA, SwiGLU; Qwen3's RMSNorm on each head of q and k before RoPE and tied lm_head;
Qwen3-MoE's softmax top-k router, renormalized by norm_topk_prob, weighing SwiGLU experts),
reading the folder with this file's own safetensors reader, so the check needs only torch.
Tolerance: both sides compute float32 with different op orders (and titan's Llama rotates
interleaved pairs where HF rotates halves of a permuted head), so logits agree to float32
reduction error, ~1e-6 of their scale; 1e-4 absolute on O(1) logits is far below what a wrong
permutation, name or expert (errors of O(1)) gives.
"""
import json
import math
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_PYTHON = os.path.join(ROOT, ".deps", "hf-python")
TRANSFORMERS = "transformers==4.57.1"

import torch  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=DTYPES[e["dtype"]]) if b > a else torch.empty(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def read_hf_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weights = {}
    for f in files:
        weights.update(read_safetensors(os.path.join(folder, f)))
    return weights


def rms_norm(x, w, eps):  # HF LlamaRMSNorm
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama3_inv_freq(inv_freq, rs):
    """HF's _compute_llama3_parameters (rope_type "llama3", Llama 3.1's frequency scaling)."""
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def swiglu(x, w, p):  # HF's LlamaMLP / Qwen3MLP: down(silu(gate(x)) * up(x))
    gate, up = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "down_proj.weight"].T


def sparse_moe(x, w, p, cfg):
    """HF's Qwen3MoeSparseMoeBlock: softmax over the experts, the top k weigh their SwiGLU outputs."""
    B, S, D = x.shape
    xf = x.reshape(B * S, D)
    probs = torch.softmax(xf @ w[p + "mlp.gate.weight"].T, dim=-1, dtype=torch.float)
    top, chosen = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    if cfg["norm_topk_prob"]:
        top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(xf)
    for e in range(cfg["num_experts"]):
        rows, slot = torch.where(chosen == e)
        if rows.numel():
            out.index_add_(0, rows, swiglu(xf[rows], w, f"{p}mlp.experts.{e}.") * top[rows, slot, None])
    return out.view(B, S, D)


def is_sparse_layer(cfg, i):  # HF's Qwen3MoeDecoderLayer
    return (cfg.get("num_experts", 0) > 0 and i not in cfg.get("mlp_only_layers", [])
            and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0)


def hf_logits(folder, tokens):
    """HF's LlamaForCausalLM / Qwen3ForCausalLM / Qwen3MoeForCausalLM forward (modeling_llama.py,
    modeling_qwen3.py, modeling_qwen3_moe.py), without caches or masks beyond causal."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    model_type = cfg.get("model_type", "llama")
    if model_type not in ("llama", "qwen3", "qwen3_moe"):
        raise SystemExit(f"model_type {model_type!r} is not one this check re-implements (llama, qwen3, qwen3_moe)")
    w = {k: v.float() for k, v in read_hf_folder(folder).items()}
    H, KV, hd, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    qk_norm = model_type != "llama"
    B, S = tokens.shape
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if cfg.get("rope_scaling"):
        inv_freq = llama3_inv_freq(inv_freq, cfg["rope_scaling"])
    freqs = torch.outer(torch.arange(S).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(B, S, H, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(B, S, KV, hd)
        if qk_norm:  # Qwen3: each head of q and k normalized before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(B, S, KV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + att.transpose(1, 2).reshape(B, S, H * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (sparse_moe(x, w, p, cfg) if is_sparse_layer(cfg, i) else swiglu(x, w, p + "mlp."))
    lm_head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms_norm(h, w["model.norm.weight"], eps) @ lm_head.T


def transformers_logits(folder, tokens):
    if os.path.isdir(HF_PYTHON):
        sys.path.insert(0, HF_PYTHON)
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None, None
    from transformers import AutoModelForCausalLM  # the class config.json's model_type names
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(tokens).logits, f"transformers {transformers.__version__} ({type(model).__name__})"


def mean_cross_entropy(folder, batches):
    data = read_safetensors(batches)
    inputs, labels = data["inputs"], data["labels"]
    total = 0.0
    with torch.no_grad():
        for i in range(inputs.shape[0]):  # one sequence at a time: small memory
            logits = hf_logits(folder, inputs[i : i + 1]).float()
            total += torch.nn.functional.cross_entropy(logits[0], labels[i], reduction="sum").double().item()
    print(json.dumps({"mean_ce": total / labels.numel(), "tokens": labels.numel()}))
    return 0


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--mean-ce":
        return mean_cross_entropy(sys.argv[2], sys.argv[3])
    if sys.argv[1:] == ["--install-transformers"]:
        return subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--target", HF_PYTHON, TRANSFORMERS])
    folder, probe = sys.argv[1], sys.argv[2]
    titan = read_safetensors(probe)
    tokens, want = titan["tokens"], titan["logits"].float()
    with torch.no_grad():
        got, via = transformers_logits(folder, tokens)
        if got is None and os.environ.get("TITAN_HF_REQUIRE_TRANSFORMERS") == "1":
            print(f"transformers is not importable (run {sys.argv[0]} --install-transformers)")
            return 1
        if got is None:
            got, via = hf_logits(folder, tokens), "HF-layout re-implementation (transformers not installed)"
    diff = (got.float() - want).abs().max().item()
    scale = want.abs().max().item()
    ok = diff <= 1e-4
    print(f"{'logits match' if ok else 'LOGITS DIFFER'} via {via}: max |diff| {diff:.3g} (max |logit| {scale:.3g}, "
          f"tolerance 1e-4)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
