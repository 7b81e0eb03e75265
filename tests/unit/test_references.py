"""Every "notebook NN" in the course points at a notebook that exists, and every exercise's
"read notebook NN, "Section"" names a heading of that notebook."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# keyed by number, an appendix's letter included: "10", "10a"
NOTEBOOKS = {p.name.split("_")[0]: p for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.md")}
# "notebook 06", "notebooks 03 and 04", "notebooks 03 to 05", "Notebook 05's", "notebook 10a"
MENTION = re.compile(r"\b[Nn]otebooks? (\d\d[a-z]?)(?:(?: and| to|,) (\d\d[a-z]?))?")
MARKER = re.compile(r'BEGIN SOLUTION (\d\d\.\d) \| notebook (\d\d), "([^"]+)"')


def _sources() -> list[Path]:
    files = [*NOTEBOOKS.values(), ROOT / "README.md", ROOT / "AUTHORING.md",
             *sorted((ROOT / "book").glob("*.md"))]
    for folder in ("cpcourse", "exercises", "solutions"):  # tests invent notebooks 98, 99
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if f.name != Path(__file__).name]


def _headings(nb: Path) -> list[str]:
    return [line.lstrip("#").strip().lower() for line in nb.read_text().splitlines()
            if line.startswith("#")]


def test_every_notebook_mention_resolves():
    missing = []
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in MENTION.finditer(line):
                missing += [f"{path.relative_to(ROOT)}:{n}: notebook {g}" for g in m.groups()
                            if g and g not in NOTEBOOKS]
    assert not missing, "references to notebooks that do not exist:\n" + "\n".join(missing)


def test_every_exercise_names_a_real_section():
    found, wrong = 0, []
    for path in sorted((ROOT / "solutions").glob("ex*.py")):
        for ex, nb, section in MARKER.findall(path.read_text()):
            found += 1
            if nb not in NOTEBOOKS or not any(section.lower() in h
                                              for h in _headings(NOTEBOOKS[nb])):
                wrong.append(f"{ex}: notebook {nb} has no section {section!r}")
    assert found >= 18, f"only {found} exercise markers found: has the marker format changed?"
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_bad_reference(tmp_path):
    assert MENTION.findall("as notebooks 03 and 09 show") == [("03", "09")]
    assert MENTION.findall("the appendix, notebook 10a,") == [("10a", "")]
    assert MARKER.findall('# BEGIN SOLUTION 01.1 | notebook 01, "Nope" | hint: x') == [
        ("01.1", "01", "Nope")]
    assert not any("nope" in h for h in _headings(NOTEBOOKS["01"]))
