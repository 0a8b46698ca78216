"""The ``gpu`` section of a cell from the GPU samples of its measured window(s). Pure (docs/gpu-telemetry.md).

A sample (:class:`GpuReading`; the samplers of :mod:`bench.server.gpu` make ``GpuReading`` objects) is one reading
of one GPU (NVML on this host, or a DCGM exporter's page). A cell's samples
come in windows (one per stretch of measured waves; a gate's re-measured waves or an A/B side's interleaved waves
add windows): energy is taken per window and added, so the time between windows never counts.

Energy of a GPU over a window: the delta of its energy counter (NVML ``nvmlDeviceGetTotalEnergyConsumption``,
DCGM ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) between the first and the last sample, where the counter exists,
never went down and moved; else power integrated over time (trapezoids between samples): an estimate, said so in
``energy_source`` and ``notes``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from bench.stats import percentile
from bench.warns import warning

__all__ = ["GpuReading", "summarize_gpu", "wave_tokens_per_joule", "comparison_notes", "THROTTLE_MASK", "REASON_BITS",
           "SERIES_MAX_POINTS", "WAVE_MIN_RESOLUTIONS", "CLOCK_DIFF_PCT", "THROTTLE_DIFF", "DISAGREE_PCT"]

WAVE_MIN_RESOLUTIONS = 10  # per-wave energy only for waves at least this many sampling resolutions long
CLOCK_DIFF_PCT = 2.0  # a gate says so when a cell's SM or memory clock p50 differs by more than this, %
THROTTLE_DIFF = 0.05  # ... or its throttle share by more than this (absolute: 5 % of the samples)
DISAGREE_PCT = 10.0  # a note when a GPU's counter and integrated power differ by more than this, %
SERIES_MAX_POINTS = 600  # (t, total power, mean SM clock) points kept per cell for the report

# NVML's clock event ("throttle") reason bits; DCGM's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS uses the same ones
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# what holds clocks below what the GPU was asked to run at: power cap, thermal and hardware slowdowns (idle, a
# clock setting made on purpose, sync boost and the display clock are not throttling)
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


class GpuReading(Protocol):
    """One reading of one GPU, as the summary reads it. ``t_s`` on ``time.monotonic()`` (the readings of one pass
    over the GPUs share it); any figure the GPU or the source does not give is None."""

    @property
    def t_s(self) -> float: ...
    @property
    def gpu(self) -> str: ...
    @property
    def power_w(self) -> float | None: ...
    @property
    def energy_j(self) -> float | None: ...  # the GPU's energy counter (since driver load or boot), joules
    @property
    def sm_clock_mhz(self) -> float | None: ...
    @property
    def mem_clock_mhz(self) -> float | None: ...
    @property
    def util_pct(self) -> float | None: ...
    @property
    def mem_used_mib(self) -> float | None: ...
    @property
    def temp_c(self) -> float | None: ...
    @property
    def reasons(self) -> int | None: ...  # clock event reasons, NVML's bit mask


def _r(v: float | None, digits: int = 3) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)


def _vals(samples: Sequence[GpuReading], name: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, name)) is not None]


def _integrated_j(samples: Sequence[GpuReading]) -> float | None:
    """Power integrated over one window's samples (trapezoids); None with fewer than two power readings."""
    pts = [(s.t_s, s.power_w) for s in samples if s.power_w is not None]
    if len(pts) < 2:
        return None
    return sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))


def _counter_j(samples: Sequence[GpuReading]) -> tuple[float | None, int]:
    """The energy counter's rise over one window and how many times it changed; None when it is absent, went down
    (a reset) or never moved."""
    es = [s.energy_j for s in samples if s.energy_j is not None]
    if len(es) < 2 or len(es) < len(samples):
        return None, 0
    changes = sum(1 for a, b in zip(es, es[1:]) if b != a)
    if any(b < a for a, b in zip(es, es[1:])) or changes == 0:
        return None, changes
    return es[-1] - es[0], changes


