"""The CI speed gate: rules, verdicts and exit codes (pure: results documents in, verdicts out).

A *rule* (one ``[[gate]]`` table of a profile) says how much worse one statistic of one metric may get in one cell
(or every cell, ``cell = "*"``)::

    [[gate]]
    metric = "decode_tok_s"      # per-stream decode tok/s, higher is better
    cell = "d0-s1-prose"         # a cell id d{depth}-s{streams}-{prompt}, or "*"
    stat = "median"              # mean | median | p1..p99 (default median)
    max_drop_pct = 5             # higher-better metrics: the allowed drop, %

    [[gate]]
    metric = "ttft_ms"           # lower is better
    cell = "*"
    stat = "p90"
    max_rise_pct = 10            # lower-better metrics: the allowed rise, %

For each rule and cell, :func:`compare` estimates ``ratio = stat(candidate) / stat(baseline)`` from the raw
per-request samples of both results files (per-wave samples for ``aggregate_decode_tok_s``) with a two-sample
bootstrap confidence interval ``[lo, hi]`` (:func:`bench.stats.bootstrap_ratio_ci`: trimmed Harrell-Davis
quantiles, expanded percentile interval; the reasons are in docs/gate.md) and classifies it against the limit
``L = 1 - max_drop_pct/100`` (higher-better) or ``L = 1 + max_rise_pct/100`` (lower-better):

=============  ===============================  ===============================
verdict        higher-better                    lower-better
=============  ===============================  ===============================
regression     ``hi < L``                       ``lo > L``
inconclusive   ``lo < L <= hi``                 ``lo <= L < hi``
improved       ``lo > 1 + t`` (and not above)   ``hi < 1 - t`` (and not above)
unchanged      otherwise                        otherwise
=============  ===============================  ===============================

so a regression is declared only when the whole interval lies beyond the allowance, and an improvement only when
the whole interval lies beyond ``t = max(allowance, MDE)`` on the better side (a change smaller than the allowance,
or than what the data can resolve, is "unchanged"). Exit codes (:func:`overall_exit`): 0 pass, 1 any regression,
2 any inconclusive and no regression.

Each verdict with an interval also carries its *minimum detectable effect* (:func:`min_detectable_pct`): the
smallest true change, in percent, that the comparison detects with probability :data:`POWER` at the measured noise,
``MDE = (z_{1-tail} + z_{power}) * SE`` with ``SE = (hi - lo) / (2 z_{1-tail})`` read off the bootstrap interval
(``tail`` the interval's own one-sided tail). When the MDE exceeds the rule's allowance, the gate cannot pass an
unchanged candidate reliably; :func:`waves_needed` says how many waves would bring it under (noise ~ 1/sqrt(n)).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from bench.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE, EXIT_OK, ConfigError
from bench.results import CellResult, Results
from bench.stats import bootstrap_ratio_ci, expanded_tail, make_estimator

__all__ = ["HOST_LOAD_CHANGE_CORES", "host_load_change", "HIGHER_BETTER", "LOWER_BETTER", "METRICS", "MAIN_METRICS",
           "VERDICTS", "Rule", "Verdict", "parse_rules", "default_rules", "rules_from_results", "check_rule_cells",
           "compare", "compare_samples", "classify", "min_detectable_pct", "waves_needed", "POWER", "overall_exit",
           "check_comparable", "setting_diffs", "REQUEST_SETTINGS", "OPEN_LOOP_SAMPLE", "profile_rules",
           "main_verdicts", "cell_samples", "inconclusive_cells", "verdict_counts", "uncovered_cells",
           "require_common_cells"]

HIGHER_BETTER = ("decode_tok_s", "aggregate_decode_tok_s", "prompt_tok_s", "prompt_tok_s_corrected",
                 "server_prefill_tok_s", "server_decode_tok_s", "spec_acceptance_rate", "tokens_per_joule")
LOWER_BETTER = ("ttft_ms", "ttfc_ms", "tpot_ms", "e2e_ms", "itl_ms_p50")
METRICS = HIGHER_BETTER + LOWER_BETTER
# The metrics of the side-by-side table of `bench compare` / `bench ab` (median of each).
MAIN_METRICS = ("decode_tok_s", "aggregate_decode_tok_s", "ttft_ms", "tpot_ms", "e2e_ms", "prompt_tok_s")
VERDICTS = ("regression", "inconclusive", "improved", "unchanged")
_RULE_KEYS = ("metric", "cell", "stat", "max_drop_pct", "max_rise_pct")
DEFAULT_GATE_TABLES: tuple[dict[str, Any], ...] = (
    {"metric": "decode_tok_s", "cell": "*", "stat": "median", "max_drop_pct": 5},
    {"metric": "ttft_ms", "cell": "*", "stat": "p90", "max_rise_pct": 10},
)
COUNT_METRICS = {"spec_acceptance_rate": ("spec_accepted_tokens", "spec_draft_tokens", "spec_drafts")}
"""Rates the server counts (its /metrics): metric -> (successes key, trials key, independent-trials key)."""
POWER = 0.80  # the probability with which the gate should detect a change of the minimum detectable effect
MIN_SAMPLES = 2  # fewer on either side: inconclusive (a bootstrap of one value says nothing about spread)


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated gate rule.

    Attributes:
        metric: a key of :data:`METRICS` (the sample lists of a cell summary).
        cell: a cell id (``d0-s1-prose``) or ``"*"`` for every cell present in both runs.
        stat: ``"mean"``, ``"median"`` or ``"pNN"`` (1..99); quantiles are trimmed Harrell-Davis estimates.
        max_change_pct: the allowed worsening in percent (a drop for higher-better, a rise for lower-better).
        index: position in the profile's ``[[gate]]`` list (None for built-in default rules).
    """

    metric: str
    cell: str
    stat: str
    max_change_pct: float
    index: int | None = None

    @property
    def higher_better(self) -> bool:
        """True when a larger value is better (throughputs), False for latencies."""
        return self.metric in HIGHER_BETTER

    @property
    def limit(self) -> float:
        """The ratio candidate/baseline at the edge of the allowance: ``1 - pct/100`` or ``1 + pct/100``."""
        pct = self.max_change_pct / 100.0
        return 1.0 - pct if self.higher_better else 1.0 + pct

    @property
    def key(self) -> str:
        """The TOML key holding the allowance: ``max_drop_pct`` or ``max_rise_pct``."""
        return "max_drop_pct" if self.higher_better else "max_rise_pct"

    @property
    def where(self) -> str:
        """``gate[i]`` for a profile rule, ``default`` for a built-in one."""
        return f"gate[{self.index}]" if self.index is not None else "default"

    def to_dict(self) -> dict[str, Any]:
        """The rule as a ``[[gate]]`` table."""
        return {"metric": self.metric, "cell": self.cell, "stat": self.stat, self.key: self.max_change_pct}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one rule in one cell.

    Attributes:
        rule: the rule.
        cell: the cell id compared.
        verdict: one of :data:`VERDICTS`.
        baseline, candidate: the statistic of each side in the metric's unit (None when it could not be computed).
        ratio: ``candidate / baseline`` (None when not computed).
        lo, hi: the confidence interval of the ratio at ``level`` (None when not computed).
        level: the confidence level (0.95).
        n_baseline, n_candidate: sample counts behind each side.
        note: why a verdict is inconclusive without an interval (missing cell, too few samples...), else "".
        mde_pct: the minimum detectable effect in percent (:func:`min_detectable_pct`; None without an interval).
        waves: the candidate's measured waves behind ``n_candidate`` (None when unknown: one sample per wave).
        planned_mde_pct: the MDE the gate planned to reach at its last look (:func:`plan_rule`; None outside
            the sequential gate).
        waves_baseline: the baseline's measured waves (None when unknown).
        look: the sequential look this verdict was made at (1, 2, ...; None for a fixed-sample comparison).
    """

    rule: Rule
    cell: str
    verdict: str
    baseline: float | None
    candidate: float | None
    ratio: float | None
    lo: float | None
    hi: float | None
    level: float
    n_baseline: int
    n_candidate: int
    note: str = ""
    mde_pct: float | None = None
    waves: int | None = None
    planned_mde_pct: float | None = None
    waves_baseline: int | None = None
    look: int | None = None

    @property
    def name(self) -> str:
        """Stable test name: ``decode_tok_s.median@d0-s1-prose``."""
        return f"{self.rule.metric}.{self.rule.stat}@{self.cell}"

    @property
    def failed(self) -> bool:
        """True for a regression or an inconclusive verdict (either fails the gate)."""
        return self.verdict in ("regression", "inconclusive")

    @property
    def resolution_ok(self) -> bool:
        """False when the minimum detectable effect exceeds the rule's allowance (the data are too noisy for it)."""
        return self.mde_pct is None or self.mde_pct <= self.rule.max_change_pct

    @property
    def waves_needed(self) -> int | None:
        """Waves per side that would bring the MDE under the allowance (None when it already is, or never can)."""
        if self.resolution_ok or self.mde_pct is None:
            return None
        return waves_needed(self.mde_pct, self.rule.max_change_pct, self.waves or self.n_candidate,
                            self.rule.higher_better)

    def resolution(self) -> str:
        """A sentence when the MDE exceeds the allowance (how many waves would fix it), else ""."""
        if self.resolution_ok or self.mde_pct is None:
            return ""
        now = self.waves or self.n_candidate
        need = self.waves_needed
        fix = (f"about {need} waves per side ({need - now} more than {now}) would resolve it" if need
               else "no number of waves can resolve a zero allowance" if self.rule.max_change_pct <= 0
               else "the noise is too large to say how many waves would resolve it")
        return (f"resolution: this comparison detects changes of {self.mde_pct:.1f} % (MDE at {POWER:.0%} power), "
                f"more than the allowed {self.rule.max_change_pct:g} %; {fix}")

    def explain(self) -> str:
        """One sentence saying why the verdict is what it is (for JUnit messages and logs)."""
        text = self._why()
        extra = self.resolution()
        return f"{text}. {extra}" if extra else text

    def _why(self) -> str:
        r = self.rule
        if self.lo is None or self.hi is None:
            return f"{self.verdict}: {self.note}"
        ci = f"{self.level:.0%} CI of the ratio [{self.lo:.3f}, {self.hi:.3f}]"
        if self.verdict == "regression":
            side = "below" if r.higher_better else "above"
            return f"regression: the whole {ci} is {side} the limit {r.limit:.3f} ({r.key} = {r.max_change_pct:g})"
        if self.verdict == "inconclusive":
            return (f"inconclusive: the {ci} straddles the limit {r.limit:.3f}; more samples "
                    f"(requests, or a larger budget: --max-time, --budget-waves) can settle it")
        if self.verdict == "improved":
            t = max(r.max_change_pct, self.mde_pct or 0.0)
            return f"improved: the whole {ci} is more than {t:.1f} % (allowance or MDE) on the better side of 1"
        return f"unchanged: the {ci} is within the allowance (limit {r.limit:.3f})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (the rule flattened in)."""
        return {
            "name": self.name, "metric": self.rule.metric, "stat": self.rule.stat, "cell": self.cell,
            "rule_cell": self.rule.cell, "rule_index": self.rule.index, "max_change_pct": self.rule.max_change_pct,
            "limit": self.rule.limit, "higher_better": self.rule.higher_better, "verdict": self.verdict,
            "baseline": self.baseline, "candidate": self.candidate, "ratio": self.ratio, "lo": self.lo,
            "hi": self.hi, "level": self.level, "n_baseline": self.n_baseline, "n_candidate": self.n_candidate,
            "note": self.note, "min_detectable_pct": self.mde_pct, "planned_mde_pct": self.planned_mde_pct,
            "resolution_ok": self.resolution_ok, "waves": {"baseline": self.waves_baseline, "candidate": self.waves},
            "waves_needed": self.waves_needed, "look": self.look,
        }


