"""The oracle bound for ``bench capacity --by rate`` (issue 24): how often could a search with a budget of ``T`` s
put its boundary within 2 % of the truth if it knew where to measure and the exact slope?

The oracle knows the true boundary ``L*`` (the truth of benchmarks/capacity_coverage.py, read from its cache)
and spends the whole budget on ONE point of ``T`` s at exactly ``L*``: bench's schedule for that load and seed
(:class:`bench.load.capacity_model.ModelPoints`, the sim's engine model in virtual time), measured on the window
a refine point uses (the first ``REFINE_WARMUP_SHARE`` of the span left out as warm-up, the default cool-down;
``--warmup-s`` fixes the warm-up instead). Drains and per-point overhead are not charged to ``T``. It turns the
point's statistic into a load estimate with the *true* local slope at ``L*``, as the search's fit would:

* share: the boundary whose share curve passes through the point's share at ``L*``,
  ``L = L* exp((logit(alpha) - logit(share)) / b)``, ``b`` = d logit(long-run share over the limit) / d log(load)
  at ``L*``;
* cv: the same with the share corrected by a control variate (:mod:`bench.load.control`, as the search does)
  whose proxy is fitted on independent long points around ``L*`` (``PROXIES``: 6,000 s of data outside the
  budget) and whose expectation is drawn over 300 schedules of the same process: the best this proxy family can
  do, not the search's cross-fitted one; cv2: the same with a proxy fitted on only two 50-s points at ``L* / 1.06`` and ``1.06 L*``
  (about what a search's other refine points give it; ten such proxies, from different seeds, in turn, each
  expectation over 100 schedules). On the sim a request's latency is a deterministic
  function of the schedule (fixed sizes), so a perfect control variate would remove all the noise: the cv
  columns say how much of it bench's proxy removes *on the sim*; a real server adds noise no schedule explains;
* p90: ``L = L* exp((log(limit) - log(statistic)) / c)``, ``c`` = d log(long-run statistic) / d log(load).

The slopes come from long runs (``--slope-run-s`` s, the first 10 % left out, ``TRUTH_SEEDS`` seeds pooled) at
``L* x exp(+-2 %)`` and ``L*`` with the same seeds at every load (common random numbers: bench's arrivals are a
unit-rate stream divided by the rate). Each estimator's error is its load estimate / ``L*`` - 1; "within 2 %"
is the share of ``--seeds`` seeds with ``|error| <= 2 %``. Because the oracle measures where the statistic's
information about the load is and does not pay for probes, warm-ups of several points, drains or a fitted
slope, a search of the same estimator family with budget ``T`` should do no better (it is a bound for this
estimator family, not a proof over every conceivable estimator). The two-point columns are the simpler check:
how often a point of ``T`` s at ``L* / 1.02`` reads a share over ``alpha`` and one at ``1.02 L*`` one under
it; if both are large, the plain share of such a point does not tell loads 4 % apart.

    python benchmarks/capacity_oracle.py --cases A-ttft-poisson,B-ttft-poisson --seeds 100 \\
        --budgets 60,120,170,300,600,1200 --truth-cache benchmarks/results/capacity_truth-2026-12-02-vm.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.config.slo import parse_slo  # noqa: E402
from bench.load.capacity_model import ModelPoints  # noqa: E402
from bench.load.capacity_points import REFINE_WARMUP_SHARE, point_settings  # noqa: E402
from bench.load.control import PointRequests, Proxy, expected_proxy, features, fit_proxy  # noqa: E402
from bench.load.point import LoadSettings  # noqa: E402
from benchmarks.capacity_coverage import ARRIVALS, SHAPES, TRUTH_SEEDS  # noqa: E402

STEP = 0.02  # the slopes' half-step in log load, and the tolerance of "within"
EVAL_SEED0 = 1000  # the oracle points' seeds: 1000, 1001, ...
PROXIES = {  # estimator: the points each proxy is fitted on (loads / L*, seeds, run s), proxies, draws
    "cv": ((0.94, 0.97, 1.0, 1.03, 1.06), range(500, 504), 300.0, 1, 300),  # plenty: the proxy family's best
    "cv2": ((1 / 1.06, 1.06), range(600, 601), 50.0, 10, 100),  # like a search's: two default refine points
}


class Case:
    """One case of capacity_coverage.py (``A-ttft-poisson``...) at its true boundary ``truth``."""

    def __init__(self, name: str, truth: float) -> None:
        shape, metric, arrival = name.split("-")
        self.name, self.truth = name, truth
        self.cfg, self.prompt, self.out, objs = SHAPES[shape]
        self.slo, self.limit, _ = objs[metric]
        self.kind, self.burst = ARRIVALS[arrival]
        self.key = self.slo.split("=")[0]
        self.alpha = 1.0 - float(self.key.rsplit("_p", 1)[1]) / 100.0

    def point(self, load: float, seed: int, duration_s: float, warmup_s: float | None = None) -> dict[str, Any]:
        """A refine point's summary at ``load`` (its warm-up ``REFINE_WARMUP_SHARE`` of it, or ``warmup_s``)."""
        ls = LoadSettings(duration_s=duration_s, input_tokens=str(self.prompt), slo=self.slo, seed=seed,
                          arrival=self.kind, burstiness=self.burst)
        pls = point_settings(ls, load, "rate", seed, None, None)
        if warmup_s is not None:
            pls = replace(pls, warmup_s=warmup_s)
        return ModelPoints(self.cfg, ls, parse_slo(self.slo), max_tokens=self.out).point(pls)

    def values(self, s: dict[str, Any]) -> np.ndarray:
        v = np.asarray(s["requests"].values[self.key], dtype=float)
        return v[~np.isnan(v)]


