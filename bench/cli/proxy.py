"""``bench proxy``: the delay proxy's command line (the proxy itself: :mod:`bench.tools.proxy`)."""

from __future__ import annotations

import click

__all__ = ["proxy"]


@click.command("proxy")
@click.argument("upstream_url")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port to listen on (0: a free one; the URL is printed).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--delay-per-event-ms", type=click.FloatRange(0, 600_000, max_open=True), default=0.0,
              show_default=True, help="Added to every gap between two streamed events (a decode slowdown).")
@click.option("--delay-first-byte-ms", type=click.FloatRange(0, 600_000, max_open=True), default=0.0,
              show_default=True, help="Added before the response starts (a TTFT rise).")
def proxy(upstream_url: str, port: int, host: str, delay_per_event_ms: float, delay_first_byte_ms: float) -> None:
    """Forward an OpenAI-compatible endpoint, streaming included, adding known delays.

    Event i of a stream goes out no earlier than its arrival + first-byte delay + i * per-event delay, so a
    client through the proxy measures the upstream plus exactly these delays (docs/gate.md, "Known slowdowns").
    Runs until Ctrl-C.

    Example: a llama-server whose events come every 20 ms, made 5 % slower in decode (20 / 0.95 - 20 = 1.05 ms):

    \b
      bench proxy http://127.0.0.1:8080/v1 --port 8081 --delay-per-event-ms 1.05
      bench run http://127.0.0.1:8081/v1 -p ci-gate
    """
    from bench.tools.proxy import ProxyConfig, serve

    serve(ProxyConfig(upstream_url, delay_per_event_ms, delay_first_byte_ms, host, port))
