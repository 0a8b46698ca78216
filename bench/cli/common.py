"""Pieces shared by the command modules (``cli.py``, ``cli_gate.py``): the endpoint context (a URL, or the
embedded llama-server), the client options every endpoint command takes (timeouts, TLS: ``--ca-bundle``,
``--insecure``), and the settings built from them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from bench.errors import ConfigError
from bench.warns import warning

if TYPE_CHECKING:
    from bench.config.profile import Profile

__all__ = ["endpoint", "client_options", "settings_from_options", "echo", "workload_options", "workload_overrides",
           "checked_images", "client_options_noting", "single_workload", "unused_out",
           "WORKLOAD_KEYS"]

WORKLOAD_KEYS = ("images", "image_size", "image_format", "image_source", "tools", "tool_choice")


def workload_options(f: Any) -> Any:
    """The workload's flags (docs/workloads.md): images, their size, format and source; tools and tool_choice."""
    opts = [
        click.option("--images", metavar="N[,N...]", help="Images per chat request (image_url parts, unique per "
                     "request); a comma list sweeps them in bench run's closed-loop cells (one value elsewhere)."),
        click.option("--image-size", metavar="WxH[,WxH...]", help="Pixels of each image (default 512x512); a comma "
                     "list sweeps them in bench run's closed-loop cells (one value elsewhere)."),
        click.option("--image-format", type=click.Choice(["png", "jpeg"]), help="How images are encoded "
                     "(default jpeg)."),
        click.option("--image-source", metavar="noise|DIR", help="Random noise (default) or a folder of images "
                     "(scaled to --image-size, a seeded noise row on top)."),
        click.option("--tools", metavar="builtin|FILE.json", help="Offer tools: bench's two built-in functions or "
                     "an OpenAI tools list."),
        click.option("--tool-choice", metavar="auto|required|none|NAME", help="tool_choice sent with --tools "
                     "(required or NAME force a call; a missing one is counted)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def workload_overrides(kw: dict[str, Any]) -> dict[str, Any]:
    """Profile overrides from the workload flags in ``kw`` (popped), each parsed; absent flags give nothing."""
    from bench.config.profile import parse_counts, parse_image_sizes

    vals = {k: kw.pop(k, None) for k in WORKLOAD_KEYS}
    out: dict[str, Any] = {}
    if vals["images"] is not None:
        out["images"] = parse_counts(vals["images"], "--images")
    if vals["image_size"] is not None:
        out["image_sizes"] = parse_image_sizes(vals["image_size"])
    for k in ("image_format", "image_source", "tools", "tool_choice"):
        if vals[k] is not None:
            out[k] = vals[k]
    return out


def single_workload(overrides: dict[str, Any], where: str) -> dict[str, Any]:
    """``overrides`` (:func:`workload_overrides`) for a command or mode with one workload: a comma list of
    ``--images`` or ``--image-size`` is refused in one line (only the first value was used, without a word)."""
    for key, flag in (("images", "--images"), ("image_sizes", "--image-size")):
        vals = overrides.get(key)
        if vals is not None and len(vals) > 1:
            raise ConfigError(f"{flag} takes one value in {where}, which sends one workload, got "
                              f"{','.join(str(v) for v in vals)}; bench run sweeps a comma list in its "
                              "closed-loop cells")
    return overrides


def checked_images(profile: Any) -> Any:
    """The profile, once its ``image_source`` folder (when a cell sends images) holds images: a bad one is refused
    before anything is sent or written (it stopped the first image cell, leaving a run behind in --out)."""
    if profile.image_source != "noise" and any(c.images for c in profile.cells()):
        from bench.client.images import image_files

        image_files(profile.image_source)
    return profile


def unused_out(command: str, *folders: Any) -> None:
    """Refuse ``--out`` for a command that never writes over a run (``bench gate``, ``bench ab``: they have no
    ``--overwrite``) when one of ``folders`` already holds a run's files: the baseline given as ``--out`` would be
    replaced by the candidate."""
    from bench.results import run_files_in

    for d in folders:
        if held := run_files_in(d):
            raise ConfigError(f"--out: {d} already holds a run ({', '.join(held)}); {command} never writes over one: "
                              "choose another folder")


def echo(text: str, err: bool = False, nl: bool = True) -> None:
    """``click.echo`` of ``text`` redacted of the API key (:func:`bench.redaction.redact`): plain lines and JSON
    documents that carry what a server said (the rich consoles of :mod:`bench.report.console` redact their own)."""
    from bench.redaction import redact

    click.echo(redact(text), err=err, nl=nl)


def engine_size(profile: Profile, url: str | None = None) -> tuple[int, int]:
    """Slots and context the embedded llama-server needs for ``profile``'s cells: ``(parallel, ctx_size)``.

    Raises:
        ConfigError: the embedded endpoint will run (no ``url``) and a cell's prompt + output cannot fit the
            default model's context (SmolLM2-135M: 8,192 tokens a request, whatever ``-c``): said before the
            server starts; not with ``$BENCH_MODEL`` (another model).
    """
    import os

    from bench.session.endpoint import check_fits_context
    from bench.tools.engine import MODEL_CTX

    if url is None and not os.environ.get("BENCH_MODEL"):
        check_fits_context(profile, MODEL_CTX, where="the embedded endpoint's model (SmolLM2-135M: {n} tokens a request)",
                           cure="give the URL of a server with a longer context")
    cells = profile.cells()
    streams = max(c.streams for c in cells)
    need = max(c.depth + c.max_tokens for c in cells) + 512
    return max(4, streams), max(8192, max(4, streams) * need)


_ENDPOINT_PATHS = ("/chat/completions", "/completions", "/models")


def checked_url(base: str) -> str:
    """The base URL (from :func:`bench.client.normalize_url`, which checked that it parses, port included); a full
    endpoint URL pasted by mistake is cut back to its base with a note.

    An ``https://`` URL gets a TLS handshake first (:func:`bench.transport.tls.check_tls`).

    Raises:
        EndpointUnreachable: ``https://`` to a server that does not speak TLS.
    """
    from bench.report.console import say
    from bench.transport.tls import check_tls

    for tail in _ENDPOINT_PATHS:
        if base.endswith(tail):
            cut = base[: -len(tail)] or base
            say(f"note: {base} is an endpoint URL; using its base URL {cut} (give the base, e.g. "
                "http://host:8000/v1)")
            base = cut
            break
    check_tls(base)  # https:// to a plain-HTTP port: one line in seconds, not a connect timeout
    return base


@contextmanager
def endpoint(url: str | None, *, parallel: int = 4, ctx_size: int = 32768, log_dir: Any = None) -> Iterator[str]:
    """Yield the base URL: ``url`` normalized, or the embedded llama-server started for the duration (its log in
    ``log_dir``, e.g. the results folder, else a temporary file removed when it stops)."""
    from bench.client import normalize_url

    if url is not None:  # "" is a mistake, not a request for the embedded endpoint: normalize_url says so
        yield checked_url(normalize_url(url))
        return
    from bench.errors import EXIT_INTERRUPTED, RunInterrupted
    from bench.report.console import say, stderr
    from bench.tools.engine import INTERRUPT_GRACE_S, LocalEngine

    eng = LocalEngine(parallel=parallel, ctx_size=ctx_size, log_dir=log_dir)
    try:
        with stderr.status("starting the embedded endpoint (llama-server, SmolLM2-135M)..."):
            eng.start()
        say(f"embedded endpoint: {eng.url}", soft_wrap=False)
        yield eng.url
    except (KeyboardInterrupt, RunInterrupted, SystemExit) as e:
        if not isinstance(e, SystemExit) or e.code == EXIT_INTERRUPTED:  # Ctrl-C: say so, stop at once
            stderr.print("interrupted: stopping the embedded endpoint (llama-server)", highlight=False)
            eng.stop(grace_s=INTERRUPT_GRACE_S)
        raise
    finally:
        eng.stop()


READ_TIMEOUT_NOTE = "default: none; long prefills send nothing for minutes"


def client_options_noting(read_timeout_note: str) -> Callable[[Any], Any]:
    """:func:`client_options` for a command whose --read-timeout has another default (its help says which)."""
    return lambda f: client_options(f, read_timeout_note=read_timeout_note)


def client_options(f: Any, *, read_timeout_note: str = READ_TIMEOUT_NOTE) -> Any:
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
        help=f"Longest silence allowed mid-response, seconds ({read_timeout_note}).",
    )(f)
    # the options below reach settings_from_options through the click context (the commands' signatures stay)
    f = click.option(
        "--setup-timeout", type=float, default=30.0, show_default=True, expose_value=False, callback=_keep,
        help="Longest wait for set-up calls (/models, /tokenize, /props), seconds; the generation stream is "
        "bounded by --read-timeout only.",
    )(f)
    f = click.option(
        "--ca-bundle", type=click.Path(dir_okay=False), default=None, expose_value=False, callback=_keep,
        help="PEM file of CA certificates to trust for https:// (a private CA); like SSL_CERT_FILE.",
    )(f)
    f = click.option(
        "--insecure", is_flag=True, default=False, expose_value=False, callback=_keep,
        help="Do not verify the server's TLS certificate (warns; prefer --ca-bundle).",
    )(f)
    return f


def _keep(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"bench.{param.name}"] = value
    return value


INSECURE_WARNING = warning("insecure-tls")


def settings_from_options(api_key_env: str, connect_timeout: float, read_timeout: float | None) -> Any:
    """``ClientSettings`` from the client options (``--setup-timeout``, ``--ca-bundle`` and ``--insecure`` come
    through the click context) and the root ``--io`` flag. Raises ConfigError on a bad value; warns on
    ``--insecure``."""
    from bench.client import ClientSettings

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
        raise ConfigError(f"--api-key-env takes the NAME of an environment variable (letters, digits, _), not "
                          f"{'an empty string' if not api_key_env else 'this text'}: e.g. --api-key-env MY_KEY")
    if connect_timeout <= 0:
        raise ConfigError("--connect-timeout must be > 0")
    if read_timeout is not None and read_timeout <= 0:
        raise ConfigError("--read-timeout must be > 0")
    ctx = click.get_current_context(silent=True)
    io = ctx.find_root().params.get("io", "fast") if ctx is not None else "fast"
    meta = ctx.meta if ctx is not None else {}
    setup = meta.get("bench.setup_timeout", 30.0)
    if setup is not None and setup <= 0:
        raise ConfigError("--setup-timeout must be > 0")
    settings = ClientSettings(api_key_env=api_key_env, connect_timeout_s=connect_timeout, read_timeout_s=read_timeout,
                              setup_timeout_s=setup, fast_io=io == "fast", ca_bundle=meta.get("bench.ca_bundle"),
                              insecure=bool(meta.get("bench.insecure", False)))
    settings.ssl_context()  # a bad --ca-bundle is one line now, not a failure later
    if settings.insecure:
        from bench.report.console import warn

        warn(INSECURE_WARNING)
    _warn_unset_key(ctx, api_key_env)
    return settings


def _warn_unset_key(ctx: click.Context | None, name: str) -> None:
    """A variable named by ``--api-key-env`` on the command line that is unset or empty: warn (its name, never a
    key), since the request goes without a key. The default variable, unset, stays silent (many servers need none)."""
    import os

    from click.core import ParameterSource

    given = ctx is not None and ctx.get_parameter_source("api_key_env") == ParameterSource.COMMANDLINE
    if given and not os.environ.get(name):
        from bench.report.console import warn

        warn(warning("api-key-unset", name=name))
