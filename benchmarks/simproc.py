"""``bench sim`` in its own process, for the benchmark scripts (fidelity, peers, gate_fairness).

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and they ``import simproc``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class SimProcess:
    """``python -m bench.sim --port 0 --FLAG VALUE ...`` as a child process.

    Keyword arguments become flags (``decode_step_ms=20`` -> ``--decode-step-ms 20``). ``base`` is the URL the sim
    printed (``http://127.0.0.1:PORT/v1``), ``root`` the same without ``/v1``. The sim's stderr goes to a temporary
    file (a pipe nobody reads would stall a chatty child), quoted when it fails to start.

    Raises:
        RuntimeError: the sim did not print its URL.
    """

    COMMAND = ["-m", "bench.sim"]  # what runs after the interpreter (a subclass may run another server)

    def __init__(self, **flags: Any) -> None:
        args = [sys.executable, *self.COMMAND, "--port", "0"]
        for k, v in flags.items():
            flag = f"--{k.replace('_', '-')}"
            args += [flag] if v is True else [flag, str(v)]  # True: a switch (--reuse-port)
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._err, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            self._err.seek(0)
            err = self._err.read()
            self._err.close()
            raise RuntimeError(f"bench sim did not start: {line!r} {err[-500:]}")
        self.base = m.group(1)
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base

    def cpu_s(self) -> float:
        """User + system CPU seconds the sim process has used so far (Linux /proc; NaN elsewhere)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def metrics(self) -> dict[str, float]:
        """TTFT sum (s) / count, finished requests and generated tokens from the sim's Prometheus ``/metrics``."""
        text = urllib.request.urlopen(self.root + "/metrics", timeout=10).read().decode()
        out: dict[str, float] = {"requests": 0.0}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            if name.startswith("vllm:time_to_first_token_seconds_sum"):
                out["ttft_sum_s"] = float(value)
            elif name.startswith("vllm:time_to_first_token_seconds_count"):
                out["ttft_count"] = float(value)
            elif name.startswith("vllm:generation_tokens_total"):
                out["gen_tokens"] = float(value)
            elif name.startswith("vllm:request_success_total"):
                out["requests"] += float(value)
        return out

    def close(self) -> None:
        """Stop the sim (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err.close()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlastProcess(SimProcess):
    """``benchmarks/blastserver.py`` in its own process: the same bytes as a sim's streams, pre-rendered, many events
    per write, a short answer in one write (a few tens of microseconds of server CPU per request)."""

    COMMAND = [str(Path(__file__).resolve().parent / "blastserver.py")]