# --- rules -------------------------------------------------------------------------------------------------------


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_rules(tables: Iterable[Mapping[str, Any]], where: str = "profile") -> list[Rule]:
    """Validate ``[[gate]]`` tables (``Profile.gate``) into rules.

    Each table needs ``metric`` (one of :data:`METRICS`), optional ``cell`` (default ``"*"``), optional ``stat``
    (default ``"median"``), and the allowance matching the metric's direction: ``max_drop_pct`` for higher-better
    metrics, ``max_rise_pct`` for lower-better ones (a number in [0, 100) resp. >= 0).

    Raises:
        ConfigError: one line naming the bad key, e.g.
            ``profile quick: gate[1].max_drop_pct: ttft_ms is lower-is-better; use max_rise_pct``.
    """
    out: list[Rule] = []
    for i, t in enumerate(tables):
        w = f"{where}: gate[{i}]"
        if not isinstance(t, Mapping):
            raise ConfigError(f"{w}: must be a table, not {type(t).__name__}")
        for k in t:
            if k not in _RULE_KEYS:
                raise ConfigError(f"{w}.{k}: unknown key (known: {', '.join(_RULE_KEYS)})")
        metric = t.get("metric")
        if metric is None:
            raise ConfigError(f"{w}.metric: missing (one of {', '.join(METRICS)})")
        if metric not in METRICS:
            raise ConfigError(f"{w}.metric: unknown metric {metric!r} (one of {', '.join(METRICS)})")
        cell = t.get("cell", "*")
        if not isinstance(cell, str) or not cell:
            raise ConfigError(f"{w}.cell: must be a cell id like 'd0-s1-prose' or '*', not {cell!r}")
        stat = t.get("stat", "median")
        try:
            if not isinstance(stat, str):
                raise ValueError
            make_estimator(stat)
        except ValueError:
            raise ConfigError(f"{w}.stat: unknown statistic {stat!r} (mean, median, or p1..p99 such as p90)") from None
        higher = metric in HIGHER_BETTER
        want, other = ("max_drop_pct", "max_rise_pct") if higher else ("max_rise_pct", "max_drop_pct")
        if other in t:
            kind = "higher-is-better" if higher else "lower-is-better"
            raise ConfigError(f"{w}.{other}: {metric} is {kind}; use {want}")
        if want not in t:
            raise ConfigError(f"{w}.{want}: missing (the allowed {'drop' if higher else 'rise'} of {metric}, in %)")
        pct = t[want]
        if not _is_num(pct) or pct < 0 or (higher and pct >= 100):
            rng = "in [0, 100)" if higher else ">= 0"
            raise ConfigError(f"{w}.{want}: must be a number {rng}, not {pct!r}")
        out.append(Rule(metric, cell, stat, float(pct), i))
    return out


