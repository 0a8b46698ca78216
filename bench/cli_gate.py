"""``bench gate``, ``bench compare`` and ``bench ab``: the CI speed gate and matched A/B comparisons.

The statistics and verdicts live in :mod:`bench.gate` (pure); this module runs profiles (:mod:`bench.runner`),
re-measures inconclusive cells, prints, and writes reports (:mod:`bench.report.verdicts`). Register the commands
with ``cli.add_command(gate)``, ``cli.add_command(compare)``, ``cli.add_command(ab)``.

Exit codes: 0 pass, 1 regression, 2 inconclusive (after the re-measure budget). ``bench gate`` exits 3 when it
could not run for any reason (unreachable endpoint, bad baseline or profile, incomparable runs, a cell whose every
request failed); ``compare`` and ``ab`` use the usual codes of :mod:`bench.errors` for those.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from .cli_common import client_options, endpoint
from .cli_common import settings_from_options as _settings
from .errors import EXIT_CHECK_FAILED, EXIT_OK, BenchError, ConfigError
from .gate import (
    MAIN_METRICS,
    GateCouldNotRun,
    Rule,
    Verdict,
    check_comparable,
    check_rule_cells,
    default_rules,
    inconclusive_cells,
    load_results,
    overall_exit,
    parse_rules,
    rules_from_results,
    uncovered_cells,
)
from .gate import (
    compare as compare_results,
)

__all__ = ["gate", "compare", "ab", "GateOutcome", "gate_session", "ab_sessions", "profile_rules", "main_verdicts"]


# --- helpers shared by the commands --------------------------------------------------------------------------------


def profile_rules(profile: Any) -> tuple[list[Rule], bool]:
    """The rules of a loaded profile's ``[[gate]]`` tables, checked against its cells; or the default rules.

    Returns ``(rules, from_profile)``. Raises ConfigError naming ``gate[i].key``.
    """
    where = f"profile {profile.name}"
    if not profile.gate:
        return default_rules(), False
    rules = parse_rules(profile.gate, where)
    check_rule_cells(rules, [c.id for c in profile.cells()], where)
    return rules, True


def main_verdicts(baseline: dict[str, Any], candidate: dict[str, Any], *, seed: int = 0) -> list[Verdict]:
    """Zero-allowance median comparisons of :data:`bench.gate.MAIN_METRICS` in every common cell, cell by cell
    (the side-by-side table; the verdict word only says on which side of 1 the whole CI lies)."""
    rules = [Rule(m, "*", "median", 0.0, None) for m in MAIN_METRICS]
    vs = compare_results(baseline, candidate, rules, seed=seed)
    order = {c["id"]: i for i, c in enumerate(candidate.get("cells", []))}
    return sorted(vs, key=lambda v: (order.get(v.cell, 0), MAIN_METRICS.index(v.rule.metric)))


def _ctx_size(profile: Any) -> tuple[int, int]:
    cells = profile.cells()
    streams = max(c.streams for c in cells)
    depth = max(c.depth for c in cells)
    return max(4, streams), max(8192, streams * (depth + max(c.max_tokens for c in cells) + 512))


def _summarize(session: Any, run: Any) -> dict[str, Any]:
    from .summary import summarize_cell

    cell = run.cell
    s = summarize_cell(cell, run.records, run.waves, session.overhead_ms, depth_target_tokens=cell.depth or None,
                       expected_cached_tokens=None if session.profile.prefix_cache else session.template_cached_tokens)
    if run.records and all(not r.ok for r in run.records):
        kinds = sorted({r.error_kind or "?" for r in run.records})
        s["warnings"].append(f"{cell.id}: every request failed ({', '.join(kinds)})")
    return s


def _merge(session: Any, run: Any, more: Any) -> Any:
    run.records.extend(more.records)
    run.waves.extend(more.waves)
    run.summary = _summarize(session, run)
    return run


def _all_failed(cells: Sequence[dict[str, Any]]) -> list[str]:
    return [c["id"] for c in cells if c.get("requests_ok", 0) == 0 and c.get("requests_failed", 0) > 0]


def _write_reports(verdicts: Sequence[Verdict], *, title: str, context: dict[str, Any], junit: str | None,
                   markdown: str | None, side: Any = None, elapsed: float | None = None) -> list[str]:
    from .report.verdicts import append_step_summary, to_junit, to_markdown, write_text

    written = []
    md = to_markdown(verdicts, title=title, context=context, side_by_side=side)
    if junit:
        written.append(str(write_text(junit, to_junit(verdicts, suite=title, properties=context, time_s=elapsed))))
    if markdown:
        written.append(str(write_text(markdown, md)))
    p = append_step_summary(md)
    if p is not None:
        written.append(f"{p} (GitHub step summary)")
    return written


def _gate_json(verdicts: Sequence[Verdict], rules: Sequence[Rule], extra: dict[str, Any]) -> str:
    doc = {"exit": overall_exit(verdicts), **extra, "rules": [r.to_dict() for r in rules],
           "verdicts": [v.to_dict() for v in verdicts]}
    return json.dumps(doc, indent=1) + "\n"


def _observer() -> tuple[Any, Callable[[str], None]]:
    from .report.console import stderr
    from .report.progress import QuietObserver

    return QuietObserver(stderr), lambda s: stderr.print(s, highlight=False, soft_wrap=True)


def _could_not_run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn any BenchError of a ``bench gate`` run into :class:`GateCouldNotRun` (exit 3)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GateCouldNotRun:
            raise
        except BenchError as e:
            raise GateCouldNotRun(str(e)) from e

    return wrapper


# --- the gate run ---------------------------------------------------------------------------------------------------


@dataclass
class GateOutcome:
    """What :func:`gate_session` produced.

    Attributes:
        results: the candidate results document (re-measured cells merged in).
        verdicts: the final verdicts.
        code: :func:`bench.gate.overall_exit` of them (0/1/2).
        extra_waves: re-measure waves spent (<= the budget).
        remeasured: ``{cell id: extra waves}``.
        differences: comparability differences accepted with ``force``.
    """

    results: dict[str, Any]
    verdicts: list[Verdict]
    code: int
    extra_waves: int = 0
    remeasured: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


async def gate_session(
    base: str,
    profile: Any,
    settings: Any,
    baseline: dict[str, Any],
    rules: Sequence[Rule],
    *,
    model: str | None = None,
    out_dir: Path | None = None,
    force: bool = False,
    budget_waves: int | None = None,
    observer: Any = None,
    log: Callable[[str], None] | None = None,
    level: float = 0.95,
    seed: int = 0,
) -> GateOutcome:
    """Run ``profile`` against ``base``, compare with ``baseline`` under ``rules``, re-measure inconclusive cells.

    Re-measuring: while some cell has an inconclusive verdict, no verdict is a regression (which already decides
    the exit code) and budget is left (``budget_waves``, default ``profile.gate_budget_waves``), each such cell gets
    ``min(its current waves, budget left / cells)`` (at least 1) more measured waves (after its warm-up), merged
    with its earlier ones, and every verdict is recomputed.

    Raises:
        ConfigError: the runs are not comparable (profile, model, backend; unless ``force``).
        GateCouldNotRun: every request of some cell failed.
        EndpointUnreachable, ServerError: from :meth:`bench.runner.Session.open`.
    """
    from .report.export import write_results
    from .runner import Session

    say = log or (lambda s: None)
    budget = profile.gate_budget_waves if budget_waves is None else budget_waves
    bname = (baseline.get("profile") or {}).get("name")
    if bname != profile.name and not force:
        raise ConfigError(f"runs are not comparable: the baseline was made with profile {bname!r}, this run uses "
                          f"{profile.name!r} (--force compares anyway)")
    session = await Session.open(base, settings, profile, model=model, out_dir=out_dir, observer=observer)
    try:
        # fail fast, before measuring anything, when the model or the backend differ
        check_comparable(baseline, {"profile": {"name": bname}, "endpoint": {"model": session.model},
                                    "server": session.server}, force)
        runs: dict[str, Any] = {}
        for cell in profile.cells():
            runs[cell.id] = await session.run_cell(cell)
            if out_dir is not None:
                write_results(session.results([r.summary for r in runs.values()]), out_dir, formats=("json",))
        results = session.results([r.summary for r in runs.values()])
        failed = _all_failed(results["cells"])
        if failed:
            if out_dir is not None:
                write_results(results, out_dir)
            raise GateCouldNotRun(f"every request failed in cell(s) {', '.join(failed)}; see "
                                  f"{out_dir or 'the results'} (nothing to compare)")
        diffs = check_comparable(baseline, results, force)
        for cid in uncovered_cells(baseline, results):
            say(f"warning: cell {cid} is not in the baseline; no rule can check it")
        verdicts = compare_results(baseline, results, rules, level=level, seed=seed)
        spent, extra = 0, {}
        cells = {c.id: c for c in profile.cells()}
        while spent < budget:
            todo = [cid for cid in inconclusive_cells(verdicts) if cid in cells]
            if not todo or overall_exit(verdicts) == EXIT_CHECK_FAILED:
                break  # nothing to settle, or a regression already decides the exit code
            share = max(1, (budget - spent) // len(todo))
            for cid in todo:
                if spent >= budget:
                    break
                k = min(share, len(runs[cid].waves) or 1, budget - spent)
                say(f"re-measuring {cid}: {k} more wave(s) (inconclusive; budget {budget - spent} of {budget} left)")
                more = await session.run_cell(cells[cid], waves=k)
                _merge(session, runs[cid], more)
                spent += k
                extra[cid] = extra.get(cid, 0) + k
            results = session.results([r.summary for r in runs.values()])
            results["run"]["gate_extra_waves"] = dict(extra)
            verdicts = compare_results(baseline, results, rules, level=level, seed=seed)
        if out_dir is not None:
            write_results(results, out_dir)
        return GateOutcome(results, verdicts, overall_exit(verdicts), spent, extra, diffs)
    finally:
        await session.close()


async def ab_sessions(
    base_a: str,
    base_b: str,
    profile: Any,
    settings: Any,
    *,
    model_a: str | None = None,
    model_b: str | None = None,
    observer: Any = None,
    out_a: Path | None = None,
    out_b: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure two endpoints with interleaved waves: per cell, waves go A, B, A, B, ... (each side warms up before
    its first wave of a cell), so slow drift of the machine or the network falls on both alike.

    Each side runs the cell's planned waves (:meth:`bench.runner.Session.planned_waves`; ``target_ci`` is not used).
    ``out_a`` / ``out_b``: folders for each side's ``records.jsonl``. Returns the two results documents ``(a, b)``.
    """
    from .runner import CellRun, Session

    sa = await Session.open(base_a, settings, profile, model=model_a, observer=observer, out_dir=out_a)
    try:
        sb = await Session.open(base_b, settings, profile, model=model_b, observer=observer, out_dir=out_b)
    except BaseException:
        await sa.close()
        raise
    try:
        ca, cb = [], []
        for cell in profile.cells():
            ra, rb = CellRun(cell), CellRun(cell)
            for w in range(sa.planned_waves(cell)):
                for sess, acc in ((sa, ra), (sb, rb)):
                    part = await sess.run_cell(cell, waves=1, warmup=(w == 0))
                    acc.records.extend(part.records)
                    acc.waves.extend(part.waves)
            ca.append(_summarize(sa, ra))
            cb.append(_summarize(sb, rb))
        return sa.results(ca), sb.results(cb)
    finally:
        await sa.close()
        await sb.close()


