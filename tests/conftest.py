"""Shared fixtures: the real llama-server (session-scoped) and the case files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

CASES_DIR = Path(__file__).parent / "cases"


def all_case_files() -> list[Path]:
    """Every case: the shared ones (copied from shared/cases) and bench's own (tests/cases/extra)."""
    return sorted(CASES_DIR.glob("*/*.json"))


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """Base URL of a running llama-server with SmolLM2-135M (4 slots, 32k shared context)."""
    from bench.engine import LocalEngine

    with LocalEngine(parallel=4, ctx_size=32768) as eng:
        yield eng.url
