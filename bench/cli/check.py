"""``bench check URL`` (the endpoint's conformance report) and ``bench record URL`` (one live response -> a
case file for ``bench replay``). Options and printing only; the work is in :mod:`bench.tools.check` and
:mod:`bench.tools.record`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from bench.cli.common import client_options, client_options_noting, echo, endpoint
from bench.cli.common import settings_from_options as _settings

__all__ = ["check", "record"]

CHECK_READ_TIMEOUT_NOTE = "default: 15 s, so that a server that never ends a response cannot hang the check"


@click.command()
@click.argument("url", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object on stdout, nothing else.")
@client_options_noting(CHECK_READ_TIMEOUT_NOTE)
def check(url: str | None, as_json: bool, model: str | None, api_key_env: str, connect_timeout: float,
          read_timeout: float | None) -> None:
    """What does this endpoint actually do? A conformance report of the streaming behaviours that break
    benchmark numbers, each with what bench does about it (docs/check.md). A few short requests.

    \b
    bench check http://gpu:8000/v1
    bench check http://gpu:8000/v1 --json

    Exits 0 with the report, 5 when no request of the check succeeded (one line naming the error; with --json
    the report is printed first), 3/4 as every command for a bad URL or an unreachable one.
    """
    from bench.errors import ServerError
    from bench.tools.check import check_endpoint, failure_line, report_rows

    settings = _settings(api_key_env, connect_timeout, read_timeout)
    with endpoint(url, parallel=1) as base:
        rep = asyncio.run(check_endpoint(base, settings, model))
    failed = failure_line(rep)  # no request succeeded: no table of findings that are only the failure's echo
    if as_json:
        echo(json.dumps(rep, ensure_ascii=False))
    if failed is not None:
        raise ServerError(failed)
    if as_json:
        return
    from rich.table import Table
    from rich.text import Text

    from bench.report.console import stdout

    t = Table(title=Text(f"bench check {base} ({rep.get('backend') or 'unknown backend'}, {rep.get('model')})"),
              header_style="bold", width=80)
    for h in ("behaviour", "found", "what bench does"):
        t.add_column(h, overflow="fold")
    for row in report_rows(rep):
        t.add_row(*(Text(v) for v in row))
    stdout.print(t)


@click.command()
@click.argument("url", required=False)
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False), help="Case file to write.")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True, help="Output tokens asked.")
@click.option("--endpoint", "endpoint_kind", type=click.Choice(["chat", "completions"]), default="chat",
              show_default=True, help="POST {URL}/chat/completions or {URL}/completions.")
@click.option("--prompt", "prompt_text", default=None, help="Prompt text (default: a short-story request).")
@client_options
def record(url: str | None, out_file: str, max_tokens: int, endpoint_kind: str, prompt_text: str | None,
           model: str | None, api_key_env: str, connect_timeout: float, read_timeout: float | None) -> None:
    """Record one live streaming response (raw bytes and their timing) as a case for ``bench replay``.

    The case (docs/cases.md) holds the request (API key redacted), every read at its time after the send, and
    what bench measured as its 'expect' block; `bench replay CASE.json` then serves it back and checks it.
    """
    from bench.tools.record import record_case, write_case

    settings = _settings(api_key_env, connect_timeout, read_timeout)
    with endpoint(url, parallel=1) as base:
        case: dict[str, Any] = asyncio.run(record_case(
            base, settings, case_id=Path(out_file).stem, model=model, endpoint=endpoint_kind, max_tokens=max_tokens,
            prompt=prompt_text))
    p = write_case(case, out_file)
    echo(f"{p}: {len(case['events'])} writes, status {case['status']}, expect {json.dumps(case['expect'])}")
