#!/usr/bin/env python3
"""Writes the committed seed inputs of fuzz/corpus/<target>/ (small valid files of each format,
and a few near misses), so that each fuzz target starts from inputs that pass its reader's
checks. Python's standard library only.  Run: python3 fuzz/make_seeds.py"""
import base64, json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob


put("fuzz_safetensors_header", "two_tensors", safetensors(
    {"a.weight": ("F32", [2, 3], struct.pack("<6f", *range(6))), "b": ("BF16", [4], b"\x80\x3f" * 4)},
    {"format": "pt"}))
put("fuzz_safetensors_header", "empty_tensor", safetensors({"e": ("F16", [0, 5], b""), "f": ("F64", [], b"\0" * 8)}))
put("fuzz_safetensors_header", "u8_refused", safetensors({"mask": ("U8", [3], b"\1\2\3")}))

lines = [base64.b64encode(bytes([b])).decode() + " " + str(b) for b in range(256)]
lines += [base64.b64encode(b"he").decode() + " 256", base64.b64encode(b"hel").decode() + " 257"]
put("fuzz_tiktoken", "bytes_and_merges", "\n".join(lines) + "\n")
put("fuzz_tiktoken", "small", "YQ== 0\nYg== 1\n\nYWI= 2\n")

def shard(ids, vocab, width):
    fmt = "<%d%s" % (len(ids), "H" if width == 2 else "I")
    return b"TITANTOK" + struct.pack("<IIQQ", 1, width, len(ids), vocab) + struct.pack(fmt, *ids)
put("fuzz_token_shard", "u16", shard([1, 2, 3, 99, 0], 100, 2))
put("fuzz_token_shard", "u32", shard([70000, 5, 131071], 131072, 4))
put("fuzz_token_shard", "empty", shard([], 10, 2))


def byte_level(bs):  # GPT-2's bytes_to_unicode
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return "".join(table[b] for b in bs)


tokens = [bytes([b]) for b in range(256)] + [b"he", b"hel", b"hello", b" w"]
vocab = {byte_level(t): i for i, t in enumerate(tokens)}
merges = [byte_level(b"h") + " " + byte_level(b"e"), byte_level(b"he") + " " + byte_level(b"l"),
          byte_level(b"hel") + " " + byte_level(b"lo"), byte_level(b" ") + " " + byte_level(b"w")]
specials = ["<|begin_of_text|>", "<|end_of_text|>"]
doc = {"version": "1.0",
       "added_tokens": [{"id": len(tokens) + i, "content": s, "special": True} for i, s in enumerate(specials)],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "ignore_merges": False, "vocab": vocab, "merges": merges}}
put("fuzz_hf_tokenizer", "small_bpe", json.dumps(doc))

put("fuzz_config", "debug", """[job]
description = "fuzz seed"
[model]
flavor = "debugmodel"
[training]
steps = 10
seq_len = 64
local_batch_size = 2
skip_nonfinite_steps = true
[optimizer]
lr = 8e-4
[lr_scheduler]
warmup_steps = 2
[parallelism]
data_parallel_shard_degree = -1
[float8]
recipe_name = "rowwise"
""")
put("fuzz_config", "empty", "")
