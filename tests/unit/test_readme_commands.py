"""Every command shown in the README and on the website's pages (book/*.md) is checked.

Each `cpcourse ...` line (also the ones run under `torchrun -m cpcourse --`) must parse with the
command's own parser; the calculators (`tokens`, `memory`, `comm`, `plan`) run and exit 0, in
about a second together. Each `make X` names a target of the Makefile. The README's counts
(notebooks, exercises, hours) are computed here from the course itself.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from cpcourse.cli import CALCULATORS, main
from cpcourse.course.stubs import registry

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md"))]
FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def _commands() -> list[tuple[str, str]]:
    """(page, command) for each shell line of each page's bash blocks, comments dropped and
    backslash continuations joined."""
    found = []
    for page in PAGES:
        for block in FENCE.findall(page.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    found.append((page.name, line))
    return found


COMMANDS = _commands()
CPCOURSE = [(p, c) for p, c in COMMANDS if "cpcourse " in c and "-m cpcourse" not in c
            or "-m cpcourse --" in c]


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    if "-m" in words and "cpcourse" in words:  # torchrun ... -m cpcourse -- demo ...
        words = words[words.index("cpcourse") + 1:]
        return words[1:] if words[:1] == ["--"] else words
    return words[next(i for i, w in enumerate(words) if w.endswith("cpcourse")) + 1:]


class _Parsed(Exception):
    pass


def test_the_pages_show_commands():
    assert len(CPCOURSE) >= 40, f"only {len(CPCOURSE)} cpcourse commands found"
    assert any(p == "README.md" for p, _ in COMMANDS)
    assert {p for p, _ in CPCOURSE} >= {"commands.md", "multi_gpu.md"}


@pytest.mark.parametrize("page,command", CPCOURSE, ids=[c[:60] for _, c in CPCOURSE])
def test_each_command_parses(page, command, monkeypatch, capsys):
    argv = _argv(command)
    if argv[0] in CALCULATORS:
        assert main(argv) == 0, f"{page}: {command}\n{capsys.readouterr().err}"
        return
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    with pytest.raises(_Parsed):
        main(argv)
    assert "error" not in capsys.readouterr().err, f"{page}: {command}"


def test_each_make_target_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    shown = {shlex.split(c)[1] for _, c in COMMANDS if c.startswith("make ")}
    assert shown and shown <= targets, shown - targets


def test_the_readme_counts_are_the_course():
    readme = (ROOT / "README.md").read_text()
    notebooks = len(list((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")))
    exercises = len(registry(ROOT))
    hours = round(notebooks * 1 + exercises * 0.5)  # the README's rule: 1 h a notebook, 30 min each
    said = re.search(r"(\d+) notebooks and (\d+) exercises.*?about (\d+) hours", readme, re.S)
    assert said, "the README no longer says how long the course takes"
    assert tuple(map(int, said.groups())) == (notebooks, exercises, hours), \
        f"the README should say {notebooks} notebooks and {exercises} exercises, " \
        f"about {hours} hours"


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) < 800
    first_screen = "\n".join(readme.splitlines()[:40])
    for must in ("make lab", "make test", "make demo", "book/images/"):
        assert must in first_screen, must
    image = re.search(r"\]\((book/images/[^)]+\.png)\)", readme).group(1)
    assert (ROOT / image).stat().st_size < 200_000
    for link in re.findall(r"\]\((book/[\w/]+\.md)\)", readme):
        assert (ROOT / link).exists(), link
