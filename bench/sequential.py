"""Sequential decisions of the gate: group-sequential boundaries (pure math), and the verdicts built on them.

The gate looks at its data after each round of waves and stops as soon as a rule is decided. Looking repeatedly at
a fixed-sample 95 % interval would raise the chance of a false regression with every look; instead each look
spends part of the one-sided error ``alpha`` by the Lan-DeMets O'Brien-Fleming-type spending function
(K. K. G. Lan, D. L. DeMets, *Discrete sequential boundaries for clinical trials*, Biometrika 70(3), 1983,
659-663)::

    alpha(t) = 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t)))        t = I_k / I_max, the information fraction

and the critical value ``c_k`` of look ``k`` is the one at which the probability, under a true ratio exactly at the
limit, of first crossing at look ``k`` is ``alpha(t_k) - alpha(t_{k-1})``. That probability is computed by the
recursive numerical integration of Armitage, McPherson and Rowe (1969; C. Jennison, B. W. Turnbull, *Group
Sequential Methods with Applications to Clinical Trials*, Chapman & Hall 2000, ch. 19) for the canonical joint
distribution of the look statistics ``Z_k`` (``Cov(Z_j, Z_k) = sqrt(I_j / I_k)``, j <= k). The canonical form holds
for the gate's log-ratio even when only the candidate grows and the baseline is a fixed stored sample: then
``Var(theta_k) = s_b^2/m + s_c^2/n_k`` and ``Cov(theta_j, theta_k) = Var(theta_k)`` for ``n_j <= n_k``.

The boundaries are *non-binding*: each side (regression, pass) is computed as if the other did not exist, so
stopping at the other one only lowers the error of this one. Early looks need very strong evidence (``c_1`` of 3-4
at a small fraction) and the last one about as much as a fixed-sample test (``c_K`` 2.0-2.1 for ``alpha`` 2.5 %
against 1.96), which is why O'Brien-Fleming-type spending costs little resolution at the end.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from bench.gate import (
    COUNT_METRICS,
    MIN_SAMPLES,
    POWER,
    Rule,
    Verdict,
    _log_change,
    _seed,
    _waves,
    cell_samples,
    classify,
    compare,
    compare_samples,
)
from bench.results import Results
from bench.stats import make_estimator, student_t_ppf

__all__ = ["obf_spent", "boundaries", "fractions", "look_schedule", "expand_z", "se_df", "ALPHA", "Look",
           "sequential_samples", "sequential_compare", "plan_rule", "plan_gate", "gate_schedules", "plan_lines",
           "MAX_GROWTH"]

_ND = NormalDist()
_SPAN = 9.0  # the grid reaches this many standard deviations (of the whole information) below the boundary


def obf_spent(t: float, alpha: float) -> float:
    """One-sided error spent by information fraction ``t``: ``2 (1 - Phi(z_{1-alpha/2} / sqrt t))``, 0 at
    ``t <= 0``, ``alpha`` at ``t >= 1``."""
    if t <= 0:
        return 0.0
    if t >= 1:
        return alpha
    return 2.0 * (1.0 - _ND.cdf(_ND.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t)))


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _phi_sf(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.asarray(_ERFC(x / math.sqrt(2.0)), dtype=float)


def _cross_mass(grid: np.ndarray, dens: np.ndarray, h: float, b: float, sd: float) -> float:
    """Probability of going from the continuation density ``dens`` (on ``grid``) above ``b`` in one increment."""
    return float(np.sum(dens * _phi_sf((b - grid) / sd)) * h)


def _solve_b(grid: np.ndarray, dens: np.ndarray, h: float, sd: float, target: float) -> float:
    lo, hi = float(grid[-1]) - 1.0, float(grid[-1]) + 12.0 * sd + 12.0
    for _ in range(80):  # bisection: the crossing mass falls as the boundary rises
        mid = 0.5 * (lo + hi)
        if _cross_mass(grid, dens, h, mid, sd) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@functools.lru_cache(maxsize=512)
def _boundaries(ts: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    out: list[float] = []
    spent_before, t_prev = 0.0, 0.0
    grid = dens = np.zeros(0)
    h = 0.0
    for t in ts:
        want = obf_spent(t, alpha) - spent_before
        if t <= t_prev or want <= 1e-15:
            out.append(math.inf)  # no new information or nothing left to spend: this look cannot decide
            continue
        if not out or grid.size == 0:  # the first look: S_1 ~ N(0, t)
            b = math.sqrt(t) * _ND.inv_cdf(1.0 - want)
            h = min(0.01, math.sqrt(t) / 40.0)
            grid = np.arange(b - _SPAN, b, h) + h / 2.0
            dens = np.exp(-grid ** 2 / (2.0 * t)) / math.sqrt(2.0 * math.pi * t)
        else:
            sd = math.sqrt(t - t_prev)
            b = _solve_b(grid, dens, h, sd, want)
            h_new = min(0.01, sd / 10.0)
            new = np.arange(b - _SPAN, b, h_new) + h_new / 2.0
            kern = np.exp(-((new[:, None] - grid[None, :]) ** 2) / (2.0 * sd * sd)) / (sd * math.sqrt(2.0 * math.pi))
            dens, grid, h = kern @ dens * h, new, h_new
        out.append(b / math.sqrt(t))
        spent_before, t_prev = obf_spent(t, alpha), t
    return tuple(out)


def boundaries(ts: Sequence[float], alpha: float) -> tuple[float, ...]:
    """One-sided critical values ``c_k`` (standard normal scale) for looks at information fractions ``ts``
    (increasing; values above 1 count as 1): a look statistic beyond ``c_k`` decides. ``inf`` for a look that
    adds no information or has nothing left to spend."""
    clipped = tuple(round(min(max(t, 0.0), 1.0), 9) for t in ts)
    return _boundaries(clipped, alpha)


def fractions(waves: Sequence[int], waves_max: int, baseline_waves: int | None) -> list[float]:
    """Information fractions of looks after ``waves`` candidate waves (increasing), out of ``waves_max``.

    With a fixed ``baseline_waves`` (a stored baseline) the information of a look with ``n`` candidate waves is
    ``1 / (1/m + 1/n)`` (equal per-wave variance on both sides); with ``baseline_waves`` None both sides grow
    together (a matched A/B) and the information is proportional to ``n``."""
    if baseline_waves is None:
        return [n / waves_max for n in waves]
    m = baseline_waves

    def info(n: int) -> float:
        return 1.0 / (1.0 / m + 1.0 / n)

    return [info(n) / info(waves_max) for n in waves]


def look_schedule(first: int, waves_max: int, growth: float = 1.5) -> list[int]:
    """Candidate waves at each look: ``first``, then ``ceil(growth * previous)`` (at least one more), up to
    ``waves_max`` (the last look; a look that would leave less than a quarter of its waves for the last one is
    moved to ``waves_max``). Fixed before measuring, so the looks do not depend on the data."""
    first = max(1, min(first, waves_max))
    out = [first]
    while out[-1] < waves_max:
        nxt = min(waves_max, max(out[-1] + 1, math.ceil(growth * out[-1])))
        if waves_max - nxt < 0.25 * nxt:
            nxt = waves_max
        out.append(nxt)
    return out


def se_df(stat: str, n: int, n_other: int) -> float:
    """Effective degrees of freedom of a bootstrap standard error of ``stat`` with these sample counts.

    For the mean it is the pooled ``n + n_other - 2``. The bootstrap variance of a quantile is much noisier: its
    relative error falls only like ``n^(-1/4)`` (P. Hall, M. A. Martin, *Exact convergence rate of bootstrap
    quantile variance estimator*, Probability Theory and Related Fields 80, 1988, 261-268). bench's simulation
    of the trimmed Harrell-Davis median (lognormal samples, 8-200 a side) measured the spread of that SE as a
    chi-square with about ``2 sqrt(m)`` degrees of freedom, ``m = min(n, n_other)``; for a quantile ``q`` only the
    samples near its tail count, so ``df = 2 sqrt(2 m min(q, 1-q))`` (p90 of 8-16 samples: 2.5-3.6, as
    measured), at least 2 and at most the pooled df."""
    pooled = float(n + n_other - 2)
    if stat == "mean":
        return pooled
    q = 0.5 if stat == "median" else int(stat[1:]) / 100.0
    m = min(n, n_other)
    return max(2.0, min(pooled, 2.0 * math.sqrt(2.0 * m * min(q, 1.0 - q))))


def expand_z(c: float, n: int, n_other: int, df: float | None = None) -> float:
    """The critical value ``c`` widened for small samples as :func:`bench.stats.expanded_tail` widens the fixed
    interval (Hesterberg 2015): ``sqrt(m/(m-1)) * t_{df}^{-1}(Phi(c))`` with ``m = min(n, n_other)`` and ``df``
    (default the pooled ``n + n_other - 2``; :func:`se_df` for a bootstrap SE); ``c`` itself when a side has fewer
    than 2 samples or ``c`` is infinite."""
    m = min(n, n_other)
    if m < 2 or not math.isfinite(c):
        return c
    p = _ND.cdf(c)
    if p >= 1.0 - 1e-12:
        return math.inf  # beyond 7 standard errors: no finite sample decides such a look
    return math.sqrt(m / (m - 1.0)) * student_t_ppf(p, df if df is not None else n + n_other - 2)


# --- sequential decisions (bench gate) ---------------------------------------------------------------------------

ALPHA = 0.025
"""The stated error of each sequential rule, one-sided: the chance of a false regression when the true ratio is
exactly at the limit, over all looks together (and, the same, of a false pass there); smaller at any better
ratio. It equals the one-sided tail of the fixed 95 % interval, so one look decides as before."""


@dataclass(frozen=True, slots=True)
class Look:
    """Where a cell's sequential test stands.

    Attributes:
        waves: the candidate's measured waves at every look so far, this one last (increasing).
        waves_max: the planned last look (the budget); information fractions are taken against it.
        baseline_waves: the baseline's waves, fixed (a stored baseline); None when both sides grow alike (A/B).
        alpha: the one-sided error spent over all looks (:data:`ALPHA`).
        spread_pct: the instance-to-instance spread (standard deviation of the log ratio between two server
            processes of one build, in %) folded into every look's standard error: a stored baseline made on
            another instance differs by that much before any change. 0: the same instance.
    """

    waves: tuple[int, ...]
    waves_max: int
    baseline_waves: int | None
    alpha: float = ALPHA
    spread_pct: float = 0.0

    def critical(self) -> float:
        """This look's one-sided critical value on the normal scale (:func:`boundaries`)."""
        return boundaries(fractions(self.waves, self.waves_max, self.baseline_waves), self.alpha)[-1]


