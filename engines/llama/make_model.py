"""Writes a random-weight GGUF model of a named shape for tandem-llama
(docs/llama.md "Models").

The step time and the memory of a model depend on its shape, not on its
values, so a model with random weights measures what a systems project needs.
The tokenizer is real: the Llama-3 vocabulary (or Qwen2's, for the Qwen
shape) from llama.cpp's own vocab-only GGUF files.

Deterministic: the same shape, type and seed give the same bytes. Every
tensor (in fixed chunks of kChunk elements) is drawn from its own generator,
seeded by (seed, tensor name, chunk), so the output does not depend on how
many worker processes fill it.

Weights: f16 values with random sign and mantissa and an exponent in
[2^-10, 2^-6) (magnitudes 0.001..0.03, the order of a trained model's
weights), or q8_0 blocks of 32 random int8 with scale 2^-12. Norm weights are
1.0; Llama-3.1's rope_freqs are computed as its rope scaling defines them.

Usage (scripts/make-model wraps this with the right interpreter and paths):
  make_model.py --gguf-py DIR --vocab-dir DIR SHAPE OUT.gguf [--seed N]
                [--type f16|q8_0] [--jobs N]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import multiprocessing
import os
import struct
import sys
import time

kChunk = 1 << 24  # elements per generator stream

# Shapes. n_ff_exp/n_expert only for MoE; tied = output shares token_embd.
SHAPES = {
    # For tests: four layers, 256 wide, GQA 4:2, the full Llama-3 vocabulary.
    "tiny": dict(arch="llama", vocab="llama-bpe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2,
                 n_ff=768, tied=True, ctx=131072, rope_theta=500000.0, rope_freqs=False),
    # Llama-3.2-1B's shape.
    "1b": dict(arch="llama", vocab="llama-bpe", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8,
               n_ff=8192, tied=True, ctx=131072, rope_theta=500000.0, rope_freqs=True),
    # Llama-3.1-8B's exact shape (config.json of meta-llama/Llama-3.1-8B).
    "llama3-8b": dict(arch="llama", vocab="llama-bpe", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                      n_ff=14336, tied=False, ctx=131072, rope_theta=500000.0, rope_freqs=True),
    # Qwen3-30B-A3B's shape (config.json of Qwen/Qwen3-30B-A3B): 48 layers,
    # 128 experts of 768, 8 active, head_dim 128, GQA 32:4.
    "qwen3-30b-a3b": dict(arch="qwen3moe", vocab="qwen2", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4,
                          head_dim=128, n_ff=6144, n_expert=128, n_expert_used=8, n_ff_exp=768, tied=False,
                          ctx=40960, rope_theta=1000000.0, rope_freqs=False, rms_eps=1e-6),
}


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


def gstr(v: str) -> bytes:
    b = v.encode()
    return struct.pack("<Q", len(b)) + b


def kv_str(key: str, v: str) -> bytes:
    return gstr(key) + struct.pack("<I", 8) + gstr(v)  # GGUF_TYPE_STRING


def kv_u32(key: str, v: int) -> bytes:
    return gstr(key) + struct.pack("<II", 4, v)  # GGUF_TYPE_UINT32


def kv_f32(key: str, v: float) -> bytes:
    return gstr(key) + struct.pack("<If", 6, v)  # GGUF_TYPE_FLOAT32


# Bytes of one value of each fixed-size GGUF type (uint8 .. float64, bool).
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_tokenizer(path: str) -> tuple[list[bytes], int]:
    """The tokenizer.* key-value entries of a GGUF file, each as its raw
    bytes, and the number of tokens. Scans the header without decoding
    strings (the Llama-3 vocabulary has 400k of them)."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, out, n_vocab = 24, [], 0

    def skip_value(t: int, p: int) -> int:
        if t == 8:  # string
            (n,) = struct.unpack_from("<Q", buf, p)
            return p + 8 + n
        if t == 9:  # array: element type, count, elements
            et, n = struct.unpack_from("<IQ", buf, p)
            p += 12
            if et in FIXED:
                return p + n * FIXED[et]
            for _ in range(n):
                p = skip_value(et, p)
            return p
        return p + FIXED[t]

    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (t,) = struct.unpack_from("<I", buf, pos)
        end = skip_value(t, pos + 4)
        if key.startswith("tokenizer."):
            out.append(buf[start:end])
            if key == "tokenizer.ggml.tokens":
                n_vocab = struct.unpack_from("<Q", buf, pos + 8)[0]
        pos = end
    if n_vocab == 0:
        raise ValueError(f"{path}: no tokenizer.ggml.tokens")
    return out, n_vocab


