"""Every command's --help answers: exit 0, no traceback (`bench sim --help` once died on a '%' in a help text), and
fits an 80-column terminal (a new user saw 58 lines up to 110 wide at COLUMNS=80: unwrapped paragraphs)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bench.cli.app import cli


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((*prefix, name))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*prefix, name))
    return out


@pytest.mark.parametrize("path", [(), *_commands(cli)], ids=lambda p: " ".join(p) or "bench")
def test_help_of_every_command(path: tuple[str, ...]) -> None:
    res = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    text = res.output
    assert res.exit_code == 0, (res.exit_code, text[-2000:], res.exception)
    assert "Traceback" not in text
    assert "Usage" in text or "usage" in text
    wide = [ln for ln in text.splitlines() if len(ln) > 80]
    assert not wide, "\n".join(wide)


def test_run_help_names_every_shipped_profile() -> None:
    from bench.config.profile import PROFILES_DIR

    text = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=80).output.split())
    names = [p.stem for p in PROFILES_DIR.glob("*.toml") if not p.stem.startswith("sim-")]
    assert names and all(n in text for n in names), [n for n in names if n not in text]


def test_check_help_states_its_own_read_timeout_default() -> None:
    """It said "default: none" (the shared text) while the check bounds every read at 15 s."""
    from bench.tools.check import CHECK_READ_TIMEOUT_S

    text = " ".join(CliRunner().invoke(cli, ["check", "--help"], terminal_width=80).output.split())
    assert f"default: {CHECK_READ_TIMEOUT_S:g} s" in text and "default: none" not in text
    run = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=80).output.split())
    assert "(default: none; long prefills" in run