def _log_se(base: Sequence[float], cand: Sequence[float], stat: str, *, resamples: int,
            seed: int | Sequence[int]) -> tuple[float, float, float]:
    """``(stat(base), stat(cand), SE of ln ratio)``, the SE read off the two-sample bootstrap distribution of the
    log-ratio as half its central 68.3 % range (robust to lumpy tails). Raises ValueError like
    :func:`bench.stats.bootstrap_ratio_ci`."""
    a, b = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"need at least 2 samples per side (baseline {a.size}, candidate {b.size})")
    est = make_estimator(stat)
    bv, cv = float(est(a[None, :])[0]), float(est(b[None, :])[0])
    if not bv > 0 or not cv > 0:
        raise ValueError(f"{stat} is not positive (baseline {bv}, candidate {cv}); a ratio needs positive values")
    rng = np.random.default_rng(seed)
    ra = est(a[rng.integers(0, a.size, size=(resamples, a.size))])
    rb = est(b[rng.integers(0, b.size, size=(resamples, b.size))])
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(rb) - np.log(ra)
    logs = logs[np.isfinite(logs)]
    lo, hi = np.quantile(logs, [NormalDist().cdf(-1.0), NormalDist().cdf(1.0)])
    return bv, cv, float(hi - lo) / 2.0


