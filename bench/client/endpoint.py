"""The endpoint side of the client: base URLs, :class:`ClientSettings`, the httpx client bench uses (with its
fast read path and its retry of stale pooled connections), model discovery and the one-line text of an HTTP error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.client.border import admit_response
from bench.errors import ConfigError, EndpointUnreachable, ServerError
from bench.redaction import LOG_FILTER, add_secret, redact
from bench.transport.http import FastPool

_ERR_BODY_LIMIT = 64 * 1024
log = logging.getLogger("bench")
log.addFilter(LOG_FILTER)


def normalize_url(url: str) -> str:
    """OpenAI-style base URL, as the openai client takes it: ``http://host:port/v1`` (no trailing slash).

    ``host:port`` gets ``http://``; a URL with no path gets ``/v1``; a path is kept as given (``/v1``,
    ``/openai/v1``...). A password in the URL (``http://user:pw@host``) is registered for redaction like the API
    key: no output, file or log shows it. Raises :class:`ConfigError` for a URL that is not http(s), does not
    parse (a bad IPv6 literal, a port out of range), or carries a query string or fragment (never sent: refused
    rather than dropped).
    """
    url = url.strip()
    if not url:
        raise ConfigError("the URL is empty: give one like http://host:port/v1, or none for the embedded endpoint")
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        add_secret(parts.password)
        parts.port  # noqa: B018 - parses the port: ValueError when it is not a number in range
    except ValueError as e:
        raise ConfigError(f"URL {redact(url)!r} does not parse ({redact(str(e))}); write it like "
                          "http://host:port/v1 (IPv6: http://[::1]:8000/v1)") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"URL {redact(url)!r} is not an http(s) URL like http://host:port/v1")
    if parts.query or parts.fragment:
        extra = f"?{parts.query}" if parts.query else f"#{parts.fragment}"
        raise ConfigError(f"URL {redact(url)!r}: its {redact(extra)!r} is not supported (bench adds /chat/completions, "
                          "/models... to the base URL, with no query string); give the base URL alone")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def root_url(base: str) -> str:
    """The server root for non-OpenAI routes (``/tokenize``, ``/health``, ``/metrics``): the base minus a final
    ``/v1``."""
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How bench talks to the endpoint.

    Attributes:
        api_key_env: name of the environment variable holding the API key (default ``OPENAI_API_KEY``).
        connect_timeout_s: TCP/TLS connect timeout in seconds (short: an unreachable URL fails fast).
        read_timeout_s: longest silence between two reads of a generation stream in seconds; ``None`` (default)
            = no limit, because a long prefill (a 1M-token prompt) can send no byte for many minutes.
        setup_timeout_s: longest wait for any other call (``/models``, ``/tokenize``, ``/props``...), per read;
            30 s by default, ``None`` = no limit.
        extra_headers: sent with every request.
        fast_io: stream responses (``http://`` and ``https://``) through :mod:`bench.transport.http`, which stamps each
            read the moment it arrives (in ``asyncio.Protocol.data_received``) instead of after httpx's stack
            processed it; every non-streaming call (``/models``, ``/tokenize``) stays on httpx.
        ca_bundle: PEM file of the CA certificates to trust for ``https://`` (instead of the default store;
            ``SSL_CERT_FILE`` is the environment's way to say the same), both read paths.
        insecure: do not verify the server's TLS certificate at all (the CLI warns).
        stamps: fastio's stamp source: ``"auto"`` (kernel receive stamps where the OS gives them, bench.transport.kernel_stamps),
            ``"kernel"`` (the same) or ``"user"`` (user-space stamps); each record says which it got.
    """

    api_key_env: str = "OPENAI_API_KEY"
    connect_timeout_s: float = 10.0
    read_timeout_s: float | None = None
    setup_timeout_s: float | None = 30.0
    extra_headers: dict[str, str] = field(default_factory=dict)
    fast_io: bool = True
    ca_bundle: str | None = None
    insecure: bool = False
    stamps: str = "auto"

    @property
    def api_key(self) -> str | None:
        """The key from the environment, or None. Never printed or stored: reading it registers it for redaction
        everywhere (:func:`bench.redaction.add_secret`)."""
        key = os.environ.get(self.api_key_env) or None
        add_secret(key)
        return key

    def headers(self) -> dict[str, str]:
        """Request headers, with ``Authorization`` when a key is set."""
        h = {"Accept": "text/event-stream", "Accept-Encoding": "identity", **self.extra_headers}
        key = self.api_key
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``https://`` on both read paths; None = httpx's default (certifi, ``SSL_CERT_FILE``).

        Raises:
            ConfigError: ``ca_bundle`` cannot be read as PEM certificates, or both options are given.
        """
        if self.insecure and self.ca_bundle:
            raise ConfigError("give --ca-bundle FILE or --insecure, not both")
        if self.insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        if self.ca_bundle:
            try:
                return ssl.create_default_context(cafile=self.ca_bundle)
            except (OSError, ssl.SSLError, ValueError) as e:
                raise ConfigError(f"--ca-bundle {self.ca_bundle}: not a readable PEM file of CA certificates "
                                  f"({exc_line(e)})") from None
        return None


def make_http_client(settings: ClientSettings, concurrency: int = 1) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` whose pool never caps concurrency below ``concurrency`` streams.

    httpx's default pool allows 100 connections and silently queues the rest; bench sets no connection limit and
    keeps ``concurrency`` connections alive between waves. The client's own timeout (every call but the
    generation stream) reads ``settings.setup_timeout_s``; :func:`stream_request` uses ``read_timeout_s``.
    """
    # keepalive_expiry well under common server idle timeouts (cpp-httplib/llama.cpp: 5 s; uvicorn: 5 s), so a
    # pooled connection is never reused just as the server closes it
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(concurrency, 1) + 4,
                          keepalive_expiry=2.0)
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s, read=settings.setup_timeout_s, write=60.0, pool=None
    )
    ctx = settings.ssl_context()
    inner = httpx.AsyncHTTPTransport(limits=limits, http2=False, verify=ctx if ctx is not None else True)
    client = _BenchClient(timeout=timeout, headers=settings.headers(), transport=_StaleRetryTransport(inner))
    client.bench_stream_timeout = httpx.Timeout(
        connect=settings.connect_timeout_s, read=settings.read_timeout_s, write=60.0, pool=None
    )
    if settings.fast_io:
        client.bench_fast_pool = FastPool(ssl_context=ctx, stamps=settings.stamps)
    return client


