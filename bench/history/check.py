"""``bench history check``: change points in every stored series of one metric, judged against the gate's rule.

For each cell, the series is one statistic (the rule's, else the median) of the metric over the stored runs in
the order they were made. :func:`bench.history.changepoints.detect` finds its change points; each is a
*regression* or an *improvement* by the metric's direction (throughputs higher-better, latencies lower-better).
The check fails (exit 1) when a regression larger than the rule's allowance (``max_drop_pct`` /
``max_rise_pct`` of the newest run's profile, else the gate's default rule, else 0) starts within the last
``recent`` runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.errors import EXIT_CHECK_FAILED, EXIT_OK, ConfigError
from bench.history.changepoints import METHODS, Change, detect
from bench.history.store import STAT_COLUMNS, HistoryStore, Point, RunRow

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
    return 0.0, "median", "no rule (any regression counts)"


@dataclass(frozen=True)
class CheckSettings:
    """The options of one check."""

    metric: str = "decode_tok_s"
    stat: str | None = None  # None: the rule's statistic
    cells: tuple[str, ...] = ()
    recent: int = 5
    method: str = "pelt"
    allowance_pct: float | None = None  # None: the rule's


def _side(points: Sequence[Point], span: tuple[int, int]) -> dict[str, Any]:
    pts = points[span[0]:span[1]]
    vals = sorted(p.value for p in pts)
    return {"runs": len(pts), "first_run_index": pts[0].index, "last_run_index": pts[-1].index,
            "first_run_id": pts[0].run.run_id, "last_run_id": pts[-1].run.run_id,
            "median": vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2}


def _change_doc(cell: str, metric: str, stat: str, points: Sequence[Point], c: Change, allowance: float,
                first_recent: int) -> dict[str, Any]:
    p = points[c.index]
    worse = c.change_pct < 0 if higher_better(metric) else c.change_pct > 0
    return {"cell": cell, "metric": metric, "stat": stat, "run_index": p.index, "run_id": p.run.run_id,
            "started": p.run.started, "commit": p.run.commit_sha, "branch": p.run.branch,
            "change_pct": round(c.change_pct, 3), "ci_pct": [round(c.lo_pct, 3), round(c.hi_pct, 3)],
            "p_value": c.p_value, "direction": "regression" if worse else "improvement",
            "beyond_allowance": abs(c.change_pct) > allowance, "allowance_pct": allowance,
            "recent": p.index >= first_recent,
            "before": _side(points, c.before), "after": _side(points, c.after)}


def check_history(store: HistoryStore, s: CheckSettings) -> dict[str, Any]:
    """The check's document (``--json``): ``changes``, ``series`` notes, ``exit``.

    Raises:
        ConfigError: an unknown method or statistic, ``recent`` < 1, or no stored series of the metric.
    """
    if s.method not in METHODS:
        raise ConfigError(f"--method {s.method}: one of {', '.join(METHODS)}")
    try:
        import ruptures  # noqa: F401
        import scipy  # noqa: F401
    except ImportError:
        raise ConfigError("bench history check needs ruptures and scipy: pip install 'bench[history]'") from None
    if s.recent < 1:
        raise ConfigError(f"--recent {s.recent}: must be at least 1")
    runs = store.runs()
    first_recent = len(runs) - s.recent
    changes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    cells = list(s.cells) or store.cells()
    found_any = False
    for cell in cells:
        allowance, rule_stat, where = allowance_for(s.metric, cell, runs)
        if s.allowance_pct is not None:
            allowance, where = s.allowance_pct, f"--allowance {s.allowance_pct:g}"
        stat = s.stat or rule_stat
        pts = store.series(s.metric, stat, [cell]).get(cell, [])
        if not pts:
            continue
        found_any = True
        res = detect([p.value for p in pts], method=s.method)
        notes.append({"cell": cell, "metric": s.metric, "stat": stat, "runs": res.n, "status": res.status,
                      "noise_pct": None if res.noise_pct is None else round(res.noise_pct, 3), "note": res.note,
                      "allowance_pct": allowance, "rule": where, "changes": len(res.changes)})
        changes += [_change_doc(cell, s.metric, stat, pts, c, allowance, first_recent) for c in res.changes]
    if not found_any:
        what = f" in cell(s) {', '.join(s.cells)}" if s.cells else ""
        raise ConfigError(f"history {store.where}: no stored {s.metric}{what} ({len(runs)} runs stored)")
    failing = [c for c in changes if c["direction"] == "regression" and c["recent"] and c["beyond_allowance"]]
    return {"db": store.where, "metric": s.metric, "method": s.method, "recent": s.recent, "runs": len(runs),
            "changes": changes, "series": notes, "failing": len(failing),
            "exit": EXIT_CHECK_FAILED if failing else EXIT_OK}
