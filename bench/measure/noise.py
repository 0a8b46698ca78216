"""Noise shown, not hidden: each cell's spread across its waves and whether its confidence interval meets the
profile's ``target_ci`` (pure). (The llama-server ``--cache-ram`` note is a cell warning of :mod:`bench.measure.summary`.)

:func:`cell_noise` gives the cell's ``noise`` dict (definitions in docs/health.md): the per-wave medians of the
per-stream decode rate, their spread and coefficient of variation, the 95 % bootstrap CI half-width of the cell's
median decode rate (the statistic ``target_ci`` bounds, as the run loop computes it), whether that is wider than
``target_ci``, and how many waves would meet it (the half-width falls like ``1/sqrt(waves)``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.measure.metrics import RequestMetrics, ok_metrics_by_wave
from bench.stats import bootstrap_ci
from bench.warns import warning

__all__ = ["cell_noise", "wave_medians", "noise_warnings"]


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def wave_medians(metrics: Sequence[RequestMetrics], waves: Sequence[Sequence[str]]) -> list[float]:
    """The median per-stream decode tok/s of each measured wave (``metrics``: the cell's requests'; waves without a
    successful request left out)."""
    out = []
    for ms in ok_metrics_by_wave(metrics, waves):
        vals = [m.decode_tok_s for m in ms if m.decode_tok_s]
        if vals:
            out.append(_median(vals))
    return out


def cell_noise(per_wave: Sequence[float], values: Sequence[float], target_ci: float,
               metric: str = "decode_tok_s") -> dict[str, Any]:
    """The ``noise`` dict of one cell.

    Args:
        per_wave: the metric's median in each measured wave (:func:`wave_medians`).
        values: the metric's per-request samples of the cell (``summary["samples"]["decode_tok_s"]``).
        target_ci: the profile's ``target_ci`` (a fraction of the median; 0 = no target).
        metric: the metric's name (recorded in the dict).

    Returns ``{"metric", "waves", "wave_medians", "spread_pct", "cv_pct", "ci_half_pct", "target_ci_pct",
    "ci_wide", "waves_needed"}``; percentages of the cell's median, None where there are too few values (spread
    and CV need 2 waves, the CI 3 requests). ``ci_wide`` is true when a target is set and the half-width exceeds
    it; ``waves_needed`` is then ``ceil(waves * (ci_half / target)^2)``, else None.
    """
    w = [float(x) for x in per_wave]
    vs = [float(x) for x in values if x]
    med = _median(vs) if vs else None
    spread = cv = half = None
    if len(w) >= 2 and med:
        spread = (max(w) - min(w)) / med * 100.0
        mean = sum(w) / len(w)
        sd = math.sqrt(sum((x - mean) ** 2 for x in w) / (len(w) - 1))
        cv = sd / mean * 100.0 if mean else None
    if len(vs) >= 3 and med:
        lo, hi = bootstrap_ci(vs)
        half = (hi - lo) / 2 / med * 100.0
    target = target_ci * 100.0 if target_ci > 0 else None
    wide = bool(target is not None and half is not None and half > target)
    need = None
    if wide and half is not None and target is not None:
        need = max(math.ceil(max(len(w), 1) * (half / target) ** 2 - 1e-9), len(w) + 1)
    return {"metric": metric, "waves": len(w), "wave_medians": [round(x, 3) for x in w], "spread_pct": _r(spread),
            "cv_pct": _r(cv), "ci_half_pct": _r(half), "target_ci_pct": target, "ci_wide": wide, "waves_needed": need}


def noise_warnings(cell_id: str, noise: Mapping[str, Any], max_waves: int | None = None) -> list[str]:
    """A warning when the cell's CI is wider than ``target_ci``, with the waves that would meet it."""
    if not noise.get("ci_wide"):
        return []
    need = noise.get("waves_needed")
    fix = f"about {need} waves would meet it"
    if max_waves is not None and need is not None and need > max_waves:
        fix += f" (raise max_waves = {max_waves} to {need})"
    return [warning("wide-ci", cell_id, metric=noise.get("metric"), half=noise["ci_half_pct"],
                    target=noise["target_ci_pct"] / 100, waves=noise["waves"], spread=noise.get("spread_pct") or 0,
                    fix=fix)]