class _BenchClient(httpx.AsyncClient):
    """``httpx.AsyncClient`` carrying bench's :class:`~bench.transport.http.FastPool` (``bench_fast_pool``, used by
    :func:`stream_request` for ``http://`` streams) and the generation stream's timeout
    (``bench_stream_timeout``); closing the client closes the pool too."""

    bench_fast_pool: FastPool | None = None
    bench_stream_timeout: httpx.Timeout | None = None

    async def send(self, request: httpx.Request, *, stream: bool = False, **kw: Any) -> httpx.Response:
        """httpx's send, every response passed through the border (:func:`bench.client.border.admit_response`):
        headers redacted of the API key, and the body too when it is read whole."""
        return admit_response(await super().send(request, stream=stream, **kw), streamed=stream)

    async def aclose(self) -> None:
        try:
            await _close_fast_pool(self)
        finally:
            await super().aclose()

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await _close_fast_pool(self)
        finally:
            await super().__aexit__(*exc)


def release_idle(client: Any) -> int:
    """Close ``client``'s idle streaming connections with a reset (:meth:`bench.transport.http.FastPool.drop_idle`):
    their local ports are free at once, for readers in other processes. Returns how many were closed."""
    pool = getattr(client, "bench_fast_pool", None)
    return pool.drop_idle() if pool is not None else 0


async def fill_pool(client: Any, base: str, n: int, timeout_s: float) -> int:
    """Open connections to ``base``'s server until ``client``'s streaming pool has ``n`` idle ones that a request
    could take (:meth:`bench.transport.http.FastPool.preconnect`), within ``timeout_s``. Returns how many opened
    (0 without bench's pool, or with no time given)."""
    pool = getattr(client, "bench_fast_pool", None)
    if pool is None or timeout_s <= 0:
        return 0
    need = n - pool.idle_count(base)
    return await pool.preconnect(base, need, timeout=timeout_s) if need > 0 else 0


async def _close_fast_pool(client: Any) -> None:
    pool, client.bench_fast_pool = client.bench_fast_pool, None
    if pool is not None:
        await pool.aclose()


