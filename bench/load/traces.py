"""Trace replay: timestamped request traces -> an open-loop plan (docs/load.md, "trace").

Formats (detected from the file: a ``.csv`` is Azure, anything else Mooncake):

* Mooncake JSONL (the FAST'25 Mooncake traces): one object per line with ``timestamp`` (ms from the trace start),
  ``input_length`` and ``output_length`` (tokens) and ``hash_ids``: the ids of the prompt's blocks of
  ``block_tokens`` tokens (512 in the published traces); equal ids are identical blocks, so requests sharing leading
  ids share a prompt prefix. bench builds block ``h`` as the same text wherever it appears (its content stream is
  seeded by ``h``; a shorter last block is a prefix of the full one), so the trace's prefix sharing is reproduced
  and a server's prefix cache sees what it saw. Tokens past ``len(hash_ids) * block_tokens`` are unique to the
  request.
* Azure LLM inference trace CSV (AzurePublicDataset 2023/2024): header with ``TIMESTAMP`` (a date-time such as
  ``2023-11-16 18:15:46.6805900``, or seconds), ``ContextTokens``, ``GeneratedTokens``; no sharing information, so
  every prompt has a unique prefix.

``speed`` divides every offset (2 = twice as fast). Offsets are relative to the first request.
``python -m bench.load.traces --make-sample DIR`` writes seeded sample traces of both formats (no download).
"""

from __future__ import annotations

import argparse
import csv
import json
from datetime import datetime
from pathlib import Path

import numpy as np

from bench.errors import ConfigError
from bench.load.openloop import Planned

__all__ = ["load_trace", "read_mooncake", "read_azure", "make_samples", "main"]


