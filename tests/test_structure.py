"""The house rules of the code base, checked on the source (docs/results.md and the error kinds included)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import bench
from bench.errors import ErrorKind
from bench.results import (
    Capacity,
    CapacityPoint,
    CellResult,
    EndpointInfo,
    Gate,
    GateVerdict,
    ProfileInfo,
    Results,
    RunInfo,
)

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
        if rel.parts[0] == "bench" and (rel.name == "__main__.py" and len(rel.parts) == 2 or rel.parts[1] == "cli"):
            continue
        if any(re.match(r"bench\.cli(\.|$)", m) for m in _imports(_tree(path), path)):
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
    src = "\n".join(p.read_text(encoding="utf-8") for p in (*(PKG / "client").glob("*.py"), PKG / "transport" / "http.py",
                                                                 PKG / "session" / "endpoint.py", PKG / "session" / "sweep.py"))
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


def test_docs_results_lists_every_field_of_capacity_and_gate() -> None:
    """docs/results.md's capacity.json and gate.json tables name every field of their classes, and no other."""
    doc = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    sections = {"capacity top level": Capacity, "`points[]`": CapacityPoint, "gate top level": Gate,
                "`verdicts[]`": GateVerdict}
    for name, cls in sections.items():
        m = re.search(rf"^### {re.escape(name)}\n(.*?)(?=^##|\Z)", doc, re.S | re.M)
        assert m, f"docs/results.md has no '### {name}' section"
        listed = re.findall(r"^\| `([a-z_0-9]+)` \|", m.group(1), re.M)
        fields = [f.name for f in dataclasses.fields(cls)]
        assert sorted(listed) == sorted(fields), (name, sorted(set(fields) - set(listed)), sorted(set(listed) - set(fields)))


def test_package_face_exports_what_users_import() -> None:
    for name in bench.__all__:
        assert hasattr(bench, name), name
    assert sorted(bench.__all__) == list(bench.__all__)


# ---- the layout (docs/architecture.md) -------------------------------------------------------------------------
MAX_ROOT_MODULES = 12
MAX_MODULE_LINES = 700


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The row of docs/architecture.md's table a module belongs to: its package, or the root module's name."""
    parts = module.split(".")
    if len(parts) == 1:
        return "bench"
    return parts[1]


def _graph() -> dict[str, set[str]]:
    """Every module of bench/ -> the modules of bench/ it imports (lazy imports inside functions included)."""
    mods = {_module_name(p): p for p in _modules(PKG)}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for m in _imports(_tree(path), path):
            while m and m not in mods:
                m = m.rpartition(".")[0]
            if m and m != name:
                deps.add(m)
        graph[name] = deps
    return graph


def _allowed() -> dict[str, set[str]]:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \|\s*([^|]*?)\s*\|$", doc, re.M)
    assert rows, "docs/architecture.md has no table of units"
    return {u: {x.strip() for x in may.split(",") if x.strip()} for u, may in rows}


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                cycles.append(" -> ".join([*stack[stack.index(v):], v]))
            elif v not in state:
                visit(v, [*stack, v])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    assert not cycles, cycles


def test_imports_between_units_follow_the_architecture_table() -> None:
    allowed = _allowed()
    units = {_unit(m) for m in _graph()}
    assert units == set(allowed), f"table rows missing {sorted(units - set(allowed))}, stale {sorted(set(allowed) - units)}"
    every = set(allowed) - {"cli", "bench", "__main__"}
    bad = []
    for mod, deps in _graph().items():
        u = _unit(mod)
        ok = every if allowed[u] == {"every unit above"} else allowed[u]
        for d in deps:
            if _unit(d) != u and _unit(d) not in ok:
                bad.append(f"{mod} -> {d}")
    assert not bad, bad


def test_layout_sizes() -> None:
    root = sorted(p.name for p in PKG.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
    big = [f"{p.relative_to(ROOT)} ({n})" for p in _modules(PKG)
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not big, big


def test_tests_mirror_the_packages() -> None:
    """Tests of bench/X/ live in tests/X/; the test files directly in tests/ are those of bench's root modules
    (driver, gate, results, warns, the face) and of the tree as a whole (structure, figures)."""
    folders = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert folders <= packages, sorted(folders - packages)
    flat = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert flat == ["test_driver.py", "test_face.py", "test_figures.py", "test_gate.py", "test_roundtrip.py",
                    "test_structure.py", "test_warns.py"], flat


def test_spec_strings_are_parsed_once_in_config() -> None:
    """SLO and size specs become typed objects in bench/config (settings made once); nothing below the CLI parses
    the strings again (the CLI may, to check a flag before anything runs)."""
    again = []
    for path in _modules(PKG):
        top = path.relative_to(PKG).parts[0]
        if top in ("config", "cli"):
            continue
        src = path.read_text(encoding="utf-8")
        again += [f"{path.relative_to(ROOT)}: {fn}" for fn in ("parse_slo(", "parse_size(") if fn in src]
    assert not again, again
