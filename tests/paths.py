"""Where things are, for tests in any folder: the repository root and the shared test data."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
FIXTURES = TESTS / "fixtures"
CASES = TESTS / "cases"
