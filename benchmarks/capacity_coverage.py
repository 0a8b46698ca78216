"""Coverage of ``bench capacity --by rate``: seeded searches against the sim's engine model, per case the boundary
error vs the sim's steady-state truth, the share within 2 %, the share of intervals that cover the truth, the
median interval width and the search time (issue 24).

Each search is :func:`bench.load.capacity.search` driving :class:`bench.load.capacity_model.ModelPoints`: the
schedules bench would send (same arrival process, seeds, sizes), the sim's scheduler replayed exactly
(:func:`bench.sim.truth.simulate_load`) in virtual time, and the same point statistics as a live point. So the
"time" column is the virtual time the search would take against ``bench sim`` (schedules + drains + 0.5 s per
point), not this script's run time. The truth: :func:`truth` (pooled long runs around a first guess).

    python benchmarks/capacity_coverage.py --searches 20 --duration 50 --jobs 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config.slo import parse_slo  # noqa: E402
from bench.load.capacity import SearchSettings, search  # noqa: E402
from bench.load.capacity_model import ModelPoints  # noqa: E402
from bench.load.capacity_points import default_time_budget  # noqa: E402
from bench.load.point import LoadSettings  # noqa: E402
from bench.sim import truth as T  # noqa: E402
from bench.sim.config import SimConfig  # noqa: E402

Shape = tuple[SimConfig, int, int, dict[str, tuple[str, float, tuple[float, float]]]]
SHAPES: dict[str, Shape] = {
    # the "Slow" problem: t(b) = 40 + 2b ms, prefill 20,000 tok/s, 200 prompt / 16 output tokens, 256 slots
    "A": (SimConfig(decode_step_ms=40, decode_step_ms_per_seq=2, prefill_tok_s=20000), 200, 16,
          {"ttft": ("ttft_p90=300ms", 300.0, (15, 31)), "tpot": ("tpot_p90=150ms", 150.0, (8, 31))}),
    # the queueing shape: 4 slots, t(b) = 20 + b ms, no prefill, 32 prompt / 8 output tokens
    "B": (SimConfig(decode_step_ms=20, decode_step_ms_per_seq=1, max_running=4, prefill_tok_s=1e12), 32, 8,
          {"ttft": ("ttft_p90=300ms", 300.0, (5, 20.9)), "tpot": ("tpot_p90=23.8ms", 23.8, (1, 20.9))}),
}
ARRIVALS = {"poisson": ("poisson", 1.0), "gamma0.5": ("gamma", 0.5), "constant": ("constant", 1.0)}


def truth(shape: str, metric: str, arrival: str, horizon: float) -> list[float]:
    """The steady-state boundary. Constant arrivals: :func:`bench.sim.truth.slo_boundary_rps` over 240 s (the
    response is deterministic). Random arrivals: a first guess by that bisection over ``horizon`` s (seed 0), then
    the long-run share over the limit at 0.95, 1 and 1.05 times it, each pooled over ``TRUTH_SEEDS`` runs of
    ``TRUTH_RUN_S`` s less their first ``TRUTH_SKIP_S``, and the crossing of ``alpha`` by the quadratic in
    logit(share) vs log(rate) through those three (a bisection on one seed's noisy share wanders by up to 2 % for
    gamma arrivals). With 6 seeds its error was up to 0.7 % (B-ttft-gamma0.5: 14.368 with seeds 10-15, 14.467 with
    10-45; benchmarks/results/capacity_truth-2026-12-05-vm.json), so 36 are used."""
    cfg, pt, ot, objs = SHAPES[shape]
    _, limit, (lo, hi) = objs[metric]
    kind, burst = ARRIVALS[arrival]
    if kind == "constant":
        return [T.slo_boundary_rps(cfg, metric, limit, pt, ot, kind=kind, burstiness=burst, horizon_s=240.0, lo=lo,
                                   hi=hi, rel_tol=5e-4)]
    t0 = T.slo_boundary_rps(cfg, metric, limit, pt, ot, kind=kind, burstiness=burst, seed=0, horizon_s=horizon, lo=lo,
                            hi=hi, rel_tol=5e-4)
    fs = (0.95, 1.0, 1.05)
    ys = []
    for f in fs:
        over = n = 0
        for seed in TRUTH_SEEDS:
            arr = T.load_arrivals_ns(f * t0, TRUTH_RUN_S, kind, seed, burst)
            sim = T.simulate_load(cfg, arr, pt, ot)
            a, first, last = (np.asarray(v, dtype=float) for v in (arr, sim["first_ns"], sim["last_ns"]))
            keep = a >= TRUTH_SKIP_S * 1e9
            v = (first - a) / 1e6 if metric == "ttft" else (last - first) / 1e6 / (ot - 1)
            over += int((v[keep] > limit).sum())
            n += int(keep.sum())
        ys.append(math.log(over / (n - over)))
    a2, b1, c0 = np.polyfit([math.log(f) for f in fs], ys, 2)
    roots = np.roots([a2, b1, c0 - math.log(1 / 9)])
    real = roots[np.isreal(roots)].real
    return [round(t0 * math.exp(float(real[np.argmin(np.abs(real))])), 4)]


TRUTH_SEEDS = range(10, 46)  # 36 runs: with 6 (capacity_truth-2026-12-02-vm.json) B-ttft-gamma0.5 came out 0.7 % low
TRUTH_RUN_S = 3000.0
TRUTH_SKIP_S = 300.0


def one_search(args: tuple[str, str, str, int, float, float | None, float]) -> dict[str, Any]:
    shape, metric, arrival, seed, duration, budget, width = args
    cfg, pt, ot, objs = SHAPES[shape]
    slo = objs[metric][0]
    kind, burst = ARRIVALS[arrival]
    ls = LoadSettings(duration_s=duration, input_tokens=str(pt), slo=slo, seed=seed, arrival=kind, burstiness=burst)
    mp = ModelPoints(cfg, ls, parse_slo(slo), max_tokens=ot)
    ss = SearchSettings(time_budget_s=budget, target_width=width, refine_s=duration)  # as bench capacity sets it
    doc = asyncio.run(search(ss, mp, clock=mp.clock))
    return {"boundary": doc["boundary"], "interval": doc["interval"], "confidence": doc["confidence"],
            "elapsed_s": doc["elapsed_s"], "points": len(doc["points"]), "note": doc["note"]}


def summarize(rows: list[dict[str, Any]], t: float) -> dict[str, Any]:
    errs = [r["boundary"] / t - 1 if r["boundary"] else math.inf for r in rows]
    calibrated = [r for r in rows if r["confidence"] is not None]
    cov = [r["interval"][0] <= t <= r["interval"][1] for r in calibrated]
    widths = [r["interval"][1] / r["interval"][0] - 1 for r in rows if r["interval"][0] and r["interval"][1]]
    return {"n": len(rows), "within_2pct": sum(abs(e) <= 0.02 for e in errs) / len(rows),
            "median_abs_err": statistics.median(abs(e) for e in errs), "mean_err": statistics.fmean(
                e for e in errs if math.isfinite(e)), "calibrated": len(calibrated),
            "coverage": sum(cov) / len(cov) if cov else None,
            "coverage_all": sum(r["interval"][0] is not None and r["interval"][1] is not None
                                and r["interval"][0] <= t <= r["interval"][1] for r in rows) / len(rows),
            "median_width": statistics.median(widths) if widths else None,
            "median_time_s": statistics.median(r["elapsed_s"] for r in rows),
            "max_time_s": max(r["elapsed_s"] for r in rows)}


def _pct(v: float | None, d: int = 1) -> str:
    return "-" if v is None else f"{100 * v:.{d}f} %"


def _budget(flag: str, arrival: str) -> float | None:
    """``--time-budget``: a number of seconds, or ``default`` (bench capacity's for the case's arrivals)."""
    return default_time_budget("rate", *ARRIVALS[arrival]) if flag == "default" else float(flag)


HEADER = ("| case | SLO | truth req/s (seeds) | within 2 % | median abs err | mean err | calibrated | coverage "
          "| coverage (all) | median width | median time s | max time s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def _row(case: str, truths: list[float], sm: dict[str, Any]) -> str:
    """One case's line of the table: ``sm``, its searches' :func:`summarize` on the mean of ``truths``."""
    shape, metric, _ = case.split("-")
    t = statistics.fmean(truths)
    return (f"| {case} | {SHAPES[shape][3][metric][0]} | {t:.3f} ({', '.join(f'{x:.3f}' for x in truths)}) "
            f"| {_pct(sm['within_2pct'], 0)} | {_pct(sm['median_abs_err'])} | {_pct(sm['mean_err'])} "
            f"| {sm['calibrated']}/{sm['n']} | {_pct(sm['coverage'], 0)} | {_pct(sm['coverage_all'], 0)} "
            f"| {_pct(sm['median_width'])} | {sm['median_time_s']:.0f} | {sm['max_time_s']:.0f} |")


def pooled(files: list[Path]) -> int:
    """``--pool``: one table over the searches of several ``--json`` outputs, case by case."""
    docs = [json.loads(f.read_text()) for f in files]
    print(HEADER)
    for case in docs[0]["cases"]:
        have = [d["cases"][case] for d in docs if case in d["cases"]]
        truths = have[0]["truth"]
        print(_row(case, truths, summarize([r for h in have for r in h["searches"]], statistics.fmean(truths))))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=20, help="per case (0: only compute, store and print the truths)")
    ap.add_argument("--duration", type=float, default=60.0, help="refine point duration (--duration), s")
    ap.add_argument("--time-budget", default="default", help="seconds per search, or default: what bench capacity "
                    "picks for the case's arrivals (bench.load.capacity_points.default_time_budget)")
    ap.add_argument("--truth-horizon", type=float, default=1000.0, help="the first guess's horizon, s")
    ap.add_argument("--target-width", type=float, default=SearchSettings().target_width,
                    help="stop refining at this interval width (--target-width)")
    ap.add_argument("--seed-step", type=int, default=1,
                    help="search i runs with seed i * this; a search's points use seed, seed + 1, ... so with 1 "
                    "neighbouring searches share most arrival streams (not independent); 100 keeps them apart")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cases", default="all", help="comma list like A-ttft-poisson (default: all 12)")
    ap.add_argument("--json", type=Path, help="write every search and the table here")
    ap.add_argument("--truth-cache", type=Path, help="read the truths from this JSON file if it exists, else write "
                    "them there")
    ap.add_argument("--pool", type=Path, nargs="+", help="run nothing: print one table of the searches of these "
                    "--json files together, case by case (for example two seed sets)")
    a = ap.parse_args(argv)
    if a.pool:
        return pooled(a.pool)
    cases = [(s, m, ar) for s in SHAPES for m in ("ttft", "tpot") for ar in ARRIVALS]
    if a.cases != "all":
        want = set(a.cases.split(","))
        cases = [c for c in cases if "-".join(c) in want]
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as pool:
        cached = json.loads(a.truth_cache.read_text()) if a.truth_cache and a.truth_cache.exists() else {}
        todo = [c for c in cases if "-".join(c) not in cached]
        got = dict(zip(todo, pool.map(truth, *zip(*todo), [a.truth_horizon] * len(todo)))) if todo else {}
        truths = {c: cached["-".join(c)] if c not in got else got[c] for c in cases}
        if a.truth_cache:
            a.truth_cache.write_text(json.dumps({**cached, **{"-".join(c): v for c, v in got.items()},
                                                 "horizon_s": a.truth_horizon}, indent=1) + "\n")
        if a.searches == 0:
            print("\n".join(f"{'-'.join(c)}: {v[0]}" for c, v in truths.items()))
            return 0
        jobs = [(s, m, ar, seed, a.duration, _budget(a.time_budget, ar), a.target_width) for (s, m, ar) in cases
                for seed in range(0, a.searches * a.seed_step, a.seed_step)]
        results = list(pool.map(one_search, jobs, chunksize=2))
    out: dict[str, Any] = {"argv": sys.argv, "cases": {}}
    print(HEADER)
    for c in cases:
        rows = [r for j, r in zip(jobs, results) if j[:3] == c]
        sm = summarize(rows, statistics.fmean(truths[c]))
        out["cases"]["-".join(c)] = {"truth": truths[c], "summary": sm, "searches": rows}
        print(_row("-".join(c), truths[c], sm), flush=True)
    print(f"(wall {time.time() - t0:.0f} s for {len(jobs)} searches)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