def _pct_of_log(x: float, higher_better: bool) -> float:
    """A change of ``x`` on the log scale in percent, in the rule's worse direction (:func:`min_detectable_pct`)."""
    return (1.0 - math.exp(-x) if higher_better else math.exp(x) - 1.0) * 100.0


def sequential_samples(
    rule: Rule, cell: str, base: Sequence[float], cand: Sequence[float], look: Look, *, seed: int = 0,
    resamples: int = 2000, waves_baseline: int | None = None, planned_mde_pct: float | None = None,
) -> Verdict:
    """The verdict of ``rule`` for one cell at one sequential look.

    ``ratio = stat(cand) / stat(base)`` with ``SE`` its bootstrap standard error on the log scale; the look's
    critical value ``c`` (alpha spending, :class:`Look`) is widened for small samples (:func:`bench.sequential.
    expand_z`) to ``k``, and the interval ``ratio * exp(-+ k SE)`` is classified by :func:`classify` as the fixed
    one is. Its ``level`` is the look's nominal two-sided level ``1 - 2 Phi(-c)``; its MDE is
    ``(k + z_power) SE``. Inconclusive here means "not decided yet" unless this is the last look.
    """
    nb, nc = len(base), len(cand)
    if nb < MIN_SAMPLES or nc < MIN_SAMPLES:
        v = compare_samples(rule, cell, base, cand, seed=seed, resamples=resamples)
        return _with_look(v, look, waves_baseline, planned_mde_pct)
    try:
        bv, cv, se = _log_se(base, cand, rule.stat, resamples=resamples, seed=_seed(seed, rule, cell))
    except ValueError as e:
        return _with_look(Verdict(rule, cell, "inconclusive", None, None, None, None, None, 0.95, nb, nc, str(e)),
                          look, waves_baseline, planned_mde_pct)
    if look.spread_pct > 0:  # the instances' own difference adds to the noise of every look alike
        se = math.hypot(se, math.log1p(look.spread_pct / 100.0))
    c = look.critical()
    k = expand_z(c, nb, nc, se_df(rule.stat, nb, nc))
    ratio = cv / bv
    if not math.isfinite(k):
        v = Verdict(rule, cell, "inconclusive", bv, cv, ratio, None, None, 1.0, nb, nc,
                    f"look {len(look.waves)} adds no information (no error left to spend)")
        return _with_look(v, look, waves_baseline, planned_mde_pct)
    lo, hi = ratio * math.exp(-k * se), ratio * math.exp(k * se)
    mde = _pct_of_log((k + NormalDist().inv_cdf(POWER)) * se, rule.higher_better)
    level = 1.0 - 2.0 * NormalDist().cdf(-c)
    v = Verdict(rule, cell, classify(rule, lo, hi, mde), bv, cv, ratio, lo, hi, level, nb, nc, "", mde)
    return _with_look(v, look, waves_baseline, planned_mde_pct)


