"""``bench gate``, ``bench compare`` and ``bench ab``: the CI speed gate and matched A/B comparisons.

The statistics and verdicts live in :mod:`bench.gate` (pure), the measuring loops (gate with its re-measurements,
ab with interleaved waves) in :mod:`bench.driver`; this module parses options, calls them, prints, and writes
reports (:mod:`bench.report.verdicts`). Register the commands
with ``cli.add_command(gate)``, ``cli.add_command(compare)``, ``cli.add_command(ab)``.

Exit codes: 0 pass, 1 regression, 2 inconclusive (after the re-measure budget). ``bench gate`` exits 3 when it
could not run for any reason (unreachable endpoint, bad baseline or profile, incomparable runs, a cell whose every
request failed); ``compare`` and ``ab`` use the usual codes of :mod:`bench.errors` for those.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from bench.cli.common import checked_url, client_options, endpoint, engine_size, unused_out
from bench.cli.common import settings_from_options as _settings
from bench.cli.gpu import gpu_options, gpu_sampler, no_gpu_options, pop_gpu_options
from bench.config.profile import Profile
from bench.errors import (
    EXIT_CHECK_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    BenchError,
    ConfigError,
    GateCouldNotRun,
    RunInterrupted,
)
from bench.gate import (
    Rule,
    Verdict,
    check_comparable,
    host_load_change,
    main_verdicts,
    overall_exit,
    profile_rules,
    require_common_cells,
    rules_from_results,
    uncovered_cells,
)
from bench.gate import (
    compare as compare_results,
)
from bench.measure.gpu import comparison_notes
from bench.results import Results, load_results
from bench.sequential import ALPHA
from bench.warns import warning

__all__ = ["gate", "compare", "ab"]

DEFAULT_GATE_PROFILE = "ci-gate"


# --- helpers shared by the commands --------------------------------------------------------------------------------


def _write_reports(verdicts: Sequence[Verdict], *, title: str, context: dict[str, Any], junit: str | None,
                   markdown: str | None, side: Any = None, elapsed: float | None = None,
                   code: int | None = None, why: str | None = None) -> list[str]:
    from bench.report.verdicts import append_step_summary, to_junit, to_markdown
    from bench.results import write_atomic

    written = []
    md = to_markdown(verdicts, title=title, context=context, side_by_side=side, code=code, why=why)
    if junit:
        written.append(str(write_atomic(junit, to_junit(verdicts, suite=title, properties=context, time_s=elapsed))))
    if markdown:
        written.append(str(write_atomic(markdown, md)))
    try:
        p = append_step_summary(md)
    except ConfigError as e:  # a CI variable pointing nowhere must not turn a verdict into exit 1 or 3
        _warn([warning("step-summary-unwritable", error=str(e))])
        return written
    if p is not None:
        written.append(f"{p} (GitHub step summary)")
    return written


def _gate_json(verdicts: Sequence[Verdict], rules: Sequence[Rule], extra: dict[str, Any]) -> str:
    """The gate result document (``gate.json``, ``ab.json``, ``bench gate --json``), typed by bench.results.Gate."""
    from bench.results import gate_json

    return gate_json({"exit": overall_exit(verdicts), **extra, "rules": [r.to_dict() for r in rules],
                      "verdicts": [v.to_dict() for v in verdicts]})


def _observer(cells: int, quiet: bool = False) -> tuple[Any, Callable[[str], None]]:
    """The progress of every run (bench.report.progress) and the log of notes (stderr)."""
    from bench.report.console import say, stderr, stdout
    from bench.report.progress import make_observer

    return make_observer(cells, stderr, quiet=quiet, width=stdout.width), say


def _could_not_run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn any BenchError of a ``bench gate`` run into :class:`GateCouldNotRun` (exit 3), but an interrupt
    (Ctrl-C, SIGTERM) stays one: exit 130, as every command."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (GateCouldNotRun, RunInterrupted):
            raise
        except BenchError as e:
            raise GateCouldNotRun(str(e)) from e

    return wrapper


# --- commands ------------------------------------------------------------------------------------------------------


def _report_options(f: Any) -> Any:
    f = click.option("--markdown", "markdown_file", type=click.Path(dir_okay=False),
                     help="Write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set).")(f)
    f = click.option("--junit", "junit_file", type=click.Path(dir_okay=False),
                     help="Write JUnit XML here: one testcase per gated metric and cell.")(f)
    return f


def _print_verdicts(verdicts: Sequence[Verdict], title: str, code: int | None = None, why: str | None = None,
                    sides: tuple[str, str] = ("baseline", "candidate")) -> None:
    from bench.report.console import say, stdout
    from bench.report.verdicts import gate_table, resolution_notes, summary_line

    stdout.print(gate_table(verdicts, title, sides))
    say(summary_line(verdicts, code, why), stdout, soft_wrap=False)
    _warn(resolution_notes(verdicts), note=True)  # the rules the noise cannot resolve, and the waves that would


def _warn(lines: Sequence[str], note: bool = False) -> None:
    """Each line as a warning (``warning`` in yellow) or, with ``note``, as ``note: ...``; their text as it is,
    wrapped at the console's width ($COLUMNS) at spaces."""
    from bench.report.console import say, warn

    for d in lines:
        if note:
            say(f"note: {d}", soft_wrap=False)
        else:
            warn(d, soft_wrap=False)