# --- commands ------------------------------------------------------------------------------------------------------


def _report_options(f: Any) -> Any:
    f = click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False),
                     help="Write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set).")(f)
    f = click.option("--junit", "junit_file", type=click.Path(dir_okay=False),
                     help="Write JUnit XML here: one testcase per gated metric and cell.")(f)
    return f


def _print_verdicts(verdicts: Sequence[Verdict], title: str) -> None:
    from .report.console import stdout
    from .report.verdicts import gate_table, summary_line

    stdout.print(gate_table(verdicts, title))
    stdout.print(summary_line(verdicts), highlight=False)


@click.command("gate")
@click.argument("url", required=False)
@click.option("--baseline", "baseline_file", required=True, type=click.Path(dir_okay=False),
              help="results.json of the baseline run (from bench run or an earlier bench gate).")
@click.option("--profile", "-p", "profile_name", required=True,
              help="Profile name or TOML path; its [[gate]] tables are the rules (default: decode_tok_s median "
                   "-5 %, ttft_ms p90 +10 %, every cell).")
@_report_options
@click.option("--force", is_flag=True, help="Compare even if profile, model or server backend differ.")
@click.option("--update-baseline", is_flag=True,
              help="After the run, write its results over the --baseline file (the exit code is still the verdict).")
@click.option("--budget-waves", type=click.IntRange(0), default=None,
              help="Extra waves for re-measuring inconclusive cells, in all (default: the profile's "
                   "gate_budget_waves).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Results folder (default bench-results/<time>-<profile>).")
