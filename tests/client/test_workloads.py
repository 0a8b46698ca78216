"""Issue 27's workloads against bench sim's truth: images, thinking phases, tool calls, real sessions, profiles."""

from __future__ import annotations

import base64
import io
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

import bench.client.request as client_request
from bench.cli.app import main
from bench.client.images import ImageSet, body_images
from bench.config.profile import load_profile, parse_profile
from bench.errors import ConfigError
from bench.measure.metrics import request_metrics
from bench.records import RequestRecord, read_records
from bench.sim import SimConfig, running_sim
from bench.sim.truth import expected_ttft_ms


def _capture_payloads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    real = client_request._payload

    def spy(spec: Any, model: str) -> bytes:
        out = real(spec, model)
        sent.append(json.loads(out))
        return out

    monkeypatch.setattr(client_request, "_payload", spy)
    return sent


def _measured(out: Path) -> list[RequestRecord]:
    return [r for r in read_records(out / "records.jsonl") if r.meta.get("phase") == "measure"]


def _results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def _server_ttft_ms(rec: RequestRecord) -> float:
    """The sim's truth for this request: its arrival (the role chunk's sched_ns) -> first token event's schedule."""
    first = next(e for e in rec.events if e.has_text)
    assert first.sched_ns is not None and rec.events[0].sched_ns is not None
    return (first.sched_ns - rec.events[0].sched_ns) / 1e6


# ---- images -----------------------------------------------------------------------------------------------------
IMG_SIM = SimConfig(decode_step_ms=10.0, prefill_tok_s=20_000.0, image_tokens=200, image_encode_ms=400.0)


def test_images_on_the_wire_in_records_and_ttft_against_truth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _capture_payloads(monkeypatch)
    out = tmp_path / "run"
    with running_sim(IMG_SIM) as base:
        code = main(["run", base, "--images", "2", "--image-size", "64x48", "--streams", "1,4", "--depths", "0",
                     "--max-tokens", "8", "--repeats", "4", "--out", str(out)])
    assert code == 0
    recs = _measured(out)
    assert len(recs) == 8 and all(r.images == 2 and r.image_bytes > 0 for r in recs)
    urls = []
    for body in sent:
        parts = body["messages"][-1]["content"]
        if isinstance(parts, list):
            imgs = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
            assert len(imgs) == 2 and all(u.startswith("data:image/jpeg;base64,") for u in imgs)
            urls += imgs
    assert len(urls) >= 16 and len(set(urls)) == len(urls)  # unique per request (and per image)
    res = _results(out)
    cells = {c["streams"]: c for c in res["cells"]}
    assert set(cells) == {1, 4} and all(c["images"] == 2 and c["image_size"] == "64x48" for c in cells.values())
    assert all(c["image_prompt_tokens"] == 200 for c in cells.values())  # the sim's T, as the server counted it
    for cell_streams in (1, 4):  # each cell: bench's median TTFT within 5 % of the sim's schedule, upload split out
        rs = [r for r in recs if f"-s{cell_streams}-" in r.meta["cell"]]
        ms = [request_metrics(r) for r in rs]
        truths = [_server_ttft_ms(r) for r in rs]
        assert all(m.ttft_ms is not None and m.upload_ms is not None and 0 < m.upload_ms < m.ttft_ms for m in ms)
        assert all((m.ttft_ms or 0) >= t for m, t in zip(ms, truths))  # one clock: never before the schedule
        med, truth = statistics.median(m.ttft_ms or 0 for m in ms), statistics.median(truths)
        assert abs(med - truth) / truth < 0.05
        engine = statistics.median((m.ttft_ms or 0) - (m.upload_ms or 0) for m in ms)
        assert abs(engine - truth) / truth < 0.05
    assert all(c["upload_ms"]["median"] > 0 for c in cells.values())
    one = [request_metrics(r) for r in recs if r.meta["cell"].startswith("d0-s1-")]
    truth = expected_ttft_ms(IMG_SIM, one[0].prompt_tokens or 0, 0, images=2)  # alone in the engine: closed form
    med = statistics.median(m.ttft_ms or 0 for m in one)
    assert abs(med - truth) / truth < 0.05 and cells[1]["ttft_ms"]["median"] == pytest.approx(med, abs=0.01)