def _load_profile(name: str) -> Profile:
    from bench.config.profile import load_profile

    return load_profile(name)


@click.command("gate")
@click.argument("url", required=False)
@click.option("--baseline", "baseline_file", required=True, type=click.Path(),
              help="results.json of the baseline run (from bench run or an earlier bench gate), or its folder.")
@click.option("--profile", "-p", "profile_name", default=DEFAULT_GATE_PROFILE, show_default=True,
              help="Profile name or TOML path; its [[gate]] tables are the rules (default rules: decode_tok_s "
                   "median -5 %, ttft_ms p90 +10 %, every cell).")
@_report_options
@click.option("--force", is_flag=True, help="Compare even if profile, model or server backend differ, or the "
              "baseline is incomplete.")
@click.option("--update-baseline", is_flag=True,
              help="After the run, make it the baseline: its results.json, records.jsonl and views replace "
                   "the --baseline run's, in its folder (a lone file: its results only). The exit code is still "
                   "the verdict.")
@click.option("--budget-waves", type=click.IntRange(0), default=None,
              help="Extra waves beyond the profile's planned ones, in all cells together (default: the profile's "
                   "gate_budget_waves when neither --max-time nor --max-waves is given).")
@click.option("--max-time", "max_time", type=click.FloatRange(min=1.0), default=None, metavar="S",
              help="Decide within S seconds in all (connecting and the final summary included): the gate plans "
                   "its looks to fit, and exits 2 (undecided) when the budget runs out first.")
@click.option("--max-waves", type=click.IntRange(1), default=None,
              help="At most this many measured waves per cell (the last look).")
@click.option("--instance-spread-pct", type=click.FloatRange(0, 100, max_open=True), default=0.0, metavar="PCT",
              help="The spread between two server instances of one build and flags (sd of their ratio, %), when "
                   "the baseline was made on another instance: folded into every verdict (docs/gate.md).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Results folder (default bench-results/<time>-<profile>).")
