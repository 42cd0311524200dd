"""The README's flag lists agree with the parsers: every flag of every command is named in that
command's README section (the engine flags in their shared section), and every flag has help
text and states its default."""
import argparse
import re
from pathlib import Path

import pytest

from bw24chat.cli import parsers
from bw24chat.options import add_engine_args

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
SECTIONS = dict(re.findall(r"^### (.+?)\n(.*?)(?=^##|\Z)", README, re.M | re.S))
ENGINE = "Engine and sampling flags (`bw24chat`, `--headless`, `serve`)"
HEADING = {"": "`bw24chat`", "serve": "`bw24chat serve`", "check": "`bw24chat check`", "bench": "`bw24chat bench`",
           "info": "`bw24chat info` and `bw24chat quality`", "quality": "`bw24chat info` and `bw24chat quality`",
           "train-draft": "`bw24chat train-draft`"}


def _options(p: argparse.ArgumentParser):
    return [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"]


def _engine_flags() -> set[str]:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return {s for a in _options(p) for s in a.option_strings}


@pytest.mark.parametrize("command", sorted(HEADING))
def test_every_flag_is_in_the_readme(command):
    text = SECTIONS[HEADING[command]]
    engine = _engine_flags()
    missing = [s for a in _options(parsers()[command]) for s in a.option_strings
               if f"`{s}" not in (SECTIONS[ENGINE] if s in engine else text)]
    assert not missing, f"README section {HEADING[command]} does not name {missing}"


@pytest.mark.parametrize("command", sorted(HEADING))
def test_every_flag_has_help_and_its_default(command):
    p = parsers()[command]
    formatter = p._get_formatter()
    for a in _options(p):
        assert a.help, f"{command} {a.option_strings} has no help"
        shown = formatter._get_help_string(a)
        if a.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in shown, f"{command} {a.option_strings}: the help does not state the default"