def default_rules() -> list[Rule]:
    """The built-in rules used when a profile has no ``[[gate]]``: decode_tok_s median may drop 5 % and ttft_ms p90
    may rise 10 %, in every cell."""
    return [Rule(r.metric, r.cell, r.stat, r.max_change_pct, None) for r in parse_rules(DEFAULT_GATE_TABLES)]


def rules_from_results(results: Results) -> list[Rule]:
    """The rules stored with a results file (``profile.settings.gate``), or :func:`default_rules` when it has none.

    Raises ConfigError naming the bad key.
    """
    tables = results.profile.settings.get("gate") or []
    if not tables:
        return default_rules()
    if not isinstance(tables, list):
        raise ConfigError(f"profile {results.profile.name or '?'} (from results): gate must be a list of tables")
    return parse_rules([_stored_table(t) for t in tables], f"profile {results.profile.name or '?'} (from results)")


def _stored_table(t: Any) -> Any:
    """A stored rule as a ``[[gate]]`` table: results written by earlier builds stored the parsed :class:`Rule`
    (``max_change_pct`` and ``index``); that form is turned back into the allowance key of its metric."""
    if not isinstance(t, Mapping) or "max_change_pct" not in t:
        return t
    out = {k: v for k, v in t.items() if k not in ("max_change_pct", "index")}
    key = "max_drop_pct" if t.get("metric") in HIGHER_BETTER else "max_rise_pct"
    out[key] = t["max_change_pct"]
    return out


