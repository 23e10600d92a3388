"""Writes a synthetic tiktoken vocabulary with Llama 3's size, for throughput benchmarks.

titan's vocabulary size comes from its tokenizer (128,000 base tokens + 256 Llama 3 specials =
128,256 with Llama 3's own tokenizer.model, which is not redistributable). The 8B-shaped
benchmarks need the real output-projection and embedding shapes, not the meaning of the tokens,
so this file has the same size: the 256 single bytes (rank = byte value), then every pair of
printable ASCII characters, then printable triples, in a fixed order, up to 128,000 tokens.

    python3 scripts/bench/bench_vocab.py OUT_FILE [--size 128000]
"""
import argparse
import base64
import itertools
import os


def tokens(size):
    printable = [bytes([c]) for c in range(32, 127)]
    yield from (bytes([b]) for b in range(256))
    n = 256
    for length in (2, 3):
        for parts in itertools.product(printable, repeat=length):
            if n == size:
                return
            yield b"".join(parts)
            n += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=128000)
    a = p.parse_args()
    if not 256 <= a.size <= 256 + 95**2 + 95**3:
        p.error(f"--size {a.size} must be in [256, {256 + 95**2 + 95**3}]")
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        for rank, tok in enumerate(tokens(a.size)):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