@click.option("--json", "as_json", is_flag=True, help="Print the gate result (gate.json) on stdout, nothing else.")
@gpu_options
@client_options
@_could_not_run
def gate(url: str | None, baseline_file: str, profile_name: str, junit_file: str | None, markdown_file: str | None,
         force: bool, update_baseline: bool, budget_waves: int | None, max_time: float | None,
         max_waves: int | None, instance_spread_pct: float, out_dir: str | None, as_json: bool,
         **client: Any) -> None:
    """CI speed gate: run a profile and compare it with a baseline results file.

    For each [[gate]] rule and cell: ratio = statistic(candidate) / statistic(baseline) with a bootstrap CI,
    judged after each round of waves (a sequential test: alpha spending keeps the false-alarm rate at 2.5 %
    one-sided at the limit however many looks it takes). Before measuring it prints its plan: the MDE it
    expects to reach and the time it needs. Verdicts:

    \b
    regression    the whole CI is beyond the allowance
                  (e.g. below 0.95 for max_drop_pct = 5)
    inconclusive  the CI still straddles the allowance when the budget
                  (--max-time, --budget-waves) ran out
    improved      the whole CI is on the better side of 1
    unchanged     otherwise

    Exit 0 pass, 1 regression, 2 inconclusive, 3 could not run (any cause). Method: docs/gate.md.

    \b
    Examples:
      bench gate http://gpu:8000/v1 --baseline base/results.json --junit gate.xml
      bench gate URL -p my-ci.toml --baseline base/ --update-baseline
          (refresh it)
      bench gate URL -p ci-gate --baseline base/results.json --max-time 600 --json
    """
    budget = {"budget_waves": budget_waves, "max_waves": max_waves, "max_time": max_time,
              "instance_spread_pct": instance_spread_pct}
    _gate(url, baseline_file, profile_name, junit_file, markdown_file, force, update_baseline, budget,
          out_dir, as_json, client)


SUMMARY_RESERVE_S = 1.0  # of --max-time, kept for the verdicts, reports and closing the session


def _sequential_doc(outcome: Any, budget: dict[str, Any], t0: float) -> dict[str, Any]:
    """gate.json's budget, plan and looks (the sequential gate's own keys)."""
    return {"extra_waves": outcome.extra_waves, "max_time_s": budget["max_time"],
            "elapsed_s": round(time.monotonic() - t0, 2), "budget_ran_out": outcome.budget_ran_out,
            "alpha": ALPHA, "instance_spread_pct": budget["instance_spread_pct"], "plan": outcome.plan,
            "schedules": outcome.schedules, "looks": outcome.looks,
            "seconds_per_wave": {k: round(v, 4) for k, v in outcome.wave_s.items()}}


