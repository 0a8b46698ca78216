"""Truth of ``bench history check``: series with known steps, detection rate, false alarms and delay per method.

Each series is N runs of one cell whose decode speed is set on bench's reference engine (``bench sim``): run i
serves at ``decode_step_ms = STEP_MS * exp(e_i) / (1 - s)`` (for i >= the step's run, else without the ``1 - s``),
``e_i`` seeded Gaussian noise of sigma ``--noise`` (run-to-run noise, as a machine gives it), ``s`` the step: a
decode drop of 1, 3, 5 or 10 %. Two parts:

* **synthetic** (``--series`` per step, default 100): the decode speed the sim is set to (1000 / step ms) taken as
  the run's value, the detector run on it; this is where the rates come from;
* **sim** (``--sim-series`` per step, default 1; 0 skips): every run measured for real, ``bench run``'s own loop
  against an in-process sim, its results.json stored in an SQLite history with :class:`bench.history.store.
  HistoryStore` and judged by :func:`bench.history.check.check_history`, end to end.

Measures, per method (``pelt`` the default of ``bench history check``, ``binseg``, ``threshold`` = each run against
the 10 before it, the per-run gate's kind of check):

* detection rate: a change point reported within +-3 runs of the true step, in the whole series;
* false alarms per 100 runs: change points more than 3 runs from any true step, over the step-free series;
* delay: for detected steps, the runs made since the step (the step's own run counts 1) when the check, run after
  every run, first reports it (median and 90th percentile).

    python benchmarks/history_truth.py                                  # about 6 minutes on 2 loaded cores
    python benchmarks/history_truth.py --series 20 --sim-series 0       # quick look
    python benchmarks/history_truth.py --out benchmarks/results/history_truth-DATE-MACHINE.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.history.changepoints import METHODS, detect  # noqa: E402

STEP_MS = 5.0  # the sim's decode step with no step and no noise: 200 tok/s per stream
STEPS = (1.0, 3.0, 5.0, 10.0)  # decode drops, %
NEAR = 3  # a change point within this many runs of the true step is a detection
SIM_PROFILE = {"max_tokens": 16, "requests": 4, "warmup": 0, "overhead_probes": 1,
               "sweep": [{"name": "decode", "depths": [0], "streams": [1]}]}


def step_ms(n: int, at: int | None, drop_pct: float, noise: float, seed: int) -> np.ndarray:
    """The sim's decode step for each run of one series."""
    ms = STEP_MS * np.exp(np.random.default_rng(seed).normal(0.0, noise, n))
    if at is not None:
        ms[at:] /= 1.0 - drop_pct / 100.0
    return ms


def _hits(changes: list[Any], at: int | None) -> tuple[bool, int]:
    """(detected, false alarms) of one analysis."""
    near = [c for c in changes if at is not None and abs(c.index - at) <= NEAR]
    return bool(near), len(changes) - len(near)


def _delay(values: np.ndarray, at: int, method: str) -> int | None:
    for t in range(at + 1, values.size + 1):
        if _hits(detect(values[:t], method=method).changes, at)[0]:
            return t - at
    return None


def synthetic(n: int, at: int, noise: float, series: int, methods: tuple[str, ...]) -> dict[str, Any]:
    """Rates over ``series`` seeded series per step (and as many with no step), per method."""
    out: dict[str, Any] = {}
    for method in methods:
        rows: dict[str, Any] = {}
        fa, runs = 0, 0
        for seed in range(series):  # step-free series: false alarms
            v = 1000.0 / step_ms(n, None, 0.0, noise, 100_000 + seed)
            fa += _hits(detect(v, method=method).changes, None)[1]
            runs += n
        rows["0"] = {"false_alarms_per_100_runs": 100.0 * fa / runs, "runs": runs}
        for s in STEPS:
            det, extra, delays = 0, 0, []
            for seed in range(series):
                v = 1000.0 / step_ms(n, at, s, noise, seed)
                hit, fal = _hits(detect(v, method=method).changes, at)
                extra += fal
                if hit:
                    det += 1
                    d = _delay(v, at, method)
                    if d is not None:
                        delays.append(d)
            rows[f"{s:g}"] = {"detection_rate": det / series, "false_alarms_per_100_runs": 100.0 * extra /
                              (series * n), "delay_median": float(np.median(delays)) if delays else None,
                              "delay_p90": float(np.quantile(delays, 0.9)) if delays else None}
        out[method] = rows
        print(f"  synthetic {method}: done", file=sys.stderr, flush=True)
    return out


async def _sim_run(ms: float, i: int) -> Any:
    from bench.client import ClientSettings
    from bench.config.profile import parse_profile
    from bench.driver import run_profile
    from bench.sim import SimConfig, running_sim

    prof = parse_profile(SIM_PROFILE, "history-truth")
    with running_sim(SimConfig(decode_step_ms=float(ms), prefill_tok_s=50_000.0)) as url:
        res = await run_profile(url, prof, ClientSettings(), out_dir=None)
    res.run.started = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00"  # the order the runs were made in
    res.run.id = f"{i:08x}"
    return res


