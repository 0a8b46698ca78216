"""The ``bench`` command: the spine of the program.

options -> settings -> (embedded engine | URL) -> plan -> runner -> metrics -> report / gate. This module is the
only place that prints errors and turns them into exit codes (table in :mod:`bench.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

import bench.cli.check as _cli_check
from bench.cli.capacity import capacity, load_options, load_settings, run_open_loop, with_cell_slo
from bench.cli.common import (
    checked_images,
    client_options,
    echo,
    endpoint,
    engine_size,
    single_workload,
    workload_options,
    workload_overrides,
)
from bench.cli.common import settings_from_options as _settings
from bench.cli.gate import ab, compare, gate
from bench.cli.gpu import gpu_options, gpu_sampler, no_gpu_in_open_loop, pop_gpu_options
from bench.cli.history import history, require_store
from bench.cli.proxy import proxy
from bench.cli.report import ROOFLINE_KEYS, report, roofline_options, roofline_spec_from_options
from bench.cli.serve import serve
from bench.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BenchError,
    ConfigError,
    ServerError,
)
from bench.version import __version__

if TYPE_CHECKING:
    from bench.client import ClientSettings
    from bench.config.profile import Profile
    from bench.results import Results


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="bench")
@click.option("-v", "--verbose", is_flag=True, help="Log each request and response line to stderr (API key hidden).")
@click.option("--io", type=click.Choice(["fast", "httpx"]), default="fast", show_default=True,
              help="How streams are read: 'fast' stamps each read the moment it arrives (asyncio protocol, http and "
              "https); 'httpx' reads through httpx.")
def cli(verbose: bool, io: str) -> None:
    """bench: speed profiler for OpenAI-compatible LLM endpoints (vLLM, SGLang, llama.cpp, TGI, Ollama...).

    Measures TTFT, ITL, TPOT, E2E, decode tok/s per stream and aggregate, prefill (prompt) tok/s at context
    depths, and gates CI on regressions. URL is the OpenAI base URL (http://host:port/v1); with no URL, bench
    starts its embedded endpoint (llama.cpp's llama-server with SmolLM2-135M) on loopback.

    \b
    Start here:
      bench probe
          one request against the embedded endpoint
      bench probe http://gpu:8000/v1
          one request against your server
      bench run --profile quick
          the default sweep (decode at 1..N streams, prefill at depths)
      bench replay CASE.json
          replay a recorded server response and check the measurement
    """
    if verbose:
        import logging

        from bench.redaction import LOG_FILTER

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("bench").setLevel(logging.DEBUG)
        for h in logging.getLogger().handlers:  # every logger's records (httpx's too) are redacted on the way out
            h.addFilter(LOG_FILTER)


@cli.command()
@click.argument("url", required=False)
@click.option("--endpoint", "endpoint_kind", type=click.Choice(["chat", "completions"]), default="chat",
              show_default=True, help="POST {URL}/chat/completions or {URL}/completions.")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True, help="Output tokens asked.")
@click.option("--prompt", "prompt_text", default=None,
              help="Prompt text (default: a short-story request; for completions, the start of a story).")
@click.option("--same-prompt", is_flag=True, help="Send the prompt without bench's unique prefix (it may come from "
              "the server's prefix cache: cached tokens are reported and prefill is marked not measured).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as one JSON object on stdout, nothing else.")
@click.option("--thinking", type=click.Choice(["on", "off"]), help="Ask thinking models to think or not (default: "
              "the server's default).")
@workload_options
@client_options
def probe(url: str | None, endpoint_kind: str, max_tokens: int, prompt_text: str | None, same_prompt: bool,
          as_json: bool, thinking: str | None, model: str | None, api_key_env: str, connect_timeout: float,
          read_timeout: float | None, **wl: Any) -> None:
    """Send one streaming request and print its measurement.

    Prints TTFT, time to first content, decode tok/s, ITL, TPOT, E2E, token counts and prefill tok/s of a single
    request. Exits 0 on success, 3 if the base URL has no OpenAI API (404), 4 if the URL is unreachable (or
    https:// meets a server without TLS), 5 if the request failed (the record is still printed).
    """
    from bench.client import RequestSpec, discover_model, make_http_client, require_ok, stream_request
    from bench.measure.metrics import request_metrics
    from bench.server.info import discover_server
    from bench.tools.probe import probe_body, probe_report, probe_workload

    settings = _settings(api_key_env, connect_timeout, read_timeout)
    work = probe_workload(endpoint_kind, single_workload(workload_overrides(wl), "bench probe"), thinking)

    async def go(base: str) -> Any:
        async with make_http_client(settings) as client:
            name = model or await discover_model(client, base, settings.api_key)
            backend = (await discover_server(client, base)).get("backend")
            body = probe_body(endpoint_kind, prompt_text, max_tokens, same_prompt=same_prompt, backend=backend,
                              work=work)
            return await stream_request(client, base, RequestSpec("probe-0", endpoint_kind, body),
                                        model=name, secret=settings.api_key)

    with endpoint(url, parallel=1) as base:
        rec = asyncio.run(go(base))
    from bench.client import image_rejection

    if rec.status == 404:
        require_ok(rec, base)  # no OpenAI API at that path: one line, exit 3, not a table of dashes
    if (line := image_rejection(rec)) is not None:
        raise ServerError(line)
    d, warns = probe_report(request_metrics(rec).to_dict(), same_prompt=same_prompt, default_prompt=not prompt_text)
    _print_record(rec, d, as_json, f"probe {base} ({endpoint_kind})", warns)
    if thinking is None and d.get("reasoning_tokens"):
        from bench.report.console import say

        say(f"note: the server thought by default ({d['reasoning_tokens']} reasoning tokens); bench run asks "
            "thinking models not to (--thinking on lets them)", soft_wrap=False)
    require_ok(rec)


def _print_record(rec: Any, m: Any, as_json: bool, title: str, warnings: list[str] | None = None) -> None:
    from bench.report.console import request_table, stdout, warn

    d = m if isinstance(m, dict) else m.to_dict()
    for w in warnings or []:
        warn(w, soft_wrap=False)
    if as_json:
        d.update({"endpoint": rec.endpoint, "model": rec.model, "usage": rec.usage, "timings": rec.timings})
        echo(json.dumps(d, ensure_ascii=False))
    else:
        stdout.print(request_table(d, title))


@cli.command()
@click.argument("case_file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the record as one JSON object on stdout, nothing else.")
def replay(case_file: str, as_json: bool) -> None:
    """Replay a recorded server response and check bench's measurement of it.

    Serves CASE_FILE (format: docs/cases.md) from bench's own reference server on loopback with its exact bytes
    and timing, probes it with the normal client, prints the record, and exits 0 when it meets the case's
    'expect' block, 1 when not (each mismatch on stderr).
    """
    from rich.text import Text

    from bench.report.console import stderr
    from bench.tools.probe import probe_report
    from bench.tools.replay import load_case, replay_case

    case = load_case(case_file)
    rec, m, fails = replay_case(case, fast_io=_settings("OPENAI_API_KEY", 10.0, None).fast_io)
    d, _ = probe_report(m.to_dict(), same_prompt=False)  # the probe's prefill rule: none from a short prompt's TTFT
    _print_record(rec, d, as_json, f"replay {case.id}: {case.about}")
    for f in fails:
        stderr.print(Text.assemble(("mismatch", "red"), " ", f), highlight=False)
    if fails:
        raise SystemExit(EXIT_CHECK_FAILED)
    if not as_json:
        stderr.print(Text.assemble(("pass", "green"), f" {case.id}: meets its {len(case.expect)} expectations"),
                     highlight=False)


@cli.command()
@click.argument("url", required=False)
@click.option("--profile", "-p", "profile_name", default="quick", show_default=True,
              help="Shipped profile name (quick, decode, prefill, depth, spark-recipe, ci-gate, multimodal, agent) "
                   "or a TOML file path.")
@click.option("--streams", help="Concurrent streams per wave, comma list: 1,2,4,8 (overrides the profile).")
@click.option("--depths", help="Context depths in prompt tokens, comma list; k = 1024: 0,4k,32k,131k.")
@click.option("--max-tokens", type=click.IntRange(1), help="Output tokens per request.")
@click.option("--prompt", "prompt_kinds", help="Prompt types, comma list of prose, code, structured, json.")
@click.option("--repeats", type=click.IntRange(1), help="Measured requests per cell (at least; whole waves).")
@click.option("--endpoint", "endpoint_kind", type=click.Choice(["chat", "completions"]), help="API endpoint.")
@click.option("--thinking", type=click.Choice(["on", "off"]), help="Let thinking models think (default off).")
@click.option("--prefix-cache", is_flag=True, default=None,
              help="Measure the cached case on purpose: requests share their prompt (no unique prefix).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Results folder "
              "(default bench-results/<time>-<profile>).")
@click.option("--workers", default="1", show_default=True, metavar="N|auto", callback=lambda c, p, v: _workers_value(v),
              help="Processes reading the measured streams: more than 1 for hundreds of streams or >5k tokens/s "
              "(see benchmarks/results/fidelity.md); 'auto': bench measures its own lag and picks the count (with "
              "--rate/--trace: from the schedule's CPU need).")
@click.option("--ray", "ray_address", metavar="ADDRESS", help="Run the measured waves (or a --rate/--trace "
              "schedule) in --workers N Ray actors on this cluster (as `ray start` prints it; needs pip install "
              "'bench[ray]').")
@click.option("--json", "as_json", is_flag=True, help="Print the results document as JSON on stdout, nothing else.")
@click.option("--resume", is_flag=True, help="Continue the interrupted run in --out (same profile and flags, endpoint and "
              "model): finished cells are kept, the rest measured.")
@click.option("--overwrite", is_flag=True, help="Replace the run already in --out.")
@click.option("--report", "make_report", is_flag=True, help="Also write report.html (one self-contained page, "
              "docs/report.md) into the results folder.")
@click.option("--history", "history_db", metavar="DB", default=None, help="When the run finishes, add it to this "
              "run history (a file, or postgresql://...; docs/history.md).")
@click.option("--progress-every", type=click.FloatRange(min=0.05), default=30.0, show_default=True,
              help="When stdout is not a terminal (CI logs): a progress line every this many seconds inside a cell.")
@load_options
@workload_options
@gpu_options
@client_options
@roofline_options
def run(url: str | None, profile_name: str, streams: str | None, depths: str | None, max_tokens: int | None,
        prompt_kinds: str | None, repeats: int | None, endpoint_kind: str | None, thinking: str | None,
        prefix_cache: bool | None, out_dir: str | None, workers: int | str, ray_address: str | None, as_json: bool,
        resume: bool, overwrite: bool, make_report: bool, history_db: str | None, progress_every: float,
        model: str | None, api_key_env: str, connect_timeout: float, read_timeout: float | None,
        **extra: Any) -> None:
    """Profile a serving setup: sweep context depths x stream counts x prompt types.

    Each cell runs warm-up waves, then waves of N concurrent streams, and reports decode tok/s per stream
    (p50, p10-p90) and aggregate, TTFT p50/p90/p99, prompt tok/s = uncached prompt tokens / TTFT (and corrected
    for the fixed overhead), ITL, TPOT and E2E. Every request has a unique prefix, so no prefix cache helps.
    Writes records.jsonl (as requests finish), results.json, results.csv and results.md to the results folder.

    \b
    Examples:
      bench run                                  quick profile, embedded endpoint
      bench run http://gpu:8000/v1 -p decode     decode at 1, 2, 4, 8 streams
      bench run URL -p spark-recipe --out res/   the seeds' table (32K, 131K)
      bench run URL --hardware h200 --model-params 8b --weight-bits 16 --report
          % of the roofline, report.html
      bench run URL --streams 1,8 --slo ttft_p90=2s,tpot_p90=60ms
          goodput and SLOs of each cell
      bench run URL --rate 10 --duration 60      open loop: Poisson arrivals
      bench run URL --trace mooncake.jsonl       replay a trace (docs/load.md)
    """
    from bench.results import discard_when_failed, prepare_folder
    from bench.session.endpoint import default_out_dir

    if ray_address and workers == "auto":
        raise click.BadParameter("--ray needs a count: --workers N (N actors)", param_hint="--workers")
    settings = _settings(api_key_env, connect_timeout, read_timeout)
    roof = roofline_spec_from_options(**{k: extra.pop(k) for k in ROOFLINE_KEYS if k in extra})
    if make_report:
        from bench.report.html import require_plotly

        require_plotly()
    work = workload_overrides(extra)
    prof = checked_images(_overridden(profile_name, streams, depths, prompt_kinds, max_tokens=max_tokens,
                                      requests=repeats, endpoint=endpoint_kind,
                                      thinking=None if thinking is None else thinking == "on",
                                      prefix_cache=prefix_cache, **work))
    out = Path(out_dir) if out_dir else default_out_dir(prof)
    gpu_kw = pop_gpu_options(extra)
    ls = load_settings(prof, extra)
    _open_loop_checks(ls, work, resume, streams=streams, depths=depths)
    with discard_when_failed(out):  # a run that fails before writing anything leaves no empty folder
        previous = prepare_folder(out, overwrite=overwrite, resume=resume)
        require_store(history_db)  # --history: a store that cannot be opened fails now, not after the run
        with _unfinished_not_stored(history_db):
            if ls is not None:  # open loop (rate, trace, sessions): bench.load
                no_gpu_in_open_loop(gpu_kw)
                results = run_open_loop(url, prof, ls, settings, out, model, workers, ray_address, quiet=as_json,
                                        progress_every=progress_every)
            else:
                prof = with_cell_slo(prof, extra.get("slo"))  # concurrency: --slo scores each cell (goodput, SLOs)
                results = _closed_loop(url, prof, settings, out, as_json, progress_every, gpu_kw, roof, model=model,
                                       workers=workers, resume=previous, ray_address=ray_address)
        _finish_run(results, out, as_json, make_report, history_db)


@contextlib.contextmanager
def _unfinished_not_stored(history_db: str | None) -> Iterator[None]:
    """``--history``: a run that stops (interrupt, error) says it was not added."""
    try:
        yield
    except BaseException:
        if history_db is not None:
            from bench.report.console import say

            say("history: this run was not added (it did not finish; only finished runs are stored)")
        raise


def _closed_loop(url: str | None, prof: Profile, settings: ClientSettings, out: Path, as_json: bool,
                 progress_every: float, gpu_kw: dict[str, Any], roof: Any, **loop_kw: Any) -> Results:
    """The concurrency cells in waves against ``url`` (or the embedded endpoint, its log kept in ``out``), the
    GPUs sampled around each cell's measured waves (bench.server.gpu), with live progress."""
    from bench.measure.roofline import RooflineAnnotator

    parallel, ctx = engine_size(prof, url)
    with endpoint(url, parallel=parallel, ctx_size=ctx, log_dir=out) as base, gpu_sampler(gpu_kw, base, settings) as g:
        annotators = [RooflineAnnotator(roof)] if roof is not None else []
        return _run_with_progress(base, prof, settings, out, as_json, progress_every, annotators=annotators, gpu=g,
                                  **loop_kw)


def _overridden(profile_name: str, streams: str | None, depths: str | None, prompt_kinds: str | None,
                **overrides: Any) -> Profile:
    """The profile with the command line's overrides (each parsed, bad values naming their flag)."""
    from bench.config.profile import load_profile, parse_depths, parse_ints, parse_kinds

    return load_profile(profile_name).with_overrides(
        streams=parse_ints(streams, "--streams") if streams is not None else None,
        depths=parse_depths(depths) if depths is not None else None,
        prompts=parse_kinds(prompt_kinds) if prompt_kinds is not None else None,
        **overrides,
    )


def _open_loop_checks(ls: Any, work: dict[str, Any], resume: bool, **given: str | None) -> None:
    """An open-loop run (``ls`` not None): no closed-loop flags, one workload, no --resume."""
    _closed_loop_only(ls, **given)
    if ls is None:
        return
    single_workload(work, f"an open-loop run ({ls.mode})")
    if resume:
        raise ConfigError("--resume continues the cells of a closed-loop run; an open-loop schedule is one piece "
                          "and cannot be continued: run it again with --overwrite (or another --out)")


def _closed_loop_only(ls: Any, **given: str | None) -> None:
    """An open-loop run (``ls`` not None) refuses the flags that shape closed-loop cells, naming what sets its
    sizes instead (they were ignored without a word)."""
    used = [f"--{k}" for k, v in given.items() if v is not None]
    if ls is not None and used:
        verb = "shape" if len(used) > 1 else "shapes"
        raise ConfigError(f"{' and '.join(used)} {verb} closed-loop cells; an open-loop run ({ls.mode}) sends its "
                          "own schedule: its prompt sizes come from --input-tokens, its concurrency from the "
                          "arrivals (cap: --max-concurrency)")


def _finish_run(results: Results, out: Path, as_json: bool, make_report: bool, history_db: str | None = None) -> None:
    """Report (optional), history (optional), print, and exit 5 when a cell had no success."""
    if history_db is not None:
        from bench.cli.history import add_finished

        add_finished(results, out, history_db)
    report_path = None
    if make_report:
        from bench.report.html import write_report

        report_path = write_report([out / "results.json"], out / "report.html")
    _print_results(results, out, as_json, report_path)
    empty = [c for c in results.cells if c.requests_ok == 0 and _window_missed(c)]
    if empty:
        raise ConfigError(_empty_window_line(empty))
    failed = [c.id for c in results.cells if c.requests_ok == 0]
    if failed:
        raise ServerError(f"no request succeeded in cell(s) {', '.join(failed)} (errors: see {out}/records.jsonl)")


def _window_missed(cell: Any) -> bool:
    """An open-loop cell whose requests succeeded, none of them inside its steady window."""
    return bool(cell.window) and (cell.counts or {}).get("finished", 0) > 0 and not (cell.window or {}).get("requests")


def _empty_window_line(cells: list[Any]) -> str:
    c = cells[0]
    w, n = c.window or {}, (c.counts or {}).get("finished", 0)
    return (f"cell(s) {', '.join(x.id for x in cells)}: {n} request(s) finished, none scheduled inside the steady "
            f"window ({w.get('from_s', 0):.1f}-{w.get('to_s', 0):.1f} s, after the warm-up and before the cool-down)"
            ": nothing was measured; send more (--requests or --duration)")


def _workers_value(v: str) -> int | str:
    if str(v).strip().lower() == "auto":
        return "auto"
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise click.BadParameter(f"{v!r} is not a count >= 1 or 'auto'")
    return n


def _run_with_progress(base: str, prof: Profile, settings: ClientSettings, out: Path, quiet: bool,
                       progress_every: float = 30.0, **loop_kw: Any) -> Results:
    """:func:`bench.driver.run_profile` with live progress: a rich display on a terminal, plain lines on stdout
    in a log (every ``progress_every`` s inside a cell); ``loop_kw`` go to it as they are."""
    from bench.driver import run_profile
    from bench.errors import RunInterrupted
    from bench.report.console import say, stderr, stdout
    from bench.report.export import VIEWS
    from bench.report.progress import make_observer, observed

    obs = make_observer(len(prof.cells()), stderr, quiet=quiet, every_s=progress_every, width=stdout.width)

    async def go() -> Results:
        return await observed(obs, run_profile(base, prof, settings, out_dir=out, observer=obs, views=VIEWS,
                                               **loop_kw), progress_every)

    try:
        return asyncio.run(go())
    except RunInterrupted as e:
        say(f"interrupted ({e.signal_name}): {e.records} finished records kept in {e.out_dir}/records.jsonl "
            f"(partial results in {e.out_dir}/results.json; --resume continues it)")
        raise SystemExit(EXIT_INTERRUPTED) from None
    except KeyboardInterrupt:
        say(f"interrupted: finished records kept in {out}/records.jsonl")
        raise SystemExit(EXIT_INTERRUPTED) from None


def _print_results(results: Results, out: Path, as_json: bool, report_path: Path | None = None) -> None:
    from bench.report.console import results_note, results_table, say, stderr, stdout, warn
    from bench.report.export import headline
    from bench.report.progress import shown_notes
    from bench.results import to_json

    if as_json:  # stdout holds the document alone; where its folder is goes to stderr, as without --json
        click.echo(to_json(results), nl=False)
        echo(f"results: {out}/results.json, results.csv, results.md, records.jsonl", err=True)
        return
    stdout.print(results_table(results, width=stdout.width))
    note = results_note(results)
    if note:
        say(note, stdout, soft_wrap=False)
    for h in headline(results):
        say(f"  {h}", stdout, soft_wrap=False)
    shown = shown_notes()
    for w in results.warnings:  # wrapped at the console's width ($COLUMNS), at spaces; once: not those shown live
        if w not in shown:
            warn(w, soft_wrap=False)
    say(f"results: {out}/results.json, results.csv, results.md, records.jsonl", soft_wrap=False)
    if report_path is not None:
        # the path whole (for copying): beside "report:" when that fits the terminal, else on a line of its own
        line = f"report: {report_path}"
        say(line if len(line) <= stderr.width else f"report:\n{report_path}")
        stderr.print("  (open it in a browser; it works offline)", highlight=False)


@cli.command()
@click.argument("results_file", type=click.Path())
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Folder for the PNGs (default: beside "
              "the results file).")
def plot(results_file: str, out_dir: str | None) -> None:
    """Plot a results.json (or a run folder): decode vs streams, and TTFT / prompt tok/s / decode vs depth (PNG
    files).

    Needs matplotlib (pip install 'bench[plot]').
    """
    from pathlib import Path

    from bench.report.console import stderr
    from bench.report.plots import plot_results
    from bench.results import load_results

    results = load_results(results_file)
    where = Path(results_file) if Path(results_file).is_dir() else Path(results_file).parent
    paths = plot_results(results, out_dir or where)
    if not paths:
        stderr.print("nothing to plot: the results have no stream sweep and no depth > 0", highlight=False)
    for p in paths:
        click.echo(str(p))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []})
@click.pass_context
def sim(ctx: click.Context) -> None:
    """Start bench's reference engine: an OpenAI-compatible server whose timing is known exactly.

    \b
    bench sim --port 8000 --decode-step-ms 20 --prefill-tok-s 5000
    bench sim --config profiles/sim-default.toml --port 0     (0: a free port; prints the URL)
    bench sim --help                                          every parameter, with units (docs/sim.md)
    """
    from bench.sim.__main__ import main as sim_main

    try:
        rc = sim_main(list(ctx.args))
    except SystemExit as e:  # the sim's usage error exits 3 (bench's bad input); --help exits 0
        rc = e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    if rc:
        raise SystemExit(rc)


for _cmd in (gate, compare, ab, report, capacity, history, proxy, serve):
    cli.add_command(_cmd)
cli.add_command(_cli_check.check)
cli.add_command(_cli_check.record)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turn errors into one line on stderr and an exit code."""
    from bench.redaction import install_excepthook
    from bench.report.console import stderr

    install_excepthook()  # a traceback (a bug) never shows the API key either
    try:
        cli.main(args=argv, prog_name="bench", standalone_mode=False)
    except click.exceptions.Abort:
        stderr.print("interrupted", highlight=False)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        stderr.print("interrupted", highlight=False)
        return EXIT_INTERRUPTED
    except click.UsageError as e:
        msg = e.format_message()
        stderr.print(f"bench: error: {msg}", highlight=False, markup=False, soft_wrap=True)
        return ConfigError.exit_code
    except click.ClickException as e:
        stderr.print(f"bench: error: {e.format_message()}", highlight=False, markup=False, soft_wrap=True)
        return ConfigError.exit_code
    except BenchError as e:
        head = "" if e.exit_code == EXIT_INTERRUPTED else "bench: error: "  # a stop asked for is no error
        stderr.print(f"{head}{e}", highlight=False, markup=False, soft_wrap=True)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
