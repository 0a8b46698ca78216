"""``bench serve`` (issue 31, point 8): the embedded endpoint on its own URL, printed first, until Ctrl-C. A stand-in
llama-server (tests.cli.test_wrong_way.FAKE_SERVER) keeps the test off the real engine."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.tools.engine import free_port
from tests.cli.test_wrong_way import fake_engine_env


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_prints_its_url_serves_and_stops_on_ctrl_c(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C or SIGTERM: the server stops with bench (SIGTERM used to end bench alone and leave llama-server
    serving on the port)."""
    port = free_port()
    env = fake_engine_env(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--port", str(port), "--parallel", "2"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url == f"http://127.0.0.1:{port}/v1"
    assert httpx.get(url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
    assert proc.poll() is None  # still serving
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stopping the embedded endpoint" in err and "Ctrl-C stops it" in err
    with pytest.raises(httpx.TransportError):  # nothing serves the port any more
        httpx.get(url.removesuffix("/v1") + "/health", timeout=5)


def test_serve_is_listed_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "bench serve" in readme
