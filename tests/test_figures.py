"""Issue 26, item 3: every figure in README.md names its stored source.

The convention (benchmarks/README.md, "Figures and their sources"): a Markdown block (a paragraph or a list item)
that states a measured figure (a number with a unit of measure: ms, %, tok/s, events/s, req/s, per CPU-second,
minutes) is followed by a line ``<!-- source: PATH[, PATH...] -->`` naming the files the figures come from: stored
results under benchmarks/results/ (each names its date, machine and the command that made it) or the test that
asserts them. The test fails when such a block has no source, a source does not exist, a stored Markdown result
names no command (a results.json is the document of the `bench run` that the text around it names), or a number of the block is in none of its sources. Code blocks are exempt (README's sample has its own
test)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = r"(?:ms|%|tok/s|events/s|req/s|(?:events )?per CPU-second|minutes|min\b)"
NUM = r"\d[\d,]*(?:\.\d+)?k?"
FIGURE = re.compile(rf"({NUM}(?:\s*(?:-|/|\.\.|–|to)\s*{NUM})*)\s*{UNIT}")
STORED = ("benchmarks/results/", "tests/", "profiles/")  # stored results; the tests that assert a bound; sim configs
SOURCE = re.compile(r"<!--\s*source:\s*(.+?)\s*-->")
COMMAND = re.compile(r"`(?:python|bench|make|\.ci/|benchmarks/)[^`]*`|^-? ?(?:command|reproduce):", re.M)


def blocks(text: str) -> list[tuple[int, str, list[str]]]:
    """``(line, block text, sources)`` of each Markdown block outside code fences; a block is a paragraph or one
    list item; its sources are the ``<!-- source: -->`` line(s) right after it."""
    out: list[tuple[int, str, list[str]]] = []
    cur: list[str] = []
    start, fence = 0, False

    def flush() -> None:
        if cur:
            out.append((start, "\n".join(cur), []))
            cur.clear()

    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            flush()
            fence = not fence
            continue
        if fence:
            continue
        m = SOURCE.search(line)
        if m and line.strip().startswith("<!--"):
            flush()
            if out:
                out[-1][2].extend(s.strip() for s in m.group(1).split(","))
            continue
        if not line.strip() or line.startswith("#") or line.startswith("|"):
            flush()
            continue
        if re.match(r"\s*(?:[-*]|\d+\.)\s", line):
            flush()
        if not cur:
            start = i
        cur.append(line)
    flush()
    return out


def numbers(block: str) -> list[str]:
    """Each number of each figure in ``block`` (commas dropped; ``20k`` stays ``20k``)."""
    out = []
    for m in FIGURE.finditer(re.sub(r"`[^`]*`", "", block)):
        out += [n.replace(",", "") for n in re.findall(NUM, m.group(1))]
    return out


def _found(n: str, text: str) -> bool:
    plain = text.replace(",", "")
    if n.endswith("k"):
        return bool(re.search(rf"(?<![\d.]){re.escape(n)}", plain)) or _found(n[:-1] + "000", text) or bool(
            re.search(rf"(?<![\d.]){re.escape(n[:-1])}\d{{3}}(?!\d)", plain))
    return bool(re.search(rf"(?<![\d.]){re.escape(n)}(?:\.0+)?(?![\d]|\.\d)", plain)) or (
        "." in n and bool(re.search(rf"(?<![\d.]){re.escape(n)}\d*", plain)))


def problems(path: Path) -> list[str]:
    bad = []
    for line, block, sources in blocks(path.read_text(encoding="utf-8")):
        nums = numbers(block)
        if not nums:
            continue
        if not sources:
            bad.append(f"{path.name}:{line}: figures {nums} with no <!-- source: --> line after the block")
            continue
        texts = []
        for s in sources:
            p = ROOT / s
            if not s.startswith(STORED):
                bad.append(f"{path.name}:{line}: source {s} is not a stored result (under {', '.join(STORED)})")
                continue
            if not p.is_file():
                bad.append(f"{path.name}:{line}: source {s} does not exist")
                continue
            t = p.read_text(encoding="utf-8", errors="replace")
            if s.startswith("benchmarks/results/") and s.endswith(".md") and not COMMAND.search(t):
                bad.append(f"{path.name}:{line}: {s} names no command")
            texts.append(t)
        for n in nums:
            if texts and not any(_found(n, t) for t in texts):
                bad.append(f"{path.name}:{line}: {n} is in none of {sources}")
    return bad


def test_every_readme_figure_names_a_stored_source() -> None:
    bad = problems(ROOT / "README.md")
    assert not bad, "\n".join(bad)


def test_the_check_finds_what_it_should(tmp_path) -> None:
    """A figure with no source, a missing source, a number its source lacks: each is reported."""
    res = ROOT / "benchmarks" / "results" / "hotpath-blast-2026-12-02-vm.md"
    rel = res.relative_to(ROOT)
    doc = tmp_path / "doc.md"
    doc.write_text(f"One process reads 118,319 events/s.\n<!-- source: {rel} -->\n\n"
                   "A wave took 12.5 ms.\n\n"
                   "It used 87 % of a core.\n<!-- source: benchmarks/results/none.md -->\n\n"
                   "A gate took 9 % longer.\n<!-- source: docs/gate.md -->\n\n"
                   f"- a list item: 999,999 events/s\n<!-- source: {rel} -->\n\n```\n1 ms in code\n```\n")
    bad = problems(doc)
    assert len(bad) == 4, bad
    assert "no <!-- source" in bad[0] and "12.5" in bad[0]
    assert "does not exist" in bad[1]
    assert "not a stored result" in bad[2]
    assert "999999 is in none" in bad[3]


@pytest.mark.parametrize("text, want", [("88,500-118,300 events/s", ["88500", "118300"]),
                                        ("p50/p99 0.44/1.1 ms", ["0.44", "1.1"]), ("20k events/s", ["20k"]),
                                        ("within 3 % of", ["3"]), ("`--seconds 4` and 30 s", [])])
def test_numbers_of_a_figure(text, want) -> None:
    assert numbers(text) == want


def _named_results(text: str) -> set[str]:
    """Results files a page names in its prose (code blocks hold commands, whose --out files are examples)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    found = re.findall(r"(?<![\w/-])(?:benchmarks/)?results/[\w.\-/]+\.(?:md|json)", prose)
    return {m for m in found if not re.search(r"[A-Z]{3,}|<", m)}  # FILE, NAME-DATE: placeholders


def test_every_stored_result_named_in_the_docs_exists_and_names_its_command() -> None:
    """README.md, docs/*.md and benchmarks/README.md: every results file they name is stored, and every stored
    Markdown result names the command that made it."""
    bad = []
    for doc in [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in _named_results(doc.read_text(encoding="utf-8")):
            path = ROOT / (name if name.startswith("benchmarks/") else "benchmarks/" + name)
            if not path.is_file():
                bad.append(f"{doc.relative_to(ROOT)}: {name} is not stored")
    for res in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        if not COMMAND.search(res.read_text(encoding="utf-8")):
            bad.append(f"{res.relative_to(ROOT)} names no command")
    assert not bad, "\n".join(bad)


def test_every_scale_figure_names_a_stored_source() -> None:
    """docs/scale.md (issue 30) holds only measured figures, each with its stored source."""
    bad = problems(ROOT / "docs" / "scale.md")
    assert not bad, "\n".join(bad)
