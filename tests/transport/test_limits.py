"""bench.transport.limits: this machine's limits on simultaneous connections (local ports, open files), checked
before a run and named in a request's error when a connect hits them (error kind ``client_limit``)."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys

import pytest

from bench.transport import limits
from tests.hosts import ROOT, clean_env, private_net

# Fills the namespace's 4-port range with idle connections to a listener, then asks for one more through each
# path (the stamping transport with kernel and user stamps, httpx, and a whole request) and prints what failed.
FILL_RANGE = """
import asyncio, json, socket
import httpx
from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request
from bench.transport.http import FastPool

srv = socket.socket(); srv.bind(("127.0.0.1", 8123)); srv.listen(64)
held = [socket.create_connection(("127.0.0.1", 8123)) for _ in range(4)]

async def main():
    out = {}
    for stamps in ("kernel", "user"):
        try:
            await FastPool(stamps=stamps).stream("GET", "http://127.0.0.1:8123/", {}, b"", connect_timeout=5,
                                                 read_timeout=5)
        except Exception as e:
            out[stamps] = [type(e).__name__, str(e)]
    for fast in (True, False):
        client = make_http_client(ClientSettings(fast_io=fast, connect_timeout_s=5), 1)
        rec = await stream_request(client, "http://127.0.0.1:8123/v1", RequestSpec("r", "chat", {}), model="m")
        out["fast" if fast else "httpx"] = [rec.error_kind, rec.error]
        await client.aclose()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_a_full_port_range_is_named_with_its_fix() -> None:
    with private_net(ports=(40000, 40003)) as net:
        p = net.run([sys.executable, "-c", FILL_RANGE], timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for stamps in ("kernel", "user"):
        kind, text = got[stamps]
        assert kind == "FastLocalLimit", got
        assert "no local port left" in text and "40000-40003: 4 ports" in text and "ip_local_port_range" in text
    for path in ("fast", "httpx"):
        kind, text = got[path]
        assert kind == "client_limit", got
        assert "Cannot assign requested address" in text and "sysctl -w net.ipv4.ip_local_port_range" in text


# Lowers this process's open-files limit to 40, opens files up to it, then asks for a connection.
FILL_FILES = """
import asyncio, json, resource, socket
import bench.transport.kernel_stamps  # imported before the files run out
from bench.client import ClientSettings, RequestSpec, make_http_client, stream_request

srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
base = f"http://127.0.0.1:{srv.getsockname()[1]}/v1"

async def main():
    client = make_http_client(ClientSettings(connect_timeout_s=5), 1)
    resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    held = []
    try:
        while True:
            held.append(open("/dev/null"))
    except OSError:
        pass
    rec = await stream_request(client, base, RequestSpec("r", "chat", {}), model="m")
    print(json.dumps([rec.error_kind, rec.error]))

asyncio.run(main())
"""


def test_no_file_descriptor_left_is_named_with_its_fix() -> None:
    p = subprocess.run([sys.executable, "-c", FILL_FILES], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=clean_env())
    assert p.returncode == 0, p.stderr[-2000:]
    kind, text = json.loads(p.stdout.strip().splitlines()[-1])
    assert kind == "client_limit"
    assert "Too many open files" in text and "open-files limit of 40" in text and "ulimit -n" in text


def test_local_limit_text_only_for_this_machines_limits() -> None:
    assert limits.local_limit_text(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "h:1") is None
    assert limits.local_limit_text(ValueError("x"), "h:1") is None
    enfile = limits.local_limit_text(OSError(errno.ENFILE, "x"), "h:1")
    assert enfile is not None and "fs.file-max" in enfile


def test_check_names_the_port_range_and_the_fix() -> None:
    assert limits.check_connections(700, "127.0.0.1:8000", ports=(40000, 40999)) is None
    msg = limits.check_connections(1000, "127.0.0.1:8000", ports=(40000, 40999))
    assert msg is not None and "\n" not in msg
    assert "1,016 simultaneous connections to 127.0.0.1:8000" in msg and "40000-40999" in msg
    assert 'sysctl -w net.ipv4.ip_local_port_range="1024 65535"' in msg and "at most 984 streams" in msg


def test_check_raises_the_soft_open_files_limit_or_names_ulimit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _k: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _k, v: calls.append(v))
    assert limits.check_connections(2000, "h:1", ports=(1024, 65535)) is None
    assert calls == [(2000 + limits.CONNECTION_MARGIN + limits.FILE_MARGIN, 4096)]  # soft raised to what it needs
    msg = limits.check_connections(8000, "h:1", ports=(1024, 65535))
    assert msg is not None and "limit of 4,096" in msg and "ulimit -n 8080" in msg and "at most 4,016 streams" in msg


def test_port_range_reads_the_kernels_file(tmp_path) -> None:
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert limits.port_range(f) == (32768, 60999)
    assert limits.port_range(tmp_path / "missing") is None


# A 4-port range with tcp_tw_reuse off (as towards a remote server): 12 connections, one after the other, each
# given up by bench (the pool closed) once its response is read. A FIN close would keep each port in TIME_WAIT for
# 60 s and the 5th connect would find none; bench's reset leaves none there.
CYCLE_PORTS = """
import asyncio, json, subprocess
from bench.transport.http import FastPool

async def answer(reader, writer):
    while await reader.readuntil(b"\\r\\n\\r\\n"):
        writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
        await writer.drain()

async def main():
    srv = await asyncio.start_server(answer, "127.0.0.1", 8123)
    out = []
    for stamps in ("kernel", "user"):
        for _ in range(6):
            pool = FastPool(stamps=stamps)
            try:
                r = await pool.stream("GET", "http://127.0.0.1:8123/", {}, b"", connect_timeout=5, read_timeout=5)
                out.append((await r.aread()).decode())
            except Exception as e:
                out.append(type(e).__name__)
            await pool.aclose()
            await asyncio.sleep(0.05)
    tw = subprocess.run(["ss", "-tanH", "state", "time-wait"], capture_output=True, text=True).stdout.split()
    print(json.dumps({"answers": out, "time_wait": len(tw) // 4}))
    srv.close()

asyncio.run(main())
"""


def test_bench_closes_leave_no_port_in_time_wait() -> None:
    with private_net(ports=(40000, 40003), sysctls={"net.ipv4.tcp_tw_reuse": "0"}) as net:
        p = net.run([sys.executable, "-c", CYCLE_PORTS], timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["answers"] == ["ok"] * 12, got
    assert got["time_wait"] == 0, got
