"""Fairness of ``bench gate``: does it fire on a real regression and stay quiet on noise?

Runs N repeated gates (default 20) against bench's reference server (``bench sim``, one process per speed) for
three scenarios, each gate comparing a fresh baseline run with a fresh candidate run:

* same       candidate = the same sim as the baseline                     -> should pass     (>= 19 of 20)
* 10% slower candidate decode tok/s x 0.90 (decode step / 0.90)           -> should fail (1) (>= 19 of 20)
* 3% slower  candidate decode tok/s x 0.97, allowance 5 %                 -> not a regression (>= 19 of 20)

The gate rules are those of the profile below: decode_tok_s median may drop 5 % in every cell, aggregate decode
median 5 % in the 4-stream cell, and TTFT p90 may rise 10 % after a 2K prompt (a metric the slowdown should not
trip). ``--noisy`` repeats the scenarios on a sim with speculative-decoding-like output (1-3 tokens per event drawn
at random per step), whose per-request decode rate varies ~10 %. ``--synthetic`` adds a Monte Carlo of the verdict
rule alone on lognormal samples, comparing bench's statistic (trimmed Harrell-Davis median, expanded percentile
bootstrap) with the plain sample median and percentile bootstrap.

    python benchmarks/gate_fairness.py                  # the three sim scenarios, N = 20 (about 6-8 minutes)
    python benchmarks/gate_fairness.py --n 5 --noisy    # quicker, with the noisy sim too
    python benchmarks/gate_fairness.py --synthetic-only # the Monte Carlo alone (about a minute)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simproc import SimProcess  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from bench.client import ClientSettings
from bench.config.profile import parse_profile  # noqa: E402
from bench.driver import run_gate, run_profile  # noqa: E402
from bench.gate import Rule, classify, profile_rules  # noqa: E402
from bench.stats import bootstrap_ratio_ci  # noqa: E402

STEP_MS = 5.0  # decode step of the baseline sim: 200 tok/s per stream
PROFILE = {
    "max_tokens": 32,
    "requests": 8,
    "warmup": 1,
    "overhead_probes": 1,
    "gate_budget_waves": 8,
    "sweep": [
        {"name": "decode", "depths": [0], "streams": [1]},
        {"name": "batch", "depths": [0], "streams": [4], "requests": 32},
        {"name": "depth", "depths": ["2k"], "streams": [1]},
    ],
    "gate": [
        {"metric": "decode_tok_s", "cell": "*", "stat": "median", "max_drop_pct": 5},
        {"metric": "aggregate_decode_tok_s", "cell": "d0-s4-prose", "stat": "median", "max_drop_pct": 5},
        {"metric": "ttft_ms", "cell": "d2048-s1-prose", "stat": "p90", "max_rise_pct": 10},
    ],
}
SCENARIOS = [  # name, decode speed factor (candidate / baseline), what a fair gate does, exit codes that satisfy it
    ("same", 1.00, "pass", (0,)),
    ("10% slower", 0.90, "regression", (1,)),
    ("3% slower", 0.97, "not a regression", (0, 2)),
]


@contextmanager
def sim_process(step_ms: float, tokens_per_event: str, seed: int) -> Iterator[str]:
    """A ``python -m bench.sim`` process on a free port; yields its base URL."""
    with SimProcess(decode_step_ms=f"{step_ms:.6f}", prefill_tok_s=20000, tokens_per_event=tokens_per_event,
                    seed=seed) as sim:
        yield sim.base


async def _scenarios(urls: dict[str, str], n: int, label: str) -> dict[str, list]:
    prof = parse_profile(PROFILE, "fairness")
    rules, _ = profile_rules(prof.gate)
    settings = ClientSettings()
    out: dict[str, list] = {name: [] for name, *_ in SCENARIOS}
    for rep in range(n):
        t0 = time.monotonic()
        baseline = await run_profile(urls["same"], prof, settings, out_dir=None)
        order = SCENARIOS[rep % 3:] + SCENARIOS[:rep % 3]  # rotate, so no scenario always runs first
        codes = []
        for name, *_ in order:
            o = await run_gate(urls[name], prof, settings, baseline, rules)
            dec = [v for v in o.verdicts if v.rule.metric == "decode_tok_s" and v.cell == "d0-s1-prose"][0]
            out[name].append((o.code, o.extra_waves, dec.ratio, dec.lo, dec.hi,
                              [f"{v.verdict} {v.name}" for v in o.verdicts if v.failed]))
            codes.append(f"{name}={o.code}")
        print(f"  {label} gate {rep + 1}/{n}: {' '.join(codes)}  ({time.monotonic() - t0:.1f} s)", file=sys.stderr,
              flush=True)
    return out


def run_sim_scenarios(n: int, noisy: bool, steady: bool = True) -> None:
    """Run and print the sim scenarios (steady, and noisy when asked)."""
    variants = ([("steady", "1")] if steady else []) + ([("noisy", "1,2,3")] if noisy else [])
    for label, tpe in variants:
        print(f"\n== bench gate on bench sim ({label}: tokens per event {tpe}; decode step {STEP_MS} ms; "
              f"N = {n} gates per scenario) ==", flush=True)
        t0 = time.monotonic()
        with sim_process(STEP_MS, tpe, 1) as same, \
                sim_process(STEP_MS / 0.90, tpe, 2) as slow10, \
                sim_process(STEP_MS / 0.97, tpe, 3) as slow3:
            res = asyncio.run(_scenarios({"same": same, "10% slower": slow10, "3% slower": slow3}, n, label))
        head = (f"{'scenario':<11} {'wanted':<17} {'pass(0)':>7} {'regr(1)':>7} {'inconc(2)':>9} {'fair':>6} "
                f"{'met':>4}  {'decode ratio d0-s1 (median; CI lo..hi range)':<44} {'extra waves':>11}")
        print(head)
        print("-" * len(head))
        for name, _factor, wanted, ok_codes in SCENARIOS:
            rows = res[name]
            c = Counter(r[0] for r in rows)
            fair = sum(c[k] for k in ok_codes)
            need = math.ceil(0.95 * len(rows))
            ratios = [r[2] for r in rows if r[2] is not None]
            los = [r[3] for r in rows if r[3] is not None]
            his = [r[4] for r in rows if r[4] is not None]
            rtxt = (f"{np.median(ratios):.3f}; {min(los):.3f}..{max(his):.3f}" if ratios else "-")
            print(f"{name:<11} {wanted:<17} {c[0]:>7} {c[1]:>7} {c[2]:>9} {fair:>3}/{len(rows):<2} "
                  f"{'yes' if fair >= need else 'NO':>4}  {rtxt:<44} {np.mean([r[1] for r in rows]):>11.1f}")
        print(f"({time.monotonic() - t0:.0f} s; true decode ratios 1.000, 0.900, 0.970; limit 0.950)")
        for name, *_ in SCENARIOS:
            fails = Counter(f for r in res[name] for f in r[5])
            if fails:
                print(f"  {name}: failing verdicts over the {len(res[name])} gates: "
                      + ", ".join(f"{k} x{v}" for k, v in fails.most_common()))


# --- synthetic Monte Carlo of the verdict rule ----------------------------------------------------------------------


def _plain_median_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, resamples: int = 4000
                     ) -> tuple[float, float]:
    ra = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    lo, hi = np.quantile(rb / ra, [0.025, 0.975])
    return float(lo), float(hi)


def _draw(rng: np.random.Generator, n: int, cv: float, scale: float) -> np.ndarray:
    """Lognormal samples with coefficient of variation ``cv``; 1 in 16 is a hiccup 15 % slower."""
    s = math.sqrt(math.log(1 + cv * cv))
    x = scale * np.exp(rng.normal(-s * s / 2, s, n))
    return np.where(rng.random(n) < 1 / 16, x * 0.85, x)


def run_synthetic(trials: int) -> None:
    """Monte Carlo of one gate verdict (decode median, 5 % allowance, one re-measure round of +n candidate
    samples when inconclusive) for both statistics; prints pass / regression / inconclusive rates."""
    rule = Rule("decode_tok_s", "*", "median", 5.0)
    print(f"\n== synthetic: one decode_tok_s median rule, allowance 5 %, {trials} trials per row; lognormal noise, "
          "1/16 hiccups at -15 %; inconclusive -> +n candidate samples once ==")
    head = f"{'method':<34} {'n':>3} {'cv':>5} " + " ".join(f"{f'r={t:.2f} pass/regr/inc':>24}" for t in
                                                           (1.0, 0.97, 0.95, 0.90))
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(12345)
    for n in (8, 16):
        for cv in (0.01, 0.03, 0.05):
            for method in ("sample median, percentile", "bench: trimmed HD, expanded pct"):
                cells = []
                for true in (1.0, 0.97, 0.95, 0.90):
                    c: Counter[str] = Counter()
                    for t in range(trials):
                        a, b = _draw(rng, n, cv, 100.0), _draw(rng, n, cv, 100.0 * true)
                        for look in range(2):
                            if method.startswith("bench"):
                                lo, hi = bootstrap_ratio_ci(list(a), list(b), "median", seed=[7, t, look])[3:]
                            else:
                                lo, hi = _plain_median_ci(a, b, rng)
                            v = classify(rule, lo, hi)
                            if v != "inconclusive" or look == 1:
                                break
                            b = np.concatenate([b, _draw(rng, n, cv, 100.0 * true)])
                        c["regression" if v == "regression" else "inconclusive" if v == "inconclusive" else "pass"] += 1
                    cells.append(f"{c['pass'] / trials:>6.1%}/{c['regression'] / trials:>6.1%}/"
                                 f"{c['inconclusive'] / trials:>6.1%}")
                print(f"{method:<34} {n:>3} {cv:>5.0%} " + " ".join(f"{x:>24}" for x in cells), flush=True)
    print("A fair rule: r=1.00 mostly pass, r=0.97 never regression, r=0.95 (on the limit) regression <= 2.5 %, "
          "r=0.90 mostly regression.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20, help="gates per scenario (default 20)")
    ap.add_argument("--noisy", action="store_true", help="also run the scenarios on a noisy sim (1-3 tokens/event)")
    ap.add_argument("--noisy-only", action="store_true", help="only the noisy sim scenarios")
    ap.add_argument("--synthetic", action="store_true", help="also run the synthetic Monte Carlo")
    ap.add_argument("--synthetic-only", action="store_true", help="only the synthetic Monte Carlo")
    ap.add_argument("--trials", type=int, default=400, help="Monte Carlo trials per row (default 400)")
    args = ap.parse_args()
    os.environ.setdefault("NO_COLOR", "1")
    if not args.synthetic_only:
        run_sim_scenarios(args.n, args.noisy or args.noisy_only, steady=not args.noisy_only)
    if args.synthetic or args.synthetic_only:
        run_synthetic(args.trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
