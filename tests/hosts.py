"""Test hosts: network namespaces on a bridge, each with its own address, a Ray cluster across them and ``bench
sim`` as the remote server (issue 30). Used by ``tests/session/test_hosts.py`` (the ``hosts`` fixture) and by
``benchmarks/hosts.py`` (the same set-up for people).

Layout (``N`` namespaces, 3 by default; the subnet ``10.A.B.0/24`` is drawn at random, unused by this machine, so
runs side by side do not clash)::

    host (the driver, bench sim)   10.A.B.1   bridge bh<tok>
    ns 1  Ray head                 10.A.B.2   veth pair, its own loopback
    ns 2  Ray worker node          10.A.B.3
    ns 3  Ray worker node          10.A.B.4

A Ray driver joins a cluster through a Ray node on its own machine (``ray.init`` attaches to a local raylet), so the
host runs one more Ray node at 10.A.B.1 with ``--num-cpus 0``: it hosts the driver and no bench actor
(bench.session.ray_actors places actors on nodes that offer CPUs). Every Ray process has its own temporary folder
under one folder of this run and every Ray port is on the namespaces' addresses; nothing listens beyond the
bridge. ``bench sim`` listens on the host's bridge address, so each actor's requests cross a veth pair.

Tear-down (always, also on an error half-way): every process in each namespace (``ip netns pids``) and every
process of this run on the host (its command line names this run's folder) is sent SIGTERM, then SIGKILL; then
``ip netns del``, ``ip link del`` of the bridge (its veth ends go with their namespaces) and the folder.

Where the kernel or the permissions refuse namespaces (not root, no ``ip``, a container without CAP_NET_ADMIN),
:class:`Hosts` raises :class:`HostsUnavailable` with one line saying why; the fixture skips on it. Reachability is
checked with TCP connects from Python (no ``ping``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RAY_PORT = 6379
# a node removed from the cluster is noticed in about a second (Ray's default: about 15 s)
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 2, "health_check_initial_delay_ms": 0}
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's floor is 75 MiB; the tests move records only


class HostsUnavailable(RuntimeError):
    """Namespaces (or Ray) cannot be set up here; the message is one line saying why."""


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {(p.stderr or p.stdout).strip()[:300]}")
    return p


def probe() -> str | None:
    """Why namespaces cannot be made here (one line), or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"bhprobe{secrets.token_hex(3)}"
    p = _run(["ip", "netns", "add", name], check=False)
    if p.returncode != 0:
        return f"ip netns add refused: {(p.stderr or p.stdout).strip().splitlines()[-1][:120]}"
    _run(["ip", "netns", "del", name], check=False)
    return None


def _used_prefixes() -> set[str]:
    """``10.A.B`` prefixes of this machine's IPv4 addresses and routes."""
    text = _run(["ip", "-4", "addr"], check=False).stdout + _run(["ip", "-4", "route"], check=False).stdout
    return set(re.findall(r"\b(10\.\d+\.\d+)\.\d+", text))


def reachable(ip: str, port: int, *, from_ns: str | None = None, timeout: float = 2.0) -> bool:
    """A TCP connection to ``ip:port`` is accepted (from namespace ``from_ns``: through ``ip netns exec``)."""
    if from_ns is None:
        try:
            with socket.create_connection((ip, port), timeout=timeout):
                return True
        except OSError:
            return False
    code = f"import socket; socket.create_connection(({ip!r}, {port}), timeout={timeout}).close()"
    return _run(["ip", "netns", "exec", from_ns, sys.executable, "-c", code], check=False).returncode == 0


def _ray_bin() -> str:
    exe = Path(sys.executable).with_name("ray")
    if exe.exists():
        return str(exe)
    found = shutil.which("ray")
    if found is None:
        raise HostsUnavailable("the `ray` command is not installed (pip install -e '.[ray]')")
    return found