def _boundary(x: float, slope: float) -> float:
    """The relative error of ``L* exp(x / slope)`` (inf where the slope is not positive)."""
    return math.exp(x / slope) - 1 if slope > 0 else math.inf


def logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def slopes(c: Case, run_s: float) -> dict[str, float]:
    """The long-run share over the limit and statistic at ``L* exp(-STEP, 0, +STEP)`` (pooled over TRUTH_SEEDS,
    common random numbers) and the slopes ``b`` (logit share) and ``c`` (log statistic) vs log load at L*."""
    q = 100.0 * (1.0 - c.alpha)
    shares, stats = [], []
    for d in (-STEP, 0.0, STEP):
        vals = np.concatenate([c.values(c.point(c.truth * math.exp(d), seed, run_s, 0.1 * run_s))
                               for seed in TRUTH_SEEDS])
        shares.append(float((vals > c.limit).mean()))
        stats.append(float(np.percentile(vals, q)))
    b = (logit(shares[2]) - logit(shares[0])) / (2 * STEP)
    cq = (math.log(stats[2]) - math.log(stats[0])) / (2 * STEP)
    return {"share_lo": shares[0], "share": shares[1], "share_hi": shares[2], "b": b, "stat_lo": stats[0],
            "stat": stats[1], "stat_hi": stats[2], "c": cq,
            "truth_offset": math.exp((logit(c.alpha) - logit(shares[1])) / b) - 1}


def train_proxy(c: Case, factors: tuple[float, ...], seeds: range, run_s: float) -> tuple[Proxy, float]:
    """The control variate's proxy fitted on ``seeds`` x ``factors`` points of ``run_s`` s around L* (seeds apart
    from the oracle's), and its time unit (the points' median E2E, s)."""
    prs = [c.point(c.truth * f, seed, run_s)["requests"] for f in factors for seed in seeds]
    u = max(1e-3, float(np.median([p.e2e_s for p in prs])))
    xs, rates, vals = [], [], []
    for p in prs:
        v = p.values[c.key]
        ok = ~np.isnan(v)
        xs.append(features(p.at_s, p.sent_s[ok], u, c.truth))
        rates.append(math.log(p.process.rate))
        vals.append(v[ok])
    return fit_proxy(xs, rates, vals, c.limit), u


def proxy_mean(proxy: Proxy, pr: PointRequests, u: float, ref: float) -> float:
    """The mean fitted probability of the window's requests (the control variate of one point)."""
    return float(proxy.predict(features(pr.at_s, pr.sent_s, u, ref), math.log(pr.process.rate)).mean())


def errors(c: Case, sl: dict[str, float], T: float, seeds: int, warmup_s: float | None,
           cvs: dict[str, list[tuple[Proxy, float]]], two_point: bool) -> dict[str, list[float]]:
    """Per seed, each estimator's relative error at budget ``T`` (seed ``i`` takes proxy ``i`` mod their number),
    and the two-point shares (at L*/1.02, 1.02 L*)."""
    q = 100.0 * (1.0 - c.alpha)
    out: dict[str, list[float]] = {k: [] for k in ("share", "p90", *PROXIES, "raw", "lo2", "hi2")}
    expect: dict[tuple[str, int], float] = {}
    for i in range(seeds):
        seed = EVAL_SEED0 + i
        s = c.point(c.truth, seed, T, warmup_s)
        v = c.values(s)
        share = float((v > c.limit).mean())
        out["raw"].append(share)
        out["share"].append(_boundary(logit(c.alpha) - logit(share), sl["b"]))
        out["p90"].append(_boundary(math.log(c.limit) - math.log(float(np.percentile(v, q))), sl["c"]))
        for k, proxies in cvs.items():
            j = i % len(proxies)
            proxy, u = proxies[j]
            pr = s["requests"]
            if (k, j) not in expect:
                expect[k, j] = expected_proxy(proxy, replace(pr, seed=10**6), u, c.truth, PROXIES[k][4])[0]
            adj = share - proxy_mean(proxy, pr, u, c.truth) + expect[k, j]
            out[k].append(_boundary(logit(c.alpha) - logit(adj), sl["b"]))
        for tag, f in (("lo2", 1 / 1.02), ("hi2", 1.02)) if two_point else ():
            out[tag].append(float((c.values(c.point(c.truth * f, seed, T, warmup_s)) > c.limit).mean()))
    return out


