"""Write a random-weight F16 GGUF with Llama-3-8B shapes (or tiny ones, for tests) and a given tokenizer.

The weights mean nothing; a server loading the file does exactly the work of a real model of those shapes, which is
all a speed benchmark needs (docs/gpu.md). Nothing is downloaded: the tokenizer comes from a JSON file of GGUF
``tokenizer.*`` fields (``benchmarks/gpu/make_tokenizer.py`` writes SmolLM2's), and the file is written with the
``gguf`` package of llama.cpp's ``gguf-py`` (pip ``gguf``, the ``gpu`` extra; or the source folder given).

usage: python benchmarks/gpu/gen_model.py GGUF_PY_DIR TOKENIZER_JSON OUT.gguf [8b|1b|135m|tiny]
  GGUF_PY_DIR     llama.cpp's gguf-py folder, or "-" for the installed gguf package
  TOKENIZER_JSON  {field name: value} of the tokenizer.* GGUF fields (tokens, token_type, merges, ids, template)
  OUT.gguf        the model file to write (8b: 14.77 GB with SmolLM2's 49,152-token vocabulary)

Shapes (``SHAPES``): Llama-3-8B is 32 layers, 4096 wide, 32 query heads and 8 KV heads (GQA) of 128, feed-forward
14336, RoPE base 500000, RMS norm eps 1e-5. Tensors are written one at a time (memory: the largest tensor, not the
file), each cut from one pool of N(0, 0.02) values (norm weights 1), so 15 GB take seconds, not minutes.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shapes:
    """The hyperparameters of a llama-architecture model."""

    layers: int
    embd: int
    heads: int
    kv_heads: int
    ff: int
    context: int
    rope_base: float = 500000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.embd // self.heads


SHAPES = {
    "8b": Shapes(layers=32, embd=4096, heads=32, kv_heads=8, ff=14336, context=131072),
    "1b": Shapes(layers=16, embd=2048, heads=32, kv_heads=8, ff=8192, context=131072),  # a draft model's size
    "135m": Shapes(layers=30, embd=576, heads=9, kv_heads=3, ff=1536, context=8192),  # SmolLM2-135M's shapes
    "tiny": Shapes(layers=2, embd=64, heads=4, kv_heads=2, ff=128, context=2048),
}
POOL = 1 << 22  # values in the random pool every tensor is cut from


def tensor_plan(s: Shapes, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, numpy shape, "f16" | "f32" | "ones")`` of every tensor, in file order (llama.cpp's llama names;
    a matrix is (out, in) as numpy sees it, which GGUF stores as ne = [in, out])."""
    kv = s.kv_heads * s.head_dim
    plan: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (vocab, s.embd), "f16")]
    for i in range(s.layers):
        b = f"blk.{i}"
        plan += [
            (f"{b}.attn_norm.weight", (s.embd,), "ones"),
            (f"{b}.attn_q.weight", (s.embd, s.embd), "f16"),
            (f"{b}.attn_k.weight", (kv, s.embd), "f16"),
            (f"{b}.attn_v.weight", (kv, s.embd), "f16"),
            (f"{b}.attn_output.weight", (s.embd, s.embd), "f16"),
            (f"{b}.ffn_norm.weight", (s.embd,), "ones"),
            (f"{b}.ffn_gate.weight", (s.ff, s.embd), "f16"),
            (f"{b}.ffn_up.weight", (s.ff, s.embd), "f16"),
            (f"{b}.ffn_down.weight", (s.embd, s.ff), "f16"),
        ]
    plan += [("output_norm.weight", (s.embd,), "ones"), ("output.weight", (vocab, s.embd), "f16")]
    return plan


def _array(shape: tuple[int, ...], kind: str, pool: np.ndarray) -> np.ndarray:
    if kind == "ones":
        return np.ones(shape, dtype=np.float32)
    n = int(np.prod(shape))
    start = (n * 7919) % pool.size  # a different cut of the pool for each size
    reps = -(-(start + n) // pool.size)
    flat = np.tile(pool, reps)[start:start + n] if reps > 1 else pool[start:start + n]
    return np.ascontiguousarray(flat.reshape(shape))


def _add_tokenizer(w: Any, gguf: Any, tok: dict[str, Any]) -> int:
    """Write the tokenizer fields with the types llama.cpp reads; returns the vocabulary size."""
    vt = gguf.GGUFValueType
    for name, val in tok.items():
        if name == "tokenizer.ggml.token_type":
            w.add_key_value(name, [int(x) for x in val], vt.ARRAY, vt.INT32)
        elif isinstance(val, bool):
            w.add_bool(name, val)
        elif isinstance(val, int):
            w.add_uint32(name, val)
        elif isinstance(val, float):
            w.add_float32(name, val)
        elif isinstance(val, str):
            w.add_string(name, val)
        elif isinstance(val, list) and val and all(isinstance(x, str) for x in val):
            w.add_key_value(name, val, vt.ARRAY, vt.STRING)
        elif isinstance(val, list) and val:
            w.add_key_value(name, [int(x) for x in val], vt.ARRAY, vt.INT32)
    tokens = tok.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise SystemExit("gen_model: the tokenizer JSON has no tokenizer.ggml.tokens list")
    return len(tokens)


def _add_hparams(w: Any, s: Shapes, size: str) -> None:
    w.add_name(f"bench random-weight llama {size}")
    w.add_context_length(s.context)
    w.add_embedding_length(s.embd)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16


def write_model(gguf: Any, tokenizer: dict[str, Any], out: Path, size: str = "8b", seed: int = 0) -> int:
    """Write the model file; returns its size in bytes."""
    s = SHAPES[size]
    w = gguf.GGUFWriter(str(out), "llama")
    _add_hparams(w, s, size)
    vocab = _add_tokenizer(w, gguf, tokenizer)
    w.add_vocab_size(vocab)
    plan = tensor_plan(s, vocab)
    for name, shape, kind in plan:
        dtype = np.dtype(np.float32 if kind == "ones" else np.float16)
        w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = (np.random.default_rng(seed).standard_normal(POOL, dtype=np.float32) * 0.02).astype(np.float16)
    for _, shape, kind in plan:
        w.write_tensor_data(_array(shape, kind, pool))
    w.close()
    return out.stat().st_size


def import_gguf(gguf_py_dir: str) -> Any:
    """The ``gguf`` module: from llama.cpp's ``gguf-py`` folder, or the installed package for ``"-"``."""
    if gguf_py_dir != "-":
        if not (Path(gguf_py_dir) / "gguf").is_dir():
            raise SystemExit(f"gen_model: {gguf_py_dir} is not llama.cpp's gguf-py folder (no gguf/ in it)")
        sys.path.insert(0, gguf_py_dir)
    try:
        import gguf
    except ImportError:
        raise SystemExit("gen_model: the gguf package is missing: pip install 'bench[gpu]' or give gguf-py") from None
    return gguf


def main(argv: list[str]) -> int:
    """Command line: see the module docstring."""
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] not in SHAPES):
        print(__doc__.split("\n\n")[2] if __doc__ else "", file=sys.stderr)
        return 2
    gguf = import_gguf(argv[0])
    tokenizer = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    size = argv[3] if len(argv) == 4 else "8b"
    t0 = time.monotonic()
    n = write_model(gguf, tokenizer, Path(argv[2]), size)
    print(f"{argv[2]}: {size}, {n / 1e9:.2f} GB in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