def _energy(windows: Sequence[Sequence[GpuReading]]) -> dict[str, Any]:
    """One GPU's energy over its windows: counter if every window has a usable one, else integrated power."""
    counter: float | None = 0.0
    integrated: float | None = 0.0
    changes = 0
    for w in windows:
        c, n = _counter_j(w)
        i = _integrated_j(w)
        changes += n
        counter = None if c is None or counter is None else counter + c
        integrated = None if i is None or integrated is None else integrated + i
    out: dict[str, Any] = {"energy_j_counter": _r(counter), "energy_j_integrated": _r(integrated),
                           "energy_counter_changes": changes}
    if counter is not None:
        out["energy_j"], out["energy_source"] = counter, "counter"
    elif integrated is not None:
        out["energy_j"], out["energy_source"] = integrated, "integrated"
    else:
        out["energy_j"], out["energy_source"] = None, None
    if counter and integrated:
        out["counter_vs_integrated_pct"] = _r((integrated - counter) / counter * 100, 2)
    return out


def _reason_shares(samples: Sequence[GpuReading]) -> dict[str, Any]:
    rs = [s.reasons for s in samples if s.reasons is not None]
    if not rs:
        return {"throttle_share": None}
    shares = {k: round(sum(1 for r in rs if r & bit) / len(rs), 4) for k, bit in REASON_BITS.items()}
    return {"throttle_share": round(sum(1 for r in rs if r & THROTTLE_MASK) / len(rs), 4),
            "reasons": {k: v for k, v in shares.items() if v}}


