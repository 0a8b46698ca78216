"""The error tree and exit codes of bench.

Error tree (every class is raised by bench code only, never leaked from a library)::

    BenchError                  base; ``exit_code`` says how the CLI exits
    ├── ConfigError             bad profile, flag, or file (exit 3)
    ├── RayClusterError         ``--ray``: ray missing, the cluster cannot be joined, its actors do not start (exit 3)
    ├── EndpointUnreachable     the URL does not answer: DNS, refused, connect timeout (exit 4)
    ├── ServerError             the server answered, but every request failed (exit 5)
    │   └── TokenizerError      the server's ``/tokenize`` failed (bad status, malformed reply, timeout); the run
    │       │                   falls back to a calibrated count
    │       └── TokenizerUnavailable   the server has no usable ``/tokenize``
    ├── GateCouldNotRun         ``bench gate`` could not produce a verdict (exit 3, whatever the cause)
    ├── HistoryError            ``bench history``: the store cannot be opened or migrated, or the run is already in
    │                           it (exit 3)
    └── RunInterrupted          SIGINT/SIGTERM stopped a run; finished records and results are on disk (exit 130)

Internal (never leaves bench): ``UnreadableResponse`` (a response the client cannot decode becomes the record's
error); ``FastIOError`` and its subclasses (the stamping transport's failures, translated into records).

Every message is redacted when the error is made (:func:`bench.redaction.redact`): an API key the server echoed
never reaches the terminal through an error.

Per-request failures (HTTP 429, an error inside a stream, a cut stream) are *data*: they are written into the
request's record (``ok=False``, ``error``, ``error_kind``) and never raised.

Exit codes used by the CLI (``cli.py`` is the only place that turns errors into them):

====  =====================================================================
0     success
1     a check failed: ``bench replay`` expectation unmet, ``bench gate`` regression, ``bench history check``
2     ``bench gate``: inconclusive after the re-measure budget
3     bad input: profile, option, results or case file (``bench gate``: could not run, any cause)
4     endpoint unreachable
5     server error: the request(s) failed
130   interrupted (Ctrl-C); finished records are on disk
====  =====================================================================
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from bench.redaction import redact

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INCONCLUSIVE = 2
EXIT_BAD_INPUT = 3
EXIT_UNREACHABLE = 4
EXIT_SERVER_ERROR = 5
EXIT_INTERRUPTED = 130


class BenchError(Exception):
    """Base of bench's errors; the message is one line meant for the user (redacted of the API key)."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(BenchError):
    """A profile, command-line option, or input file is invalid; the message names the key or flag."""

    exit_code = EXIT_BAD_INPUT


class RayClusterError(BenchError):
    """``--ray``: ray is not installed, the cluster cannot be joined, or bench's actors did not start."""

    exit_code = EXIT_BAD_INPUT


class EndpointUnreachable(BenchError):
    """The endpoint could not be reached (DNS failure, connection refused, connect timeout)."""

    exit_code = EXIT_UNREACHABLE


class ServerError(BenchError):
    """The endpoint answered but the request(s) failed (HTTP error, broken stream, error event)."""

    exit_code = EXIT_SERVER_ERROR


class TokenizerError(ServerError):
    """A request to the server's ``/tokenize`` failed (bad status, malformed reply, timeout); one redacted line."""


class TokenizerUnavailable(TokenizerError):
    """The server exposes no usable ``/tokenize`` endpoint."""


class GateCouldNotRun(BenchError):
    """``bench gate`` could not produce a verdict (unreachable endpoint, bad baseline, a cell with no success...)."""

    exit_code = EXIT_BAD_INPUT


class HistoryError(ConfigError):
    """``bench history`` / ``--history``: the run store cannot be opened, reached or migrated, or a run being added
    is already stored (exit 3)."""

    exit_code = EXIT_BAD_INPUT


class RunInterrupted(BenchError):
    """The run was stopped (SIGINT or SIGTERM); ``out_dir`` holds every finished record and the partial results."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, out_dir: Path | None, records: int, signal_name: str = "SIGINT", *,
                 kept: str | None = None) -> None:
        """``kept``: what was kept, in words, where one folder does not say it (``bench ab``: both sides')."""
        super().__init__(f"interrupted ({signal_name}): {kept or f'{records} finished records kept in {out_dir}'}")
        self.out_dir = out_dir
        self.records = records
        self.signal_name = signal_name


class ErrorKind(StrEnum):
    """The closed set of ``error_kind`` values of a failed request's record (docs/metrics.md lists the same)."""

    HTTP_REDIRECT = "http_redirect"
    HTTP_4XX = "http_4xx"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    STREAM_ERROR = "stream_error"
    INCOMPLETE = "incomplete"
    NO_TOKENS = "no_tokens"
    CONNECT = "connect"
    CLIENT_LIMIT = "client_limit"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    BAD_JSON = "bad_json"
    CANCELLED = "cancelled"
    WORKER_LOST = "worker_lost"


class UnreadableResponse(Exception):
    """Internal to the client: a response it cannot decode (an unsupported Content-Encoding, a corrupt compressed
    body); it becomes the request's record error (``kind``), never raised out of :func:`bench.client.stream_request`."""

    def __init__(self, msg: str, kind: str = "protocol") -> None:
        super().__init__(redact(msg))
        self.kind = kind


# --- the stamping transport (bench.transport.http): internal, translated into records by bench.client.request ---------------


class FastIOError(Exception):
    """The connection broke or the peer did not speak valid HTTP/1.1."""


class FastConnectError(FastIOError):
    """The TCP connection could not be opened (refused, unreachable, DNS, connect timeout)."""


class FastLocalLimit(FastConnectError):
    """The connection could not be opened for a limit of this machine, not the server's: no local port left
    (EADDRNOTAVAIL) or no file descriptor (EMFILE, ENFILE); the message names the limit and the fix."""


class FastTimeout(FastIOError):
    """No byte arrived within the read timeout (or the request could not be written in time)."""


class StaleConnection(FastIOError):
    """A reused keep-alive connection failed before any response byte: safe to send again on a fresh one."""


class PointBudgetSpent(Exception):
    """Internal to ``bench capacity``'s search: the point budget (``max_points``) ran out."""


class TimeBudgetSpent(Exception):
    """Internal to ``bench capacity``'s search: the next point would end past ``--time-budget``."""
