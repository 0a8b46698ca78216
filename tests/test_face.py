"""The package face: ``import bench`` is the library (lazy), and docs/architecture.md's example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import bench
from bench.sim import SimConfig

ROOT = Path(__file__).resolve().parent.parent
SIM_CONFIG = SimConfig(decode_step_ms=10.0, prefill_tok_s=1e7)  # the shared `sim` fixture


def test_the_face_names_the_library() -> None:
    for name in ("load_profile", "Profile", "run_profile", "run_load", "run_capacity", "load_results", "Results",
                 "LoadSettings", "ClientSettings"):
        assert name in bench.__all__ and callable(getattr(bench, name)), name


def test_import_bench_is_lazy() -> None:
    code = "import sys, bench; print(sorted(m for m in sys.modules if m.startswith('bench')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['bench', 'bench.version']"


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        bench.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("bench.no_such_name did not raise")


def test_the_docs_example_runs_against_the_sim(sim: str) -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", doc, re.S)
    assert code, "docs/architecture.md has no python example"
    src = code.group(1).replace("http://127.0.0.1:8000/v1", sim)
    out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert [ln.split()[0] for ln in lines] == [c.id for c in bench.load_profile("quick").cells()]
    for ln in lines:  # the sim decodes one token per 10 ms step: 100 tok/s per stream
        assert 98 < float(ln.split()[1]) < 102, ln