def tensor_plan(s: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape (outer first), kind) for every tensor; kind is
    'w' (random weight), 'norm' (ones) or 'rope' (rope_freqs)."""
    hd = s.get("head_dim", s["n_embd"] // s["n_head"])
    q, kv, e = s["n_head"] * hd, s["n_head_kv"] * hd, s["n_embd"]
    t: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (s["n_vocab"], e), "w")]
    if s.get("rope_freqs"):
        t.append(("rope_freqs.weight", (hd // 2,), "rope"))
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (e,), "norm"),
              (b + "attn_q.weight", (q, e), "w"),
              (b + "attn_k.weight", (kv, e), "w"),
              (b + "attn_v.weight", (kv, e), "w"),
              (b + "attn_output.weight", (e, q), "w"),
              (b + "ffn_norm.weight", (e,), "norm")]
        if s["arch"] == "qwen3moe":
            x, f = s["n_expert"], s["n_ff_exp"]
            t += [(b + "attn_q_norm.weight", (hd,), "norm"),
                  (b + "attn_k_norm.weight", (hd,), "norm"),
                  (b + "ffn_gate_inp.weight", (x, e), "w"),
                  (b + "ffn_gate_exps.weight", (x, f, e), "w"),
                  (b + "ffn_up_exps.weight", (x, f, e), "w"),
                  (b + "ffn_down_exps.weight", (x, e, f), "w")]
        else:
            f = s["n_ff"]
            t += [(b + "ffn_gate.weight", (f, e), "w"),
                  (b + "ffn_up.weight", (f, e), "w"),
                  (b + "ffn_down.weight", (e, f), "w")]
    t.append(("output_norm.weight", (e,), "norm"))
    if not s["tied"]:
        t.append(("output.weight", (s["n_vocab"], e), "w"))
    return t


def llama31_rope_freqs(hd: int, theta: float) -> "np.ndarray":
    """Llama-3.1's rope scaling (factor 8, low/high frequency factors 1 and
    4, original context 8192), as the factors llama.cpp divides by."""
    import numpy as np
    factor, low, high, orig = 8.0, 1.0, 4.0, 8192
    low_wl, high_wl = orig / low, orig / high
    out = []
    for i in range(0, hd, 2):
        freq = 1.0 / theta ** (i / hd)
        wl = 2 * math.pi / freq
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (orig / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def stream_seed(seed: int, name: str, chunk: int) -> int:
    h = hashlib.sha256(f"{seed}:{name}:{chunk}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def fill(job):
    """Worker: writes chunk `chunk` of tensor `name` at byte `offset`."""
    import numpy as np
    path, offset, name, kind, qtype, n_elems, chunk, seed = job
    first = chunk * kChunk
    n = min(kChunk, n_elems - first)
    rng = np.random.default_rng(stream_seed(seed, name, chunk))
    if qtype == "f16":
        r = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        # sign and mantissa random, exponent 5..8 (2^-10 .. 2^-7, times 1..2)
        w = (r & np.uint16(0x83FF)) | ((np.uint16(5) + ((r >> np.uint16(10)) & np.uint16(3))) << np.uint16(10))
        data = w.view(np.uint8)
        at = offset + first * 2
    else:  # q8_0: blocks of 32 elements, f16 scale then 32 int8
        blocks = n // 32
        b = np.empty((blocks, 34), dtype=np.uint8)
        b[:, 0:2] = np.frombuffer(np.float16(2.0 ** -12).tobytes(), dtype=np.uint8)
        q = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8)
        b[:, 2:] = q.view(np.uint8)
        data = b.reshape(-1)
        at = offset + (first // 32) * 34
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data.tobytes())
    return n


def main() -> int:
    ap = argparse.ArgumentParser(prog="make-model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--vocab-dir", required=True, help="llama.cpp's models/ folder (ggml-vocab-*.gguf)")
    ap.add_argument("shape", help="one of: " + ", ".join(SHAPES))
    ap.add_argument("out", help="the GGUF file to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--type", choices=["f16", "q8_0"], default="f16")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    if a.shape not in SHAPES:
        print(f"make-model: unknown shape '{a.shape}' (shapes: {', '.join(SHAPES)})", file=sys.stderr)
        return 2
    if a.jobs < 1:
        print("make-model: --jobs must be at least 1", file=sys.stderr)
        return 2
    sys.path.insert(0, a.gguf_py)
    try:
        import numpy as np
        import gguf
    except ImportError as e:
        print(f"make-model: {e} (scripts/install-deps installs python3-numpy and python3-yaml)", file=sys.stderr)
        return 1

    s = dict(SHAPES[a.shape])
    vocab_path = os.path.join(a.vocab_dir, f"ggml-vocab-{s['vocab']}.gguf")
    if not os.path.isfile(vocab_path):
        print(f"make-model: {vocab_path}: no such file", file=sys.stderr)
        return 1
    tokenizer_kv, n_vocab = read_tokenizer(vocab_path)
    s["n_vocab"] = n_vocab
    hd = s.get("head_dim", s["n_embd"] // s["n_head"])

    arch = s["arch"]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".part"
    V = gguf.GGUFValueType
    kv: list[bytes] = [
        kv_str("general.architecture", arch),
        kv_str("general.name", f"tandem-random-{a.shape}"),
        kv_str("general.description", f"random weights in the shape '{a.shape}', seed {a.seed} (tandem scripts/make-model)"),
        kv_u32(f"{arch}.context_length", s["ctx"]),
        kv_u32(f"{arch}.embedding_length", s["n_embd"]),
        kv_u32(f"{arch}.block_count", s["n_layer"]),
        kv_u32(f"{arch}.feed_forward_length", s["n_ff"]),
        kv_u32(f"{arch}.attention.head_count", s["n_head"]),
        kv_u32(f"{arch}.attention.head_count_kv", s["n_head_kv"]),
        kv_f32(f"{arch}.rope.freq_base", s["rope_theta"]),
        kv_f32(f"{arch}.attention.layer_norm_rms_epsilon", s.get("rms_eps", 1e-5)),
        kv_u32(f"{arch}.vocab_size", n_vocab),
        kv_u32(f"{arch}.rope.dimension_count", hd),
        kv_u32("general.file_type", 1 if a.type == "f16" else 7),  # MOSTLY_F16 / MOSTLY_Q8_0
    ]
    if "head_dim" in s:
        kv += [kv_u32(f"{arch}.attention.key_length", hd), kv_u32(f"{arch}.attention.value_length", hd)]
    if arch == "qwen3moe":
        kv += [kv_u32(f"{arch}.expert_count", s["n_expert"]),
               kv_u32(f"{arch}.expert_used_count", s["n_expert_used"]),
               kv_u32(f"{arch}.expert_feed_forward_length", s["n_ff_exp"])]
    kv += tokenizer_kv  # the vocab file's tokenizer.* entries, byte for byte

    plan = tensor_plan(s)
    align = gguf.GGUF_DEFAULT_ALIGNMENT
    qt = gguf.GGMLQuantizationType
    infos, sizes, off = [], [], 0
    for name, shape, kind in plan:
        n = math.prod(shape)
        if kind == "w" and a.type == "q8_0":
            if shape[-1] % 32:
                print(f"make-model: {name}: rows of {shape[-1]} are not a multiple of 32 (q8_0)", file=sys.stderr)
                return 1
            t, nbytes = qt.Q8_0, n // 32 * 34
        elif kind == "w":
            t, nbytes = qt.F16, n * 2
        else:
            t, nbytes = qt.F32, n * 4
        ne = list(reversed(shape))  # ggml order: innermost first
        infos.append(gstr(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) +
                     struct.pack("<IQ", int(t), off))
        sizes.append(nbytes)
        off += pad(nbytes, align)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(kv)) + b"".join(kv) + b"".join(infos)
    data_start = pad(len(head), align)
    offsets, at = [], data_start
    for nbytes in sizes:
        offsets.append(at)
        at += pad(nbytes, align)
    with open(tmp, "wb") as out:
        out.write(head)
        out.truncate(at)
        for (name, shape, kind), at_t in zip(plan, offsets):
            if kind == "norm":
                out.seek(at_t)
                out.write(np.ones(shape, dtype=np.float32).tobytes())
            elif kind == "rope":
                out.seek(at_t)
                out.write(llama31_rope_freqs(hd, s["rope_theta"]).tobytes())
    off = at

    jobs = []
    for (name, shape, kind), at in zip(plan, offsets):
        if kind != "w":
            continue
        n = math.prod(shape)
        for c in range((n + kChunk - 1) // kChunk):
            jobs.append((tmp, at, name, kind, a.type, n, c, a.seed))
    t0 = time.monotonic()
    total = 0
    if a.jobs == 1:
        for j in jobs:
            total += fill(j)
    else:
        with multiprocessing.get_context("fork").Pool(a.jobs) as pool:
            for n in pool.imap_unordered(fill, jobs, chunksize=1):
                total += n
    os.replace(tmp, a.out)
    params = sum(math.prod(sh) for _, sh, _ in plan)
    print(f"make-model: {a.out}: {a.shape} ({arch}, {params / 1e9:.3f} B parameters, {a.type}, seed {a.seed}), "
          f"{off / 2**20:.1f} MiB, weights in {time.monotonic() - t0:.1f} s with {a.jobs} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
