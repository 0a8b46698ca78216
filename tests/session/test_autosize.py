"""bench.session.autosize and ``bench run --workers auto``: bench's own lag picks the worker count; results say which."""

from __future__ import annotations

import json

import pytest

from bench.cli.app import main
from bench.records import Event, RequestRecord
from bench.session import autosize as autosize
from bench.session.autosize import advice, assess, carry, choose_workers, lag_budget_ms, lag_summary, recheck
from bench.sim import SimConfig, running_sim


def _rec(gaps_ms: list[float]) -> RequestRecord:
    r = RequestRecord("r", "chat", "m")
    t = 1_000_000
    r.events.append(Event(t, content="a"))
    for g in gaps_ms:
        t += int(g * 1e6)
        r.events.append(Event(t, content="a"))
    return r


def test_budget_is_half_the_median_gap_clipped() -> None:
    assert lag_budget_ms([_rec([10, 10, 30])]) == pytest.approx(5.0)
    assert lag_budget_ms([_rec([0.5, 0.5])]) == 1.0  # clipped at 1 ms
    assert lag_budget_ms([_rec([500])]) == 20.0  # and at 20 ms
    assert lag_budget_ms([]) == 20.0


def test_choose_workers_scales_with_lag_and_caps() -> None:
    assert choose_workers(0.3, 5.0, streams=64, cores=16)["workers"] == 1
    c = choose_workers(23.0, 5.0, streams=64, cores=16)
    assert c["workers"] == 5 and not c["capped"]
    c = choose_workers(230.0, 5.0, streams=64, cores=16)
    assert c["workers"] == 15 and c["capped"]  # the cores beside the main process
    assert choose_workers(230.0, 5.0, streams=3, cores=16)["workers"] == 3  # never more than the streams
    assert choose_workers(None, 5.0, streams=8, cores=16)["workers"] == 1  # nothing measured: one process


def test_assess_prefers_read_lag_and_advice_names_the_count() -> None:
    recs = [_rec([10, 10, 10])]
    c = assess(recs, [1.0] * 98 + [12.0, 12.0], [50.0], streams=32, cores=16)
    assert c["lag_source"] == "read" and c["lag_p99_ms"] == 12.0 and c["workers"] == 3
    c2 = assess(recs, [], [0.2, 0.4, 11.0], streams=32, cores=16)
    assert c2["lag_source"] == "loop" and c2["workers"] == 3
    msg = advice("d0-s32", c, 1)
    assert msg is not None and "--workers 3" in msg  # the cell's id is put before it with its other warnings
    assert advice("d0-s32", c, 3) is None
    assert lag_summary([])["p99_ms"] is None


def test_cpu_need_raises_a_saturated_process_choice() -> None:
    """A 16,384-stream warm-up read by one process: its lag (45 ms against 20 ms) asks for 3 readers, but it spent
    30 us of CPU per event, and the measured waves bring 16,384 streams x 20 events/s = 327,680 events/s, 9.8 cores
    at that cost, 20 processes at half busy: capped at the 15 cores beside the main process. Few streams: one."""
    recs = [_rec([50.0] * 7) for _ in range(100)]  # 800 events, 50 ms apart
    assert autosize.cpu_workers(recs, 800 * 30e-6, streams=16384) == 20
    c = assess(recs, [45.0] * 100, [], streams=16384, cores=16, cpu_s=800 * 30e-6)
    assert c["workers"] == 15 and c["capped"] and c["cpu_workers"] == 20
    small = assess(recs, [0.1] * 100, [], streams=4, cores=16, cpu_s=800 * 30e-6)
    assert small["workers"] == 1 and small["cpu_workers"] == 1
    assert autosize.cpu_workers(recs, None, streams=4) is None and autosize.cpu_workers([], 1.0, streams=4) is None
    assert assess(recs, [45.0] * 100, [], streams=16384, cores=16)["workers"] == 3  # no CPU time: the lag rule


