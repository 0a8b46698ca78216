"""The error tree and exit codes of bench.

Error tree (every class is raised by bench code only, never leaked from a library)::

    BenchError                  base; ``exit_code`` says how the CLI exits
    ├── ConfigError             bad profile, flag, or file (exit 3)
    ├── RayClusterError         ``--ray``: ray missing, the cluster cannot be joined, its actors do not start (exit 3)
    ├── EndpointUnreachable     the URL does not answer: DNS, refused, connect timeout (exit 4)
    └── ServerError             the server answered, but every request failed (exit 5)

Per-request failures (HTTP 429, an error inside a stream, a cut stream) are *data*: they are written into the
request's record (``ok=False``, ``error``, ``error_kind``) and never raised.

Exit codes used by the CLI (``cli.py`` is the only place that turns errors into them):

====  =====================================================================
0     success
1     a check failed: ``bench replay`` expectation unmet, ``bench gate`` regression
2     ``bench gate``: inconclusive after the re-measure budget
3     bad input: profile, option, results or case file (``bench gate``: could not run, any cause)
4     endpoint unreachable
5     server error: the request(s) failed
130   interrupted (Ctrl-C); finished records are on disk
====  =====================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INCONCLUSIVE = 2
EXIT_BAD_INPUT = 3
EXIT_UNREACHABLE = 4
EXIT_SERVER_ERROR = 5
EXIT_INTERRUPTED = 130


class BenchError(Exception):
    """Base of bench's errors; the message is one line meant for the user."""

    exit_code = EXIT_BAD_INPUT


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
