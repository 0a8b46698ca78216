"""Errors that point the right way (issue 31, point 3): a typo in the URL's path, ``https://`` to a plain-HTTP
port, and Ctrl-C of a run against the embedded endpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench.errors import EndpointUnreachable
from bench.transport.tls import check_tls

ROOT = Path(__file__).resolve().parents[2]
HINT = "no OpenAI API at that base URL"


def _bench(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HOME": str(cwd)})


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("bench: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("extra", [[], ["--model", "bench-sim"]])
def test_a_typo_in_the_path_says_the_base_url_is_wrong(sim, tmp_path, extra):
    bad = sim.replace("/v1", "/v11")
    r = _bench("probe", bad, *extra, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    line = _one_line(r.stderr)
    assert HINT in line and "404" in line and "(http://host:8000/v1)?" in line
    assert "--model" not in line
    assert "Traceback" not in r.stderr


def test_a_run_with_a_typo_in_the_path_stops_at_set_up(sim, tmp_path):
    bad = sim.replace("/v1", "/v11")
    r = _bench("run", bad, "--model", "bench-sim", "-p", "quick", "--out", "x", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert HINT in _one_line(r.stderr)


@pytest.fixture
def silent_port() -> tuple[int, list[socket.socket]]:
    """A TCP port that accepts and then says nothing (a plain-HTTP server waiting for a request line)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            held.append(c)

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1], held
    srv.close()
    for c in held:
        c.close()


def test_https_to_a_server_that_answers_plain_http(sim, tmp_path):
    r = _bench("probe", sim.replace("http://", "https://"), cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    line = _one_line(r.stderr)
    assert "TLS handshake" in line and "not in TLS" in line and "is the server http://?" in line


def test_https_to_a_port_that_never_answers_the_handshake(silent_port, tmp_path):
    port, _ = silent_port
    t0 = time.monotonic()
    r = _bench("probe", f"https://127.0.0.1:{port}/v1", cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    line = _one_line(r.stderr)
    assert "TLS" in line and "the TCP connect succeeded" in line and f"http://127.0.0.1:{port}/v1" in line
    assert time.monotonic() - t0 < 60  # the handshake bound ends it; nothing waits on the read timeout (none)


def test_check_tls_bounds_the_handshake(silent_port):
    port, _ = silent_port
    with pytest.raises(EndpointUnreachable, match="no TLS answer came within 0.3 s"):
        check_tls(f"https://127.0.0.1:{port}/v1", handshake_s=0.3)
    check_tls(f"http://127.0.0.1:{port}/v1", handshake_s=0.3)  # not https: nothing to check
    check_tls("https://127.0.0.1:1/v1", handshake_s=0.3)  # refused: left to the client's own error


def test_check_tls_passes_a_tls_server(tls_cert):
    import ssl

    cert, key = tls_cert
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(2)

    def serve() -> None:
        c, _ = srv.accept()
        try:
            with ctx.wrap_socket(c, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    check_tls(f"https://127.0.0.1:{srv.getsockname()[1]}/v1")
    th.join(5)
    srv.close()


FAKE_SERVER = textwrap.dedent("""
    import signal, sys, time, pathlib
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    marks = pathlib.Path(sys.argv[0]).with_suffix(".marks")
    def on_signal(num, frame):  # a server slow to stop: it waits a minute before exiting
        with marks.open("a") as f:
            f.write(signal.Signals(num).name + "\\n")
        time.sleep(60)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
            else:
                time.sleep(120)  # every set-up call hangs: the run waits until Ctrl-C
        def log_message(self, *a):
            pass
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def fake_engine_env(tmp_path: Path) -> dict[str, str]:
    """The environment that makes bench's embedded endpoint the stand-in llama-server (FAKE_SERVER) in ``tmp_path``."""
    fake = tmp_path / "llama-server.py"
    fake.write_text(FAKE_SERVER)
    launcher = tmp_path / "llama-server"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
    launcher.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return {**os.environ, "HOME": str(tmp_path), "BENCH_LLAMA_SERVER": str(launcher), "BENCH_MODEL": str(model)}


def test_ctrl_c_of_a_run_on_the_embedded_endpoint_stops_at_once(tmp_path):
    env = fake_engine_env(tmp_path)
    fake = tmp_path / "llama-server.py"  # the stand-in marks the signals it got beside itself
    proc = subprocess.Popen([sys.executable, "-m", "bench", "run", "-p", "quick", "--out", "x"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen = ""
    while "embedded endpoint:" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    assert "embedded endpoint:" in seen, seen
    time.sleep(1.0)  # in the set-up calls, which hang
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, seen + err
    assert "stopping the embedded endpoint" in err
    assert "SIGTERM" in fake.with_suffix(".marks").read_text()
    assert took < 30, err  # killed after the short grace, not waited on for the fake's minute
