"""Request sizes: input (prompt) and output token counts drawn from a distribution, or prompts from a dataset.

A size spec is a string (profile key or flag value):

* ``"128"`` or ``"fixed:128"``: every request 128 tokens;
* ``"uniform:64,256"``: integers uniform on [64, 256];
* ``"normal:512,64"``: mean 512, standard deviation 64, rounded;
* ``"lognormal:512,0.5"``: median 512, sigma 0.5 of the log (``exp(N(ln 512, 0.5))``), rounded.

Draws are clipped to [1, ``MAX_TOKENS``] and seeded (:func:`bench.load.arrivals.rng_for`). A dataset
(:func:`load_dataset`) is a JSONL file, one object per line with ``"prompt"`` (text sent as is, after bench's unique
prefix) and optionally ``"output_tokens"``; requests take its lines in a seeded random order, cycling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.errors import ConfigError

__all__ = ["SizeDist", "parse_size", "DatasetPrompt", "load_dataset", "dataset_order", "MAX_TOKENS"]

MAX_TOKENS = 10_000_000
_KINDS = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}


@dataclass(frozen=True, slots=True)
class SizeDist:
    """A token-count distribution: ``kind`` in fixed/uniform/normal/lognormal and its parameters."""

    kind: str
    a: float
    b: float = 0.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` integer sizes (int64), clipped to [1, MAX_TOKENS]."""
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, n).astype(float)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, n)
        else:
            x = np.exp(rng.normal(np.log(self.a), self.b, n))
        out: np.ndarray = np.clip(np.rint(x), 1, MAX_TOKENS).astype(np.int64)
        return out

    @property
    def label(self) -> str:
        """The spec back as text (``fixed:128``, ``uniform:64,256``)."""
        if self.kind == "fixed":
            return str(int(self.a))
        return f"{self.kind}:{self.a:g},{self.b:g}"


def parse_size(spec: str | int, flag: str) -> SizeDist:
    """Parse a size spec (module docstring). Raises ConfigError naming ``flag``."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = str(spec)
    if not isinstance(spec, str):
        raise ConfigError(f"{flag}: {spec!r} is not a size (128, uniform:64,256, normal:512,64, lognormal:512,0.5)")
    s = spec.strip().lower()
    kind, _, params = s.partition(":") if ":" in s else ("fixed", "", s)
    if kind not in _KINDS:
        raise ConfigError(f"{flag}: unknown distribution {kind!r} (fixed, uniform, normal, lognormal)")
    try:
        vals = [float(v) for v in params.split(",")]
    except ValueError:
        raise ConfigError(f"{flag}: {spec!r}: parameters must be numbers") from None
    if len(vals) != _KINDS[kind]:
        raise ConfigError(f"{flag}: {kind} takes {_KINDS[kind]} number(s), got {spec!r}")
    d = SizeDist(kind, *vals)
    bad = {
        "fixed": not 1 <= d.a <= MAX_TOKENS or d.a != int(d.a),
        "uniform": not 1 <= d.a <= d.b <= MAX_TOKENS,
        "normal": not (d.a >= 1 and d.b >= 0),
        "lognormal": not (d.a >= 1 and d.b >= 0),
    }[kind]
    if bad:
        raise ConfigError(f"{flag}: {spec!r} is out of range (sizes are whole tokens >= 1; spreads >= 0; "
                          "uniform needs low <= high)")
    return d


@dataclass(frozen=True, slots=True)
class DatasetPrompt:
    """One dataset line: the prompt text and its output length (None: the run's)."""

    text: str
    output_tokens: int | None = None


def load_dataset(path: str | Path, flag: str = "--dataset") -> list[DatasetPrompt]:
    """Read a JSONL prompt dataset. Raises ConfigError naming the line of the first bad one."""
    out: list[DatasetPrompt] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ConfigError(f"{flag}: cannot read {path}: {e.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError:
            raise ConfigError(f"{flag}: {path}:{i} is not JSON") from None
        if not isinstance(d, dict) or not isinstance(d.get("prompt"), str):
            raise ConfigError(f"{flag}: {path}:{i} needs a string \"prompt\"")
        ot = d.get("output_tokens")
        if ot is not None and not (isinstance(ot, int) and not isinstance(ot, bool) and ot >= 1):
            raise ConfigError(f"{flag}: {path}:{i}: output_tokens must be an int >= 1")
        out.append(DatasetPrompt(d["prompt"], ot))
    if not out:
        raise ConfigError(f"{flag}: {path} has no prompts")
    return out


def dataset_order(n_items: int, n: int, rng: np.random.Generator) -> list[int]:
    """Indexes of ``n`` requests into a dataset of ``n_items``: seeded permutations, one after another."""
    out: list[int] = []
    while len(out) < n:
        out.extend(int(i) for i in rng.permutation(n_items))
    return out[:n]
