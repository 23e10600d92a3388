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


def _exec_into(name, package, path):
    module = types.ModuleType(name)
    module.__package__ = package
    sys.modules[name] = module
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    return module


def load_release_model(family, args_class, model_py, moe_py):
    """torchtitan/models/<family>/model/model.py (model_py) of a release, with its MoE module
    (moe_py, torchtitan/models/moe/moe.py). Returns (the model module, the moe module)."""
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
    stub("torchtitan.models.attention", create_attention_mask=unused, create_varlen_metadata_for_document=unused,
         FlexAttentionWrapper=SdpaWrapper, get_causal_mask_mod=unused, get_document_mask_mod=unused,
         ScaledDotProductAttentionWrapper=SdpaWrapper, VarlenAttentionWrapper=SdpaWrapper, VarlenMetadata=object)
    stub("torchtitan.models.moe.utils", indices_padding_wrapper=lambda fn: fn)
    moe = stub("torchtitan.models.moe")
    moe_module = _exec_into("torchtitan.models.moe.moe", "torchtitan.models.moe", moe_py)
    for name in ("MoE", "MoEArgs", "FeedForward", "build_moe"):
        setattr(moe, name, getattr(moe_module, name))
    stub(f"{package}.args", **{args_class: object})
    return _exec_into(f"{package}.model", package, model_py), moe_module
