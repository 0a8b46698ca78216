"""The house rules of the code base, checked on the source (docs/results.md and the error kinds included)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import bench
from bench.errors import ErrorKind
from bench.results import CellResult, EndpointInfo, ProfileInfo, Results, RunInfo

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "bench"
MAX_FUNCTION_LINES = 60


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _imports(tree: ast.Module, path: Path) -> set[str]:
    """Absolute names of every module imported (relative imports resolved against ``path``'s package)."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_no_function_is_longer_than_60_lines() -> None:
    long = []
    for path in _modules(PKG):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


def test_only_the_cli_imports_the_cli() -> None:
    bad = []
    for path in _modules(PKG) + _modules(ROOT / "benchmarks"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "bench" and (rel.name == "__main__.py" and len(rel.parts) == 2 or rel.name.startswith("cli")):
            continue
        if any(re.match(r"bench\.cli(_\w+)?(\.|$)", m) for m in _imports(_tree(path), path)):
            bad.append(str(rel))
    assert not bad, bad


def test_every_exception_class_is_in_errors_py() -> None:
    outside = []
    for path in _modules(PKG):
        if path.name == "errors.py" or "sim" in path.relative_to(PKG).parts[:1]:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Interrupted", "CouldNotRun")) for b in bases):
                    outside.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not outside, outside


def test_documented_error_kinds_are_the_codes() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    line = next(ln for ln in doc.splitlines() if ln.startswith("| `requests_ok`"))
    documented = set(re.findall(r"`([a-z0-9_]+)`", line.split("by kind", 1)[1].split(";", 1)[0]))
    assert documented == {k.value for k in ErrorKind}


def test_error_kinds_in_the_client_are_the_enum() -> None:
    src = "\n".join(p.read_text(encoding="utf-8") for p in (PKG / "client.py", PKG / "fastio.py", PKG / "runner.py"))
    used = set(re.findall(r'error_kind\s*==?\s*"([a-z0-9_]+)"', src))
    used |= set(re.findall(r'_set_error\([^)]*?"([a-z0-9_]+)"(?:, secret)?\)', src))
    assert used <= {k.value for k in ErrorKind}, used - {k.value for k in ErrorKind}


def test_docs_results_lists_every_field() -> None:
    """docs/results.md names every field of the typed document, and nothing the document does not have."""
    doc = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    sections = {"run": RunInfo, "profile": ProfileInfo, "endpoint": EndpointInfo, "cells[]": CellResult}
    for name, cls in sections.items():
        m = re.search(rf"^### `{re.escape(name)}`\n(.*?)(?=^### |\Z)", doc, re.S | re.M)
        assert m, f"docs/results.md has no '### `{name}`' section"
        listed = set(re.findall(r"^\| `([a-z_0-9]+)` \|", m.group(1), re.M))
        fields = {f.name for f in dataclasses.fields(cls)}
        assert listed == fields, f"{name}: missing {sorted(fields - listed)}, stale {sorted(listed - fields)}"
    top = {f.name for f in dataclasses.fields(Results)}
    m = re.search(r"^### top level\n(.*?)(?=^### |\Z)", doc, re.S | re.M)
    assert m and set(re.findall(r"^\| `([a-z_0-9]+)` \|", m.group(1), re.M)) == top


def test_package_face_exports_what_users_import() -> None:
    for name in bench.__all__:
        assert hasattr(bench, name), name
    assert sorted(bench.__all__) == list(bench.__all__)