def test_image_bytes_are_the_decoded_size() -> None:
    s = ImageSet(3, 40, 30, "png")
    urls = s.urls("req-1")
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                      *({"type": "image_url", "image_url": {"url": u}} for u in urls)]}]}
    n, size = body_images(body)
    assert n == 3 and size == sum(len(base64.b64decode(u.split(",", 1)[1])) for u in urls)
    from PIL import Image

    img = Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1])))
    assert img.format == "PNG" and img.size == (40, 30)
    assert s.urls("req-1") == urls and s.urls("req-2") != urls  # seeded per request


def test_images_from_a_folder_are_resized_and_unique(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (100, 80), (200, 10, 10)).save(tmp_path / "a.png")
    s = ImageSet(1, 32, 32, "jpeg", str(tmp_path))
    a, b = s.urls("r1")[0], s.urls("r2")[0]
    assert a != b
    assert Image.open(io.BytesIO(base64.b64decode(a.split(",", 1)[1]))).size == (32, 32)
    with pytest.raises(ConfigError, match="--image-source"):
        ImageSet(1, 8, 8, "jpeg", str(tmp_path / "missing"))


@pytest.mark.parametrize("load", [["--streams", "1", "--depths", "0", "--repeats", "1"],
                                  ["--rate", "5", "--requests", "3"]], ids=["waves", "open-loop"])
def test_server_without_images_gives_one_line_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              load: list[str]) -> None:
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, images=False)) as base:
        code = main(["run", base, "--images", "1", "--image-size", "16x16", "--max-tokens", "4", *load,
                     "--out", str(tmp_path / "r")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 5
    assert len([line for line in err if "--images" in line]) == 1
    assert any("does not accept image input" in line and "mmproj" in line for line in err)


def test_a_bad_image_source_is_refused_before_anything_is_sent(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    for source, why in ((tmp_path / "missing", "neither 'noise' nor a folder"), (tmp_path / "empty", "no image")):
        code = main(["run", "http://127.0.0.1:9/v1", "--images", "1", "--image-source", str(source),
                     "--out", str(tmp_path / "r")])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 3 and len(err) == 1 and why in err[0] and "--image-source" in err[0]
        assert not (tmp_path / "r").exists()  # refused while parsing: no run folder left to block the next try
    assert main(["run", "http://127.0.0.1:9/v1", "--image-source", str(tmp_path / "missing"), "--out",
                 str(tmp_path / "r")]) == 4  # no cell sends images: the folder is not read (then: unreachable)


def test_a_run_stopped_by_a_server_error_keeps_its_finished_cells_with_their_views(tmp_path: Path) -> None:
    """The second cell's images are refused (exit 5): the first cell's figures were in results.json only, with
    no results.md or results.csv."""
    prof = tmp_path / "p.toml"
    prof.write_text('max_tokens = 4\nrequests = 1\nwarmup = 0\n[[sweep]]\nimages = [0, 1]\nimage_sizes = ["16x16"]\n')
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, images=False)) as base:
        code = main(["run", base, "-p", str(prof), "--out", str(tmp_path / "r")])
    assert code == 5
    md = (tmp_path / "r" / "results.md").read_text()
    assert "Incomplete: the run did not finish" in md and "| short | 1 | prose | 1/0 |" in md
    rows = (tmp_path / "r" / "results.csv").read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith("d0-s1-prose,")  # the header and the finished cell


def test_image_profile_keys_and_cells() -> None:
    p = parse_profile({"images": 1, "image_size": "256x256", "sweep": [{"images": [0, 1, 4],
                                                                       "image_sizes": ["512x512", "1024x1024"]}]},
                      "t")
    ids = [c.id for c in p.cells()]
    assert ids == ["d0-s1-prose", "d0-s1-prose-i1-512x512", "d0-s1-prose-i1-1024x1024", "d0-s1-prose-i4-512x512",
                   "d0-s1-prose-i4-1024x1024"]
    with pytest.raises(ConfigError, match="image_size"):
        parse_profile({"image_size": "big"}, "t")
    with pytest.raises(ConfigError, match="chat endpoint"):
        parse_profile({"images": 1, "endpoint": "completions"}, "t")
    o = load_profile("quick").with_overrides(images=[2], image_sizes=["64x64"])
    assert o.images == 2 and o.image_size == "64x64" and all(c.images == 2 for c in o.cells())


@pytest.mark.parametrize("accept", [True, False])
def test_check_reports_whether_images_are_accepted(accept: bool, capsys: pytest.CaptureFixture[str]) -> None:
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, images=accept, image_tokens=77)) as base:
        assert main(["check", base, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    if accept:
        assert rep["images"] == "accepted" and rep["image_tokens"] == 77
    else:
        assert rep["images"] == "rejected" and "mmproj" in rep["images_error"] and rep["image_tokens"] is None


# ---- thinking ---------------------------------------------------------------------------------------------------
THINK_SIM = SimConfig(decode_step_ms=10.0, decode_step_ms_per_seq=2.0, prefill_tok_s=1e6, reasoning_tokens=10)


def test_thinking_phases_against_truth(tmp_path: Path) -> None:
    """Reasoning then content, one token per step of t(b) = 10 + 2b ms: each phase decodes at 1000 / t(b) per
    stream, its first content event comes R steps after its first reasoning event."""
    from bench.sim.truth import expected_decode_tok_s, step_ms

    out = tmp_path / "think"
    with running_sim(THINK_SIM) as base:
        assert main(["run", base, "--thinking", "on", "--streams", "1,4", "--depths", "0", "--max-tokens", "30",
                     "--repeats", "4", "--out", str(out)]) == 0
    res = _results(out)
    for c in res["cells"]:
        b = c["streams"]
        truth = expected_decode_tok_s(THINK_SIM, b)
        for key in ("reasoning_tok_s", "content_tok_s"):
            assert abs(c[key]["median"] - truth) / truth < 0.03, (key, b, c[key], truth)
        gap = c["ttft_content_ms"]["median"] - c["ttft_reasoning_ms"]["median"]
        assert abs(gap - 10 * step_ms(THINK_SIM, b)) < 5.0
        assert c["reasoning_tokens"] == 10 * c["requests_ok"]
    lines = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    measured = [x for x in lines if x["meta"].get("phase") == "measure"]
    assert all(x["ttft_reasoning_ms"] is not None and x["ttft_content_ms"] > x["ttft_reasoning_ms"] for x in measured)
    head = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert "reasoning_tok_s_p50" in head and "content_tok_s_p50" in head
    md = (out / "results.md").read_text()
    assert "think / answer tok/s" in md and "first answer / tool call ms p50" in md
    first = round(res["cells"][0]["ttft_content_ms"]["median"])
    assert f"| {first} / - |" in md  # the first answer's time, no tool call
    assert main(["report", str(out), "--out", str(out / "report.html")]) == 0
    page = (out / "report.html").read_text()
    assert "Images, thinking and tool calls" in page and "reasoning tok/s" in page


def test_no_thinking_leaves_reasoning_null(tmp_path: Path) -> None:
    out = tmp_path / "plain"
    with running_sim(SimConfig(decode_step_ms=5.0, prefill_tok_s=1e6)) as base:
        assert main(["run", base, "--streams", "1", "--depths", "0", "--max-tokens", "8", "--repeats", "2",
                     "--out", str(out)]) == 0
    c = _results(out)["cells"][0]
    assert c["reasoning_tok_s"]["median"] is None and c["content_tok_s"]["median"] is not None
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[-1])
    assert rec["ttft_reasoning_ms"] is None and rec["ttft_content_ms"] is not None


@pytest.mark.parametrize("usage", ["final", "never"])
def test_same_reasoning_under_both_keys_counts_once(tmp_path: Path, usage: str) -> None:
    cfg = SimConfig(decode_step_ms=5.0, prefill_tok_s=1e6, reasoning_tokens=6, reasoning_field="both",
                    usage_mode=usage)
    out = tmp_path / usage
    with running_sim(cfg) as base:
        assert main(["run", base, "--thinking", "on", "--streams", "1", "--depths", "0", "--max-tokens", "16",
                     "--repeats", "2", "--out", str(out)]) == 0
    for r in _measured(out):
        m = request_metrics(r)
        text = "".join(e.reasoning for e in r.events)
        assert len(text.split()) == 6  # each word once, though the server sent it under two keys
        assert m.output_tokens == 16 and m.reasoning_tokens == 6
        assert m.reasoning_tokens_estimated == (usage == "never")


# ---- tool calls -------------------------------------------------------------------------------------------------
def test_tool_calls_counted_and_missing_forced_calls_reported(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The sim calls a tool on request n iff calls_tool(cfg, n); one stream, so records.jsonl's line i is request
    i + 1. Argument fragments are output; a forced call that does not come is counted and warned about."""
    from bench.sim.truth import calls_tool, expected_decode_tok_s

    cfg = SimConfig(decode_step_ms=8.0, prefill_tok_s=1e6, tool_call_prob=0.5, seed=11)
    sent = _capture_payloads(monkeypatch)
    out = tmp_path / "tools"
    with running_sim(cfg) as base:
        assert main(["run", base, "--tools", "builtin", "--tool-choice", "required", "--streams", "1", "--depths",
                     "0", "--max-tokens", "24", "--repeats", "8", "--out", str(out)]) == 0
    lines = read_records(out / "records.jsonl")
    measured = [(i + 1, r) for i, r in enumerate(lines) if r.meta.get("phase") == "measure"]
    want = {n: calls_tool(cfg, n) for n, _ in measured}
    assert any(want.values()) and not all(want.values())
    for n, r in measured:
        m = request_metrics(r)
        assert m.ok and r.tool_forced and m.tool_call == want[n] and m.tool_call_missing == (not want[n])
        assert m.output_tokens == 24
        if want[n]:
            assert m.ttft_tool_ms == m.ttft_ms and m.ttft_content_ms is None
            assert m.tool_tok_s == pytest.approx(m.decode_tok_s)  # all its output is arguments
    c = _results(out)["cells"][0]
    truth = expected_decode_tok_s(cfg, 1)
    assert abs(c["tool_tok_s"]["median"] - truth) / truth < 0.05
    assert c["tool_calls"] == sum(want.values()) and c["tool_calls_forced"] == 8
    assert c["tool_calls_missing"] == 8 - sum(want.values())
    assert any("forced to call a tool" in w for w in c["warnings"])
    tool_bodies = [b for b in sent if b.get("tools")]
    assert tool_bodies and all(b["tool_choice"] == "required" and len(b["tools"]) == 2 for b in tool_bodies)
    assert "tool calls (missing)" in (out / "results.md").read_text()


def test_tools_file_and_named_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.config.tools import load_tools, tool_choice_value

    f = tmp_path / "tools.json"
    f.write_text(json.dumps({"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]}))
    tools = load_tools(str(f))
    assert tool_choice_value("lookup", tools) == {"type": "function", "function": {"name": "lookup"}}
    assert main(["run", "http://127.0.0.1:9/v1", "--tools", str(f), "--tool-choice", "nope"]) == 3
    err = capsys.readouterr().err.strip()
    assert "--tool-choice" in err and "lookup" in err and "\n" not in err
    (tmp_path / "bad.json").write_text("[1]")
    assert main(["run", "http://127.0.0.1:9/v1", "--tools", str(tmp_path / "bad.json")]) == 3


# ---- real sessions ----------------------------------------------------------------------------------------------
def test_sessions_send_real_messages_and_the_cache_reuses_them(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.sim.truth import expected_cached_tokens

    cfg = SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, prefix_cache=True, prefix_block_tokens=16)
    sent = _capture_payloads(monkeypatch)
    out = tmp_path / "sess"
    with running_sim(cfg) as base:
        assert main(["run", base, "--sessions", "2", "--turns", "4", "--think", "0.01", "--input-tokens", "30",
                     "--max-tokens", "8", "--out", str(out)]) == 0
    recs = {(r.meta["user"], r.meta["turn"]): r for r in _measured(out)}
    assert len(recs) == 8
    answers = {k: "".join(e.content for e in r.events) for k, r in recs.items()}
    bodies = [b for b in sent if b["messages"][0]["role"] == "system" and len(b["messages"]) >= 2]
    assert len(bodies) == 8
    for b in bodies:
        roles = [m["role"] for m in b["messages"]]
        turn = (len(roles) - 2) // 2
        assert roles == ["system"] + ["user", "assistant"] * turn + ["user"]
    for u in range(2):
        prev = None
        for t in range(4):
            r = recs[(u, t)]
            p = r.usage["prompt_tokens"] if r.usage else 0
            cached = r.usage["prompt_tokens_details"]["cached_tokens"] if r.usage else -1
            assert cached == (0 if prev is None else expected_cached_tokens(cfg, p, prev))
            if prev is not None:
                assert p == prev + 8 + 30  # the previous prompt, its 8-token answer (as sent back), 30 new tokens
            prev = p
    last = max(bodies, key=lambda b: len(b["messages"]))
    assistant = [m["content"] for m in last["messages"] if m["role"] == "assistant"]
    user0 = next(k for k, a in answers.items() if k[1] == 0 and a == assistant[0])
    assert [answers[(user0[0], t)] for t in range(3)] == assistant  # what the server returned, turn by turn
    turns = json.loads((out / "results.json").read_text())["cells"][0]["turns"]
    assert [t["turn"] for t in turns] == [0, 1, 2, 3]
    for row in turns:
        assert row["new_tokens_p50"] == row["prompt_tokens_p50"] - row["cached_tokens_p50"]
        assert row["prefill_new_tok_s_p50"] > 0


# ---- probe, capacity and the profiles ---------------------------------------------------------------------------
def test_probe_with_images_tools_and_thinking(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, image_tokens=50, reasoning_tokens=3, tool_call_prob=1.0)
    with running_sim(cfg) as base:
        assert main(["probe", base, "--images", "2", "--image-size", "32x32", "--image-format", "png", "--tools",
                     "builtin", "--tool-choice", "get_weather", "--thinking", "on", "--max-tokens", "10",
                     "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["images"] == 2 and d["image_bytes"] > 0 and d["tool_call"] and not d["tool_call_missing"]
    assert d["ttft_reasoning_ms"] is not None and d["ttft_tool_ms"] > d["ttft_reasoning_ms"]
    assert d["reasoning_tokens"] == 3 and d["output_tokens"] == 10


def test_capacity_takes_the_workload_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["capacity", "http://127.0.0.1:9/v1", "--slo", "ttft_p90=2s", "--out", "/tmp/bench-cap-x",
                 "--endpoint", "completions", "--images", "1"])
    assert code == 3 and "chat endpoint" in capsys.readouterr().err


def test_agent_profile_thinking_on_and_off_with_tools(tmp_path: Path) -> None:
    cfg = SimConfig(decode_step_ms=3.0, prefill_tok_s=1e6, reasoning_tokens=4, tool_call_prob=1.0)
    out = tmp_path / "agent"
    with running_sim(cfg) as base:
        assert main(["run", base, "-p", "agent", "--max-tokens", "12", "--repeats", "2", "--streams", "1",
                     "--out", str(out)]) == 0
    cells = {c["id"]: c for c in _results(out)["cells"]}
    assert set(cells) == {"d1024-s1-prose-think", "d1024-s1-prose-nothink"}
    think, plain = cells["d1024-s1-prose-think"], cells["d1024-s1-prose-nothink"]
    assert think["reasoning_tokens"] == 4 * think["requests_ok"] and think["reasoning_tok_s"]["median"] > 0
    assert plain["reasoning_tokens"] == 0 and plain["reasoning_tok_s"]["median"] is None
    assert all(c["tool_calls"] == c["requests_ok"] and c["tool_calls_missing"] == 0 for c in cells.values())
    assert think["ttft_tool_ms"]["median"] > plain["ttft_tool_ms"]["median"]  # the reasoning comes first


def test_multimodal_profile_cells() -> None:
    p = load_profile("multimodal")
    cells = p.cells()
    assert len(cells) == 10 and {c.streams for c in cells} == {1, 4}
    assert {(c.images, c.image_size) for c in cells} == {(0, ""), (1, "512x512"), (1, "1024x1024"),
                                                         (4, "512x512"), (4, "1024x1024")}


def test_open_loop_requests_carry_unique_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _capture_payloads(monkeypatch)
    out = tmp_path / "rate"
    with running_sim(SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, image_tokens=10)) as base:
        assert main(["run", base, "--rate", "5", "--requests", "4", "--images", "1", "--image-size", "24x24",
                     "--max-tokens", "4", "--out", str(out)]) == 0
    recs = [r for r in read_records(out / "records.jsonl") if r.images]
    assert len(recs) == 4 and all(r.ok and r.image_bytes > 0 for r in recs)
    urls = [p["image_url"]["url"] for b in sent if isinstance(b["messages"][-1]["content"], list)
            for p in b["messages"][-1]["content"] if p.get("type") == "image_url"]
    assert len(urls) == 4 and len(set(urls)) == 4


def test_sessions_send_tool_calls_back_as_an_agent_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.config.tools import TOOL_RESULT
    from bench.sim.text import count_tokens
    from bench.sim.truth import expected_cached_tokens

    cfg = SimConfig(decode_step_ms=2.0, prefill_tok_s=1e6, prefix_cache=True, tool_call_prob=1.0)
    sent = _capture_payloads(monkeypatch)
    out = tmp_path / "agent-sessions"
    with running_sim(cfg) as base:
        assert main(["run", base, "--sessions", "1", "--turns", "3", "--think", "0.01", "--input-tokens", "30",
                     "--max-tokens", "6", "--tools", "builtin", "--out", str(out)]) == 0
    recs = sorted(_measured(out), key=lambda r: r.meta["turn"])
    assert all(len(r.tool_calls) == 1 and r.tool_calls[0]["id"].startswith("call_") for r in recs)
    assert all(r.tool_calls[0]["name"] == "get_weather" and len(r.tool_calls[0]["arguments"].split()) == 6
               for r in recs)
    last = max((b for b in sent if b["messages"][0]["role"] == "system"), key=lambda b: len(b["messages"]))
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "user"]
    a0 = last["messages"][2]
    assert a0["content"] is None and a0["tool_calls"][0]["id"] == recs[0].tool_calls[0]["id"]
    assert a0["tool_calls"][0]["function"]["arguments"] == recs[0].tool_calls[0]["arguments"]
    assert last["messages"][3] == {"role": "tool", "tool_call_id": a0["tool_calls"][0]["id"], "content": TOOL_RESULT}
    prompts = [r.usage["prompt_tokens"] for r in recs if r.usage]
    for prev, p, r in zip(prompts, prompts[1:], recs[1:]):
        assert p == prev + count_tokens(TOOL_RESULT) + 30  # the sim counts no tool_calls, the tool result it does
        assert r.usage and r.usage["prompt_tokens_details"]["cached_tokens"] == expected_cached_tokens(cfg, p, prev)


@pytest.mark.parametrize("cmd", [["probe", "http://127.0.0.1:9/v1"],
                                 ["capacity", "http://127.0.0.1:9/v1", "--slo", "ttft_p90=1s"],
                                 ["run", "http://127.0.0.1:9/v1", "--rate", "5", "--duration", "2"]],
                         ids=["probe", "capacity", "open-loop"])
@pytest.mark.parametrize("flag", [["--images", "1,2"], ["--images", "1", "--image-size", "64x64,128x128"]],
                         ids=["images", "image-size"])
def test_one_workload_commands_refuse_a_comma_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   cmd: list[str], flag: list[str]) -> None:
    """Probe, capacity and an open-loop run send one workload: a list took its first value without a word (a new
    user's `bench probe URL --images 1,2` sent one image). Refused in one line before anything is sent."""
    code = main([*cmd, *flag, "--out", str(tmp_path / "r")] if cmd[0] != "probe" else [*cmd, *flag])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 3 and len(err) == 1 and "takes one value" in err[0] and flag[-2] in err[0]
    assert not (tmp_path / "r").exists()
