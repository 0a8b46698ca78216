"""A run never runs out of local ports by its own doing, and says up front when this machine cannot hold its streams'
connections (issue 30: 4,538 of 16,384 requests failed with EADDRNOTAVAIL in each wave of
benchmarks/results/scale_streams-16384-2026-12-04-h200.md)."""

from __future__ import annotations

import json
import sys

import pytest

from bench.cli.app import main
from bench.transport import limits


def test_a_run_larger_than_the_port_range_is_refused_up_front(tmp_path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = tmp_path / "ip_local_port_range"
    rng.write_text("40000\t40999\n")
    monkeypatch.setattr(limits, "PORT_RANGE_FILE", rng)
    # nothing listens on port 9: the check comes before any connection
    rc = main(["run", "http://127.0.0.1:9/v1", "--profile", "quick", "--depths", "0", "--streams", "1000"])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "1,016 simultaneous connections to 127.0.0.1:9" in err and "40000-40999" in err
    assert 'sysctl -w net.ipv4.ip_local_port_range="1024 65535"' in err and "at most 984 streams" in err
    assert "cannot connect" not in err


# `bench run` in a private network namespace whose local port range (500 ports) holds the 300 streams once but not
# twice, with tcp_tw_reuse off (as towards a remote server: a port in TIME_WAIT stays unusable for 60 s). argv[1]:
# the --workers value; "auto" is made to grow to 2 workers after the warm-up (a reader lagging 15 ms of a 10 ms
# budget), so the warm-up is read here and the measured waves by the new pool.
RUN_IN_NAMESPACE = """
import json, sys
from bench.cli.app import main
from bench.session import autosize
from bench.sim import SimConfig, running_sim

if __name__ == "__main__":
    autosize.read_lag_since = lambda _m=0: [15.0] * 50
    autosize.usable_cores = lambda: 4
    with running_sim(SimConfig(decode_step_ms=20.0, prefill_tok_s=1e6, max_running=1000)) as url:
        rc = main(["run", url, "--profile", "quick", "--depths", "0", "--streams", "300", "--repeats", "600",
                   "--max-tokens", "8", "--workers", sys.argv[1], "--out", sys.argv[2], "--json"])
    sys.exit(rc)
"""


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_worker_processes_never_hold_a_second_set_of_ports(tmp_path, workers: str) -> None:
    from bench.records import read_records
    from tests.hosts import private_net

    with private_net(ports=(40000, 40499), sysctls={"net.ipv4.tcp_tw_reuse": "0"}) as net:
        script = net.dir / "run.py"
        script.write_text(RUN_IN_NAMESPACE)
        p = net.run([sys.executable, str(script), workers, str(tmp_path / "out")], timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    recs = read_records(tmp_path / "out" / "records.jsonl")
    failed = [(r.meta.get("phase"), r.error_kind, r.error) for r in recs if not r.ok]
    assert not failed, f"{len(failed)} failed, e.g. {failed[0]}"
    res = json.loads(p.stdout)
    # auto grows the pool from one process (2 by the mocked lag, up to 3 by the CPU rule on the mocked 4 cores)
    assert res["run"]["workers"] in ((2, 3) if workers == "auto" else (2,)) and res["cells"][0]["requests_ok"] == 600
    warm = [r for r in recs if r.meta.get("phase") == "warmup"]
    # auto: the probe wave read here, then one wave that warms the new pool's connections; 2: the pool's own
    assert sorted({r.meta["wave"] for r in warm}) == ([0, 1] if workers == "auto" else [0])