def profile_rules(rules: Sequence[Rule]) -> tuple[list[Rule], bool]:
    """A profile's parsed ``[[gate]]`` rules, or the default rules: ``(rules, from_profile)``."""
    return (list(rules), True) if rules else (default_rules(), False)


def main_verdicts(baseline: Results, candidate: Results, *, seed: int = 0) -> list[Verdict]:
    """Zero-allowance median comparisons of :data:`MAIN_METRICS` in every common cell, cell by cell (the
    side-by-side table of compare / ab; the verdict word only says on which side of 1 the whole CI lies).
    ``prompt_tok_s`` only in cells that measure prefill (:attr:`CellResult.measures_prefill`)."""
    rules = [Rule(m, "*", "median", 0.0, None) for m in MAIN_METRICS]
    cells = {c.id: c for c in candidate.cells}
    vs = [v for v in compare(baseline, candidate, rules, seed=seed)  # prompt tok/s only where it is prefill's
          if v.rule.metric != "prompt_tok_s" or (v.cell in cells and cells[v.cell].measures_prefill)]
    order = {c.id: i for i, c in enumerate(candidate.cells)}
    return sorted(vs, key=lambda v: (order.get(v.cell, 0), MAIN_METRICS.index(v.rule.metric)))


def check_rule_cells(rules: Sequence[Rule], cell_ids: Iterable[str], where: str = "profile") -> None:
    """Raise ConfigError (naming ``gate[i].cell``) when a rule names a cell that is not among ``cell_ids``."""
    ids = list(cell_ids)
    for r in rules:
        if r.cell != "*" and r.cell not in ids:
            shown = ", ".join(ids[:8]) + (" ..." if len(ids) > 8 else "")
            raise ConfigError(f"{where}: {r.where}.cell: no cell {r.cell!r} in this profile (cells: {shown})")


# --- results files -----------------------------------------------------------------------------------------------


