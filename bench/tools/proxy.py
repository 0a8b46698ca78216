"""``bench proxy``: forward an OpenAI-compatible endpoint and add known delays, so a known slowdown exists on a real
engine (docs/gate.md, "Known slowdowns").

Every request is forwarded as it came (method, path, query, headers but the hop-by-hop ones, body) to the upstream.
A streamed answer (``text/event-stream``) is cut into its SSE events (blocks ending in a blank line); event ``i``
(0, 1, 2, ... in the order they arrive) is written no earlier than ``arrival_i + first_byte + i * per_event``, the
response headers go out ``first_byte`` after the upstream's. So the gaps between events grow by exactly
``per_event`` (a decode slowdown: per-stream decode tok/s falls from ``1000 / itl`` to ``1000 / (itl + per_event)``
for one token per event) and the first event comes ``first_byte`` later (TTFT); the targets are absolute, so a late
wake-up of the proxy delays one event, not all later ones. Any other answer is held ``first_byte`` and passed on
whole. The upstream keeps streaming into the proxy's buffer meanwhile, so the engine itself is not slowed.

The upstream URL may end in ``/v1`` (it is cut: paths are forwarded verbatim, so a client uses the proxy's
``http://HOST:PORT/v1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from bench.errors import ConfigError
from bench.sim.runner import app_runner, running_app, serve_app

__all__ = ["ProxyConfig", "create_app", "serve", "running_proxy", "split_events", "upstream_root"]

_HOP = {"host", "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
        "content-length", "accept-encoding", "content-encoding"}
_EVENT_END = re.compile(rb"\r?\n\r?\n")
_SESSION_KEY: web.AppKey[aiohttp.ClientSession] = web.AppKey("proxy_session", aiohttp.ClientSession)
_CFG_KEY: web.AppKey[ProxyConfig] = web.AppKey("proxy_cfg")


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The proxy's settings: ``upstream`` base URL, the delays (ms, >= 0), and where it listens (port 0: free)."""

    upstream: str
    delay_per_event_ms: float = 0.0
    delay_first_byte_ms: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        upstream_root(self.upstream)
        for name in ("delay_per_event_ms", "delay_first_byte_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 600_000:
                raise ConfigError(f"--{name.replace('_', '-')}: must be a number of ms in [0, 600000), not {v!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port: {self.port} is out of range (0-65535; 0 picks a free port)")


def upstream_root(url: str) -> str:
    """The upstream's root to which request paths are appended: ``url`` without a trailing ``/`` or ``/v1``.

    Raises ConfigError (one line) for anything but an ``http(s)://host[:port][/path]`` URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"upstream URL {url!r}: expected http(s)://HOST[:PORT][/v1]")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events of ``buf`` (each with its terminating blank line) and the incomplete rest."""
    out, pos = [], 0
    for m in _EVENT_END.finditer(buf):
        out.append(buf[pos:m.end()])
        pos = m.end()
    return out, buf[pos:]


async def _until(loop: asyncio.AbstractEventLoop, t: float) -> None:
    delay = t - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _read_events(up: aiohttp.ClientResponse, queue: asyncio.Queue[tuple[float, bytes] | None]) -> None:
    """Read the upstream stream as it comes, stamping each event's arrival (None at the end)."""
    loop = asyncio.get_running_loop()
    buf = b""
    try:
        async for chunk in up.content.iter_any():
            t = loop.time()
            events, buf = split_events(buf + chunk)
            for ev in events:
                queue.put_nowait((t, ev))
        if buf:
            queue.put_nowait((loop.time(), buf))
    finally:
        queue.put_nowait(None)


async def _stream(request: web.Request, up: aiohttp.ClientResponse, headers: dict[str, str],
                  cfg: ProxyConfig) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    first, per = cfg.delay_first_byte_ms / 1000.0, cfg.delay_per_event_ms / 1000.0
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    reader = asyncio.create_task(_read_events(up, queue))  # stamps arrivals while the writer waits
    try:
        await _until(loop, loop.time() + first)
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        i = 0
        while (item := await queue.get()) is not None:
            arrival, ev = item
            await _until(loop, arrival + first + i * per)
            await resp.write(ev)
            i += 1
        await reader  # re-raises a read error of the upstream
        await resp.write_eof()
        return resp
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await reader


async def _forward(request: web.Request) -> web.StreamResponse:
    cfg = request.app[_CFG_KEY]
    session = request.app[_SESSION_KEY]
    url = upstream_root(cfg.upstream) + request.rel_url.path_qs
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
    body = await request.read()
    try:
        up_cm = session.request(request.method, url, headers=headers, data=body or None, allow_redirects=False)
        async with up_cm as up:
            out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            if up.content_type == "text/event-stream":
                return await _stream(request, up, out_headers, cfg)
            data = await up.read()
            await asyncio.sleep(cfg.delay_first_byte_ms / 1000.0)
            return web.Response(status=up.status, body=data, headers=out_headers)
    except aiohttp.ClientError as e:
        msg = f"bench proxy: upstream {upstream_root(cfg.upstream)} failed: {type(e).__name__}: {e}"
        return web.json_response({"error": {"message": msg, "type": "proxy_error", "code": 502}}, status=502)


def create_app(cfg: ProxyConfig) -> web.Application:
    """The proxy as an aiohttp app (one upstream session, opened on startup)."""
    app = web.Application(client_max_size=1 << 30)
    app[_CFG_KEY] = cfg

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        app[_SESSION_KEY] = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[_SESSION_KEY].close()

    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", _forward)
    return app


async def _serve(cfg: ProxyConfig, announce: Callable[[str], None]) -> None:
    try:
        await serve_app(app_runner(create_app(cfg)), cfg.host, cfg.port, announce)
    except OSError as e:
        raise ConfigError(f"bench proxy: cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}") from None


def serve(cfg: ProxyConfig, announce: Callable[[str], None] | None = None) -> None:
    """Run the proxy until SIGINT/SIGTERM (blocking); ``announce(url)`` once listening (default: print
    ``listening on URL -> UPSTREAM ...``)."""
    def default(url: str) -> None:
        print(f"listening on {url} -> {cfg.upstream} (+{cfg.delay_per_event_ms:g} ms per event, "
              f"+{cfg.delay_first_byte_ms:g} ms before the first byte)", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(cfg, announce or default))


@contextlib.contextmanager
def running_proxy(cfg: ProxyConfig) -> Iterator[str]:
    """The proxy in a background thread (own event loop) on a free 127.0.0.1 port; yields its ``.../v1`` URL."""
    with running_app(lambda: app_runner(create_app(cfg)), "bench proxy") as url:
        yield url