def summary(e: dict[str, list[float]], alpha: float) -> dict[str, Any]:
    def within(xs: list[float]) -> float | None:
        return sum(abs(x) <= STEP for x in xs) / len(xs) if xs else None

    def sd(xs: list[float]) -> float | None:
        fin = [math.log1p(x) for x in xs if math.isfinite(x)]
        return statistics.stdev(fin) if len(fin) > 1 else None

    return {k: {"within": within(e[k]), "mean": statistics.median(e[k]) if e[k] else None, "sd_log": sd(e[k])}
            for k in ("share", *PROXIES, "p90")} | {
        "raw_mean": statistics.fmean(e["raw"]),
        "lo2_over": sum(x > alpha for x in e["lo2"]) / len(e["lo2"]) if e["lo2"] else None,
        "hi2_under": sum(x <= alpha for x in e["hi2"]) / len(e["hi2"]) if e["hi2"] else None}


def _p(v: float | None, d: int = 0) -> str:
    return "-" if v is None else f"{100 * v:.{d}f} %"


def row(name: str, T: float, sm: dict[str, Any]) -> str:
    cols = [name, f"{T:g}"]
    for k in ("share", *PROXIES, "p90"):
        cols += [_p(sm[k]["within"]), f"{_p(sm[k]['mean'], 1)} / {_p(sm[k]['sd_log'], 1)}"]
    cols += [_p(sm["raw_mean"], 1), _p(sm["lo2_over"]), _p(sm["hi2_under"])]
    return "| " + " | ".join(cols) + " |"


HEADER = ("| case | T s | share: within 2 % | share: median / sd err | cv: within 2 % | cv: median / sd err "
          "| cv2: within 2 % | cv2: median / sd err | p90: within 2 % | p90: median / sd err | mean share at L* "
          "| L*/1.02 reads over | 1.02 L* reads under |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="A-ttft-poisson,B-ttft-poisson,A-tpot-poisson,B-tpot-poisson")
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--budgets", default="60,120,170,300,600,1200", help="point lengths T, s (comma list)")
    ap.add_argument("--warmup-s", type=float, help=f"fixed warm-up, s (default {REFINE_WARMUP_SHARE} of T)")
    ap.add_argument("--slope-run-s", type=float, default=3000.0)
    ap.add_argument("--no-cv", action="store_true", help="skip the control-variate estimator")
    ap.add_argument("--no-two-point", action="store_true", help="skip the points at L*/1.02 and 1.02 L*")
    ap.add_argument("--truth-cache", type=Path, default=Path("benchmarks/results/capacity_truth-2026-12-05-vm.json"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    truths = json.loads(a.truth_cache.read_text())
    out: dict[str, Any] = {"argv": sys.argv, "cases": {}}
    t0 = time.time()
    print(HEADER, flush=True)
    for name in a.cases.split(","):
        c = Case(name, float(truths[name][0]))
        sl = slopes(c, a.slope_run_s)
        cvs = {} if a.no_cv else {k: [train_proxy(c, fs, range(s0.start + 100 * j, s0.stop + 100 * j), run_s)
                                      for j in range(n)] for k, (fs, s0, run_s, n, _) in PROXIES.items()}
        out["cases"][name] = {"truth": c.truth, "slopes": sl, "budgets": {}}
        for T in (float(x) for x in a.budgets.split(",")):
            e = errors(c, sl, T, a.seeds, a.warmup_s, cvs, not a.no_two_point)
            sm = summary(e, c.alpha)
            out["cases"][name]["budgets"][f"{T:g}"] = {"summary": sm, "errors": e}
            print(row(name, T, sm), flush=True)
        print(f"<!-- {name}: L* {c.truth:g}, long-run share at L* exp(-2 %, 0, +2 %) {sl['share_lo']:.4f} / "
              f"{sl['share']:.4f} / {sl['share_hi']:.4f} (b = {sl['b']:.2f}), statistic {sl['stat_lo']:.2f} / "
              f"{sl['stat']:.2f} / {sl['stat_hi']:.2f} ms (c = {sl['c']:.3f}); implied truth offset "
              f"{100 * sl['truth_offset']:+.2f} % -->", flush=True)
    print(f"(wall {time.time() - t0:.0f} s)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
