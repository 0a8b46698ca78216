"""A run never runs out of local ports by its own doing, and says up front when this machine cannot hold its streams'
connections (issue 30: 4,538 of 16,384 requests failed with EADDRNOTAVAIL in each wave of
benchmarks/results/scale_streams-16384-2026-12-04-h200.md)."""

from __future__ import annotations

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