def _ident(results: Results) -> dict[str, Any]:
    return {"profile": results.profile.name, "model": results.endpoint.model,
            "backend": results.server.get("backend")}


def check_comparable(baseline: Results, candidate: Results, force: bool = False, *,
                     ignore_interrupted: bool = False) -> list[str]:
    """Check that two runs can be compared: same profile name, model and server backend, the same requests
    (:func:`setting_diffs`), both complete (a run that was interrupted or killed before its end is incomplete).

    Returns the differences found (one line each; empty when comparable). With ``force`` differences are returned
    instead of raised, for the caller to print as warnings.

    Raises:
        ConfigError: on any difference when not ``force``; the message lists them and mentions ``--force``.
    """
    diffs = []
    a, b = _ident(baseline), _ident(candidate)
    for k in ("profile", "model", "backend"):
        if a[k] != b[k]:
            diffs.append(f"{k} differs: baseline {a[k]!r}, candidate {b[k]!r}")
    diffs += setting_diffs(baseline, candidate)
    for name, res in (("baseline", baseline), ("candidate", candidate)):
        if ignore_interrupted:
            break
        if res.run.interrupted:
            diffs.append(f"the {name} run was interrupted (cells may be missing or short)")
        elif not res.run.complete:
            diffs.append(f"the {name} run is incomplete (it was stopped before its end)")
    if diffs and not force:
        raise ConfigError("runs are not comparable: " + "; ".join(diffs) + " (--force compares anyway)")
    return diffs


# The profile's settings that shape every request (a cell's max_tokens, images and image size are compared per cell).
# tests/test_gate.py checks that every Profile field is here, per cell, or named as not shaping a request, and that
# the history's setups (bench.history.store.measured_settings) tell apart at least the runs these do.
REQUEST_SETTINGS = ("temperature", "thinking", "endpoint", "tools", "tool_choice", "prefix_cache", "force_length",
                    "image_format", "image_source", "warmup")
OPEN_LOOP_SAMPLE = frozenset({"seed", "duration_s", "requests"})  # an open-loop load's sample, its size and draw


def setting_diffs(baseline: Results, candidate: Results) -> list[str]:
    """What the two runs' requests differ in (a baseline of ``--max-tokens 48`` gated with 16 passed): each common
    cell's ``max_tokens``, images and image size, the profiles' :data:`REQUEST_SETTINGS` and the open-loop load
    (``results.load``) less its sample (:data:`OPEN_LOOP_SAMPLE`); one line each."""
    out = []
    sa, sb = (r.profile.settings if isinstance(r.profile.settings, dict) else {} for r in (baseline, candidate))
    for k in (k for k in REQUEST_SETTINGS if k in sa and k in sb):  # a run stored before k was recorded: not judged
        if sa[k] != sb[k]:
            out.append(f"{k} differs: baseline {sa[k]!r}, candidate {sb[k]!r}")
    la, lb = ({k: v for k, v in (r.load or {}).items() if k not in OPEN_LOOP_SAMPLE} for r in (baseline, candidate))
    out += [f"load {k} differs: baseline {la.get(k)!r}, candidate {lb.get(k)!r}" for k in sorted(set(la) | set(lb))
            if la.get(k) != lb.get(k)]
    cand = {c.id: c for c in candidate.cells}
    for c, other in ((c, cand.get(c.id)) for c in baseline.cells):
        for k in ("max_tokens", "images", "image_size"):
            if other is not None and getattr(c, k, None) != getattr(other, k, None):
                out.append(f"{c.id}: {k} differs: baseline {getattr(c, k)!r}, candidate {getattr(other, k)!r}")
    return out


def cell_samples(cell: CellResult, metric: str) -> list[float]:
    """The raw samples of ``metric`` in a cell summary (``cell.samples[metric]``), None/NaN dropped."""
    vs = cell.samples.get(metric) or []
    return [float(v) for v in vs if v is not None and _is_num(v)]


def _proportion(cell: CellResult, metric: str) -> tuple[float, float] | None:
    """``(rate, effective trials)`` of a count metric from a cell's ``server_metrics``: the acceptance rate
    (accepted / drafted tokens) with the number of drafts as the trials (tokens of one draft are not independent),
    or None when the server did not count it."""
    acc_key, n_key, eff_key = COUNT_METRICS[metric]
    sm = cell.server_metrics or {}
    acc, n, eff = (float(v) if _is_num(v) else 0.0 for v in (sm.get(acc_key), sm.get(n_key), sm.get(eff_key)))  # type: ignore[arg-type]
    if n <= 0 or acc <= 0:
        return None
    return acc / n, eff if eff > 0 else n


