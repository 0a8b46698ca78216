"""benchmarks/scale_streams.py's placement: the sims and bench pinned to disjoint CPU sets (issue 30: a reader
preempted by a sim on a shared core read its event a whole 50-ms gap late)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.paths import script


def _module() -> Any:
    return script("benchmarks/scale_streams.py")


def test_cpu_lists_parse_and_refuse_what_is_not_here() -> None:
    m = _module()
    mine = sorted(os.sched_getaffinity(0))
    assert m.cpu_list(None) is None and m.cpu_list("") is None
    assert m.cpu_list(f"{mine[0]}-{mine[0]}") == {mine[0]}
    assert m.cpu_list(",".join(str(c) for c in mine)) == set(mine)
    with pytest.raises(ValueError, match="bad CPU range"):
        m.cpu_list("3-1")
    with pytest.raises(ValueError, match="not available here"):
        m.cpu_list("100000")


def test_the_sims_run_on_the_cpus_asked(tmp_path: Path) -> None:
    m = _module()
    cpu = min(os.sched_getaffinity(0))
    with m.sims(1, 4, 50.0, tmp_path, {cpu}) as sv:
        assert sv.url.startswith("http://127.0.0.1:")
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        ours = [p for p in pids if _is_sim(p, sv.url)]
        assert ours and all(os.sched_getaffinity(p) == {cpu} for p in ours)


def _is_sim(pid: int, url: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    port = url.rsplit(":", 1)[1].split("/")[0].encode()
    return b"bench.sim" in cmd and port in cmd
