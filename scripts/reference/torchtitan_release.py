"""What the torchtitan reference scripts share (torchtitan_qwen3.py, torchtitan_deepseek_v3.py):
the fixtures' deterministic values, and a release's model files loaded with stand-ins for their
torchtitan imports, so that nothing beyond torch needs to be installed.

The stand-ins: the attention wrappers become the plain scaled_dot_product_attention call
torchtitan's SDPA wrapper makes (causal, with the model's softmax scale), the model protocol an
nn.Module, the model arguments' class `object` (the scripts pass a namespace with its fields),
the grouped-mm padding helper the identity (unused with use_grouped_mm = False). The MoE
router's torch.histc of int64 indices has a float-only CPU kernel (the CUDA one returns int64
counts): count_histc_in_float makes it count in float and return int64, as on the GPU.
"""
import logging
import math
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn


def values(shape, seed, scale, ones=False):
    """(1 if ones) + scale * sin(1.7 i + seed) over the flat index i, in float64, rounded to float32:
    what tests/sin_values.h computes."""
    n = math.prod(shape)
    flat = torch.tensor([(1.0 if ones else 0.0) + scale * math.sin(1.7 * i + seed) for i in range(n)],
                        dtype=torch.float64)
    return flat.to(torch.float32).view(shape)


def stub(name, **attrs):
    module = types.ModuleType(name)
    module.__path__ = []
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def count_histc_in_float():
    histc = torch.histc
    torch.histc = lambda t, *a, **k: histc(t, *a, **k) if t.is_floating_point() else histc(t.float(), *a, **k).long()


def _exec_into(name, package, path, fixes=()):
    """Runs the file at `path` as module `name`; `fixes`: (old, new) source replacements, each of
    which must occur (a release bug the scripts correct, said where they pass one)."""
    module = types.ModuleType(name)
    module.__package__ = package
    sys.modules[name] = module
    with open(path) as f:
        source = f.read()
    for old, new in fixes:
        assert old in source, f"{path}: the fix's text is not there: {old!r}"
        source = source.replace(old, new)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def release_attention(attention_py):
    """The release's torchtitan/models/attention.py run as it is (its mask mods), with
    create_attention_mask evaluating a mask mod on every (batch, query, key) into a dense boolean
    [B, 1, Q, KV] mask, and a FlexAttentionWrapper that is SDPA under that mask (returning the
    log-sum-exp when asked): FlexAttention's result without compiling it."""
    module = _exec_into("torchtitan.models.attention", "torchtitan.models", attention_py)

    def create_attention_mask(mask_mod, B, H, Q_LEN, KV_LEN):
        b = torch.arange(B).view(B, 1, 1, 1)
        h = torch.zeros(1, 1, 1, 1, dtype=torch.long)
        q = torch.arange(Q_LEN).view(1, 1, Q_LEN, 1)
        kv = torch.arange(KV_LEN).view(1, 1, 1, KV_LEN)
        return mask_mod(b, h, q, kv).expand(B, 1, Q_LEN, KV_LEN)

    class DenseFlexWrapper(nn.Module):
        def forward(self, q, k, v, *, score_mod=None, block_mask=None, scale=None, return_lse=False, enable_gqa=False):
            assert score_mod is None
            if enable_gqa:
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
            scores = scores.masked_fill(~block_mask, float("-inf"))
            lse = torch.logsumexp(scores, dim=-1)
            out = torch.softmax(scores, dim=-1) @ v
            return (out, lse) if return_lse else out

    module.create_attention_mask = create_attention_mask
    module.FlexAttentionWrapper = DenseFlexWrapper
    return module


def load_release_model(family, args_class, model_py, moe_py, attention_py=None, fixes=(), siblings=()):
    """torchtitan/models/<family>/model/model.py (model_py) of a release, with its MoE module
    (moe_py, torchtitan/models/moe/moe.py). Returns (the model module, the moe module).
    `args_class`: the name (or names) model.py imports from .args. `attention_py`: the release's
    torchtitan/models/attention.py, for a model that builds masks (release_attention); without
    it the SDPA stand-ins. `fixes`: source replacements in model.py (_exec_into). `siblings`:
    (name, path) of the family's other model files model.py imports (gpt-oss's moe.py), run first."""
    class SdpaWrapper(nn.Module):  # what torchtitan's ScaledDotProductAttentionWrapper computes
        def forward(self, q, k, v, *, scale=None, enable_gqa=False, is_causal=True):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa)

    class ModelProtocol(nn.Module):
        def __init__(self, model_args):
            super().__init__()

    package = f"torchtitan.models.{family}.model"
    for name in ("torchtitan", "torchtitan.models", "torchtitan.tools", "torchtitan.components",
                 "torchtitan.protocols", f"torchtitan.models.{family}", package):
        stub(name)
    stub("torchtitan.models.utils", trunc_normal_=torch.nn.init.trunc_normal_)
    stub("torchtitan.tools.logging", logger=logging.getLogger("torchtitan"))
    stub("torchtitan.components.tokenizer", BaseTokenizer=object)
    stub("torchtitan.protocols.model", AttentionMasksType=object)
    stub("torchtitan.protocols.train_spec", ModelProtocol=ModelProtocol)
    unused = lambda *a, **k: None  # noqa: E731 (flex / varlen mask builders: not used by sdpa)
    if attention_py is None:
        stub("torchtitan.models.attention", create_attention_mask=unused, create_varlen_metadata_for_document=unused,
             FlexAttentionWrapper=SdpaWrapper, get_causal_mask_mod=unused, get_document_mask_mod=unused,
             ScaledDotProductAttentionWrapper=SdpaWrapper, VarlenAttentionWrapper=SdpaWrapper, VarlenMetadata=object)
    else:
        release_attention(attention_py).ScaledDotProductAttentionWrapper = SdpaWrapper
    stub("torchtitan.models.moe.utils", indices_padding_wrapper=lambda fn: fn, _permute=None, _unpermute=None)
    moe = stub("torchtitan.models.moe")
    moe_module = _exec_into("torchtitan.models.moe.moe", "torchtitan.models.moe", moe_py)
    for name in ("MoE", "MoEArgs", "FeedForward", "build_moe"):
        setattr(moe, name, getattr(moe_module, name))
    names = (args_class,) if isinstance(args_class, str) else tuple(args_class)
    stub(f"{package}.args", **{name: object for name in names})
    for name, path in siblings:
        _exec_into(f"{package}.{name}", package, path)
    return _exec_into(f"{package}.model", package, model_py, fixes), moe_module
