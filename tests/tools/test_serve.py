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
    assert "(2 slots, 32768 tokens of context;" in err  # the stand-in's /props does not answer: -c alone
    with pytest.raises(httpx.TransportError):  # nothing serves the port any more
        httpx.get(url.removesuffix("/v1") + "/health", timeout=5)


def test_serve_on_a_taken_port_says_so_before_printing_a_url(tmp_path: Path) -> None:
    """The other server's /health answered for llama-server, so bench printed the URL and "serving", then failed
    with a log path it had deleted."""
    import socket

    env = fake_engine_env(tmp_path)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "bench", "serve", "--port", str(port)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and p.stdout == "", p
    assert f"port {port} on 127.0.0.1 is taken" in p.stderr and "--port 0" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.engine
def test_serve_says_the_context_a_request_can_use(tmp_path: Path) -> None:
    """`bench serve` said "4 slots, 32768 tokens of context" while `bench run` against it refused prompts over
    8192 tokens and `bench check` showed context_tokens 8192: llama-server gives a slot at most the model's trained
    context (SmolLM2-135M: 8192, at 2 slots as at 4). The line now gives that figure, as bench reads it, and -c."""
    import asyncio

    from bench.client import ClientSettings, make_http_client
    from bench.server.info import discover_server

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench", "serve", "--port", str(port), "--parallel", "2"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        url = proc.stdout.readline().strip()
        line = ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line, "bench serve ended"

        async def ctx() -> int:
            async with make_http_client(ClientSettings()) as client:
                return int((await discover_server(client, url))["context_size"])

        per = asyncio.run(ctx())
        assert per < 32768 and f"2 slots, {per} tokens of context per request, 32768 in all" in line, line
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_serve_is_listed_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "bench serve" in readme
