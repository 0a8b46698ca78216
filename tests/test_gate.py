"""Tests of the CI gate: rules, the ratio bootstrap and verdicts (pure), reports, the compare/gate commands, and a
short fairness run against bench sim (same server passes, 10 % slower decode fails, 3 % slower is no regression).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from bench.errors import ConfigError
from bench.gate import (
    Rule,
    Verdict,
    check_comparable,
    check_rule_cells,
    classify,
    compare,
    default_rules,
    inconclusive_cells,
    overall_exit,
    parse_rules,
    rules_from_results,
)
from bench.report.verdicts import append_step_summary, to_junit, to_markdown
from bench.results import Results, load_results, results_from_dict
from bench.stats import (
    betainc_reg,
    bootstrap_ratio_ci,
    expanded_tail,
    hd_quantile,
    hd_weights,
    student_t_ppf,
    thd_quantile,
    thd_weights,
)

ROOT = Path(__file__).resolve().parent.parent


def spread(center: float, n: int = 12, cv: float = 0.01) -> list[float]:
    """n deterministic values around ``center`` (even spread over +-1.7 cv)."""
    return [center * (1 + cv * x) for x in np.linspace(-1.7, 1.7, n)]


def results(cells: dict[str, dict[str, list[float]]], *, profile: str = "p", model: str = "m",
            backend: str = "vllm", gate: list[dict] | None = None, interrupted: bool = False,
            complete: bool = True) -> Results:
    """A minimal results document holding only what the gate reads."""
    return results_from_dict({
        "schema": 1,
        "profile": {"name": profile, "settings": {"gate": gate or []}},
        "endpoint": {"url": "http://x/v1", "model": model, "kind": "chat"},
        "server": {"backend": backend},
        "run": {"id": "r1", "interrupted": interrupted, "complete": complete and not interrupted},
        "cells": [{"id": cid, "samples": s} for cid, s in cells.items()],
    })


DEC = Rule("decode_tok_s", "*", "median", 5.0, 0)
TTFT = Rule("ttft_ms", "*", "p90", 10.0, 1)


# --- stats ------------------------------------------------------------------------------------------------------


def test_special_functions_match_known_values():
    assert betainc_reg(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-12)  # closed form: 1-(1-x)^3(1+3x)
    assert betainc_reg(0.5, 0.5, 0.5) == pytest.approx(0.5, abs=1e-12)
    assert student_t_ppf(0.975, 7) == pytest.approx(2.364624, abs=1e-5)
    assert student_t_ppf(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert student_t_ppf(0.025, 30) == pytest.approx(-2.042272, abs=1e-5)
    assert expanded_tail(0.95, 100_000) == pytest.approx(0.025, abs=1e-4)
    assert expanded_tail(0.95, 8) < expanded_tail(0.95, 8, 8) < 0.025  # small n: read further out in the tails


def test_trimmed_harrell_davis_is_smooth_and_robust():
    w = thd_weights(8, 0.5)
    assert w.sum() == pytest.approx(1.0) and np.allclose(w, w[::-1])
    assert w[0] == w[-1] == 0  # the extremes are trimmed away
    assert thd_weights(8, 0.9)[-1] > 0.5 and thd_weights(8, 0.9).sum() == pytest.approx(1.0)
    xs = [1.0, 2, 3, 4, 5, 6, 7, 8]
    assert thd_quantile(xs[:-1] + [1000.0], 0.5) == pytest.approx(thd_quantile(xs, 0.5))  # an outlier: no effect
    assert hd_quantile(xs[:-1] + [1000.0], 0.5) > hd_quantile(xs, 0.5)  # the untrimmed estimator moves
    nudged = thd_quantile(xs[:3] + [4.1] + xs[4:], 0.5)
    assert 0 < nudged - thd_quantile(xs, 0.5) < 0.1  # a small change in one value moves it a little, no jump


def test_harrell_davis():
    w = hd_weights(8, 0.5)
    assert w.sum() == pytest.approx(1.0) and np.allclose(w, w[::-1])
    assert hd_quantile([5.0] * 6, 0.9) == pytest.approx(5.0)
    assert hd_quantile([1, 2, 3, 4, 5], 0.5) == pytest.approx(3.0)
    rows = hd_quantile(np.array([[1.0, 2, 3], [3, 2, 1]]), 0.9)
    assert rows.shape == (2,) and rows[0] == pytest.approx(rows[1])


def test_bootstrap_ratio_ci_is_deterministic_and_brackets_the_ratio():
    a, b = spread(100), spread(90)
    r1 = bootstrap_ratio_ci(a, b, "median", seed=3)
    assert r1 == bootstrap_ratio_ci(a, b, "median", seed=3)
    base, cand, ratio, lo, hi = r1
    assert ratio == pytest.approx(0.9, rel=1e-9) and lo < 0.9 < hi and hi - lo < 0.03
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0], b)


# --- rules --------------------------------------------------------------------------------------------------------


def test_parse_rules_defaults_and_limits():
    rules = parse_rules([{"metric": "decode_tok_s", "max_drop_pct": 5},
                         {"metric": "ttft_ms", "cell": "d32768-s1-prose", "stat": "p90", "max_rise_pct": 10}])
    assert rules[0] == Rule("decode_tok_s", "*", "median", 5.0, 0)
    assert rules[0].limit == pytest.approx(0.95) and rules[0].higher_better
    assert rules[1].limit == pytest.approx(1.10) and not rules[1].higher_better and rules[1].index == 1
    assert [r.metric for r in default_rules()] == ["decode_tok_s", "ttft_ms"]


@pytest.mark.parametrize("table, key", [
    ({"metric": "tok_s", "max_drop_pct": 5}, "gate[1].metric"),
    ({"max_drop_pct": 5}, "gate[1].metric"),
    ({"metric": "ttft_ms", "max_drop_pct": 5}, "gate[1].max_drop_pct"),
    ({"metric": "decode_tok_s", "max_rise_pct": 5}, "gate[1].max_rise_pct"),
    ({"metric": "decode_tok_s"}, "gate[1].max_drop_pct"),
    ({"metric": "decode_tok_s", "max_drop_pct": -1}, "gate[1].max_drop_pct"),
    ({"metric": "decode_tok_s", "max_drop_pct": 100}, "gate[1].max_drop_pct"),
    ({"metric": "decode_tok_s", "max_drop_pct": "5"}, "gate[1].max_drop_pct"),
    ({"metric": "decode_tok_s", "max_drop_pct": 5, "stat": "p100"}, "gate[1].stat"),
    ({"metric": "decode_tok_s", "max_drop_pct": 5, "stat": "max"}, "gate[1].stat"),
    ({"metric": "decode_tok_s", "max_drop_pct": 5, "cell": 3}, "gate[1].cell"),
    ({"metric": "decode_tok_s", "max_drop_pct": 5, "metirc": "x"}, "gate[1].metirc"),
])
def test_bad_rule_names_its_key(table, key):
    with pytest.raises(ConfigError) as e:
        parse_rules([{"metric": "e2e_ms", "max_rise_pct": 5}, table], "profile ci")
    assert str(e.value).startswith(f"profile ci: {key}")


def test_rule_naming_unknown_cell():
    rules = parse_rules([{"metric": "e2e_ms", "max_rise_pct": 5, "cell": "d0-s9-prose"}])
    check_rule_cells(rules[:0], ["d0-s1-prose"])
    with pytest.raises(ConfigError, match=r"gate\[0\]\.cell: no cell 'd0-s9-prose'"):
        check_rule_cells(rules, ["d0-s1-prose"], "profile ci")


def test_rules_from_results_file():
    assert rules_from_results(results({}))[0].metric == "decode_tok_s"  # none stored: defaults
    stored = results({}, gate=[{"metric": "tpot_ms", "max_rise_pct": 3}])
    assert rules_from_results(stored) == [Rule("tpot_ms", "*", "median", 3.0, 0)]


# --- verdicts -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factor, want", [
    (0.90, "regression"), (0.95, "inconclusive"), (0.97, "unchanged"), (1.0, "unchanged"), (1.10, "improved"),
])
def test_higher_better_verdicts(factor, want):
    base = results({"c": {"decode_tok_s": spread(100)}})
    cand = results({"c": {"decode_tok_s": spread(100 * factor)}})
    [v] = compare(base, cand, [DEC])
    assert v.verdict == want, v
    assert v.ratio == pytest.approx(factor, rel=1e-6) and v.lo <= v.ratio <= v.hi
    assert overall_exit([v]) == {"regression": 1, "inconclusive": 2}.get(want, 0)


@pytest.mark.parametrize("factor, want", [(1.30, "regression"), (1.10, "inconclusive"), (1.0, "unchanged"),
                                          (0.8, "improved")])
def test_lower_better_verdicts(factor, want):
    base = results({"c": {"ttft_ms": spread(50, 16, 0.02)}})
    cand = results({"c": {"ttft_ms": spread(50 * factor, 16, 0.02)}})
    [v] = compare(base, cand, [TTFT])
    assert v.verdict == want, v


def test_classify_edges():
    assert classify(DEC, 0.90, 0.949) == "regression"
    assert classify(DEC, 0.949, 0.99) == "inconclusive"
    assert classify(DEC, 0.95, 1.02) == "unchanged"
    assert classify(DEC, 1.001, 1.02) == "unchanged"  # better, but by less than the 5 % allowance
    assert classify(DEC, 1.051, 1.08) == "improved"
    assert classify(DEC, 1.051, 1.08, mde_pct=6.0) == "unchanged"  # inside the resolution: not called improved
    assert classify(TTFT, 1.101, 1.3) == "regression"
    assert classify(TTFT, 0.9, 0.99) == "unchanged"
    assert classify(TTFT, 0.8, 0.899) == "improved"


def test_noisy_small_samples_are_inconclusive_not_regression():
    rng = np.random.default_rng(0)
    base = results({"c": {"decode_tok_s": list(100 * np.exp(rng.normal(0, 0.08, 6)))}})
    cand = results({"c": {"decode_tok_s": list(93 * np.exp(rng.normal(0, 0.08, 6)))}})
    [v] = compare(base, cand, [DEC])
    assert v.verdict == "inconclusive" and v.lo < 0.95 < v.hi


def test_missing_data():
    base = results({"a": {"decode_tok_s": spread(100)}, "b": {"decode_tok_s": [100.0]}, "only-base": {}})
    cand = results({"a": {"decode_tok_s": spread(100)}, "b": {"decode_tok_s": spread(100)}})
    vs = compare(base, cand, [DEC, TTFT, Rule("e2e_ms", "zz", "median", 5, 2)])
    by = {(v.rule.metric, v.cell): v for v in vs}
    assert by[("decode_tok_s", "a")].verdict == "unchanged"
    assert by[("decode_tok_s", "b")].verdict == "inconclusive" and "too few" in by[("decode_tok_s", "b")].note
    assert ("ttft_ms", "a") not in by  # "*" skips a metric neither side has
    assert "not in the baseline nor the candidate" in by[("e2e_ms", "zz")].note
    assert inconclusive_cells(vs) == []  # neither can be settled by measuring the candidate more
    assert len(vs) == 3


def test_verdicts_do_not_depend_on_rule_order_and_follow_the_seed():
    base = results({"c": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}})
    cand = results({"c": {"decode_tok_s": spread(96), "ttft_ms": spread(43)}})
    v1 = compare(base, cand, [DEC, TTFT])
    v2 = compare(base, cand, [TTFT, DEC])
    assert (v1[0].lo, v1[1].lo) == (v2[1].lo, v2[0].lo)
    assert compare(base, cand, [DEC], seed=1)[0].lo != v1[0].lo


def test_overall_exit():
    def v(kind: str) -> Verdict:
        return Verdict(DEC, "c", kind, 1, 1, 1, 1, 1, 0.95, 8, 8)

    assert overall_exit([v("unchanged"), v("improved")]) == 0
    assert overall_exit([v("unchanged"), v("inconclusive")]) == 2
    assert overall_exit([v("inconclusive"), v("regression")]) == 1
    assert overall_exit([]) == 2  # nothing compared is not a pass


def test_summary_line_counts_in_words():
    """'REGRESSION: 2 regression, 1 inconclusive': the noun takes its plural (the other verdicts are adjectives)."""
    from bench.report.verdicts import summary_line

    def v(kind: str) -> Verdict:
        return Verdict(DEC, "c", kind, 1, 1, 1, 1, 1, 0.95, 8, 8)

    assert summary_line([v("regression"), v("regression"), v("inconclusive")]) == \
        "REGRESSION: 2 regressions, 1 inconclusive"
    assert summary_line([v("regression"), v("unchanged"), v("unchanged")]) == "REGRESSION: 1 regression, 2 unchanged"
    assert summary_line([v("unchanged"), v("improved"), v("improved")]) == "PASS: 2 improved, 1 unchanged"


def test_summary_line_of_a_verdict_withheld_says_what_was_found():
    """'INCONCLUSIVE (other work on this host changed between the runs): 1 regression, 2 unchanged' read as a
    contradiction: the line says what the verdicts found, then why the verdict is withheld (and the cure)."""
    from bench.report.verdicts import summary_line

    def v(kind: str) -> Verdict:
        return Verdict(DEC, "c", kind, 1, 1, 1, 1, 1, 0.95, 8, 8)

    why = "other work on this host changed between the runs (cure)"
    assert summary_line([v("regression"), v("unchanged"), v("unchanged")], 2, why) == \
        "INCONCLUSIVE: 1 regression found (2 unchanged), but the verdict is withheld: " + why
    assert summary_line([v("regression"), v("regression")], 2, why) == \
        "INCONCLUSIVE: 2 regressions found, but the verdict is withheld: " + why
    assert summary_line([v("unchanged"), v("improved")], 2, why) == \
        "INCONCLUSIVE: no regression found (1 improved, 1 unchanged), but the verdict is withheld: " + why
    assert summary_line([v("unchanged")], 2).endswith("but the verdict is withheld: see the warnings")
    assert summary_line([v("regression")], 1, why) == "REGRESSION: 1 regression"  # the verdicts decided


def test_compares_change_words_are_the_documented_three():
    from bench.report.verdicts import side_by_side_rows

    def v(kind: str) -> Verdict:
        return Verdict(DEC, "c", kind, 1, 1, 1, 0.99, 1.01, 0.95, 8, 8)

    words = [row[-1] for row in side_by_side_rows([v(k) for k in ("regression", "improved", "inconclusive",
                                                                   "unchanged")])[1]]
    assert words == ["worse", "better", "~", "~"]  # docs/gate.md: better / worse / ~


def test_check_comparable():
    a = results({}, profile="ci", model="llama", backend="vllm")
    assert check_comparable(a, results({}, profile="ci", model="llama", backend="vllm")) == []
    b = results({}, profile="ci", model="qwen", backend="llama.cpp")
    with pytest.raises(ConfigError, match=r"model differs.*backend differs.*--force"):
        check_comparable(a, b)
    assert len(check_comparable(a, b, force=True)) == 2
    with pytest.raises(ConfigError, match="profile differs"):
        check_comparable(a, results({}, profile="other", model="llama", backend="vllm"))
    with pytest.raises(ConfigError, match="interrupted"):
        check_comparable(a, results({}, profile="ci", model="llama", backend="vllm", interrupted=True))


def test_load_results_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_results(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_results(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({"schema": 9, "cells": []}))
    with pytest.raises(ConfigError, match="schema 9"):
        load_results(tmp_path / "old.json")
    (tmp_path / "ok.json").write_text(json.dumps(results({"c": {}}).to_dict()))
    assert load_results(tmp_path / "ok.json").cells[0].id == "c"


# --- reports ------------------------------------------------------------------------------------------------------


def _mixed_verdicts() -> list[Verdict]:
    base = results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)},
                    "d0-s2-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}})
    cand = results({"d0-s1-prose": {"decode_tok_s": spread(88), "ttft_ms": spread(40)},
                    "d0-s2-prose": {"decode_tok_s": spread(95), "ttft_ms": spread(30)}})
    return compare(base, cand, [DEC, TTFT])


def test_junit_is_well_formed():
    vs = _mixed_verdicts()
    assert [v.verdict for v in vs] == ["regression", "inconclusive", "unchanged", "improved"]
    xml = to_junit(vs, properties={"profile": "ci & <friends>"}, time_s=1.5)
    root = ET.fromstring(xml.encode())
    suite = root.find("testsuite")
    assert root.tag == "testsuites" and suite.get("tests") == "4" and suite.get("failures") == "2"
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases][:2] == ["bench.gate.d0-s1-prose", "bench.gate.d0-s2-prose"]
    types = [(c.find("failure").get("type") if c.find("failure") is not None else None) for c in cases]
    assert types == ["regression", "inconclusive", None, None]
    assert suite.find("properties/property").get("value") == "ci & <friends>"
    texts = [(c.find("failure") if c.find("failure") is not None else c.find("system-out")).text or ""
             for c in cases]
    assert len(texts) == 4 and all("% CI [" in t for t in texts if "ratio -" not in t)
    assert not any(" -, limit" in t for t in texts)  # no bare "-" where an interval goes


def test_markdown_table_and_step_summary(tmp_path):
    vs = _mixed_verdicts()
    md = to_markdown(vs, title="bench gate", context={"baseline": "a|b.json"})
    lines = md.splitlines()
    assert lines[0].startswith("### :x: bench gate: REGRESSION")
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) == 2 + len(vs) and all(ln.count(" | ") == table[0].count(" | ") for ln in table[2:])
    assert "**regression**" in table[2] and "a\\|b.json" in md
    assert append_step_summary(md, env={}) is None
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert append_step_summary(md, env={"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text().startswith("earlier step\n### ")
    with pytest.raises(ConfigError, match="Is a directory"):
        append_step_summary(md, env={"GITHUB_STEP_SUMMARY": str(tmp_path)})
    import dataclasses

    assert "| 95% CI |" in md  # one level: named once in the header
    mixed = [dataclasses.replace(v, level=0.96) if i == 0 else v for i, v in enumerate(vs)]  # sequential looks
    md = to_markdown(mixed, title="bench gate")
    head = next(ln for ln in md.splitlines() if ln.startswith("| verdict"))
    assert "| CI |" in head and "% CI" not in head and "| 96%: [" in md and "| 95%: [" in md


def test_an_unwritable_step_summary_keeps_the_verdicts_exit_code(tmp_path, bench_main, capsys, monkeypatch):
    """It raised IsADirectoryError: a traceback and exit 1 ("regression") for a compare that passed."""
    a = tmp_path / "a"
    a.mkdir()
    _write(a / "results.json", results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}}))
    for target in (tmp_path, tmp_path / "missing" / "summary.md"):
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
        code = bench_main(["compare", str(a), str(a)])
        err = capsys.readouterr().err
        assert code == 0 and "Traceback" not in err, err
        assert "cannot append the report to $GITHUB_STEP_SUMMARY" in err and "exit code stand" in err


# --- commands -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bench_main():
    """bench.cli.app.main, with the gate commands registered as the CLI ships them."""
    from bench.cli.app import cli, main

    assert {"gate", "compare", "ab"} <= set(cli.commands)
    return main


def _write(path: Path, doc: Results) -> str:
    path.write_text(json.dumps(doc.to_dict()))
    return str(path)


def test_compare_command(tmp_path, bench_main, capsys):
    a = _write(tmp_path / "a.json", results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}}))
    b = _write(tmp_path / "b.json", results({"d0-s1-prose": {"decode_tok_s": spread(85), "ttft_ms": spread(40)}}))
    same = _write(tmp_path / "s.json", results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}}))
    other = _write(tmp_path / "o.json", results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}},
                                                 model="other"))
    junit, md = tmp_path / "g.xml", tmp_path / "g.md"
    assert bench_main(["compare", a, b, "--junit", str(junit), "--markdown", str(md)]) == 1
    assert ET.parse(junit).getroot().find("testsuite").get("failures") == "1"
    assert "REGRESSION" in md.read_text()
    assert bench_main(["compare", a, same]) == 0
    out = capsys.readouterr().out
    assert "decode_tok_s" in out and "unchanged" in out
    assert bench_main(["compare", a, other]) == 3  # incomparable: refused
    assert "model differs" in capsys.readouterr().err
    assert bench_main(["compare", a, other, "--force"]) == 0
    assert bench_main(["compare", a, str(tmp_path / "missing.json")]) == 3
    capsys.readouterr()
    noisy = _write(tmp_path / "n.json", results({"d0-s1-prose": {"decode_tok_s": spread(100, 4, 0.2),
                                                                 "ttft_ms": spread(40)}}))
    assert bench_main(["compare", a, noisy]) == 0  # undecided: shown and noted, not failed
    captured = capsys.readouterr()
    assert "inconclusive" in captured.out and "verdict(s) inconclusive" in captured.err


def test_compare_with_no_cell_in_common_is_incomparable(tmp_path, bench_main, capsys):
    """No cell in common: exit 3 naming the cells only in A and only in B (not an empty table, 'nothing compared',
    exit 0); --force cannot make them comparable."""
    a = _write(tmp_path / "a.json", results({"d0-s1-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}}))
    b = _write(tmp_path / "b.json", results({"d0-s2-prose": {"decode_tok_s": spread(100), "ttft_ms": spread(40)}}))
    for extra in ([], ["--force"]):
        assert bench_main(["compare", a, b, *extra]) == 3
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
        assert "no cell in common (only in A: d0-s1-prose; only in B: d0-s2-prose)" in err


# --- against bench sim ----------------------------------------------------------------------------------------------

SIM_PROFILE = """
name = "gate-sim"
max_tokens = 24
requests = 8
warmup = 1
overhead_probes = 1
gate_budget_waves = 6
[[sweep]]
depths = [0]
streams = [1]
[[gate]]
metric = "decode_tok_s"
cell = "*"
max_drop_pct = 5
"""
STEP_MS = 5.0


@contextmanager
def sim(step_ms: float, seed: int) -> Iterator[str]:
    """bench sim in its own process (so its timing does not share this process's GIL)."""
    p = subprocess.Popen([sys.executable, "-m", "bench.sim", "--port", "0", "--decode-step-ms", f"{step_ms:.6f}",
                          "--prefill-tok-s", "20000", "--seed", str(seed)], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT)
    try:
        line = p.stdout.readline()
        assert "listening on" in line, line
        yield line.split("listening on", 1)[1].strip()
    finally:
        p.terminate()
        p.wait(timeout=10)


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    with sim(STEP_MS, 1) as same, sim(STEP_MS / 0.90, 2) as slow10, sim(STEP_MS / 0.97, 3) as slow3:
        yield {"same": same, "slow10": slow10, "slow3": slow3}


@pytest.fixture(scope="module")
def sim_profile(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("gate") / "gate-sim.toml"
    p.write_text(SIM_PROFILE)
    return p


def test_gate_fairness_against_sim(sims, sim_profile):
    from bench.client import ClientSettings
    from bench.config.profile import load_profile
    from bench.driver import run_gate, run_profile
    from bench.gate import profile_rules

    prof = load_profile(str(sim_profile))
    rules, from_profile = profile_rules(prof.gate)
    assert from_profile and rules[0].metric == "decode_tok_s"
    settings = ClientSettings()

    async def go() -> dict[str, int]:
        baseline = await run_profile(sims["same"], prof, settings, out_dir=None)
        codes = {}
        for name in ("same", "slow10", "slow3"):
            o = await run_gate(sims[name], prof, settings, baseline, rules)
            codes[name] = o.code
            codes[name + "_ratio"] = o.verdicts[0].ratio
        return codes

    codes = asyncio.run(go())
    assert codes["same"] == 0, codes
    assert codes["slow10"] == 1, codes
    assert codes["slow3"] != 1, codes
    assert codes["slow10_ratio"] == pytest.approx(0.90, abs=0.02)


def test_gate_command_end_to_end(sims, sim_profile, tmp_path, bench_main, capsys, monkeypatch):
    base_dir, cand_dir = tmp_path / "base", tmp_path / "cand"
    assert bench_main(["run", sims["same"], "-p", str(sim_profile), "--out", str(base_dir), "--json"]) == 0
    capsys.readouterr()
    baseline = base_dir / "results.json"
    before = baseline.read_text()
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit = tmp_path / "gate.xml"
    code = bench_main(["gate", sims["slow10"], "-p", str(sim_profile), "--baseline", str(baseline),
                       "--out", str(cand_dir), "--junit", str(junit), "--update-baseline"])
    out = capsys.readouterr().out
    assert code == 1
    assert "regression" in out and "d0-s1-prose" in out
    assert ET.parse(junit).getroot().find("testsuite/testcase/failure").get("type") == "regression"
    assert "REGRESSION" in summary.read_text()
    assert json.loads((cand_dir / "gate.json").read_text())["exit"] == 1
    _typed_gate_file(cand_dir / "gate.json")
    assert baseline.read_text() != before and load_results(baseline).run.id != json.loads(before)["run"]["id"]
    # the whole run beside it, not results.json alone over the old records and views (a mixed folder)
    for name in ("records.jsonl", "results.md", "results.csv"):
        assert (base_dir / name).read_bytes() == (cand_dir / name).read_bytes(), name
    assert load_results(baseline).run.id == load_results(cand_dir).run.id


def test_update_baseline_of_a_folder_keeps_the_verdict(sims, sim_profile, tmp_path, bench_main, capsys):
    """`--baseline base --update-baseline` with a results folder failed 'cannot write base: Is a directory' (exit 3)
    after the verdict: the folder now gets the new run's files (stale run files removed, other files kept) and the
    exit code is the verdict's."""
    base_dir, cand_dir = tmp_path / "base", tmp_path / "cand"
    assert bench_main(["run", sims["same"], "-p", str(sim_profile), "--out", str(base_dir), "--json"]) == 0
    (base_dir / "report.html").write_text("<p>the old run</p>")
    (base_dir / "notes.txt").write_text("mine")
    capsys.readouterr()
    code = bench_main(["gate", sims["slow10"], "-p", str(sim_profile), "--baseline", str(base_dir),
                       "--out", str(cand_dir), "--update-baseline"])
    out, err = capsys.readouterr()
    verdict = json.loads((cand_dir / "gate.json").read_text())["exit"]  # 1; 2 should other work load this host
    assert code == verdict and verdict in (1, 2), err
    assert "bench: error" not in err and f"{base_dir} (baseline updated)" in " ".join(err.split())
    assert load_results(base_dir).run.id == load_results(cand_dir).run.id
    for name in ("records.jsonl", "results.md", "results.csv", "gate.json"):
        assert (base_dir / name).read_bytes() == (cand_dir / name).read_bytes(), name
    assert not (base_dir / "report.html").exists() and (base_dir / "notes.txt").read_text() == "mine"
    assert not list(base_dir.glob(".*.new"))


def test_replace_run_of_a_lone_file_and_on_failure(tmp_path, monkeypatch):
    """A lone results file gets the results alone; a copy that fails leaves the old set whole (exit 3, one line)."""
    from bench.results import replace_run, to_json

    new, old = results({"c": {"decode_tok_s": spread(90)}}), results({"c": {"decode_tok_s": spread(100)}})
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(to_json(new))
    (run / "records.jsonl").write_text("new\n")
    lone = tmp_path / "base.json"
    lone.write_text(to_json(old))
    assert replace_run(lone, run, new) == lone and lone.read_text() == to_json(new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "run"]
    base = tmp_path / "base"
    base.mkdir()
    (base / "results.json").write_text(to_json(old))
    (base / "records.jsonl").write_text("old\n")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("shutil.copyfile", full)
    with pytest.raises(ConfigError, match=r"\(left as it was\): No space left on device"):
        replace_run(base / "results.json", run, new)
    assert sorted(p.name for p in base.iterdir()) == ["records.jsonl", "results.json"]
    assert (base / "results.json").read_text() == to_json(old) and (base / "records.jsonl").read_text() == "old\n"


def test_other_work_beside_a_local_server_leaves_the_gate_undecided(sims, sim_profile, tmp_path, bench_main, capsys):
    """A baseline recorded while other work kept 1.6 cores of this host busy beside the (local) server, gated on
    a quiet host: the same server, but the verdicts may be the machine's -> exit 2 with the warning and its cure,
    gate.json's ``host_load``. Without the difference the same gate passes."""
    base_dir = tmp_path / "base"
    assert bench_main(["run", sims["same"], "-p", str(sim_profile), "--out", str(base_dir), "--json"]) == 0
    capsys.readouterr()
    doc = json.loads((base_dir / "results.json").read_text())
    load = doc["machine"]["other_load"]
    assert load["server_local"] and load["server_cores"] is not None, load
    doc["machine"]["other_load"] = {**load, "other_cores": load["other_cores"] + 1.6}
    busy = _write_doc(tmp_path / "busy.json", doc)
    md = tmp_path / "g1.md"
    code = bench_main(["gate", sims["same"], "-p", str(sim_profile), "--baseline", busy, "--out",
                       str(tmp_path / "g1"), "--max-waves", "8", "--markdown", str(md)])
    out, err = capsys.readouterr()
    assert code == 2, err
    # the printed outcome is the exit's, whatever the verdicts alone would say
    said = " ".join(out.split())
    assert "INCONCLUSIVE: " in said and "found" in said, said
    assert "but the verdict is withheld: other work on this host changed between the runs (run the baseline" in said
    assert "bench ab)" in said
    assert md.read_text().startswith("### :warning: bench gate: INCONCLUSIVE: ")
    assert "but the verdict is withheld: other work on this host changed" in md.read_text().splitlines()[0]
    assert f"other work on this host kept {load['other_cores'] + 1.6:.2f} cores busy during the baseline" in err
    assert "bench ab" in err
    gate_doc = json.loads((tmp_path / "g1" / "gate.json").read_text())
    assert gate_doc["host_load"]["change_cores"] < -1.0 and gate_doc["exit"] == 2
    assert bench_main(["gate", sims["same"], "-p", str(sim_profile), "--baseline", str(base_dir / "results.json"),
                       "--out", str(tmp_path / "g2"), "--max-waves", "8"]) in (0, 2)
    warned = "other work on this host" in capsys.readouterr().err
    again = json.loads((tmp_path / "g2" / "gate.json").read_text())
    # on a quiet machine no warning; should other work start between the two runs, the warning must be its own
    assert warned == ("host_load" in again)
    if warned:
        assert abs(again["host_load"]["change_cores"]) > 0.25 and again["exit"] == 2


def _write_doc(path: Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_host_load_change_is_pure_and_needs_a_local_server():
    from bench.gate import host_load_change

    def with_load(other, local=True):
        r = results({"c": {"decode_tok_s": [50.0] * 4}})
        r.machine = {"other_load": {"other_cores": other, "server_local": local}}
        return r

    assert host_load_change(with_load(0.1), with_load(0.2)) is None  # within 0.25 cores
    assert host_load_change(with_load(0.1), with_load(1.1)) == {"baseline_other_cores": 0.1,
                                                                 "candidate_other_cores": 1.1, "change_cores": 1.0}
    assert host_load_change(with_load(0.1, local=False), with_load(1.1, local=False)) is None  # a remote server
    assert host_load_change(results({"c": {"decode_tok_s": [50.0] * 4}}), with_load(1.1)) is None  # an older baseline


def test_compare_warns_of_other_work_and_keeps_its_exit(tmp_path, bench_main, capsys):
    def doc(other):
        r = results({"c": {"decode_tok_s": [50.0, 50.5, 49.5, 50.2]}})
        r.machine = {"other_load": {"other_cores": other, "server_local": True}}
        return _write(tmp_path / f"r{other}.json", r)

    assert bench_main(["compare", doc(0.0), doc(1.2)]) == 0
    err = capsys.readouterr().err
    assert "other work on this host kept 0.00 cores busy during the baseline and 1.20" in err
    assert "read the verdicts with care" in err


def test_gate_could_not_run_is_exit_3(tmp_path, sim_profile, bench_main, capsys):
    baseline = _write(tmp_path / "b.json", results({}, profile="gate-sim"))
    # unreachable endpoint (a closed port): exit 3 for bench gate, not 4
    assert bench_main(["gate", "http://127.0.0.1:9/v1", "-p", str(sim_profile), "--baseline", baseline,
                       "--connect-timeout", "2", "--out", str(tmp_path / "o")]) == 3
    assert bench_main(["gate", "http://127.0.0.1:9/v1", "-p", str(sim_profile), "--baseline",
                       str(tmp_path / "none.json")]) == 3
    other = _write(tmp_path / "other.json", results({}, profile="another"))
    assert bench_main(["gate", "http://127.0.0.1:9/v1", "-p", str(sim_profile), "--baseline", other]) == 3
    assert "not comparable" in capsys.readouterr().err


def test_gate_notes_keep_their_brackets_and_warnings_read_alike(sims, tmp_path, bench_main, capsys):
    """A profile with no [[gate]] tables and a cell the baseline lacks: the note says '[[gate]]' (rich once read it
    as markup and printed '[]'), and the cell's warning reads 'warning cell ...' as every other ('warning:' once)."""
    tiny = 'max_tokens = 4\nrequests = 2\nwarmup = 0\noverhead_probes = 1\n[[sweep]]\nstreams = [{}]\n'
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    (tmp_path / "b" / "p.toml").write_text(tiny.format("1"))
    (tmp_path / "c" / "p.toml").write_text(tiny.format("1, 2"))
    assert bench_main(["run", sims["same"], "-p", str(tmp_path / "b" / "p.toml"), "--out", str(tmp_path / "base"),
                       "--json"]) == 0
    capsys.readouterr()
    bench_main(["gate", sims["same"], "-p", str(tmp_path / "c" / "p.toml"), "--baseline",
                str(tmp_path / "base" / "results.json"), "--out", str(tmp_path / "cand")])
    err = capsys.readouterr().err
    assert "note: the profile has no [[gate]] tables; using the default rules" in err
    assert "warning cell d0-s2-prose is only in the candidate" in err and "warning:" not in err


def test_ab_alternates_waves_and_compares(sims, sim_profile, tmp_path, bench_main, capsys):
    out = tmp_path / "ab"
    code = bench_main(["ab", sims["same"], sims["slow10"], "-p", str(sim_profile), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "B/A" in text and "regression" in text
    a, b = load_results(out / "a" / "results.json"), load_results(out / "b" / "results.json")
    assert a.cells[0].waves == b.cells[0].waves == 8
    assert a.cells[0].client_cpu_pct is not None and b.cells[0].client_cpu_pct is not None
    assert json.loads((out / "ab.json").read_text())["verdicts"][0]["ratio"] == pytest.approx(0.90, abs=0.02)
    # the waves really alternate: ordered by send time, measured requests go A, B, A, B, ...
    sides = []
    for side in ("a", "b"):
        for line in (out / side / "records.jsonl").read_text().splitlines():
            r = json.loads(line)
            if (r.get("meta") or {}).get("phase") == "measure":
                sides.append((r["sent_ns"], side))
    order = "".join(side for _, side in sorted(sides))
    assert order == "ab" * 8, order


def test_gate_module_imports_first() -> None:
    """bench.cli.gate imported before bench.cli.app (as benchmarks/gate_fairness.py does) must not hit an import cycle."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import bench.cli.gate, bench.cli.app; "
                        "assert {'gate', 'compare', 'ab'} <= set(bench.cli.app.cli.commands)"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _spec_cell(accepted: int, drafted: int, drafts: int) -> Results:
    r = results({"c": {"decode_tok_s": spread(100)}})
    r.cells[0].server_metrics = {"spec_accepted_tokens": accepted, "spec_draft_tokens": drafted, "spec_drafts": drafts}
    return r


def test_acceptance_rate_rule_on_the_servers_counts():
    """A gate rule on the server's spec-decode acceptance rate: the ratio of two counted proportions, with the
    drafts (not the tokens) as independent trials."""
    [rule] = parse_rules([{"metric": "spec_acceptance_rate", "max_drop_pct": 5}])
    same = compare(_spec_cell(7000, 10000, 2500), _spec_cell(7020, 10000, 2500), [rule])[0]
    assert same.verdict == "unchanged" and same.ratio == pytest.approx(7020 / 7000)
    drop = compare(_spec_cell(7000, 10000, 2500), _spec_cell(5600, 10000, 2500), [rule])[0]
    assert drop.verdict == "regression" and drop.hi < 0.95  # 0.70 -> 0.56: -20 %
    few = compare(_spec_cell(7, 10, 3), _spec_cell(6, 10, 3), [rule])[0]
    assert few.verdict == "inconclusive"  # 3 drafts a side say little
    none = compare(results({"c": {"decode_tok_s": spread(100)}}), _spec_cell(7, 10, 3), [rule])
    assert none == [] or none[0].verdict == "inconclusive"


# --- resolution: the minimum detectable effect ------------------------------------------------------------------


def _lognormal(rng: np.random.Generator, center: float, n: int, cv: float) -> list[float]:
    return list(center * np.exp(rng.normal(0.0, cv, n)))


def test_min_detectable_pct_follows_the_interval_and_the_noise():
    from bench.gate import min_detectable_pct

    assert min_detectable_pct(1.0, 1.0, 8, 8) == 0.0
    wide, narrow = min_detectable_pct(0.9, 1.1, 8, 8), min_detectable_pct(0.98, 1.02, 8, 8)
    assert wide == pytest.approx(5 * narrow)
    # (z + z_power) / z of the half-width: about 1.3x the half-width at 95 % / 80 % power
    assert 1.2 * 2.0 < narrow < 1.6 * 2.0
    rng = np.random.default_rng(1)
    quiet = compare_samples_v(_lognormal(rng, 100, 16, 0.01), _lognormal(rng, 100, 16, 0.01))
    noisy = compare_samples_v(_lognormal(rng, 100, 16, 0.05), _lognormal(rng, 100, 16, 0.05))
    assert quiet.mde_pct < 5 < noisy.mde_pct
    assert quiet.resolution_ok and not noisy.resolution_ok


def compare_samples_v(base: list[float], cand: list[float], waves: int | None = None) -> Verdict:
    from bench.gate import compare_samples

    return compare_samples(DEC, "c", base, cand, waves=waves)


def test_resolution_says_how_many_waves_fix_it():
    from bench.gate import waves_needed

    assert waves_needed(10.0, 5.0, 8) == 32  # noise ~ 1/sqrt(n): twice the MDE needs four times the waves
    assert waves_needed(4.0, 5.0, 8) == 8
    assert waves_needed(5.01, 5.0, 8) == 9
    assert waves_needed(3.0, 0.0, 8) is None
    assert waves_needed(10.0, 5.0, 8, True) == 34  # on the log scale: (ln 0.90 / ln 0.95)^2 = 4.22
    assert waves_needed(10.0, 5.0, 8, False) == 31  # (ln 1.10 / ln 1.05)^2 = 3.82
    rng = np.random.default_rng(2)
    v = compare_samples_v(_lognormal(rng, 100, 16, 0.06), _lognormal(rng, 100, 16, 0.06), waves=4)
    assert not v.resolution_ok and v.waves == 4
    assert v.waves_needed == waves_needed(v.mde_pct, 5.0, 4, True) > 4
    d = v.to_dict()
    assert d["min_detectable_pct"] == pytest.approx(v.mde_pct) and d["resolution_ok"] is False
    assert d["waves_needed"] == v.waves_needed
    msg = v.explain()
    assert "MDE" in msg and f"{v.mde_pct:.1f} %" in msg and f"about {v.waves_needed} waves" in msg


def test_compare_reads_the_cells_waves():
    base = results({"c": {"decode_tok_s": spread(100, 16, 0.06)}})
    cand = results({"c": {"decode_tok_s": spread(100, 16, 0.06)}})
    cand.cells[0].waves = 4
    [v] = compare(base, cand, [DEC])
    assert v.waves == 4 and v.mde_pct is not None and v.mde_pct > 0


@pytest.mark.parametrize("n, cv", [(8, 0.01), (8, 0.03), (16, 0.05), (6, 0.10)])
def test_self_comparison_never_regresses_and_never_improves(n, cv):
    """Two draws of one distribution: never a regression, never 'improved' (that would be noise called a change)."""
    rng = np.random.default_rng(int(n * 1000 + cv * 100))
    kinds = []
    for trial in range(60):
        rule = DEC if trial % 2 else TTFT
        center = 100.0 if rule is DEC else 40.0
        from bench.gate import compare_samples

        v = compare_samples(rule, "c", _lognormal(rng, center, n, cv), _lognormal(rng, center, n, cv), seed=trial,
                            resamples=1000)
        kinds.append(v.verdict)
    assert "regression" not in kinds and "improved" not in kinds, kinds


def test_reports_print_the_mde():
    from bench.report.verdicts import gate_table, verdict_rows

    vs = _mixed_verdicts()
    head, rows = verdict_rows(vs)
    assert "MDE" in head
    col = head.index("MDE")
    assert all(r[col] == f"{v.mde_pct:.1f} %" for v, r in zip(vs, rows))
    xml = to_junit(vs)
    assert "MDE" in xml and f"{vs[0].mde_pct:.1f} %" in xml
    md = to_markdown(vs)
    assert f"{vs[0].mde_pct:.1f} %" in md and "MDE" in md
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(gate_table(vs))
    assert f"{vs[0].mde_pct:.1f} %" in con.export_text()


def test_reports_flag_a_resolution_short_of_the_allowance():
    from bench.report.verdicts import verdict_rows

    rng = np.random.default_rng(3)
    v = compare_samples_v(_lognormal(rng, 100, 8, 0.08), _lognormal(rng, 100, 8, 0.08), waves=8)
    assert not v.resolution_ok
    head, [row] = verdict_rows([v])
    assert row[head.index("MDE")].endswith("!")
    assert f"{v.waves_needed} waves" in to_markdown([v])


def test_mde_is_relative_so_a_large_change_is_called_what_it_is():
    """A run 7-27x faster (drift between runs) is 'improved', not 'unchanged' behind a huge linear MDE."""
    from bench.gate import min_detectable_pct

    mde = min_detectable_pct(6.7, 26.9, 4, 4, higher_better=True)
    assert mde < 100.0
    assert classify(DEC, 6.7, 26.9, mde) == "improved"
    near = min_detectable_pct(0.98, 1.02, 8, 8, higher_better=True)
    assert near == pytest.approx(min_detectable_pct(0.98, 1.02, 8, 8), rel=0.03)  # the same near a ratio of 1
    rise = min_detectable_pct(0.9, 1.1, 8, 8, higher_better=False)
    drop = min_detectable_pct(0.9, 1.1, 8, 8, higher_better=True)
    assert drop < rise  # a drop and a rise of the same log size


# --- sequential decisions (pure) ------------------------------------------------------------------------------------


def test_obf_boundaries_match_published_values_and_spend_alpha():
    from bench.sequential import boundaries, fractions, look_schedule, obf_spent

    assert boundaries([1.0], 0.025)[0] == pytest.approx(1.95996, abs=1e-4)  # one look: the fixed test
    # Lan-DeMets O'Brien-Fleming-type, 5 equally spaced looks, one-sided 0.025 (Jennison & Turnbull 2000, ch. 7)
    want = (4.877, 3.357, 2.680, 2.290, 2.031)
    assert boundaries([0.2, 0.4, 0.6, 0.8, 1.0], 0.025) == pytest.approx(want, abs=2e-3)
    assert obf_spent(0.0, 0.025) == 0 and obf_spent(1.0, 0.025) == 0.025 and obf_spent(0.5, 0.025) < 0.002
    # a stored baseline of 16 waves, candidate looks at 8 .. 40 waves: the crossing probability over all looks
    # under the null (Monte Carlo of the canonical joint distribution) is alpha
    sched = look_schedule(8, 40)
    assert sched == [8, 12, 18, 27, 40]
    ts = fractions(sched, 40, 16)
    assert ts[-1] == 1.0 and all(a < b for a, b in zip(ts, ts[1:]))
    c = np.array(boundaries(ts, 0.025))
    rng = np.random.default_rng(3)
    n = 200_000
    z = np.cumsum(rng.standard_normal((n, len(ts))) * np.sqrt(np.diff([0.0, *ts])), axis=1) / np.sqrt(ts)
    rate = float(np.mean((z > c).any(axis=1)))
    assert abs(rate - 0.025) < 4 * np.sqrt(0.025 * 0.975 / n), rate
    assert boundaries([0.5, 0.5], 0.025)[1] == float("inf")  # no new information: that look cannot decide


def _sequential_gate(rng, ratio, cv, base_waves, sched, rule, resamples=600):
    """One simulated sequential gate on lognormal per-wave samples; returns (verdict, looks taken)."""
    from bench.sequential import Look, sequential_samples

    base = list(100.0 * np.exp(rng.normal(0.0, cv, base_waves)))
    cand = list(100.0 * ratio * np.exp(rng.normal(0.0, cv, sched[-1])))
    for k, n in enumerate(sched):
        v = sequential_samples(rule, "c", base, cand[:n], Look(tuple(sched[:k + 1]), sched[-1], base_waves),
                               resamples=resamples, seed=int(rng.integers(1 << 30)))
        if v.verdict != "inconclusive":
            return v.verdict, k + 1
    return "inconclusive", len(sched)


def _binomial_margin(p: float, n: int) -> float:
    return 3.0 * float(np.sqrt(p * (1.0 - p) / n))


def test_sequential_gate_keeps_its_false_alarm_rate_and_has_power():
    """Many simulated gates, each looking after every round (6 looks): at a true ratio exactly at the limit the
    share of regressions stays within alpha (plus 3 binomial standard errors of this simulation); an unchanged
    candidate passes; 2 points beyond the allowance is a regression >= 95 % of the time (the plan says so)."""
    from bench.sequential import ALPHA, look_schedule, plan_rule

    rule = Rule("decode_tok_s", "*", "median", 5.0, 0)
    sched = look_schedule(16, 96)
    rng = np.random.default_rng(25)
    cv = 0.02  # lognormal scatter per sample
    counts = {0.95: 600, 1.0: 200, 0.93: 200}  # the edge gets the most trials: its rate is the one asserted
    runs = {r: [_sequential_gate(rng, r, cv, 48, sched, rule, resamples=400) for _ in range(n)]
            for r, n in counts.items()}
    share = {r: {k: sum(v == k for v, _ in out) / len(out) for k in VERDICT_KINDS} for r, out in runs.items()}
    edge = ALPHA + _binomial_margin(ALPHA, counts[0.95])
    assert share[0.95]["regression"] <= edge, share[0.95]
    assert share[0.95]["unchanged"] + share[0.95]["improved"] <= edge, share[0.95]
    assert share[1.0]["regression"] == 0 and share[1.0]["unchanged"] >= 0.95, share[1.0]
    assert share[0.93]["regression"] >= 0.95 - _binomial_margin(0.95, counts[0.93]), share[0.93]
    assert share[0.93]["unchanged"] == 0, share[0.93]
    # clear cases stop early: a 10 % slowdown needs fewer looks than the budget
    early = [k for v, k in (_sequential_gate(rng, 0.90, cv, 48, sched, rule) for _ in range(40))]
    assert max(early) < len(sched)
    # the plan made from a baseline of this noise promises that power: its MDE is within 2 points
    base = list(100.0 * np.exp(rng.normal(0.0, cv, 48)))
    plan = plan_rule(rule, "c", base, 48, sched)
    assert plan["planned_mde_pct"] < 2.0 and plan["waves_needed"] is not None and plan["waves_needed"] <= 96


VERDICT_KINDS = ("regression", "inconclusive", "improved", "unchanged")


def test_sequential_verdict_fields_and_plan():
    from bench.sequential import Look, plan_rule, sequential_samples

    rule = Rule("decode_tok_s", "*", "median", 5.0, 0)
    rng = np.random.default_rng(1)
    base = list(100 * np.exp(rng.normal(0, 0.02, 16)))
    cand = list(90 * np.exp(rng.normal(0, 0.02, 8)))
    v = sequential_samples(rule, "c", base, cand, Look((8,), 24, 16), waves_baseline=16, planned_mde_pct=3.0)
    assert v.verdict == "regression" and v.look == 1 and v.level > 0.99  # a first look needs strong evidence
    d = v.to_dict()
    assert d["waves"] == {"baseline": 16, "candidate": 8} and d["planned_mde_pct"] == 3.0
    assert d["min_detectable_pct"] > 0 and d["verdict"] == "regression"
    # the plan: a noisier baseline needs more waves; a baseline too noisy for the allowance says so (None)
    quiet = plan_rule(rule, "c", base, 16, [8, 12, 18, 24])
    noisy = plan_rule(rule, "c", list(100 * np.exp(rng.normal(0, 0.10, 16))), 16, [8, 12, 18, 24])
    assert quiet["planned_mde_pct"] < noisy["planned_mde_pct"]
    assert noisy["waves_needed"] is None and noisy["waves_needed_both"] > 24
    assert quiet["waves_needed"] is not None
    # one sample a wave (a single stream's TTFT): one wave gives no verdict (MIN_SAMPLES), so the plan never says
    # "from 1 waves" however quiet the baseline (it did for a 0.2 % spread)
    flat = [100.0 * (1 + 0.001 * (i % 3)) for i in range(2)]
    assert plan_rule(Rule("ttft_ms", "c", "p90", 10.0, 0), "c", flat, 2, [2])["waves_needed"] >= 2
    assert plan_rule(Rule("ttft_ms", "c", "p90", 10.0, 0), "c", flat * 2, 2, [2])["waves_needed"] == 1  # 2 a wave
    # printed within 80 columns, the names whole (a long rule name, two cells, a plan that cannot be met)
    from bench.sequential import plan_lines

    long_rule = Rule("decode_tok_s", "*", "median", 5.0, 0)
    p1 = plan_rule(long_rule, "d131072-s16-prose", base, 16, [8, 12, 18, 24])
    p2 = plan_rule(long_rule, "d0-s1-prose", list(100 * np.exp(rng.normal(0, 0.10, 16))), 16, [8, 12, 18, 24])
    lines = plan_lines([p1, p2], {"d131072-s16-prose": [8, 12, 18, 24], "d0-s1-prose": [8, 12, 18, 24]},
                       {"d131072-s16-prose": (1.25, 2.0), "d0-s1-prose": (0.5, 1.0)}, 300.0)
    assert all(len(line) <= 80 for line in lines), lines
    text = "\n".join(lines)
    assert "d131072-s16-prose: 1.25 s a wave, looks at 8/12/18/24 waves" in text and "of the 300 s left" in text
    assert f"plan: {p1['name']}: expected MDE" in text and f"plan: {p2['name']}: expected MDE" in text
    assert "record the baseline with about" in " ".join(t.strip() for t in lines)
    assert "if the candidate is as steady as the baseline" in " ".join(t.strip() for t in lines)  # an assumption


def test_gate_schedules_fit_the_budget():
    from bench.driver import gate_schedules

    first = {"a": 8, "b": 4, "free": 6}
    costs = {"a": (0.5, 0.2), "b": (1.0, 0.2), "free": (0.5, 0.2)}
    gated = {"a", "b"}
    one = gate_schedules(first, costs, gated, time_left=None, waves_left=0)
    assert one == {"a": [8], "b": [4], "free": [6]}  # no budget: one look at the planned waves (the fixed gate)
    s = gate_schedules(first, costs, gated, time_left=60.0, waves_left=None)
    assert s["free"] == [6] and s["a"][0] == 8 and s["b"][0] == 4 and len(s["a"]) > 2

    def cost(sched, wave, warm):
        return len(sched) * warm + (sched[-1] - 1) * wave

    assert sum(cost(v, *costs[k]) for k, v in s.items()) <= 60.0
    bigger = gate_schedules(first, costs, gated, time_left=60.0 * 1.3, waves_left=None)
    assert bigger["a"][-1] > s["a"][-1]  # the budget was used, not just met
    capped = gate_schedules(first, costs, gated, time_left=600.0, waves_left=12, max_waves=14)
    assert capped["a"][-1] <= 14 and sum(v[-1] - first[k] for k, v in capped.items()) <= 12
    tiny = gate_schedules(first, costs, gated, time_left=2.0, waves_left=None)
    assert all(v[-1] <= first[k] for k, v in tiny.items()) and tiny["a"][-1] < 8  # cut to what fits


def test_gate_command_max_time_json(sims, sim_profile, tmp_path, bench_main, capsys):
    base_dir = tmp_path / "base"
    assert bench_main(["run", sims["same"], "-p", str(sim_profile), "--out", str(base_dir), "--json",
                       "--repeats", "12"]) == 0
    capsys.readouterr()
    baseline = str(base_dir / "results.json")
    code = bench_main(["gate", sims["same"], "-p", str(sim_profile), "--baseline", baseline, "--max-time", "40",
                       "--json", "--out", str(tmp_path / "c1")])
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert code == 0 and doc["exit"] == 0, cap.err
    v = doc["verdicts"][0]
    assert v["verdict"] in ("unchanged", "improved") and v["waves"]["baseline"] == 12 and v["waves"]["candidate"] >= 8
    assert v["min_detectable_pct"] > 0 and v["planned_mde_pct"] > 0 and v["look"] >= 1
    assert doc["plan"][0]["name"] == v["name"] and doc["elapsed_s"] <= 40.0 and doc["max_time_s"] == 40.0
    assert "plan: decode_tok_s.median@d0-s1-prose: expected MDE" in cap.err  # printed before measuring
    # a budget that allows one wave cannot decide: exit 2, and it says so
    code = bench_main(["gate", sims["same"], "-p", str(sim_profile), "--baseline", baseline, "--max-waves", "1",
                       "--json", "--out", str(tmp_path / "c2")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["verdicts"][0]["verdict"] == "inconclusive" and doc["looks"]["d0-s1-prose"] == [1]
    # the 10 % slower sim is a regression within the budget
    code = bench_main(["gate", sims["slow10"], "-p", str(sim_profile), "--baseline", baseline, "--max-time", "40",
                       "--json", "--out", str(tmp_path / "c3")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdicts"][0]["verdict"] == "regression"


def test_ab_sequential_rounds(sims, sim_profile, tmp_path, bench_main, capsys):
    out = tmp_path / "ab"
    code = bench_main(["ab", sims["same"], sims["slow10"], "-p", str(sim_profile), "--out", str(out),
                       "--max-waves", "24"])
    capsys.readouterr()
    doc = json.loads((out / "ab.json").read_text())
    _typed_gate_file(out / "ab.json")
    assert code == 1 and doc["exit"] == 1 and doc["schedules"]["d0-s1-prose"] == [8, 12, 18, 24]
    looks = doc["looks"]["d0-s1-prose"]
    assert looks and looks[-1] <= 24 and doc["verdicts"][0]["look"] == len(looks)
    a = load_results(out / "a" / "results.json")
    assert a.cells[0].waves == looks[-1] == doc["verdicts"][0]["waves"]["candidate"]
    code = bench_main(["ab", sims["same"], sims["same"], "-p", str(sim_profile), "--out", str(tmp_path / "ab2"),
                       "--max-time", "60"])
    capsys.readouterr()
    assert code == 0


def test_instance_spread_turns_drift_into_an_honest_verdict():
    """A stored baseline from another instance that decoded 6.5 % faster (drift, not a change): without the
    spread the quiet data call it a regression; with a measured instance spread of 3 % it is not one."""
    from bench.sequential import Look, plan_rule, sequential_samples

    rule = Rule("decode_tok_s", "*", "median", 5.0, 0)
    base, cand = spread(100.0, 24, 0.005), spread(93.5, 24, 0.005)
    look = Look((24,), 24, 24)
    assert sequential_samples(rule, "c", base, cand, look).verdict == "regression"
    folded = sequential_samples(rule, "c", base, cand, Look((24,), 24, 24, spread_pct=3.0))
    assert folded.verdict == "inconclusive" and folded.lo < 0.95 < folded.hi
    # the plan says what the spread costs: the MDE cannot fall under (k + z) * 3 %
    p0 = plan_rule(rule, "c", base, 24, [24, 36, 48])
    p3 = plan_rule(rule, "c", base, 24, [24, 36, 48], spread_pct=3.0)
    assert p3["planned_mde_pct"] > 2.0 * 3.0 > p0["planned_mde_pct"] and p3["waves_needed"] is None


def test_server_decode_rate_is_a_gate_metric():
    rules = parse_rules([{"metric": "server_decode_tok_s", "max_drop_pct": 5}])
    a = results({"c": {"server_decode_tok_s": spread(200.0, 12)}})
    b = results({"c": {"server_decode_tok_s": spread(180.0, 12)}})
    (v,) = compare(a, b, rules)
    assert v.rule.higher_better and v.verdict == "regression"
    plain = results({"c": {"decode_tok_s": spread(180.0, 12)}})
    assert compare(plain, plain, rules) == []  # a backend that never reports it: skipped quietly


def _typed_gate_file(path: Path) -> None:
    """The file loads through bench.results.load_gate, every key it holds is a documented field, and a wrong type
    in it is refused naming the key path."""
    import dataclasses

    from bench.errors import ConfigError
    from bench.results import Gate, GateVerdict, load_gate

    raw = json.loads(path.read_text())
    doc = load_gate(path)
    assert set(raw) <= {f.name for f in dataclasses.fields(Gate)}, set(raw)
    for v in raw["verdicts"]:
        assert set(v) == {f.name for f in dataclasses.fields(GateVerdict)}, set(v) ^ {f.name for f in dataclasses.fields(GateVerdict)}
    typed = doc.to_dict()
    assert all(typed.get(k) == v for k, v in raw.items())
    raw["verdicts"][0]["ratio"] = "fast"
    bad = path.with_name("bad-" + path.name)
    bad.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"verdicts\[0\]\.ratio"):
        load_gate(bad)


def test_side_by_side_judges_prompt_rate_only_where_it_is_prefill() -> None:
    """compare / ab judged prompt tok/s at depth 0 (a few prompt tokens over TTFT: overhead, not prefill), where the
    run table shows "-": a slower decode step read as a prompt-rate regression."""
    from bench.gate import main_verdicts

    def side(prompt: float) -> Results:
        r = results({cid: {"decode_tok_s": spread(100), "prompt_tok_s": spread(prompt)} for cid in ("d0", "d4k")})
        (r.cells[0].depth, r.cells[0].streams), (r.cells[1].depth, r.cells[1].streams) = (0, 1), (4096, 1)
        return r

    got = {(v.cell, v.rule.metric): v.verdict for v in main_verdicts(side(50), side(40))}
    assert got[("d4k", "prompt_tok_s")] == "regression" and ("d0", "prompt_tok_s") not in got
    assert ("d0", "decode_tok_s") in got


def test_junit_re_measured_names_every_cell_looked_at_again() -> None:
    """The re-measured property was empty although the gate printed "measured again": it listed only waves beyond
    the profile's plan, and a sequential gate's later looks can stay within it."""
    from bench.cli.gate import remeasured_text

    assert remeasured_text({"a": [4], "b": [4, 8]}, {}) == "b (2 looks, 8 waves)"
    assert remeasured_text({"a": [4, 8, 12]}, {"a": 2}) == "a (3 looks, 12 waves, +2 beyond the plan)"
    assert remeasured_text({"a": [4]}, {}) is None


def test_runs_with_other_requests_are_not_comparable() -> None:
    """A baseline of --max-tokens 48 gated with 16 passed ('3 unchanged'): the cells' max_tokens and the profiles'
    request settings must match, else the one line names each difference (--force compares anyway)."""
    base, cand = results({"c": {"decode_tok_s": spread(100)}}), results({"c": {"decode_tok_s": spread(100)}})
    assert check_comparable(base, cand) == []
    cand.profile.settings["force_length"] = False  # the baseline was stored before it was recorded: not judged
    assert check_comparable(base, cand) == []
    base.cells[0].max_tokens, cand.cells[0].max_tokens = 48, 16
    base.profile.settings["temperature"], cand.profile.settings["temperature"] = 0.0, 0.7
    with pytest.raises(ConfigError, match=r"temperature differs: baseline 0.0, candidate 0.7; c: max_tokens differs: "
                                          r"baseline 48, candidate 16 \(--force"):
        check_comparable(base, cand)
    assert len(check_comparable(base, cand, force=True)) == 2


def test_open_loop_runs_with_another_load_are_not_comparable() -> None:
    """Two rate runs differ in their arrivals or sizes (not their seed or length): not comparable."""
    base, cand = results({"rate-5": {"ttft_ms": spread(100)}}), results({"rate-5": {"ttft_ms": spread(100)}})
    base.load = {"mode": "rate", "rate": 5.0, "arrival": "poisson", "seed": 1, "duration_s": 30.0}
    cand.load = {**base.load, "seed": 2, "duration_s": 60.0}
    assert check_comparable(base, cand) == []
    cand.load["arrival"] = "gamma"
    with pytest.raises(ConfigError, match="load arrival differs: baseline 'poisson', candidate 'gamma'"):
        check_comparable(base, cand)


# Profile fields that do not shape a request: words, sample sizes, the gate's own rules, where the profile came
# from; the sweeps are compared through their cells (ids, and each cell's max_tokens, images, image size); the
# open-loop load through results.load.
NOT_REQUEST = {"name", "description", "requests", "min_waves", "max_waves", "target_ci", "requests_by_depth",
               "overhead_probes", "gate", "gate_budget_waves", "source", "overrides", "sweeps", "mode", "load"}
PER_CELL = {"max_tokens", "images", "image_size"}


def test_every_profile_field_is_judged_by_the_gate_or_named_as_not_shaping_requests() -> None:
    """The gate's list of request settings had drifted from the profile (force_length, image_format, image_source
    were missing): a new Profile field must be placed here. And the history's setups (a digest of the settings
    less a denylist) must tell apart every run the gate refuses to compare."""
    from dataclasses import fields

    from bench.config.profile import Profile
    from bench.gate import REQUEST_SETTINGS
    from bench.history.store import _UNMEASURED

    names, placed = {f.name for f in fields(Profile)}, set(REQUEST_SETTINGS) | PER_CELL | NOT_REQUEST
    assert names == placed, names ^ placed
    assert not (set(REQUEST_SETTINGS) | PER_CELL) & _UNMEASURED
