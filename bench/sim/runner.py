"""Starting the sim: ``serve`` (blocking, for the CLI) and ``running_sim`` (background thread, for tests).

``serve_app`` and ``running_app`` do the same for any aiohttp application (``bench proxy`` uses them too): listen,
announce the base URL of the bound port, run until SIGINT/SIGTERM or the end of the ``with`` block, clean up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from aiohttp import web

from bench.sim.collector import install as install_gc_rule
from bench.sim.collector import report as report_gc
from bench.sim.config import SimConfig
from bench.sim.server import create_app

__all__ = ["serve", "running_sim", "serve_app", "running_app", "app_runner", "base_url"]

_SHUTDOWN_TIMEOUT_S = 2.0


def app_runner(app: web.Application) -> web.AppRunner:
    """A runner that leaves signals to its caller, logs no access lines and aborts requests after 2 s on stop."""
    return web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)


def _bound_port(runner: web.AppRunner) -> int:
    addrs = runner.addresses
    if not addrs:
        raise RuntimeError("server has no listening socket")
    return int(addrs[0][1])


def base_url(host: str, port: int) -> str:
    """``http://HOST:PORT/v1``; a wildcard host is given as 127.0.0.1, an IPv6 one in brackets."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


async def serve_app(runner: web.AppRunner, host: str, port: int, announce: Callable[[str], None], *,
                    reuse_port: bool = False, install_collector: bool = False) -> None:
    """Listen on ``host:port`` (``port`` 0: any free one; ``reuse_port``: SO_REUSEPORT), ``announce(base_url)``
    of the bound port, run until SIGINT/SIGTERM, clean up. Raises OSError when it cannot listen.
    ``install_collector``: this process is the server's own (:func:`bench.sim.collector.install`)."""
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
        await site.start()
        if install_collector:
            install_gc_rule()
        announce(base_url(host, _bound_port(runner)))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(cfg: SimConfig, announce: Callable[[str], None] | None = None) -> None:
    """Run the sim on ``cfg.host:cfg.port`` until SIGINT/SIGTERM (blocking).

    Once listening it calls ``announce(base_url)``; the default prints ``listening on http://HOST:PORT/v1``
    (the bound port, so ``port = 0`` works) to stdout and flushes. A wildcard host is announced as 127.0.0.1.
    """
    if announce is None:
        def announce(url: str) -> None:
            print(f"listening on {url}", flush=True)
    if cfg.late_write_ms:
        report_gc(cfg.late_write_ms)
    try:
        asyncio.run(serve_app(app_runner(create_app(cfg)), cfg.host, cfg.port, announce, reuse_port=cfg.reuse_port,
                              install_collector=True))
    except KeyboardInterrupt:
        pass


@contextlib.contextmanager
def running_app(make_runner: Callable[[], web.AppRunner], name: str) -> Iterator[str]:
    """Run an application in a background thread (own event loop) on a free 127.0.0.1 port; yield its base URL
    ``http://127.0.0.1:PORT/v1``. On exit the server is shut down (in-flight requests are aborted) and the thread
    joined. ``make_runner`` is called in that thread (the app belongs to its loop)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, object] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        runner = make_runner()
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            state["port"] = _bound_port(runner)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            state["error"] = e
            ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(runner.cleanup())
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(runner.cleanup())
                loop.run_until_complete(loop.shutdown_asyncgens())
            except Exception as e:  # noqa: BLE001 - shutdown is best effort; said on stderr
                print(f"{name}: shutdown error: {e!r}", file=sys.stderr)
            finally:
                loop.close()

    thread = threading.Thread(target=main, name=name.replace(" ", "-"), daemon=True)
    thread.start()
    ready.wait()
    if "error" in state:
        thread.join()
        raise RuntimeError(f"{name} failed to start: {state['error']!r}") from state["error"]  # type: ignore[misc]
    try:
        yield base_url("127.0.0.1", state["port"])  # type: ignore[arg-type]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_SHUTDOWN_TIMEOUT_S + 5)


@contextlib.contextmanager
def running_sim(cfg: SimConfig | None = None) -> Iterator[str]:
    """Run the sim in a background thread (own event loop) on a free 127.0.0.1 port; yield the base URL
    ``http://127.0.0.1:PORT/v1``. On exit the server is shut down (in-flight requests are aborted) and the
    thread joined. ``cfg.host``/``cfg.port`` are ignored."""
    cfg = dataclasses.replace(cfg or SimConfig(), host="127.0.0.1", port=0)
    with running_app(lambda: app_runner(create_app(cfg)), "bench sim") as url:
        yield url