def _gate(url: str | None, baseline_file: str, profile_name: str, junit_file: str | None, markdown_file: str | None,
          force: bool, update_baseline: bool, budget: dict[str, Any], out_dir: str | None, as_json: bool,
          client: dict[str, Any]) -> None:
    from bench.driver import run_gate
    from bench.report.console import say
    from bench.report.export import VIEWS
    from bench.report.progress import observed
    from bench.results import discard_when_failed, replace_run, write_atomic
    from bench.session.endpoint import default_out_dir

    t0 = time.monotonic()
    baseline = load_results(baseline_file)
    prof = _load_profile(profile_name)
    out = Path(out_dir) if out_dir else default_out_dir(prof)
    unused_out("bench gate", out)
    rules, from_profile = profile_rules(prof.gate)
    if not from_profile and not as_json:
        say("note: the profile has no [[gate]] tables; using the default rules (decode_tok_s median drop <= 5 %, "
            "ttft_ms p90 rise <= 10 %, every cell)")
    model = client.pop("model")
    gpu_kw = pop_gpu_options(client)
    settings = _settings(**client)
    observer, log = _observer(len(prof.cells()), quiet=as_json)
    parallel, ctx = engine_size(prof, url)
    deadline = t0 + budget["max_time"] - SUMMARY_RESERVE_S if budget["max_time"] else None
    with discard_when_failed(out), endpoint(url, parallel=parallel, ctx_size=ctx) as base, \
            gpu_sampler(gpu_kw, base, settings) as gpu:
        outcome = asyncio.run(observed(observer, run_gate(
            base, prof, settings, baseline, rules, model=model, out_dir=out, force=force,
            budget_waves=budget["budget_waves"], max_waves=budget["max_waves"], deadline=deadline, observer=observer,
            log=log, views=VIEWS, instance_spread_pct=budget["instance_spread_pct"], gpu=gpu)))
    _warn([warning("not-comparable", difference=d) for d in outcome.differences])
    _warn(_drift_lines(baseline, outcome.results), note=True)
    moved = _moved_beside(baseline, outcome.results)
    code = EXIT_INCONCLUSIVE if "host_load" in moved and outcome.code in (EXIT_OK, EXIT_CHECK_FAILED) else outcome.code
    why = ("other work on this host changed between the runs (run the baseline and the gate on a quiet machine, "
           "or compare live with bench ab)") if code != outcome.code else None
    doc = _gate_json(outcome.verdicts, rules, {"baseline": baseline_file, **_sequential_doc(outcome, budget, t0),
                                               **moved, **({"exit": code} if code != outcome.code else {})})
    write_atomic(out / "gate.json", doc)
    if as_json:
        click.echo(doc, nl=False)
    else:
        _print_verdicts(outcome.verdicts, f"bench gate: profile {prof.name}, {base} vs {baseline_file}", code, why)
    context = {
        "profile": prof.name, "baseline": baseline_file, "endpoint": base, "model": outcome.results.endpoint.model,
        "backend": outcome.results.server.get("backend"),
        "re-measured": remeasured_text(outcome.looks, outcome.remeasured),
        "results": str(out / "results.json"), "GPUs": "; ".join(moved.get("gpu_notes", [])) or None,
    }
    written = _write_reports(outcome.verdicts, title="bench gate", context=context, junit=junit_file,
                             markdown=markdown_file, elapsed=time.monotonic() - t0, code=code, why=why)
    if update_baseline:
        written.append(f"{replace_run(baseline_file, out, outcome.results)} (baseline updated)")
    say(f"results: {out}/results.json, gate.json" + "".join(f"; {w}" for w in written))
    if code != EXIT_OK:
        raise SystemExit(code)


@click.command("compare")
@click.argument("file_a", type=click.Path())
@click.argument("file_b", type=click.Path())
@click.option("--profile", "-p", "profile_name", default=None,
              help="Take the gate rules from this profile (default: the rules stored in A, else the defaults).")
@_report_options
@click.option("--force", is_flag=True, help="Compare even if profile, model or server backend differ, or a file "
              "is incomplete.")
def compare(file_a: str, file_b: str, profile_name: str | None, junit_file: str | None, markdown_file: str | None,
            force: bool) -> None:
    """Compare two results files (or run folders): main metrics side by side, and the gate rules' verdicts (B
    against A).

    Prints, per cell, the medians of decode tok/s (per stream and aggregate), TTFT, TPOT, E2E and prompt tok/s
    of A and B with the ratio B/A and its bootstrap 95 % CI; then one line per gate rule and cell.
    Exit 1 when a rule finds a regression, else 0 (inconclusive verdicts are shown and noted, not failed: two
    stored runs cannot be re-measured; bench gate does that); 3 for a bad, incomplete or incomparable file.
    """
    from bench.report.console import say, stdout
    from bench.report.verdicts import side_by_side_rows, side_by_side_table

    a, b = load_results(file_a), load_results(file_b)
    _warn([warning("not-comparable", difference=d) for d in check_comparable(a, b, force)])
    require_common_cells(a, b)  # nothing in common: exit 3, not an empty table that passes
    rules = profile_rules(_load_profile(profile_name).gate)[0] if profile_name else rules_from_results(a)
    _warn([warning("cell-not-covered", cell=cid, which="B") for cid in uncovered_cells(a, b)])
    _moved_beside(a, b, then="read the verdicts with care")  # what moved between A and B beside the change
    main = main_verdicts(a, b)
    stdout.print(side_by_side_table(main, f"bench compare: A = {file_a}, B = {file_b}"))
    verdicts = compare_results(a, b, rules)
    _print_verdicts(verdicts, "gate rules (B against A)", sides=("A", "B"))
    context = {"A (baseline)": file_a, "B (candidate)": file_b, "profile": a.profile.name, "model": b.endpoint.model}
    written = _write_reports(verdicts, title="bench compare", context=context, junit=junit_file,
                             markdown=markdown_file, side=side_by_side_rows(main))
    if written:
        say("wrote " + "; ".join(written))
    undecided = sum(1 for v in verdicts if v.verdict == "inconclusive")
    if undecided and overall_exit(verdicts) != EXIT_CHECK_FAILED:
        _warn([f"{undecided} verdict(s) inconclusive (their intervals are wider than the allowance): bench compare "
               "does not fail on them; bench gate measures more waves until they are decided"], note=True)
    if overall_exit(verdicts) == EXIT_CHECK_FAILED:
        raise SystemExit(EXIT_CHECK_FAILED)


