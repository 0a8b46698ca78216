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


def test_merged_reads_counts_late_events_stamped_with_their_next() -> None:
    """An event read in one read with the stream's next one carries the later one's stamp: its error is a whole
    step. merged_reads counts those among the events over the worst-event goal (not the sims' flagged ones)."""
    from bench.records import Event, RequestRecord

    ms = 1_000_000
    evs = [Event(t_ns=10 * ms, content="a", write_ns=1_000 + 10 * ms),
           Event(t_ns=110 * ms, content="b", write_ns=1_000 + 60 * ms),  # read late (50 ms), alone
           Event(t_ns=200 * ms, content="c", write_ns=1_000 + 140 * ms),  # 60 ms late, read with d
           Event(t_ns=200 * ms, content="d", write_ns=1_000 + 190 * ms),  # 10 ms late
           Event(t_ns=300 * ms, content="e", write_ns=1_000 + 250 * ms)]  # 50 ms late, flagged by its sim
    rec = RequestRecord(request_id="r", endpoint="chat", model="m", sent_ns=1_000, events=evs)
    line = _module().merged_reads([rec], late={1_000 + 250 * ms})
    assert line.endswith("not flagged by the sims: 3; of them read together with their stream's next event (one "
                         "stamp for both): 1")
