"""The ``bench`` command: the spine of the program.

options -> settings -> (embedded engine | URL) -> plan -> runner -> metrics -> report / gate. This module is the
only place that prints errors and turns them into exit codes (table in :mod:`bench.errors`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from . import __version__
from .errors import EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, BenchError, ConfigError

PROBE_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
PROBE_COMPLETION_PROMPT = "The lighthouse keeper climbed the stairs at dusk, and as the lamp came alive he saw"


@contextmanager
def endpoint(url: str | None, *, parallel: int = 4, ctx_size: int = 32768) -> Iterator[str]:
    """Yield the base URL: ``url`` normalized, or the embedded llama-server started for the duration."""
    from .client import normalize_url

    if url:
        yield normalize_url(url)
        return
    from .engine import LocalEngine
    from .report.console import stderr

    with stderr.status("starting the embedded endpoint (llama-server, SmolLM2-135M)..."):
        eng = LocalEngine(parallel=parallel, ctx_size=ctx_size)
        eng.start()
    try:
        stderr.print(f"embedded endpoint: {eng.url}", highlight=False)
        yield eng.url
    finally:
        eng.stop()


def client_options(f: Any) -> Any:
    """Options shared by every command that talks to an endpoint."""
    f = click.option("--model", default=None, help="Model name (default: first entry of GET {URL}/models).")(f)
    f = click.option(
        "--api-key-env", default="OPENAI_API_KEY", show_default=True,
        help="Environment variable holding the API key (never printed or saved).",
    )(f)
    f = click.option(
        "--connect-timeout", type=float, default=10.0, show_default=True, help="Connect timeout, seconds."
    )(f)
    f = click.option(
        "--read-timeout", type=float, default=None,
        help="Longest silence allowed mid-response, seconds (default: none; long prefills send nothing for minutes).",
    )(f)
    return f


def _settings(api_key_env: str, connect_timeout: float, read_timeout: float | None) -> Any:
    from .client import ClientSettings

    if connect_timeout <= 0:
        raise ConfigError("--connect-timeout must be > 0")
    if read_timeout is not None and read_timeout <= 0:
        raise ConfigError("--read-timeout must be > 0")
    return ClientSettings(api_key_env=api_key_env, connect_timeout_s=connect_timeout, read_timeout_s=read_timeout)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="bench")
def cli() -> None:
    """bench: speed profiler for OpenAI-compatible LLM endpoints (vLLM, SGLang, llama.cpp, TGI, Ollama...).

    \b
    Measures TTFT, ITL, TPOT, E2E, decode tok/s per stream and aggregate, prefill (prompt) tok/s at context
    depths, and gates CI on regressions. URL is the OpenAI base URL (http://host:port/v1); with no URL, bench
    starts its embedded endpoint (llama.cpp's llama-server with SmolLM2-135M) on loopback.

    \b
    Start here:
      bench probe                         one request against the embedded endpoint
      bench probe http://gpu:8000/v1      one request against your server
      bench run --profile quick           the default sweep (decode at 1..N streams, prefill at depths)
      bench replay CASE.json              replay a recorded server response and check the measurement
    """


@cli.command()
@click.argument("url", required=False)
@click.option("--endpoint", "endpoint_kind", type=click.Choice(["chat", "completions"]), default="chat",
              show_default=True, help="POST {URL}/chat/completions or {URL}/completions.")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True, help="Output tokens asked.")
@click.option("--prompt", "prompt_text", default=None,
              help="Prompt text (default: a short-story request; for completions, the start of a story).")
@click.option("--json", "as_json", is_flag=True, help="Print the record as one JSON object on stdout, nothing else.")
@client_options
def probe(url: str | None, endpoint_kind: str, max_tokens: int, prompt_text: str | None, as_json: bool,
          model: str | None, api_key_env: str, connect_timeout: float, read_timeout: float | None) -> None:
    """Send one streaming request and print its measurement.

    Prints TTFT, time to first content, decode tok/s, ITL, TPOT, E2E, token counts and prefill tok/s of a single
    request. Exits 0 on success, 4 if the URL is unreachable, 5 if the request failed (the record is still
    printed).
    """
    from .client import RequestSpec, make_http_client, require_ok, discover_model, stream_request
    from .metrics import request_metrics

    settings = _settings(api_key_env, connect_timeout, read_timeout)
    if endpoint_kind == "chat":
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt_text or PROBE_PROMPT}]}
    else:
        body = {"prompt": prompt_text or PROBE_COMPLETION_PROMPT}
    body.update({"max_tokens": max_tokens, "temperature": 0})

    async def go(base: str) -> Any:
        async with make_http_client(settings) as client:
            name = model or await discover_model(client, base, settings.api_key)
            return await stream_request(client, base, RequestSpec("probe-0", endpoint_kind, body),
                                        model=name, secret=settings.api_key)

    with endpoint(url, parallel=1) as base:
        rec = asyncio.run(go(base))
    _print_record(rec, request_metrics(rec), as_json, f"probe {base} ({endpoint_kind})")
    require_ok(rec)


def _print_record(rec: Any, m: Any, as_json: bool, title: str) -> None:
    from .report.console import request_table, stdout

    d = m.to_dict()
    if as_json:
        d.update({"endpoint": rec.endpoint, "model": rec.model, "usage": rec.usage, "timings": rec.timings})
        click.echo(json.dumps(d, ensure_ascii=False))
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
    from .replay import load_case, replay_case
    from .report.console import stderr

    case = load_case(case_file)
    rec, m, fails = replay_case(case)
    _print_record(rec, m, as_json, f"replay {case.id}: {case.about}")
    for f in fails:
        stderr.print(f"[red]mismatch[/red] {f}", highlight=False)
    if fails:
        raise SystemExit(EXIT_CHECK_FAILED)
    if not as_json:
        stderr.print(f"[green]pass[/green] {case.id}: meets its {len(case.expect)} expectations", highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turn errors into one line on stderr and an exit code."""
    from .report.console import stderr

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
        stderr.print(f"bench: error: {e}", highlight=False, markup=False, soft_wrap=True)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