def compare_counts(rule: Rule, cell: str, base: CellResult, cand: CellResult, *, level: float = 0.95) -> Verdict:
    """The verdict of a rule on a rate the server counts (``spec_acceptance_rate``): the ratio of two proportions
    with the log-ratio normal interval (Katz), each side's trials being its drafts; inconclusive when a side has no
    count."""
    b, c = _proportion(base, rule.metric), _proportion(cand, rule.metric)
    if b is None or c is None:
        missing = " and ".join(s for s, v in (("baseline", b), ("candidate", c)) if v is None)
        return Verdict(rule, cell, "inconclusive", b[0] if b else None, c[0] if c else None, None, None, None,
                       level, 0, 0, f"the {missing} server counted no {rule.metric} (its /metrics)")
    (pb, nb), (pc, nc) = b, c
    ratio = pc / pb
    se = math.sqrt(max(0.0, (1 - pb) / (pb * nb)) + max(0.0, (1 - pc) / (pc * nc)))
    z = NormalDist().inv_cdf(0.5 + level / 2)
    lo, hi = ratio * math.exp(-z * se), ratio * math.exp(z * se)
    return Verdict(rule, cell, classify(rule, lo, hi), pb, pc, ratio, lo, hi, level, int(nb), int(nc))


# --- verdicts ----------------------------------------------------------------------------------------------------


def classify(rule: Rule, lo: float, hi: float, mde_pct: float = 0.0) -> str:
    """Verdict of a ratio interval ``[lo, hi]`` under ``rule`` (table in the module docstring).

    ``improved`` needs the whole interval beyond ``t = max(allowance, mde_pct)`` percent on the better side of 1.
    """
    lim = rule.limit
    t = max(rule.max_change_pct, mde_pct) / 100.0
    if rule.higher_better:
        if hi < lim:
            return "regression"
        if lo < lim:
            return "inconclusive"
        return "improved" if lo > 1.0 + t else "unchanged"
    if lo > lim:
        return "regression"
    if hi > lim:
        return "inconclusive"
    return "improved" if hi < 1.0 - t else "unchanged"


def min_detectable_pct(lo: float, hi: float, n_baseline: int, n_candidate: int, level: float = 0.95,
                       power: float = POWER, higher_better: bool | None = None) -> float:
    """The minimum detectable effect, in percent of the ratio, of a comparison whose interval is ``[lo, hi]``.

    ``z = Phi^-1(1 - tail)``, ``tail`` the one-sided tail the interval was read at (:func:`bench.stats.expanded_tail`
    for these sample counts), ``k = z + Phi^-1(power)``. With ``higher_better`` given the interval is read on the log
    scale, where a ratio's spread does not grow with the ratio: ``SE = (ln hi - ln lo) / (2 z)``, and the MDE is the
    change in the rule's worse direction, ``1 - exp(-k SE)`` (a drop, higher-better) or ``exp(k SE) - 1`` (a rise).
    With ``higher_better`` None, linearly: ``SE = (hi - lo) / (2 z)``, ``MDE = k SE`` (the same near a ratio of 1).
    A true change of MDE percent puts the interval clear of 1 with probability ``power``; equally, an unchanged
    candidate stays inside an allowance of MDE percent with that probability.
    """
    tail = expanded_tail(level, n_baseline, n_candidate) or (1.0 - level) / 2.0
    nd = NormalDist()
    z = nd.inv_cdf(1.0 - tail)
    k = z + nd.inv_cdf(power)
    if higher_better is None or lo <= 0 or hi <= 0:
        return k * max(hi - lo, 0.0) / (2.0 * z) * 100.0
    se = max(math.log(hi) - math.log(lo), 0.0) / (2.0 * z)
    return (1.0 - math.exp(-k * se) if higher_better else math.exp(k * se) - 1.0) * 100.0


def _log_change(pct: float, higher_better: bool | None) -> float:
    if higher_better is None:
        return pct
    return -math.log(1.0 - pct / 100.0) if higher_better else math.log(1.0 + pct / 100.0)


def waves_needed(mde_pct: float, allowance_pct: float, waves: int, higher_better: bool | None = None) -> int | None:
    """Waves per side that bring an MDE of ``mde_pct`` (measured with ``waves``) down to ``allowance_pct``.

    Noise falls like ``1/sqrt(n)``, so ``ceil(waves * (mde / allowance)^2)``, the two read on the log scale of
    :func:`min_detectable_pct` when ``higher_better`` is given; ``waves`` itself when the MDE is already within the
    allowance; None for a zero allowance (no finite number of waves reaches it).
    """
    if mde_pct <= allowance_pct:
        return max(waves, 1)
    if allowance_pct <= 0 or (higher_better and mde_pct >= 100.0):
        return None
    ratio = _log_change(mde_pct, higher_better) / _log_change(allowance_pct, higher_better)
    return max(math.ceil(max(waves, 1) * ratio ** 2 - 1e-9), max(waves, 1) + 1)