@client_options
@_could_not_run
def gate(url: str | None, baseline_file: str, profile_name: str, junit_file: str | None, markdown_file: str | None,
         force: bool, update_baseline: bool, budget_waves: int | None, out_dir: str | None, model: str | None,
         api_key_env: str, connect_timeout: float, read_timeout: float | None) -> None:
    """CI speed gate: run a profile and compare it with a baseline results file.

    \b
    For each [[gate]] rule and cell: ratio = statistic(candidate) / statistic(baseline) with a bootstrap 95 % CI.
    regression    the whole CI is beyond the allowance (e.g. below 0.95 for max_drop_pct = 5)
    inconclusive  the CI straddles the allowance; such cells are re-measured within gate_budget_waves
    improved      the whole CI is on the better side of 1
    unchanged     otherwise
    Exit 0 pass, 1 regression, 2 inconclusive, 3 could not run (any cause). Method: docs/gate.md.

    \b
    Examples:
      bench gate http://gpu:8000/v1 -p ci.toml --baseline base/results.json --junit gate.xml
      bench gate URL -p ci.toml --baseline base/results.json --update-baseline     (refresh it)
    """
    from .profile import load_profile
    from .report.console import stderr
    from .report.export import to_json
    from .report.verdicts import write_text
    from .runner import default_out_dir

    t0 = time.monotonic()
    baseline = load_results(baseline_file)
    prof = load_profile(profile_name)
    rules, from_profile = profile_rules(prof)
    if not from_profile:
        stderr.print("note: the profile has no [[gate]] tables; using the default rules "
                     "(decode_tok_s median drop <= 5 %, ttft_ms p90 rise <= 10 %, every cell)", highlight=False)
    settings = _settings(api_key_env, connect_timeout, read_timeout)
    out = Path(out_dir) if out_dir else default_out_dir(prof)
    observer, log = _observer()
    parallel, ctx = _ctx_size(prof)
    with endpoint(url, parallel=parallel, ctx_size=ctx) as base:
        outcome = asyncio.run(gate_session(base, prof, settings, baseline, rules, model=model, out_dir=out,
                                           force=force, budget_waves=budget_waves, observer=observer, log=log))
    for d in outcome.differences:
        stderr.print(f"[yellow]warning[/yellow] --force: {d}", highlight=False, soft_wrap=True)
    verdicts = outcome.verdicts
    _print_verdicts(verdicts, f"bench gate: profile {prof.name}, {base} vs {baseline_file}")
    context = {
        "profile": prof.name, "baseline": baseline_file, "endpoint": base,
        "model": outcome.results["endpoint"].get("model"), "backend": outcome.results["server"].get("backend"),
        "re-measured": ", ".join(f"{k} (+{v} waves)" for k, v in outcome.remeasured.items()) or None,
        "results": str(out / "results.json"),
    }
    write_text(out / "gate.json", _gate_json(verdicts, rules, {"baseline": baseline_file,
                                                                "extra_waves": outcome.extra_waves}))
    written = _write_reports(verdicts, title="bench gate", context=context, junit=junit_file,
                             markdown=markdown_file, elapsed=time.monotonic() - t0)
    if update_baseline:
        write_text(baseline_file, to_json(outcome.results))
        written.append(f"{baseline_file} (baseline updated)")
    stderr.print(f"results: {out}/results.json, gate.json" + "".join(f"; {w}" for w in written), highlight=False,
                 soft_wrap=True)
    if outcome.code != EXIT_OK:
        raise SystemExit(outcome.code)