class _StaleRetryTransport(httpx.AsyncBaseTransport):
    """Retries a request once when the server closed a pooled keep-alive connection before any response.

    Servers such as llama.cpp close a connection right after a streamed response; the close can arrive just after
    httpx put the connection back in its pool, and the next request on it fails at once with no response. Nothing
    reached the server's handler, so sending again on a fresh connection is safe; the failed attempt costs well
    under a millisecond.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.RemoteProtocolError as e:
            if "without sending a response" not in str(e):
                raise
        except (httpx.ReadError, httpx.WriteError):
            pass
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class StreamTap:
    """Live counters of one in-flight request, read by progress displays (cheap to update in the read loop).

    Attributes:
        events: SSE events decoded so far (about one token each; for live display only, never for results).
        started: the request was sent.
        finished: the request ended.
    """

    __slots__ = ("events", "started", "finished")

    def __init__(self) -> None:
        self.events = 0
        self.started = False
        self.finished = False


@dataclass(slots=True)
class RequestSpec:
    """One planned request: where it goes and the exact JSON body.

    Attributes:
        request_id: unique within a run.
        endpoint: ``"chat"`` (``/chat/completions``) or ``"completions"`` (``/completions``).
        body: the JSON body; bench adds ``stream: true`` and ``stream_options.include_usage`` if missing.
        meta: copied into the record (cell, stream index, targets).
    """

    request_id: str
    endpoint: str
    body: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)


async def discover_model(client: httpx.AsyncClient, base: str, secret: str | None = None) -> str:
    """The first model id of ``GET {base}/models`` (bounded by the client's setup timeout).

    Raises:
        EndpointUnreachable: connection refused / DNS / connect timeout.
        ServerError: an HTTP error, a timeout or a body with no model.
    """
    add_secret(secret)
    try:
        r = await client.get(f"{base}/models", headers={"Accept": "application/json"})
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        raise EndpointUnreachable(f"cannot reach {base}: {exc_line(e)}") from None
    except httpx.TimeoutException:
        raise ServerError(f"GET {base}/models: no answer within the setup timeout; pass --model, or raise "
                          "--setup-timeout") from None
    except httpx.HTTPError as e:
        raise ServerError(f"GET {base}/models failed: {exc_line(e)}") from None
    if r.status_code == 404:
        raise ConfigError(no_api_message(base))
    if r.status_code >= 400:
        msg = error_from_body(r.status_code, r.headers.get("content-type", ""), r.content)
        raise ServerError(f"GET {base}/models: {msg}; {_models_cure(r.status_code)}")
    try:
        data = r.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        raise ServerError(f"GET {base}/models returned no model list; pass --model") from None


KEY_REFUSED = "the API key was refused: put the right one in the variable --api-key-env names (OPENAI_API_KEY)"


def _models_cure(status: int) -> str:
    """What to do when ``GET /models`` answers ``status`` (>= 400, not 404)."""
    if status in (502, 503, 504):  # a gateway or proxy with nothing answering behind it, or a server still loading
        return ("the server, or a proxy in front of it, has no model server answering behind it: start it (or wait "
                "until it is ready) and run again")
    if status in (401, 403):
        return KEY_REFUSED
    return "pass --model (a server that does not list its models can still serve them)"


def no_api_message(base: str, call: str = "GET /models") -> str:
    """The one line for a base URL whose ``/models`` (or a request's path) answers 404: most often a typo in the
    path (``/v11``, a missing ``/v1``). ``call``: ``METHOD /path`` below the base URL."""
    method, _, path = call.partition(" ")
    return (f"no OpenAI API at that base URL: {method} {base}{path} answered 404 (not found); is the base URL "
            "right (http://host:8000/v1)?")


def exc_line(e: BaseException) -> str:
    """An exception as one redacted line of at most 300 characters (the type name when it has no text)."""
    s = redact(str(e)).strip() or type(e).__name__
    return s.splitlines()[0][:300]


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def error_from_body(status: int, ctype: str, body: bytes) -> str:
    """One redacted line: ``HTTP <status>: <message>`` from a JSON, HTML or text error body."""
    text = body[:_ERR_BODY_LIMIT].decode("utf-8", "replace")
    msg = ""
    if "json" in ctype or text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
            err = obj.get("error", obj) if isinstance(obj, dict) else obj
            if isinstance(err, dict):
                msg = str(err.get("message") or err.get("detail") or err)
            else:
                msg = str(err)
        except (ValueError, RecursionError):
            msg = text
    elif "html" in ctype or text.lstrip().lower().startswith(("<!doctype", "<html")):
        m = _TITLE.search(text)
        msg = m.group(1) if m else _TAG.sub(" ", text)
    else:
        msg = text
    msg = " ".join(redact(msg).split())[:200]  # redacted before the cut: no key prefix survives it
    if 300 <= status < 400 and not msg:
        msg = "redirect; give the final URL"
    return f"HTTP {status}: {msg}" if msg else f"HTTP {status}"


def _http_kind(status: int) -> str:
    if status < 400:
        return "http_redirect"  # httpx follows no redirect: the URL to give is the final one
    if status == 429:
        return "http_429"
    return "http_5xx" if status >= 500 else "http_4xx"
