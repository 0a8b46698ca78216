"""``bench history check``: change points in every stored series of one metric, judged against the gate's rule.

A series is one cell of one *setup* (profile, model, endpoint URL and the settings run with: runs of another
profile, other settings or another server measure something else and are never mixed in): one statistic (the
rule's, else the median) of the metric over that setup's stored runs in the order they were made.
:func:`bench.history.changepoints.detect` finds its change points; each is a *regression* or an *improvement* by
the metric's direction (throughputs higher-better, latencies lower-better).
The check fails (exit 1) when a regression larger than the rule's allowance (``max_drop_pct`` /
``max_rise_pct`` of the setup's newest run's profile, else the gate's default rule, else 0) starts within the
last ``recent`` runs of its setup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.errors import EXIT_CHECK_FAILED, EXIT_OK, ConfigError
from bench.history import runs_text
from bench.history.changepoints import METHODS, MIN_SIZE, Change, detect
from bench.history.store import STAT_COLUMNS, HistoryStore, Point, RunRow, Setup, setup_labels, setup_url

__all__ = ["CheckSettings", "check_history", "higher_better", "allowance_for"]


def higher_better(metric: str) -> bool:
    """Throughputs (``*_tok_s``) are better higher; latencies (``*_ms``) lower."""
    from bench.gate import HIGHER_BETTER

    return metric in HIGHER_BETTER or metric.endswith("_tok_s")


def allowance_for(metric: str, cell: str, runs: Sequence[RunRow]) -> tuple[float, str, str]:
    """``(allowed worsening %, stat, where)``: the newest run's profile rule for this metric and cell (an exact
    cell rule before ``*``), else the gate's default rule, else ``(0, median, none)``."""
    from bench.gate import default_rules, parse_rules

    tables = runs[-1].gate_rules if runs else []
    try:
        rules = parse_rules(tables, "stored gate rules") if tables else []
    except ConfigError:
        rules = []
    for source, rs in (("profile", rules), ("default", default_rules())):
        for want in (cell, "*"):
            for r in rs:
                if r.metric == metric and r.cell == want:
                    stat = r.stat if r.stat in STAT_COLUMNS else "median"
                    return r.max_change_pct, stat, f"{source} rule {r.key} = {r.max_change_pct:g}"
    return 0.0, "median", "no rule: any regression counts"


@dataclass(frozen=True)
class CheckSettings:
    """The options of one check (``profile``, ``model``, ``endpoint``: only the setups that match, None: any)."""

    metric: str = "decode_tok_s"
    stat: str | None = None  # None: the rule's statistic
    cells: tuple[str, ...] = ()
    recent: int = 5
    method: str = "pelt"
    allowance_pct: float | None = None  # None: the rule's
    profile: str | None = None
    model: str | None = None
    endpoint: str | None = None


def _side(points: Sequence[Point], span: tuple[int, int]) -> dict[str, Any]:
    pts = points[span[0]:span[1]]
    vals = sorted(p.value for p in pts)
    return {"runs": len(pts), "first_run_index": pts[0].index, "last_run_index": pts[-1].index,
            "first_run_id": pts[0].run.run_id, "last_run_id": pts[-1].run.run_id,
            "median": vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2}


@dataclass(frozen=True)
class _SetupRuns:
    """One setup's runs, in the order made, its number among the store's setups (1-based) and its one-line name
    (:func:`bench.history.store.setup_labels`)."""

    setup: Setup
    number: int
    runs: list[RunRow]
    label: str = ""

    def fields(self) -> dict[str, Any]:
        return {"setup": self.number, **self.setup.to_dict()}


def _change_doc(cell: str, metric: str, stat: str, points: Sequence[Point], c: Change, allowance: float,
                sr: _SetupRuns, recent: int) -> dict[str, Any]:
    p = points[c.index]
    worse = c.change_pct < 0 if higher_better(metric) else c.change_pct > 0
    at = next(i for i, r in enumerate(sr.runs) if r.pk == p.run.pk)
    return {"cell": cell, "metric": metric, "stat": stat, "run_index": p.index, "run_id": p.run.run_id,
            "started": p.run.started, "commit": p.run.commit_sha, "branch": p.run.branch,
            "change_pct": round(c.change_pct, 3), "ci_pct": [round(c.lo_pct, 3), round(c.hi_pct, 3)],
            "p_value": c.p_value, "direction": "regression" if worse else "improvement",
            "beyond_allowance": abs(c.change_pct) > allowance, "allowance_pct": allowance,
            "recent": at >= len(sr.runs) - recent, **sr.fields(), "setup_run_index": at,
            "before": _side(points, c.before), "after": _side(points, c.after)}


def _matches(setup: Setup, s: CheckSettings) -> bool:
    return ((s.profile is None or setup.profile == s.profile) and (s.model is None or setup.model == s.model)
            and (s.endpoint is None or setup.endpoint_url.rstrip("/") == setup_url(s.endpoint).rstrip("/")))