@click.command("compare")
@click.argument("file_a", type=click.Path(dir_okay=False))
@click.argument("file_b", type=click.Path(dir_okay=False))
@click.option("--profile", "-p", "profile_name", default=None,
              help="Take the gate rules from this profile (default: the rules stored in A, else the defaults).")
@_report_options
@click.option("--force", is_flag=True, help="Compare even if profile, model or server backend differ.")
def compare(file_a: str, file_b: str, profile_name: str | None, junit_file: str | None, markdown_file: str | None,
            force: bool) -> None:
    """Compare two results files: main metrics side by side, and the gate rules' verdicts (B against A).

    \b
    Prints, per cell, the medians of decode tok/s (per stream and aggregate), TTFT, TPOT, E2E and prompt tok/s
    of A and B with the ratio B/A and its bootstrap 95 % CI; then one line per gate rule and cell.
    Exit 0 pass, 1 regression, 2 inconclusive (as bench gate); 3 for a bad or incomparable file.
    """
    from .profile import load_profile
    from .report.console import stderr, stdout
    from .report.verdicts import side_by_side_rows, side_by_side_table

    a, b = load_results(file_a), load_results(file_b)
    for d in check_comparable(a, b, force):
        stderr.print(f"[yellow]warning[/yellow] --force: {d}", highlight=False, soft_wrap=True)
    if profile_name:
        prof = load_profile(profile_name)
        rules = parse_rules(prof.gate, f"profile {prof.name}") if prof.gate else default_rules()
    else:
        rules = rules_from_results(a)
    for cid in uncovered_cells(a, b):
        stderr.print(f"[yellow]warning[/yellow] cell {cid} is only in B; no rule can check it", highlight=False)
    main = main_verdicts(a, b)
    stdout.print(side_by_side_table(main, f"bench compare: A = {file_a}, B = {file_b}"))
    verdicts = compare_results(a, b, rules)
    _print_verdicts(verdicts, "gate rules (B against A)")
    context = {"A (baseline)": file_a, "B (candidate)": file_b, "profile": (a.get("profile") or {}).get("name"),
               "model": (b.get("endpoint") or {}).get("model")}
    written = _write_reports(verdicts, title="bench compare", context=context, junit=junit_file,
                             markdown=markdown_file, side=side_by_side_rows(main))
    if written:
        stderr.print("wrote " + "; ".join(written), highlight=False, soft_wrap=True)
    code = overall_exit(verdicts)
    if code != EXIT_OK:
        raise SystemExit(code)