def _with_look(v: Verdict, look: Look, waves_baseline: int | None, planned: float | None) -> Verdict:
    from dataclasses import replace

    return replace(v, waves=look.waves[-1], waves_baseline=waves_baseline, look=len(look.waves),
                   planned_mde_pct=planned)


def sequential_compare(baseline: Results, candidate: Results, rules: Sequence[Rule], looks: Mapping[str, Look], *,
                       planned: Mapping[str, float | None] | None = None, seed: int = 0,
                       resamples: int = 2000) -> list[Verdict]:
    """:func:`compare`, but every cell in ``looks`` is judged at its sequential look (:func:`sequential_samples`);
    ``planned``: ``{verdict name: planned MDE %}`` (:func:`plan_gate`). Server-counted rates and cells without a
    look get the fixed-sample verdict."""
    fixed = compare(baseline, candidate, rules, seed=seed, resamples=resamples)
    bcells = {c.id: c for c in baseline.cells}
    ccells = {c.id: c for c in candidate.cells}
    out = []
    for v in fixed:
        look = looks.get(v.cell)
        if look is None or v.rule.metric in COUNT_METRICS or v.cell not in bcells or v.cell not in ccells:
            out.append(v)
            continue
        bs, cs = cell_samples(bcells[v.cell], v.rule.metric), cell_samples(ccells[v.cell], v.rule.metric)
        out.append(sequential_samples(v.rule, v.cell, bs, cs, look, seed=seed, resamples=resamples,
                                      waves_baseline=_waves(bcells[v.cell]),
                                      planned_mde_pct=(planned or {}).get(v.name)))
    return out