class Hosts:
    """``n`` namespaces on a bridge with their own addresses; optionally a Ray cluster on them and a sim.

    Args:
        n: namespaces (>= 1; the Ray head goes in the first, a worker node in each other).
        ray: start the Ray cluster (head, worker nodes, the host's driver node).
        sim_flags: start ``bench sim`` on the host's bridge address with these flags (``decode_step_ms=20`` ->
            ``--decode-step-ms 20``); None: no sim.
        num_cpus: CPUs each namespace's Ray node offers.

    After ``start()`` (or ``with Hosts(...) as h``): ``h.host_ip``, ``h.ips`` (one per namespace), ``h.ns``
    (namespace names), ``h.ray_address`` (``10.A.B.2:6379``), ``h.sim_url`` (``http://10.A.B.1:PORT/v1``).
    """

    def __init__(self, n: int = 3, *, ray: bool = True, sim_flags: dict[str, Any] | None = None,
                 num_cpus: int = 1) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n, self.want_ray, self.sim_flags, self.num_cpus = n, ray, sim_flags, num_cpus
        self.tok = secrets.token_hex(3)
        self.bridge = f"bh{self.tok}br"
        self.ns = [f"bh{self.tok}n{i + 1}" for i in range(n)]
        self.prefix = ""
        self.host_ip = ""
        self.ips: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix=f"bh{self.tok}-", dir="/tmp"))  # short: Ray's socket paths
        self.procs: list[subprocess.Popen[str]] = []
        self.node_procs: dict[int, subprocess.Popen[str]] = {}  # namespace index -> its `ray start --block`
        self.sim_proc: subprocess.Popen[str] | None = None
        self.sim_url = ""
        self.ray_address = ""
        self._made_ns: list[str] = []
        self._made_bridge = False

    # -- set-up ----------------------------------------------------------------------------------------------
    def start(self) -> Hosts:
        why = probe()
        if why:
            raise HostsUnavailable(why)
        try:
            self._network()
            if self.sim_flags is not None:
                self._start_sim()
            if self.want_ray:
                self._start_ray()
        except BaseException:
            self.close()
            raise
        return self

    def _network(self) -> None:
        used = _used_prefixes()
        rnd = random.SystemRandom()
        while True:
            self.prefix = f"10.{rnd.randint(100, 250)}.{rnd.randint(0, 255)}"
            if self.prefix not in used:
                break
        self.host_ip = f"{self.prefix}.1"
        self.ips = [f"{self.prefix}.{i + 2}" for i in range(self.n)]
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._made_bridge = True
        _run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i, (ns, ip) in enumerate(zip(self.ns, self.ips)):
            _run(["ip", "netns", "add", ns])
            self._made_ns.append(ns)
            veth = f"bh{self.tok}v{i + 1}"
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            for argv in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                         ["ip", "link", "set", "lo", "up"]):
                _run(["ip", "netns", "exec", ns, *argv])

    def _popen(self, argv: Sequence[str], log: str, ns: str | None = None) -> subprocess.Popen[str]:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
        env = clean_env()
        out = open(self.dir / log, "w")  # noqa: SIM115 - closed with the process (the OS)
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                             start_new_session=True)
        out.close()
        self.procs.append(p)
        return p

    def _start_sim(self) -> None:
        port = _free_port(self.host_ip)
        argv = [sys.executable, "-m", "bench.sim", "--host", self.host_ip, "--port", str(port)]
        for k, v in (self.sim_flags or {}).items():
            argv += [f"--{k.replace('_', '-')}", str(v)]
        self.sim_proc = self._popen(argv, "sim.log")
        _wait(lambda: reachable(self.host_ip, port, timeout=0.5), 30, "bench sim", self.dir / "sim.log",
              self.sim_proc)
        self.sim_url = f"http://{self.host_ip}:{port}/v1"

    def _ray_node(self, i: int | None) -> subprocess.Popen[str]:
        """``ray start --block`` in namespace i (0: the head), or on the host (None: the driver's node)."""
        ray = _ray_bin()
        ip = self.host_ip if i is None else self.ips[i]
        where = "host" if i is None else f"n{i + 1}"
        argv = [ray, "start", "--block", "--node-ip-address", ip, "--temp-dir", str(self.dir / where),
                "--disable-usage-stats", "--object-store-memory", str(OBJECT_STORE_BYTES),
                "--num-cpus", str(0 if i is None else self.num_cpus)]
        if i == 0:
            argv += ["--head", "--port", str(RAY_PORT), "--include-dashboard=false",
                     "--system-config", json.dumps(FAST_HEALTH)]
        else:
            argv += ["--address", self.ray_address]
        if i is None:  # the host's network is shared with any other Ray here: no fixed port (52365...) of Ray's
            argv += ["--dashboard-agent-listen-port", str(_free_port(ip))]
        return self._popen(argv, f"ray-{where}.log", None if i is None else self.ns[i])

    def _start_ray(self) -> None:
        self.ray_address = f"{self.ips[0]}:{RAY_PORT}"
        self.node_procs[0] = self._ray_node(0)
        _wait(lambda: reachable(self.ips[0], RAY_PORT, timeout=0.5), 90, "the Ray head",
              self.dir / "ray-n1.log", self.node_procs[0])
        for i in range(1, self.n):
            self.node_procs[i] = self._ray_node(i)
        self.host_node = self._ray_node(None)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            up = {n["ip"] for n in self.nodes() if n["alive"]}
            if up >= {self.host_ip, *self.ips}:
                return
            time.sleep(1.0)
        missing = [ip for ip in [*self.ips, self.host_ip] if ip not in up]
        logs = {ip: self.dir / f"ray-{'host' if ip == self.host_ip else 'n' + str(self.ips.index(ip) + 1)}.log"
                for ip in missing}
        tails = "; ".join(f"{ip}: {p.read_text(errors='replace')[-300:]!r}" for ip, p in logs.items() if p.exists())
        raise RuntimeError(f"Ray nodes at {', '.join(missing)} did not join within 180 s: {tails}")

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes from the head's GCS: ``node_id`` (hex), ``ip``, ``alive`` (asked in a child
        process, so this process never imports ray's native client)."""
        code = ("import json, ray._raylet as r\n"
                "from ray.core.generated.gcs_pb2 import GcsNodeInfo\n"
                f"c = r.GcsClient(address={self.ray_address!r})\n"
                "print(json.dumps([{'node_id': n.node_id.hex(), 'ip': n.node_manager_address, "
                "'alive': n.state == GcsNodeInfo.GcsNodeState.ALIVE} for n in "
                "c.get_all_node_info(timeout=5).values()]))")
        p = _run([sys.executable, "-c", code], check=False, timeout=30)
        try:
            out: list[dict[str, Any]] = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return []
        return out

    def alive_nodes(self) -> int:
        """Live nodes of the cluster."""
        return sum(1 for n in self.nodes() if n["alive"])

    def node_id(self, i: int) -> str:
        """The live Ray node id of namespace i."""
        ids = [n["node_id"] for n in self.nodes() if n["alive"] and n["ip"] == self.ips[i]]
        if not ids:
            raise RuntimeError(f"no live Ray node at {self.ips[i]}")
        return str(ids[0])

    # -- faults ----------------------------------------------------------------------------------------------
    def stop_node(self, i: int) -> None:
        """Kill every process of namespace i at once (SIGKILL): its Ray node is lost, as a host that fails."""
        for pid in self.ns_pids(self.ns[i]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.node_procs.pop(i, None)

    def restart_node(self, i: int) -> None:
        """Start namespace i's Ray worker node again (after :meth:`stop_node`) and wait until it is live."""
        if i == 0:
            raise ValueError("the head cannot be restarted (the cluster goes with it)")
        self.node_procs[i] = self._ray_node(i)
        _wait(lambda: any(n["alive"] and n["ip"] == self.ips[i] for n in self.nodes()), 120,
              f"the Ray node at {self.ips[i]}", self.dir / f"ray-n{i + 1}.log", self.node_procs[i])

    # -- tear-down -------------------------------------------------------------------------------------------
    @staticmethod
    def ns_pids(ns: str) -> list[int]:
        p = _run(["ip", "netns", "pids", ns], check=False)
        return [int(x) for x in p.stdout.split() if x.isdigit()]

    def _own_pids(self) -> set[int]:
        """Every process of this run: in its namespaces, started by it, or naming its folder (Ray's children)."""
        pids = {p.pid for p in self.procs if p.poll() is None}
        for ns in self._made_ns:
            pids |= set(self.ns_pids(ns))
        mark = str(self.dir).encode()
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError):
                    if mark in (d / "cmdline").read_bytes():
                        pids.add(int(d.name))
        pids.discard(os.getpid())
        return pids

    def close(self) -> None:
        """Stop everything this run started and remove its namespaces, bridge and folder. Idempotent."""
        _stop(self._own_pids, reap=lambda: [p.poll() for p in self.procs])
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        for ns in self._made_ns:
            _run(["ip", "netns", "del", ns], check=False)
        self._made_ns = []
        if self._made_bridge:
            _run(["ip", "link", "del", self.bridge], check=False)
            self._made_bridge = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(pids_of: Callable[[], set[int]], reap: Callable[[], object] = lambda: None) -> None:
    """SIGTERM the processes ``pids_of()`` names and wait up to 5 s for them to go, then SIGKILL whatever it names
    then and wait up to 3 s; ``reap`` (waiting on our own children) runs while waiting."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 3.0)):
        pids = pids_of()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            reap()
            pids = {pid for pid in pids if _alive(pid)}
            time.sleep(0.1)


def clean_env() -> dict[str, str]:
    """This process's environment for the processes of the cluster (and a driver joining it): bench on the path,
    no usage stats, and without ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` (tests/session/test_ray.py sets it to 0 for its
    one-machine cluster; with it, ``ray start --address`` refuses to join a multi-node cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)})
    return env


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _wait(ready: Any, timeout_s: float, what: str, log: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
    raise RuntimeError(f"{what} did not come up within {timeout_s:g} s: {tail}")


class PrivateNet:
    """One network namespace with only its loopback up, for tests that change per-namespace network settings (the
    local port range, ``tcp_tw_reuse``) without touching this machine's: ``with PrivateNet(ports=(40000, 40999))
    as net:`` then ``net.run(argv)`` or ``net.popen(argv, log)`` runs a command in it (bench on the path). Tear-down
    (always): every process in it (``ip netns pids``) gets SIGTERM, then SIGKILL; then ``ip netns del``.
    :meth:`start` raises :class:`HostsUnavailable` (one line) where namespaces cannot be made (:func:`probe`)."""

    def __init__(self, ports: tuple[int, int] | None = None, sysctls: dict[str, str] | None = None) -> None:
        self.name = f"bh{secrets.token_hex(3)}p"
        self.settings = dict(sysctls or {})
        if ports is not None:
            self.settings["net.ipv4.ip_local_port_range"] = f"{ports[0]} {ports[1]}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir="/tmp"))
        self._made = False

    def start(self) -> PrivateNet:
        why = probe()
        if why:
            raise HostsUnavailable(why)
        try:
            _run(["ip", "netns", "add", self.name])
            self._made = True
            _run(self.cmd(["ip", "link", "set", "lo", "up"]))
            for key, value in self.settings.items():  # /proc/sys directly: sysctl may not be on PATH (/sbin)
                path = "/proc/sys/" + key.replace(".", "/")
                _run(self.cmd(["sh", "-c", f'echo "$1" > {path}', "sh", value]))
        except BaseException:
            self.close()
            raise
        return self

    def cmd(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the namespace to its end (output captured, never raising on its exit code)."""
        return subprocess.run(self.cmd(argv), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=clean_env())

    def popen(self, argv: Sequence[str], log: str) -> subprocess.Popen[str]:
        """Start ``argv`` in the namespace, its output in ``self.dir / log``."""
        out = open(self.dir / log, "w")  # noqa: SIM115 - closed with the process (the OS)
        p = subprocess.Popen(self.cmd(argv), stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                             env=clean_env(), start_new_session=True)
        out.close()
        return p

    def close(self) -> None:
        """Stop every process in the namespace and delete it (and the folder). Idempotent."""
        if self._made:
            _stop(lambda: set(Hosts.ns_pids(self.name)))
            _run(["ip", "netns", "del", self.name], check=False)
            self._made = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateNet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def private_net(**kw: Any) -> Iterator[PrivateNet]:
    """A test's :class:`PrivateNet`, skipped with the one-line reason where namespaces cannot be made."""
    import pytest

    net = PrivateNet(**kw)
    try:
        net.start()
    except HostsUnavailable as e:
        pytest.skip(str(e))
    try:
        yield net
    finally:
        net.close()


@contextlib.contextmanager
def running_hosts(n: int = 3, **kw: Any) -> Iterator[Hosts]:
    """``with running_hosts() as h:`` -- :class:`Hosts` started and always torn down."""
    h = Hosts(n, **kw)
    with h:
        yield h
