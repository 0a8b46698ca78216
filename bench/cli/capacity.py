"""``bench capacity`` and the open-loop options of ``bench run`` (``--rate``, ``--trace``, ``--slo``...; ``--slo``
also scores the cells of a concurrency run).

Options only: the work is in :mod:`bench.load` (plans, the executor, the search); this module builds its settings,
runs it and prints.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from bench.cli.common import (
    checked_images,
    client_options,
    endpoint,
    single_workload,
    workload_options,
    workload_overrides,
)
from bench.cli.common import settings_from_options as _settings
from bench.errors import EXIT_INTERRUPTED, ConfigError, RunInterrupted

if TYPE_CHECKING:
    from bench.client import ClientSettings
    from bench.config.load import LoadSettings
    from bench.config.profile import Profile
    from bench.load.capacity import SearchSettings

__all__ = ["capacity", "load_options", "load_settings", "with_cell_slo", "run_open_loop", "LOAD_OPTION_NAMES"]

RATE_POINT_S = 50.0  # --by rate: a refine point's schedule (docs/load.md, "Capacity")

LOAD_OPTION_NAMES = ("rate", "duration", "requests", "arrival", "burstiness", "ramp", "max_concurrency",
                     "input_tokens", "output_tokens", "dataset", "seed", "slo", "trace", "block_tokens", "speed",
                     "drain", "warmup", "cooldown", "users", "turns", "think")


def _one_slo(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> str | None:
    """``--slo`` given once (every objective in it); given again it is refused, not silently replaced."""
    if len(value) > 1:
        raise click.BadParameter(f"given {len(value)} times; put every objective in one --slo, e.g. --slo "
                                 "ttft_p90=2s,tpot_p90=60ms", param_hint="--slo")
    return value[0] if value else None


# open-loop options that do not apply to the search (it chooses each point's load): refused, and hidden from its help
_NOT_FOR_CAPACITY = ("rate", "trace", "block_tokens", "speed", "users", "turns", "think")


def load_options(f: Any) -> Any:
    """The open-loop options (shared by ``bench run`` and ``bench capacity``)."""
    opts = [
        click.option("--rate", type=float, help="Open loop: requests/s (mode rate)."),
        click.option("--duration", type=float, help="Open loop: seconds of arrivals (or --requests)."),
        click.option("--requests", type=click.IntRange(1), help="Open loop: this many requests (or --duration)."),
        click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant"]), help="Arrival process "
                     "(default poisson)."),
        click.option("--burstiness", type=float, help="Gamma shape of the gaps: 1 = Poisson, < 1 burstier."),
        click.option("--ramp", type=float, help="Linear ramp-up from 0 to the rate over this many seconds."),
        click.option("--max-concurrency", type=click.IntRange(1), help="Cap on requests in flight."),
        click.option("--input-tokens",
                     help="Prompt tokens: N, or uniform:LO,HI, normal:MEAN,SD, lognormal:MEDIAN,SIGMA."),
        click.option("--output-tokens", help="Output tokens, same forms (default --max-tokens / the profile's)."),
        click.option("--dataset", type=click.Path(dir_okay=False), help="JSONL prompts ({\"prompt\": ...})."),
        click.option("--seed", type=int, help="Seed of the schedule and sizes (default 0)."),
        click.option("--slo", multiple=True, callback=_one_slo,
                     help="SLOs (once; every objective in it): ttft_p90=2s,tpot_p90=60ms,e2e_p99=30s or 'ttft_ms <= 2000 and tpot_ms <= 60'; "
                     "goodput and each SLO per point, or per cell of a concurrency run."),
        click.option("--trace", type=click.Path(dir_okay=False), help="Replay a Mooncake JSONL or Azure CSV trace."),
        click.option("--block-tokens", type=click.IntRange(1), help="Tokens per trace hash block (default 512)."),
        click.option("--speed", type=float, help="Trace speed factor (2 = twice as fast)."),
        click.option("--drain", type=float, help="Seconds to wait for requests in flight after the last send "
                     "before cutting them (default 60)."),
        click.option("--warmup", type=float, help="Seconds at the start of a point left out of its statistics "
                     "(default 20 % of the span, at most 30; a --trace keeps every request: 0)."),
        click.option("--cooldown", type=float, help="Seconds at the end of a point left out (default 10 %, at "
                     "most 10; a --trace: 0)."),
        click.option("--sessions", "users", type=click.IntRange(1), help="Multi-turn mode: this many conversations."),
        click.option("--turns", type=click.IntRange(1), help="Turns per conversation (default 3)."),
        click.option("--think", type=float, help="Seconds between an answer and the next turn (default 1)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


_FLAG_TO_FIELD = {"duration": "duration_s", "ramp": "ramp_s", "drain": "drain_s", "warmup": "warmup_s",
                  "cooldown": "cooldown_s", "think": "think_s"}


_SESSION_ONLY = ("turns", "think_s")  # settings only a multi-turn (--sessions) run reads


def load_settings(profile: Profile, kw: dict[str, Any]) -> LoadSettings | None:
    """LoadSettings from the profile's ``mode``/``[load]`` and the flags given (flags win); None when neither asks
    for an open-loop mode (``--slo`` alone is then for the concurrency cells: :func:`with_cell_slo`). ``kw`` holds
    the options of :func:`load_options` (None = not given)."""
    from bench.load.point import LoadSettings

    given = {_FLAG_TO_FIELD.get(k, k): v for k, v in kw.items() if v is not None}
    base = dict(profile.load)
    mode = profile.mode
    chosen = [k for k in ("trace", "users", "rate") if k in given]
    if len(chosen) > 1:
        a, b = kw_names({k: 0 for k in chosen[:2]})
        raise ConfigError(f"--{a} and --{b} ask for two open-loop modes: give one (--rate R for Poisson arrivals, "
                          "--trace FILE to replay a trace, --sessions N for multi-turn conversations)")
    if "trace" in given:
        mode = "trace"
    elif "users" in given:
        mode = "sessions"
    elif "rate" in given:
        mode = "rate"
    alone = [k for k in _SESSION_ONLY if k in given]
    if alone and mode != "sessions":
        raise ConfigError(f"--{kw_names({alone[0]: 1})[0]} applies to multi-turn runs: add --sessions N")
    if mode == "concurrency":
        others = {k: v for k, v in given.items() if k != "slo"}
        if others:
            raise ConfigError(f"--{next(iter(kw_names(others)))} applies to open-loop runs: add --rate R (or "
                              "--trace FILE)")
        return None
    names = {f.name for f in fields(LoadSettings) if f.init}
    ls = LoadSettings(mode=mode, **{k: v for k, v in {**base, **given}.items() if k in names})
    if ls.mode == "rate" and ls.duration_s is None and ls.requests is None:
        raise ConfigError("open loop: give --duration S or --requests N with --rate")
    ls.check()
    return ls


def with_cell_slo(profile: Profile, slo: str | None) -> Profile:
    """The concurrency profile with ``--slo`` (it wins over the ``[load]`` key ``slo``), checked: every cell then
    gets ``goodput``, ``slo`` and ``slo_met`` (docs/load.md). ``slo`` None: the profile as it is."""
    from bench.measure.slo import parse_slo

    if slo is None:
        return profile
    parse_slo(slo)
    return replace(profile, load=tuple(sorted({**dict(profile.load), "slo": slo}.items())))


def kw_names(given: dict[str, Any]) -> list[str]:
    """Flag names (``max-concurrency``) of the given load settings."""
    back = {v: k for k, v in _FLAG_TO_FIELD.items()} | {"users": "sessions"}
    return [back.get(k, k).replace("_", "-") for k in given]


def run_open_loop(url: str | None, prof: Profile, ls: LoadSettings, settings: ClientSettings, out: Path,
                  model: str | None, workers: int | str = 1, ray_address: str | None = None, *, quiet: bool = False,
                  progress_every: float = 30.0) -> Any:
    """``bench run`` in rate/trace/sessions mode: run the point (from ``workers`` processes, or Ray actors on
    ``ray_address``) with the progress of every run (bench.report.progress), return the results document (files
    written to ``out``)."""
    from bench.driver import run_load
    from bench.load.point import describe_point
    from bench.report.console import stderr, stdout
    from bench.report.progress import make_observer, observed

    obs = make_observer(1, stderr, quiet=quiet, every_s=progress_every, width=stdout.width)
    with endpoint(url, parallel=max(4, ls.max_concurrency or 16)) as base:
        try:
            results = asyncio.run(observed(obs, run_load(base, prof, settings, ls, out_dir=out, model=model,
                                                         workers=workers, ray_address=ray_address, observer=obs),
                                           progress_every))
        except (RunInterrupted, KeyboardInterrupt) as e:
            n = f"{e.records} " if isinstance(e, RunInterrupted) else ""
            _interrupted(e, f"{n}finished records kept in {out}/records.jsonl (partial results in "
                         f"{out}/results.json; an open-loop schedule is not resumed: run it again)")
    if not quiet:  # --json: the document on stdout, nothing else
        from bench.report.console import say

        for cell in results.cells:
            for line in describe_point(cell.to_dict()):  # wrapped at the console's width ($COLUMNS), indent kept
                say(line, stderr, soft_wrap=False)
    return results


@click.command()
@click.argument("url", required=False)
@click.option("--by", type=click.Choice(["rate", "concurrency"]), default="rate", show_default=True,
              help="Search over the arrival rate (open loop) or the number of requests in flight.")
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True, help="Output tokens.")
@click.option("--start", type=float, default=1.0, show_default=True, help="First load (req/s or concurrency).")
@click.option("--factor", type=float, default=2.0, show_default=True, help="Escalation factor between points.")
@click.option("--max-load", type=float, default=10_000.0, show_default=True, help="Highest load tried.")
@click.option("--resolution", type=float, default=0.02, show_default=True, help="Stop bisecting at hi/lo <= 1+this.")
@click.option("--trials", type=click.IntRange(1), default=3, show_default=True, help="Trials at each end of the "
              "final bracket.")
@click.option("--max-points", type=click.IntRange(1), default=40, show_default=True, help="Budget of points.")
@click.option("--time-budget", type=float, help="Seconds the search may take; when the next point would end later, "
              "the answer is the interval earned so far (default for --by rate: 170, or 170 / B^2 for gamma arrivals of "
              "--burstiness B < 1, at most 680; none for concurrency). A first "
              "probe longer than it is refused (a low --start stretches it); a concurrency point is cut where it "
              "ends.")
@click.option("--confidence", "level", type=float, default=0.95, show_default=True,
              help="Level of the interval (--by rate).")
@click.option("--target-width", type=float, default=0.05, show_default=True,
              help="--by rate: stop refining when the interval's hi/lo - 1 is at most this.")
@click.option("--endpoint", "endpoint_kind", type=click.Choice(["chat", "completions"]), default="chat",
              show_default=True, help="API endpoint.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Results folder.")
@click.option("--json", "as_json", is_flag=True, help="Print capacity.json on stdout, nothing else.")
@click.option("--overwrite", is_flag=True, help="Replace the search already in --out (capacity.json, points/).")
@load_options
@workload_options
@client_options
def capacity(url: str | None, by: str, max_tokens: int, start: float, factor: float, max_load: float,
             resolution: float, trials: int, max_points: int, time_budget: float | None, level: float,
             target_width: float, endpoint_kind: str, out_dir: str, as_json: bool, overwrite: bool,
             model: str | None, api_key_env: str, connect_timeout: float, read_timeout: float | None,
             **load_kw: Any) -> None:
    """Find the highest rate (or concurrency) at which the SLOs hold, with an interval (docs/load.md).

    --by rate: short probes escalate by --factor until the SLO is missed, then refine points of --duration
    seconds (default 50) run around the estimate, and a model fitted across them (the share of requests over
    each limit against the arrival rate) gives the steady-state boundary and its interval at --confidence,
    within --time-budget (default 170 s; bursty arrivals get more). --by concurrency: points of 8 x N
    requests, escalate, bisect to --resolution, confirm both ends with --trials. Writes DIR/capacity.json,
    every point's records and summary (DIR/points/) and the set-up requests' records (DIR/records.jsonl).

    \b
      bench capacity http://gpu:8000/v1 --slo ttft_p90=2s,tpot_p90=60ms \\
          --input-tokens 512 --out cap/
    """
    from bench.config.profile import Profile
    from bench.load.capacity import SearchSettings
    from bench.load.capacity_points import default_time_budget

    if not load_kw.get("slo"):
        raise ConfigError("--slo is needed (e.g. --slo ttft_p90=2s,tpot_p90=60ms)")
    for k in _NOT_FOR_CAPACITY:
        if load_kw.get(k) is not None:
            flag = kw_names({_FLAG_TO_FIELD.get(k, k): 0})[0]
            raise ConfigError(f"bench capacity: --{flag} does not apply: the search chooses each point's load "
                              "(--by, --start, --factor, --max-load); for one load of your own: bench run --rate R")
    settings = _settings(api_key_env, connect_timeout, read_timeout)
    prof = Profile(name="capacity", endpoint=endpoint_kind, max_tokens=max_tokens, warmup=0)
    prof = checked_images(prof.with_overrides(**single_workload(workload_overrides(load_kw), "bench capacity")))
    if load_kw.get("duration") is None and load_kw.get("requests") is None:
        load_kw["duration"] = RATE_POINT_S if by == "rate" else 20.0
    ls = load_settings(replace(prof, mode="rate"), load_kw)
    assert ls is not None  # mode "rate": always open loop
    if time_budget is None:
        time_budget = default_time_budget(by, ls.arrival, ls.burstiness)
    ss = SearchSettings(by=by, start=start, factor=factor, max_load=max_load, resolution=resolution, trials=trials,
                        max_points=max_points, confidence=level, target_width=target_width, time_budget_s=time_budget,
                        refine_s=ls.duration_s)
    ss.check()
    from bench.results import discard_when_failed

    with discard_when_failed(out_dir):  # a search that fails before writing anything leaves no empty folder
        _prepare_capacity_folder(Path(out_dir), overwrite)
        doc = _capacity_run(url, prof, ls, ss, settings, Path(out_dir), model, quiet=as_json)
    _refuse_cut_first_point(doc, Path(out_dir))
    _print_capacity(doc, as_json)
    click.echo(f"results: {out_dir}/capacity.json, {out_dir}/points/ (set-up requests: records.jsonl)", err=True)


# what the shared open-loop options do in a search (load_options' help says what they do in bench run); the numbers
# are bench.load.capacity_points' REFINE_WARMUP_SHARE, REFINE_COOLDOWN_S and bench.load.capacity's probe_s
# (tests/load/test_capacity.py checks)
CAPACITY_HELP = {
    "duration": "--by rate: seconds of a refine point's schedule (default 50; probes last 4 s, or longer for 5 "
                "requests in their judged second half). --by concurrency: each point is 8 x N requests instead.",
    "warmup": "--by rate: seconds at the start of a refine point left out of its statistics (default 25 % of it). "
              "Probes are judged on the second half of their schedule; --by concurrency leaves out the first and "
              "last N requests of a point.",
    "cooldown": "--by rate: seconds at the end of a refine point left out (default 0: its window runs to the end "
                "of its schedule). Probes: 0.",
    "output_tokens": "Output tokens per request, same forms as --input-tokens (default --max-tokens).",
}

for _param in capacity.params:  # accepted (to refuse them in one line) but not listed in capacity's --help
    if isinstance(_param, click.Option) and _param.name in _NOT_FOR_CAPACITY:
        _param.hidden = True
    if isinstance(_param, click.Option) and _param.name in CAPACITY_HELP:
        _param.help = CAPACITY_HELP[_param.name]


def _prepare_capacity_folder(out: Path, overwrite: bool) -> None:
    """A search never adds its points to another search's folder: refused, or cleared with ``--overwrite``."""
    import shutil

    from bench.results import prepare_folder

    held = [n for n in ("capacity.json", "points") if (out / n).exists()]
    if held and not overwrite:
        raise ConfigError(f"--out {out}: already holds a capacity search ({', '.join(held)}); --overwrite replaces "
                          "it, or choose another folder")
    for n in held:
        shutil.rmtree(out / n) if (out / n).is_dir() else (out / n).unlink()
    prepare_folder(out, overwrite=overwrite)


