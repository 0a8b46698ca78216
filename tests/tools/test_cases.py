"""Every stream case goes through `bench replay` (the real CLI, the real client, a real HTTP server)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.cli.app import main
from bench.tools.replay import check_expect, load_case, replay_case
from tests.conftest import all_case_files

CASES = all_case_files()


def test_cases_present() -> None:
    assert len([c for c in CASES if c.parent.name == "shared"]) >= 19
    assert len([c for c in CASES if c.parent.name == "extra"]) >= 15


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_replay_meets_expect(path, capsys) -> None:
    rc = main(["replay", "--json", str(path)])
    out, err = capsys.readouterr()
    record = json.loads(out)  # --json: exactly one JSON object on stdout
    assert rc == 0, err
    case = load_case(path)
    assert record["ok"] is case.expect.get("ok", record["ok"])
    if not record["ok"]:
        assert record["error"], "a failed request must say why"
        assert record["decode_tok_s"] is None or record["ok"] is False


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_httpx_read_path_measures_cases_alike(path) -> None:
    """The same cases through httpx's read path (https:// uses it; `bench --io httpx` forces it)."""
    _, m, fails = replay_case(load_case(path), fast_io=False)
    assert fails == [], fails


def test_io_flag_reaches_the_client(capsys) -> None:
    assert main(["--io", "httpx", "replay", "--json", str(CASES[0])]) == 0
    assert json.loads(capsys.readouterr().out)


def test_replay_exit_code_on_mismatch(tmp_path, capsys) -> None:
    case = json.loads((CASES[0]).read_text())
    case["expect"] = {"ok": True, "output_tokens": 999999}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(case))
    assert main(["replay", str(p)]) == 1
    assert "output_tokens" in capsys.readouterr().err


def test_replay_bad_file(tmp_path, capsys) -> None:
    p = tmp_path / "x.json"
    p.write_text("{not json")
    assert main(["replay", str(p)]) == 3
    err = capsys.readouterr().err
    assert "not JSON" in err and len(err.strip().splitlines()) == 1
    good = {"events": [{"at_ms": 0, "data": "[DONE]"}], "expect": {"ok": True}}
    for doc, words in (({**good, "events": "x"}, "'events' must be a list"),  # a traceback, exit 1
                       ({**good, "events": [1, 2]}, "events[0] is not an object"),
                       ({**good, "expect": {"okk": True}}, "unknown key(s) in 'expect': okk")):  # a mismatch, exit 1
        p.write_text(json.dumps(doc))
        assert main(["replay", str(p)]) == 3
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_check_expect_rules() -> None:
    m = {"ok": True, "ttft_ms": 100.0, "ttfc_ms": None, "output_tokens": 5, "error": None}
    assert check_expect(m, {"ok": True, "ttft_ms": [90, 110], "ttfc_ms": None, "output_tokens": 5}) == []
    assert len(check_expect(m, {"ok": False, "ttft_ms": [0, 50], "ttfc_ms": 3, "output_tokens": 6})) == 4
    assert check_expect({"ok": 1}, {"ok": True}) != []  # booleans match exactly, not by truthiness
    assert check_expect({"error": "HTTP 429: slow"}, {"error": "429"}) == []
    assert check_expect({"error": None}, {"error": "429"}) != []


def test_a_late_case_server_is_retried_and_named(monkeypatch) -> None:
    """A try whose server fell behind the case's timing is not the case: it is repeated, and a failure says so."""
    import bench.tools.replay as replay

    case = load_case(CASES[0])
    wrong = replace(case, expect={**case.expect, "ttft_ms": [0.0, 0.001]})  # no stream meets this
    tries: list[int] = []
    real = replay._probe

    async def counted(*a):
        tries.append(1)
        return await real(*a)

    monkeypatch.setattr(replay, "_probe", counted)
    monkeypatch.setattr(replay, "LATE_MS", 1e9)  # no write counts as late
    _, _, fails = replay_case(wrong)
    assert len(tries) == 1 and not any("case server" in f for f in fails)  # on time: one try, the plain mismatch
    monkeypatch.setattr(replay, "LATE_MS", -1e9)  # every write counts as late
    tries.clear()
    _, _, fails = replay_case(wrong)
    assert len(tries) == replay.TRIES
    assert "ttft_ms" in fails[0] and "behind the case's timing" in fails[-1]
    tries.clear()
    untimed = replace(case, expect={"ok": case.expect.get("ok", True)})  # no timing: passes on any host
    assert replay_case(untimed)[2] == [] and len(tries) == 1  # a pass is a pass, late or not
