"""Exporters and plots render a results document (from a real run's shape, built by hand here)."""

from __future__ import annotations

import csv
import io

import pytest

from bench.cli.app import main
from bench.report.export import CSV_COLUMNS, headline, to_csv, to_markdown, write_results
from bench.results import results_from_dict
from bench.warns import warning

NOTE = warning("no-usage", "d0-s1-prose")


def _summ(median: float) -> dict:
    return {"n": 4, "mean": median, "median": median, "p10": median * 0.9, "p90": median * 1.1, "p99": median * 1.2,
            "min": median * 0.8, "max": median * 1.3, "thin": ["p99"]}


def _cell(depth: int, streams: int, dec: float, agg: float, ttft: float) -> dict:
    keys = ["ttfc_ms", "itl_ms", "tpot_ms", "e2e_ms", "prompt_tok_s_corrected", "server_prefill_tok_s",
            "prompt_tokens", "output_tokens", "tokens_per_event"]
    c = {k: _summ(1.0) for k in keys}
    c.update(id=f"d{depth}-s{streams}-prose", sweep="s", depth=depth, streams=streams, prompt="prose", waves=2,
             requests_ok=4, requests_failed=0, decode_tok_s=_summ(dec), aggregate_decode_tok_s=_summ(agg),
             ttft_ms=_summ(ttft), prompt_tok_s=_summ(depth / ttft * 1000 if depth else 0.0), overhead_flag=False,
             overhead_ms=20.0, cached_tokens=0)
    return c


RESULTS = results_from_dict({
    "schema": 1, "profile": {"name": "t"}, "endpoint": {"model": "m", "url": "http://x/v1", "kind": "chat"},
    "server": {}, "run": {"id": "r", "overhead_ms": 20.0, "complete": True}, "bench_version": "0", "created": "now",
    "warnings": [NOTE],
    "cells": [_cell(0, 1, 87.9, 87.9, 50), _cell(0, 2, 80.0, 160.0, 60), _cell(32768, 1, 64.1, 64.1, 14000),
              _cell(131072, 1, 64.9, 64.9, 60000)],
})


def test_headline_in_the_seeds_shape() -> None:
    h = headline(RESULTS)
    assert h[0] == "single stream, short decode: 87.9 tok/s"
    assert h[1] == "decode after a 32K / 128K prompt: 64.1 / 64.9 tok/s"
    assert h[2].startswith("prompt tokens over TTFT at 32K / 128K: 2,341 / 2,185")
    assert h[3] == "decode at 1, 2 streams: 87.9 / 160 tok/s aggregate (87.9 / 80.0 per stream)"



def test_headline_takes_one_cell_per_stream_count() -> None:
    """A profile that varies images (or thinking, tools) at each stream count: the sentence names each count once,
    with the first cell of that count (multimodal: the cells without images)."""
    cells = [_cell(0, 1, 50.0, 50.0, 26), _cell(0, 1, 49.0, 49.0, 108), _cell(0, 4, 50.0, 197.0, 45),
             _cell(0, 4, 48.0, 191.0, 125)]
    for i, c in enumerate(cells):
        c["id"] += f"-v{i}"
    doc = {"schema": 1, "profile": {"name": "t"}, "endpoint": {"model": "m", "url": "http://x/v1", "kind": "chat"},
           "server": {}, "run": {"id": "r", "overhead_ms": 20.0, "complete": True}, "bench_version": "0",
           "created": "now", "cells": cells}
    assert headline(results_from_dict(doc))[1] == \
        "decode at 1, 4 streams: 50.0 / 197 tok/s aggregate (50.0 / 50.0 per stream)"

def test_csv_and_markdown() -> None:
    rows = list(csv.reader(io.StringIO(to_csv(RESULTS))))
    assert rows[0] == [c[0] for c in CSV_COLUMNS] and len(rows) == 5
    assert rows[1][rows[0].index("decode_tok_s_p50")] == "87.9"
    md = to_markdown(RESULTS)
    assert md.count("\n| ") >= 5 and NOTE in md and "87.9" in md


def test_plot_command(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    write_results(RESULTS, tmp_path, formats=("json",))
    assert main(["plot", str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "decode_vs_streams.png").stat().st_size > 1000
    assert (tmp_path / "depth.png").stat().st_size > 1000
    (tmp_path / "depth.png").unlink()
    assert main(["plot", str(tmp_path)]) == 0  # a run folder, as gate, compare and report take it
    assert (tmp_path / "depth.png").stat().st_size > 1000


def test_plot_rejects_other_json(tmp_path, capsys) -> None:
    p = tmp_path / "x.json"
    p.write_text("[1, 2]")
    assert main(["plot", str(p)]) == 3


def test_report_never_writes_over_a_runs_files(tmp_path, capsys) -> None:
    """`bench report res -o res/results.json` wrote the HTML over the run's results.json and exited 0: -o must end
    in .html/.htm and must not be an input; exit 3 with one line, every file untouched."""
    write_results(RESULTS, tmp_path / "res", formats=("json", "md", "csv"))
    (tmp_path / "res" / "records.jsonl").write_text("")
    (tmp_path / "in.html").write_text((tmp_path / "res" / "results.json").read_text())  # a results doc, oddly named
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for args, words in (([tmp_path / "res", "-o", tmp_path / "res" / "results.json"], "ending in .html or .htm"),
                        ([tmp_path / "res" / "results.json", "-o", tmp_path / "res" / "records.jsonl"], ".html"),
                        ([tmp_path / "res", "-o", tmp_path / "res" / "results.md"], ".html"),
                        ([tmp_path / "res", "-o", tmp_path / "elsewhere.json"], ".html"),
                        ([tmp_path / "in.html", "-o", tmp_path / "in.html"], "is one of the report's inputs")):
        capsys.readouterr()
        assert main(["report", *map(str, args)]) == 3
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "elsewhere.json").exists()


def test_report_of_a_results_file_without_cells_is_refused(tmp_path, capsys) -> None:
    """`{"cells": [], "schema": 1}` gave an empty page and exit 0; now one line and the bad-input exit."""
    bad = tmp_path / "bad2.json"
    bad.write_text('{"cells": [], "schema": 1}')
    assert main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == 3
    err = capsys.readouterr().err
    assert f"no cells in {bad}: nothing to report" in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.html").exists()