def _capacity_run(url: str | None, prof: Profile, ls: LoadSettings, ss: SearchSettings, settings: ClientSettings,
                  out: Path, model: str | None,
                  quiet: bool) -> Any:
    from bench.driver import run_capacity
    from bench.load.capacity_run import Progress

    assert ls.slo_spec is not None
    prog = None if quiet else Progress(sys.stderr, ls.slo_spec, tty=sys.stderr.isatty())
    with endpoint(url, parallel=16) as base:
        try:
            return asyncio.run(run_capacity(base, prof, settings, ls, ss, out_dir=out, model=model, progress=prog))
        except (RunInterrupted, KeyboardInterrupt) as e:
            _print_interrupted(out / "capacity.json", quiet)
            _interrupted(e, f"the points finished so far are in {out}/capacity.json and {out}/points/")


def _print_interrupted(path: Path, as_json: bool) -> None:
    """After an interrupt: what the finished points show (capacity.json as written), as a whole search prints it."""
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(doc, dict):
        _print_capacity(doc, as_json)


def _refuse_cut_first_point(doc: dict[str, Any], out: Path) -> None:
    """``--by concurrency``: the time budget cut the first point (no point finished): one line, exit 3."""
    from bench.load.capacity_run import PER_SLOT_REQUESTS

    cut = doc.get("cut_point")
    if doc.get("points") or not cut or doc.get("interrupted"):
        return
    raise ConfigError(f"--time-budget {doc.get('time_budget_s'):g} s ended before the first point ({cut['load']:g} in "
                      f"flight, {int(cut['load']) * PER_SLOT_REQUESTS} requests) finished: raise --time-budget or "
                      f"lower --start (what it recorded: {out}/capacity.json)")


def _interrupted(e: BaseException, kept: str) -> NoReturn:
    """One line on stderr for a stopped run (SIGINT or SIGTERM), then exit 130."""
    from bench.report.console import say

    name = e.signal_name if isinstance(e, RunInterrupted) else "SIGINT"
    say(f"interrupted ({name}): {kept}")
    raise SystemExit(EXIT_INTERRUPTED) from None


def _print_capacity(doc: dict[str, Any], as_json: bool) -> None:
    """The curve (what its req/s columns count below it), the answer, the note; or ``--json``: the document."""
    import json

    from bench.report.console import stdout
    from bench.report.tables import capacity_answer, curve_note, curve_text

    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    import textwrap

    width = max(60, stdout.width)  # the answer and the note wrap at spaces: every number stays whole
    if doc.get("points"):
        for line in curve_text(doc, stdout.width):
            click.echo(line)
        click.echo(textwrap.fill(f"({curve_note(doc)})", width, break_long_words=False))
    click.echo(textwrap.fill(capacity_answer(doc), width, subsequent_indent="  ", break_long_words=False))
    if doc.get("note"):
        click.echo(textwrap.fill(f"note: {doc['note']}", width, subsequent_indent="  ", break_long_words=False),
                   err=True)
