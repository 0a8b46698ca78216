"""Other work on this host during a run: the CPU that neither bench nor a server on this host used.

A stored gate baseline and the gate's run are compared as if the machine were the same; when a test suite, a build
or another job shares the cores with a server on this host in one of them, the server's speed moves with it
(a 2-core run moved decode by -23..-32 % that way: benchmarks/results/gate_oc_real-2026-12-02-vm.md). So every run
records how many cores other processes kept busy meanwhile (``machine.other_load`` in results.json), from
/proc/stat (the host's busy time) minus the CPU time of bench's own processes and of the server's, when it listens
on this host (found by its listening port in /proc/net/tcp). Niced work counts: a process at nice 5 still takes
about a quarter of a contended core from a server at nice 0, and a process's own CPU time (utime, subtracted for
bench and the server) holds its niced time too, so the host's figure must hold it as well::

    load = HostLoad.start("http://127.0.0.1:8080/v1")
    ... the run ...
    load.figures()   # {"other_cores": 0.03, "busy_cores": 1.9, "bench_cores": 0.4, "server_cores": 1.5, ...}

bench's CPU is this process's tree plus the children it reaped (a worker pool replaced mid-run). Linux only
(other systems: ``figures()`` is None). Limits: the server is the process holding the listening port, so a server
behind a proxy process on the same host (docker-proxy) counts as other work; a server on another host is not
seen at all (``server_local`` false: the gate then does not compare). The gate compares the two runs'
``other_cores`` (:func:`bench.gate.host_load_change`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import resource
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["HostLoad", "listener_pid", "server_here", "tree_cpu_s"]

PROC = Path("/proc")


def server_here(base_url: str) -> bool:
    """Whether the endpoint's host is this machine: a loopback address, or one this host can bind (an address of
    its own interfaces). False when the name does not resolve."""
    host = urlsplit(base_url).hostname
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, addr in infos:
        ip = str(addr[0]).split("%", 1)[0]
        if ipaddress.ip_address(ip).is_loopback:
            return True
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((addr[0], 0))
            return True
    return False


def _host_busy_s() -> float | None:
    """Busy CPU seconds of the whole host since boot (user + nice + system + irq + softirq + steal), or None.
    Niced time counts: it is in the per-process utime subtracted from it (:func:`_stat`), and niced work still
    takes a share of the cores from a server of normal priority. guest and guest_nice (fields 9-10) are left out:
    the kernel already counts them in user and nice."""
    try:
        first = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    v = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: utime + stime) of a process, or None when it is gone. utime holds the process's
    time at any nice level (and its guest time), as /proc/stat's user + nice does for the host."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float]]:
    out = {}
    for p in PROC.iterdir():
        if p.name.isdigit() and (s := _stat(int(p.name))) is not None:
            out[int(p.name)] = s
    return out


def tree_cpu_s(root: int, procs: dict[int, tuple[int, float]] | None = None, exclude: int | None = None) -> float:
    """CPU seconds of ``root`` and every process under it (alive now), leaving out ``exclude``'s subtree."""
    procs = _processes() if procs is None else procs
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in procs and pid != exclude:
            total += procs[pid][1]
            todo += kids.get(pid, [])
    return total


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this host (its socket's inode in /proc/net/tcp*, then the process
    holding it), or None (not listening here, or not visible to this user)."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    for p in PROC.iterdir() if inodes else ():
        if not p.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (p / "fd").iterdir()):
                return int(p.name)
        except OSError:
            continue
    return None


def _bench_cpu_s(procs: dict[int, tuple[int, float]], server_pid: int | None) -> float:
    """This process and its descendants alive now, plus the children it has reaped (their CPU leaves the tree when
    they end): bench's own CPU seconds, the server's subtree left out."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return tree_cpu_s(os.getpid(), procs, exclude=server_pid) + reaped.ru_utime + reaped.ru_stime


class HostLoad:
    """The host's busy time and bench's and the server's CPU since :meth:`start` (module docstring)."""

    def __init__(self, server_pid: int | None, local: bool) -> None:
        self.server_pid, self.local = server_pid, local
        self.t0 = time.monotonic()
        self.busy0 = _host_busy_s()
        procs = _processes()
        self.bench0 = _bench_cpu_s(procs, server_pid)
        self.server0 = tree_cpu_s(server_pid, procs) if server_pid else 0.0

    @classmethod
    def start(cls, base_url: str) -> HostLoad:
        """Start counting for a run against ``base_url`` (a loopback URL: its server's CPU is counted apart)."""
        u = urlsplit(base_url)
        local = server_here(base_url)
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(listener_pid(port) if local else None, local)

    def figures(self) -> dict[str, Any] | None:
        """Cores kept busy since the start, on average: ``busy_cores`` (the host), ``bench_cores``,
        ``server_cores`` (None when the server is not a process of this host seen here) and ``other_cores``
        (the rest: other work), with ``span_s`` and ``server_local``; None off Linux."""
        span = time.monotonic() - self.t0
        busy = _host_busy_s()
        if self.busy0 is None or busy is None or span <= 0:
            return None
        procs = _processes()
        bench = _bench_cpu_s(procs, self.server_pid) - self.bench0
        server = tree_cpu_s(self.server_pid, procs) - self.server0 if self.server_pid else None
        other = max(0.0, (busy - self.busy0) - bench - (server or 0.0))
        return {"other_cores": round(other / span, 3), "busy_cores": round((busy - self.busy0) / span, 3),
                "bench_cores": round(bench / span, 3),
                "server_cores": None if server is None else round(server / span, 3),
                "server_local": self.local, "span_s": round(span, 1), "cores": os.cpu_count()}
