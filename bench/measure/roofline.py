"""The physical limit beside each figure (roofline): how fast this model could decode and prefill on this hardware.

Pure arithmetic (docs/roofline.md has the formulas, assumptions and sources):

- decode is memory-bound: each step reads the (active) weights once for the whole batch, plus each stream's KV
  cache at its context length. At N streams a step takes ``(W + N * KV(ctx)) / bandwidth`` seconds and yields N
  tokens, so the aggregate ceiling is ``N * bandwidth / (W + N * KV(ctx))`` and the per-stream ceiling
  ``bandwidth / (W + N * KV(ctx))`` (at one stream: ``bandwidth / (W + KV(ctx))``);
- prefill is compute-bound: a prompt token costs ``2 * active_params`` FLOPs in the matrix products plus
  ``2 * layers * attn_dim * L`` in causal attention over an L-token prompt, so the ceiling is
  ``FLOP/s / (2 * active_params + 2 * layers * attn_dim * L)`` tokens/s.

Several devices (tensor parallelism) sum bandwidth and FLOP/s; communication between them is ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from bench.errors import ConfigError
from bench.results import CellResult
from bench.warns import warning

__all__ = ["Hardware", "HARDWARE", "RooflineSpec", "build_spec", "complete_spec", "model_size_note", "roofline_for_cell",
           "decode_limit", "prefill_limit", "apply_roofline", "parse_bandwidth", "parse_flops", "parse_count",
           "parse_bytes"]

T = 1e12


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator: memory bandwidth (bytes/s) and dense tensor FLOP/s (None where the maker publishes none)."""

    name: str
    label: str
    bandwidth: float
    bf16_flops: float | None
    fp8_flops: float | None


def _hw(name: str, label: str, bw_gb_s: float, bf16_tf: float | None, fp8_tf: float | None) -> Hardware:
    return Hardware(name, label, bw_gb_s * 1e9, None if bf16_tf is None else bf16_tf * T,
                    None if fp8_tf is None else fp8_tf * T)


# Dense (no sparsity) figures; sources and notes per row in docs/roofline.md.
HARDWARE: dict[str, Hardware] = {h.name: h for h in [
    _hw("h200", "NVIDIA H200 SXM (141 GB HBM3e)", 4800, 989, 1979),
    _hw("h100", "NVIDIA H100 SXM5 (80 GB HBM3)", 3350, 989, 1979),
    _hw("h100-pcie", "NVIDIA H100 PCIe (80 GB HBM2e)", 2000, 756, 1513),
    _hw("b200", "NVIDIA B200 (HGX, 180 GB HBM3e)", 8000, 2250, 4500),
    _hw("gb10", "NVIDIA GB10, DGX Spark (128 GB LPDDR5x)", 273, 125, 250),
    _hw("rtx4090", "NVIDIA GeForce RTX 4090 (24 GB GDDR6X)", 1008, 165.2, 330.3),
    _hw("rtx5090", "NVIDIA GeForce RTX 5090 (32 GB GDDR7)", 1792, 209.5, 419),
    _hw("m1", "Apple M1", 68.25, None, None),
    _hw("m1-pro", "Apple M1 Pro", 200, None, None),
    _hw("m1-max", "Apple M1 Max", 400, None, None),
    _hw("m1-ultra", "Apple M1 Ultra", 800, None, None),
    _hw("m2", "Apple M2", 100, None, None),
    _hw("m2-pro", "Apple M2 Pro", 200, None, None),
    _hw("m2-max", "Apple M2 Max", 400, None, None),
    _hw("m2-ultra", "Apple M2 Ultra", 800, None, None),
    _hw("m3", "Apple M3", 100, None, None),
    _hw("m3-pro", "Apple M3 Pro", 150, None, None),
    _hw("m3-max", "Apple M3 Max (40-core GPU)", 400, None, None),
    _hw("m3-ultra", "Apple M3 Ultra", 819, None, None),
    _hw("m4", "Apple M4", 120, None, None),
    _hw("m4-pro", "Apple M4 Pro", 273, None, None),
    _hw("m4-max", "Apple M4 Max (40-core GPU)", 546, None, None),
]}
_ALIASES = {"dgx-spark": "gb10", "spark": "gb10", "h100-sxm": "h100", "4090": "rtx4090", "5090": "rtx5090"}


