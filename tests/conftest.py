"""Shared fixtures: the real llama-server (session-scoped), the one `bench sim` fixture, and the case files."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

CASES_DIR = Path(__file__).parent / "cases"

# The terminal the tests see, whatever the caller's: bench's consoles are made at import (bench.report.console reads
# $COLUMNS then), rich reads the colour variables when a console is made, and every CLI test that starts a
# subprocess passes os.environ on. So the values are pinned here, before any test module imports bench, and again
# around every test (hermetic_terminal). 220 columns is what bench uses when stdout is not a terminal.
HERMETIC_ENV = {"COLUMNS": "220", "LINES": "50", "TERM": "dumb", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "PYTHONIOENCODING": "utf-8"}
HERMETIC_UNSET = ("NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "COLORTERM", "TTY_COMPATIBLE",
                  "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES", "LANGUAGE", "LC_CTYPE", "LC_NUMERIC",
                  "LC_MESSAGES")
os.environ.update(HERMETIC_ENV)
for _name in HERMETIC_UNSET:
    os.environ.pop(_name, None)
# Every warning in a document bench writes must be of a kind in bench.warns.KINDS (the closed set): with this set,
# results.json / capacity.json holding any other warning is refused when written, in-process and in every subprocess.
os.environ["BENCH_STRICT_WARNINGS"] = "1"

# A shell starts a background job (`make test &`, `nohup ... &` in a script) with SIGINT ignored, and every process
# a test starts would inherit that: the Ctrl-C tests (bench run, serve, the open-loop driver) would wait for an
# interrupt that never comes. A handler here makes the children start with the default (exec resets handlers).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def hermetic_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with the pinned terminal (a test may still change it, through monkeypatch)."""
    for k, v in HERMETIC_ENV.items():
        monkeypatch.setenv(k, v)
    for k in HERMETIC_UNSET:
        monkeypatch.delenv(k, raising=False)


def all_case_files() -> list[Path]:
    """Every case: the shared ones (copied from shared/cases) and bench's own (tests/cases/extra)."""
    return sorted(CASES_DIR.glob("*/*.json"))


@pytest.fixture(scope="module")
def sim(request: pytest.FixtureRequest) -> Iterator[str]:
    """Base URL of a `bench sim` on loopback for this test module, shared by its tests. Its settings are the
    module's ``SIM_CONFIG`` (a :class:`bench.sim.SimConfig`), else 10 ms decode steps and 1M tok/s prefill."""
    from bench.sim import SimConfig, running_sim

    cfg = getattr(request.module, "SIM_CONFIG", None) or SimConfig(decode_step_ms=10.0, prefill_tok_s=1e6)
    with running_sim(cfg) as base:
        yield base


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """Base URL of a running llama-server with SmolLM2-135M (4 slots, 32k shared context)."""
    from bench.tools.engine import LocalEngine

    with LocalEngine(parallel=4, ctx_size=32768) as eng:
        yield eng.url


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (openssl CLI), as (cert.pem, key.pem): for the TLS tests of fastio,
    kstamp and the hardening suite."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def hosts(request: pytest.FixtureRequest) -> Iterator[object]:
    """Three network namespaces with their own addresses, a Ray cluster across them and `bench sim` on the host's
    bridge address (tests/hosts.py); the module's ``HOSTS_SIM`` are the sim's flags. Skips with one line where
    namespaces or Ray cannot run."""
    pytest.importorskip("ray", reason="needs ray (pip install -e '.[ray]')")
    from tests.hosts import Hosts, HostsUnavailable

    flags = getattr(request.module, "HOSTS_SIM", None) or {"decode_step_ms": 20.0, "prefill_tok_s": 1e6}
    h = Hosts(3, sim_flags=flags)
    try:
        h.start()
    except HostsUnavailable as e:
        pytest.skip(f"test hosts: {e}")
    try:
        yield h
    finally:
        h.close()
