"""This machine's limits on simultaneous connections: local ports and open files.

Every TCP connection bench opens to one ``host:port`` takes a local port from the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default: 28,232 ports; the range is per network namespace and
shared by IPv4 and IPv6) and one file descriptor of its process (``RLIMIT_NOFILE``, ``ulimit -n``). A run that
needs more than either gives requests that fail at connect: ``EADDRNOTAVAIL`` ("Cannot assign requested address")
when no local port is left, ``EMFILE`` / ``ENFILE`` when no file descriptor is.

* :func:`check_connections` is the check before a run sends anything (:meth:`bench.session.endpoint.Session.open`):
  it raises the soft open-files limit up to the hard one when that is enough, and otherwise returns the one line
  that names the cause and the fix (``sysctl``, ``ulimit -n``, or fewer streams);
* :func:`reset_on_close` makes every connection bench opens close with a reset, so that none waits in TIME_WAIT
  holding its port after bench gave it up;
* :func:`local_limit_text` turns a connect's ``OSError`` into that kind of line, for the request's record
  (error kind ``client_limit``, :class:`bench.errors.FastLocalLimit`).
"""

from __future__ import annotations

import errno
import socket
import struct
from pathlib import Path
from typing import Any

from bench.errors import FastLocalLimit

__all__ = ["PORT_RANGE_FILE", "CONNECTION_MARGIN", "FILE_MARGIN", "LOCAL_LIMIT_ERRNOS", "port_range",
           "open_files_limit", "raise_open_files", "check_connections", "local_limit_text", "local_limit", "reset_on_close"]

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
CONNECTION_MARGIN = 16  # connections beside the streams: the set-up client, /metrics, a GPU exporter, a probe
FILE_MARGIN = 64  # descriptors beside the connections: files, pipes to workers, the interpreter's own
LOCAL_LIMIT_ERRNOS = (errno.EADDRNOTAVAIL, errno.EMFILE, errno.ENFILE)
WIDE_RANGE = "1024 65535"


def port_range(path: Path | None = None) -> tuple[int, int] | None:
    """The kernel's ephemeral port range ``(low, high)``, both included (from ``path``, by default
    :data:`PORT_RANGE_FILE`); None where it cannot be read (not Linux)."""
    try:
        text = (path or PORT_RANGE_FILE).read_text(encoding="ascii")
        low, high = (int(x) for x in text.split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


def open_files_limit() -> tuple[int, int] | None:
    """``RLIMIT_NOFILE`` as ``(soft, hard)`` (``resource.RLIM_INFINITY`` for no limit); None off Unix."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return int(soft), int(hard)


def raise_open_files(need: int) -> bool:
    """Raise the soft open-files limit to ``need`` when the hard limit allows it (worker processes inherit it).
    True when the limit now holds ``need``."""
    lim = open_files_limit()
    if lim is None:
        return True
    import resource

    soft, hard = lim
    if soft == resource.RLIM_INFINITY or soft >= need:
        return True
    if hard != resource.RLIM_INFINITY and hard < need:
        return False
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (OSError, ValueError):
        return False
    return True


def check_connections(streams: int, target: str, *, ports: tuple[int, int] | None = None) -> str | None:
    """Whether this machine can hold ``streams`` simultaneous connections to ``target`` (``host:port``) from one
    process: None when it can (the soft open-files limit raised if needed), else one line naming the cause and the
    fix. ``ports``: the ephemeral range to check (default: :func:`port_range`)."""
    rng = ports if ports is not None else port_range()
    need = streams + CONNECTION_MARGIN
    if rng is not None:
        have = rng[1] - rng[0] + 1
        if need > have:
            return (f"{streams:,} streams need {need:,} simultaneous connections to {target}, more than the "
                    f"{have:,} local ports of this machine's range {rng[0]}-{rng[1]}: widen it (sysctl -w "
                    f"net.ipv4.ip_local_port_range=\"{WIDE_RANGE}\", as root) or run at most "
                    f"{max(0, have - CONNECTION_MARGIN):,} streams")
    files = need + FILE_MARGIN
    if not raise_open_files(files):
        lim = open_files_limit()
        hard = lim[1] if lim is not None else 0
        return (f"{streams:,} streams need about {files:,} open files in one bench process, more than its limit "
                f"of {hard:,} (RLIMIT_NOFILE, hard): raise it (ulimit -n {files}, as root or in "
                f"/etc/security/limits.conf) or run at most {max(0, hard - CONNECTION_MARGIN - FILE_MARGIN):,} "
                "streams")
    return None


def local_limit_text(e: BaseException, target: str) -> str | None:
    """One line for a connect that failed on this machine's own limits (``EADDRNOTAVAIL``, ``EMFILE``,
    ``ENFILE``), naming the limit and the fix; None for any other failure."""
    code = getattr(e, "errno", None)
    if code not in LOCAL_LIMIT_ERRNOS:
        return None
    if code == errno.EADDRNOTAVAIL:
        rng = port_range()
        span = f" ({rng[0]}-{rng[1]}: {rng[1] - rng[0] + 1:,} ports)" if rng else ""
        return (f"no local port left for a new connection to {target} ([Errno {code}] Cannot assign requested "
                f"address): this machine's connections to it hold its whole local port range{span}; widen it "
                f"(sysctl -w net.ipv4.ip_local_port_range=\"{WIDE_RANGE}\") or run fewer streams")
    if code == errno.EMFILE:
        lim = open_files_limit()
        n = f" of {lim[0]:,}" if lim else ""
        return (f"no file descriptor left for a new connection to {target} ([Errno {code}] Too many open files): "
                f"this process reached its open-files limit{n} (ulimit -n); raise it or run fewer streams")
    return (f"no file descriptor left for a new connection to {target} ([Errno {code}] Too many open files in "
            f"system): the system's limit (sysctl fs.file-max) is reached; raise it or run fewer streams")


def local_limit(e: BaseException, host: str, port: int) -> FastLocalLimit | None:
    """:class:`~bench.errors.FastLocalLimit` for a connect that failed on this machine's own limits
    (:func:`local_limit_text`), else None."""
    text = local_limit_text(e, f"{host}:{port}")
    return FastLocalLimit(text) if text else None


def reset_on_close(sock: Any) -> None:
    """``SO_LINGER`` on with a 0 s timeout: closing the socket sends a reset instead of a FIN, so the connection
    never waits in TIME_WAIT. The side that closes first keeps TIME_WAIT for 60 s with its 4-tuple, and bench closes
    first whenever it gives a connection up (the rest of a body late after ``[DONE]``, a cancelled or broken stream,
    an expired keep-alive, the end of a run): to a remote server (``tcp_tw_reuse`` applies to loopback only) those
    local ports stay unusable, and a run of thousands of streams, or the next run, finds none left (EADDRNOTAVAIL).
    bench only closes a connection it has nothing more to read from or send on, so the reset loses nothing."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