@dataclass(frozen=True, slots=True)
class RooflineSpec:
    """What the limits are computed from; every device count already applied (bandwidth and FLOP/s summed).

    Attributes:
        bandwidth: memory bytes/s of all devices.
        flops: dense FLOP/s of all devices, or None (then no prefill limit).
        weight_bytes: bytes of weights read per decode step (active weights for MoE); None until known.
        active_params: parameters used per token (all of them for a dense model); None until known.
        kv_bytes_per_token: KV-cache bytes per token of context (all layers, K and V), or None (then 0 is read).
        layers, attn_dim: transformer layers and attention width (heads x head size) for attention FLOPs, or None.
        devices: devices summed (tensor parallel); hardware: table name or None; model_source: "user" / "server".
    """

    bandwidth: float
    flops: float | None = None
    weight_bytes: float | None = None
    active_params: float | None = None
    kv_bytes_per_token: float | None = None
    layers: int | None = None
    attn_dim: int | None = None
    devices: int = 1
    hardware: str | None = None
    model_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (the results document's top-level ``roofline_spec``)."""
        return asdict(self)


# ---- parsing -----------------------------------------------------------------------------------------------------
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*(?:/\s*s)?\s*$", re.IGNORECASE)
_DEC = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


def _split(text: str, flag: str) -> tuple[float, str]:
    m = _NUM.match(str(text))
    if not m:
        raise ConfigError(f"{flag}: cannot read {text!r} as a number with an optional unit")
    v = float(m.group(1))
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{flag}: must be > 0 (got {text!r})")
    return v, m.group(2).lower()


def parse_bandwidth(text: str, flag: str = "--bandwidth") -> float:
    """``4.8TB/s``, ``4800GB/s``, ``273G``, ``4.8e12`` (bytes/s) -> bytes/s (decimal prefixes)."""
    v, unit = _split(text, flag)
    unit = unit[:-1] if unit.endswith("b") else unit
    if unit not in _DEC:
        raise ConfigError(f"{flag}: unknown unit in {text!r} (use e.g. 4.8TB/s, 273GB/s)")
    return v * _DEC[unit]


def parse_flops(text: str, flag: str = "--flops") -> float:
    """``989T``, ``989TFLOPS``, ``2.25P``, ``9.89e14`` -> FLOP/s."""
    v, unit = _split(text, flag)
    unit = unit[: -len("flops")] if unit.endswith("flops") else unit
    if unit not in _DEC:
        raise ConfigError(f"{flag}: unknown unit in {text!r} (use e.g. 989T, 2.25P)")
    return v * _DEC[unit]


def parse_count(text: str, flag: str) -> float:
    """``8b``, ``70B``, ``135m``, ``1.5t``, ``7.38e9`` -> a parameter count."""
    v, unit = _split(text, flag)
    scale = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(unit)
    if scale is None:
        raise ConfigError(f"{flag}: unknown unit in {text!r} (use e.g. 8b, 135m, 7.38e9)")
    return v * scale


def parse_bytes(text: str, flag: str) -> float:
    """``131072``, ``128k`` / ``128KiB`` (x1024), ``0.5MiB``, ``160kB`` (x1000) -> bytes."""
    v, unit = _split(text, flag)
    binary = {"k": 1024.0, "kib": 1024.0, "m": 1024.0**2, "mib": 1024.0**2, "gib": 1024.0**3}
    decimal = {"": 1.0, "b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9}
    scale = binary.get(unit, decimal.get(unit))
    if scale is None:
        raise ConfigError(f"{flag}: unknown unit in {text!r} (use e.g. 131072, 128KiB, 0.5MiB)")
    return v * scale


def hardware(name: str) -> Hardware:
    """The table row for ``name`` (case-insensitive; ``dgx-spark`` = ``gb10``). Raises ConfigError naming the flag."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in HARDWARE:
        raise ConfigError(f"--hardware: unknown {name!r}; known: {', '.join(HARDWARE)} (or give --bandwidth)")
    return HARDWARE[key]


def build_spec(*, hardware_name: str | None = None, bandwidth: str | None = None, flops: str | None = None,
               model_params: str | None = None, weight_bits: float | None = None,
               active_params: str | None = None, kv_bytes_per_token: str | None = None, devices: int = 1,
               layers: int | None = None, attn_dim: int | None = None) -> RooflineSpec | None:
    """A spec from the command-line values; None when no roofline was asked for (no hardware, no bandwidth).

    The model part may stay unknown (``weight_bytes`` None) until :func:`complete_spec` reads the server's.
    Raises ConfigError naming the flag on a bad or missing value.
    """
    model_flags = [model_params, weight_bits, active_params, kv_bytes_per_token, layers, attn_dim]
    if hardware_name is None and bandwidth is None:
        if flops is not None or any(v is not None for v in model_flags) or devices != 1:
            raise ConfigError("--bandwidth or --hardware is needed for a roofline (the model flags alone give none)")
        return None
    if devices < 1:
        raise ConfigError("--devices must be >= 1")
    hw = hardware(hardware_name) if hardware_name else None
    bw = parse_bandwidth(bandwidth) if bandwidth else hw.bandwidth if hw else 0.0
    params = parse_count(model_params, "--model-params") if model_params else None
    active = parse_count(active_params, "--active-params") if active_params else params
    if weight_bits is not None and not (0 < weight_bits <= 64):
        raise ConfigError(f"--weight-bits must be in (0, 64] (got {weight_bits})")
    if weight_bits is not None and active is None:
        raise ConfigError("--weight-bits needs --model-params (or --active-params); without them the server's "
                          "model size is used")
    if params is not None and weight_bits is None:
        raise ConfigError("--model-params needs --weight-bits (16 for F16/BF16, 8 for FP8, about 4.5 for Q4_K_M)")
    if params is not None and active is not None and active > params:
        raise ConfigError("--active-params must not exceed --model-params")
    for v, flag in ((layers, "--layers"), (attn_dim, "--attn-dim")):
        if v is not None and v < 1:
            raise ConfigError(f"{flag} must be >= 1")
    fl = parse_flops(flops) if flops else _table_flops(hw, weight_bits)
    weights = active * weight_bits / 8 if active is not None and weight_bits is not None else None
    return RooflineSpec(
        bandwidth=bw * devices, flops=None if fl is None else fl * devices, weight_bytes=weights,
        active_params=active, devices=devices, hardware=hw.name if hw else None,
        kv_bytes_per_token=parse_bytes(kv_bytes_per_token, "--kv-bytes-per-token") if kv_bytes_per_token else None,
        layers=layers, attn_dim=attn_dim, model_source="user" if weights is not None else None)


def _table_flops(hw: Hardware | None, weight_bits: float | None) -> float | None:
    """FP8 tensor FLOP/s for 8-bit weights where the chip has them, else BF16 (quantized GGUFs compute in 16 bits)."""
    if hw is None:
        return None
    if weight_bits is not None and weight_bits == 8 and hw.fp8_flops is not None:
        return hw.fp8_flops
    return hw.bf16_flops


def complete_spec(spec: RooflineSpec, server: dict[str, Any] | None) -> RooflineSpec:
    """Fill the model part from what the server said (``server["model_meta"]``: llama.cpp's ``n_params``,
    ``size``, ``n_embd``); the user's flags win. Unchanged when the server said nothing."""
    meta = (server or {}).get("model_meta") or {}
    size, n_params = _num(meta.get("size")), _num(meta.get("n_params"))
    changes: dict[str, Any] = {}
    if spec.weight_bytes is None and size:
        share = (spec.active_params / n_params) if spec.active_params and n_params else 1.0
        changes.update(weight_bytes=size * share, model_source="server")
    if spec.active_params is None and n_params:
        changes["active_params"] = n_params
    if spec.attn_dim is None and _num(meta.get("n_embd")) and spec.layers is not None:
        changes["attn_dim"] = int(meta["n_embd"])
    return replace(spec, **changes) if changes else spec


SIZE_MISMATCH = 0.10
"""A model size given by flag more than this far (relative) from the server's own count is warned about."""


def model_size_note(spec: RooflineSpec, server: dict[str, Any] | None) -> str | None:
    """A warning when the parameters given by flag (``--model-params`` / ``--active-params``) differ from what the
    server reports (llama.cpp's ``n_params``) by more than :data:`SIZE_MISMATCH`: the limits use the flags, so a
    wrong flag moves every percentage. None when they agree or the server says nothing."""
    meta = (server or {}).get("model_meta") or {}
    theirs = _num(meta.get("n_params"))
    if spec.model_source != "user" or not spec.active_params or not theirs:
        return None
    if abs(spec.active_params / theirs - 1.0) <= SIZE_MISMATCH:
        return None
    return warning("roofline-size-mismatch", flags=spec.active_params / 1e9, server=theirs / 1e9,
                   moe="--active-params is the share used per token, and this note can be ignored")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


# ---- limits ------------------------------------------------------------------------------------------------------
def decode_limit(spec: RooflineSpec, context_tokens: float, streams: int = 1) -> tuple[float, float]:
    """``(per-stream, aggregate)`` decode ceilings in tok/s at ``streams`` streams of ``context_tokens`` each."""
    if spec.weight_bytes is None:
        raise ConfigError("roofline: the model's size is unknown: give --model-params N --weight-bits B")
    step_bytes = spec.weight_bytes + streams * (spec.kv_bytes_per_token or 0.0) * max(context_tokens, 0.0)
    per = spec.bandwidth / step_bytes
    return per, per * streams


def prefill_limit(spec: RooflineSpec, prompt_tokens: float) -> float | None:
    """Prefill ceiling in tok/s for an ``prompt_tokens``-token prompt; None without FLOP/s or parameter count."""
    if spec.flops is None or spec.active_params is None:
        return None
    attn = 2.0 * spec.layers * spec.attn_dim * max(prompt_tokens, 0.0) if spec.layers and spec.attn_dim else 0.0
    return spec.flops / (2.0 * spec.active_params + attn)


def _stat(cell: dict[str, Any], key: str, stat: str = "median") -> float | None:
    v = cell.get(key)
    v = v.get(stat) if isinstance(v, dict) else None
    return float(v) if isinstance(v, (int, float)) else None


def _pct(measured: float | None, limit: float) -> float | None:
    return None if measured is None or limit <= 0 else round(100.0 * measured / limit, 1)


def roofline_for_cell(cell: dict[str, Any], spec: RooflineSpec) -> dict[str, Any]:
    """The cell's ``roofline``: decode and (with FLOP/s) prefill ceilings and the measured share of them.

    Decode context = prompt tokens (p50, else the depth) + half the output (p50, else max_tokens): the mean KV
    length read during decode. At 1 stream the limit is the per-stream ceiling, compared with decode tok/s p50;
    at N > 1 streams it is the aggregate ceiling, compared with aggregate tok/s p50. Prefill compares prompt tok/s
    p50 (uncached prompt tokens / TTFT) at depth > 0; its percentage is None at depth 0 (a tiny prompt).
    """
    streams = int(cell.get("streams") or 1)
    prompt = _stat(cell, "prompt_tokens") or float(cell.get("depth") or 0)
    out = _stat(cell, "output_tokens") or float(cell.get("max_tokens") or 0)
    per, agg = decode_limit(spec, prompt + out / 2.0, streams)
    if streams == 1:
        limit, measured = per, _stat(cell, "decode_tok_s")
    else:
        limit, measured = agg, _stat(cell, "aggregate_decode_tok_s")
    r: dict[str, Any] = {"decode_tok_s_limit": round(limit, 2), "decode_pct_of_limit": _pct(measured, limit)}
    pf = prefill_limit(spec, prompt)
    if pf is not None:
        r["prefill_tok_s_limit"] = round(pf, 1)
        r["prefill_pct_of_limit"] = _pct(_stat(cell, "prompt_tok_s"), pf) if cell.get("depth") else None
    return r


def apply_roofline(results: dict[str, Any], spec: RooflineSpec) -> dict[str, Any]:
    """Attach ``roofline`` to every cell and ``roofline_spec`` to the document (after :func:`complete_spec`).

    When the model's size is still unknown, nothing is attached and a warning naming the fix is added.
    """
    spec = complete_spec(spec, results.get("server"))
    if spec.weight_bytes is None:
        results.setdefault("warnings", []).append(warning("roofline-no-size"))
        return results
    for cell in results.get("cells", []):
        cell["roofline"] = roofline_for_cell(cell, spec)
    results["roofline_spec"] = spec.to_dict()
    return results


class SessionView(Protocol):
    """What the annotator reads and writes of a session (:class:`bench.session.endpoint.Session` has it)."""

    server: dict[str, Any]
    extras: dict[str, Any]

    def note(self, text: str) -> None: ...


class RooflineAnnotator:
    """The run loop's hook (:data:`bench.session.endpoint.CellAnnotator`): each fresh cell summary gets its ``roofline``,
    the results document its ``roofline_spec``; a model of unknown size is warned about once, naming the fix."""

    def __init__(self, spec: RooflineSpec) -> None:
        self.spec = spec
        self._warned = False
        self._checked = False

    def __call__(self, session: SessionView, cell: CellResult) -> None:
        spec = complete_spec(self.spec, session.server)
        if not self._checked:  # once per run: the flags' model size against the server's
            self._checked = True
            note = model_size_note(spec, session.server)
            if note:
                session.note(note)
        if spec.weight_bytes is None:
            if not self._warned:
                self._warned = True
                session.note(warning("roofline-no-size"))
            return
        cell.roofline = roofline_for_cell(cell.to_dict(), spec)
        session.extras["roofline_spec"] = spec.to_dict()