def _seed(seed: int, rule: Rule, cell: str) -> list[int]:
    # One independent, order-free stream per (rule, cell): adding a rule never changes another verdict.
    tag = f"{rule.metric}|{rule.stat}|{rule.max_change_pct}|{rule.cell}|{cell}"
    return [seed, zlib.crc32(tag.encode())]


def compare_samples(
    rule: Rule, cell: str, base: Sequence[float], cand: Sequence[float], *, level: float = 0.95, seed: int = 0,
    resamples: int = 4000, waves: int | None = None, waves_baseline: int | None = None,
) -> Verdict:
    """The verdict of ``rule`` for one cell from the two sides' raw samples.

    Fewer than 2 samples on a side, or a non-positive baseline statistic, gives ``inconclusive`` with a note.
    ``waves``: the candidate's measured waves (for :attr:`Verdict.waves_needed`; default one sample per wave).
    """
    nb, nc = len(base), len(cand)

    def point(xs: Sequence[float]) -> float | None:
        return float(make_estimator(rule.stat)(np.asarray([list(xs)], dtype=float))[0]) if xs else None

    if nb < MIN_SAMPLES or nc < MIN_SAMPLES:
        bv, cv = point(base), point(cand)
        ratio = cv / bv if bv and cv is not None and bv > 0 else None
        return Verdict(rule, cell, "inconclusive", bv, cv, ratio, None, None, level, nb, nc,
                       f"too few samples to compare (baseline {nb}, candidate {nc}; need {MIN_SAMPLES} each)")
    try:
        bv, cv, ratio, lo, hi = bootstrap_ratio_ci(base, cand, rule.stat, level=level, resamples=resamples,
                                                   seed=_seed(seed, rule, cell))
    except ValueError as e:
        return Verdict(rule, cell, "inconclusive", point(base), point(cand), None, None, None, level, nb, nc, str(e))
    mde = min_detectable_pct(lo, hi, nb, nc, level, higher_better=rule.higher_better)
    return Verdict(rule, cell, classify(rule, lo, hi, mde), bv, cv, ratio, lo, hi, level, nb, nc, "", mde,
                   waves if waves else nc, waves_baseline=waves_baseline or nb)


def compare(
    baseline: Results,
    candidate: Results,
    rules: Sequence[Rule],
    *,
    level: float = 0.95,
    seed: int = 0,
    resamples: int = 4000,
) -> list[Verdict]:
    """Apply ``rules`` to two results dicts; one :class:`Verdict` per rule and matching cell, in rule order then
    candidate cell order.

    A ``"*"`` rule covers every cell present in both runs where at least one side has samples of the metric (so a
    metric a backend never reports, such as ``server_prefill_tok_s``, is skipped quietly). A rule naming one cell
    gives an ``inconclusive`` verdict with a note when that cell or its samples are missing on either side.
    Deterministic for a ``seed``.
    """
    bcells = {c.id: c for c in baseline.cells}
    ccells = {c.id: c for c in candidate.cells}
    order = [cid for cid in ccells if cid in bcells]
    out: list[Verdict] = []
    for rule in rules:
        if rule.metric in COUNT_METRICS:
            out += _count_verdicts(rule, bcells, ccells, order, level)
            continue
        if rule.cell == "*":
            for cid in order:
                bs, cs = cell_samples(bcells[cid], rule.metric), cell_samples(ccells[cid], rule.metric)
                if not bs and not cs:
                    continue
                out.append(compare_samples(rule, cid, bs, cs, level=level, seed=seed, resamples=resamples,
                                           waves=_waves(ccells[cid]), waves_baseline=_waves(bcells[cid])))
            continue
        cid = rule.cell
        missing = [side for side, cells in (("baseline", bcells), ("candidate", ccells)) if cid not in cells]
        if missing:
            out.append(Verdict(rule, cid, "inconclusive", None, None, None, None, None, level, 0, 0,
                               f"cell {cid} is not in the {' nor the '.join(missing)} run"))
            continue
        bs, cs = cell_samples(bcells[cid], rule.metric), cell_samples(ccells[cid], rule.metric)
        out.append(compare_samples(rule, cid, bs, cs, level=level, seed=seed, resamples=resamples,
                                   waves=_waves(ccells[cid]), waves_baseline=_waves(bcells[cid])))
    return out


