"""``bench serve``: the embedded endpoint (llama.cpp's llama-server with SmolLM2-135M) on its own loopback URL, so
that other tools (curl, guidellm, a second bench) can be pointed at it; runs until Ctrl-C or SIGTERM
(the engine itself: :mod:`bench.tools.engine`)."""

from __future__ import annotations

import signal
from types import FrameType

import click

__all__ = ["serve"]


@click.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Loopback port to listen on (0: a free one; the URL is printed).")
@click.option("--parallel", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Server slots: the most streams it decodes at once.")
@click.option("--ctx-size", type=click.IntRange(512), default=32768, show_default=True,
              help="Context in tokens, shared by every slot (one request can use at most the model's trained "
              "context: 8192 for SmolLM2-135M; the line printed at the start says).")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the server's log here (llama-server.log; default: a temporary file).")
def serve(port: int, parallel: int, ctx_size: int, log_dir: str | None) -> None:
    """Start the embedded endpoint on its own URL and keep it running until Ctrl-C.

    The same llama-server and SmolLM2-135M that `bench run` starts when given no URL, on 127.0.0.1; its OpenAI
    base URL is printed on stdout (the first line), for any tool to use:

    \b
      bench serve --port 8080 &
      bench run http://127.0.0.1:8080/v1 -p quick
      curl http://127.0.0.1:8080/v1/models
    """
    from bench.report.console import say, stderr
    from bench.tools.engine import INTERRUPT_GRACE_S, LocalEngine

    eng = LocalEngine(parallel=parallel, ctx_size=ctx_size, log_dir=log_dir, port=port)
    # `kill PID` (SIGTERM, what service managers and `timeout` send) stops the server as Ctrl-C does; by default
    # it would end this process at once and leave llama-server running on the port
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with stderr.status("starting the embedded endpoint (llama-server, SmolLM2-135M)..."):
            eng.start()
            per = eng.slot_ctx()  # what a request can use, as bench run and bench check read it (not -c)
        click.echo(eng.url)
        ctx = f"{per} tokens of context per request, {ctx_size} in all" if per else f"{ctx_size} tokens of context"
        say(f"serving {eng.url} ({parallel} slots, {ctx}; log {eng.log_path}); Ctrl-C stops it")
        rc = eng.wait()
        raise click.ClickException(f"llama-server exited with code {rc}; see {eng.log_path}")
    except KeyboardInterrupt:
        stderr.print("stopping the embedded endpoint", highlight=False)
        eng.stop(grace_s=INTERRUPT_GRACE_S)
    finally:
        eng.stop()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