def _clocks(samples: Sequence[GpuReading]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("sm_clock_mhz", "mem_clock_mhz"):
        vs = _vals(samples, name)
        out[f"{name}_p5"] = _r(percentile(vs, 5), 1)
        out[f"{name}_p50"] = _r(percentile(vs, 50), 1)
    return out


def _window_s(windows: Sequence[Sequence[GpuReading]]) -> float:
    return sum(max(s.t_s for s in w) - min(s.t_s for s in w) for w in windows if w)


def _per_gpu(label: str, windows: Sequence[Sequence[GpuReading]], info: dict[str, Any]) -> dict[str, Any]:
    flat = [s for w in windows for s in w]
    power = _vals(flat, "power_w")
    util = _vals(flat, "util_pct")
    g: dict[str, Any] = {"gpu": label, **info, "samples": len(flat),
                         "power_w_mean": _r(sum(power) / len(power) if power else None, 2),
                         "power_w_max": _r(max(power) if power else None, 2)}
    g.update(_energy(windows))
    g["energy_j"] = _r(g["energy_j"])
    g.update(_clocks(flat))
    g["util_pct_mean"] = _r(sum(util) / len(util) if util else None, 1)
    mem, temp = _vals(flat, "mem_used_mib"), _vals(flat, "temp_c")
    g["mem_used_mib_max"] = _r(max(mem) if mem else None, 1)
    g["temp_c_max"] = _r(max(temp) if temp else None, 1)
    g.update(_reason_shares(flat))
    return g


def _series(windows: Sequence[Sequence[GpuReading]]) -> list[list[float | None]]:
    """``[t_s, total power W, mean SM clock MHz]`` per pass over the GPUs, t from the first sample."""
    flat = sorted((s for w in windows for s in w), key=lambda s: s.t_s)
    if not flat:
        return []
    t0 = flat[0].t_s
    by_t: dict[float, list[GpuReading]] = {}
    for s in flat:
        by_t.setdefault(s.t_s, []).append(s)
    pts: list[list[float | None]] = []
    for t, ss in by_t.items():
        p, c = _vals(ss, "power_w"), _vals(ss, "sm_clock_mhz")
        pts.append([round(t - t0, 3), _r(sum(p), 1) if p else None, _r(sum(c) / len(c), 0) if c else None])
    step = max(1, math.ceil(len(pts) / SERIES_MAX_POINTS))
    return pts[::step]


def _total_power_max(windows: Sequence[Sequence[GpuReading]]) -> float | None:
    sums: dict[float, float] = {}
    for w in windows:
        for s in w:
            if s.power_w is not None:
                sums[s.t_s] = sums.get(s.t_s, 0.0) + s.power_w
    return max(sums.values()) if sums else None


def _labels(windows: Sequence[Sequence[GpuReading]]) -> list[str]:
    seen = list(dict.fromkeys(s.gpu for w in windows for s in w))
    return sorted(seen, key=lambda x: (0, int(x), "") if x.isdigit() else (1, 0, x))


def _totals(gpus: list[dict[str, Any]], windows: Sequence[Sequence[GpuReading]]) -> dict[str, Any]:
    flat = [s for w in windows for s in w]
    sources = {g["energy_source"] for g in gpus}
    energy = None if None in sources else sum(g["energy_j"] for g in gpus)
    means = [g["power_w_mean"] for g in gpus if g["power_w_mean"] is not None]
    out: dict[str, Any] = {
        "power_w_mean": _r(sum(means), 2) if means else None, "power_w_max": _r(_total_power_max(windows), 2),
        "energy_j": _r(energy),
        "energy_source": None if energy is None else sources.pop() if len(sources) == 1 else "mixed",
    }
    out.update(_clocks(flat))
    out.update(_reason_shares(flat))
    out.pop("reasons", None)
    return out


def _notes(gpus: list[dict[str, Any]], out: dict[str, Any]) -> list[str]:
    notes = []
    est = [g["gpu"] for g in gpus if g["energy_source"] == "integrated"]
    if est:
        notes.append(f"energy of GPU {', '.join(est)} is power integrated over the samples (an estimate): no energy "
                     "counter, or it did not move during the cell (an exporter that refreshes less often than the "
                     "cell lasts; dcgm-exporter: -c 1000)")
    apart = [f"{g['gpu']} ({g['counter_vs_integrated_pct']:+.0f} %)" for g in gpus
             if abs(g.get("counter_vs_integrated_pct") or 0) > DISAGREE_PCT]
    if apart:
        notes.append(f"GPU {', '.join(apart)}: power integrated over the samples differs from the energy counter by "
                     f"more than {DISAGREE_PCT:g} % (the counter is used): samples too sparse for the cell, or a "
                     "source that refreshes power slowly")
    idle = [g["gpu"] for g in gpus if g.get("util_pct_mean") == 0]
    if idle and len(idle) < len(gpus):
        notes.append(f"GPU {', '.join(idle)} showed 0 % utilisation throughout: its power is in the totals "
                     "(--gpu-devices to leave it out)")
    elif idle:
        notes.append("no GPU showed any utilisation during the cell: the endpoint may not run on these GPUs (the "
                     "figures are then their idle power)")
    if out.get("energy_j") is None:
        notes.append("no energy: fewer than two power readings in the cell (a cell shorter than --gpu-interval)")
    return notes


def _per_token(out: dict[str, Any], output_tokens: int, prompt_tokens: int | None) -> None:
    e = out.get("energy_j")
    e = float(e) if isinstance(e, float | int) and e > 0 else None
    out["tokens_per_joule"] = _r(output_tokens / e, 5) if e and output_tokens else None
    out["joules_per_token"] = _r(e / output_tokens, 5) if e and output_tokens else None
    if prompt_tokens is not None:
        out["joules_per_prompt_token"] = _r(e / prompt_tokens, 6) if e and prompt_tokens else None


def summarize_gpu(windows: Sequence[Sequence[GpuReading]], *, output_tokens: int, prompt_tokens: int | None = None,
                  source: str = "", interval_s: float | None = None,
                  info: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The ``gpu`` dict of one cell (keys: docs/gpu-telemetry.md), or None when no sample came.

    Args:
        windows: the samples of each measured window (first = before the window's first wave, last = after).
        output_tokens: output tokens of the cell's successful requests (tokens per joule: these over the energy).
        prompt_tokens: uncached prompt tokens of a prefill cell (depth > 0): ``joules_per_prompt_token``.
        info: per GPU label, what the sampler knows of it (``name``, ``uuid``, ``host``).
    """
    windows = [w for w in windows if w]
    if not windows:
        return None
    by_gpu = {g: [[s for s in w if s.gpu == g] for w in windows] for g in _labels(windows)}
    gpus = [_per_gpu(g, [w for w in ws if w], (info or {}).get(g, {})) for g, ws in by_gpu.items()]
    out: dict[str, Any] = {"source": source, "interval_s": interval_s, "window_s": _r(_window_s(windows)),
                           "windows": len(windows), "samples": len({(s.t_s) for w in windows for s in w})}
    out.update(_totals(gpus, windows))
    _per_token(out, output_tokens, prompt_tokens)
    out["output_tokens"] = output_tokens
    if prompt_tokens is not None:
        out["prompt_tokens"] = prompt_tokens
    out["gpus"] = gpus
    out["series"] = _series(windows)
    out["notes"] = _notes(gpus, out)
    return out


# ---- per wave (the samples behind a gate rule on tokens_per_joule) --------------------------------------------------


def _at(curve: Sequence[tuple[float, float]], t: float) -> float | None:
    """The curve linearly interpolated at ``t``; None outside it."""
    for (t0, e0), (t1, e1) in zip(curve, curve[1:]):
        if t0 <= t <= t1:
            return e0 if t1 == t0 else e0 + (e1 - e0) * (t - t0) / (t1 - t0)
    return None


def _wave_energy(windows: Sequence[Sequence[GpuReading]], gpus: Sequence[str], t0: float, t1: float) -> float | None:
    """Joules of every GPU between ``t0`` and ``t1`` (inside one window), each GPU's energy counter interpolated."""
    for w in windows:
        if not w or not (w[0].t_s <= t0 and t1 <= w[-1].t_s):
            continue
        total = 0.0
        for g in gpus:
            curve = [(s.t_s, s.energy_j) for s in w if s.gpu == g and s.energy_j is not None]
            a, b = _at(curve, t0), _at(curve, t1)
            if a is None or b is None:
                return None
            total += b - a
        return total
    return None


def wave_tokens_per_joule(summary: dict[str, Any], windows: Sequence[Sequence[GpuReading]],
                          waves: Sequence[tuple[float, float, int]]) -> list[float] | None:
    """Output tokens per joule of each measured wave ``(start, end on time.monotonic(), output tokens)``, or None
    when a wave is shorter than :data:`WAVE_MIN_RESOLUTIONS` sampling resolutions (the interval, or how often the
    exporter's counter moved if that is slower) or some GPU's energy is not from its counter. Pure."""
    gpus = summary.get("gpus") or []
    if not gpus or not waves or any(g.get("energy_source") != "counter" for g in gpus):
        return None
    window_s = summary.get("window_s") or 0.0
    changes = min(g.get("energy_counter_changes") or 0 for g in gpus)
    resolution = max(summary.get("interval_s") or 0.0, window_s / changes if changes else math.inf)
    if min(t1 - t0 for t0, t1, _ in waves) < WAVE_MIN_RESOLUTIONS * resolution:
        return None
    out = []
    for t0, t1, tokens in waves:
        e = _wave_energy(windows, [g["gpu"] for g in gpus], t0, t1)
        if e is None or e <= 0:
            return None
        out.append(round(tokens / e, 5))
    return out


# ---- baseline against candidate (bench gate, bench compare) -------------------------------------------------------


def _clock_note(where: str, what: str, b: Any, c: Any) -> str | None:
    if not isinstance(b, int | float) or not isinstance(c, int | float) or b <= 0:
        return None
    pct = (c - b) / b * 100
    if abs(pct) <= CLOCK_DIFF_PCT:
        return None
    return warning("gpu-clock-moved", where=where, what=what, base=b, cand=c, pct=pct, limit=CLOCK_DIFF_PCT)


def _throttle_note(where: str, b: Any, c: Any) -> str | None:
    if not isinstance(b, int | float) or not isinstance(c, int | float) or abs(c - b) <= THROTTLE_DIFF:
        return None
    return warning("gpu-throttle-moved", where=where, base=b, cand=c, limit=THROTTLE_DIFF)


def _pairs(cid: str, b: dict[str, Any], c: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(where, baseline figures, candidate figures)``: per GPU label in both runs, else the cell's totals."""
    bg = {g.get("gpu"): g for g in b.get("gpus") or []}
    both = [(f"{cid}: GPU {g['gpu']}", bg[g.get("gpu")], g) for g in c.get("gpus") or [] if g.get("gpu") in bg]
    return both or [(f"{cid}: GPU", b, c)]


def comparison_notes(baseline: Sequence[Any], candidate: Sequence[Any]) -> list[str]:
    """Lines for a gate's verdict: per cell in both runs with GPU figures (``.id``, ``.gpu``) and per GPU seen in
    both, SM and memory clock p50 that differ by more than :data:`CLOCK_DIFF_PCT` % and throttle shares that
    differ by more than :data:`THROTTLE_DIFF`. Pure."""
    base = {c.id: c.gpu for c in baseline if c.gpu}
    out = []
    for cell in candidate:
        b, c = base.get(cell.id), cell.gpu
        if not b or not c:
            continue
        for where, x, y in _pairs(cell.id, b, c):
            notes = [_clock_note(where, "SM", x.get("sm_clock_mhz_p50"), y.get("sm_clock_mhz_p50")),
                     _clock_note(where, "memory", x.get("mem_clock_mhz_p50"), y.get("mem_clock_mhz_p50")),
                     _throttle_note(where, x.get("throttle_share"), y.get("throttle_share"))]
            out += [n for n in notes if n]
    return out
