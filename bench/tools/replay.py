"""Replay of stream cases: serve a recorded response with its exact bytes and timing, probe it, check it.

A case file (format: ``docs/cases.md``, the same as ``shared/cases/README.md``) holds one HTTP response as timed
raw writes plus an ``expect`` block. :class:`CaseServer` serves it on loopback from aiohttp: the status line and
headers, then each write's exact bytes at ``at_ms`` after the request was read (a ``close`` entry drops the
connection mid-body). :func:`replay_case` probes it with bench's normal client and compares the metrics with
``expect``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.errors import ConfigError

__all__ = ["Case", "load_case", "serve_case", "check_expect", "replay_case"]


@dataclass(frozen=True, slots=True)
class Case:
    """A parsed case file. ``events`` are ``(at_ms, bytes | None)``; None means close the connection."""

    id: str
    about: str
    endpoint: str
    status: int
    headers: dict[str, str]
    events: tuple[tuple[float, bytes | None], ...]
    expect: dict[str, Any]


def load_case(path: str | Path) -> Case:
    """Read and validate a case file. Raises :class:`ConfigError` naming the problem."""
    p = Path(path)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"case file not found: {p}") from None
    except ValueError as exc:
        raise ConfigError(f"case file {p} is not JSON: {exc}") from None
    try:
        evs: list[tuple[float, bytes | None]] = []
        if not isinstance(d["events"], list):
            raise ConfigError(f"case {p} is malformed: 'events' must be a list of objects")
        for i, e in enumerate(d["events"]):
            if not isinstance(e, dict):
                raise ConfigError(f"case {p} is malformed: events[{i}] is not an object")
            if e.get("close"):
                evs.append((float(e["at_ms"]), None))
            elif "data" in e:
                evs.append((float(e["at_ms"]), str(e["data"]).encode("utf-8")))
            else:
                raise ConfigError(f"case {p}: events[{i}] has neither 'data' nor 'close'")
        endpoint = d.get("endpoint", "chat")
        if endpoint not in ("chat", "completions"):
            raise ConfigError(f"case {p}: endpoint must be 'chat' or 'completions', not {endpoint!r}")
        return Case(
            id=str(d.get("id", p.stem)),
            about=str(d.get("about", "")),
            endpoint=endpoint,
            status=int(d.get("status", 200)),
            headers={str(k): str(v) for k, v in (d.get("headers") or {}).items()},
            events=tuple(evs),
            expect=_expectations(d.get("expect") or {}, p),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ConfigError(f"case {p} is malformed: missing or bad {e}") from None


def _make_app(case: Case, late_ms: list[float] | None = None) -> web.Application:
    """The case's app; each write's lateness behind ``at_ms`` (ms) goes to ``late_ms`` when given."""

    async def respond(request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        await request.read()
        resp = web.StreamResponse(status=case.status, headers=case.headers)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for at_ms, data in case.events:
            delay = t0 + at_ms / 1000.0 - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if data is None:
                if request.transport is not None:
                    request.transport.abort()
                return resp
            await resp.write(data)
            if late_ms is not None:
                late_ms.append((time.perf_counter() - t0) * 1000.0 - at_ms)
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "case"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", respond)
    app.router.add_post("/v1/completions", respond)
    app.router.add_get("/v1/models", models)
    return app


@contextmanager
def serve_case(case: Case, *, late_ms: list[float] | None = None) -> Iterator[str]:
    """Serve ``case`` on a free loopback port from a background thread; yields the base URL ``.../v1``.

    ``late_ms``, when given, receives how late (ms) each write left behind the case's ``at_ms``.
    """
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(_make_app(case, late_ms), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["port"] = runner.addresses[0][1]

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            box["error"] = e
        started.set()
        if "error" not in box:
            loop.run_forever()

    th = threading.Thread(target=main, name=f"case-{case.id}", daemon=True)
    th.start()
    started.wait()
    if "error" in box:
        raise box["error"]
    try:
        yield f"http://127.0.0.1:{box['port']}/v1"
    finally:
        fut = asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop)
        try:
            fut.result(timeout=5)
        except Exception:  # noqa: BLE001 - best-effort cleanup of a test server at exit
            pass
        loop.call_soon_threadsafe(loop.stop)
        th.join(timeout=5)
        loop.close()


def _expectations(expect: Any, p: Path) -> dict[str, Any]:
    """A case's ``expect`` block: every key a figure of the record (:class:`RequestMetrics`) or ``error``; a typo
    would be a mismatch at every replay, not the bad input it is."""
    import dataclasses

    from bench.measure.metrics import RequestMetrics

    if not isinstance(expect, dict):
        raise ConfigError(f"case {p} is malformed: 'expect' must be an object")
    known = {f.name for f in dataclasses.fields(RequestMetrics)} | {"error"}
    unknown = sorted(set(expect) - known)
    if unknown:
        raise ConfigError(f"case {p}: unknown key(s) in 'expect': {', '.join(unknown)} (a figure of the record: "
                          "docs/cases.md)")
    return dict(expect)


def check_expect(metrics: dict[str, Any], expect: dict[str, Any]) -> list[str]:
    """Compare metric values with a case's ``expect`` block.

    ``[lo, hi]`` is an inclusive range, ``null`` means the metric must be None, ``error`` must be a substring of
    the recorded error, any other value must match exactly. Returns one line per mismatch (empty = pass).
    """
    fails: list[str] = []
    for key, want in expect.items():
        got = metrics.get(key, "<missing>")
        if key == "error":
            if not isinstance(got, str) or str(want) not in got:
                fails.append(f"error: expected text {want!r} in {got!r}")
            continue
        if want is None:
            if got is not None:
                fails.append(f"{key}: expected null, got {got!r}")
        elif isinstance(want, list) and len(want) == 2:
            if not isinstance(got, (int, float)) or isinstance(got, bool) or not want[0] <= got <= want[1]:
                fails.append(f"{key}: expected in [{want[0]}, {want[1]}], got {got!r}")
        elif isinstance(want, bool) or isinstance(got, bool):
            if got is not want:
                fails.append(f"{key}: expected {want!r}, got {got!r}")
        elif isinstance(want, (int, float)) and isinstance(got, (int, float)):
            if abs(got - want) > 1e-9:
                fails.append(f"{key}: expected {want!r}, got {got!r}")
        elif got != want:
            fails.append(f"{key}: expected {want!r}, got {got!r}")
    return fails


async def _probe(base: str, case: Case, fast_io: bool) -> Any:
    from bench.client import ClientSettings, RequestSpec, discover_model, make_http_client, stream_request
    from bench.config.plan import BodyOptions, request_body

    settings = ClientSettings(connect_timeout_s=5.0, read_timeout_s=30.0, fast_io=fast_io)
    async with make_http_client(settings) as client:
        # as in a real probe: model discovery first, so one-time costs (imports, connect) stay out of the timing
        model = await discover_model(client, base)
        body = request_body(BodyOptions(case.endpoint, force_length=False, template_kwargs=False), "replay", 16)
        return await stream_request(client, base, RequestSpec(case.id, case.endpoint, body), model=model)


#: A case server that wrote more than this behind the case's timing did not serve the case (a busy host).
LATE_MS = 5.0
#: Tries when the case server itself fell behind and the check failed.
TRIES = 3


def replay_case(case: Case, *, fast_io: bool = True) -> tuple[Any, Any, list[str]]:
    """Serve ``case``, probe it once with the normal client, and check it.

    ``fast_io`` picks the client's read path (``ClientSettings.fast_io``); both must measure every case alike.
    Returns ``(record, metrics, failures)``: the :class:`~bench.records.RequestRecord`, its
    :class:`~bench.measure.metrics.RequestMetrics`, and the mismatch lines of :func:`check_expect`.

    The server runs in this process: on a busy host its own writes can leave late, and then the stream was not the
    case's. Such a try is repeated (up to :data:`TRIES`); a failure that remains names the server's lateness.
    """
    from bench.measure.metrics import request_metrics

    for _ in range(TRIES):
        late: list[float] = []
        with serve_case(case, late_ms=late) as base:
            rec = asyncio.run(_probe(base, case, fast_io))
        m = request_metrics(rec)
        fails = check_expect(m.to_dict(), case.expect)
        worst = max(late, default=0.0)
        if not fails or worst <= LATE_MS:
            return rec, m, fails
    note = f"the case server itself wrote up to {worst:.1f} ms behind the case's timing in {TRIES} tries (busy host)"
    return rec, m, [*fails, note]