def _setups(runs: Sequence[RunRow], s: CheckSettings, where: str) -> list[_SetupRuns]:
    """The store's setups that match the settings' filters; ConfigError when none does (or none is stored)."""
    if not runs:
        raise ConfigError(f"history {where}: no runs stored (bench history add adds them)")
    by: dict[Setup, list[RunRow]] = {}
    for r in runs:
        by.setdefault(r.setup, []).append(r)
    labels = setup_labels(runs)
    out = [_SetupRuns(k, i + 1, v, labels[k]) for i, (k, v) in enumerate(by.items()) if _matches(k, s)]
    if not out:
        given = ", ".join(f"{o} {v}" for o, v in (("--profile", s.profile), ("--model", s.model),
                                                   ("--endpoint", s.endpoint)) if v is not None)
        stored = "; ".join(labels.values())
        raise ConfigError(f"history {where}: no stored run matches {given} (stored: {stored})")
    return out


def _check_setup(store: HistoryStore, s: CheckSettings, sr: _SetupRuns, cells: Sequence[str],
                 cache: dict[str, dict[tuple[Setup, str], list[Point]]]) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]]]:
    """``(series notes, changes)`` of one setup's series of the metric, one per cell it has."""
    notes: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    for cell in cells:
        allowance, rule_stat, where = allowance_for(s.metric, cell, sr.runs)
        if s.allowance_pct is not None:
            allowance, where = s.allowance_pct, f"--allowance {s.allowance_pct:g}"
        stat = s.stat or rule_stat
        if stat not in cache:
            cache[stat] = store.setup_series(s.metric, stat, cells)
        pts = cache[stat].get((sr.setup, cell), [])
        if not pts:
            continue
        res = detect([p.value for p in pts], method=s.method, judge_last=s.recent)
        notes.append({"cell": cell, "metric": s.metric, "stat": stat, "runs": res.n, "status": res.status,
                      "min_runs": res.need,
                      "noise_pct": None if res.noise_pct is None else round(res.noise_pct, 3), "note": res.note,
                      "allowance_pct": allowance, "rule": where, "changes": len(res.changes), **sr.fields(),
                      "setup_runs": len(sr.runs)})
        changes += [_change_doc(cell, s.metric, stat, pts, c, allowance, sr, s.recent) for c in res.changes]
    return notes, changes


def check_history(store: HistoryStore, s: CheckSettings) -> dict[str, Any]:
    """The check's document (``--json``): ``changes``, ``series`` notes, ``setups``, the number of series
    ``judged`` and ``not_judged`` (too short, too noisy, bad values), ``exit`` (0 also when nothing was judged).

    A series is one cell of one setup (:class:`bench.history.store.Setup`: profile, model, endpoint URL); change
    points are searched in each on its own, and "recent" counts the runs of the change's setup.

    Raises:
        ConfigError: an unknown method or statistic, ``recent`` below what the method can see (3 runs for
            ``pelt`` and ``binseg``, 1 for ``threshold``), no stored run (of the setups asked for), or
            no stored series of the metric.
    """
    if s.method not in METHODS:
        raise ConfigError(f"--method {s.method}: one of {', '.join(METHODS)}")
    try:
        import ruptures  # noqa: F401
        import scipy  # noqa: F401
    except ImportError:
        raise ConfigError("bench history check needs ruptures and scipy: pip install 'bench[history]'") from None
    if s.method == "threshold" and s.recent < 1:
        raise ConfigError(f"--recent {s.recent}: must be at least 1")
    if s.method != "threshold" and s.recent < MIN_SIZE:  # a change needs MIN_SIZE runs after it to be found
        raise ConfigError(f"--recent {s.recent}: must be at least {MIN_SIZE} (--method {s.method} sees a change "
                          f"{MIN_SIZE} runs after it at the earliest)")
    runs = store.runs()
    setups = _setups(runs, s, store.where)
    cells = list(s.cells) or store.cells()
    changes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    cache: dict[str, dict[tuple[Setup, str], list[Point]]] = {}
    checked = []
    for sr in setups:
        n, c = _check_setup(store, s, sr, cells, cache)
        notes += n
        changes += c
        if n:
            checked.append({**sr.fields(), "runs": len(sr.runs), "label": sr.label})
    if not notes:
        what = f" in cell(s) {', '.join(s.cells)}" if s.cells else ""
        raise ConfigError(f"history {store.where}: no stored {s.metric}{what} ({runs_text(len(runs))} stored)")
    failing = [c for c in changes if c["direction"] == "regression" and c["recent"] and c["beyond_allowance"]]
    judged = sum(n["status"] == "ok" for n in notes)
    return {"db": store.where, "metric": s.metric, "method": s.method, "recent": s.recent, "runs": len(runs),
            "changes": changes, "series": notes, "setups": checked, "failing": len(failing),
            "judged": judged, "not_judged": len(notes) - judged, "exit": EXIT_CHECK_FAILED if failing else EXIT_OK}