def remeasured_text(looks: dict[str, list[int]], extra: dict[str, int]) -> str | None:
    """The cells measured again after their first look (the progress line's "measured again"): looks, waves in
    all, and the waves beyond the profile's plan; None when none was."""
    again = [f"{cid} ({len(ws)} looks, {ws[-1]} waves" + (f", +{extra[cid]} beyond the plan)" if extra.get(cid)
                                                          else ")") for cid, ws in looks.items() if len(ws) > 1]
    return ", ".join(again) or None


@click.command("ab")
@click.argument("url_a")
@click.argument("url_b")
@click.option("--profile", "-p", "profile_name", default=DEFAULT_GATE_PROFILE, show_default=True,
              help="Profile name or TOML path.")
@click.option("--model-b", default=None, help="Model name on URL_B (default: --model, else discovered).")
@_report_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write a/ and b/ (results.json, records.jsonl...) and ab.json here.")
@click.option("--max-time", "max_time", type=click.FloatRange(min=1.0), default=None, metavar="S",
              help="Keep adding pairs of waves to undecided cells (a sequential test) within S seconds in all.")
@click.option("--max-waves", type=click.IntRange(1), default=None,
              help="With or without --max-time: at most this many waves per side and cell (sequential looks).")
@client_options
@no_gpu_options("bench ab")
def ab(url_a: str, url_b: str, profile_name: str, model_b: str | None, junit_file: str | None,
       markdown_file: str | None, out_dir: str | None, max_time: float | None, max_waves: int | None,
       **client: Any) -> None:
    """Matched A/B: measure two endpoints with alternating waves, then compare B against A.

    For each cell the waves alternate A, B, A, B, ... so drift of the machine, the network or the time of day
    falls on both alike: the recommended way to compare two setups that can run at once (docs/gate.md). Prints
    each main metric's ratio B/A with its bootstrap 95 % CI per cell, and the profile's gate rules (or the
    defaults) as verdicts. With --max-time or --max-waves, undecided cells get more pairs of waves, judged
    sequentially (alpha spending, docs/gate.md) until decided or the budget ends. Exit 0 pass, 1 B regressed,
    2 inconclusive.

    \b
    Example:
      bench ab http://gpu:8000/v1 http://gpu:8001/v1 -p decode --markdown ab.md
    """
    from bench.client import normalize_url
    from bench.driver import ABRounds, run_ab
    from bench.report.console import say
    from bench.report.export import VIEWS
    from bench.report.progress import observed
    from bench.results import discard_when_failed, write_atomic

    t0 = time.monotonic()
    prof = _load_profile(profile_name)
    rules, _ = profile_rules(prof.gate)
    model = client.pop("model")
    settings = _settings(**client)
    base_a, base_b = checked_url(normalize_url(url_a)), checked_url(normalize_url(url_b))
    observer, _log = _observer(len(prof.cells()))
    rounds = None
    if max_time is not None or max_waves is not None:
        rounds = ABRounds(rules, t0 + max_time - SUMMARY_RESERVE_S if max_time else None, max_waves)
    out_a, out_b = (Path(out_dir) / "a", Path(out_dir) / "b") if out_dir else (None, None)
    if out_dir:
        unused_out("bench ab", out_dir, out_a, out_b)
    with discard_when_failed(out_dir or "."):
        ra, rb = asyncio.run(observed(observer, run_ab(base_a, base_b, prof, settings, model_a=model,
                                                       model_b=model_b or model, observer=observer, out_a=out_a,
                                                       out_b=out_b, views=VIEWS, rounds=rounds)))
    _warn(check_comparable(ra, rb, force=True), note=True)
    verdicts = _print_ab(ra, rb, rules, base_a, base_b, rounds)
    if out_dir:
        extra: dict[str, Any] = {"a": base_a, "b": base_b}
        if rounds is not None:
            extra.update(max_time_s=max_time, budget_ran_out=rounds.budget_ran_out, alpha=ALPHA,
                         schedules=rounds.schedules, looks=rounds.looks)
        write_atomic(Path(out_dir) / "ab.json", _gate_json(verdicts, rules, extra))
    context = {"A": f"{base_a} ({ra.endpoint.model})", "B": f"{base_b} ({rb.endpoint.model})", "profile": prof.name}
    written = _write_reports(verdicts, title="bench ab", context=context, junit=junit_file, markdown=markdown_file,
                             side=_side_rows(ra, rb), elapsed=time.monotonic() - t0)
    if written or out_dir:
        say("wrote " + "; ".join(written + ([f"{out_dir}/a, {out_dir}/b, ab.json"] if out_dir else [])))
    code = overall_exit(verdicts)
    if code != EXIT_OK:
        raise SystemExit(code)


