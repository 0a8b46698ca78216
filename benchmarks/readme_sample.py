"""README's sample output, generated: what ``bench run`` prints at the end for a stored results file, 80 columns.

The README block that follows the marker line ``<!-- sample: PATH -->`` is ``bench.report.console.results_text`` of
the results file PATH (tests/cli/test_newuser.py checks that they agree, so the sample cannot go stale).

    python benchmarks/readme_sample.py benchmarks/results/readme-sample.json           # print it
    python benchmarks/readme_sample.py benchmarks/results/readme-sample.json --write   # and rewrite README's block
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report.console import results_text  # noqa: E402
from bench.results import results_from_dict  # noqa: E402

WIDTH = 80


def sample_block(readme: str) -> tuple[str, str] | None:
    """``(results path, the block's text)`` of README's sample, or None when it has no marker."""
    m = re.search(r"<!-- sample: (\S+) -->\n```\n(.*?)\n```", readme, re.S)
    return (m.group(1), m.group(2)) if m else None


def render(path: str | Path) -> str:
    """The sample text for a results file."""
    return results_text(results_from_dict(json.loads((ROOT / path).read_text(encoding="utf-8"))), WIDTH)


def main(argv: list[str]) -> int:
    """Command line: see the module docstring."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    text = render(argv[0])
    print(text)
    if "--write" in argv:
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        marker = f"<!-- sample: {argv[0]} -->\n```\n"
        start = readme.index(marker) + len(marker)
        end = readme.index("```", start)  # the closing fence (the block itself never holds one)
        (ROOT / "README.md").write_text(readme[:start] + text + "\n" + readme[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