def plan_rule(rule: Rule, cell: str, base: Sequence[float], baseline_waves: int, schedule: Sequence[int], *,
              alpha: float = ALPHA, seed: int = 0, resamples: int = 2000, both_grow: bool = False,
              spread_pct: float = 0.0) -> dict[str, Any]:
    """Before measuring: what a sequential rule will resolve with the looks ``schedule`` (candidate waves).

    The per-wave spread ``s`` of the log statistic comes from the baseline alone: the baseline compared with
    itself by two independent bootstrap resamples gives ``SE_self = s sqrt(2/m)`` (``m`` = baseline waves). A
    candidate as noisy with ``n`` waves then has ``SE(n) = s sqrt(1/m + 1/n)`` (``s sqrt(2/n)`` when
    ``both_grow``), plus ``d^2`` for an instance spread of ``spread_pct`` (``d = ln(1 + spread_pct/100)``), and the
    planned MDE is ``(k + z_power) SE(n_max)`` with ``k`` the last look's critical value (small-sample widened). Returns a dict: ``name``, ``cell``, ``max_change_pct``, ``planned_mde_pct``,
    ``waves_max``, ``looks``, ``baseline_waves``, ``waves_needed`` (candidate waves for an MDE within the allowance
    against this baseline; None when the baseline's own noise forbids it), ``waves_needed_both`` (waves per side if
    both sides were measured that long), ``se_per_wave_pct`` and ``note``.
    """
    name = f"{rule.metric}.{rule.stat}@{cell}"
    out: dict[str, Any] = {"name": name, "cell": cell, "max_change_pct": rule.max_change_pct,
                           "planned_mde_pct": None, "waves_max": schedule[-1] if schedule else 0,
                           "looks": len(schedule), "baseline_waves": baseline_waves, "waves_needed": None,
                           "waves_needed_both": None, "se_per_wave_pct": None, "note": ""}
    m, nb = max(baseline_waves, 1), len(base)
    if nb < MIN_SAMPLES or not schedule:
        out["note"] = f"too few baseline samples ({nb}) to plan"
        return out
    try:
        _, _, se_self = _log_se(base, base, rule.stat, resamples=resamples, seed=_seed(seed + 7, rule, cell))
    except ValueError as e:
        out["note"] = str(e)
        return out
    s = se_self * math.sqrt(m / 2.0)
    n_max = schedule[-1]
    c = boundaries(fractions(schedule, n_max, None if both_grow else m), alpha)[-1]
    zp = NormalDist().inv_cdf(POWER)
    d = math.log1p(spread_pct / 100.0)

    def mde_log(n: int, base_n: int | None) -> float:
        """(k + z_power) SE on the log scale with ``n`` candidate waves (and ``base_n`` baseline waves; None:
        the baseline as it is)."""
        mb = m if base_n is None else base_n
        nbs, ncs = max(2, round(mb * nb / m)), max(2, round(n * nb / m))
        k = expand_z(c, nbs, ncs, se_df(rule.stat, nbs, ncs)) + zp
        return k * math.sqrt(s * s * (2.0 / n if both_grow else 1.0 / mb + 1.0 / n) + d * d)

    out["planned_mde_pct"] = _pct_of_log(mde_log(n_max, None), rule.higher_better)
    out["se_per_wave_pct"] = s * 100.0
    a = _log_change(rule.max_change_pct, rule.higher_better) if 0 < rule.max_change_pct < 100 else 0.0
    if a > 0:  # and enough waves for MIN_SAMPLES samples: fewer give no verdict at all
        def enough(n: int) -> bool:
            return round(n * nb / m) >= MIN_SAMPLES

        out["waves_needed"] = _least_waves(lambda n: enough(n) and mde_log(n, None) <= a)
        out["waves_needed_both"] = _least_waves(lambda n: enough(n) and mde_log(n, n) <= a)
    return out


def _least_waves(ok: Callable[[int], bool], limit: int = 100_000) -> int | None:
    """The least ``n`` in 2..limit with ``ok(n)`` (``ok`` monotone), or None: doubling, then bisection."""
    hi = 2
    while not ok(hi):
        hi *= 2
        if hi > limit:
            return None
    lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi if hi > 2 or not ok(1) else 1


def plan_gate(baseline: Results, rules: Sequence[Rule], schedules: Mapping[str, Sequence[int]], *,
              alpha: float = ALPHA, seed: int = 0, both_grow: bool = False,
              spread_pct: float = 0.0) -> list[dict[str, Any]]:
    """:func:`plan_rule` for every rule and baseline cell it covers that has a look schedule (``{cell id: candidate
    waves at each look}``), in rule order; server-counted rates are not planned."""
    out = []
    for rule in rules:
        if rule.metric in COUNT_METRICS:
            continue
        for cell in baseline.cells:
            if cell.id not in schedules or (rule.cell not in ("*", cell.id)):
                continue
            bs = cell_samples(cell, rule.metric)
            if not bs and rule.cell == "*":
                continue
            out.append(plan_rule(rule, cell.id, bs, _waves(cell) or len(bs), schedules[cell.id], alpha=alpha,
                                 seed=seed, both_grow=both_grow, spread_pct=spread_pct))
    return out


MAX_GROWTH = 8
"""The last look has at most this many times a cell's planned waves: against a stored baseline of as many waves the
information is then 8/9 of its limit, and a longer schedule would only make the early looks (whose thresholds
depend on their share of the last one's information) stricter."""


def _schedule_cost(sched: Sequence[int], wave_s: float, warm_s: float) -> float:
    """Seconds to take every look of ``sched`` after the plan's wave: a warm-up per round plus the new waves."""
    return len(sched) * warm_s + max(sched[-1] - 1, 0) * wave_s


def gate_schedules(first: Mapping[str, int], costs: Mapping[str, tuple[float, float]], gated: set[str], *,
                   time_left: float | None, waves_left: int | None, max_waves: int | None = None,
                   growth: float = 1.5) -> dict[str, list[int]]:
    """Each cell's planned looks (candidate waves at each), fixed before measuring.

    A gated cell's first look is at its planned waves ``first[cid]``; its last at ``round(first * g)`` for the
    largest common factor ``g`` (1 to :data:`MAX_GROWTH`) whose rounds fit: in ``time_left`` seconds (``costs[cid] = (seconds per
    wave, seconds of a round's warm-up)``), within ``waves_left`` extra waves in all, and ``max_waves`` per cell;
    looks in between grow by ``growth``. When not even the planned waves fit the time, every cell is cut to what
    does (at least the plan's one wave). Cells no rule judges get one look at their planned waves.
    """
    def build(g: float) -> dict[str, list[int]]:
        out = {}
        for cid, w0 in first.items():
            top = max(1, round(w0 * g)) if cid in gated else min(w0, max(1, round(w0 * g)))
            if max_waves is not None:
                top = min(top, max(max_waves, 1))
            out[cid] = look_schedule(min(w0, top), top, growth)
        return out

    def fits(s: Mapping[str, list[int]]) -> bool:
        t = sum(_schedule_cost(v, *costs[cid]) for cid, v in s.items())
        extra = sum(max(0, v[-1] - first[cid]) for cid, v in s.items())
        return (time_left is None or t <= time_left) and (waves_left is None or extra <= waves_left)

    best = build(1.0)
    if not fits(best):
        g = 1.0
        while g > 1.0 / max(max(first.values(), default=1), 1) and not fits(best):
            g *= 0.9
            best = build(g)
        return best
    g = 1.0
    while g < MAX_GROWTH:
        cand = build(g * 1.05)
        if not fits(cand):
            break
        g *= 1.05
        best = cand
    return best


PLAN_WIDTH = 80
"""Columns a printed plan line keeps to (a terminal's and a CI log's); longer text goes on indented lines below."""


def plan_lines(plan: Sequence[Mapping[str, Any]], schedules: Mapping[str, Sequence[int]],
               costs: Mapping[str, tuple[float, float]], time_left: float | None) -> list[str]:
    """The plan as printed before the gate measures: the budget, each cell's looks, then each rule and cell; every
    line within :data:`PLAN_WIDTH` columns (a long one continues on lines indented under its text)."""
    need_s = sum(_schedule_cost(s, *costs[c]) for c, s in schedules.items())
    budget = f" of the {time_left:.0f} s left" if time_left is not None else ""
    texts = [f"at most {need_s:.0f} s{budget}"]
    texts += [f"{c}: {costs[c][0]:.2f} s a wave, looks at {'/'.join(str(w) for w in s)} waves"
              for c, s in schedules.items()]
    texts += [_plan_text(p, costs.get(p["cell"], (0.0, 0.0))) for p in plan]
    return [line for t in texts for line in textwrap.wrap(t, PLAN_WIDTH, initial_indent="plan: ",
                                                           subsequent_indent="      ", break_long_words=False,
                                                           break_on_hyphens=False)]


def _plan_text(p: Mapping[str, Any], cost: tuple[float, float]) -> str:
    if p["planned_mde_pct"] is None:
        return f"{p['name']}: cannot plan ({p['note']})"
    head = (f"{p['name']}: expected MDE {p['planned_mde_pct']:.1f} % at {p['waves_max']} waves in {p['looks']} "
            f"look(s) (allowance {p['max_change_pct']:g} %, baseline {p['baseline_waves']} waves; if the candidate is "
            "as steady as the baseline)")
    need = p["waves_needed"]
    if need is None:
        both = p["waves_needed_both"]
        fix = f"record the baseline with about {both} waves" if both else "raise the allowance"
        return f"{head}; the baseline's own noise keeps it above the allowance however long this runs ({fix})"
    return (f"{head}; within the allowance from {need} wave{'' if need == 1 else 's'} "
            f"(~{need * cost[0] + cost[1]:.0f} s)")