def _moved_beside(baseline: Results, candidate: Results, then: str = "the gate exits 2, undecided") -> dict[str, Any]:
    """Warn of what moved beside the change between the runs: GPU clocks or throttling, other work on the host of
    a local server (the gate is then undecided: ``then`` says so); their gate.json keys (``gpu_notes``,
    ``host_load``)."""
    gpu_notes = comparison_notes(baseline.cells, candidate.cells)
    _warn(gpu_notes)
    host = host_load_change(baseline, candidate)
    if host:
        _warn([warning("host-load-changed", base=host["baseline_other_cores"], cand=host["candidate_other_cores"],
                       then=then)])
    return {**({"gpu_notes": gpu_notes} if gpu_notes else {}), **({"host_load": host} if host else {})}


def _drift_lines(baseline: Results, candidate: Results) -> list[str]:
    """How far each run's server moved between its first and last overhead probes (docs/gate.md)."""
    out = []
    for name, r in (("baseline", baseline), ("candidate", candidate)):
        d = r.run.drift or {}
        if d.get("overhead_change_pct") is not None:
            out.append(f"{name} drift: fixed overhead {d['overhead_ms_start']:.1f} -> {d['overhead_ms_end']:.1f} ms "
                       f"({d['overhead_change_pct']:+.1f} %) during its run")
    return out


def _side_rows(a: Results, b: Results) -> Any:
    from bench.report.verdicts import side_by_side_rows

    return side_by_side_rows(main_verdicts(a, b))


def _print_ab(ra: Results, rb: Results, rules: Sequence[Rule], base_a: str, base_b: str,
              rounds: Any = None) -> list[Verdict]:
    from bench.report.console import stdout
    from bench.report.verdicts import side_by_side_table
    from bench.sequential import sequential_compare

    stdout.print(side_by_side_table(main_verdicts(ra, rb), f"bench ab: A = {base_a}, B = {base_b} (waves "
                                                          "alternated)"))
    if rounds is not None and rounds.looks:
        verdicts = sequential_compare(ra, rb, rules, rounds.look_map(), seed=rounds.seed)
    else:
        verdicts = compare_results(ra, rb, rules)
    _print_verdicts(verdicts, "gate rules (B against A)", sides=("A", "B"))
    return verdicts
