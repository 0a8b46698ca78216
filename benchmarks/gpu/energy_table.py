"""The energy table of runs made with GPU telemetry (issue 29, docs/gpu-telemetry.md): per cell, speed beside
power, energy, tokens per joule and clocks, and whether the energy counter and the integrated power agree.

usage: python benchmarks/gpu/energy_table.py [--out FILE.md] [--bound-pct 2] RESULTS [RESULTS...]

RESULTS: a results.json, or a folder holding one. The H200 check (still to be run) is, with llama-server serving
the random 8B model of run_h200.sh on the GPU and nvidia-ml-py importable (its wheel is pure Python: put
``nvidia_ml_py-13.615.71-py3-none-any.whl`` in .carry/, which run_h200.sh puts on PYTHONPATH)::

    bench run http://127.0.0.1:8090/v1 -p decode --streams 1,2,4,8 --gpu-telemetry nvml --out res/energy-decode
    bench run http://127.0.0.1:8090/v1 -p depth --depths 0,32k --gpu-telemetry nvml --out res/energy-depth
    python benchmarks/gpu/energy_table.py --out benchmarks/results/gpu-energy-<date>-h200.md res/energy-*
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.results import Results, load_results

BOUND_PCT = 2.0  # the bound: energy counter and integrated power agree within 2 %


def _f(v: Any, digits: int = 1) -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:,.{digits}f}"


def agreement(gpu: dict[str, Any]) -> float | None:
    """The largest |integrated - counter| / counter over the cell's GPUs, in %; None without both."""
    pcts = [abs(g["counter_vs_integrated_pct"]) for g in gpu.get("gpus") or []
            if isinstance(g.get("counter_vs_integrated_pct"), int | float)]
    return max(pcts) if pcts else None


def rows(name: str, results: Results, bound_pct: float) -> list[str]:
    """Markdown rows, one per cell with GPU figures."""
    out = []
    for c in results.cells:
        g = c.gpu
        if not g:
            continue
        agree = agreement(g)
        ok = "-" if agree is None else ("yes" if agree <= bound_pct else "**no**")
        est = "" if g.get("energy_source") == "counter" else " (est.)"
        out.append(
            f"| {name} | {c.id} | {c.streams} | {c.depth} | {_f(c.stat('aggregate_decode_tok_s'))} | "
            f"{_f(c.stat('prompt_tok_s'), 0) if c.depth else '-'} | {_f(g.get('power_w_mean'), 0)} / "
            f"{_f(g.get('power_w_max'), 0)} | {_f(g.get('energy_j'), 0)}{est} | {_f(agree, 2)} ({ok}) | "
            f"{_f(g.get('tokens_per_joule'), 3)} | {_f(g.get('joules_per_token'), 4)} | "
            f"{_f(g.get('joules_per_prompt_token'), 5)} | {_f(g.get('sm_clock_mhz_p5'), 0)} / "
            f"{_f(g.get('sm_clock_mhz_p50'), 0)} | {_f(g.get('throttle_share'), 3)} |")
    return out


HEAD = ("| run | cell | streams | depth | aggregate tok/s p50 | prompt tok/s p50 | power W mean / max | energy J | "
        "counter vs integrated % (within bound) | tok/J | J/token | J/prompt token | SM MHz p5 / p50 | throttled |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def table(paths: list[Path], bound_pct: float = BOUND_PCT) -> str:
    """The whole Markdown page for these results files."""
    lines = ["# GPU energy per token", "",
             f"Energy counter against integrated power: agreement bound {bound_pct:g} % (the largest over a cell's "
             "GPUs). Definitions: docs/gpu-telemetry.md.", "", HEAD]
    for p in paths:
        f = p / "results.json" if p.is_dir() else p
        r = load_results(f)
        gpus = {g.get("name") for c in r.cells if c.gpu for g in c.gpu.get("gpus") or []} - {None}
        lines += rows(f"{f.parent.name} ({', '.join(sorted(gpus)) or 'GPU'}, {r.endpoint.model})", r, bound_pct)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--bound-pct", type=float, default=BOUND_PCT)
    a = ap.parse_args(argv)
    text = table(a.results, a.bound_pct)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