@click.command("ab")
@click.argument("url_a")
@click.argument("url_b")
@click.option("--profile", "-p", "profile_name", required=True, help="Profile name or TOML path.")
@click.option("--model-b", default=None, help="Model name on URL_B (default: --model, else discovered).")
@_report_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write a/ and b/ (results.json, records.jsonl...) and ab.json here.")
@client_options
def ab(url_a: str, url_b: str, profile_name: str, model_b: str | None, junit_file: str | None,
       markdown_file: str | None, out_dir: str | None, model: str | None, api_key_env: str, connect_timeout: float,
       read_timeout: float | None) -> None:
    """Matched A/B: measure two endpoints with alternating waves, then compare B against A.

    \b
    For each cell the waves alternate A, B, A, B, ... so drift of the machine, the network or the time of day
    falls on both alike. Prints each main metric's ratio B/A with its bootstrap 95 % CI per cell, and the
    profile's gate rules (or the defaults) as verdicts. Exit 0 pass, 1 B regressed, 2 inconclusive.

    \b
    Example:
      bench ab http://gpu:8000/v1 http://gpu:8001/v1 -p decode --markdown ab.md
    """
    from .client import normalize_url
    from .profile import load_profile
    from .report.console import stderr, stdout
    from .report.export import write_results
    from .report.verdicts import side_by_side_rows, side_by_side_table, write_text

    prof = load_profile(profile_name)
    rules, _ = profile_rules(prof)
    settings = _settings(api_key_env, connect_timeout, read_timeout)
    base_a, base_b = normalize_url(url_a), normalize_url(url_b)
    observer, _log = _observer()
    t0 = time.monotonic()
    out_a, out_b = (Path(out_dir) / "a", Path(out_dir) / "b") if out_dir else (None, None)
    ra, rb = asyncio.run(ab_sessions(base_a, base_b, prof, settings, model_a=model, model_b=model_b or model,
                                     observer=observer, out_a=out_a, out_b=out_b))
    for d in check_comparable(ra, rb, force=True):
        stderr.print(f"note: {d}", highlight=False, soft_wrap=True)
    main = main_verdicts(ra, rb)
    stdout.print(side_by_side_table(main, f"bench ab: A = {base_a}, B = {base_b} (waves alternated)"))
    verdicts = compare_results(ra, rb, rules)
    _print_verdicts(verdicts, "gate rules (B against A)")
    if out_a is not None and out_b is not None:
        write_results(ra, out_a)
        write_results(rb, out_b)
        write_text(Path(out_dir) / "ab.json", _gate_json(verdicts, rules, {"a": base_a, "b": base_b}))
    context = {"A": f"{base_a} ({ra['endpoint'].get('model')})", "B": f"{base_b} ({rb['endpoint'].get('model')})",
               "profile": prof.name}
    written = _write_reports(verdicts, title="bench ab", context=context, junit=junit_file, markdown=markdown_file,
                             side=side_by_side_rows(main), elapsed=time.monotonic() - t0)
    if written or out_dir:
        stderr.print("wrote " + "; ".join(written + ([f"{out_dir}/a, {out_dir}/b, ab.json"] if out_dir else [])),
                     highlight=False, soft_wrap=True)
    code = overall_exit(verdicts)
    if code != EXIT_OK:
        raise SystemExit(code)
