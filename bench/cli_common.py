"""Pieces shared by the command modules (``cli.py``, ``cli_gate.py``): the endpoint context (a URL, or the
embedded llama-server), the client options every endpoint command takes, and the settings built from them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .errors import ConfigError

__all__ = ["endpoint", "client_options", "settings_from_options"]


@contextmanager
def endpoint(url: str | None, *, parallel: int = 4, ctx_size: int = 32768, log_dir: Any = None) -> Iterator[str]:
    """Yield the base URL: ``url`` normalized, or the embedded llama-server started for the duration (its log in
    ``log_dir``, e.g. the results folder, else a temporary file removed when it stops)."""
    from .client import normalize_url

    if url:
        yield normalize_url(url)
        return
    from .engine import LocalEngine
    from .report.console import stderr

    with stderr.status("starting the embedded endpoint (llama-server, SmolLM2-135M)..."):
        eng = LocalEngine(parallel=parallel, ctx_size=ctx_size, log_dir=log_dir)
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


def settings_from_options(api_key_env: str, connect_timeout: float, read_timeout: float | None) -> Any:
    """``ClientSettings`` from the client options and the root ``--io`` flag. Raises ConfigError on a bad value."""
    from .client import ClientSettings

    if connect_timeout <= 0:
        raise ConfigError("--connect-timeout must be > 0")
    if read_timeout is not None and read_timeout <= 0:
        raise ConfigError("--read-timeout must be > 0")
    ctx = click.get_current_context(silent=True)
    io = ctx.find_root().params.get("io", "fast") if ctx is not None else "fast"
    return ClientSettings(api_key_env=api_key_env, connect_timeout_s=connect_timeout, read_timeout_s=read_timeout,
                          fast_io=io == "fast")
