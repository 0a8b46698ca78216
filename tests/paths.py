"""Where things are, for tests in any folder: the repository root and the shared test data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
FIXTURES = TESTS / "fixtures"
CASES = TESTS / "cases"


def script(rel: str) -> ModuleType:
    """The script at ``rel`` (from the repository root, e.g. ``benchmarks/scale_streams.py``) imported as a module
    named after its file (registered in ``sys.modules``: dataclasses look their module up there)."""
    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod
