"""bench.warns: the closed set of warnings (docs/warnings.md)."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import pytest

from bench.results import to_json
from bench.warns import KINDS, check_document, in_cell, kind_of, unknown_warnings, warning

ROOT = Path(__file__).resolve().parent.parent


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def _sample(code: str) -> str:
    k = next(k for k in KINDS if k.code == code)
    return warning(code, **{f: 1.5 for f in _fields(k.cause + k.cure)})


def test_codes_are_unique_and_every_kind_names_cause_and_cure() -> None:
    codes = [k.code for k in KINDS]
    assert len(codes) == len(set(codes))
    for k in KINDS:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", k.code), k.code
        literal_cause = "".join(lit for lit, *_ in string.Formatter().parse(k.cause))
        assert len(literal_cause) >= 15, k.code  # a cause in words, not only a field
        assert k.cure.strip(), k.code


@pytest.mark.parametrize("code", [k.code for k in KINDS])
def test_every_kind_reads_back_as_itself(code: str) -> None:
    text = _sample(code)
    assert kind_of(text) == code
    assert kind_of(in_cell("d0-s4-prose", text)) == code


def test_real_warning_texts_are_of_their_kind() -> None:
    from bench.measure.noise import noise_warnings
    from bench.measure.queueing import slot_warnings
    from bench.session.loop_lag import lag_warning

    lag = {"p50_ms": 3.0, "p99_ms": 40.0, "max_ms": 80.0, "samples": 500}
    assert kind_of(lag_warning(lag, workers=1, streams=64) or "") == "client-lag"
    assert kind_of(lag_warning(lag, workers=2, streams=2) or "") == "client-lag-busy-host"
    assert kind_of(slot_warnings({"id": "d0-s8-prose", "streams": 8}, {"slots": 4})[0]) == "slots-exceeded"
    noise = {"ci_wide": True, "waves_needed": 9, "metric": "decode_tok_s", "ci_half_pct": 4.0,
             "target_ci_pct": 2.0, "waves": 3, "spread_pct": 7.0}
    (w,) = noise_warnings("d0-s1-prose", noise, max_waves=5)
    assert kind_of(w) == "wide-ci" and "raise max_waves = 5 to 9" in w


def test_text_of_no_kind_is_unknown() -> None:
    assert kind_of("something went wrong") is None
    assert unknown_warnings(["something went wrong", _sample("no-usage")]) == ["something went wrong"]
    with pytest.raises(KeyError):
        warning("no-such-kind")


def test_strict_mode_refuses_a_document_with_a_warning_of_no_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    cell: dict[str, Any] = {"id": "c", "warnings": ["c: made up here"]}
    doc: dict[str, Any] = {"warnings": [_sample("resumed")], "cells": [cell]}
    monkeypatch.setenv("BENCH_STRICT_WARNINGS", "1")
    with pytest.raises(ValueError, match="made up here"):
        check_document(doc)
    with pytest.raises(ValueError, match="made up here"):
        to_json(doc)
    cell["warnings"] = [in_cell("c", _sample("not-steady"))]
    check_document(doc)
    monkeypatch.delenv("BENCH_STRICT_WARNINGS")
    check_document({"warnings": ["made up"]})  # a user's run is never refused for a warning's wording


def test_no_site_builds_a_warning_by_hand() -> None:
    """A warning appended to a warnings list, or given to a session's note(), is made by bench.warns."""
    by_hand = re.compile(r"""(warnings\.append|\["warnings"\]\.append|\.note|warnings \+=)\(\s*f?["']""")
    found = []
    for path in (ROOT / "bench").rglob("*.py"):
        if path.parts[-2] == "sim":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if by_hand.search(line) or re.search(r"""["'](\[yellow\]warning\[/yellow\]|warning:) [A-Za-z]""", line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, found


def test_docs_list_every_kind_as_the_code_has_it() -> None:
    doc = (ROOT / "docs" / "warnings.md").read_text(encoding="utf-8")

    def plain(t: str) -> str:
        return re.sub(r"\{(\w+)(?:[:!][^}]*)?\}", r"{\1}", t)

    rows = re.findall(r"^\| `([a-z-]+)` \| (.*) \| (.*) \|$", doc, re.M)
    assert [r[0] for r in rows] == [k.code for k in KINDS]
    for (code, cause, cure), k in zip(rows, KINDS):
        assert (cause, cure) == (plain(k.cause), plain(k.cure)), code


def test_failed_requests_are_counted_in_words_not_a_python_dict() -> None:
    """'3 of 33 requests failed ({'cancelled': 3})' once: the counts by error kind read 'cancelled 3, http_5xx 1'."""
    from bench.config.profile import Cell
    from bench.measure.summary import summarize_cell
    from bench.records import Event, RequestRecord
    from bench.warns import counts

    assert counts({"http_5xx": 1, "cancelled": 3, "timeout": 1}) == "cancelled 3, http_5xx 1, timeout 1"
    recs = []
    for i in range(8):
        r = RequestRecord(f"r{i}", "chat", "m", queued_ns=1, sent_ns=1, done=True, finish_reason="length",
                          usage={"prompt_tokens": 8, "completion_tokens": 4})
        r.events = [Event((10 + 20 * k) * 1_000_000, content=" w") for k in range(4)]
        r.end_ns = 80 * 1_000_000
        if i < 4:
            r.done, r.events = False, []
            r.error, r.error_kind = ("cancelled", "cancelled") if i < 3 else ("HTTP 500: boom", "http_5xx")
        recs.append(r)
    warns = summarize_cell(Cell("s", 0, 1, "prose", 4, 8), recs, [[r.request_id for r in recs]], None).warnings
    (w,) = [w for w in warns if kind_of(w) == "requests-failed"]
    assert "4 of 8 requests failed (cancelled 3, http_5xx 1)" in w and "{" not in w