def _count_verdicts(rule: Rule, bcells: Mapping[str, CellResult], ccells: Mapping[str, CellResult],
                    order: Sequence[str], level: float) -> list[Verdict]:
    ids = order if rule.cell == "*" else [rule.cell]
    out = []
    for cid in ids:
        b, c = bcells.get(cid), ccells.get(cid)
        if b is None or c is None:
            out.append(Verdict(rule, cid, "inconclusive", None, None, None, None, None, level, 0, 0,
                               f"cell {cid} is not in both runs"))
        elif rule.cell != "*" or _proportion(b, rule.metric) or _proportion(c, rule.metric):
            out.append(compare_counts(rule, cid, b, c, level=level))
    return out


def _waves(cell: CellResult) -> int | None:
    # A cell's measured waves (the re-measure unit); None when the summary does not say.
    return cell.waves if cell.waves > 0 else None


def overall_exit(verdicts: Sequence[Verdict]) -> int:
    """Exit code of a gate: 1 when any verdict is a regression, else 2 when any is inconclusive, else 0.

    An empty list (nothing could be compared) is 2: a gate that checked nothing has not passed.
    """
    kinds = {v.verdict for v in verdicts}
    if "regression" in kinds:
        return EXIT_CHECK_FAILED
    if "inconclusive" in kinds or not verdicts:
        return EXIT_INCONCLUSIVE
    return EXIT_OK


def inconclusive_cells(verdicts: Sequence[Verdict]) -> list[str]:
    """Ids of the cells with an inconclusive verdict that has an interval (more samples can settle it), in order."""
    out: list[str] = []
    for v in verdicts:
        settle = (v.lo is not None or (v.n_candidate < MIN_SAMPLES <= v.n_baseline)
                  or (v.look is not None and v.ratio is not None))  # a sequential look that could not decide yet
        if v.verdict == "inconclusive" and settle and v.cell not in out:
            out.append(v.cell)
    return out


def verdict_counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """``{verdict: count}`` over :data:`VERDICTS` (zeros included)."""
    return {k: sum(1 for v in verdicts if v.verdict == k) for k in VERDICTS}


def uncovered_cells(baseline: Results, candidate: Results) -> list[str]:
    """Ids of candidate cells absent from the baseline (no rule can check them: worth a warning)."""
    have = {c.id for c in baseline.cells}
    return [c.id for c in candidate.cells if c.id not in have]


def require_common_cells(a: Results, b: Results, names: tuple[str, str] = ("A", "B")) -> None:
    """Raise ConfigError (exit 3: incomparable files) when ``a`` and ``b`` have no cell in common, naming the cells
    only in each (a few of them): nothing could be compared, and ``--force`` cannot change that."""
    ids_a, ids_b = [c.id for c in a.cells], [c.id for c in b.cells]
    if set(ids_a) & set(ids_b):
        return

    def few(ids: list[str]) -> str:
        return ", ".join(ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "") if ids else "none"

    raise ConfigError(f"incomparable files: no cell in common (only in {names[0]}: {few(ids_a)}; only in "
                      f"{names[1]}: {few(ids_b)}); compare runs of the same cells (--streams, --depths, --prompt)")


HOST_LOAD_CHANGE_CORES = 0.25  # other work on the host moved by more cores than this: the verdicts may be its


def host_load_change(baseline: Results, candidate: Results) -> dict[str, Any] | None:
    """When the server ran on bench's host in both runs and other work there kept a different number of cores busy
    (``machine.other_load.other_cores``, :mod:`bench.session.hostload`) by more than
    :data:`HOST_LOAD_CHANGE_CORES`: ``{"baseline_other_cores", "candidate_other_cores", "change_cores"}``; else
    None (a remote server, or a run that did not record it). The server's speed moves with such load, so the
    gate's verdicts may be the machine's, not the change's."""
    a = (baseline.machine or {}).get("other_load") or {}
    b = (candidate.machine or {}).get("other_load") or {}
    xs, ys = a.get("other_cores"), b.get("other_cores")
    if not (a.get("server_local") and b.get("server_local")) or not (_is_num(xs) and _is_num(ys)):
        return None
    x, y = float(xs or 0.0), float(ys or 0.0)
    if abs(y - x) <= HOST_LOAD_CHANGE_CORES:
        return None
    return {"baseline_other_cores": x, "candidate_other_cores": y, "change_cores": round(y - x, 3)}