def _pos_int(v: object, where: str, key: str, minimum: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ConfigError(f"--trace: {where}: {key} must be an int >= {minimum}, got {v!r}")
    return v


def read_mooncake(path: Path, block_tokens: int) -> list[Planned]:
    """Parse a Mooncake JSONL trace (offsets not yet shifted or sped up)."""
    out: list[Planned] = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            d = json.loads(line)
        except ValueError:
            raise ConfigError(f"--trace: {where} is not JSON") from None
        if not isinstance(d, dict):
            raise ConfigError(f"--trace: {where} is not an object")
        ts = d.get("timestamp")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0:
            raise ConfigError(f"--trace: {where}: timestamp must be a number of ms >= 0, got {ts!r}")
        n_in = _pos_int(d.get("input_length"), where, "input_length", 1)
        n_out = _pos_int(d.get("output_length"), where, "output_length", 1)
        ids = d.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise ConfigError(f"--trace: {where}: hash_ids must be a list of ints")
        out.append(Planned(ts / 1000.0, n_in, n_out, tuple(ids), meta={"trace_line": i}))
    _check_blocks(out, path, block_tokens)
    return out


_BLOCK_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _fitting(plan: list[Planned]) -> list[int]:
    """Block sizes for which every request's hash_ids cover its prompt exactly (``ceil(input / size)`` ids)."""
    with_ids = [p for p in plan if p.blocks]
    return [b for b in _BLOCK_SIZES if with_ids and all(-(-p.input_tokens // b) == len(p.blocks) for p in with_ids)]


def _hint(plan: list[Planned]) -> str:
    """The block size to pass instead: one the whole file fits (the published traces use 512)."""
    fit = _fitting(plan)
    if fit:
        b = 512 if 512 in fit else fit[0]
        return f"the file fits --block-tokens {b}" + (" (the published Mooncake traces use 512)" if b == 512 else "")
    return "give the block size the trace was made with (the published Mooncake traces use 512)"


def _check_blocks(plan: list[Planned], path: Path, block_tokens: int) -> None:
    """Refuse hash_ids inconsistent with ``block_tokens`` (the blocks would be built the wrong length and the
    trace's prefix sharing lost): a request with more ids than its prompt has blocks, or a file in which no
    request's ids cover its prompt at this size while another size fits them all. Fewer ids than blocks, in a
    file that fits, is allowed: the tokens past the last id are the request's own."""
    with_ids = [p for p in plan if p.blocks]
    for p in with_ids:
        fits = -(-p.input_tokens // block_tokens)
        if len(p.blocks) > fits:
            raise ConfigError(f"--trace: {path}:{p.meta['trace_line']}: {len(p.blocks)} hash_ids for input_length "
                              f"{p.input_tokens}, more than its {fits} blocks of --block-tokens {block_tokens}; "
                              f"{_hint(plan)}")
    if with_ids and not any(-(-p.input_tokens // block_tokens) == len(p.blocks) for p in with_ids) and _fitting(plan):
        raise ConfigError(f"--trace: {path}: no request's hash_ids match its input_length in blocks of "
                          f"--block-tokens {block_tokens}; {_hint(plan)}")


def _azure_time(s: str, where: str) -> float:
    s = s.strip()
    try:
        return float(s)
    except ValueError:
        pass
    base, _, frac = s.partition(".")
    try:
        t = datetime.fromisoformat(base.replace("T", " ")).timestamp()
    except ValueError:
        raise ConfigError(f"--trace: {where}: TIMESTAMP {s!r} is not a date-time or seconds") from None
    digits = "".join(ch for ch in frac if ch.isdigit())
    return t + (int(digits) / 10 ** len(digits) if digits else 0.0)


def read_azure(path: Path) -> list[Planned]:
    """Parse an Azure LLM inference trace CSV (offsets not yet shifted or sped up)."""
    out: list[Planned] = []
    with open(path, encoding="utf-8", newline="") as fh:
        rd = csv.DictReader(fh)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not need <= set(rd.fieldnames or []):
            raise ConfigError(f"--trace: {path}: an Azure CSV needs the columns {', '.join(sorted(need))}")
        for i, row in enumerate(rd, 2):
            where = f"{path}:{i}"
            try:
                n_in, n_out = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError):
                raise ConfigError(f"--trace: {where}: ContextTokens/GeneratedTokens must be integers") from None
            if n_in < 1 or n_out < 1:
                raise ConfigError(f"--trace: {where}: token counts must be >= 1")
            out.append(Planned(_azure_time(row["TIMESTAMP"], where), n_in, n_out, meta={"trace_line": i}))
    return out


def load_trace(path: str | Path, *, block_tokens: int = 512, speed: float = 1.0) -> list[Planned]:
    """A trace file as a plan sorted by time, the first request at 0, offsets divided by ``speed``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--trace: file not found: {path}")
    if not speed > 0:
        raise ConfigError(f"--speed must be > 0, got {speed!r}")
    if block_tokens < 1:
        raise ConfigError(f"--block-tokens must be >= 1, got {block_tokens!r}")
    plan = read_azure(p) if p.suffix.lower() == ".csv" else read_mooncake(p, block_tokens)
    if not plan:
        raise ConfigError(f"--trace: {path} has no requests")
    plan.sort(key=lambda x: x.at_s)
    t0 = plan[0].at_s
    for x in plan:
        x.at_s = (x.at_s - t0) / speed
    return plan


def make_samples(out_dir: str | Path, *, n: int = 120, rate: float = 4.0, seed: int = 0,
                 block_tokens: int = 64) -> list[Path]:
    """Write ``mooncake-sample.jsonl`` and ``azure-sample.csv`` (seeded; Poisson arrivals at ``rate``). The
    Mooncake sample has 4 shared "system prompts" of 1-3 blocks, each request adding unique blocks."""
    rng = np.random.default_rng(seed)
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    t = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0 / rate, n - 1))))
    systems = [list(range(1000 * (s + 1), 1000 * (s + 1) + int(rng.integers(1, 4)))) for s in range(4)]
    next_id = 100_000
    lines = []
    for k in range(n):
        shared = systems[int(rng.integers(0, len(systems)))]
        own = int(rng.integers(1, 3))
        ids = shared + list(range(next_id, next_id + own))
        next_id += own
        n_in = (len(ids) - 1) * block_tokens + int(rng.integers(1, block_tokens + 1))
        lines.append(json.dumps({"timestamp": round(float(t[k]) * 1000), "input_length": n_in,
                                 "output_length": int(rng.integers(4, 17)), "hash_ids": ids}))
    moon = d / "mooncake-sample.jsonl"
    moon.write_text("\n".join(lines) + "\n", encoding="utf-8")
    az = d / "azure-sample.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    base = datetime(2023, 11, 16, 18, 0, 0).timestamp()
    for k in range(n):
        ts = datetime.fromtimestamp(base + float(t[k]))
        rows.append(f"{ts:%Y-%m-%d %H:%M:%S}.{ts.microsecond:06d}0,{int(rng.integers(16, 257))},"
                    f"{int(rng.integers(4, 17))}")
    az.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return [moon, az]


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.load.traces --make-sample DIR [--n N] [--rate R] [--seed K] [--block-tokens B]``."""
    ap = argparse.ArgumentParser(prog="python -m bench.load.traces", description="Write seeded sample traces.")
    ap.add_argument("--make-sample", metavar="DIR", required=True)
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-tokens", type=int, default=64)
    a = ap.parse_args(argv)
    for p in make_samples(a.make_sample, n=a.n, rate=a.rate, seed=a.seed, block_tokens=a.block_tokens):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