def test_recheck_holds_the_readers_lag_to_the_budget() -> None:
    """After the measured waves: 2 readers whose worst lagged 12 ms (p99) against a 5 ms budget -> one process
    would have lagged 24 ms -> 5 readers; within the budget they kept up and need no more; carry raises the next
    cell's choice to it (at most one reader per stream)."""
    c = recheck(choose_workers(3.0, 5.0, streams=64, cores=16), {"p99_ms": 12.0}, 2, streams=64, cores=16)
    assert c["measured"] == {"workers": 2, "lag_p99_ms": 12.0, "kept_up": False, "workers_needed": 5}
    ok = recheck(choose_workers(3.0, 5.0, streams=64, cores=16), {"p99_ms": 4.0}, 2, streams=64, cores=16)
    assert ok["measured"]["kept_up"] and ok["measured"]["workers_needed"] == 2
    capped = recheck(choose_workers(3.0, 5.0, streams=64, cores=4), {"p99_ms": 50.0}, 3, streams=64, cores=4)
    assert capped["measured"]["workers_needed"] == 3  # the cores cap the rule; never fewer than the readers
    nxt = carry(choose_workers(0.1, 5.0, streams=64, cores=16), [ok, c], streams=64)
    assert nxt["workers"] == 5 and nxt["carried"] is True
    assert carry(choose_workers(0.1, 5.0, streams=3, cores=16), [c], streams=3)["workers"] == 3
    one = recheck(choose_workers(0.1, 5.0, streams=64, cores=16), {"p99_ms": 1.0}, 1, streams=64, cores=16)
    assert "carried" not in carry(choose_workers(0.1, 5.0, streams=64, cores=16), [one], streams=64)


async def _loop_lag_samples() -> list[float]:
    import asyncio

    async with autosize.LoopLag(0.001) as lag:
        await asyncio.sleep(0.03)
    return lag.samples


def test_loop_lag_ticks() -> None:
    import asyncio

    s = asyncio.run(_loop_lag_samples())
    assert len(s) >= 3 and all(x >= 0 for x in s)