def sim_part(n: int, at: int, noise: float, series: int, methods: tuple[str, ...]) -> dict[str, Any]:
    """Series measured through the sim, stored in a history and checked end to end."""
    from bench.history.check import CheckSettings, check_history
    from bench.history.store import open_store

    out: dict[str, Any] = {}
    for k, s in enumerate((0.0, *STEPS)):
        for seed in range(series):  # each series its own noise
            ms = step_ms(n, at if s else None, s, noise, 7_000 + 100 * k + seed)
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory() as d, open_store(Path(d) / "h.db") as store:
                measured = []
                for i, m in enumerate(ms):
                    r = asyncio.run(_sim_run(m, i))
                    store.add(r)
                    measured.append(r.cells[0].stat("decode_tok_s"))
                set_ = 1000.0 / ms
                err = np.log(np.asarray(measured, dtype=float) / set_)
                entry: dict[str, Any] = {"measured_vs_set_pct": [round(float(np.mean(err)) * 100, 3),
                                                                 round(float(np.std(err)) * 100, 3)],
                                         "set": [round(float(v), 4) for v in set_],
                                         "measured": [round(float(v), 4) for v in measured]}
                for method in methods:
                    doc = check_history(store, CheckSettings("decode_tok_s", None, (), n - at, method, None))
                    idx = [c["run_index"] for c in doc["changes"]]
                    hit = [i for i in idx if s and abs(i - at) <= NEAR]
                    entry[method] = {"changes": idx, "detected": bool(hit), "false_alarms": len(idx) - len(hit),
                                     "noise_pct": doc["series"][0]["noise_pct"], "exit": doc["exit"]}
            out[f"{s:g}/{seed}"] = entry
            print(f"  sim step {s:g} % seed {seed}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def _md(args: argparse.Namespace, syn: dict[str, Any], sim: dict[str, Any], took: float) -> str:
    lines = [f"# bench history check: detection truth ({datetime.now(UTC).date()}, {socket.gethostname()})", "",
             f"Command: `python benchmarks/history_truth.py {' '.join(sys.argv[1:])}` ({took:.0f} s; "
             f"{platform.platform()}, Python {platform.python_version()}).", "",
             f"Series of {args.n} runs, the step at run {args.at} ({args.n - args.at} runs after it), run-to-run "
             f"noise sigma {args.noise * 100:g} % (log-normal, seeded), {args.series} series per step size and "
             f"{args.series} without a step. Detection: a change point within +-{NEAR} runs of the step. Delay: runs "
             "since the step (its own run is 1) when the check, run after every run, first reports it.", "",
             "## Synthetic (the decode speed the sim is set to)", "",
             "| method | step | detection rate | false alarms / 100 runs | delay median | delay p90 |",
             "|---|---|---|---|---|---|"]
    for method, rows in syn.items():
        lines.append(f"| {method} | none | - | {rows['0']['false_alarms_per_100_runs']:.2f} | - | - |")
        for s in STEPS:
            r = rows[f"{s:g}"]
            dm = "-" if r["delay_median"] is None else f"{r['delay_median']:g}"
            dp = "-" if r["delay_p90"] is None else f"{r['delay_p90']:g}"
            lines.append(f"| {method} | {s:g} % | {r['detection_rate'] * 100:.0f} % | "
                         f"{r['false_alarms_per_100_runs']:.2f} | {dm} | {dp} |")
    if sim:
        lines += ["", "## Through the sim, end to end (bench's run loop, an SQLite history, `check_history`)", "",
                  "Measured vs set: mean and sd of log(measured median / set decode speed), %.", "",
                  "| step / seed | measured vs set % | " + " | ".join(f"{m}: change runs" for m in METHODS) + " |",
                  "|---|---|" + "---|" * len(METHODS)]
        for k, e in sim.items():
            cols = " | ".join(f"{e[m]['changes']}" for m in METHODS if m in e)
            lines.append(f"| {k} | {e['measured_vs_set_pct']} | {cols} |")
    lines += ["", "Raw numbers: the JSON file beside this one.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=60, help="runs per series")
    ap.add_argument("--at", type=int, default=40, help="the run where the step starts")
    ap.add_argument("--noise", type=float, default=0.02, help="run-to-run noise sigma (0.02 = 2 %%)")
    ap.add_argument("--series", type=int, default=100, help="synthetic series per step size")
    ap.add_argument("--sim-series", type=int, default=1, help="series measured through the sim per step size")
    ap.add_argument("--sim-n", type=int, default=30, help="runs per sim series (the step at 2/3 of them)")
    ap.add_argument("--out", help="write the Markdown table here (and the JSON beside it)")
    args = ap.parse_args()
    t0 = time.monotonic()
    syn = synthetic(args.n, args.at, args.noise, args.series, METHODS)
    sim = sim_part(args.sim_n, 2 * args.sim_n // 3, args.noise, args.sim_series, METHODS) if args.sim_series else {}
    md = _md(args, syn, sim, time.monotonic() - t0)
    print(md)
    if args.out:
        Path(args.out).write_text(md, encoding="utf-8")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), "synthetic": syn, "sim": sim},
                                                                  indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