def _run(url: str, out: str, capsys: pytest.CaptureFixture[str]) -> dict:
    rc = main(["run", url, "--profile", "quick", "--depths", "0", "--streams", "4", "--repeats", "4",
               "--max-tokens", "16", "--workers", "auto", "--out", out, "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_workers_auto_end_to_end(tmp_path, capsys, monkeypatch) -> None:
    with running_sim(SimConfig(decode_step_ms=20.0, prefill_tok_s=50_000.0)) as url:
        res = _run(url, str(tmp_path / "a"), capsys)
        run = res["run"]
        assert run["workers_auto"] is True and run["workers"] >= 1
        (choice,) = run["sizing"].values()
        assert choice["workers"] == run["workers"] and choice["budget_ms"] == pytest.approx(10.0, rel=0.3)
        assert choice["measured"]["workers"] == run["workers"] and choice["measured"]["lag_p99_ms"] is not None
        assert run["stamp_clock"]["measurements"] >= 1 and run["stamp_clock"]["uncertainty_ns"] >= 0
        from bench.records import read_records
        from bench.transport.kernel_stamps import kernel_stamps_supported

        measured = [r for r in read_records(tmp_path / "a" / "records.jsonl") if r.meta.get("phase") == "measure"]
        want = "kernel" if kernel_stamps_supported() else "user"
        assert measured and {r.stamp_source for r in measured} == {want}  # the default on Linux over TCP
        # a process that lags 15 ms behind its reads, with 10 ms of budget, needs two readers
        monkeypatch.setattr(autosize, "read_lag_since", lambda _m=0: [15.0] * 50)
        monkeypatch.setattr(autosize, "usable_cores", lambda: 4)
        res = _run(url, str(tmp_path / "b"), capsys)
    assert res["run"]["workers"] == 2 and res["run"]["workers_auto"] is True
    cell = res["cells"][0]
    # the measured waves were read by the 2 workers: their own loops' lag is the cell's and the sizing's
    assert len(cell["client_lag"]["workers"]) == 2
    (choice,) = res["run"]["sizing"].values()
    assert choice["measured"]["workers"] == 2 and choice["measured"]["lag_p99_ms"] == cell["client_lag"]["p99_ms"]
    assert cell["requests_ok"] == 4
    assert cell["decode_tok_s"]["median"] == pytest.approx(50.0, rel=0.06)


def test_bad_workers_value(capsys) -> None:
    rc = main(["run", "http://127.0.0.1:9/v1", "--workers", "many"])
    assert rc != 0
    assert "auto" in capsys.readouterr().err


def test_open_loop_workers_from_the_schedules_cpu_need() -> None:
    """``--workers auto`` with ``--rate``: processes from the schedule's client CPU need (requests and token events
    per second, measured costs) at half busy, at most the cores beside the main process."""
    from bench.session.autosize import open_loop_workers

    def sched(rate: float, seconds: float, tokens: int) -> tuple[list[float], list[int]]:
        n = int(rate * seconds)
        return [i / rate for i in range(n)], [tokens] * n

    c = open_loop_workers(*sched(20_000, 3, 1), cores=16)
    assert c["workers"] == 15 and c["capped"] and c["rate_rps"] == pytest.approx(20_000, rel=0.001)  # wants 17
    assert c["cpu_cores"] == pytest.approx(20_000 * (0.40e-3 + 3e-6), rel=0.001)
    assert open_loop_workers(*sched(10_000, 3, 1), cores=16)["workers"] == 9
    assert open_loop_workers(*sched(20_000, 3, 1), cores=2) == {**c, "workers": 2, "capped": True}
    assert open_loop_workers(*sched(100, 3, 1), cores=16)["workers"] == 1
    assert open_loop_workers(*sched(1_000, 3, 128), cores=16)["workers"] == 2  # 0.40 + 0.38 cores of events
    assert open_loop_workers([0.0], [1], cores=16)["workers"] == 1


def test_a_server_on_this_host_keeps_a_quarter_of_the_cores() -> None:
    """``--workers auto`` beside a server on the same host (loopback, or an address of this host) takes at most
    three quarters of the cores: 12 of 16 (15 processes sending 20,000 req/s beside 3 blast servers lagged p99
    2.35 ms there, 12 held 0.22 ms), 1 of 2."""
    from bench.session.autosize import open_loop_workers, reader_limit

    n = 60_000
    times, toks = [i / 20_000 for i in range(n)], [1] * n
    assert open_loop_workers(times, toks, cores=16)["workers"] == 15
    here = open_loop_workers(times, toks, cores=16, here=True)
    assert here["workers"] == 12 and here["capped"] and here["server_here"] is True
    assert [reader_limit(10**6, c, here=True) for c in (1, 2, 4, 8, 16)] == [1, 1, 3, 6, 12]
    assert [reader_limit(10**6, c) for c in (1, 2, 4, 8, 16)] == [1, 2, 3, 7, 15]
    assert reader_limit(5, 16, here=True) == 5


def _own_address() -> str | None:
    """A non-loopback address of this host (the one its default route leaves from; a UDP connect sends nothing)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


@pytest.mark.parametrize("url, want", [
    ("http://127.0.0.1:8000/v1", True), ("http://localhost:8000/v1", True), ("http://[::1]:8000/v1", True),
    ("http://127.8.9.10/v1", True), ("http://192.0.2.1:8000/v1", False),  # TEST-NET-1: never this host's
    ("http://no-such-host.invalid/v1", False), ("not a url", False),
])
def test_server_here_knows_loopback_and_other_hosts(url, want) -> None:
    from bench.session.hostload import server_here

    assert server_here(url) is want


def test_server_here_knows_this_hosts_own_address() -> None:
    from bench.session.hostload import server_here

    ip = _own_address()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address with a route")
    assert server_here(f"http://{ip}:8000/v1") is True


def test_open_loop_workers_auto_end_to_end(tmp_path, capsys) -> None:
    with running_sim(SimConfig(decode_step_ms=1.0)) as url:
        rc = main(["run", url, "--rate", "50", "--duration", "1", "--max-tokens", "2", "--input-tokens", "16",
                   "--workers", "auto", "--out", str(tmp_path / "o"), "--json"])
        res = json.loads(capsys.readouterr().out)
    assert rc == 0 and res["run"]["workers_auto"] is True and res["run"]["workers"] == 1
    sizing = res["run"]["sizing"]["open-loop"]
    assert sizing["workers"] == 1 and sizing["cpu_cores"] < 0.1 and sizing["rate_rps"] > 0
    assert sizing["server_here"] is True  # the sim on 127.0.0.1
    assert res["cells"][0]["counts"]["failed"] == 0
